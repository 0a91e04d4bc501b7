//! Scanning one Iceberg table: skiff plans the files from its cached manifests (pruning by
//! their column bounds), or Iceberg does when there are delete files; DataFusion reads them.
//!
//! Files without delete files go to DataFusion's own Parquet scan, split over all cores, with
//! row-group and page pruning, and read through the table's Iceberg `FileIO` so vended
//! credentials and every storage Iceberg supports work unchanged; data files on local disk are
//! read directly. Files with delete files are read by Iceberg's own reader, which applies the
//! deletes.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::RecordBatchOptions;
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::pruning::PrunableStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue, Statistics};
use datafusion::config::TableParquetOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_optimizer::pruning::PruningPredicate;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use futures::{StreamExt, TryStreamExt};
use iceberg::io::FileIO;
use iceberg::scan::FileScanTask;
use iceberg::spec::DataFileFormat;
use iceberg::table::Table;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::file::metadata::PageIndexPolicy;

use super::cache::{Caches, Shares};
use super::data_cache::DataCache;
use super::file_stats::{self, MANIFEST_READS};
use super::manifest::SnapshotFiles;
use super::reader::{FileIoReaderFactory, PlannedFile};
use super::row_filter;
use super::stats::QueryStats;

/// Which of the scan's own optimizations are on; the engine sets them in the session
/// config from `--disable-rules` (`manifest_statistics`, `manifest_pruning`,
/// `measured_row_filters`). A session without them has every one on.
#[derive(Debug, Clone, Copy)]
pub struct ScanOptions {
    /// Row counts and column bounds from the manifests are given to DataFusion (which may then
    /// answer from them alone, and prunes and folds by them).
    pub statistics: bool,
    /// Files whose manifest bounds cannot satisfy the filters are not planned.
    pub pruning: bool,
    /// A scan filters while decoding when a sample shows that pays (`row_filter`).
    pub measured_row_filters: bool,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self { statistics: true, pruning: true, measured_row_filters: true }
    }
}

impl ScanOptions {
    pub fn of(state: &dyn datafusion::catalog::Session) -> Self {
        state.config().get_extension::<Self>().map(|o| *o).unwrap_or_default()
    }
}

/// The Arrow schema skiff exposes for an Iceberg table: Iceberg's own mapping, without the
/// per-field `PARQUET:field_id` metadata (DataFusion rejects plans whose logical and physical
/// field metadata differ, and unions of versions would carry conflicting ids), and with
/// string columns as `Utf8View`.
///
/// Views are decoded without copying each string into one buffer, and filters, joins,
/// groupings and sorts then move 16-byte views instead of strings: 0.66–0.88× the time on
/// the string-heavy query kinds at 30M events. Responses still carry `Utf8` (see the engine).
pub fn arrow_schema(table: &Table) -> iceberg::Result<SchemaRef> {
    let s = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())?;
    let fields: Vec<Field> = s
        .fields()
        .iter()
        .map(|f| {
            let t = match f.data_type() {
                DataType::Utf8 | DataType::LargeUtf8 => DataType::Utf8View,
                other => other.clone(),
            };
            Field::new(f.name(), t, f.is_nullable())
        })
        .collect();
    Ok(Arc::new(Schema::new(fields)))
}

/// Every filter is offered to Iceberg and Parquet for pruning, and DataFusion re-checks rows.
pub fn pushdown(filters: &[&Expr]) -> Vec<TableProviderFilterPushDown> {
    vec![TableProviderFilterPushDown::Inexact; filters.len()]
}

/// Plans and builds the physical scan of `table` at its current snapshot.
pub async fn scan(
    table: &Table,
    schema: &SchemaRef,
    caches: &Arc<Caches>,
    state: &dyn Session,
    projection: Option<&Vec<usize>>,
    filters: &[Expr],
    limit: Option<usize>,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let stats = QueryStats::of(state);
    let projected = Arc::new(match projection {
        Some(p) => schema.project(p)?,
        None => schema.as_ref().clone(),
    });
    let Some(snapshot) = table.metadata().current_snapshot() else {
        stats.record_snapshot(table.identifier().to_string(), None);
        return Ok(Arc::new(EmptyExec::new(projected)));
    };
    stats.record_snapshot(table.identifier().to_string(), Some(snapshot.snapshot_id()));
    let total = snapshot.summary().additional_properties.get("total-data-files");
    if let Some(n) = total.and_then(|n| n.parse::<u64>().ok()) {
        stats.files_total.fetch_add(n, Ordering::Relaxed);
    }

    let options = ScanOptions::of(state);
    let files = manifest_files(table, schema, caches).await.map_err(ext)?;
    // Without pruning every file is planned; DataFusion still applies every filter.
    let pruning_by: &[Expr] = if options.pruning { filters } else { &[] };
    let tasks = match files.as_deref().filter(|f| !f.has_deletes) {
        Some(f) => plan_from_manifests(table, schema, &projected, pruning_by, f, state),
        None => plan_files(table, schema, &projected, pruning_by).await?,
    };
    stats.files_planned.fetch_add(tasks.len() as u64, Ordering::Relaxed);
    if tasks.is_empty() {
        return Ok(Arc::new(EmptyExec::new(projected)));
    }
    if reads_by_field_id(table) || tasks.iter().any(|t| !t.deletes.is_empty()) {
        return iceberg_reader_scan(table, projected, tasks, state.config().target_partitions());
    }
    let factory = Arc::new(FileIoReaderFactory {
        file_io: table.file_io().clone(),
        stats: stats.clone(),
        caches: caches.clone(),
    });
    let (row_filter, shares) = if options.measured_row_filters {
        row_filter::pays(state, schema, &projected, filters, &tasks, caches, |t| {
            factory.open(t.data_file_path.clone(), t.file_size_in_bytes)
        })
        .await
    } else {
        (false, Shares::from([]))
    };
    let files = files.as_deref().filter(|_| options.statistics);
    let scan = ParquetScan { schema, files, factory, row_filter, shares, exact_rows: options.statistics };
    scan.build(state, projection, limit, tasks)
}

/// Iceberg's planning: prunes manifests, partitions and files by the filters it can take.
async fn plan_files(
    table: &Table,
    schema: &SchemaRef,
    projected: &SchemaRef,
    filters: &[Expr],
) -> DFResult<Vec<FileScanTask>> {
    // Filters Iceberg would mis-prune by are left to DataFusion, which applies every filter.
    let safe: Vec<Expr> = filters.iter().filter(|f| safe_for_iceberg(f, table, schema)).cloned().collect();
    let names: Vec<String> = projected.fields().iter().map(|f| f.name().clone()).collect();
    // Manifests are read MANIFEST_READS at a time (Iceberg's default is one per core, and a
    // remote store spends tens of milliseconds per read); their entries stay one per core.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut builder = table
        .scan()
        .with_concurrency_limit(MANIFEST_READS)
        .with_manifest_entry_concurrency_limit(cores)
        .with_data_file_concurrency_limit(cores);
    builder = if names.is_empty() { builder.select_empty() } else { builder.select(names) };
    if let Some(p) = convert_filters_to_predicate(&safe) {
        builder = builder.with_filter(p);
    }
    let scan = builder.build().map_err(ext)?;
    scan.plan_files().await.map_err(ext)?.try_collect().await.map_err(ext)
}

/// The files of a snapshot without delete files whose manifest statistics may satisfy the
/// filters, as Iceberg's planning would find them. Iceberg's planning decodes manifests into
/// a cache that lives and dies with each loaded table version, so the first query after
/// every commit decoded them all again (twice, with the statistics' own read).
fn plan_from_manifests(
    table: &Table,
    schema: &SchemaRef,
    projected: &SchemaRef,
    filters: &[Expr],
    files: &SnapshotFiles,
    state: &dyn Session,
) -> Vec<FileScanTask> {
    let keep = may_match(schema, filters, files, state);
    let iceberg_schema = table.metadata().current_schema();
    let ids: Vec<i32> = projected
        .fields()
        .iter()
        .filter_map(|f| iceberg_schema.field_by_name(f.name()))
        .map(|f| f.id)
        .collect();
    files
        .files
        .iter()
        .zip(keep)
        .filter(|(_, keep)| *keep)
        .map(|(f, _)| {
            FileScanTask::builder()
                .with_file_size_in_bytes(f.size)
                .with_start(0)
                .with_length(f.size)
                .with_record_count(Some(f.records))
                .with_data_file_path(f.path.clone())
                .with_data_file_format(f.format)
                .with_schema(iceberg_schema.clone())
                .with_project_field_ids(ids.clone())
                .with_case_sensitive(true)
                .build()
        })
        .collect()
}

/// For each file, whether its statistics may satisfy every filter; every file when the
/// filters cannot be checked against statistics.
fn may_match(schema: &SchemaRef, filters: &[Expr], files: &SnapshotFiles, state: &dyn Session) -> Vec<bool> {
    let unqualified = filters.iter().map(|f| {
        f.clone()
            .transform(|e| {
                Ok(match e {
                    Expr::Column(c) => Transformed::yes(Expr::Column(Column::new_unqualified(c.name))),
                    e => Transformed::no(e),
                })
            })
            .map(|t| t.data)
    });
    let pruned = || -> DFResult<Option<Vec<bool>>> {
        let Some(expr) = conjunction(unqualified.collect::<DFResult<Vec<_>>>()?) else {
            return Ok(None);
        };
        let physical = state.create_physical_expr(expr, &DFSchema::try_from(schema.as_ref().clone())?)?;
        let predicate = PruningPredicate::try_new(physical, schema.clone())?;
        let stats =
            PrunableStatistics::new(files.files.iter().map(|f| f.stats.clone()).collect(), schema.clone());
        Ok(Some(predicate.prune(&stats)?))
    };
    pruned().ok().flatten().unwrap_or_else(|| vec![true; files.files.len()])
}

/// Whether iceberg-rust 0.10.1 prunes correctly by `e`. It mis-prunes when a filter casts a
/// column, fails on f32 literals, prunes older files by their bounds in a column's old type
/// after a promotion (int to long: `id > 1` skipped files holding 2), and, as Iceberg's float
/// bounds leave NaN out, skips files whose NaN would pass `d > 2`.
fn safe_for_iceberg(e: &Expr, table: &Table, schema: &SchemaRef) -> bool {
    let risky = e
        .exists(|x| {
            Ok(match x {
                Expr::Cast(_) | Expr::TryCast(_) | Expr::ScalarFunction(_) => true,
                Expr::Column(c) => {
                    schema.field_with_name(&c.name).map(|f| f.data_type().is_floating()).unwrap_or(true)
                        || was_promoted(table, &c.name)
                }
                _ => false,
            })
        })
        .unwrap_or(true);
    !risky
}

/// Whether column `name` had another type in any of the table's schemas.
fn was_promoted(table: &Table, name: &str) -> bool {
    let Some(field) = table.metadata().current_schema().field_by_name(name) else { return true };
    table
        .metadata()
        .schemas_iter()
        .any(|s| s.field_by_id(field.id).is_some_and(|old| old.field_type != field.field_type))
}

/// The current snapshot's files from skiff's own manifests, which plan every scan except of
/// a table read by field id (by Iceberg's reader, see [`reads_by_field_id`]) and of files with
/// deletes (matched to their data files by Iceberg's planning).
pub(super) async fn manifest_files(
    table: &Table,
    schema: &SchemaRef,
    caches: &Arc<Caches>,
) -> iceberg::Result<Option<Arc<SnapshotFiles>>> {
    if reads_by_field_id(table) {
        return Ok(None);
    }
    file_stats::snapshot_files(table, schema, caches).await.map(Some)
}

/// Footers read at once by [`warm_footers`].
const FOOTER_READS: usize = 16;

/// Reads the Parquet footers of a snapshot's data files into the footer cache, as each file's
/// first query would (on R2, a round trip per file), until the cache is half full. Returns how
/// many were read; a file that cannot be read is left for the queries that read it to report.
pub(super) async fn warm_footers(table: &Table, files: &SnapshotFiles, caches: &Arc<Caches>) -> usize {
    // Files with deletes go through Iceberg's reader, which reads their footers itself.
    if files.has_deletes {
        return 0;
    }
    let factory = Arc::new(FileIoReaderFactory {
        file_io: table.file_io().clone(),
        stats: Arc::default(),
        caches: caches.clone(),
    });
    let reads: Vec<_> = files
        .files
        .iter()
        .filter(|f| f.format == DataFileFormat::Parquet)
        .map(|f| {
            let (factory, path, size) = (factory.clone(), f.path.clone(), f.size);
            async move {
                if factory.caches.footers_half_full() {
                    return None;
                }
                // As DataFusion's scan loads a footer: a query that prunes pages reads the
                // page index itself.
                let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Skip);
                factory.open(path, size).ok()?.get_metadata(Some(&options)).await.ok()
            }
        })
        .collect();
    let mut read = futures::stream::iter(reads).buffer_unordered(FOOTER_READS);
    let mut count = 0;
    while let Some(footer) = read.next().await {
        count += usize::from(footer.is_some());
    }
    count
}

/// DataFusion's Parquet scan reads columns by name, which is only right while the table's
/// columns have never been renamed or re-typed, and while the files name them as Iceberg does:
/// PyIceberg and Java's Iceberg write a name Avro would not accept under another name in
/// Parquet (`$browser` as `_x24browser`). Otherwise Iceberg's reader reads by field id.
fn reads_by_field_id(table: &Table) -> bool {
    let avro_name = |n: &str| {
        n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let metadata = table.metadata();
    metadata.schemas_iter().len() > 1
        || metadata.current_schema().field_id_to_fields().values().any(|f| !avro_name(&f.name))
}

/// What opening a file costs, in bytes read: locally about the time to decode 256 KiB; on
/// a remote store two round trips (footer, then data) of tens of milliseconds each.
const LOCAL_FILE_COST: u64 = 256 << 10;
const REMOTE_FILE_COST: u64 = 8 << 20;

/// The smallest byte range a large file is split into for parallel reading.
const MIN_RANGE: u64 = 8 << 20;

/// Scan partitions per core for files on a remote store (S3, R2): with tens of milliseconds
/// per request, a core can decode what many concurrent reads bring in.
const REMOTE_PARTITIONS_PER_CORE: usize = 16;

struct ParquetScan<'a> {
    schema: &'a SchemaRef,
    files: Option<&'a SnapshotFiles>,
    factory: Arc<FileIoReaderFactory>,
    /// Whether the scan's own filters are applied while decoding (see `row_filter`).
    row_filter: bool,
    /// What the sample measured of each of the scan's conditions, for `SelectiveFirst`.
    shares: Shares,
    /// Whether the planned files' row counts are given to DataFusion as exact.
    exact_rows: bool,
}

impl ParquetScan<'_> {
    fn build(
        self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
        tasks: Vec<FileScanTask>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let schema = self.schema;
        // skiff makes the file groups (DataFusion's own re-split is off, see the engine). A
        // remote file's reads mostly wait on the network, so more files are read at once than
        // there are cores; each partition reads its files one after another.
        let mut partitions = state.config().target_partitions().max(1);
        let mut file_cost = LOCAL_FILE_COST;
        if tasks.first().is_some_and(|t| DataCache::covers(&t.data_file_path)) {
            partitions *= REMOTE_PARTITIONS_PER_CORE;
            file_cost = REMOTE_FILE_COST;
        }
        let total_rows: u64 = tasks.iter().map(|t| t.record_count.unwrap_or(0)).sum();
        let rows_known = self.exact_rows && tasks.iter().all(|t| t.record_count.is_some());
        // Manifest statistics of every planned file, when each one has them.
        let per_file: Option<Vec<&Statistics>> = self.files.and_then(|files| {
            tasks
                .iter()
                .map(|t| whole_file(t).then(|| files.get(&t.data_file_path)).flatten())
                .map(|s| s.map(|s| s.as_ref()))
                .collect()
        });
        let statistics = match &per_file {
            Some(all) => file_stats::merge(all, schema),
            None => Statistics::new_unknown(schema).with_num_rows(if rows_known {
                Precision::Exact(total_rows as usize)
            } else {
                Precision::Absent
            }),
        };
        let groups =
            split_into_groups(&tasks, partitions, file_cost, self.files, &self.shares, &self.factory.file_io);

        let mut options = TableParquetOptions {
            global: state.config_options().execution.parquet.clone(),
            ..Default::default()
        };
        if self.row_filter {
            options.global.pushdown_filters = true;
            options.global.reorder_filters = true;
        }
        // Parquet's float statistics leave NaN out, yet NaN is above every number to
        // DataFusion: pruning row groups or pages by them would drop NaN rows that `d > 2`
        // (or a top-k on `d`) keeps. Files are still pruned by their manifest bounds.
        let read = |i: &usize| schema.field(*i).data_type().is_floating();
        if projection.map_or_else(|| (0..schema.fields().len()).any(|i| read(&i)), |p| p.iter().any(read)) {
            options.global.pruning = false;
            options.global.enable_page_index = false;
        }
        let source = ParquetSource::new(schema.clone())
            .with_table_parquet_options(options)
            .with_parquet_file_reader_factory(self.factory);
        // No predicate here: DataFusion pushes the filters above this scan into it (for
        // pruning, and as a row filter with `pushdown_filters`); setting them here as well
        // would evaluate every filter twice.
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(source))
            .with_file_groups(groups)
            .with_projection_indices(projection.cloned())?
            .with_statistics(statistics)
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}

/// Whether a task reads its whole file, so the file's statistics are the task's.
fn whole_file(t: &FileScanTask) -> bool {
    t.start == 0 && t.length == t.file_size_in_bytes
}

/// Spreads files over `n` groups by cost (largest first onto the cheapest group), so every
/// group gets a similar share of work: a file costs its bytes plus `per_file`, what opening
/// it is worth (on a remote store a round trip outweighs most files' bytes). A file larger
/// than a share is read as byte ranges by several groups (Parquet gives each range the row
/// groups whose middle falls in it), so one large file still uses every core. Each whole file carries its manifest statistics, so a
/// top-k can skip files whose bounds cannot beat what it already holds.
fn split_into_groups(
    tasks: &[FileScanTask],
    n: usize,
    per_file: u64,
    files: Option<&SnapshotFiles>,
    shares: &Shares,
    file_io: &FileIO,
) -> Vec<FileGroup> {
    let total: u64 = tasks.iter().map(|t| t.length).sum();
    let share = total.div_ceil(n.max(1) as u64).max(MIN_RANGE);
    let mut pieces: Vec<PartitionedFile> = Vec::with_capacity(tasks.len());
    for t in tasks {
        let end = t.start + t.length;
        if t.length <= share {
            let mut f = partitioned_file(t, t.start..end, shares, file_io);
            if let Some(st) = files.filter(|_| whole_file(t)).and_then(|files| files.get(&t.data_file_path)) {
                f = f.with_statistics(st.clone());
            }
            pieces.push(f);
            continue;
        }
        let mut at = t.start;
        while at < end {
            let to = (at + share).min(end);
            pieces.push(partitioned_file(t, at..to, shares, file_io));
            at = to;
        }
    }
    pieces.sort_by(|a, b| {
        b.effective_size()
            .cmp(&a.effective_size())
            .then_with(|| a.object_meta.location.cmp(&b.object_meta.location))
    });
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> =
        (0..n.min(pieces.len())).map(|_| (0, Vec::new())).collect();
    for f in pieces {
        let g = groups.iter_mut().min_by_key(|(cost, _)| *cost).expect("at least one group");
        g.0 += f.effective_size() + per_file;
        g.1.push(f);
    }
    groups
        .into_iter()
        .map(|(_, mut files)| {
            newest_first(&mut files);
            FileGroup::new(files)
        })
        .collect()
}

/// Orders a group's files by the upper bound of the table's first timestamp column, newest
/// first. The scan declares no order, so this changes no answer; but "latest events" (a
/// top-k on time) then fills its heap from the first files, and its dynamic filter prunes the
/// rest by their bounds without opening them.
fn newest_first(files: &mut [PartitionedFile]) {
    let newest = |f: &PartitionedFile| -> Option<i64> {
        f.statistics.as_ref()?.column_statistics.iter().find_map(|c| match c.max_value.get_value()? {
            ScalarValue::TimestampMicrosecond(Some(t), _) => Some(*t),
            ScalarValue::TimestampNanosecond(Some(t), _) => Some(*t / 1000),
            _ => None,
        })
    };
    files.sort_by_cached_key(|f| std::cmp::Reverse(newest(f)));
}

/// A planned file (or a byte range of it) for DataFusion. Its object-store path is only a
/// label: the reader factory opens the real Iceberg location kept in `extensions`.
fn partitioned_file(
    t: &FileScanTask,
    range: Range<u64>,
    shares: &Shares,
    file_io: &FileIO,
) -> PartitionedFile {
    let label = t.data_file_path.split_once("://").map(|(_, p)| p).unwrap_or(&t.data_file_path);
    let mut f = if range.start == 0 && range.end == t.file_size_in_bytes {
        PartitionedFile::new(label.to_string(), t.file_size_in_bytes)
    } else {
        PartitionedFile::new_with_range(
            label.to_string(),
            t.file_size_in_bytes,
            range.start as i64,
            range.end as i64,
        )
    };
    f.extensions = Some(Arc::new(PlannedFile {
        location: t.data_file_path.clone(),
        shares: Arc::clone(shares),
        file_io: file_io.clone(),
    }));
    f
}

/// Files with delete files (or tables whose schema evolved) go through Iceberg's reader,
/// which applies deletes and maps columns by field id; tasks are spread over partitions.
fn iceberg_reader_scan(
    table: &Table,
    projected: SchemaRef,
    tasks: Vec<FileScanTask>,
    partitions: usize,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let n = partitions.clamp(1, tasks.len());
    let mut chunks: Vec<Vec<FileScanTask>> = (0..n).map(|_| Vec::new()).collect();
    for (i, t) in tasks.into_iter().enumerate() {
        chunks[i % n].push(t);
    }
    let streams: Vec<Arc<dyn PartitionStream>> = chunks
        .into_iter()
        .map(|tasks| {
            Arc::new(IcebergPartition { table: table.clone(), schema: projected.clone(), tasks })
                as Arc<dyn PartitionStream>
        })
        .collect();
    Ok(Arc::new(StreamingTableExec::try_new(projected, streams, None, vec![], false, None)?))
}

#[derive(Debug)]
struct IcebergPartition {
    table: Table,
    schema: SchemaRef,
    tasks: Vec<FileScanTask>,
}

impl PartitionStream for IcebergPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let table = self.table.clone();
        let tasks = self.tasks.clone();
        let out = schema.clone();
        let stream = futures::stream::once(async move {
            let tasks = futures::stream::iter(tasks.into_iter().map(Ok)).boxed();
            table.reader_builder().build().read(tasks).map(|r| r.stream().map_err(ext)).map_err(ext)
        })
        .try_flatten()
        .map(move |batch| {
            let batch = batch?;
            // Iceberg's batches carry field-id metadata and plain strings; re-label them with
            // skiff's schema, strings as views.
            if out.fields().is_empty() {
                let opts = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                return Ok(RecordBatch::try_new_with_options(out.clone(), vec![], &opts)?);
            }
            let columns = batch
                .columns()
                .iter()
                .zip(out.fields())
                .map(
                    |(c, f)| {
                        if c.data_type() == f.data_type() { Ok(c.clone()) } else { cast(c, f.data_type()) }
                    },
                )
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RecordBatch::try_new(out.clone(), columns)?)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, stream))
    }
}

fn ext(e: iceberg::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{DataFileFormat, Schema as IcebergSchema};

    use super::*;

    fn task(name: &str, size: u64) -> FileScanTask {
        FileScanTask::builder()
            .with_file_size_in_bytes(size)
            .with_start(0)
            .with_length(size)
            .with_data_file_path(format!("s3://bucket/{name}.parquet"))
            .with_data_file_format(DataFileFormat::Parquet)
            .with_schema(Arc::new(IcebergSchema::builder().build().unwrap()))
            .with_project_field_ids(vec![])
            .with_case_sensitive(true)
            .build()
    }

    #[test]
    fn groups_share_files_as_well_as_bytes() {
        // By bytes alone, one group would take the large file and the others every small one.
        let mut tasks = vec![task("large", 4 << 20)];
        tasks.extend((0..99).map(|i| task(&format!("small-{i}"), 40 << 10)));
        let groups =
            split_into_groups(&tasks, 4, REMOTE_FILE_COST, None, &Shares::from([]), &FileIO::new_with_fs());
        let counts: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        assert_eq!(counts.iter().sum::<usize>(), 100, "every file once");
        assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{counts:?}");
    }

    #[test]
    fn a_large_file_is_read_in_ranges_by_every_group() {
        let size = 64 << 20;
        let groups = split_into_groups(
            &[task("huge", size)],
            4,
            LOCAL_FILE_COST,
            None,
            &Shares::from([]),
            &FileIO::new_with_fs(),
        );
        assert_eq!(groups.len(), 4);
        let mut ranges: Vec<(i64, i64)> = groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|f| f.range.as_ref().map(|r| (r.start, r.end)).expect("a range"))
            .collect();
        ranges.sort();
        assert_eq!(ranges.first().unwrap().0, 0);
        assert_eq!(ranges.last().unwrap().1, size as i64);
        assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0), "contiguous: {ranges:?}");
        // A small file stays whole, with no range.
        let groups = split_into_groups(
            &[task("small", 1 << 20)],
            4,
            LOCAL_FILE_COST,
            None,
            &Shares::from([]),
            &FileIO::new_with_fs(),
        );
        assert_eq!(groups.len(), 1);
        assert!(groups[0].iter().all(|f| f.range.is_none()));
    }
}
