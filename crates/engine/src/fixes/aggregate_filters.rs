//! Aggregate `FILTER`s that are NULL keep no row.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use super::rewrite_calls;

/// `FILTER (WHERE p)` keeps the rows where `p` is true: written `p IS TRUE`, so no aggregate
/// sees a NULL in its filter. DataFusion 53.1's groups-accumulator helpers
/// (`accumulate_indices`, behind every grouped `count`, and `accumulate_multiple`, behind
/// `corr`) read a filter's value bits and ignore its null mask, so a row where `p` is NULL
/// counted whenever the bit under the NULL was set (`count(*) FILTER (WHERE revenue < 50)`
/// per group answered 14,411 instead of 123). Fixed upstream by apache/datafusion#22068
/// (issue #22067), in the releases after 53.
#[derive(Debug, Default)]
pub struct FilterNullsAreFalse;

impl AnalyzerRule for FilterNullsAreFalse {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_calls(plan, |e| match e {
            Expr::AggregateFunction(mut f) if needs_is_true(f.params.filter.as_deref()) => {
                f.params.filter = f.params.filter.map(|p| Box::new(p.is_true()));
                Transformed::yes(Expr::AggregateFunction(f))
            }
            Expr::WindowFunction(mut w) if needs_is_true(w.params.filter.as_deref()) => {
                w.params.filter = w.params.filter.map(|p| Box::new(p.is_true()));
                Transformed::yes(Expr::WindowFunction(w))
            }
            e => Transformed::no(e),
        })
    }

    fn name(&self) -> &str {
        "filter_nulls_are_false"
    }
}

/// Whether a filter can be NULL: anything but a test that is never NULL (`IS TRUE` and the
/// like, or a literal).
fn needs_is_true(filter: Option<&Expr>) -> bool {
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
