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

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use arrow::array::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::WindowAggExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, stream};

use crate::memory::batch_bytes;

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
            if !node.as_any().is::<WindowAggExec>() || node.children()[0].as_any().is::<Pass>() {
                return Ok(Transformed::no(node));
            }
            let input = Arc::new(Pass::new(Job::Count, node.children()[0].clone()));
            let window = node.with_new_children(vec![input])?;
            Ok(Transformed::yes(Arc::new(Pass::new(Job::Slice, window))))
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

/// What a [`Pass`] node does to the batches going through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    /// Reserves each batch's memory and, at the end, as much again; frees it when dropped.
    Count,
    /// Cuts each batch into slices of at most the session's batch size.
    Slice,
}

/// A node that passes its input's batches on, doing its [`Job`] to them.
#[derive(Debug)]
pub struct Pass {
    job: Job,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl Pass {
    fn new(job: Job, input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = Arc::new(PlanProperties::clone(input.properties()));
        Self { job, input, properties }
    }
}

impl DisplayAs for Pass {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl ExecutionPlan for Pass {
    fn name(&self) -> &str {
        match self.job {
            Job::Count => "CountedWindowInput",
            Job::Slice => "SlicedWindowOutput",
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.len() {
            1 => Ok(Arc::new(Pass::new(self.job, children.swap_remove(0)))),
            _ => Err(DataFusionError::Internal(format!("{} has one child", self.name()))),
        }
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&ctx))?;
        let schema = input.schema();
        Ok(match self.job {
            Job::Count => {
                let reservation =
                    MemoryConsumer::new(format!("WindowAggExec[{partition}]")).register(ctx.memory_pool());
                Box::pin(RecordBatchStreamAdapter::new(schema, Counted { input, reservation, ended: false }))
            }
            Job::Slice => {
                let size = ctx.session_config().batch_size().max(1);
                let sliced = input.flat_map(move |b| stream::iter(slices(b, size)));
                Box::pin(RecordBatchStreamAdapter::new(schema, sliced))
            }
        })
    }
}

/// `input`'s batches, each reserved as it passes, and the whole again when it ends (the
/// window's concatenation). The reservation lives as long as this stream, which the window keeps
/// as long as it keeps its batches.
struct Counted {
    input: SendableRecordBatchStream,
    reservation: MemoryReservation,
    ended: bool,
}

impl futures::Stream for Counted {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        Poll::Ready(match ready!(self.input.poll_next_unpin(cx)) {
            Some(Ok(batch)) => Some(self.reservation.try_grow(batch_bytes(&batch)).map(|()| batch)),
            Some(Err(e)) => {
                self.ended = true;
                Some(Err(e))
            }
            None => {
                self.ended = true;
                let whole = self.reservation.size();
                self.reservation.try_grow(whole).err().map(Err)
            }
        })
    }
}

/// `batch` as slices of at most `size` rows (zero-copy).
fn slices(batch: Result<RecordBatch>, size: usize) -> Vec<Result<RecordBatch>> {
    match batch {
        Ok(b) if b.num_rows() > size => {
            (0..b.num_rows()).step_by(size).map(|at| Ok(b.slice(at, size.min(b.num_rows() - at)))).collect()
        }
        other => vec![other],
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
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
