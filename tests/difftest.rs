//! Differential testing (tests/difftest/): generated queries, with a fixed seed, on two small
//! lakes (one shaped to hurt, `tests/fixtures/hurt_lake.py`, and one from `gen_lake.py`), each
//! answered by skiff with every rule and by skiff with `--disable-rules all` (answers must be
//! identical) and by DuckDB over the same Iceberg tables (answers must agree except where
//! `tests/difftest/known.py` lists a difference). The reduced mismatches kept in
//! `tests/difftest/regressions/` are replayed first. A mismatch fails the test with the query
//! and the answers; so does a 5xx or a dead server.
//!
//! `SKIFF_DIFFTEST_QUERIES` (default 1000 per lake, 2000 in all, about two minutes a lake on two
//! cores) and `SKIFF_DIFFTEST_SEED` change the run.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn queries() -> u64 {
    std::env::var("SKIFF_DIFFTEST_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn seed() -> u64 {
    std::env::var("SKIFF_DIFFTEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(4040)
}

/// `scripts/difftest` against the two servers; returns its report.
fn difftest(lake: &Path, on: &Server, off: &Server, seed: u64, n: u64) -> serde_json::Value {
    let out = Command::new(repo().join("scripts/difftest"))
        .env("SKIFF_TEST_PYTHON", python())
        .args(["--seed", &seed.to_string(), "--queries", &n.to_string(), "--lake"])
        .arg(lake)
        .args(["--server", &on.base, "--server-off", &off.base, "--token", TOKEN])
        // a bounded reduction: the test reports, a developer reduces further by hand
        .args(["--max-reductions", "3", "--reduce-seconds", "20", "--reduce-total-seconds", "45"])
        .output()
        .expect("running scripts/difftest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    let report: serde_json::Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("scripts/difftest gave no report ({e}):\n{stderr}\n{stdout}"));
    eprintln!(
        "{}",
        stderr.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    report
}

/// The failures and mismatches of a report, readable.
fn problems(report: &serde_json::Value, on: &Server, off: &Server) -> Vec<String> {
    let mut out = vec![];
    for key in ["failure_list", "mismatch_list"] {
        for m in report[key].as_array().into_iter().flatten() {
            let place =
                m["regression"].as_str().map(String::from).unwrap_or_else(|| format!("query {}", m["n"]));
            let mut s = format!(
                "{} (oracle {}) at {place}: {}\n  query: {}\n",
                m["kind"].as_str().unwrap_or(""),
                m["oracle"].as_str().unwrap_or(""),
                m["why"].as_str().unwrap_or(""),
                m["query"].as_str().unwrap_or("")
            );
            if let Some(r) = m["reduced"].as_str() {
                s += &format!("  reduced: {r}\n  reduced answers: {}\n", m["reduced_answers"]);
            } else {
                s += &format!("  answers: {}\n", m["answers"]);
            }
            out.push(s);
        }
    }
    if report["failures"].as_u64().unwrap_or(0) > 0 {
        out.push(format!("log of skiff with rules:\n{}", tail(&on.log_text(), 40)));
        out.push(format!("log of skiff without rules:\n{}", tail(&off.log_text(), 40)));
    }
    out
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// skiff with its rules and without: both with the result cache off (tests/common does that),
/// or a repeated query would be answered from the cache and compare nothing; and with a memory
/// limit, since the default (60% of the machine's memory each) lets four servers on a shared
/// machine reach the OOM killer before their pools say no (a query over its limit is a 507,
/// which the comparison skips).
fn servers(lake: &Path) -> (Server, Server) {
    let mut args = lake_args(lake);
    args.extend(["--memory-limit".to_string(), "2GiB".to_string()]);
    let on = Server::start(Opts { args: args.clone(), ..Default::default() });
    args.extend(["--disable-rules".to_string(), "all".to_string()]);
    let off = Server::start(Opts { args, ..Default::default() });
    (on, off)
}

fn check(lake: &Path, on: &Server, off: &Server, seed: u64, n: u64) -> serde_json::Value {
    let report = difftest(lake, on, off, seed, n);
    let problems = problems(&report, on, off);
    assert!(
        problems.is_empty(),
        "{} problem(s) in {}:\n{}",
        problems.len(),
        compact(&report),
        problems.join("\n")
    );
    assert_eq!(report["generated"].as_u64(), Some(n), "{report}");
    // the comparisons happened: most queries answered on both servers and most in DuckDB
    let b = report["compared"]["b"].as_u64().unwrap_or(0);
    let a = report["compared"]["a"].as_u64().unwrap_or(0);
    assert!(b >= n * 9 / 10, "only {b} of {n} queries compared between the servers: {report}");
    assert!(a >= n / 2, "only {a} of {n} queries compared with DuckDB: {report}");
    report
}

#[test]
fn hurt_lake_answers_agree() {
    let dir = tempdir();
    let lake = dir.path().join("hurt");
    let written = fixture("hurt_lake.py", &["--out", lake.to_str().unwrap(), "--events", "4000"]);
    let (on, off) = servers(&lake);
    // both read the deletes the fixture wrote, partition-scoped equality deletes included
    for server in [&on, &off] {
        for (table, want) in written["counts"].as_object().unwrap() {
            if table == "glass.events" {
                continue; // the union of every version in skiff; checked below
            }
            let rows = server.rows(&format!("SELECT count(*) AS n FROM {table}"));
            assert_eq!(&rows[0]["n"], want, "rows of {table}");
        }
        let rows = server.rows("SELECT count(*) AS n FROM glass.events");
        assert_eq!(
            rows[0]["n"], written["union_counts"]["glass.events"],
            "rows of glass.events (every version)"
        );
    }
    let report = check(&lake, &on, &off, seed(), queries());
    eprintln!("hurt lake: {}", compact(&report));
}

#[test]
fn gen_lake_answers_agree() {
    let dir = tempdir();
    py_lake(dir.path(), 40_000);
    let (on, off) = servers(dir.path());
    let report = check(dir.path(), &on, &off, seed() + 1, queries());
    eprintln!("gen_lake: {}", compact(&report));
}

/// The report without its lists.
fn compact(report: &serde_json::Value) -> String {
    let mut r = report.clone();
    if let Some(o) = r.as_object_mut() {
        for k in ["mismatch_list", "failure_list", "known_differences"] {
            o.remove(k);
        }
    }
    r.to_string()
}
