//! Workarounds for DataFusion 53.1 bugs that give wrong answers or panic. Each names the
//! upstream issue or fix; when skiff's DataFusion has it, the workaround goes. They are not
//! optimizations and have no off switch.

use std::any::Any;
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::functions_window::lead_lag::{lag_udwf, lead_udwf};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::function::{ExpressionArgs, PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::{
    AggregateUDF, ColumnarValue, Documentation, Expr, LimitEffect, LogicalPlan, PartitionEvaluator,
    ReversedUDWF, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, WindowUDF, WindowUDFImpl,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;
use datafusion::prelude::SessionContext;

/// `FILTER (WHERE p)` keeps the rows where `p` is true: written `p IS TRUE`, so no aggregate
/// sees a NULL in its filter. DataFusion 53.1's groups-accumulator helpers
/// (`accumulate_indices`, behind every grouped `count`, and `accumulate_multiple`, behind
/// `corr`) read a filter's value bits and ignore its null mask, so a row where `p` is NULL
/// counted whenever the bit under the NULL was set (`count(*) FILTER (WHERE revenue < 50)`
/// per group answered 14,411 instead of 123). Fixed upstream by apache/datafusion#22068
/// (issue #22067), in the releases after 53.
#[derive(Debug, Default)]
pub struct FilterNullsAreFalse;

impl AnalyzerRule for FilterNullsAreFalse {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_calls(plan, |e| match e {
            Expr::AggregateFunction(mut f) if needs_is_true(f.params.filter.as_deref()) => {
                f.params.filter = f.params.filter.map(|p| Box::new(p.is_true()));
                Transformed::yes(Expr::AggregateFunction(f))
            }
            Expr::WindowFunction(mut w) if needs_is_true(w.params.filter.as_deref()) => {
                w.params.filter = w.params.filter.map(|p| Box::new(p.is_true()));
                Transformed::yes(Expr::WindowFunction(w))
            }
            e => Transformed::no(e),
        })
    }

    fn name(&self) -> &str {
        "filter_nulls_are_false"
    }
}

/// `plan` with every expression in it (subqueries too) rewritten by `rewrite`, bottom up; a
/// rewritten expression keeps its name, so nothing above it changes.
fn rewrite_calls(plan: LogicalPlan, rewrite: impl Fn(Expr) -> Transformed<Expr>) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let names = NamePreserver::new(&node);
        node.map_expressions(|e| {
            let saved = names.save(&e);
            let rewritten = e.transform_up(|e| Ok(rewrite(e)))?;
            Ok(if rewritten.transformed { rewritten.update_data(|e| saved.restore(e)) } else { rewritten })
        })
    })
    .map(|t| t.data)
}

/// An `ORDER BY` inside an aggregate whose answer does not depend on order (`avg(x ORDER BY
/// y)`) is dropped. DataFusion 53.1 passes the ordering columns to these aggregates as extra
/// arguments: `avg`, `bit_and`/`bit_or`/`bit_xor`, `stddev` and `var_*` panic on them
/// (upstream issue apache/datafusion#25401, fix #25403), `min`/`max` fail on a state with more
/// fields than columns (#25402), and `count(x ORDER BY y)` skipped rows where `y` is NULL
/// (#24997). Functions whose ORDER BY means something (`array_agg`, `string_agg`,
/// `first_value`, the `WITHIN GROUP` of percentiles) are not in the list.
#[derive(Debug)]
pub struct OrderInsensitiveAggregates(Vec<Arc<AggregateUDF>>);

impl OrderInsensitiveAggregates {
    /// `skiff_count` is the `count` skiff registers in DataFusion's place, if any.
    pub fn new(skiff_count: Option<Arc<AggregateUDF>>) -> Self {
        use datafusion::functions_aggregate::{
            approx_distinct, approx_median, average, bit_and_or_xor, correlation, count, covariance, median,
            min_max, regr, stddev, variance,
        };
        let mut functions = vec![
            average::avg_udaf(),
            bit_and_or_xor::bit_and_udaf(),
            bit_and_or_xor::bit_or_udaf(),
            bit_and_or_xor::bit_xor_udaf(),
            stddev::stddev_udaf(),
            stddev::stddev_pop_udaf(),
            variance::var_samp_udaf(),
            variance::var_pop_udaf(),
            correlation::corr_udaf(),
            covariance::covar_samp_udaf(),
            covariance::covar_pop_udaf(),
            regr::regr_slope_udaf(),
            regr::regr_intercept_udaf(),
            regr::regr_count_udaf(),
            regr::regr_r2_udaf(),
            regr::regr_avgx_udaf(),
            regr::regr_avgy_udaf(),
            regr::regr_sxx_udaf(),
            regr::regr_syy_udaf(),
            regr::regr_sxy_udaf(),
            min_max::min_udaf(),
            min_max::max_udaf(),
            median::median_udaf(),
            approx_median::approx_median_udaf(),
            approx_distinct::approx_distinct_udaf(),
            count::count_udaf(),
        ];
        functions.extend(skiff_count);
        Self(functions)
    }
}

impl AnalyzerRule for OrderInsensitiveAggregates {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_calls(plan, |e| match e {
            Expr::AggregateFunction(mut f)
                if !f.params.order_by.is_empty() && self.0.iter().any(|u| u.as_ref() == f.func.as_ref()) =>
            {
                f.params.order_by.clear();
                Transformed::yes(Expr::AggregateFunction(f))
            }
            e => Transformed::no(e),
        })
    }

    fn name(&self) -> &str {
        "order_insensitive_aggregates"
    }
}

/// Whether a filter can be NULL: anything but a test that is never NULL (`IS TRUE` and the
/// like, or a literal).
fn needs_is_true(filter: Option<&Expr>) -> bool {
    !matches!(
        filter,
        None | Some(
            Expr::IsTrue(_)
                | Expr::IsFalse(_)
                | Expr::IsNotTrue(_)
                | Expr::IsNotFalse(_)
                | Expr::IsNull(_)
                | Expr::IsNotNull(_)
                | Expr::Literal(..)
        )
    )
}

/// Registers the function workarounds.
pub fn register(ctx: &mut SessionContext) -> Result<()> {
    for (shift, lag) in [(lag_udwf(), true), (lead_udwf(), false)] {
        ctx.register_udwf(Arc::new(WindowUDF::new_from_impl(LeadLag { shift, lag })))?;
    }
    Ok(())
}

/// `lag` and `lead` with `IGNORE NULLS` computed by skiff, over the whole partition. DataFusion
/// 53.1 gets them wrong three ways: over a whole partition it panics on values without a null
/// bitmap (apache/datafusion#23705, fixed by #23706) and answers NULL for every `lead` over
/// values with one (its offset's sign is lost); row by row, `lead` misses rows across runs of
/// NULLs (#25471, fix #25472). So an `IGNORE NULLS` call never runs row by row (it tells the
/// planner it needs its whole partition) and is computed here. `lag` with a negative offset
/// reads later rows, so no LIMIT is pushed below it (DataFusion says a `lag` never needs more
/// rows, #25471). Calls without `IGNORE NULLS` are DataFusion's.
#[derive(Debug, PartialEq, Eq, Hash)]
struct LeadLag {
    shift: Arc<WindowUDF>,
    lag: bool,
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

/// `json_get_str(NULL, 'q')` is NULL, as in Basin SQL: datafusion-functions-json 0.53 refuses
/// an argument of SQL's untyped NULL ("expected a string, got Null"), so such an argument is
/// taken as a NULL string. Upstream: datafusion-functions-json checks argument types in
/// `return_type_check`, which has no case for `Null`.
pub fn null_args_as_strings(function: Arc<ScalarUDF>) -> ScalarUDF {
    let volatility = function.signature().volatility;
    ScalarUDF::new_from_impl(NullArgsAsStrings { function, signature: Signature::user_defined(volatility) })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct NullArgsAsStrings {
    function: Arc<ScalarUDF>,
    signature: Signature,
}

impl ScalarUDFImpl for NullArgsAsStrings {
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
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        Ok(args.iter().map(|t| if t.is_null() { DataType::Utf8 } else { t.clone() }).collect())
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.function.return_type(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.function.invoke_with_args(args)
    }

    fn placement(
        &self,
        args: &[datafusion::logical_expr::ExpressionPlacement],
    ) -> datafusion::logical_expr::ExpressionPlacement {
        self.function.inner().placement(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.function.documentation()
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, Int64Array, RecordBatch, StringViewArray, TimestampMicrosecondArray};
    use arrow::buffer::{NullBuffer, ScalarBuffer};
    use arrow::datatypes::{Field, Schema, TimeUnit};

    use super::*;
    use crate::engine::testing::{answer, on_and_off, session};

    /// 2,000 events in 3 projects and 50 devices. `revenue` is NULL on 4 rows in 5 and every
    /// NULL has 1.0 under it, as an operator's output may: `revenue < 50` is then true in the
    /// value bits under each NULL.
    fn events() -> RecordBatch {
        let n = 2000;
        let strings = |f: &dyn Fn(usize) -> String| -> Arc<StringViewArray> {
            Arc::new((0..n).map(|i| Some(f(i))).collect::<StringViewArray>())
        };
        let revenue = Float64Array::new(
            ScalarBuffer::from(
                (0..n).map(|i| if i % 5 == 0 { 100.0 + i as f64 } else { 1.0 }).collect::<Vec<_>>(),
            ),
            Some(NullBuffer::from((0..n).map(|i| i % 5 == 0 || i % 7 == 0).collect::<Vec<_>>())),
        );
        let schema = Schema::new(vec![
            Field::new("project", DataType::Utf8View, false),
            Field::new("device", DataType::Utf8View, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), false),
            Field::new("event", DataType::Utf8View, false),
            Field::new("revenue", DataType::Float64, true),
            Field::new("k", DataType::Int64, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                strings(&|i| format!("p{}", i % 3)),
                strings(&|i| format!("d{}", i % 50)),
                Arc::new(TimestampMicrosecondArray::from_iter_values((0..n as i64).map(|i| i * 1_000_000))),
                strings(&|i| ["view", "click", "buy"][(i * 7 / 3) % 3].to_string()),
                Arc::new(revenue),
                Arc::new((0..n).map(|i| (i % 11 != 0).then_some(i as i64 % 13)).collect::<Int64Array>()),
            ],
        )
        .unwrap()
    }

    /// The same query written so no NULL reaches a FILTER or an ordered aggregate, for the
    /// expected answer.
    async fn expect_equal(sql: &str, reference: &str) {
        let tables = [("e", events())];
        let (on, off) = on_and_off(&tables, sql).await;
        let (expected, _) = on_and_off(&tables, reference).await;
        assert!(!expected.starts_with("error"), "{reference}: {expected}");
        assert_eq!(on, expected, "{sql}");
        assert_eq!(off, expected, "{sql} with skiff's rules off");
    }

    #[tokio::test]
    async fn a_filter_that_is_null_keeps_no_row() {
        expect_equal(
            "SELECT project, count(*) FILTER (WHERE revenue < 50) AS n FROM e GROUP BY project",
            "SELECT project, sum(CASE WHEN revenue < 50 THEN 1 ELSE 0 END) AS n FROM e GROUP BY project",
        )
        .await;
        expect_equal(
            "SELECT project, corr(revenue, k) FILTER (WHERE revenue < 500) AS c FROM e GROUP BY project",
            "SELECT project, corr(CASE WHEN revenue < 500 THEN revenue END, CASE WHEN revenue < 500 THEN k END) \
             AS c FROM e GROUP BY project",
        )
        .await;
    }

    /// DataFusion itself still counts them: when this fails, DataFusion has the fix and
    /// `FilterNullsAreFalse` can go.
    #[tokio::test]
    async fn datafusion_alone_counts_rows_whose_filter_is_null() {
        let ctx = SessionContext::new_with_config(
            datafusion::prelude::SessionConfig::new().with_target_partitions(4),
        );
        ctx.register_batch("e", events()).unwrap();
        let sql =
            "SELECT count(*) FILTER (WHERE revenue < 50) AS n FROM e GROUP BY project ORDER BY 1 LIMIT 1";
        let skiff = session(&Default::default(), 256 << 20, &[("e", events())]);
        assert_ne!(answer(&ctx, sql).await, answer(&skiff, sql).await);
    }

    #[tokio::test]
    async fn lag_over_sorted_partitions_under_a_filter() {
        expect_equal(
            "SELECT project, count(*) FILTER (WHERE prev = event) AS n FROM \
             (SELECT project, event, lag(event) OVER (PARTITION BY device ORDER BY ts) AS prev FROM e) \
             GROUP BY project",
            "SELECT project, sum(CASE WHEN prev = event THEN 1 ELSE 0 END) AS n FROM \
             (SELECT project, event, lag(event) OVER (PARTITION BY device ORDER BY ts) AS prev FROM e) \
             GROUP BY project",
        )
        .await;
    }

    #[tokio::test]
    async fn lag_and_lead_ignore_nulls_over_whole_partitions() {
        // `event` has no NULLs (no bitmap); `revenue` has them.
        for f in ["lag(event)", "lead(event, 2)", "lag(revenue)", "lead(revenue)"] {
            let sql = format!(
                "SELECT device, ts, {f} IGNORE NULLS OVER (PARTITION BY device ORDER BY ts) AS x FROM e"
            );
            let (on, off) = on_and_off(&[("e", events())], &sql).await;
            assert!(!on.starts_with("error"), "{sql}: {on}");
            assert_eq!(on, off, "{sql}");
        }
        // IGNORE NULLS does skip NULLs: the previous non-NULL revenue of a device.
        expect_equal(
            "SELECT device, ts, lag(revenue) IGNORE NULLS OVER (PARTITION BY device ORDER BY ts) AS x FROM e",
            "SELECT device, ts, last_value(revenue) IGNORE NULLS OVER (PARTITION BY device ORDER BY ts \
             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS x FROM e",
        )
        .await;
    }

    #[tokio::test]
    async fn order_insensitive_aggregates_ignore_an_order_by() {
        for f in [
            "avg(revenue)",
            "stddev(revenue)",
            "var_pop(revenue)",
            "bit_and(k)",
            "bit_xor(k)",
            "min(revenue)",
            "max(k)",
            "count(revenue)",
            "corr(revenue, k)",
            "median(k)",
        ] {
            let ordered = f.replace(')', " ORDER BY k)");
            expect_equal(
                &format!("SELECT project, {ordered} AS a FROM e GROUP BY project"),
                &format!("SELECT project, {f} AS a FROM e GROUP BY project"),
            )
            .await;
            expect_equal(&format!("SELECT {ordered} AS a FROM e"), &format!("SELECT {f} AS a FROM e")).await;
        }
        // An ORDER BY that means something is kept.
        let (on, off) =
            on_and_off(&[("e", events())], "SELECT array_agg(k ORDER BY ts DESC)[1] AS a FROM e").await;
        assert!(on.contains("| 10 |"), "{on}");
        assert_eq!(on, off);
    }

    #[tokio::test]
    async fn json_functions_take_an_untyped_null() {
        let (on, off) = on_and_off(
            &[("e", events())],
            "SELECT json_get_str(NULL, 'q') IS NULL AS s, json_get_int(NULL, 'a') IS NULL AS i, \
             json_get_str('{\"q\": \"x\"}', 'q') AS q",
        )
        .await;
        assert!(on.contains("| true | true | x |"), "{on}");
        assert_eq!(on, off);
    }
}
