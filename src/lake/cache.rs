//! Caches of what never changes: Iceberg metadata files, manifest lists, manifests and
//! Parquet footers are immutable per path, so a cached copy can never be stale. Only the
//! table pointer (the catalog's current metadata location) is re-read for every query.
//!
//! Every cache is bounded, and counts its hits and misses in `/metrics`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iceberg::spec::{ManifestFile, ManifestList};
use iceberg::table::Table;
use parquet::file::metadata::ParquetMetaData;

use super::data_cache::DataCache;
use super::file_stats::SnapshotFiles;
use super::manifest::{self, FileEntry};
use super::row_filter::Sample;
use crate::observe::metrics;

/// Manifests and manifest lists kept, by count (one is a few KiB per data file it lists).
const MANIFESTS: u64 = 20_000;
/// Parquet footers kept, by decoded size.
const FOOTER_BYTES: u64 = 128 * 1024 * 1024;
/// Per-snapshot file statistics kept (one per table version, plus a few older snapshots).
const SNAPSHOTS: u64 = 256;
/// Measured filter selectivities kept (one per sampled file and filter, a few hundred bytes).
const SELECTIVITIES: u64 = 10_000;
/// A loaded table is reused while the catalog points at the same metadata file, but not for
/// longer than this: its `FileIO` may hold credentials the catalog vended for a limited time.
const TABLE_REUSE: Duration = Duration::from_secs(300);

struct LoadedTable {
    metadata_location: String,
    loaded: Instant,
    table: Table,
}

pub struct Caches {
    /// Table ident → the last table loaded for it. Reusing the `Table` reuses iceberg-rust's
    /// own manifest cache, which lives inside it.
    tables: Mutex<HashMap<String, LoadedTable>>,
    manifest_lists: moka::future::Cache<String, Arc<ManifestList>>,
    /// Manifest path → the live data files it lists.
    manifests: moka::future::Cache<String, Arc<[FileEntry]>>,
    snapshots: moka::future::Cache<(String, i32), Arc<SnapshotFiles>>,
    footers: moka::future::Cache<String, Arc<ParquetMetaData>>,
    /// (file, filter, columns) → what a sample of the file says about the filter.
    selectivities: moka::future::Cache<String, Sample>,
    /// Data-file bytes from remote stores, when configured.
    pub data: Option<Arc<DataCache>>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Caches")
    }
}

impl Caches {
    pub fn new(data: Option<Arc<DataCache>>) -> Self {
        Self {
            tables: Mutex::default(),
            manifest_lists: moka::future::Cache::new(MANIFESTS),
            manifests: moka::future::Cache::new(MANIFESTS),
            snapshots: moka::future::Cache::new(SNAPSHOTS),
            footers: moka::future::Cache::builder()
                .weigher(|_, m: &Arc<ParquetMetaData>| m.memory_size().min(u32::MAX as usize) as u32)
                .max_capacity(FOOTER_BYTES)
                .build(),
            selectivities: moka::future::Cache::new(SELECTIVITIES),
            data,
        }
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
            metrics::cache_hit("table");
            return t.table.clone();
        }
        metrics::cache_miss("table");
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
            metrics::cache_hit("manifest_list");
            return Ok(m);
        }
        metrics::cache_miss("manifest_list");
        let m = Arc::new(table.manifest_list_reader(snapshot).load().await.map_err(|e| named(e, &key))?);
        self.manifest_lists.insert(key, m.clone()).await;
        Ok(m)
    }

    /// The live data files a manifest lists. Encrypted manifests are read by iceberg-rust,
    /// which decrypts them; the rest are decoded by `manifest`.
    pub async fn manifest(&self, table: &Table, file: &ManifestFile) -> iceberg::Result<Arc<[FileEntry]>> {
        if let Some(m) = self.manifests.get(&file.manifest_path).await {
            metrics::cache_hit("manifest");
            return Ok(m);
        }
        metrics::cache_miss("manifest");
        let path = &file.manifest_path;
        let files = if file.key_metadata.is_some() {
            manifest::from_iceberg(&file.load_manifest(table.file_io()).await.map_err(|e| named(e, path))?)
        } else {
            let read = async { table.file_io().new_input(path)?.read().await };
            let avro = read.await.map_err(|e| named(e, path))?;
            manifest::live_files(&avro).map_err(|e| named(e, path))?
        };
        let files: Arc<[FileEntry]> = files.into();
        self.manifests.insert(path.clone(), files.clone()).await;
        Ok(files)
    }

    pub async fn snapshot_files(&self, key: &(String, i32)) -> Option<Arc<SnapshotFiles>> {
        let hit = self.snapshots.get(key).await;
        if hit.is_some() {
            metrics::cache_hit("snapshot_files")
        } else {
            metrics::cache_miss("snapshot_files")
        }
        hit
    }

    pub async fn put_snapshot_files(&self, key: (String, i32), files: Arc<SnapshotFiles>) {
        self.snapshots.insert(key, files).await;
    }

    pub async fn footer(&self, location: &str) -> Option<Arc<ParquetMetaData>> {
        let hit = self.footers.get(location).await;
        if hit.is_some() {
            metrics::cache_hit("parquet_footer")
        } else {
            metrics::cache_miss("parquet_footer")
        }
        hit
    }

    pub async fn put_footer(&self, location: String, metadata: Arc<ParquetMetaData>) {
        self.footers.insert(location, metadata).await;
    }

    pub async fn selectivity(&self, key: &str) -> Option<Sample> {
        let hit = self.selectivities.get(key).await;
        if hit.is_some() {
            metrics::cache_hit("selectivity")
        } else {
            metrics::cache_miss("selectivity")
        }
        hit
    }

    pub async fn put_selectivity(&self, key: String, sample: Sample) {
        self.selectivities.insert(key, sample).await;
    }
}

/// Names the metadata file a read failed on. A file that was read but cannot be decoded is
/// the lake's fault, not the query's, so it is not left as Iceberg's `DataInvalid` (which is
/// how Iceberg reports a bad query).
fn named(e: iceberg::Error, path: &str) -> iceberg::Error {
    if e.kind() == iceberg::ErrorKind::DataInvalid {
        iceberg::Error::new(iceberg::ErrorKind::Unexpected, "cannot decode a metadata file")
            .with_context("file", path)
            .with_source(e)
    } else {
        super::scan::with_file(e, path)
    }
}
