//! A sort planned under a node that needs its input ordered, sorting by a column equal to the
//! one needed but not the one needed. DataFusion 53.1 plans `SELECT x AS a, x AS b FROM
//! (… UNION ALL …) ORDER BY b LIMIT 5` as a merge by `b` over per-partition sorts by `a`: the
//! sort's key was swapped for an equal column inside the union's branches, and the union does
//! not carry that equality up, so the plan fails its own sanity check (`SanityCheckPlan … does
//! not satisfy order requirements`) and the query fails. Upstream: apache/datafusion#16171
//! (open). Such a sort (one whose parent's requirement it does not meet, which no other rule
//! leaves behind: the plan would fail) is given the ordering its parent needs: it exists only to
//! give its parent that order.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// Runs just before DataFusion's `SanityCheckPlan`.
#[derive(Debug, Default)]
pub struct SortsForMerges;

impl PhysicalOptimizerRule for SortsForMerges {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let mut changed = false;
            let mut children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
            for (child, required) in children.iter_mut().zip(node.required_input_ordering()) {
                let Some(required) = required else { continue };
                let Some(sort) = child.as_any().downcast_ref::<SortExec>() else { continue };
                let required = required.into_single();
                if child.equivalence_properties().ordering_satisfy_requirement(required.clone())? {
                    continue;
                }
                let repaired = SortExec::new(LexOrdering::from(required), sort.input().clone())
                    .with_preserve_partitioning(sort.preserve_partitioning())
                    .with_fetch(sort.fetch());
                *child = Arc::new(repaired);
                changed = true;
            }
            Ok(if changed {
                Transformed::yes(node.with_new_children(children)?)
            } else {
                Transformed::no(node)
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "sorts_for_merges"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::{answer, session};

    #[tokio::test]
    async fn a_column_twice_over_a_union_ordered_by_its_second_name() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let t = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..5000))]).unwrap();
        for off in [Disabled::default(), Disabled::all()] {
            let ctx = session(&off, 64 << 20, &[("t", t.clone())]);
            for (sql, last) in [
                (
                    "SELECT x AS a, x AS b FROM (SELECT x FROM t UNION ALL SELECT x FROM t WHERE x < 10) \
                     ORDER BY b DESC LIMIT 3",
                    "| 4997 | 4997 |",
                ),
                (
                    "(SELECT x AS a, x AS b FROM t) UNION ALL (SELECT x AS a, x AS b FROM t WHERE x > 100) \
                     ORDER BY b DESC LIMIT 3",
                    "| 4998 | 4998 |",
                ),
            ] {
                let text = answer(&ctx, sql).await;
                assert!(text.contains("| 4999 | 4999 |") && text.contains(last), "{sql}: {text}");
                assert_eq!(text.lines().count(), 7, "three rows: {text}");
            }
        }
    }
}
