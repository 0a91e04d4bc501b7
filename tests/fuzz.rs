//! No request can crash the process: randomised inputs against the live binary over real
//! HTTP and raw TCP: random bytes and JSON bodies, odd headers and content types, random
//! methods and paths, the Basin route, and a bounded random-SQL run over the demo lake
//! (expressions, functions incl. JSON ones, casts, joins, GROUP BY, ORDER BY, LIMIT,
//! windows) plus token soup.
//!
//! For every input: an answer arrives within a bound, its status is an expected one (never
//! 500), an error body is the JSON error envelope of its route, and at the end the server is
//! alive and its log has no panic. Inputs come from seeded generators (`rand`): case i of a
//! category uses seed `SKIFF_FUZZ_SEED + i`, so a reported case can be replayed.
//! `SKIFF_FUZZ_CASES` (default 150) sets the cases per category; the counts are printed.
//! (proptest was tried: as a dev-dependency its features force a rebuild of all of DataFusion
//! in the test profile, ~45 minutes on the 2-core build machine, so it is not used.)

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const BASIN: &str = "/api/v1/accounts/acc/basin-sql/query/bucket";
/// A response must arrive within this (the server's query timeout is 10 s).
const BOUND: Duration = Duration::from_secs(20);

fn cases() -> u64 {
    std::env::var("SKIFF_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(150)
}

fn base_seed() -> u64 {
    std::env::var("SKIFF_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(20261201)
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

/// Small random-input helpers over a seeded generator.
struct R(StdRng);

impl R {
    fn new(seed: u64) -> Self {
        Self(StdRng::seed_from_u64(seed))
    }
    fn n(&mut self, hi: usize) -> usize {
        self.0.random_range(0..hi.max(1))
    }
    fn coin(&mut self) -> bool {
        self.0.random_bool(0.5)
    }
    fn pick<'a, T: ?Sized>(&mut self, xs: &[&'a T]) -> &'a T {
        xs[self.n(xs.len())]
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = self.n(max + 1);
        (0..len).map(|_| self.0.random::<u8>()).collect()
    }
    /// Text from printable ASCII, some non-ASCII and control characters.
    fn text(&mut self, max: usize) -> String {
        let len = self.n(max + 1);
        (0..len)
            .map(|_| match self.n(10) {
                0 => char::from_u32(self.0.random_range(0x80..0x3000)).unwrap_or('?'),
                1 => char::from(self.0.random_range(0u8..32)),
                _ => char::from(self.0.random_range(32u8..127)),
            })
            .collect()
    }
    /// A token made of the given characters.
    fn word(&mut self, chars: &[u8], min: usize, max: usize) -> String {
        let len = min + self.n(max - min + 1);
        (0..len).map(|_| chars[self.n(chars.len())] as char).collect()
    }
    fn json(&mut self, depth: u32) -> Value {
        match if depth >= 4 { self.n(5) } else { self.n(7) } {
            0 => Value::Null,
            1 => json!(self.coin()),
            2 => json!(self.0.random::<i64>()),
            3 => json!(self.0.random::<f64>() * 1e6),
            4 => json!(self.text(40)),
            5 => Value::Array((0..self.n(6)).map(|_| self.json(depth + 1)).collect()),
            _ => {
                let mut m = serde_json::Map::new();
                for _ in 0..self.n(5) {
                    let k = match self.n(3) {
                        0 => "query".to_string(),
                        1 => "warehouse".to_string(),
                        _ => self.text(8),
                    };
                    m.insert(k, self.json(depth + 1));
                }
                Value::Object(m)
            }
        }
    }
}

const LOWER: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
const PATHCH: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-";

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
    let seed = base_seed();
    let started = Instant::now();
    let json_ct = || ("content-type".to_string(), b"application/json".to_vec());

    // 1. Random bytes as the body of every query route, with and without a JSON content type.
    for i in 0..n {
        let mut r = R::new(seed + i);
        let mut h = vec![auth()];
        if r.coin() {
            h.push(json_ct());
        }
        let route = r.pick(ROUTES);
        let body = r.bytes(1500);
        fz.send("POST", route, &h, body, HTTP_OK);
    }
    fz.alive();

    // 2. Random JSON bodies, sometimes with a string `query` of random text.
    for i in 0..n {
        let mut r = R::new(seed + 100_000 + i);
        let route = r.pick(ROUTES);
        let v = if r.coin() { r.json(0) } else { json!({ "query": r.text(60) }) };
        fz.send("POST", route, &[auth(), json_ct()], v.to_string().into_bytes(), SQL_OK_OR_HTTP);
    }
    fz.alive();

    // 3. Odd headers: content types, authorization forms, request ids, junk header values.
    let token_header = format!("Bearer {TOKEN}");
    for i in 0..n {
        let mut r = R::new(seed + 200_000 + i);
        let mut h: Vec<(String, Vec<u8>)> = Vec::new();
        for _ in 0..r.n(6) {
            let name = match r.n(8) {
                7 => r.word(LOWER, 1, 20),
                k => [
                    "content-type",
                    "authorization",
                    "x-request-id",
                    "accept",
                    "content-encoding",
                    "expect",
                    "accept-encoding",
                ][k]
                    .to_string(),
            };
            let value = match r.n(14) {
                12 => r.bytes(300).into_iter().map(|b| b.max(32)).collect(),
                13 => r.text(200).into_bytes(),
                k => [
                    "application/json",
                    "application/json; charset=utf-16",
                    "text/plain",
                    "multipart/form-data; boundary=x",
                    "application/x-www-form-urlencoded",
                    "application/vnd.apache.arrow.stream",
                    "",
                    token_header.as_str(),
                    "Bearer",
                    "Bearer  ",
                    "bearer wrong",
                    "gzip",
                ][k]
                    .as_bytes()
                    .to_vec(),
            };
            h.push((name, value));
        }
        if r.coin() && !h.iter().any(|(k, _)| k == "authorization") {
            h.push(auth());
        }
        let route = r.pick(ROUTES);
        fz.send("POST", route, &h, br#"{"query": "SELECT 1 AS one"}"#.to_vec(), HTTP_OK);
    }
    fz.alive();

    // 4. Random methods and paths (percent-encoded junk, dot segments, long ones).
    for i in 0..n {
        let mut r = R::new(seed + 300_000 + i);
        let m = r.pick(&["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"]);
        let segs: Vec<String> = (0..r.n(8))
            .map(|_| match r.n(13) {
                0..=6 => r
                    .pick(&["query", "streaming-query", "_health", "api", "v1", "accounts", "basin-sql"])
                    .to_string(),
                7 => "..".into(),
                8 => "%00".into(),
                9 => "%2F".into(),
                10 => "%ZZ".into(),
                11 => r.word(PATHCH, 0, 30),
                _ => r.bytes(20).iter().map(|x| format!("%{x:02X}")).collect(),
            })
            .collect();
        let mut path = format!("/{}", segs.join("/"));
        if r.coin() {
            path.push_str("?x=%FF&&=");
        }
        fz.send(m, &path, &[auth()], br#"{"query": "SELECT 1"}"#.to_vec(), HTTP_OK);
    }
    fz.alive();

    // 5. The Basin route: random accounts and buckets, bodies with generated SQL.
    for i in 0..n {
        let mut r = R::new(seed + 400_000 + i);
        let enc = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
        let (acc, bucket) = (r.text(30), r.text(30));
        let (acc, bucket) = (
            if acc.is_empty() { "a".into() } else { acc },
            if bucket.is_empty() { "b".into() } else { bucket },
        );
        let path = format!("/api/v1/accounts/{}/basin-sql/query/{}", enc(&acc), enc(&bucket));
        let mut body = json!({ "query": SqlGen::new(seed + 400_000 + i).query() });
        if r.coin() {
            body["warehouse"] = json!(format!("{acc}_{bucket}"));
            body["params"] = json!([1, "x"]);
        }
        fz.send("POST", &path, &[auth()], body.to_string().into_bytes(), SQL_OK);
    }
    fz.alive();

    // 6. Raw HTTP/1.1 over TCP: malformed request lines, headers and lengths.
    for i in 0..n {
        let bytes = raw_request(&mut R::new(seed + 500_000 + i));
        raw(&fz, &bytes);
    }
    fz.alive();

    // 7. Random SQL: generated queries over the lake, and token soup, on every route.
    let sql_cases = n * 2;
    for i in 0..sql_cases {
        let s = seed + 600_000 + i;
        let sql = SqlGen::new(s).query();
        let route = ["/query", "/streaming-query", BASIN][(i % 3) as usize];
        let r = fz.send("POST", route, &[auth()], json!({ "query": sql }).to_string().into_bytes(), SQL_OK);
        let mut t = fz.tally.lock().unwrap();
        t.sql += 1;
        if r.is_some_and(|(st, _)| st == 200) {
            t.sql_ok += 1;
        }
    }
    fz.alive();

    let log = fz.s.log_text();
    let t = fz.tally.lock().unwrap();
    eprintln!(
        "fuzz: {} HTTP inputs, {} raw TCP inputs, {} SQL queries ({} answered 200, {} streams cut after 200), \
         {} crashes, {} hangs, {} problems, in {:?} (SKIFF_FUZZ_CASES={n}, SKIFF_FUZZ_SEED={seed})",
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
    assert!(t.sql_ok > sql_cases / 10, "the SQL generator mostly makes errors: {}", t.sql_ok);
}

/// A JSON body may hold a valid query, so any query status is fine too.
const SQL_OK_OR_HTTP: &[u16] = &[200, 400, 401, 403, 404, 405, 413, 415, 429, 504, 507];

/// Raw request bytes: a sane request mutated, or plain junk.
fn raw_request(r: &mut R) -> Vec<u8> {
    if r.n(4) == 0 {
        return r.bytes(300);
    }
    let line = match r.n(9) {
        7 => format!("{} /{} HTTP/1.{}", r.word(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 0, 8), r.text(40), r.n(10)),
        8 => r.text(80),
        k => [
            "POST /query HTTP/1.1",
            "GET /_health HTTP/1.1",
            "POST /query HTTP/1.0",
            "POST /query HTTP/2.0",
            "POST  /query  HTTP/1.1",
            "POST http://x/query HTTP/1.1",
            "POST * HTTP/1.1",
        ][k]
            .to_string(),
    };
    let mut out = format!("{line}\r\n").into_bytes();
    for _ in 0..r.n(7) {
        let h = match r.n(14) {
            12 => format!("{}: {}", r.word(PATHCH, 1, 20), r.text(60)),
            13 => r.text(60),
            k => [
                format!("Authorization: Bearer {TOKEN}"),
                "Content-Type: application/json".into(),
                "Content-Length: 0".into(),
                "Content-Length: 5".into(),
                "Content-Length: 99999999999999999999".into(),
                "Content-Length: -1".into(),
                "Content-Length: 10\r\nContent-Length: 20".into(),
                "Transfer-Encoding: chunked".into(),
                "Transfer-Encoding: gzip, chunked".into(),
                "Expect: 100-continue".into(),
                "Connection: close".into(),
                "Host:".into(),
            ][k]
                .clone(),
        };
        out.extend(h.into_bytes());
        out.extend(b"\r\n");
    }
    out.extend(b"\r\n");
    match r.n(4) {
        0 => out.extend(br#"{"query": "SELECT 1"}"#),
        1 => out.extend(b"5\r\n{\"que\r\n0\r\n\r\n"),
        2 => out.extend(b"zz\r\nxx\r\n"),
        _ => out.extend(r.bytes(200)),
    }
    out
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
            0..=2 => self.col(cols),
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
