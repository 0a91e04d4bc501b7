//! skiff's Parquet scan as it travels to a distributed worker.
//!
//! DataFusion's plan codec writes a Parquet scan as DataFusion's own, which loses what makes it
//! skiff's: the reader factory that opens each file through the table's Iceberg `FileIO` (with
//! the catalog's credentials, the data cache and local positioned reads), and each file's real
//! location, kept in its `PartitionedFile` extensions. So before a distributed plan is sent,
//! every such scan is wrapped in a [`LakeScanExec`], which [`LakeCodec`] writes as the scan
//! DataFusion's codec writes plus what it loses, and reads back on the worker into the same
//! scan over the worker's own caches.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use datafusion_proto::physical_plan::{AsExecutionPlan, PhysicalExtensionCodec};
use datafusion_proto::protobuf::PhysicalPlanNode;
use iceberg::io::{FileIO, FileIOBuilder};
use prost::Message;

use crate::cache::Caches;
use crate::catalog::storage_factory;
use crate::reader::{FileIoReaderFactory, PlannedFile};
use crate::stats::QueryStats;

/// A skiff Parquet scan that can be sent to a worker; runs as the scan it wraps.
pub struct LakeScanExec {
    scan: Arc<dyn ExecutionPlan>,
    file_io: FileIO,
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
            Ok(match PlannedFile::file_io_of(&node) {
                Some(file_io) => Transformed::yes(Arc::new(LakeScanExec { scan: node, file_io })),
                None => Transformed::no(node),
            })
        })
        .map(|t| t.data)
    }
}

impl DisplayAs for LakeScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("LakeScanExec")
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
}

/// Writes and reads [`LakeScanExec`]s. The scan's predicate may hold expressions only the
/// engine knows, which `exprs` writes and reads.
#[derive(Debug)]
pub struct LakeCodec {
    caches: Arc<Caches>,
    exprs: Arc<dyn PhysicalExtensionCodec>,
}

impl LakeCodec {
    /// Reads scans through `caches` (the worker's own).
    pub fn new(caches: Arc<Caches>, exprs: Arc<dyn PhysicalExtensionCodec>) -> Self {
        Self { caches, exprs }
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
        let factory = Arc::new(FileIoReaderFactory {
            file_io: file_io.clone(),
            stats: ctx.session_config().get_extension::<QueryStats>().unwrap_or_default(),
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
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .with_file_groups(groups)
            .build();
        Ok(Arc::new(LakeScanExec { scan: DataSourceExec::from_data_source(config), file_io }))
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DFResult<()> {
        let Some(lake) = node.as_any().downcast_ref::<LakeScanExec>() else {
            return Err(DataFusionError::NotImplemented(format!("{} is not a lake scan", node.name())));
        };
        let exec = lake.scan.as_any().downcast_ref::<DataSourceExec>();
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
        let scan = PhysicalPlanNode::try_from_physical_plan(Arc::clone(&lake.scan), self.exprs.as_ref())?;
        let proto = LakeScanProto {
            scan: scan.encode_to_vec(),
            locations,
            storage: lake.file_io.config().props().clone(),
        };
        proto.encode(buf).map_err(|e| DataFusionError::Internal(format!("a lake scan: {e}")))
    }
}
