//! `ntile(n)` as the SQL standard (and PostgreSQL, DuckDB) deals rows out: over `rows` rows,
//! the first `rows % n` buckets get one row more than the others. DataFusion 53.1 numbers row
//! `i` as `i * n / rows + 1`, which spreads the larger buckets out (6 rows in 4 buckets: 2, 1,
//! 2, 1 rows, where the standard gives 2, 2, 1, 1; difftest regression 012). Upstream:
//! `NtileEvaluator` in DataFusion's `functions-window/src/ntile.rs`.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, UInt64Array};
use arrow::datatypes::{DataType, FieldRef};
use datafusion::error::Result;
use datafusion::functions_window::ntile::ntile_udwf;
use datafusion::logical_expr::function::{PartitionEvaluatorArgs, WindowUDFFieldArgs};
use datafusion::logical_expr::{
    Documentation, LimitEffect, PartitionEvaluator, ReversedUDWF, Signature, WindowUDF, WindowUDFImpl,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;

/// skiff's `ntile`.
pub fn ntile() -> WindowUDF {
    WindowUDF::new_from_impl(Ntile(ntile_udwf()))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Ntile(Arc<WindowUDF>);

impl WindowUDFImpl for Ntile {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    fn aliases(&self) -> &[String] {
        self.0.aliases()
    }

    fn signature(&self) -> &Signature {
        self.0.signature()
    }

    fn partition_evaluator(&self, args: PartitionEvaluatorArgs) -> Result<Box<dyn PartitionEvaluator>> {
        let n = args
            .input_exprs()
            .first()
            .and_then(|e| e.as_any().downcast_ref::<Literal>())
            .and_then(|l| l.value().cast_to(&DataType::UInt64).ok())
            .and_then(|v| match v {
                datafusion::common::ScalarValue::UInt64(Some(n)) if n > 0 => Some(n),
                _ => None,
            });
        // DataFusion's evaluator checks the argument and says what is wrong with it.
        let checked = self.0.partition_evaluator_factory(args)?;
        Ok(match n {
            Some(buckets) => Box::new(Buckets { buckets }),
            None => checked,
        })
    }

    fn field(&self, args: WindowUDFFieldArgs) -> Result<FieldRef> {
        self.0.field(args)
    }

    fn sort_options(&self) -> Option<arrow::compute::SortOptions> {
        self.0.sort_options()
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        self.0.coerce_types(args)
    }

    fn reverse_expr(&self) -> ReversedUDWF {
        self.0.reverse_expr()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }

    fn limit_effect(&self, args: &[Arc<dyn PhysicalExpr>]) -> LimitEffect {
        self.0.inner().limit_effect(args)
    }
}

#[derive(Debug)]
struct Buckets {
    buckets: u64,
}

impl PartitionEvaluator for Buckets {
    fn evaluate_all(&mut self, _values: &[ArrayRef], rows: usize) -> Result<ArrayRef> {
        Ok(Arc::new(UInt64Array::from_iter_values(numbered(rows as u64, self.buckets))))
    }
}

/// The bucket of each of `rows` rows in `n` buckets, the larger buckets first.
fn numbered(rows: u64, n: u64) -> impl Iterator<Item = u64> {
    let (size, larger) = (rows / n, rows % n);
    (0..rows).map(move |i| {
        // The first `larger` buckets hold `size + 1` rows each.
        let in_larger = larger * (size + 1);
        if i < in_larger { i / (size + 1) + 1 } else { larger + (i - in_larger) / size.max(1) + 1 }
    })
}

#[cfg(test)]
mod tests {
    use super::numbered;

    #[test]
    fn larger_buckets_come_first() {
        let b = |rows, n| numbered(rows, n).collect::<Vec<_>>();
        assert_eq!(b(6, 4), [1, 1, 2, 2, 3, 4]);
        assert_eq!(b(8, 4), [1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!(b(3, 5), [1, 2, 3]);
        assert_eq!(b(7, 3), [1, 1, 1, 2, 2, 3, 3]);
        assert_eq!(b(0, 3), Vec::<u64>::new());
        assert_eq!(b(5, 1), [1, 1, 1, 1, 1]);
    }
}
