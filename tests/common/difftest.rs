//! Running the differential tester (`scripts/difftest`, tests/difftest/) against two running
//! servers, for `difftest.rs` (rules on and off) and `distributed.rs` (spread and not).

use std::path::Path;
use std::process::Command;

use super::*;

/// `scripts/difftest` against the two servers; returns its report.
pub fn difftest(lake: &Path, on: &Server, off: &Server, seed: u64, n: u64) -> serde_json::Value {
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
pub fn problems(report: &serde_json::Value, on: &Server, off: &Server) -> Vec<String> {
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

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The report of `n` queries from `seed` on `lake`, failing the test on any mismatch or failure,
/// or when too few queries were compared.
pub fn check(lake: &Path, on: &Server, off: &Server, seed: u64, n: u64) -> serde_json::Value {
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

/// The report without its lists.
pub fn compact(report: &serde_json::Value) -> String {
    let mut r = report.clone();
    if let Some(o) = r.as_object_mut() {
        for k in ["mismatch_list", "failure_list", "known_differences"] {
            o.remove(k);
        }
    }
    r.to_string()
}
