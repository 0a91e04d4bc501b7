//! What a data file's column bounds decide before it is read.
//!
//! Pipelines rolls its files every few minutes, so each covers a short span of time: in the
//! bench lakes every file lies within one day. A query's time range then holds for every row of
//! almost every file, and a day or week bucket of the timestamp is one value per file. Yet a
//! filter above the scan tests each row's timestamp, and the bucket is computed per row, so
//! the scan decodes every timestamp (zstd decompression of that column was 41% of the CPU of a
//! count over a time range at 30M events).
//!
//! `FoldPerFile` hands a filter and a projection over a Parquet scan to the scan itself. For
//! each file it then drops the conditions the manifest bounds prove true (a file they prove
//! false yields nothing), replaces each expression that is constant over the bounds by its
//! value, and reads only the columns what is left needs. Only exact bounds of files with no
//! nulls in the column count, and no floating-point column (its bounds leave NaN out).

use std::any::Any;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use arrow::array::{AsArray, RecordBatch, RecordBatchOptions};
use arrow::compute::BatchCoalescer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{ScalarValue, Statistics};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    FileOpenFuture, FileOpener, FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::Operator;
use datafusion::object_store::ObjectStore;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, Literal, NegativeExpr, TryCastExpr,
};
use datafusion::physical_expr::projection::{ProjectionExpr, ProjectionExprs};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{DisplayFormatType, ExecutionPlan};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

/// Moves a filter and a projection over a Parquet scan into the scan, folded per file.
#[derive(Debug, Default)]
pub struct FoldPerFile;

impl PhysicalOptimizerRule for FoldPerFile {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let batch_size = config.execution.batch_size;
        plan.transform_down(|node| {
            Ok(match folded(&node, batch_size)? {
                Some(scan) => Transformed::yes(scan),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "fold_per_file"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// The scan that takes over `node`, a projection or a filter (or a projection over a filter)
/// over a Parquet scan, when some of its work may fold on a file's bounds. A projection over
/// a union (the versions of a table) goes into each of its inputs, when each one takes it.
fn folded(node: &Arc<dyn ExecutionPlan>, batch_size: usize) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(p) = node.as_any().downcast_ref::<ProjectionExec>()
        && p.input().as_any().is::<UnionExec>()
    {
        let mut inputs = Vec::new();
        for input in p.input().children() {
            let projected: Arc<dyn ExecutionPlan> =
                Arc::new(ProjectionExec::try_new(p.expr().to_vec(), Arc::clone(input))?);
            match folded(&projected, batch_size)? {
                Some(scan) => inputs.push(scan),
                None => return Ok(None),
            }
        }
        let union = UnionExec::try_new(inputs)?;
        return Ok((union.schema().fields() == node.schema().fields()).then_some(union));
    }
    let projection = node.as_any().downcast_ref::<ProjectionExec>();
    let below = projection.map_or(node, |p| p.input());
    let filter = below.as_any().downcast_ref::<FilterExec>();
    if projection.is_none() && filter.is_none() || filter.is_some_and(|f| f.fetch().is_some()) {
        return Ok(None);
    }
    let scan = filter.map_or(below, |f| f.input());
    let Some(exec) = scan.as_any().downcast_ref::<DataSourceExec>() else { return Ok(None) };
    let Some((config, source)) = exec.downcast_to_file_source::<ParquetSource>() else { return Ok(None) };
    // A scan with a row filter already filters while decoding; a limit would count rows
    // before the filter.
    if config.limit.is_some() || source.table_parquet_options().global.pushdown_filters {
        return Ok(None);
    }
    if !config.file_groups.iter().flat_map(|g| g.iter()).any(|f| f.statistics.is_some()) {
        return Ok(None);
    }
    // Everything in the table's columns, as the file statistics are.
    let Some(scanned) = source.projection() else { return Ok(None) };
    let scanned: Vec<Arc<dyn PhysicalExpr>> = scanned.expr_iter().collect();
    let mut read = HashMap::new();
    for (at, e) in scanned.iter().enumerate() {
        let Some(c) = e.as_any().downcast_ref::<Column>() else { return Ok(None) };
        read.insert(c.index(), at);
    }
    let predicate = filter.map(|f| substitute(f.predicate(), &scanned)).transpose()?;
    let scan_schema = scan.schema();
    let passed: Vec<usize> = match filter.and_then(|f| f.projection().as_ref()) {
        Some(columns) => columns.to_vec(),
        None => (0..scanned.len()).collect(),
    };
    let after_filter: Vec<Arc<dyn PhysicalExpr>> = passed.iter().map(|&i| Arc::clone(&scanned[i])).collect();
    let output: Vec<ProjectionExpr> = match projection {
        Some(p) => p
            .expr()
            .iter()
            .map(|pe| Ok(ProjectionExpr::new(substitute(&pe.expr, &after_filter)?, pe.alias.clone())))
            .collect::<DFResult<_>>()?,
        None => passed
            .iter()
            .zip(after_filter)
            .map(|(&i, e)| ProjectionExpr::new(e, scan_schema.field(i).name().clone()))
            .collect(),
    };
    let table = source.table_schema().table_schema();
    let may_fold =
        predicate.as_ref().is_some_and(|p| split_conjunction(p).iter().any(|c| comparison(c).is_some()))
            || output.iter().any(|pe| single_column(&pe.expr, table).is_some());
    if !may_fold {
        return Ok(None);
    }
    let folding_filter = predicate.is_some();
    let folding = FoldingSource {
        inner: Arc::new(source.clone()),
        inner_schema: scan_schema,
        read: Arc::new(read),
        filter: predicate,
        output: ProjectionExprs::new(output),
    };
    let config = FileScanConfigBuilder::from(config.clone()).with_source(Arc::new(folding)).build();
    let mut plan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
    if folding_filter {
        // The filter it replaces gathered the rows that pass into full batches across files;
        // a scan gathers them per file only. Many small files (as Pipelines writes) then make
        // many small batches, and a hash exchange over those reports each of its output
        // batches at many times its size (arrow's coalescer keeps a partly filled 1 MiB block
        // per source batch): 38 MB for 8,000 rows, a 507 in a 256 MiB pool.
        #[expect(deprecated, reason = "the gathering a FilterExec does inside itself, which a scan does not")]
        let gathered =
            datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec::new(plan, batch_size);
        plan = Arc::new(gathered);
    }
    // Only where nothing above can tell (a nullability DataFusion derived differently, say).
    if plan.schema().fields() != node.schema().fields() {
        return Ok(None);
    }
    Ok(Some(plan))
}

/// `e` with each column `i` replaced by `by[i]`.
fn substitute(e: &Arc<dyn PhysicalExpr>, by: &[Arc<dyn PhysicalExpr>]) -> DFResult<Arc<dyn PhysicalExpr>> {
    Arc::clone(e)
        .transform_up(|n| {
            Ok(match n.as_any().downcast_ref::<Column>() {
                Some(c) => Transformed::yes(Arc::clone(&by[c.index()])),
                None => Transformed::no(n),
            })
        })
        .map(|t| t.data)
}

/// A Parquet scan that also filters and projects, folding both per file (see the module).
#[derive(Clone)]
struct FoldingSource {
    /// The scan it reads through, narrowed per file; its predicate still prunes row groups
    /// and pages.
    inner: Arc<dyn FileSource>,
    inner_schema: SchemaRef,
    /// Table column → its place in `inner`'s output.
    read: Arc<HashMap<usize, usize>>,
    filter: Option<Arc<dyn PhysicalExpr>>,
    output: ProjectionExprs,
}

impl FileSource for FoldingSource {
    fn create_file_opener(
        &self,
        object_store: Arc<dyn ObjectStore>,
        base_config: &FileScanConfig,
        partition: usize,
    ) -> DFResult<Arc<dyn FileOpener>> {
        let table = Arc::clone(self.table_schema().table_schema());
        let schema = Arc::new(self.output.project_schema(&table)?);
        Ok(Arc::new(FoldingOpener {
            source: self.clone(),
            object_store,
            config: base_config.clone(),
            partition,
            table,
            schema,
            openers: Mutex::default(),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn table_schema(&self) -> &TableSchema {
        self.inner.table_schema()
    }

    fn with_batch_size(&self, batch_size: usize) -> Arc<dyn FileSource> {
        Arc::new(Self { inner: self.inner.with_batch_size(batch_size), ..self.clone() })
    }

    fn filter(&self) -> Option<Arc<dyn PhysicalExpr>> {
        self.filter.clone().or_else(|| self.inner.filter())
    }

    fn projection(&self) -> Option<&ProjectionExprs> {
        Some(&self.output)
    }

    fn metrics(&self) -> &ExecutionPlanMetricsSet {
        self.inner.metrics()
    }

    fn file_type(&self) -> &str {
        self.inner.file_type()
    }

    fn fmt_extra(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // The columns a file may need; each file reads only those its bounds leave undecided.
        let table = self.table_schema().table_schema();
        let mut columns: Vec<usize> = self.read.keys().copied().collect();
        columns.sort_unstable();
        let names: Vec<&str> = columns.iter().map(|&c| table.field(c).name().as_str()).collect();
        write!(f, ", folded per file, reads=[{}]", names.join(", "))?;
        if let Some(filter) = &self.filter {
            write!(f, ", filter={filter}")?;
        }
        self.inner.fmt_extra(t, f)
    }

    fn supports_repartitioning(&self) -> bool {
        false
    }
}

struct FoldingOpener {
    source: FoldingSource,
    object_store: Arc<dyn ObjectStore>,
    config: FileScanConfig,
    partition: usize,
    table: SchemaRef,
    schema: SchemaRef,
    /// One opener of the inner scan per set of columns read.
    openers: Mutex<HashMap<Vec<usize>, Arc<dyn FileOpener>>>,
}

impl FoldingOpener {
    fn opener(&self, columns: &[usize]) -> DFResult<Arc<dyn FileOpener>> {
        let mut openers = self.openers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = openers.get(columns) {
            return Ok(Arc::clone(o));
        }
        let at: Vec<usize> = columns.iter().map(|c| self.source.read[c]).collect();
        let narrowed = self
            .source
            .inner
            .try_pushdown_projection(&ProjectionExprs::from_indices(&at, &self.source.inner_schema))?
            .ok_or_else(|| DataFusionError::Internal("a Parquet scan takes projections".into()))?;
        let opener =
            narrowed.create_file_opener(Arc::clone(&self.object_store), &self.config, self.partition)?;
        openers.insert(columns.to_vec(), Arc::clone(&opener));
        Ok(opener)
    }
}

impl FileOpener for FoldingOpener {
    fn open(&self, file: PartitionedFile) -> DFResult<FileOpenFuture> {
        let outputs: Vec<_> = self.source.output.expr_iter().collect();
        let Some(plan) =
            FilePlan::new(file.statistics.as_deref(), self.source.filter.as_ref(), &outputs, &self.table)?
        else {
            return Ok(Box::pin(async { Ok(futures::stream::empty().boxed()) }));
        };
        let open = self.opener(&plan.columns)?.open(file)?;
        let schema = Arc::clone(&self.schema);
        let batch_size = self.config.batch_size.unwrap_or(8192);
        Ok(Box::pin(async move {
            let input = open.await?;
            let read = Arc::new(Schema::new(plan.read_fields.clone()));
            let coalescer = plan.filter.as_ref().map(|_| BatchCoalescer::new(read, batch_size));
            Ok(Folded { input, plan, schema, coalescer, done: false }.boxed())
        }))
    }
}

/// What one file needs read and computed.
#[derive(Debug)]
struct FilePlan {
    /// Table columns read, ascending; the expressions below refer to them by position.
    columns: Vec<usize>,
    read_fields: Vec<Field>,
    /// The conditions the bounds did not decide.
    filter: Option<Arc<dyn PhysicalExpr>>,
    outputs: Vec<Arc<dyn PhysicalExpr>>,
}

impl FilePlan {
    /// `None` when the bounds prove no row passes the filter.
    fn new(
        stats: Option<&Statistics>,
        filter: Option<&Arc<dyn PhysicalExpr>>,
        outputs: &[Arc<dyn PhysicalExpr>],
        table: &Schema,
    ) -> DFResult<Option<Self>> {
        let bounds = |c: usize| bounds(stats?, table, c);
        let mut kept = Vec::new();
        for condition in filter.map(split_conjunction).unwrap_or_default() {
            match decided(condition, bounds) {
                Some(true) => {}
                Some(false) => return Ok(None),
                None => kept.push(Arc::clone(condition)),
            }
        }
        let outputs: Vec<Arc<dyn PhysicalExpr>> =
            outputs.iter().map(|e| constant(e, table, bounds).unwrap_or_else(|| Arc::clone(e))).collect();
        let mut columns: Vec<usize> =
            kept.iter().chain(&outputs).flat_map(collect_columns).map(|c| c.index()).collect();
        columns.sort_unstable();
        columns.dedup();
        let to_read = |e: Arc<dyn PhysicalExpr>| -> DFResult<Arc<dyn PhysicalExpr>> {
            e.transform_up(|n| {
                Ok(match n.as_any().downcast_ref::<Column>() {
                    Some(c) => {
                        let at = columns.binary_search(&c.index()).expect("a column read");
                        Transformed::yes(Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>)
                    }
                    None => Transformed::no(n),
                })
            })
            .map(|t| t.data)
        };
        let filter = match kept.is_empty() {
            true => None,
            false => Some(to_read(datafusion::physical_expr::conjunction(kept))?),
        };
        let outputs = outputs.into_iter().map(to_read).collect::<DFResult<_>>()?;
        let read_fields = columns.iter().map(|&c| table.field(c).clone()).collect();
        Ok(Some(Self { columns, read_fields, filter, outputs }))
    }

    /// The file's rows of `batch` that pass the filter.
    fn mask(&self, batch: &RecordBatch) -> DFResult<arrow::array::BooleanArray> {
        let filter = self.filter.as_ref().expect("a filter");
        let mask = filter.evaluate(batch)?.into_array(batch.num_rows())?;
        mask.as_boolean_opt()
            .cloned()
            .ok_or_else(|| DataFusionError::Internal("a filter that is not boolean".into()))
    }

    fn output(&self, batch: &RecordBatch, schema: &SchemaRef) -> DFResult<RecordBatch> {
        let rows = batch.num_rows();
        let columns =
            self.outputs.iter().map(|e| e.evaluate(batch)?.into_array(rows)).collect::<DFResult<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(Arc::clone(schema), columns, &options)?)
    }
}

/// The filtered and projected batches of one file.
struct Folded {
    input: BoxStream<'static, DFResult<RecordBatch>>,
    plan: FilePlan,
    schema: SchemaRef,
    /// Gathers the rows that pass into full batches, as a filter above the scan would.
    coalescer: Option<BatchCoalescer>,
    done: bool,
}

impl Folded {
    fn step(&mut self, batch: RecordBatch) -> DFResult<Option<RecordBatch>> {
        match self.coalescer.as_mut() {
            None => self.plan.output(&batch, &self.schema).map(Some),
            Some(coalescer) => {
                let mask = self.plan.mask(&batch)?;
                coalescer.push_batch_with_filter(batch, &mask)?;
                Ok(None)
            }
        }
    }
}

impl Stream for Folded {
    type Item = DFResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(batch) = self.coalescer.as_mut().and_then(|c| c.next_completed_batch()) {
                return Poll::Ready(Some(self.plan.output(&batch, &self.schema)));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match ready!(self.input.poll_next_unpin(cx)) {
                None => {
                    self.done = true;
                    if let Some(Err(e)) = self.coalescer.as_mut().map(|c| c.finish_buffered_batch()) {
                        return Poll::Ready(Some(Err(e.into())));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(batch)) => match self.step(batch) {
                    Ok(None) => {}
                    Ok(Some(out)) => return Poll::Ready(Some(Ok(out))),
                    Err(e) => return Poll::Ready(Some(Err(e))),
                },
            }
        }
    }
}

/// A column's lower and upper bound in a file, when they bound every row: exact, the column
/// has no nulls there, and its type has no NaN.
fn bounds<'a>(stats: &'a Statistics, table: &Schema, c: usize) -> Option<(&'a ScalarValue, &'a ScalarValue)> {
    let s = stats.column_statistics.get(c)?;
    if table.field(c).data_type().is_floating() || s.null_count != Precision::Exact(0) {
        return None;
    }
    match (&s.min_value, &s.max_value) {
        (Precision::Exact(lo), Precision::Exact(hi)) if !lo.is_null() && !hi.is_null() => Some((lo, hi)),
        _ => None,
    }
}

/// A condition `column <op> literal` (or the other way round): the column, the operator as
/// if the column were on the left, and the literal.
fn comparison(e: &Arc<dyn PhysicalExpr>) -> Option<(usize, Operator, &ScalarValue)> {
    let b = e.as_any().downcast_ref::<BinaryExpr>()?;
    fn column(e: &Arc<dyn PhysicalExpr>) -> Option<usize> {
        e.as_any().downcast_ref::<Column>().map(|c| c.index())
    }
    fn literal(e: &Arc<dyn PhysicalExpr>) -> Option<&ScalarValue> {
        e.as_any().downcast_ref::<Literal>().map(|l| l.value())
    }
    let (c, op, v) = match (column(b.left()), literal(b.right())) {
        (Some(c), Some(v)) => (c, *b.op(), v),
        _ => (column(b.right())?, b.op().swap()?, literal(b.left())?),
    };
    let compares = matches!(
        op,
        Operator::Eq | Operator::NotEq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
    );
    (compares && !v.is_null()).then_some((c, op, v))
}

/// Whether `condition` holds for every row within the bounds (`Some(true)`), for none
/// (`Some(false)`), or may hold for some (`None`).
fn decided<'a>(
    condition: &Arc<dyn PhysicalExpr>,
    bounds: impl Fn(usize) -> Option<(&'a ScalarValue, &'a ScalarValue)>,
) -> Option<bool> {
    let (c, op, v) = comparison(condition)?;
    let (lo, hi) = bounds(c)?;
    let (lo, hi) = (lo.partial_cmp(v)?, hi.partial_cmp(v)?);
    use Ordering::{Equal, Greater, Less};
    let (all, none) = match op {
        Operator::Lt => (hi == Less, lo != Less),
        Operator::LtEq => (hi != Greater, lo == Greater),
        Operator::Gt => (lo == Greater, hi != Greater),
        Operator::GtEq => (lo != Less, hi == Less),
        Operator::Eq => (lo == Equal && hi == Equal, lo == Greater || hi == Less),
        Operator::NotEq => (lo == Greater || hi == Less, lo == Equal && hi == Equal),
        _ => return None,
    };
    if all {
        Some(true)
    } else if none {
        Some(false)
    } else {
        None
    }
}

/// `e`'s value over the file as a literal, when `e` reads one column, moves with it in one
/// direction, and has the same value at both of its bounds: then every row has that value.
fn constant<'a>(
    e: &Arc<dyn PhysicalExpr>,
    table: &Schema,
    bounds: impl Fn(usize) -> Option<(&'a ScalarValue, &'a ScalarValue)>,
) -> Option<Arc<dyn PhysicalExpr>> {
    let c = single_column(e, table)?;
    let (lo, hi) = bounds(c)?;
    let field = table.field(c).clone().with_nullable(true);
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![field])),
        vec![ScalarValue::iter_to_array([lo.clone(), hi.clone()]).ok()?],
    )
    .ok()?;
    // Arithmetic checked for overflow: the rows wrap on overflow, and a wrapped product could
    // take the same value at both bounds while rows between them differ. Without overflow at
    // the bounds there is none between them, as every step is monotonic.
    let at_zero = Arc::clone(e)
        .transform_up(|n| {
            let any = n.as_any();
            Ok(if let Some(col) = any.downcast_ref::<Column>() {
                Transformed::yes(Arc::new(Column::new(col.name(), 0)) as Arc<dyn PhysicalExpr>)
            } else if let Some(b) = any.downcast_ref::<BinaryExpr>() {
                let checked = BinaryExpr::new(Arc::clone(b.left()), *b.op(), Arc::clone(b.right()));
                Transformed::yes(Arc::new(checked.with_fail_on_overflow(true)) as Arc<dyn PhysicalExpr>)
            } else {
                Transformed::no(n)
            })
        })
        .ok()?
        .data;
    // An expression that fails at a bound (an overflow) is left to each row.
    let values = at_zero.evaluate(&batch).ok()?.into_array(2).ok()?;
    let (first, last) =
        (ScalarValue::try_from_array(&values, 0).ok()?, ScalarValue::try_from_array(&values, 1).ok()?);
    (!first.is_null() && first == last).then(|| Arc::new(Literal::new(first)) as Arc<dyn PhysicalExpr>)
}

/// The one column `e` reads, when `e` is more than that column and monotonic in it.
fn single_column(e: &Arc<dyn PhysicalExpr>, table: &Schema) -> Option<usize> {
    if e.as_any().is::<Column>() {
        return None;
    }
    let columns = collect_columns(e);
    let [c] = columns.iter().collect::<Vec<_>>()[..] else { return None };
    matches!(direction(e, table)?, Direction::Up | Direction::Down).then_some(c.index())
}

/// How an expression moves as its one column grows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Direction {
    Constant,
    Up,
    Down,
}

impl Direction {
    fn flip(self) -> Self {
        match self {
            Self::Up => Self::Down,
            Self::Down => Self::Up,
            Self::Constant => Self::Constant,
        }
    }

    fn plus(self, other: Self) -> Option<Self> {
        match (self, other) {
            (Self::Constant, d) | (d, Self::Constant) => Some(d),
            (a, b) if a == b => Some(a),
            _ => None,
        }
    }
}

/// The direction of `e`, for the expressions whose direction is known: arithmetic with
/// constants, order-preserving casts, and the functions that bucket time or round numbers.
fn direction(e: &Arc<dyn PhysicalExpr>, table: &Schema) -> Option<Direction> {
    let any = e.as_any();
    if any.is::<Column>() {
        return Some(Direction::Up);
    }
    if any.is::<Literal>() {
        return Some(Direction::Constant);
    }
    if let Some(b) = any.downcast_ref::<BinaryExpr>() {
        let (l, r) = (direction(b.left(), table)?, direction(b.right(), table)?);
        return match b.op() {
            Operator::Plus => l.plus(r),
            Operator::Minus => l.plus(r.flip()),
            Operator::Multiply | Operator::Divide => match (l, r) {
                (Direction::Constant, Direction::Constant) => Some(Direction::Constant),
                (d, Direction::Constant) => scaled(d, b.right()),
                (Direction::Constant, d) if *b.op() == Operator::Multiply => scaled(d, b.left()),
                _ => None,
            },
            _ => None,
        };
    }
    if let Some(n) = any.downcast_ref::<NegativeExpr>() {
        return direction(n.arg(), table).map(Direction::flip);
    }
    let cast = any
        .downcast_ref::<CastExpr>()
        .map(|c| (c.expr(), c.cast_type()))
        .or_else(|| any.downcast_ref::<TryCastExpr>().map(|c| (c.expr(), c.cast_type())));
    if let Some((inner, to)) = cast {
        let from = inner.data_type(table).ok()?;
        let instant =
            |t: &DataType| matches!(t, DataType::Timestamp(..) | DataType::Date32 | DataType::Date64);
        let keeps_order = from.is_numeric() && to.is_numeric() || instant(&from) && instant(to);
        return keeps_order.then(|| direction(inner, table)).flatten();
    }
    let f = any.downcast_ref::<ScalarFunctionExpr>()?;
    let args = f.args();
    // The argument that moves; every other one must be constant.
    let moving = match f.name() {
        "date_trunc" | "date_bin" => 1,
        "floor" | "ceil" | "trunc" | "round" => 0,
        "date_part" | "datepart" => {
            let part = args.first()?.as_any().downcast_ref::<Literal>()?.value().try_as_str()??;
            if !matches!(part.to_ascii_lowercase().as_str(), "epoch" | "year") {
                return None;
            }
            1
        }
        _ => return None,
    };
    for (i, a) in args.iter().enumerate() {
        if i != moving && direction(a, table)? != Direction::Constant {
            return None;
        }
    }
    direction(args.get(moving)?, table)
}

/// `d` multiplied or divided by the constant `by`: kept when it is positive, flipped when
/// negative.
fn scaled(d: Direction, by: &Arc<dyn PhysicalExpr>) -> Option<Direction> {
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    let v = ScalarValue::try_from_array(&by.evaluate(&one_row).ok()?.into_array(1).ok()?, 0).ok()?;
    match v.partial_cmp(&ScalarValue::new_zero(&v.data_type()).ok()?)? {
        Ordering::Greater => Some(d),
        Ordering::Less => Some(d.flip()),
        Ordering::Equal => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::{ColumnStatistics, DFSchema};
    use datafusion::prelude::SessionContext;

    /// ts (a timestamp), n (an integer), x (a float).
    fn table() -> Schema {
        Schema::new(vec![
            Field::new("ts", DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None), true),
            Field::new("n", DataType::Int64, true),
            Field::new("x", DataType::Float64, true),
        ])
    }

    fn expr(sql: &str) -> Arc<dyn PhysicalExpr> {
        let ctx = SessionContext::new();
        let schema = DFSchema::try_from(table()).unwrap();
        ctx.create_physical_expr(ctx.parse_sql_expr(sql, &schema).unwrap(), &schema).unwrap()
    }

    fn micros(ts: &str) -> ScalarValue {
        let t = chrono::NaiveDateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S").unwrap();
        ScalarValue::TimestampMicrosecond(Some(t.and_utc().timestamp_micros()), None)
    }

    /// A file's statistics: ts within [from, to], n within [lo, hi], x within [0, 1]; `nulls`
    /// in every column.
    fn file(from: &str, to: &str, lo: i64, hi: i64, nulls: usize) -> Statistics {
        let column = |min, max| ColumnStatistics {
            null_count: Precision::Exact(nulls),
            min_value: Precision::Exact(min),
            max_value: Precision::Exact(max),
            ..ColumnStatistics::new_unknown()
        };
        Statistics {
            num_rows: Precision::Exact(100),
            total_byte_size: Precision::Absent,
            column_statistics: vec![
                column(micros(from), micros(to)),
                column(ScalarValue::Int64(Some(lo)), ScalarValue::Int64(Some(hi))),
                column(ScalarValue::Float64(Some(0.0)), ScalarValue::Float64(Some(1.0))),
            ],
        }
    }

    /// `ts <op> <timestamp>`, as the server plans it (SQL here would compare nanoseconds).
    fn at(op: Operator, ts: &str) -> Arc<dyn PhysicalExpr> {
        let table = table();
        let column = datafusion::physical_expr::expressions::col("ts", &table).unwrap();
        datafusion::physical_expr::expressions::binary(column, op, Arc::new(Literal::new(micros(ts))), &table)
            .unwrap()
    }

    fn decide(condition: &str, stats: &Statistics) -> Option<bool> {
        decide_expr(&expr(condition), stats)
    }

    fn decide_expr(condition: &Arc<dyn PhysicalExpr>, stats: &Statistics) -> Option<bool> {
        let table = table();
        decided(condition, |c| bounds(stats, &table, c))
    }

    fn folded(e: &str, stats: &Statistics) -> Option<String> {
        let table = table();
        constant(&expr(e), &table, |c| bounds(stats, &table, c)).map(|l| l.to_string())
    }

    #[test]
    fn conditions_are_decided_by_the_bounds() {
        let day = file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 20, 0);
        // Inside the range, outside it, across its edge.
        assert_eq!(decide_expr(&at(Operator::GtEq, "2026-09-07 00:00:00"), &day), Some(true));
        assert_eq!(decide_expr(&at(Operator::Lt, "2026-09-08 00:00:00"), &day), Some(false));
        assert_eq!(decide_expr(&at(Operator::Lt, "2026-09-08 12:00:00"), &day), None);
        // Each operator at the edges of n's [10, 20], the literal on either side.
        let cases = [
            ("n < 21", Some(true)),
            ("n < 20", None),
            ("n < 10", Some(false)),
            ("n <= 20", Some(true)),
            ("n <= 9", Some(false)),
            ("n > 9", Some(true)),
            ("n > 20", Some(false)),
            ("n >= 10", Some(true)),
            ("n >= 21", Some(false)),
            ("n = 15", None),
            ("n = 30", Some(false)),
            ("n <> 30", Some(true)),
            ("n <> 15", None),
            ("21 > n", Some(true)),
            ("10 > n", Some(false)),
        ];
        for (condition, want) in cases {
            assert_eq!(decide(condition, &day), want, "{condition}");
        }
        let one = file("2026-09-08 00:00:00", "2026-09-08 00:00:00", 15, 15, 0);
        assert_eq!(decide("n = 15", &one), Some(true));
        assert_eq!(decide("n <> 15", &one), Some(false));
        // Not decided: a column with nulls (they fail every comparison), a float column (its
        // bounds leave NaN out), a condition that is not a comparison with a literal.
        assert_eq!(decide("n < 21", &file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 20, 1)), None);
        assert_eq!(decide("x < 2", &day), None);
        assert_eq!(decide("n + 1 < 100", &day), None);
        assert_eq!(decide("n < NULL", &day), None);
    }

    #[test]
    fn expressions_constant_over_the_bounds_become_literals() {
        let day = file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 19, 0);
        // A week and a day bucket of a day's file; retention's week number.
        let week = folded("date_trunc('week', ts)", &day).expect("folded");
        assert_eq!(week, micros("2026-09-07 00:00:00").to_string());
        assert!(folded("date_trunc('day', ts)", &day).is_some());
        let weeks = "CAST(floor((date_part('epoch', ts) - 1785715200) / 604800) AS BIGINT)";
        assert_eq!(folded(weeks, &day).as_deref(), Some("5"));
        // Integer arithmetic in either direction.
        assert_eq!(folded("n / 10", &day).as_deref(), Some("1"));
        assert_eq!(folded("(100 - n) / 100", &day).as_deref(), Some("0"));
        assert_eq!(folded("-n / 100", &day).as_deref(), Some("0"));
        // Not constant: the bounds give two values; an hour of a day's file.
        assert_eq!(folded("n / 5", &day), None);
        assert_eq!(folded("date_trunc('hour', ts)", &day), None);
        // Not monotonic, so equal values at the bounds prove nothing: the hour of day, n % 10.
        let span = file("2026-09-08 05:00:00", "2026-09-09 05:30:00", 10, 20, 0);
        assert_eq!(folded("date_part('hour', ts)", &span), None);
        assert_eq!(folded("n % 10", &span), None);
        assert_eq!(folded("100 / n", &span), None);
        // A product that wraps takes one value at both bounds (10 and 18 times 2^62) but not
        // between them.
        let wraps = file("2026-09-08 00:00:00", "2026-09-08 01:00:00", 10, 18, 0);
        assert_eq!(folded("n * 4611686018427387904", &wraps), None);
        assert_eq!(folded("n * 2 / 100", &wraps).as_deref(), Some("0"));
        // Not for a column with nulls or a float, nor for a bare column.
        assert_eq!(folded("n / 100", &file("2026-09-08 00:00:00", "2026-09-08 01:00:00", 10, 19, 3)), None);
        assert_eq!(folded("floor(x * 0.1)", &day), None);
        assert_eq!(folded("n", &file("2026-09-08 00:00:00", "2026-09-08 00:00:00", 15, 15, 0)), None);
    }

    #[test]
    fn a_file_plan_reads_only_what_is_left() {
        let table = table();
        let filter = datafusion::physical_expr::conjunction([
            at(Operator::GtEq, "2026-09-07 00:00:00"),
            at(Operator::Lt, "2026-10-26 00:00:00"),
            expr("n > 12"),
        ]);
        let outputs = [expr("date_trunc('week', ts)"), expr("x")];
        let day = file("2026-09-08 00:00:00", "2026-09-08 23:59:59", 10, 20, 0);
        let plan =
            FilePlan::new(Some(&day), Some(&filter), &outputs, &table).unwrap().expect("rows may pass");
        // The time range and the week fold: n (for its condition) and x are read, as 0 and 1.
        assert_eq!(plan.columns, vec![1, 2]);
        assert_eq!(plan.filter.as_ref().unwrap().to_string(), "n@0 > 12");
        assert_eq!(plan.outputs[1].to_string(), "x@1");
        assert!(plan.outputs[0].as_any().is::<Literal>());
        // Without statistics nothing folds.
        let plan = FilePlan::new(None, Some(&filter), &outputs, &table).unwrap().unwrap();
        assert_eq!(plan.columns, vec![0, 1, 2]);
        // A file outside the range is not read.
        let before = file("2026-09-01 00:00:00", "2026-09-01 23:59:59", 10, 20, 0);
        assert!(FilePlan::new(Some(&before), Some(&filter), &outputs, &table).unwrap().is_none());
        // Everything folds: no column is read.
        let plan = FilePlan::new(Some(&day), Some(&expr("n >= 10")), &outputs[..1], &table).unwrap().unwrap();
        assert!(plan.columns.is_empty() && plan.filter.is_none());
    }
}
