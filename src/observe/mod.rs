//! The one log line per query ([`QueryLog`]), shared by every front end. It lists the query
//! in the engine's recent-queries registry (`system.queries`) while it runs and records the
//! Prometheus metrics (the `metrics` crate module) when it ends; this module only logs.
//!
//! A front end needs nothing but `QueryLog::new(request_id, route)` to be logged, counted and
//! listed like every other.
//!
//! A front end's whole part:
//!
//! ```ignore
//! let mut log = QueryLog::new(request_id, "flight");
//! log.set_sql(&sql);                         // kept only with --log-sql
//! let q = engine.execute(&sql).await;        // on Err(e): log.finish(Err(&e))
//! log.set_stats(q.stats.clone());
//! // while sending: log.rows += n; log.bytes += encoded.len() as u64;
//! log.finish(Ok(()));                         // or Err(&e); dropping it unfinished = cancelled
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use skiff_engine::error::QueryError;
use skiff_engine::queries;
use skiff_lake::stats::QueryStats;
use skiff_metrics as metrics;

use crate::error::SkiffError;

static LOG_SQL: AtomicBool = AtomicBool::new(false);

/// Process-wide settings, set once at start.
pub fn init(log_sql: bool, query_history: usize) {
    LOG_SQL.store(log_sql, Ordering::Relaxed);
    queries::set_capacity(query_history);
    metrics::init();
}

/// Whether SQL text may be logged and listed (`--log-sql`; it may hold user data).
/// The caller's request id when it is sane (short, no spaces or control characters), else a
/// new one: the same rule for HTTP's `x-request-id` header and Flight's metadata.
pub fn request_id(given: Option<&str>) -> String {
    given
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 128
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        })
        .map(String::from)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// The span of one query's work: whatever it logs names the request.
pub fn query_span(request_id: &str, route: &'static str) -> tracing::Span {
    tracing::info_span!("query", request_id, route)
}

pub fn log_sql() -> bool {
    LOG_SQL.load(Ordering::Relaxed)
}

/// One query from arrival to its last byte. It is listed in `system.queries` as running
/// from `new` on; `finish` (or drop, which means the client went away) writes the one log
/// line, records the metrics and moves it to the history.
pub struct QueryLog {
    running: Arc<queries::Running>,
    /// The span the query's work runs in, so what it logs (a panic too) names the request.
    span: tracing::Span,
    /// Rows sent so far.
    pub rows: u64,
    /// Encoded bytes sent so far.
    pub bytes: u64,
    /// The result was cut at a cap and said so.
    pub truncated: bool,
    done: bool,
}

impl QueryLog {
    pub fn new(request_id: impl Into<String>, route: &'static str) -> Self {
        let request_id = request_id.into();
        Self {
            span: query_span(&request_id, route),
            running: queries::start(request_id, route),
            rows: 0,
            bytes: 0,
            truncated: false,
            done: false,
        }
    }

    /// The span to run the query's planning and execution in.
    pub fn span(&self) -> tracing::Span {
        self.span.clone()
    }

    /// The query's text: kept for the log line and `system.queries` only with `--log-sql`.
    pub fn set_sql(&mut self, sql: &str) {
        if log_sql() {
            let _ = self.running.sql.set(sql.to_string());
        }
    }

    /// The query's scan counters, live while it runs.
    pub fn set_stats(&mut self, stats: Arc<QueryStats>) {
        let _ = self.running.stats.set(stats);
    }

    /// Whether the query has ended and its line is written.
    pub fn done(&self) -> bool {
        self.done
    }

    pub fn finish(&mut self, outcome: Result<(), &SkiffError>) {
        if self.done {
            return;
        }
        self.done = true;
        match outcome {
            Ok(()) => self.emit("ok", None),
            Err(e) => {
                count_dependency_error(e);
                self.emit(e.code(), Some(e.to_string()))
            }
        }
    }

    fn emit(&self, outcome: &str, error: Option<String>) {
        let r = &self.running;
        let took = r.started.elapsed();
        let stats = r.stats.get().cloned().unwrap_or_default();
        let snapshots: Vec<String> = stats
            .snapshots()
            .into_iter()
            .map(|(t, s)| format!("{t}@{}", s.map(|s| s.to_string()).unwrap_or_else(|| "empty".into())))
            .collect();
        let sql = r.sql.get().map(String::as_str);
        tracing::info!(
            target: "skiff::query",
            request_id = %r.request_id,
            route = r.route,
            outcome,
            duration_ms = took.as_millis() as u64,
            rows = self.rows,
            bytes_sent = self.bytes,
            truncated = self.truncated,
            files_planned = stats.files_planned(),
            files_pruned = stats.files_pruned(),
            result_cache = stats.result_cache(),
            files_scanned = stats.files_scanned(),
            bytes_scanned = stats.bytes_scanned(),
            snapshots = %snapshots.join(","),
            error = error.as_deref(),
            sql,
            "query"
        );
        metrics::query_finished(r.route, outcome, took);
        metrics::scanned(stats.files_scanned(), stats.bytes_scanned(), stats.requests());
        let mut record = r.record();
        record.state = outcome.to_string();
        record.rows = Some(self.rows);
        record.bytes_sent = Some(self.bytes);
        record.truncated = Some(self.truncated);
        record.files_scanned = Some(stats.files_scanned());
        record.bytes_scanned = Some(stats.bytes_scanned());
        // An error's text may quote the query's literals, which other clients of
        // `system.queries` must not read: only with `--log-sql`, as the SQL itself.
        record.error = error.filter(|_| log_sql());
        queries::finish(r, record);
    }
}

impl Drop for QueryLog {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            // Ended by skiff while its client was away (a stall, the deadline), or by the
            // client going away.
            let ended = self.running.stats.get().and_then(|s| s.ended::<QueryError>());
            let outcome = ended.map(|e| SkiffError::from(e.clone()).code()).unwrap_or("cancelled");
            self.emit(outcome, None);
        }
    }
}

/// Outages and unreadable files are counted where a query fails for them, once per query.
fn count_dependency_error(e: &SkiffError) {
    match e {
        SkiffError::Unavailable { dependency: "catalog", .. } => metrics::catalog_error("query"),
        SkiffError::Unavailable { .. } => metrics::object_store_error(),
        SkiffError::DataError(_) => metrics::data_error(),
        _ => {}
    }
}
