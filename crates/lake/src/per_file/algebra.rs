//! What a file's column bounds decide: conditions that hold for all of its rows or for none,
//! and expressions that take one value over it, because they move one way with their one
//! column and agree at both of its bounds.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Schema};
use datafusion::common::ScalarValue;
use datafusion::common::Statistics;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::functions::datetime::date_bin::DateBinFunc;
use datafusion::functions::datetime::date_part::DatePartFunc;
use datafusion::functions::datetime::date_trunc::DateTruncFunc;
use datafusion::functions::math::ceil::CeilFunc;
use datafusion::functions::math::floor::FloorFunc;
use datafusion::functions::math::round::RoundFunc;
use datafusion::functions::math::trunc::TruncFunc;
use datafusion::logical_expr::{Operator, ScalarUDF, ScalarUDFImpl};
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, Literal, NegativeExpr, TryCastExpr,
};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

/// A column's lower and upper bound in a file, when they bound every row: exact, the column
/// has no nulls there, and its type has no NaN.
pub(super) fn bounds<'a>(
    stats: &'a Statistics,
    table: &Schema,
    c: usize,
) -> Option<(&'a ScalarValue, &'a ScalarValue)> {
    let s = stats.column_statistics.get(c)?;
    if table.field(c).data_type().is_floating() || s.null_count != Precision::Exact(0) {
        return None;
    }
    match (&s.min_value, &s.max_value) {
        (Precision::Exact(lo), Precision::Exact(hi)) if !lo.is_null() && !hi.is_null() => Some((lo, hi)),
        _ => None,
    }
}

/// A condition `column <op> literal` (or the other way round): the column, the operator as
/// if the column were on the left, and the literal.
pub(super) fn comparison(e: &Arc<dyn PhysicalExpr>) -> Option<(usize, Operator, &ScalarValue)> {
    let b = e.as_any().downcast_ref::<BinaryExpr>()?;
    fn column(e: &Arc<dyn PhysicalExpr>) -> Option<usize> {
        e.as_any().downcast_ref::<Column>().map(|c| c.index())
    }
    fn literal(e: &Arc<dyn PhysicalExpr>) -> Option<&ScalarValue> {
        e.as_any().downcast_ref::<Literal>().map(|l| l.value())
    }
    let (c, op, v) = match (column(b.left()), literal(b.right())) {
        (Some(c), Some(v)) => (c, *b.op(), v),
        _ => (column(b.right())?, b.op().swap()?, literal(b.left())?),
    };
    let compares = matches!(
        op,
        Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
    );
    (compares && !v.is_null()).then_some((c, op, v))
}

/// Whether `condition` holds for every row within the bounds (`Some(true)`), for none
/// (`Some(false)`), or may hold for some (`None`).
pub(super) fn decided<'a>(
    condition: &Arc<dyn PhysicalExpr>,
    bounds: impl Fn(usize) -> Option<(&'a ScalarValue, &'a ScalarValue)>,
) -> Option<bool> {
    let (c, op, v) = comparison(condition)?;
    let (lo, hi) = bounds(c)?;
    let (lo, hi) = (lo.partial_cmp(v)?, hi.partial_cmp(v)?);
    use Ordering::{Equal, Greater, Less};
    let (all, none) = match op {
        Operator::Lt => (hi == Less, lo != Less),
        Operator::LtEq => (hi != Greater, lo == Greater),
        Operator::Gt => (lo == Greater, hi != Greater),
        Operator::GtEq => (lo != Less, hi == Less),
        Operator::Eq => (lo == Equal && hi == Equal, lo == Greater || hi == Less),
        Operator::NotEq => (lo == Greater || hi == Less, lo == Equal && hi == Equal),
        _ => return None,
    };
    if all {
        Some(true)
    } else if none {
        Some(false)
    } else {
        None
    }
}

/// `e`'s value over the file as a literal, when `e` reads one column, moves with it in one
/// direction, and has the same value at both of its bounds: then every row has that value.
pub(super) fn constant<'a>(
    e: &Arc<dyn PhysicalExpr>,
    table: &Schema,
    wrapped: Wrapped,
    bounds: impl Fn(usize) -> Option<(&'a ScalarValue, &'a ScalarValue)>,
) -> Option<Arc<dyn PhysicalExpr>> {
    let c = single_column(e, table, wrapped)?;
    let (lo, hi) = bounds(c)?;
    let field = table.field(c).clone().with_nullable(true);
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![field])),
        vec![ScalarValue::iter_to_array([lo.clone(), hi.clone()]).ok()?],
    )
    .ok()?;
    // Arithmetic checked for overflow: the rows wrap on overflow, and a wrapped product could
    // take the same value at both bounds while rows between them differ. Without overflow at
    // the bounds there is none between them, as every step is monotonic.
    let at_zero = Arc::clone(e)
        .transform_up(|n| {
            let any = n.as_any();
            Ok(if let Some(col) = any.downcast_ref::<Column>() {
                Transformed::yes(Arc::new(Column::new(col.name(), 0)) as Arc<dyn PhysicalExpr>)
            } else if let Some(b) = any.downcast_ref::<BinaryExpr>() {
                let checked = BinaryExpr::new(Arc::clone(b.left()), *b.op(), Arc::clone(b.right()));
                Transformed::yes(Arc::new(checked.with_fail_on_overflow(true)) as Arc<dyn PhysicalExpr>)
            } else {
                Transformed::no(n)
            })
        })
        .ok()?
        .data;
    // An expression that fails at a bound (an overflow) is left to each row.
    let values = at_zero.evaluate(&batch).ok()?.into_array(2).ok()?;
    let (first, last) =
        (ScalarValue::try_from_array(&values, 0).ok()?, ScalarValue::try_from_array(&values, 1).ok()?);
    (!first.is_null() && first == last).then(|| Arc::new(Literal::new(first)) as Arc<dyn PhysicalExpr>)
}

/// The one column `e` reads, when `e` is more than that column and monotonic in it.
pub(super) fn single_column(e: &Arc<dyn PhysicalExpr>, table: &Schema, wrapped: Wrapped) -> Option<usize> {
    if e.as_any().is::<Column>() {
        return None;
    }
    let columns = collect_columns(e);
    let [c] = columns.iter().collect::<Vec<_>>()[..] else { return None };
    matches!(direction(e, table, wrapped)?, Direction::Up | Direction::Down).then_some(c.index())
}

/// How an expression moves as its one column grows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Direction {
    Constant,
    Up,
    Down,
}

impl Direction {
    fn flip(self) -> Self {
        match self {
            Self::Up => Self::Down,
            Self::Down => Self::Up,
            Self::Constant => Self::Constant,
        }
    }

    fn plus(self, other: Self) -> Option<Self> {
        match (self, other) {
            (Self::Constant, d) | (d, Self::Constant) => Some(d),
            (a, b) if a == b => Some(a),
            _ => None,
        }
    }
}

/// The direction of `e`, for the expressions whose direction is known: arithmetic with
/// constants, order-preserving casts, and the functions that bucket time or round numbers.
fn direction(e: &Arc<dyn PhysicalExpr>, table: &Schema, wrapped: Wrapped) -> Option<Direction> {
    let any = e.as_any();
    if any.is::<Column>() {
        return Some(Direction::Up);
    }
    if any.is::<Literal>() {
        return Some(Direction::Constant);
    }
    if let Some(b) = any.downcast_ref::<BinaryExpr>() {
        let (l, r) = (direction(b.left(), table, wrapped)?, direction(b.right(), table, wrapped)?);
        return match b.op() {
            Operator::Plus => l.plus(r),
            Operator::Minus => l.plus(r.flip()),
            Operator::Multiply | Operator::Divide => match (l, r) {
                (Direction::Constant, Direction::Constant) => Some(Direction::Constant),
                (d, Direction::Constant) => scaled(d, b.right()),
                (Direction::Constant, d) if *b.op() == Operator::Multiply => scaled(d, b.left()),
                _ => None,
            },
            _ => None,
        };
    }
    if let Some(n) = any.downcast_ref::<NegativeExpr>() {
        return direction(n.arg(), table, wrapped).map(Direction::flip);
    }
    let cast = any
        .downcast_ref::<CastExpr>()
        .map(|c| (c.expr(), c.cast_type()))
        .or_else(|| any.downcast_ref::<TryCastExpr>().map(|c| (c.expr(), c.cast_type())));
    if let Some((inner, to)) = cast {
        let from = inner.data_type(table).ok()?;
        let instant =
            |t: &DataType| matches!(t, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64);
        let keeps_order = from.is_numeric() && to.is_numeric() || instant(&from) && instant(to);
        return keeps_order.then(|| direction(inner, table, wrapped)).flatten();
    }
    let f = any.downcast_ref::<ScalarFunctionExpr>()?;
    let args = f.args();
    // The argument that moves; every other one must be constant.
    let moving = match Function::of(f.fun(), wrapped)? {
        Function::TimeBucket => 1,
        Function::Rounding => 0,
        Function::DatePart => {
            let part = args.first()?.as_any().downcast_ref::<Literal>()?.value().try_as_str()??;
            if !matches!(part.to_ascii_lowercase().as_str(), "epoch" | "year") {
                return None;
            }
            1
        }
    };
    for (i, a) in args.iter().enumerate() {
        if i != moving && direction(a, table, wrapped)? != Direction::Constant {
            return None;
        }
    }
    direction(args.get(moving)?, table, wrapped)
}

/// The function a wrapper of a built-in evaluates (a faster path or a fix the engine
/// registers under the built-in's name), or `None` for any other function. The lake cannot
/// name the engine's wrappers, so the engine says what is under them.
pub type Wrapped = fn(&dyn ScalarUDFImpl) -> Option<&ScalarUDF>;

/// The built-ins whose direction is known, told apart by their implementation: a function
/// registered under one of their names is any function at all.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Function {
    /// `date_trunc`, `date_bin`: up with their timestamp, the second argument.
    TimeBucket,
    /// `floor`, `ceil`, `trunc`, `round`: up with their first argument.
    Rounding,
    /// `date_part`: up with its timestamp for the parts that never wrap around.
    DatePart,
}

impl Function {
    fn of(f: &ScalarUDF, wrapped: Wrapped) -> Option<Self> {
        let any = f.inner().as_any();
        if any.is::<DateTruncFunc>() || any.is::<DateBinFunc>() {
            Some(Self::TimeBucket)
        } else if any.is::<FloorFunc>()
            || any.is::<CeilFunc>()
            || any.is::<TruncFunc>()
            || any.is::<RoundFunc>()
        {
            Some(Self::Rounding)
        } else if any.is::<DatePartFunc>() {
            Some(Self::DatePart)
        } else {
            Self::of(wrapped(f.inner().as_ref())?, wrapped)
        }
    }
}

/// `d` multiplied or divided by the constant `by`: kept when it is positive, flipped when
/// negative.
fn scaled(d: Direction, by: &Arc<dyn PhysicalExpr>) -> Option<Direction> {
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    let v = ScalarValue::try_from_array(&by.evaluate(&one_row).ok()?.into_array(1).ok()?, 0).ok()?;
    match v.partial_cmp(&ScalarValue::new_zero(&v.data_type()).ok()?)? {
        Ordering::Greater => Some(d),
        Ordering::Less => Some(d.flip()),
        Ordering::Equal => None,
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{FieldRef, TimestampMicrosecondType};
    use datafusion::common::{Result, Statistics};
    use datafusion::execution::FunctionRegistry;
    use datafusion::logical_expr::{
        ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, Signature, Volatility,
    };
    use datafusion::prelude::SessionContext;

    use super::super::fixtures::{at, expr, expr_in, file, micros, no_wrappers, table};
    use super::*;

    fn decide(condition: &str, stats: &Statistics) -> Option<bool> {
        decide_expr(&expr(condition), stats)
    }

    fn decide_expr(condition: &Arc<dyn PhysicalExpr>, stats: &Statistics) -> Option<bool> {
        let table = table();
        decided(condition, |c| bounds(stats, &table, c))
    }

    fn folded(e: &str, stats: &Statistics) -> Option<String> {
        let table = table();
        constant(&expr(e), &table, no_wrappers, |c| bounds(stats, &table, c)).map(|l| l.to_string())
    }

    #[test]
    fn conditions_are_decided_by_the_bounds() {
        let day = file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 20, 0);
        // Inside the range, outside it, across its edge.
        assert_eq!(decide_expr(&at(Operator::GtEq, "2026-09-07 00:00:00"), &day), Some(true));
        assert_eq!(decide_expr(&at(Operator::Lt, "2026-09-08 00:00:00"), &day), Some(false));
        assert_eq!(decide_expr(&at(Operator::Lt, "2026-09-08 12:00:00"), &day), None);
        // Each operator at the edges of n's [10, 20], the literal on either side.
        let cases = [
            ("n < 21", Some(true)),
            ("n < 20", None),
            ("n < 10", Some(false)),
            ("n <= 20", Some(true)),
            ("n <= 9", Some(false)),
            ("n > 9", Some(true)),
            ("n > 20", Some(false)),
            ("n >= 10", Some(true)),
            ("n >= 21", Some(false)),
            ("n = 15", None),
            ("n = 30", Some(false)),
            ("n <> 30", Some(true)),
            ("n <> 15", None),
            ("21 > n", Some(true)),
            ("10 > n", Some(false)),
        ];
        for (condition, want) in cases {
            assert_eq!(decide(condition, &day), want, "{condition}");
        }
        let one = file("2026-09-08 00:00:00", "2026-09-08 00:00:00", 15, 15, 0);
        assert_eq!(decide("n = 15", &one), Some(true));
        assert_eq!(decide("n <> 15", &one), Some(false));
        // Not decided: a column with nulls (they fail every comparison), a float column (its
        // bounds leave NaN out), a condition that is not a comparison with a literal.
        assert_eq!(decide("n < 21", &file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 20, 1)), None);
        assert_eq!(decide("x < 2", &day), None);
        assert_eq!(decide("n + 1 < 100", &day), None);
        assert_eq!(decide("n < NULL", &day), None);
    }

    #[test]
    fn expressions_constant_over_the_bounds_become_literals() {
        let day = file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 19, 0);
        // A week and a day bucket of a day's file; retention's week number.
        let week = folded("date_trunc('week', ts)", &day).expect("folded");
        assert_eq!(week, micros("2026-09-07 00:00:00").to_string());
        assert!(folded("date_trunc('day', ts)", &day).is_some());
        let weeks = "CAST(floor((date_part('epoch', ts) - 1785715200) / 604800) AS BIGINT)";
        assert_eq!(folded(weeks, &day).as_deref(), Some("5"));
        // Integer arithmetic in either direction.
        assert_eq!(folded("n / 10", &day).as_deref(), Some("1"));
        assert_eq!(folded("(100 - n) / 100", &day).as_deref(), Some("0"));
        assert_eq!(folded("-n / 100", &day).as_deref(), Some("0"));
        // Not constant: the bounds give two values; an hour of a day's file.
        assert_eq!(folded("n / 5", &day), None);
        assert_eq!(folded("date_trunc('hour', ts)", &day), None);
        // Not monotonic, so equal values at the bounds prove nothing: the hour of day, n % 10.
        let span = file("2026-09-08 05:00:00", "2026-09-09 05:30:00", 10, 20, 0);
        assert_eq!(folded("date_part('hour', ts)", &span), None);
        assert_eq!(folded("n % 10", &span), None);
        assert_eq!(folded("100 / n", &span), None);
        // A product that wraps takes one value at both bounds (10 and 18 times 2^62) but not
        // between them.
        let wraps = file("2026-09-08 00:00:00", "2026-09-08 01:00:00", 10, 18, 0);
        assert_eq!(folded("n * 4611686018427387904", &wraps), None);
        assert_eq!(folded("n * 2 / 100", &wraps).as_deref(), Some("0"));
        // Not for a column with nulls or a float, nor for a bare column.
        assert_eq!(folded("n / 100", &file("2026-09-08 00:00:00", "2026-09-08 01:00:00", 10, 19, 3)), None);
        assert_eq!(folded("floor(x * 0.1)", &day), None);
        assert_eq!(folded("n", &file("2026-09-08 00:00:00", "2026-09-08 00:00:00", 15, 15, 0)), None);
    }

    /// A function named `date_trunc` that is not DataFusion's: the hour of the day, which is
    /// 5 at both ends of a file from 05:00 one day to 05:30 the next and not between them.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct HourOfDay(Signature);

    impl ScalarUDFImpl for HourOfDay {
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn name(&self) -> &str {
            "date_trunc"
        }
        fn signature(&self) -> &Signature {
            &self.0
        }
        fn return_type(&self, _: &[DataType]) -> Result<DataType> {
            Ok(DataType::Int64)
        }
        fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
            let ts = args.args[1].to_array(args.number_rows)?;
            let hours: Int64Array = ts
                .as_primitive::<TimestampMicrosecondType>()
                .unary(|t| t.div_euclid(3_600_000_000).rem_euclid(24));
            Ok(ColumnarValue::Array(Arc::new(hours)))
        }
    }

    /// A wrapper of a built-in, as the engine's faster paths are: the same name and answers.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct Wrapper(Arc<ScalarUDF>);

    impl ScalarUDFImpl for Wrapper {
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn name(&self) -> &str {
            self.0.name()
        }
        fn signature(&self) -> &Signature {
            self.0.signature()
        }
        fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
            self.0.coerce_types(args)
        }
        fn return_type(&self, args: &[DataType]) -> Result<DataType> {
            self.0.return_type(args)
        }
        fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
            self.0.return_field_from_args(args)
        }
        fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
            self.0.invoke_with_args(args)
        }
    }

    fn under_wrapper(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
        f.as_any().downcast_ref::<Wrapper>().map(|w| w.0.as_ref())
    }

    fn folded_with(e: &Arc<dyn PhysicalExpr>, wrapped: Wrapped, stats: &Statistics) -> Option<String> {
        let table = table();
        constant(e, &table, wrapped, |c| bounds(stats, &table, c)).map(|l| l.to_string())
    }

    #[test]
    fn functions_are_known_by_their_implementation_not_their_name() {
        let table = table();
        let ctx = SessionContext::new();
        ctx.register_udf(ScalarUDF::new_from_impl(HourOfDay(Signature::any(2, Volatility::Immutable))));
        let impostor = expr_in(&ctx, "date_trunc('day', ts)");
        assert!(impostor.to_string().starts_with("date_trunc("), "{impostor}");
        assert_eq!(direction(&impostor, &table, no_wrappers), None);
        let span = file("2026-09-08 05:00:00", "2026-09-09 05:30:00", 10, 20, 0);
        assert_eq!(folded_with(&impostor, no_wrappers, &span), None);
        // DataFusion's own moves up with the timestamp.
        assert_eq!(direction(&expr("date_trunc('day', ts)"), &table, no_wrappers), Some(Direction::Up));
    }

    #[test]
    fn a_wrapped_built_in_is_known_when_the_session_says_what_it_wraps() {
        let ctx = SessionContext::new();
        let date_trunc = ctx.udf("date_trunc").unwrap();
        ctx.register_udf(ScalarUDF::new_from_impl(Wrapper(date_trunc)));
        let week = expr_in(&ctx, "date_trunc('week', ts)");
        let day = file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 19, 0);
        assert_eq!(folded_with(&week, under_wrapper, &day), Some(micros("2026-09-07 00:00:00").to_string()));
        assert_eq!(folded_with(&week, no_wrappers, &day), None);
    }
}
