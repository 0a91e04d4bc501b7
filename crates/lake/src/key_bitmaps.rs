//! A join filter's hash-table lookup of one integer key, answered from a bitmap over the build
//! side's key range once it has looked up as many rows as that range holds.
//!
//! A hash join's dynamic filter on its probe side's scan is `key >= lo AND key <= hi AND
//! hash_lookup(key)` when its build side has too many keys for an IN list: each scanned row is
//! hashed and looked up in the join's hash table. In TPC-H q09 at scale factor 10 that lookup
//! (60M lineitem rows in a table of 109K parts over a range of 2M) was a third of the query's
//! CPU, about 58 ns a row. A bitmap of the range's 2M values is 250 KB and answers in a few.
//!
//! Why the answer cannot change: the bitmap holds, for every value of `[lo, hi]`, what the
//! lookup itself answers for it (it is made by evaluating the lookup over the whole range), and
//! what it answers for a NULL key. A value outside the range answers false where the lookup
//! may not, so the bitmap is only used where the same AND holds `key >= lo` and `key <= hi`,
//! which make that row false either way.
//!
//! When: a bitmap costs one lookup per value of the range, made by one thread while the scan's
//! others wait. So it is made only for a range of at most a sixteenth of the rows the scan
//! reads (and 2^26 values, 8 MiB), and only once the filter has looked up as many rows as the
//! range holds (across every file and partition of the scan; a filter behind a selective one
//! may see few). Until then the lookup answers. TPC-H at scale factor 1 measured 1.07× DuckDB
//! without bitmaps and 1.11× with bitmaps made at any range: q05's and q08's orders ranges
//! (6M keys) were made for scans that ended soon after.
//!
//! Upstream: DataFusion 53's `ArrayMap` answers dense build sides from an array, but a build
//! side as sparse as q09's parts keeps the hash table; no issue filed. Goes when DataFusion's
//! join filters answer a range-bounded integer key without hashing it.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, BooleanBufferBuilder, Int64Array, new_null_array,
};
use arrow::buffer::BooleanBuffer;
use arrow::compute::cast;
use arrow::datatypes::{
    DataType, Field, Int8Type, Int16Type, Int32Type, Int64Type, Schema, UInt8Type, UInt16Type, UInt32Type,
};
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_plan::joins::HashTableLookupExpr;

/// The widest key range a bitmap is made for: 2^26 values, 8 MiB…
const MAX_RANGE: u64 = 1 << 26;
/// …and at most this share of the rows the scan reads.
const SCAN_SHARE: u64 = 16;
/// Candidate values looked up at a time while a bitmap is made.
const CHUNK: i64 = 1 << 16;

/// The bitmaps of one scan's join filters, shared by its per-file copies so that each range is
/// counted and looked up once.
#[derive(Debug)]
pub(crate) struct KeyBitmaps {
    made: Mutex<Vec<Arc<KeyBitmap>>>,
    /// The rows the scan reads (0 when not known: no bitmaps).
    scan_rows: u64,
}

impl KeyBitmaps {
    pub(crate) fn for_scan(scan_rows: u64) -> Self {
        Self { made: Mutex::default(), scan_rows }
    }

    /// `filter` with each hash-table lookup of one integer key that is ANDed with `key >= lo`
    /// and `key <= hi` (literals) answered through a [`KeyBitmap`] of `[lo, hi]`.
    pub(crate) fn apply(&self, filter: Arc<dyn PhysicalExpr>) -> Result<Arc<dyn PhysicalExpr>> {
        filter
            .transform_down(|e| {
                let Some(and) = e.as_any().downcast_ref::<BinaryExpr>().filter(|b| *b.op() == Operator::And)
                else {
                    return Ok(Transformed::no(e));
                };
                let mut conjuncts = Vec::new();
                flatten(and, &mut conjuncts);
                let Some((lookup, bitmap)) = conjuncts.iter().find_map(|c| self.bitmap_for(c, &conjuncts))
                else {
                    return Ok(Transformed::no(e));
                };
                let replaced = Arc::clone(&e).transform(|n| {
                    if Arc::ptr_eq(&n, &lookup) {
                        let key = Arc::clone(n.children()[0]);
                        let answered: Arc<dyn PhysicalExpr> =
                            Arc::new(BitmapLookup { key, lookup: n, bitmap: Arc::clone(&bitmap) });
                        return Ok(Transformed::new(answered, true, TreeNodeRecursion::Jump));
                    }
                    Ok(Transformed::no(n))
                })?;
                Ok(Transformed::new(replaced.data, true, TreeNodeRecursion::Jump))
            })
            .map(|t| t.data)
    }

    /// The bitmap for `conjunct`, if it is a lookup of one integer key bounded by literals in
    /// `conjuncts`: the one already made for the same lookup and range, or a new one.
    fn bitmap_for(
        &self,
        conjunct: &Arc<dyn PhysicalExpr>,
        conjuncts: &[Arc<dyn PhysicalExpr>],
    ) -> Option<(Arc<dyn PhysicalExpr>, Arc<KeyBitmap>)> {
        let lookup = conjunct.as_any().downcast_ref::<HashTableLookupExpr>()?;
        let [key] = lookup.children()[..] else { return None };
        let lo = conjuncts.iter().find_map(|c| bound(c, key, Operator::GtEq))?;
        let hi = conjuncts.iter().find_map(|c| bound(c, key, Operator::LtEq))?;
        // The bounds' type is the key's (a comparison's sides agree).
        let key_type = lo.data_type();
        let (lo, hi) = (integer(lo)?, integer(hi)?);
        let width = u64::try_from(i128::from(hi) - i128::from(lo) + 1).ok()?;
        if width > MAX_RANGE || width * SCAN_SHARE > self.scan_rows {
            return None;
        }
        // The lookup over one column of candidate values, the same map and hashing.
        let over_candidates =
            Arc::clone(conjunct).with_new_children(vec![Arc::new(Column::new("k", 0))]).ok()?;
        // Kept as long as the scan: each file's copy is dropped when the file is read, and the
        // next one's must find the count and the bitmap made so far.
        let mut made = self.made.lock().expect("key bitmaps lock");
        let bitmap = match made
            .iter()
            .find(|b| b.lo == lo && b.hi == hi && b.lookup.as_ref() == over_candidates.as_ref())
        {
            Some(b) => Arc::clone(b),
            None => {
                let b = Arc::new(KeyBitmap {
                    lo,
                    hi,
                    key_type,
                    lookup: over_candidates,
                    looked_up: AtomicUsize::new(0),
                    bits: OnceLock::new(),
                });
                made.push(Arc::clone(&b));
                b
            }
        };
        Some((Arc::clone(conjunct), bitmap))
    }
}

/// The conjuncts of an AND chain.
fn flatten(and: &BinaryExpr, out: &mut Vec<Arc<dyn PhysicalExpr>>) {
    for side in [and.left(), and.right()] {
        match side.as_any().downcast_ref::<BinaryExpr>().filter(|b| *b.op() == Operator::And) {
            Some(inner) => flatten(inner, out),
            None => out.push(Arc::clone(side)),
        }
    }
}

/// `v` when `e` is `key <op> v` with `v` a literal.
fn bound<'a>(
    e: &'a Arc<dyn PhysicalExpr>,
    key: &Arc<dyn PhysicalExpr>,
    op: Operator,
) -> Option<&'a ScalarValue> {
    let b = e.as_any().downcast_ref::<BinaryExpr>().filter(|b| *b.op() == op)?;
    if b.left().as_ref() != key.as_ref() {
        return None;
    }
    Some(b.right().as_any().downcast_ref::<Literal>()?.value())
}

/// A non-NULL value of an integer type that fits `i64` (the types a bitmap is made for).
fn integer(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::Int8(Some(v)) => Some(i64::from(*v)),
        ScalarValue::Int16(Some(v)) => Some(i64::from(*v)),
        ScalarValue::Int32(Some(v)) => Some(i64::from(*v)),
        ScalarValue::Int64(Some(v)) => Some(*v),
        ScalarValue::UInt8(Some(v)) => Some(i64::from(*v)),
        ScalarValue::UInt16(Some(v)) => Some(i64::from(*v)),
        ScalarValue::UInt32(Some(v)) => Some(i64::from(*v)),
        _ => None,
    }
}

/// What one join filter's lookup answers over `[lo, hi]`, made once it has been asked about as
/// many rows as the range holds.
#[derive(Debug)]
pub(crate) struct KeyBitmap {
    lo: i64,
    hi: i64,
    key_type: DataType,
    /// The lookup, reading its key from column 0.
    lookup: Arc<dyn PhysicalExpr>,
    looked_up: AtomicUsize,
    /// One bit per value of the range, and the answer for a NULL key.
    bits: OnceLock<std::result::Result<(BooleanBuffer, bool), String>>,
}

impl KeyBitmap {
    /// How many values the range holds.
    fn width(&self) -> usize {
        (self.hi - self.lo + 1) as usize
    }

    /// The bitmap, if rows enough have been looked up to pay for it; `rows` more are counted.
    fn ready(&self, rows: usize) -> Result<Option<&(BooleanBuffer, bool)>> {
        if self.bits.get().is_none()
            && self.looked_up.fetch_add(rows, Ordering::Relaxed) + rows < self.width()
        {
            return Ok(None);
        }
        match self.bits.get_or_init(|| self.make().map_err(|e| e.to_string())) {
            Ok(bits) => Ok(Some(bits)),
            Err(e) => Err(DataFusionError::Execution(format!("making a join filter's key bitmap: {e}"))),
        }
    }

    fn make(&self) -> Result<(BooleanBuffer, bool)> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", self.key_type.clone(), true)]));
        let answers = |values: ArrayRef| -> Result<BooleanArray> {
            let batch = RecordBatch::try_new(Arc::clone(&schema), vec![values])?;
            let rows = batch.num_rows();
            Ok(self.lookup.evaluate(&batch)?.into_array(rows)?.as_boolean().clone())
        };
        let mut bits = BooleanBufferBuilder::new(self.width());
        let mut from = self.lo;
        while from <= self.hi {
            let to = (from + CHUNK - 1).min(self.hi);
            let values = cast(&Int64Array::from_iter_values(from..=to), &self.key_type)?;
            let a = answers(values)?;
            for i in 0..a.len() {
                bits.append(a.is_valid(i) && a.value(i));
            }
            from = to + 1;
        }
        let null = answers(new_null_array(&self.key_type, 1))?;
        Ok((bits.finish(), null.is_valid(0) && null.value(0)))
    }
}

/// Whether `e` is a lookup this module answers through a bitmap.
pub(crate) fn is_lookup(e: &dyn PhysicalExpr) -> bool {
    e.as_any().is::<BitmapLookup>()
}

/// A hash-table lookup of one integer key answered from a [`KeyBitmap`] once it is made.
#[derive(Debug)]
struct BitmapLookup {
    key: Arc<dyn PhysicalExpr>,
    /// The lookup this answers for, over `key`.
    lookup: Arc<dyn PhysicalExpr>,
    bitmap: Arc<KeyBitmap>,
}

impl BitmapLookup {
    fn answer(&self, keys: &dyn Array, bits: &BooleanBuffer, null: bool) -> Result<BooleanBuffer> {
        macro_rules! over {
            ($t:ty) => {{
                let keys = keys.as_primitive::<$t>();
                let (lo, hi) = (self.bitmap.lo, self.bitmap.hi);
                let values = keys.values();
                let answers = BooleanBuffer::collect_bool(keys.len(), |i| {
                    let v = values[i] as i64;
                    v >= lo && v <= hi && bits.value((v - lo) as usize)
                });
                Ok(match keys.nulls() {
                    None => answers,
                    Some(n) if null => &answers | &!n.inner(),
                    Some(n) => &answers & n.inner(),
                })
            }};
        }
        match keys.data_type() {
            DataType::Int8 => over!(Int8Type),
            DataType::Int16 => over!(Int16Type),
            DataType::Int32 => over!(Int32Type),
            DataType::Int64 => over!(Int64Type),
            DataType::UInt8 => over!(UInt8Type),
            DataType::UInt16 => over!(UInt16Type),
            DataType::UInt32 => over!(UInt32Type),
            t => Err(DataFusionError::Internal(format!("a key bitmap over {t}"))),
        }
    }
}

impl fmt::Display for BitmapLookup {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.lookup)
    }
}

impl PartialEq for BitmapLookup {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.bitmap, &other.bitmap) && self.key.as_ref() == other.key.as_ref()
    }
}

impl Eq for BitmapLookup {}

impl Hash for BitmapLookup {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.lookup.hash(state);
    }
}

impl PhysicalExpr for BitmapLookup {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, _input_schema: &Schema) -> Result<bool> {
        Ok(false)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let rows = batch.num_rows();
        let Some((bits, null)) = self.bitmap.ready(rows)? else {
            return self.lookup.evaluate(batch);
        };
        let keys = self.key.evaluate(batch)?.into_array(rows)?;
        // The bitmap was made by hashing values of the bounds' type, which the key has.
        if keys.data_type() != &self.bitmap.key_type {
            return self.lookup.evaluate(batch);
        }
        let answers = self.answer(&keys, bits, *null)?;
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::new(answers, None))))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.key]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [key]: [Arc<dyn PhysicalExpr>; 1] = children
            .try_into()
            .map_err(|_| DataFusionError::Internal("a key bitmap's lookup has one child".into()))?;
        let lookup = Arc::clone(&self.lookup).with_new_children(vec![Arc::clone(&key)])?;
        Ok(Arc::new(Self { key, lookup, bitmap: Arc::clone(&self.bitmap) }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lookup.fmt_sql(f)
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int32Array;
    use datafusion::common::hash_utils::create_hashes;
    use datafusion::physical_expr::expressions::{col, lit};
    use datafusion::physical_plan::joins::join_hash_map::{JoinHashMapType, JoinHashMapU64};
    use datafusion::physical_plan::joins::{Map, SeededRandomState};

    use super::*;

    /// `k >= lo AND k <= hi AND hash_lookup(k)` over a hash table of `build`, as a hash join
    /// fills its dynamic filter.
    fn join_filter(
        schema: &Schema,
        build: ArrayRef,
        lo: ScalarValue,
        hi: ScalarValue,
    ) -> Arc<dyn PhysicalExpr> {
        let seeds = SeededRandomState::with_seeds(1, 2, 3, 4);
        let mut hashes = vec![0; build.len()];
        create_hashes([&build], seeds.random_state(), &mut hashes).unwrap();
        let mut map = JoinHashMapU64::with_capacity(build.len());
        map.update_from_iter(Box::new(hashes.iter().enumerate()), 0);
        let k = col("k", schema).unwrap();
        let lookup = Arc::new(HashTableLookupExpr::new(
            vec![Arc::clone(&k)],
            seeds,
            Arc::new(Map::HashMap(Box::new(map))),
            "hash_lookup".into(),
        ));
        let bounds = Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(Arc::clone(&k), Operator::GtEq, lit(lo))),
            Operator::And,
            Arc::new(BinaryExpr::new(k, Operator::LtEq, lit(hi))),
        ));
        Arc::new(BinaryExpr::new(bounds, Operator::And, lookup))
    }

    fn answers(filter: &Arc<dyn PhysicalExpr>, batch: &RecordBatch) -> Vec<Option<bool>> {
        filter.evaluate(batch).unwrap().into_array(batch.num_rows()).unwrap().as_boolean().iter().collect()
    }

    fn bitmap_of(filter: &Arc<dyn PhysicalExpr>) -> Option<Arc<KeyBitmap>> {
        let mut found = None;
        filter
            .apply(|e| {
                if let Some(b) = e.as_any().downcast_ref::<BitmapLookup>() {
                    found = Some(Arc::clone(&b.bitmap));
                }
                Ok(TreeNodeRecursion::Continue)
            })
            .unwrap();
        found
    }

    /// Sparse build keys over 1..=3000; probe rows inside and outside that range and NULL.
    #[test]
    fn a_bitmap_answers_as_the_lookup_does() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let build: ArrayRef = Arc::new(Int64Array::from_iter_values((1..=3000).step_by(7)));
        let filter = join_filter(&schema, build, ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(2997)));
        let bitmaps = KeyBitmaps::for_scan(1 << 20);
        let answered = bitmaps.apply(Arc::clone(&filter)).unwrap();
        let bitmap = bitmap_of(&answered).expect("the lookup is answered through a bitmap");
        let probe = |from: i64| {
            let keys: Int64Array =
                (from..from + 1000).map(|v| (v % 13 != 0).then_some(v - 500)).collect::<Int64Array>();
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(keys)]).unwrap()
        };
        // Until 2,997 rows are looked up the lookup answers; then the bitmap does.
        for (i, from) in [0, 1000, 2000, 3000, 4000].into_iter().enumerate() {
            let batch = probe(from);
            assert_eq!(bitmap.bits.get().is_some(), i >= 3, "batch {i}");
            let want = answers(&filter, &batch);
            assert_eq!(answers(&answered, &batch), want, "batch {i}");
            assert!(want.contains(&Some(true)) || from > 3500);
        }
        assert!(bitmap.bits.get().is_some());
        // A copy renumbered to another file's columns shares the bitmap.
        let wider = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int8, true),
            Field::new("k", DataType::Int64, true),
        ]));
        let renumbered = answered
            .transform(|e| match e.as_any().downcast_ref::<Column>() {
                Some(c) => Ok(Transformed::yes(Arc::new(Column::new(c.name(), 1)) as Arc<dyn PhysicalExpr>)),
                None => Ok(Transformed::no(e)),
            })
            .unwrap()
            .data;
        assert!(Arc::ptr_eq(&bitmap_of(&renumbered).unwrap(), &bitmap));
        let batch = probe(0);
        let widened = RecordBatch::try_new(
            wider,
            vec![new_null_array(&DataType::Int8, 1000), Arc::clone(batch.column(0))],
        )
        .unwrap();
        assert_eq!(answers(&renumbered, &widened), answers(&filter, &batch));
        // Once every copy is dropped (each file's is, when the file is read), the next file's
        // finds the bitmap made.
        drop((renumbered, bitmap));
        assert!(bitmap_of(&bitmaps.apply(filter).unwrap()).unwrap().bits.get().is_some());
    }

    #[test]
    fn a_null_key_answers_as_the_lookup_does() {
        // NULL build keys hash like NULL probe keys: the lookup answers true for a NULL key.
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int32, true)]));
        let build: ArrayRef = Arc::new(Int32Array::from(vec![Some(5), None, Some(9)]));
        let filter = join_filter(&schema, build, ScalarValue::Int32(Some(5)), ScalarValue::Int32(Some(9)));
        let answered = KeyBitmaps::for_scan(1 << 20).apply(Arc::clone(&filter)).unwrap();
        let keys: ArrayRef =
            Arc::new(Int32Array::from(vec![None, Some(5), Some(6), Some(9), Some(10), None]));
        let batch = RecordBatch::try_new(schema, vec![keys]).unwrap();
        for _ in 0..3 {
            assert_eq!(answers(&answered, &batch), answers(&filter, &batch));
        }
        assert!(
            bitmap_of(&answered).unwrap().bits.get().is_some_and(|b| b.as_ref().is_ok_and(|(_, null)| *null))
        );
    }

    #[test]
    fn lookups_without_bounds_or_over_wide_ranges_are_left_alone() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let build: ArrayRef = Arc::new(Int64Array::from(vec![1, i64::MAX - 1]));
        let wide = join_filter(
            &schema,
            Arc::clone(&build),
            ScalarValue::Int64(Some(1)),
            ScalarValue::Int64(Some(i64::MAX - 1)),
        );
        assert!(bitmap_of(&KeyBitmaps::for_scan(1 << 20).apply(wide).unwrap()).is_none());
        // The lookup alone, with no bounds beside it.
        let filter = join_filter(&schema, build, ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(5)));
        let lookup = Arc::clone(filter.children()[1]);
        assert!(bitmap_of(&KeyBitmaps::for_scan(1 << 20).apply(lookup).unwrap()).is_none());
        // A range over a sixteenth of the scan's rows.
        assert!(bitmap_of(&KeyBitmaps::for_scan(5 * 16).apply(Arc::clone(&filter)).unwrap()).is_some());
        assert!(bitmap_of(&KeyBitmaps::for_scan(5 * 16 - 1).apply(filter).unwrap()).is_none());
    }
}
