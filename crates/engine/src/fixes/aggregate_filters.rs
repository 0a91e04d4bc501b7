//! Aggregate `FILTER`s that are NULL keep no row.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::functions::expr_fn::coalesce;
use datafusion::logical_expr::{Expr, LogicalPlan, lit};
use datafusion::optimizer::AnalyzerRule;

use super::rewrite_calls;

/// `FILTER (WHERE p)` keeps the rows where `p` is true: written `coalesce(p, false)`, so no
/// aggregate sees a NULL in its filter. DataFusion 53.1's groups-accumulator helpers
/// (`accumulate_indices`, behind every grouped `count`, and `accumulate_multiple`, behind
/// `corr`) read a filter's value bits and ignore its null mask, so a row where `p` is NULL
/// counted whenever the bit under the NULL was set (`count(*) FILTER (WHERE revenue < 50)`
/// per group answered 14,411 instead of 123). Fixed upstream by apache/datafusion#22068
/// (issue #22067), in the releases after 53.
///
/// Not `p IS TRUE`: DataFusion plans that as a physical `IS NOT DISTINCT FROM`, which says it
/// can be NULL where the logical plan says it cannot, and when two aggregates share the
/// filter, the projection common-subexpression elimination makes of it fails the planner's
/// schema check (an internal error for valid SQL). `coalesce` is never NULL in both plans.
#[derive(Debug, Default)]
pub struct FilterNullsAreFalse;

impl AnalyzerRule for FilterNullsAreFalse {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_calls(plan, |e| match e {
            Expr::AggregateFunction(mut f) if can_be_null(f.params.filter.as_deref()) => {
                f.params.filter = f.params.filter.map(never_null);
                Transformed::yes(Expr::AggregateFunction(f))
            }
            Expr::WindowFunction(mut w) if can_be_null(w.params.filter.as_deref()) => {
                w.params.filter = w.params.filter.map(never_null);
                Transformed::yes(Expr::WindowFunction(w))
            }
            e => Transformed::no(e),
        })
    }

    fn name(&self) -> &str {
        "filter_nulls_are_false"
    }
}

fn never_null(p: Box<Expr>) -> Box<Expr> {
    Box::new(coalesce(vec![*p, lit(false)]))
}

/// Whether a filter can be NULL: anything but a test that is never NULL (`IS TRUE` and the
/// like, or a literal).
fn can_be_null(filter: Option<&Expr>) -> bool {
    !matches!(
        filter,
        None | Some(
            Expr::IsTrue(_)
                | Expr::IsFalse(_)
                | Expr::IsNotTrue(_)
                | Expr::IsNotFalse(_)
                | Expr::IsNull(_)
                | Expr::IsNotNull(_)
                | Expr::Literal(..)
        )
    )
}
