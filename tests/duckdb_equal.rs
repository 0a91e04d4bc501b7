//! skiff's answers equal DuckDB's (iceberg extension, `UNION ALL BY NAME` over the versions)
//! on the same Iceberg tables, for the benchmark's query kinds and skiff's own, on a lake
//! written by PyIceberg and on one written by `skiff demo`. `shared/bench/bench.py` does
//! the comparison.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn compare(lake: &Path, server: &Server, queries: &Path) {
    let out = run(Command::new(python())
        .arg(shared().join("bench/bench.py"))
        .arg("--lake")
        .arg(lake)
        .arg("--queries")
        .arg(queries)
        .args(["--server", &server.base, "--token", TOKEN, "--reps", "1", "--threads", "2"]));
    let summary: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let n = std::fs::read_dir(queries)
        .unwrap_or_else(|e| panic!("{}: {e}", queries.display()))
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "sql"))
        .count();
    assert_eq!(summary["queries"].as_u64(), Some(n as u64), "{out}");
    assert_eq!(summary["matched"], summary["queries"], "answers differ from DuckDB's:\n{out}");
}

#[test]
fn pyiceberg_lake_answers_equal_duckdb() {
    let dir = tempdir();
    py_lake(dir.path(), 60_000);
    let server = Server::lake(dir.path());
    compare(dir.path(), &server, &shared().join("bench/queries"));
    compare(dir.path(), &server, &repo().join("tests/queries"));
}

#[test]
fn demo_lake_answers_equal_duckdb() {
    let dir = tempdir();
    demo_lake(dir.path(), 30_000);
    let server = Server::lake(dir.path());
    compare(dir.path(), &server, &shared().join("bench/queries"));
    compare(dir.path(), &server, &repo().join("tests/queries"));
}
