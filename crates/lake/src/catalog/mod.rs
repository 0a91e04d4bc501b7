//! Connecting to an Iceberg catalog (SQLite/PostgreSQL SQL catalogs, REST catalogs such as
//! Basin Catalog) with the storage its tables live on, and writing the demo lake.

pub mod demo;
mod rest;
pub mod sql;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use iceberg::io::StorageFactory;
use iceberg::{Catalog, TableIdent};
use iceberg_storage_opendal::OpenDalResolvingStorageFactory;

use crate::error::SetupResult;

/// A connected catalog and how to describe it (never with a secret in the description).
pub struct Connection {
    pub catalog: Arc<dyn Catalog>,
    /// `sqlite`, `postgres` or `rest`.
    pub kind: &'static str,
    /// Where it is, for the startup line and `GET /`.
    pub location: String,
    /// Reads table pointers without loading tables.
    pub pointers: Arc<TablePointers>,
}

/// Reads a table's current metadata location (its pointer) without loading the table, so a
/// query can reuse the table loaded before while the pointer has not moved.
pub enum TablePointers {
    Sql(sql::SqlPointers),
    Rest(Box<rest::RestPointers>),
}

/// Why a pointer could not be read: the catalog's failure, reported as its outage.
pub type PointerError = Box<dyn std::error::Error + Send + Sync>;

impl TablePointers {
    /// The table's metadata location; `None` when the catalog's answer does not give it (no
    /// such table, an error status), for the full load to report.
    pub async fn current(&self, table: &TableIdent) -> Result<Option<String>, PointerError> {
        match self {
            Self::Sql(p) => Ok(p.current(table).await?),
            Self::Rest(p) => p.current(table).await,
        }
    }

    /// The error status a REST catalog answers now, if any (SQL catalogs have none).
    pub async fn refusal(&self) -> Option<reqwest::StatusCode> {
        match self {
            Self::Sql(_) => None,
            Self::Rest(p) => p.refusal().await,
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Connection({} at {})", self.kind, self.location)
    }
}

/// The catalog's bearer token (a REST catalog's; SQL catalogs take none), replaceable while
/// skiff runs through the admin route: the catalog and the pointer reads use the token as it
/// is at each call, so a rotated or revoked token takes effect without a restart.
#[derive(Default)]
pub struct CatalogToken {
    token: RwLock<Option<String>>,
    generation: AtomicU64,
    changed: tokio::sync::Notify,
}

impl CatalogToken {
    pub fn new(token: Option<String>) -> Arc<Self> {
        Arc::new(Self { token: RwLock::new(token), ..Default::default() })
    }

    /// The token and its generation (which changes with every replacement).
    pub fn get(&self) -> (u64, Option<String>) {
        let token = self.token.read().expect("token");
        (self.generation.load(Ordering::SeqCst), token.clone())
    }

    pub fn set(&self, token: Option<String>) {
        let mut t = self.token.write().expect("token");
        *t = token.filter(|t| !t.is_empty());
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Resolves at the next replacement.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// SHA-256 of the token, hex, for the admin route to show which one is held.
    pub fn sha256(&self) -> Option<String> {
        use sha2::Digest;
        let t = self.token.read().expect("token");
        t.as_ref().map(|t| sha2::Sha256::digest(t.as_bytes()).iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// The embedded default: a SQLite catalog and a local warehouse under `./lake`.
pub fn default_lake_dir() -> PathBuf {
    PathBuf::from("lake")
}

/// Where the catalog is and how to reach the storage its tables live on: the server builds
/// it from its settings, so the lake does not depend on how they are given.
#[derive(Clone, Default)]
pub struct CatalogOptions {
    /// `sqlite://…`, `postgres://…` or a REST catalog's `http(s)://` URL; `None`: the demo lake.
    pub uri: Option<String>,
    /// A SQL catalog's name (the one catalog in it when `None`).
    pub name: Option<String>,
    /// A path or URL for SQL catalogs; a REST catalog's warehouse name.
    pub warehouse: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_region: Option<String>,
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    pub s3_path_style: bool,
}

/// Connects to the configured catalog. With `--demo` (no catalog configured), serves `./lake`,
/// writing a demo lake there first if it does not exist yet.
pub async fn connect(cfg: &CatalogOptions, token: &Arc<CatalogToken>) -> SetupResult<Connection> {
    match cfg.uri.as_deref() {
        None => {
            let dir = default_lake_dir();
            let db = dir.join("catalog.db");
            if !db.exists() {
                eprintln!(
                    "skiff: --demo and no lake at {} yet: writing a demo lake there (see `skiff demo --help`)",
                    dir.display()
                );
                demo::write(&dir, demo::DEFAULT_EVENTS).await?;
            }
            let db = std::fs::canonicalize(&db)?;
            let warehouse = std::fs::canonicalize(dir.join("warehouse"))?;
            let uri = format!("sqlite://{}", db.display());
            sql::connect(&uri, &file_url(&warehouse), cfg.name.as_deref(), storage_props(cfg)).await
        }
        Some(uri) if uri.starts_with("http://") || uri.starts_with("https://") => {
            rest::connect(uri, cfg.warehouse.as_deref(), token.clone(), storage_props(cfg)).await
        }
        Some(uri) => {
            let warehouse = cfg.warehouse.as_deref().unwrap_or_default();
            sql::connect(uri, &warehouse_url(warehouse)?, cfg.name.as_deref(), storage_props(cfg)).await
        }
    }
}

/// Storage properties for `s3://` warehouses configured statically. A REST catalog's vended
/// credentials arrive per table and need none of these.
fn storage_props(cfg: &CatalogOptions) -> HashMap<String, String> {
    use iceberg::io::{S3_ACCESS_KEY_ID, S3_ENDPOINT, S3_PATH_STYLE_ACCESS, S3_REGION, S3_SECRET_ACCESS_KEY};
    let mut p = HashMap::new();
    let mut put = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            p.insert(k.to_string(), v.clone());
        }
    };
    put(S3_ENDPOINT, &cfg.s3_endpoint);
    put(S3_REGION, &cfg.s3_region);
    put(S3_ACCESS_KEY_ID, &cfg.s3_access_key_id);
    put(S3_SECRET_ACCESS_KEY, &cfg.s3_secret_access_key);
    if cfg.s3_path_style {
        p.insert(S3_PATH_STYLE_ACCESS.to_string(), "true".to_string());
    }
    p
}

/// One storage factory for every scheme a table location can use (file, s3).
pub fn storage_factory() -> Arc<dyn StorageFactory> {
    Arc::new(OpenDalResolvingStorageFactory::new())
}

/// A warehouse given as a path or URL, as a URL.
fn warehouse_url(w: &str) -> std::io::Result<String> {
    if w.contains("://") {
        return Ok(w.trim_end_matches('/').to_string());
    }
    let p = Path::new(w);
    std::fs::create_dir_all(p)?;
    Ok(file_url(&std::fs::canonicalize(p)?))
}

pub fn file_url(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Describes a catalog URI for humans, without credentials.
fn describe(uri: &str) -> String {
    redact_uri(uri)
}

/// A URI with any password removed, for messages and logs.
pub fn redact_uri(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        let r = redact_uri("postgres://user:hunter2@db:5432/cat");
        assert!(!r.contains("hunter2"), "{r}");
        assert_eq!(redact_uri("sqlite:///a/b.db"), "sqlite:///a/b.db");
    }
}
