//! A partial aggregation hands on its groups whenever they fill a small table, instead of
//! holding every group it has seen until its input ends.
//!
//! DataFusion's partial aggregation keeps a group for each key it meets and hands them all to
//! the final aggregation at the end. It skips itself when its first rows show few repeated keys,
//! but keys that repeat nearby and are many in all pass that test: TPC-H q18 groups 60M line
//! items by `l_orderkey` at scale factor 10, four lines to an order, stored in order. The two
//! partitions' tables grew to 15M groups (875 MB), every lookup a cache miss, and took 3.3 s
//! of CPU to hand on the 15M groups a table of a few thousand hands on as well (1.9 s capped).
//!
//! DataFusion already knows what a partial aggregation does when memory runs out: it hands on
//! what it holds and goes on (`OutOfMemoryMode::EmitEarly`). [`CappedMemory`] gives each
//! partial aggregation's partition a pool of [`CAP`] bytes on top of the query's pool, so it
//! emits whenever its table fills that. Its input runs with the query's pool, uncapped
//! ([`CappedMemory::lift`] below the aggregation).
//!
//! Why the answer cannot change: a partial aggregation's groups are states the final
//! aggregation merges; a key handed on twice is merged twice, as keys from two partitions are.
//!
//! Only aggregations whose keys and states are of fixed width are capped: a single group of
//! strings or lists could fill the cap alone, and an aggregation that cannot hand on enough
//! groups to get under its pool's limit fails.
//!
//! Upstream: DataFusion sizes a partial aggregation only by the memory pool; no issue filed.
//! The ledger in `rules.rs` says when this goes.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Statistics, internal_err, resources_datafusion_err};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, PlanProperties,
};

/// What a partial aggregation's partition may hold before it hands its groups on. Smaller
/// tables are faster on keys that repeat nearby, but lose what a partial aggregation is for
/// on keys that do not: DataFusion's own skipping keeps partial aggregation on for up to
/// about 220K random keys (fewer groups than 80% of its first 100K rows), which take about
/// 10 MiB with one sum, and at a cap of 4 MiB TPC-H's `GROUP BY l_suppkey` (100K keys per
/// partition) at SF10 handed on 39M rows instead of 200K and took 2.6× as long.
pub const CAP: usize = 32 << 20;

/// Caps every partial aggregation that groups by hashing (not by an order it reads in) at
/// `cap` bytes per partition.
#[derive(Debug)]
pub struct BoundedPartials {
    pub cap: usize,
}

impl Default for BoundedPartials {
    fn default() -> Self {
        Self { cap: CAP }
    }
}

impl PhysicalOptimizerRule for BoundedPartials {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(agg) = node.as_any().downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            let hashed = *agg.mode() == AggregateMode::Partial
                && !agg.group_expr().is_empty()
                && agg.limit_options().is_none()
                && *agg.input_order_mode() == InputOrderMode::Linear;
            // Keys and states of fixed width: no single group can fill the cap, which the
            // aggregation could not resolve by handing groups on (it would fail instead).
            let small_groups = agg.schema().fields().iter().all(|f| fixed_width(f.data_type()));
            if !hashed || !small_groups {
                return Ok(Transformed::no(node));
            }
            let input = CappedMemory::lift(Arc::clone(agg.input()));
            let agg = Arc::clone(&node).with_new_children(vec![input])?;
            Ok(Transformed::yes(CappedMemory::cap(agg, self.cap)))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "bounded_partials"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

fn fixed_width(t: &DataType) -> bool {
    t.is_primitive() || matches!(t, DataType::Boolean | DataType::Null)
}

/// Removes the nodes this rule adds, for plans cut into stages that run in other processes.
pub fn without_bounded_partials(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| match node.as_any().is::<CappedMemory>() {
        true => Ok(Transformed::yes(Arc::clone(node.children()[0]))),
        false => Ok(Transformed::no(node)),
    })
    .map(|t| t.data)
}

/// Runs its input with a pool of `cap` bytes per partition on top of the query's pool, or,
/// with no cap, with the query's pool again.
#[derive(Debug)]
pub struct CappedMemory {
    input: Arc<dyn ExecutionPlan>,
    cap: Option<usize>,
}

/// The query's runtime, kept in a capped task's configuration for [`CappedMemory::lift`].
#[derive(Debug)]
struct QueryRuntime(Arc<RuntimeEnv>);

impl CappedMemory {
    pub fn cap(input: Arc<dyn ExecutionPlan>, bytes: usize) -> Arc<dyn ExecutionPlan> {
        Arc::new(Self { input, cap: Some(bytes) })
    }

    pub fn lift(input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        Arc::new(Self { input, cap: None })
    }

    /// The task context its input runs in: with a capped pool that remembers the query's
    /// runtime, or with that runtime again.
    fn context(&self, ctx: Arc<TaskContext>) -> Arc<TaskContext> {
        let query = ctx.runtime_env();
        let (config, runtime) = match self.cap {
            Some(cap) => {
                let pool = Capped { query: Arc::clone(&query.memory_pool), cap, used: AtomicUsize::new(0) };
                let capped = RuntimeEnv { memory_pool: Arc::new(pool), ..RuntimeEnv::clone(&query) };
                let config = ctx.session_config().clone().with_extension(Arc::new(QueryRuntime(query)));
                (config, Arc::new(capped))
            }
            None => match ctx.session_config().get_extension::<QueryRuntime>() {
                Some(query) => (ctx.session_config().clone(), Arc::clone(&query.0)),
                None => return ctx,
            },
        };
        Arc::new(TaskContext::new(
            ctx.task_id(),
            ctx.session_id(),
            config,
            ctx.scalar_functions().clone(),
            ctx.aggregate_functions().clone(),
            ctx.window_functions().clone(),
            runtime,
        ))
    }
}

impl DisplayAs for CappedMemory {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match self.cap {
            Some(cap) => write!(f, "CappedMemory: per_partition={cap}"),
            None => write!(f, "QueryMemory"),
        }
    }
}

impl ExecutionPlan for CappedMemory {
    fn name(&self) -> &str {
        match self.cap {
            Some(_) => "CappedMemory",
            None => "QueryMemory",
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Ok([input]) = <[_; 1]>::try_from(children) else {
            return internal_err!("{} has one child", self.name());
        };
        Ok(Arc::new(Self { input, cap: self.cap }))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, self.context(ctx))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Statistics> {
        self.input.partition_statistics(partition)
    }
}

/// The query's pool, with at most `cap` bytes of it for the reservations made through this one.
#[derive(Debug)]
struct Capped {
    query: Arc<dyn MemoryPool>,
    cap: usize,
    used: AtomicUsize,
}

impl MemoryPool for Capped {
    fn register(&self, consumer: &MemoryConsumer) {
        self.query.register(consumer)
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.query.unregister(consumer)
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.query.grow(reservation, additional)
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.query.shrink(reservation, shrink)
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let used = self.used.load(Ordering::Relaxed);
        if used + additional > self.cap {
            return Err(resources_datafusion_err!(
                "a partial aggregation's partition holds {used} of its {} bytes",
                self.cap
            ));
        }
        self.query.try_grow(reservation, additional)?;
        self.used.fetch_add(additional, Ordering::Relaxed);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.query.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.query.memory_limit()
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{Field, Schema};
    use arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::{collect, displayable};
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::rules::Disabled;
    use crate::testing::session_on;

    /// 100K rows of 25K keys, each key's four rows next to each other (as TPC-H's line items
    /// are to their order), and a string of each key.
    fn lines() -> Vec<(&'static str, RecordBatch)> {
        let n = 100_000i64;
        let schema = Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i / 4))),
                Arc::new(Int64Array::from_iter_values(0..n)),
                Arc::new(StringArray::from_iter_values((0..n).map(|i| format!("s{}", i / 4)))),
            ],
        )
        .unwrap();
        vec![("lines", batch)]
    }

    /// `sql` planned with every rule off, then with this rule at `cap` bytes if there is one.
    async fn plan(ctx: &SessionContext, sql: &str, cap: Option<usize>) -> Arc<dyn ExecutionPlan> {
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        match cap {
            Some(cap) => BoundedPartials { cap }.optimize(plan, &ConfigOptions::default()).unwrap(),
            None => plan,
        }
    }

    async fn answer(ctx: &SessionContext, plan: &Arc<dyn ExecutionPlan>) -> String {
        let batches = collect(Arc::clone(plan), ctx.task_ctx()).await.unwrap();
        let text = pretty_format_batches(&batches).unwrap().to_string();
        let mut lines: Vec<&str> = text.lines().collect();
        let end = lines.len() - 1;
        lines[3..end].sort();
        lines.join("\n")
    }

    /// The partial aggregation's peak memory over its partitions, and the rows it handed on.
    fn partial(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
        if let Some(agg) = plan.as_any().downcast_ref::<AggregateExec>()
            && *agg.mode() == AggregateMode::Partial
        {
            let m = agg.metrics().unwrap();
            return (m.sum_by_name("peak_mem_used").unwrap().as_usize(), m.output_rows().unwrap());
        }
        plan.children().into_iter().map(partial).find(|p| p.0 > 0).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_capped_partial_aggregation_hands_on_its_groups_as_they_fill_the_cap() {
        let ctx = session_on(2, &Disabled::all(), 256 << 20, &lines());
        let sql = "SELECT k, sum(v) AS total, count(*) AS n FROM lines GROUP BY k";
        let cap = 64 << 10;
        let (whole, capped) = (plan(&ctx, sql, None).await, plan(&ctx, sql, Some(cap)).await);
        assert_eq!(answer(&ctx, &whole).await, answer(&ctx, &capped).await);
        let (whole_peak, whole_rows) = partial(&whole);
        let (capped_peak, capped_rows) = partial(&capped);
        // Uncapped, each partition held every key it met (12.5K); capped, a few thousand.
        assert!(whole_peak > 4 * cap, "uncapped peak {whole_peak}");
        // A reservation grows in steps, so a partition can be at most about twice its cap.
        assert!(capped_peak <= 2 * 2 * cap, "capped peak {capped_peak}");
        // Keys next to each other still meet in the same table: nearly every key is handed on once.
        assert_eq!(whole_rows, 25_000);
        assert!(capped_rows < 26_000, "capped partial handed on {capped_rows} rows");
    }

    #[tokio::test]
    async fn the_input_of_a_capped_aggregation_has_the_query_pool() {
        // The join under the aggregation builds a table of 100K rows, far over the cap: were it
        // capped too, the query would fail.
        let ctx = session_on(2, &Disabled::all(), 256 << 20, &lines());
        let sql = "SELECT a.k, sum(b.v) AS total FROM lines a JOIN lines b ON a.v = b.v GROUP BY a.k";
        let (whole, capped) = (plan(&ctx, sql, None).await, plan(&ctx, sql, Some(16 << 10)).await);
        let shown = displayable(capped.as_ref()).indent(false).to_string();
        assert!(shown.contains("CappedMemory") && shown.contains("HashJoinExec"), "{shown}");
        assert_eq!(answer(&ctx, &whole).await, answer(&ctx, &capped).await);
    }

    #[tokio::test]
    async fn only_partial_aggregations_of_fixed_width_groups_are_capped() {
        let ctx = session_on(2, &Disabled::all(), 256 << 20, &lines());
        for (sql, capped) in [
            ("SELECT k, sum(v) FROM lines GROUP BY k", true),
            ("SELECT k, avg(v), min(v) FROM lines GROUP BY k", true),
            // A string key, or a state that grows with its group's rows, could fill the cap alone.
            ("SELECT s, count(*) FROM lines GROUP BY s", false),
            ("SELECT k, array_agg(v) FROM lines GROUP BY k", false),
            ("SELECT k, max(s) FROM lines GROUP BY k", false),
            // No keys: no table of groups.
            ("SELECT sum(v) FROM lines", false),
        ] {
            let plan = plan(&ctx, sql, Some(CAP)).await;
            let shown = displayable(plan.as_ref()).indent(false).to_string();
            assert_eq!(shown.contains("CappedMemory"), capped, "{sql}\n{shown}");
        }
    }

    #[tokio::test]
    async fn distributed_plans_lose_the_caps() {
        let ctx = session_on(2, &Disabled::all(), 256 << 20, &lines());
        let plan = plan(&ctx, "SELECT k, sum(v) FROM lines GROUP BY k", Some(CAP)).await;
        let bare = without_bounded_partials(Arc::clone(&plan)).unwrap();
        let shown = displayable(bare.as_ref()).indent(false).to_string();
        assert!(!shown.contains("CappedMemory") && !shown.contains("QueryMemory"), "{shown}");
        assert_eq!(answer(&ctx, &plan).await, answer(&ctx, &bare).await);
    }
}
