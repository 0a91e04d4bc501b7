//! A coordinator and two workers as local processes (`skiff serve --workers`, `skiff worker`)
//! answer as one skiff does (the Worker's query kinds, and the differential tester's generated
//! queries), and a worker that is gone fails a query with a clear error while the coordinator
//! stays up. Workers need a token; one of the two is reached through its WebSocket tunnel
//! (`--tunnel`, the way a coordinator reaches a worker on Cloudflare) and the other over TCP.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The token the tests' workers and coordinators share.
const TOKEN: &str = "worker-secret-1";

/// A `skiff worker` on a port of its own, reached over TCP or through its tunnel.
struct Worker {
    child: Child,
    url: String,
    _logdir: tempfile::TempDir,
}

#[derive(PartialEq)]
enum Via {
    Tcp,
    Tunnel,
}

impl Worker {
    fn start(via: Via) -> Worker {
        let (port, tunnel) = (free_port(), free_port());
        let logdir = tempdir();
        let log = std::fs::File::create(logdir.path().join("worker.log")).unwrap();
        let mut command = Command::new(skiff_bin());
        command.args(["worker", "--listen", &format!("127.0.0.1:{port}")]);
        if via == Via::Tunnel {
            command.args(["--tunnel", &format!("127.0.0.1:{tunnel}")]);
        }
        let child = command
            .env("SKIFF_WORKER_TOKEN", format!("{TOKEN},an-older-token"))
            .env("RUST_LOG", "info")
            .env("SKIFF_DATA_CACHE_MEMORY", "0")
            .env("SKIFF_DATA_CACHE_DISK", "0")
            .env("SKIFF_MEMORY_LIMIT", "1GiB")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn skiff worker");
        let listens = if via == Via::Tunnel { tunnel } else { port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", listens)).is_err() {
            assert!(Instant::now() < deadline, "the worker did not listen on {listens}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let url = match via {
            Via::Tcp => format!("http://127.0.0.1:{port}"),
            Via::Tunnel => format!("ws://127.0.0.1:{tunnel}/_worker/0"),
        };
        Worker { child, url, _logdir: logdir }
    }

    /// One worker of each kind.
    fn pair() -> [Worker; 2] {
        [Worker::start(Via::Tunnel), Worker::start(Via::Tcp)]
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Worker's query kinds and the shapes of the product's queries, each in a file.
fn queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in [repo().join("tests/queries"), shared().join("bench/queries")] {
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "sql")) {
            out.push((f.file_name().unwrap().to_string_lossy().into(), std::fs::read_to_string(&f).unwrap()));
        }
    }
    out
}

/// A coordinator of `workers` over the lake in `dir`, with `more` flags (the worker token
/// among them, unless `--worker-token` is in `more`).
fn coordinator(dir: &std::path::Path, workers: &[Worker], more: &[&str]) -> Server {
    let urls = workers.iter().map(|w| w.url.clone()).collect::<Vec<_>>().join(",");
    let mut args = lake_args(dir);
    args.extend(["--workers".into(), urls]);
    if !more.contains(&"--worker-token") {
        args.extend(["--worker-token".into(), TOKEN.into()]);
    }
    args.extend(more.iter().map(|a| a.to_string()));
    Server::start(Opts { args, ..Default::default() })
}

/// The `metrics` of `sql`'s answer on the Basin route.
fn basin_metrics(server: &Server, sql: &str) -> serde_json::Value {
    let r =
        server.post("/api/v1/accounts/a/basin-sql/query/b", serde_json::json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 200);
    let body: serde_json::Value = r.json().unwrap();
    body["result"]["metrics"].clone()
}

#[test]
fn a_coordinator_with_two_workers_answers_as_one_skiff() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let workers = Worker::pair();
    let coordinator = coordinator(dir.path(), &workers, &[]);
    let alone = Server::lake(dir.path());

    // A plain aggregation over the events is spread: its plan has stages.
    let (_, explain) = coordinator.query("EXPLAIN SELECT event, count(*) FROM glass.events GROUP BY event");
    let plan = explain.to_string();
    assert!(plan.contains("NetworkShuffleExec") || plan.contains("NetworkCoalesceExec"), "{plan}");

    // A top-k over the events' scan prunes it by its dynamic filter, which cannot travel: local.
    let (_, explain) =
        coordinator.query("EXPLAIN SELECT event, ts FROM glass.events ORDER BY ts DESC LIMIT 5");
    assert!(!explain.to_string().contains("Network"), "a pruning top-k was spread: {explain}");

    // What the workers read counts in the query's metrics (here the Basin envelope's), as if
    // the coordinator had read it.
    let sql = "SELECT event, count(*) FROM glass.events GROUP BY event";
    let (one, many) = (basin_metrics(&alone, sql), basin_metrics(&coordinator, sql));
    for m in [&one, &many] {
        let scanned = m["files_scanned"].as_u64().unwrap();
        assert!(scanned > 0 && scanned >= m["files_planned"].as_u64().unwrap(), "{m}");
        assert!(
            m["bytes_scanned"].as_u64().unwrap() > 0 && m["r2_requests_count"].as_u64().unwrap() > 0,
            "{m}"
        );
    }
    for count in ["files_scanned", "bytes_scanned"] {
        assert_eq!(many[count], one[count], "{count} spread: {many}; alone: {one}");
    }

    let (mut spread, mut folded) = (Vec::new(), 0);
    for (name, sql) in queries() {
        let (status, want) = alone.query(&sql);
        assert_eq!(status, 200, "{name} alone: {want}");
        let (status, got) = coordinator.query(&sql);
        assert_eq!(status, 200, "{name} distributed: {got}");
        assert_eq!(got, want, "{name}: the coordinator's answer differs");
        let (_, explain) = coordinator.query(&format!("EXPLAIN {sql}"));
        let explain = explain.to_string();
        if explain.contains("Network") {
            // Scans that fold per file travel too.
            folded += explain.contains("folded per file") as usize;
            spread.push(name);
        }
    }
    assert!(folded > 0, "no query whose scan folds per file was spread over the workers");
    println!("{} of {} queries were spread over the workers: {spread:?}", spread.len(), queries().len());
}

/// Generated queries (tests/difftest/) answered by a coordinator with two workers and every
/// rule against one skiff with `--disable-rules all`, and against DuckDB.
#[test]
fn generated_queries_answer_the_same_spread() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let workers = Worker::pair();
    let spread = coordinator(dir.path(), &workers, &["--memory-limit", "1GiB"]);
    let mut args = lake_args(dir.path());
    args.extend(["--memory-limit", "1GiB", "--disable-rules", "all"].map(String::from));
    let alone = Server::start(Opts { args, ..Default::default() });
    let report = difftest::check(dir.path(), &spread, &alone, 4343, 300);
    eprintln!("spread over two workers: {}", difftest::compact(&report));
}

#[test]
fn a_worker_that_is_gone_fails_the_query_and_the_coordinator_stays_up() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    // Two workers, so that the plan is spread; every stage has a task on each.
    let mut workers = Worker::pair();
    let coordinator = coordinator(dir.path(), &workers, &[]);
    let sql = "SELECT event, count(*) FROM glass.events GROUP BY event";
    // Answered first, so the coordinator holds a connection to the worker that then goes.
    assert_eq!(coordinator.query(sql).0, 200);
    let url = workers[1].url.clone();
    workers[1].child.kill().unwrap();
    workers[1].child.wait().unwrap();
    let (_, message) = coordinator.error(sql, 503);
    assert!(message.contains(&url), "the error names the worker: {message}");
    let (status, _) = coordinator.query("SELECT 1");
    assert_eq!(status, 200, "the coordinator still answers");
}

#[test]
fn a_coordinator_without_the_workers_token_is_refused() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    let workers = Worker::pair();
    let wrong = coordinator(dir.path(), &workers, &["--worker-token", "not-the-token"]);
    let sql = "SELECT event, count(*) FROM glass.events GROUP BY event";
    let (status, body) = wrong.query(sql);
    let text = body.to_string();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("token") || text.contains("401"), "the refusal says why: {text}");
    assert!(!text.contains("not-the-token") && !text.contains(TOKEN), "no token in an answer: {text}");
}
