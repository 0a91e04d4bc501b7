//! Functions Basin SQL has that DataFusion lacks, registered next to DataFusion's built-ins
//! and the datafusion-functions-json set.
//!
//! `approx_top_k(expr, k)`: the `k` most frequent values with their counts, as Basin returns
//! them, a list of `{value, count}` structs, most frequent first. It keeps a bounded
//! Space-Saving summary (exact while a group has fewer distinct values than its capacity),
//! so memory stays bounded on high-cardinality columns.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, ListArray, StructArray, UInt64Array};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, FieldRef, Fields, UInt64Type};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{Accumulator, AggregateUDF, AggregateUDFImpl, Signature, Volatility};
use datafusion::physical_expr::expressions::Literal;

/// Counters kept per group: enough that the top `k` of a skewed distribution are exact.
fn capacity(k: usize) -> usize {
    (k * 20).max(1000)
}

pub fn approx_top_k() -> AggregateUDF {
    AggregateUDF::from(ApproxTopK { signature: Signature::any(2, Volatility::Immutable) })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ApproxTopK {
    signature: Signature,
}

fn entry_fields(value: &DataType) -> Fields {
    Fields::from(vec![Field::new("value", value.clone(), true), Field::new("count", DataType::UInt64, false)])
}

fn result_type(value: &DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Struct(entry_fields(value)), true)))
}

impl AggregateUDFImpl for ApproxTopK {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "approx_top_k"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        if !args[1].is_integer() {
            return plan_err!("approx_top_k(expr, k): k must be an integer literal, got {}", args[1]);
        }
        Ok(result_type(&args[0]))
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let k = match args.exprs[1].as_any().downcast_ref::<Literal>().map(|l| l.value()) {
            Some(v) if !v.is_null() => match v.cast_to(&DataType::Int64)? {
                ScalarValue::Int64(Some(k)) if k > 0 && k <= 100_000 => k as usize,
                _ => return exec_err!("approx_top_k(expr, k): k must be between 1 and 100000"),
            },
            _ => return exec_err!("approx_top_k(expr, k): k must be a constant"),
        };
        Ok(Box::new(TopK { k, value_type: args.expr_fields[0].data_type().clone(), counts: HashMap::new() }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let value = args.input_fields[0].data_type().clone();
        Ok(vec![
            Arc::new(Field::new("values", DataType::List(Arc::new(Field::new("item", value, true))), true)),
            Arc::new(Field::new(
                "counts",
                DataType::List(Arc::new(Field::new("item", DataType::UInt64, true))),
                true,
            )),
        ])
    }
}

#[derive(Debug)]
struct TopK {
    k: usize,
    value_type: DataType,
    counts: HashMap<ScalarValue, u64>,
}

impl TopK {
    fn add(&mut self, value: ScalarValue, n: u64) {
        if let Some(c) = self.counts.get_mut(&value) {
            *c += n;
            return;
        }
        if self.counts.len() < capacity(self.k) {
            self.counts.insert(value, n);
            return;
        }
        // Space-Saving: the new value takes over the smallest counter.
        let (min_key, min) =
            self.counts.iter().min_by_key(|(_, c)| **c).map(|(k, c)| (k.clone(), *c)).expect("full");
        self.counts.remove(&min_key);
        self.counts.insert(value, min + n);
    }

    fn sorted(&self) -> Vec<(&ScalarValue, u64)> {
        let mut v: Vec<(&ScalarValue, u64)> = self.counts.iter().map(|(k, c)| (k, *c)).collect();
        // Most frequent first; ties in value order, so answers are deterministic.
        v.sort_by(|a, b| {
            b.1.cmp(&a.1).then_with(|| a.0.partial_cmp(b.0).unwrap_or(std::cmp::Ordering::Equal))
        });
        v
    }
}

impl Accumulator for TopK {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let a = &values[0];
        for i in 0..a.len() {
            if a.is_valid(i) {
                self.add(ScalarValue::try_from_array(a, i)?, 1);
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let values = states[0].as_list::<i32>();
        let counts = states[1].as_list::<i32>();
        for row in 0..values.len() {
            if values.is_null(row) {
                continue;
            }
            let vs = values.value(row);
            let cs = counts.value(row);
            let cs = cs.as_primitive::<UInt64Type>();
            for j in 0..vs.len() {
                self.add(ScalarValue::try_from_array(&vs, j)?, cs.value(j));
            }
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        let entries = self.sorted();
        let values: Vec<ScalarValue> = entries.iter().map(|(v, _)| (*v).clone()).collect();
        let counts: Vec<ScalarValue> = entries.iter().map(|(_, c)| ScalarValue::UInt64(Some(*c))).collect();
        Ok(vec![
            ScalarValue::List(ScalarValue::new_list_nullable(&values, &self.value_type)),
            ScalarValue::List(ScalarValue::new_list_nullable(&counts, &DataType::UInt64)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let top: Vec<(&ScalarValue, u64)> = self.sorted().into_iter().take(self.k).collect();
        let values: Vec<ScalarValue> = top.iter().map(|(v, _)| (*v).clone()).collect();
        let values = if values.is_empty() {
            arrow::array::new_empty_array(&self.value_type)
        } else {
            ScalarValue::iter_to_array(values)?
        };
        let counts: ArrayRef = Arc::new(UInt64Array::from(top.iter().map(|(_, c)| *c).collect::<Vec<_>>()));
        let n = counts.len();
        let entries = StructArray::try_new(entry_fields(&self.value_type), vec![values, counts], None)?;
        let field = Arc::new(Field::new("item", DataType::Struct(entry_fields(&self.value_type)), true));
        let list = ListArray::try_new(field, OffsetBuffer::from_lengths([n]), Arc::new(entries), None)?;
        Ok(ScalarValue::List(Arc::new(list)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.counts.keys().map(|k| k.size() + 8).sum::<usize>()
    }
}
