//! Functions whose answer can be far larger than their arguments, checked before they
//! allocate it. The memory pool counts operators' buffers, not the values a scalar function
//! returns, and a failed allocation aborts the process: `array_repeat(1, 1000000000000)` asked
//! for 8 TB. Each of these estimates, from its arguments, the largest value it would make and
//! what a whole call would take, and fails the query (400) over `--max-value-bytes`,
//! `--max-array-length`, or a quarter of `--memory-limit` per call. Constant folding calls the
//! same functions, so it is bounded too.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::{ScalarValue, exec_err};
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExpressionPlacement, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How large a function's answer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ValueBounds {
    /// The longest string a function may return, in bytes.
    pub max_value_bytes: usize,
    /// The most elements an array (or a series) a function returns may have.
    pub max_array_length: usize,
    /// What one call, over a whole batch, may return in all.
    pub max_call_bytes: usize,
}

/// How a function's answer grows with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(s, n)`: `n` times `s`.
    Repeat,
    /// `lpad(s, n[, fill])`, `rpad`: `n` characters.
    Pad,
    /// `replace(s, from, to)`: every `from` in `s` may become `to`.
    Replace,
    /// `array_repeat(x, n)`, `array_resize(a, n[, x])`: `n` elements.
    Elements,
    /// `range(start, stop[, step])`, `generate_series`: one element per step.
    Series,
}

const GROWING: [(&str, Growth); 8] = [
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("replace", Growth::Replace),
    ("array_repeat", Growth::Elements),
    ("array_resize", Growth::Elements),
    ("range", Growth::Series),
    ("generate_series", Growth::Series),
];

/// Wraps the session's growing functions in their checks.
pub fn register(ctx: &mut SessionContext, bounds: ValueBounds) -> Result<()> {
    for (name, growth) in GROWING {
        let function = ctx.udf(name)?;
        ctx.register_udf(Arc::new(ScalarUDF::new_from_impl(Checked { function, growth, bounds })))?;
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    function: Arc<ScalarUDF>,
    growth: Growth,
    bounds: ValueBounds,
}

/// The `i`th argument's value on each row (NULL as 0), as i64; `None` when it is not an
/// integer.
fn integers(args: &[ColumnarValue], i: usize, rows: usize) -> Option<Vec<i64>> {
    let array = args.get(i)?.to_array(rows).ok()?;
    let array = arrow::compute::cast(&array, &DataType::Int64).ok()?;
    let ints = array.as_primitive::<Int64Type>();
    Some((0..rows).map(|r| if ints.is_valid(r) { ints.value(r) } else { 0 }).collect())
}

/// The byte length of the `i`th argument's string on each row (0 for NULL or a non-string).
fn lengths(args: &[ColumnarValue], i: usize, rows: usize) -> Vec<u64> {
    let Some(Ok(array)) = args.get(i).map(|a| a.to_array(rows)) else { return vec![0; rows] };
    let len = |r: usize| -> u64 {
        if array.is_null(r) {
            return 0;
        }
        match array.data_type() {
            DataType::Utf8 => array.as_string::<i32>().value(r).len() as u64,
            DataType::LargeUtf8 => array.as_string::<i64>().value(r).len() as u64,
            DataType::Utf8View => array.as_string_view().value(r).len() as u64,
            _ => 0,
        }
    };
    (0..rows).map(len).collect()
}

/// Counts the elements `range`/`generate_series` would make on each row: integers directly;
/// dates and timestamps by their span over the step (months as 28 days, so never fewer).
fn series(args: &[ColumnarValue], rows: usize) -> Vec<u64> {
    let arrays: Vec<ArrayRef> = args.iter().filter_map(|a| a.to_array(rows).ok()).collect();
    let at = |i: usize, r: usize| -> Option<ScalarValue> {
        arrays.get(i).and_then(|a| ScalarValue::try_from_array(a, r).ok()).filter(|v| !v.is_null())
    };
    let micros = |v: &ScalarValue| -> Option<i128> {
        match v.cast_to(&DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None)).ok()? {
            ScalarValue::TimestampMicrosecond(Some(t), _) => Some(t as i128),
            _ => None,
        }
    };
    (0..rows)
        .map(|r| {
            let (start, stop) = match (at(0, r), at(1, r)) {
                (Some(a), Some(b)) => (a, b),
                // One argument: `range(n)` counts from 0.
                (Some(b), None) => (ScalarValue::Int64(Some(0)), b),
                _ => return 0,
            };
            let (span, step): (i128, i128) =
                match (start.cast_to(&DataType::Int64), stop.cast_to(&DataType::Int64)) {
                    (Ok(ScalarValue::Int64(Some(a))), Ok(ScalarValue::Int64(Some(b))))
                        if start.data_type().is_integer() =>
                    {
                        let step = match at(2, r).map(|s| s.cast_to(&DataType::Int64)) {
                            Some(Ok(ScalarValue::Int64(Some(s)))) => s as i128,
                            _ => 1,
                        };
                        (b as i128 - a as i128, step)
                    }
                    _ => {
                        let (Some(a), Some(b)) = (micros(&start), micros(&stop)) else { return 0 };
                        let step = match at(2, r) {
                            Some(ScalarValue::IntervalMonthDayNano(Some(i))) => {
                                i.months as i128 * 28 * 86_400_000_000
                                    + i.days as i128 * 86_400_000_000
                                    + i.nanoseconds as i128 / 1000
                            }
                            Some(ScalarValue::IntervalDayTime(Some(i))) => {
                                i.days as i128 * 86_400_000_000 + i.milliseconds as i128 * 1000
                            }
                            Some(ScalarValue::IntervalYearMonth(Some(m))) => m as i128 * 28 * 86_400_000_000,
                            _ => 86_400_000_000,
                        };
                        (b - a, step)
                    }
                };
            if step == 0 || (span != 0 && span.signum() != step.signum()) {
                return 0;
            }
            u64::try_from(span / step + 1).unwrap_or(u64::MAX)
        })
        .collect()
}

impl Checked {
    /// Fails when the answer to `args` would be over the bounds.
    fn check(&self, args: &[ColumnarValue], rows: usize) -> Result<()> {
        // Scalars are one value, whatever the batch.
        let rows = if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) { 1 } else { rows };
        let count = |i| integers(args, i, rows).unwrap_or_else(|| vec![0; rows]);
        let (sizes, unit, limit, what): (Vec<u64>, u64, usize, &str) = match self.growth {
            Growth::Repeat => {
                let (s, n) = (lengths(args, 0, rows), count(1));
                let sizes = s.iter().zip(&n).map(|(s, n)| s.saturating_mul(*n.max(&0) as u64)).collect();
                (sizes, 1, self.bounds.max_value_bytes, "bytes (--max-value-bytes)")
            }
            Growth::Pad => {
                // Up to 4 bytes a character, or the fill's length if longer.
                let fill = lengths(args, 2, rows);
                let sizes = count(1)
                    .iter()
                    .zip(&fill)
                    .map(|(n, f)| (*n.max(&0) as u64).saturating_mul((*f).max(4)))
                    .collect();
                (sizes, 1, self.bounds.max_value_bytes, "bytes (--max-value-bytes)")
            }
            Growth::Replace => {
                let (s, from, to) = (lengths(args, 0, rows), lengths(args, 1, rows), lengths(args, 2, rows));
                let sizes = (0..rows)
                    .map(|r| s[r].saturating_add((s[r] / from[r].max(1)).saturating_mul(to[r])))
                    .collect();
                (sizes, 1, self.bounds.max_value_bytes, "bytes (--max-value-bytes)")
            }
            Growth::Elements => {
                let sizes = count(1).iter().map(|n| *n.max(&0) as u64).collect();
                (sizes, 8, self.bounds.max_array_length, "elements (--max-array-length)")
            }
            Growth::Series => {
                (series(args, rows), 8, self.bounds.max_array_length, "elements (--max-array-length)")
            }
        };
        let largest = sizes.iter().copied().max().unwrap_or(0);
        if largest > limit as u64 {
            return exec_err!(
                "{}() would return a value of {largest} {what}: over the limit of {limit}",
                self.function.name()
            );
        }
        let total = sizes.iter().fold(0u64, |t, s| t.saturating_add(s.saturating_mul(unit)));
        if total > self.bounds.max_call_bytes as u64 {
            return exec_err!(
                "{}() would return {total} bytes for {rows} rows: over the limit of {} bytes per call \
                 (a quarter of --memory-limit)",
                self.function.name(),
                self.bounds.max_call_bytes
            );
        }
        Ok(())
    }
}

impl ScalarUDFImpl for Checked {
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

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.function.return_field_from_args(args)
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.function.coerce_types(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.check(&args.args, args.number_rows)?;
        self.function.invoke_with_args(args)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        self.function.simplify(args, info)
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.function.inner().placement(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.function.documentation()
    }
}
