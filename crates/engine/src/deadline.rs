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
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::{CANCELLED_AT_SHUTDOWN, Permit};
use crate::error::QueryError;

/// A result stream that holds its query's permit while the query runs. A watchdog ends the
/// query, whether or not anyone polls the stream: at the deadline ([`QueryError::Timeout`]),
/// when shutdown cancels running queries ([`QueryError::ShuttingDown`]), or when the consumer
/// has not taken a ready batch for `stall` (a client that stopped reading). Ending drops the
/// query (so cancels it) and frees its permit at once; the consumer's next poll gets the error.
pub struct Bounded {
    state: Arc<std::sync::Mutex<Running>>,
    woken: Arc<Woken>,
    schema: SchemaRef,
    watchdog: tokio::task::AbortHandle,
}

/// The waker the query is polled with: it notes when the query woke its consumer. A consumer
/// whose last poll found nothing ready, and that is never polled again (an HTTP/2 stream whose
/// client stopped reading is not polled while its window is full), has then not taken a ready
/// batch since that moment, though none was handed out.
#[derive(Default)]
struct Woken {
    at: std::sync::Mutex<Option<Instant>>,
    consumer: std::sync::Mutex<Option<std::task::Waker>>,
}

impl futures::task::ArcWake for Woken {
    fn wake_by_ref(this: &Arc<Self>) {
        this.at.lock().expect("woken").get_or_insert_with(Instant::now);
        if let Some(w) = this.consumer.lock().expect("woken").as_ref() {
            w.wake_by_ref();
        }
    }
}

struct Running {
    inner: Option<SendableRecordBatchStream>,
    permit: Option<Permit>,
    /// Why the watchdog ended the query, until the consumer is told.
    ended: Option<QueryError>,
    /// Since when a batch handed out waits for the consumer to come back for the next.
    handed_out: Option<Instant>,
}

impl Running {
    fn end(&mut self, why: QueryError) {
        if self.inner.take().is_some() {
            self.ended = Some(why);
        }
        self.permit = None;
    }
}

impl Bounded {
    pub fn new(
        inner: SendableRecordBatchStream,
        deadline: Instant,
        stall: Duration,
        shutdown: CancellationToken,
        permit: Permit,
        stats: Arc<skiff_lake::stats::QueryStats>,
    ) -> Self {
        let schema = inner.schema();
        let state = Arc::new(std::sync::Mutex::new(Running {
            inner: Some(inner),
            permit: Some(permit),
            ended: None,
            handed_out: None,
        }));
        let watched = Arc::downgrade(&state);
        let woken = Arc::new(Woken::default());
        let woken_watched = Arc::downgrade(&woken);
        let watchdog = tokio::spawn(async move {
            let mut check = tokio::time::interval(stall.clamp(Duration::from_millis(10), Duration::from_secs(1)));
            loop {
                let why = tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => QueryError::Timeout,
                    _ = shutdown.cancelled() => QueryError::ShuttingDown(CANCELLED_AT_SHUTDOWN.into()),
                    _ = check.tick() => {
                        let (Some(state), Some(woken)) = (watched.upgrade(), woken_watched.upgrade()) else { return };
                        let waited = |t: &Option<Instant>| t.is_some_and(|t| t.elapsed() >= stall);
                        let stalled = waited(&state.lock().expect("running").handed_out)
                            || waited(&woken.at.lock().expect("woken"));
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
                // The consumer's next poll gets the error.
                if let Some(woken) = woken_watched.upgrade()
                    && let Some(consumer) = woken.consumer.lock().expect("woken").take()
                {
                    consumer.wake();
                }
                return;
            }
        })
        .abort_handle();
        Self { state, woken, schema, watchdog }
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
        *self.woken.consumer.lock().expect("woken") = Some(cx.waker().clone());
        *self.woken.at.lock().expect("woken") = None;
        let waker = futures::task::waker(Arc::clone(&self.woken));
        let mut state = self.state.lock().expect("running");
        state.handed_out = None;
        if let Some(e) = state.ended.take() {
            return Poll::Ready(Some(Err(DataFusionError::External(Box::new(e)))));
        }
        let Some(inner) = state.inner.as_mut() else { return Poll::Ready(None) };
        match inner.as_mut().poll_next(&mut Context::from_waker(&waker)) {
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
            Poll::Pending => Poll::Pending,
        }
    }
}

impl RecordBatchStream for Bounded {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;

    use super::*;

    /// The consumer polls once, finds nothing ready, and never comes back, while the query
    /// then has a batch for it: the query ends after `stall` and its slot is free.
    #[tokio::test]
    async fn a_consumer_that_never_returns_after_a_pending_poll_is_stalled() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let (tx, rx) = tokio::sync::mpsc::channel::<DFResult<RecordBatch>>(1);
        let inner = RecordBatchStreamAdapter::new(schema.clone(), from_channel(rx));
        let slots = crate::admission::Admission::new(1, 0, Duration::from_secs(1), None);
        let permit =
            slots.admit(Instant::now() + Duration::from_secs(1), &CancellationToken::new()).await.unwrap();
        let stall = Duration::from_millis(200);
        let mut bounded = Bounded::new(
            Box::pin(inner),
            Instant::now() + Duration::from_secs(60),
            stall,
            CancellationToken::new(),
            permit,
            Arc::default(),
        );
        let waker = futures::task::noop_waker();
        assert!(bounded.poll_next_unpin(&mut Context::from_waker(&waker)).is_pending());
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        tx.send(Ok(batch)).await.unwrap();
        tokio::time::sleep(stall * 5).await;
        assert_eq!(slots.running(), 0, "the slot is still held");
        let next = bounded.next().await.unwrap();
        assert!(next.unwrap_err().to_string().contains("--write-timeout"));
    }

    fn from_channel(
        mut rx: tokio::sync::mpsc::Receiver<DFResult<RecordBatch>>,
    ) -> impl futures::Stream<Item = DFResult<RecordBatch>> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
