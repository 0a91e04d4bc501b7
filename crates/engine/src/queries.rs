//! Recent queries, running and finished, for `system.queries`: every running query, plus
//! the last `--query-history` finished ones in a ring buffer.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::catalog::{MemTable, Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;
use skiff_lake::stats::QueryStats;

/// A query while it runs: what is known from its start, and its live scan counters.
pub struct Running {
    seq: u64,
    pub request_id: String,
    pub route: &'static str,
    pub started_at: SystemTime,
    pub started: Instant,
    pub sql: OnceLock<String>,
    pub stats: OnceLock<Arc<QueryStats>>,
}

/// One row of `system.queries`.
#[derive(Debug, Clone)]
pub struct Record {
    pub request_id: String,
    pub route: &'static str,
    /// `running`, `ok`, `cancelled`, or the error code.
    pub state: String,
    pub started_at: SystemTime,
    pub duration_ms: u64,
    /// Unknown (None) while running: the front end counts them as it sends.
    pub rows: Option<u64>,
    pub bytes_sent: Option<u64>,
    pub truncated: Option<bool>,
    pub files_scanned: Option<u64>,
    pub bytes_scanned: Option<u64>,
    pub error: Option<String>,
    pub sql: Option<String>,
}

struct Registry {
    next: AtomicU64,
    capacity: RwLock<usize>,
    running: Mutex<BTreeMap<u64, Arc<Running>>>,
    finished: Mutex<VecDeque<Record>>,
    /// The number of running queries, sent on every change, so shutdown's drain waits for
    /// the last one to end rather than polling.
    count: tokio::sync::watch::Sender<usize>,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    next: AtomicU64::new(0),
    capacity: RwLock::new(1000),
    running: Mutex::default(),
    finished: Mutex::default(),
    count: tokio::sync::watch::Sender::new(0),
});

/// How many finished queries to keep.
pub fn set_capacity(n: usize) {
    *REGISTRY.capacity.write().expect("queries lock") = n;
}

/// Registers a query as running.
pub fn start(request_id: String, route: &'static str) -> Arc<Running> {
    let r = Arc::new(Running {
        seq: REGISTRY.next.fetch_add(1, Ordering::Relaxed),
        request_id,
        route,
        started_at: SystemTime::now(),
        started: Instant::now(),
        sql: OnceLock::new(),
        stats: OnceLock::new(),
    });
    let mut running = REGISTRY.running.lock().expect("queries lock");
    running.insert(r.seq, r.clone());
    REGISTRY.count.send_replace(running.len());
    r
}

/// Moves a query from running to the history.
pub fn finish(running: &Running, record: Record) {
    {
        let mut running_now = REGISTRY.running.lock().expect("queries lock");
        running_now.remove(&running.seq);
        REGISTRY.count.send_replace(running_now.len());
    }
    let cap = *REGISTRY.capacity.read().expect("queries lock");
    let mut finished = REGISTRY.finished.lock().expect("queries lock");
    finished.push_back(record);
    while finished.len() > cap {
        finished.pop_front();
    }
}

/// Queries in flight (arrived and not yet answered in full), for shutdown's drain.
pub fn running_count() -> usize {
    REGISTRY.running.lock().expect("queries lock").len()
}

/// Resolves once no query is running (at once if none is).
pub async fn all_finished() {
    let mut count = REGISTRY.count.subscribe();
    // The sender lives in a static, so the wait ends only when the count reaches zero.
    let _ = count.wait_for(|n| *n == 0).await;
}

impl Running {
    pub fn record(&self) -> Record {
        let stats = self.stats.get();
        Record {
            request_id: self.request_id.clone(),
            route: self.route,
            state: "running".into(),
            started_at: self.started_at,
            duration_ms: self.started.elapsed().as_millis() as u64,
            rows: None,
            bytes_sent: None,
            truncated: None,
            files_scanned: stats.map(|s| s.files_scanned()),
            bytes_scanned: stats.map(|s| s.bytes_scanned()),
            error: None,
            sql: self.sql.get().map(|s| shorten(s)),
        }
    }
}

/// Longest SQL text kept in the history, so 1,000 entries of 256 KiB queries cannot hold
/// hundreds of megabytes. A cut text says so; the log line keeps the whole text.
const MAX_SQL_KEPT: usize = 16 * 1024;

fn shorten(sql: &str) -> String {
    if sql.len() <= MAX_SQL_KEPT {
        return sql.to_string();
    }
    let mut end = MAX_SQL_KEPT;
    while !sql.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} of {} bytes shown]", &sql[..end], end, sql.len())
}

/// Every known query, finished ones first (oldest first), then running ones by start.
pub fn snapshot() -> Vec<Record> {
    let mut out: Vec<Record> = REGISTRY.finished.lock().expect("queries lock").iter().cloned().collect();
    let running: Vec<Arc<Running>> =
        REGISTRY.running.lock().expect("queries lock").values().cloned().collect();
    out.extend(running.iter().map(|r| r.record()));
    out
}

fn schema() -> SchemaRef {
    static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
        let n = |name: &str, t: DataType| Field::new(name, t, true);
        Arc::new(Schema::new(vec![
            Field::new("request_id", DataType::Utf8, false),
            Field::new("route", DataType::Utf8, false),
            Field::new("state", DataType::Utf8, false),
            Field::new("started_at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
            Field::new("duration_ms", DataType::Int64, false),
            n("rows", DataType::Int64),
            n("bytes_sent", DataType::Int64),
            n("truncated", DataType::Boolean),
            n("files_scanned", DataType::Int64),
            n("bytes_scanned", DataType::Int64),
            n("error", DataType::Utf8),
            n("sql", DataType::Utf8),
        ]))
    });
    SCHEMA.clone()
}

fn batch(records: &[Record]) -> DFResult<RecordBatch> {
    let int = |f: fn(&Record) -> Option<u64>| -> ArrayRef {
        Arc::new(records.iter().map(|r| f(r).map(|v| v as i64)).collect::<Int64Array>())
    };
    let text = |f: fn(&Record) -> Option<&str>| -> ArrayRef {
        Arc::new(records.iter().map(f).collect::<StringArray>())
    };
    let started: TimestampMicrosecondArray = records
        .iter()
        .map(|r| Some(r.started_at.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as i64))
        .collect::<TimestampMicrosecondArray>()
        .with_timezone("UTC");
    let columns: Vec<ArrayRef> = vec![
        text(|r| Some(&r.request_id)),
        text(|r| Some(r.route)),
        text(|r| Some(&r.state)),
        Arc::new(started),
        int(|r| Some(r.duration_ms)),
        int(|r| r.rows),
        int(|r| r.bytes_sent),
        Arc::new(records.iter().map(|r| r.truncated).collect::<BooleanArray>()),
        int(|r| r.files_scanned),
        int(|r| r.bytes_scanned),
        text(|r| r.error.as_deref()),
        text(|r| r.sql.as_deref()),
    ];
    Ok(RecordBatch::try_new(schema(), columns)?)
}

/// `system.queries`: read afresh by every scan, so the query reading it sees itself running.
#[derive(Debug, Default)]
pub struct QueriesTable;

#[async_trait]
impl TableProvider for QueriesTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        schema()
    }

    /// Computed when read, like a view over skiff's own state.
    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let table = MemTable::try_new(schema(), vec![vec![batch(&snapshot())?]])?;
        table.scan(state, projection, filters, limit).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_sql_is_cut_visibly() {
        let sql = format!("SELECT '{}'", "é".repeat(20_000));
        let s = super::shorten(&sql);
        assert!(
            s.len() < 17 * 1024 && s.ends_with(&format!("of {} bytes shown]", sql.len())),
            "{}",
            &s[s.len() - 40..]
        );
        assert_eq!(super::shorten("SELECT 1"), "SELECT 1");
    }
}
