//! A projected truth test (`p IS TRUE`, `a IS NOT DISTINCT FROM b`) is never NULL, and its
//! physical column says so too.

use std::any::Any;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, Operator, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// Wraps every truth test that a projection outputs in [`NeverNull`]. DataFusion 53.1 plans
/// `p IS TRUE` as `p IS NOT DISTINCT FROM true`, and its physical `IS [NOT] DISTINCT FROM`
/// reports itself nullable when an operand is, where the logical plan says it never is. Once
/// common-subexpression elimination projects such a test for two aggregates (skiff's
/// [`super::FilterNullsAreFalse`] writes each nullable `FILTER` as `p IS TRUE`), the
/// aggregation's physical input differs from its logical one and planning fails:
/// `count(DISTINCT d) FILTER (WHERE c = 'US'), count(*) FILTER (WHERE c = 'US')` was an
/// internal error. Runs after DataFusion's logical rules, common-subexpression elimination
/// included. Fixed upstream by apache/datafusion#24244 (issue #24096), in the releases after
/// 54.
#[derive(Debug, Default)]
pub struct TruthTestsNeverNull;

impl OptimizerRule for TruthTestsNeverNull {
    fn name(&self) -> &str {
        "truth_tests_never_null"
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        plan.transform_up_with_subqueries(|node| {
            let LogicalPlan::Projection(_) = &node else { return Ok(Transformed::no(node)) };
            let names = NamePreserver::new(&node);
            node.map_expressions(|e| {
                if !truth_test(unaliased(&e)) {
                    return Ok(Transformed::no(e));
                }
                let saved = names.save(&e);
                let test = e.unalias_nested().data;
                Ok(Transformed::yes(saved.restore(never_null().call(vec![test]))))
            })
        })
    }
}

fn unaliased(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unaliased(&a.expr),
        e => e,
    }
}

/// The tests DataFusion lowers to `IS [NOT] DISTINCT FROM`.
fn truth_test(e: &Expr) -> bool {
    match e {
        Expr::IsTrue(_) | Expr::IsFalse(_) | Expr::IsNotTrue(_) | Expr::IsNotFalse(_) => true,
        Expr::BinaryExpr(b) => matches!(b.op, Operator::IsDistinctFrom | Operator::IsNotDistinctFrom),
        _ => false,
    }
}

fn never_null() -> ScalarUDF {
    ScalarUDF::new_from_impl(NeverNull {
        signature: Signature::exact(vec![DataType::Boolean], Volatility::Immutable),
    })
}

/// Its Boolean argument unchanged, declared never NULL: it is given only truth tests, which
/// never are.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NeverNull {
    signature: Signature,
}

impl ScalarUDFImpl for NeverNull {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        "never_null"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn return_field_from_args(&self, _args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(self.name(), DataType::Boolean, false)))
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(args.args.swap_remove(0))
    }
}
