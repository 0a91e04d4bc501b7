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
        // 503 `starting` while the demo lake is written.
        if !r.status().is_success() {
            return None;
        }
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

#[test]
fn a_first_batch_over_a_cap_is_refused_before_any_byte() {
    let dir = tempdir();
    demo_lake(dir.path(), 100);
    let caps = ["--max-result-rows", "10", "--max-result-bytes", "3000"].map(String::from).to_vec();
    let s = Server::start(Opts { args: [lake_args(dir.path()), caps].concat(), ..Default::default() });
    // One batch each: 9 rows of ~4.5 KB, and 20 small rows.
    let cases = [
        (
            "SELECT repeat('x', 500) AS s FROM generate_series(1, 9)",
            "the result is larger than 3000 bytes (--max-result-bytes)",
        ),
        ("SELECT value FROM generate_series(1, 20)", "the result has more than 10 rows (--max-result-rows)"),
    ];
    for (sql, message) in cases {
        for path in ["/query", "/streaming-query"] {
            let r = s.post(path, json!({ "query": sql }).to_string());
            assert_eq!(r.status(), 413, "{path}: {sql}");
            assert_eq!(r.headers()["content-type"], "application/json");
            let v: serde_json::Value = r.json().unwrap();
            assert_eq!(v, json!({"error": {"code": "result_too_large", "message": message}}), "{path}");
        }
    }
    // Nothing was sent, and the log says so.
    let lines: Vec<String> = eventually(10, || {
        Some(s.log_text()).filter(|t| t.matches("outcome=\"result_too_large\"").count() == 4)
    })
    .lines()
    .filter(|l| l.contains("outcome=\"result_too_large\""))
    .map(String::from)
    .collect();
    for line in lines {
        assert!(line.contains(" rows=0 bytes_sent=0 truncated=false "), "{line}");
    }
    // Within the caps, the whole result.
    assert_eq!(s.rows("SELECT value FROM generate_series(1, 10)").len(), 10);
}

#[test]
fn unsupported_time_zones_are_the_querys_fault() {
    let s = server();
    for zone in ["Foo/Bar", "UTC+2"] {
        let sql = format!("SELECT arrow_cast(0, 'Timestamp(Second, Some(\"{zone}\"))') AS a");
        let (code, msg) = s.error(&sql, 400);
        assert_eq!(code, "invalid_query");
        assert_eq!(
            msg,
            format!(
                "unsupported time zone \"{zone}\": use a zone name such as \"Europe/Paris\" or an offset such as \"+02:00\""
            )
        );
        // An Arrow stream carries the zone's name as it is.
        let r = s.post("/streaming-query", json!({ "query": sql }).to_string());
        assert_eq!(r.status(), 200);
    }
}

#[test]
fn timestamps_of_any_year_are_dates() {
    let rows = server().rows(
        "SELECT arrow_cast(10413792000000000, 'Timestamp(Microsecond, None)') AS b, \
                arrow_cast(-62135596800, 'Timestamp(Second, None)') AS c, \
                arrow_cast(-11676096000000, 'Timestamp(Millisecond, Some(\"+02:00\"))') AS d, \
                arrow_cast(253402300799999999, 'Timestamp(Microsecond, Some(\"UTC\"))') AS e, \
                arrow_cast(-9223372036854775807, 'Timestamp(Nanosecond, None)') AS f",
    );
    assert_eq!(
        rows,
        vec![json!({
            "b": "2300-01-01T00:00:00.000000Z", "c": "0001-01-01T00:00:00.000000Z",
            "d": "1600-01-01T02:00:00.000000+02:00", "e": "9999-12-31T23:59:59.999999Z",
            "f": "1677-09-21T00:12:43.145224193Z"
        })]
    );
    // Beyond the years a date can be written for, the query fails rather than answer null.
    let (code, msg) =
        server().error("SELECT arrow_cast(9223372036854775807, 'Timestamp(Second, None)') AS t", 400);
    assert_eq!(code, "invalid_query");
    assert_eq!(
        msg,
        "the timestamp 9223372036854775807 (Seconds since 1970) is beyond the years a date can be written for"
    );
}

#[test]
fn json_get_values_are_their_json() {
    let rows = server().rows(
        r#"SELECT json_get('{"a":1}', 'a') AS v, json_get('{"a":null}', 'a') AS y, json_get('{}', 'a') AS missing,
                  json_get('{"a":true}', 'a') AS b, json_get('{"a":1.5}', 'a') AS f, json_get('{"a":"s\"q"}', 'a') AS s,
                  json_get('{"a":[1, {"b": "c"}]}', 'a') AS arr, json_get('{"a":{"b": [2]}}', 'a') AS obj"#,
    );
    assert_eq!(
        rows,
        vec![json!({
            "v": 1, "y": null, "missing": null, "b": true, "f": 1.5, "s": "s\"q",
            "arr": [1, {"b": "c"}], "obj": {"b": [2]}
        })]
    );
    // On the lake: the same values json_get_str reads.
    let rows = server().rows(
        "SELECT json_get(props, '$title') AS v, json_get_str(props, '$title') AS s \
         FROM glass.events WHERE props IS NOT NULL ORDER BY event_id LIMIT 20",
    );
    assert!(rows.iter().any(|r| r["s"].is_string()), "{rows:?}");
    for r in rows {
        assert_eq!(r["v"], r["s"], "{r}");
    }
}

#[test]
fn duplicate_column_names_are_refused_for_json() {
    let s = server();
    let message = "the result has more than one column named \"x\", and a JSON object cannot carry both: \
                   give the columns distinct names with AS";
    for sql in [
        "SELECT * FROM (SELECT 1 AS x) a CROSS JOIN (SELECT 2 AS x) b",
        "SELECT * FROM (SELECT 1 AS x) a CROSS JOIN (SELECT 2 AS x) b WHERE false",
    ] {
        assert_eq!(s.error(sql, 400), ("invalid_query".to_string(), message.to_string()), "{sql}");
    }
    assert_eq!(
        s.rows("SELECT a.x, b.x AS x2 FROM (SELECT 1 AS x) a CROSS JOIN (SELECT 2 AS x) b"),
        vec![json!({"x": 1, "x2": 2})]
    );
    // An Arrow stream carries both.
    let r = s.post(
        "/streaming-query",
        json!({"query": "SELECT * FROM (SELECT 1 AS x) a CROSS JOIN (SELECT 2 AS x) b"}).to_string(),
    );
    assert_eq!(r.status(), 200);
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(r.bytes().unwrap()), None).unwrap();
    let names: Vec<String> = reader.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(names, ["x", "x"]);
}

#[test]
fn nested_dictionaries_are_their_values() {
    let rows = server().rows(
        "SELECT arrow_cast([1, 2], 'List(Dictionary(Int32, Int64))') AS a, \
                arrow_cast(['u', NULL], 'List(Dictionary(Int32, Utf8))') AS b, \
                named_struct('k', arrow_cast(1, 'Dictionary(Int32, Int64)')) AS c",
    );
    assert_eq!(rows, vec![json!({"a": [1, 2], "b": ["u", null], "c": {"k": 1}})]);
}

#[test]
fn floats_have_the_digits_of_their_own_width() {
    let sql = "SELECT arrow_cast(0.1, 'Float32') AS a, arrow_cast(0.1, 'Float16') AS h, \
               [arrow_cast(1.1, 'Float32')] AS l, arrow_cast(65504, 'Float16') AS hmax, \
               arrow_cast('NaN', 'Float32') AS nan";
    let r = server().post("/query", json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), r#"[{"a":0.1,"h":0.1,"l":[1.1],"hmax":65500.0,"nan":null}]"#);
}

#[test]
fn array_and_compressed_bodies_are_refused() {
    let s = server();
    let send = |encoding: Option<&str>, body: &str| {
        let mut req = client()
            .post(format!("{}/query", s.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(e) = encoding {
            req = req.header("content-encoding", e);
        }
        let r = req.send().unwrap();
        (r.status().as_u16(), r.json::<serde_json::Value>().unwrap())
    };
    let error = |code: &str, message: &str| json!({"error": {"code": code, "message": message}});
    assert_eq!(
        send(None, r#"["SELECT 1"]"#),
        (
            400,
            error(
                "bad_request",
                "the body must be a JSON object like {\"query\": \"SELECT 1\"}: it is not an object"
            )
        )
    );
    for encoding in ["gzip", "br", "deflate"] {
        assert_eq!(
            send(Some(encoding), r#"{"query": "SELECT 1"}"#),
            (
                415,
                error(
                    "unsupported_media_type",
                    &format!(
                        "compressed request bodies are not accepted (content-encoding: {encoding}): send the JSON uncompressed"
                    )
                )
            )
        );
    }
    assert_eq!(send(Some("identity"), r#"{"query": "SELECT 1 AS x"}"#), (200, json!([{"x": 1}])));
}

#[test]
fn strings_nested_in_lists_structs_and_maps_are_utf8() {
    use arrow::datatypes::{DataType, Field, Fields};
    let sql = "SELECT array_agg(DISTINCT event) AS a, named_struct('e', max(event)) AS s, \
               MAP([max(event)], [max(country)]) AS m FROM glass.events";
    let r = server().post("/streaming-query", json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 200);
    let reader =
        arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(r.bytes().unwrap()), None).unwrap();
    let schema = reader.schema();
    let types: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
    let DataType::List(item) = types[0] else { panic!("{:?}", types[0]) };
    assert_eq!(item.data_type(), &DataType::Utf8);
    assert_eq!(types[1], &DataType::Struct(Fields::from(vec![Field::new("e", DataType::Utf8, true)])));
    let DataType::Map(entries, _) = types[2] else { panic!("{:?}", types[2]) };
    let DataType::Struct(kv) = entries.data_type() else { panic!("{entries:?}") };
    assert_eq!([kv[0].data_type(), kv[1].data_type()], [&DataType::Utf8, &DataType::Utf8]);
    assert_eq!(reader.map(|b| b.unwrap().num_rows()).sum::<usize>(), 1);
}
