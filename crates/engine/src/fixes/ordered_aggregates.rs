//! `ORDER BY` inside aggregates whose answer does not depend on order.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{AggregateUDF, Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use super::rewrite_calls;

/// An `ORDER BY` inside an aggregate whose answer does not depend on order (`avg(x ORDER BY
/// y)`) is dropped. DataFusion 53.1 passes the ordering columns to these aggregates as extra
/// arguments: `avg`, `bit_and`/`bit_or`/`bit_xor`, `stddev` and `var_*` panic on them
/// (upstream issue apache/datafusion#25401, fix #25403), `min`/`max` fail on a state with more
/// fields than columns (#25402), and `count(x ORDER BY y)` skipped rows where `y` is NULL
/// (#24997). Functions whose ORDER BY means something (`array_agg`, `string_agg`,
/// `first_value`, the `WITHIN GROUP` of percentiles) are not in the list.
#[derive(Debug)]
pub struct OrderInsensitiveAggregates(Vec<Arc<AggregateUDF>>);

impl OrderInsensitiveAggregates {
    /// `replaced`: skiff's functions registered in the place of DataFusion's.
    pub fn new(replaced: Vec<Arc<AggregateUDF>>) -> Self {
        use datafusion::functions_aggregate::{
            approx_distinct, approx_median, average, bit_and_or_xor, correlation, count, covariance, median,
            min_max, regr, stddev, variance,
        };
        let mut functions = vec![
            average::avg_udaf(),
            bit_and_or_xor::bit_and_udaf(),
            bit_and_or_xor::bit_or_udaf(),
            bit_and_or_xor::bit_xor_udaf(),
            stddev::stddev_udaf(),
            stddev::stddev_pop_udaf(),
            variance::var_samp_udaf(),
            variance::var_pop_udaf(),
            correlation::corr_udaf(),
            covariance::covar_samp_udaf(),
            covariance::covar_pop_udaf(),
            regr::regr_slope_udaf(),
            regr::regr_intercept_udaf(),
            regr::regr_count_udaf(),
            regr::regr_r2_udaf(),
            regr::regr_avgx_udaf(),
            regr::regr_avgy_udaf(),
            regr::regr_sxx_udaf(),
            regr::regr_syy_udaf(),
            regr::regr_sxy_udaf(),
            min_max::min_udaf(),
            min_max::max_udaf(),
            median::median_udaf(),
            approx_median::approx_median_udaf(),
            approx_distinct::approx_distinct_udaf(),
            count::count_udaf(),
        ];
        functions.extend(replaced);
        Self(functions)
    }
}

impl AnalyzerRule for OrderInsensitiveAggregates {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        rewrite_calls(plan, |e| match e {
            Expr::AggregateFunction(mut f)
                if !f.params.order_by.is_empty() && self.0.iter().any(|u| u.as_ref() == f.func.as_ref()) =>
            {
                f.params.order_by.clear();
                Transformed::yes(Expr::AggregateFunction(f))
            }
            e => Transformed::no(e),
        })
    }

    fn name(&self) -> &str {
        "order_insensitive_aggregates"
    }
}
