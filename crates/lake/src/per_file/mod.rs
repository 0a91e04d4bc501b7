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
//!
//! The rule and its planning are here; what a file's scan does is in `source`, and what its
//! bounds decide in `algebra`.

mod algebra;
mod conditions;
#[cfg(test)]
mod fixtures;
mod source;

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result as DFResult;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::projection::{ProjectionExpr, ProjectionExprs};
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::union::UnionExec;

pub use algebra::Wrapped;
use algebra::{comparison, single_column};
use source::FoldingSource;

/// Moves a filter and a projection over a Parquet scan into the scan, folded per file.
#[derive(Debug)]
pub struct FoldPerFile {
    wrapped: Wrapped,
}

impl FoldPerFile {
    /// `wrapped` sees through the session's wrappers of built-in functions, so a wrapped
    /// `date_trunc` folds as DataFusion's does.
    pub fn new(wrapped: Wrapped) -> Self {
        Self { wrapped }
    }
}

impl PhysicalOptimizerRule for FoldPerFile {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let batch_size = config.execution.batch_size;
        plan.transform_down(|node| {
            Ok(match folded(&node, self.wrapped, batch_size)? {
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
fn folded(
    node: &Arc<dyn ExecutionPlan>,
    wrapped: Wrapped,
    batch_size: usize,
) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    if let Some(p) = node.as_any().downcast_ref::<ProjectionExec>()
        && p.input().as_any().is::<UnionExec>()
    {
        let mut inputs = Vec::new();
        for input in p.input().children() {
            let projected: Arc<dyn ExecutionPlan> =
                Arc::new(ProjectionExec::try_new(p.expr().to_vec(), Arc::clone(input))?);
            match folded(&projected, wrapped, batch_size)? {
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
            || output.iter().any(|pe| single_column(&pe.expr, table, wrapped).is_some());
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
        wrapped,
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

/// What a folding scan adds to the Parquet scan it reads through: how it travels to a
/// distributed worker beside that scan (`travel`).
pub(crate) struct Folding {
    pub(crate) filter: Option<Arc<dyn PhysicalExpr>>,
    pub(crate) output: ProjectionExprs,
    /// Table column → its place in the Parquet scan's output.
    pub(crate) read: HashMap<usize, usize>,
}

/// `plan`, when it is a folding scan, as the Parquet scan under it and its folding.
pub(crate) fn unfold(plan: &Arc<dyn ExecutionPlan>) -> Option<(Arc<dyn ExecutionPlan>, Folding)> {
    let exec = plan.as_any().downcast_ref::<DataSourceExec>()?;
    let (config, folding) = exec.downcast_to_file_source::<FoldingSource>()?;
    let config = FileScanConfigBuilder::from(config.clone()).with_source(Arc::clone(&folding.inner)).build();
    let parts = Folding {
        filter: folding.filter.clone(),
        output: folding.output.clone(),
        read: folding.read.as_ref().clone(),
    };
    Some((DataSourceExec::from_data_source(config), parts))
}

/// The folding scan of `folding` over `scan`, a Parquet scan (as [`unfold`] splits one).
pub(crate) fn refold(
    scan: &Arc<dyn ExecutionPlan>,
    folding: Folding,
    wrapped: Wrapped,
) -> DFResult<Arc<dyn ExecutionPlan>> {
    let internal =
        |what: &str| datafusion::error::DataFusionError::Internal(format!("a folding scan {what}"));
    let exec =
        scan.as_any().downcast_ref::<DataSourceExec>().ok_or_else(|| internal("over no data source"))?;
    let (config, source) =
        exec.downcast_to_file_source::<ParquetSource>().ok_or_else(|| internal("over no Parquet scan"))?;
    let source = FoldingSource {
        inner: Arc::new(source.clone()),
        inner_schema: scan.schema(),
        read: Arc::new(folding.read),
        filter: folding.filter,
        output: folding.output,
        wrapped,
    };
    let config = FileScanConfigBuilder::from(config.clone()).with_source(Arc::new(source)).build();
    Ok(DataSourceExec::from_data_source(config))
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
