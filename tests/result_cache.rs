//! The result cache and HTTP caching: an answer is reused only while every table it read is
//! at the same snapshot, never for volatile functions or tables outside the lake, and an
//! `If-None-Match` that names the current answer gets 304 before anything executes.

mod common;

use common::*;
use reqwest::blocking::Response;

const TRENDS: &str = "SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY event";

fn server(dir: &std::path::Path, cache: &str) -> Server {
    let mut args = lake_args(dir);
    args.extend(["--result-cache-bytes".into(), cache.into(), "--log-sql".into()]);
    Server::start(Opts { args, ..Default::default() })
}

fn send(s: &Server, path: &str, sql: &str, if_none_match: Option<&str>) -> Response {
    let mut req = client()
        .post(format!("{}{path}", s.base))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({ "query": sql }));
    if let Some(tag) = if_none_match {
        req = req.header("if-none-match", tag);
    }
    req.send().expect("request")
}

fn header(r: &Response, name: &str) -> Option<String> {
    r.headers().get(name).map(|v| v.to_str().unwrap().to_string())
}

/// Status, result-cache header, ETag and body of one `POST /query`.
fn query(s: &Server, sql: &str, if_none_match: Option<&str>) -> (u16, String, Option<String>, String) {
    let r = send(s, "/query", sql, if_none_match);
    let cache = header(&r, "x-skiff-result-cache").unwrap_or_default();
    let etag = header(&r, "etag");
    (r.status().as_u16(), cache, etag, r.text().unwrap())
}

fn append(dir: &std::path::Path, rows: &str) {
    fixture(
        "write_local.py",
        &["append", "--lake", &dir.display().to_string(), "--table", "glass.events_v2", "--rows", rows],
    );
}

#[test]
fn a_repeated_query_is_answered_from_the_cache_until_a_new_snapshot() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let s = server(dir.path(), "64MiB");

    let (status, cache, etag, first) = query(&s, TRENDS, None);
    assert_eq!((status, cache.as_str()), (200, "miss"), "{first}");
    let etag = etag.expect("a deterministic query over the lake has an ETag");
    assert!(etag.starts_with("W/\""), "{etag}");

    let r = send(&s, "/query", TRENDS, None);
    assert_eq!(header(&r, "x-skiff-result-cache").as_deref(), Some("hit"));
    assert_eq!(header(&r, "x-skiff-files-scanned").as_deref(), Some("0"), "a hit reads nothing");
    assert_eq!(header(&r, "etag").as_deref(), Some(etag.as_str()));
    assert_eq!(r.text().unwrap(), first);

    // The Arrow route shares the answer (same plan and snapshots), encoded its own way.
    let r = send(&s, "/streaming-query", TRENDS, None);
    assert_eq!(header(&r, "x-skiff-result-cache").as_deref(), Some("hit"));
    let rows = arrow_rows(&r.bytes().unwrap());
    assert_eq!(rows, serde_json::from_str::<Vec<serde_json::Value>>(&first).unwrap().len());

    // Another process commits a snapshot: the next answer is computed afresh and differs.
    append(dir.path(), "250");
    let (status, cache, etag2, after) = query(&s, TRENDS, None);
    assert_eq!((status, cache.as_str()), (200, "miss"), "{after}");
    assert_ne!(etag2.as_deref(), Some(etag.as_str()));
    let total = |body: &str| -> u64 {
        serde_json::from_str::<Vec<serde_json::Value>>(body)
            .unwrap()
            .iter()
            .map(|r| r["n"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(total(&after), total(&first) + 250);

    // A different query (even one differing only in a literal) is another entry.
    let (_, cache, _, _) = query(&s, &TRENDS.replace("ORDER BY event", "ORDER BY event DESC"), None);
    assert_eq!(cache, "miss");
    assert_eq!(s.metric("skiff_cache_hits_total{cache=\"result\"}"), 2.0);
}

#[test]
fn if_none_match_gets_304_without_executing() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    // With the result cache off, so the 304 cannot come from it.
    let s = server(dir.path(), "0");
    let (status, cache, etag, _) = query(&s, TRENDS, None);
    assert_eq!((status, cache.as_str()), (200, "off"));
    let etag = etag.expect("ETag");

    let r = client()
        .post(format!("{}/query", s.base))
        .bearer_auth(TOKEN)
        .header("x-request-id", "revalidate-1")
        .header("if-none-match", format!("\"other\", {etag}"))
        .json(&serde_json::json!({ "query": TRENDS }))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 304);
    assert_eq!(header(&r, "etag").as_deref(), Some(etag.as_str()));
    assert!(r.text().unwrap().is_empty());
    // The log line of the revalidation: no file was even planned.
    let line = eventually(10, || s.log_text().lines().find(|l| l.contains("revalidate-1")).map(String::from));
    assert!(line.contains("files_planned=0") && line.contains("outcome=\"ok\""), "{line}");

    // A stale tag gets the full answer; so does the Basin route with a stale one.
    let (status, _, _, body) = query(&s, TRENDS, Some("W/\"0123\""));
    assert_eq!(status, 200, "{body}");
    append(dir.path(), "10");
    let (status, _, etag2, _) = query(&s, TRENDS, Some(&etag));
    assert_eq!(status, 200, "a new snapshot makes the old tag stale");
    assert_ne!(etag2, Some(etag));
}

#[test]
fn volatile_functions_and_system_tables_bypass_the_cache() {
    let dir = tempdir();
    demo_lake(dir.path(), 2_000);
    let s = server(dir.path(), "64MiB");
    for sql in [
        "SELECT random() AS r",
        "SELECT now() AS t, count(*) AS n FROM glass.events",
        "SELECT count(*) AS n FROM glass.events WHERE timestamp < now()",
        "SELECT count(*) AS n FROM system.queries",
        "SELECT count(*) AS n FROM information_schema.tables",
    ] {
        for _ in 0..2 {
            let (status, cache, etag, body) = query(&s, sql, None);
            assert_eq!((status, cache.as_str(), etag), (200, "bypass", None), "{sql}: {body}");
        }
    }
    // random() really is computed again.
    let a = query(&s, "SELECT random() AS r", None).3;
    let b = query(&s, "SELECT random() AS r", None).3;
    assert_ne!(a, b);
    // A deterministic query over the same lake is cached, with its cost headers.
    let sql = "SELECT count(*) AS n FROM glass.events WHERE event = 'signup'";
    let r = send(&s, "/query", sql, None);
    assert_eq!(header(&r, "x-skiff-result-cache").as_deref(), Some("miss"));
    let planned: u64 = header(&r, "x-skiff-files-planned").unwrap().parse().unwrap();
    let pruned: u64 = header(&r, "x-skiff-files-pruned").unwrap().parse().unwrap();
    assert!(planned > 0, "planned {planned}, pruned {pruned}");
    assert!(header(&r, "server-timing").unwrap().starts_with("first-batch;dur="));
    // The answer is kept when its stream ends, before its last bytes are sent: read to the end,
    // it is there for the next request.
    r.text().unwrap();
    assert_eq!(query(&s, sql, None).1, "hit");
}

#[test]
fn answers_over_the_size_bound_are_not_kept() {
    let dir = tempdir();
    demo_lake(dir.path(), 5_000);
    // 64 KiB of cache: an answer over 16 KiB is not kept.
    let s = server(dir.path(), "64KiB");
    let big = "SELECT * FROM glass.events ORDER BY event_id";
    let (status, cache, _, body) = query(&s, big, None);
    assert_eq!((status, cache.as_str()), (200, "miss"));
    assert!(body.len() > 64 * 1024);
    assert_eq!(query(&s, big, None).1, "miss");
    let small = "SELECT count(*) AS n FROM glass.events";
    assert_eq!(query(&s, small, None).1, "miss");
    assert_eq!(query(&s, small, None).1, "hit");
}

/// Rows in an Arrow IPC stream.
fn arrow_rows(bytes: &[u8]) -> usize {
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
    reader.map(|b| b.unwrap().num_rows()).sum()
}

#[test]
fn queries_that_differ_only_where_a_plan_display_abbreviates_never_share_an_answer() {
    let dir = tempdir();
    demo_lake(dir.path(), 2_000);
    let s = server(dir.path(), "64MiB");
    // Each pair hashed alike when the fingerprint was taken from the plan's display: it shows
    // five rows of a VALUES list, no table for DESCRIBE, string literals unescaped.
    let pairs = [
        (
            "SELECT sum(column1) AS s FROM (VALUES (1),(2),(3),(4),(5),(6))",
            "SELECT sum(column1) AS s FROM (VALUES (1),(2),(3),(4),(5),(100))",
        ),
        ("DESCRIBE glass.events", "DESCRIBE glass.identities"),
        ("SELECT concat('a', 'b') AS x", r#"SELECT concat('a"), Utf8("b') AS x"#),
        (
            r#"SELECT count(*) AS n FROM glass.identities WHERE user_id = 'u1") OR glass.identities.user_id = Utf8("u2'"#,
            "SELECT count(*) AS n FROM glass.identities WHERE user_id = 'u1' OR user_id = 'u2'",
        ),
        ("EXPLAIN SELECT count(*) FROM glass.events", "EXPLAIN VERBOSE SELECT count(*) FROM glass.events"),
    ];
    for (a, b) in pairs {
        let (sa, ca, ea, _) = query(&s, a, None);
        let (sb, cb, eb, _) = query(&s, b, None);
        assert_eq!((sa, sb, ca.as_str(), cb.as_str()), (200, 200, "miss", "miss"), "{a} / {b}");
        assert_ne!(ea, eb, "{a} / {b}");
        assert_eq!(query(&s, b, None).1, "hit");
    }
    // EXPLAIN ANALYZE reports this run's timings: never from the cache.
    let sql = "EXPLAIN ANALYZE SELECT count(*) FROM glass.events";
    assert_eq!(query(&s, sql, None).1, "bypass");
}
