//! `median` of doubles whose two middle values add up past the largest double. DataFusion
//! 53.1's `calculate_median` averages them as `(a + b) / 2`, which is infinite there:
//! `median(1e308)` over an even number of rows answered `+inf` (shown as `null`) where DuckDB
//! answers `1e308`. Its integers were fixed by apache/datafusion#19509; its doubles are not
//! filed upstream (the same overflow in `percentile_cont` is apache/datafusion#25267). When
//! DataFusion averages them as `a / 2 + b / 2` on overflow, this file goes.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array};
use arrow::datatypes::{DataType, FieldRef, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, Signature,
};

/// DataFusion's `median`, with doubles averaged without overflow.
pub fn median() -> AggregateUDF {
    AggregateUDF::new_from_impl(Median(datafusion::functions_aggregate::median::median_udaf()))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Median(Arc<AggregateUDF>);

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
            let values = values.as_primitive::<Float64Type>();
            let mut values: Vec<f64> = values.iter().flatten().collect();
            median_of(&mut values)
        })
        .collect()
}

fn doubles(args: &AccumulatorArgs) -> bool {
    args.return_field.data_type() == &DataType::Float64
}

impl AggregateUDFImpl for Median {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    fn aliases(&self) -> &[String] {
        self.0.aliases()
    }

    fn signature(&self) -> &Signature {
        self.0.signature()
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.0.return_type(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.0.state_fields(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let inner = self.0.accumulator(args.clone())?;
        Ok(if doubles(&args) { Box::new(Midpoint(inner)) } else { inner })
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.0.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let inner = self.0.create_groups_accumulator(args.clone())?;
        Ok(if doubles(&args) { Box::new(Midpoints(inner)) } else { inner })
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }
}

/// DataFusion's accumulator; an infinite answer (an overflow, or an infinity in the middle) is
/// worked out again from its values.
#[derive(Debug)]
struct Midpoint(Box<dyn Accumulator>);

impl Accumulator for Midpoint {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.0.update_batch(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let answer = self.0.evaluate()?;
        if !matches!(answer, ScalarValue::Float64(Some(v)) if v.is_infinite()) {
            return Ok(answer);
        }
        // Taking the state empties the accumulator; merging it back restores it (a window
        // evaluates the same accumulator again).
        let state: Vec<ArrayRef> =
            self.0.state()?.iter().map(ScalarValue::to_array).collect::<Result<_>>()?;
        self.0.merge_batch(&state)?;
        Ok(ScalarValue::Float64(Some(medians(&state[0]).value(0))))
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.0.state()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.0.merge_batch(states)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.0.retract_batch(values)
    }

    fn supports_retract_batch(&self) -> bool {
        self.0.supports_retract_batch()
    }
}

/// DataFusion's groups accumulator, each group's median worked out from its values.
struct Midpoints(Box<dyn GroupsAccumulator>);

impl GroupsAccumulator for Midpoints {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.0.update_batch(values, group_indices, opt_filter, total_num_groups)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let state = self.0.state(emit_to)?;
        Ok(Arc::new(medians(&state[0])))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        self.0.state(emit_to)
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.0.merge_batch(values, group_indices, opt_filter, total_num_groups)
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        self.0.convert_to_state(values, opt_filter)
    }

    fn supports_convert_to_state(&self) -> bool {
        self.0.supports_convert_to_state()
    }

    fn size(&self) -> usize {
        self.0.size()
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
