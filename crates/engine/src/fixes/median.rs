//! `median` of doubles whose two middle values add up past the largest double. DataFusion
//! 53.1's `calculate_median` averages them as `(a + b) / 2`, which is infinite there:
//! `median(1e308)` over an even number of rows answered `+inf` (shown as `null`) where DuckDB
//! answers `1e308`. Its integers were fixed by apache/datafusion#19509; its doubles are not
//! filed upstream (the same overflow in `percentile_cont` is apache/datafusion#25267). When
//! DataFusion averages them as `a / 2 + b / 2` on overflow, this file goes.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Array};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{Accumulator, AggregateUDF, EmitTo, GroupsAccumulator};

use super::answers::{Answers, fixed};

/// DataFusion's `median`, with doubles averaged without overflow.
pub fn median() -> AggregateUDF {
    fixed(datafusion::functions_aggregate::median::median_udaf(), Midpoint)
}

/// The median of `values` (no NULLs), ordered as DataFusion orders doubles (IEEE total order).
fn median_of(values: &mut [f64]) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let (low, high, _) = values.select_nth_unstable_by(n / 2, f64::total_cmp);
    let high = *high;
    if n % 2 == 1 {
        return Some(high);
    }
    let low = low.iter().copied().max_by(f64::total_cmp).expect("an even count has a lower half");
    let sum = low + high;
    Some(if sum.is_finite() || !low.is_finite() || !high.is_finite() {
        sum / 2.0
    } else {
        low / 2.0 + high / 2.0
    })
}

/// Each list's median: the state DataFusion's accumulators keep is every value (or every
/// distinct one) of a group.
fn medians(lists: &ArrayRef) -> Float64Array {
    let lists = lists.as_list::<i32>();
    (0..lists.len())
        .map(|i| {
            if lists.is_null(i) {
                return None;
            }
            let values = lists.value(i);
            let mut values: Vec<f64> = values.as_primitive::<Float64Type>().iter().flatten().collect();
            median_of(&mut values)
        })
        .collect()
}

/// Medians of doubles worked out by [`median_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Midpoint;

impl Answers for Midpoint {
    fn applies(&self, args: &AccumulatorArgs) -> bool {
        args.return_field.data_type() == &DataType::Float64
    }

    /// DataFusion's answer, unless infinite (an overflow, or an infinity in the middle): that
    /// one is worked out again from the accumulator's values.
    fn evaluate(&self, inner: &mut dyn Accumulator) -> Result<ScalarValue> {
        let answer = inner.evaluate()?;
        if !matches!(answer, ScalarValue::Float64(Some(v)) if v.is_infinite()) {
            return Ok(answer);
        }
        // Taking the state empties the accumulator; merging it back restores it (a window
        // evaluates the same accumulator again).
        let state: Vec<ArrayRef> = inner.state()?.iter().map(ScalarValue::to_array).collect::<Result<_>>()?;
        inner.merge_batch(&state)?;
        Ok(ScalarValue::Float64(Some(medians(&state[0]).value(0))))
    }

    /// Every group's median from its values, which DataFusion's own evaluation reads too.
    fn evaluate_groups(&self, inner: &mut dyn GroupsAccumulator, emit_to: EmitTo) -> Result<ArrayRef> {
        let state = inner.state(emit_to)?;
        Ok(Arc::new(medians(&state[0])))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::testing::{answer, on_and_off};

    #[test]
    fn the_middle_of_two_large_doubles_is_not_infinite() {
        assert_eq!(median_of(&mut [1e308, 1e308]), Some(1e308));
        assert_eq!(median_of(&mut [f64::MAX, f64::MAX, 1.0, 2.0]), Some(f64::MAX / 2.0 + 1.0));
        assert_eq!(median_of(&mut [3.0, 1.0, 2.0, 4.0]), Some(2.5));
        assert_eq!(median_of(&mut [f64::INFINITY, 1.0]), Some(f64::INFINITY));
        assert!(median_of(&mut [f64::INFINITY, f64::NEG_INFINITY]).unwrap().is_nan());
        assert_eq!(median_of(&mut []), None);
    }

    /// Grouped, whole-table, distinct and as a window: groups of even size answer 1e308.
    #[tokio::test]
    async fn medians_of_large_doubles() {
        let n = 1000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("x", DataType::Float64, true),
        ]));
        let t = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 7))),
                Arc::new(Float64Array::from_iter((0..n).map(|i| (i % 5 != 0).then_some(1e308)))),
            ],
        )
        .unwrap();
        for sql in [
            "SELECT g, median(x) AS m FROM t GROUP BY g",
            "SELECT median(x) AS m FROM t",
            "SELECT g, median(DISTINCT x) AS m, median(x) AS n FROM t GROUP BY g",
            "SELECT DISTINCT g, median(x) OVER (PARTITION BY g) AS m FROM t",
        ] {
            let (on, off) = on_and_off(&[("t", t.clone())], sql).await;
            assert_eq!(on, off, "{sql}");
            assert!(!on.contains("inf") && !on.contains("NULL") && on.contains("1e308"), "{sql}: {on}");
        }
    }

    /// DataFusion alone still overflows: when this fails, `median` can be DataFusion's again.
    #[tokio::test]
    async fn datafusion_alone_answers_infinity() {
        let ctx = datafusion::prelude::SessionContext::new();
        let text = answer(&ctx, "SELECT median(x) AS m FROM (VALUES (1e308), (1e308)) t(x)").await;
        assert!(text.contains("inf"), "{text}");
    }
}
