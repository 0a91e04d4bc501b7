//! Semi and anti joins below the joins they filter.
//!
//! `o_orderkey IN (SELECT …)` becomes a semi join, and DataFusion leaves it above the query's
//! other joins: TPC-H q18 at scale factor 10 joined 15M orders to 60M line items (a 3 GB hash
//! table) and only then kept the 624 orders the subquery names. A semi or anti join whose
//! condition reads one input of the join below it (besides the subquery) filters that input
//! instead: the join then sees only the rows it keeps. Below an inner join it goes only when
//! the join's other input is read whole (see `keeps_rows`).
//!
//! Why the answer cannot change: a semi (anti) join keeps a row when its columns find a match
//! (none) in the subquery. The rows a join makes from one input row all carry that row's
//! columns, so they are all kept or all dropped, exactly as that input row is when filtered
//! first. This holds for both inputs of an inner join and for the preserved input of an
//! outer join (`LEFT` keeps its left input's rows: a left row's null-extended output carries
//! the left row's columns too), never for the other input of an outer join, whose rows are
//! null-extended when missing. Nulls: a row whose key is null matches nothing either way; a
//! null-aware anti join (`NOT IN`) drops every row when the subquery has a null, before the
//! join as after it.
//!
//! Upstream: Spark has this as `PushLeftSemiLeftAntiThroughJoin`; DataFusion has no such rule
//! and no issue for one. Goes when DataFusion moves semi joins itself and TPC-H q18 at scale
//! factor 10 builds no hash table of every order with it off.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, JoinType, Result};
use datafusion::logical_expr::{Join, LogicalPlan};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

#[derive(Debug, Default)]
pub struct SemiJoinsFirst;

impl OptimizerRule for SemiJoinsFirst {
    fn name(&self) -> &str {
        "semi_joins_first"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(semi) = &plan else { return Ok(Transformed::no(plan)) };
        let LogicalPlan::Join(below) = semi.left.as_ref() else { return Ok(Transformed::no(plan)) };
        if !matches!(semi.join_type, JoinType::LeftSemi | JoinType::LeftAnti) {
            return Ok(Transformed::no(plan));
        }
        // The columns of the filtered side the condition reads.
        let mut read: HashSet<&Column> = semi.on.iter().flat_map(|(l, _)| l.column_refs()).collect();
        if let Some(f) = &semi.filter {
            read.extend(f.column_refs().into_iter().filter(|c| !semi.right.schema().has_column(c)));
        }
        let within = |side: &LogicalPlan| read.iter().all(|c| side.schema().has_column(c));
        // Into an outer join's preserved side always: the join keeps each of its rows. Into an
        // inner join's side only when the other side keeps all its rows (no filter): the join
        // then drops few of this side's rows, if any, and filtering them first costs no more
        // probes. Where the other side is filtered the join may keep far fewer rows than the
        // side has, and the subquery is better probed with those (TPC-H q21: line items of one
        // nation's suppliers, 1 in 25).
        let (left, right) = match below.join_type {
            JoinType::Left if within(&below.left) => (filtered(semi, &below.left)?, below.right.clone()),
            JoinType::Right if within(&below.right) => (below.left.clone(), filtered(semi, &below.right)?),
            JoinType::Inner if within(&below.left) && keeps_rows(&below.right) => {
                (filtered(semi, &below.left)?, below.right.clone())
            }
            JoinType::Inner if within(&below.right) && keeps_rows(&below.left) => {
                (below.left.clone(), filtered(semi, &below.right)?)
            }
            _ => return Ok(Transformed::no(plan)),
        };
        // The filtered side keeps its schema, so the join's does not change.
        Ok(Transformed::yes(LogicalPlan::Join(Join { left, right, ..below.clone() })))
    }
}

/// Whether `plan` is tables read whole: scans without filters or limits, joined without
/// conditions beyond keys.
fn keeps_rows(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(scan) => scan.filters.is_empty() && scan.fetch.is_none(),
        LogicalPlan::Projection(p) => keeps_rows(&p.input),
        LogicalPlan::SubqueryAlias(a) => keeps_rows(&a.input),
        LogicalPlan::Join(j) => {
            j.join_type == JoinType::Inner
                && j.filter.is_none()
                && keeps_rows(&j.left)
                && keeps_rows(&j.right)
        }
        _ => false,
    }
}

/// `semi` with `input` in place of the join it was over.
fn filtered(semi: &Join, input: &Arc<LogicalPlan>) -> Result<Arc<LogicalPlan>> {
    Ok(Arc::new(LogicalPlan::Join(Join::try_new(
        input.clone(),
        semi.right.clone(),
        semi.on.clone(),
        semi.filter.clone(),
        semi.join_type,
        semi.join_constraint,
        semi.null_equality,
        semi.null_aware,
    )?)))
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    use crate::rules::Disabled;
    use crate::testing;

    fn table(columns: &[(&str, Vec<Option<i64>>)]) -> RecordBatch {
        let fields: Vec<Field> = columns.iter().map(|(n, _)| Field::new(*n, DataType::Int64, true)).collect();
        let arrays =
            columns.iter().map(|(_, v)| std::sync::Arc::new(Int64Array::from(v.clone())) as _).collect();
        RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), arrays).unwrap()
    }

    /// Every kind of join below every kind of subquery filter, with nulls on each side and a
    /// subquery with and without a null: the rule's answers are the answers without it.
    #[tokio::test]
    async fn filters_below_joins_answer_as_above_them() {
        let n = |i: i64| (i % 7 != 3).then_some(i % 13);
        let a = table(&[("k", (0..300).map(n).collect()), ("x", (0..300).map(|i| Some(i % 5)).collect())]);
        let b = table(&[
            ("k", (0..200).map(|i| n(i + 2)).collect()),
            ("y", (0..200).map(|i| Some(i % 3)).collect()),
        ]);
        let s = table(&[
            ("k", (0..40).map(|i| Some(i % 6)).collect()),
            ("v", (0..40).map(|i| Some(i % 4)).collect()),
        ]);
        let with_null = table(&[("k", vec![Some(1), None, Some(2)]), ("v", vec![Some(0), Some(1), Some(2)])]);
        let tables = [("a", a), ("b", b), ("s", s), ("sn", with_null)];
        let only = crate::testing::only(&["semi_joins_first"]);
        let mut moved = Vec::new();
        let joins = [
            "JOIN",
            "LEFT JOIN",
            "RIGHT JOIN",
            "FULL JOIN",
            "JOIN (SELECT * FROM b WHERE y > 0)",
            // b filtered in the WHERE clause, beside the subquery, with the join a cross join
            // and a condition until DataFusion's rules have moved them.
            "CROSS JOIN",
        ];
        for join in joins {
            for filter in [
                "a.k IN (SELECT k FROM s WHERE v > 1)",
                "b.k IN (SELECT k FROM s)",
                "a.k NOT IN (SELECT k FROM s WHERE v < 2)",
                "a.k NOT IN (SELECT k FROM sn)",
                "b.k NOT IN (SELECT k FROM sn WHERE v > 0)",
                "EXISTS (SELECT 1 FROM s WHERE s.k = a.k AND s.v > a.x)",
                "NOT EXISTS (SELECT 1 FROM s WHERE s.k = b.k AND s.v <> b.y)",
                "a.x IN (SELECT v FROM s) AND b.y NOT IN (SELECT v FROM s WHERE k > 2)",
            ] {
                let sql = match join {
                    "CROSS JOIN" => format!(
                        "SELECT a.k, a.x, b.k AS bk, b.y FROM a CROSS JOIN b WHERE a.k = b.k AND b.y > 0 AND {filter}"
                    ),
                    _ => {
                        format!("SELECT a.k, a.x, b.k AS bk, b.y FROM a {join} b ON a.k = b.k WHERE {filter}")
                    }
                };
                let (on, off) = testing::on_and_off(&tables, &sql).await;
                assert!(!off.starts_with("error"), "{sql}: {off}");
                assert_eq!(on, off, "{sql}");
                let mut plans = Vec::new();
                for disabled in [only.clone(), Disabled::all()] {
                    let ctx = testing::session(&disabled, 64 << 20, &tables);
                    let plan = ctx.sql(&sql).await.unwrap().into_optimized_plan().unwrap();
                    plans.push(plan.display_indent().to_string());
                }
                if plans[0] != plans[1] {
                    moved.push((join, filter));
                }
            }
        }
        // Every filter under an inner join of whole tables; those on the preserved side of an
        // outer join; none through a full join; under an inner join with a filtered side, only
        // those on the whole side (b), never those on a, whose partner is filtered.
        let count = |join: &str| moved.iter().filter(|(j, _)| *j == join).count();
        assert_eq!(["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"].map(count), [8, 5, 3, 0], "{moved:#?}");
        for b_filtered in ["JOIN (SELECT * FROM b WHERE y > 0)", "CROSS JOIN"] {
            let filters: Vec<&str> =
                moved.iter().filter(|(j, _)| *j == b_filtered).map(|(_, f)| *f).collect();
            assert_eq!(filters.len(), 3, "{b_filtered}: {moved:#?}");
            assert!(filters.iter().all(|f| f.contains("b.") && !f.contains("a.")), "{moved:#?}");
        }
    }
}
