//! Shared subqueries. DataFusion inlines a CTE at every reference, so the funnel's `e` (a
//! filtered scan of the events) is read six times, and `s1` (an aggregation over it)
//! computed four times. skiff computes each repeated subquery that reads the lake once:
//!
//! - an analyzer rule marks every repeated subquery (`SubqueryAlias`) with a `Shared` node,
//!   before the optimiser runs. The node takes no filter, projection or limit from its
//!   parents, so the optimiser plans every copy alike;
//! - the physical planner turns each copy into a `SharedExec` over one shared state: the first
//!   consumer of a partition materialises it, the others replay the kept batches, and the
//!   last one frees them. The physical optimiser must then leave every copy alike too:
//!   `SharedExec` takes no sort from its parent (DataFusion pushes a sort below nodes that
//!   keep their input's order, which put a `SortExec` in one copy only, and a window then
//!   read the other copy's unsorted rows). Nothing from a copy's parents reaches into it, so
//!   every copy is planned alike and every consumer can read the first copy's rows; a copy
//!   whose output properties still differ (partitioning, order) runs on its own.
//!
//! A subquery whose output does not fit in a quarter of the memory pool is not kept: each
//! consumer then computes it on its own, as without sharing. No consumer's dynamic filter
//! (from a join or a top-k) can reach a shared subtree, since filters stop at the node.

use std::any::Any;
use std::cmp::Ordering as CmpOrdering;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchemaRef, DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, SubqueryAlias, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::optimizer::{AnalyzerRule, OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::expressions::UnKnownColumn;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, SendableRecordBatchStream,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::memory::{batch_bytes, compact_views};

/// The analyzer rule; add it after DataFusion's own.
#[derive(Debug, Default)]
pub struct ShareRepeatedSubqueries;

impl AnalyzerRule for ShareRepeatedSubqueries {
    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        let mut counts: HashMap<LogicalPlan, usize> = HashMap::new();
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::SubqueryAlias(a) = node
                && shareable(&a.input)?
            {
                *counts.entry(node.clone()).or_default() += 1;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        counts.retain(|_, n| *n > 1);
        if counts.is_empty() {
            return Ok(plan);
        }
        let read = columns_read(&plan, &counts)?;
        // Every copy of one subquery gets the same share, inner repeats included (the copies
        // are walked from their original, unmarked inputs).
        let mut shares: HashMap<LogicalPlan, Arc<Share>> = HashMap::new();
        let plan = plan
            .transform_down_with_subqueries(|node| {
                if !counts.contains_key(&node) {
                    return Ok(Transformed::no(node));
                }
                let share = shares
                    .entry(node.clone())
                    .or_insert_with(|| {
                        Arc::new(Share { read: read.get(&node).cloned(), ..Default::default() })
                    })
                    .clone();
                let LogicalPlan::SubqueryAlias(a) = node else { unreachable!("counted aliases only") };
                let input = Arc::unwrap_or_clone(a.input);
                let marked = LogicalPlan::Extension(Extension { node: Arc::new(Shared { input, share }) });
                Ok(Transformed::yes(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                    Arc::new(marked),
                    a.alias,
                )?)))
            })?
            .data;
        // How many consumers each share has once shared: a shared subtree runs once, so the
        // repeats inside it count once.
        plan.apply_with_subqueries(|node| {
            if let Some(shared) = as_shared(node)
                && shared.share.consumers.fetch_add(1, Ordering::Relaxed) > 0
            {
                return Ok(TreeNodeRecursion::Jump);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "share_repeated_subqueries"
    }
}

/// The logical rules' last step: every copy of one shared subquery gets the first copy's
/// optimised plan. The copies go into the optimiser alike and nothing from their parents
/// reaches into them, so each comes out as valid for all; but common-subexpression
/// elimination numbers its columns over the whole query (`__common_expr_2` in one copy,
/// `__common_expr_3` in the next), and copies that differ in those names are planned apart
/// and share nothing.
#[derive(Debug, Default)]
pub struct CopiesAlike;

impl OptimizerRule for CopiesAlike {
    fn name(&self) -> &str {
        "shared_copies_alike"
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let mut first: HashMap<*const Share, LogicalPlan> = HashMap::new();
        plan.transform_down_with_subqueries(|node| {
            let Some(shared) = as_shared(&node) else { return Ok(Transformed::no(node)) };
            let input = match first.get(&Arc::as_ptr(&shared.share)) {
                None => {
                    first.insert(Arc::as_ptr(&shared.share), shared.input.clone());
                    return Ok(Transformed::no(node));
                }
                Some(input) if *input != shared.input && input.schema() == shared.input.schema() => {
                    input.clone()
                }
                Some(_) => return Ok(Transformed::no(node)),
            };
            let share = shared.share.clone();
            Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(Shared { input, share }),
            })))
        })
    }
}

/// The columns of each repeated subquery (by name) that the query reads, through any copy:
/// every column some expression names through the copy's alias or an alias over it, or names
/// without a qualifier. No entry (every column) when the query has a wildcard left to expand.
/// Computing only these keeps every copy alike and never computes what no copy reads (which
/// could fail where the unshared plan, pruned per copy, answers: a division by zero in a
/// column no one selects).
fn columns_read(
    plan: &LogicalPlan,
    copies: &HashMap<LogicalPlan, usize>,
) -> Result<HashMap<LogicalPlan, HashSet<String>>> {
    let mut named: HashSet<(Option<String>, String)> = HashSet::new();
    let mut wildcard = false;
    plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            e.apply(|e| {
                match e {
                    Expr::Column(c) | Expr::OuterReferenceColumn(_, c) => {
                        named.insert((c.relation.as_ref().map(|r| r.table().to_string()), c.name.clone()));
                    }
                    #[expect(deprecated)]
                    Expr::Wildcard { .. } => wildcard = true,
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut read: HashMap<LogicalPlan, HashSet<String>> = HashMap::new();
    if wildcard {
        return Ok(read);
    }
    // Each alias a copy is read through (its own, or one over it), with what it names.
    plan.apply_with_subqueries(|node| {
        let LogicalPlan::SubqueryAlias(outer) = node else { return Ok(TreeNodeRecursion::Continue) };
        let alias = Some(outer.alias.table().to_string());
        let mut under = node;
        while let LogicalPlan::SubqueryAlias(a) = under {
            if let Some((copy, _)) = copies.get_key_value(under) {
                let names = read.entry(copy.clone()).or_default();
                for field in copy.schema().fields() {
                    let name = field.name().clone();
                    if named.contains(&(None, name.clone())) || named.contains(&(alias.clone(), name.clone()))
                    {
                        names.insert(name);
                    }
                }
                break;
            }
            under = a.input.as_ref();
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(read)
}

/// Worth sharing: reads the lake; safe to share: the same rows at every reference (no
/// volatile function, no reference to an outer query).
fn shareable(plan: &LogicalPlan) -> Result<bool> {
    let mut scans = false;
    let mut unsafe_ = false;
    plan.apply_with_subqueries(|node| {
        scans |= matches!(node, LogicalPlan::TableScan(_));
        unsafe_ |= node.expressions().iter().any(|e| e.contains_outer() || e.is_volatile());
        Ok(if unsafe_ { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })?;
    Ok(scans && !unsafe_)
}

fn as_shared(node: &LogicalPlan) -> Option<&Shared> {
    match node {
        LogicalPlan::Extension(e) => e.node.as_any().downcast_ref::<Shared>(),
        _ => None,
    }
}

/// One repeated subquery, across its copies: how many consumers it has, and (once planned)
/// its physical state.
#[derive(Default)]
struct Share {
    consumers: AtomicUsize,
    state: OnceLock<Arc<SharedState>>,
    /// The subquery's columns some copy reads (`columns_read`); `None` for all.
    read: Option<HashSet<String>>,
}

impl fmt::Debug for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Share").field("consumers", &self.consumers).finish()
    }
}

/// The logical marker over one copy of a repeated subquery.
#[derive(Debug, Clone)]
struct Shared {
    input: LogicalPlan,
    share: Arc<Share>,
}

impl PartialEq for Shared {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.share, &other.share) && self.input == other.input
    }
}

impl Eq for Shared {}

impl PartialOrd for Shared {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        self.input.partial_cmp(&other.input)
    }
}

impl Hash for Shared {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.input.hash(state);
        Arc::as_ptr(&self.share).hash(state);
    }
}

impl UserDefinedLogicalNodeCore for Shared {
    fn name(&self) -> &str {
        "Shared"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Shared: consumers={}", self.share.consumers.load(Ordering::Relaxed))
    }

    /// The columns any copy reads, whatever this copy's parent needs: the copies must stay
    /// alike. The parent's own needs are added in case the analysis missed one (that copy
    /// then plans apart and reads its own rows).
    fn necessary_children_exprs(&self, output_columns: &[usize]) -> Option<Vec<Vec<usize>>> {
        let fields = self.input.schema().fields();
        let Some(read) = &self.share.read else {
            return Some(vec![(0..fields.len()).collect()]);
        };
        let mut keep: Vec<usize> = (0..fields.len())
            .filter(|i| read.contains(fields[*i].name()) || output_columns.contains(i))
            .collect();
        if keep.is_empty() {
            // A copy counted only (`count(*)`): one column carries the rows.
            keep.push(0);
        }
        Some(vec![keep])
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        if inputs.len() != 1 {
            return Err(DataFusionError::Internal("Shared has one input".into()));
        }
        Ok(Self { input: inputs.swap_remove(0), share: self.share.clone() })
    }
}

/// DataFusion's planner, plus `Shared` nodes.
#[derive(Debug, Default)]
pub struct Planner;

#[async_trait]
impl QueryPlanner for Planner {
    async fn create_physical_plan(
        &self,
        plan: &LogicalPlan,
        state: &SessionState,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(SharedPlanner)])
            .create_physical_plan(plan, state)
            .await
    }
}

struct SharedPlanner;

#[async_trait]
impl ExtensionPlanner for SharedPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _state: &SessionState,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(shared) = node.as_any().downcast_ref::<Shared>() else {
            return Ok(None);
        };
        let input = physical_inputs[0].clone();
        let share = &shared.share;
        let state = share
            .state
            .get_or_init(|| Arc::new(SharedState::new(share.consumers.load(Ordering::Relaxed).max(1))));
        Ok(Some(Arc::new(SharedExec::new(input, state.clone()))))
    }
}

/// What became of a partition.
enum Kept {
    /// Its batches, until its last consumer takes them.
    Batches(Mutex<Option<Vec<RecordBatch>>>),
    /// Over its share of memory: every consumer computes the partition on its own.
    TooLarge,
    Failed(Arc<DataFusionError>),
}

/// One shared subtree's output: each partition computed once, kept until its last consumer
/// has read it.
struct SharedState {
    consumers: usize,
    cells: Mutex<HashMap<usize, Arc<Cell>>>,
    /// The copy that computes every partition: the first to run one. Every partition a
    /// consumer reads, kept or computed again, comes from this one plan. Copies planned alike
    /// may still split their rows over partitions differently (two plannings of one Iceberg
    /// scan may give a partition other files): a consumer that took partition 0 from one copy
    /// and partition 1 from another read some rows twice and others never. And a partition of
    /// a subtree with an exchange in it needs every input partition; were partitions computed
    /// in different copies, each copy would run the whole exchange.
    owner: OnceLock<Arc<dyn ExecutionPlan>>,
    /// The partitions run so far.
    started: Mutex<HashSet<usize>>,
}

struct Cell {
    kept: OnceCell<Kept>,
    remaining: AtomicUsize,
    reservation: Mutex<Option<MemoryReservation>>,
}

impl SharedState {
    fn new(consumers: usize) -> Self {
        Self { consumers, cells: Mutex::default(), owner: OnceLock::new(), started: Mutex::default() }
    }

    /// The plan that computes every partition: `input`, unless a copy claimed it before.
    fn claim(&self, input: &Arc<dyn ExecutionPlan>) -> &Arc<dyn ExecutionPlan> {
        self.owner.get_or_init(|| input.clone())
    }

    /// Runs partition `p` of the owner, or of a fresh copy of it when that partition has run
    /// before. A node's partition runs at most once (DataFusion's exchanges panic when
    /// asked twice: "partition not used yet"), yet a partition is asked again when its
    /// computation for everyone was abandoned (the consumer that started it was dropped, as
    /// a `LIMIT` does) or did not fit, or when it has more consumers than counted: then each
    /// consumer computes it on its own, from the same plan as every other partition it reads.
    fn execute_once(&self, p: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let owner = self.owner.get().expect("claimed before it runs").clone();
        let first = self.started.lock().expect("started").insert(p);
        let owner = if first { owner } else { reset_plan_states(owner)? };
        owner.execute(p, ctx)
    }

    fn cell(&self, p: usize) -> Arc<Cell> {
        let mut cells = self.cells.lock().expect("cells");
        cells
            .entry(p)
            .or_insert_with(|| {
                Arc::new(Cell {
                    kept: OnceCell::new(),
                    remaining: AtomicUsize::new(self.consumers),
                    reservation: Mutex::default(),
                })
            })
            .clone()
    }
}

impl Cell {
    /// Runs a partition to its end, keeping its batches within its share of the memory
    /// pool (a quarter of the pool over all partitions).
    async fn materialise(
        &self,
        state: &SharedState,
        partitions: usize,
        p: usize,
        ctx: Arc<TaskContext>,
    ) -> Kept {
        let partitions = partitions.max(1);
        let limit = match ctx.memory_pool().memory_limit() {
            MemoryLimit::Finite(n) => n / 4 / partitions,
            _ => usize::MAX,
        };
        let run = async {
            let reservation = MemoryConsumer::new(format!("SharedExec[{p}]")).register(ctx.memory_pool());
            let mut stream = state.execute_once(p, ctx)?;
            let mut batches = Vec::new();
            while let Some(batch) = stream.next().await {
                let batch = compact_views(batch?)?;
                let size = batch_bytes(&batch);
                if reservation.size() + size > limit || reservation.try_grow(size).is_err() {
                    return Ok(Kept::TooLarge);
                }
                batches.push(batch);
            }
            *self.reservation.lock().expect("reservation") = Some(reservation);
            Ok(Kept::Batches(Mutex::new(Some(batches))))
        };
        run.await.unwrap_or_else(|e: DataFusionError| Kept::Failed(Arc::new(e)))
    }

    /// A consumer's copy of the batches, or `None` when the last consumer took them. The
    /// last consumer takes them and frees their memory once it has streamed them.
    fn take(&self, kept: &Mutex<Option<Vec<RecordBatch>>>) -> Option<Vec<RecordBatch>> {
        let mut guard = kept.lock().expect("kept batches");
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.reservation.lock().expect("reservation") = None;
            guard.take()
        } else {
            guard.clone()
        }
    }
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

    /// Whether this copy's consumer can read `owner`'s rows: the same columns, partitioned and
    /// ordered as this copy says its own are (its consumer relies on both).
    fn reads_alike(&self, owner: &Arc<dyn ExecutionPlan>) -> bool {
        let (theirs, ours) = (&owner.properties().partitioning, &self.properties.partitioning);
        // A partitioning that promises nothing about which rows go where is never `==` to
        // another; only the number of partitions then counts.
        let promises = |p: &Partitioning| match p {
            Partitioning::UnknownPartitioning(_) => false,
            // Hashed on a column projected away since: no consumer can ask for it.
            Partitioning::Hash(exprs, _) => !exprs.iter().any(|e| e.as_any().is::<UnKnownColumn>()),
            Partitioning::RoundRobinBatch(_) => true,
        };
        let partitioned_alike = if promises(theirs) || promises(ours) {
            theirs == ours
        } else {
            theirs.partition_count() == ours.partition_count()
        };
        owner.schema() == self.schema()
            && partitioned_alike
            && owner.properties().output_ordering() == self.properties.output_ordering()
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

    /// Its output keeps the subtree's order, but it tells the optimiser it does not, so no
    /// sort (or order-preserving variant) is pushed into one copy for its consumer's sake.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    /// Later rules may rebuild the subtree at each of its places; every copy keeps the same
    /// state, so whichever runs first computes for all the copies planned alike.
    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("SharedExec has one child".into()));
        }
        Ok(Arc::new(SharedExec::new(children.swap_remove(0), self.state.clone())))
    }

    /// Nothing below a shared subtree is repartitioned for its consumers' sake.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let state = self.state.clone();
        if !self.reads_alike(state.claim(&self.input)) {
            // Planned apart from the owner after all: its own rows, unshared (the owner's kept
            // partitions then wait for the query's end to be freed, one consumer short).
            return self.input.execute(partition, ctx);
        }
        let cell = state.cell(partition);
        let partitions = self.properties.partitioning.partition_count();
        let batches = futures::stream::once(async move {
            let kept =
                cell.kept.get_or_init(|| cell.materialise(&state, partitions, partition, ctx.clone())).await;
            match kept {
                Kept::Batches(kept) => match cell.take(kept) {
                    Some(batches) => Ok(futures::stream::iter(batches.into_iter().map(Ok)).boxed()),
                    // More readers than counted (a repeat inside copies that were planned
                    // apart after all): compute it again rather than fail.
                    None => state.execute_once(partition, ctx).map(|s| s.boxed()),
                },
                Kept::TooLarge => state.execute_once(partition, ctx).map(|s| s.boxed()),
                Kept::Failed(e) => Err(DataFusionError::Shared(e.clone())),
            }
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), batches)))
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::memory_pool::GreedyMemoryPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::physical_plan::displayable;

    use super::*;

    fn input(rows: i64) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..rows))])
                .unwrap();
        MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None).unwrap()
    }

    fn task(pool: usize) -> Arc<TaskContext> {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(GreedyMemoryPool::new(pool)))
            .build_arc()
            .unwrap();
        Arc::new(TaskContext::default().with_runtime(runtime))
    }

    async fn rows(plan: &SharedExec, ctx: &Arc<TaskContext>) -> usize {
        let batches: Vec<RecordBatch> = plan.execute(0, ctx.clone()).unwrap().try_collect().await.unwrap();
        batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// Two copies of one shared subquery, the first over `rows` rows, the second over 5: the
    /// inputs differ here only to show which one ran.
    fn copies(rows: i64) -> (Arc<SharedState>, SharedExec, SharedExec) {
        let state = Arc::new(SharedState::new(2));
        (state.clone(), SharedExec::new(input(rows), state.clone()), SharedExec::new(input(5), state))
    }

    #[tokio::test]
    async fn copies_share_one_computation_and_the_last_frees_it() {
        let (state, first, second) = copies(1000);
        let ctx = task(64 << 20);
        assert_eq!(rows(&first, &ctx).await, 1000);
        assert!(matches!(state.cell(0).kept.get(), Some(Kept::Batches(_))));
        assert!(ctx.memory_pool().reserved() > 0, "kept within the pool");
        assert_eq!(rows(&second, &ctx).await, 1000, "replayed, not computed again");
        assert_eq!(ctx.memory_pool().reserved(), 0, "freed by the last consumer");
    }

    #[tokio::test]
    async fn every_partition_is_computed_by_the_copy_that_ran_first() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let two = |first: i64| -> Arc<dyn ExecutionPlan> {
            let part = |v: i64| {
                vec![RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()]
            };
            MemorySourceConfig::try_new_exec(&[part(first), part(first + 1)], schema.clone(), None).unwrap()
        };
        let state = Arc::new(SharedState::new(2));
        let (a, b) = (SharedExec::new(two(10), state.clone()), SharedExec::new(two(20), state));
        let ctx = task(64 << 20);
        let value = |batches: Vec<RecordBatch>| batches[0].column(0).as_primitive::<Int64Type>().value(0);
        // `a` runs partition 0 first; `b` then runs partition 1, which `a`'s copy computes.
        assert_eq!(value(a.execute(0, ctx.clone()).unwrap().try_collect().await.unwrap()), 10);
        assert_eq!(value(b.execute(1, ctx.clone()).unwrap().try_collect().await.unwrap()), 11);
        assert_eq!(value(b.execute(0, ctx.clone()).unwrap().try_collect().await.unwrap()), 10);
        assert_eq!(value(a.execute(1, ctx.clone()).unwrap().try_collect().await.unwrap()), 11);
    }

    #[tokio::test]
    async fn a_copy_ordered_unlike_the_owner_reads_its_own_rows() {
        let state = Arc::new(SharedState::new(2));
        let sorted: Arc<dyn ExecutionPlan> = Arc::new(datafusion::physical_plan::sorts::sort::SortExec::new(
            [datafusion::physical_expr::PhysicalSortExpr::new_default(Arc::new(
                datafusion::physical_expr::expressions::Column::new("n", 0),
            ))]
            .into(),
            input(5),
        ));
        let (plain, sorted) = (SharedExec::new(input(1000), state.clone()), SharedExec::new(sorted, state));
        let ctx = task(64 << 20);
        assert_eq!(rows(&plain, &ctx).await, 1000);
        assert_eq!(rows(&sorted, &ctx).await, 5, "its own rows, not the other copy's");
    }

    /// `rows` rows behind an exchange, as a grouping's subtree has one: its partitions can
    /// each run once only.
    fn exchanged(input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        use datafusion::physical_plan::Partitioning;
        use datafusion::physical_plan::repartition::RepartitionExec;
        Arc::new(RepartitionExec::try_new(input, Partitioning::RoundRobinBatch(2)).unwrap())
    }

    /// Rows that partition 0 of `plan` has, run on its own.
    async fn rows_of(plan: Arc<dyn ExecutionPlan>, ctx: &Arc<TaskContext>) -> usize {
        let batches: Vec<RecordBatch> = plan.execute(0, ctx.clone()).unwrap().try_collect().await.unwrap();
        batches.iter().map(RecordBatch::num_rows).sum()
    }

    /// A source whose first run never ends and whose later runs give `rows` rows.
    #[derive(Debug)]
    struct StallsOnce {
        runs: AtomicUsize,
        rows: i64,
    }

    impl datafusion::physical_plan::streaming::PartitionStream for StallsOnce {
        fn schema(&self) -> &SchemaRef {
            static SCHEMA: OnceLock<SchemaRef> = OnceLock::new();
            SCHEMA.get_or_init(|| Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)])))
        }

        fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
            let schema = self.schema().clone();
            if self.runs.fetch_add(1, Ordering::SeqCst) == 0 {
                return Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::pending()));
            }
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from_iter_values(0..self.rows))],
            )
            .unwrap();
            Box::pin(RecordBatchStreamAdapter::new(schema, futures::stream::iter([Ok(batch)])))
        }
    }

    #[tokio::test]
    async fn a_partition_whose_computation_was_abandoned_is_computed_by_the_next_consumer() {
        use datafusion::physical_plan::streaming::StreamingTableExec;
        let source = Arc::new(StallsOnce { runs: AtomicUsize::new(0), rows: 1000 });
        let scan = || -> Arc<dyn ExecutionPlan> {
            let schema =
                datafusion::physical_plan::streaming::PartitionStream::schema(source.as_ref()).clone();
            Arc::new(
                StreamingTableExec::try_new(schema, vec![source.clone()], None, [], false, None).unwrap(),
            )
        };
        let state = Arc::new(SharedState::new(2));
        let (first, second) =
            (SharedExec::new(exchanged(scan()), state.clone()), SharedExec::new(exchanged(scan()), state));
        let ctx = task(64 << 20);
        // The first consumer starts the shared computation and is dropped before it ends, as
        // a LIMIT above it drops partitions it no longer needs.
        let mut started = first.execute(0, ctx.clone()).unwrap();
        let polled = tokio::time::timeout(std::time::Duration::from_millis(100), started.next()).await;
        assert!(polled.is_err(), "still computing when dropped");
        drop(started);
        let expected = rows_of(exchanged(scan()), &ctx).await;
        assert!(expected > 0);
        assert_eq!(rows(&second, &ctx).await, expected);
        assert_eq!(rows(&first, &ctx).await, expected);
    }

    #[tokio::test]
    async fn a_partition_too_large_to_keep_is_computed_again_by_the_consumer_that_tried() {
        let state = Arc::new(SharedState::new(2));
        let (first, second) = (
            SharedExec::new(exchanged(input(100_000)), state.clone()),
            SharedExec::new(exchanged(input(100_000)), state),
        );
        let ctx = task(64 << 10);
        let expected = rows_of(exchanged(input(100_000)), &task(64 << 20)).await;
        // The first consumer's own plan computed the partition for everyone and gave up: it
        // then runs the partition again on a fresh copy of that plan.
        assert_eq!(rows(&first, &ctx).await, expected);
        assert_eq!(rows(&second, &ctx).await, expected);
        assert_eq!(ctx.memory_pool().reserved(), 0);
    }

    /// Through SQL: a shared grouping that does not fit in its share of the pool, and one
    /// whose consumer stops early (a LIMIT), answer right every time.
    #[tokio::test]
    async fn shared_groupings_too_large_to_keep_or_cut_short_by_a_limit() {
        use crate::testing;
        let ids = arrow::array::StringViewArray::from_iter_values(
            (0..400_000).map(|i| format!("s{}", i % 200_000)),
        );
        let schema = Arc::new(Schema::new(vec![Field::new("session_id", DataType::Utf8View, false)]));
        let events = RecordBatch::try_new(schema, vec![Arc::new(ids)]).unwrap();
        let ctx = testing::session(&Default::default(), 16 << 20, &[("e", events)]);
        let s = "WITH s AS (SELECT session_id, count(*) AS n FROM e GROUP BY session_id)";
        for _ in 0..3 {
            let both = testing::answer(
                &ctx,
                &format!("{s} SELECT (SELECT count(*) FROM s) AS a, (SELECT sum(n) FROM s) AS b"),
            )
            .await;
            assert!(both.contains("| 200000 | 400000 |"), "{both}");
            let limited = testing::answer(
                &ctx,
                &format!("{s} SELECT (SELECT count(*) FROM s) AS a, (SELECT count(*) FROM (SELECT * FROM s LIMIT 3)) AS b"),
            )
            .await;
            assert!(limited.contains("| 200000 | 3 |"), "{limited}");
        }
    }

    /// A shared window (its rows behind a hash exchange) whose first consumer stops early:
    /// every later consumer still reads every partition.
    #[tokio::test]
    async fn a_shared_exchange_cut_short_by_a_limit_still_gives_every_partition() {
        use crate::testing;
        let rows = 20_000i64;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("g", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let events = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows)),
                Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i % 37))),
                Arc::new(Int64Array::from_iter_values((0..rows).map(|i| (i * 7919) % 1000))),
            ],
        )
        .unwrap();
        let sql = "WITH c AS (SELECT id, v, min(v) OVER (PARTITION BY g ORDER BY id) AS m FROM e) \
                   SELECT (SELECT count(*) FROM (SELECT id FROM c LIMIT 3) l) AS a, \
                   (SELECT count(*) FROM c u WHERE u.v > (SELECT avg(w.v) FROM c w)) AS b, \
                   (SELECT count(*) FROM (SELECT id FROM c LIMIT 1) l) AS d, \
                   (SELECT count(*) FROM c) AS n";
        let (on, off) = testing::on_and_off(&[("e", events)], sql).await;
        assert!(off.contains("| 3 | 10000 | 1 | 20000 |"), "{off}");
        assert_eq!(on, off);
    }

    /// A subquery whose copies common-subexpression elimination numbers apart (two aggregates
    /// under one nullable `FILTER`) is still computed once.
    #[tokio::test]
    async fn copies_with_common_subexpressions_are_shared() {
        use crate::testing;
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        let events = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..10_000).map(|i| i % 7))),
                Arc::new(Int64Array::from_iter((0..10_000).map(|i| (i % 3 != 0).then_some(i % 11)))),
            ],
        )
        .unwrap();
        let sql = "WITH s AS (SELECT g, count(*) FILTER (WHERE v > 5) AS a, sum(v) FILTER (WHERE v > 5) AS b \
                   FROM e GROUP BY g) \
                   SELECT (SELECT sum(a) FROM s) AS a, (SELECT sum(b) FROM s) AS b, (SELECT count(*) FROM s) AS n";
        let ctx = testing::session(&Default::default(), 256 << 20, &[("e", events.clone())]);
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let mut copies = Vec::new();
        plan.apply(|node| {
            if node.as_any().is::<SharedExec>() {
                copies.push(node.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let shown = displayable(plan.as_ref()).indent(false).to_string();
        assert_eq!(copies.len(), 3, "{shown}");
        let input = |c: &Arc<dyn ExecutionPlan>| c.children()[0].clone();
        let display = |c: &Arc<dyn ExecutionPlan>| displayable(input(c).as_ref()).indent(false).to_string();
        for copy in &copies {
            assert_eq!(display(copy), display(&copies[0]), "copies planned apart:\n{shown}");
            let shared = copy.as_any().downcast_ref::<SharedExec>().unwrap();
            assert!(shared.reads_alike(&input(&copies[0])), "a copy would run on its own:\n{shown}");
        }
        let (on, off) = testing::on_and_off(&[("e", events)], sql).await;
        assert!(!on.starts_with("error"), "{on}");
        assert_eq!(on, off);
    }

    /// A column no copy reads is not computed: here it would fail (a division by zero), where
    /// each copy planned on its own prunes it and answers.
    #[tokio::test]
    async fn columns_no_copy_reads_are_not_computed() {
        use crate::testing;
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]));
        let events = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values((0..1000).map(|i| i % 7))),
                Arc::new(Int64Array::from_iter_values((0..1000).map(|i| i % 3))),
            ],
        )
        .unwrap();
        let sql = "WITH c AS (SELECT g, v, g / v AS bad FROM e) \
                   SELECT (SELECT count(*) FROM c u) AS n, (SELECT sum(w.g) FROM c w) AS s, \
                   (SELECT max(x.v) FROM c x WHERE x.g > 2) AS m";
        let (on, off) = testing::on_and_off(&[("e", events)], sql).await;
        assert!(off.contains("| 1000 | 2997 | 2 |"), "{off}");
        assert_eq!(on, off);
    }

    #[tokio::test]
    async fn a_subquery_too_large_to_keep_is_computed_by_each_consumer() {
        let (state, first, second) = copies(100_000);
        let ctx = task(64 << 10);
        assert_eq!(rows(&first, &ctx).await, 100_000);
        assert!(matches!(state.cell(0).kept.get(), Some(Kept::TooLarge)));
        assert_eq!(rows(&second, &ctx).await, 100_000, "computed again, from the first copy's plan");
        assert_eq!(ctx.memory_pool().reserved(), 0);
    }

    /// Two copies that display alike but split their rows over partitions differently (as
    /// two plannings of one Iceberg scan may), with more consumers than counted: each
    /// consumer still reads every row once, never partition 0 of one copy and partition 1 of
    /// the other.
    #[tokio::test]
    async fn a_consumer_reads_every_partition_from_one_plan() {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let split = |parts: [i64; 2]| -> Arc<dyn ExecutionPlan> {
            let part = |v: i64| {
                vec![RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![v]))]).unwrap()]
            };
            MemorySourceConfig::try_new_exec(&[part(parts[0]), part(parts[1])], schema.clone(), None).unwrap()
        };
        let state = Arc::new(SharedState::new(1));
        let (a, b) = (SharedExec::new(split([1, 2]), state.clone()), SharedExec::new(split([2, 1]), state));
        let ctx = task(64 << 20);
        let values = |batches: Vec<Vec<RecordBatch>>| -> Vec<i64> {
            let mut v: Vec<i64> = batches
                .iter()
                .flatten()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect();
            v.sort();
            v
        };
        let mut seen = [Vec::new(), Vec::new()];
        // `a` takes partition 0 and `b` partition 1 (each the one counted consumer); each then
        // reads the other partition, which it must compute again.
        seen[0].push(a.execute(0, ctx.clone()).unwrap().try_collect().await.unwrap());
        seen[1].push(b.execute(1, ctx.clone()).unwrap().try_collect().await.unwrap());
        seen[1].push(b.execute(0, ctx.clone()).unwrap().try_collect().await.unwrap());
        seen[0].push(a.execute(1, ctx.clone()).unwrap().try_collect().await.unwrap());
        let [a_rows, b_rows] = seen;
        assert_eq!(values(a_rows), [1, 2]);
        assert_eq!(values(b_rows), [1, 2]);
    }
}
