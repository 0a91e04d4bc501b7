//! A node that passes its input's batches on, doing a [`Job`] to each: the fixes that make
//! up for what a DataFusion operator counts, emits or claims about its rows put one beside it.

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, stream};

use crate::memory::{batch_bytes, compact_views, slices};

/// What a [`Pass`] node does to the batches going through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Job {
    /// Under a window that keeps its whole input: reserves each batch's memory and, at the
    /// end, as much again (the window's concatenation); frees it when dropped.
    CountWindowInput,
    /// Over such a window: cuts each batch into slices of at most the session's batch size.
    SliceWindowOutput,
    /// Under a hash join's build side: copies each batch whose buffers are counted at more
    /// than twice what its rows use ([`own_buffers`]).
    OwnBuffers,
    /// Under a hash exchange: copies the strings of each view column whose buffers hold more
    /// than twice what its views use ([`compact_views`]).
    CompactViews,
    /// Over an aggregation with grouping sets: passes its rows on unchanged and claims nothing
    /// about them but their partitioning (no constants, no order), so sorts above it stay.
    ForgetGroupProperties,
}

impl Job {
    pub const ALL: [Job; 5] = [
        Job::CountWindowInput,
        Job::SliceWindowOutput,
        Job::OwnBuffers,
        Job::ForgetGroupProperties,
        Job::CompactViews,
    ];

    /// The job as it travels to a distributed worker.
    pub fn to_byte(self) -> u8 {
        Self::ALL.iter().position(|j| *j == self).expect("every job is listed") as u8
    }

    pub fn from_byte(b: u8) -> Result<Self> {
        Self::ALL.get(b as usize).copied().ok_or_else(|| DataFusionError::Internal(format!("no job {b}")))
    }
}

/// A node that passes its input's batches on, doing its [`Job`] to them.
#[derive(Debug)]
pub struct Pass {
    job: Job,
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl Pass {
    pub fn over(job: Job, input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let properties = Arc::new(match job {
            Job::ForgetGroupProperties => PlanProperties::new(
                EquivalenceProperties::new(input.schema()),
                input.properties().partitioning.clone(),
                input.properties().emission_type,
                input.properties().boundedness,
            ),
            _ => PlanProperties::clone(input.properties()),
        });
        Arc::new(Self { job, input, properties })
    }

    /// The job of `plan`, if it is a `Pass`.
    pub fn job_of(plan: &dyn ExecutionPlan) -> Option<Job> {
        plan.as_any().downcast_ref::<Self>().map(|p| p.job)
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
            Job::CountWindowInput => "CountedWindowInput",
            Job::SliceWindowOutput => "SlicedWindowOutput",
            Job::OwnBuffers => "OwnBuffers",
            Job::CompactViews => "CompactedViews",
            Job::ForgetGroupProperties => "NullableGroups",
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
        vec![self.job != Job::ForgetGroupProperties]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.len() {
            1 => Ok(Pass::over(self.job, children.swap_remove(0))),
            _ => Err(DataFusionError::Internal(format!("{} has one child", self.name()))),
        }
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&ctx))?;
        let schema = input.schema();
        Ok(match self.job {
            Job::CountWindowInput => {
                let reservation =
                    MemoryConsumer::new(format!("WindowAggExec[{partition}]")).register(ctx.memory_pool());
                Box::pin(RecordBatchStreamAdapter::new(schema, Counted { input, reservation, ended: false }))
            }
            Job::SliceWindowOutput => {
                let size = ctx.session_config().batch_size().max(1);
                let sliced = input.flat_map(move |b| match b {
                    Ok(b) => stream::iter(slices(&b, size).into_iter().map(Ok).collect::<Vec<_>>()),
                    Err(e) => stream::iter(vec![Err(e)]),
                });
                Box::pin(RecordBatchStreamAdapter::new(schema, sliced))
            }
            Job::OwnBuffers => {
                Box::pin(RecordBatchStreamAdapter::new(schema, input.map(|b| b.and_then(own_buffers))))
            }
            Job::CompactViews => {
                Box::pin(RecordBatchStreamAdapter::new(schema, input.map(|b| b.and_then(compact_views))))
            }
            Job::ForgetGroupProperties => input,
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

/// A batch whose buffers are counted at more than twice what its rows use, copied.
pub fn own_buffers(batch: RecordBatch) -> Result<RecordBatch> {
    let batch = compact_views(batch)?;
    let counted = get_record_batch_memory_size(&batch);
    let used = batch
        .columns()
        .iter()
        .try_fold(0usize, |sum, c| c.to_data().get_slice_memory_size().map(|n| sum + n));
    match used {
        Ok(used) if counted > 2 * used + (64 << 10) => {
            let rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
            Ok(take_record_batch(&batch, &rows)?)
        }
        _ => Ok(batch),
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn a_slice_of_a_large_array_gets_its_own_buffers() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let whole =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..1_000_000))]).unwrap();
        let slice = whole.slice(10, 8192);
        assert!(get_record_batch_memory_size(&slice) >= 8_000_000);
        let own = own_buffers(slice.clone()).unwrap();
        assert_eq!(own, slice);
        assert!(get_record_batch_memory_size(&own) < 100_000);
        // A batch that is its own stays as it is.
        let small = own_buffers(own.clone()).unwrap();
        assert_eq!(
            small.column(0).to_data().buffers()[0].as_ptr(),
            own.column(0).to_data().buffers()[0].as_ptr()
        );
    }
}
