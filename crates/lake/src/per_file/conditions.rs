//! A file's filter, evaluated condition by condition.
//!
//! DataFusion evaluates `a AND b` as one expression: when `a` keeps at most a fifth of the
//! rows, it filters every column of the batch to those rows, evaluates `b` there, and writes
//! `b`'s answers back one row at a time (`pre_selection_scatter`, which slices its input for
//! every run of kept rows). In TPC-H q12 at scale factor 1, whose lineitem filter has five
//! conditions, that evaluation was a quarter of the query's CPU. Here each condition's
//! answers are ANDed into one bitmap: a condition over the whole batch while more than a fifth
//! of the rows are left, otherwise over only the columns it reads, filtered to the rows left,
//! its answers deposited back at their positions.
//!
//! The answers are the filter's: a row passes when every condition is true for it. NULL
//! counts as false, as it does for a filter, so the bitmap need not carry SQL's three values.
//! Each condition sees the rows DataFusion's chain of ANDs would give it: every row while more
//! than a fifth are left, else only those, so a condition that fails on a row fails as there.
//!
//! Upstream: `BinaryExpr`'s pre-selection (datafusion-physical-expr, expressions/binary.rs)
//! is the same idea for one AND; this goes when a filter of several conditions evaluates
//! there as fast as here (compare q12 with `fold_per_file` on and off).

use std::fmt;
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::BooleanBuffer;
use arrow::compute::FilterBuilder;
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DFResult;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::collect_columns;

use crate::masks::{deposit, truth};

/// A condition is evaluated over the whole batch while more than one row in this many is
/// left (DataFusion's `BinaryExpr` switches at the same share).
const DENSE: usize = 5;

/// The conditions a file's rows must all meet.
#[derive(Debug)]
pub(super) struct Conditions(Vec<Condition>);

#[derive(Debug)]
struct Condition {
    /// Over the batch read.
    whole: Arc<dyn PhysicalExpr>,
    /// The batch's columns it reads, ascending, and the condition over only those.
    columns: Vec<usize>,
    narrowed: Arc<dyn PhysicalExpr>,
    schema: SchemaRef,
}

impl Conditions {
    /// `conditions` over a batch of `fields`, tested in the order given.
    pub(super) fn new(conditions: Vec<Arc<dyn PhysicalExpr>>, fields: &[Field]) -> DFResult<Self> {
        let conditions = conditions.into_iter().map(|whole| {
            let columns = columns_read([&whole]);
            let narrowed = renumbered(Arc::clone(&whole), &columns)?;
            let schema =
                Arc::new(Schema::new(columns.iter().map(|&c| fields[c].clone()).collect::<Vec<_>>()));
            Ok(Condition { whole, columns, narrowed, schema })
        });
        Ok(Self(conditions.collect::<DFResult<_>>()?))
    }

    /// The rows of `batch` that meet every condition.
    pub(super) fn mask(&self, batch: &RecordBatch) -> DFResult<BooleanArray> {
        let rows = batch.num_rows();
        let mut left: Option<BooleanBuffer> = None;
        for c in &self.0 {
            let kept = match &left {
                None => rows,
                Some(l) => l.count_set_bits(),
            };
            if kept == 0 {
                break;
            }
            left = Some(match left {
                Some(l) if kept * DENSE <= rows => deposit(&l, &c.on_rows(batch, &l, kept)?),
                Some(l) => &l & &truth(&c.whole.evaluate(batch)?.into_array(rows)?)?,
                None => truth(&c.whole.evaluate(batch)?.into_array(rows)?)?,
            });
        }
        Ok(BooleanArray::new(left.unwrap_or_else(|| BooleanBuffer::new_set(rows)), None))
    }
}

/// The columns `exprs` read, ascending, each once.
pub(super) fn columns_read<'a>(exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>) -> Vec<usize> {
    let mut columns: Vec<usize> = exprs.into_iter().flat_map(collect_columns).map(|c| c.index()).collect();
    columns.sort_unstable();
    columns.dedup();
    columns
}

/// `e` over a batch of only `columns` (ascending, each of `e`'s among them), in that order.
pub(super) fn renumbered(e: Arc<dyn PhysicalExpr>, columns: &[usize]) -> DFResult<Arc<dyn PhysicalExpr>> {
    e.transform_up(|n| {
        Ok(match n.as_any().downcast_ref::<Column>() {
            Some(c) => {
                let at = columns.binary_search(&c.index()).expect("a column read");
                Transformed::yes(Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>)
            }
            None => Transformed::no(n),
        })
    })
    .map(|t| t.data)
}

impl Condition {
    /// The condition's answers for the `kept` rows set in `left`, in their order.
    fn on_rows(&self, batch: &RecordBatch, left: &BooleanBuffer, kept: usize) -> DFResult<BooleanBuffer> {
        let filter = FilterBuilder::new(&BooleanArray::new(left.clone(), None)).build();
        let columns =
            self.columns.iter().map(|&c| filter.filter(batch.column(c))).collect::<Result<Vec<_>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(kept));
        let rows = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        truth(&self.narrowed.evaluate(&rows)?.into_array(kept)?)
    }
}

impl fmt::Display for Conditions {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" AND ")?;
            }
            write!(f, "{}", c.whole)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray, Int64Array, StringArray};
    use arrow::datatypes::DataType;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, IsNullExpr, col, lit};

    use super::*;

    fn batch(rows: i64) -> RecordBatch {
        let n = Int64Array::from_iter((0..rows).map(|i| (i % 7 != 3).then_some(i)));
        let s = StringArray::from_iter_values((0..rows).map(|i| format!("s{}", i % 10)));
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("n", DataType::Int64, true),
                Field::new("s", DataType::Utf8, false),
            ])),
            vec![Arc::new(n), Arc::new(s)],
        )
        .unwrap()
    }

    fn cmp(
        b: &RecordBatch,
        name: &str,
        op: Operator,
        v: impl Into<datafusion::common::ScalarValue>,
    ) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(col(name, &b.schema()).unwrap(), op, lit(v.into())))
    }

    /// The mask DataFusion's own AND gives, NULL taken as false.
    fn expected(b: &RecordBatch, conditions: &[Arc<dyn PhysicalExpr>]) -> Vec<bool> {
        let all = datafusion::physical_expr::conjunction(conditions.to_vec());
        let a = all.evaluate(b).unwrap().into_array(b.num_rows()).unwrap();
        a.as_boolean().iter().map(|v| v == Some(true)).collect()
    }

    fn got(b: &RecordBatch, conditions: &[Arc<dyn PhysicalExpr>]) -> Vec<bool> {
        let fields: Vec<Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        let mask = Conditions::new(conditions.to_vec(), &fields).unwrap().mask(b).unwrap();
        assert_eq!(mask.null_count(), 0);
        mask.iter().map(|v| v == Some(true)).collect()
    }

    #[test]
    fn every_share_of_rows_left_gives_the_filters_answer() {
        let b = batch(10_000);
        // Each second condition runs over many rows left and over few (a twentieth, under the
        // fifth), over NULLs, over a string column alone and on no rows left at all.
        let cases: Vec<Vec<Arc<dyn PhysicalExpr>>> = vec![
            vec![cmp(&b, "n", Operator::Lt, 9_000i64), cmp(&b, "s", Operator::NotEq, "s4")],
            vec![
                cmp(&b, "n", Operator::Lt, 500i64),
                cmp(&b, "s", Operator::NotEq, "s4"),
                cmp(&b, "n", Operator::Gt, 10i64),
            ],
            vec![cmp(&b, "s", Operator::Eq, "s1"), cmp(&b, "n", Operator::Gt, 100i64)],
            vec![Arc::new(IsNullExpr::new(col("n", &b.schema()).unwrap())), cmp(&b, "s", Operator::Eq, "s3")],
            vec![cmp(&b, "n", Operator::Lt, 0i64), cmp(&b, "s", Operator::Eq, "s3")],
            vec![cmp(&b, "n", Operator::Gt, 3i64)],
        ];
        for conditions in cases {
            let want = expected(&b, &conditions);
            assert_eq!(
                got(&b, &conditions),
                want,
                "{}",
                datafusion::physical_expr::conjunction(conditions.clone())
            );
        }
    }
}
