//! Admission: at most N queries run, M wait, each waiting at most T, so an overloaded server
//! answers 429 instead of queueing without end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

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
