//! Caches of what never changes: Iceberg metadata files, manifest lists, manifests and
//! Parquet footers are immutable per path, so a cached copy can never be stale. Only the
//! table pointer (the catalog's current metadata location) is re-read for every query.
//!
//! Every cache is bounded, and counts its hits and misses for `/metrics`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::spec::{Manifest, ManifestFile, ManifestList};
use iceberg::table::Table;
use parquet::file::metadata::ParquetMetaData;

use super::file_stats::SnapshotFiles;

/// Manifests and manifest lists kept, by count (one is a few KiB per data file it lists).
const MANIFESTS: u64 = 20_000;
/// Parquet footers kept, by decoded size.
const FOOTER_BYTES: u64 = 128 * 1024 * 1024;
/// Per-snapshot file statistics kept (one per table version, plus a few older snapshots).
const SNAPSHOTS: u64 = 256;
/// A loaded table is reused while the catalog points at the same metadata file, but not for
/// longer than this: its `FileIO` may hold credentials the catalog vended for a limited time.
const TABLE_REUSE: Duration = Duration::from_secs(300);

/// Hits and misses of one cache.
#[derive(Debug, Default)]
pub struct Counter {
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Counter {
    fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
    fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}

/// One cache's counters at a moment, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheCounts {
    pub name: &'static str,
    pub hits: u64,
    pub misses: u64,
    pub entries: u64,
}

struct LoadedTable {
    metadata_location: String,
    loaded: Instant,
    table: Table,
}

pub struct Caches {
    /// Table ident → the last table loaded for it. Reusing the `Table` reuses iceberg-rust's
    /// own manifest cache, which lives inside it.
    tables: Mutex<HashMap<String, LoadedTable>>,
    pub tables_counter: Counter,
    manifest_lists: moka::future::Cache<String, Arc<ManifestList>>,
    pub manifest_lists_counter: Counter,
    manifests: moka::future::Cache<String, Arc<Manifest>>,
    pub manifests_counter: Counter,
    snapshots: moka::future::Cache<(String, i32), Arc<SnapshotFiles>>,
    pub snapshots_counter: Counter,
    footers: moka::future::Cache<String, Arc<ParquetMetaData>>,
    pub footers_counter: Counter,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.counts()).finish()
    }
}

impl Default for Caches {
    fn default() -> Self {
        Self {
            tables: Mutex::default(),
            tables_counter: Counter::default(),
            manifest_lists: moka::future::Cache::new(MANIFESTS),
            manifest_lists_counter: Counter::default(),
            manifests: moka::future::Cache::new(MANIFESTS),
            manifests_counter: Counter::default(),
            snapshots: moka::future::Cache::new(SNAPSHOTS),
            snapshots_counter: Counter::default(),
            footers: moka::future::Cache::builder()
                .weigher(|_, m: &Arc<ParquetMetaData>| m.memory_size().min(u32::MAX as usize) as u32)
                .max_capacity(FOOTER_BYTES)
                .build(),
            footers_counter: Counter::default(),
        }
    }
}

impl Caches {
    /// Every cache's hits, misses and current entries.
    pub fn counts(&self) -> Vec<CacheCounts> {
        let c = |name, counter: &Counter, entries| CacheCounts {
            name,
            hits: counter.hits(),
            misses: counter.misses(),
            entries,
        };
        vec![
            c("table", &self.tables_counter, self.tables.lock().expect("tables").len() as u64),
            c("manifest_list", &self.manifest_lists_counter, self.manifest_lists.entry_count()),
            c("manifest", &self.manifests_counter, self.manifests.entry_count()),
            c("snapshot_files", &self.snapshots_counter, self.snapshots.entry_count()),
            c("parquet_footer", &self.footers_counter, self.footers.entry_count()),
        ]
    }

    /// The table to use for a freshly loaded one: the one loaded before if the catalog still
    /// points at the same metadata file (so its warm manifest cache is kept), else this one.
    pub fn table(&self, fresh: Table) -> Table {
        let Some(location) = fresh.metadata_location().map(str::to_string) else {
            return fresh;
        };
        let key = fresh.identifier().to_string();
        let mut tables = self.tables.lock().expect("tables");
        if let Some(t) = tables.get(&key)
            && t.metadata_location == location
            && t.loaded.elapsed() < TABLE_REUSE
        {
            self.tables_counter.hit();
            return t.table.clone();
        }
        self.tables_counter.miss();
        tables.insert(
            key,
            LoadedTable { metadata_location: location, loaded: Instant::now(), table: fresh.clone() },
        );
        fresh
    }

    pub async fn manifest_list(
        &self,
        table: &Table,
        snapshot: &iceberg::spec::SnapshotRef,
    ) -> iceberg::Result<Arc<ManifestList>> {
        let key = snapshot.manifest_list().to_string();
        if let Some(m) = self.manifest_lists.get(&key).await {
            self.manifest_lists_counter.hit();
            return Ok(m);
        }
        self.manifest_lists_counter.miss();
        let m = Arc::new(table.manifest_list_reader(snapshot).load().await?);
        self.manifest_lists.insert(key, m.clone()).await;
        Ok(m)
    }

    pub async fn manifest(&self, table: &Table, file: &ManifestFile) -> iceberg::Result<Arc<Manifest>> {
        if let Some(m) = self.manifests.get(&file.manifest_path).await {
            self.manifests_counter.hit();
            return Ok(m);
        }
        self.manifests_counter.miss();
        let m = Arc::new(file.load_manifest(table.file_io()).await?);
        self.manifests.insert(file.manifest_path.clone(), m.clone()).await;
        Ok(m)
    }

    pub async fn snapshot_files(&self, key: &(String, i32)) -> Option<Arc<SnapshotFiles>> {
        let hit = self.snapshots.get(key).await;
        if hit.is_some() {
            self.snapshots_counter.hit()
        } else {
            self.snapshots_counter.miss()
        }
        hit
    }

    pub async fn put_snapshot_files(&self, key: (String, i32), files: Arc<SnapshotFiles>) {
        self.snapshots.insert(key, files).await;
    }

    pub async fn footer(&self, location: &str) -> Option<Arc<ParquetMetaData>> {
        let hit = self.footers.get(location).await;
        if hit.is_some() {
            self.footers_counter.hit()
        } else {
            self.footers_counter.miss()
        }
        hit
    }

    pub async fn put_footer(&self, location: String, metadata: Arc<ParquetMetaData>) {
        self.footers.insert(location, metadata).await;
    }
}
