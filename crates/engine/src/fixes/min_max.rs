//! `min` and `max` over NaN, and over window frames without a value.
//!
//! DataFusion 53.1's `min`/`max` compare floats with `partial_cmp` and keep the newer value when
//! it is unordered, so over doubles holding NaN the answer depends on the order rows arrive in
//! (difftest regression 001); skiff follows PostgreSQL and DuckDB (and DataFusion's own sort):
//! NaN is larger than every number, so `max` is NaN when any value is, and `min` only when
//! every value is. Its grouped `max` starts from the smallest finite double, so a group of
//! `-inf` answered -1.79e308 (`min` likewise with `+inf`). Over a sliding window frame whose
//! rows are all NULL, its accumulator answers the last value it saw instead of NULL
//! (regression 003). Here NaN and the infinity on the far side never reach DataFusion's
//! accumulators (they are noted and taken out), and a frame's values are counted, so an empty
//! one is NULL. Upstream: DataFusion's `MinAccumulator`/`MaxAccumulator`, its primitive groups
//! accumulators' starting values, and `SlidingMinAccumulator`/`SlidingMaxAccumulator` in
//! `functions-aggregate/src/min_max.rs`.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray};
use arrow::compute::kernels::zip::zip;
use arrow::datatypes::{DataType, Field, FieldRef, Float16Type, Float32Type, Float64Type};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature, StatisticsArgs,
};

/// skiff's `min` and `max`.
pub fn min_and_max() -> [AggregateUDF; 2] {
    [
        AggregateUDF::from(MinMax { inner: min_udaf(), max: false }),
        AggregateUDF::from(MinMax { inner: max_udaf(), max: true }),
    ]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct MinMax {
    inner: Arc<AggregateUDF>,
    max: bool,
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float16 | DataType::Float32 | DataType::Float64)
}

/// Which valid values of `values` are NaN, and which are the infinity on the far side of
/// the answer (`-inf` for `max`, `+inf` for `min`); all false for other types.
fn specials(values: &ArrayRef, max: bool) -> (BooleanArray, BooleanArray) {
    fn of<T: arrow::datatypes::ArrowPrimitiveType>(
        a: &ArrayRef,
        test: impl Fn(T::Native) -> bool,
    ) -> BooleanArray {
        a.as_primitive::<T>().iter().map(|v| Some(v.is_some_and(&test))).collect()
    }
    let far = if max { f64::NEG_INFINITY } else { f64::INFINITY };
    match values.data_type() {
        DataType::Float16 => {
            (of::<Float16Type>(values, |v| v.is_nan()), of::<Float16Type>(values, |v| f64::from(v) == far))
        }
        DataType::Float32 => {
            (of::<Float32Type>(values, |v| v.is_nan()), of::<Float32Type>(values, |v| v as f64 == far))
        }
        DataType::Float64 => {
            (of::<Float64Type>(values, |v| v.is_nan()), of::<Float64Type>(values, |v| v == far))
        }
        _ => {
            let none = BooleanArray::from(vec![false; values.len()]);
            (none.clone(), none)
        }
    }
}

/// `values` without their special values (made NULL), and which were NaN and which the far
/// infinity.
fn without_specials(values: &ArrayRef, max: bool) -> Result<(ArrayRef, BooleanArray, BooleanArray)> {
    let (nan, far) = specials(values, max);
    if nan.true_count() == 0 && far.true_count() == 0 {
        return Ok((values.clone(), nan, far));
    }
    let either = arrow::compute::or(&nan, &far)?;
    Ok((arrow::compute::nullif(values, &either)?, nan, far))
}

fn special_of(t: &DataType, v: f64) -> Result<ScalarValue> {
    ScalarValue::Float64(Some(v)).cast_to(t)
}

/// The answer from the numbers' answer (NULL when there were none) and whether NaN and the
/// far infinity were seen: NaN is above everything, the far infinity beyond every number.
fn answer(max: bool, numbers_null: bool, nan: bool, far: bool) -> Option<f64> {
    match (max, numbers_null) {
        (true, _) if nan => Some(f64::NAN),
        (true, true) if far => Some(f64::NEG_INFINITY),
        (false, true) if far => Some(f64::INFINITY),
        (false, true) if nan => Some(f64::NAN),
        _ => None,
    }
}

impl AggregateUDFImpl for MinMax {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.inner.return_type(args)
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let float = is_float(args.return_field.data_type());
        let mut fields = self.inner.state_fields(args)?;
        if float {
            fields.push(Arc::new(Field::new("nan", DataType::Boolean, true)));
            fields.push(Arc::new(Field::new("far", DataType::Boolean, true)));
        }
        Ok(fields)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let t = args.return_field.data_type().clone();
        let inner = self.inner.accumulator(args)?;
        if !is_float(&t) {
            return Ok(inner);
        }
        Ok(Box::new(FloatAccumulator { inner, nan: false, far: false, max: self.max, t }))
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let t = args.return_field.data_type().clone();
        let inner = self.inner.create_groups_accumulator(args)?;
        if !is_float(&t) {
            return Ok(inner);
        }
        Ok(Box::new(FloatGroups { inner, nan: Vec::new(), far: Vec::new(), max: self.max, t }))
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let t = args.return_field.data_type().clone();
        let inner = self.inner.create_sliding_accumulator(args)?;
        Ok(Box::new(Sliding { inner, values: 0, nans: 0, fars: 0, max: self.max, t }))
    }

    fn is_descending(&self) -> Option<bool> {
        self.inner.is_descending()
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.inner.order_sensitivity()
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }

    /// File statistics leave NaN out: a float's bounds do not answer `min`/`max`.
    fn value_from_stats(&self, args: &StatisticsArgs) -> Option<ScalarValue> {
        if is_float(args.return_type) {
            return None;
        }
        self.inner.value_from_stats(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn set_monotonicity(&self, t: &DataType) -> SetMonotonicity {
        self.inner.inner().set_monotonicity(t)
    }
}

/// `min`/`max` of floats without groups: DataFusion's over the numbers, and whether a NaN and
/// the far infinity were seen (two extra state fields).
#[derive(Debug)]
struct FloatAccumulator {
    inner: Box<dyn Accumulator>,
    nan: bool,
    far: bool,
    max: bool,
    t: DataType,
}

impl Accumulator for FloatAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let (numbers, nan, far) = without_specials(&values[0], self.max)?;
        self.nan |= nan.true_count() > 0;
        self.far |= far.true_count() > 0;
        self.inner.update_batch(&[numbers])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let (inner, flags) = states.split_at(states.len() - 2);
        self.nan |= flags[0].as_boolean().true_count() > 0;
        self.far |= flags[1].as_boolean().true_count() > 0;
        self.inner.merge_batch(inner)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let mut state = self.inner.state()?;
        state.push(ScalarValue::Boolean(Some(self.nan)));
        state.push(ScalarValue::Boolean(Some(self.far)));
        Ok(state)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let numbers = self.inner.evaluate()?;
        match answer(self.max, numbers.is_null(), self.nan, self.far) {
            Some(v) => special_of(&self.t, v),
            None => Ok(numbers),
        }
    }

    fn size(&self) -> usize {
        self.inner.size() + std::mem::size_of::<Self>()
    }
}

/// `min`/`max` of floats per group: DataFusion's over the numbers, and whether each group saw
/// a NaN and the far infinity.
struct FloatGroups {
    inner: Box<dyn GroupsAccumulator>,
    nan: Vec<bool>,
    far: Vec<bool>,
    max: bool,
    t: DataType,
}

/// Sets `flags[g]` for each row's group `g` where `seen` is true and the filter keeps the row.
fn note(
    flags: &mut Vec<bool>,
    seen: &BooleanArray,
    groups: &[usize],
    filter: Option<&BooleanArray>,
    total: usize,
) {
    flags.resize(total, false);
    if seen.true_count() == 0 {
        return;
    }
    for (i, g) in groups.iter().enumerate() {
        let kept = filter.is_none_or(|f| f.is_valid(i) && f.value(i));
        if kept && seen.is_valid(i) && seen.value(i) {
            flags[*g] = true;
        }
    }
}

impl GroupsAccumulator for FloatGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        let (numbers, nan, far) = without_specials(&values[0], self.max)?;
        note(&mut self.nan, &nan, groups, filter, total);
        note(&mut self.far, &far, groups, filter, total);
        self.inner.update_batch(&[numbers], groups, filter, total)
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        let (inner, flags) = values.split_at(values.len() - 2);
        note(&mut self.nan, flags[0].as_boolean(), groups, filter, total);
        note(&mut self.far, flags[1].as_boolean(), groups, filter, total);
        self.inner.merge_batch(inner, groups, filter, total)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let numbers = self.inner.evaluate(emit_to)?;
        let (nan, far) = (emit_to.take_needed(&mut self.nan), emit_to.take_needed(&mut self.far));
        let special: Vec<Option<f64>> =
            (0..numbers.len()).map(|g| answer(self.max, numbers.is_null(g), nan[g], far[g])).collect();
        if special.iter().all(Option::is_none) {
            return Ok(numbers);
        }
        let replaced: BooleanArray = special.iter().map(|v| Some(v.is_some())).collect();
        let values =
            arrow::array::Float64Array::from(special.iter().map(|v| v.unwrap_or(0.0)).collect::<Vec<_>>());
        let values = arrow::compute::cast(&values, &self.t)?;
        Ok(zip(&replaced, &values, &numbers)?)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let mut state = self.inner.state(emit_to)?;
        state.push(Arc::new(BooleanArray::from(emit_to.take_needed(&mut self.nan))));
        state.push(Arc::new(BooleanArray::from(emit_to.take_needed(&mut self.far))));
        Ok(state)
    }

    fn convert_to_state(&self, values: &[ArrayRef], filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let (numbers, nan, far) = without_specials(&values[0], self.max)?;
        let mut state = self.inner.convert_to_state(&[numbers], filter)?;
        for flag in [nan, far] {
            let kept = match filter {
                Some(f) => arrow::compute::and_kleene(&flag, f)?,
                None => flag,
            };
            state.push(Arc::new(kept));
        }
        Ok(state)
    }

    fn supports_convert_to_state(&self) -> bool {
        self.inner.supports_convert_to_state()
    }

    fn size(&self) -> usize {
        self.inner.size() + self.nan.capacity() + self.far.capacity()
    }
}

/// `min`/`max` over a sliding window frame: DataFusion's over the frame's numbers, with the
/// frame's numbers, NaNs and far infinities counted, so a frame of NULLs answers NULL.
#[derive(Debug)]
struct Sliding {
    inner: Box<dyn Accumulator>,
    values: usize,
    nans: usize,
    fars: usize,
    max: bool,
    t: DataType,
}

impl Sliding {
    fn count(&mut self, values: &ArrayRef, sign: isize) -> Result<ArrayRef> {
        let (numbers, nan, far) = without_specials(values, self.max)?;
        let n = (numbers.len() - numbers.logical_null_count()) as isize;
        self.values = (self.values as isize + sign * n) as usize;
        self.nans = (self.nans as isize + sign * nan.true_count() as isize) as usize;
        self.fars = (self.fars as isize + sign * far.true_count() as isize) as usize;
        Ok(numbers)
    }
}

impl Accumulator for Sliding {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let numbers = self.count(&values[0], 1)?;
        self.inner.update_batch(&[numbers])
    }

    fn retract_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let numbers = self.count(&values[0], -1)?;
        self.inner.retract_batch(&[numbers])
    }

    fn supports_retract_batch(&self) -> bool {
        true
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.inner.merge_batch(states)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        self.inner.state()
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        if let Some(v) = answer(self.max, self.values == 0, self.nans > 0, self.fars > 0) {
            return special_of(&self.t, v);
        }
        if self.values == 0 {
            return ScalarValue::try_from(&self.t);
        }
        self.inner.evaluate()
    }

    fn size(&self) -> usize {
        self.inner.size() + std::mem::size_of::<Self>()
    }
}
