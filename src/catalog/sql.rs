//! SQL catalogs (SQLite, PostgreSQL) in PyIceberg's layout: `iceberg_tables` and
//! `iceberg_namespace_properties`, keyed by catalog name.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::CatalogBuilder;
use iceberg_catalog_sql::{
    SQL_CATALOG_PROP_BIND_STYLE, SQL_CATALOG_PROP_URI, SQL_CATALOG_PROP_WAREHOUSE, SqlBindStyle,
    SqlCatalogBuilder,
};
use sqlx::Row;

use super::{Connection, describe, storage_factory};
use crate::error::{StartError, StartResult as Result};

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
    Ok(Connection {
        catalog: Arc::new(catalog),
        kind,
        location: format!("{} (catalog {name}, warehouse {warehouse})", describe(uri)),
    })
}

/// A missing SQLite file would otherwise surface as an opaque driver error.
fn check_sqlite_file(uri: &str) -> Result<()> {
    let Some(rest) = uri.strip_prefix("sqlite://").or_else(|| uri.strip_prefix("sqlite:")) else {
        return Ok(());
    };
    let path = rest.split('?').next().unwrap_or(rest);
    if !path.is_empty() && path != ":memory:" && !std::path::Path::new(path).exists() {
        return Err(StartError::Msg(format!("SQLite catalog file not found: {path}")));
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
        0 => Err(StartError::Msg(
            "the SQL catalog holds no catalog yet: set --catalog-name / SKIFF_CATALOG_NAME".into(),
        )),
        _ => Err(StartError::Msg(format!(
            "the SQL catalog holds several catalogs ({}): choose one with --catalog-name / SKIFF_CATALOG_NAME",
            names.join(", ")
        ))),
    }
}
