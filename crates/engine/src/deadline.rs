//! A query's result stream, ended by its deadline, by shutdown, or by a client that stopped
//! reading, whether or not anyone polls it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_plan::{RecordBatchStream, SendableRecordBatchStream};
use futures::Stream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::CANCELLED_AT_SHUTDOWN;
use crate::error::QueryError;

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
