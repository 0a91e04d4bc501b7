//! Two DataFusion 53.1 bugs in GROUPING SETS, ROLLUP and CUBE that give wrong answers:
//!
//! - **Duplicate grouping sets are merged.** `GROUPING SETS ((), (), (a))` must answer the grand
//!   total twice; DataFusion gives both copies one grouping id, so it answers one row with twice
//!   the count. Fixed upstream by apache/datafusion#21058 (issue #21316), after 53. Until skiff's
//!   DataFusion has it, such a GROUP BY is refused (400) rather than answered wrong.
//! - **A grouping column known to be constant stays constant above the aggregation.**
//!   `WHERE a = 'x' GROUP BY ROLLUP (a) ORDER BY a NULLS LAST` (or `GROUP BY CUBE (1 - 4)`): the
//!   aggregation's output properties keep "`a` is constant" from its input, but the rolled-up
//!   rows hold NULL in `a`; the sort is then dropped as already satisfied and the NULL row comes
//!   first. [`NullableGroupingSets`] puts a node above every aggregation with grouping sets that
//!   tells the optimiser nothing about its rows (no constants, no order), so sorts above it stay.
//!   Same class as PostgreSQL's fix for ROLLUP with WHERE (v18); no DataFusion issue filed yet.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, GroupingSet, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;

use super::pass::{Job, Pass};

/// Refuses a GROUP BY whose grouping sets (after ROLLUP and CUBE are expanded) list one set of
/// expressions twice.
#[derive(Debug, Default)]
pub struct DistinctGroupingSets;

impl AnalyzerRule for DistinctGroupingSets {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::Aggregate(a) = node {
                for e in &a.group_expr {
                    if let Expr::GroupingSet(set) = e {
                        refuse_duplicates(set)?;
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "distinct_grouping_sets"
    }
}

fn refuse_duplicates(set: &GroupingSet) -> Result<()> {
    let distinct = set.distinct_expr();
    let index = |e: &Expr| distinct.iter().position(|d| *d == e).unwrap_or(usize::MAX);
    let duplicated = match set {
        // Every subset of the columns: two are equal exactly when a column is listed twice.
        GroupingSet::Cube(exprs) => (exprs.len() != distinct.len()).then(|| exprs.clone()),
        // Each prefix: one equals the next when a column repeats an earlier one.
        GroupingSet::Rollup(exprs) => (exprs.len() != distinct.len())
            .then(|| exprs.iter().take(1 + first_repeat(exprs)).cloned().collect()),
        GroupingSet::GroupingSets(sets) => {
            let mut seen = HashSet::new();
            sets.iter()
                .find(|s| {
                    let mut key: Vec<usize> = s.iter().map(index).collect();
                    key.sort_unstable();
                    key.dedup();
                    !seen.insert(key)
                })
                .cloned()
        }
    };
    match duplicated {
        None => Ok(()),
        Some(exprs) => {
            let names: Vec<String> = exprs.iter().map(|e| e.schema_name().to_string()).collect();
            Err(DataFusionError::Plan(format!(
                "the GROUP BY has the grouping set ({}) more than once; skiff cannot answer repeated \
                 grouping sets yet (apache/datafusion#21316): list each set once",
                names.join(", ")
            )))
        }
    }
}

/// The position of the first expression that equals an earlier one.
fn first_repeat(exprs: &[Expr]) -> usize {
    (0..exprs.len()).find(|&i| exprs[..i].contains(&exprs[i])).unwrap_or(exprs.len())
}

/// Puts a [`Pass`] that forgets the grouping's properties above every aggregation that has grouping sets. Runs first, on
/// the plan as the planner made it.
#[derive(Debug, Default)]
pub struct NullableGroupingSets;

impl PhysicalOptimizerRule for NullableGroupingSets {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let grouping_sets = node
                .as_any()
                .downcast_ref::<AggregateExec>()
                .is_some_and(|a| a.group_expr().has_grouping_set());
            Ok(if grouping_sets {
                Transformed::yes(Pass::over(Job::ForgetGroupProperties, node))
            } else {
                Transformed::no(node)
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "nullable_grouping_sets"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::util::pretty::pretty_format_batches;

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::{answer, session};

    fn events() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("device", DataType::Utf8, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let devices = StringArray::from_iter((0..300).map(|i| Some(["desktop", "mobile", "tablet"][i % 3])));
        RecordBatch::try_new(schema, vec![Arc::new(devices), Arc::new(Int64Array::from_iter_values(0..300))])
            .unwrap()
    }

    #[tokio::test]
    async fn repeated_grouping_sets_are_refused() {
        let ctx = session(&Default::default(), 64 << 20, &[("t", events())]);
        for sql in [
            "SELECT device, count(*) FROM t GROUP BY GROUPING SETS ((), (), (device))",
            "SELECT device, count(*) FROM t GROUP BY GROUPING SETS ((device, n), (n, device))",
            "SELECT device, count(*) FROM t GROUP BY GROUPING SETS ((device), (n), (device))",
        ] {
            let text = answer(&ctx, sql).await;
            assert!(text.contains("more than once") && text.contains("21316"), "{sql}: {text}");
        }
        let fine =
            answer(&ctx, "SELECT device, count(*) AS c FROM t GROUP BY GROUPING SETS ((), (device))").await;
        assert!(fine.contains("| desktop | 100 |") && fine.contains("|         | 300 |"), "{fine}");
    }

    /// The rolled-up row's NULL sorts where ORDER BY says, though the filter makes the column
    /// constant below the aggregation; with skiff's rules on and off.
    #[tokio::test]
    async fn a_grouping_column_constant_below_the_aggregation_is_still_sorted() {
        for off in [Disabled::default(), Disabled::all()] {
            let ctx = session(&off, 64 << 20, &[("t", events())]);
            for (sql, first) in [
                (
                    "SELECT device, count(*) AS c FROM t WHERE device = 'mobile' GROUP BY ROLLUP (device) \
                  ORDER BY device NULLS LAST",
                    "mobile",
                ),
                (
                    "SELECT device, count(*) AS c FROM t WHERE device = 'mobile' GROUP BY ROLLUP (device) \
                  ORDER BY device NULLS FIRST",
                    "",
                ),
                ("SELECT 1 - 4 AS k, count(*) AS c FROM t GROUP BY CUBE (1 - 4) ORDER BY k NULLS LAST", "-3"),
            ] {
                let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
                let text = pretty_format_batches(&batches).unwrap().to_string();
                let row = text.lines().nth(3).unwrap();
                let cell = row.split('|').nth(1).unwrap().trim();
                assert_eq!(cell, first, "{sql}:\n{text}");
            }
        }
    }
}
