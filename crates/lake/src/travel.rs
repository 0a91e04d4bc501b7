//! skiff's Parquet scan as it travels to a distributed worker.
//!
//! DataFusion's plan codec writes a Parquet scan as DataFusion's own, which loses what makes it
//! skiff's: the reader factory that opens each file through the table's Iceberg `FileIO` (with
//! the catalog's credentials, the data cache and local positioned reads), and each file's real
//! location, kept in its `PartitionedFile` extensions. So before a distributed plan is sent,
//! every such scan is wrapped in a [`LakeScanExec`], which [`LakeCodec`] writes as the scan
//! DataFusion's codec writes plus what it loses, and reads back on the worker into the same
//! scan over the worker's own caches. A scan that folds per file (`per_file`) travels as the
//! Parquet scan under it plus its folding.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::Schema;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::projection::{ProjectionExpr, ProjectionExprs};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_proto::physical_plan::from_proto::parse_physical_expr;
use datafusion_proto::physical_plan::to_proto::serialize_physical_expr;
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::{PhysicalExprNode, PhysicalPlanNode, ProjectionExpr as ProjectionExprNode};
use iceberg::io::{FileIO, FileIOBuilder};
use prost::Message;

use crate::cache::Caches;
use crate::catalog::storage_factory;
use crate::per_file::{self, Wrapped};
use crate::reader::{FileIoReaderFactory, PlannedFile};
use crate::stats::QueryStats;

/// A skiff Parquet scan that can be sent to a worker; runs as the scan it wraps.
pub struct LakeScanExec {
    scan: Arc<dyn ExecutionPlan>,
    file_io: FileIO,
    /// What the scan read, when it was read back on a worker: the query's `QueryStats` is
    /// the coordinator's, so a worker's reads go back to it as this node's metrics, which
    /// `datafusion-distributed` sends when the task ends.
    reads: Option<Arc<QueryStats>>,
}

// Without the `FileIO`, as `reader.rs`'s types.
impl fmt::Debug for LakeScanExec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("LakeScanExec").field("scan", &self.scan).finish_non_exhaustive()
    }
}

impl LakeScanExec {
    /// `plan` with every skiff Parquet scan in it wrapped, so that it can travel.
    pub fn wrap_scans(plan: Arc<dyn ExecutionPlan>) -> DFResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if node.as_any().is::<LakeScanExec>() {
                return Ok(Transformed::no(node));
            }
            let parquet = per_file::unfold(&node).map_or_else(|| Arc::clone(&node), |(scan, _)| scan);
            Ok(match PlannedFile::file_io_of(&parquet) {
                Some(file_io) => {
                    Transformed::yes(Arc::new(LakeScanExec { scan: node, file_io, reads: None }))
                }
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }
}

// With the scan it wraps, which is not a child: EXPLAIN shows what a worker reads.
impl DisplayAs for LakeScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("LakeScanExec: ")?;
        self.scan.fmt_as(t, f)
    }
}

impl ExecutionPlan for LakeScanExec {
    fn name(&self) -> &str {
        "LakeScanExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.scan.properties()
    }

    // The scan inside is not a child: DataFusion's codec must not write it on its own.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal("LakeScanExec has no children".into()))
        }
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> DFResult<SendableRecordBatchStream> {
        self.scan.execute(partition, context)
    }

    fn partition_statistics(&self, partition: Option<usize>) -> DFResult<datafusion::common::Statistics> {
        self.scan.partition_statistics(partition)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.reads.as_ref().map(|r| r.reads_as_metrics())
    }
}

/// What a [`LakeScanExec`] travels as.
#[derive(Clone, PartialEq, Message)]
struct LakeScanProto {
    /// The scan as DataFusion's codec writes it.
    #[prost(bytes = "vec", tag = "1")]
    scan: Vec<u8>,
    /// Each file's Iceberg location, in the order of the scan's file groups.
    #[prost(string, repeated, tag = "2")]
    locations: Vec<String>,
    /// The table's `FileIO` properties (the storage credentials among them).
    #[prost(map = "string, string", tag = "3")]
    storage: HashMap<String, String>,
    /// What a folding scan adds to the Parquet scan, when it is one.
    #[prost(message, optional, tag = "4")]
    folding: Option<FoldingProto>,
}

/// A [`per_file::Folding`]; its expressions are over the table's columns.
#[derive(Clone, PartialEq, Message)]
struct FoldingProto {
    #[prost(message, optional, tag = "1")]
    filter: Option<PhysicalExprNode>,
    #[prost(message, repeated, tag = "2")]
    output: Vec<ProjectionExprNode>,
    #[prost(map = "uint32, uint32", tag = "3")]
    read: HashMap<u32, u32>,
}

/// Writes and reads [`LakeScanExec`]s. The scan's predicate may hold expressions only the
/// engine knows, which `exprs` writes and reads.
#[derive(Debug)]
pub struct LakeCodec {
    caches: Arc<Caches>,
    exprs: Arc<dyn PhysicalExtensionCodec>,
    wrapped: Wrapped,
}

impl LakeCodec {
    /// Reads scans through `caches` (the worker's own); folding scans see through the
    /// functions `wrapped` says, as `FoldPerFile` does.
    pub fn new(caches: Arc<Caches>, exprs: Arc<dyn PhysicalExtensionCodec>, wrapped: Wrapped) -> Self {
        Self { caches, exprs, wrapped }
    }

    fn write_folding(&self, folding: per_file::Folding) -> DFResult<FoldingProto> {
        let expr = |e: &Arc<dyn PhysicalExpr>| serialize_physical_expr(e, self.exprs.as_ref());
        Ok(FoldingProto {
            filter: folding.filter.as_ref().map(expr).transpose()?,
            output: folding
                .output
                .iter()
                .map(|p| Ok(ProjectionExprNode { alias: p.alias.clone(), expr: Some(expr(&p.expr)?) }))
                .collect::<DFResult<_>>()?,
            read: folding.read.into_iter().map(|(c, at)| (c as u32, at as u32)).collect(),
        })
    }

    fn read_folding(
        &self,
        proto: FoldingProto,
        table: &Schema,
        ctx: &TaskContext,
    ) -> DFResult<per_file::Folding> {
        let expr = |e: &PhysicalExprNode| parse_physical_expr(e, ctx, table, self.exprs.as_ref());
        let output = proto
            .output
            .iter()
            .map(|p| {
                let e = p
                    .expr
                    .as_ref()
                    .ok_or_else(|| DataFusionError::Internal("a projection without its expression".into()))?;
                Ok(ProjectionExpr::new(expr(e)?, p.alias.clone()))
            })
            .collect::<DFResult<Vec<_>>>()?;
        Ok(per_file::Folding {
            filter: proto.filter.as_ref().map(expr).transpose()?,
            output: ProjectionExprs::new(output),
            read: proto.read.into_iter().map(|(c, at)| (c as usize, at as usize)).collect(),
        })
    }
}

impl PhysicalExtensionCodec for LakeCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        _inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let proto =
            LakeScanProto::decode(buf).map_err(|e| DataFusionError::Internal(format!("a lake scan: {e}")))?;
        let node = PhysicalPlanNode::decode(proto.scan.as_slice())
            .map_err(|e| DataFusionError::Internal(format!("a lake scan's plan: {e}")))?;
        let scan = node.try_into_physical_plan(ctx, self.exprs.as_ref())?;
        let file_io = FileIOBuilder::new(storage_factory()).with_props(proto.storage).build();
        let reads = Arc::new(QueryStats::default());
        let factory = Arc::new(FileIoReaderFactory {
            file_io: file_io.clone(),
            stats: Arc::clone(&reads),
            caches: Arc::clone(&self.caches),
        });
        let exec = scan
            .as_any()
            .downcast_ref::<DataSourceExec>()
            .ok_or_else(|| DataFusionError::Internal("a lake scan that is not a data source".into()))?;
        let (config, source) = exec
            .downcast_to_file_source::<ParquetSource>()
            .ok_or_else(|| DataFusionError::Internal("a lake scan that is not a Parquet scan".into()))?;
        let mut locations = proto.locations.into_iter();
        let no_shares: crate::cache::Shares = Arc::new([]);
        let mut groups = Vec::with_capacity(config.file_groups.len());
        for group in &config.file_groups {
            let files = group
                .iter()
                .map(|f| {
                    let location = locations.next().ok_or_else(|| {
                        DataFusionError::Internal("a lake scan with fewer locations than files".into())
                    })?;
                    let mut f: PartitionedFile = f.clone();
                    f.extensions = Some(Arc::new(PlannedFile {
                        location,
                        shares: Arc::clone(&no_shares),
                        file_io: file_io.clone(),
                    }));
                    Ok(f)
                })
                .collect::<DFResult<Vec<_>>>()?;
            groups.push(FileGroup::new(files));
        }
        let source = source.clone().with_parquet_file_reader_factory(factory);
        let table = Arc::clone(source.table_schema().table_schema());
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .with_file_groups(groups)
            .build();
        let mut scan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
        if let Some(folding) = proto.folding {
            scan = per_file::refold(&scan, self.read_folding(folding, &table, ctx)?, self.wrapped)?;
        }
        Ok(Arc::new(LakeScanExec { scan, file_io, reads: Some(reads) }))
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DFResult<()> {
        let Some(lake) = node.as_any().downcast_ref::<LakeScanExec>() else {
            return Err(DataFusionError::NotImplemented(format!("{} is not a lake scan", node.name())));
        };
        let (scan, folding) = match per_file::unfold(&lake.scan) {
            Some((scan, folding)) => (scan, Some(self.write_folding(folding)?)),
            None => (Arc::clone(&lake.scan), None),
        };
        let exec = scan.as_any().downcast_ref::<DataSourceExec>();
        let (config, _) = exec
            .and_then(|e| e.downcast_to_file_source::<ParquetSource>())
            .ok_or_else(|| DataFusionError::Internal("a lake scan that is not a Parquet scan".into()))?;
        let locations = config
            .file_groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|f| {
                f.extensions
                    .as_ref()
                    .and_then(|e| e.downcast_ref::<PlannedFile>())
                    .map(|p| p.location.clone())
                    .ok_or_else(|| DataFusionError::Internal("a planned file without its location".into()))
            })
            .collect::<DFResult<Vec<_>>>()?;
        let scan = PhysicalPlanNode::try_from_physical_plan(scan, self.exprs.as_ref())?;
        let proto = LakeScanProto {
            scan: scan.encode_to_vec(),
            locations,
            storage: lake.file_io.config().props().clone(),
            folding,
        };
        proto.encode(buf).map_err(|e| DataFusionError::Internal(format!("a lake scan: {e}")))
    }
}
