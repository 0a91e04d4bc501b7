//! `GET /metrics` (Prometheus text format, parsed strictly here) and `system.queries`,
//! against the real binary: queries of every outcome move exactly the counters they should.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use serde_json::{Value, json};

const BASIN: &str = "/api/v1/accounts/acct-7f3a9c/basin-sql/query/bucket-x";
const BASIN_PATTERN: &str = "/api/v1/accounts/{account}/basin-sql/query/{bucket}";

fn serve(flags: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempdir();
    demo_lake(dir.path(), 3_000);
    let args = [lake_args(dir.path()), flags.iter().map(|s| s.to_string()).collect()].concat();
    let s = Server::start(Opts { args, ..Default::default() });
    (dir, s)
}

/// A parsed exposition: (name, labels) → value.
type Samples = BTreeMap<(String, BTreeMap<String, String>), f64>;

/// Parses Prometheus' text format strictly: every family has exactly one `# HELP` and one
/// `# TYPE` before its samples, every sample line is `name{labels} value` with a family
/// declared for it, label values are quoted and escaped, and no sample repeats.
fn parse(text: &str) -> (Samples, BTreeMap<String, String>) {
    let mut types = BTreeMap::new();
    let mut helps = BTreeSet::new();
    let mut samples = Samples::new();
    for line in text.lines() {
        assert!(!line.trim().is_empty(), "blank line in the exposition");
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP has a name and text");
            assert!(!help.trim().is_empty(), "{line}");
            assert!(helps.insert(name.to_string()), "a second HELP for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE has a name and kind");
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line}");
            assert!(helps.contains(name), "TYPE before HELP for {name}");
            assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "a second TYPE for {name}");
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment: {line}");
        let (name, labels, value) = parse_sample(line);
        let family = family_of(&name, &types).unwrap_or_else(|| panic!("sample without a family: {line}"));
        let kind = &types[&family];
        if name != family {
            assert_eq!(kind, "histogram", "{line}");
        }
        if name.ends_with("_total") {
            assert_eq!(kind, "counter", "{line}");
        }
        assert!(value.is_finite() || name.ends_with("_bucket"), "{line}");
        assert!(samples.insert((name, labels), value).is_none(), "repeated sample: {line}");
    }
    assert_eq!(helps.len(), types.len(), "every HELP has a TYPE");
    (samples, types)
}

fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|f| types.get(*f).is_some_and(|k| k == "histogram"))
        .map(String::from)
}

fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value: {line}"));
    let name = &line[..name_end];
    assert!(
        !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !name.starts_with(|c: char| c.is_ascii_digit()),
        "bad metric name: {line}"
    );
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let end: usize;
        loop {
            let (i, c) = chars.next().unwrap_or_else(|| panic!("unclosed labels: {line}"));
            if c == '}' {
                end = i;
                break;
            }
            // key
            let mut key = String::from(c);
            loop {
                let (_, c) = chars.next().expect("label key");
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "bad label {key:?}: {line}");
            assert_eq!(chars.next().map(|x| x.1), Some('"'), "label value quoted: {line}");
            let mut value = String::new();
            loop {
                let (_, c) = chars.next().unwrap_or_else(|| panic!("unterminated value: {line}"));
                match c {
                    '"' => break,
                    '\\' => match chars.next().map(|x| x.1) {
                        Some('\\') => value.push('\\'),
                        Some('"') => value.push('"'),
                        Some('n') => value.push('\n'),
                        other => panic!("bad escape {other:?}: {line}"),
                    },
                    c => value.push(c),
                }
            }
            assert!(labels.insert(key, value).is_none(), "repeated label: {line}");
            match chars.peek().map(|x| x.1) {
                Some(',') => {
                    chars.next();
                }
                Some('}') => {}
                other => panic!("expected , or }} after a label, got {other:?}: {line}"),
            }
        }
        rest = &r[end + 1..];
    }
    let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("one space before the value: {line}"));
    assert!(!value.contains(' '), "no timestamp expected: {line}");
    let v = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
    };
    (name.to_string(), labels, v)
}

/// Every histogram series: cumulative buckets, a `+Inf` bucket equal to `_count`, a `_sum`.
fn check_histograms(samples: &Samples, types: &BTreeMap<String, String>) {
    for (family, _) in types.iter().filter(|(_, k)| *k == "histogram") {
        let bucket = format!("{family}_bucket");
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for ((name, labels), v) in samples {
            if *name == bucket {
                let mut l = labels.clone();
                let le = l.remove("le").expect("bucket has le");
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().expect("le is a number") };
                series.entry(l).or_default().push((le, *v));
            }
        }
        for (labels, mut buckets) in series {
            buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
            assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{family} {labels:?}: not cumulative");
            let last = buckets.last().unwrap();
            assert!(last.0.is_infinite(), "{family} {labels:?}: no +Inf bucket");
            let count = samples[&(format!("{family}_count"), labels.clone())];
            assert_eq!(last.1, count, "{family} {labels:?}: +Inf bucket != _count");
            let sum = samples[&(format!("{family}_sum"), labels.clone())];
            assert!(sum >= 0.0, "{family} {labels:?}");
        }
    }
}

fn scrape(s: &Server) -> (String, Samples) {
    let r = client().get(format!("{}/metrics", s.base)).bearer_auth(TOKEN).send().unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let text = r.text().unwrap();
    let (samples, types) = parse(&text);
    check_histograms(&samples, &types);
    (text, samples)
}

fn get(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    let l: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    samples.get(&(name.to_string(), l)).copied().unwrap_or(0.0)
}

fn delta(a: &Samples, b: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    get(b, name, labels) - get(a, name, labels)
}

fn post_as(s: &Server, path: &str, id: &str, sql: &str) -> reqwest::blocking::Response {
    client()
        .post(format!("{}{path}", s.base))
        .bearer_auth(TOKEN)
        .header("x-request-id", id)
        .body(json!({ "query": sql }).to_string())
        .send()
        .unwrap()
}

/// `post_as`, reading the whole answer as a client does: a query is finished (and counted as
/// `ok`) once its last byte is sent, and a client that hangs up before that cancels it.
fn answered(s: &Server, path: &str, id: &str, sql: &str) -> u16 {
    let r = post_as(s, path, id, sql);
    let status = r.status().as_u16();
    r.bytes().unwrap();
    status
}

#[test]
fn metrics_count_requests_queries_scans_and_errors() {
    let (_d, s) = serve(&["--memory-limit", "64MiB"]);
    let (_, m0) = scrape(&s);
    let sql = "SELECT max(event) AS m FROM glass.events";

    assert_eq!(answered(&s, "/query", "m-ok", sql), 200);
    let v: Value = s.post(BASIN, json!({ "query": sql }).to_string()).json().unwrap();
    assert_eq!(v["success"], true, "{v}");
    let files = v["result"]["metrics"]["files_scanned"].as_f64().unwrap();
    let bytes = v["result"]["metrics"]["bytes_scanned"].as_f64().unwrap();
    let requests = v["result"]["metrics"]["r2_requests_count"].as_f64().unwrap();
    assert!(files > 0.0 && bytes > 0.0, "{v}");
    s.error("SELEC 1", 400);
    s.error("SELECT * FROM glass.nope", 404);
    let r =
        client().post(format!("{}/query", s.base)).body(json!({"query": sql}).to_string()).send().unwrap();
    assert_eq!(r.status(), 401);
    let r = client().post(format!("{}/no/such/route", s.base)).bearer_auth(TOKEN).send().unwrap();
    assert_eq!(r.status(), 404);

    let (text, m1) = scrape(&s);
    let d = |name: &str, labels: &[(&str, &str)]| delta(&m0, &m1, name, labels);
    let req = "skiff_http_requests_total";
    assert_eq!(d(req, &[("route", "/query"), ("status", "200")]), 1.0);
    assert_eq!(d(req, &[("route", "/query"), ("status", "400")]), 1.0);
    assert_eq!(d(req, &[("route", "/query"), ("status", "404")]), 1.0);
    assert_eq!(d(req, &[("route", "/query"), ("status", "401")]), 1.0);
    assert_eq!(d(req, &[("route", BASIN_PATTERN), ("status", "200")]), 1.0);
    assert_eq!(d(req, &[("route", "unmatched"), ("status", "404")]), 1.0);
    // The scrape before is counted once it was answered.
    assert_eq!(d(req, &[("route", "/metrics"), ("status", "200")]), 1.0);
    // Routes are labelled by pattern: no account id, no made-up path.
    assert!(!text.contains("acct-7f3a9c") && !text.contains("no/such"), "{text}");

    let count = "skiff_query_duration_seconds_count";
    assert_eq!(d(count, &[("route", "/query"), ("outcome", "ok")]), 1.0);
    assert_eq!(d(count, &[("route", "/query"), ("outcome", "sql_syntax_error")]), 1.0);
    assert_eq!(d(count, &[("route", "/query"), ("outcome", "table_not_found")]), 1.0);
    assert_eq!(d(count, &[("route", "basin"), ("outcome", "ok")]), 1.0);
    let sum = d("skiff_query_duration_seconds_sum", &[("route", "/query"), ("outcome", "ok")]);
    assert!(sum > 0.0 && sum < 60.0, "{sum}");
    let inf =
        d("skiff_query_duration_seconds_bucket", &[("route", "/query"), ("outcome", "ok"), ("le", "+Inf")]);
    assert_eq!(inf, 1.0);

    // Four queries reached admission (the unauthorized one never did); none waited long.
    let wait = "skiff_query_queue_wait_seconds";
    assert_eq!(d(&format!("{wait}_count"), &[("outcome", "admitted")]), 4.0);
    assert_eq!(d(&format!("{wait}_bucket"), &[("outcome", "admitted"), ("le", "1.0")]), 4.0);
    assert_eq!(get(&m1, "skiff_queries_running", &[]), 0.0);
    assert_eq!(get(&m1, "skiff_queries_queued", &[]), 0.0);

    // What both queries read, as each reported it (the Basin envelope, `system.queries`).
    let q = &queries_by_id(&s, "m-reader")["m-ok"];
    let (q_files, q_bytes) = (q["files_scanned"].as_f64().unwrap(), q["bytes_scanned"].as_f64().unwrap());
    assert!(q_files > 0.0, "{q}");
    assert_eq!(d("skiff_scan_files_total", &[]), q_files + files);
    assert_eq!(d("skiff_scan_bytes_total", &[]), q_bytes + bytes);
    assert!(d("skiff_scan_requests_total", &[]) > requests);

    // Two lookups of a listed table, one of a table the listing lacks (then re-listed).
    assert_eq!(d("skiff_cache_hits_total", &[("cache", "table_list")]), 2.0);
    assert_eq!(d("skiff_cache_misses_total", &[("cache", "table_list")]), 1.0);

    assert_eq!(get(&m1, "skiff_memory_pool_limit_bytes", &[]), (64u64 << 20) as f64);
    assert_eq!(get(&m1, "skiff_memory_pool_reserved_bytes", &[]), 0.0, "nothing runs");
    assert_eq!(get(&m1, "skiff_build_info", &[("version", env!("CARGO_PKG_VERSION"))]), 1.0);
    assert_eq!(get(&m1, "skiff_draining", &[]), 0.0);
    assert_eq!(d("skiff_catalog_errors_total", &[("source", "query")]), 0.0);
    assert_eq!(d("skiff_object_store_errors_total", &[]), 0.0);
    assert!(!text.contains(TOKEN));

    // A data file gone from storage: the query fails naming it, and the error is counted.
    let dir = _d.path().join("warehouse");
    // One of glass.events' own data files, which the query below must read (a max() may skip
    // files whose bounds cannot beat the maximum so far; a distinct count reads every file).
    let victim = walk(&dir)
        .into_iter()
        .find(|p| {
            p.extension().is_some_and(|e| e == "parquet") && p.to_string_lossy().contains("/glass/events/")
        })
        .unwrap();
    std::fs::remove_file(&victim).unwrap();
    let (status, v) = s.query("SELECT count(DISTINCT device_id) FROM glass.events");
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "unavailable");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains(victim.file_name().unwrap().to_str().unwrap()), "{message}");
    let (_, m2) = scrape(&s);
    assert_eq!(delta(&m1, &m2, "skiff_object_store_errors_total", &[]), 1.0);
    assert_eq!(delta(&m1, &m2, "skiff_catalog_errors_total", &[("source", "query")]), 0.0);
    assert_eq!(delta(&m1, &m2, "skiff_data_errors_total", &[]), 0.0);
    let code = v["error"]["code"].as_str().unwrap();
    assert_eq!(
        delta(&m1, &m2, "skiff_query_duration_seconds_count", &[("route", "/query"), ("outcome", code)]),
        1.0
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn metrics_need_the_token_unless_public() {
    let (_d, s) = serve(&[]);
    let r = client().get(format!("{}/metrics", s.base)).send().unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = client().get(format!("{}/metrics", s.base)).bearer_auth("wrong").send().unwrap();
    assert_eq!(r.status(), 401);
    let (text, _) = scrape(&s);
    assert!(!text.contains(TOKEN));
    // `GET /` lists it.
    let v: Value = client().get(format!("{}/", s.base)).bearer_auth(TOKEN).send().unwrap().json().unwrap();
    assert!(v["endpoints"].as_array().unwrap().contains(&json!("GET /metrics")), "{v}");

    let (_d2, p) = serve(&["--metrics-public"]);
    let r = client().get(format!("{}/metrics", p.base)).send().unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().unwrap();
    parse(&text);
    assert!(!text.contains(TOKEN));
    // Only the metrics are public.
    let r = client().post(format!("{}/query", p.base)).body(r#"{"query":"SELECT 1"}"#).send().unwrap();
    assert_eq!(r.status(), 401);
    // The environment variable works too.
    let dir = tempdir();
    demo_lake(dir.path(), 100);
    let e = Server::start(Opts {
        args: lake_args(dir.path()),
        env: vec![("SKIFF_METRICS_PUBLIC", "true".into())],
        ..Default::default()
    });
    assert_eq!(client().get(format!("{}/metrics", e.base)).send().unwrap().status(), 200);
}

/// `system.queries` rows by request id.
fn queries_by_id(s: &Server, reader: &str) -> BTreeMap<String, Value> {
    let r = post_as(s, "/query", reader, "SELECT * FROM system.queries");
    assert_eq!(r.status(), 200);
    let rows: Vec<Value> = r.json().unwrap();
    rows.into_iter().map(|r| (r["request_id"].as_str().unwrap().to_string(), r)).collect()
}

#[test]
fn system_queries_lists_finished_and_running_queries() {
    let (_d, s) = serve(&[]);
    assert_eq!(answered(&s, "/query", "q-ok", "SELECT count(*) AS n FROM glass.events"), 200);
    assert_eq!(answered(&s, "/query", "q-syntax", "SELEC 1"), 400);
    assert_eq!(answered(&s, BASIN, "q-basin", "SELECT * FROM glass.nope"), 400);
    // A big result whose client does not read: its query stays running.
    let held = post_as(&s, "/query", "q-held", "SELECT value FROM generate_series(1, 3000000)");
    assert_eq!(held.status(), 200);

    let rows = queries_by_id(&s, "q-reader");
    let ok = &rows["q-ok"];
    assert_eq!(ok["route"], "/query");
    assert_eq!(ok["state"], "ok");
    assert_eq!(ok["rows"], 1);
    assert!(ok["bytes_sent"].as_u64().unwrap() > 0, "{ok}");
    assert_eq!(ok["error"], Value::Null);
    assert_eq!(ok["sql"], Value::Null, "no SQL without --log-sql");
    assert!(ok["started_at"].as_str().unwrap().ends_with('Z'), "{ok}");
    assert!(ok["duration_ms"].as_u64().is_some(), "{ok}");
    let bad = &rows["q-syntax"];
    assert_eq!(bad["state"], "sql_syntax_error");
    assert_eq!(bad["error"], Value::Null, "no error text without --log-sql: {bad}");
    assert_eq!(bad["rows"], 0);
    let basin = &rows["q-basin"];
    assert_eq!((basin["route"].as_str(), basin["state"].as_str()), (Some("basin"), Some("table_not_found")));
    let held_row = &rows["q-held"];
    assert_eq!(held_row["state"], "running", "{held_row}");
    assert_eq!(held_row["rows"], Value::Null, "{held_row}");
    // The reading query sees itself running.
    assert_eq!(rows["q-reader"]["state"], "running");

    // The held client goes away: its query is cancelled, and listed so.
    drop(held);
    eventually(10, || (queries_by_id(&s, "q-reader-2")["q-held"]["state"] == "cancelled").then_some(()));
    let rows = queries_by_id(&s, "q-reader-3");
    assert_eq!(rows["q-reader"]["state"], "ok");
    assert_eq!(rows["q-reader-2"]["state"], "ok");

    // Filters, projections and aggregates work on it like on any table.
    let n = s.rows("SELECT count(*) AS n FROM system.queries WHERE state = 'sql_syntax_error'");
    assert_eq!(n[0]["n"], 1);
    // It is listed, once, as skiff's view, next to the lake's tables.
    let t = s.rows(
        "SELECT table_schema, table_type FROM information_schema.tables \
         WHERE table_catalog = 'lake' AND table_name = 'queries'",
    );
    assert_eq!(t, vec![json!({"table_schema": "system", "table_type": "VIEW"})]);
    let shown = s.rows("SHOW TABLES");
    assert!(shown.iter().any(|r| r["table_schema"] == "glass" && r["table_name"] == "events"));
    let cols: Vec<String> = s
        .rows("DESCRIBE system.queries")
        .iter()
        .map(|r| r["column_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        cols,
        [
            "request_id",
            "route",
            "state",
            "started_at",
            "duration_ms",
            "rows",
            "bytes_sent",
            "truncated",
            "files_scanned",
            "bytes_scanned",
            "error",
            "sql"
        ]
    );
}

#[test]
fn system_queries_shows_sql_only_with_log_sql_and_keeps_a_bounded_history() {
    let dir = tempdir();
    demo_lake(dir.path(), 100);
    let s = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--log-sql".into()]].concat(),
        env: vec![("SKIFF_QUERY_HISTORY", "3".into())],
        ..Default::default()
    });
    for i in 0..4 {
        assert_eq!(answered(&s, "/query", &format!("h-{i}"), &format!("SELECT {i} AS i")), 200);
    }
    assert_eq!(answered(&s, "/query", "h-4", "SELEC 4"), 400);
    let rows = queries_by_id(&s, "reader");
    let finished: Vec<&String> = rows.keys().filter(|k| k.starts_with("h-")).collect();
    assert_eq!(finished, ["h-2", "h-3", "h-4"], "the last 3 finished, in order");
    assert_eq!(rows["h-3"]["sql"], "SELECT 3 AS i");
    assert_eq!(rows["h-4"]["sql"], "SELEC 4");
    // With --log-sql, the error's text too.
    assert!(rows["h-4"]["error"].as_str().unwrap().contains("syntax"), "{}", rows["h-4"]);
    assert_eq!(rows["reader"]["sql"], "SELECT * FROM system.queries");
    // And the log line has it too.
    let log = s.log_text();
    assert!(log.contains("SELECT 3 AS i"), "{log}");
}

#[test]
fn a_lake_namespace_named_system_keeps_its_other_tables() {
    let dir = tempdir();
    demo_lake(dir.path(), 100);
    let lake = dir.path().to_str().unwrap();
    for table in ["system.audit", "system.queries"] {
        fixture("write_local.py", &["create-table", "--lake", lake, "--table", table, "--rows", "4"]);
    }
    let s = Server::lake(dir.path());
    assert_eq!(s.rows("SELECT count(*) AS n FROM system.audit")[0]["n"], 4);
    // `system.queries` is skiff's, and the log says the lake's table is shadowed.
    let rows = s.rows("SELECT request_id, state FROM system.queries");
    assert!(rows.iter().any(|r| r["state"] == "running"), "{rows:?}");
    let log = s.log_text();
    assert!(log.contains("system.queries") && log.contains("reserves"), "{log}");
    let listed = s.rows(
        "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'system' ORDER BY 1",
    );
    assert_eq!(
        listed,
        vec![
            json!({"table_name": "audit", "table_type": "BASE TABLE"}),
            json!({"table_name": "queries", "table_type": "VIEW"}),
        ]
    );
    let schemas =
        s.rows("SELECT count(*) AS n FROM information_schema.schemata WHERE schema_name = 'system'");
    assert_eq!(schemas[0]["n"], 1);
}

#[test]
fn catalog_failures_are_counted() {
    let (d, s) = serve(&["--refresh-interval", "1s"]);
    let (_, m0) = scrape(&s);
    // The catalog database emptied under skiff: loading a table, and listing, fail.
    std::fs::File::create(d.path().join("catalog.db")).unwrap();
    let (status, v) = s.query("SELECT max(event) AS m FROM glass.events");
    assert_eq!(status, 503, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("catalog is unavailable"), "{v}");
    let m1 = eventually(10, || {
        let (_, m) = scrape(&s);
        (delta(&m0, &m, "skiff_catalog_errors_total", &[("source", "refresh")]) >= 1.0).then_some(m)
    });
    assert_eq!(delta(&m0, &m1, "skiff_catalog_errors_total", &[("source", "query")]), 1.0);
    assert_eq!(delta(&m0, &m1, "skiff_object_store_errors_total", &[]), 0.0);
    assert_eq!(
        delta(
            &m0,
            &m1,
            "skiff_query_duration_seconds_count",
            &[("route", "/query"), ("outcome", "unavailable")]
        ),
        1.0
    );
}

#[test]
fn gauges_show_running_and_queued_queries_and_pool_memory() {
    let (_d, s) =
        serve(&["--max-concurrent-queries", "1", "--queue-timeout", "20s", "--memory-limit", "1GiB"]);
    // A sorted result whose client does not read: it holds the only slot and its sort's memory.
    let held =
        post_as(&s, "/query", "g-held", "SELECT value FROM generate_series(1, 3000000) ORDER BY value DESC");
    assert_eq!(held.status(), 200);
    let base = s.base.clone();
    let waiting = std::thread::spawn(move || {
        client()
            .post(format!("{base}/query"))
            .bearer_auth(TOKEN)
            .body(r#"{"query": "SELECT 1 AS one"}"#)
            .send()
            .unwrap()
            .status()
            .as_u16()
    });
    let m = eventually(10, || {
        let (_, m) = scrape(&s);
        (get(&m, "skiff_queries_queued", &[]) == 1.0).then_some(m)
    });
    assert_eq!(get(&m, "skiff_queries_running", &[]), 1.0);
    let reserved = get(&m, "skiff_memory_pool_reserved_bytes", &[]);
    assert!(reserved > 0.0 && reserved <= (1u64 << 30) as f64, "{reserved}");
    // The client goes away: the slot frees, the waiting query runs, the pool empties.
    drop(held);
    assert_eq!(waiting.join().unwrap(), 200);
    // The slot frees when the client goes; the held query's task, on the query runtime, frees
    // its sort's memory a moment later, when it sees that (a test run once scraped in between).
    let m = eventually(5, || {
        let (_, m) = scrape(&s);
        (get(&m, "skiff_memory_pool_reserved_bytes", &[]) == 0.0).then_some(m)
    });
    assert_eq!(get(&m, "skiff_queries_running", &[]), 0.0);
    assert_eq!(get(&m, "skiff_queries_queued", &[]), 0.0);
    let waited = get(&m, "skiff_query_queue_wait_seconds_sum", &[("outcome", "admitted")]);
    assert!(waited > 0.0, "the second query's wait was measured: {waited}");
}
