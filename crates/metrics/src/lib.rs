//! Process-wide counters and histograms, rendered in Prometheus' text exposition format
//! (version 0.0.4) by `GET /metrics`.
//!
//! A crate of its own at the bottom of the workspace, so the lake (cache hits, catalog
//! errors), the engine (queue waits, the result cache) and the server (requests, queries) all
//! count into one registry without depending on each other.
//!
//! Hand-written rather than a metrics crate: a few families, each a mutex-guarded map from
//! label values to numbers, is all skiff needs, and the output format is small and stable.
//! Every label set is bounded (route patterns, status codes, error codes, cache names), so
//! cardinality cannot grow with traffic.
//!
//! `prometheus-client` 0.26 was measured against it (`benches/increments.rs`, 2 threads × 10M
//! increments of one labelled counter, 2 vCPU Intel Xeon sandbox, 2026-12-06): 31–33 ns per
//! increment here, 49–50 ns there. And it writes OpenMetrics, not the 0.0.4 format served
//! here: a `# EOF` line, counters' TYPE named without the `_total` their samples carry, a
//! period added to each HELP text; the strict parser of `tests/observability.rs` rejects it.
//! So this stays.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Query latency buckets, seconds: from a cached lookup to a query at the default timeout.
const DURATION_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Queue wait buckets, seconds: most admissions are immediate, the queue timeout is 10 s.
const WAIT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Caches whose counters are shown (at zero) before their first hit or miss.
const KNOWN_CACHES: &[&str] = &[
    "table_list",
    "result",
    "table",
    "manifest_list",
    "manifest",
    "snapshot_files",
    "parquet_footer",
    "selectivity",
];

struct Registry {
    started: SystemTime,
    http_requests: Counter<2>,
    query_duration: Histogram<2>,
    queue_wait: Histogram<1>,
    scan_files: Counter<0>,
    scan_bytes: Counter<0>,
    scan_requests: Counter<0>,
    cache_hits: Counter<1>,
    cache_misses: Counter<1>,
    catalog_errors: Counter<1>,
    object_store_errors: Counter<0>,
    data_errors: Counter<0>,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    started: SystemTime::now(),
    http_requests: Counter::default(),
    query_duration: Histogram::new(DURATION_BUCKETS),
    queue_wait: Histogram::new(WAIT_BUCKETS),
    scan_files: Counter::default(),
    scan_bytes: Counter::default(),
    scan_requests: Counter::default(),
    cache_hits: Counter::default(),
    cache_misses: Counter::default(),
    catalog_errors: Counter::default(),
    object_store_errors: Counter::default(),
    data_errors: Counter::default(),
});

/// Starts the clock for `skiff_process_start_time_seconds`.
pub fn init() {
    LazyLock::force(&REGISTRY);
}

/// One HTTP response, by route pattern (`/api/v1/accounts/{account}/…`, never the raw path)
/// and status.
pub fn http_request(route: &str, status: u16) {
    REGISTRY.http_requests.add([route.to_string(), status.to_string()], 1);
}

/// One query's whole life, by front-end route and outcome (`ok`, an error code, `cancelled`).
pub fn query_finished(route: &str, outcome: &str, took: Duration) {
    REGISTRY.query_duration.observe([route.to_string(), outcome.to_string()], took.as_secs_f64());
}

/// Time one query spent waiting for an admission permit, and how the wait ended
/// (`admitted`, `overloaded`, `timeout`, `shutting_down`).
pub fn queue_wait(outcome: &'static str, waited: Duration) {
    REGISTRY.queue_wait.observe([outcome.to_string()], waited.as_secs_f64());
}

/// What a finished query read from storage.
pub fn scanned(files: u64, bytes: u64, requests: u64) {
    REGISTRY.scan_files.add([], files);
    REGISTRY.scan_bytes.add([], bytes);
    REGISTRY.scan_requests.add([], requests);
}

/// A lookup a cache answered.
pub fn cache_hit(cache: &'static str) {
    REGISTRY.cache_hits.add([cache.to_string()], 1);
}

/// A lookup a cache could not answer (the source was asked).
pub fn cache_miss(cache: &'static str) {
    REGISTRY.cache_misses.add([cache.to_string()], 1);
}

/// A failed call to the catalog: `source` is `query` (a query failed for it) or `refresh`
/// (the background table-list refresh).
pub fn catalog_error(source: &'static str) {
    REGISTRY.catalog_errors.add([source.to_string()], 1);
}

/// A query that failed because the object store could not be read.
pub fn object_store_error() {
    REGISTRY.object_store_errors.add([], 1);
}

/// A query that failed on a data or metadata file that could not be read as what it is.
pub fn data_error() {
    REGISTRY.data_errors.add([], 1);
}

/// Values sampled at scrape time from their owners (the engine's admission and memory pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub running: usize,
    pub queued: usize,
    pub memory_reserved: usize,
    pub memory_limit: usize,
    pub draining: bool,
}

/// The whole exposition.
pub fn render(g: &Gauges) -> String {
    let r = &*REGISTRY;
    let mut out = String::with_capacity(8 * 1024);
    let o = &mut out;
    family(o, "skiff_build_info", "gauge", "Build information; the value is always 1.");
    sample(o, "skiff_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    let start = r.started.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    family(o, "skiff_process_start_time_seconds", "gauge", "When this process started, Unix seconds.");
    sample(o, "skiff_process_start_time_seconds", &[], start);
    family(o, "skiff_draining", "gauge", "1 while shutting down (no new queries accepted), else 0.");
    sample(o, "skiff_draining", &[], if g.draining { 1.0 } else { 0.0 });

    family(o, "skiff_http_requests_total", "counter", "HTTP responses by route pattern and status code.");
    r.http_requests.render(o, "skiff_http_requests_total", ["route", "status"]);

    family(
        o,
        "skiff_query_duration_seconds",
        "histogram",
        "Query time from arrival to the last byte sent, by route and outcome.",
    );
    r.query_duration.render(o, "skiff_query_duration_seconds", ["route", "outcome"]);
    family(
        o,
        "skiff_query_queue_wait_seconds",
        "histogram",
        "Time queries waited for an execution slot, by how the wait ended.",
    );
    r.queue_wait.render(o, "skiff_query_queue_wait_seconds", ["outcome"]);
    family(o, "skiff_queries_running", "gauge", "Queries holding an execution slot.");
    sample(o, "skiff_queries_running", &[], g.running as f64);
    family(o, "skiff_queries_queued", "gauge", "Queries waiting for an execution slot.");
    sample(o, "skiff_queries_queued", &[], g.queued as f64);

    family(o, "skiff_scan_files_total", "counter", "Data files opened by finished queries.");
    r.scan_files.render(o, "skiff_scan_files_total", []);
    family(o, "skiff_scan_bytes_total", "counter", "Bytes read from data files by finished queries.");
    r.scan_bytes.render(o, "skiff_scan_bytes_total", []);
    family(o, "skiff_scan_requests_total", "counter", "Storage read requests made by finished queries.");
    r.scan_requests.render(o, "skiff_scan_requests_total", []);

    for c in KNOWN_CACHES {
        r.cache_hits.add([c.to_string()], 0);
        r.cache_misses.add([c.to_string()], 0);
    }
    family(o, "skiff_cache_hits_total", "counter", "Lookups answered by a cache, by cache.");
    r.cache_hits.render(o, "skiff_cache_hits_total", ["cache"]);
    family(o, "skiff_cache_misses_total", "counter", "Lookups a cache could not answer, by cache.");
    r.cache_misses.render(o, "skiff_cache_misses_total", ["cache"]);

    family(o, "skiff_memory_pool_reserved_bytes", "gauge", "Bytes reserved in the query memory pool.");
    sample(o, "skiff_memory_pool_reserved_bytes", &[], g.memory_reserved as f64);
    family(o, "skiff_memory_pool_limit_bytes", "gauge", "Size of the query memory pool (--memory-limit).");
    sample(o, "skiff_memory_pool_limit_bytes", &[], g.memory_limit as f64);

    for s in ["query", "refresh"] {
        r.catalog_errors.add([s.to_string()], 0);
    }
    family(
        o,
        "skiff_catalog_errors_total",
        "counter",
        "Catalog failures: queries failed by an unavailable catalog, and failed table-list refreshes.",
    );
    r.catalog_errors.render(o, "skiff_catalog_errors_total", ["source"]);
    family(
        o,
        "skiff_object_store_errors_total",
        "counter",
        "Queries failed because the object store could not be read.",
    );
    r.object_store_errors.render(o, "skiff_object_store_errors_total", []);
    family(
        o,
        "skiff_data_errors_total",
        "counter",
        "Queries failed on an unreadable (corrupt, truncated) data or metadata file.",
    );
    r.data_errors.render(o, "skiff_data_errors_total", []);
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    push_value(out, value);
    out.push('\n');
}

fn push_value(out: &mut String, v: f64) {
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A counter family with `N` labels.
struct Counter<const N: usize> {
    values: Mutex<BTreeMap<[String; N], u64>>,
}

impl<const N: usize> Default for Counter<N> {
    fn default() -> Self {
        Self { values: Mutex::new(BTreeMap::new()) }
    }
}

impl<const N: usize> Counter<N> {
    fn add(&self, labels: [String; N], n: u64) {
        *self.values.lock().expect("metrics lock").entry(labels).or_default() += n;
    }

    fn render(&self, out: &mut String, name: &str, keys: [&str; N]) {
        let values = self.values.lock().expect("metrics lock");
        if N == 0 && values.is_empty() {
            sample(out, name, &[], 0.0);
        }
        for (labels, v) in values.iter() {
            let pairs: Vec<(&str, &str)> =
                keys.iter().copied().zip(labels.iter().map(String::as_str)).collect();
            sample(out, name, &pairs, *v as f64);
        }
    }
}

/// A histogram family with `N` labels and fixed buckets.
struct Histogram<const N: usize> {
    bounds: &'static [f64],
    series: Mutex<BTreeMap<[String; N], Series>>,
}

#[derive(Default)]
struct Series {
    /// Per-bucket (not cumulative) counts; the last is the +Inf overflow.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl<const N: usize> Histogram<N> {
    fn new(bounds: &'static [f64]) -> Self {
        Self { bounds, series: Mutex::new(BTreeMap::new()) }
    }

    fn observe(&self, labels: [String; N], v: f64) {
        let mut series = self.series.lock().expect("metrics lock");
        let s = series
            .entry(labels)
            .or_insert_with(|| Series { buckets: vec![0; self.bounds.len() + 1], ..Default::default() });
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        s.buckets[i] += 1;
        s.sum += v;
        s.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, keys: [&str; N]) {
        let series = self.series.lock().expect("metrics lock");
        let bucket = format!("{name}_bucket");
        for (labels, s) in series.iter() {
            let mut pairs: Vec<(&str, String)> = keys.iter().copied().zip(labels.iter().cloned()).collect();
            let mut cumulative = 0;
            for (i, n) in s.buckets.iter().enumerate() {
                cumulative += n;
                let le = match self.bounds.get(i) {
                    Some(b) => {
                        let mut t = String::new();
                        push_value(&mut t, *b);
                        if !t.contains('.') {
                            t.push_str(".0");
                        }
                        t
                    }
                    None => "+Inf".to_string(),
                };
                pairs.push(("le", le));
                let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
                sample(out, &bucket, &refs, cumulative as f64);
                pairs.pop();
            }
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            sample(out, &format!("{name}_sum"), &refs, s.sum);
            sample(out, &format!("{name}_count"), &refs, s.count as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut s = String::new();
        sample(&mut s, "x", &[("a", "q\"b\\c\nd")], 1.0);
        assert_eq!(s, "x{a=\"q\\\"b\\\\c\\nd\"} 1\n");
    }

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let h = Histogram::<1>::new(&[0.1, 1.0]);
        for v in [0.0625, 0.5, 0.5, 7.0] {
            h.observe(["r".into()], v);
        }
        let mut s = String::new();
        h.render(&mut s, "d", ["route"]);
        assert_eq!(
            s,
            "d_bucket{route=\"r\",le=\"0.1\"} 1\nd_bucket{route=\"r\",le=\"1.0\"} 3\n\
             d_bucket{route=\"r\",le=\"+Inf\"} 4\nd_sum{route=\"r\"} 8.0625\nd_count{route=\"r\"} 4\n"
        );
    }
}
