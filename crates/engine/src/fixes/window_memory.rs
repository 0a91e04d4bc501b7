//! DataFusion's `WindowAggExec` (windows that need whole partitions: frames that end in
//! UNBOUNDED FOLLOWING, `ntile`, `percent_rank`, …) keeps its whole input, concatenates it into
//! one copy, and hands its answer on as one batch of every row, all outside the memory pool. On
//! 30M events, `max(revenue) OVER (PARTITION BY browser, url ORDER BY timestamp ROWS BETWEEN
//! CURRENT ROW AND UNBOUNDED FOLLOWING)` got the process OOM-killed at 6 GiB with a 2 GiB pool.
//!
//! Under each such window, a `CountedWindowInput` node reserves what the window will hold:
//! every input batch as it passes, then as much again for the concatenation, until the window
//! is dropped; so a window the pool cannot hold fails the query (507) instead of the process.
//! Above it, `SlicedWindowOutput` hands the answer on in slices of the session's batch size, so
//! the operators above never work on one batch of millions of rows.
//!
//! Upstream: apache/datafusion#23207 (memory accounting for `WindowAggExec`) and #23206 (its
//! output in batch-size slices); #22946 would let it spill. This file goes when skiff's
//! DataFusion has the first two.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::windows::WindowAggExec;

use super::pass::{Job, Pass};

/// Puts a [`Pass`] that counts under and one that slices over every `WindowAggExec`. Runs
/// once the plan's windows are final.
#[derive(Debug, Default)]
pub struct CountWholeWindows;

impl PhysicalOptimizerRule for CountWholeWindows {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !node.as_any().is::<WindowAggExec>()
                || Pass::job_of(node.children()[0].as_ref()) == Some(Job::CountWindowInput)
            {
                return Ok(Transformed::no(node));
            }
            let input = Pass::over(Job::CountWindowInput, node.children()[0].clone());
            let window = node.with_new_children(vec![input])?;
            Ok(Transformed::yes(Pass::over(Job::SliceWindowOutput, window)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "count_whole_windows"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::{collect, displayable};

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::session_on;

    /// 1M rows of two integers: 16 MB.
    fn numbers() -> RecordBatch {
        let n = 1_000_000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let columns: Vec<arrow::array::ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 7))),
            Arc::new(Int64Array::from_iter_values(0..n)),
        ];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    // `count(*) OVER ()` needs the whole input and no sort, so nothing else reserves memory.
    const WHOLE: &str = "SELECT v, count(*) OVER () AS n FROM t";

    #[tokio::test]
    async fn a_whole_input_window_is_counted_against_the_pool() {
        for off in [Disabled::default(), Disabled::all()] {
            let ctx = session_on(1, &off, 8 << 20, &[("t", numbers())]);
            let e = ctx.sql(WHOLE).await.unwrap().collect().await.unwrap_err().to_string();
            assert!(e.contains("Resources exhausted") && e.contains("WindowAggExec[0]"), "{e}");
        }
    }

    #[tokio::test]
    async fn its_answer_comes_in_batch_size_slices() {
        let ctx = session_on(1, &Disabled::default(), 64 << 20, &[("t", numbers())]);
        let plan = ctx.sql(WHOLE).await.unwrap().create_physical_plan().await.unwrap();
        let text = displayable(plan.as_ref()).indent(false).to_string();
        let at = |name: &str| text.find(name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        assert!(
            at("SlicedWindowOutput") < at("WindowAggExec") && at("WindowAggExec") < at("CountedWindowInput")
        );
        let batches = collect(plan, ctx.task_ctx()).await.unwrap();
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1_000_000);
        assert!(
            batches.iter().all(|b| b.num_rows() <= 1024),
            "{:?}",
            batches.iter().map(|b| b.num_rows()).max()
        );
        let n = batches[0].column(1).as_any().downcast_ref::<Int64Array>().unwrap();
        assert!(n.iter().all(|n| n == Some(1_000_000)));
        // Its memory is given back when the query is done.
        assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
    }
}
