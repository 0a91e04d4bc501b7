//! skiff's own plan rules give DataFusion's answers: the window operator for many small
//! partitions (`SortedWindowExec`) and the shared subqueries (`SharedExec`), over a lake of
//! known rows (`tests/fixtures/plan_rules_lake.py`), against answers written out by hand.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{Value, json};

/// The known lake, served once for every test here.
fn lake() -> &'static (tempfile::TempDir, Server) {
    static L: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    L.get_or_init(|| {
        let dir = tempdir();
        let out = dir.path().to_str().unwrap();
        assert_eq!(fixture("plan_rules_lake.py", &["--out", out])["files"], 5);
        let s = Server::lake(dir.path());
        (dir, s)
    })
}

fn plan(s: &Server, sql: &str) -> String {
    s.rows(&format!("EXPLAIN {sql}"))
        .iter()
        .map(|r| r["plan"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// DataFusion computes `lag`/`lead` over input sorted the other way when another window of
/// the query orders so (one sort for both): it reverses the expression, keeping its name.
/// skiff's operator once shifted such input as if it were in the named order, so `lag` came
/// out as `lead`.
#[test]
fn lag_and_lead_read_the_right_neighbour_when_another_window_orders_the_other_way() {
    let s = &lake().1;
    // Partitions e0 (ids 0, 3, 6, 9) and y (200, 201, 202).
    let lag = "SELECT id, lag(id) OVER (PARTITION BY ev ORDER BY id) AS lg, \
               row_number() OVER (PARTITION BY ev ORDER BY id DESC) AS rn \
               FROM glass.tk WHERE ev IN ('e0', 'y') ORDER BY id";
    assert!(plan(s, lag).contains("SortedWindowExec"), "skiff's operator is under test");
    let want = json!([
        {"id": 0, "lg": null, "rn": 4}, {"id": 3, "lg": 0, "rn": 3}, {"id": 6, "lg": 3, "rn": 2},
        {"id": 9, "lg": 6, "rn": 1}, {"id": 200, "lg": null, "rn": 3}, {"id": 201, "lg": 200, "rn": 2},
        {"id": 202, "lg": 201, "rn": 1},
    ]);
    assert_eq!(Value::Array(s.rows(lag)), want);

    // With an aggregate window ordered the other way; an offset and a default.
    let lead = "SELECT id, lead(id) OVER (PARTITION BY ev ORDER BY id) AS ld, \
                lag(id, 2, -1) OVER (PARTITION BY ev ORDER BY id) AS l2, \
                sum(id) OVER (PARTITION BY ev ORDER BY id DESC) AS s \
                FROM glass.tk WHERE ev IN ('e0', 'y') ORDER BY id";
    assert!(plan(s, lead).contains("SortedWindowExec"), "skiff's operator is under test");
    let want = json!([
        {"id": 0, "ld": 3, "l2": -1, "s": 18}, {"id": 3, "ld": 6, "l2": -1, "s": 18},
        {"id": 6, "ld": 9, "l2": 0, "s": 15}, {"id": 9, "ld": null, "l2": 3, "s": 9},
        {"id": 200, "ld": 201, "l2": -1, "s": 603}, {"id": 201, "ld": 202, "l2": -1, "s": 403},
        {"id": 202, "ld": null, "l2": 200, "s": 202},
    ]);
    assert_eq!(Value::Array(s.rows(lead)), want);
}

/// A CTE read by a window (which needs it sorted) and by another branch is computed once
/// for both. DataFusion once pushed the window's sort below the shared node in that copy
/// only, and whichever copy ran first computed the rows for both: the window then read
/// unsorted rows, some of the time.
#[test]
fn a_shared_subquery_gives_a_window_its_rows_sorted() {
    let s = &lake().1;
    let sql = "WITH s AS (SELECT ev, id FROM glass.tk) \
               SELECT ev, id, lag(id) OVER (ORDER BY id) AS l FROM s UNION ALL SELECT ev, id, NULL FROM s";
    assert_eq!(plan(s, sql).matches("SharedExec").count(), 2, "{}", plan(s, sql));
    // Every id in order: each one's lag is the one before it (the first one's is NULL, like
    // every row of the other branch).
    let ids: Vec<i64> = (0..10).chain(100..110).chain(200..203).chain([300]).chain(400..404).collect();
    let want: Vec<(i64, i64)> = ids.windows(2).map(|w| (w[1], w[0])).collect();
    // Which copy runs first varies: ask several times.
    for _ in 0..10 {
        let r = s.post("/api/v1/accounts/acc/basin-sql/query/bucket", json!({ "query": sql }).to_string());
        let v: Value = r.json().unwrap();
        let rows = v["result"]["rows"].as_array().unwrap_or_else(|| panic!("{v}"));
        let mut lags: Vec<(i64, i64)> = rows
            .iter()
            .filter(|r| !r["l"].is_null())
            .map(|r| (r["id"].as_i64().unwrap(), r["l"].as_i64().unwrap()))
            .collect();
        lags.sort();
        assert_eq!(lags, want);
        assert_eq!(rows.len(), 2 * ids.len());
        // Still computed once: each of the five data files read once.
        assert_eq!(v["result"]["metrics"]["files_scanned"], 5, "{}", v["result"]["metrics"]);
    }
}

/// Bytes a query read from data files (`x-skiff-bytes-scanned`).
fn bytes_read(s: &Server, sql: &str) -> u64 {
    let r = s.post("/query", json!({ "query": sql }).to_string());
    assert_eq!(r.status(), 200);
    r.headers()["x-skiff-bytes-scanned"].to_str().unwrap().parse().unwrap()
}

/// A filter and a bucket that a file's id bounds decide are decided once for the file
/// (`lake/per_file/`), and the file's rows are then not read at all. Files hold ids 0-9,
/// 100-109, 200-202, 300 and 400-403.
#[test]
fn a_files_bounds_decide_its_filter_and_buckets() {
    let s = &lake().1;
    let buckets = "SELECT id / 100 AS b, count(*) AS n FROM glass.tk WHERE id >= 100 GROUP BY 1 ORDER BY 1";
    assert!(plan(s, buckets).contains("folded per file"), "{}", plan(s, buckets));
    let want = json!([{"b": 1, "n": 10}, {"b": 2, "n": 3}, {"b": 3, "n": 1}, {"b": 4, "n": 4}]);
    assert_eq!(Value::Array(s.rows(buckets)), want);
    // Every file is decided by its bounds, so no column is read; `id % 100` needs every id.
    assert_eq!(bytes_read(s, buckets), 0);
    assert!(bytes_read(s, &buckets.replace("id / 100", "id % 100")) > 0);

    // A filter edge inside the file of 100-109, and buckets of 5 that split it and no other.
    let edges = "SELECT id / 5 AS b, count(*) AS n, min(id) AS lo FROM glass.tk \
                 WHERE id >= 105 AND id < 300 GROUP BY 1 ORDER BY 1";
    assert!(plan(s, edges).contains("folded per file"), "{}", plan(s, edges));
    let want = json!([{"b": 21, "n": 5, "lo": 105}, {"b": 40, "n": 3, "lo": 200}]);
    assert_eq!(Value::Array(s.rows(edges)), want);
    let split = "SELECT id / 5 AS b, count(*) AS n FROM glass.tk WHERE id < 200 GROUP BY 1 ORDER BY 1";
    let want = json!([
        {"b": 0, "n": 5}, {"b": 1, "n": 5}, {"b": 20, "n": 5}, {"b": 21, "n": 5}
    ]);
    assert_eq!(Value::Array(s.rows(split)), want);
}

/// A group key of one table's column is computed next to that table's scan, below a join
/// (`engine/group_keys.rs`), where the scan folds it per file; but never on the side of an
/// outer join whose rows may be missing, where the key of the NULLs it adds is computed above.
#[test]
fn group_keys_go_to_the_scan_on_the_side_a_join_keeps() {
    let s = &lake().1;
    let kept = "SELECT t.id / 100 AS b, count(u.ev) AS n FROM glass.tk t \
                LEFT JOIN (SELECT DISTINCT ev FROM glass.tk WHERE ev = 'x') u ON u.ev = t.ev \
                WHERE t.id >= 100 GROUP BY 1 ORDER BY 1";
    let p = plan(s, kept);
    assert!(p.contains("__skiff_group_key_0") && p.contains("folded per file"), "{p}");
    let want = json!([{"b": 1, "n": 10}, {"b": 2, "n": 0}, {"b": 3, "n": 0}, {"b": 4, "n": 0}]);
    assert_eq!(Value::Array(s.rows(kept)), want);

    // t's ids each matched with the id 100 above it, when there is one.
    let missing = "SELECT coalesce(u.id, 0) / 100 AS b, count(*) AS n FROM glass.tk t \
                   LEFT JOIN glass.tk u ON u.id = t.id + 100 GROUP BY 1 ORDER BY 1";
    assert!(!plan(s, missing).contains("__skiff_group_key"), "{}", plan(s, missing));
    let want = json!([
        {"b": 0, "n": 13}, {"b": 1, "n": 10}, {"b": 2, "n": 3}, {"b": 3, "n": 1}, {"b": 4, "n": 1}
    ]);
    assert_eq!(Value::Array(s.rows(missing)), want);
}

/// A scan filtering while it decodes tests first the condition that kept the fewest rows in
/// its sample (`lake/row_filter.rs`), whichever order the query wrote them in; the shares
/// travel with the scan's own files, so another table's samples never decide it. In the demo
/// lake `purchase` is 2% of events and `proj_beta` 15%. Whether a row filter pays at all is
/// measured on the same sample.
#[test]
fn a_row_filter_tests_its_most_selective_condition_first() {
    let dir = tempdir();
    demo_lake(dir.path(), 50_000);
    let predicate = |s: &Server, conditions: &str| {
        let sql = format!("SELECT count(*), max(props), max(url) FROM glass.events_v2 WHERE {conditions}");
        let text = plan(s, &sql);
        let at = text.find("predicate=").unwrap_or_else(|| panic!("no predicate in {text}"));
        text[at..].split(", pruning_predicate").next().unwrap().to_string()
    };
    let (beta, purchase) = ("project_id = 'proj_beta'", "event = 'purchase'");
    let want = "predicate=event@4 = purchase AND project_id@1 = proj_beta";
    let s = Server::lake(dir.path());
    assert_eq!(predicate(&s, &format!("{beta} AND {purchase}")), want);
    assert_eq!(predicate(&s, &format!("{purchase} AND {beta}")), want);
    let count = format!("SELECT count(*) AS n FROM glass.events_v2 WHERE {beta} AND {purchase}");
    let n = s.rows(&count)[0]["n"].clone();
    // Only skipped columns of variable width make a row filter pay: with strings to skip the
    // scan filters while decoding (the filter's column is not in its output, no FilterExec);
    // with only fixed-width ones a FilterExec filters decoded batches. Both count 2% of rows.
    let strings =
        format!("SELECT count(*) AS n, max(url) AS u, max(props) AS p FROM glass.events_v2 WHERE {purchase}");
    let fixed = format!(
        "SELECT count(*) AS n, max(timestamp) AS t, max(revenue) AS r FROM glass.events_v2 WHERE {purchase}"
    );
    assert!(!plan(&s, &strings).contains("FilterExec"), "{}", plan(&s, &strings));
    assert!(plan(&s, &fixed).contains("FilterExec: event@"), "{}", plan(&s, &fixed));
    assert_eq!(s.rows(&strings)[0]["n"], s.rows(&fixed)[0]["n"]);
    drop(s);
    // With the rule off, the query's order stays, and the answer.
    let off = Server::start(Opts {
        args: [lake_args(dir.path()), vec!["--disable-rules".into(), "selective_first".into()]].concat(),
        ..Default::default()
    });
    assert_eq!(
        predicate(&off, &format!("{beta} AND {purchase}")),
        "predicate=project_id@1 = proj_beta AND event@4 = purchase"
    );
    assert_eq!(off.rows(&count)[0]["n"], n);
}

/// A hash join whose two inputs are hash-partitioned (forced here on a small lake) filters its
/// probe side's scan by the build side's keys: with `unioned_join_filters` as one IN list,
/// without it (and without `key_bitmap_join_filters`, which shares its wrapper) as a CASE over
/// each row's partition. Both keep the rows the join needs.
#[test]
fn a_partitioned_joins_filter_keeps_the_rows_it_needs() {
    let dir = &lake().0;
    let sql = "SELECT a.id AS a, b.id AS b FROM glass.tk a JOIN glass.tk b ON a.id = b.id + 100 \
               WHERE a.ev = 'x' ORDER BY a.id";
    let want: Vec<Value> = (0..10).map(|i| json!({"a": 100 + i, "b": i})).collect();
    for off in ["none", "unioned_join_filters,key_bitmap_join_filters"] {
        let mut args = lake_args(dir.path());
        for o in [
            "datafusion.optimizer.hash_join_single_partition_threshold=0",
            "datafusion.optimizer.hash_join_single_partition_threshold_rows=0",
            "datafusion.execution.target_partitions=4",
        ] {
            args.extend(["--datafusion-option".into(), o.into()]);
        }
        if off != "none" {
            args.extend(["--disable-rules".into(), off.into()]);
        }
        let s = Server::start(Opts { args, ..Default::default() });
        let shown = plan(&s, sql);
        assert!(shown.contains("mode=Partitioned"), "{shown}");
        assert_eq!(shown.contains("Unioned("), off == "none", "{shown}");
        assert_eq!(s.rows(sql), want, "with {off} off");
    }
}
