//! A hash join counts its build side batch by batch with `get_record_batch_memory_size`, which
//! counts the whole allocation behind every buffer a batch points into. A grouping emits its
//! groups as one array sliced into batches, so every slice is counted as the whole array: at
//! 30M events, on one partition (a fraction of a vCPU), the Worker's retention query (`SELECT
//! DISTINCT device_id, week …` joined to its own grouping) was refused with "2.3 GB already
//! allocated for HashJoinInput" for a build side of a few tens of MB, with or without skiff's
//! rules. Each build-side batch counted at more than twice what its rows use is copied into
//! buffers of its own first (the copy is of what the rows use, and is what the join keeps).
//! Upstream: `get_record_batch_memory_size` in `datafusion/common/src/utils/memory.rs`, used by
//! `collect_left_input` in `datafusion/physical-plan/src/joins/hash_join/exec.rs`; no issue
//! filed yet.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::utils::memory::get_record_batch_memory_size;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use crate::memory::compact_views;

/// Puts a [`OwnBuffers`] under every hash join's build side (its first child). Runs once the
/// joins' sides are chosen.
#[derive(Debug, Default)]
pub struct CompactJoinBuilds;

impl PhysicalOptimizerRule for CompactJoinBuilds {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !node.as_any().is::<HashJoinExec>() {
                return Ok(Transformed::no(node));
            }
            let mut children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
            if children[0].as_any().is::<OwnBuffers>() {
                return Ok(Transformed::no(node));
            }
            children[0] = OwnBuffers::over(children[0].clone());
            Ok(Transformed::yes(node.with_new_children(children)?))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "compact_join_builds"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// A batch whose buffers are counted at more than twice what its rows use, copied.
pub fn own_buffers(batch: RecordBatch) -> Result<RecordBatch> {
    let batch = compact_views(batch)?;
    let counted = get_record_batch_memory_size(&batch);
    let used = batch
        .columns()
        .iter()
        .try_fold(0usize, |sum, c| c.to_data().get_slice_memory_size().map(|n| sum + n));
    match used {
        Ok(used) if counted > 2 * used + (64 << 10) => {
            let rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
            Ok(take_record_batch(&batch, &rows)?)
        }
        _ => Ok(batch),
    }
}

/// Passes its input's batches on, each with buffers of its own when it shared them.
#[derive(Debug)]
pub struct OwnBuffers {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl OwnBuffers {
    fn over(input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let properties = Arc::new(PlanProperties::clone(input.properties()));
        Arc::new(Self { input, properties })
    }
}

impl DisplayAs for OwnBuffers {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OwnBuffers")
    }
}

impl ExecutionPlan for OwnBuffers {
    fn name(&self) -> &str {
        "OwnBuffers"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.len() {
            1 => Ok(OwnBuffers::over(children.swap_remove(0))),
            _ => Err(DataFusionError::Internal("OwnBuffers has one child".into())),
        }
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let stream = self.input.execute(partition, ctx)?;
        let schema = stream.schema();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream.map(|b| b.and_then(own_buffers)))))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::{answer, session_on};

    #[test]
    fn a_slice_of_a_large_array_gets_its_own_buffers() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let whole =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..1_000_000))]).unwrap();
        let slice = whole.slice(10, 8192);
        assert!(get_record_batch_memory_size(&slice) >= 8_000_000);
        let own = own_buffers(slice.clone()).unwrap();
        assert_eq!(own, slice);
        assert!(get_record_batch_memory_size(&own) < 100_000);
        // A batch that is its own stays as it is.
        let small = own_buffers(own.clone()).unwrap();
        assert_eq!(
            small.column(0).to_data().buffers()[0].as_ptr(),
            own.column(0).to_data().buffers()[0].as_ptr()
        );
    }

    /// On one partition, a grouping's output (one array, sliced into batches) as a join's
    /// build side fits a pool it was counted far over.
    #[tokio::test]
    async fn a_join_built_from_a_grouping_is_counted_by_what_it_holds() {
        let n = 2_000_000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Int64, false),
            Field::new("w", DataType::Int64, false),
        ]));
        let events = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 1_000_000))),
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i / 1_000_000))),
            ],
        )
        .unwrap();
        let sql = "WITH a AS (SELECT DISTINCT d, w FROM e), c AS (SELECT d, min(w) AS cohort FROM a GROUP BY d) \
                   SELECT count(*) AS n FROM a JOIN c ON a.d = c.d";
        for off in [Disabled::default(), Disabled::all()] {
            let ctx = session_on(1, &off, 400 << 20, &[("e", events.clone())]);
            let text = answer(&ctx, sql).await;
            assert!(text.contains("| 2000000 |"), "{text}");
        }
    }
}
