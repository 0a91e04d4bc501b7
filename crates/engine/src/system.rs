//! The `system` schema: skiff's own tables (`system.queries`) next to the lake's namespaces.
//!
//! The rule for a lake namespace also named `system`: its tables stay readable as
//! `system.<table>`, except a table whose name skiff reserves (`queries`), which skiff's own
//! table shadows. That shadowing is never silent: a warning is logged at start, or the first
//! time such a lake table is listed or named. `SHOW TABLES` and `information_schema` list `system` once,
//! with skiff's tables (as views) and the lake's other tables.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;

use super::queries::QueriesTable;

pub const SCHEMA: &str = "system";
/// Table names in `system` that are skiff's.
const RESERVED: &[&str] = &["queries"];

/// The lake's catalog with the `system` schema added.
pub fn with_system_schema(lake: Arc<dyn CatalogProvider>) -> Arc<dyn CatalogProvider> {
    SystemSchema { lake: lake.schema(SCHEMA) }.warn_shadowed();
    Arc::new(WithSystem { lake })
}

#[derive(Debug)]
struct WithSystem {
    lake: Arc<dyn CatalogProvider>,
}

impl CatalogProvider for WithSystem {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        let mut names = self.lake.schema_names();
        if !names.iter().any(|n| n == SCHEMA) {
            names.push(SCHEMA.to_string());
        }
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == SCHEMA {
            return Some(Arc::new(SystemSchema { lake: self.lake.schema(name) }));
        }
        self.lake.schema(name)
    }
}

#[derive(Debug)]
struct SystemSchema {
    /// The lake's own `system` namespace, if the lake resolves one.
    lake: Option<Arc<dyn SchemaProvider>>,
}

impl SystemSchema {
    /// Warns (once per process) about each lake table skiff's own shadows.
    fn warn_shadowed(&self) {
        static WARNED: AtomicBool = AtomicBool::new(false);
        let Some(lake) = &self.lake else { return };
        let shadowed: Vec<&str> = RESERVED.iter().copied().filter(|t| lake.table_exist(t)).collect();
        if !shadowed.is_empty() && !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                tables = %shadowed.iter().map(|t| format!("{SCHEMA}.{t}")).collect::<Vec<_>>().join(","),
                "the lake has tables whose names skiff reserves in the system schema; \
                 SQL reads skiff's own tables under these names, not the lake's"
            );
        }
    }
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        self.warn_shadowed();
        let mut names: Vec<String> = RESERVED.iter().map(|t| t.to_string()).collect();
        if let Some(lake) = &self.lake {
            names.extend(lake.table_names().into_iter().filter(|t| !RESERVED.contains(&t.as_str())));
        }
        names
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        if name == "queries" {
            self.warn_shadowed();
            return Ok(Some(Arc::new(QueriesTable)));
        }
        match &self.lake {
            Some(lake) => lake.table(name).await,
            None => Ok(None),
        }
    }

    async fn table_type(&self, name: &str) -> DFResult<Option<TableType>> {
        if RESERVED.contains(&name) {
            return Ok(Some(TableType::View));
        }
        match &self.lake {
            Some(lake) => lake.table_type(name).await,
            None => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        RESERVED.contains(&name) || self.lake.as_ref().is_some_and(|l| l.table_exist(name))
    }
}
