//! Functions whose answer can be far larger than their arguments, checked before they
//! allocate it. The memory pool counts operators' buffers, not the values a scalar function
//! returns, and a failed allocation aborts the process: `array_repeat(1, 1000000000000)` asked
//! for 8 TB. Each of these estimates, from its arguments, the largest value it would make and
//! what a whole call would take, and fails the query (400) over `--max-value-bytes`,
//! `--max-array-length`, or a quarter of `--memory-limit` per call. Constant folding calls the
//! same functions, so it is bounded too.
//!
//! Functions whose answer is at most a few times their arguments (`concat`, `||`, `upper`, …)
//! are checked too: called on their own answers through a chain of CTEs, twenty calls of
//! `s || s` make a value a million times longer.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{ScalarValue, exec_err};
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::type_coercion::binary::BinaryTypeCoercer;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Documentation, Expr, ExpressionPlacement, LogicalPlan, Operator,
    ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{self, Column};
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
    /// `concat(a, b, …)`, `a || b`: the sum of the arguments.
    Sum,
    /// `concat_ws(sep, a, b, …)`: the sum of the arguments, with a separator between each two.
    SumWithSeparator,
    /// `array_concat(a, b, …)`: the sum of the arrays' elements.
    ElementSum,
    /// `upper(s)`, `encode(s, 'hex')`, …: at most so many times the argument (a character's
    /// case can take three times its bytes; hex two).
    Scaled(u64),
}

/// Each of these, called on its own answer through a chain of CTEs, grows a value
/// exponentially; each answer is checked before it is made.
const GROWING: [(&str, Growth); 18] = [
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::Replace),
    ("array_repeat", Growth::Elements),
    ("array_resize", Growth::Elements),
    ("range", Growth::Series),
    ("generate_series", Growth::Series),
    ("concat", Growth::Sum),
    ("concat_ws", Growth::SumWithSeparator),
    ("array_concat", Growth::ElementSum),
    ("upper", Growth::Scaled(3)),
    ("lower", Growth::Scaled(3)),
    ("initcap", Growth::Scaled(3)),
    ("translate", Growth::Scaled(4)),
    ("encode", Growth::Scaled(2)),
    ("overlay", Growth::Sum),
];

/// Wraps the session's growing functions in their checks, and puts a checked function in the
/// place of every `||` on strings.
pub fn register(ctx: &mut SessionContext, bounds: ValueBounds) -> Result<()> {
    for (name, growth) in GROWING {
        let function = ctx.udf(name)?;
        ctx.register_udf(Arc::new(ScalarUDF::new_from_impl(Checked { function, growth, bounds })))?;
    }
    let operator = Arc::new(ScalarUDF::new_from_impl(ConcatOperator::default()));
    let checked = Checked { function: operator, growth: Growth::Sum, bounds };
    ctx.add_analyzer_rule(Arc::new(CheckedConcatOperator(Arc::new(ScalarUDF::new_from_impl(checked)))));
    Ok(())
}

/// Replaces `a || b` on strings (a `BinaryExpr`, which no function wrapper reaches) with
/// [`ConcatOperator`] in its checks. Runs after type coercion, so both sides have their final
/// types; `||` on arrays is `array_concat` by then.
#[derive(Debug)]
struct CheckedConcatOperator(Arc<ScalarUDF>);

impl AnalyzerRule for CheckedConcatOperator {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        super::fixes::rewrite_calls(plan, |e| match e {
            Expr::BinaryExpr(BinaryExpr { left, op: Operator::StringConcat, right }) => Transformed::yes(
                Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(&self.0), vec![*left, *right])),
            ),
            e => Transformed::no(e),
        })
    }

    fn name(&self) -> &str {
        "checked_concat_operator"
    }
}

/// `a || b` as a function: NULL when either side is, otherwise the two joined, computed by
/// DataFusion's own operator; named as the operator is, so no column's name changes.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ConcatOperator {
    signature: Signature,
}

impl Default for ConcatOperator {
    fn default() -> Self {
        Self { signature: Signature::any(2, Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for ConcatOperator {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "string_concat"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        BinaryTypeCoercer::new(&args[0], &Operator::StringConcat, &args[1]).get_result_type()
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        Ok(format!("{} || {}", args[0].schema_name(), args[1].schema_name()))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let rows = if scalar { 1 } else { args.number_rows };
        let [l, r] = [&args.args[0], &args.args[1]].map(|a| a.to_array(rows));
        let (l, r) = (l?, r?);
        let schema = Schema::new(vec![
            Field::new("l", l.data_type().clone(), true),
            Field::new("r", r.data_type().clone(), true),
        ]);
        let batch = RecordBatch::try_new(Arc::new(schema), vec![l, r])?;
        let join = expressions::BinaryExpr::new(
            Arc::new(Column::new("l", 0)),
            Operator::StringConcat,
            Arc::new(Column::new("r", 1)),
        );
        let joined = join.evaluate(&batch)?.into_array(rows)?;
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&joined, 0)?)
        } else {
            ColumnarValue::Array(joined)
        })
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    function: Arc<ScalarUDF>,
    growth: Growth,
    bounds: ValueBounds,
}

/// The function `f` checks, when `f` is a check.
pub fn wrapped(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
    f.as_any().downcast_ref::<Checked>().map(|c| c.function.as_ref())
}

impl Checked {
    /// How errors name the call: as the query wrote it.
    fn called(&self) -> String {
        match self.function.inner().as_any().is::<ConcatOperator>() {
            true => "||".to_string(),
            false => format!("{}()", self.function.name()),
        }
    }
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

/// At least the bytes of the `i`th argument's strings on all `rows`, found without looking at
/// each row (an offset, or the sizes of a view array's buffers).
fn total_bytes(args: &[ColumnarValue], i: usize, rows: usize) -> u64 {
    let array = match args.get(i) {
        Some(ColumnarValue::Array(a)) => a,
        Some(ColumnarValue::Scalar(v)) => {
            let len = v.try_as_str().flatten().map_or(0, str::len) as u64;
            return len.saturating_mul(rows as u64);
        }
        None => return 0,
    };
    let span = |first: usize, last: usize| (last - first) as u64;
    match array.data_type() {
        DataType::Utf8 => {
            let o = array.as_string::<i32>().offsets();
            span(o[0] as usize, o[o.len() - 1] as usize)
        }
        DataType::LargeUtf8 => {
            let o = array.as_string::<i64>().offsets();
            span(o[0] as usize, o[o.len() - 1] as usize)
        }
        DataType::Utf8View => {
            let v = array.as_string_view();
            let outside: usize = v.data_buffers().iter().map(|b| b.len()).sum();
            (12 * v.len() + outside) as u64
        }
        _ => 0,
    }
}

/// The elements of the `i`th argument's array on each row (0 for NULL or a non-array).
fn list_lengths(args: &[ColumnarValue], i: usize, rows: usize) -> Vec<u64> {
    let Some(Ok(array)) = args.get(i).map(|a| a.to_array(rows)) else { return vec![0; rows] };
    let len = |r: usize| -> u64 {
        if array.is_null(r) {
            return 0;
        }
        match array.data_type() {
            DataType::List(_) => array.as_list::<i32>().value_length(r) as u64,
            DataType::LargeList(_) => array.as_list::<i64>().value_length(r) as u64,
            DataType::FixedSizeList(_, n) => *n as u64,
            _ => 0,
        }
    };
    (0..rows).map(len).collect()
}

/// The row-wise sum of `each(i)` over the arguments `from..`.
fn summed(args: &[ColumnarValue], from: usize, rows: usize, each: impl Fn(usize) -> Vec<u64>) -> Vec<u64> {
    (from..args.len()).map(each).fold(vec![0; rows], |mut sum, v| {
        sum.iter_mut().zip(v).for_each(|(s, v)| *s = s.saturating_add(v));
        sum
    })
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

const BYTES: &str = "bytes (--max-value-bytes)";

impl Checked {
    /// Whether a string answer is surely within the bounds from the arguments' sizes in all,
    /// without a pass over the rows: the common case, kept cheap for `lower`, `concat` and `||`
    /// on every batch of a scan.
    fn small(&self, args: &[ColumnarValue], rows: usize) -> bool {
        let total = |from: usize| (from..args.len()).map(|i| total_bytes(args, i, rows)).sum::<u64>();
        let bound = match self.growth {
            Growth::Sum => total(0),
            Growth::SumWithSeparator => {
                total(1).saturating_add(total_bytes(args, 0, rows).saturating_mul(args.len() as u64))
            }
            Growth::Scaled(k) => total_bytes(args, 0, rows).saturating_mul(k),
            _ => return false,
        };
        bound <= self.bounds.max_value_bytes.min(self.bounds.max_call_bytes) as u64
    }

    /// Fails when the answer to `args` would be over the bounds.
    fn check(&self, args: &[ColumnarValue], rows: usize) -> Result<()> {
        // Scalars are one value, whatever the batch.
        let rows = if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) { 1 } else { rows };
        if self.small(args, rows) {
            return Ok(());
        }
        let count = |i| integers(args, i, rows).unwrap_or_else(|| vec![0; rows]);
        let (sizes, unit, limit, what): (Vec<u64>, u64, usize, &str) = match self.growth {
            Growth::Repeat => {
                let (s, n) = (lengths(args, 0, rows), count(1));
                let sizes = s.iter().zip(&n).map(|(s, n)| s.saturating_mul(*n.max(&0) as u64)).collect();
                (sizes, 1, self.bounds.max_value_bytes, BYTES)
            }
            Growth::Pad => {
                // Up to 4 bytes a character, or the fill's length if longer.
                let fill = lengths(args, 2, rows);
                let sizes = count(1)
                    .iter()
                    .zip(&fill)
                    .map(|(n, f)| (*n.max(&0) as u64).saturating_mul((*f).max(4)))
                    .collect();
                (sizes, 1, self.bounds.max_value_bytes, BYTES)
            }
            Growth::Replace => {
                // Every `from` in `s` may become `to`; an empty one (or a pattern matching
                // nothing) matches between every two bytes.
                let (s, from, to) = (lengths(args, 0, rows), lengths(args, 1, rows), lengths(args, 2, rows));
                let sizes = (0..rows)
                    .map(|r| s[r].saturating_add((s[r] / from[r].max(1) + 1).saturating_mul(to[r])))
                    .collect();
                (sizes, 1, self.bounds.max_value_bytes, BYTES)
            }
            Growth::Elements => {
                let sizes = count(1).iter().map(|n| *n.max(&0) as u64).collect();
                (sizes, 8, self.bounds.max_array_length, "elements (--max-array-length)")
            }
            Growth::Series => {
                (series(args, rows), 8, self.bounds.max_array_length, "elements (--max-array-length)")
            }
            Growth::Sum => {
                (summed(args, 0, rows, |i| lengths(args, i, rows)), 1, self.bounds.max_value_bytes, BYTES)
            }
            Growth::SumWithSeparator => {
                let parts = args.len().saturating_sub(2) as u64;
                let separators = lengths(args, 0, rows).into_iter().map(|s| s.saturating_mul(parts));
                let sizes = summed(args, 1, rows, |i| lengths(args, i, rows))
                    .into_iter()
                    .zip(separators)
                    .map(|(a, b)| a.saturating_add(b))
                    .collect();
                (sizes, 1, self.bounds.max_value_bytes, BYTES)
            }
            Growth::ElementSum => {
                let sizes = summed(args, 0, rows, |i| list_lengths(args, i, rows));
                (sizes, 8, self.bounds.max_array_length, "elements (--max-array-length)")
            }
            Growth::Scaled(k) => {
                let sizes = lengths(args, 0, rows).into_iter().map(|n| n.saturating_mul(k)).collect();
                (sizes, 1, self.bounds.max_value_bytes, BYTES)
            }
        };
        let largest = sizes.iter().copied().max().unwrap_or(0);
        if largest > limit as u64 {
            return exec_err!(
                "{} would return a value of {largest} {what}: over the limit of {limit}",
                self.called()
            );
        }
        let total = sizes.iter().fold(0u64, |t, s| t.saturating_add(s.saturating_mul(unit)));
        if total > self.bounds.max_call_bytes as u64 {
            return exec_err!(
                "{} would return {total} bytes for {rows} rows: over the limit of {} bytes per call \
                 (a quarter of --memory-limit)",
                self.called(),
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

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.function.inner().schema_name(args)
    }

    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        self.function.inner().placement(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.function.documentation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Disabled;
    use crate::testing::{answer, session};

    const BOUNDS: ValueBounds =
        ValueBounds { max_value_bytes: 1 << 20, max_array_length: 100_000, max_call_bytes: 16 << 20 };

    fn bounded() -> SessionContext {
        let mut ctx = session(&Disabled::default(), 256 << 20, &[]);
        register(&mut ctx, BOUNDS).unwrap();
        ctx
    }

    /// `levels` CTEs, each `step` applied to the one before, from `start`.
    fn chain(start: &str, step: &str, levels: usize) -> String {
        let mut sql = format!("WITH c0 AS (SELECT {start} AS s)");
        for i in 1..=levels {
            sql += &format!(", c{i} AS (SELECT {step} AS s FROM c{})", i - 1);
        }
        sql + &format!(" SELECT length(s) AS n FROM c{levels}")
    }

    #[tokio::test]
    async fn values_grown_through_a_chain_of_ctes_stop_at_the_bound() {
        let ctx = bounded();
        for (start, step, what) in [
            ("repeat('x', 1000)", "s || s", "||"),
            ("repeat('x', 1000)", "concat(s, s, s)", "concat"),
            ("repeat('x', 1000)", "concat_ws(s, s, s)", "concat_ws"),
            ("repeat('x', 1000)", "regexp_replace(s, 'x', 'xx', 'g')", "regexp_replace"),
        ] {
            let sql = chain(start, step, 30);
            let text = answer(&ctx, &sql).await;
            let what = if what == "||" { what.to_string() } else { format!("{what}()") };
            assert!(
                text.contains(&format!("{what} would return")) && text.contains("--max-value-bytes"),
                "{sql}: {text}"
            );
        }
        // One call: 'ΐ' in upper case is three characters of two bytes each.
        let text = answer(&ctx, "SELECT length(upper(repeat('ΐ', 400000)))").await;
        assert!(text.contains("upper() would return a value of 2400000 bytes"), "{text}");
        let arrays = "WITH c0 AS (SELECT range(1000) AS s), c1 AS (SELECT array_concat(s, s) AS s FROM c0), \
                      c2 AS (SELECT array_concat(s, s, s, s) AS s FROM c1), c3 AS (SELECT array_concat(s, s, s, s) AS s FROM c2), \
                      c4 AS (SELECT array_concat(s, s, s, s) AS s FROM c3) SELECT cardinality(s) FROM c4";
        let text = answer(&ctx, arrays).await;
        assert!(
            text.contains("array_concat() would return") && text.contains("--max-array-length"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn within_the_bounds_the_answers_are_the_same() {
        let plain = session(&Disabled::default(), 256 << 20, &[]);
        let ctx = bounded();
        for sql in [
            chain("repeat('x', 1000)", "s || s", 5),
            chain("'ab'", "concat(s, NULL, s)", 4),
            chain("'ß'", "upper(s)", 3),
            "SELECT 'a' || 'b', 'a' || NULL, NULL || 'b', arrow_typeof(arrow_cast('a', 'Utf8View') || 'b'), \
             arrow_typeof(arrow_cast('a', 'LargeUtf8') || 'b'), 1 || 'x', 'x' || 2.5"
                .to_string(),
            "SELECT s || t AS st, s || 'x', concat_ws('-', s, t) FROM (VALUES ('a', 'b'), (NULL, 'c'), ('d', NULL)) v(s, t)"
                .to_string(),
            "SELECT array_concat([1, 2], [3]), [1] || [2, 3], cardinality(array_concat(range(10), range(5)))".to_string(),
        ] {
            assert_eq!(answer(&ctx, &sql).await, answer(&plain, &sql).await, "{sql}");
        }
    }
}
