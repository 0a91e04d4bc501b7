//! Limits that keep one query, or many, from taking the server down: the query timeout,
//! admission (concurrency and queue), the memory pool, and result caps, on every HTTP route.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const BASIN: &str = "/api/v1/accounts/acc/basin-sql/query/bucket";
/// Runs for minutes unless cancelled.
const SLOW: &str = "SELECT count(*) FROM generate_series(1, 1000000000000)";

fn serve(flags: &[&str]) -> (tempfile::TempDir, Server) {
    serve_events(5_000, flags)
}

fn serve_events(events: u64, flags: &[&str]) -> (tempfile::TempDir, Server) {
    let dir = tempdir();
    demo_lake(dir.path(), events);
    let args = [lake_args(dir.path()), flags.iter().map(|s| s.to_string()).collect()].concat();
    let s = Server::start(Opts { args, ..Default::default() });
    (dir, s)
}

#[test]
fn a_query_past_its_deadline_is_cancelled_with_504() {
    let (_d, s) = serve(&["--query-timeout", "1s"]);
    let t = Instant::now();
    let (code, msg) = s.error(SLOW, 504);
    assert_eq!(code, "timeout", "{msg}");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    let r = s.post(BASIN, json!({ "query": SLOW }).to_string());
    assert_eq!(r.status(), 504);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["success"], false);
    assert_eq!(v["errors"][0]["code"], 40008);
    // The server is fine afterwards.
    assert_eq!(s.rows("SELECT 1 AS one")[0]["one"], 1);
}

#[test]
fn beyond_capacity_queries_get_429_with_retry_after() {
    let (_d, s) = serve(&[
        "--max-concurrent-queries",
        "1",
        "--max-queued-queries",
        "1",
        "--queue-timeout",
        "500ms",
        "--query-timeout",
        "20s",
    ]);
    let base = s.base.clone();
    // One query runs and holds the only slot until it times out.
    let running = std::thread::spawn(move || {
        client()
            .post(format!("{base}/query"))
            .bearer_auth(TOKEN)
            .body(json!({ "query": SLOW }).to_string())
            .send()
            .map(|r| r.status().as_u16())
    });
    std::thread::sleep(Duration::from_millis(500));
    // The next waits in the queue for 500 ms, then is turned away.
    let t = Instant::now();
    let r = s.post("/query", json!({"query": "SELECT 1"}).to_string());
    assert_eq!(r.status(), 429);
    assert!(t.elapsed() >= Duration::from_millis(400), "it waited in the queue first");
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.json::<serde_json::Value>().unwrap()["error"]["code"], "overloaded");
    let r = s.post(BASIN, json!({"query": "SELECT 1"}).to_string());
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<serde_json::Value>().unwrap()["success"], false);
    drop(s);
    let _ = running.join();
}

#[test]
fn a_client_that_goes_away_frees_its_slot() {
    let (_d, s) =
        serve(&["--max-concurrent-queries", "1", "--max-queued-queries", "0", "--query-timeout", "60s"]);
    // A slow query whose client gives up after a moment.
    let r = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(700))
        .build()
        .unwrap()
        .post(format!("{}/query", s.base))
        .bearer_auth(TOKEN)
        .body(json!({ "query": SLOW }).to_string())
        .send();
    assert!(r.is_err(), "the client timed out");
    // Its query was cancelled, so the only slot is free again.
    eventually(10, || (s.query("SELECT 1").0 == 200).then_some(()));
    let line = eventually(10, || {
        s.log_text().lines().find(|l| l.contains("outcome=\"cancelled\"")).map(String::from)
    });
    assert!(line.contains("/query"), "{line}");
}

#[test]
fn results_over_the_caps_are_never_silently_cut() {
    let (_d, s) = serve(&["--max-result-rows", "100"]);
    let sql = "SELECT value FROM generate_series(1, 1000)";
    // JSON and Arrow cannot say "cut here": they refuse.
    let (code, msg) = s.error(sql, 413);
    assert_eq!(code, "result_too_large");
    assert!(msg.contains("--max-result-rows"), "{msg}");
    let r = s.post("/streaming-query", json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 413);
    // Basin's envelope has `messages`: the rows that fit, and a message saying it stopped.
    let r = s.post(BASIN, json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["success"], true);
    assert_eq!(v["result"]["rows"].as_array().unwrap().len(), 100);
    let m = v["messages"][0]["message"].as_str().unwrap();
    assert!(m.contains("truncated") && m.contains("100 rows"), "{m}");
    // Up to the cap, nothing is said.
    let v: serde_json::Value = s
        .post(BASIN, json!({"query": "SELECT value FROM generate_series(1, 100)"}).to_string())
        .json()
        .unwrap();
    assert_eq!(v["result"]["rows"].as_array().unwrap().len(), 100);
    assert_eq!(v["messages"], json!([]));

    // A byte cap reached mid-stream ends the JSON body as a failure, not a short array.
    let (_d2, s2) = serve(&["--max-result-bytes", "20000"]);
    let whole = client()
        .post(format!("{}/query", s2.base))
        .bearer_auth(TOKEN)
        .body(json!({"query": "SELECT * FROM glass.events"}).to_string())
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.bytes());
    assert!(whole.is_err(), "a cut JSON result must not look whole");
    let v: serde_json::Value =
        s2.post(BASIN, json!({"query": "SELECT * FROM glass.events"}).to_string()).json().unwrap();
    assert!(v["messages"][0]["message"].as_str().unwrap().contains("--max-result-bytes"));
}

#[test]
fn a_query_over_the_memory_limit_fails_clearly_and_the_server_lives() {
    let (_d, s) = serve_events(20_000, &["--memory-limit", "1MiB"]);
    // A self-join's hash table needs far more than 1 MiB, and joins cannot spill.
    let (status, v) = s.query(
        "SELECT a.event_id, b.event_id FROM glass.events a JOIN glass.events b ON a.device_id = b.device_id ORDER BY 1, 2 LIMIT 3",
    );
    assert_eq!(status, 507, "{v}");
    assert_eq!(v["error"]["code"], "resources_exhausted");
    assert!(v["error"]["message"].as_str().unwrap().contains("memory"));
    // Queries that fit still run.
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events")[0]["n"], 20_000);
    assert_eq!(s.rows("SELECT event FROM glass.events GROUP BY event ORDER BY event LIMIT 1").len(), 1);
}

#[test]
fn limits_are_validated_at_start() {
    for (flag, value) in [("--memory-limit", "lots"), ("--query-timeout", "soon"), ("--max-result-rows", "0")]
    {
        let out = std::process::Command::new(skiff_bin()).args(["serve", flag, value]).output().unwrap();
        assert!(!out.status.success(), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag.trim_start_matches('-')) || err.contains(value), "{err}");
    }
}

#[test]
fn a_deeply_nested_query_is_refused_and_the_server_lives() {
    let (_d, s) = serve(&[]);
    // 2,000 terms (4 KB) overflowed a thread's stack and aborted the process; 100,000 is
    // what 200 KB of SQL can nest.
    for n in [2_000, 100_000] {
        let sql = format!("SELECT {} AS x", vec!["1"; n].join("+"));
        let (code, msg) = s.error(&sql, 400);
        assert_eq!(code, "bad_request", "{msg}");
        assert!(msg.contains("nests expressions more than 1000 deep"), "{msg}");
    }
    let unions = vec!["SELECT 1 AS x"; 1_500].join(" UNION ALL ");
    let (_, msg) = s.error(&unions, 400);
    assert!(msg.contains("nests set operations"), "{msg}");
    // Just under the limit plans and answers.
    let sql = format!("SELECT {} AS x", vec!["1"; 900].join("+"));
    assert_eq!(s.rows(&sql)[0]["x"], 900);
}

#[test]
fn a_cpu_bound_query_does_not_hold_up_health_checks_timers_or_the_queue() {
    let (_d, s) = serve_events(
        20_000,
        &["--query-timeout", "3s", "--max-concurrent-queries", "1", "--queue-timeout", "1s"],
    );
    // A join of 20k x 20k rows with two md5s per pair: over a minute here unless cancelled. (A
    // bare `a.event_id < b.event_id` finished inside the 3 s deadline on a faster CI machine.)
    let heavy = "SELECT count(*) AS n FROM glass.events a, glass.events b \
                 WHERE md5(a.event_id || b.event_id) < md5(b.event_id || a.event_id)";
    let started = Instant::now();
    let base = s.base.clone();
    let running = std::thread::spawn(move || {
        let r = client()
            .post(format!("{base}/query"))
            .bearer_auth(TOKEN)
            .json(&json!({ "query": heavy }))
            .send()
            .unwrap();
        (r.status().as_u16(), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    // Generous bounds for a loaded machine: before the query runtime of its own, health
    // checks took 2.5–7.4 s, the queue's 429 came after 15 s and the 504 after 7–23 s.
    for _ in 0..3 {
        let t = Instant::now();
        let r = client().get(format!("{}/_health", s.base)).send().unwrap();
        assert_eq!(r.status(), 200);
        assert!(t.elapsed() < Duration::from_millis(1500), "/_health took {:?}", t.elapsed());
    }
    let t = Instant::now();
    let (code, _) = s.error("SELECT 2 AS two", 429);
    assert_eq!(code, "overloaded");
    assert!(t.elapsed() < Duration::from_secs(3), "the 429 took {:?}", t.elapsed());
    let (status, took) = running.join().unwrap();
    assert_eq!(status, 504);
    assert!(took < Duration::from_secs(6), "the 504 took {took:?}");
    // The cancelled query stops computing, here within ~1 s. Before its join yielded, it kept
    // the query threads busy for ~7 s after its 504, and the next query timed out behind it.
    eventually(4, || {
        let before = cpu_seconds(s.pid());
        std::thread::sleep(Duration::from_millis(500));
        (cpu_seconds(s.pid()) - before < 0.2).then_some(())
    });
    // The cancelled query gives its slot back.
    assert_eq!(s.rows("SELECT 1 AS one")[0]["one"], 1);
}

/// User and system CPU time a process has used, from /proc/<pid>/stat.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}
