//! `x NOT IN (subquery)` builds its hash table from the subquery when the subquery is the
//! smaller input, and the outer rows stream past it.
//!
//! DataFusion runs `NOT IN` as a null-aware anti join and never swaps its inputs: the outer
//! rows are the build side, collected into one hash table, and the join hands on the rows
//! nothing matched from one partition once every probe has ended. TPC-H q16 at scale factor
//! 10 collects 1.2M part-supplier rows to probe them with the few suppliers its subquery
//! keeps, then aggregates those rows in one partition.
//!
//! Here the subquery is the build side of an ordinary anti join ([`SubquerySeen`] over it
//! notes whether it had any row and any NULL), and [`NotInGate`] over the join gives the
//! null-aware answer from what was noted. By SQL, `x NOT IN (s)` is
//! - true for every row when `s` has no rows (NULL `x` included);
//! - unknown for every row when `s` has a NULL, so no row is kept;
//! - otherwise unknown where `x` is NULL (not kept), and true where `x` finds no match.
//!
//! The ordinary anti join keeps exactly the rows whose `x` matches nothing, NULL `x` included
//! (NULL matches nothing); the gate then drops everything if the subquery had a NULL, and the
//! NULL `x` if it had any row. A hash join asks its probe side for rows only once its build
//! side has ended, so the gate sees no row before the subquery is fully noted; it fails the
//! query rather than guess if that ever stops holding. A plan with a recursive query is left
//! alone: it runs its joins more than once, and the notes would keep an earlier run's.
//!
//! Upstream: DataFusion's null-aware anti join keeps the outer input as its build side
//! (`JoinSelection` never swaps one); no issue filed. Goes when DataFusion builds a `NOT IN`
//! from its subquery and TPC-H q16 at scale factor 10 is no slower with this rule off.

use std::any::Any;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use arrow::array::RecordBatch;
use arrow::compute::{filter_record_batch, is_not_null};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{JoinType, Statistics, internal_err};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{Stream, StreamExt};

#[derive(Debug, Default)]
pub struct NotInBuildsSubquery;

impl PhysicalOptimizerRule for NotInBuildsSubquery {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if plan.exists(|n| Ok(n.as_any().is::<RecursiveQueryExec>()))? {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(join) = node.as_any().downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(node));
            };
            if !join.null_aware || join.filter().is_some() || join.fetch().is_some() || !smaller(join)? {
                return Ok(Transformed::no(node));
            }
            Ok(Transformed::yes(swapped(join)?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "not_in_builds_subquery"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether the statistics say the subquery (the join's right input) is the smaller input, as
/// DataFusion's `JoinSelection` decides for the joins it may swap: by bytes when both inputs
/// have a size, else by rows. Without either, the join stays as it is.
fn smaller(join: &HashJoinExec) -> Result<bool> {
    let (outer, sub): (Statistics, Statistics) =
        (join.left().partition_statistics(None)?, join.right().partition_statistics(None)?);
    Ok(match (outer.total_byte_size.get_value(), sub.total_byte_size.get_value()) {
        (Some(o), Some(s)) => s < o,
        _ => matches!((outer.num_rows.get_value(), sub.num_rows.get_value()), (Some(o), Some(s)) if s < o),
    })
}

/// The null-aware `LeftAnti` join `join` as an ordinary `RightAnti` join built from the
/// subquery, under a [`NotInGate`] and the join's own projection.
fn swapped(join: &HashJoinExec) -> Result<Arc<dyn ExecutionPlan>> {
    let [(outer_key, sub_key)] = join.on() else {
        return internal_err!("a null-aware anti join has one key");
    };
    let seen = Arc::new(Seen::default());
    let sub: Arc<dyn ExecutionPlan> = Arc::new(SubquerySeen {
        input: Arc::clone(join.right()),
        key: Arc::clone(sub_key),
        seen: Arc::clone(&seen),
    });
    // A new join (`join.builder()` would share the old join's build), giving every column of
    // the outer input: the gate reads the key.
    let anti = HashJoinExec::try_new(
        sub,
        Arc::clone(join.left()),
        vec![(Arc::clone(sub_key), Arc::clone(outer_key))],
        None,
        &JoinType::RightAnti,
        None,
        PartitionMode::CollectLeft,
        join.null_equality(),
        false,
    )?;
    let gate: Arc<dyn ExecutionPlan> = Arc::new(NotInGate::new(Arc::new(anti), Arc::clone(outer_key), seen)?);
    // Then the `NOT IN` join's own projection.
    let Some(projection) = &join.projection else { return Ok(gate) };
    let schema = gate.schema();
    let columns = projection.iter().map(|&i| {
        let name = schema.field(i).name();
        (Arc::new(Column::new(name, i)) as PhysicalExprRef, name.clone())
    });
    Ok(Arc::new(ProjectionExec::try_new(columns, gate)?))
}

/// `plan` with every `NOT IN` this rule built turned back into DataFusion's null-aware anti
/// join, for a plan that leaves the process: [`SubquerySeen`] and [`NotInGate`] share what
/// they note in memory.
pub fn without_not_in_gates(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(gate) = node.as_any().downcast_ref::<NotInGate>() else {
            return Ok(Transformed::no(node));
        };
        let Some(anti) = gate.input.as_any().downcast_ref::<HashJoinExec>() else {
            return internal_err!("NotInGate is over its anti join");
        };
        let [(sub_key, outer_key)] = anti.on() else {
            return internal_err!("NotInGate's anti join has one key");
        };
        // The subquery as it was before the rule, without what later rules put over it.
        let sub = Arc::clone(&noted(anti.left())?.input);
        let mut outer = Arc::clone(anti.right());
        if outer.output_partitioning().partition_count() > 1 {
            outer = Arc::new(CoalescePartitionsExec::new(outer));
        }
        let join = HashJoinExec::try_new(
            outer,
            sub,
            vec![(Arc::clone(outer_key), Arc::clone(sub_key))],
            None,
            &JoinType::LeftAnti,
            None,
            PartitionMode::CollectLeft,
            anti.null_equality(),
            true,
        )?;
        // Its new build side gets the buffer copy every build side has.
        let join = crate::fixes::CompactJoinBuilds.optimize(Arc::new(join), &ConfigOptions::default())?;
        Ok(Transformed::yes(join))
    })
    .map(|t| t.data)
}

/// What the subquery had, noted as its rows go by to the join's build side.
#[derive(Debug, Default)]
struct Seen {
    rows: AtomicBool,
    nulls: AtomicBool,
    /// Partitions of the subquery read to their end.
    ended: AtomicUsize,
}

/// Passes the subquery's rows on, noting whether any came and whether any key was NULL.
#[derive(Debug)]
pub struct SubquerySeen {
    input: Arc<dyn ExecutionPlan>,
    key: PhysicalExprRef,
    seen: Arc<Seen>,
}

impl DisplayAs for SubquerySeen {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SubquerySeen: key={}", self.key)
    }
}

impl ExecutionPlan for SubquerySeen {
    fn name(&self) -> &str {
        "SubquerySeen"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("SubquerySeen has one child".into()))?;
        Ok(Arc::new(Self { input, key: Arc::clone(&self.key), seen: Arc::clone(&self.seen) }))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let schema = input.schema();
        let noting = Noting { input, key: Arc::clone(&self.key), seen: Arc::clone(&self.seen), ended: false };
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, noting)))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        self.input.partition_statistics(partition)
    }
}

/// One partition of the subquery, noting as its rows go by.
struct Noting {
    input: SendableRecordBatchStream,
    key: PhysicalExprRef,
    seen: Arc<Seen>,
    ended: bool,
}

impl Stream for Noting {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let batch = match ready!(self.input.poll_next_unpin(cx)) {
            Some(Ok(batch)) => batch,
            None => {
                if !std::mem::replace(&mut self.ended, true) {
                    self.seen.ended.fetch_add(1, Ordering::AcqRel);
                }
                return Poll::Ready(None);
            }
            error => return Poll::Ready(error),
        };
        if batch.num_rows() > 0 {
            self.seen.rows.store(true, Ordering::Release);
            let key = self.key.evaluate(&batch)?.into_array(batch.num_rows())?;
            if key.logical_null_count() > 0 {
                self.seen.nulls.store(true, Ordering::Release);
            }
        }
        Poll::Ready(Some(Ok(batch)))
    }
}

/// The [`SubquerySeen`] under an anti join's build side (under the exchange and the buffer
/// copy that later rules put over it).
fn noted(build: &Arc<dyn ExecutionPlan>) -> Result<&SubquerySeen> {
    let mut node = build;
    loop {
        if let Some(seen) = node.as_any().downcast_ref::<SubquerySeen>() {
            return Ok(seen);
        }
        match node.children()[..] {
            [only] => node = only,
            _ => return internal_err!("NotInGate's anti join builds from SubquerySeen"),
        }
    }
}

/// Over the ordinary anti join: every row goes when the subquery had a NULL, rows whose
/// outer key is NULL go when it had any row.
#[derive(Debug)]
pub struct NotInGate {
    input: Arc<dyn ExecutionPlan>,
    /// The outer key, over the anti join's output (the outer input's columns).
    key: PhysicalExprRef,
    /// Partitions the subquery has: all of them ended before the gate passes a row.
    partitions: usize,
    seen: Arc<Seen>,
}

impl NotInGate {
    fn new(input: Arc<dyn ExecutionPlan>, key: PhysicalExprRef, seen: Arc<Seen>) -> Result<Self> {
        let Some(anti) = input.as_any().downcast_ref::<HashJoinExec>() else {
            return internal_err!("NotInGate is over its anti join");
        };
        let partitions = noted(anti.left())?.input.output_partitioning().partition_count();
        Ok(Self { input, key, partitions, seen })
    }
}

impl DisplayAs for NotInGate {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "NotInGate: key={}", self.key)
    }
}

impl ExecutionPlan for NotInGate {
    fn name(&self) -> &str {
        "NotInGate"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .map_err(|_| DataFusionError::Internal("NotInGate has one child".into()))?;
        Ok(Arc::new(Self::new(input, Arc::clone(&self.key), Arc::clone(&self.seen))?))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let (key, seen, partitions) = (Arc::clone(&self.key), Arc::clone(&self.seen), self.partitions);
        let gated = input.map(move |batch| {
            let batch = batch?;
            if seen.ended.load(Ordering::Acquire) < partitions {
                return internal_err!("NOT IN: the anti join gave rows before its subquery ended");
            }
            Ok(if seen.nulls.load(Ordering::Acquire) {
                batch.slice(0, 0)
            } else if seen.rows.load(Ordering::Acquire) {
                let key = key.evaluate(&batch)?.into_array(batch.num_rows())?;
                filter_record_batch(&batch, &is_not_null(&key)?)?
            } else {
                batch
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), gated)))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::{collect, displayable};

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::{answer, only, session};

    /// `outer` (3,000 rows, every 11th key NULL), and subqueries' tables: `small` (keys 0..40
    /// by 3), `small_null` (the same and one NULL), `none` (no rows).
    fn tables() -> Vec<(&'static str, RecordBatch)> {
        let table = |keys: Vec<Option<i64>>| {
            let tags: Vec<String> = (0..keys.len()).map(|i| format!("t{}", i % 5)).collect();
            RecordBatch::try_new(
                Arc::new(Schema::new(vec![
                    Field::new("k", DataType::Int64, true),
                    Field::new("tag", DataType::Utf8, false),
                ])),
                vec![Arc::new(Int64Array::from(keys)), Arc::new(StringArray::from(tags))],
            )
            .unwrap()
        };
        let small: Vec<Option<i64>> = (0..40).step_by(3).map(Some).collect();
        let mut small_null = small.clone();
        small_null.insert(5, None);
        vec![
            ("outer_t", table((0..3000).map(|i| (i % 11 != 10).then_some(i % 97)).collect())),
            ("small", table(small)),
            ("small_null", table(small_null)),
            ("none", table(vec![])),
        ]
    }

    fn gated(plan: &Arc<dyn ExecutionPlan>) -> bool {
        plan.exists(|n| Ok(n.as_any().is::<NotInGate>())).unwrap()
    }

    #[tokio::test]
    async fn not_in_builds_from_the_smaller_subquery_and_answers_stay() {
        let on = session(&Disabled::default(), 64 << 20, &tables());
        let alone = session(&only(&["not_in_builds_subquery"]), 64 << 20, &tables());
        let off = session(&Disabled::all(), 64 << 20, &tables());
        for (sql, swaps) in [
            // NULL outer keys go, since the subquery has rows.
            ("SELECT k, tag FROM outer_t WHERE k NOT IN (SELECT k FROM small)", true),
            // A NULL in the subquery: no row is kept.
            ("SELECT k, tag FROM outer_t WHERE k NOT IN (SELECT k FROM small_null)", true),
            // No rows in the subquery: every row is kept, NULL keys too.
            ("SELECT k, tag FROM outer_t WHERE k NOT IN (SELECT k FROM none)", true),
            // A filtered subquery, the join's own projection, and an aggregation over it.
            (
                "SELECT tag, count(*) AS n, count(DISTINCT k) AS keys FROM outer_t \
                 WHERE k NOT IN (SELECT k + 1 FROM small WHERE tag <> 't2') GROUP BY tag",
                true,
            ),
            ("SELECT tag FROM outer_t WHERE k NOT IN (SELECT k FROM small_null WHERE k > 3)", true),
            // The subquery is the larger input: the join stays.
            ("SELECT k FROM small WHERE k NOT IN (SELECT k FROM outer_t WHERE k > 20)", false),
            // Correlated: the join has a filter, and stays.
            (
                "SELECT k, tag FROM outer_t o WHERE k NOT IN (SELECT k FROM small s WHERE s.tag > o.tag)",
                false,
            ),
        ] {
            let plan = alone.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            assert_eq!(gated(&plan), swaps, "{sql}\n{}", displayable(plan.as_ref()).indent(false));
            let expected = answer(&off, sql).await;
            assert!(!expected.starts_with("error"), "{expected}");
            assert_eq!(answer(&alone, sql).await, expected, "{sql}");
            assert_eq!(answer(&on, sql).await, expected, "{sql}");
        }
    }

    /// Counted by hand: each of the gate's three cases decides rows (without the gate, the
    /// first would keep NULL keys and the second would keep rows).
    #[tokio::test]
    async fn each_case_of_the_gate_decides_rows() {
        let alone = session(&only(&["not_in_builds_subquery"]), 64 << 20, &tables());
        let count = async |sub: &str| {
            let sql = format!("SELECT count(*) FROM outer_t WHERE k NOT IN (SELECT k FROM {sub})");
            let batches = alone.sql(&sql).await.unwrap().collect().await.unwrap();
            batches[0].column(0).as_primitive::<arrow::datatypes::Int64Type>().value(0) as usize
        };
        let kept = (0..3000).filter(|i| i % 11 != 10 && !(i % 97 < 40 && (i % 97) % 3 == 0)).count();
        assert_eq!(count("small").await, kept);
        assert_eq!(count("small_null").await, 0);
        assert_eq!(count("none").await, 3000);
    }

    /// A join that projects its output keeps its projection, over the gate (DataFusion's
    /// planner gives joins no projection before this rule runs; a later rule could).
    #[tokio::test]
    async fn the_joins_own_projection_goes_over_the_gate() {
        use datafusion::datasource::memory::MemorySourceConfig;
        use datafusion::physical_expr::expressions::col;

        let [outer, small, small_null, none] =
            <[RecordBatch; 4]>::try_from(tables().into_iter().map(|(_, b)| b).collect::<Vec<_>>()).unwrap();
        let ctx = datafusion::prelude::SessionContext::new().task_ctx();
        for sub in [small, small_null, none] {
            let scan = |b: &RecordBatch| {
                MemorySourceConfig::try_new_exec(&[vec![b.clone()]], b.schema(), None).unwrap()
            };
            let (outer, sub) = (scan(&outer), scan(&sub));
            let on = vec![(col("k", &outer.schema()).unwrap(), col("k", &sub.schema()).unwrap())];
            let join: Arc<dyn ExecutionPlan> = Arc::new(
                HashJoinExec::try_new(
                    outer,
                    sub,
                    on,
                    None,
                    &JoinType::LeftAnti,
                    Some(vec![1]),
                    PartitionMode::CollectLeft,
                    datafusion::common::NullEquality::NullEqualsNothing,
                    true,
                )
                .unwrap(),
            );
            let ours = NotInBuildsSubquery.optimize(Arc::clone(&join), &ConfigOptions::default()).unwrap();
            let projected =
                ours.as_any().downcast_ref::<datafusion::physical_plan::projection::ProjectionExec>();
            assert!(projected.is_some_and(|p| p.input().as_any().is::<NotInGate>()));
            assert_eq!(ours.schema(), join.schema());
            // The rows, sorted: no batch and an empty one are the same answer.
            let show = |b: Vec<RecordBatch>| {
                let all = arrow::compute::concat_batches(&join.schema(), &b).unwrap();
                let text = pretty_format_batches(&[all]).unwrap().to_string();
                let mut lines: Vec<String> = text.lines().map(String::from).collect();
                lines.sort();
                lines
            };
            let theirs = show(collect(Arc::clone(&join), Arc::clone(&ctx)).await.unwrap());
            assert_eq!(show(collect(ours, Arc::clone(&ctx)).await.unwrap()), theirs);
        }
    }

    /// A plan that leaves the process gets DataFusion's null-aware join back, and answers the same.
    #[tokio::test]
    async fn without_gates_the_plan_is_datafusions_and_answers_the_same() {
        let alone = session(&only(&["not_in_builds_subquery"]), 64 << 20, &tables());
        for sql in [
            "SELECT k, tag FROM outer_t WHERE k NOT IN (SELECT k FROM small)",
            "SELECT tag, count(*) FROM outer_t WHERE k NOT IN (SELECT k FROM small_null) GROUP BY tag",
            "SELECT tag FROM outer_t WHERE k NOT IN (SELECT k FROM none)",
        ] {
            let plan = alone.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
            assert!(gated(&plan), "{sql}");
            let back = without_not_in_gates(Arc::clone(&plan)).unwrap();
            assert!(!gated(&back));
            assert!(!back.exists(|n| Ok(n.as_any().is::<SubquerySeen>())).unwrap());
            let null_aware = back
                .exists(|n| Ok(n.as_any().downcast_ref::<HashJoinExec>().is_some_and(|j| j.null_aware)))
                .unwrap();
            assert!(null_aware, "{}", displayable(back.as_ref()).indent(false));
            let show = |b: Vec<RecordBatch>| {
                let text = pretty_format_batches(&b).unwrap().to_string();
                let mut lines: Vec<String> = text.lines().map(String::from).collect();
                lines.sort();
                lines
            };
            let ours = show(collect(plan, alone.task_ctx()).await.unwrap());
            let theirs = show(collect(back, alone.task_ctx()).await.unwrap());
            assert_eq!(ours, theirs, "{sql}");
        }
    }
}
