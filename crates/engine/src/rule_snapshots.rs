//! Before/after plan snapshots of skiff's rules that change a plan's shape: each query is
//! planned with every rule off, then with only its rule on, and both plans are kept as a
//! snapshot (`src/snapshots/`). A DataFusion upgrade or a change to a rule that moves a plan
//! shows as a snapshot diff to review (`cargo insta review`, or `INSTA_UPDATE=always` to take
//! the new plans). Answers are checked elsewhere: by each rule's tests, and by the
//! differential tests with all rules on against all off. Rules that only replace a function's
//! implementation or an expression's (`date_trunc_fixed_units`, `coalesce_views`,
//! `json_once_per_document`, `string_equalities`) leave the plan's text as it was, and the
//! scan's rules need Parquet files (`tests/plan_rules.rs`), as `range_selectivity` needs a
//! table's bounds (its tests plan over a demo lake).

use std::sync::Arc;

use arrow::array::{RecordBatch, StringViewArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::physical_plan::displayable;

use crate::rules::Disabled;
use crate::testing::{only, session};

/// 200 events of 20 devices; identities for half the devices.
fn tables() -> Vec<(&'static str, RecordBatch)> {
    let n = 200;
    let strings = |f: &dyn Fn(usize) -> String, n: usize| -> Arc<StringViewArray> {
        Arc::new((0..n).map(|i| Some(f(i))).collect::<StringViewArray>())
    };
    let events = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("project", DataType::Utf8View, false),
            Field::new("device", DataType::Utf8View, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
            Field::new("event", DataType::Utf8View, false),
        ])),
        vec![
            strings(&|i| format!("p{}", i % 3), n),
            strings(&|i| format!("d{}", i % 20), n),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values((0..n as i64).map(|i| i * 3_600_000_000))
                    .with_timezone("UTC"),
            ),
            strings(&|i| ["view", "click", "purchase"][i % 3].to_string(), n),
        ],
    )
    .unwrap();
    let identities = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("device", DataType::Utf8View, false),
            Field::new("person", DataType::Utf8View, false),
        ])),
        vec![strings(&|i| format!("d{}", i * 2), 10), strings(&|i| format!("u{i}"), 10)],
    )
    .unwrap();
    // Suppliers and customers of 5 nations, and the lines of their orders, for joins on
    // integer keys.
    let ints = |columns: &[(&str, Vec<i64>)]| {
        let fields: Vec<Field> =
            columns.iter().map(|(n, _)| Field::new(*n, DataType::Int64, false)).collect();
        let arrays = columns
            .iter()
            .map(|(_, v)| Arc::new(arrow::array::Int64Array::from(v.clone())) as arrow::array::ArrayRef)
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
    };
    let nations = ints(&[("nation", (0..5).collect()), ("region", (0..5).map(|i| i % 2).collect())]);
    let customers = ints(&[("customer", (0..50).collect()), ("nation", (0..50).map(|i| i % 5).collect())]);
    let suppliers = ints(&[("supplier", (0..20).collect()), ("nation", (0..20).map(|i| i % 5).collect())]);
    let lines = ints(&[
        ("customer", (0..400).map(|i| i % 50).collect()),
        ("supplier", (0..400).map(|i| i % 20).collect()),
    ]);
    vec![
        ("events", events),
        ("identities", identities),
        ("nations", nations),
        ("customers", customers),
        ("suppliers", suppliers),
        ("lines", lines),
    ]
}

/// The physical plans of `sql` with every rule off and with only the rules `on` on.
async fn before_and_after(on: &[&str], sql: &str) -> String {
    let rule = on.join(", ");
    let mut plans = Vec::new();
    for off in [Disabled::all(), only(on)] {
        let ctx = session(&off, 64 << 20, &tables());
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        plans.push(displayable(plan.as_ref()).indent(false).to_string());
    }
    assert_ne!(plans[0], plans[1], "{rule} left the plan of {sql} as it was");
    format!("{sql}\n\n-- before ({rule} off)\n{}\n-- after ({rule} on)\n{}", plans[0], plans[1])
}

macro_rules! snapshot {
    ($name:ident, [$($rule:literal),+], $sql:literal) => {
        #[tokio::test]
        async fn $name() {
            insta::assert_snapshot!(before_and_after(&[$($rule),+], $sql).await);
        }
    };
}

snapshot!(
    a_cte_read_twice_is_computed_once,
    ["share_repeated_subqueries"],
    "WITH d AS (SELECT device, count(*) AS n FROM events GROUP BY device) \
     SELECT a.device, a.n + b.n AS twice FROM d a JOIN d b ON a.device = b.device"
);

snapshot!(
    a_lone_distinct_count_of_strings_is_not_regrouped,
    // Skipping DataFusion's rewrite is for skiff's own count(DISTINCT): the two go together.
    ["single_distinct_unless_strings", "distinct_strings_count"],
    "SELECT project, count(DISTINCT device) AS devices FROM events GROUP BY project"
);

snapshot!(
    a_subquery_filters_the_join_input_it_reads,
    ["semi_joins_first"],
    "SELECT e.event, i.person FROM events e JOIN identities i ON e.device = i.device \
     WHERE e.project IN (SELECT project FROM events WHERE event = 'purchase' GROUP BY project HAVING count(*) > 20)"
);

snapshot!(
    a_group_key_is_computed_next_to_its_scan,
    ["group_keys_at_scan"],
    "SELECT date_trunc('week', e.ts) AS week, count(i.person) AS people \
     FROM events e JOIN identities i ON e.device = i.device GROUP BY 1"
);

snapshot!(
    lag_over_sorted_partitions_runs_in_one_pass,
    ["whole_partition_windows"],
    "SELECT device, ts, lag(event) OVER (PARTITION BY device ORDER BY ts) AS before FROM events"
);

snapshot!(
    lead_grouped_by_a_count_groups_its_partitions_by_hash,
    ["whole_partition_windows", "hashed_windows"],
    "SELECT event, next, count(*) AS n FROM \
     (SELECT event, lead(event) OVER (PARTITION BY device ORDER BY ts) AS next FROM events) GROUP BY 1, 2"
);

snapshot!(
    lead_in_the_order_of_its_sort_keeps_the_sort,
    ["whole_partition_windows", "hashed_windows"],
    "SELECT device, ts, lead(event) OVER (PARTITION BY device ORDER BY ts) AS next FROM events \
     ORDER BY device, ts"
);

snapshot!(
    a_cross_join_yields_to_the_runtime,
    ["yielding_joins"],
    "SELECT e.device, i.person FROM events e CROSS JOIN identities i"
);

snapshot!(
    a_scalar_subquery_groups_by_its_key_alone,
    ["constant_group_keys"],
    "SELECT device, ts FROM events o WHERE ts > (SELECT min(ts) FROM events i WHERE i.device = o.device)"
);

snapshot!(
    a_probe_side_starts_after_its_build_side_and_each_key_filters_its_own_scan,
    ["probe_after_build", "per_key_join_filters"],
    "SELECT n.nation, count(*) AS n FROM customers c, lines l, suppliers s, nations n \
     WHERE l.customer = c.customer AND l.supplier = s.supplier AND c.nation = s.nation \
     AND s.nation = n.nation AND n.region = 0 GROUP BY n.nation"
);

snapshot!(
    a_partial_aggregation_is_capped,
    ["bounded_partials"],
    "SELECT customer, count(*) AS lines FROM lines GROUP BY customer"
);

snapshot!(
    a_join_key_both_sides_fix_is_dropped,
    ["constant_join_keys"],
    "SELECT a.event, b.event AS later FROM events a JOIN events b ON a.device = b.device AND a.project = b.project \
     WHERE a.project = 'p1' AND b.ts > a.ts"
);

snapshot!(
    a_not_in_builds_from_its_smaller_subquery,
    ["not_in_builds_subquery"],
    "SELECT c.nation, count(*) AS n FROM lines l JOIN customers c ON l.customer = c.customer \
     WHERE nullif(l.supplier, 0) NOT IN (SELECT nullif(supplier, 0) FROM suppliers WHERE nation = 2) GROUP BY c.nation"
);
