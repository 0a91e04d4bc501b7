//! Versioned tables: `glass.events` is every version (`events`, `events_v2`, …) as one
//! UNION ALL by column name, with typed NULLs for what a version lacks.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::json;

fn count(s: &Server, sql_from: &str) -> u64 {
    s.rows(&format!("SELECT count(*) AS n FROM {sql_from}"))[0]["n"].as_u64().unwrap()
}

/// A PyIceberg lake shared by the read-only tests here.
fn lake() -> &'static (tempfile::TempDir, Server) {
    static L: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    L.get_or_init(|| {
        let dir = tempdir();
        py_lake(dir.path(), 30_000);
        let s = Server::lake(dir.path());
        (dir, s)
    })
}

#[test]
fn the_base_name_reads_every_version_in_order() {
    let s = &lake().1;
    let (v1, v2) = (count(s, "glass.events_v1"), count(s, "glass.events_v2"));
    assert!(v1 > 0 && v2 > 0);
    assert_eq!(count(s, "glass.events"), v1 + v2);
    // `_v1` is the physical first version (stored as plain `events`): gen_lake.py writes
    // it the 60 days before 2026-09-30.
    assert_eq!(v1, count(s, "glass.events WHERE timestamp < TIMESTAMP '2026-09-30 00:00:00'"));
    // Columns: v1's, then those v2 adds, in first-appearance order.
    let cols: Vec<String> = s
        .rows("DESCRIBE glass.events")
        .iter()
        .map(|r| r["column_name"].as_str().unwrap().to_string())
        .collect();
    let v1_cols: Vec<String> = s
        .rows("DESCRIBE glass.events_v1")
        .iter()
        .map(|r| r["column_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(&cols[..v1_cols.len()], &v1_cols[..]);
    assert_eq!(&cols[v1_cols.len()..], &["utm_source", "utm_medium", "utm_campaign", "revenue"]);
    let star = s.rows("SELECT * FROM glass.events LIMIT 1");
    assert_eq!(star[0].as_object().unwrap().len(), cols.len());
}

#[test]
fn later_columns_are_typed_nulls_in_older_versions() {
    let s = &lake().1;
    // gen_lake.py writes events_v2 from 2026-09-30 on: before that, only v1 has rows.
    let rows = s.rows(
        "SELECT count(*) AS n, sum(revenue) AS revenue, avg(revenue) AS avg, max(utm_source) AS src \
         FROM glass.events WHERE timestamp < TIMESTAMP '2026-09-01 00:00:00'",
    );
    assert!(rows[0]["n"].as_u64().unwrap() > 0);
    assert_eq!(rows[0]["revenue"], json!(null));
    assert_eq!(rows[0]["avg"], json!(null));
    assert_eq!(rows[0]["src"], json!(null));
    let t =
        s.rows("SELECT arrow_typeof(revenue) AS t, arrow_typeof(utm_source) AS u FROM glass.events LIMIT 1");
    // The lake's strings are read as views; responses still type them Utf8 (tests/basin.rs).
    assert_eq!(t[0], json!({"t": "Float64", "u": "Utf8View"}));
    let total = s.rows("SELECT sum(revenue) > 0 AS some FROM glass.events");
    assert_eq!(total[0]["some"], true);
}

#[test]
fn filters_and_projections_reach_every_branch() {
    let s = &lake().1;
    let physical = |sql: &str| {
        let plan = s.rows(&format!("EXPLAIN {sql}"));
        plan.iter().find(|r| r["plan_type"] == "physical_plan").expect("physical plan")["plan"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Ten days on each side of the switch to events_v2 (2026-09-30).
    let plan = physical(
        "SELECT event, url FROM glass.events WHERE timestamp >= TIMESTAMP '2026-09-20 00:00:00' AND timestamp < TIMESTAMP '2026-10-10 00:00:00'",
    );
    let scans: Vec<&str> = plan.lines().filter(|l| l.contains("DataSourceExec")).collect();
    assert_eq!(scans.len(), 2, "one scan per version:\n{plan}");
    for scan in &scans {
        assert!(
            scan.contains("predicate=") && scan.contains("timestamp@"),
            "the filter reaches the scan:\n{scan}"
        );
        // A scan that folds per file names what it reads apart from what it yields.
        let read = if scan.contains("reads=[") { "reads=[" } else { "projection=[" };
        let projection = scan.split(read).nth(1).and_then(|p| p.split(']').next()).unwrap_or("");
        let mut cols: Vec<&str> = projection.split(", ").collect();
        cols.sort();
        assert_eq!(cols, ["event", "timestamp", "url"], "only the needed columns are read:\n{scan}");
    }
    assert!(plan.contains("UnionExec"), "{plan}");
    // A range only events_v2 covers: Iceberg planning leaves the first version no file to read.
    let plan = physical("SELECT event FROM glass.events WHERE timestamp >= TIMESTAMP '2026-10-20 00:00:00'");
    assert_eq!(plan.matches("DataSourceExec").count(), 1, "{plan}");
    assert!(plan.contains("EmptyExec"), "{plan}");
}

fn basin_metrics(s: &Server, sql: &str) -> serde_json::Value {
    let r = s.post("/api/v1/accounts/acc/basin-sql/query/bucket", json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["success"], true, "{v}");
    v["result"]["metrics"].clone()
}

#[test]
fn a_time_filter_prunes_files_in_each_version() {
    let s = &lake().1;
    let all = basin_metrics(s, "SELECT count(DISTINCT url) AS n FROM glass.events");
    let recent = basin_metrics(
        s,
        "SELECT count(DISTINCT url) AS n FROM glass.events WHERE timestamp >= TIMESTAMP '2026-10-25 00:00:00'",
    );
    let old = basin_metrics(
        s,
        "SELECT count(DISTINCT url) AS n FROM glass.events WHERE timestamp < TIMESTAMP '2026-08-05 00:00:00'",
    );
    let files = |m: &serde_json::Value| m["files_scanned"].as_u64().unwrap();
    let bytes = |m: &serde_json::Value| m["bytes_scanned"].as_u64().unwrap();
    assert!(files(&all) > 0 && bytes(&all) > 0, "{all}");
    assert!(files(&recent) < files(&all) / 4, "{recent} vs {all}");
    assert!(files(&old) < files(&all) / 4, "{old} vs {all}");
    assert!(bytes(&recent) < bytes(&all) && bytes(&old) < bytes(&all));
    // Pruned while planning, by the manifests' column bounds, before any file is opened.
    let planned = |m: &serde_json::Value| m["files_planned"].as_u64().unwrap();
    assert!(planned(&recent) < planned(&all) / 4 && planned(&old) < planned(&all) / 4, "{recent} {old}");
}

#[test]
fn a_new_version_is_read_without_restart() {
    let dir = tempdir();
    py_lake(dir.path(), 10_000);
    let s = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--refresh-interval".into(), "1s".into()]].concat(),
        ..Default::default()
    });
    let before = count(&s, "glass.events");
    fixture(
        "write_local.py",
        &[
            "create-version",
            "--lake",
            &dir.path().display().to_string(),
            "--table",
            "glass.events_v3",
            "--extra-column",
            "plan:string!",
            "--rows",
            "250",
        ],
    );
    eventually(15, || (count(&s, "glass.events") == before + 250).then_some(()));
    assert_eq!(count(&s, "glass.events WHERE plan IS NOT NULL"), 250);
    assert_eq!(count(&s, "glass.events WHERE plan IS NULL"), before);
    let cols = s.rows("DESCRIBE glass.events");
    assert_eq!(cols.last().unwrap()["column_name"], "plan");
}

#[test]
fn pinned_versions_and_a_missing_one() {
    let dir = tempdir();
    py_lake(dir.path(), 5_000);
    let pinned = |versions: &str| {
        Server::start(Opts {
            args: lake_args(dir.path()),
            env: vec![("LAKE_VERSIONS", versions.to_string())],
            ..Default::default()
        })
    };
    let s = pinned("events=1;identities=1");
    assert_eq!(count(&s, "glass.events"), count(&s, "glass.events_v1"));
    assert!(s.rows("DESCRIBE glass.events").iter().all(|r| r["column_name"] != "revenue"));
    drop(s);
    let s = pinned("events=1,2,3");
    let (code, msg) = s.error("SELECT count(*) FROM glass.events", 404);
    assert_eq!(code, "table_not_found");
    assert!(msg.contains("events_v3") && msg.contains("LAKE_VERSIONS"), "{msg}");
    // The physical versions still answer.
    assert!(count(&s, "glass.events_v2") > 0);
    drop(s);
    let bad = std::process::Command::new(skiff_bin())
        .args(["serve", "--lake-versions", "events=one"])
        .args(lake_args(dir.path()))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("LAKE_VERSIONS"));
}

#[test]
fn column_types_widen_or_fail_clearly() {
    let dir = tempdir();
    py_lake(dir.path(), 2_000);
    let lake = dir.path().display().to_string();
    fixture("write_local.py", &["create-conflict", "--lake", &lake]);
    fixture("write_local.py", &["create-widen", "--lake", &lake]);
    let s = Server::lake(dir.path());
    let (code, msg) = s.error("SELECT * FROM glass.things", 400);
    assert_eq!(code, "invalid_query");
    assert!(
        msg.contains("column n") && msg.contains("glass.things") && msg.contains("glass.things_v2"),
        "{msg}"
    );
    let t = s.rows("SELECT arrow_typeof(n) AS n, arrow_typeof(x) AS x FROM glass.nums LIMIT 1");
    assert_eq!(t[0], json!({"n": "Int64", "x": "Float64"}));
    let sums = s.rows("SELECT count(*) AS c, sum(n) IS NOT NULL AS s FROM glass.nums");
    assert_eq!(sums[0]["s"], true);
    assert_eq!(sums[0]["c"].as_u64().unwrap(), count(&s, "glass.nums_v1") + count(&s, "glass.nums_v2"));
}

#[test]
fn a_version_without_data_files_is_fine() {
    let dir = tempdir();
    py_lake(dir.path(), 2_000);
    fixture(
        "write_local.py",
        &[
            "create-version",
            "--lake",
            &dir.path().display().to_string(),
            "--table",
            "glass.identities_v2",
            "--from",
            "glass.identities",
            "--extra-column",
            "email:string",
            "--rows",
            "0",
        ],
    );
    let s = Server::lake(dir.path());
    assert_eq!(count(&s, "glass.identities"), count(&s, "glass.identities_v1"));
    assert_eq!(count(&s, "glass.identities WHERE email IS NULL"), count(&s, "glass.identities_v1"));
}

#[test]
fn count_star_over_every_version_comes_from_metadata() {
    let s = &lake().1;
    let plain = basin_metrics(s, "SELECT count(*) AS n FROM glass.events");
    assert_eq!(
        (plain["files_scanned"].as_u64(), plain["bytes_scanned"].as_u64()),
        (Some(0), Some(0)),
        "{plain}"
    );
    // The same count read from the data agrees.
    let n = count(s, "glass.events");
    assert_eq!(n, count(s, "glass.events WHERE event_id IS NOT NULL"));
}

#[test]
fn min_and_max_over_every_version_come_from_metadata() {
    let s = &lake().1;
    let sql = "SELECT min(timestamp) AS lo, max(timestamp) AS hi, min(__ingest_ts) AS ilo, \
               max(__ingest_ts) AS ihi, count(*) AS n FROM glass.events";
    let m = basin_metrics(s, sql);
    assert_eq!((m["files_scanned"].as_u64(), m["bytes_scanned"].as_u64()), (Some(0), Some(0)), "{m}");
    // The same aggregates computed from the data agree (the filter makes DataFusion read rows).
    let from_meta = s.rows(sql);
    let from_data = s.rows(&format!("{sql} WHERE event_id IS NOT NULL"));
    assert_eq!(from_meta, from_data);
    // String bounds may be truncated in manifests: those are read from the data.
    let m = basin_metrics(s, "SELECT max(url) AS u FROM glass.events");
    assert!(m["files_scanned"].as_u64().unwrap() > 0, "{m}");
}

#[test]
fn a_cte_aggregation_used_several_times_is_computed_once() {
    let s = &lake().1;
    let funnel = std::fs::read_to_string(shared().join("bench/queries/funnel.sql")).unwrap();
    let plan = s.rows(&format!("EXPLAIN {funnel}"));
    let physical = plan.iter().find(|r| r["plan_type"] == "physical_plan").expect("physical plan")["plan"]
        .as_str()
        .unwrap()
        .to_string();
    // `s1` is read by `viewed`, by `s2` and by `s3`; `s2` by `signed_up` and `s3`.
    assert!(physical.contains("SharedExec: consumers="), "{physical}");
    // Sharing is only for repeats: a query that reads its aggregation once has none.
    let plan = s.rows("EXPLAIN SELECT event, count(*) FROM glass.events GROUP BY event");
    assert!(!format!("{plan:?}").contains("SharedExec"), "{plan:?}");
    // The funnel's answer with shared subplans equals the same funnel written without a CTE
    // reference shared (each step computed by its own subquery).
    let unshared = "SELECT count(*) AS n FROM (SELECT coalesce(person_id, device_id) AS actor FROM glass.events \
                    WHERE project_id = 'proj_alpha' AND event = '$pageview' AND timestamp >= TIMESTAMP '2026-09-01 00:00:00' \
                    AND timestamp < TIMESTAMP '2026-10-15 00:00:00' GROUP BY 1)";
    // The lake is read once: as many files as one read of `e`'s columns (measured before the
    // result cache holds the funnel).
    let e = "SELECT count(person_id), count(device_id), count(event), max(timestamp) FROM glass.events \
             WHERE project_id = 'proj_alpha' AND event IN ('$pageview', 'signup', 'purchase') \
             AND timestamp >= TIMESTAMP '2026-09-01 00:00:00' AND timestamp < TIMESTAMP '2026-10-15 00:00:00'";
    let files = |sql: &str| basin_metrics(s, sql)["files_scanned"].as_u64().unwrap();
    assert_eq!(files(&funnel), files(e));
    let viewed = s.rows(unshared)[0]["n"].clone();
    let got = s.rows(&funnel);
    assert_eq!(got[0]["viewed"], viewed, "{got:?}");
}

#[test]
fn a_cte_read_twice_is_read_from_the_lake_once() {
    let s = &lake().1;
    let e = "SELECT device_id, event FROM glass.events WHERE event IN ('signup', 'purchase')";
    let twice = format!(
        "WITH e AS ({e}) SELECT (SELECT count(*) FROM e WHERE event = 'signup') AS signups, \
         (SELECT count(DISTINCT device_id) FROM e) AS devices"
    );
    let plan = format!("{:?}", s.rows(&format!("EXPLAIN {twice}")));
    assert!(plan.contains("SharedExec: consumers=2"), "{plan}");
    // Filters stay above the shared scan, so both readers see every row of the CTE.
    let inline = format!(
        "SELECT (SELECT count(*) FROM ({e}) WHERE event = 'signup') AS signups, \
         (SELECT count(DISTINCT device_id) FROM ({e})) AS devices"
    );
    assert_eq!(s.rows(&twice), s.rows(&inline));
    // Not shared: a CTE with a volatile function (each reference may differ), or read once.
    for sql in [
        "WITH r AS (SELECT device_id, random() AS x FROM glass.events) SELECT (SELECT count(*) FROM r) AS a, (SELECT count(*) FROM r WHERE x < 2) AS b",
        "WITH e AS (SELECT event FROM glass.events) SELECT count(*) AS n FROM e",
    ] {
        let plan = format!("{:?}", s.rows(&format!("EXPLAIN {sql}")));
        assert!(!plan.contains("SharedExec"), "{sql}: {plan}");
    }
}

#[test]
fn windows_over_many_partitions_use_the_whole_partition_operator() {
    let s = &lake().1;
    let paths = std::fs::read_to_string(shared().join("bench/queries/paths.sql")).unwrap();
    // Nothing above paths' window uses its order: its partitions are grouped by hash.
    let plan = format!("{:?}", s.rows(&format!("EXPLAIN {paths}")));
    assert!(plan.contains("HashedWindowExec") && !plan.contains("BoundedWindowAggExec"), "{plan}");
    // A window without PARTITION BY keeps the streaming operator (it would buffer everything).
    let plan =
        format!("{:?}", s.rows("EXPLAIN SELECT row_number() OVER (ORDER BY timestamp) FROM glass.events"));
    assert!(plan.contains("BoundedWindowAggExec"), "{plan}");
    // lead/lag, row_number and a running sum per partition agree with a self-join formulation.
    let sql = "SELECT session_id, timestamp, event_id, \
               row_number() OVER (PARTITION BY session_id ORDER BY timestamp, event_id) AS rn, \
               lag(event) OVER (PARTITION BY session_id ORDER BY timestamp, event_id) AS prev \
               FROM glass.events WHERE project_id = 'proj_alpha' ORDER BY session_id, timestamp, event_id LIMIT 2000";
    let rows = s.rows(sql);
    assert!(rows.len() > 100);
    let mut last: Option<(String, u64)> = None;
    for r in &rows {
        let sid = r["session_id"].as_str().unwrap().to_string();
        let rn = r["rn"].as_u64().unwrap();
        match &last {
            Some((p, n)) if *p == sid => assert_eq!(rn, n + 1, "{r}"),
            _ => assert_eq!(rn, 1, "{r}"),
        }
        if rn == 1 {
            assert!(r["prev"].is_null(), "{r}");
        } else {
            assert!(!r["prev"].is_null(), "{r}");
        }
        last = Some((sid, rn));
    }
    // skiff's own lead/lag/row_number agree with DataFusion's operator, which runs them when
    // the same window also has a function skiff leaves to it (sum): over many small partitions,
    // and over a few that each span many batches.
    for key in ["session_id", "project_id"] {
        let w = format!("OVER (PARTITION BY {key} ORDER BY timestamp, event_id)");
        let shifts = format!(
            "session_id, timestamp, event_id, row_number() {w} AS rn, lead(url) {w} AS next, \
             lead(url, 2, 'none') {w} AS next2, lag(event, 1) {w} AS prev, lag(revenue, 3, -1.5) {w} AS r3, \
             lead(url, -1) {w} AS back, lead(utm_source, 1, NULL) {w} AS src"
        );
        let order = "ORDER BY session_id, timestamp, event_id";
        let ours = format!("SELECT {shifts} FROM glass.events {order}");
        let theirs = format!("SELECT {shifts}, sum(1) {w} AS s FROM glass.events {order}");
        // By session_id the window's sort is the query's order; by project_id it is not, and
        // the window groups its partitions by hash.
        let plan = format!("{:?}", s.rows(&format!("EXPLAIN {ours}")));
        let skiffs = if key == "session_id" { "SortedWindowExec" } else { "HashedWindowExec" };
        assert!(plan.contains(skiffs), "{plan}");
        let plan = format!("{:?}", s.rows(&format!("EXPLAIN {theirs}")));
        assert!(!plan.contains("SortedWindowExec") && plan.contains("WindowAggExec"), "{plan}");
        let mut expected = s.rows(&theirs);
        for r in &mut expected {
            r.as_object_mut().unwrap().remove("s");
        }
        let got = s.rows(&ours);
        assert!(got.len() > 8192, "more rows than one batch: {}", got.len());
        assert!(got.iter().any(|r| r["next2"] == "none") && got.iter().any(|r| r["r3"] == -1.5), "defaults");
        assert_eq!(got, expected, "PARTITION BY {key}");
    }
}

#[test]
fn scans_filter_rows_while_decoding_only_when_it_pays() {
    let s = &lake().1;
    let physical = |sql: &str| {
        let rows = s.rows(&format!("EXPLAIN {sql}"));
        let plan = rows.iter().find(|r| r["plan_type"] == "physical_plan").expect("a physical plan");
        plan["plan"].as_str().unwrap().to_string()
    };
    let person = s.rows(
        "SELECT person_id FROM glass.events WHERE person_id IS NOT NULL \
         GROUP BY person_id ORDER BY count(*) DESC, person_id LIMIT 1",
    )[0]["person_id"]
        .as_str()
        .unwrap()
        .to_string();
    // A needle with wide columns to read: the scans apply the filter (no FilterExec above).
    let needle = format!(
        "SELECT timestamp, event_id, url, props FROM glass.events WHERE person_id = '{person}' \
         ORDER BY timestamp, event_id"
    );
    let plan = physical(&needle);
    assert!(!plan.contains("FilterExec") && plan.contains("person_id"), "{plan}");
    // The same rows as when the filter cannot reach the scan (it does not pass a LIMIT).
    let above = format!(
        "SELECT timestamp, event_id, url, props FROM \
         (SELECT * FROM glass.events LIMIT 1000000000) WHERE person_id = '{person}' \
         ORDER BY timestamp, event_id"
    );
    assert!(physical(&above).contains("FilterExec"));
    let rows = s.rows(&needle);
    assert!(!rows.is_empty());
    assert_eq!(rows, s.rows(&above));
    // Most rows match, or nothing wide is left to skip: decoded first, filtered after.
    for sql in [
        "SELECT url, props FROM glass.events WHERE project_id = 'proj_alpha'".to_string(),
        format!("SELECT count(*) AS n FROM glass.events WHERE person_id = '{person}'"),
    ] {
        assert!(physical(&sql).contains("FilterExec"), "{sql}");
    }
    // The condition that keeps fewer rows is tested first (purchases are rarer than a
    // project's events), whatever the order written; the answer is unchanged.
    let rare = "SELECT country, props FROM glass.events WHERE project_id = 'proj_alpha' AND event = 'purchase' \
                ORDER BY country, props";
    let plan = physical(rare);
    let scans: Vec<&str> = plan.lines().filter(|l| l.contains("DataSourceExec")).collect();
    assert!(!plan.contains("FilterExec") && !scans.is_empty(), "{plan}");
    for scan in scans {
        let (event, project) = (scan.find("event@").unwrap(), scan.find("project_id@").unwrap());
        assert!(event < project, "{scan}");
    }
    let rows = s.rows(rare);
    assert!(!rows.is_empty());
    let above = "SELECT country, props FROM (SELECT * FROM glass.events LIMIT 1000000000) \
                 WHERE project_id = 'proj_alpha' AND event = 'purchase' ORDER BY country, props";
    assert_eq!(rows, s.rows(above));
    // Under a top-k, the scans filter by its bound while decoding, and the filter above them
    // is folded in; the answer is unchanged.
    let top = "SELECT timestamp, event_id, url FROM glass.events WHERE project_id = 'proj_beta' \
               ORDER BY timestamp DESC, event_id LIMIT 20";
    let plan = physical(top);
    assert!(!plan.contains("FilterExec") && plan.contains("DynamicFilter"), "{plan}");
    let all = s.rows(
        "SELECT timestamp, event_id, url FROM (SELECT * FROM glass.events LIMIT 1000000000) \
         WHERE project_id = 'proj_beta' ORDER BY timestamp DESC, event_id LIMIT 20",
    );
    assert_eq!(s.rows(top), all);
    // A condition that fails while the scan decodes (the cast, under the top-k's row filter)
    // is the query's error, not the data's.
    let (code, message) = s.error(
        "SELECT timestamp FROM glass.events WHERE CAST(event_id AS DOUBLE) > 1 \
         ORDER BY timestamp DESC LIMIT 5",
        400,
    );
    assert_eq!(code, "invalid_query", "{message}");
    assert!(message.contains("Cannot cast string"), "{message}");
}
