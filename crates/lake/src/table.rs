//! DataFusion tables over Iceberg: one physical table, or the versions of a versioned table
//! read as one. Each is built per query from freshly loaded metadata, so its schema and the
//! snapshot it scans always agree.

use std::any::Any;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::expressions::{CastExpr, Column, Literal};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};
use iceberg::table::Table;

use super::cache::Caches;
use super::error::LakeError;
use super::scan;
use super::versions::union_schema;

#[derive(Debug)]
pub struct PhysicalTable {
    table: Table,
    schema: SchemaRef,
    caches: Arc<Caches>,
}

impl PhysicalTable {
    pub fn try_new(table: Table, caches: Arc<Caches>) -> Result<Self, LakeError> {
        let schema = scan::arrow_schema(&table)?;
        Ok(Self { table, schema, caches })
    }

    /// Reads what a first scan of the current snapshot needs (its manifest list, manifests
    /// and data files' footers) into the caches, as a scan would. Returns the footers read.
    pub async fn warm(&self) -> Result<usize, LakeError> {
        match scan::manifest_files(&self.table, &self.schema, &self.caches).await? {
            Some(files) => Ok(scan::warm_footers(&self.table, &files, &self.caches).await),
            None => Ok(0),
        }
    }

    /// The table, snapshot and schema this provider reads: its data cannot change while
    /// these stay the same (snapshots and the files they list are immutable).
    fn version(&self) -> String {
        let m = self.table.metadata();
        let snapshot = m.current_snapshot_id().map_or_else(|| "empty".to_string(), |s| s.to_string());
        format!("{}@{snapshot}/schema{}", self.table.identifier(), m.current_schema_id())
    }
}

/// The exact table versions a lake table provider reads (one per physical table), or `None`
/// when the provider is not a lake table (`system.queries`, `information_schema`), whose
/// contents change without a snapshot.
pub fn versions_read(provider: &dyn TableProvider) -> Option<Vec<String>> {
    let any = provider.as_any();
    if let Some(t) = any.downcast_ref::<PhysicalTable>() {
        return Some(vec![t.version()]);
    }
    any.downcast_ref::<VersionedTable>().map(|v| v.versions.iter().map(PhysicalTable::version).collect())
}

#[async_trait]
impl TableProvider for PhysicalTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(scan::pushdown(filters))
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        scan::scan(&self.table, &self.schema, &self.caches, state, projection, filters, limit).await
    }
}

/// Every version of a table as one: a UNION ALL of per-version scans, each projected onto
/// the union schema (typed NULL for a column the version lacks, a cast where a type widened).
/// Filters and projections reach each version's scan, so pruning works per version.
#[derive(Debug)]
pub struct VersionedTable {
    versions: Vec<PhysicalTable>,
    schema: SchemaRef,
}

impl VersionedTable {
    pub fn try_new(tables: Vec<Table>, caches: &Arc<Caches>) -> Result<Self, LakeError> {
        let versions = tables
            .into_iter()
            .map(|t| PhysicalTable::try_new(t, caches.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let named: Vec<_> =
            versions.iter().map(|v| (v.table.identifier().to_string(), v.schema.clone())).collect();
        let schema = union_schema(&named).map_err(LakeError::Invalid)?;
        Ok(Self { versions, schema })
    }

    async fn scan_version(
        &self,
        version: &PhysicalTable,
        state: &dyn Session,
        columns: &[usize],
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let vs = &version.schema;
        // The version's own columns among those wanted, in the order its scan returns them.
        let own: Vec<usize> =
            columns.iter().filter_map(|&i| vs.index_of(self.schema.field(i).name()).ok()).collect();
        // A filter goes down only if the version has all its columns with the union's type.
        let pushed: Vec<Expr> = filters
            .iter()
            .filter(|f| {
                f.column_refs().iter().all(|c| {
                    vs.field_with_name(&c.name)
                        .ok()
                        .zip(self.schema.field_with_name(&c.name).ok())
                        .is_some_and(|(a, b)| a.data_type() == b.data_type())
                })
            })
            .cloned()
            .collect();
        let input = version.scan(state, Some(&own), &pushed, limit).await?;
        let input_schema = input.schema();
        let mut exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = Vec::with_capacity(columns.len());
        for &i in columns {
            let field = self.schema.field(i);
            let expr: Arc<dyn PhysicalExpr> = match input_schema.index_of(field.name()) {
                Ok(j) => {
                    let col: Arc<dyn PhysicalExpr> = Arc::new(Column::new(field.name(), j));
                    if input_schema.field(j).data_type() == field.data_type() {
                        col
                    } else {
                        Arc::new(CastExpr::new(col, field.data_type().clone(), None))
                    }
                }
                Err(_) => Arc::new(Literal::new(ScalarValue::try_from(field.data_type())?)),
            };
            exprs.push((expr, field.name().clone()));
        }
        Ok(Arc::new(ProjectionExec::try_new(exprs, input)?))
    }
}

#[async_trait]
impl TableProvider for VersionedTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(scan::pushdown(filters))
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        // Versions are planned at once: on a remote store planning waits on manifest reads.
        let branches = self.versions.iter().map(|v| self.scan_version(v, state, &columns, filters, limit));
        UnionExec::try_new(futures::future::try_join_all(branches).await?)
    }
}
