//! A hash join counts its build side batch by batch with `get_record_batch_memory_size`, which
//! counts the whole allocation behind every buffer a batch points into. A grouping emits its
//! groups as one array sliced into batches, so every slice is counted as the whole array: at
//! 30M events, on one partition (a fraction of a vCPU), the Worker's retention query (`SELECT
//! DISTINCT device_id, week …` joined to its own grouping) was refused with "2.3 GB already
//! allocated for HashJoinInput" for a build side of a few tens of MB, with or without skiff's
//! rules. Each build-side batch counted at more than twice what its rows use is copied into
//! buffers of its own first (the copy is of what the rows use, and is what the join keeps).
//!
//! A hash exchange counts the batches it holds the same way, and spills them whole. A join's
//! output points into every buffer of its build side (a string view's data): at TPC-H scale
//! factor 10 with a 1.25 GiB pool, q10's exchange after `customer ⋈ orders` counted 573K rows
//! as 26 GB, spilled 16.7 GB of customer strings over and over, and took 18.5 s (DuckDB 1.4 s).
//! Batches going into a hash exchange are given buffers of their own the same way (a copy only
//! where their buffers hold more than twice what their rows use).
//!
//! Upstream: `get_record_batch_memory_size` in `datafusion/common/src/utils/memory.rs`, used by
//! `collect_left_input` in `datafusion/physical-plan/src/joins/hash_join/exec.rs` and by
//! `RepartitionExec`'s buffering; no issue filed yet.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

use super::pass::{Job, Pass};

/// Puts a [`Pass`] that gives batches buffers of their own under every hash join's build side
/// (its first child) and under every hash exchange. Runs once the joins' sides are chosen.
#[derive(Debug, Default)]
pub struct CompactJoinBuilds;

impl PhysicalOptimizerRule for CompactJoinBuilds {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let hashed = |r: &RepartitionExec| matches!(r.partitioning(), Partitioning::Hash(..));
            let buffers = node.as_any().is::<HashJoinExec>()
                || node.as_any().downcast_ref::<RepartitionExec>().is_some_and(hashed);
            if !buffers {
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

    /// Batches whose strings point into one large buffer (as a join's output points into all
    /// of its build side's), going into a hash exchange whose consumers read one partition at
    /// a time: held at what their rows use, they fit the pool; counted whole, they spill.
    #[tokio::test]
    async fn batches_going_into_an_exchange_are_counted_by_what_they_hold() {
        use arrow::array::StringViewArray;
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::execution::TaskContext;
        use datafusion::execution::memory_pool::GreedyMemoryPool;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::physical_expr::expressions::col;
        use futures::TryStreamExt;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("note", DataType::Utf8View, false),
        ]));
        // 4 MB of strings in one buffer, handed on as 16 slices that each point into all of it.
        let whole = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(0..16_000)),
                Arc::new(StringViewArray::from_iter_values((0..16_000).map(|i| format!("{i:0>250}")))),
            ],
        )
        .unwrap();
        let slices: Vec<RecordBatch> = (0..16).map(|i| whole.slice(i * 1000, 1000)).collect();
        let spills = |fixed: bool| {
            let (slices, schema) = (slices.clone(), schema.clone());
            async move {
                let source = MemorySourceConfig::try_new_exec(&[slices], schema.clone(), None).unwrap();
                let hash = Partitioning::Hash(vec![col("k", &schema).unwrap()], 4);
                let mut plan: Arc<dyn ExecutionPlan> =
                    Arc::new(RepartitionExec::try_new(source, hash).unwrap());
                if fixed {
                    plan = CompactJoinBuilds.optimize(plan, &ConfigOptions::default()).unwrap();
                }
                let pool = Arc::new(GreedyMemoryPool::new(24 << 20));
                let runtime = RuntimeEnvBuilder::new().with_memory_pool(pool).build_arc().unwrap();
                let task = Arc::new(TaskContext::default().with_runtime(runtime));
                let mut rows = 0;
                for p in 0..4 {
                    let batches: Vec<RecordBatch> =
                        plan.execute(p, task.clone()).unwrap().try_collect().await.unwrap();
                    rows += batches.iter().map(RecordBatch::num_rows).sum::<usize>();
                }
                assert_eq!(rows, 16_000);
                plan.metrics().and_then(|m| m.spill_count()).unwrap_or(0)
            }
        };
        assert!(spills(false).await > 0, "counted whole, the slices spilled");
        assert_eq!(spills(true).await, 0);
    }
}
