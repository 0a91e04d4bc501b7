//! A bounded cache of data-file bytes read from remote object stores, in memory and on the
//! local (ephemeral) disk. A data file never changes at its path, so nothing cached is ever
//! stale and nothing needs invalidating.
//!
//! Files are cut into fixed chunks. A read takes the chunks the tiers hold and fetches the
//! missing ones, coalesced into runs, in one concurrent batch. Local files bypass the cache:
//! the OS page cache already keeps them, and a second copy would only cost memory.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use skiff_metrics as metrics;

/// Chunk size. A cold read fetches whole chunks: a few extra bytes per request cost far less
/// than another round trip to the store, and neighbouring columns come along for later reads.
pub const CHUNK: u64 = 1 << 20;

/// Each process's folder inside the configured directory: `skiff-<pid>`.
const DIR_PREFIX: &str = "skiff-";

type Key = (Arc<str>, u64);

pub struct DataCache {
    memory: Option<moka::future::Cache<Key, Bytes>>,
    disk: Option<Disk>,
}

struct Disk {
    dir: PathBuf,
    next: AtomicU64,
    index: moka::future::Cache<Key, Arc<DiskChunk>>,
}

struct DiskChunk {
    path: PathBuf,
    len: u32,
}

/// What a read found, and the byte ranges still to fetch from the store.
pub struct Lookup {
    location: Arc<str>,
    size: u64,
    ranges: Vec<Range<u64>>,
    found: BTreeMap<u64, Bytes>,
    /// Runs of consecutive missing chunks, as chunk indexes.
    runs: Vec<Range<u64>>,
}

impl Lookup {
    /// The byte ranges to fetch (one per run of missing chunks), for `DataCache::complete`.
    pub fn missing(&self) -> Vec<Range<u64>> {
        self.runs.iter().map(|r| r.start * CHUNK..(r.end * CHUNK).min(self.size)).collect()
    }
}

impl DataCache {
    /// A cache of `memory` bytes in memory and `disk` bytes in `dir` (either may be 0);
    /// `None` when both are 0. Chunk files left in `dir` by an earlier run are deleted.
    pub fn new(memory: u64, disk: u64, dir: &Path) -> std::io::Result<Option<Arc<Self>>> {
        if memory == 0 && disk == 0 {
            return Ok(None);
        }
        let memory = (memory > 0).then(|| {
            moka::future::Cache::builder().weigher(|_, b: &Bytes| b.len() as u32).max_capacity(memory).build()
        });
        let disk = if disk > 0 { Some(Disk::open(dir, disk)?) } else { None };
        Ok(Some(Arc::new(Self { memory, disk })))
    }

    /// Whether reads of `location` go through the cache: remote object stores only.
    pub fn covers(location: &str) -> bool {
        location.contains("://") && !location.starts_with("file:")
    }

    /// Looks up the chunks covering `ranges` of the file at `location` (`size` bytes long).
    pub async fn lookup(&self, location: &str, size: u64, ranges: &[Range<u64>]) -> Lookup {
        let location: Arc<str> = location.into();
        let mut found = BTreeMap::new();
        let mut runs: Vec<Range<u64>> = Vec::new();
        for i in chunks_of(ranges, size) {
            match self.get(&(location.clone(), i)).await {
                Some(b) => {
                    found.insert(i, b);
                }
                None => match runs.last_mut() {
                    Some(run) if run.end == i => run.end += 1,
                    _ => runs.push(i..i + 1),
                },
            }
        }
        Lookup { location, size, ranges: ranges.to_vec(), found, runs }
    }

    /// Keeps the `fetched` bytes (one per `lookup.missing()` range) and answers the read.
    /// `None` when the store returned less than the file's size promised: the caller then
    /// reads without the cache, so the store's own error surfaces.
    pub async fn complete(&self, lookup: Lookup, fetched: Vec<Bytes>) -> Option<Vec<Bytes>> {
        let Lookup { location, size, ranges, mut found, runs } = lookup;
        for (run, bytes) in runs.iter().zip(fetched) {
            if bytes.len() as u64 != (run.end * CHUNK).min(size) - run.start * CHUNK {
                return None;
            }
            for i in run.clone() {
                let start = ((i - run.start) * CHUNK) as usize;
                let end = (start + CHUNK as usize).min(bytes.len());
                // A copy, so an evicted chunk frees its memory (a slice would pin the run).
                let chunk = Bytes::copy_from_slice(&bytes[start..end]);
                self.put((location.clone(), i), chunk.clone()).await;
                found.insert(i, chunk);
            }
        }
        ranges.iter().map(|r| assemble(&found, r)).collect()
    }

    async fn get(&self, key: &Key) -> Option<Bytes> {
        if let Some(memory) = &self.memory
            && let Some(b) = memory.get(key).await
        {
            metrics::cache_hit("data_memory");
            return Some(b);
        }
        if let Some(disk) = &self.disk
            && let Some(b) = disk.get(key).await
        {
            metrics::cache_hit("data_disk");
            if let Some(memory) = &self.memory {
                memory.insert(key.clone(), b.clone()).await;
            }
            return Some(b);
        }
        metrics::cache_miss("data");
        None
    }

    async fn put(&self, key: Key, chunk: Bytes) {
        if let Some(disk) = &self.disk {
            disk.put(key.clone(), chunk.clone());
        }
        if let Some(memory) = &self.memory {
            memory.insert(key, chunk).await;
        }
    }
}

impl Disk {
    /// The tier lives in `dir/skiff-<pid>`, so skiff processes sharing `dir` never touch
    /// each other's files; folders of processes that are gone are deleted.
    fn open(dir: &Path, capacity: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            // `skiff-<pid>`, or `skiff-<pid>.gone` left by a removal that did not finish.
            let pid = path
                .file_name()
                .and_then(|n| n.to_str()?.strip_prefix(DIR_PREFIX)?.split('.').next()?.parse::<u32>().ok());
            if let Some(pid) = pid
                && (pid == std::process::id() || !alive(pid))
            {
                std::fs::remove_dir_all(&path)?;
            }
        }
        let own = dir.join(format!("{DIR_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&own)?;
        let index = moka::future::Cache::builder()
            .weigher(|_, c: &Arc<DiskChunk>| c.len)
            .max_capacity(capacity)
            // Every chunk has its own file, so an evicted or replaced entry's file can go.
            .eviction_listener(|_, c: Arc<DiskChunk>, _| {
                let _ = std::fs::remove_file(&c.path);
            })
            .build();
        Ok(Self { dir: own, next: AtomicU64::new(0), index })
    }

    async fn get(&self, key: &Key) -> Option<Bytes> {
        let chunk = self.index.get(key).await?;
        // The entry may be evicted (its file deleted) between the lookup and the read.
        tokio::fs::read(&chunk.path).await.ok().filter(|b| b.len() == chunk.len as usize).map(Bytes::from)
    }

    /// Writes the chunk in the background: a query never waits for the disk tier.
    fn put(&self, key: Key, chunk: Bytes) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(n.to_string());
        let index = self.index.clone();
        tokio::spawn(async move {
            match tokio::fs::write(&path, &chunk).await {
                Ok(()) => index.insert(key, Arc::new(DiskChunk { path, len: chunk.len() as u32 })).await,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "writing to the data cache's disk failed");
                    let _ = tokio::fs::remove_file(&path).await;
                }
            }
        });
    }
}

/// Whether a process lives (Linux's /proc; elsewhere every folder is taken to be in use).
fn alive(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new(&format!("/proc/{pid}")).exists()
}

impl Drop for Disk {
    /// A chunk write still in flight could land while the folder is being emptied and make
    /// removing it fail. Renamed first, the folder no longer has the path those writes create
    /// their files under, so they fail and nothing new lands in it while it is removed.
    fn drop(&mut self) {
        let gone = self.dir.with_extension("gone");
        let dir = if std::fs::rename(&self.dir, &gone).is_ok() { gone } else { self.dir.clone() };
        for _ in 0..8 {
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => continue,
                _ => break,
            }
        }
    }
}

/// The chunk indexes `ranges` touch, ascending and once each.
fn chunks_of(ranges: &[Range<u64>], size: u64) -> impl Iterator<Item = u64> {
    let mut all: Vec<u64> = ranges
        .iter()
        .filter(|r| r.start < r.end)
        .flat_map(|r| r.start / CHUNK..=(r.end.min(size).max(r.start + 1) - 1) / CHUNK)
        .collect();
    all.sort_unstable();
    all.dedup();
    all.into_iter()
}

/// One requested range from its chunks: a slice when it lies in one chunk, else a copy.
fn assemble(chunks: &BTreeMap<u64, Bytes>, r: &Range<u64>) -> Option<Bytes> {
    if r.start >= r.end {
        return Some(Bytes::new());
    }
    let (first, last) = (r.start / CHUNK, (r.end - 1) / CHUNK);
    let piece = |i: u64| -> Option<Bytes> {
        let chunk = chunks.get(&i)?;
        let base = i * CHUNK;
        let start = r.start.max(base) - base;
        let end = r.end.min(base + CHUNK) - base;
        (end as usize <= chunk.len()).then(|| chunk.slice(start as usize..end as usize))
    };
    if first == last {
        return piece(first);
    }
    let mut out = BytesMut::with_capacity((r.end - r.start) as usize);
    for i in first..=last {
        out.extend_from_slice(&piece(i)?);
    }
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(size: usize) -> Bytes {
        (0..size).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
    }

    async fn read(cache: &DataCache, data: &Bytes, ranges: &[Range<u64>]) -> (Vec<Bytes>, usize) {
        let size = data.len() as u64;
        let lookup = cache.lookup("s3://b/f.parquet", size, ranges).await;
        let missing = lookup.missing();
        let fetched = missing.iter().map(|r| data.slice(r.start as usize..r.end as usize)).collect();
        (cache.complete(lookup, fetched).await.expect("complete"), missing.len())
    }

    #[tokio::test]
    async fn serves_ranges_across_chunks_and_tiers() {
        let dir = tempfile::tempdir().unwrap();
        let data = file(3 * CHUNK as usize + 1234);
        let ranges = [10..20, CHUNK - 5..CHUNK + 7, 0..data.len() as u64, 3 * CHUNK..3 * CHUNK + 1234];
        for (memory, disk) in [(64 << 20, 0), (0, 64 << 20), (64 << 20, 64 << 20)] {
            let cache = DataCache::new(memory, disk, dir.path()).unwrap().unwrap();
            let (first, fetches) = read(&cache, &data, &ranges).await;
            assert_eq!(fetches, 1, "one run of four missing chunks");
            for (r, b) in ranges.iter().zip(&first) {
                assert_eq!(b, &data.slice(r.start as usize..r.end as usize));
            }
            if disk > 0 {
                // The disk tier is written in the background.
                for _ in 0..100 {
                    if cache.disk.as_ref().unwrap().index.get(&("s3://b/f.parquet".into(), 3)).await.is_some()
                    {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
            let (second, fetches) = read(&cache, &data, &ranges).await;
            assert_eq!(fetches, 0, "everything cached (memory {memory}, disk {disk})");
            assert_eq!(first, second);
        }
    }

    #[tokio::test]
    async fn a_short_answer_is_not_cached() {
        let cache = DataCache::new(64 << 20, 0, Path::new("unused")).unwrap().unwrap();
        let lookup = cache.lookup("s3://b/f", 2 * CHUNK, std::slice::from_ref(&(0..2 * CHUNK))).await;
        assert!(cache.complete(lookup, vec![Bytes::from_static(b"short")]).await.is_none());
        let lookup = cache.lookup("s3://b/f", 2 * CHUNK, std::slice::from_ref(&(0..10))).await;
        assert_eq!(lookup.missing(), vec![0..CHUNK]);
    }

    #[tokio::test]
    async fn disk_tier_stays_within_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(format!("{DIR_PREFIX}{}", u32::MAX));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join("0"), b"left by a process that is gone").unwrap();
        std::fs::write(dir.path().join("keep.txt"), b"not ours").unwrap();
        let cache = DataCache::new(0, 3 * CHUNK, dir.path()).unwrap().unwrap();
        assert!(!stale.exists());
        assert!(dir.path().join("keep.txt").exists());
        let data = file(10 * CHUNK as usize);
        read(&cache, &data, std::slice::from_ref(&(0..data.len() as u64))).await;
        let disk = cache.disk.as_ref().unwrap();
        let mut on_disk = u64::MAX;
        for _ in 0..200 {
            disk.index.run_pending_tasks().await;
            on_disk = std::fs::read_dir(&disk.dir)
                .unwrap()
                .map(|e| std::fs::metadata(e.unwrap().path()).map(|m| m.len()).unwrap_or(0))
                .sum();
            if disk.index.entry_count() > 0 && on_disk <= 3 * CHUNK {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(disk.index.entry_count() > 0, "some chunks are kept");
        assert!(on_disk <= 3 * CHUNK, "{on_disk} bytes on disk, over the 3-chunk limit");
        let own = disk.dir.clone();
        drop(cache);
        assert!(!own.exists(), "the folder goes with the cache");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_folder_goes_even_with_writes_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        for round in 0..20 {
            let cache = DataCache::new(0, 64 << 20, dir.path()).unwrap().unwrap();
            let disk = cache.disk.as_ref().unwrap();
            let own = disk.dir.clone();
            for i in 0..64 {
                disk.put((format!("s3://b/{round}").into(), i), Bytes::from(vec![0u8; 4096]));
            }
            // Some writes land while the folder is removed, some after.
            tokio::task::yield_now().await;
            drop(cache);
            assert!(!own.exists(), "round {round}: the folder outlived its cache");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            assert!(!own.exists(), "round {round}: a late write made the folder again");
        }
    }

    #[test]
    fn local_files_bypass_the_cache() {
        assert!(DataCache::covers("s3://bucket/a.parquet"));
        assert!(DataCache::covers("gs://bucket/a.parquet"));
        assert!(!DataCache::covers("file:///lake/a.parquet"));
        assert!(!DataCache::covers("/lake/a.parquet"));
    }
}
