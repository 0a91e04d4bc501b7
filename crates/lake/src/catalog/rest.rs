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

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent};
use iceberg_catalog_rest::{
    REST_CATALOG_PROP_URI, REST_CATALOG_PROP_WAREHOUSE, RestCatalog, RestCatalogBuilder,
};
use reqwest::header::{AUTHORIZATION, ETAG, HeaderMap, HeaderValue, IF_NONE_MATCH, USER_AGENT};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::{CatalogToken, Connection, PointerError, TablePointers, describe, storage_factory};
use crate::error::{SetupError, SetupResult as Result};

/// Asks for vended credentials: a table loaded without them could not read its files.
const ACCESS_DELEGATION: (&str, &str) = ("X-Iceberg-Access-Delegation", "vended-credentials");

pub async fn connect(
    uri: &str,
    warehouse: Option<&str>,
    token: Arc<CatalogToken>,
    mut props: HashMap<String, String>,
) -> Result<Connection> {
    let uri = uri.trim_end_matches('/');
    props.insert(REST_CATALOG_PROP_URI.into(), uri.into());
    if let Some(w) = warehouse {
        props.insert(REST_CATALOG_PROP_WAREHOUSE.into(), w.into());
    }
    props.insert(format!("header.{}", ACCESS_DELEGATION.0), ACCESS_DELEGATION.1.into());
    let catalog = RotatingCatalog::new(props, token.clone()).await?;
    let pointers = RestPointers::new(uri, warehouse, token)?;
    Ok(Connection {
        catalog: Arc::new(catalog),
        kind: "rest",
        location: match warehouse {
            Some(w) => format!("{} (warehouse {w})", describe(uri)),
            None => describe(uri),
        },
        pointers: Arc::new(TablePointers::Rest(Box::new(pointers))),
    })
}

/// Reads tables' metadata locations with conditional `loadTable` requests.
pub struct RestPointers {
    client: reqwest::Client,
    /// Sent with each request, as it is at that moment.
    token: Arc<CatalogToken>,
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

    fn new(uri: &str, warehouse: Option<&str>, token: Arc<CatalogToken>) -> Result<Self> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCESS_DELEGATION.0, HeaderValue::from_static(ACCESS_DELEGATION.1));
        headers.insert(USER_AGENT, HeaderValue::from_static(concat!("skiff/", env!("CARGO_PKG_VERSION"))));
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(Self::TIMEOUT)
            .connect_timeout(Self::CONNECT_TIMEOUT)
            .build()
            .map_err(|e| SetupError::Msg(format!("building the catalog client: {e}")))?;
        Ok(Self {
            client,
            token,
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
        let mut request = self.authorized(self.client.get(url))?;
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

    /// The error status the catalog answers its config with now, if it answers one: asked when a
    /// call through iceberg-rust failed, whose errors keep the status only as text
    /// (apache/iceberg-rust#1918).
    pub async fn refusal(&self) -> Option<StatusCode> {
        let status = self.config_request().ok()?.send().await.ok()?.status();
        (!status.is_success()).then_some(status)
    }

    /// `GET /v1/config` for this warehouse, with the token as it is now.
    fn config_request(&self) -> std::result::Result<reqwest::RequestBuilder, PointerError> {
        let request = self.authorized(self.client.get(format!("{}/v1/config", self.uri)))?;
        Ok(match &self.warehouse {
            Some(w) => request.query(&[("warehouse", w)]),
            None => request,
        })
    }

    /// The request with the catalog token as it is now.
    fn authorized(
        &self,
        request: reqwest::RequestBuilder,
    ) -> std::result::Result<reqwest::RequestBuilder, PointerError> {
        Ok(match self.token.get().1 {
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                    .map_err(|_| "the catalog token is not a valid header value")?;
                v.set_sensitive(true);
                request.header(AUTHORIZATION, v)
            }
            None => request,
        })
    }

    /// `<uri>/v1[/<prefix>]`, with the URI and prefix the catalog's config sets.
    async fn base(&self) -> std::result::Result<Url, PointerError> {
        let response = self.config_request()?.send().await?.error_for_status()?;
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

/// iceberg-rust's REST catalog with a token that can change while skiff runs: when the
/// [`CatalogToken`] changes, the next call builds the catalog anew with it (cheap: the catalog
/// reads its config on first use), so a rotated Cloudflare API token takes effect at once.
struct RotatingCatalog {
    props: HashMap<String, String>,
    token: Arc<CatalogToken>,
    /// The catalog and the token generation it was built with.
    current: tokio::sync::RwLock<(u64, Arc<RestCatalog>)>,
}

impl std::fmt::Debug for RotatingCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RotatingCatalog")
    }
}

impl RotatingCatalog {
    async fn new(props: HashMap<String, String>, token: Arc<CatalogToken>) -> Result<Self> {
        let (generation, t) = token.get();
        let catalog = Self::build(&props, t).await?;
        Ok(Self { props, token, current: tokio::sync::RwLock::new((generation, Arc::new(catalog))) })
    }

    async fn build(props: &HashMap<String, String>, token: Option<String>) -> iceberg::Result<RestCatalog> {
        let mut props = props.clone();
        if let Some(t) = token {
            props.insert("token".into(), t);
        }
        RestCatalogBuilder::default().with_storage_factory(storage_factory()).load("rest", props).await
    }

    /// The catalog for the token as it is now.
    async fn catalog(&self) -> iceberg::Result<Arc<RestCatalog>> {
        let (generation, token) = self.token.get();
        {
            let current = self.current.read().await;
            if current.0 == generation {
                return Ok(current.1.clone());
            }
        }
        let mut current = self.current.write().await;
        if current.0 != generation {
            *current = (generation, Arc::new(Self::build(&self.props, token).await?));
        }
        Ok(current.1.clone())
    }
}

#[async_trait]
impl Catalog for RotatingCatalog {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.catalog().await?.list_namespaces(parent).await
    }
    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.catalog().await?.create_namespace(namespace, properties).await
    }
    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.catalog().await?.get_namespace(namespace).await
    }
    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.catalog().await?.namespace_exists(namespace).await
    }
    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.catalog().await?.update_namespace(namespace, properties).await
    }
    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        self.catalog().await?.drop_namespace(namespace).await
    }
    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.catalog().await?.list_tables(namespace).await
    }
    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> iceberg::Result<Table> {
        self.catalog().await?.create_table(namespace, creation).await
    }
    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        self.catalog().await?.load_table(table).await
    }
    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.catalog().await?.drop_table(table).await
    }
    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.catalog().await?.purge_table(table).await
    }
    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        self.catalog().await?.table_exists(table).await
    }
    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.catalog().await?.rename_table(src, dest).await
    }
    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> iceberg::Result<Table> {
        self.catalog().await?.register_table(table, metadata_location).await
    }
    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        self.catalog().await?.update_table(commit).await
    }
}
