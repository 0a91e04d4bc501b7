//! The lake: the Iceberg catalog's namespaces and tables as DataFusion schemas and tables.
//!
//! The table list is read at start and refreshed on an interval (and on a miss, so a new
//! table is queryable at once); each query loads the tables it names afresh, so it always
//! reads the current snapshot. A table that fails to load fails only the queries that use it.

mod adaptive_join_filters;
pub mod cache;
pub mod catalog;
pub mod data_cache;
pub mod error;
mod file_stats;
mod join_filters;
mod key_bitmaps;
mod key_sets;
mod manifest;
mod masks;
mod per_file;
mod reader;
mod row_filter;
pub mod scan;
pub mod stats;
mod table;
mod travel;
pub mod versions;

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, SchemaProvider, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result as DFResult};
use futures::StreamExt;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};
use skiff_metrics as metrics;

use crate::catalog::TablePointers;
pub use adaptive_join_filters::AdaptiveJoinFilters;
use cache::Caches;
use error::LakeError;
pub use join_filters::UnionedJoinFilters;
pub use key_sets::{KeyIn, KeySet};
pub use per_file::{FoldPerFile, Wrapped};
pub use reader::with_parquet_source;
pub use row_filter::{DynamicRowFilters, SelectiveFirst, scan_takes_dynamic_filter};
pub use scan::ScanOptions;
pub use table::versions_read;
use table::{PhysicalTable, VersionedTable};
pub use travel::{LakeCodec, LakeScanExec};
use versions::{PinnedVersions, split_version, version_name};

/// Tables whose manifests are read at once at start (each with its own manifest reads in
/// flight), so a lake of many tables does not flood the store.
const WARM_TABLES: usize = 4;

/// Namespace → physical table names, as last listed.
type Listing = BTreeMap<String, BTreeSet<String>>;

pub struct Lake {
    catalog: Arc<dyn Catalog>,
    /// Lets a query reuse a loaded table without the catalog re-reading its metadata file.
    pointers: Arc<TablePointers>,
    caches: Arc<Caches>,
    pinned: PinnedVersions,
    listing: RwLock<Listing>,
}

impl std::fmt::Debug for Lake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lake({} namespaces)", self.listing.read().expect("listing").len())
    }
}

impl Lake {
    /// Connects the lake and lists its tables once.
    pub async fn new(
        catalog: Arc<dyn Catalog>,
        pointers: Arc<TablePointers>,
        pinned: PinnedVersions,
        caches: Caches,
    ) -> Result<Arc<Self>, LakeError> {
        let caches = Arc::new(caches);
        let lake = Arc::new(Self { catalog, pointers, caches, pinned, listing: RwLock::default() });
        lake.refresh().await?;
        Ok(lake)
    }

    /// Re-reads every namespace's table list from the catalog.
    pub async fn refresh(&self) -> Result<(), LakeError> {
        let mut listing = Listing::new();
        let namespaces = match self.catalog.list_namespaces(None).await {
            Ok(namespaces) => namespaces,
            Err(e) => return Err(self.catalog_down(e).await),
        };
        for ns in namespaces {
            let tables = self.list(&ns).await?;
            listing.insert(ns_name(&ns), tables);
        }
        *self.listing.write().expect("listing") = listing;
        Ok(())
    }

    async fn list(&self, ns: &NamespaceIdent) -> Result<BTreeSet<String>, LakeError> {
        match self.catalog.list_tables(ns).await {
            Ok(tables) => Ok(tables.into_iter().map(|t| t.name).collect()),
            Err(e) if e.kind() == iceberg::ErrorKind::NamespaceNotFound => Ok(BTreeSet::new()),
            Err(e) => Err(self.catalog_down(e).await),
        }
    }

    /// Refreshes the listing every `every`, logging (not failing) when the catalog is down.
    pub fn spawn_refresh(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(lake) = weak.upgrade() else { return };
                if let Err(e) = lake.refresh().await {
                    metrics::catalog_error("refresh");
                    tracing::warn!(error = %e, "refreshing the table list failed; keeping the last one");
                }
            }
        });
    }

    /// Reads every listed table's current manifests and data files' footers into the caches,
    /// in the background, so the first queries after a start plan and open files from memory:
    /// what each table's first query would read anyway. A table that fails here is left for
    /// its queries to report.
    pub fn spawn_warm(self: &Arc<Self>) {
        let lake = self.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let names: Vec<(String, String)> = lake
                .listing
                .read()
                .expect("listing")
                .iter()
                .flat_map(|(ns, tables)| tables.iter().map(move |t| (ns.clone(), t.clone())))
                .collect();
            let tables = names.len();
            let warm = names.into_iter().map(|(ns, name)| {
                let lake = lake.clone();
                async move {
                    lake.warm_table(&ns, &name).await.inspect_err(|e| {
                        tracing::warn!(table = %format!("{ns}.{name}"), error = %e, "reading its manifests at start failed")
                    })
                }
            });
            let (mut failed, mut footers) = (0, 0);
            let mut warmed = futures::stream::iter(warm).buffer_unordered(WARM_TABLES);
            while let Some(r) = warmed.next().await {
                match r {
                    Ok(n) => footers += n,
                    Err(_) => failed += 1,
                }
            }
            tracing::info!(
                tables,
                failed,
                footers,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "manifests and footers read at start"
            );
        });
    }

    /// One table of [`Self::spawn_warm`]: loaded as a query would, then its manifests and
    /// footers read. Returns the footers read.
    async fn warm_table(&self, ns: &str, name: &str) -> Result<usize, LakeError> {
        let table = self.load(ns, name).await?;
        PhysicalTable::try_new(table, self.caches.clone())?.warm().await
    }

    /// What this lake's scans read through (caches of files, footers and data).
    pub fn caches(&self) -> Arc<Caches> {
        Arc::clone(&self.caches)
    }

    pub fn namespaces(&self) -> Vec<String> {
        self.listing.read().expect("listing").keys().cloned().collect()
    }

    /// Physical table count, for the startup line and `GET /`.
    pub fn table_count(&self) -> usize {
        self.listing.read().expect("listing").values().map(BTreeSet::len).sum()
    }

    /// The names SQL can use in a namespace: every physical table, plus each versioned
    /// table's base name.
    pub fn table_names(&self, ns: &str) -> Vec<String> {
        let listing = self.listing.read().expect("listing");
        let Some(physical) = listing.get(ns) else {
            return vec![];
        };
        let mut names: BTreeSet<String> = physical.clone();
        for name in physical {
            names.insert(split_version(name).0.to_string());
        }
        names.into_iter().collect()
    }

    /// The DataFusion catalog over this lake, its names resolved as `names` says.
    pub fn catalog_provider(self: &Arc<Self>, names: Names) -> Arc<dyn CatalogProvider> {
        Arc::new(LakeCatalog(self.clone(), names))
    }

    /// Every physical table of a namespace, as listed.
    fn physical_names(&self, ns: &str) -> Vec<String> {
        self.listing.read().expect("listing").get(ns).map(|t| t.iter().cloned().collect()).unwrap_or_default()
    }

    /// One physical table, as Basin SQL resolves a name.
    async fn resolve_physical(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<dyn TableProvider>>, LakeError> {
        if !self.exists(ns, name) {
            return Ok(None);
        }
        let table = self.load(ns, name).await?;
        Ok(Some(Arc::new(PhysicalTable::try_new(table, self.caches.clone())?)))
    }

    /// Loads a table's current metadata from the catalog (reusing the table loaded before
    /// when its metadata file has not changed).
    pub async fn load(&self, ns: &str, name: &str) -> Result<Table, LakeError> {
        let ident = TableIdent::new(NamespaceIdent::new(ns.to_string()), name.to_string());
        let location = self.pointers.current(&ident).await.map_err(|e| {
            LakeError::CatalogUnavailable(format!("reading the metadata location of {ns}.{name}: {e}"))
        })?;
        // Unknown (no such table, an error status): the full load below reports it.
        if let Some(table) = location.and_then(|l| self.caches.loaded_table(&ident, &l)) {
            return Ok(table);
        }
        let fresh = self.catalog.load_table(&ident).await.map_err(|e| match LakeError::from_iceberg(&e) {
            LakeError::TableNotFound(_) => LakeError::TableNotFound(format!("table not found: {ns}.{name}")),
            // The catalog answered, but the table's metadata file does not parse.
            LakeError::Invalid(_) if e.kind() == iceberg::ErrorKind::DataInvalid => {
                LakeError::Unreadable(format!("the metadata file of {ns}.{name} is unreadable: {}", e))
            }
            // A SQL catalog reads the metadata file itself: a storage failure there is the
            // object store's, and its context names the file.
            LakeError::StoreUnavailable(_) if error::from_storage(&e) => {
                LakeError::StoreUnavailable(format!("loading {ns}.{name}: {e}"))
            }
            LakeError::StoreUnavailable(_) => {
                LakeError::CatalogUnavailable(format!("loading {ns}.{name}: {}", e.message()))
            }
            other => other,
        })?;
        Ok(self.caches.table(fresh))
    }

    /// Resolves a name SQL used: a versioned base, a physical table, or `<base>_v1`.
    async fn resolve(&self, ns: &str, name: &str) -> Result<Option<Arc<dyn TableProvider>>, LakeError> {
        let Some(versions) = self.versions_of(ns, name) else {
            return Ok(None);
        };
        match versions {
            Resolved::Physical(physical) => {
                let table = self.load(ns, &physical).await?;
                Ok(Some(Arc::new(PhysicalTable::try_new(table, self.caches.clone())?)))
            }
            Resolved::Versions(base, list) => {
                let mut names = Vec::with_capacity(list.len());
                for v in list {
                    let physical = version_name(&base, v);
                    if !self.exists(ns, &physical) {
                        return Err(LakeError::TableNotFound(format!(
                            "{ns}.{physical} is pinned by LAKE_VERSIONS ({base}={}) but does not exist",
                            self.pinned
                                .get(&base)
                                .unwrap_or_default()
                                .iter()
                                .map(u32::to_string)
                                .collect::<Vec<_>>()
                                .join(",")
                        )));
                    }
                    names.push(physical);
                }
                // Loaded at once: each load is a catalog (and often an object-store) round trip.
                let tables = futures::future::try_join_all(names.iter().map(|n| self.load(ns, n))).await?;
                Ok(Some(Arc::new(VersionedTable::try_new(tables, &self.caches)?)))
            }
        }
    }

    fn exists(&self, ns: &str, name: &str) -> bool {
        self.listing.read().expect("listing").get(ns).is_some_and(|t| t.contains(name))
    }

    /// What a name means, from the listing and the pinned versions.
    fn versions_of(&self, ns: &str, name: &str) -> Option<Resolved> {
        let listing = self.listing.read().expect("listing");
        let physical = listing.get(ns)?;
        // `<base>_v1` names the first version, stored as plain `<base>`.
        if let Some(base) = name.strip_suffix("_v1")
            && !physical.contains(name)
            && physical.contains(base)
        {
            return Some(Resolved::Physical(base.to_string()));
        }
        let (base, v) = split_version(name);
        if v >= 2 {
            return physical.contains(name).then(|| Resolved::Physical(name.to_string()));
        }
        let mut versions: Vec<u32> = physical
            .iter()
            .filter_map(|t| {
                let (b, v) = split_version(t);
                (b == base).then_some(v)
            })
            .collect();
        versions.sort_unstable();
        if let Some(pinned) = self.pinned.get(base) {
            return Some(Resolved::Versions(base.to_string(), pinned.to_vec()));
        }
        match versions.as_slice() {
            [] => None,
            [1] => Some(Resolved::Physical(base.to_string())),
            _ => Some(Resolved::Versions(base.to_string(), versions)),
        }
    }

    /// On a miss, re-lists one namespace so a table created moments ago is found. Only names
    /// the catalog itself listed are sent to it (iceberg-rust builds request paths from them
    /// without encoding): a namespace the listing lacks is looked for in the catalog's own
    /// list of namespaces first.
    async fn relist(&self, ns: &str) -> Result<(), LakeError> {
        let known = self.listing.read().expect("listing").contains_key(ns);
        let ident = if known {
            NamespaceIdent::new(ns.to_string())
        } else {
            let listed = match self.catalog.list_namespaces(None).await {
                Ok(listed) => listed,
                Err(e) => return Err(self.catalog_down(e).await),
            };
            match listed.into_iter().find(|n| ns_name(n) == ns) {
                Some(n) => n,
                None => return Ok(()),
            }
        };
        let tables = self.list(&ident).await?;
        let mut listing = self.listing.write().expect("listing");
        if tables.is_empty() {
            listing.remove(ns);
        } else {
            listing.insert(ns.to_string(), tables);
        }
        Ok(())
    }
}

impl Lake {
    /// A failed listing as the catalog's outage, with the error status the catalog answers now
    /// (asked again: iceberg-rust's error has it only as text), in plain words when it refuses
    /// the credentials.
    async fn catalog_down(&self, e: iceberg::Error) -> LakeError {
        use reqwest::StatusCode;
        let message = match self.pointers.refusal().await {
            Some(s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)) => format!(
                "the catalog refused the credentials ({s}): check the catalog token (CF_API_TOKEN or --catalog-token)"
            ),
            Some(s) => format!("{} ({s})", e.message()),
            None => e.message().to_string(),
        };
        LakeError::CatalogUnavailable(message)
    }
}

enum Resolved {
    Physical(String),
    Versions(String, Vec<u32>),
}

/// What a table name in SQL means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// `glass.events` is every version of the table, one UNION ALL (`/query`, Flight).
    Versioned,
    /// Every name is one physical table, as in Basin SQL (the Basin route).
    Physical,
}

fn ns_name(ns: &NamespaceIdent) -> String {
    ns.as_ref().join(".")
}

pub(crate) fn to_df(e: LakeError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[derive(Debug)]
struct LakeCatalog(Arc<Lake>, Names);

impl CatalogProvider for LakeCatalog {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema_names(&self) -> Vec<String> {
        self.0.namespaces()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        // Unknown namespaces still resolve, so that a missing table is reported as such.
        Some(Arc::new(LakeSchema { lake: self.0.clone(), ns: name.to_string(), names: self.1 }))
    }
}

#[derive(Debug)]
struct LakeSchema {
    lake: Arc<Lake>,
    ns: String,
    names: Names,
}

impl LakeSchema {
    async fn resolve(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, LakeError> {
        match self.names {
            Names::Versioned => self.lake.resolve(&self.ns, name).await,
            Names::Physical => self.lake.resolve_physical(&self.ns, name).await,
        }
    }
}

#[async_trait]
impl SchemaProvider for LakeSchema {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_names(&self) -> Vec<String> {
        match self.names {
            Names::Versioned => self.lake.table_names(&self.ns),
            Names::Physical => self.lake.physical_names(&self.ns),
        }
    }

    /// The table list is a cache of the catalog's: a name it lacks is looked up again.
    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        if self.table_exist(name) {
            metrics::cache_hit("table_list");
            if let Some(t) = self.resolve(name).await.map_err(to_df)? {
                return Ok(Some(t));
            }
        } else {
            metrics::cache_miss("table_list");
        }
        self.lake.relist(&self.ns).await.map_err(to_df)?;
        self.resolve(name).await.map_err(to_df)
    }

    /// Listing tables must not load them: one broken table would break `SHOW TABLES`.
    async fn table_type(&self, name: &str) -> DFResult<Option<TableType>> {
        Ok(self.table_exist(name).then_some(TableType::Base))
    }

    fn table_exist(&self, name: &str) -> bool {
        match self.names {
            Names::Versioned => self.lake.versions_of(&self.ns, name).is_some(),
            Names::Physical => self.lake.exists(&self.ns, name),
        }
    }
}
