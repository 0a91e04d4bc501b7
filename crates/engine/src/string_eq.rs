//! `column = 'literal'` (and `<>`) over string views, compared as 16-byte integers.
//!
//! Almost every query the Worker sends filters on `project_id = '…'` and often `event = '…'`,
//! so that comparison runs over every row of a scan (30M at 30M events). Arrow's kernel takes
//! several branches per row once the array has data buffers, as every array a Parquet scan
//! decodes has: about 5 ns per row, a tenth of `breakdown`'s CPU. A literal of up to 12 bytes
//! is its own view (length, then the bytes inline), so a row equals it exactly when its view
//! does, bytes past the length aside: one masked compare per row, about 1.4 ns. Longer
//! literals compare length and prefix first and the bytes only for rows that pass.
//!
//! The rewrite happens last among the physical rules, on filters and on the predicates pushed
//! into Parquet scans. The wrapper shows as the comparison it replaces and gives it back to
//! anything that inspects predicates (pruning by statistics, bloom filters and page indexes
//! read it through `snapshot`), and any input that is not a view array goes to the original.
use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringViewArray};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, FieldRef, Schema};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{Result, ScalarValue};
use datafusion::datasource::physical_plan::FileSource;
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};

use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
use skiff_lake::with_parquet_source;

use super::window::SortedWindowExec;

/// Rewrites string equalities in filters and scan predicates to compare views.
#[derive(Debug, Default)]
pub struct StringEqualities;

impl PhysicalOptimizerRule for StringEqualities {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        rewrite_plan(&plan)
    }

    fn name(&self) -> &str {
        "string_equalities"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with the string equalities of its filters and scans wrapped, except under a window.
/// A filter's equality also makes its column constant in what the filter outputs, and a
/// window partitioned by that column was planned without a sort on it; the wrapper is no
/// equality to DataFusion's analysis, and a window checks, when it is rebuilt and when it
/// runs, that its input is ordered by every partition key (the fuzz test found one). Other
/// operators rebuilt over a rewritten input derive their plan from it again, and the data
/// itself is the same.
fn rewrite_plan(plan: &Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    let any = plan.as_any();
    if any.is::<BoundedWindowAggExec>() || any.is::<WindowAggExec>() || any.is::<SortedWindowExec>() {
        return Ok(plan.clone());
    }
    let children = plan.children();
    let rewritten = children.iter().map(|c| rewrite_plan(c)).collect::<Result<Vec<_>>>()?;
    let mut node = plan.clone();
    if rewritten.iter().zip(&children).any(|(new, old)| !Arc::ptr_eq(new, old)) {
        // An operator that refuses the rewritten input keeps its original one.
        node = plan.clone().with_new_children(rewritten).unwrap_or(node);
    }
    if let Some(filter) = node.as_any().downcast_ref::<FilterExec>()
        && let Some(predicate) = rewrite(filter.predicate())
    {
        return Ok(Arc::new(FilterExecBuilder::from(filter).with_predicate(predicate).build()?));
    }
    Ok(with_parquet_source(&node, |source| Some(source.with_predicate(rewrite(&source.filter()?)?)))
        .unwrap_or(node))
}

/// `predicate` with its string equalities wrapped, looking through AND and OR only (a dynamic
/// filter, for one, must keep its own expression); `None` when nothing changed.
fn rewrite(predicate: &Arc<dyn PhysicalExpr>) -> Option<Arc<dyn PhysicalExpr>> {
    if let Some(eq) = ViewEq::try_new(predicate) {
        return Some(Arc::new(eq));
    }
    let b = predicate.as_any().downcast_ref::<BinaryExpr>()?;
    if !matches!(b.op(), Operator::And | Operator::Or) {
        return None;
    }
    let (l, r) = (rewrite(b.left()), rewrite(b.right()));
    if l.is_none() && r.is_none() {
        return None;
    }
    let l = l.unwrap_or_else(|| b.left().clone());
    let r = r.unwrap_or_else(|| b.right().clone());
    Some(Arc::new(BinaryExpr::new(l, *b.op(), r)))
}

/// `column = 'literal'` or `column <> 'literal'` (either side), evaluated on views.
#[derive(Debug)]
struct ViewEq {
    /// The comparison as DataFusion built it: shown, inspected, and used for other inputs.
    original: Arc<dyn PhysicalExpr>,
    column: Arc<dyn PhysicalExpr>,
    literal: Vec<u8>,
    negated: bool,
}

impl ViewEq {
    fn try_new(expr: &Arc<dyn PhysicalExpr>) -> Option<Self> {
        let b = expr.as_any().downcast_ref::<BinaryExpr>()?;
        let negated = match b.op() {
            Operator::Eq => false,
            Operator::NotEq => true,
            _ => return None,
        };
        let string = |e: &Arc<dyn PhysicalExpr>| match e.as_any().downcast_ref::<Literal>()?.value() {
            ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => {
                Some(s.as_bytes().to_vec())
            }
            _ => None,
        };
        let is_column = |e: &Arc<dyn PhysicalExpr>| e.as_any().is::<Column>();
        let (column, literal) = match (string(b.left()), string(b.right())) {
            (None, Some(s)) if is_column(b.left()) => (b.left().clone(), s),
            (Some(s), None) if is_column(b.right()) => (b.right().clone(), s),
            _ => return None,
        };
        Some(Self { original: expr.clone(), column, literal, negated })
    }

    /// Which rows of `array` equal the literal (values under nulls are arbitrary).
    fn equal(&self, array: &StringViewArray) -> BooleanBuffer {
        let lit = &self.literal;
        let mut inline = [0u8; 16];
        inline[..4].copy_from_slice(&(lit.len() as u32).to_le_bytes());
        let head = lit.len().min(12);
        inline[4..4 + head].copy_from_slice(&lit[..head]);
        let want = u128::from_le_bytes(inline);
        let (want_lo, want_hi) = (want as u64, (want >> 64) as u64);
        let views = array.views();
        if lit.len() <= 12 {
            // Length and bytes, with the bytes past the length masked off.
            let mask = if lit.len() == 12 { u128::MAX } else { (1u128 << (32 + 8 * lit.len())) - 1 };
            let (mask_lo, mask_hi) = (mask as u64, (mask >> 64) as u64);
            BooleanBuffer::collect_bool(views.len(), |i| {
                let v = views[i];
                ((v as u64 & mask_lo) == want_lo) & (((v >> 64) as u64 & mask_hi) == want_hi)
            })
        } else {
            BooleanBuffer::collect_bool(views.len(), |i| {
                views[i] as u64 == want_lo && array.value(i).as_bytes() == lit.as_slice()
            })
        }
    }
}

impl fmt::Display for ViewEq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.original.fmt(f)
    }
}

impl PartialEq for ViewEq {
    fn eq(&self, other: &Self) -> bool {
        self.original.as_ref() == other.original.as_ref()
    }
}

impl Eq for ViewEq {}

impl Hash for ViewEq {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.original.hash(state)
    }
}

impl PhysicalExpr for ViewEq {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.original.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.original.nullable(input_schema)
    }

    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.original.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let ColumnarValue::Array(array) = self.column.evaluate(batch)? else {
            return self.original.evaluate(batch);
        };
        let Some(views) = array.as_string_view_opt() else {
            return self.original.evaluate(batch);
        };
        let mut equal = self.equal(views);
        if self.negated {
            equal = !&equal;
        }
        let result: ArrayRef = Arc::new(BooleanArray::new(equal, views.nulls().cloned()));
        Ok(ColumnarValue::Array(result))
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        self.original.children()
    }

    /// New children (a file's own column index, a column replaced by a constant) make a new
    /// comparison, wrapped again only if it still compares a column with a string.
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let original = self.original.clone().with_new_children(children)?;
        Ok(match Self::try_new(&original) {
            Some(eq) => Arc::new(eq),
            None => original,
        })
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.original.fmt_sql(f)
    }

    /// What pruning by statistics sees: the comparison DataFusion knows how to prune with.
    fn snapshot(&self) -> Result<Option<Arc<dyn PhysicalExpr>>> {
        Ok(Some(self.original.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Field;
    use datafusion::physical_optimizer::pruning::PruningPredicate;
    use datafusion::physical_plan::expressions::{binary, col, lit};

    fn schema() -> Schema {
        Schema::new(vec![Field::new("s", DataType::Utf8View, true)])
    }

    /// Strings around the inline limit and sharing prefixes, with nulls, in a sliced array
    /// that has data buffers (as arrays decoded from Parquet do).
    fn strings() -> StringViewArray {
        let words = [
            "",
            "a",
            "abcd",
            "abcde",
            "proj_alpha",
            "proj_alphb",
            "proj_alpha_x",
            "proj_alpha_xy",
            "proj_alpha_xyz",
            "proj_alpha_xyz_long_tail",
            "proj_alpha_xyz_long_taim",
            "purchase",
        ];
        let values: Vec<Option<&str>> =
            (0..3000).map(|i| (i % 7 != 3).then(|| words[(i * 5 + i / 12) % words.len()])).collect();
        StringViewArray::from(values).slice(5, 2900)
    }

    fn evaluate(expr: &Arc<dyn PhysicalExpr>, array: &StringViewArray) -> BooleanArray {
        let batch = RecordBatch::try_new(Arc::new(schema()), vec![Arc::new(array.clone())]).unwrap();
        expr.evaluate(&batch).unwrap().into_array(batch.num_rows()).unwrap().as_boolean().clone()
    }

    #[test]
    fn answers_equal_arrows_comparison() {
        let schema = schema();
        let array = strings();
        for literal in [
            "",
            "a",
            "abcd",
            "abcde",
            "proj_alpha",
            "proj_alpha_x",
            "proj_alpha_xy",
            "proj_alpha_xyz_long_tail",
            "absent",
        ] {
            for op in [Operator::Eq, Operator::NotEq] {
                for column_left in [true, false] {
                    let (l, r) =
                        (col("s", &schema).unwrap(), lit(ScalarValue::Utf8View(Some(literal.into()))));
                    let (l, r) = if column_left { (l, r) } else { (r, l) };
                    let original = binary(l, op, r, &schema).unwrap();
                    let fast: Arc<dyn PhysicalExpr> =
                        Arc::new(ViewEq::try_new(&original).expect("a string equality"));
                    assert_eq!(evaluate(&fast, &array), evaluate(&original, &array), "{original}");
                    assert_eq!(fast.to_string(), original.to_string());
                }
            }
        }
    }

    #[test]
    fn padding_past_the_length_does_not_matter() {
        // An inline view of "ab" whose unused bytes are not zero: still equal to 'ab'.
        let mut bytes = [0xEEu8; 16];
        bytes[..4].copy_from_slice(&2u32.to_le_bytes());
        bytes[4..6].copy_from_slice(b"ab");
        let views = vec![u128::from_le_bytes(bytes)].into();
        let array = unsafe { StringViewArray::new_unchecked(views, vec![], None) };
        let schema = schema();
        let original = binary(col("s", &schema).unwrap(), Operator::Eq, lit("ab"), &schema).unwrap();
        let fast: Arc<dyn PhysicalExpr> = Arc::new(ViewEq::try_new(&original).unwrap());
        assert!(evaluate(&fast, &array).value(0));
    }

    #[test]
    fn only_string_equalities_of_a_column_are_wrapped() {
        let schema = Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("n", DataType::Int64, true),
        ]);
        let s = || col("s", &schema).unwrap();
        let wrapped = |e: Arc<dyn PhysicalExpr>| ViewEq::try_new(&e).is_some();
        assert!(wrapped(binary(s(), Operator::Eq, lit("x"), &schema).unwrap()));
        assert!(!wrapped(binary(s(), Operator::Lt, lit("x"), &schema).unwrap()));
        assert!(!wrapped(binary(col("n", &schema).unwrap(), Operator::Eq, lit(1i64), &schema).unwrap()));
        assert!(!wrapped(binary(s(), Operator::Eq, s(), &schema).unwrap()));
        assert!(!wrapped(binary(s(), Operator::Eq, lit(ScalarValue::Utf8(None)), &schema).unwrap()));

        // Through AND and OR, not through other operators.
        let eq = binary(s(), Operator::Eq, lit("x"), &schema).unwrap();
        let n = binary(col("n", &schema).unwrap(), Operator::Gt, lit(1i64), &schema).unwrap();
        let and = binary(eq.clone(), Operator::And, n.clone(), &schema).unwrap();
        let rewritten = rewrite(&and).expect("rewritten");
        assert_eq!(rewritten.to_string(), and.to_string());
        let left = rewritten.as_any().downcast_ref::<BinaryExpr>().unwrap().left();
        assert!(left.as_any().is::<ViewEq>());
        assert!(rewrite(&n).is_none());
        let not = Arc::new(datafusion::physical_expr::expressions::NotExpr::new(eq)) as Arc<dyn PhysicalExpr>;
        assert!(rewrite(&not).is_none());
    }

    #[test]
    fn pruning_still_sees_the_comparison() {
        let schema = Arc::new(schema());
        let original = binary(col("s", &schema).unwrap(), Operator::Eq, lit("x"), &schema).unwrap();
        let fast: Arc<dyn PhysicalExpr> = Arc::new(ViewEq::try_new(&original).unwrap());
        let pruning = PruningPredicate::try_new(fast, schema.clone()).unwrap();
        assert!(!pruning.always_true());
        assert_eq!(pruning.literal_columns(), vec!["s".to_string()]);
    }

    #[test]
    fn new_children_keep_or_drop_the_fast_path() {
        let schema = schema();
        let original = binary(col("s", &schema).unwrap(), Operator::Eq, lit("x"), &schema).unwrap();
        let fast: Arc<dyn PhysicalExpr> = Arc::new(ViewEq::try_new(&original).unwrap());
        let moved = fast.clone().with_new_children(vec![Arc::new(Column::new("s", 3)), lit("x")]).unwrap();
        assert!(moved.as_any().is::<ViewEq>());
        assert_eq!(moved.children()[0].as_any().downcast_ref::<Column>().unwrap().index(), 3);
        let constant = fast.with_new_children(vec![lit(ScalarValue::Utf8View(None)), lit("x")]).unwrap();
        assert!(constant.as_any().is::<BinaryExpr>());
    }

    #[tokio::test]
    async fn the_rule_rewrites_filters_and_keeps_the_answers() {
        use arrow::array::Int64Array;
        use datafusion::catalog::MemTable;
        use datafusion::common::tree_node::TreeNode;
        use datafusion::execution::SessionStateBuilder;
        use datafusion::prelude::SessionContext;

        let schema = Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8View, true),
            Field::new("n", DataType::Int64, false),
        ]));
        let strings = strings();
        let n = Int64Array::from_iter_values((0..strings.len() as i64).map(|i| (i * 7919) % 1000));
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(strings), Arc::new(n)]).unwrap();
        let sql = [
            "SELECT s, count(*) AS n FROM t \
             WHERE s = 'proj_alpha' OR s <> 'abcd' AND 'proj_alpha_xyz_long_tail' <> s \
             GROUP BY s ORDER BY s",
            // The filter makes `s` constant, so the window needs no sort on it; the wrapper is
            // no equality to that analysis, and the plan must still hold (the fuzz test found
            // a window that refused its rewritten input).
            "SELECT s, n, first_value(n) OVER (PARTITION BY s ORDER BY n DESC) AS f FROM t \
             WHERE s = 'proj_alpha' ORDER BY n, f LIMIT 50",
        ];
        let mut answers = Vec::new();
        for ours in [false, true] {
            let state = SessionStateBuilder::new().with_default_features().build();
            let mut rules = state.physical_optimizers().to_vec();
            if ours {
                rules.push(Arc::new(StringEqualities));
            }
            let state =
                SessionStateBuilder::new_from_existing(state).with_physical_optimizer_rules(rules).build();
            let ctx = SessionContext::new_with_state(state);
            let table = MemTable::try_new(schema.clone(), vec![vec![batch.clone()]]).unwrap();
            ctx.register_table("t", Arc::new(table)).unwrap();
            let mut results = Vec::new();
            for q in sql {
                let plan = ctx.sql(q).await.unwrap().create_physical_plan().await.unwrap();
                let wrapped = plan
                    .exists(|node| {
                        let filter = node.as_any().downcast_ref::<FilterExec>();
                        Ok(filter.is_some_and(|f| {
                            f.predicate().exists(|e| Ok(e.as_any().is::<ViewEq>())).unwrap()
                        }))
                    })
                    .unwrap();
                if q.contains("count(*)") {
                    assert_eq!(wrapped, ours, "{q}");
                }
                let batches = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await.unwrap();
                results.push(arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string());
            }
            answers.push(results);
        }
        assert_eq!(answers[0], answers[1]);
        assert!(answers[0][0].contains("proj_alpha_xy "), "{}", answers[0][0]);
        assert!(answers[0][1].contains("proj_alpha"), "{}", answers[0][1]);
    }
}
