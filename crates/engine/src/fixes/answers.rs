//! A DataFusion aggregate function whose answers a fix works out differently: everything else
//! (signature, state, updates, merges) stays the wrapped function's.

use std::any::Any;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray};
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature,
};

/// How a fix answers, given the wrapped function's accumulator.
pub trait Answers: fmt::Debug + Copy + PartialEq + Eq + Hash + Send + Sync + 'static {
    /// Whether the fix concerns accumulators made with `args` (others are the wrapped ones).
    fn applies(&self, _args: &AccumulatorArgs) -> bool {
        true
    }
    fn evaluate(&self, inner: &mut dyn Accumulator) -> Result<ScalarValue>;
    fn evaluate_groups(&self, inner: &mut dyn GroupsAccumulator, emit_to: EmitTo) -> Result<ArrayRef>;
    /// The fix's own accumulator for a sliding window frame, in place of the wrapped one's.
    fn sliding(&self, _args: &AccumulatorArgs) -> Option<Box<dyn Accumulator>> {
        None
    }
}

/// `function` answering as `answers` says.
pub fn fixed<A: Answers>(function: Arc<AggregateUDF>, answers: A) -> AggregateUDF {
    AggregateUDF::new_from_impl(Fixed { function, answers })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Fixed<A> {
    function: Arc<AggregateUDF>,
    answers: A,
}

impl<A: Answers> Fixed<A> {
    fn wrap(&self, args: &AccumulatorArgs, inner: Box<dyn Accumulator>) -> Box<dyn Accumulator> {
        if self.answers.applies(args) {
            Box::new(FixedAccumulator { inner, answers: self.answers })
        } else {
            inner
        }
    }
}

impl<A: Answers> AggregateUDFImpl for Fixed<A> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.function.name()
    }

    fn aliases(&self) -> &[String] {
        self.function.aliases()
    }

    fn signature(&self) -> &Signature {
        self.function.signature()
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.function.return_type(args)
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.function.coerce_types(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.function.state_fields(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(self.wrap(&args, self.function.accumulator(args.clone())?))
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.function.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let inner = self.function.create_groups_accumulator(args.clone())?;
        Ok(if self.answers.applies(&args) {
            Box::new(FixedGroups { inner, answers: self.answers })
        } else {
            inner
        })
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let inner = match self.answers.sliding(&args) {
            Some(own) => own,
            None => self.function.create_sliding_accumulator(args.clone())?,
        };
        Ok(self.wrap(&args, inner))
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.function.inner().order_sensitivity()
    }

    /// The fixed functions (`sum`, `avg`, `median`) answer the same over rows in any order.
    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.function.documentation()
    }

    fn set_monotonicity(&self, t: &DataType) -> SetMonotonicity {
        self.function.inner().set_monotonicity(t)
    }
}

#[derive(Debug)]
struct FixedAccumulator<A> {
    inner: Box<dyn Accumulator>,
    answers: A,
}

impl<A: Answers> Accumulator for FixedAccumulator<A> {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.update_batch(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        self.answers.evaluate(self.inner.as_mut())
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.inner.state()
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.inner.merge_batch(states)
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.inner.retract_batch(values)
    }

    fn supports_retract_batch(&self) -> bool {
        self.inner.supports_retract_batch()
    }
}

struct FixedGroups<A> {
    inner: Box<dyn GroupsAccumulator>,
    answers: A,
}

impl<A: Answers> GroupsAccumulator for FixedGroups<A> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.inner.update_batch(values, group_indices, opt_filter, total_num_groups)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.answers.evaluate_groups(self.inner.as_mut(), emit_to)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        self.inner.state(emit_to)
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.inner.merge_batch(values, group_indices, opt_filter, total_num_groups)
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        self.inner.convert_to_state(values, opt_filter)
    }

    fn supports_convert_to_state(&self) -> bool {
        self.inner.supports_convert_to_state()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }
}
