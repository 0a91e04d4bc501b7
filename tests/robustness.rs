//! No single query or client takes the server down: values, plans and grouping sets beyond
//! their bounds are refused before they allocate; clients that stop reading, never finish a
//! request or hold idle connections are let go; spill files have a cap. Each against the real
//! binary, which must still answer afterwards.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

fn serve(events: u64, flags: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempdir();
    demo_lake(dir.path(), events);
    let args = [lake_args(dir.path()), flags.iter().map(|s| s.to_string()).collect()].concat();
    let s = Server::start(Opts { args, ..Default::default() });
    (dir, s)
}

fn healthy(s: &Server) {
    let r = client().get(format!("{}/_health", s.base)).send().expect("/_health answers");
    assert_eq!(r.status(), 200);
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"], 2_000);
}

/// Each of these aborted the process or got it OOM-killed in seconds: now a 400 naming the
/// setting, in well under a second, and the server goes on.
#[test]
fn values_plans_and_grouping_sets_beyond_their_bounds_are_refused() {
    let (_d, s) = serve(2_000, &["--memory-limit", "256MiB"]);
    let doubling: String = (1..=22)
        .map(|i| format!(", c{i} AS (SELECT x FROM c{} UNION ALL SELECT x FROM c{})", i - 1, i - 1))
        .collect();
    let linear: String = (1..8_000).map(|i| format!(", c{i} AS (SELECT x FROM c{})", i - 1)).collect();
    let from: Vec<String> = (0..1_000).map(|i| format!("(VALUES (1)) AS v{i}")).collect();
    // Each CTE doubles the one before: 2^40 events' worth of bytes.
    let concat: String =
        (1..=40).map(|i| format!(", c{i} AS (SELECT s || s AS s FROM c{})", i - 1)).collect();
    let cube: Vec<String> = (0..24).map(|i| format!("(event_id || '{i}')")).collect();
    let cases = [
        ("SELECT cardinality(array_repeat(1, 1000000000000))".to_string(), "--max-array-length"),
        (
            "SELECT cardinality(array_repeat(event, 300000000)) FROM glass.events".to_string(),
            "--max-array-length",
        ),
        ("SELECT cardinality(range(1000000000))".to_string(), "--max-array-length"),
        ("SELECT length(repeat('x', 2000000000))".to_string(), "--max-value-bytes"),
        ("SELECT length(lpad(event, 1000000000, 'y')) FROM glass.events".to_string(), "--max-value-bytes"),
        (
            format!("SELECT count(*) FROM glass.events GROUP BY CUBE ({})", cube.join(", ")),
            "--max-grouping-sets",
        ),
        (format!("WITH c0 AS (SELECT 1 AS x){doubling} SELECT count(*) FROM c22"), "--max-plan-nodes"),
        (format!("WITH c0 AS (SELECT 1 AS x){linear} SELECT * FROM c7999"), "8000 CTEs"),
        (format!("SELECT 1 FROM {}", from.join(", ")), "at most 256"),
        (
            format!(
                "WITH c0 AS (SELECT event AS s FROM glass.events){concat} SELECT max(length(s)) FROM c40"
            ),
            "|| would return",
        ),
    ];
    for (sql, says) in &cases {
        let t = Instant::now();
        let (status, v) = s.query(sql);
        let message = v["error"]["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(status, 400, "{}: {v}", &sql[..sql.len().min(120)]);
        assert!(message.contains(says), "{}: {message}", &sql[..sql.len().min(120)]);
        assert!(t.elapsed() < Duration::from_secs(10), "refused in {:?}", t.elapsed());
    }
    healthy(&s);
    // Within the bounds, the same functions answer.
    assert_eq!(s.rows("SELECT cardinality(array_repeat(1, 1000)) AS n")[0]["n"], 1000);
    assert_eq!(s.rows("SELECT length(repeat('x', 100000)) AS n")[0]["n"], 100_000);
}

/// Reads a response's status line from a raw connection.
fn status_line(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).trim().to_string()
}

fn raw_query(s: &Server, sql: &str) -> TcpStream {
    let addr = s.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    let body = json!({ "query": sql }).to_string();
    write!(
        stream,
        "POST /query HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

/// Closed by the server: a read gives end of stream or an error (a reset) within `secs`.
fn closed_within(stream: &mut TcpStream, secs: u64) -> bool {
    stream.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a 408 before closing is fine
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn clients_that_stop_reading_or_never_finish_are_let_go() {
    let (_d, s) = serve(
        2_000,
        &[
            "--max-concurrent-queries",
            "2",
            "--max-queued-queries",
            "0",
            "--query-timeout",
            "120s",
            "--write-timeout",
            "2s",
            "--header-timeout",
            "1s",
            "--idle-timeout",
            "3s",
            "--max-connections",
            "64",
        ],
    );
    // Two clients take both slots with large results, read the status line and stop reading.
    let big = "SELECT value, repeat('x', 200) AS pad FROM generate_series(1, 20000000)";
    let mut stalled: Vec<TcpStream> = (0..2).map(|_| raw_query(&s, big)).collect();
    for stream in &mut stalled {
        assert!(status_line(stream).contains("200"), "the query started");
    }
    // While they hold the slots, others are told so; once their writes stall past
    // --write-timeout, the slots are free again.
    let t = Instant::now();
    eventually(30, || (s.query("SELECT 1 AS one").0 == 200).then_some(()));
    assert!(t.elapsed() < Duration::from_secs(25), "freed after {:?}", t.elapsed());
    // Told nothing more (it reads nothing), the client's log line says why its query ended
    // once the connection goes (when the client closes, or after --idle-timeout).
    drop(stalled);
    let line =
        eventually(10, || s.log_text().lines().find(|l| l.contains("client_stalled")).map(String::from));
    assert!(line.contains("/query"), "{line}");

    // Half-sent requests are closed after --header-timeout.
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut half: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            c.write_all(b"POST /query HTTP/1.1\r\nHost: x\r\n").unwrap();
            c
        })
        .collect();
    for c in &mut half {
        assert!(closed_within(c, 10), "a half-sent request was kept open");
    }

    // More idle connections than --max-connections: the idlest are let go and new ones still
    // get answers, /_health included.
    let idle: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let r = client().get(format!("{}/_health", s.base)).send().expect("/_health answers at the cap");
    assert_eq!(r.status(), 200);
    assert_eq!(s.rows("SELECT 41 + 1 AS n")[0]["n"], 42);
    drop(idle);
}

#[test]
fn spill_files_stop_at_their_cap() {
    let dir = tempdir();
    let spill = dir.path().join("spill");
    std::fs::create_dir_all(&spill).unwrap();
    let spill_dir = spill.display().to_string();
    let (_d, s) =
        serve(200_000, &["--memory-limit", "24MiB", "--max-spill-bytes", "2MiB", "--spill-dir", &spill_dir]);
    let (status, v) = s.query("SELECT * FROM glass.events ORDER BY props DESC, event_id LIMIT 199000");
    assert_eq!(status, 507, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("--max-spill-bytes"), "{message}");
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"], 200_000);
}
