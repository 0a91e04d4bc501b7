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

use common::difftest::{check, compact};
use common::*;

fn queries() -> u64 {
    std::env::var("SKIFF_DIFFTEST_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn seed() -> u64 {
    std::env::var("SKIFF_DIFFTEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(4040)
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
