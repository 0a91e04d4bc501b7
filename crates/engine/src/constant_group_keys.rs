//! Constant group keys are dropped from a grouping that has other keys.
//!
//! A scalar subquery turned into a join groups by its correlated column and by a constant
//! (`GROUP BY l_partkey, true AS __always_true`, TPC-H q2, q17, q20). The constant key costs
//! more than its bytes: DataFusion sees a constant column as sorted, so the aggregation runs
//! as partially sorted, which neither spills nor emits early when memory runs out. Spread over
//! four workers, each with a smaller fair share of its pool, TPC-H q17 at scale factor 10
//! fails with 507 with this rule off. Grouped by `l_partkey` alone it also takes the
//! single-primitive-key path, not the row format of two keys.
//!
//! Why the answer cannot change: a constant is the same on every row, so grouping by it as
//! well as by another key makes the same groups as that key alone; the constant is projected
//! back above. When the constants are all the keys, nothing is done: `GROUP BY <constant>`
//! answers no row over no rows, an aggregation without keys one (difftest regression 011).
//! That is what DataFusion's `EliminateGroupByConstant` gets wrong, and why skiff runs this
//! rule in its place.
//!
//! Upstream: DataFusion's `EliminateGroupByConstant` does this and also drops the last key;
//! goes when that rule keeps a grouping's last key (no issue filed yet) and is back in
//! skiff's list.

use datafusion::common::Result;
use datafusion::common::tree_node::Transformed;
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, LogicalPlanBuilder};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

#[derive(Debug, Default)]
pub struct ConstantGroupKeys;

impl OptimizerRule for ConstantGroupKeys {
    fn name(&self) -> &str {
        "constant_group_keys"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn supports_rewrite(&self) -> bool {
        true
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(aggregate) = &plan else { return Ok(Transformed::no(plan)) };
        // A grouping set's keys are not plain keys: left alone.
        let plain = !aggregate.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_)));
        let (constant, keys): (Vec<&Expr>, Vec<&Expr>) =
            aggregate.group_expr.iter().partition(|e| is_constant(e));
        if !plain || constant.is_empty() || keys.is_empty() {
            return Ok(Transformed::no(plan));
        }
        let keys = keys.into_iter().cloned().collect();
        let fewer = Aggregate::try_new(aggregate.input.clone(), keys, aggregate.aggr_expr.clone())?;
        // The same columns in the same order: the keys and aggregates are read from the new
        // aggregation's output by name, the constants computed again.
        let columns = aggregate.group_expr.iter().chain(&aggregate.aggr_expr).cloned();
        let projected = LogicalPlanBuilder::from(LogicalPlan::Aggregate(fewer)).project(columns)?.build()?;
        Ok(Transformed::yes(projected))
    }
}

fn is_constant(e: &Expr) -> bool {
    match e {
        Expr::Alias(a) => is_constant(&a.expr),
        Expr::Literal(..) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::is_constant;
    use crate::rules::Disabled;
    use crate::testing::session;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::LogicalPlan;
    use std::sync::Arc;

    fn t() -> (&'static str, RecordBatch) {
        let schema =
            Schema::new(vec![Field::new("k", DataType::Int64, true), Field::new("v", DataType::Int64, true)]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![Some(1), Some(1), Some(2), None, Some(3)])),
                Arc::new(Int64Array::from(vec![10, 20, 30, 40, 50])),
            ],
        )
        .unwrap();
        ("t", batch)
    }

    /// The answer of `sql` with the rules in `off` off, and the constant group keys of its
    /// optimized plan's aggregations.
    async fn answer_and_constant_keys(off: &[&str], sql: &str) -> (String, usize) {
        let names: Vec<String> = off.iter().map(|s| s.to_string()).collect();
        let ctx = session(&Disabled::parse(&names).unwrap(), 64 << 20, &[t()]);
        let df = ctx.sql(sql).await.unwrap();
        let mut constants = 0;
        df.clone()
            .into_optimized_plan()
            .unwrap()
            .apply(|node| {
                if let LogicalPlan::Aggregate(a) = node {
                    constants += a.group_expr.iter().filter(|e| is_constant(e)).count();
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .unwrap();
        (pretty_format_batches(&df.collect().await.unwrap()).unwrap().to_string(), constants)
    }

    #[tokio::test]
    async fn constants_go_from_a_grouping_with_other_keys_and_answers_stay() {
        for sql in [
            "SELECT k, 'x' AS c, sum(v) AS s FROM t GROUP BY k, 'x' ORDER BY k",
            "SELECT 1 AS one, k, count(*) AS n FROM t GROUP BY 1, k ORDER BY k",
            "SELECT k, NULL AS nothing, max(v) FROM t WHERE v > 100 GROUP BY k, NULL",
            // A decorrelated scalar subquery: grouped by `k, true AS __always_true`.
            "SELECT k, v FROM t o WHERE v > (SELECT avg(v) FROM t i WHERE i.k = o.k) ORDER BY k, v",
        ] {
            let (with, left) = answer_and_constant_keys(&[], sql).await;
            let (without, before) = answer_and_constant_keys(&["constant_group_keys"], sql).await;
            assert_eq!(with, without, "{sql}");
            assert!(before > 0, "{sql}: no constant key to start with");
            assert_eq!(left, 0, "{sql}: a constant key is left");
        }
    }

    #[tokio::test]
    async fn a_grouping_by_constants_alone_is_left_as_it_is() {
        // Over no rows: no group, where an aggregation without keys would answer one row.
        let sql = "SELECT 'x' AS c, count(*) AS n FROM t WHERE v > 100 GROUP BY 'x'";
        let (answer, constants) = answer_and_constant_keys(&[], sql).await;
        assert!(!answer.contains("| x"), "{answer}");
        assert_eq!(constants, 1);
    }
}
