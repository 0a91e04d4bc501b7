//! A hash join counts its build side batch by batch with `get_record_batch_memory_size`, which
//! counts the whole allocation behind every buffer a batch points into. A grouping emits its
//! groups as one array sliced into batches, so every slice is counted as the whole array: at
//! 30M events, on one partition (a fraction of a vCPU), the Worker's retention query (`SELECT
//! DISTINCT device_id, week …` joined to its own grouping) was refused with "2.3 GB already
//! allocated for HashJoinInput" for a build side of a few tens of MB, with or without skiff's
//! rules. Each build-side batch counted at more than twice what its rows use is copied into
//! buffers of its own first (the copy is of what the rows use, and is what the join keeps).
//! Upstream: `get_record_batch_memory_size` in `datafusion/common/src/utils/memory.rs`, used by
//! `collect_left_input` in `datafusion/physical-plan/src/joins/hash_join/exec.rs`; no issue
//! filed yet.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;

use super::pass::{Job, Pass};

/// Puts a [`Pass`] that gives batches buffers of their own under every hash join's build side
/// (its first child). Runs once the joins' sides are chosen.
#[derive(Debug, Default)]
pub struct CompactJoinBuilds;

impl PhysicalOptimizerRule for CompactJoinBuilds {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !node.as_any().is::<HashJoinExec>() {
                return Ok(Transformed::no(node));
            }
            let mut children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
            if Pass::job_of(children[0].as_ref()) == Some(Job::OwnBuffers) {
                return Ok(Transformed::no(node));
            }
            children[0] = Pass::over(Job::OwnBuffers, children[0].clone());
            Ok(Transformed::yes(node.with_new_children(children)?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "compact_join_builds"
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
    use crate::testing::{answer, session_on};

    /// On one partition, a grouping's output (one array, sliced into batches) as a join's
    /// build side fits a pool it was counted far over.
    #[tokio::test]
    async fn a_join_built_from_a_grouping_is_counted_by_what_it_holds() {
        let n = 2_000_000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Int64, false),
            Field::new("w", DataType::Int64, false),
        ]));
        let events = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 1_000_000))),
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i / 1_000_000))),
            ],
        )
        .unwrap();
        let sql = "WITH a AS (SELECT DISTINCT d, w FROM e), c AS (SELECT d, min(w) AS cohort FROM a GROUP BY d) \
                   SELECT count(*) AS n FROM a JOIN c ON a.d = c.d";
        for off in [Disabled::default(), Disabled::all()] {
            let ctx = session_on(1, &off, 400 << 20, &[("e", events.clone())]);
            let text = answer(&ctx, sql).await;
            assert!(text.contains("| 2000000 |"), "{text}");
        }
    }
}
