//! The scan `FoldPerFile` puts in place: a Parquet scan that plans each file on its own
//! bounds, reads the columns left undecided, and filters and projects what it reads.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::compute::BatchCoalescer;
use arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::Statistics;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileOpenFuture, FileOpener, FileScanConfig, FileSource};
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::object_store::ObjectStore;
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_plan::DisplayFormatType;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};

use super::algebra::{Wrapped, bounds, constant, decided};
use super::conditions::{Conditions, columns_read, renumbered};

/// A Parquet scan that also filters and projects, folding both per file (see the module).
#[derive(Clone)]
pub(super) struct FoldingSource {
    /// The scan it reads through, narrowed per file; its predicate still prunes row groups
    /// and pages.
    pub(super) inner: Arc<dyn FileSource>,
    pub(super) inner_schema: SchemaRef,
    /// Table column → its place in `inner`'s output.
    pub(super) read: Arc<HashMap<usize, usize>>,
    pub(super) filter: Option<Arc<dyn PhysicalExpr>>,
    pub(super) output: ProjectionExprs,
    /// What the session's wrappers of built-in functions wrap, for the algebra.
    pub(super) wrapped: Wrapped,
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
        let Some(plan) = FilePlan::new(
            file.statistics.as_deref(),
            self.source.filter.as_ref(),
            &outputs,
            &self.table,
            self.source.wrapped,
        )?
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
    filter: Option<Conditions>,
    outputs: Vec<Arc<dyn PhysicalExpr>>,
}

impl FilePlan {
    /// `None` when the bounds prove no row passes the filter.
    fn new(
        stats: Option<&Statistics>,
        filter: Option<&Arc<dyn PhysicalExpr>>,
        outputs: &[Arc<dyn PhysicalExpr>],
        table: &Schema,
        wrapped: Wrapped,
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
        let outputs: Vec<Arc<dyn PhysicalExpr>> = outputs
            .iter()
            .map(|e| constant(e, table, wrapped, bounds).unwrap_or_else(|| Arc::clone(e)))
            .collect();
        let columns = columns_read(kept.iter().chain(&outputs));
        let to_read = |e| renumbered(e, &columns);
        let outputs = outputs.into_iter().map(to_read).collect::<DFResult<_>>()?;
        let read_fields: Vec<Field> = columns.iter().map(|&c| table.field(c).clone()).collect();
        let filter = match kept.is_empty() {
            true => None,
            false => {
                Some(Conditions::new(kept.into_iter().map(to_read).collect::<DFResult<_>>()?, &read_fields)?)
            }
        };
        Ok(Some(Self { columns, read_fields, filter, outputs }))
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
                let mask = self.plan.filter.as_ref().expect("a filter").mask(&batch)?;
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

#[cfg(test)]
mod tests {
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::Literal;

    use super::super::fixtures::{at, expr, file, no_wrappers, table};
    use super::*;

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
        let plan = FilePlan::new(Some(&day), Some(&filter), &outputs, &table, no_wrappers)
            .unwrap()
            .expect("rows may pass");
        // The time range and the week fold: n (for its condition) and x are read, as 0 and 1.
        assert_eq!(plan.columns, vec![1, 2]);
        assert_eq!(plan.filter.as_ref().unwrap().to_string(), "n@0 > 12");
        assert_eq!(plan.outputs[1].to_string(), "x@1");
        assert!(plan.outputs[0].as_any().is::<Literal>());
        // Without statistics nothing folds.
        let plan = FilePlan::new(None, Some(&filter), &outputs, &table, no_wrappers).unwrap().unwrap();
        assert_eq!(plan.columns, vec![0, 1, 2]);
        // A file outside the range is not read.
        let before = file("2026-09-01 00:00:00", "2026-09-01 23:59:59", 10, 20, 0);
        assert!(
            FilePlan::new(Some(&before), Some(&filter), &outputs, &table, no_wrappers).unwrap().is_none()
        );
        // Everything folds: no column is read.
        let plan = FilePlan::new(Some(&day), Some(&expr("n >= 10")), &outputs[..1], &table, no_wrappers)
            .unwrap()
            .unwrap();
        assert!(plan.columns.is_empty() && plan.filter.is_none());
    }
}
