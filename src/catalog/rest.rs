//! Iceberg REST catalogs: Basin Catalog (R2 Data Catalog) and any other that follows the spec.
//!
//! Basin Catalog authenticates with a Cloudflare API token as a bearer token, has no OAuth
//! endpoint, and vends S3 credentials for R2 in `loadTable`'s `config` when asked to.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::CatalogBuilder;
use iceberg_catalog_rest::{REST_CATALOG_PROP_URI, REST_CATALOG_PROP_WAREHOUSE, RestCatalogBuilder};

use super::{Connection, describe, storage_factory};
use crate::error::StartResult as Result;

pub async fn connect(
    uri: &str,
    warehouse: Option<&str>,
    token: Option<String>,
    mut props: HashMap<String, String>,
) -> Result<Connection> {
    props.insert(REST_CATALOG_PROP_URI.into(), uri.trim_end_matches('/').into());
    if let Some(w) = warehouse {
        props.insert(REST_CATALOG_PROP_WAREHOUSE.into(), w.into());
    }
    if let Some(t) = token {
        props.insert("token".into(), t);
    }
    props.insert("header.X-Iceberg-Access-Delegation".into(), "vended-credentials".into());
    let catalog =
        RestCatalogBuilder::default().with_storage_factory(storage_factory()).load("rest", props).await?;
    Ok(Connection {
        catalog: Arc::new(catalog),
        kind: "rest",
        location: match warehouse {
            Some(w) => format!("{} (warehouse {w})", describe(uri)),
            None => describe(uri),
        },
        pointers: None,
    })
}
