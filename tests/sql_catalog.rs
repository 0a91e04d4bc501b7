//! A SQLite catalog written by PyIceberg, changed by PyIceberg while skiff runs: new
//! snapshots, new tables, deletes, and a broken table that must not take the others down.

mod common;

use std::process::Command;

use common::*;

fn count(s: &Server, table: &str) -> u64 {
    s.rows(&format!("SELECT count(*) AS n FROM {table}"))[0]["n"].as_u64().unwrap()
}

fn lake_arg(dir: &tempfile::TempDir) -> String {
    dir.path().display().to_string()
}

#[test]
fn appends_by_another_process_are_seen_by_the_next_query() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let s = Server::lake(dir.path());
    let before = count(&s, "glass.events_v2");
    let out = fixture(
        "write_local.py",
        &["append", "--lake", &lake_arg(&dir), "--table", "glass.events_v2", "--rows", "123", "--seed", "7"],
    );
    assert_eq!(count(&s, "glass.events_v2"), before + 123, "{out}");
    assert_eq!(count(&s, "glass.events"), count(&s, "glass.events_v1") + before + 123);
    // min/max come from manifest statistics, cached per snapshot: a new snapshot moves them.
    let last = |s: &Server| s.rows("SELECT max(timestamp) AS t FROM glass.events")[0]["t"].clone();
    let old = last(&s);
    fixture(
        "write_local.py",
        &[
            "append",
            "--lake",
            &lake_arg(&dir),
            "--table",
            "glass.events_v2",
            "--rows",
            "5",
            "--start",
            "2027-01-01T00:00:00",
            "--end",
            "2027-01-01T01:00:00",
        ],
    );
    let new = last(&s);
    assert_ne!(new, old);
    assert!(new.as_str().unwrap().starts_with("2027-01-01T00:"), "{new}");
}

#[test]
fn deletes_by_pyiceberg_are_applied() {
    let dir = tempdir();
    py_lake(dir.path(), 20_000);
    let s = Server::lake(dir.path());
    let logouts =
        s.rows("SELECT count(*) AS n FROM glass.events_v1 WHERE event = 'logout'")[0]["n"].as_u64().unwrap();
    assert!(logouts > 0);
    let before = count(&s, "glass.events_v1");
    fixture(
        "write_local.py",
        &["delete", "--lake", &lake_arg(&dir), "--table", "glass.events", "--where", "event = 'logout'"],
    );
    assert_eq!(s.rows("SELECT count(*) AS n FROM glass.events_v1 WHERE event = 'logout'")[0]["n"], 0);
    assert_eq!(count(&s, "glass.events_v1"), before - logouts);
    // Statistics answers (count, min, max from manifests) agree with reading the rows.
    let sql = "SELECT count(*) AS n, min(timestamp) AS lo, max(timestamp) AS hi FROM glass.events_v1";
    assert_eq!(s.rows(sql), s.rows(&format!("{sql} WHERE event_id IS NOT NULL")));
}

#[test]
fn tables_created_after_start_become_visible() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    let s = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--refresh-interval".into(), "1s".into()]].concat(),
        ..Default::default()
    });
    assert_eq!(s.error("SELECT * FROM glass.late_table", 404).0, "table_not_found");
    fixture("write_local.py", &["create-table", "--lake", &lake_arg(&dir), "--table", "glass.late_table"]);
    assert!(count(&s, "glass.late_table") > 0);
    // And it is listed once the refresh interval has passed.
    eventually(10, || {
        let rows = s.rows("SELECT table_name FROM information_schema.tables WHERE table_schema = 'glass'");
        rows.iter().any(|r| r["table_name"] == "late_table").then_some(())
    });
}

#[test]
fn a_broken_table_fails_alone() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    // Point glass.identities at a metadata file that does not exist.
    run(Command::new(python()).arg("-c").arg(format!(
        "import sqlite3; c = sqlite3.connect('{}'); \
         c.execute(\"UPDATE iceberg_tables SET metadata_location = metadata_location || '.gone' WHERE table_name = 'identities'\"); c.commit()",
        dir.path().join("catalog.db").display()
    )));
    let s = Server::lake(dir.path());
    assert!(count(&s, "glass.events") > 0);
    let (status, v) = s.query("SELECT count(*) FROM glass.identities");
    assert!(status == 503 || status == 400, "{status} {v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("identities"), "the error names the table: {msg}");
    // Listing tables does not load them, so the broken one does not break it.
    let tables = s.rows("SHOW TABLES");
    assert!(tables.iter().any(|r| r["table_name"] == "identities"));
}
