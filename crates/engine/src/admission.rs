//! Admission: at most N queries run, M wait, each waiting at most T, so an overloaded server
//! answers 429 instead of queueing without end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use skiff_metrics as metrics;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::QueryError;

/// Concurrency admission: a query runs with a permit; without one it waits in a bounded
/// queue for a bounded time, else it is turned away (429) so clients back off.
pub struct Admission {
    slots: Arc<Slots>,
    waiting: AtomicUsize,
    max_waiting: usize,
    max_wait: Duration,
}

/// A running query's slot, given back when dropped.
pub struct Permit {
    permit: Option<OwnedSemaphorePermit>,
    slots: Arc<Slots>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.slots.check();
    }
}

/// The slots, and what runs when the last running query ends.
struct Slots {
    permits: Arc<Semaphore>,
    max_running: usize,
    when_idle: Option<fn()>,
    hook_running: Arc<AtomicBool>,
}

impl Slots {
    /// Runs the hook on a thread of its own when no query runs, unless it is still running
    /// from the last time.
    fn check(&self) {
        let Some(hook) = self.when_idle else { return };
        if self.permits.available_permits() != self.max_running
            || self.hook_running.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let running = Arc::clone(&self.hook_running);
        let spawned = std::thread::Builder::new().name("skiff-idle".into()).spawn(move || {
            hook();
            running.store(false, Ordering::SeqCst);
        });
        if spawned.is_err() {
            self.hook_running.store(false, Ordering::SeqCst);
        }
    }
}

impl Admission {
    /// `when_idle` runs each time the last running query ends.
    pub fn new(max_running: usize, max_waiting: usize, max_wait: Duration, when_idle: Option<fn()>) -> Self {
        let max_running = max_running.max(1);
        let slots = Slots {
            permits: Arc::new(Semaphore::new(max_running)),
            max_running,
            when_idle,
            hook_running: Arc::new(AtomicBool::new(false)),
        };
        Self { slots: Arc::new(slots), waiting: AtomicUsize::new(0), max_waiting, max_wait }
    }

    fn permit(&self, permit: OwnedSemaphorePermit) -> Permit {
        Permit { permit: Some(permit), slots: Arc::clone(&self.slots) }
    }

    /// Waits for a permit until `deadline` or the queue timeout, whichever comes first, or
    /// until shutdown cancels what is left. The wait is measured for `/metrics`.
    pub async fn admit(&self, deadline: Instant, shutdown: &CancellationToken) -> Result<Permit, QueryError> {
        let arrived = Instant::now();
        let got = self.wait(deadline, shutdown).await;
        let outcome = match &got {
            Ok(_) => "admitted",
            Err(QueryError::Timeout) => "timeout",
            Err(QueryError::ShuttingDown(_)) => "shutting_down",
            Err(_) => "overloaded",
        };
        metrics::queue_wait(outcome, arrived.elapsed());
        got.map(|p| self.permit(p))
    }

    async fn wait(
        &self,
        deadline: Instant,
        shutdown: &CancellationToken,
    ) -> Result<OwnedSemaphorePermit, QueryError> {
        if let Ok(p) = self.slots.permits.clone().try_acquire_owned() {
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
            got = tokio::time::timeout_at(until, self.slots.permits.clone().acquire_owned()) => Some(got),
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
        self.slots.max_running - self.slots.permits.available_permits()
    }
}

/// Why a query still running when the shutdown grace period ends fails.
pub const CANCELLED_AT_SHUTDOWN: &str =
    "the query outlived the grace period (--shutdown-grace) and was cancelled";

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    static IDLE: AtomicUsize = AtomicUsize::new(0);

    #[tokio::test]
    async fn the_hook_runs_when_the_last_running_query_ends() {
        let admission =
            Admission::new(2, 0, Duration::from_secs(1), Some(|| _ = IDLE.fetch_add(1, Ordering::SeqCst)));
        let deadline = Instant::now() + Duration::from_secs(5);
        let shutdown = CancellationToken::new();
        let first = admission.admit(deadline, &shutdown).await.unwrap();
        let second = admission.admit(deadline, &shutdown).await.unwrap();
        let settled = || async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            IDLE.load(Ordering::SeqCst)
        };
        drop(first);
        assert_eq!(settled().await, 0, "a query still runs");
        drop(second);
        assert_eq!(settled().await, 1);
        drop(admission.admit(deadline, &shutdown).await.unwrap());
        assert_eq!(settled().await, 2);
    }
}
