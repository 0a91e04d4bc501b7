//! A hash join's key pair that both inputs fix to the same value is dropped from its keys.
//!
//! A join on `(device_id, project_id)` under `WHERE project_id = 'proj_alpha'` (the Worker's
//! unique_people: identities are per project) has `project_id` fixed on both sides: the
//! filter holds it on one, and DataFusion infers it for the other through the join's
//! equality. The join still hashes and compares that string for every one of the 14M rows it
//! probes at 30M events.
//!
//! Why the answer cannot change: when both sides of a key pair are the same non-NULL value
//! on every row (DataFusion's equivalence properties say so, from filters and literals), the
//! pair's equality is true for every pair of rows, so it decides no match, for any join type.
//! At least one key stays, and a pair whose values differ or may be NULL stays.
//!
//! Upstream: no DataFusion rule or issue; goes when DataFusion's join planning drops key
//! pairs its equivalence properties fix, and unique_people is no slower with this rule off.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_expr::{AcrossPartitions, PhysicalExprRef};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashJoinExec;

#[derive(Debug, Default)]
pub struct ConstantJoinKeys;

impl PhysicalOptimizerRule for ConstantJoinKeys {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(join) = node.as_any().downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            let (left, right) =
                (&join.left().properties().eq_properties, &join.right().properties().eq_properties);
            let fixed = |(l, r): &(PhysicalExprRef, PhysicalExprRef)| match (
                left.is_expr_constant(l),
                right.is_expr_constant(r),
            ) {
                (Some(AcrossPartitions::Uniform(Some(a))), Some(AcrossPartitions::Uniform(Some(b)))) => {
                    !a.is_null() && a == b
                }
                _ => false,
            };
            let kept: Vec<_> = join.on().iter().filter(|pair| !fixed(pair)).cloned().collect();
            if kept.len() == join.on().len() || kept.is_empty() {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(join.builder().with_on(kept).build_exec()?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "constant_join_keys"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::displayable;

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::{answer, session};

    /// Events of two projects, and identities per project and device; some devices and
    /// projects are NULL.
    fn tables() -> Vec<(&'static str, RecordBatch)> {
        let strings = |v: Vec<Option<String>>| std::sync::Arc::new(StringArray::from(v));
        let at = |i: usize, n: usize, prefix: &str| (i % 7 != 6).then(|| format!("{prefix}{}", i % n));
        let events = RecordBatch::try_new(
            std::sync::Arc::new(Schema::new(vec![
                Field::new("project", DataType::Utf8, true),
                Field::new("device", DataType::Utf8, true),
            ])),
            vec![
                strings((0..300).map(|i| at(i, 2, "p")).collect()),
                strings((0..300).map(|i| at(i + 3, 40, "d")).collect()),
            ],
        )
        .unwrap();
        let identities = RecordBatch::try_new(
            std::sync::Arc::new(Schema::new(vec![
                Field::new("project", DataType::Utf8, true),
                Field::new("device", DataType::Utf8, true),
                Field::new("person", DataType::Utf8, true),
            ])),
            vec![
                strings((0..60).map(|i| at(i, 3, "p")).collect()),
                strings((0..60).map(|i| at(i, 30, "d")).collect()),
                strings((0..60).map(|i| Some(format!("u{i}"))).collect()),
            ],
        )
        .unwrap();
        vec![("events", events), ("identities", identities)]
    }

    /// The keys of every hash join in `plan`.
    fn join_keys(plan: &std::sync::Arc<dyn ExecutionPlan>) -> usize {
        let own = plan.as_any().downcast_ref::<HashJoinExec>().map_or(0, |j| j.on().len());
        own + plan.children().into_iter().map(join_keys).sum::<usize>()
    }

    #[tokio::test]
    async fn a_key_pair_both_sides_fix_to_one_value_is_dropped_and_answers_stay() {
        let on = session(&Disabled::default(), 64 << 20, &tables());
        let only = session(&crate::testing::only(&["constant_join_keys"]), 64 << 20, &tables());
        let off = session(&Disabled::all(), 64 << 20, &tables());
        for (sql, dropped) in [
            // Fixed on both sides, the left side by the filter and the right by inference.
            (
                "SELECT e.project, e.device, i.person FROM events e LEFT JOIN identities i \
                 ON i.device = e.device AND i.project = e.project WHERE e.project = 'p1'",
                true,
            ),
            (
                "SELECT e.device, count(i.person) AS people FROM events e JOIN identities i \
                 ON i.device = e.device AND i.project = e.project WHERE e.project = 'p0' GROUP BY e.device",
                true,
            ),
            // Fixed by literals, to the same value and to different ones: then the pair decides
            // that nothing matches.
            (
                "SELECT e.device, i.person FROM (SELECT 'p1' AS project, device FROM events) e \
                 LEFT JOIN (SELECT 'p1' AS project, device, person FROM identities) i \
                 ON i.device = e.device AND i.project = e.project",
                true,
            ),
            (
                "SELECT e.device, i.person FROM (SELECT 'p1' AS project, device FROM events) e \
                 LEFT JOIN (SELECT 'p2' AS project, device, person FROM identities) i \
                 ON i.device = e.device AND i.project = e.project",
                false,
            ),
            // Fixed on one side only: identities of every project are kept.
            (
                "SELECT e.device, i.project, i.person FROM (SELECT * FROM events WHERE project = 'p1') e \
                 RIGHT JOIN identities i ON i.device = e.device AND i.project = e.project",
                false,
            ),
            // A full join whose filter makes it a right join fixes both sides again.
            (
                "SELECT e.device, i.person FROM events e FULL JOIN identities i \
                 ON i.device = e.device AND i.project = e.project WHERE e.project = 'p1'",
                true,
            ),
        ] {
            let with = only.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let without = off.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            let shown =
                |p: &std::sync::Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(false).to_string();
            assert_eq!(
                join_keys(&with) < join_keys(&without),
                dropped,
                "{sql}\nwith:\n{}\nwithout:\n{}",
                shown(&with),
                shown(&without)
            );
            let expected = answer(&off, sql).await;
            assert!(!expected.starts_with("error"), "{expected}");
            assert_eq!(answer(&only, sql).await, expected, "{sql}");
            assert_eq!(answer(&on, sql).await, expected, "{sql}");
        }
    }
}
