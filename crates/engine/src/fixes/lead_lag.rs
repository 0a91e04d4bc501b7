//! `lag`/`lead … IGNORE NULLS`, computed by skiff.

use std::any::Any;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::function::{ExpressionArgs, PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::{
    Documentation, LimitEffect, PartitionEvaluator, ReversedUDWF, Signature, WindowUDF, WindowUDFImpl,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;

/// `lag` and `lead` with `IGNORE NULLS` computed by skiff, over the whole partition. DataFusion
/// 53.1 gets them wrong three ways: over a whole partition it panics on values without a null
/// bitmap (apache/datafusion#23705, fixed by #23706) and answers NULL for every `lead` over
/// values with one (its offset's sign is lost); row by row, `lead` misses rows across runs of
/// NULLs (#25471, fix #25472). So an `IGNORE NULLS` call never runs row by row (it tells the
/// planner it needs its whole partition) and is computed here. `lag` with a negative offset
/// reads later rows, so no LIMIT is pushed below it (DataFusion says a `lag` never needs more
/// rows, #25471). Calls without `IGNORE NULLS` are DataFusion's.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct LeadLag {
    pub shift: Arc<WindowUDF>,
    /// `lag` (`lead` when false).
    pub lag: bool,
}

impl WindowUDFImpl for LeadLag {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.shift.name()
    }

    fn aliases(&self) -> &[String] {
        self.shift.aliases()
    }

    fn signature(&self) -> &Signature {
        self.shift.signature()
    }

    fn expressions(&self, args: ExpressionArgs) -> Vec<Arc<dyn PhysicalExpr>> {
        self.shift.expressions(args)
    }

    fn partition_evaluator(&self, args: PartitionEvaluatorArgs) -> Result<Box<dyn PartitionEvaluator>> {
        if !args.ignore_nulls() {
            return self.shift.partition_evaluator_factory(args);
        }
        let literal = |i: usize| -> Result<Option<ScalarValue>> {
            match args.input_exprs().get(i) {
                None => Ok(None),
                Some(e) => match e.as_any().downcast_ref::<Literal>() {
                    Some(l) => Ok(Some(l.value().clone())),
                    None => datafusion::common::not_impl_err!(
                        "{} takes literal arguments after the first",
                        self.name()
                    ),
                },
            }
        };
        // As DataFusion reads them: a NULL offset is 0; `lag` looks back, `lead` ahead, and
        // reversed (to share a sort with a window ordered the other way) the other way round.
        let offset = match literal(1)? {
            None => 1,
            Some(v) if v.is_null() => 0,
            Some(v) => i64::try_from(v.cast_to(&DataType::Int64)?)?,
        };
        let back = if self.lag { offset } else { offset.checked_neg().unwrap_or(i64::MAX) };
        let back = if args.is_reversed() { back.checked_neg().unwrap_or(i64::MAX) } else { back };
        let field = self.shift.field(WindowUDFFieldArgs::new(args.input_fields(), self.name()))?;
        let default = match literal(2)? {
            Some(v) if !v.data_type().is_null() => v.cast_to(field.data_type())?,
            _ => ScalarValue::try_from(field.data_type())?,
        };
        Ok(Box::new(IgnoringNulls { back, default }))
    }

    fn field(&self, args: WindowUDFFieldArgs) -> Result<FieldRef> {
        self.shift.field(args)
    }

    fn sort_options(&self) -> Option<arrow::compute::SortOptions> {
        self.shift.sort_options()
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.shift.coerce_types(args)
    }

    /// The reverse of `lag` is `lead` and back: it stays wrapped.
    fn reverse_expr(&self) -> ReversedUDWF {
        match self.shift.reverse_expr() {
            ReversedUDWF::Reversed(r) => {
                ReversedUDWF::Reversed(Arc::new(WindowUDF::new_from_impl(LeadLag {
                    shift: r,
                    lag: !self.lag,
                })))
            }
            other => other,
        }
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.shift.documentation()
    }

    fn limit_effect(&self, args: &[Arc<dyn PhysicalExpr>]) -> LimitEffect {
        let negative = args
            .get(1)
            .and_then(|a| a.as_any().downcast_ref::<Literal>())
            .and_then(|l| l.value().cast_to(&DataType::Int64).ok())
            .is_some_and(|v| matches!(v, ScalarValue::Int64(Some(n)) if n < 0));
        if self.lag && negative {
            return LimitEffect::Unknown;
        }
        self.shift.inner().limit_effect(args)
    }
}

/// `lag`/`lead … IGNORE NULLS` over a whole partition: the value `back` non-NULL rows before
/// each row (after, when negative), or `default` where there is none.
#[derive(Debug)]
struct IgnoringNulls {
    back: i64,
    default: ScalarValue,
}

impl PartitionEvaluator for IgnoringNulls {
    fn evaluate_all(&mut self, values: &[ArrayRef], num_rows: usize) -> Result<ArrayRef> {
        let values = values.first().ok_or_else(|| {
            datafusion::common::DataFusionError::Internal("lag/lead without a value".into())
        })?;
        let values = arrow::compute::cast(values, &self.default.data_type())?;
        Ok(shift_ignoring_nulls(&values, num_rows, self.back, &self.default)?)
    }

    fn is_causal(&self) -> bool {
        self.back > 0
    }

    /// Needs its whole partition: DataFusion's row-by-row `IGNORE NULLS` is the wrong one.
    fn supports_bounded_execution(&self) -> bool {
        false
    }
}

/// For each of the `rows` rows of `values`, the value `back` non-NULL rows earlier (later
/// when negative; the row itself when 0), or `default`.
fn shift_ignoring_nulls(
    values: &ArrayRef,
    rows: usize,
    back: i64,
    default: &ScalarValue,
) -> std::result::Result<ArrayRef, arrow::error::ArrowError> {
    use arrow::array::{Array, UInt32Array};
    if back == 0 || rows == 0 {
        return Ok(values.slice(0, rows));
    }
    let valid: Vec<u32> = (0..rows).filter(|&i| values.is_valid(i)).map(|i| i as u32).collect();
    let mut before = 0usize; // valid rows before row i
    let mut at: Vec<Option<u32>> = Vec::with_capacity(rows);
    for i in 0..rows {
        let here = values.is_valid(i);
        let k = back.unsigned_abs() as usize;
        let target = if back > 0 {
            before.checked_sub(k)
        } else {
            // The k-th valid row after i: the valid rows up to and including i come first.
            (before + usize::from(here) + k - 1).into()
        };
        at.push(target.and_then(|t| valid.get(t).copied()));
        before += usize::from(here);
    }
    let found = arrow::compute::take(values.as_ref(), &UInt32Array::from(at.clone()), None)?;
    if default.is_null() {
        return Ok(found);
    }
    let missing: arrow::array::BooleanArray = at.iter().map(|t| Some(t.is_some())).collect();
    arrow::compute::kernels::zip::zip(&missing, &found, &default.to_scalar()?)
}
