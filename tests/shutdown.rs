//! SIGTERM and SIGINT: skiff stops taking queries, lets running ones finish within
//! `--shutdown-grace`, cancels the rest, and exits 0; `/_health` says `draining` meanwhile.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// A result far bigger than the socket buffers: while its client does not read, its
/// query cannot finish.
const ROWS: u64 = 2_000_000;

fn serve(flags: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempdir();
    demo_lake(dir.path(), 1_000);
    let args = [lake_args(dir.path()), flags.iter().map(|s| s.to_string()).collect()].concat();
    let s = Server::start(Opts { args, ..Default::default() });
    (dir, s)
}

fn hold_open(s: &Server) -> reqwest::blocking::Response {
    let r = s.post(
        "/query",
        json!({ "query": format!("SELECT value FROM generate_series(1, {ROWS})") }).to_string(),
    );
    assert_eq!(r.status(), 200);
    r
}

fn health(s: &Server) -> (u16, Value) {
    let r = client().get(format!("{}/_health", s.base)).send().unwrap();
    (r.status().as_u16(), r.json().unwrap())
}

fn running(s: &Server) -> usize {
    s.rows("SELECT count(*) AS n FROM system.queries WHERE state = 'running'")[0]["n"].as_u64().unwrap()
        as usize
}

#[test]
fn sigterm_drains_running_queries_then_exits_0() {
    let (_d, mut s) = serve(&["--shutdown-grace", "60s"]);
    let mut held = hold_open(&s);
    // The held query and the one counting.
    assert_eq!(running(&s), 2);

    s.signal("TERM");
    eventually(10, || (health(&s) == (503, json!({"status": "draining"}))).then_some(()));
    // New queries are refused, clearly and retryably, on every route.
    let r = s.post("/query", r#"{"query": "SELECT 1"}"#);
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().unwrap();
    assert_eq!(v["error"]["code"], "shutting_down", "{v}");
    let r = s.post("/api/v1/accounts/a/basin-sql/query/b", r#"{"query": "SELECT 1"}"#);
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().unwrap()["errors"][0]["code"], 80001);
    // The running query is not cut: skiff waits for it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(s.wait_exit(Duration::ZERO).is_none(), "skiff exited with a query running");

    let mut body = String::new();
    held.read_to_string(&mut body).expect("the held result arrives whole");
    let rows: Vec<Value> = serde_json::from_str(&body).expect("a complete JSON array");
    assert_eq!(rows.len() as u64, ROWS);
    assert_eq!(rows.last().unwrap()["value"], ROWS);

    let status = s.wait_exit(Duration::from_secs(10)).expect("skiff exits once the query is done");
    assert_eq!(status.code(), Some(0), "{}", s.log_text());
    let log = s.log_text();
    assert!(log.contains("SIGTERM received") && log.contains("skiff stopped"), "{log}");
    assert!(log.contains("request_id") && log.contains("outcome=\"ok\""), "{log}");
}

#[test]
fn queries_outliving_the_grace_period_are_cancelled_and_skiff_exits_0() {
    let (_d, mut s) = serve(&["--shutdown-grace", "1s", "--query-timeout", "10m"]);
    let mut held = hold_open(&s);
    // A query still computing its first row when the grace period ends.
    let base = s.base.clone();
    let computing = std::thread::spawn(move || {
        let r = client()
            .post(format!("{base}/query"))
            .bearer_auth(TOKEN)
            .body(json!({"query": "SELECT count(*) FROM generate_series(1, 1000000000000)"}).to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    });
    eventually(10, || (running(&s) == 3).then_some(()));

    let t = Instant::now();
    s.signal("TERM");
    let status = s.wait_exit(Duration::from_secs(8)).expect("skiff exits soon after the grace period");
    let took = t.elapsed();
    assert_eq!(status.code(), Some(0), "{}", s.log_text());
    assert!(took >= Duration::from_millis(900), "the grace period was not given: {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // The one that had not started answering gets a real error.
    let (code, v) = computing.join().unwrap();
    assert_eq!(code, 503, "{v}");
    assert_eq!(v["error"]["code"], "shutting_down");
    assert!(v["error"]["message"].as_str().unwrap().contains("--shutdown-grace"), "{v}");
    // The one mid-stream is cut as a failure, never as a clean shorter result.
    let mut body = Vec::new();
    let read = held.read_to_end(&mut body);
    assert!(read.is_err(), "a cancelled stream must not end cleanly ({} bytes read)", body.len());
    assert!(serde_json::from_slice::<Vec<Value>>(&body).is_err());
    let log = s.log_text();
    assert!(log.contains("grace period over"), "{log}");
}

#[test]
fn a_second_signal_skips_the_rest_of_the_grace_period() {
    let dir = tempdir();
    demo_lake(dir.path(), 100);
    let mut s = Server::start(Opts {
        args: lake_args(dir.path()),
        env: vec![("SKIFF_SHUTDOWN_GRACE", "10m".into())],
        ..Default::default()
    });
    let mut held = hold_open(&s);
    s.signal("TERM");
    eventually(10, || (health(&s).0 == 503).then_some(()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.wait_exit(Duration::ZERO).is_none(), "still waiting for the held query");
    let t = Instant::now();
    s.signal("INT");
    let status = s.wait_exit(Duration::from_secs(8)).expect("exits after the second signal");
    assert_eq!(status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(held.read_to_end(&mut Vec::new()).is_err(), "the cancelled stream is cut as a failure");
    assert!(s.log_text().contains("second signal"));
}

#[test]
fn sigint_with_nothing_running_exits_at_once() {
    let (_d, mut s) = serve(&["--shutdown-grace", "60s"]);
    assert_eq!(s.rows("SELECT 1 AS one")[0]["one"], 1);
    let t = Instant::now();
    s.signal("INT");
    let status = s.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_eq!(status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn shutdown_grace_is_validated() {
    let out =
        std::process::Command::new(skiff_bin()).args(["serve", "--shutdown-grace", "soon"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("shutdown-grace"));
}
