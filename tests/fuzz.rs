//! No request can crash the process: property-based inputs (proptest) against the live
//! binary over real HTTP and raw TCP: random bytes and JSON bodies, odd headers and content
//! types, random methods and paths, the Basin route, and a bounded random-SQL run over the
//! demo lake (expressions, functions incl. JSON ones, casts, joins, GROUP BY, ORDER BY,
//! LIMIT, windows) plus token soup.
//!
//! For every input: an answer arrives within a bound, its status is an expected one (never
//! 500), an error body is the JSON error envelope of its route, and at the end the server is
//! alive and its log has no panic. `SKIFF_FUZZ_CASES` (default 250) sets the cases per
//! category; the counts are printed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const BASIN: &str = "/api/v1/accounts/acc/basin-sql/query/bucket";
/// A response must arrive within this (the server's query timeout is 10 s).
const BOUND: Duration = Duration::from_secs(20);

fn cases() -> u32 {
    std::env::var("SKIFF_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(250)
}

/// What the run saw; problems are collected, not panicked on, so one run reports them all.
#[derive(Default)]
struct Tally {
    http: u64,
    raw: u64,
    sql: u64,
    sql_ok: u64,
    aborted: u64,
    hangs: u64,
    problems: Vec<String>,
}

struct Fuzz {
    s: Server,
    http: reqwest::blocking::Client,
    tally: Mutex<Tally>,
}

impl Fuzz {
    fn problem(&self, what: String) {
        let mut t = self.tally.lock().unwrap();
        if t.problems.len() < 50 {
            t.problems.push(what);
        }
    }

    /// Sends one request and checks the answer. `basin` selects the envelope to expect.
    fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, Vec<u8>)],
        body: Vec<u8>,
        allowed: &[u16],
    ) -> Option<(u16, Value)> {
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::POST);
        let mut req = self.http.request(m.clone(), format!("{}{path}", self.s.base)).body(body.clone());
        for (k, v) in headers {
            let (Ok(k), Ok(v)) = (
                reqwest::header::HeaderName::from_bytes(k.as_bytes()),
                reqwest::header::HeaderValue::from_bytes(v),
            ) else {
                continue;
            };
            req = req.header(k, v);
        }
        let t = Instant::now();
        let res = req.send();
        self.tally.lock().unwrap().http += 1;
        let what = || format!("{m} {path} headers={headers:?} body={:?}", String::from_utf8_lossy(&body));
        let res = match res {
            Ok(r) => r,
            Err(e) if e.is_timeout() => {
                self.tally.lock().unwrap().hangs += 1;
                self.problem(format!("no answer within {BOUND:?}: {}", what()));
                return None;
            }
            Err(e) => {
                self.problem(format!("request failed ({e}): {}", what()));
                return None;
            }
        };
        let status = res.status().as_u16();
        let ctype = res.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let bytes = match res.bytes() {
            Ok(b) => b,
            // A stream that fails after its 200 header is cut on purpose (no valid end).
            Err(_) if status == 200 => {
                self.tally.lock().unwrap().aborted += 1;
                return None;
            }
            Err(e) => {
                self.problem(format!("{status} body unreadable ({e}): {}", what()));
                return None;
            }
        };
        if t.elapsed() > BOUND {
            self.tally.lock().unwrap().hangs += 1;
            self.problem(format!("answer took {:?}: {}", t.elapsed(), what()));
        }
        if !allowed.contains(&status) {
            self.problem(format!("status {status}: {} -> {}", what(), String::from_utf8_lossy(&bytes)));
        }
        if m == reqwest::Method::HEAD || ctype.contains("arrow") {
            return Some((status, Value::Null));
        }
        let v: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => {
                self.problem(format!(
                    "{status} body is not JSON: {} -> {:?}",
                    what(),
                    String::from_utf8_lossy(&bytes)
                ));
                return None;
            }
        };
        let basin = path.contains("-sql/query/");
        if status >= 400 {
            let ok = if basin && status != 404 && status != 405 {
                v["success"] == false
                    && v["errors"][0]["code"].is_u64()
                    && v["errors"][0]["message"].is_string()
            } else {
                v["error"]["code"].is_string() && v["error"]["message"].is_string()
            };
            if !ok {
                self.problem(format!("{status} without the error envelope: {} -> {v}", what()));
            }
        }
        Some((status, v))
    }

    fn alive(&self) {
        let r = self.http.get(format!("{}/_health", self.s.base)).send().expect("skiff is alive");
        assert_eq!(r.status(), 200, "skiff is healthy");
    }
}

const ROUTES: &[&str] = &["/query", "/streaming-query", BASIN, "/api/v1/accounts/a/r2-sql/query/b"];
/// Statuses a request that is not a valid query may get.
const HTTP_OK: &[u16] = &[200, 400, 401, 403, 404, 405, 413, 415, 429];
/// Statuses a query may get (504: the query timeout, 507: the memory limit).
const SQL_OK: &[u16] = &[200, 400, 403, 404, 413, 429, 504, 507];

fn auth() -> (String, Vec<u8>) {
    ("authorization".into(), format!("Bearer {TOKEN}").into_bytes())
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![Just("query".to_string()), Just("warehouse".to_string()), ".{0,8}"],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn no_request_crashes_the_server() {
    let dir = tempdir();
    demo_lake(dir.path(), 3_000);
    let args = [
        lake_args(dir.path()),
        ["--query-timeout", "10s", "--max-concurrent-queries", "2", "--max-result-rows", "20000"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    ]
    .concat();
    let fz = Fuzz {
        s: Server::start(Opts { args, ..Default::default() }),
        http: reqwest::blocking::Client::builder().timeout(BOUND).build().unwrap(),
        tally: Mutex::default(),
    };
    let n = cases();
    let started = Instant::now();
    let runner = || TestRunner::new(Config { cases: n, failure_persistence: None, ..Config::default() });

    // 1. Random bytes as the body of every query route, with and without a JSON content type.
    runner()
        .run(
            &(prop::collection::vec(any::<u8>(), 0..1500), 0..ROUTES.len(), any::<bool>()),
            |(body, r, ct)| {
                let mut h = vec![auth()];
                if ct {
                    h.push(("content-type".into(), b"application/json".to_vec()));
                }
                fz.send("POST", ROUTES[r], &h, body, HTTP_OK);
                Ok(())
            },
        )
        .unwrap();
    fz.alive();

    // 2. Random JSON bodies, sometimes with a string `query` of random text.
    runner()
        .run(&(json_value(), 0..ROUTES.len()), |(v, r)| {
            let h = vec![auth(), ("content-type".into(), b"application/json".to_vec())];
            fz.send("POST", ROUTES[r], &h, v.to_string().into_bytes(), SQL_OK_OR_HTTP);
            Ok(())
        })
        .unwrap();
    fz.alive();

    // 3. Odd headers: content types, authorization forms, request ids, junk header values.
    let header_value = prop_oneof![
        Just(b"application/json".to_vec()),
        Just(b"application/json; charset=utf-16".to_vec()),
        Just(b"text/plain".to_vec()),
        Just(b"multipart/form-data; boundary=x".to_vec()),
        Just(b"application/x-www-form-urlencoded".to_vec()),
        Just(b"application/vnd.apache.arrow.stream".to_vec()),
        Just(b"".to_vec()),
        Just(format!("Bearer {TOKEN}").into_bytes()),
        Just(b"Bearer".to_vec()),
        Just(b"Bearer  ".to_vec()),
        Just(b"bearer wrong".to_vec()),
        Just(b"Basic dXNlcjpwYXNz".to_vec()),
        prop::collection::vec(32u8..=255, 0..300),
        ".{0,200}".prop_map(String::into_bytes),
    ];
    let header_name = prop_oneof![
        Just("content-type".to_string()),
        Just("authorization".to_string()),
        Just("x-request-id".to_string()),
        Just("accept".to_string()),
        Just("content-encoding".to_string()),
        Just("transfer-encoding".to_string()),
        Just("expect".to_string()),
        "[a-z][a-z0-9-]{0,20}",
    ];
    runner()
        .run(
            &(prop::collection::vec((header_name, header_value), 0..6), 0..ROUTES.len(), any::<bool>()),
            |(headers, r, with_auth)| {
                let mut h: Vec<(String, Vec<u8>)> =
                    headers.into_iter().filter(|(k, _)| k != "transfer-encoding").collect();
                if with_auth && !h.iter().any(|(k, _)| k == "authorization") {
                    h.push(auth());
                }
                fz.send("POST", ROUTES[r], &h, br#"{"query": "SELECT 1 AS one"}"#.to_vec(), HTTP_OK);
                Ok(())
            },
        )
        .unwrap();
    fz.alive();

    // 4. Random methods and paths (percent-encoded junk, dot segments, long ones).
    let method = prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("PUT"),
        Just("DELETE"),
        Just("PATCH"),
        Just("HEAD"),
        Just("OPTIONS"),
        Just("TRACE"),
        Just("FOO")
    ];
    let segment = prop_oneof![
        Just("query".to_string()),
        Just("streaming-query".to_string()),
        Just("_health".to_string()),
        Just("api".to_string()),
        Just("v1".to_string()),
        Just("accounts".to_string()),
        Just("basin-sql".to_string()),
        Just("..".to_string()),
        Just("%00".to_string()),
        Just("%2F".to_string()),
        Just("%ZZ".to_string()),
        "[a-zA-Z0-9._~-]{0,30}",
        prop::collection::vec(any::<u8>(), 0..20)
            .prop_map(|b| b.iter().map(|x| format!("%{x:02X}")).collect::<String>()),
    ];
    runner()
        .run(&(method, prop::collection::vec(segment, 0..8), any::<bool>()), |(m, segs, q)| {
            let mut path = format!("/{}", segs.join("/"));
            if q {
                path.push_str("?x=%FF&&=");
            }
            fz.send(m, &path, &[auth()], br#"{"query": "SELECT 1"}"#.to_vec(), HTTP_OK);
            Ok(())
        })
        .unwrap();
    fz.alive();

    // 5. The Basin route: random accounts and buckets, bodies with random and generated SQL.
    runner()
        .run(&("[^/?#]{1,30}", "[^/?#]{1,30}", any::<u64>(), any::<bool>()), |(acc, bucket, seed, extra)| {
            let enc = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
            let path = format!("/api/v1/accounts/{}/basin-sql/query/{}", enc(&acc), enc(&bucket));
            let sql = SqlGen::new(seed).query();
            let mut body = json!({ "query": sql });
            if extra {
                body["warehouse"] = json!(format!("{acc}_{bucket}"));
                body["params"] = json!([1, "x"]);
            }
            fz.send("POST", &path, &[auth()], body.to_string().into_bytes(), SQL_OK);
            Ok(())
        })
        .unwrap();
    fz.alive();

    // 6. Raw HTTP/1.1 over TCP: malformed request lines, headers and lengths.
    runner()
        .run(&(raw_request(), any::<u64>()), |(bytes, _)| {
            raw(&fz, &bytes);
            Ok(())
        })
        .unwrap();
    fz.alive();

    // 7. Random SQL: generated queries over the lake, and token soup.
    let sql_cases = n * 2;
    TestRunner::new(Config { cases: sql_cases, failure_persistence: None, ..Config::default() })
        .run(&any::<u64>(), |seed| {
            let sql = SqlGen::new(seed).query();
            let route = ["/query", "/streaming-query", BASIN][(seed % 7 % 3) as usize];
            let r =
                fz.send("POST", route, &[auth()], json!({ "query": sql }).to_string().into_bytes(), SQL_OK);
            let mut t = fz.tally.lock().unwrap();
            t.sql += 1;
            if r.is_some_and(|(s, _)| s == 200) {
                t.sql_ok += 1;
            }
            Ok(())
        })
        .unwrap();
    fz.alive();

    let log = fz.s.log_text();
    let t = fz.tally.lock().unwrap();
    eprintln!(
        "fuzz: {} HTTP inputs, {} raw TCP inputs, {} SQL queries ({} answered 200, {} streams cut after 200), \
         {} crashes, {} hangs, {} problems, in {:?}",
        t.http - t.sql,
        t.raw,
        t.sql,
        t.sql_ok,
        t.aborted,
        usize::from(log.contains("panicked")),
        t.hangs,
        t.problems.len(),
        started.elapsed()
    );
    assert!(!log.contains("panicked"), "skiff panicked:\n{log}");
    assert!(t.problems.is_empty(), "problems:\n{}", t.problems.join("\n"));
    assert!(t.sql_ok > u64::from(sql_cases) / 10, "the SQL generator mostly makes errors: {}", t.sql_ok);
}

/// A JSON body may hold a valid query, so any query status is fine too.
const SQL_OK_OR_HTTP: &[u16] = &[200, 400, 401, 403, 404, 405, 413, 415, 429, 504, 507];

/// Raw request bytes: a sane request mutated, or plain junk.
fn raw_request() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        Just("POST /query HTTP/1.1".to_string()),
        Just("GET /_health HTTP/1.1".to_string()),
        Just("POST /query HTTP/1.0".to_string()),
        Just("POST /query HTTP/2.0".to_string()),
        Just("POST  /query  HTTP/1.1".to_string()),
        Just("POST http://x/query HTTP/1.1".to_string()),
        Just("POST * HTTP/1.1".to_string()),
        "[A-Z]{0,8} /[ -~]{0,40} HTTP/1\\.[0-9]",
        "[ -~]{0,80}",
    ];
    let header = prop_oneof![
        Just(format!("Authorization: Bearer {TOKEN}")),
        Just("Content-Type: application/json".to_string()),
        Just("Content-Length: 0".to_string()),
        Just("Content-Length: 5".to_string()),
        Just("Content-Length: 99999999999999999999".to_string()),
        Just("Content-Length: -1".to_string()),
        Just("Content-Length: 10\r\nContent-Length: 20".to_string()),
        Just("Transfer-Encoding: chunked".to_string()),
        Just("Transfer-Encoding: gzip, chunked".to_string()),
        Just("Expect: 100-continue".to_string()),
        Just("Connection: close".to_string()),
        Just("Host:".to_string()),
        "[!-~]{1,20}: [ -~]{0,60}",
        "[ -~]{0,60}",
    ];
    let body = prop_oneof![
        Just(br#"{"query": "SELECT 1"}"#.to_vec()),
        Just(b"5\r\n{\"que\r\n0\r\n\r\n".to_vec()),
        Just(b"zz\r\nxx\r\n".to_vec()),
        prop::collection::vec(any::<u8>(), 0..200),
    ];
    prop_oneof![
        3 => (line, prop::collection::vec(header, 0..6), body).prop_map(|(l, hs, b)| {
            let mut out = format!("{l}\r\n").into_bytes();
            for h in hs {
                out.extend(h.into_bytes());
                out.extend(b"\r\n");
            }
            out.extend(b"\r\n");
            out.extend(b);
            out
        }),
        1 => prop::collection::vec(any::<u8>(), 0..300),
    ]
}

/// Sends raw bytes, half-closes, and expects an HTTP answer or a closed connection in time.
fn raw(fz: &Fuzz, bytes: &[u8]) {
    fz.tally.lock().unwrap().raw += 1;
    let addr = fz.s.base.trim_start_matches("http://");
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(BOUND)).unwrap();
    let t = Instant::now();
    let _ = c.write_all(bytes);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => out.extend_from_slice(&buf[..k]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                fz.tally.lock().unwrap().hangs += 1;
                fz.problem(format!(
                    "raw request got no end within {:?}: {:?}",
                    t.elapsed(),
                    String::from_utf8_lossy(bytes)
                ));
                return;
            }
            Err(_) => break, // reset: the server dropped a request it could not parse
        }
    }
    let text = String::from_utf8_lossy(&out);
    // Every answer on the connection, not only the first (pipelined requests).
    for status in text.match_indices("HTTP/1.1 ").filter_map(|(i, _)| text.get(i + 9..i + 12)) {
        if status.starts_with('5') {
            fz.problem(format!(
                "raw request answered {status}: {:?} -> {text:?}",
                String::from_utf8_lossy(bytes)
            ));
        }
    }
}

/// A small random-SQL generator over the demo lake's tables: typed expressions so that most
/// queries plan, with enough odd corners (casts, division, JSON, windows) to probe errors.
struct SqlGen {
    r: StdRng,
    depth: u32,
    v2: bool,
}

const STR_COLS: &[&str] = &[
    "project_id",
    "event_id",
    "event",
    "device_id",
    "person_id",
    "user_id",
    "session_id",
    "url",
    "referrer",
    "browser",
    "os",
    "device_type",
    "country",
    "props",
    "person_props",
];
const TOKENS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP BY",
    "ORDER BY",
    "LIMIT",
    "OFFSET",
    "JOIN",
    "LEFT JOIN",
    "ON",
    "AND",
    "OR",
    "NOT",
    "(",
    ")",
    ",",
    "*",
    "=",
    "<>",
    "<",
    ">=",
    "+",
    "-",
    "/",
    "%",
    "||",
    "::",
    "CAST",
    "AS",
    "BIGINT",
    "VARCHAR",
    "DOUBLE",
    "TIMESTAMP",
    "DATE",
    "INTERVAL",
    "'1 day'",
    "NULL",
    "TRUE",
    "1",
    "0",
    "-1",
    "1e308",
    "9223372036854775807",
    "'x'",
    "''",
    "'{\"a\":1}'",
    "glass.events",
    "glass.identities",
    "glass.events_v2",
    "events",
    "device_id",
    "props",
    "timestamp",
    "count(*)",
    "sum",
    "avg",
    "OVER",
    "PARTITION BY",
    "ROWS",
    "UNBOUNDED PRECEDING",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "WITH",
    "UNION ALL",
    "DISTINCT",
    "EXPLAIN",
    "DROP",
    "TABLE",
    "INSERT",
    "INTO",
    "VALUES",
    "CREATE",
    "COPY",
    "TO",
    "'/tmp/x'",
    "SET",
    "SHOW",
    "DESCRIBE",
    ";",
    "\"",
    "`",
    "$1",
    "?",
    "[",
    "]",
    "{",
    "}",
    "json_get_str",
    "json_get",
    "->",
    "->>",
    "ILIKE",
    "'%a%'",
    "IN",
    "BETWEEN",
    "IS",
    "NULLS FIRST",
    "unnest",
    "make_array",
    "named_struct",
    "generate_series",
    "information_schema.tables",
    "lake.glass.events",
    "QUALIFY",
    "FILTER",
    "ARRAY",
    "STRUCT",
    "\\",
    "--",
    "/*",
];

impl SqlGen {
    fn new(seed: u64) -> Self {
        Self { r: StdRng::seed_from_u64(seed), depth: 0, v2: false }
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.r.random_range(0..xs.len())]
    }

    fn chance(&mut self, p: f64) -> bool {
        self.r.random_bool(p)
    }

    fn query(&mut self) -> String {
        match self.r.random_range(0..20) {
            0 | 1 => self.soup(),
            2 => self.odd_values(),
            3 => format!("WITH q AS ({}) SELECT * FROM q LIMIT 5", self.select()),
            4 => format!("{} UNION ALL {}", self.simple_count(), self.simple_count()),
            _ => self.select(),
        }
    }

    fn soup(&mut self) -> String {
        let n = self.r.random_range(1..25);
        let mut toks: Vec<&str> = (0..n).map(|_| self.pick(TOKENS)).collect();
        if self.chance(0.7) {
            toks.insert(0, "SELECT");
        }
        toks.join(" ")
    }

    /// Values of every type the encoders must handle.
    fn odd_values(&mut self) -> String {
        let v = self.pick(&[
            "make_array(1, 2, NULL)",
            "named_struct('a', 1, 'b', 'x')",
            "make_array(named_struct('k', 'v'))",
            "CAST(1.5 AS DECIMAL(38, 10))",
            "CAST(-12345678901234567890.123 AS DECIMAL(38, 3))",
            "CAST('NaN' AS DOUBLE)",
            "1.0 / 0.0",
            "-(1.0 / 0.0)",
            "CAST('x\\u0000y' AS VARCHAR)",
            "'\\\"quoted\\\" \u{2603} \t'",
            "CAST('abc' AS BYTEA)",
            "INTERVAL '1 year 2 months 3 days 4 hours'",
            "CAST('2026-08-01' AS DATE)",
            "CAST('12:34:56' AS TIME)",
            "arrow_cast(1, 'Duration(Second)')",
            "arrow_cast(1, 'Int8')",
            "arrow_cast(1, 'UInt64')",
            "arrow_cast(1.5, 'Float16')",
            "arrow_cast('a', 'Dictionary(Int32, Utf8)')",
            "arrow_cast('a', 'LargeUtf8')",
            "arrow_cast(1, 'Timestamp(Nanosecond, Some(\"+05:00\"))')",
            "map(['a', 'b'], [1, 2])",
            "NULL",
            "9223372036854775807 + 1",
            "CAST(9223372036854775807 AS DOUBLE)",
            "to_timestamp(-99999999999)",
            "json_get(props, 'amount')",
            "json_get_json(props, 'items')",
            "json_as_text(props, 'q')",
            "json_length(props)",
            "json_contains(props, 'plan')",
            "props -> 'amount'",
            "props ->> 'plan'",
        ]);
        let t = self.table();
        format!("SELECT {v} AS v, count(*) OVER () AS n FROM {t} LIMIT {}", self.r.random_range(0..4))
    }

    fn simple_count(&mut self) -> String {
        let t = self.table();
        format!("SELECT count(*) AS n FROM {t}")
    }

    fn table(&mut self) -> &'static str {
        let t = self.pick(&["glass.events", "glass.events_v2", "glass.events_v1", "glass.identities"]);
        self.v2 = t == "glass.events_v2";
        t
    }

    fn select(&mut self) -> String {
        let t = self.table();
        let identities = t == "glass.identities";
        let join = !identities && self.chance(0.2);
        let from = if join {
            format!("{t} AS a JOIN glass.identities AS i ON a.device_id = i.device_id")
        } else {
            format!("{t} AS a")
        };
        let s_cols: Vec<&str> = if identities {
            vec!["project_id", "device_id", "person_id", "user_id"]
        } else {
            STR_COLS.to_vec()
        };
        let mut sql = String::from("SELECT ");
        let mode = self.r.random_range(0..10);
        let mut group = Vec::new();
        let items: Vec<String> = if mode < 4 {
            // Aggregation.
            let g = self.r.random_range(0..3);
            for _ in 0..g {
                group.push(self.str_expr(&s_cols));
            }
            let mut items: Vec<String> = group.clone();
            for _ in 0..self.r.random_range(1..4) {
                items.push(self.aggregate(&s_cols));
            }
            items
        } else if mode < 6 {
            // Windows.
            let mut items = vec![self.str_expr(&s_cols)];
            items.push(self.window(&s_cols));
            items
        } else {
            (0..self.r.random_range(1..5)).map(|_| self.any_expr(&s_cols)).collect()
        };
        sql.push_str(
            &items.iter().enumerate().map(|(i, e)| format!("{e} AS c{i}")).collect::<Vec<_>>().join(", "),
        );
        sql.push_str(&format!(" FROM {from}"));
        if join && self.chance(0.5) {
            sql.push_str(" AND i.person_id IS NOT NULL");
        }
        if self.chance(0.6) {
            sql.push_str(&format!(" WHERE {}", self.bool_expr(&s_cols)));
        }
        if !group.is_empty() {
            let idx: Vec<String> = (1..=group.len()).map(|i| i.to_string()).collect();
            sql.push_str(&format!(" GROUP BY {}", idx.join(", ")));
            if self.chance(0.3) {
                sql.push_str(" HAVING count(*) > 1");
            }
        }
        if self.chance(0.7) {
            let n = items.len();
            let dir = self.pick(&["", " DESC", " ASC NULLS FIRST", " DESC NULLS LAST"]);
            sql.push_str(&format!(" ORDER BY {}{dir}", self.r.random_range(1..=n)));
        }
        if self.chance(0.85) {
            sql.push_str(&format!(" LIMIT {}", self.pick(&["0", "1", "7", "50", "1000"])));
            if self.chance(0.2) {
                sql.push_str(" OFFSET 3");
            }
        }
        sql
    }

    fn col(&mut self, cols: &[&str]) -> String {
        format!("a.{}", self.pick(cols))
    }

    fn str_expr(&mut self, cols: &[&str]) -> String {
        self.depth += 1;
        let deep = self.depth > 3;
        let e = match if deep { 0 } else { self.r.random_range(0..14) } {
            0 | 1 | 2 => self.col(cols),
            3 => format!("lower({})", self.str_expr(cols)),
            4 => format!(
                "substr({}, {}, {})",
                self.str_expr(cols),
                self.r.random_range(-2..5),
                self.r.random_range(-1..9)
            ),
            5 => format!("concat({}, '-', {})", self.str_expr(cols), self.str_expr(cols)),
            6 => format!("coalesce({}, 'none')", self.str_expr(cols)),
            7 => {
                let k = self.pick(&["amount", "plan", "q", "tag", "$title", "missing", ""]);
                format!("json_get_str(a.props, '{k}')")
            }
            8 => format!("CAST({} AS VARCHAR)", self.num_expr(cols)),
            9 => format!("split_part({}, '/', {})", self.str_expr(cols), self.r.random_range(-1..4)),
            10 => format!(
                "CASE WHEN {} THEN {} ELSE {} END",
                self.bool_expr(cols),
                self.str_expr(cols),
                self.str_expr(cols)
            ),
            11 => format!("regexp_replace({}, '[0-9]+', 'N')", self.str_expr(cols)),
            12 => format!("{} || {}", self.str_expr(cols), self.str_expr(cols)),
            _ => format!("upper(trim({}))", self.str_expr(cols)),
        };
        self.depth -= 1;
        e
    }

    fn num_expr(&mut self, cols: &[&str]) -> String {
        self.depth += 1;
        let deep = self.depth > 3;
        let e = match if deep { 0 } else { self.r.random_range(0..16) } {
            0 => format!("length({})", self.col(cols)),
            1 => self.r.random_range(-5..100).to_string(),
            2 => format!("{:.3}", self.r.random_range(-10.0..10.0)),
            3 => format!("({} + {})", self.num_expr(cols), self.num_expr(cols)),
            4 => format!("({} * {})", self.num_expr(cols), self.num_expr(cols)),
            5 => format!("({} / {})", self.num_expr(cols), self.num_expr(cols)),
            6 => format!("({} % {})", self.num_expr(cols), self.num_expr(cols)),
            7 => format!("abs({})", self.num_expr(cols)),
            8 => format!("round({}, {})", self.num_expr(cols), self.r.random_range(0..4)),
            9 => "json_get_int(a.props, 'items')".into(),
            10 => "json_get_float(a.props, 'amount')".into(),
            11 => format!(
                "date_part('{}', {})",
                self.pick(&["hour", "day", "dow", "epoch", "week"]),
                self.ts_expr()
            ),
            12 => format!("CAST({} AS {})", self.str_expr(cols), self.pick(&["BIGINT", "DOUBLE", "INT"])),
            13 if self.v2 => "a.revenue".into(),
            14 => format!("TRY_CAST({} AS BIGINT)", self.str_expr(cols)),
            _ => format!("sqrt(abs({}))", self.num_expr(cols)),
        };
        self.depth -= 1;
        e
    }

    fn ts_expr(&mut self) -> String {
        match self.r.random_range(0..6) {
            0 => "a.timestamp".into(),
            1 => format!("date_trunc('{}', a.timestamp)", self.pick(&["hour", "day", "week", "month"])),
            2 => "a.timestamp + INTERVAL '1 day'".into(),
            3 => "to_timestamp(1785542400)".into(),
            4 => "CAST('2026-08-02 00:00:00' AS TIMESTAMP)".into(),
            _ => "a.__ingest_ts".into(),
        }
    }

    fn bool_expr(&mut self, cols: &[&str]) -> String {
        self.depth += 1;
        let deep = self.depth > 3;
        let e = match if deep { 0 } else { self.r.random_range(0..9) } {
            0 => format!("{} = '{}'", self.col(cols), self.pick(&["purchase", "proj_alpha", "US", "x"])),
            1 => format!("{} > {}", self.num_expr(cols), self.num_expr(cols)),
            2 => format!("{} LIKE '{}'", self.str_expr(cols), self.pick(&["%a%", "p\\_%", "%", ""])),
            3 => format!("{} IS NULL", self.col(cols)),
            4 => format!("({} AND {})", self.bool_expr(cols), self.bool_expr(cols)),
            5 => format!("NOT ({} OR {})", self.bool_expr(cols), self.bool_expr(cols)),
            6 => format!("{} IN ('a', 'US', 'Chrome')", self.str_expr(cols)),
            7 => format!("{} BETWEEN 0 AND {}", self.num_expr(cols), self.r.random_range(0..50)),
            _ => format!(
                "{} >= TIMESTAMP '2026-08-{:02} 00:00:00'",
                self.ts_expr(),
                self.r.random_range(1..30)
            ),
        };
        self.depth -= 1;
        e
    }

    fn aggregate(&mut self, cols: &[&str]) -> String {
        match self.r.random_range(0..11) {
            0 => "count(*)".into(),
            1 => format!("count(DISTINCT {})", self.str_expr(cols)),
            2 => format!("sum({})", self.num_expr(cols)),
            3 => format!("avg({})", self.num_expr(cols)),
            4 => format!("min({})", self.any_expr(cols)),
            5 => format!("max({})", self.any_expr(cols)),
            6 => format!("approx_distinct({})", self.str_expr(cols)),
            7 => format!("median({})", self.num_expr(cols)),
            8 => format!("array_agg({}) FILTER (WHERE {})", self.col(cols), self.bool_expr(cols)),
            9 => format!("stddev({})", self.num_expr(cols)),
            _ => format!("approx_percentile_cont({}, 0.5)", self.num_expr(cols)),
        }
    }

    fn window(&mut self, cols: &[&str]) -> String {
        let part = self.col(cols);
        let f = match self.r.random_range(0..6) {
            0 => "row_number()".to_string(),
            1 => format!("lag({})", self.col(cols)),
            2 => format!("lead({}, 2)", self.col(cols)),
            3 => format!("sum({})", self.num_expr(cols)),
            4 => "rank()".to_string(),
            _ => format!("first_value({})", self.col(cols)),
        };
        format!("{f} OVER (PARTITION BY {part} ORDER BY a.timestamp, a.device_id)")
    }

    fn any_expr(&mut self, cols: &[&str]) -> String {
        match self.r.random_range(0..4) {
            0 => self.num_expr(cols),
            1 => self.ts_expr(),
            _ => self.str_expr(cols),
        }
    }
}
