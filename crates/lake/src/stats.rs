//! What one query cost: filled in by the scans while the query plans and runs, read by the
//! front ends for their response metrics and by the query log line.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::catalog::Session;
use datafusion::physical_plan::metrics::{Count, Metric, MetricValue, MetricsSet};

const FILES_SCANNED: &str = "skiff_files_scanned";
const BYTES_SCANNED: &str = "skiff_bytes_scanned";
const REQUESTS: &str = "skiff_requests";

#[derive(Debug, Default)]
pub struct QueryStats {
    /// Files Iceberg planning kept after pruning.
    pub files_planned: AtomicU64,
    /// Data files in the snapshots read (from their summaries), so `total - planned` were
    /// pruned by Iceberg planning without being opened.
    pub files_total: AtomicU64,
    /// Files actually opened.
    pub files_scanned: AtomicU64,
    /// Bytes read from data files.
    pub bytes_scanned: AtomicU64,
    /// Read requests made to storage (GETs, footers included).
    pub requests: AtomicU64,
    /// Each table read, with the snapshot it was read at (`None`: the table has no snapshot).
    snapshots: Mutex<Vec<(String, Option<i64>)>>,
    /// Data files open now and the last few closed, to name them in a decoding error, which
    /// Parquet reports without a file (its reader is closed by the time the error arrives).
    open: Mutex<Vec<String>>,
    closed: Mutex<std::collections::VecDeque<String>>,
    /// How the result cache served the query (`hit`, `miss`, `bypass`, `off`).
    result_cache: OnceLock<&'static str>,
    /// Why skiff ended the query while its consumer was away (the engine's error, which the
    /// lake does not know): a stalled client is told nothing more, so this is what its log
    /// line says.
    ended: OnceLock<Arc<dyn Any + Send + Sync>>,
}

impl QueryStats {
    /// The stats of the query a session belongs to. A session without them (a planning
    /// path skiff did not set up) gets a throwaway set, so scans never fail for lack of one.
    pub fn of(state: &dyn Session) -> Arc<QueryStats> {
        state.config().get_extension::<QueryStats>().unwrap_or_default()
    }

    pub fn record_snapshot(&self, table: String, snapshot: Option<i64>) {
        let mut s = self.snapshots.lock().expect("stats lock");
        if !s.iter().any(|(t, id)| *t == table && *id == snapshot) {
            s.push((table, snapshot));
        }
    }

    pub fn snapshots(&self) -> Vec<(String, Option<i64>)> {
        self.snapshots.lock().expect("stats lock").clone()
    }

    pub fn opened(&self, location: &str) {
        self.open.lock().expect("stats lock").push(location.to_string());
    }

    pub fn closed(&self, location: &str) {
        let mut open = self.open.lock().expect("stats lock");
        if let Some(i) = open.iter().position(|l| l == location) {
            open.swap_remove(i);
        }
        let mut closed = self.closed.lock().expect("stats lock");
        if closed.len() == 4 {
            closed.pop_front();
        }
        closed.push_back(location.to_string());
    }

    /// The data files open now, then the last closed, newest first.
    pub fn recent_files(&self) -> Vec<String> {
        let mut files = self.open.lock().expect("stats lock").clone();
        for f in self.closed.lock().expect("stats lock").iter().rev() {
            if !files.contains(f) {
                files.push(f.clone());
            }
        }
        files
    }

    pub fn files_scanned(&self) -> u64 {
        self.files_scanned.load(Ordering::Relaxed)
    }

    pub fn bytes_scanned(&self) -> u64 {
        self.bytes_scanned.load(Ordering::Relaxed)
    }

    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn files_planned(&self) -> u64 {
        self.files_planned.load(Ordering::Relaxed)
    }

    pub fn files_pruned(&self) -> u64 {
        self.files_total.load(Ordering::Relaxed).saturating_sub(self.files_planned())
    }

    pub fn set_ended(&self, why: Arc<dyn Any + Send + Sync>) {
        let _ = self.ended.set(why);
    }

    /// Why the query was ended, when it was and the reason is an `E`.
    pub fn ended<E: 'static>(&self) -> Option<&E> {
        self.ended.get().and_then(|e| e.downcast_ref::<E>())
    }

    /// The reads counted here, as plan metrics: how a worker's reads reach the coordinator,
    /// whose `QueryStats` is in another process. Named apart from DataFusion's own Parquet
    /// metrics (`bytes_scanned` is one), which count what they see differently.
    pub fn reads_as_metrics(&self) -> MetricsSet {
        let mut set = MetricsSet::new();
        for (name, n) in self.reads() {
            let count = Count::new();
            count.add(n as usize);
            set.push(Arc::new(Metric::new(MetricValue::Count { name: name.into(), count }, None)));
        }
        set
    }

    /// Adds the reads in `metrics` (from [`Self::reads_as_metrics`], summed over a worker's
    /// tasks) to these.
    pub fn add_reads(&self, metrics: &MetricsSet) {
        for metric in metrics.iter() {
            let MetricValue::Count { name, count } = metric.value() else { continue };
            let counter = match name.as_ref() {
                FILES_SCANNED => &self.files_scanned,
                BYTES_SCANNED => &self.bytes_scanned,
                REQUESTS => &self.requests,
                _ => continue,
            };
            counter.fetch_add(count.value() as u64, Ordering::Relaxed);
        }
    }

    fn reads(&self) -> [(&'static str, u64); 3] {
        [
            (FILES_SCANNED, self.files_scanned()),
            (BYTES_SCANNED, self.bytes_scanned()),
            (REQUESTS, self.requests()),
        ]
    }

    pub fn set_result_cache(&self, how: &'static str) {
        let _ = self.result_cache.set(how);
    }

    pub fn result_cache(&self) -> &'static str {
        self.result_cache.get().copied().unwrap_or("off")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_go_through_plan_metrics_and_nothing_else_counts() {
        let worker = QueryStats::default();
        worker.files_scanned.store(3, Ordering::Relaxed);
        worker.bytes_scanned.store(4096, Ordering::Relaxed);
        worker.requests.store(7, Ordering::Relaxed);
        let mut metrics = worker.reads_as_metrics();
        // DataFusion's own Parquet metric of the same plain name is not skiff's count.
        let count = Count::new();
        count.add(1 << 30);
        metrics.push(Arc::new(Metric::new(MetricValue::Count { name: "bytes_scanned".into(), count }, None)));

        let coordinator = QueryStats::default();
        coordinator.bytes_scanned.store(100, Ordering::Relaxed);
        coordinator.add_reads(&metrics);
        coordinator.add_reads(&metrics);
        assert_eq!(
            (coordinator.files_scanned(), coordinator.bytes_scanned(), coordinator.requests()),
            (6, 100 + 2 * 4096, 14)
        );
    }
}
