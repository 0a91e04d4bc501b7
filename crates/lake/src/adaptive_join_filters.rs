//! A join's filter on a scan that stops testing rows while it keeps nearly all of them.
//!
//! A hash join hands its probe side's scan a dynamic filter: its build keys' bounds, and their
//! membership (an IN list, or a lookup in the join's hash table). When the build side holds
//! every key the probe side has (TPC-H q07 joins every order to line items), the filter keeps
//! every row, yet each row is hashed and looked up in a table of 1.5M orders, and then the
//! join looks it up again. In q05, q07 and q08 at scale factor 1, evaluating join filters was
//! a fifth of the CPU. So each filter counts the rows it keeps, over windows of
//! [`WINDOW`] rows: while a window kept at least [`KEEPS`] of them, the filter answers true
//! without testing, except on one batch in [`RESAMPLE`], which keeps the count going and turns
//! testing back on when the filter starts to drop rows. A new form of the filter (the join's
//! build finished, a top-k's bound tightened) starts the count again.
//!
//! Why the answer cannot change: a dynamic filter only lets a scan skip rows its producer
//! would drop anyway (a join without a match, a row below a top-k's bound); keeping such a row
//! costs time only. Pruning of files, row groups and pages reads the filter's current form
//! ([`PhysicalExpr::snapshot`]), which this does not change.
//!
//! The count is shared by the filter's copies (one per file read, each over that file's
//! columns) and by the scan's partitions, in relaxed atomics: it decides speed only.
//!
//! Upstream: DataFusion tracks no dynamic filter's selectivity yet (apache/datafusion#19858
//! measures the cost on TPC-H; #20363 and #22234 propose tracking it); this goes when a filter
//! that keeps every row costs nothing upstream and q07 is no slower with this rule off.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use arrow::datatypes::{DataType, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{DynamicFilterPhysicalExpr, InListExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::HashTableLookupExpr;

use crate::join_filters::{UnionedJoinFilter, Wrap, wrap_scan_filters};
use crate::masks::truth;

/// Rows counted before deciding whether to test.
const WINDOW: u64 = 65_536;
/// The share of a window's rows kept at which a filter stops testing. Below it, the rows it
/// drops save their other columns' decoding and the join's own lookup, which costs about what
/// the filter's does.
const KEEPS: f64 = 0.8;
/// While not testing, one batch in this many is still tested.
const RESAMPLE: u64 = 16;

/// Wraps the dynamic filters in Parquet scans' predicates in [`AdaptiveJoinFilter`].
#[derive(Debug, Default)]
pub struct AdaptiveJoinFilters;

impl PhysicalOptimizerRule for AdaptiveJoinFilters {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        wrap_scan_filters(plan, |_, e| {
            let any = e.as_any();
            if any.is::<AdaptiveJoinFilter>() {
                return Wrap::Leave;
            }
            if any.is::<DynamicFilterPhysicalExpr>() || any.is::<UnionedJoinFilter>() {
                return Wrap::With(Arc::new(AdaptiveJoinFilter::new(Arc::clone(e))));
            }
            Wrap::Look
        })
    }

    fn name(&self) -> &str {
        "adaptive_join_filters"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A dynamic filter that answers true untested while it keeps nearly every row.
pub struct AdaptiveJoinFilter {
    filter: Arc<dyn PhysicalExpr>,
    count: Arc<Count>,
}

/// What the filter kept in the current window, for its current form.
struct Count {
    generation: AtomicU64,
    /// Whether the current form tests membership in a join's build side.
    joins: AtomicBool,
    rows: AtomicU64,
    kept: AtomicU64,
    untested: AtomicBool,
    batches: AtomicU64,
}

impl Default for Count {
    fn default() -> Self {
        Self {
            // No form counted yet.
            generation: AtomicU64::new(u64::MAX),
            joins: AtomicBool::new(false),
            rows: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            untested: AtomicBool::new(false),
            batches: AtomicU64::new(0),
        }
    }
}

impl AdaptiveJoinFilter {
    fn new(filter: Arc<dyn PhysicalExpr>) -> Self {
        Self { filter, count: Arc::default() }
    }

    /// Whether this batch goes untested.
    fn skip(&self) -> bool {
        let c = &self.count;
        let generation = self.filter.snapshot_generation();
        if c.generation.swap(generation, Relaxed) != generation {
            c.rows.store(0, Relaxed);
            c.kept.store(0, Relaxed);
            c.untested.store(false, Relaxed);
            c.joins.store(tests_membership(&self.filter), Relaxed);
        }
        c.joins.load(Relaxed)
            && c.untested.load(Relaxed)
            && !(c.batches.fetch_add(1, Relaxed) + 1).is_multiple_of(RESAMPLE)
    }

    fn tally(&self, rows: u64, kept: u64) {
        let c = &self.count;
        let total = c.rows.fetch_add(rows, Relaxed) + rows;
        let kept = c.kept.fetch_add(kept, Relaxed) + kept;
        if total >= WINDOW {
            c.rows.store(0, Relaxed);
            c.kept.store(0, Relaxed);
            c.untested.store(kept as f64 >= KEEPS * total as f64, Relaxed);
            c.batches.store(0, Relaxed);
        }
    }
}

/// Whether `filter`'s current form looks rows up in a join's build side (an IN list or a hash
/// table). A top-k's filter, a bound that tightens as rows arrive, is always tested: rows it
/// keeps early on are decoded in full and sorted, and later files' rows it drops all.
fn tests_membership(filter: &Arc<dyn PhysicalExpr>) -> bool {
    let Ok(Some(now)) = filter.snapshot() else { return false };
    now.exists(|e| {
        let any = e.as_any();
        Ok(any.is::<HashTableLookupExpr>()
            || any.is::<InListExpr>()
            || crate::key_bitmaps::is_lookup(e.as_ref())
            || crate::key_sets::is_key_in(e.as_ref()))
    })
    .unwrap_or(false)
}

impl PhysicalExpr for AdaptiveJoinFilter {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.filter.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.filter.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        if self.skip() {
            return Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))));
        }
        let answers = self.filter.evaluate(batch)?;
        // A filter that is always tested (a top-k's bound) need not be counted.
        if !self.count.joins.load(Relaxed) {
            return Ok(answers);
        }
        let rows = batch.num_rows();
        let kept = match &answers {
            ColumnarValue::Array(a) => truth(a.as_ref())?.count_set_bits(),
            ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))) => rows,
            ColumnarValue::Scalar(_) => 0,
        };
        self.tally(rows as u64, kept as u64);
        Ok(answers)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.filter]
    }

    /// A copy over another file's columns shares the count: it is the same filter.
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [filter]: [Arc<dyn PhysicalExpr>; 1] = children.try_into().map_err(|_| {
            datafusion::error::DataFusionError::Internal("a join filter has one child".into())
        })?;
        Ok(Arc::new(Self { filter, count: Arc::clone(&self.count) }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.filter.fmt_sql(f)
    }

    /// The filter's current form, never this wrapper: a snapshot is taken children first, so
    /// the filter under this one may already be a plain expression, and pruning cannot read a
    /// wrapper (a top-k's files went unpruned).
    fn snapshot(&self) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        Ok(Some(self.filter.snapshot()?.unwrap_or_else(|| Arc::clone(&self.filter))))
    }

    fn snapshot_generation(&self) -> u64 {
        self.filter.snapshot_generation()
    }
}

impl fmt::Debug for AdaptiveJoinFilter {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_tuple("AdaptiveJoinFilter").field(&self.filter).finish()
    }
}

impl fmt::Display for AdaptiveJoinFilter {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Adaptive({})", self.filter)
    }
}

impl PartialEq for AdaptiveJoinFilter {
    fn eq(&self, other: &Self) -> bool {
        self.filter.as_ref() == other.filter.as_ref()
    }
}

impl Eq for AdaptiveJoinFilter {}

impl Hash for AdaptiveJoinFilter {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.filter.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::Field;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, InListExpr, col, lit};
    use datafusion::physical_expr_common::physical_expr::snapshot_physical_expr;

    use super::*;

    fn batch(from: i64) -> RecordBatch {
        let keys = Int64Array::from_iter_values(from..from + 8192);
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
            vec![Arc::new(keys)],
        )
        .unwrap()
    }

    fn kept(filter: &AdaptiveJoinFilter, batch: &RecordBatch) -> usize {
        let answers = filter.evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap();
        answers.as_boolean().true_count()
    }

    /// `k >= from AND k IN (from..70000)`, a join's filter, under a dynamic filter the test
    /// updates.
    fn filter(from: i64) -> (Arc<DynamicFilterPhysicalExpr>, AdaptiveJoinFilter) {
        let k = col("k", &batch(0).schema()).unwrap();
        let keys = Arc::new(Int64Array::from_iter_values(from..70_000));
        let list = Arc::new(InListExpr::try_new_from_array(Arc::clone(&k), keys, false).unwrap());
        let bound = Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::GtEq, lit(from)));
        let dynamic = Arc::new(DynamicFilterPhysicalExpr::new(vec![k], lit(true)));
        dynamic.update(Arc::new(BinaryExpr::new(bound, Operator::And, list))).unwrap();
        let adaptive = AdaptiveJoinFilter::new(Arc::clone(&dynamic) as Arc<dyn PhysicalExpr>);
        (dynamic, adaptive)
    }

    #[test]
    fn a_filter_that_keeps_every_row_stops_testing_and_starts_again_when_it_drops_rows() {
        let (dynamic, adaptive) = filter(0);
        // Every row kept for a window: from then on, rows it would drop are kept untested.
        for i in 0..8 {
            assert_eq!(kept(&adaptive, &batch(i * 8192)), 8192);
        }
        let below = batch(-8192);
        assert_eq!(kept(&adaptive, &below), 8192, "untested");
        // One batch in RESAMPLE is tested still; when those drop rows, testing resumes.
        let tested: Vec<usize> = (0..RESAMPLE * 8).map(|_| kept(&adaptive, &below)).collect();
        assert!(tested.contains(&0), "a sample was tested");
        assert_eq!(tested.last(), Some(&0), "testing resumed");
        // A new form of the filter is counted afresh, and tested from the start.
        for _ in 0..8 {
            kept(&adaptive, &batch(0));
        }
        assert_eq!(kept(&adaptive, &below), 8192);
        let (renewed, _) = filter(0);
        dynamic.update(renewed.current().unwrap()).unwrap();
        assert_eq!(kept(&adaptive, &below), 0);
        // A bound without membership (a top-k's) is always tested.
        dynamic
            .update(Arc::new(BinaryExpr::new(col("k", &below.schema()).unwrap(), Operator::GtEq, lit(0i64))))
            .unwrap();
        for i in 0..8 {
            assert_eq!(kept(&adaptive, &batch(i * 8192)), 8192);
        }
        assert_eq!(kept(&adaptive, &below), 0);
    }

    #[test]
    fn a_snapshot_is_the_filters_current_form() {
        let (_, adaptive) = filter(5);
        let snapshot = snapshot_physical_expr(Arc::new(adaptive)).unwrap();
        assert!(!snapshot.exists(|e| Ok(e.as_any().is::<AdaptiveJoinFilter>())).unwrap(), "{snapshot}");
        assert!(snapshot.as_any().is::<BinaryExpr>(), "{snapshot}");
    }

    #[test]
    fn a_filter_that_drops_rows_keeps_testing() {
        // Half of each batch dropped, window after window.
        let (_, adaptive) = filter(4096);
        for _ in 0..64 {
            assert_eq!(kept(&adaptive, &batch(0)), 4096);
        }
    }
}
