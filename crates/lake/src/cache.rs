//! Caches of what never changes: Iceberg metadata files, manifest lists, manifests and
//! Parquet footers are immutable per path, so a cached copy can never be stale. Only the
//! table pointer (the catalog's current metadata location) is re-read for every query.
//!
//! Every cache is bounded, and counts its hits and misses in `/metrics`. Queries that need the
//! same uncached file (or a snapshot's statistics) at the same time share one load of it
//! (`get_or_load`).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use iceberg::TableIdent;
use iceberg::spec::{ManifestFile, ManifestList};
use iceberg::table::Table;
use parquet::file::metadata::ParquetMetaData;
use skiff_metrics as metrics;
use tokio::sync::OnceCell;

use super::data_cache::DataCache;
use super::error::with_file;
use super::manifest::{self, FileEntry, SnapshotFiles};

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

/// What a sample of one file says about a scan's filter: the selectivity cache's value.
/// Measured by `row_filter`; defined with the cache so the cache depends on no scan module.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// The share of the sampled rows the filter keeps.
    pub(super) share: f64,
    /// Bytes of the scan's other columns of variable width (strings, binary) over bytes of the
    /// filter's columns (uncompressed).
    pub(super) width: f64,
    /// Each of the filter's conditions, over the table's columns, with the share it keeps alone.
    pub(super) conditions: Shares,
}

/// What a [`Sample`] was measured for: the sampled file, the scan's filter and its columns.
pub type SampleKey = (String, Expr, Vec<String>);

/// Conditions over a table's columns, each with the share of a sample's rows it keeps alone.
pub type Shares = Arc<[(Arc<dyn PhysicalExpr>, f64)]>;

impl Sample {
    pub(super) fn whole(width: f64) -> Self {
        Sample { share: 1.0, width, ..Sample::default() }
    }
}

pub struct Caches {
    /// Table ident → the last table loaded for it. Reusing the `Table` reuses iceberg-rust's
    /// own manifest cache, which lives inside it.
    tables: Mutex<HashMap<String, LoadedTable>>,
    manifest_lists: moka::future::Cache<String, Arc<ManifestList>>,
    list_loads: InFlight<String, Arc<ManifestList>>,
    /// Manifest path → the live data files it lists.
    manifests: moka::future::Cache<String, Arc<[FileEntry]>>,
    manifest_loads: InFlight<String, Arc<[FileEntry]>>,
    snapshots: moka::future::Cache<(String, i32), Arc<SnapshotFiles>>,
    snapshot_loads: InFlight<(String, i32), Arc<SnapshotFiles>>,
    footers: moka::future::Cache<String, Arc<ParquetMetaData>>,
    footer_loads: InFlight<String, Arc<ParquetMetaData>>,
    /// (file, filter, columns) → what a sample of the file says about the filter.
    selectivities: moka::future::Cache<SampleKey, Sample>,
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
            list_loads: InFlight::default(),
            manifests: moka::future::Cache::new(MANIFESTS),
            manifest_loads: InFlight::default(),
            snapshots: moka::future::Cache::new(SNAPSHOTS),
            snapshot_loads: InFlight::default(),
            footers: moka::future::Cache::builder()
                .weigher(|_, m: &Arc<ParquetMetaData>| m.memory_size().min(u32::MAX as usize) as u32)
                .max_capacity(FOOTER_BYTES)
                .build(),
            footer_loads: InFlight::default(),
            selectivities: moka::future::Cache::new(SELECTIVITIES),
            data,
        }
    }

    /// The table loaded before for `ident`, if it was loaded from the metadata file at
    /// `location` (the catalog's current pointer) recently enough to reuse.
    pub fn loaded_table(&self, ident: &TableIdent, location: &str) -> Option<Table> {
        let tables = self.tables.lock().expect("tables");
        let t = tables.get(&ident.to_string())?;
        (t.metadata_location == location && t.loaded.elapsed() < TABLE_REUSE).then(|| {
            metrics::cache_hit("table");
            t.table.clone()
        })
    }

    /// The table to use for a freshly loaded one: the one loaded before if the catalog still
    /// points at the same metadata file (so its warm manifest cache is kept), else this one.
    pub fn table(&self, fresh: Table) -> Table {
        let Some(location) = fresh.metadata_location().map(str::to_string) else {
            return fresh;
        };
        if let Some(t) = self.loaded_table(fresh.identifier(), &location) {
            return t;
        }
        metrics::cache_miss("table");
        let key = fresh.identifier().to_string();
        let mut tables = self.tables.lock().expect("tables");
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
        let key = snapshot.manifest_list();
        let load = async { Ok(Arc::new(table.manifest_list_reader(snapshot).load().await?)) };
        get_or_load(&self.manifest_lists, &self.list_loads, "manifest_list", key, load)
            .await
            .map_err(|e| named(e, key))
    }

    /// The live data files a manifest lists. Encrypted manifests are read by iceberg-rust,
    /// which decrypts them; the rest are decoded by `manifest`.
    pub async fn manifest(&self, table: &Table, file: &ManifestFile) -> iceberg::Result<Arc<[FileEntry]>> {
        let path = &file.manifest_path;
        let load = async {
            let files = if file.key_metadata.is_some() {
                manifest::from_iceberg(&file.load_manifest(table.file_io()).await?)
            } else {
                manifest::live_files(&table.file_io().new_input(path)?.read().await?)?
            };
            Ok(files.into())
        };
        get_or_load(&self.manifests, &self.manifest_loads, "manifest", path, load)
            .await
            .map_err(|e| named(e, path))
    }

    /// A snapshot's files and statistics (by manifest list and schema id), built by `load`
    /// unless cached or already being built.
    pub async fn snapshot_files<E>(
        &self,
        key: &(String, i32),
        load: impl Future<Output = Result<Arc<SnapshotFiles>, E>>,
    ) -> Result<Arc<SnapshotFiles>, E> {
        get_or_load(&self.snapshots, &self.snapshot_loads, "snapshot_files", key, load).await
    }

    /// A data file's Parquet footer, loaded by `load` unless cached or already being loaded.
    pub async fn footer<E>(
        &self,
        location: &str,
        load: impl Future<Output = Result<Arc<ParquetMetaData>, E>>,
    ) -> Result<Arc<ParquetMetaData>, E> {
        get_or_load(&self.footers, &self.footer_loads, "parquet_footer", location, load).await
    }

    /// Whether footers fill half the cache: reading more at start would evict what queries read.
    pub fn footers_half_full(&self) -> bool {
        self.footers.weighted_size() >= FOOTER_BYTES / 2
    }

    pub async fn selectivity(&self, key: &SampleKey) -> Option<Sample> {
        let hit = self.selectivities.get(key).await;
        if hit.is_some() {
            metrics::cache_hit("selectivity")
        } else {
            metrics::cache_miss("selectivity")
        }
        hit
    }

    pub async fn put_selectivity(&self, key: SampleKey, sample: Sample) {
        self.selectivities.insert(key, sample).await;
    }
}

/// The cached value for `key`, or else the value `load` gives, cached. Concurrent callers for
/// the same key share one load: a burst of cold queries reads each file from the store once,
/// and builds each snapshot's statistics once.
async fn get_or_load<K, Q, V, E>(
    cache: &moka::future::Cache<K, V>,
    in_flight: &InFlight<K, V>,
    name: &'static str,
    key: &Q,
    load: impl Future<Output = Result<V, E>>,
) -> Result<V, E>
where
    K: Borrow<Q> + Hash + Eq + Send + Sync + 'static,
    Q: ToOwned<Owned = K> + Hash + Eq + ?Sized,
    V: Clone + Send + Sync + 'static,
{
    if let Some(v) = cache.get(key).await {
        metrics::cache_hit(name);
        return Ok(v);
    }
    let loaded = AtomicBool::new(false);
    let v = in_flight
        .run(key, async {
            // Loaded by someone else between the look-up above and joining the flight.
            if let Some(v) = cache.get(key).await {
                return Ok(v);
            }
            loaded.store(true, Ordering::Relaxed);
            metrics::cache_miss(name);
            let v = load.await?;
            cache.insert(key.to_owned(), v.clone()).await;
            Ok(v)
        })
        .await?;
    if !loaded.load(Ordering::Relaxed) {
        metrics::cache_hit(name);
    }
    Ok(v)
}

/// Loads in flight, by key. A load that fails, or whose caller goes away, is not shared: the
/// next caller waiting runs its own.
///
/// Hand-written rather than moka's `try_get_with`, which does the same job: in its place,
/// `benches/cache_loads.rs` measured it slower (2 vCPU Intel Xeon sandbox, 2026-12-06: a miss
/// 17 µs against 10–12 µs here, a hit 0.91–0.97 µs against 0.81–0.83 µs, shared loads 3.8–6.6
/// µs against 2.7–2.9 µs), and it hands one caller's failed load to all its waiters.
struct InFlight<K, V>(Mutex<HashMap<K, Arc<OnceCell<V>>>>);

impl<K, V> Default for InFlight<K, V> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<K: Hash + Eq, V: Clone> InFlight<K, V> {
    async fn run<Q, E>(&self, key: &Q, load: impl Future<Output = Result<V, E>>) -> Result<V, E>
    where
        K: Borrow<Q>,
        Q: ToOwned<Owned = K> + Hash + Eq + ?Sized,
    {
        let cell = self.0.lock().expect("in flight").entry(key.to_owned()).or_default().clone();
        let _leave = Leave { in_flight: self, key, cell: cell.clone() };
        cell.get_or_try_init(|| load).await.cloned()
    }
}

/// Takes a finished (or abandoned) flight off the map, unless a newer one replaced it.
struct Leave<'a, K: Borrow<Q> + Hash + Eq, Q: Hash + Eq + ?Sized, V> {
    in_flight: &'a InFlight<K, V>,
    key: &'a Q,
    cell: Arc<OnceCell<V>>,
}

impl<K: Borrow<Q> + Hash + Eq, Q: Hash + Eq + ?Sized, V> Drop for Leave<'_, K, Q, V> {
    fn drop(&mut self) {
        let mut map = self.in_flight.0.lock().expect("in flight");
        if map.get(self.key).is_some_and(|c| Arc::ptr_eq(c, &self.cell)) {
            map.remove(self.key);
        }
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
        with_file(e, path)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use tokio::time::{sleep, timeout};

    use super::*;

    type Cache = moka::future::Cache<String, u32>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_loads_of_one_key_run_the_load_once() {
        let (cache, flights) = (Arc::new(Cache::new(10)), Arc::new(InFlight::default()));
        let loads = Arc::new(AtomicUsize::new(0));
        let callers = (0..8).map(|_| {
            let (cache, flights, loads) = (cache.clone(), flights.clone(), loads.clone());
            tokio::spawn(async move {
                let load = async {
                    loads.fetch_add(1, Ordering::Relaxed);
                    sleep(Duration::from_millis(50)).await;
                    Ok::<_, String>(7)
                };
                get_or_load(&cache, &flights, "test", "k", load).await
            })
        });
        for got in futures::future::join_all(callers).await {
            assert_eq!(got.unwrap(), Ok(7));
        }
        assert_eq!(loads.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_failed_load_is_not_cached() {
        let (cache, flights) = (Cache::new(10), InFlight::default());
        let failing = async { Err::<u32, _>("store down".to_string()) };
        assert_eq!(get_or_load(&cache, &flights, "test", "k", failing).await, Err("store down".to_string()));
        assert_eq!(get_or_load(&cache, &flights, "test", "k", async { Ok::<_, String>(2) }).await, Ok(2));
    }

    /// A waiter does not take on another query's error: it runs its own load.
    #[tokio::test]
    async fn a_failed_load_fails_its_caller_and_a_waiter_runs_its_own() {
        let (cache, flights) = (Cache::new(10), InFlight::default());
        let failing = get_or_load(&cache, &flights, "test", "k", async {
            sleep(Duration::from_millis(50)).await;
            Err::<u32, _>("leader's error".to_string())
        });
        let waiting = async {
            sleep(Duration::from_millis(10)).await;
            get_or_load(&cache, &flights, "test", "k", async { Ok::<_, String>(3) }).await
        };
        let (failed, waited) = tokio::join!(failing, waiting);
        assert_eq!(failed, Err("leader's error".to_string()));
        assert_eq!(waited, Ok(3));
        assert_eq!(cache.get("k").await, Some(3));
    }

    /// A query cancelled while it loads neither hangs nor fails the others waiting on it.
    #[tokio::test]
    async fn a_waiter_takes_over_from_a_cancelled_load() {
        let (cache, flights) = (Cache::new(10), InFlight::default());
        let slow = async {
            sleep(Duration::from_secs(3600)).await;
            Ok::<_, String>(1)
        };
        let cancelled = timeout(Duration::from_millis(50), get_or_load(&cache, &flights, "test", "k", slow));
        let waiting = async {
            sleep(Duration::from_millis(10)).await;
            let load = get_or_load(&cache, &flights, "test", "k", async { Ok::<_, String>(4) });
            timeout(Duration::from_secs(5), load).await
        };
        let (cancelled, waited) = tokio::join!(cancelled, waiting);
        assert!(cancelled.is_err(), "the first load was cancelled");
        assert_eq!(waited.expect("the waiter does not hang"), Ok(4));
    }
}
