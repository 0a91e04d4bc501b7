//! The Basin SQL-compatible route: Basin's paths, envelope, type names, error codes and
//! statuses, and its dialect, without its limits.

mod common;

use std::collections::HashSet;
use std::sync::OnceLock;

use common::*;
use serde_json::{Value, json};

const ROUTE: &str = "/api/v1/accounts/0123abcd/basin-sql/query/my-bucket";
const LEGACY: &str = "/api/v1/accounts/0123abcd/r2-sql/query/my-bucket";

fn server() -> &'static Server {
    static S: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    &S.get_or_init(|| {
        let dir = tempdir();
        demo_lake(dir.path(), 20_000);
        let s = Server::lake(dir.path());
        (dir, s)
    })
    .1
}

/// Status and envelope of one Basin call.
fn basin(path: &str, sql: &str) -> (u16, Value) {
    let body = json!({"query": sql, "warehouse": "0123abcd_my-bucket"}).to_string();
    let r = server().post(path, body);
    (r.status().as_u16(), r.json().expect("a JSON envelope"))
}

fn ok(sql: &str) -> Value {
    let (status, v) = basin(ROUTE, sql);
    assert_eq!(status, 200, "{sql}: {v}");
    assert_eq!(v["success"], true, "{v}");
    assert_eq!(v["errors"], json!([]));
    v["result"].clone()
}

fn rows(sql: &str) -> Vec<Value> {
    ok(sql)["rows"].as_array().unwrap().clone()
}

fn fails(sql: &str, status: u16, code: u64) -> String {
    let (got, v) = basin(ROUTE, sql);
    assert_eq!(
        (got, v["success"].clone(), v["result"].clone()),
        (status, json!(false), Value::Null),
        "{sql}: {v}"
    );
    assert_eq!(v["errors"][0]["code"], code, "{sql}: {v}");
    v["errors"][0]["message"].as_str().unwrap().to_string()
}

#[test]
fn the_envelope_is_basins() {
    let (status, v) =
        basin(ROUTE, "SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC LIMIT 2");
    assert_eq!(status, 200);
    let keys: HashSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, HashSet::from(["success", "errors", "messages", "result"]));
    let result = &v["result"];
    assert!(result["request_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(result["schema"], json!([{"name": "event", "type": "Utf8"}, {"name": "n", "type": "Int64"}]));
    assert_eq!(result["rows"].as_array().unwrap().len(), 2);
    assert_eq!(result["rows"][0]["event"], "$pageview");
    for m in ["r2_requests_count", "files_scanned", "bytes_scanned"] {
        assert!(result["metrics"][m].as_u64().is_some(), "{m}: {result}");
    }
    assert!(result["metrics"]["files_scanned"].as_u64().unwrap() > 0);
    // The legacy path answers the same.
    let (status, legacy) =
        basin(LEGACY, "SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC LIMIT 2");
    assert_eq!(status, 200);
    assert_eq!(legacy["result"]["rows"], v["result"]["rows"]);
}

#[test]
fn request_ids_are_unique_and_logged() {
    let a = ok("SELECT 1 AS x")["request_id"].as_str().unwrap().to_string();
    let b = ok("SELECT 1 AS x")["request_id"].as_str().unwrap().to_string();
    assert_ne!(a, b);
    let line = eventually(10, || server().log_text().lines().find(|l| l.contains(&b)).map(String::from));
    assert!(line.contains("route=\"basin\"") || line.contains("route=basin"), "{line}");
}

#[test]
fn empty_results_have_an_empty_schema() {
    let r = ok("SELECT event FROM glass.events WHERE event = 'no such event'");
    assert_eq!(r["schema"], json!([]));
    assert_eq!(r["rows"], json!([]));
}

#[test]
fn types_are_named_as_basin_names_them() {
    let r = ok("SELECT CAST(1 AS TINYINT) AS i8, CAST(1 AS INT) AS i32, CAST(1 AS BIGINT) AS i64, \
                CAST(1 AS INT UNSIGNED) AS u32, CAST(1.5 AS FLOAT) AS f32, CAST(1.5 AS DOUBLE) AS f64, \
                CAST(1.25 AS DECIMAL(10, 2)) AS dec, 'a' AS s, arrow_cast('a', 'LargeUtf8') AS ls, \
                true AS b, DATE '2026-01-02' AS d, X'00ff' AS bin, \
                arrow_cast(TIMESTAMP '2025-10-10 18:29:21', 'Timestamp(Microsecond, None)') AS ts, \
                arrow_cast(TIMESTAMP '2025-10-10 18:29:21', 'Timestamp(Microsecond, Some(\"UTC\"))') AS tsz, \
                arrow_cast(0, 'Time64(Microsecond)') AS t, [1, 2] AS l, named_struct('a', 1) AS st, \
                map(['k'], [1]) AS m, NULL AS n");
    let types: Vec<(String, Value)> = r["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().to_string(), f.get("type").cloned().unwrap_or(Value::Null)))
        .collect();
    let expected = [
        ("i8", "Int8"),
        ("i32", "Int32"),
        ("i64", "Int64"),
        ("u32", "UInt32"),
        ("f32", "Float32"),
        ("f64", "Float64"),
        ("dec", "Decimal128(10, 2)"),
        ("s", "Utf8"),
        ("ls", "LargeUtf8"),
        ("b", "Boolean"),
        ("d", "Date32"),
        ("bin", "Binary"),
        ("ts", "Timestamp(Microsecond, None)"),
        ("tsz", "Timestamp(Microsecond, Some(\"UTC\"))"),
        ("t", "Time64(Microsecond)"),
        ("n", "Null"),
    ];
    for (name, ty) in expected {
        let got = types.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(got.1, json!(ty), "{name}");
    }
    // Nested types carry a descriptor instead of a type.
    let schema = r["schema"].as_array().unwrap();
    let l = schema.iter().find(|f| f["name"] == "l").unwrap();
    assert_eq!(l["descriptor"]["type"]["name"], "list");
    assert_eq!(l["descriptor"]["type"]["item"]["type"]["name"], "Int64");
    let st = schema.iter().find(|f| f["name"] == "st").unwrap();
    assert_eq!(st["descriptor"]["type"]["name"], "struct");
    let m = schema.iter().find(|f| f["name"] == "m").unwrap();
    assert_eq!(m["descriptor"]["type"]["name"], "map");
    let row = &r["rows"][0];
    assert_eq!(row["ts"], "2025-10-10T18:29:21.000000Z");
    assert_eq!(row["tsz"], "2025-10-10T18:29:21.000000Z");
    assert_eq!(row["l"], json!([1, 2]));
    assert_eq!(row["st"], json!({"a": 1}));
    assert_eq!(row["m"], json!({"k": 1}));
    assert_eq!(row["bin"], "AP8=");
    assert_eq!(row["n"], Value::Null);
}

#[test]
fn errors_carry_basins_codes_and_statuses() {
    fails("SELEC 1", 400, 40003);
    let m = fails("SELECT nope FROM glass.events", 400, 40004);
    assert!(m.contains("nope"), "{m}");
    fails("SELECT no_such_fn(1)", 400, 40004);
    fails("SELECT 'a' + 1", 400, 40004);
    fails("DROP TABLE glass.events", 400, 40004);
    let m = fails("SELECT * FROM glass.missing", 400, 40010);
    assert!(m.contains("glass.missing"), "{m}");
    // Auth: missing token 401, wrong token 403, both in the envelope.
    let body = json!({"query": "SELECT 1"}).to_string();
    let r = client().post(format!("{}{ROUTE}", server().base)).body(body.clone()).send().unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.json::<Value>().unwrap()["success"], false);
    let r =
        client().post(format!("{}{ROUTE}", server().base)).bearer_auth("wrong").body(body).send().unwrap();
    assert_eq!(r.status(), 403);
    let v: Value = r.json().unwrap();
    assert_eq!(v["success"], false);
    assert!(!v.to_string().contains(TOKEN));
    // Malformed bodies.
    let r = server().post(ROUTE, "{not json");
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().unwrap()["errors"][0]["code"], 40004);
}

#[test]
fn every_statement_kind_basin_accepts_runs() {
    let cases = [
        "WITH a AS (SELECT event FROM glass.events) SELECT count(*) FROM a",
        "SELECT e.event, count(*) FROM glass.events e JOIN glass.identities i ON i.device_id = e.device_id GROUP BY 1",
        "SELECT e.event FROM glass.events e LEFT JOIN glass.identities i ON i.device_id = e.device_id WHERE i.device_id IS NULL LIMIT 3",
        "SELECT count(*) FROM glass.events WHERE device_id IN (SELECT device_id FROM glass.identities)",
        "SELECT event, row_number() OVER (PARTITION BY event ORDER BY timestamp) AS rn FROM glass.events LIMIT 5",
        "SELECT event, timestamp FROM glass.events QUALIFY row_number() OVER (PARTITION BY event ORDER BY timestamp DESC) = 1",
        "SELECT DISTINCT ON (event) event, timestamp FROM glass.events ORDER BY event, timestamp DESC",
        "SELECT event, country, count(*) FROM glass.events GROUP BY GROUPING SETS ((event), (country), ())",
        "SELECT event, country, count(*) FROM glass.events GROUP BY ROLLUP (event, country)",
        "SELECT event, country, count(*) FROM glass.events GROUP BY CUBE (event, country)",
        "SELECT event FROM glass.events UNION SELECT 'x' INTERSECT SELECT 'x' EXCEPT SELECT 'y'",
        "SELECT approx_distinct(device_id), approx_median(json_get_float(props, 'amount')), \
                approx_percentile_cont(json_get_float(props, 'amount'), 0.9) FROM glass.events",
        "SELECT json_get(props, 'amount'), json_get_str(props, 'plan'), json_get_int(props, 'items'), \
                json_get_float(props, 'amount'), json_get_bool('{\"b\": true}', 'b'), json_get_json(props, 'plan'), \
                json_get_array('{\"a\": [1]}', 'a'), json_as_text(props, 'plan'), json_contains(props, 'plan'), \
                json_length(props) FROM glass.events WHERE event = 'purchase' LIMIT 1",
        "SELECT date_trunc('hour', timestamp), date_bin(INTERVAL '15 minutes', timestamp), date_part('dow', timestamp), \
                to_timestamp('2026-10-10T00:00:00Z'), to_timestamp_millis(1), to_timestamp_micros(1), to_timestamp_seconds(1), \
                from_unixtime(1760000000), to_char(timestamp, '%Y-%m-%d') FROM glass.events LIMIT 1",
        "SHOW TABLES",
        "SHOW TABLES IN glass",
        "SHOW DATABASES",
        "SHOW NAMESPACES",
        "DESCRIBE glass.events",
        "EXPLAIN SELECT count(*) FROM glass.events",
        // None of Basin's limits: OFFSET, UNNEST, NOT IN on nullable columns, MEDIAN, exact DISTINCT.
        "SELECT event FROM glass.events ORDER BY event_id LIMIT 5 OFFSET 10",
        "SELECT unnest([1, 2, 3]) AS v",
        "SELECT count(*) FROM glass.events WHERE person_id NOT IN (SELECT person_id FROM glass.identities)",
        "SELECT median(json_get_float(props, 'amount')), count(DISTINCT device_id), sum(DISTINCT 1) FROM glass.events",
    ];
    for sql in cases {
        ok(sql);
    }
    let ns: Vec<Value> = rows("SHOW NAMESPACES");
    // The lake's namespaces, and skiff's own `system` (system.queries).
    assert_eq!(ns, vec![json!({"namespace": "glass"}), json!({"namespace": "system"})]);
    let tables: Vec<String> =
        rows("SHOW TABLES IN glass").iter().map(|r| r["table_name"].as_str().unwrap().to_string()).collect();
    assert!(
        tables.contains(&"events".to_string()) && tables.contains(&"identities".to_string()),
        "{tables:?}"
    );
    assert!(!tables.is_empty());
}

#[test]
fn approx_top_k_returns_value_count_structs() {
    let r = ok("SELECT approx_top_k(event, 3) AS top FROM glass.events");
    let top = r["rows"][0]["top"].as_array().unwrap();
    assert_eq!(top.len(), 3);
    assert_eq!(top[0]["value"], "$pageview");
    let exact =
        rows("SELECT event, count(*) AS n FROM glass.events GROUP BY event ORDER BY n DESC, event LIMIT 3");
    for (t, e) in top.iter().zip(&exact) {
        assert_eq!((&t["value"], &t["count"]), (&e["event"], &e["n"]), "exact while distinct values fit");
    }
    let per_group = rows(
        "SELECT project_id, approx_top_k(country, 2) AS top FROM glass.events GROUP BY project_id ORDER BY project_id",
    );
    assert_eq!(per_group.len(), 3);
    assert!(per_group.iter().all(|r| r["top"].as_array().unwrap().len() == 2));
    fails("SELECT approx_top_k(event, 0) FROM glass.events", 400, 40004);
}

#[test]
fn no_silent_default_limit_and_long_json_strings_work() {
    // Basin caps results at 500 rows by default and 10,000 at most; skiff returns them all.
    let all = "SELECT event_id FROM glass.events UNION ALL SELECT event_id FROM glass.events_v2";
    let n = rows(&format!("SELECT count(*) AS n FROM ({all})"))[0]["n"].as_u64().unwrap() as usize;
    assert!(n > 10_000, "{n}");
    assert_eq!(rows(all).len(), n);
    let long = format!("{{\"k\": \"{}\", \"n\": 7}}", "x".repeat(5_000));
    let r = rows(&format!("SELECT json_get_int('{long}', 'n') AS n, json_length('{long}') AS len"));
    assert_eq!(r[0], json!({"n": 7, "len": 2}));
}

#[test]
fn every_arrow_type_has_a_basin_name_and_a_json_value() {
    // (SQL, Basin's type name, JSON value)
    let cases: &[(&str, &str, Value)] = &[
        ("arrow_cast(1, 'Int16')", "Int16", json!(1)),
        ("arrow_cast(1, 'UInt8')", "UInt8", json!(1)),
        ("arrow_cast(1, 'UInt16')", "UInt16", json!(1)),
        ("arrow_cast(18446744073709551615, 'UInt64')", "UInt64", json!(18446744073709551615u64)),
        ("arrow_cast(1.5, 'Float16')", "Float16", json!(1.5)),
        // Strings are answered as Utf8 whatever the engine used (the lake's are views).
        ("arrow_cast('v', 'Utf8View')", "Utf8", json!("v")),
        ("arrow_cast(X'01', 'LargeBinary')", "LargeBinary", json!("AQ==")),
        ("arrow_cast(X'01', 'BinaryView')", "BinaryView", json!("AQ==")),
        ("arrow_cast(X'0102', 'FixedSizeBinary(2)')", "FixedSizeBinary(2)", json!("AQI=")),
        ("arrow_cast(DATE '2026-01-02', 'Date64')", "Date64", json!("2026-01-02")),
        (
            "arrow_cast(TIMESTAMP '2026-01-02 03:04:05', 'Timestamp(Second, None)')",
            "Timestamp(Second, None)",
            json!("2026-01-02T03:04:05.000000Z"),
        ),
        (
            "arrow_cast(TIMESTAMP '2026-01-02 03:04:05.123', 'Timestamp(Millisecond, None)')",
            "Timestamp(Millisecond, None)",
            json!("2026-01-02T03:04:05.123000Z"),
        ),
        (
            "TIMESTAMP '2026-01-02 03:04:05.123456789'",
            "Timestamp(Nanosecond, None)",
            json!("2026-01-02T03:04:05.123456789Z"),
        ),
        // DataFusion reads a zone-less timestamp cast into a zone as that zone's local time.
        (
            "arrow_cast(TIMESTAMP '2026-01-02 03:04:05', 'Timestamp(Microsecond, Some(\"+02:00\"))')",
            "Timestamp(Microsecond, Some(\"+02:00\"))",
            json!("2026-01-02T03:04:05.000000+02:00"),
        ),
        (
            "arrow_cast(arrow_cast(3723, 'Int32'), 'Time32(Second)')",
            "Time32(Second)",
            json!("01:02:03.000000"),
        ),
        (
            "arrow_cast(3723000000000, 'Time64(Nanosecond)')",
            "Time64(Nanosecond)",
            json!("01:02:03.000000000"),
        ),
        ("arrow_cast(1, 'Duration(Second)')", "Duration(Second)", Value::Null),
        ("INTERVAL '1 day'", "Interval(MonthDayNano)", Value::Null),
        ("arrow_cast('x', 'Dictionary(Int32, Utf8)')", "Dictionary(Int32, Utf8)", json!("x")),
        ("CAST(1 AS DECIMAL(38, 0))", "Decimal128(38, 0)", json!(1)),
    ];
    let select: Vec<String> =
        cases.iter().enumerate().map(|(i, (sql, _, _))| format!("{sql} AS c{i}")).collect();
    let r = ok(&format!("SELECT {}", select.join(", ")));
    for (i, (sql, name, value)) in cases.iter().enumerate() {
        let col = format!("c{i}");
        let f = r["schema"].as_array().unwrap().iter().find(|f| f["name"] == col.as_str()).unwrap();
        assert_eq!(f["type"], json!(name), "{sql}");
        let got = &r["rows"][0][&col];
        if value.is_null() {
            // Durations and intervals are strings as Arrow prints them.
            assert!(got.as_str().is_some_and(|s| !s.is_empty()), "{sql}: {got}");
        } else {
            assert_eq!(got, value, "{sql}");
        }
    }
    // Nested kinds beyond List: LargeList, FixedSizeList, and a map with non-string keys.
    let r = ok(
        "SELECT arrow_cast([1, 2], 'LargeList(Int64)') AS ll, arrow_cast([1, 2], 'FixedSizeList(2, Int64)') AS fl, \
                map([1, 2], ['a', 'b']) AS m",
    );
    assert_eq!(r["rows"][0]["ll"], json!([1, 2]));
    assert_eq!(r["rows"][0]["fl"], json!([1, 2]));
    assert_eq!(r["rows"][0]["m"], json!([{"key": 1, "value": "a"}, {"key": 2, "value": "b"}]));
    for f in r["schema"].as_array().unwrap() {
        assert!(f["descriptor"]["type"]["name"].is_string(), "{f}");
    }
}

#[test]
fn encoding_errors_come_in_the_envelope_with_their_status() {
    let m = fails("SELECT arrow_cast(0, 'Timestamp(Second, Some(\"Foo/Bar\"))') AS a", 400, 40004);
    assert_eq!(
        m,
        "unsupported time zone \"Foo/Bar\": use a zone name such as \"Europe/Paris\" or an offset such as \"+02:00\""
    );
    let m = fails("SELECT * FROM (SELECT 1 AS x) a CROSS JOIN (SELECT 2 AS x) b", 400, 40004);
    assert_eq!(
        m,
        "the result has more than one column named \"x\", and a JSON object cannot carry both: \
         give the columns distinct names with AS"
    );
    let r = server().post(ROUTE, r#"["SELECT 1"]"#);
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"success": false, "errors": [{"code": 40004, "message": "the body must be a JSON object like {\"query\": \"SELECT 1\"}: it is not an object"}],
               "messages": [], "result": null})
    );
}

#[test]
fn json_get_is_a_union_named_union_and_its_values_are_json() {
    // A short, stable name: the union's `Debug` orders its members' metadata differently each run.
    let r = ok(r#"SELECT json_get('{"a":1}', 'a') AS v, json_get('{"a":{"b":null}}', 'a') AS o"#);
    assert_eq!(r["schema"], json!([{"name": "v", "type": "Union"}, {"name": "o", "type": "Union"}]));
    assert_eq!(r["rows"], json!([{"v": 1, "o": {"b": null}}]));
    let r = rows(
        "SELECT json_get(props, '$title') AS v, json_get_str(props, '$title') AS s \
         FROM glass.events WHERE props IS NOT NULL ORDER BY event_id LIMIT 20",
    );
    assert!(r.iter().any(|r| r["s"].is_string()), "{r:?}");
    assert!(r.iter().all(|r| r["v"] == r["s"]), "{r:?}");
}

#[test]
fn a_path_segment_that_is_not_utf8_still_gets_the_envelope() {
    let url = format!("{}/api/v1/accounts/%FF/basin-sql/query/b", server().base);
    let body = json!({"query": "SELECT 1 AS x"}).to_string();
    let r = client().post(&url).body(body.clone()).send().unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().unwrap(),
        json!({"success": false, "errors": [{"code": 10000, "message": "missing or invalid bearer token"}],
               "messages": [], "result": null})
    );
    let r = client().post(&url).bearer_auth(TOKEN).body(body).send().unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    assert_eq!((&v["success"], &v["result"]["rows"]), (&json!(true), &json!([{"x": 1}])));
}

/// Basin's names: on this route `glass.events` is one physical table, so SQL a Basin client has
/// already expanded into every version counts each row once (it read events_v2 twice before).
#[test]
fn names_are_physical_tables_as_in_basin() {
    let n = |r: &[Value]| r[0]["n"].as_u64().unwrap();
    let expanded = "SELECT count(*) AS n FROM (SELECT event FROM glass.events UNION ALL SELECT event FROM glass.events_v2)";
    assert_eq!(n(&rows(expanded)), 20_000);
    assert_eq!(n(&server().rows("SELECT count(*) AS n FROM glass.events")), 20_000);
    let v1 = n(&rows("SELECT count(*) AS n FROM glass.events"));
    let v2 = n(&rows("SELECT count(*) AS n FROM glass.events_v2"));
    assert!(v1 > 0 && v2 > 0 && v1 + v2 == 20_000, "{v1} + {v2}");
    // /query keeps the versioned union, so there the same expanded SQL reads events_v2 twice.
    assert_eq!(n(&server().rows(expanded)), 20_000 + v2);
    // DESCRIBE and SHOW TABLES show what Basin shows: the physical tables and their columns.
    let cols = rows("DESCRIBE glass.events");
    assert!(!cols.iter().any(|c| c["column_name"] == "revenue"), "v1 has no revenue: {cols:?}");
    let tables: HashSet<String> = rows("SHOW TABLES")
        .iter()
        .filter(|t| t["table_schema"] == "glass")
        .map(|t| t["table_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tables, HashSet::from(["events".into(), "events_v2".into(), "identities".into()]));
    // `events_v1` is a /query alias, not a Basin name.
    fails("SELECT count(*) FROM glass.events_v1", 400, 40010);
}

/// The expansion on request: `x-skiff-expand-versions: true` reads names as /query does.
#[test]
fn expand_versions_header() {
    let call = |value: &str, sql: &str| {
        let r = client()
            .post(format!("{}{ROUTE}", server().base))
            .bearer_auth(TOKEN)
            .header("x-skiff-expand-versions", value)
            .body(json!({ "query": sql }).to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    let sql = "SELECT count(*) AS n FROM glass.events";
    assert_eq!(call("true", sql).1["result"]["rows"][0]["n"], 20_000);
    assert_eq!(call("false", sql).1["result"]["rows"], json!(rows(sql)));
    let (status, v) = call("maybe", sql);
    assert_eq!((status, v["errors"][0]["code"].clone()), (400, json!(40004)), "{v}");
    assert!(v["errors"][0]["message"].as_str().unwrap().contains("x-skiff-expand-versions"), "{v}");
}

/// SQL a Basin client wrote for Basin SQL: each versioned table replaced by a UNION ALL of its
/// versions, by column name, a column a version lacks padded with a typed NULL (SQL type names,
/// as a person writes them). `versions` maps a table to its versions' columns (name, Arrow type).
fn dataflare_expand(sql: &str, table: &str, versions: &[(&str, Vec<(String, String)>)]) -> String {
    let mut union_cols: Vec<(String, String)> = Vec::new();
    for (_, cols) in versions {
        for c in cols {
            if !union_cols.iter().any(|u| u.0 == c.0) {
                union_cols.push(c.clone());
            }
        }
    }
    let sql_type = |arrow: &str| match arrow {
        t if t.contains("Utf8") => "VARCHAR",
        t if t.starts_with("Timestamp") => "TIMESTAMP",
        "Float64" => "DOUBLE",
        "Float32" => "REAL",
        "Int64" => "BIGINT",
        "Int32" => "INT",
        "Boolean" => "BOOLEAN",
        other => panic!("no SQL name for {other}"),
    };
    let branches: Vec<String> = versions
        .iter()
        .map(|(name, cols)| {
            let list: Vec<String> = union_cols
                .iter()
                .map(|(c, t)| {
                    if cols.iter().any(|x| &x.0 == c) {
                        format!("\"{c}\"")
                    } else {
                        format!("CAST(NULL AS {}) AS \"{c}\"", sql_type(t))
                    }
                })
                .collect();
            format!("SELECT {} FROM glass.{name}", list.join(", "))
        })
        .collect();
    let union = format!("({})", branches.join(" UNION ALL "));
    // Each `glass.<table>` (not `glass.<table>_v2`) becomes the union, keeping an alias if one follows.
    let needle = format!("glass.{table}");
    let keywords = [
        "WHERE", "GROUP", "ORDER", "LIMIT", "LEFT", "RIGHT", "INNER", "JOIN", "ON", "UNION", "HAVING",
        "QUALIFY", "CROSS", "FULL",
    ];
    let mut out = String::new();
    let mut rest = sql;
    while let Some(at) = rest.find(&needle) {
        let after = &rest[at + needle.len()..];
        if after.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            out.push_str(&rest[..at + needle.len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        out.push_str(&union);
        let next = after.split_whitespace().next().unwrap_or("");
        let aliased = !next.is_empty()
            && next.chars().all(|c| c.is_alphanumeric() || c == '_')
            && !keywords.contains(&next.to_ascii_uppercase().as_str());
        if !aliased {
            out.push_str(&format!(" AS {table}"));
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Every query kind of the benchmark and of tests/queries, expanded as a Basin client expands it,
/// answers on the Basin route exactly what the unexpanded SQL answers on /query: on a lake written
/// by PyIceberg (gen_lake.py, where every kind but one person's timeline, a needle that needs a
/// bigger lake, has rows) and on the demo lake.
#[test]
fn expanded_sql_on_the_basin_route_equals_query() {
    let dir = tempdir();
    py_lake(dir.path(), 60_000);
    let py = Server::lake(dir.path());
    for (s, every_kind_has_rows) in [(&py, true), (server(), false)] {
        let basin_rows = |sql: &str| -> Vec<Value> {
            let r = s.post(ROUTE, json!({ "query": sql }).to_string());
            let v: Value = r.json().unwrap();
            assert_eq!(v["success"], true, "{sql}: {v}");
            v["result"]["rows"].as_array().unwrap().clone()
        };
        let columns = |t: &str| -> Vec<(String, String)> {
            basin_rows(&format!("DESCRIBE glass.{t}"))
                .iter()
                .map(|c| (c["column_name"].as_str().unwrap().into(), c["data_type"].as_str().unwrap().into()))
                .collect()
        };
        let versions = [("events", columns("events")), ("events_v2", columns("events_v2"))];
        assert!(versions[1].1.len() > versions[0].1.len(), "events_v2 adds columns: {versions:?}");
        let (mut n, mut empty) = (0, vec![]);
        for dir in [shared().join("bench/queries"), repo().join("tests/queries")] {
            let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
            files.sort();
            for f in files.into_iter().filter(|f| f.extension().is_some_and(|x| x == "sql")) {
                let text = std::fs::read_to_string(&f).unwrap();
                let sql: String =
                    text.lines().filter(|l| !l.trim_start().starts_with("--")).collect::<Vec<_>>().join("\n");
                let expanded = dataflare_expand(&sql, "events", &versions);
                assert!(expanded.contains("UNION ALL"), "{}: {expanded}", f.display());
                let want = s.rows(&sql);
                if want.is_empty() {
                    empty.push(f.file_stem().unwrap().to_string_lossy().to_string());
                }
                assert_eq!(
                    basin_rows(&expanded),
                    want,
                    "{}: expanded on the Basin route vs /query\n{expanded}",
                    f.display()
                );
                n += 1;
            }
        }
        assert!(n >= 15, "{n} query kinds");
        if every_kind_has_rows {
            assert!(empty.len() <= 1, "kinds without rows: {empty:?}");
        }
    }
}
