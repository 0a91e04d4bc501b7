//! A coordinator and two workers as local processes (`skiff serve --workers`, `skiff worker`)
//! answer as one skiff does (the Worker's query kinds, and the differential tester's generated
//! queries), and a worker that is gone fails a query with a clear error while the coordinator
//! stays up.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A `skiff worker` on a port of its own.
struct Worker {
    child: Child,
    url: String,
    _logdir: tempfile::TempDir,
}

impl Worker {
    fn start() -> Worker {
        let port = free_port();
        let logdir = tempdir();
        let log = std::fs::File::create(logdir.path().join("worker.log")).unwrap();
        let child = Command::new(skiff_bin())
            .args(["worker", "--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", "info")
            .env("SKIFF_DATA_CACHE_MEMORY", "0")
            .env("SKIFF_DATA_CACHE_DISK", "0")
            .env("SKIFF_MEMORY_LIMIT", "1GiB")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn skiff worker");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the worker did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Worker { child, url: format!("http://127.0.0.1:{port}"), _logdir: logdir }
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

/// A coordinator of `workers` over the lake in `dir`, with `more` flags.
fn coordinator(dir: &std::path::Path, workers: &[Worker], more: &[&str]) -> Server {
    let urls = workers.iter().map(|w| w.url.clone()).collect::<Vec<_>>().join(",");
    let mut args = lake_args(dir);
    args.extend(["--workers".into(), urls]);
    args.extend(more.iter().map(|a| a.to_string()));
    Server::start(Opts { args, ..Default::default() })
}

#[test]
fn a_coordinator_with_two_workers_answers_as_one_skiff() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let workers = [Worker::start(), Worker::start()];
    let coordinator = coordinator(dir.path(), &workers, &[]);
    let alone = Server::lake(dir.path());

    // A plain aggregation over the events is spread: its plan has stages.
    let (_, explain) = coordinator.query("EXPLAIN SELECT event, count(*) FROM glass.events GROUP BY event");
    let plan = explain.to_string();
    assert!(plan.contains("NetworkShuffleExec") || plan.contains("NetworkCoalesceExec"), "{plan}");

    let mut spread = 0;
    for (name, sql) in queries() {
        let (status, want) = alone.query(&sql);
        assert_eq!(status, 200, "{name} alone: {want}");
        let (status, got) = coordinator.query(&sql);
        assert_eq!(status, 200, "{name} distributed: {got}");
        assert_eq!(got, want, "{name}: the coordinator's answer differs");
        let (_, explain) = coordinator.query(&format!("EXPLAIN {sql}"));
        spread += explain.to_string().contains("Network") as usize;
    }
    assert!(spread > 0, "no query was spread over the workers");
    println!("{spread} of {} queries were spread over the workers", queries().len());
}

/// Generated queries (tests/difftest/) answered by a coordinator with two workers and every
/// rule against one skiff with `--disable-rules all`, and against DuckDB.
#[test]
fn generated_queries_answer_the_same_spread() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let workers = [Worker::start(), Worker::start()];
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
    let mut workers = [Worker::start(), Worker::start()];
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
