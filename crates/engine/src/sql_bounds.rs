//! Bounds on what one statement may ask the planner for, checked on its syntax tree before
//! DataFusion plans it: DataFusion's planning is synchronous, recursive and unbounded. Over a
//! bound the statement is refused (400) with the bound's name.
//!
//! - Nesting: 2,000 `OR`ed terms (4 KB of SQL) overflowed a thread's stack.
//! - Size once CTEs are expanded: DataFusion inlines a CTE at every reference, so 22 CTEs that
//!   each read the one before twice (1.3 KB of SQL) made a plan of 4 million nodes and
//!   exhausted memory.
//! - FROM items in one SELECT: 12,000 took minutes and gigabytes to plan.
//! - Grouping sets: `GROUP BY CUBE` of 24 columns is 16 million of them.

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{
    Expr, GroupByExpr, GroupByWithModifier, ObjectName, Query, Select, SetExpr, Visit, Visitor,
};

use crate::error::QueryError;

/// How deep expressions and chains of set operations may nest.
pub const MAX_NESTING: usize = 1000;

/// Tables, subqueries and joins one SELECT may read.
pub const MAX_FROM_ITEMS: usize = 256;
/// CTEs in one WITH.
const MAX_CTES: usize = 256;

/// What a statement may ask the planner for.
#[derive(Debug, Clone, Copy)]
pub struct PlanBounds {
    /// Syntax nodes once every CTE reference is expanded.
    pub max_plan_nodes: u64,
    /// Grouping sets of one GROUP BY.
    pub max_grouping_sets: u64,
}

/// Refuses a statement over `bounds`, before DataFusion plans it.
pub fn check(statement: &Statement, bounds: &PlanBounds) -> Result<(), QueryError> {
    let statement = match statement {
        Statement::Statement(s) => s.as_ref(),
        Statement::Explain(e) => return check(&e.statement, bounds),
        _ => return Ok(()),
    };
    let mut walk = Walk { depth: 0, bounds };
    match statement.visit(&mut walk) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(why) => Err(QueryError::BadRequest(why)),
    }
}

struct Walk<'a> {
    depth: usize,
    bounds: &'a PlanBounds,
}

impl Visitor for Walk<'_> {
    type Break = String;

    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<String> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return ControlFlow::Break(format!(
                "the query nests expressions more than {MAX_NESTING} deep; write a long list of \
                 alternatives as `x IN (…)`"
            ));
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<String> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<String> {
        if set_depth(&query.body, MAX_NESTING) > MAX_NESTING {
            return ControlFlow::Break(format!(
                "the query nests set operations (UNION, INTERSECT, EXCEPT) more than {MAX_NESTING} deep"
            ));
        }
        for select in selects(&query.body) {
            let items: usize = select.from.iter().map(|t| 1 + t.joins.len()).sum();
            if items > MAX_FROM_ITEMS {
                return ControlFlow::Break(format!(
                    "a SELECT reads {items} tables, subqueries and joins; at most {MAX_FROM_ITEMS} are planned"
                ));
            }
            let sets = grouping_sets(select);
            if sets > self.bounds.max_grouping_sets {
                return ControlFlow::Break(format!(
                    "the GROUP BY expands to {sets} grouping sets; the limit is {} (--max-grouping-sets)",
                    self.bounds.max_grouping_sets
                ));
            }
        }
        if let Some(with) = &query.with {
            // Each CTE is planned in the scope of the ones before it: a long chain takes minutes
            // to plan though it stays small.
            if with.cte_tables.len() > MAX_CTES {
                return ControlFlow::Break(format!(
                    "a WITH defines {} CTEs; at most {MAX_CTES} are planned",
                    with.cte_tables.len()
                ));
            }
            let nodes = expanded(query);
            if nodes > self.bounds.max_plan_nodes {
                return ControlFlow::Break(format!(
                    "the query is {nodes} syntax nodes once its CTEs are expanded at each reference; \
                     the limit is {} (--max-plan-nodes)",
                    self.bounds.max_plan_nodes
                ));
            }
        }
        ControlFlow::Continue(())
    }
}

/// The depth of a chain of set operations, counted no further than `budget` + 1.
fn set_depth(e: &SetExpr, budget: usize) -> usize {
    match e {
        SetExpr::SetOperation { left, right, .. } if budget > 0 => {
            1 + set_depth(left, budget - 1).max(set_depth(right, budget - 1))
        }
        SetExpr::SetOperation { .. } => 1,
        _ => 0,
    }
}

/// The SELECTs of a query body (those of nested queries are visited on their own).
fn selects(e: &SetExpr) -> Vec<&Select> {
    match e {
        SetExpr::Select(s) => vec![s],
        SetExpr::SetOperation { left, right, .. } => {
            let mut all = selects(left);
            all.extend(selects(right));
            all
        }
        _ => vec![],
    }
}

/// How many grouping sets a SELECT's GROUP BY makes: the product of its parts'.
fn grouping_sets(select: &Select) -> u64 {
    let GroupByExpr::Expressions(exprs, modifiers) = &select.group_by else { return 1 };
    let pow2 = |n: usize| 1u64.checked_shl(n as u32).unwrap_or(u64::MAX);
    let mut sets = exprs.iter().fold(1u64, |sets, e| {
        let here = match e {
            Expr::Cube(columns) => pow2(columns.len()),
            Expr::Rollup(columns) => columns.len() as u64 + 1,
            Expr::GroupingSets(list) => list.len() as u64,
            _ => 1,
        };
        sets.saturating_mul(here)
    });
    for m in modifiers {
        sets = sets.saturating_mul(match m {
            GroupByWithModifier::Rollup => exprs.len() as u64 + 1,
            GroupByWithModifier::Cube => pow2(exprs.len()),
            _ => 1,
        });
    }
    sets
}

/// The syntax nodes of `query` with each reference to one of its CTEs counted as that CTE's
/// own expanded size, as DataFusion inlines it.
fn expanded(query: &Query) -> u64 {
    let mut sizes: HashMap<String, u64> = HashMap::new();
    if let Some(with) = &query.with {
        for cte in &with.cte_tables {
            let size = counted(&cte.query, &sizes);
            sizes.insert(cte.alias.name.value.to_lowercase(), size.max(1));
        }
    }
    let mut body = query.clone();
    body.with = None;
    counted(&body, &sizes)
}

/// Nodes of `query`, each reference to a CTE of `sizes` counted as its size.
fn counted(query: &Query, sizes: &HashMap<String, u64>) -> u64 {
    struct Count<'a> {
        nodes: u64,
        sizes: &'a HashMap<String, u64>,
    }
    impl Visitor for Count<'_> {
        type Break = ();
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
            self.nodes = self.nodes.saturating_add(1);
            ControlFlow::Continue(())
        }
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.nodes = self.nodes.saturating_add(1);
            ControlFlow::Continue(())
        }
        fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
            let cte = match name.0.as_slice() {
                [part] => part.as_ident().and_then(|i| self.sizes.get(&i.value.to_lowercase())),
                _ => None,
            };
            self.nodes = self.nodes.saturating_add(cte.copied().unwrap_or(1));
            ControlFlow::Continue(())
        }
    }
    let mut count = Count { nodes: 0, sizes };
    let _ = query.visit(&mut count);
    count.nodes
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn checked(sql: &str) -> Result<(), QueryError> {
        let statement = DFParser::parse_sql(sql).unwrap().pop_front().unwrap();
        check(&statement, &PlanBounds { max_plan_nodes: 100_000, max_grouping_sets: 4096 })
    }

    #[test]
    fn ctes_that_double_at_each_step_are_refused() {
        let mut sql = String::from("WITH c0 AS (SELECT 1 AS x)");
        for i in 1..=22 {
            sql += &format!(", c{i} AS (SELECT x FROM c{} UNION ALL SELECT x FROM c{})", i - 1, i - 1);
        }
        sql += " SELECT count(*) FROM c22";
        let e = checked(&sql).unwrap_err().to_string();
        assert!(e.contains("--max-plan-nodes"), "{e}");
        // A few steps are fine.
        let short: String = sql.split(", c6 ").next().unwrap().to_string() + " SELECT count(*) FROM c5";
        checked(&short).unwrap();
    }

    #[test]
    fn long_from_lists_and_large_cubes_are_refused() {
        let from: Vec<String> = (0..300).map(|i| format!("(VALUES (1)) AS v{i}")).collect();
        let e = checked(&format!("SELECT 1 FROM {}", from.join(", "))).unwrap_err().to_string();
        assert!(e.contains("300 tables"), "{e}");
        let columns: Vec<String> = (0..24).map(|i| format!("c{i}")).collect();
        let e = checked(&format!("SELECT count(*) FROM t GROUP BY CUBE ({})", columns.join(", ")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("16777216 grouping sets"), "{e}");
        checked("SELECT count(*) FROM t GROUP BY CUBE (a, b, c), ROLLUP (d, e)").unwrap();
        checked("SELECT count(*) FROM t GROUP BY GROUPING SETS ((a), (b), ())").unwrap();
        let chain = |n: usize| -> String {
            let ctes: String = (1..n).map(|i| format!(", c{i} AS (SELECT x FROM c{})", i - 1)).collect();
            format!("WITH c0 AS (SELECT 1 AS x){ctes} SELECT * FROM c{}", n - 1)
        };
        let e = checked(&chain(8000)).unwrap_err().to_string();
        assert!(e.contains("8000 CTEs"), "{e}");
        checked(&chain(200)).unwrap();
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = (0..1500).map(|i| format!("x = {i}")).collect::<Vec<_>>().join(" OR ");
        assert!(checked(&format!("SELECT 1 FROM t WHERE {deep}")).is_err());
        checked("SELECT 1 FROM t WHERE x = 1 OR x = 2").unwrap();
    }
}
