//! Iceberg REST catalogs: Basin Catalog (R2 Data Catalog) and any other that follows the spec.
//!
//! Basin Catalog authenticates with a Cloudflare API token as a bearer token, has no OAuth
//! endpoint, and vends S3 credentials for R2 in `loadTable`'s `config` when asked to.
//!
//! Besides iceberg-rust's catalog, skiff sends its own `loadTable` for [`RestPointers`]: a
//! conditional one (`If-None-Match` with the table's last `ETag`), answered with a bodiless 304
//! by catalogs that implement freshness-aware loading, and otherwise read for its
//! `metadata-location` alone (asking for no more snapshots than the refs name). iceberg-rust's
//! `load_table` parses the whole metadata (every snapshot a table keeps) and builds a new
//! `FileIO` on every call, even for a table skiff already holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iceberg::{CatalogBuilder, TableIdent};
use iceberg_catalog_rest::{REST_CATALOG_PROP_URI, REST_CATALOG_PROP_WAREHOUSE, RestCatalogBuilder};
use reqwest::header::{AUTHORIZATION, ETAG, HeaderMap, HeaderValue, IF_NONE_MATCH, USER_AGENT};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::{Connection, PointerError, TablePointers, describe, storage_factory};
use crate::error::{StartError, StartResult as Result};

/// Asks for vended credentials: a table loaded without them could not read its files.
const ACCESS_DELEGATION: (&str, &str) = ("X-Iceberg-Access-Delegation", "vended-credentials");

pub async fn connect(
    uri: &str,
    warehouse: Option<&str>,
    token: Option<String>,
    mut props: HashMap<String, String>,
) -> Result<Connection> {
    let uri = uri.trim_end_matches('/');
    props.insert(REST_CATALOG_PROP_URI.into(), uri.into());
    if let Some(w) = warehouse {
        props.insert(REST_CATALOG_PROP_WAREHOUSE.into(), w.into());
    }
    if let Some(t) = &token {
        props.insert("token".into(), t.clone());
    }
    props.insert(format!("header.{}", ACCESS_DELEGATION.0), ACCESS_DELEGATION.1.into());
    let catalog =
        RestCatalogBuilder::default().with_storage_factory(storage_factory()).load("rest", props).await?;
    let pointers = RestPointers::new(uri, warehouse, token.as_deref())?;
    Ok(Connection {
        catalog: Arc::new(catalog),
        kind: "rest",
        location: match warehouse {
            Some(w) => format!("{} (warehouse {w})", describe(uri)),
            None => describe(uri),
        },
        pointers: Arc::new(TablePointers::Rest(pointers)),
    })
}

/// Reads tables' metadata locations with conditional `loadTable` requests.
pub struct RestPointers {
    client: reqwest::Client,
    uri: String,
    warehouse: Option<String>,
    /// The table routes' base (`<uri>/v1[/<prefix>]`), from the catalog's `/v1/config`, read
    /// on first use as iceberg-rust does.
    base: OnceCell<Url>,
    /// Per table, the last `ETag` the catalog sent and the metadata location it was sent with.
    etags: Mutex<HashMap<TableIdent, (HeaderValue, String)>>,
    /// Asks for the snapshots that branches and tags reference, not every snapshot kept (the
    /// spec's `snapshots=refs`): a check needs none of them, and a Pipelines table keeps one
    /// per commit. Cleared if the catalog refuses it.
    refs_only: AtomicBool,
}

/// The parts of `/v1/config`'s answer that move the table routes.
#[derive(Deserialize)]
struct CatalogConfig {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

/// The one field of a `loadTable` answer a pointer needs; the metadata is skipped unparsed.
#[derive(Deserialize)]
struct LoadTablePointer {
    #[serde(rename = "metadata-location")]
    metadata_location: Option<String>,
}

impl RestPointers {
    /// A pointer read that takes longer fails the query as the catalog's outage, rather than
    /// waiting out Basin's 40 s request timeout.
    const TIMEOUT: Duration = Duration::from_secs(10);
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

    fn new(uri: &str, warehouse: Option<&str>, token: Option<&str>) -> Result<Self> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCESS_DELEGATION.0, HeaderValue::from_static(ACCESS_DELEGATION.1));
        headers.insert(USER_AGENT, HeaderValue::from_static(concat!("skiff/", env!("CARGO_PKG_VERSION"))));
        if let Some(t) = token {
            let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|_| StartError::Msg("the catalog token is not a valid header value".into()))?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Self::TIMEOUT)
            .connect_timeout(Self::CONNECT_TIMEOUT)
            .build()
            .map_err(|e| StartError::Msg(format!("building the catalog client: {e}")))?;
        Ok(Self {
            client,
            uri: uri.to_string(),
            warehouse: warehouse.map(str::to_string),
            base: OnceCell::new(),
            etags: Mutex::default(),
            refs_only: AtomicBool::new(true),
        })
    }

    /// The table's current metadata location, or `None` when the catalog's answer cannot tell
    /// (no such table, an error status, an answer without a location, no config yet): the full
    /// load then reports it in iceberg-rust's words.
    pub async fn current(&self, table: &TableIdent) -> std::result::Result<Option<String>, PointerError> {
        let Ok(base) = self.base.get_or_try_init(|| self.base()).await else {
            return Ok(None);
        };
        let mut url = base.clone();
        url.path_segments_mut().map_err(|_| "the catalog URI cannot take a path")?.extend([
            "namespaces",
            &table.namespace().join("\u{1f}"),
            "tables",
            table.name(),
        ]);
        let held = self.etags.lock().expect("etags").get(table).cloned();
        let refs_only = self.refs_only.load(Ordering::Relaxed);
        let mut request = self.client.get(url);
        if refs_only {
            request = request.query(&[("snapshots", "refs")]);
        }
        if let Some((etag, _)) = &held {
            request = request.header(IF_NONE_MATCH, etag.clone());
        }
        let response = request.send().await?;
        match response.status() {
            StatusCode::NOT_MODIFIED => Ok(held.map(|(_, location)| location)),
            StatusCode::OK => {
                let etag = response.headers().get(ETAG).cloned();
                let body = response.bytes().await?;
                let Ok(LoadTablePointer { metadata_location: Some(location) }) =
                    serde_json::from_slice(&body)
                else {
                    return Ok(None);
                };
                let mut etags = self.etags.lock().expect("etags");
                match etag {
                    Some(etag) => etags.insert(table.clone(), (etag, location.clone())),
                    None => etags.remove(table),
                };
                Ok(Some(location))
            }
            // A catalog that refuses `snapshots=refs` is asked without it from now on.
            StatusCode::BAD_REQUEST if refs_only => {
                self.refs_only.store(false, Ordering::Relaxed);
                Box::pin(self.current(table)).await
            }
            _ => Ok(None),
        }
    }

    /// `<uri>/v1[/<prefix>]`, with the URI and prefix the catalog's config sets.
    async fn base(&self) -> std::result::Result<Url, PointerError> {
        let mut request = self.client.get(format!("{}/v1/config", self.uri));
        if let Some(w) = &self.warehouse {
            request = request.query(&[("warehouse", w)]);
        }
        let response = request.send().await?.error_for_status()?;
        let mut config: CatalogConfig = serde_json::from_slice(&response.bytes().await?)?;
        let uri = config.overrides.remove("uri").unwrap_or_else(|| self.uri.clone());
        let prefix = config.overrides.remove("prefix").or_else(|| config.defaults.remove("prefix"));
        // Joined as iceberg-rust joins them, so both send the same paths.
        let base = match prefix {
            Some(p) => format!("{}/v1/{p}", uri.trim_end_matches('/')),
            None => format!("{}/v1", uri.trim_end_matches('/')),
        };
        let mut url = Url::parse(&base)?;
        url.path_segments_mut().map_err(|_| "the catalog URI cannot take a path")?.pop_if_empty();
        Ok(url)
    }
}
