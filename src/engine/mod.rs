//! The query engine: one DataFusion session over the lake, the read-only rules, and the one
//! entry point every front end calls: SQL in, a record-batch stream and its costs out.

mod dialect;
mod functions;
pub mod readonly;
pub mod stats;

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext};

use crate::error::{Result, SkiffError};
use crate::lake::Lake;
use stats::QueryStats;

/// The name SQL can give the lake's catalog (`lake.glass.events`); it is also the default,
/// so `glass.events` resolves as Basin SQL resolves it.
pub const CATALOG: &str = "lake";

pub struct Engine {
    ctx: SessionContext,
    lake: Arc<Lake>,
    max_sql_bytes: usize,
}

/// A running query: its schema, its batches as they are produced, and what it has cost so far.
pub struct Query {
    pub schema: SchemaRef,
    pub stream: SendableRecordBatchStream,
    pub stats: Arc<QueryStats>,
}

impl Engine {
    pub fn new(lake: Arc<Lake>, max_sql_bytes: usize) -> Result<Self> {
        let default_schema = lake
            .namespaces()
            .into_iter()
            .next()
            .unwrap_or_else(|| "public".into());
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_default_catalog_and_schema(CATALOG, &default_schema)
            .with_create_default_catalog_and_schema(false);
        let opts = config.options_mut();
        // The lake's schema declares strings as Utf8; reading them as views only to cast back
        // would cost time for nothing.
        opts.execution.parquet.schema_force_view_types = false;
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .build();
        let mut ctx = SessionContext::new_with_state(state);
        ctx.register_catalog(CATALOG, lake.catalog_provider());
        datafusion_functions_json::register_all(&mut ctx)?;
        ctx.register_udaf(functions::approx_top_k());
        Ok(Self {
            ctx,
            lake,
            max_sql_bytes,
        })
    }

    pub fn lake(&self) -> &Arc<Lake> {
        &self.lake
    }

    /// Plans and starts one query. Errors in planning (syntax, unknown tables and columns,
    /// refused statements, an unreachable catalog) come back here, before any row.
    pub async fn execute(&self, sql: &str) -> Result<Query> {
        if sql.len() > self.max_sql_bytes {
            return Err(SkiffError::BadRequest(format!(
                "SQL text is {} bytes, over the limit of {} bytes",
                sql.len(),
                self.max_sql_bytes
            )));
        }
        if sql.trim().is_empty() {
            return Err(SkiffError::BadRequest("the query is empty".into()));
        }
        let mut state = self.ctx.state();
        let stats = Arc::new(QueryStats::default());
        state.config_mut().set_extension(stats.clone());
        let rewritten = dialect::rewrite(sql);
        let plan = state
            .create_logical_plan(rewritten.as_deref().unwrap_or(sql))
            .await?;
        readonly::check(&plan)?;
        let df = DataFrame::new(state, plan);
        let schema = Arc::new(df.schema().as_arrow().clone());
        let stream = df.execute_stream().await?;
        Ok(Query {
            schema,
            stream,
            stats,
        })
    }
}
