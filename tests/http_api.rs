//! The HTTP API over a lake written by `skiff demo`: endpoints, encodings, auth, read-only
//! rules and every kind of bad input.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::json;

const EVENTS: u64 = 20_000;

/// One demo lake and one server for the read-only tests in this file.
fn server() -> &'static Server {
    static S: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    &S.get_or_init(|| {
        let dir = tempdir();
        demo_lake(dir.path(), EVENTS);
        let server = Server::start(Opts {
            args: [lake_args(dir.path()), vec!["--max-body-bytes".into(), "4096".into()]].concat(),
            ..Default::default()
        });
        (dir, server)
    })
    .1
}

#[test]
fn health_needs_no_token_and_welcome_lists_tables() {
    let s = server();
    let r = client().get(format!("{}/_health", s.base)).send().unwrap();
    assert_eq!(r.status(), 200);
    let r = client().get(format!("{}/", s.base)).send().unwrap();
    assert_eq!(r.status(), 401);
    let r = client().get(format!("{}/", s.base)).bearer_auth(TOKEN).send().unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["name"], "skiff");
    assert_eq!(v["catalog"], "sqlite");
    let tables: Vec<&str> = v["tables"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    for t in ["glass.events", "glass.events_v2", "glass.identities"] {
        assert!(tables.contains(&t), "{tables:?}");
    }
}

#[test]
fn json_rows_encode_each_type() {
    let rows = server().rows(
        "SELECT 1 AS i, 2.5 AS f, CAST('NaN' AS DOUBLE) AS nan, 'a\"b' AS s, NULL AS n, true AS b, \
         TIMESTAMP '2025-10-10 18:29:21' AS t, DATE '2026-01-02' AS d, \
         arrow_cast(TIMESTAMP '2025-10-10 18:29:21.123456', 'Timestamp(Microsecond, None)') AS us, [1, 2] AS l, \
         named_struct('k', 'v') AS st, X'6869' AS bin, CAST(12.30 AS DECIMAL(10, 2)) AS dec, \
         arrow_cast(TIMESTAMP '2025-10-10 18:29:21', 'Timestamp(Microsecond, Some(\"UTC\"))') AS tz",
    );
    assert_eq!(
        rows,
        vec![json!({
            "i": 1, "f": 2.5, "nan": null, "s": "a\"b", "n": null, "b": true,
            "t": "2025-10-10T18:29:21.000000000Z", "us": "2025-10-10T18:29:21.123456Z", "d": "2026-01-02", "l": [1, 2],
            "st": {"k": "v"}, "bin": "aGk=", "dec": 12.30, "tz": "2025-10-10T18:29:21.000000Z"
        })]
    );
}

#[test]
fn queries_read_the_lake() {
    let s = server();
    let total = s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"].as_u64().unwrap();
    let v1 = s.rows("SELECT count(*) AS n FROM glass.events_v1")[0]["n"].as_u64().unwrap();
    let v2 = s.rows("SELECT count(*) AS n FROM glass.events_v2")[0]["n"].as_u64().unwrap();
    assert_eq!(total, EVENTS, "glass.events is every version");
    assert_eq!(v1 + v2, EVENTS);
    assert!(v1 > 0 && v2 > 0);
    let rows = s.rows("SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC LIMIT 3");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["event"], "$pageview");
    let with_filter = s.rows(
        "SELECT count(*) AS n FROM glass.events WHERE project_id = 'proj_alpha' AND timestamp >= TIMESTAMP '2026-10-01 00:00:00'",
    )[0]["n"]
        .as_u64()
        .unwrap();
    assert!(with_filter > 0 && with_filter < total);
}

#[test]
fn large_results_stream_whole() {
    let s = server();
    let r = s.post("/query", json!({"query": "SELECT event_id, props FROM glass.events"}).to_string());
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-length").is_none(), "a large result is streamed, not buffered");
    let rows: Vec<serde_json::Value> = r.json().unwrap();
    assert_eq!(rows.len() as u64, EVENTS);
}

#[test]
fn arrow_stream_has_schema_first_and_all_rows() {
    let s = server();
    let r =
        s.post("/streaming-query", json!({"query": "SELECT event, timestamp FROM glass.events"}).to_string());
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/vnd.apache.arrow.stream");
    let bytes = r.bytes().unwrap();
    let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
    let schema = reader.schema();
    assert_eq!(schema.field(0).name(), "event");
    let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows as u64, EVENTS);

    // An empty result is still a stream with its schema.
    let r = s
        .post("/streaming-query", json!({"query": "SELECT event FROM glass.events WHERE false"}).to_string());
    assert_eq!(r.status(), 200);
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(r.bytes().unwrap()), None).unwrap();
    assert_eq!(reader.schema().field(0).name(), "event");
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 0);

    // Planning errors come as JSON with a status, before any Arrow byte.
    let r = s.post("/streaming-query", json!({"query": "SELEC 1"}).to_string());
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["error"]["code"], "sql_syntax_error");
}

#[test]
fn errors_after_streaming_began_fail_the_response() {
    let s = server();
    // Rows past the first batches fail to cast: the error arrives after the first batch, so
    // the status is already 200 and the only honest signal left is a broken body.
    let sql = "SELECT CAST(CASE WHEN value < 60000 THEN '1' ELSE 'oops' END AS INT) AS x FROM generate_series(1, 100000)";
    let send = |path: &str| {
        client()
            .post(format!("{}{path}", s.base))
            .bearer_auth(TOKEN)
            .body(json!({ "query": sql }).to_string())
            .send()
            .and_then(|r| {
                assert_eq!(r.status(), 200, "the first batch was fine");
                r.bytes()
            })
    };
    assert!(send("/query").is_err(), "a JSON body must not end cleanly after an error");
    if let Ok(bytes) = send("/streaming-query") {
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        assert!(reader.into_iter().any(|b| b.is_err()), "the stream must not end with a clean end-of-stream");
    }
    let line = eventually(10, || s.log_text().lines().find(|l| l.contains("oops")).map(String::from));
    assert!(line.contains("outcome=\"invalid_query\""), "{line}");
}

#[test]
fn auth_is_required_and_tokens_never_logged() {
    let s = server();
    for header in [None, Some("Bearer wrong"), Some("Basic dGVzdA=="), Some("Bearer")] {
        let mut req =
            client().post(format!("{}/query", s.base)).body(json!({"query": "SELECT 1"}).to_string());
        if let Some(h) = header {
            req = req.header("authorization", h);
        }
        let r = req.send().unwrap();
        assert_eq!(r.status(), 401, "{header:?}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let v: serde_json::Value = r.json().unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
    }
    let (status, _) = s.query("SELECT 1");
    assert_eq!(status, 200);
    assert!(!s.log_text().contains(TOKEN), "a token reached the log");
}

#[test]
fn rotated_tokens_all_work() {
    let dir = tempdir();
    demo_lake(dir.path(), 1000);
    let s = Server::start(Opts {
        args: lake_args(dir.path()),
        token: Some("old-one, new-one"),
        ..Default::default()
    });
    for t in ["old-one", "new-one"] {
        let r = client()
            .post(format!("{}/query", s.base))
            .bearer_auth(t)
            .body(r#"{"query":"SELECT 1"}"#)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{t}");
    }
    let r = client()
        .post(format!("{}/query", s.base))
        .bearer_auth("old-one, new-one")
        .body(r#"{"query":"SELECT 1"}"#)
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[test]
fn every_writing_statement_is_refused() {
    let s = server();
    for sql in [
        "CREATE TABLE t (a INT)",
        "CREATE TABLE glass.t AS SELECT 1",
        "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
        "CREATE VIEW v AS SELECT 1",
        "DROP TABLE glass.events",
        "INSERT INTO glass.identities SELECT * FROM glass.identities",
        "DELETE FROM glass.events",
        "UPDATE glass.events SET event = 'x'",
        "COPY (SELECT 1) TO '/tmp/skiff-copy.csv'",
        "SET datafusion.execution.batch_size = 1",
        "CREATE SCHEMA s",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM 'https://example.com/data.parquet'",
    ] {
        let (code, msg) = s.error(sql, 403);
        assert_eq!(code, "read_only", "{sql}: {msg}");
        assert!(!msg.is_empty());
    }
    assert!(!std::path::Path::new("/tmp/skiff-copy.csv").exists());
    // The lake is unchanged.
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"], EVENTS);
}

#[test]
fn bad_input_gets_a_clear_status() {
    let s = server();
    let send = |ct: &str, body: &str| {
        let r = client()
            .post(format!("{}/query", s.base))
            .bearer_auth(TOKEN)
            .header("content-type", ct)
            .body(body.to_string())
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().unwrap())
    };
    for body in ["{", "[]", r#"{"query": 1}"#, r#"{"sql": "SELECT 1"}"#, "", "SELECT 1"] {
        let (status, v) = send("application/json", body);
        assert_eq!(status, 400, "{body:?}: {v}");
        assert_eq!(v["error"]["code"], "bad_request");
    }
    let (status, v) = send("application/xml", r#"{"query": "SELECT 1"}"#);
    assert_eq!((status, v["error"]["code"].as_str()), (415, Some("unsupported_media_type")));
    let huge = json!({ "query": format!("SELECT '{}'", "x".repeat(10_000)) }).to_string();
    let (status, v) = send("application/json", &huge);
    assert_eq!((status, v["error"]["code"].as_str()), (413, Some("payload_too_large")));
    // curl -d without a content type still works.
    let (status, _) = send("application/x-www-form-urlencoded", r#"{"query": "SELECT 1"}"#);
    assert_eq!(status, 200);

    assert_eq!(s.error("SELEC 1", 400).0, "sql_syntax_error");
    assert_eq!(s.error("   ", 400).0, "bad_request");
    let (code, msg) = s.error("SELECT * FROM glass.nope", 404);
    assert_eq!(code, "table_not_found");
    assert!(msg.contains("glass.nope"), "{msg}");
    assert_eq!(s.error("SELECT * FROM nowhere.nope", 404).0, "table_not_found");
    let (code, msg) = s.error("SELECT no_such_column FROM glass.events", 400);
    assert_eq!(code, "invalid_query");
    assert!(msg.contains("no_such_column"), "{msg}");
    assert_eq!(s.error("SELECT no_such_function(1)", 400).0, "invalid_query");
    assert_eq!(s.error("SELECT 'a' + 1", 400).0, "invalid_query");
    let r = client().get(format!("{}/nope", s.base)).send().unwrap();
    assert_eq!(r.status(), 404);
}

#[test]
fn basin_json_functions_work() {
    let rows = server().rows(
        "SELECT json_get_str(props, 'currency') AS cur, json_get_float(props, 'amount') > 0 AS pos, \
                json_get_int(props, 'items') BETWEEN 1 AND 5 AS items, json_contains(props, 'plan') AS has_plan, \
                json_length(props) AS len, json_as_text(props, 'plan') IS NOT NULL AS plan \
         FROM glass.events WHERE event = 'purchase' LIMIT 1",
    );
    assert_eq!(
        rows,
        vec![json!({"cur": "USD", "pos": true, "items": true, "has_plan": true, "len": 4, "plan": true})]
    );
    let rows = server()
        .rows(r#"SELECT json_get_str('{"a": {"b": "c"}}', 'a', 'b') AS v, json_get('[1,2]', 1) AS w"#);
    assert_eq!(rows[0]["v"], "c");
}

#[test]
fn show_describe_and_information_schema() {
    let s = server();
    let tables = s.rows("SHOW TABLES");
    let names: Vec<String> = tables
        .iter()
        .filter(|r| r["table_schema"] == "glass")
        .map(|r| r["table_name"].as_str().unwrap().to_string())
        .collect();
    for t in ["events", "events_v2", "identities"] {
        assert!(names.contains(&t.to_string()), "{names:?}");
    }
    let cols: Vec<String> = s
        .rows("DESCRIBE glass.events")
        .iter()
        .map(|r| r["column_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(cols.first().map(String::as_str), Some("__ingest_ts"));
    assert!(cols.contains(&"revenue".to_string()), "the union schema: {cols:?}");
    let n = s.rows(
        "SELECT count(*) AS n FROM information_schema.columns WHERE table_schema = 'glass' AND table_name = 'events'",
    );
    assert_eq!(n[0]["n"].as_u64(), Some(cols.len() as u64));
    // Settings hold no secret; listing them works.
    assert!(!s.rows("SHOW ALL").is_empty());
}

#[test]
fn embedded_default_writes_and_serves_a_demo_lake() {
    let cwd = tempdir();
    let port = free_port();
    // A bare `skiff`, configured only by its environment.
    let mut child = std::process::Command::new(skiff_bin())
        .current_dir(cwd.path())
        .env("SKIFF_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env_remove("API_TOKEN")
        .env_remove("SKIFF_CATALOG_URI")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let n = eventually(120, || {
        let r = client()
            .post(format!("{base}/query"))
            .body(r#"{"query":"SELECT count(*) AS n FROM glass.events"}"#)
            .send()
            .ok()?;
        r.json::<serde_json::Value>().ok().map(|v| v[0]["n"].as_u64().unwrap())
    });
    assert!(n > 0);
    assert!(cwd.path().join("lake/catalog.db").exists());
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("writing a demo lake"), "{stderr}");
    assert!(stderr.contains("API_TOKEN is not set"), "{stderr}");
}

#[test]
fn one_log_line_per_query_with_its_request_id() {
    let s = server();
    let r = client()
        .post(format!("{}/query", s.base))
        .bearer_auth(TOKEN)
        .header("x-request-id", "req-abc-123")
        .body(r#"{"query":"SELECT count(*) FROM glass.identities"}"#)
        .send()
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "req-abc-123");
    assert_eq!(r.status(), 200);
    let line = eventually(10, || s.log_text().lines().find(|l| l.contains("req-abc-123")).map(String::from));
    assert!(line.contains("outcome=\"ok\"") || line.contains("outcome=ok"), "{line}");
    assert!(line.contains("glass.identities@"), "snapshot ids are logged: {line}");
    assert!(!line.contains("SELECT"), "SQL is not logged by default: {line}");
}
