//! A hash exchange (`RepartitionExec`) counts each batch it holds with
//! `get_array_memory_size`, which counts every buffer a string view points into, and spills
//! batches it cannot reserve. A join's output points into all of its build side's strings: at
//! TPC-H scale factor 10 with a 1.5 GiB pool, q10's exchange after `customer ⋈ orders` counted
//! each batch of a few hundred rows at gigabytes, spilled and re-read them, and took 19.8 s
//! (DuckDB 1.7 s). Each view column going into a hash exchange whose buffers hold more than
//! twice what its views use has its strings copied into a buffer of its own first. Other
//! columns need nothing: the exchange's own `take` gives them buffers of their own.
//!
//! Upstream: apache/datafusion#20491 (open: the same over-count after a partial aggregation);
//! apache/datafusion#20500 made this same copy inside `RepartitionExec` and was closed unmerged.
//! Goes when skiff's DataFusion's exchange counts views by what they use.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};

use super::pass::{Job, Pass};

/// Puts a [`Pass`] that compacts string views under every hash exchange.
#[derive(Debug, Default)]
pub struct CompactExchangeViews;

impl PhysicalOptimizerRule for CompactExchangeViews {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(exchange) = node.as_any().downcast_ref::<RepartitionExec>() else {
                return Ok(Transformed::no(node));
            };
            let input = exchange.input();
            let hashed = matches!(exchange.partitioning(), Partitioning::Hash(..));
            if !hashed || Pass::job_of(input.as_ref()) == Some(Job::CompactViews) || !has_views(input) {
                return Ok(Transformed::no(node));
            }
            let compacted = Pass::over(Job::CompactViews, Arc::clone(input));
            Ok(Transformed::yes(node.with_new_children(vec![compacted])?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "compact_exchange_views"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn has_views(plan: &Arc<dyn ExecutionPlan>) -> bool {
    use arrow::datatypes::DataType;
    plan.schema().fields().iter().any(|f| matches!(f.data_type(), DataType::Utf8View | DataType::BinaryView))
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array, RecordBatch, StringViewArray};
    use arrow::datatypes::Int64Type;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::TaskContext;
    use datafusion::execution::memory_pool::GreedyMemoryPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::physical_expr::expressions::col;
    use futures::TryStreamExt;

    use super::*;

    /// Batches whose strings point into one large buffer (as a join's output points into all
    /// of its build side's), going into a hash exchange whose consumers read one partition at
    /// a time: counted by what they use, they fit the pool; counted whole, they spill.
    #[tokio::test]
    async fn batches_going_into_an_exchange_are_counted_by_what_they_hold() {
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
        let run = |fixed: bool| {
            let (slices, schema) = (slices.clone(), schema.clone());
            async move {
                let source = MemorySourceConfig::try_new_exec(&[slices], schema.clone(), None).unwrap();
                let hash = Partitioning::Hash(vec![col("k", &schema).unwrap()], 4);
                let mut plan: Arc<dyn ExecutionPlan> =
                    Arc::new(RepartitionExec::try_new(source, hash).unwrap());
                if fixed {
                    plan = CompactExchangeViews.optimize(plan, &ConfigOptions::default()).unwrap();
                    assert_eq!(Pass::job_of(plan.children()[0].as_ref()), Some(Job::CompactViews));
                }
                let pool = Arc::new(GreedyMemoryPool::new(24 << 20));
                let runtime = RuntimeEnvBuilder::new().with_memory_pool(pool).build_arc().unwrap();
                let task = Arc::new(TaskContext::default().with_runtime(runtime));
                let mut keys = Vec::new();
                for p in 0..4 {
                    let batches: Vec<RecordBatch> =
                        plan.execute(p, task.clone()).unwrap().try_collect().await.unwrap();
                    for b in &batches {
                        let (k, note) =
                            (b.column(0).as_primitive::<Int64Type>(), b.column(1).as_string_view());
                        for i in 0..b.num_rows() {
                            assert_eq!(note.value(i), format!("{:0>250}", k.value(i)));
                            keys.push(k.value(i));
                        }
                    }
                }
                keys.sort_unstable();
                assert_eq!(keys, (0..16_000).collect::<Vec<_>>());
                plan.metrics().and_then(|m| m.spill_count()).unwrap_or(0)
            }
        };
        assert!(run(false).await > 0, "counted whole, the slices spilled");
        assert_eq!(run(true).await, 0);
    }
}
