//! `sum` and `avg` of doubles that reach NaN answer NaN with the sign bit of whichever NaN the
//! additions met first: `inf + -inf` makes a negative NaN on x86, and the order rows are added
//! in changes from run to run. DataFusion compares and sorts doubles by IEEE total order, where
//! a negative NaN is below every number and a positive one above: `x > (SELECT avg(x) …)` over
//! a column holding `inf` and `-inf` answered every row on some runs and none on others. The
//! results of these two are made the one positive NaN, which compares as SQL's NaN does
//! (greater than every number, as in PostgreSQL and DuckDB). Upstream: arrow-rs compares
//! floats with `total_cmp`; no DataFusion issue on aggregate results filed yet.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::AccumulatorArgs;
use datafusion::logical_expr::{Accumulator, AggregateUDF, EmitTo, GroupsAccumulator};

use super::answers::{Answers, fixed};
use super::sliding_sums::{self, Answer};

/// `sum` and `avg` with one NaN, and their sliding window frames summed right.
pub fn sum_and_avg() -> [AggregateUDF; 2] {
    use datafusion::functions_aggregate::{average::avg_udaf, sum::sum_udaf};
    [fixed(sum_udaf(), OneNan(Answer::Sum)), fixed(avg_udaf(), OneNan(Answer::Average))]
}

/// DataFusion's answer, any NaN in it the positive one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct OneNan(Answer);

impl Answers for OneNan {
    fn sliding(&self, args: &AccumulatorArgs) -> Option<Box<dyn Accumulator>> {
        sliding_sums::accumulator(self.0, args)
    }

    fn evaluate(&self, inner: &mut dyn Accumulator) -> Result<ScalarValue> {
        inner.evaluate().map(canonical_scalar)
    }

    fn evaluate_groups(&self, inner: &mut dyn GroupsAccumulator, emit_to: EmitTo) -> Result<ArrayRef> {
        inner.evaluate(emit_to).map(canonical_array)
    }
}

fn canonical(v: f64) -> f64 {
    if v.is_nan() { f64::NAN } else { v }
}

fn canonical_scalar(v: ScalarValue) -> ScalarValue {
    match v {
        ScalarValue::Float64(Some(x)) => ScalarValue::Float64(Some(canonical(x))),
        v => v,
    }
}

fn canonical_array(a: ArrayRef) -> ArrayRef {
    match a.data_type() {
        DataType::Float64 => {
            let values = a.as_primitive::<Float64Type>();
            if values.values().iter().any(|v| v.is_nan()) {
                Arc::new(values.unary::<_, Float64Type>(canonical)) as ArrayRef
            } else {
                a
            }
        }
        _ => a,
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, RecordBatch};
    use arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::testing::{answer, session};

    /// `inf` and `-inf` meet in different orders over 4 partitions and in windows: every run
    /// answers the same, and no row is greater than the NaN average.
    #[tokio::test]
    async fn sums_that_reach_nan_compare_as_one_nan() {
        let n = 4000;
        let values: Float64Array = (0..n)
            .map(|i| {
                Some(match i % 997 {
                    0 => f64::INFINITY,
                    1 => f64::NEG_INFINITY,
                    k => k as f64,
                })
            })
            .collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("x", DataType::Float64, true),
        ]));
        let groups = arrow::array::Int64Array::from_iter_values((0..n).map(|i| i % 3));
        let t = RecordBatch::try_new(schema, vec![Arc::new(groups), Arc::new(values)]).unwrap();
        let ctx = session(&Default::default(), 64 << 20, &[("t", t)]);
        for sql in [
            "SELECT count(*) AS n FROM t WHERE x > (SELECT avg(x) FROM t)",
            "SELECT count(*) AS n FROM t WHERE x > (SELECT sum(x) FROM t)",
            "SELECT count(*) AS n FROM t u JOIN (SELECT g, sum(x) AS s FROM t GROUP BY g) v ON u.g = v.g WHERE u.x > v.s",
            "SELECT count(*) AS n FROM (SELECT x, avg(x) OVER (PARTITION BY g) AS a FROM t) WHERE x > a",
        ] {
            let text = answer(&ctx, sql).await;
            assert!(text.contains("| 0 |"), "{sql}: {text}");
        }
    }
}
