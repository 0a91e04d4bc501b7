//! Group keys computed next to the scan that reads their column.
//!
//! `GROUP BY date_trunc('week', e.timestamp)` is computed by the aggregation, above any join,
//! so the scan hands up every timestamp. Computed in a projection right above the table's
//! scan (and its filter), the key is there for the scan to fold per file
//! (`lake/per_file/`): a week is one value for a file of one day, and the timestamps are
//! then not read at all. The key moves through projections, aliases and the preserved side of
//! inner and outer joins, and only when it reaches a scan; the aggregation then groups by the
//! computed column under the key's old name.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, JoinType, Result};
use datafusion::logical_expr::{Aggregate, Expr, Join, LogicalPlan, Projection, SubqueryAlias};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// Prefix of the computed keys' column names.
const KEY: &str = "__skiff_group_key_";

#[derive(Debug, Default)]
pub struct GroupKeysAtScan;

impl OptimizerRule for GroupKeysAtScan {
    fn name(&self) -> &str {
        "group_keys_at_scan"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(a) = &plan else { return Ok(Transformed::no(plan)) };
        let mut input = a.input.as_ref().clone();
        let mut group = a.group_expr.clone();
        let mut moved = false;
        for (i, g) in a.group_expr.iter().enumerate() {
            let g = match g {
                Expr::Alias(alias) => alias.expr.as_ref(),
                g => g,
            };
            if !movable(g) {
                continue;
            }
            let name = format!("{KEY}{i}");
            let Some(with) = with_column(&input, g, &name)? else { continue };
            let (qualifier, field) = a.schema.qualified_field(i);
            group[i] = column(with.schema(), &name)?.alias_qualified(qualifier.cloned(), field.name());
            input = with;
            moved = true;
        }
        if !moved {
            return Ok(Transformed::no(plan));
        }
        let new = Aggregate::try_new(Arc::new(input), group, a.aggr_expr.clone())?;
        // The aggregation's output must not change; if it would, the key stays where it was.
        if new.schema.as_ref() != a.schema.as_ref() {
            return Ok(Transformed::no(plan));
        }
        Ok(Transformed::yes(LogicalPlan::Aggregate(new)))
    }
}

/// A key worth computing below: an expression of columns (not a column itself, nor one
/// already moved), the same every time it is evaluated. `g` is unaliased.
fn movable(g: &Expr) -> bool {
    !matches!(g, Expr::Column(_) | Expr::Literal(..) | Expr::GroupingSet(_))
        && !g.column_refs().is_empty()
        && !g.is_volatile()
        && !g
            .exists(|e| Ok(matches!(e, Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_))))
            .unwrap_or(true)
}

/// `plan` with `g` (over `plan`'s columns, unaliased) as one more column `name`, computed right
/// above the scan it reads; `None` when `g` cannot get there.
fn with_column(plan: &LogicalPlan, g: &Expr, name: &str) -> Result<Option<LogicalPlan>> {
    Ok(Some(match plan {
        LogicalPlan::Projection(p) => {
            let inner = substitute(g, &p.schema, |i| p.expr[i].clone().unalias())?;
            if !movable(&inner) {
                return Ok(None);
            }
            let Some(input) = with_column(&p.input, &inner, name)? else { return Ok(None) };
            let mut expr = p.expr.clone();
            expr.push(column(input.schema(), name)?);
            LogicalPlan::Projection(Projection::try_new(expr, Arc::new(input))?)
        }
        LogicalPlan::SubqueryAlias(s) => {
            let below = s.input.schema();
            let inner = substitute(g, &s.schema, |i| Expr::Column(Column::from(below.qualified_field(i))))?;
            let Some(input) = with_column(&s.input, &inner, name)? else { return Ok(None) };
            LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(Arc::new(input), s.alias.clone())?)
        }
        LogicalPlan::Join(j) => {
            let columns = g.column_refs();
            let on = |side: &LogicalPlan| columns.iter().all(|c| side.schema().has_column(c));
            // Only a side whose rows the join keeps as they are: on the other side of an
            // outer join, rows without a match would get the key of NULL computed above.
            let (left, right) = match j.join_type {
                JoinType::Inner | JoinType::Left if on(&j.left) => match with_column(&j.left, g, name)? {
                    Some(left) => (Arc::new(left), Arc::clone(&j.right)),
                    None => return Ok(None),
                },
                JoinType::Inner | JoinType::Right if on(&j.right) => match with_column(&j.right, g, name)? {
                    Some(right) => (Arc::clone(&j.left), Arc::new(right)),
                    None => return Ok(None),
                },
                _ => return Ok(None),
            };
            LogicalPlan::Join(Join::try_new(
                left,
                right,
                j.on.clone(),
                j.filter.clone(),
                j.join_type,
                j.join_constraint,
                j.null_equality,
                j.null_aware,
            )?)
        }
        LogicalPlan::TableScan(_) => project(plan, g, name)?,
        LogicalPlan::Filter(f) if matches!(f.input.as_ref(), LogicalPlan::TableScan(_)) => {
            project(plan, g, name)?
        }
        _ => return Ok(None),
    }))
}

/// `plan`'s columns and `g` as `name`.
fn project(plan: &LogicalPlan, g: &Expr, name: &str) -> Result<LogicalPlan> {
    let mut expr: Vec<Expr> = plan.schema().columns().into_iter().map(Expr::Column).collect();
    expr.push(g.clone().alias(name));
    Ok(LogicalPlan::Projection(Projection::try_new(expr, Arc::new(plan.clone()))?))
}

/// `g` (over `schema`) with each column replaced by `by` of its place in `schema`.
fn substitute(g: &Expr, schema: &DFSchema, by: impl Fn(usize) -> Expr) -> Result<Expr> {
    g.clone()
        .transform(|e| {
            Ok(match &e {
                Expr::Column(c) => Transformed::yes(by(schema.index_of_column(c)?)),
                _ => Transformed::no(e),
            })
        })
        .map(|t| t.data)
}

/// The column `name` of `schema`, with its qualifier.
fn column(schema: &DFSchema, name: &str) -> Result<Expr> {
    let (qualifier, field) = schema.qualified_field_with_unqualified_name(name)?;
    Ok(Expr::Column(Column::from((qualifier, field))))
}
