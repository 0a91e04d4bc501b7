//! A partitioned hash join's filter on its probe side's scan, as one IN list, or else evaluated
//! branch by branch ([`Routed`]).
//!
//! A hash join whose inputs are both hash-partitioned fills its dynamic filter with one branch
//! per partition: `CASE hash_repartition(key) % n WHEN 0 THEN <bounds> AND key IN (…) WHEN 1
//! THEN … ELSE false END`. Each row of the scan is hashed and routed to its branch: in TPC-H q17
//! at scale factor 1 that filter took 481 ms over 6M rows (80 ns a row), where the collect-left
//! join's single lookup over the same rows took 50 ms. When every branch holds an IN list over
//! the same key, the filter is evaluated as one IN list of all the lists' values.
//!
//! Why the answer cannot change: a dynamic filter only lets the scan skip rows the join would
//! drop; the join still matches every row it gets. The IN list of the union keeps every row the
//! CASE keeps (a row the CASE keeps is in its branch's list), so it drops no row the join would
//! match. It keeps no more either: a build key in partition i's list hashes to i, so a probe row
//! with that key is routed to branch i, whose bounds hold its key.
//!
//! Upstream: DataFusion builds the CASE in `SharedBuildAccumulator` (hash_join/shared_bounds.rs)
//! and has no issue filed for this; goes when a partitioned join's filter of small build sides
//! is one lookup upstream and TPC-H q17's subquery scan is no slower with this rule off.

use std::any::Any;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::compute::filter_record_batch;
use arrow::compute::kernels::cmp::eq;
use arrow::datatypes::{DataType, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::datasource::physical_plan::FileSource;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CaseExpr, DynamicFilterPhysicalExpr, InListExpr, Literal,
};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use crate::key_bitmaps::KeyBitmaps;
use crate::masks::{deposit, truth};
use crate::reader::with_parquet_source;

/// Wraps the dynamic filters in Parquet scans' predicates in [`UnionedJoinFilter`].
#[derive(Debug, Clone, Copy)]
pub struct UnionedJoinFilters {
    /// A partitioned join's CASE as one IN list, or else evaluated branch by branch.
    pub unions: bool,
    /// Lookups of one integer key answered from a bitmap ([`crate::key_bitmaps`]).
    pub key_bitmaps: bool,
}

impl PhysicalOptimizerRule for UnionedJoinFilters {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        wrap_scan_filters(plan, |scan, e| {
            if e.as_any().is::<UnionedJoinFilter>() {
                return Wrap::Leave;
            }
            if !e.as_any().is::<DynamicFilterPhysicalExpr>() {
                return Wrap::Look;
            }
            let rows = scan.partition_statistics(None).ok().and_then(|s| s.num_rows.get_value().copied());
            Wrap::With(Arc::new(UnionedJoinFilter::new(Arc::clone(e), *self, rows.unwrap_or(0) as u64)))
        })
    }

    fn name(&self) -> &str {
        "unioned_join_filters"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// What [`wrap_scan_filters`] does with one part of a scan's predicate.
pub(crate) enum Wrap {
    /// Put this in its place.
    With(Arc<dyn PhysicalExpr>),
    /// Leave it and what is under it.
    Leave,
    /// Look under it.
    Look,
}

/// `plan` with the parts of each Parquet scan's predicate that `wrap` wraps replaced.
pub(crate) fn wrap_scan_filters(
    plan: Arc<dyn ExecutionPlan>,
    wrap: impl Fn(&Arc<dyn ExecutionPlan>, &Arc<dyn PhysicalExpr>) -> Wrap,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let changed = with_parquet_source(&node, |source| {
            let wrapped = source
                .filter()?
                .transform_down(|e| {
                    Ok(match wrap(&node, &e) {
                        Wrap::With(w) => Transformed::new(w, true, TreeNodeRecursion::Jump),
                        Wrap::Leave => Transformed::new(e, false, TreeNodeRecursion::Jump),
                        Wrap::Look => Transformed::no(e),
                    })
                })
                .ok()?;
            wrapped.transformed.then(|| source.with_predicate(wrapped.data))
        });
        Ok(changed.map_or_else(|| Transformed::no(node), Transformed::yes))
    })
    .map(|t| t.data)
}

/// A dynamic filter evaluated in the form [`unioned`] and [`KeyBitmaps`] make of its current one.
pub struct UnionedJoinFilter {
    dynamic: Arc<dyn PhysicalExpr>,
    ways: UnionedJoinFilters,
    /// The form last made, and the filter's generation it was made from.
    made: Mutex<Option<(u64, Arc<dyn PhysicalExpr>)>>,
    /// Shared with the filter's copies (one per file read), each renumbered to its file.
    bitmaps: Arc<KeyBitmaps>,
}

impl UnionedJoinFilter {
    /// `dynamic` on a scan that reads `scan_rows` rows.
    fn new(dynamic: Arc<dyn PhysicalExpr>, ways: UnionedJoinFilters, scan_rows: u64) -> Self {
        let bitmaps = Arc::new(KeyBitmaps::for_scan(scan_rows));
        Self { dynamic, ways, made: Mutex::new(None), bitmaps }
    }

    fn current(&self) -> Result<Arc<dyn PhysicalExpr>> {
        let generation = self.dynamic.snapshot_generation();
        let mut made = self.made.lock().expect("join filter lock");
        if let Some((g, e)) = made.as_ref()
            && *g == generation
        {
            return Ok(Arc::clone(e));
        }
        let now = self.dynamic.snapshot()?.unwrap_or_else(|| Arc::clone(&self.dynamic));
        let e = match self.ways.unions {
            true => unioned(&now)?.unwrap_or(now),
            false => now,
        };
        let e = match self.ways.key_bitmaps {
            true => self.bitmaps.apply(e)?,
            false => e,
        };
        *made = Some((generation, Arc::clone(&e)));
        Ok(e)
    }
}

/// `filter` as one IN list, when it is a CASE whose every branch holds a (not negated) IN list
/// over the same expression, and whose other outcome is false.
fn unioned(filter: &Arc<dyn PhysicalExpr>) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let Some(case) = filter.as_any().downcast_ref::<CaseExpr>() else { return Ok(None) };
    let otherwise_false = case.else_expr().is_none_or(|e| {
        e.as_any().downcast_ref::<Literal>().is_some_and(|l| l.value() == &ScalarValue::Boolean(Some(false)))
    });
    if case.expr().is_none() || !otherwise_false || case.when_then_expr().is_empty() {
        return Ok(None);
    }
    let mut key: Option<&Arc<dyn PhysicalExpr>> = None;
    // A join's lists hold its build side's keys row by row, repeats included (TPC-H q17's hold
    // 6,086 rows of 204 parts). Each value once keeps the same rows, and every file's scan
    // remakes and walks the list (its row filter, pruning and page index), so each costs less.
    let mut seen = HashSet::new();
    let mut values = Vec::new();
    for (_, then) in case.when_then_expr() {
        let Some(list) = in_list_of(then) else { return Ok(None) };
        if list.negated() || key.is_some_and(|k| k.as_ref() != list.expr().as_ref()) {
            return Ok(None);
        }
        key = Some(list.expr());
        for v in list.list() {
            let Some(l) = v.as_any().downcast_ref::<Literal>() else { return Ok(None) };
            if seen.insert(l.value()) {
                values.push(l.value().clone());
            }
        }
    }
    let Some(key) = key.filter(|_| !values.is_empty()) else { return Ok(None) };
    let array = ScalarValue::iter_to_array(values)?;
    Ok(Some(Arc::new(InListExpr::try_new_from_array(Arc::clone(key), array, false)?)))
}

/// A partitioned join's filter whose branches are not all IN lists (a branch of a build side
/// over `hash_join_inlist_pushdown_max_distinct_values` looks its key up in the join's hash
/// table), evaluated branch by branch on only the rows routed there.
///
/// DataFusion's `CaseExpr` does the same and then merges the branches' answers row by row
/// (`merge_n`); in TPC-H q12 at scale factor 1 that merge, and the AND inside each branch
/// writing its answers back slice by slice, were a sixth of the query's CPU. Here each
/// branch's answers are deposited into one bitmap. The answer is the CASE's exactly: a row
/// takes the first branch whose value its routing value equals, and a row no branch takes
/// is false, or NULL when the CASE has no ELSE.
struct Routed<'a> {
    case: &'a CaseExpr,
    route: &'a Arc<dyn PhysicalExpr>,
    branches: Vec<(&'a ScalarValue, &'a Arc<dyn PhysicalExpr>)>,
    otherwise_null: bool,
}

impl<'a> Routed<'a> {
    /// `CASE route WHEN <literal> THEN … END` with an ELSE that is false or absent.
    fn of(case: &'a CaseExpr) -> Option<Self> {
        let route = case.expr()?;
        let otherwise_null = match case.else_expr() {
            None => true,
            Some(e) => {
                let l = e.as_any().downcast_ref::<Literal>()?;
                (l.value() == &ScalarValue::Boolean(Some(false))).then_some(false)?
            }
        };
        let branches = case
            .when_then_expr()
            .iter()
            .map(|(when, then)| Some((when.as_any().downcast_ref::<Literal>()?.value(), then)))
            .collect::<Option<Vec<_>>>()?;
        Some(Self { case, route, branches, otherwise_null })
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let rows = batch.num_rows();
        let route = self.route.evaluate(batch)?.into_array(rows)?;
        // Values of another type than the routing value's: the CASE decides what that means.
        if self.branches.iter().any(|(v, _)| v.data_type() != *route.data_type()) {
            return self.case.evaluate(batch);
        }
        let mut values = BooleanBuffer::new_unset(rows);
        // Rows no branch takes are valid (false) unless the CASE has no ELSE.
        let mut valid = match self.otherwise_null {
            true => BooleanBuffer::new_unset(rows),
            false => BooleanBuffer::new_set(rows),
        };
        let mut untaken = BooleanBuffer::new_set(rows);
        for (value, then) in &self.branches {
            if value.is_null() {
                continue;
            }
            let here = &truth(&eq(&route, &value.to_scalar()?)?)? & &untaken;
            let count = here.count_set_bits();
            if count == 0 {
                continue;
            }
            untaken = &untaken & &!&here;
            let routed = filter_record_batch(batch, &BooleanArray::new(here.clone(), None))?;
            let answers = then.evaluate(&routed)?.into_array(count)?;
            let answers = answers.as_boolean_opt().ok_or_else(|| {
                datafusion::error::DataFusionError::Internal("a join filter's branch is not boolean".into())
            })?;
            values = &values | &deposit(&here, answers.values());
            let answered =
                answers.nulls().map_or_else(|| BooleanBuffer::new_set(count), |n| n.inner().clone());
            valid = &(&valid & &!&here) | &deposit(&here, &answered);
        }
        let values = &values & &valid;
        let nulls = (valid.count_set_bits() < rows).then(|| NullBuffer::new(valid));
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::new(values, nulls))))
    }
}

/// The IN list of a branch: the branch itself, or a conjunct of it.
fn in_list_of(then: &Arc<dyn PhysicalExpr>) -> Option<&InListExpr> {
    if let Some(list) = then.as_any().downcast_ref::<InListExpr>() {
        return Some(list);
    }
    let and = then.as_any().downcast_ref::<BinaryExpr>().filter(|b| *b.op() == Operator::And)?;
    in_list_of(and.right()).or_else(|| in_list_of(and.left()))
}

impl fmt::Debug for UnionedJoinFilter {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_tuple("UnionedJoinFilter").field(&self.dynamic).finish()
    }
}

impl fmt::Display for UnionedJoinFilter {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Unioned({})", self.dynamic)
    }
}

impl PartialEq for UnionedJoinFilter {
    fn eq(&self, other: &Self) -> bool {
        self.dynamic.as_ref() == other.dynamic.as_ref()
    }
}

impl Eq for UnionedJoinFilter {}

impl Hash for UnionedJoinFilter {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.dynamic.hash(state);
    }
}

impl PhysicalExpr for UnionedJoinFilter {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.dynamic.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.dynamic.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let now = self.current()?;
        let routed = self.ways.unions.then(|| now.as_any().downcast_ref::<CaseExpr>()).flatten();
        match routed.and_then(Routed::of) {
            Some(routed) => routed.evaluate(batch),
            None => now.evaluate(batch),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.dynamic]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [dynamic]: [Arc<dyn PhysicalExpr>; 1] = children.try_into().map_err(|_| {
            datafusion::error::DataFusionError::Internal("a join filter has one child".into())
        })?;
        let bitmaps = Arc::clone(&self.bitmaps);
        Ok(Arc::new(Self { dynamic, ways: self.ways, made: Mutex::new(None), bitmaps }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.dynamic.fmt_sql(f)
    }

    fn snapshot(&self) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        self.current().map(Some)
    }

    fn snapshot_generation(&self) -> u64 {
        self.dynamic.snapshot_generation()
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::{col, lit};

    use super::*;

    fn batch() -> RecordBatch {
        let keys =
            Int64Array::from(vec![Some(1), Some(2), Some(3), Some(4), Some(5), Some(8), None, Some(10)]);
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)])),
            vec![Arc::new(keys)],
        )
        .unwrap()
    }

    /// The filter a partitioned join makes, with `k % 2` routing rows as its hash does: the
    /// build keys of partition i all route to i.
    fn case(schema: &Schema, lists: &[&[i64]], negated: bool) -> Arc<dyn PhysicalExpr> {
        let k = col("k", schema).unwrap();
        let route: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::Modulo, lit(2i64)));
        let branches = lists
            .iter()
            .enumerate()
            .map(|(i, keys)| {
                let array = Arc::new(Int64Array::from(keys.to_vec()));
                let list: Arc<dyn PhysicalExpr> =
                    Arc::new(InListExpr::try_new_from_array(Arc::clone(&k), array, negated).unwrap());
                let (lo, hi) = (*keys.iter().min().unwrap(), *keys.iter().max().unwrap());
                let bounds = Arc::new(BinaryExpr::new(
                    Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::GtEq, lit(lo))),
                    Operator::And,
                    Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::LtEq, lit(hi))),
                ));
                (
                    lit(i as i64),
                    Arc::new(BinaryExpr::new(bounds, Operator::And, list)) as Arc<dyn PhysicalExpr>,
                )
            })
            .collect();
        Arc::new(CaseExpr::try_new(Some(route), branches, Some(lit(false))).unwrap())
    }

    fn kept(filter: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Vec<bool> {
        let mask = filter.evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap();
        mask.as_boolean().iter().map(|b| b == Some(true)).collect()
    }

    #[test]
    fn one_in_list_keeps_the_rows_the_case_keeps() {
        let batch = batch();
        let filter = case(&batch.schema(), &[&[2, 8, 6], &[3, 5]], false);
        let one = unioned(&filter).unwrap().expect("a CASE of IN lists is unioned");
        assert!(one.as_any().is::<InListExpr>());
        assert_eq!(kept(&one, &batch), kept(&filter, &batch));
        assert_eq!(kept(&one, &batch), [false, true, true, false, true, true, false, false]);
        // A build side's repeated keys are listed once.
        let repeated = case(&batch.schema(), &[&[2, 8, 2, 6, 8], &[3, 5, 3]], false);
        let one = unioned(&repeated).unwrap().unwrap();
        assert_eq!(one.as_any().downcast_ref::<InListExpr>().unwrap().list().len(), 5);
        assert_eq!(kept(&one, &batch), kept(&repeated, &batch));
    }

    #[test]
    fn other_filters_are_left_as_they_are() {
        let batch = batch();
        let schema = batch.schema();
        // NOT IN lists, and a filter that is not a CASE.
        assert!(unioned(&case(&schema, &[&[2], &[3]], true)).unwrap().is_none());
        let plain: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(col("k", &schema).unwrap(), Operator::Gt, lit(3i64)));
        assert!(unioned(&plain).unwrap().is_none());
        // A branch without an IN list (a hash-table lookup, in a join's filter).
        let k = col("k", &schema).unwrap();
        let route: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::Modulo, lit(2i64)));
        let list: Arc<dyn PhysicalExpr> = Arc::new(
            InListExpr::try_new_from_array(Arc::clone(&k), Arc::new(Int64Array::from(vec![2])), false)
                .unwrap(),
        );
        let branches = vec![(lit(0i64), list), (lit(1i64), Arc::clone(&plain))];
        let mixed: Arc<dyn PhysicalExpr> =
            Arc::new(CaseExpr::try_new(Some(route), branches, Some(lit(false))).unwrap());
        assert!(unioned(&mixed).unwrap().is_none());
    }

    fn answers(filter: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Vec<Option<bool>> {
        let answers = match filter.as_any().downcast_ref::<CaseExpr>().and_then(Routed::of) {
            Some(routed) => routed.evaluate(batch),
            None => filter.evaluate(batch),
        };
        answers.unwrap().into_array(batch.num_rows()).unwrap().as_boolean().iter().collect()
    }

    #[test]
    fn a_routed_filter_answers_as_its_case_does() {
        let batch = batch();
        let schema = batch.schema();
        let k = col("k", &schema).unwrap();
        let route: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::Modulo, lit(3i64)));
        let gt = |v: i64| -> Arc<dyn PhysicalExpr> {
            Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::Gt, lit(v)))
        };
        let list: Arc<dyn PhysicalExpr> = Arc::new(
            InListExpr::try_new_from_array(Arc::clone(&k), Arc::new(Int64Array::from(vec![2, 8])), false)
                .unwrap(),
        );
        // A NULL key routes nowhere; `k > NULL` answers NULL; the second branch for 1 is never
        // taken; no branch for 2 in the last.
        let null_gt: Arc<dyn PhysicalExpr> =
            Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::Gt, lit(ScalarValue::Int64(None))));
        let cases = [
            (vec![(lit(0i64), gt(4)), (lit(1i64), Arc::clone(&list)), (lit(2i64), list)], Some(lit(false))),
            (vec![(lit(0i64), gt(4)), (lit(1i64), null_gt), (lit(1i64), gt(0))], Some(lit(false))),
            (vec![(lit(0i64), gt(1)), (lit(1i64), gt(-1))], None),
        ];
        for (branches, otherwise) in cases {
            let case = CaseExpr::try_new(Some(Arc::clone(&route)), branches, otherwise).unwrap();
            assert!(Routed::of(&case).is_some());
            let case: Arc<dyn PhysicalExpr> = Arc::new(case);
            let want: Vec<Option<bool>> =
                case.evaluate(&batch).unwrap().into_array(8).unwrap().as_boolean().iter().collect();
            assert_eq!(answers(&case, &batch), want, "{case}");
        }
    }
}
