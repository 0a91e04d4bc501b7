//! Dependency faults: the object store and the catalog fail, slow down or send broken bodies,
//! and lake files are corrupt or missing. Every query must fail fast with a status and a
//! message naming the dependency and the file or table, never leak a secret, never take the
//! server down, and succeed again once the fault is gone, with no restart.
//!
//! The object store is moto's S3 server (`tests/fixtures/s3_server.py`) behind the
//! fault-injecting proxy `tests/fixtures/s3_proxy.py`; the catalog is SQLite (so it is not
//! behind the proxy) or the REST catalog fixture behind its own proxy.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const S3_SECRET: &str = "s3-secret-never-shown-8c1d";
const CATALOG_TOKEN: &str = "cf-api-token-faults-55e1";
/// Reads every data file of the table (count(*) alone would read none).
const SQL: &str = "SELECT count(DISTINCT device_id) AS n FROM glass.events";

/// The fault proxy in front of an HTTP service, and its control endpoint.
struct Proxy {
    server: FixtureServer,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        Proxy { server: FixtureServer::start("s3_proxy.py", &["--upstream", upstream, "--quiet"]) }
    }

    fn url(&self) -> String {
        self.server.url()
    }

    fn control(&self, body: Value) -> Value {
        let r = client().post(format!("{}/__control", self.url())).body(body.to_string()).send().unwrap();
        assert_eq!(r.status(), 200);
        r.json().unwrap()
    }

    fn fault(&self, rule: Value) {
        self.control(json!({ "faults": [rule] }));
    }

    fn clear(&self) {
        self.control(json!({ "clear": true }));
    }

    /// How many requests each rule has matched, in order.
    fn hits(&self) -> Vec<u64> {
        let v: Value = client().get(format!("{}/__control", self.url())).send().unwrap().json().unwrap();
        v["by_rule"].as_array().unwrap().iter().map(|h| h.as_u64().unwrap()).collect()
    }

    /// Adds a rule that changes nothing, to count the GETs whose path matches `regex`.
    fn count_reads(&self, regex: &str) {
        self.fault(
            json!({"action": "delay", "delay_ms": 0, "match": format!("regex:{regex}"), "method": "GET"}),
        );
    }

    fn faults_injected(&self) -> u64 {
        let v: Value = client().get(format!("{}/__control", self.url())).send().unwrap().json().unwrap();
        v["faults"].as_u64().unwrap()
    }
}

/// A lake on S3 written through the REST catalog fixture (straight to moto), read by skiff
/// from the catalog's SQLite file with static credentials through the proxy.
struct S3Lake {
    dir: tempfile::TempDir,
    s3: FixtureServer,
    catalog: FixtureServer,
}

fn s3_lake() -> S3Lake {
    s3_lake_with(&[])
}

/// The same, with `extra` arguments for the REST catalog fixture.
fn s3_lake_with(extra: &[&str]) -> S3Lake {
    let dir = tempdir();
    let s3 = FixtureServer::start("s3_server.py", &["--bucket", "lakebucket", "--quiet"]);
    let db = dir.path().join("rest.db").display().to_string();
    let s3_url = s3.url();
    let mut args = vec![
        "--db",
        &db,
        "--warehouse",
        "s3://lakebucket/wh",
        "--token",
        CATALOG_TOKEN,
        "--s3-endpoint",
        &s3_url,
    ];
    args.extend(extra);
    let catalog = FixtureServer::start("rest_catalog.py", &args);
    fixture(
        "write_rest_lake.py",
        &["init", "--uri", &catalog.url(), "--token", CATALOG_TOKEN, "--events", "2000"],
    );
    S3Lake { dir, s3, catalog }
}

/// One more PyIceberg commit to glass.events, of `rows` rows.
fn commit(lake: &S3Lake, rows: u32, seed: u32) {
    let (rows, seed) = (rows.to_string(), seed.to_string());
    fixture(
        "write_rest_lake.py",
        &["append", "--uri", &lake.catalog.url(), "--token", CATALOG_TOKEN, "--rows", &rows, "--seed", &seed],
    );
}

/// glass.events' row count (from metadata: no data file is read).
fn count_events(s: &Server) -> u64 {
    s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"].as_u64().unwrap()
}

fn serve_sql_on_s3(lake: &S3Lake, endpoint: &str, extra: &[&str]) -> Server {
    let db = lake.dir.path().join("rest.db");
    let mut args: Vec<String> = [
        "--catalog-uri",
        &format!("sqlite://{}", db.display()),
        "--warehouse",
        "s3://lakebucket/wh",
        "--s3-endpoint",
        endpoint,
        "--s3-region",
        "us-east-1",
        "--s3-access-key-id",
        "testing",
        "--s3-path-style",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    // The secret goes in through the environment, as deployments set it.
    Server::start(Opts {
        args,
        env: vec![("SKIFF_S3_SECRET_ACCESS_KEY", S3_SECRET.to_string())],
        ..Default::default()
    })
}

/// Asserts what every failed query must show: the error envelope, no secret, the status.
fn failed(s: &Server, sql: &str, bound: Duration) -> (u16, String, String) {
    let t = Instant::now();
    let (status, v) = s.query(sql);
    let took = t.elapsed();
    assert!(took < bound, "{sql}: took {took:?} (bound {bound:?}): {v}");
    assert_ne!(status, 200, "{sql}: {v}");
    let text = v.to_string();
    for secret in [S3_SECRET, TOKEN, CATALOG_TOKEN] {
        assert!(!text.contains(secret), "a secret in the response: {text}");
    }
    (
        status,
        v["error"]["code"].as_str().expect("error code").to_string(),
        v["error"]["message"].as_str().expect("error message").to_string(),
    )
}

fn assert_clean_log(s: &Server) {
    let log = s.log_text();
    for secret in [S3_SECRET, TOKEN, CATALOG_TOKEN] {
        assert!(!log.contains(secret), "a secret in skiff's log");
    }
    assert!(!log.contains("panicked"), "skiff panicked:\n{log}");
}

#[test]
fn object_store_faults_fail_fast_name_the_file_and_clear_without_restart() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    let s = serve_sql_on_s3(&lake, &proxy.url(), &["--query-timeout", "25s"]);
    let expected = s.rows(SQL)[0]["n"].clone();

    // (fault, expected status, expected code, what the message names). Retried faults take
    // opendal's three retries (1 s + 2 s + 4 s of backoff) before they fail.
    let data = "s3://lakebucket/wh/glass/events/data/";
    let meta = "glass/events/metadata/";
    let cases = [
        (json!({"action": "status", "status": 401, "match": "data"}), 503, "unavailable", data),
        (json!({"action": "status", "status": 403, "match": "data"}), 503, "unavailable", data),
        (json!({"action": "status", "status": 404, "match": "data"}), 503, "unavailable", data),
        (json!({"action": "status", "status": 429, "match": "data"}), 503, "unavailable", data),
        (json!({"action": "status", "status": 500, "match": "data"}), 503, "unavailable", data),
        (json!({"action": "status", "status": 503, "match": "data"}), 503, "unavailable", data),
        (json!({"action": "reset", "match": "data"}), 503, "unavailable", data),
        // Every answer ends right after its headers (a body cut later is resumed: see below).
        (json!({"action": "truncate", "match": "data", "keep_bytes": 0}), 503, "unavailable", data),
        (json!({"action": "corrupt", "match": "data"}), 502, "data_error", data),
        (json!({"action": "status", "status": 403, "match": "metadata"}), 503, "unavailable", meta),
        (json!({"action": "status", "status": 503, "match": "metadata"}), 503, "unavailable", meta),
        (json!({"action": "reset", "match": "metadata"}), 503, "unavailable", meta),
        // The table's metadata.json is read first; iceberg's parse error names no file.
        (
            json!({"action": "corrupt", "match": "metadata"}),
            502,
            "data_error",
            "metadata file of glass.events",
        ),
    ];
    let mut report = Vec::new();
    for (rule, want_status, want_code, names) in cases {
        proxy.fault(rule.clone());
        // Metadata files are immutable per path, so the running server answers from the copies
        // it holds (checked here); a server that has not read them yet meets the fault.
        let fresh;
        let s = if rule["match"] == "metadata" {
            assert_eq!(s.rows(SQL)[0]["n"], expected, "{rule}: the metadata it holds still serves");
            fresh = serve_sql_on_s3(&lake, &proxy.url(), &["--query-timeout", "25s"]);
            &fresh
        } else {
            &s
        };
        let t = Instant::now();
        let (status, code, msg) = failed(s, SQL, Duration::from_secs(15));
        report.push(format!("{rule} -> {status} {code} in {:?}", t.elapsed()));
        assert_eq!((status, code.as_str()), (want_status, want_code), "{rule}: {msg}");
        assert!(
            msg.contains("object store") || want_code == "data_error",
            "{rule}: names the dependency: {msg}"
        );
        assert!(msg.contains(names), "{rule}: names the file: {msg}");
        // The fault cleared, the same query works again on the same server.
        proxy.clear();
        assert_eq!(s.rows(SQL)[0]["n"], expected, "after {rule}");
        assert_clean_log(s);
    }
    eprintln!("{}", report.join("\n"));
    assert_clean_log(&s);
}

#[test]
fn transient_object_store_faults_are_retried() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    let s = serve_sql_on_s3(&lake, &proxy.url(), &[]);
    let expected = s.rows(SQL)[0]["n"].clone();
    for rule in [
        json!({"action": "status", "status": 503, "match": "data", "times": 2}),
        json!({"action": "status", "status": 429, "match": "metadata", "times": 1}),
        json!({"action": "status", "status": 500, "times": 2}),
        json!({"action": "reset", "match": "data", "times": 2}),
        json!({"action": "truncate", "match": "data", "times": 1}),
    ] {
        proxy.clear();
        proxy.fault(rule.clone());
        assert_eq!(s.rows(SQL)[0]["n"], expected, "{rule} is retried");
        assert!(proxy.faults_injected() >= 1, "{rule} was injected");
    }
    // Not retried: a refusal is not transient, so it fails at once.
    proxy.fault(json!({"action": "status", "status": 403, "match": "data", "times": 1}));
    let (status, _, _) = failed(&s, SQL, Duration::from_secs(3));
    assert_eq!(status, 503);
    proxy.clear();
    assert_eq!(s.rows(SQL)[0]["n"], expected);
    assert_clean_log(&s);
}

/// Remote data files are cached in memory and on local disk: a repeated query reads no data
/// file from the store and answers the same, even while the store fails every data read. The
/// disk tier keeps its files in a folder of its own, gone when skiff stops.
#[test]
fn the_data_cache_spares_the_store_repeated_reads() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    let expected = serve_sql_on_s3(&lake, &proxy.url(), &[]).rows(SQL);
    let dir = tempdir();
    let dir_arg = dir.path().display().to_string();
    for (memory, disk, tier) in [("64MiB", "0", "data_memory"), ("0", "64MiB", "data_disk")] {
        // A rule that changes nothing, to count the data reads that reach the store.
        proxy.clear();
        proxy.fault(json!({"action": "delay", "delay_ms": 0, "match": "data"}));
        let cache = ["--data-cache-memory", memory, "--data-cache-disk", disk, "--data-cache-dir", &dir_arg];
        let mut s = serve_sql_on_s3(&lake, &proxy.url(), &cache);
        assert_eq!(s.rows(SQL), expected);
        let reads = proxy.hits()[0];
        assert!(reads > 0, "the first query reads data files");
        // The disk tier is written in the background, so allow it a moment.
        eventually(10, || (s.rows(SQL) == expected && proxy.hits()[0] == reads).then_some(()));

        proxy.control(json!({"faults": [{"action": "status", "status": 503, "match": "data"}]}));
        assert_eq!(s.rows(SQL), expected, "{tier}: served without the store");
        assert_eq!(proxy.hits(), [0], "{tier}: no data read reached the store");
        let r = client().get(format!("{}/metrics", s.base)).bearer_auth(TOKEN).send().unwrap();
        let hits = r.text().unwrap();
        let line = format!("skiff_cache_hits_total{{cache=\"{tier}\"}}");
        assert!(hits.lines().any(|l| l.starts_with(&line) && !l.ends_with(" 0")), "{line} in:\n{hits}");

        let own = dir.path().join(format!("skiff-{}", s.pid()));
        assert_eq!(own.exists(), disk != "0", "{}", own.display());
        s.terminate();
        assert!(!own.exists(), "the disk tier's folder goes when skiff stops");
        assert_clean_log(&s);
    }
}

/// Manifests are immutable per path: after a commit, the next query reads from the store
/// only the manifest list and the manifest the commit added, not every manifest again.
#[test]
fn after_a_commit_only_the_new_manifests_are_read() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    let s = serve_sql_on_s3(&lake, &proxy.url(), &[]);
    let before = count_events(&s);
    commit(&lake, 40, 5);
    proxy.count_reads("\\.avro$");
    assert_eq!(count_events(&s), before + 40);
    assert_eq!(proxy.hits(), [2], "the new snapshot's manifest list and its one new manifest");
    // A query that reads every data file (the new one too) reads no manifest again.
    s.rows(SQL);
    assert_eq!(proxy.hits(), [2], "nothing read twice");
}

/// A table's metadata file is immutable per path too: with a SQL catalog, a repeated query
/// reads only the table pointer from the catalog and no metadata file from the store, until a
/// commit moves the pointer; then it reads the new file once and sees the commit.
#[test]
fn a_repeated_query_reads_no_metadata_file_until_a_commit() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    let s = serve_sql_on_s3(&lake, &proxy.url(), &[]);
    let before = count_events(&s);
    proxy.count_reads("\\.metadata\\.json$");
    assert_eq!(count_events(&s), before);
    assert_eq!(proxy.hits(), [0], "the table's metadata file is not read again");
    commit(&lake, 25, 9);
    assert_eq!(count_events(&s), before + 25);
    assert_eq!(proxy.hits(), [1], "the new metadata file, once");
    assert_eq!(count_events(&s), before + 25);
    assert_eq!(proxy.hits(), [1], "and not again");
}

/// With `--warm-on-start`, the manifest lists, manifests and Parquet footers a table's first
/// query would read are read at start, in the background: once that is done, the first query
/// reads none of them.
#[test]
fn manifests_and_footers_read_at_start_spare_the_first_query() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    // Manifest lists and manifests.
    proxy.count_reads("\\.avro$");
    let s = serve_sql_on_s3(&lake, &proxy.url(), &["--warm-on-start", "false"]);
    let expected = s.rows(SQL);
    let cold = proxy.hits()[0];
    assert!(cold >= 2, "without reads at start, the first query reads a manifest list and manifests: {cold}");
    let cold_footers = cache_misses(&s, "parquet_footer");
    assert!(cold_footers >= 2.0, "without reads at start, the first query loads footers: {cold_footers}");
    drop(s);

    proxy.count_reads("\\.avro$");
    let s = serve_sql_on_s3(&lake, &proxy.url(), &["--warm-on-start", "true"]);
    let line = reads_at_start(&s);
    assert!(line.contains("failed=0"), "{line}");
    let at_start = proxy.hits()[0];
    assert!(at_start >= cold, "every table's manifests, glass.events' among them: {at_start} < {cold}");
    let footers = cache_misses(&s, "parquet_footer");
    assert!(
        footers >= cold_footers,
        "every table's footers, glass.events' among them: {footers} < {cold_footers}"
    );
    assert!(line.contains(&format!("footers={footers}")), "{line}");
    assert_eq!(s.rows(SQL), expected);
    assert_eq!(proxy.hits()[0], at_start, "the first query read no manifest list or manifest");
    assert_eq!(cache_misses(&s, "parquet_footer"), footers, "the first query loaded no footer");
}

/// A server's count of look-ups that `cache` could not answer, from `/metrics`.
fn cache_misses(s: &Server, cache: &str) -> f64 {
    s.metric(&format!("skiff_cache_misses_total{{cache=\"{cache}\"}}"))
}

/// The log line of a server's manifest and footer reads at start, once they are done.
fn reads_at_start(s: &Server) -> String {
    eventually(20, || {
        s.log_text().lines().find(|l| l.contains("manifests and footers read at start")).map(String::from)
    })
}

/// A burst of queries on a cold server shares each metadata read: four at once read every
/// manifest list and manifest from the store once, and load every Parquet footer once, as one
/// query alone does.
#[test]
fn concurrent_cold_queries_read_each_manifest_and_footer_once_and_build_snapshot_statistics_once() {
    let lake = s3_lake();
    let proxy = Proxy::start(&lake.s3.url());
    // Slow enough that the four queries' reads overlap; the first rule counts metadata reads.
    let slow = || {
        proxy.clear();
        proxy.control(json!({"faults": [
            {"action": "delay", "delay_ms": 300, "match": "regex:\\.avro$", "method": "GET"},
            {"action": "delay", "delay_ms": 100, "match": "data"},
        ]}));
    };
    slow();
    let s = serve_sql_on_s3(&lake, &proxy.url(), &[]);
    let expected = s.rows(SQL);
    let (metadata, files) = (proxy.hits()[0], cache_misses(&s, "parquet_footer"));
    let snapshots = cache_misses(&s, "snapshot_files");
    assert!(metadata >= 2, "a manifest list and its manifests: {metadata}");
    assert!(files >= 2.0, "the table's data files: {files}");
    assert!(snapshots >= 1.0, "the table's snapshot: {snapshots}");
    drop(s);

    slow();
    let s = serve_sql_on_s3(&lake, &proxy.url(), &[]);
    let answers: Vec<_> = std::thread::scope(|scope| {
        let queries: Vec<_> = (0..4).map(|_| scope.spawn(|| s.rows(SQL))).collect();
        queries.into_iter().map(|q| q.join().unwrap()).collect()
    });
    assert!(answers.iter().all(|a| *a == expected), "{answers:?}");
    assert_eq!(proxy.hits()[0], metadata, "four cold queries read each metadata file once");
    assert_eq!(cache_misses(&s, "parquet_footer"), files, "four cold queries load each footer once");
    assert_eq!(
        cache_misses(&s, "snapshot_files"),
        snapshots,
        "four cold queries build the snapshot's statistics once"
    );
}

#[test]
fn a_slow_or_gone_object_store_is_a_timeout_or_503_then_recovers() {
    let lake = s3_lake();
    let mut proxy = Proxy::start(&lake.s3.url());
    let s = serve_sql_on_s3(&lake, &proxy.url(), &["--query-timeout", "2s"]);
    let expected = s.rows(SQL)[0]["n"].clone();

    // Slower than the query timeout: 504 at the deadline, not when the store answers.
    proxy.control(json!({"delay_ms": 5000}));
    let (status, code, msg) = failed(&s, SQL, Duration::from_millis(4500));
    assert_eq!((status, code.as_str()), (504, "timeout"), "{msg}");
    proxy.control(json!({"delay_ms": 0}));
    assert_eq!(eventually(10, || s.query(SQL).1[0]["n"].as_u64()), expected.as_u64().unwrap());

    // Gone (connection refused): 503 naming the object store, then back on the same port.
    let port = proxy.server.port.to_string();
    proxy.server.stop();
    let (status, code, msg) = failed(&s, SQL, Duration::from_secs(4));
    assert!(status == 503 || status == 504, "{status} {code} {msg}");
    if status == 503 {
        assert!(msg.contains("object store"), "{msg}");
    }
    let up = lake.s3.url();
    proxy = Proxy {
        server: FixtureServer::start("s3_proxy.py", &["--upstream", &up, "--port", &port, "--quiet"]),
    };
    assert_eq!(eventually(20, || s.query(SQL).1[0]["n"].as_u64()), expected.as_u64().unwrap());
    drop(proxy);
    assert_clean_log(&s);
}

#[test]
fn rest_catalog_faults_are_503_naming_the_catalog() {
    // Without ETags every `loadTable` answer has a body for the faults to cut short (a 304
    // has none, and skiff rightly keeps the table it holds).
    let lake = s3_lake_with(&["--no-etag"]);
    let proxy = Proxy::start(&lake.catalog.url());
    let s = Server::start(Opts {
        args: vec!["--catalog-uri".into(), proxy.url(), "--query-timeout".into(), "20s".into()],
        env: vec![("CF_API_TOKEN", CATALOG_TOKEN.to_string())],
        ..Default::default()
    });
    let expected = s.rows(SQL)[0]["n"].clone();
    for rule in [
        json!({"action": "status", "status": 401}),
        json!({"action": "status", "status": 403}),
        json!({"action": "status", "status": 429}),
        json!({"action": "status", "status": 500}),
        json!({"action": "status", "status": 503}),
        json!({"action": "reset"}),
        json!({"action": "truncate"}),
    ] {
        proxy.fault(rule.clone());
        let (status, code, msg) = failed(&s, SQL, Duration::from_secs(15));
        assert_eq!((status, code.as_str()), (503, "unavailable"), "{rule}: {msg}");
        assert!(msg.contains("catalog") && msg.contains("glass.events"), "{rule}: {msg}");
        proxy.clear();
        assert_eq!(s.rows(SQL)[0]["n"], expected, "after {rule}");
    }
    assert_clean_log(&s);
}

/// Lake files broken on disk: each query names the file, other tables keep working, and
/// restoring the file restores the table, with no restart.
#[test]
fn corrupt_and_missing_local_files_are_named() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    let s = Server::lake(dir.path());
    let wh = dir.path().join("warehouse/glass");
    let files = |table: &str, sub: &str, ext: &str| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(wh.join(table).join(sub))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(ext))
            .collect();
        if v.is_empty() {
            // Partitioned tables keep data files one folder down.
            for d in std::fs::read_dir(wh.join(table).join(sub)).unwrap() {
                let d = d.unwrap().path();
                if d.is_dir() {
                    for f in std::fs::read_dir(d).unwrap() {
                        let f = f.unwrap().path();
                        if f.to_string_lossy().ends_with(ext) {
                            v.push(f);
                        }
                    }
                }
            }
        }
        v.sort();
        v
    };
    let q = |t: &str| format!("SELECT count(DISTINCT device_id) AS n FROM glass.{t}");
    let good: Vec<(String, Value)> = ["events_v1", "events_v2", "identities"]
        .iter()
        .map(|t| (t.to_string(), s.rows(&q(t))[0]["n"].clone()))
        .collect();
    let check_others = |broken: &str| {
        for (t, n) in &good {
            if t != broken {
                assert_eq!(&s.rows(&q(t))[0]["n"], n, "{t} works while {broken} is broken");
            }
        }
    };

    type Breaker = fn(&std::path::Path);
    let garbage: Breaker = |p| std::fs::write(p, vec![0x42u8; 4096]).unwrap();
    // Cut to its first bytes: skiff keeps footers it read, so a half file could still give the
    // columns that sit in its first half.
    let truncate: Breaker = |p| {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(16).unwrap();
    };
    let delete: Breaker = |p| std::fs::remove_file(p).unwrap();
    let garble_json: Breaker = |p| std::fs::write(p, b"{\"format-version\": 2, \"table-uuid\": ").unwrap();
    let cases: Vec<(&str, std::path::PathBuf, Breaker, &[u16])> = vec![
        ("events_v1", files("events", "data", ".parquet")[0].clone(), garbage, &[502]),
        ("events_v2", files("events_v2", "data", ".parquet")[0].clone(), truncate, &[502]),
        // Gone: the store says "not found", as S3's 404 is mapped (503: a retry may see a new snapshot).
        ("identities", files("identities", "data", ".parquet")[0].clone(), delete, &[503]),
        ("events_v2", files("events_v2", "metadata", ".avro")[0].clone(), garbage, &[502]),
        // The table's metadata.json: iceberg's parse error names no file, so skiff names the
        // table and says it is its metadata file.
        (
            "identities",
            files("identities", "metadata", ".metadata.json").last().unwrap().clone(),
            garble_json,
            &[502],
        ),
    ];
    for (table, path, breaker, statuses) in cases {
        let saved = std::fs::read(&path).unwrap();
        breaker(&path);
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // Metadata files and manifests are immutable per path, so a running skiff answers from
        // the copy it holds (checked here); a server that has not read the file yet meets the
        // damage.
        let fresh;
        let server = if name.ends_with(".avro") || name.ends_with(".metadata.json") {
            let want = &good.iter().find(|(t, _)| t == table).unwrap().1;
            assert_eq!(&s.rows(&q(table))[0]["n"], want, "{table}: the cached manifest still serves");
            fresh = Server::lake(dir.path());
            &fresh
        } else {
            &s
        };
        let (status, code, msg) = failed(server, &q(table), Duration::from_secs(10));
        eprintln!("{table} {name}: {status} {code} {msg}");
        assert!(statuses.contains(&status), "{table} {name}: {status} {code} {msg}");
        if name.ends_with(".metadata.json") {
            assert!(msg.contains("metadata file of glass.identities"), "{table}: {msg}");
        } else {
            assert!(msg.contains(&name), "{table}: the error names {name}: {msg}");
        }
        check_others(table);
        std::fs::write(&path, saved).unwrap();
        let want = &good.iter().find(|(t, _)| t == table).unwrap().1;
        assert_eq!(&s.rows(&q(table))[0]["n"], want, "{table} is back once {name} is");
    }
    assert_clean_log(&s);

    // A manifest that does not decode when the manifests are read at start: the server still
    // starts, warns naming the table, and only that table's queries fail, naming the file.
    let manifest = files("events_v2", "metadata", ".avro")[0].clone();
    let saved = std::fs::read(&manifest).unwrap();
    garbage(&manifest);
    let mut args = lake_args(dir.path());
    args.extend(["--warm-on-start".to_string(), "true".to_string()]);
    let warmed = Server::start(Opts { args, ..Default::default() });
    let line = reads_at_start(&warmed);
    assert!(line.contains("failed=1"), "{line}");
    let log = warmed.log_text();
    assert!(
        log.lines().any(|l| l.contains("WARN") && l.contains("glass.events_v2") && l.contains("at start")),
        "{log}"
    );
    let name = manifest.file_name().unwrap().to_string_lossy().to_string();
    let (status, _, msg) = failed(&warmed, &q("events_v2"), Duration::from_secs(10));
    assert_eq!(status, 502, "{msg}");
    assert!(msg.contains(&name), "the error names {name}: {msg}");
    let identities = &good.iter().find(|(t, _)| t == "identities").unwrap().1;
    assert_eq!(&warmed.rows(&q("identities"))[0]["n"], identities);
    std::fs::write(&manifest, saved).unwrap();
}
