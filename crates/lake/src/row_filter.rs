//! Whether a scan filters rows while it decodes them (a Parquet row filter).
//!
//! A row filter decodes the filter's columns first and the other columns only for the rows
//! that match. For a needle (one person's events, a rare event) that is 1.5–2.5× faster at 30M
//! events; when most rows match it is slower (up to 1.6× on `trends`), because decoding every
//! column once and filtering afterwards costs less than decoding selectively. So skiff
//! measures: it evaluates the scan's filters on a sample of one planned file and uses a row
//! filter when few rows match and the strings it would skip are wide. Data files never change,
//! so the measurement is cached per file, filter and columns. Filters that arrive during
//! execution (top-k bounds, join keys) always go into the row filter (`DynamicRowFilters`).
//! The sample also measures each condition alone, and the row filter tests the one that keeps
//! the fewest rows first (`SelectiveFirst`); the shares travel in the scan's planned files.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray};
use arrow::compute::{cast, concat_batches};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::DFSchema;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::{FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::utils::{
    conjunction as conjunction_expr, split_conjunction as split_conjunction_expr,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::utils::reassign_expr_columns;
use datafusion::physical_expr::{conjunction, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use futures::TryStreamExt;
use iceberg::scan::FileScanTask;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::basic::Type as PhysicalType;

use super::cache::{Caches, Sample, Shares};
use super::reader::{CountingReader, PlannedFile, with_parquet_source};

/// A row filter pays when its filter keeps at most this share of the rows…
const SELECTIVE: f64 = 0.1;
/// …and the other columns read are at least this many times the filter's columns in bytes:
/// skipping narrow columns saves less than selective decoding costs (`utm_revenue`, whose
/// other columns are two small ones, measured 1.2× slower with a row filter).
const WIDER: f64 = 2.0;

/// Rows evaluated for the estimate: the first row group of the sampled file, up to this.
const SAMPLE_ROWS: usize = 65_536;

/// Whether the scan of `projected` columns with `filters` should filter rows while decoding,
/// judged on the planned file with the most rows, and the share each condition kept there.
/// Any failure (an unreadable sample, a filter that does not evaluate on it) means no row
/// filter and no shares: this only ever changes speed.
pub async fn pays(
    state: &dyn Session,
    schema: &SchemaRef,
    projected: &SchemaRef,
    filters: &[Expr],
    tasks: &[FileScanTask],
    caches: &Arc<Caches>,
    open: impl FnOnce(&FileScanTask) -> iceberg::Result<CountingReader>,
) -> (bool, Shares) {
    let none = || (false, Shares::from([]));
    let Some(predicate) = conjunction_expr(filters.iter().cloned()) else {
        return none();
    };
    let Some(file) = tasks.iter().max_by_key(|t| t.record_count.unwrap_or(0)) else {
        return none();
    };
    let names: Vec<&str> = projected.fields().iter().map(|f| f.name().as_str()).collect();
    let key = (file.data_file_path.clone(), predicate.clone(), names.iter().map(|n| n.to_string()).collect());
    let sample = match caches.selectivity(&key).await {
        Some(s) => s,
        None => match measure(state, schema, &names, &predicate, open(file)).await {
            Ok(s) => {
                caches.put_selectivity(key, s.clone()).await;
                s
            }
            Err(e) => {
                tracing::debug!(error = %e, "no selectivity sample; reading without a row filter");
                return none();
            }
        },
    };
    tracing::debug!(?sample, %predicate, "row filter sample");
    (sample.share <= SELECTIVE && sample.width >= WIDER, sample.conditions)
}

/// Evaluates `predicate` on the sample file's first rows, and weighs its columns.
async fn measure(
    state: &dyn Session,
    schema: &SchemaRef,
    projected: &[&str],
    predicate: &Expr,
    reader: iceberg::Result<CountingReader>,
) -> DFResult<Sample> {
    let reader = reader.map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut names: Vec<String> = predicate.column_refs().iter().map(|c| c.name.clone()).collect();
    names.sort_by_key(|n| schema.index_of(n).unwrap_or(usize::MAX));
    names.dedup();
    let fields = names.iter().map(|n| Ok(schema.field_with_name(n)?.clone()));
    let columns = Arc::new(Schema::new(fields.collect::<DFResult<Vec<_>>>()?));
    let evaluate = state.create_physical_expr(predicate.clone(), &DFSchema::try_from(columns.clone())?)?;

    let builder = ParquetRecordBatchStreamBuilder::new(reader).await?;
    let Some(group) = builder.metadata().row_groups().first() else {
        return Ok(Sample::whole(0.0));
    };
    // Only the other columns of variable width count as skipped. Without a page index every
    // page of a skipped column is still read and decompressed; what skipping saves is the
    // decoding, which for a fixed-width value is a copy costing about what skipping it does.
    // TPC-H q06 (2% of rows kept, the other column a decimal) took 111 ms with a row filter
    // and 80 without; q15 90 and 71 (docs/performance.md).
    let (mut filter_bytes, mut other_bytes) = (0, 0);
    for c in group.columns() {
        let name = c.column_path().string();
        if names.contains(&name) {
            filter_bytes += c.uncompressed_size();
        } else if projected.contains(&name.as_str()) && c.column_type() == PhysicalType::BYTE_ARRAY {
            other_bytes += c.uncompressed_size();
        }
    }
    let width = other_bytes as f64 / filter_bytes.max(1) as f64;
    let leaves: Vec<usize> = names
        .iter()
        .map(|n| {
            let leaf = builder.parquet_schema().columns().iter().position(|c| c.path().string() == *n);
            leaf.ok_or_else(|| DataFusionError::Plan(format!("no column {n} in the file")))
        })
        .collect::<DFResult<_>>()?;
    let mask = ProjectionMask::leaves(builder.parquet_schema(), leaves);
    let stream = builder.with_projection(mask).with_row_groups(vec![0]).with_limit(SAMPLE_ROWS).build()?;
    let batches: Vec<RecordBatch> = stream.try_collect().await?;
    let Some(first) = batches.first() else {
        return Ok(Sample::whole(width));
    };
    let read = concat_batches(&first.schema(), &batches)?;
    // The file's columns in the table's types (the file may store an older or narrower type).
    let arrays = columns
        .fields()
        .iter()
        .map(|f| Ok(cast(read.column_by_name(f.name()).expect("projected"), f.data_type())?))
        .collect::<DFResult<Vec<_>>>()?;
    let batch = RecordBatch::try_new(columns, arrays)?;
    if batch.num_rows() == 0 {
        return Ok(Sample::whole(width));
    }
    let share = |e: &Arc<dyn PhysicalExpr>| -> DFResult<f64> {
        let kept = e.evaluate(&batch)?.into_array(batch.num_rows())?;
        let kept = kept
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or_else(|| DataFusionError::Plan("a filter that is not boolean".into()))?;
        Ok(kept.true_count() as f64 / batch.num_rows() as f64)
    };
    let table = DFSchema::try_from(schema.as_ref().clone())?;
    let sampled = DFSchema::try_from(batch.schema())?;
    // Each condition alone, as well as it can be measured: a condition that cannot only goes
    // unordered, and the filter as a whole still decides.
    let conditions = split_conjunction_expr(predicate)
        .into_iter()
        .filter_map(|c| {
            let over_table = state.create_physical_expr(c.clone(), &table).ok()?;
            Some((over_table, share(&state.create_physical_expr(c.clone(), &sampled).ok()?).ok()?))
        })
        .collect::<Vec<_>>();
    Ok(Sample { share: share(&evaluate)?, width, conditions: conditions.into() })
}

/// A row filter evaluates its conditions one after another, each on the rows the previous
/// ones kept. DataFusion orders them by the bytes of their columns; skiff orders them by the
/// share of the sampled rows each keeps, fewest first, when the scan measured them. In
/// `breakdown` (`project_id = 'proj_alpha' AND event = 'purchase'`, a third and 2% of the
/// rows) testing the event first made the query 1.6× faster: the project is then decoded for
/// 2% of the rows instead of the event for a third. Conditions never measured (a dynamic
/// filter) come after those that were, in their order. The shares come with the scan: its
/// planned files carry what its sample measured ([`PlannedFile`]), so one query's order
/// depends on its own tables' data only.
#[derive(Debug, Default)]
pub struct SelectiveFirst;

impl PhysicalOptimizerRule for SelectiveFirst {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(shares) = PlannedFile::shares_of(&node) else {
                return Ok(Transformed::no(node));
            };
            let ordered = with_parquet_source(&node, |source| {
                let options = &source.table_parquet_options().global;
                if !options.pushdown_filters || !options.reorder_filters {
                    return None;
                }
                let share = |c: &Arc<dyn PhysicalExpr>| shares.iter().find(|(e, _)| e == c).map(|(_, s)| *s);
                let ordered = selective_first(&source.filter()?, share)?;
                Some(source.with_predicate(ordered).with_reorder_filters(false))
            });
            Ok(match ordered {
                Some(scan) => Transformed::yes(scan),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "selective_first"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `predicate`'s conditions ordered by the share each keeps, fewest first (unknown ones last,
/// ties in their order); `None` when fewer than two conditions or none with a known share.
fn selective_first(
    predicate: &Arc<dyn PhysicalExpr>,
    share: impl Fn(&Arc<dyn PhysicalExpr>) -> Option<f64>,
) -> Option<Arc<dyn PhysicalExpr>> {
    let conditions = split_conjunction(predicate);
    let mut ranked: Vec<(f64, usize, Arc<dyn PhysicalExpr>)> = conditions
        .iter()
        .enumerate()
        .map(|(i, c)| (share(c).unwrap_or(f64::INFINITY), i, Arc::clone(c)))
        .collect();
    if ranked.len() < 2 || ranked.iter().all(|r| r.0.is_infinite()) {
        return None;
    }
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    Some(conjunction(ranked.into_iter().map(|r| r.2)))
}

/// Filters that arrive while the query runs (a top-k's current bound, a hash join's build-side
/// keys) are selective by design: a scan that has one filters rows while decoding. The filter
/// above such a scan is folded into it when the scan already applies every one of its
/// conditions: a `FilterExec` gathers rows into full batches, which would hold back the rows
/// a top-k needs to tighten its bound (the event listing read 140× more rows with it).
#[derive(Debug, Default)]
pub struct DynamicRowFilters;

impl PhysicalOptimizerRule for DynamicRowFilters {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            if let Some(filter) = node.as_any().downcast_ref::<FilterExec>()
                && filter.fetch().is_none()
                && let Some(scan) = with_row_filter(filter.input())
                && let Some(folded) = fold(filter, scan.clone())?
            {
                return Ok(Transformed::yes(folded));
            }
            Ok(match with_row_filter(&node) {
                Some(scan) => Transformed::yes(scan),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "dynamic_row_filters"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `source`'s predicate holds a dynamic filter (one a join or a top-k above it fills).
fn takes_dynamic_filter(source: &ParquetSource) -> bool {
    let predicate = source.filter();
    predicate.is_some_and(|p| p.exists(|e| Ok(e.as_any().is::<DynamicFilterPhysicalExpr>())).unwrap_or(false))
}

/// Whether `plan` is a Parquet scan whose predicate holds a dynamic filter.
pub fn scan_takes_dynamic_filter(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let exec = plan.as_any().downcast_ref::<DataSourceExec>();
    exec.and_then(|e| e.downcast_to_file_source::<ParquetSource>())
        .is_some_and(|(_, s)| takes_dynamic_filter(s))
}

/// `plan` with its row filter on, if it is a Parquet scan with a dynamic filter and without one.
fn with_row_filter(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    with_parquet_source(plan, |source| {
        if !takes_dynamic_filter(source) || source.table_parquet_options().global.pushdown_filters {
            return None;
        }
        Some(source.clone().with_pushdown_filters(true).with_reorder_filters(true))
    })
}

/// `filter` folded into `scan` (which has its row filter on), when the scan's predicate holds
/// each of the filter's conditions already: DataFusion put them there when it offered them to
/// the scan, for pruning. Otherwise `None`, and the filter stays.
fn fold(filter: &FilterExec, scan: Arc<dyn ExecutionPlan>) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
    let exec = scan.as_any().downcast_ref::<DataSourceExec>().expect("a scan");
    let (_, source) = exec.downcast_to_file_source::<ParquetSource>().expect("a Parquet scan");
    let table = source.table_schema().table_schema();
    let Some(predicate) = source.filter() else {
        return Ok(None);
    };
    let held = split_conjunction(&predicate);
    for condition in split_conjunction(filter.predicate()) {
        let Ok(condition) = reassign_expr_columns(condition.clone(), table) else {
            return Ok(None);
        };
        if !held.contains(&&condition) {
            return Ok(None);
        }
    }
    let input = scan.schema();
    let Some(columns) = filter.projection() else {
        return Ok(Some(scan));
    };
    let exprs = columns.iter().map(|&i| {
        let name = input.field(i).name();
        (Arc::new(Column::new(name, i)) as Arc<dyn PhysicalExpr>, name.clone())
    });
    Ok(Some(Arc::new(ProjectionExec::try_new(exprs, scan)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};
    use datafusion::logical_expr::Operator;
    use datafusion::physical_plan::expressions::{binary, col, lit};

    #[test]
    fn conditions_go_fewest_rows_first() {
        let schema = Schema::new(vec![
            Field::new("project", DataType::Utf8, true),
            Field::new("event", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]);
        let eq = |c: &str, v: &str| binary(col(c, &schema).unwrap(), Operator::Eq, lit(v), &schema).unwrap();
        let (project, event) = (eq("project", "alpha"), eq("event", "purchase"));
        let n = binary(col("n", &schema).unwrap(), Operator::Gt, lit(1i64), &schema).unwrap();
        let predicate = conjunction([project.clone(), n.clone(), event.clone()]);
        // Measured on an equal condition built anew: matched by structure, not by identity.
        let shares: Shares = [(eq("project", "alpha"), 0.33), (eq("event", "purchase"), 0.02)].into();
        let share = |c: &Arc<dyn PhysicalExpr>| shares.iter().find(|(e, _)| e == c).map(|(_, s)| *s);
        let ordered = selective_first(&predicate, share).expect("reordered");
        // The measured ones by share, then the unmeasured one.
        assert_eq!(split_conjunction(&ordered), [&event, &project, &n]);
        // Equal shares keep their order.
        let ordered = selective_first(&predicate, |c| (c != &n).then_some(0.5)).unwrap();
        assert_eq!(split_conjunction(&ordered), [&project, &event, &n]);
        // A condition that differs only in a literal's value is not the measured one.
        let other = conjunction([eq("project", "beta"), eq("event", "purchase")]);
        assert_eq!(split_conjunction(&selective_first(&other, share).unwrap())[0], &eq("event", "purchase"));
        // Nothing measured, or a single condition: left to DataFusion.
        assert!(selective_first(&predicate, |_| None).is_none());
        assert!(selective_first(&event, |_| Some(0.1)).is_none());
    }
}
