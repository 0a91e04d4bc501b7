//! `sum` and `avg` of doubles that reach NaN answer NaN with the sign bit of whichever NaN the
//! additions met first: `inf + -inf` makes a negative NaN on x86, and the order rows are added
//! in changes from run to run. DataFusion compares and sorts doubles by IEEE total order, where
//! a negative NaN is below every number and a positive one above: `x > (SELECT avg(x) …)` over
//! a column holding `inf` and `-inf` answered every row on some runs and none on others. The
//! results of these two are made the one positive NaN, which compares as SQL's NaN does
//! (greater than every number, as in PostgreSQL and DuckDB). Upstream: arrow-rs compares
//! floats with `total_cmp`; no DataFusion issue on aggregate results filed yet.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, BooleanArray};
use arrow::datatypes::{DataType, FieldRef, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature,
};

/// `sum` and `avg` with one NaN.
pub fn sum_and_avg() -> [AggregateUDF; 2] {
    use datafusion::functions_aggregate::{average::avg_udaf, sum::sum_udaf};
    [sum_udaf(), avg_udaf()].map(|inner| AggregateUDF::new_from_impl(OneNan(inner)))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct OneNan(Arc<AggregateUDF>);

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

impl AggregateUDFImpl for OneNan {
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

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.0.coerce_types(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.0.state_fields(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(OneNanAccumulator(self.0.accumulator(args)?)))
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.0.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(OneNanGroups(self.0.create_groups_accumulator(args)?)))
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(OneNanAccumulator(self.0.create_sliding_accumulator(args)?)))
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.0.inner().order_sensitivity()
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }

    fn set_monotonicity(&self, t: &DataType) -> SetMonotonicity {
        self.0.inner().set_monotonicity(t)
    }
}

#[derive(Debug)]
struct OneNanAccumulator(Box<dyn Accumulator>);

impl Accumulator for OneNanAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.0.update_batch(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.0.evaluate().map(canonical_scalar)
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

struct OneNanGroups(Box<dyn GroupsAccumulator>);

impl GroupsAccumulator for OneNanGroups {
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
        self.0.evaluate(emit_to).map(canonical_array)
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
