//! Shared subplans. DataFusion inlines a CTE at every reference, so the funnel's `s1` (an
//! aggregation over a scan) is planned and computed once per reference, four times. This
//! physical optimizer rule finds aggregations that occur more than once, identical down to
//! their scans, and computes each once: the first consumer of a partition materialises it,
//! the others replay the kept batches.
//!
//! It runs before DataFusion's last filter push-down, which adds dynamic filters (from joins
//! and top-k) to scans. A shared subtree takes no filter from its parents, so no consumer's
//! dynamic filter can change what another consumer reads.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream, displayable,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

/// The rule. Insert it before DataFusion's post-optimisation filter push-down.
#[derive(Debug, Default)]
pub struct ShareSubplans;

impl PhysicalOptimizerRule for ShareSubplans {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut counts = HashMap::new();
        count(&plan, &mut counts);
        if !counts.values().any(|c| c.shareable && c.occurrences > 1) {
            return Ok(plan);
        }
        // An inner aggregation repeated only because an outer shared one is repeated gains
        // nothing from its own sharing: count consumers in the tree as it will be.
        let mut shared: Vec<String> =
            counts.iter().filter(|(_, c)| c.shareable && c.occurrences > 1).map(|(k, _)| k.clone()).collect();
        loop {
            let mut consumers = HashMap::new();
            consumers_of(&plan, &shared, &mut consumers);
            let before = shared.len();
            shared.retain(|k| consumers.get(k).copied().unwrap_or(0) > 1);
            if shared.len() == before {
                let mut states = HashMap::new();
                return Ok(rewrite(&plan, &consumers, &mut states)?.0);
            }
        }
    }

    fn name(&self) -> &str {
        "share_subplans"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

struct Count {
    occurrences: usize,
    shareable: bool,
}

/// A node's identity: its own display, schema and its children's identities. Two nodes with
/// the same key compute the same batches.
fn key(node: &Arc<dyn ExecutionPlan>) -> String {
    let children: Vec<String> = node.children().into_iter().map(key).collect();
    node_key(node, &children)
}

fn node_key(node: &Arc<dyn ExecutionPlan>, children: &[String]) -> String {
    format!("{}|{:?}|[{}]", displayable(node.as_ref()).one_line(), node.schema(), children.join(","))
}

fn count(node: &Arc<dyn ExecutionPlan>, counts: &mut HashMap<String, Count>) -> (String, bool) {
    let mut reads = node.as_any().is::<DataSourceExec>();
    let mut child_keys = Vec::new();
    for child in node.children() {
        let (k, r) = count(child, counts);
        child_keys.push(k);
        reads |= r;
    }
    let key = node_key(node, &child_keys);
    let aggregate = node
        .as_any()
        .downcast_ref::<AggregateExec>()
        .is_some_and(|a| !matches!(a.mode(), AggregateMode::Partial));
    let c = counts.entry(key.clone()).or_insert(Count { occurrences: 0, shareable: aggregate && reads });
    c.occurrences += 1;
    (key, reads)
}

/// How many parents each shared subtree would have, walking a shared subtree only once.
fn consumers_of(node: &Arc<dyn ExecutionPlan>, shared: &[String], consumers: &mut HashMap<String, usize>) {
    for child in node.children() {
        let k = key(child);
        if shared.contains(&k) {
            let n = consumers.entry(k).or_insert(0);
            *n += 1;
            if *n > 1 {
                continue;
            }
        }
        consumers_of(child, shared, consumers);
    }
}

fn rewrite(
    node: &Arc<dyn ExecutionPlan>,
    consumers: &HashMap<String, usize>,
    states: &mut HashMap<String, Arc<SharedState>>,
) -> Result<(Arc<dyn ExecutionPlan>, bool)> {
    let mut changed = false;
    let mut children = Vec::new();
    for child in node.children() {
        let (c, ch) = rewrite(child, consumers, states)?;
        changed |= ch;
        children.push(c);
    }
    let new = if changed { node.clone().with_new_children(children)? } else { node.clone() };
    match consumers.get(&key(node)) {
        Some(&n) if n > 1 => {
            let partitions = new.properties().partitioning.partition_count();
            let state = states.entry(key(node)).or_insert_with(|| Arc::new(SharedState::new(partitions, n)));
            Ok((Arc::new(SharedExec::new(new, state.clone())), true))
        }
        _ => Ok((new, changed)),
    }
}

/// A partition's batches, taken by its last consumer.
type Kept = std::result::Result<Arc<Mutex<Option<Vec<RecordBatch>>>>, Arc<DataFusionError>>;

/// One shared subtree's output: each partition computed once, kept until its last consumer
/// has read it.
struct SharedState {
    partitions: Vec<OnceCell<Kept>>,
    remaining: Vec<AtomicUsize>,
    reservations: Mutex<Vec<Option<MemoryReservation>>>,
    consumers: usize,
}

/// A partition's batches for one consumer, or `None` when its last consumer took them.
type Taken = Option<Vec<RecordBatch>>;

impl SharedState {
    fn new(partitions: usize, consumers: usize) -> Self {
        Self {
            partitions: (0..partitions).map(|_| OnceCell::new()).collect(),
            remaining: (0..partitions).map(|_| AtomicUsize::new(consumers)).collect(),
            reservations: Mutex::new((0..partitions).map(|_| None).collect()),
            consumers,
        }
    }

    /// Runs a partition to its end, keeping its batches within the query's memory pool.
    async fn materialise(&self, input: Arc<dyn ExecutionPlan>, p: usize, ctx: Arc<TaskContext>) -> Kept {
        let run = async {
            let reservation = MemoryConsumer::new(format!("SharedExec[{p}]")).register(ctx.memory_pool());
            let mut stream = input.execute(p, ctx)?;
            let mut batches = Vec::new();
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                reservation.try_grow(sliced_size(&batch))?;
                batches.push(batch);
            }
            self.reservations.lock().expect("reservations")[p] = Some(reservation);
            Ok(Arc::new(Mutex::new(Some(batches))))
        };
        run.await.map_err(Arc::new)
    }

    /// A consumer's copy of a partition; the last consumer takes the kept batches and frees
    /// their memory once it has streamed them.
    fn take(&self, p: usize, kept: &Mutex<Option<Vec<RecordBatch>>>) -> Taken {
        let mut guard = kept.lock().expect("kept batches");
        if self.remaining[p].fetch_sub(1, Ordering::AcqRel) == 1 {
            self.reservations.lock().expect("reservations")[p] = None;
            guard.take()
        } else {
            guard.clone()
        }
    }
}

/// The memory a batch's rows take. Aggregations emit slices of one large array, and every
/// slice reports the whole array in `get_array_memory_size`.
pub fn sliced_size(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()))
        .sum()
}

/// A shared subtree at one of its places in the plan.
pub struct SharedExec {
    input: Arc<dyn ExecutionPlan>,
    state: Arc<SharedState>,
    properties: Arc<PlanProperties>,
}

impl SharedExec {
    fn new(input: Arc<dyn ExecutionPlan>, state: Arc<SharedState>) -> Self {
        let properties = Arc::new(PlanProperties::clone(input.properties()));
        Self { input, state, properties }
    }
}

impl fmt::Debug for SharedExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedExec").field("consumers", &self.state.consumers).finish()
    }
}

impl DisplayAs for SharedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedExec: consumers={}", self.state.consumers)
    }
}

impl ExecutionPlan for SharedExec {
    fn name(&self) -> &str {
        "SharedExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.input.schema()
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

    /// Later rules may rebuild the subtree at each of its places; every copy keeps the same
    /// state, so whichever runs first computes for all.
    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("SharedExec has one child".into()));
        }
        Ok(Arc::new(SharedExec::new(children.swap_remove(0), self.state.clone())))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        if partition >= self.state.partitions.len() {
            return Err(DataFusionError::Internal(format!("SharedExec has no partition {partition}")));
        }
        let state = self.state.clone();
        let input = self.input.clone();
        let batches = futures::stream::once(async move {
            let cell = &state.partitions[partition];
            let kept = cell.get_or_init(|| state.materialise(input.clone(), partition, ctx.clone())).await;
            match kept {
                Ok(kept) => match state.take(partition, kept) {
                    Some(batches) => Ok(futures::stream::iter(batches.into_iter().map(Ok)).boxed()),
                    // More readers than counted: compute it again rather than fail.
                    None => input.execute(partition, ctx).map(|s| s.boxed()),
                },
                Err(e) => Err(DataFusionError::Shared(e.clone())),
            }
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), batches)))
    }
}
