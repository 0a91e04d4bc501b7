//! Reading Parquet data files: the reader every planned file is opened with (through the
//! table's `FileIO`, the data cache, or positioned reads on local disk), counting what the
//! query read, and the one helper skiff's plan rules use to adjust a finished Parquet scan.
//!
//! Below the scan and the row-filter sampling, which both open files through it.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetFileReaderFactory;
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::FutureExt;
use futures::future::BoxFuture;
use iceberg::arrow::ArrowFileReader;
use iceberg::io::{FileIO, FileMetadata};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::ParquetMetaData;

use super::cache::{Caches, Shares};
use super::data_cache::DataCache;
use super::error::with_file;
use super::stats::QueryStats;

/// What skiff keeps with each planned file (in `PartitionedFile::extensions`): where it really
/// is, and what the scan's sample measured of its conditions.
pub struct PlannedFile {
    /// The Iceberg location, which the reader factory opens.
    pub(super) location: String,
    pub(super) shares: Shares,
    /// The table's, which a scan sent to a worker takes along (`travel`).
    pub(super) file_io: FileIO,
}

impl PlannedFile {
    /// The first planned file of `plan`, if it is one of skiff's Parquet scans.
    fn first_of(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<PlannedFile>> {
        let exec = plan.as_any().downcast_ref::<DataSourceExec>()?;
        let (config, _) = exec.downcast_to_file_source::<ParquetSource>()?;
        let file = config.file_groups.iter().flat_map(|g| g.iter()).next()?;
        Arc::clone(file.extensions.as_ref()?).downcast::<PlannedFile>().ok()
    }

    /// The condition shares `plan`'s files carry, if it is one of skiff's Parquet scans.
    pub fn shares_of(plan: &Arc<dyn ExecutionPlan>) -> Option<Shares> {
        Some(Arc::clone(&Self::first_of(plan)?.shares))
    }

    /// The `FileIO` `plan` reads through, if it is one of skiff's Parquet scans.
    pub(super) fn file_io_of(plan: &Arc<dyn ExecutionPlan>) -> Option<FileIO> {
        Some(Self::first_of(plan)?.file_io.clone())
    }
}

/// `plan` reading through the source `change` makes from its own, when `plan` is a Parquet
/// scan and `change` makes one: how skiff's plan rules adjust a scan DataFusion finished.
pub fn with_parquet_source(
    plan: &Arc<dyn ExecutionPlan>,
    change: impl FnOnce(&ParquetSource) -> Option<ParquetSource>,
) -> Option<Arc<dyn ExecutionPlan>> {
    let exec = plan.as_any().downcast_ref::<DataSourceExec>()?;
    let (config, source) = exec.downcast_to_file_source::<ParquetSource>()?;
    let source = change(source)?;
    let config = FileScanConfigBuilder::from(config.clone()).with_source(Arc::new(source)).build();
    Some(Arc::new(exec.clone().with_data_source(Arc::new(config))))
}

/// Opens planned files through the table's Iceberg `FileIO`, counting what is read.
pub(super) struct FileIoReaderFactory {
    pub(super) file_io: FileIO,
    pub(super) stats: Arc<QueryStats>,
    pub(super) caches: Arc<Caches>,
}

// Neither prints its `FileIO`: its properties hold the storage credentials, and plans (with
// their scans' files and reader) are printed with `{:?}` in errors.
impl std::fmt::Debug for FileIoReaderFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileIoReaderFactory").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PlannedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedFile").field("location", &self.location).finish_non_exhaustive()
    }
}

impl ParquetFileReaderFactory for FileIoReaderFactory {
    fn create_reader(
        &self,
        _partition_index: usize,
        file: PartitionedFile,
        _metadata_size_hint: Option<usize>,
        _metrics: &ExecutionPlanMetricsSet,
    ) -> DFResult<Box<dyn AsyncFileReader + Send>> {
        let location = file
            .extensions
            .as_ref()
            .and_then(|e| e.downcast_ref::<PlannedFile>())
            .map(|p| p.location.clone())
            .ok_or_else(|| DataFusionError::Internal("planned file without its location".into()))?;
        self.stats.files_scanned.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(
            self.open(location, file.object_meta.size).map_err(|e| DataFusionError::External(Box::new(e)))?,
        ))
    }
}

impl FileIoReaderFactory {
    pub(super) fn open(&self, location: String, size: u64) -> iceberg::Result<CountingReader> {
        let input = self.file_io.new_input(&location)?;
        self.stats.opened(&location);
        Ok(CountingReader {
            size,
            input,
            inner: None,
            stats: self.stats.clone(),
            data: self.caches.data.clone().filter(|_| DataCache::covers(&location)),
            local: local_path(&location).map(|path| LocalFile { path, file: None }),
            caches: self.caches.clone(),
            location,
        })
    }
}

/// An `AsyncFileReader` that opens the Iceberg reader on first use (opening is async, the
/// factory is not) and counts requests and bytes for the query's metrics.
pub(super) struct CountingReader {
    location: String,
    size: u64,
    input: iceberg::io::InputFile,
    inner: Option<ArrowFileReader>,
    stats: Arc<QueryStats>,
    caches: Arc<Caches>,
    /// The data cache, when this file is remote (decided once per file).
    data: Option<Arc<DataCache>>,
    /// The file, when it is on local disk: read directly (see [`LocalFile`]).
    local: Option<LocalFile>,
}

/// A data file on local disk, read with positioned reads, each range straight into its own
/// buffer. Through Iceberg's `FileIO` (OpenDAL over tokio's file) every byte was copied twice
/// more, by tokio's read buffer and joining OpenDAL's chunks, in 2 MiB hops through tokio's
/// blocking pool: scan-heavy kinds took 4–18% longer at 30M (docs/performance.md).
struct LocalFile {
    path: std::path::PathBuf,
    /// Opened on the first read, kept for the reader's life.
    file: Option<Arc<std::fs::File>>,
}

/// The path of a location on local disk, as Iceberg's `FileIO` resolves it (`file:/…` or an
/// absolute path); `None` for any other storage.
fn local_path(location: &str) -> Option<std::path::PathBuf> {
    let path = match location.strip_prefix("file:") {
        Some(rest) => rest,
        None if !location.contains("://") => location,
        None => return None,
    };
    path.starts_with('/').then(|| format!("/{}", path.trim_start_matches('/')).into())
}

impl LocalFile {
    async fn read(&mut self, ranges: Vec<Range<u64>>, location: &str) -> parquet::errors::Result<Vec<Bytes>> {
        use std::os::unix::fs::FileExt;
        let (path, file) = (self.path.clone(), self.file.clone());
        let io = move || -> std::io::Result<(Arc<std::fs::File>, Vec<Bytes>)> {
            let file = match file {
                Some(f) => f,
                None => Arc::new(std::fs::File::open(&path)?),
            };
            // A footer can claim any range: none is allocated past the file's end.
            let len = file.metadata()?.len();
            let mut out = Vec::with_capacity(ranges.len());
            for r in ranges {
                if r.end > len || r.start > r.end {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                let mut buf = vec![0u8; (r.end - r.start) as usize];
                file.read_exact_at(&mut buf, r.start)?;
                out.push(Bytes::from(buf));
            }
            Ok((file, out))
        };
        let (file, out) = tokio::task::spawn_blocking(io)
            .await
            .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?
            .map_err(|e| local_error(e, location))?;
        self.file = Some(file);
        Ok(out)
    }
}

/// A local read's failure, classified as the same failure through `FileIO` would be: a file
/// shorter than its manifest lists is broken (a data error), anything else is an outage.
fn local_error(e: std::io::Error, location: &str) -> parquet::errors::ParquetError {
    use parquet::errors::ParquetError;
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        return ParquetError::External(
            format!("{location}: the file is shorter than its manifest lists").into(),
        );
    }
    let ie = iceberg::Error::new(iceberg::ErrorKind::Unexpected, "cannot read the data file").with_source(e);
    ParquetError::External(Box::new(with_file(ie, location)))
}

/// A file's reader lives while its rows are decoded: a decoding error is then in it.
impl Drop for CountingReader {
    fn drop(&mut self) {
        self.stats.closed(&self.location);
    }
}

impl CountingReader {
    async fn reader(&mut self) -> parquet::errors::Result<&mut ArrowFileReader> {
        if self.inner.is_none() {
            let r = self.input.reader().await.map_err(|e| {
                parquet::errors::ParquetError::External(Box::new(with_file(e, &self.location)))
            })?;
            self.inner = Some(ArrowFileReader::new(FileMetadata { size: self.size }, r));
        }
        Ok(self.inner.as_mut().expect("just set"))
    }

    fn count(&self, requests: u64, bytes: u64) {
        self.stats.requests.fetch_add(requests, Ordering::Relaxed);
        self.stats.bytes_scanned.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Reads `ranges`, through the data cache for remote files.
    async fn read(&mut self, ranges: Vec<Range<u64>>) -> parquet::errors::Result<Vec<Bytes>> {
        let bytes: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        self.count(ranges.len() as u64, bytes);
        if let Some(cache) = self.data.clone() {
            let lookup = cache.lookup(&self.location, self.size, &ranges).await;
            let missing = lookup.missing();
            let fetched = if missing.is_empty() { vec![] } else { self.fetch(missing).await? };
            if let Some(all) = cache.complete(lookup, fetched).await {
                return Ok(all);
            }
        }
        self.fetch(ranges).await
    }

    async fn fetch(&mut self, ranges: Vec<Range<u64>>) -> parquet::errors::Result<Vec<Bytes>> {
        let location = self.location.clone();
        if let Some(local) = &mut self.local {
            return local.read(ranges, &location).await;
        }
        self.reader().await?.get_byte_ranges(ranges).await.map_err(|e| in_file(e, &location))
    }
}

impl AsyncFileReader for CountingReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        async move {
            let mut all = self.read(vec![range]).await?;
            Ok(all.pop().expect("one range read"))
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        self.read(ranges).boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            // A data file never changes at its path, so neither does its footer.
            let (caches, location) = (self.caches.clone(), self.location.clone());
            let load = async {
                self.count(1, 0);
                self.reader().await?.get_metadata(options).await.map_err(|e| in_file(e, &location))
            };
            caches.footer(&location, load).await
        }
        .boxed()
    }
}

/// Parquet errors name no file; a corrupt or missing file must be named. Storage errors
/// stay Iceberg errors (they are outages); anything else is the file's own fault.
fn in_file(e: parquet::errors::ParquetError, location: &str) -> parquet::errors::ParquetError {
    use parquet::errors::ParquetError;
    match e {
        ParquetError::External(inner) => match inner.downcast::<iceberg::Error>() {
            Ok(ie) => ParquetError::External(Box::new(with_file(*ie, location))),
            Err(other) => ParquetError::External(format!("{location}: {other}").into()),
        },
        other => ParquetError::External(format!("{location}: {other}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_resolve_as_file_io_does() {
        let p = |l: &str| local_path(l).map(|p| p.display().to_string());
        assert_eq!(p("file:///lake/a.parquet").as_deref(), Some("/lake/a.parquet"));
        assert_eq!(p("file:/lake/a.parquet").as_deref(), Some("/lake/a.parquet"));
        assert_eq!(p("/lake/a.parquet").as_deref(), Some("/lake/a.parquet"));
        for remote in ["s3://bucket/a.parquet", "memory:/a.parquet", "lake/a.parquet"] {
            assert_eq!(p(remote), None, "{remote}");
        }
    }

    #[tokio::test]
    async fn a_local_range_past_the_end_is_a_short_file_not_an_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.parquet");
        std::fs::write(&path, b"0123456789").unwrap();
        let mut f = LocalFile { path, file: None };
        let read = f.read(vec![2..5, 8..10], "file:///a.parquet").await.unwrap();
        assert_eq!(read, vec![Bytes::from_static(b"234"), Bytes::from_static(b"89")]);
        // A corrupt footer may claim a chunk of any size: without the check this would
        // allocate 4 EiB and abort.
        let huge: Range<u64> = 0..1 << 62;
        let e = f.read(vec![huge], "file:///a.parquet").await.unwrap_err().to_string();
        assert!(e.contains("file:///a.parquet: the file is shorter"), "{e}");
        let missing = LocalFile { path: dir.path().join("gone.parquet"), file: None }
            .read(vec![Range { start: 0, end: 1 }], "file:///gone.parquet")
            .await
            .unwrap_err();
        let parquet::errors::ParquetError::External(inner) = missing else { panic!("{missing}") };
        let ie = inner.downcast_ref::<iceberg::Error>().expect("an Iceberg error: an outage");
        assert!(ie.to_string().contains("gone.parquet"), "{ie}");
    }
}
