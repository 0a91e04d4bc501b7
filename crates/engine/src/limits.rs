//! What keeps one query, or many, from taking the server down: admission (at most N
//! running, M waiting, each waiting at most T), a deadline over the whole life of a query,
//! the memory pool's size, how deeply a query may nest, what a batch held in memory is
//! counted as, and joins that give a cancelled query the chance to stop.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{CrossJoinExec, NestedLoopJoinExec};
use datafusion::physical_plan::{ExecutionPlan, RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;
use skiff_metrics as metrics;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::QueryError;

/// Concurrency admission: a query runs with a permit; without one it waits in a bounded
/// queue for a bounded time, else it is turned away (429) so clients back off.
pub struct Admission {
    permits: Arc<Semaphore>,
    max_running: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
    max_wait: Duration,
}

impl Admission {
    pub fn new(max_running: usize, max_waiting: usize, max_wait: Duration) -> Self {
        let max_running = max_running.max(1);
        Self {
            permits: Arc::new(Semaphore::new(max_running)),
            max_running,
            waiting: AtomicUsize::new(0),
            max_waiting,
            max_wait,
        }
    }

    /// Waits for a permit until `deadline` or the queue timeout, whichever comes first, or
    /// until shutdown cancels what is left. The wait is measured for `/metrics`.
    pub async fn admit(
        &self,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) -> Result<OwnedSemaphorePermit, QueryError> {
        let arrived = Instant::now();
        let got = self.wait(deadline, shutdown).await;
        let outcome = match &got {
            Ok(_) => "admitted",
            Err(QueryError::Timeout) => "timeout",
            Err(QueryError::ShuttingDown(_)) => "shutting_down",
            Err(_) => "overloaded",
        };
        metrics::queue_wait(outcome, arrived.elapsed());
        got
    }

    async fn wait(
        &self,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) -> Result<OwnedSemaphorePermit, QueryError> {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(QueryError::Overloaded(format!(
                "too many queries: {} running and {} waiting",
                self.running(),
                self.max_waiting
            )));
        }
        let until = deadline.min(Instant::now() + self.max_wait);
        let got = tokio::select! {
            got = tokio::time::timeout_at(until, self.permits.clone().acquire_owned()) => Some(got),
            _ = shutdown.cancelled() => None,
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        match got {
            None => Err(QueryError::ShuttingDown(CANCELLED_AT_SHUTDOWN.into())),
            Some(Ok(Ok(p))) => Ok(p),
            _ if Instant::now() >= deadline => Err(QueryError::Timeout),
            _ => Err(QueryError::Overloaded(format!("no query slot became free within {:?}", self.max_wait))),
        }
    }

    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst).min(self.max_waiting)
    }

    pub fn running(&self) -> usize {
        self.max_running - self.permits.available_permits()
    }
}

/// Why a query still running when the shutdown grace period ends fails.
pub const CANCELLED_AT_SHUTDOWN: &str =
    "the query outlived the grace period (--shutdown-grace) and was cancelled";

/// A result stream that holds its query's permit while the query runs. A watchdog ends the
/// query, whether or not anyone polls the stream: at the deadline ([`QueryError::Timeout`]),
/// when shutdown cancels running queries ([`QueryError::ShuttingDown`]), or when the consumer
/// has not taken a ready batch for `stall` (a client that stopped reading). Ending drops the
/// query (so cancels it) and frees its permit at once; the consumer's next poll gets the error.
pub struct Bounded {
    state: Arc<std::sync::Mutex<Running>>,
    schema: SchemaRef,
    watchdog: tokio::task::AbortHandle,
}

struct Running {
    inner: Option<SendableRecordBatchStream>,
    permit: Option<OwnedSemaphorePermit>,
    /// Why the watchdog ended the query, until the consumer is told.
    ended: Option<QueryError>,
    /// Since when a batch handed out waits for the consumer to come back for the next.
    handed_out: Option<Instant>,
    waker: Option<std::task::Waker>,
}

impl Running {
    fn end(&mut self, why: QueryError) {
        if self.inner.take().is_some() {
            self.ended = Some(why);
        }
        self.permit = None;
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

impl Bounded {
    pub fn new(
        inner: SendableRecordBatchStream,
        deadline: Instant,
        stall: Duration,
        shutdown: CancellationToken,
        permit: OwnedSemaphorePermit,
        stats: Arc<skiff_lake::stats::QueryStats>,
    ) -> Self {
        let schema = inner.schema();
        let state = Arc::new(std::sync::Mutex::new(Running {
            inner: Some(inner),
            permit: Some(permit),
            ended: None,
            handed_out: None,
            waker: None,
        }));
        let watched = Arc::downgrade(&state);
        let watchdog = tokio::spawn(async move {
            let mut check = tokio::time::interval(stall.clamp(Duration::from_millis(10), Duration::from_secs(1)));
            loop {
                let why = tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => QueryError::Timeout,
                    _ = shutdown.cancelled() => QueryError::ShuttingDown(CANCELLED_AT_SHUTDOWN.into()),
                    _ = check.tick() => {
                        let Some(state) = watched.upgrade() else { return };
                        let stalled = state.lock().expect("running").handed_out.is_some_and(|t| t.elapsed() >= stall);
                        if !stalled {
                            continue;
                        }
                        QueryError::Stalled(format!(
                            "the client took no data for {stall:?} (--write-timeout): the query was cancelled"
                        ))
                    }
                };
                if let Some(state) = watched.upgrade() {
                    stats.set_ended(Arc::new(why.clone()));
                    state.lock().expect("running").end(why);
                }
                return;
            }
        })
        .abort_handle();
        Self { state, schema, watchdog }
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        self.watchdog.abort();
    }
}

impl Stream for Bounded {
    type Item = DFResult<RecordBatch>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut state = self.state.lock().expect("running");
        state.handed_out = None;
        if let Some(e) = state.ended.take() {
            return Poll::Ready(Some(Err(DataFusionError::External(Box::new(e)))));
        }
        let Some(inner) = state.inner.as_mut() else { return Poll::Ready(None) };
        match inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(item)) => {
                state.handed_out = Some(Instant::now());
                Poll::Ready(Some(item))
            }
            Poll::Ready(None) => {
                // Done: the slot is free as soon as the last batch is out.
                state.inner = None;
                state.permit = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl RecordBatchStream for Bounded {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// The memory pool's size when none is configured: 60% of what this process may use (the
/// cgroup limit in a container, else physical memory), leaving room for caches and the
/// allocator, so a heavy query spills or fails instead of the container being OOM-killed.
pub fn default_memory_limit() -> usize {
    let physical = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map(|kb| kb * 1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    let total = match (physical, cgroup) {
        (Some(p), Some(c)) => p.min(c),
        (Some(p), None) => p,
        (None, Some(c)) => c,
        (None, None) => 4 << 30,
    };
    total / 10 * 6
}

/// Half of the space free in `dir` (1 GiB when it cannot be read): what spilling may use by
/// default, so that queries never fill the disk the process and its caches live on.
pub fn default_spill_bytes(dir: &std::path::Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return 1 << 30 };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a buffer statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return 1 << 30;
    }
    let free = (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64);
    usize::try_from(free / 2).unwrap_or(usize::MAX)
}

/// The memory a batch's rows take. Aggregations emit slices of one large array, and every
/// slice reports the whole array in `get_array_memory_size`. A string view array reports every
/// buffer it points into, and after a sort or a concatenation that is all of its sources'
/// buffers (one window batch reported gigabytes): it counts its views and the bytes they use.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => view_size(c.as_string_view().views(), c.nulls()),
            DataType::BinaryView => view_size(c.as_binary_view().views(), c.nulls()),
            _ => c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()),
        })
        .sum()
}

/// A view holds strings of up to 12 bytes itself; a longer one points at its bytes elsewhere.
fn view_size(views: &[u128], nulls: Option<&NullBuffer>) -> usize {
    views.len() * 16 + outside(views) + nulls.map_or(0, |n| n.len().div_ceil(8))
}

fn outside(views: &[u128]) -> usize {
    views.iter().map(|v| *v as u32 as usize).filter(|&len| len > 12).sum()
}

/// Copies the strings of each view column whose buffers hold more than twice the bytes its
/// views use into buffers of its own. A batch that is kept (a shared subquery's rows) or
/// gathered (a window's) would otherwise keep whole decoded pages alive for the few strings a
/// filter let through, or list a sort's buffers once per source batch.
pub fn compact_views(batch: RecordBatch) -> DFResult<RecordBatch> {
    fn wasteful(views: &[u128], buffers: &[arrow::buffer::Buffer]) -> bool {
        buffers.iter().map(|b| b.len()).sum::<usize>() > 2 * outside(views)
    }
    let mut changed = false;
    let columns = batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View if wasteful(c.as_string_view().views(), c.as_string_view().data_buffers()) => {
                changed = true;
                Arc::new(c.as_string_view().gc()) as ArrayRef
            }
            DataType::BinaryView
                if wasteful(c.as_binary_view().views(), c.as_binary_view().data_buffers()) =>
            {
                changed = true;
                Arc::new(c.as_binary_view().gc()) as ArrayRef
            }
            _ => c.clone(),
        })
        .collect();
    if !changed {
        return Ok(batch);
    }
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

/// A cancelled or timed-out query stops where its task next yields, and a task yields only
/// when a stream in it returns `Pending`. A nested-loop or cross join can turn one input
/// batch into seconds of output batches without polling its inputs, and so without
/// yielding: its query kept both query threads busy long after its 504. Each output batch of
/// such a join now spends tokio's cooperative budget, so the task yields every 128 batches.
#[derive(Debug, Default)]
pub struct YieldingJoins;

impl PhysicalOptimizerRule for YieldingJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let any = node.as_any();
            if any.is::<NestedLoopJoinExec>() || any.is::<CrossJoinExec>() {
                return Ok(Transformed::yes(Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "yielding_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{StringViewArray, UInt32Array};
    use arrow::compute::take;

    use super::*;

    #[test]
    fn a_few_views_count_their_own_bytes_not_the_buffers_they_share() {
        let long = "x".repeat(100);
        let all: StringViewArray = (0..10_000).map(|i| Some(format!("{long}{i}"))).collect();
        let few = take(&all, &UInt32Array::from(vec![0, 5_000]), None).unwrap();
        let batch = |a| RecordBatch::try_from_iter([("s", a)]).unwrap();
        let (all, few) = (batch(Arc::new(all) as _), batch(few));
        // The two taken views still point into the whole array's buffers.
        assert!(few.get_array_memory_size() > 1_000_000);
        assert_eq!(batch_bytes(&few), 2 * 16 + 101 + 104);
        let bytes: usize = (0..10_000).map(|i| 100 + format!("{i}").len()).sum();
        assert_eq!(batch_bytes(&all), 10_000 * 16 + bytes);
        // Compacted, the few views get buffers of their own; the whole array is left alone.
        let compacted = compact_views(few).unwrap();
        assert!(compacted.get_array_memory_size() < 1_000);
        assert_eq!(compacted.column(0).as_string_view().value(1), format!("{long}5000"));
        assert_eq!(
            compact_views(all.clone()).unwrap().column(0).as_string_view().data_buffers(),
            all.column(0).as_string_view().data_buffers()
        );
        // Inline strings (12 bytes or fewer) take only their views.
        let short: StringViewArray = vec![Some("a"), None, Some("bcd")].into_iter().collect();
        assert_eq!(batch_bytes(&batch(Arc::new(short) as _)), 3 * 16 + 1);
    }
}
