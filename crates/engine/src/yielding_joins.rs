//! Joins that give a cancelled query the chance to stop.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result as DFResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{CrossJoinExec, NestedLoopJoinExec};

/// A cancelled or timed-out query stops where its task next yields, and a task yields only
/// when a stream in it returns `Pending`. A nested-loop or cross join can turn one input
/// batch into seconds of output batches without polling its inputs, and so without
/// yielding, keeping the query threads busy long after the query's 504. Wrapped, each output
/// batch of such a join spends tokio's cooperative budget, so the task yields every 128 batches.
#[derive(Debug, Default)]
pub struct YieldingJoins;

impl PhysicalOptimizerRule for YieldingJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let any = node.as_any();
            if any.is::<NestedLoopJoinExec>() || any.is::<CrossJoinExec>() {
                return Ok(Transformed::yes(Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "yielding_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
