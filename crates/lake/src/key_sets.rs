//! Membership of an integer key in a set of values known when the plan runs: a join's
//! build-side values of one key, filtering the scan that key comes from.
//!
//! DataFusion's `InListExpr` would answer the same, but it keeps its values as literals as
//! well, and rebuilds its hash set from them whenever the expression is rewritten: a scan
//! rewrites its predicate for every file it opens, and the pruning of row groups turns an IN
//! list into a guarantee of every value. With 20K supplier keys in TPC-H q05 at scale factor
//! 10, that cost lineitem's scan over a second for its 165 row groups. This set is built once
//! and shared by every copy, and pruning leaves it alone (the bounds beside it prune).

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::buffer::BooleanBuffer;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::Result;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;

/// The widest range kept as a bitmap (8 MiB); a wider set is kept as sorted values.
const MAX_BITMAP: i64 = 1 << 26;

/// Distinct integer values, as a bitmap over their range or, if that is too wide, sorted.
#[derive(Debug)]
pub struct KeySet {
    len: usize,
    values: Values,
}

#[derive(Debug)]
enum Values {
    Bitmap { lo: i64, bits: BooleanBuffer },
    Sorted(Vec<i64>),
}

impl KeySet {
    /// The set of `values` (in any order, repeats allowed).
    pub fn new(mut values: Vec<i64>) -> Self {
        values.sort_unstable();
        values.dedup();
        let len = values.len();
        let values = match (values.first(), values.last()) {
            (Some(&lo), Some(&hi)) if hi.saturating_sub(lo) < MAX_BITMAP => {
                let mut bits = arrow::array::BooleanBufferBuilder::new((hi - lo + 1) as usize);
                bits.append_n((hi - lo + 1) as usize, false);
                values.iter().for_each(|v| bits.set_bit((v - lo) as usize, true));
                Values::Bitmap { lo, bits: bits.finish() }
            }
            _ => Values::Sorted(values),
        };
        Self { len, values }
    }

    /// Whether keys of type `t` can be tested against a set: integers that fit `i64`.
    pub fn holds(t: &DataType) -> bool {
        use DataType::*;
        matches!(t, Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn contains(&self, v: i64) -> bool {
        match &self.values {
            Values::Bitmap { lo, bits } => v
                .checked_sub(*lo)
                .is_some_and(|d| d >= 0 && (d as u64) < bits.len() as u64 && bits.value(d as usize)),
            Values::Sorted(s) => s.binary_search(&v).is_ok(),
        }
    }
}

/// `key IN set`, false for a NULL key (a join whose NULL keys match nothing).
#[derive(Debug)]
pub struct KeyIn {
    key: Arc<dyn PhysicalExpr>,
    set: Arc<KeySet>,
}

impl KeyIn {
    pub fn new(key: Arc<dyn PhysicalExpr>, set: Arc<KeySet>) -> Self {
        Self { key, set }
    }
}

/// Whether `e` tests membership in a [`KeySet`].
pub(crate) fn is_key_in(e: &dyn PhysicalExpr) -> bool {
    e.as_any().is::<KeyIn>()
}

impl fmt::Display for KeyIn {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} IN ({} values)", self.key, self.set.len())
    }
}

impl PartialEq for KeyIn {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.set, &other.set) && self.key.as_ref() == other.key.as_ref()
    }
}

impl Eq for KeyIn {}

impl Hash for KeyIn {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
        self.set.len().hash(state);
    }
}

impl PhysicalExpr for KeyIn {
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
        let keys = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        if !KeySet::holds(keys.data_type()) {
            return Err(DataFusionError::Internal(format!(
                "a key set of integers tested with {}",
                keys.data_type()
            )));
        }
        let keys = cast(&keys, &DataType::Int64)?;
        let keys = keys.as_primitive::<Int64Type>();
        let values = keys.values();
        let answers = BooleanBuffer::collect_bool(keys.len(), |i| self.set.contains(values[i]));
        let answers = match keys.nulls() {
            Some(n) => &answers & n.inner(),
            None => answers,
        };
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
            .map_err(|_| DataFusionError::Internal("a key set test has one child".into()))?;
        Ok(Arc::new(Self { key, set: Arc::clone(&self.set) }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int32Array, UInt16Array};
    use arrow::datatypes::Field;
    use datafusion::physical_expr::expressions::col;

    use super::*;

    fn answers(set: &Arc<KeySet>, keys: Arc<dyn Array>) -> Vec<bool> {
        let schema = Arc::new(Schema::new(vec![Field::new("k", keys.data_type().clone(), true)]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![keys]).unwrap();
        let e = KeyIn::new(col("k", &schema).unwrap(), Arc::clone(set));
        let out = e.evaluate(&batch).unwrap().into_array(batch.num_rows()).unwrap();
        out.as_boolean().iter().map(|b| b.unwrap()).collect()
    }

    /// A narrow set is a bitmap, a wide one sorted values; both answer alike, NULL keys and
    /// keys beyond either end included.
    #[test]
    fn a_set_answers_as_its_values_do() {
        let keys = Arc::new(Int32Array::from(vec![
            Some(3),
            None,
            Some(-1),
            Some(7),
            Some(100),
            Some(8),
            Some(i32::MAX),
        ]));
        let narrow = Arc::new(KeySet::new(vec![7, 3, 7, 100]));
        assert!(matches!(narrow.values, Values::Bitmap { .. }));
        assert_eq!(narrow.len(), 3);
        assert_eq!(answers(&narrow, keys.clone()), [true, false, false, true, true, false, false]);
        let wide = Arc::new(KeySet::new(vec![7, 3, 100, i32::MAX as i64]));
        assert!(matches!(wide.values, Values::Sorted(_)));
        assert_eq!(answers(&wide, keys), [true, false, false, true, true, false, true]);
        let small = Arc::new(UInt16Array::from(vec![3, 4]));
        assert_eq!(answers(&narrow, small), [true, false]);
        assert!(KeySet::new(vec![]).is_empty());
        assert_eq!(answers(&Arc::new(KeySet::new(vec![])), Arc::new(Int32Array::from(vec![1]))), [false]);
    }
}
