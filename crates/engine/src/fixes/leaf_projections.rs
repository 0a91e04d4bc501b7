//! DataFusion 53.1's `push_down_leaf_projections` moves an extracted expression (a JSON
//! function's result, say) below a `Union` by rewriting each branch's projection, and when the
//! branches project different columns of tables of different widths (as SQL that unions the
//! versions of a table does: `SELECT … FROM glass.events UNION ALL SELECT … FROM
//! glass.events_v2`) the branches no longer line up by position: a filtered breakdown by
//! `country` answered `device_type`'s values. The rule is kept everywhere but over a union.
//! Upstream: `datafusion/optimizer/src/extract_leaf_expressions.rs`; no issue filed yet.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// DataFusion's `PushDownLeafProjections`, kept from plans that hold a union.
#[derive(Debug)]
pub struct NotOverUnions(pub Arc<dyn OptimizerRule + Send + Sync>);

impl OptimizerRule for NotOverUnions {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        self.0.apply_order()
    }

    fn rewrite(&self, plan: LogicalPlan, config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        // A node with a union under it: the rule would push through it. Nodes inside the
        // union's branches are still rewritten.
        if plan.exists(|n| Ok(matches!(n, LogicalPlan::Union(_))))? {
            return Ok(Transformed::no(plan));
        }
        self.0.rewrite(plan, config)
    }
}
