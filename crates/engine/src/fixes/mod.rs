//! Workarounds for DataFusion 53.1 bugs that give wrong answers, fail valid queries or panic,
//! found by skiff's differential tests (`tests/difftest`) or by users. Each names the upstream
//! issue or fix; when skiff's DataFusion has it, the workaround goes. They are not
//! optimizations and have no off switch.

mod aggregate_filters;
mod answers;
mod exchange_views;
mod grouping_sets;
mod join_builds;
mod json_nulls;
mod lead_lag;
mod leaf_projections;
mod median;
mod min_max;
mod nan_sums;
mod ntile;
mod ordered_aggregates;
mod pass;
mod round;
mod sliding_sums;
mod sorts_for_merges;
mod string_agg;
mod truth_tests;
mod window_memory;

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use datafusion::functions_window::lead_lag::{lag_udwf, lead_udwf};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{AggregateUDF, Expr, LogicalPlan, ScalarUDF, ScalarUDFImpl, WindowUDF};
use datafusion::optimizer::AnalyzerRule;
use datafusion::prelude::SessionContext;

pub use aggregate_filters::FilterNullsAreFalse;
pub use exchange_views::CompactExchangeViews;
pub use grouping_sets::{DistinctGroupingSets, NullableGroupingSets};
pub use join_builds::CompactJoinBuilds;
pub use json_nulls::null_args_as_strings;
pub use leaf_projections::NotOverUnions;
pub use ordered_aggregates::OrderInsensitiveAggregates;
pub use pass::{Job, Pass};
pub use sorts_for_merges::SortsForMerges;
pub use truth_tests::TruthTestsNeverNull;
pub use window_memory::CountWholeWindows;

/// The analyzer rules that fix plans; `skiff_count` is the `count` skiff registers in place of
/// DataFusion's, if any.
pub fn analyzer_rules(skiff_count: Option<Arc<AggregateUDF>>) -> Vec<Arc<dyn AnalyzerRule + Send + Sync>> {
    let mut replaced: Vec<Arc<AggregateUDF>> = min_max::min_and_max()
        .into_iter()
        .chain(nan_sums::sum_and_avg())
        .chain([median::median()])
        .map(Arc::new)
        .collect();
    replaced.extend(skiff_count);
    vec![
        Arc::new(DistinctGroupingSets),
        Arc::new(FilterNullsAreFalse),
        Arc::new(OrderInsensitiveAggregates::new(replaced)),
    ]
}

/// The function under a fix's wrapper of a built-in, when `f` is one.
pub fn wrapped(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
    round::wrapped(f).or_else(|| json_nulls::wrapped(f))
}

/// Registers the functions that replace DataFusion's wrong ones.
pub fn register(ctx: &mut SessionContext) -> Result<()> {
    for (shift, lag) in [(lag_udwf(), true), (lead_udwf(), false)] {
        ctx.register_udwf(Arc::new(WindowUDF::new_from_impl(lead_lag::LeadLag { shift, lag })))?;
    }
    ctx.register_udwf(Arc::new(ntile::ntile()))?;
    ctx.register_udf(Arc::new(round::round()))?;
    ctx.register_udaf(Arc::new(string_agg::string_agg()))?;
    for f in min_max::min_and_max().into_iter().chain(nan_sums::sum_and_avg()).chain([median::median()]) {
        ctx.register_udaf(Arc::new(f))?;
    }
    Ok(())
}

/// `plan` with every expression in it (subqueries too) rewritten by `rewrite`, bottom up; a
/// rewritten expression keeps its name, so nothing above it changes.
pub(super) fn rewrite_calls(
    plan: LogicalPlan,
    rewrite: impl Fn(Expr) -> Transformed<Expr>,
) -> Result<LogicalPlan> {
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

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, Int64Array, RecordBatch, StringViewArray, TimestampMicrosecondArray};
    use arrow::buffer::{NullBuffer, ScalarBuffer};
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

    use super::*;
    use crate::testing::{answer, on_and_off, session};

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
            Field::new("score", DataType::Float64, true),
            Field::new("r2", DataType::Float64, true),
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
                // NaN on project p0's rows i % 17 == 0, and every row of device d7.
                Arc::new(
                    (0..n)
                        .map(|i| {
                            Some(if (i % 17 == 0 && i % 3 == 0) || i % 50 == 7 { f64::NAN } else { i as f64 })
                        })
                        .collect::<Float64Array>(),
                ),
                // `revenue`, but NULL on every row of project p2.
                Arc::new(
                    (0..n)
                        .map(|i| (i % 3 != 2 && (i % 5 == 0 || i % 7 == 0)).then_some(i as f64))
                        .collect::<Float64Array>(),
                ),
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

    /// Two aggregates under one nullable condition: common-subexpression elimination projects
    /// the condition's truth test once for both.
    #[tokio::test]
    async fn aggregates_sharing_a_nullable_filter() {
        expect_equal(
            "SELECT project, count(DISTINCT device) FILTER (WHERE revenue < 50) AS d, \
             count(*) FILTER (WHERE revenue < 50) AS n FROM e GROUP BY project",
            "SELECT project, count(DISTINCT CASE WHEN revenue < 50 THEN device END) AS d, \
             sum(CASE WHEN revenue < 50 THEN 1 ELSE 0 END) AS n FROM e GROUP BY project",
        )
        .await;
        expect_equal(
            "SELECT project, sum(k) FILTER (WHERE (revenue < 50) IS TRUE) AS s, \
             count(*) FILTER (WHERE (revenue < 50) IS TRUE) AS n FROM e GROUP BY project",
            "SELECT project, sum(CASE WHEN revenue < 50 THEN k END) AS s, \
             sum(CASE WHEN revenue < 50 THEN 1 ELSE 0 END) AS n FROM e GROUP BY project",
        )
        .await;
    }

    /// DataFusion alone fails to plan it: when this fails, DataFusion has the fix and
    /// `TruthTestsNeverNull` can go.
    #[tokio::test]
    async fn datafusion_alone_fails_aggregates_sharing_a_truth_test() {
        let ctx = SessionContext::new();
        ctx.register_batch("e", events()).unwrap();
        let sql = "SELECT project, sum(k) FILTER (WHERE (revenue < 50) IS TRUE) AS s, \
                   count(*) FILTER (WHERE (revenue < 50) IS TRUE) AS n FROM e GROUP BY project";
        let answer = answer(&ctx, sql).await;
        assert!(answer.contains("Physical input schema should be the same"), "{answer}");
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
    async fn nan_is_larger_than_every_number() {
        let tables = [("e", events())];
        let (on, off) =
            on_and_off(&tables, "SELECT project, max(score) AS mx, min(score) AS mn FROM e GROUP BY project")
                .await;
        assert_eq!(on, off);
        assert!(on.contains("| p0      | NaN | 3.0 |"), "{on}");
        // d7's rows are all NaN: its min is NaN too; the others' is a number.
        let (on, off) = on_and_off(
            &tables,
            "SELECT device, min(score) AS mn FROM e WHERE device IN ('d7', 'd8') GROUP BY device",
        )
        .await;
        assert_eq!(on, off);
        assert!(on.contains("| d7     | NaN |") && on.contains("| d8     | 8.0 |"), "{on}");
        let (on, off) = on_and_off(&tables, "SELECT max(score) AS mx, min(score) AS mn FROM e").await;
        assert_eq!(on, off);
        assert!(on.contains("| NaN | 1.0 |"), "{on}");
    }

    #[tokio::test]
    async fn infinities_are_their_own_min_and_max() {
        let values = "(VALUES (1, CAST('-inf' AS DOUBLE), CAST('inf' AS DOUBLE)), \
                      (1, CAST('-inf' AS DOUBLE), CAST('inf' AS DOUBLE)), (2, 1.0, 2.0)) AS t(k, v, w)";
        for sql in [
            format!(
                "SELECT k, CAST(max(v) AS VARCHAR) AS mx, CAST(min(w) AS VARCHAR) AS mn FROM {values} GROUP BY k"
            ),
            format!(
                "SELECT k, CAST(max(v) AS VARCHAR) AS mx, CAST(min(w) AS VARCHAR) AS mn FROM {values} WHERE k = 1 GROUP BY k"
            ),
        ] {
            let (on, off) = on_and_off(&[], &sql).await;
            assert_eq!(on, off);
            assert!(on.contains("| 1 | -inf | inf |"), "{sql}: {on}");
        }
        let (on, _) = on_and_off(
            &[],
            &format!("SELECT CAST(max(v) AS VARCHAR) AS mx, CAST(min(w) AS VARCHAR) AS mn FROM {values} WHERE k = 1"),
        )
        .await;
        assert!(on.contains("| -inf | inf |"), "{on}");
    }

    #[tokio::test]
    async fn a_sliding_frame_of_nulls_has_no_min_or_max() {
        for f in ["min", "max"] {
            expect_equal(
                &format!(
                    "SELECT count(*) AS n FROM (SELECT {f}(revenue) OVER (ORDER BY ts ROWS BETWEEN 1 PRECEDING \
                     AND 1 FOLLOWING) AS m FROM e) WHERE m IS NULL"
                ),
                "SELECT count(*) AS n FROM (SELECT revenue AS r, lag(revenue) OVER (ORDER BY ts) AS p, \
                 lead(revenue) OVER (ORDER BY ts) AS q FROM e) WHERE r IS NULL AND p IS NULL AND q IS NULL",
            )
            .await;
        }
    }

    #[tokio::test]
    async fn ntile_puts_the_larger_buckets_first() {
        let (on, off) = on_and_off(
            &[],
            "SELECT b, count(*) AS n FROM (SELECT ntile(4) OVER (ORDER BY x) AS b FROM \
             (VALUES (1), (2), (3), (4), (5), (6)) AS v(x)) GROUP BY b",
        )
        .await;
        assert_eq!(on, off);
        for row in ["| 1 | 2 |", "| 2 | 2 |", "| 3 | 1 |", "| 4 | 1 |"] {
            assert!(on.contains(row), "{on}");
        }
    }

    #[tokio::test]
    async fn no_rows_make_no_groups() {
        let (on, off) = on_and_off(
            &[("e", events())],
            "SELECT 1 AS k, count(*) AS n FROM e WHERE project = 'none' GROUP BY 1",
        )
        .await;
        assert_eq!(on, off);
        assert!(!on.contains("| 1 |"), "no row: {on}");
    }

    #[tokio::test]
    async fn top_groups_by_an_aggregate_keep_those_whose_aggregate_is_null() {
        let (on, off) = on_and_off(
            &[("e", events())],
            "SELECT count(*) AS n FROM (SELECT project, max(r2) AS m FROM e GROUP BY project ORDER BY m DESC LIMIT 10)",
        )
        .await;
        assert_eq!(on, off);
        assert!(on.contains("| 3 |"), "{on}");
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
