//! skiff never changes the lake or the server: DDL, DML, `COPY`, `SET` and every other
//! statement that is not a query are refused after planning, before anything runs.
//! Reading files or URLs as tables is off too (DataFusion's URL tables stay disabled), and
//! a path used as a table name is reported as refused rather than missing (see `error`).

use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::LogicalPlan;

use crate::error::{QueryError, Result};

pub fn check(plan: &LogicalPlan) -> Result<()> {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(plan)
        .map_err(|e| {
            let why = e.strip_backtrace();
            let why = why.strip_prefix("Error during planning: ").unwrap_or(&why);
            QueryError::ReadOnly(format!("skiff is read-only and accepts only queries: {why}"))
        })
}
