//! SQL catalogs (SQLite, PostgreSQL) in PyIceberg's layout: `iceberg_tables` and
//! `iceberg_namespace_properties`, keyed by catalog name.
//!
//! Besides iceberg-rust's catalog, skiff keeps its own small pool for [`SqlPointers`]: the
//! catalog's `load_table` re-reads and re-parses a table's `metadata.json` on every call, even
//! when it is the file skiff already holds, and that is half of a result-cache hit's time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use iceberg::{CatalogBuilder, TableIdent};
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE, SqlBindStyle,
    SqlCatalogBuilder,
};
use sqlx::Row;

use super::{Connection, TablePointers, describe, storage_factory};
use crate::error::{SetupError, SetupResult as Result};

pub async fn connect(
    uri: &str,
    warehouse: &str,
    name: Option<&str>,
    mut props: HashMap<String, String>,
) -> Result<Connection> {
    let kind = if uri.starts_with("sqlite:") { "sqlite" } else { "postgres" };
    check_sqlite_file(uri)?;
    let name = match name {
        Some(n) => n.to_string(),
        None => only_catalog_name(uri).await?,
    };
    let bind = if kind == "sqlite" { SqlBindStyle::QMark } else { SqlBindStyle::DollarNumeric };
    props.insert(SQL_CATALOG_PROP_URI.into(), uri.into());
    props.insert(SQL_CATALOG_PROP_WAREHOUSE.into(), warehouse.into());
    props.insert(SQL_CATALOG_PROP_BIND_STYLE.into(), bind.to_string());
    let catalog = SqlCatalogBuilder::default()
        .with_storage_factory(storage_factory())
        .load(name.clone(), props)
        .await?;
    let pointers = SqlPointers::connect(uri, bind, &name).await?;
    Ok(Connection {
        catalog: Arc::new(catalog),
        kind,
        location: format!("{} (catalog {name}, warehouse {warehouse})", describe(uri)),
        pointers: Arc::new(TablePointers::Sql(pointers)),
    })
}

/// Reads a table's current metadata location (the table pointer) from `iceberg_tables`,
/// without reading the metadata file it names.
pub struct SqlPointers {
    pool: sqlx::AnyPool,
    /// The look-up, with the catalog's placeholder style (`?` or `$n`).
    sql: String,
    catalog_name: String,
}

impl SqlPointers {
    /// Connections for pointer reads: a query reads a few tables' pointers at once.
    const CONNECTIONS: u32 = 4;
    /// A catalog database that is down fails the query in this time, not sqlx's 30 s.
    const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

    async fn connect(uri: &str, bind: SqlBindStyle, catalog_name: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(Self::CONNECTIONS)
            .idle_timeout(Duration::from_secs(60))
            .acquire_timeout(Self::ACQUIRE_TIMEOUT)
            .connect_lazy(uri)?;
        // The same rows iceberg-rust's `load_table` reads (PyIceberg leaves `iceberg_type` NULL).
        let (a, b, c) = match bind {
            SqlBindStyle::QMark => ("?", "?", "?"),
            SqlBindStyle::DollarNumeric => ("$1", "$2", "$3"),
        };
        let sql = format!(
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = {a} AND table_namespace = {b} AND table_name = {c} \
             AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)"
        );
        Ok(Self { pool, sql, catalog_name: catalog_name.to_string() })
    }

    /// The table's current metadata location, or `None` if the catalog has no such table.
    pub async fn current(&self, table: &TableIdent) -> std::result::Result<Option<String>, sqlx::Error> {
        sqlx::query(&self.sql)
            .bind(&self.catalog_name)
            .bind(table.namespace().join("."))
            .bind(table.name())
            .fetch_optional(&self.pool)
            .await?
            .map(|row| row.try_get::<Option<String>, _>(0))
            .transpose()
            .map(Option::flatten)
    }
}

/// A missing SQLite file would otherwise surface as an opaque driver error.
fn check_sqlite_file(uri: &str) -> Result<()> {
    let Some(rest) = uri.strip_prefix("sqlite://").or_else(|| uri.strip_prefix("sqlite:")) else {
        return Ok(());
    };
    let path = rest.split('?').next().unwrap_or(rest);
    if !path.is_empty() && path != ":memory:" && !std::path::Path::new(path).exists() {
        return Err(SetupError::Msg(format!("SQLite catalog file not found: {path}")));
    }
    Ok(())
}

/// PyIceberg writes one `catalog_name` per lake; use it when the user named none.
async fn only_catalog_name(uri: &str) -> Result<String> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(1).connect(uri).await?;
    let mut names: Vec<String> = Vec::new();
    for table in ["iceberg_tables", "iceberg_namespace_properties"] {
        let q = format!("SELECT DISTINCT catalog_name FROM {table}");
        if let Ok(rows) = sqlx::query(&q).fetch_all(&pool).await {
            for r in rows {
                let n: String = r.try_get(0)?;
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    pool.close().await;
    match names.len() {
        1 => Ok(names.remove(0)),
        0 => Err(SetupError::Msg(
            "the SQL catalog holds no catalog yet: set --catalog-name / SKIFF_CATALOG_NAME".into(),
        )),
        _ => Err(SetupError::Msg(format!(
            "the SQL catalog holds several catalogs ({}): choose one with --catalog-name / SKIFF_CATALOG_NAME",
            names.join(", ")
        ))),
    }
}
