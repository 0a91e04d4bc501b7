//! Windows over many small partitions without a sort by the partition keys. `lead(url) OVER
//! (PARTITION BY session_id ORDER BY timestamp)` needs each session's rows together and in
//! time order, not the sessions in order of their ids; DataFusion sorts by `(session_id,
//! timestamp)` all the same, and comparing long, mostly equal strings was two thirds of that
//! sort's time (`paths` at 30M events: 330 ms of compute for 1.6M rows).
//!
//! When nothing above the window uses its output order, `HashedWindowExec` replaces the sort
//! under a `SortedWindowExec`: it gathers its input, orders the rows by a 64-bit hash of the
//! partition keys and then by the window's ORDER BY (ties in input order), keeps rows whose
//! keys differ but share a hash apart, and computes the window over that order, holding the
//! rows about once. If they do not fit the memory pool, it hands what it has gathered to
//! DataFusion's sort, which spills, and computes the window over the sorted stream as
//! `SortedWindowExec` does.

use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::kernels::partition::partition;
use arrow::compute::{LexicographicalComparator, SortColumn, concat, take};
use arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::hash_utils::create_hashes;
use datafusion::common::{DataFusionError, internal_datafusion_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::{Distribution, OrderingRequirements, PhysicalExpr};
use datafusion::physical_expr_common::utils::evaluate_expressions_to_arrays;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::memory::{batch_bytes, compact_view_column, compact_views, slices};
use super::window::SortedWindowExec;

#[derive(Debug, Default)]
pub struct HashedWindows;

impl PhysicalOptimizerRule for HashedWindows {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The query's own output order matters: an ORDER BY the window's sort satisfied has
        // no sort of its own left in the plan.
        rewrite(plan, true)
    }

    fn name(&self) -> &str {
        "hashed_windows"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with its windows hashed where `order_matters` (whether anything above uses the
/// order of `plan`'s output) allows.
fn rewrite(plan: Arc<dyn ExecutionPlan>, order_matters: bool) -> Result<Arc<dyn ExecutionPlan>> {
    if !order_matters && let Some(hashed) = HashedWindowExec::replacing(&plan) {
        let input = rewrite(hashed.sort.input().clone(), false)?;
        return Arc::new(hashed).with_new_children(vec![input]);
    }
    let children = plan.children();
    if children.is_empty() {
        return Ok(plan);
    }
    let required = plan.required_input_ordering();
    let maintains = plan.maintains_input_order();
    let mut changed = false;
    let mut rewritten = Vec::with_capacity(children.len());
    for (i, child) in children.into_iter().enumerate() {
        let matters = required.get(i).is_none_or(|r| r.is_some())
            || (order_matters && maintains.get(i).copied().unwrap_or(true));
        let new = rewrite(child.clone(), matters)?;
        changed |= !Arc::ptr_eq(&new, child);
        rewritten.push(new);
    }
    if changed { plan.with_new_children(rewritten) } else { Ok(plan) }
}

/// A `SortedWindowExec` without the sort under it, which it does its own way (module docs).
#[derive(Debug, Clone)]
pub struct HashedWindowExec {
    /// The window as it was, over `sort`.
    window: SortedWindowExec,
    /// The sort it replaces: its input is this node's, its order the one a spilling fallback uses.
    sort: Arc<SortExec>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl HashedWindowExec {
    /// The replacement for `plan`, if it is a window over a sort that begins with the window's
    /// partition keys (in any order and direction) and keeps each input partition apart.
    fn replacing(plan: &Arc<dyn ExecutionPlan>) -> Option<Self> {
        let window = plan.as_any().downcast_ref::<SortedWindowExec>()?;
        let child = window.children()[0].clone();
        let sort = child.as_any().downcast_ref::<SortExec>()?;
        let single = sort.input().output_partitioning().partition_count() == 1;
        if sort.fetch().is_some() || !(sort.preserve_partitioning() || single) {
            return None;
        }
        // `PARTITION BY a, a` sorts by `a` once.
        let keys = distinct(window.partition_by());
        let leading = sort.expr().iter().take(keys.len()).map(|s| &s.expr).collect::<Vec<_>>();
        let all_keys = leading.iter().all(|l| keys.iter().any(|k| k.eq(l)));
        if keys.is_empty() || leading.len() != keys.len() || !all_keys {
            return None;
        }
        let sort = Arc::new(sort.clone());
        Some(Self::new(window.clone(), sort))
    }

    fn new(window: SortedWindowExec, sort: Arc<SortExec>) -> Self {
        let sorted = window.properties();
        // What is known of the sorted window's output (constants, equal columns) but its order.
        let mut known = sorted.eq_properties.clone();
        known.clear_orderings();
        let properties = PlanProperties::new(
            known,
            sorted.partitioning.clone(),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self { window, sort, properties: Arc::new(properties), metrics: ExecutionPlanMetricsSet::new() }
    }

    /// The sort's keys after the partition keys: the order within a partition.
    fn order(&self, rows: &RecordBatch) -> Result<Vec<SortColumn>> {
        let keys = distinct(self.window.partition_by()).len();
        let order = &self.sort.expr()[keys..];
        order
            .iter()
            .map(|s| {
                let values = s.expr.evaluate(rows)?.into_array(rows.num_rows())?;
                Ok(SortColumn { values, options: Some(s.options) })
            })
            .collect()
    }
}

impl DisplayAs for HashedWindowExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "HashedWindowExec: ")?;
        self.window.fmt_windows(f)
    }
}

impl ExecutionPlan for HashedWindowExec {
    fn name(&self) -> &str {
        "HashedWindowExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.sort.input()]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        vec![None]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        self.window.required_input_distribution()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let sort = self.sort.clone().with_new_children(children)?;
        let window = Arc::new(self.window.clone()).with_new_children(vec![sort.clone()])?;
        let window = window.as_any().downcast_ref::<SortedWindowExec>();
        let sort = sort.as_any().downcast_ref::<SortExec>();
        let (Some(window), Some(sort)) = (window, sort) else {
            return Err(internal_datafusion_err!("a hashed window lost its window or sort"));
        };
        Ok(Arc::new(Self::new(window.clone(), Arc::new(sort.clone()))))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.sort.input().execute(partition, ctx.clone())?;
        // It spills in that it hands its rows to a sort that spills: its share of a fair pool is
        // a spilling consumer's.
        let reservation = MemoryConsumer::new(format!("HashedWindowExec[{partition}]"))
            .with_can_spill(true)
            .register(ctx.memory_pool());
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        // The stream owns its copy of the node (cheap: the plans and properties are shared).
        let node = self.clone();
        let windows =
            futures::stream::once(node.run(input, reservation, metrics, partition, ctx)).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), windows)))
    }
}

impl HashedWindowExec {
    async fn run(
        self,
        mut input: SendableRecordBatchStream,
        reservation: MemoryReservation,
        metrics: BaselineMetrics,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let mut gathered = vec![];
        let mut rows = 0;
        while let Some(batch) = input.next().await {
            // Strings that point into whole decoded pages are copied out as they come, so the
            // pages go (and the rows are counted as what they hold).
            let batch = compact_views(batch?)?;
            rows += batch.num_rows();
            // Room for the rows, their place in the window's order, and its hashes.
            let fits = reservation.try_grow(batch_bytes(&batch) + 16 * batch.num_rows()).is_ok();
            gathered.push(batch);
            if !fits || rows > u32::MAX as usize {
                reservation.free();
                return self.sorted(gathered, input, partition, ctx);
            }
        }
        let schema = input.schema();
        if gathered.is_empty() {
            return Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), futures::stream::empty())));
        }
        let timer = metrics.elapsed_compute().timer();
        // Column by column, each column's pieces (then its unordered rows) freed as soon as
        // its next form is made: the rows are held about once, not twice.
        let mut pieces = vec![Vec::with_capacity(gathered.len()); schema.fields().len()];
        for batch in gathered {
            for (column, piece) in pieces.iter_mut().zip(batch.columns()) {
                column.push(Arc::clone(piece));
            }
        }
        let columns = pieces
            .into_iter()
            .map(|p| Ok(compact_view_column(concat(&p.iter().map(|a| a.as_ref()).collect::<Vec<_>>())?)))
            .collect::<Result<Vec<_>>>()?;
        let all = RecordBatch::try_new(schema.clone(), columns)?;
        let keys = evaluate_expressions_to_arrays(self.window.partition_by(), &all)?;
        let mut hashes = vec![0; all.num_rows()];
        create_hashes(&keys, &HASHING, &mut hashes)?;
        let (order, partitions) = group(&keys, &hashes, &self.order(&all)?)?;
        drop((keys, hashes));
        let (_, columns, _) = all.into_parts();
        let columns = columns.into_iter().map(|c| Ok(take(&c, &order, None)?)).collect::<Result<Vec<_>>>()?;
        let out = self.window.append_windows(&RecordBatch::try_new(schema, columns)?, &partitions)?;
        reservation.try_resize(batch_bytes(&out))?;
        timer.done();
        let batch_size = ctx.session_config().batch_size().max(1);
        // The reservation lasts as long as the slices do.
        let batches = futures::stream::iter(slices(&out, batch_size)).map(move |b| {
            let _held = &reservation;
            metrics.record_output(b.num_rows());
            Ok(b)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), batches)))
    }

    /// The window over DataFusion's sort of `gathered` and the rest of `input`.
    fn sorted(
        &self,
        gathered: Vec<RecordBatch>,
        input: SendableRecordBatchStream,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = input.schema();
        let rest = futures::stream::iter(gathered.into_iter().map(Ok)).chain(input);
        let replay = Replay {
            schema: schema.clone(),
            stream: Mutex::new(Some(Box::pin(RecordBatchStreamAdapter::new(schema.clone(), rest)))),
        };
        let source = StreamingTableExec::try_new(schema, vec![Arc::new(replay)], None, [], false, None)?;
        let sort = SortExec::new(self.sort.expr().clone(), Arc::new(source));
        let sorted = sort.execute(0, ctx.clone())?;
        Ok(self.window.over_sorted(sorted, partition, &ctx))
    }
}

/// Fixed seeds: the order of rows only has to keep equal keys together within one query.
const HASHING: ahash::RandomState = ahash::RandomState::with_seeds(0x5eed, 0x5ca1e, 0xc0ffee, 0xfeed);

fn distinct(exprs: &[Arc<dyn PhysicalExpr>]) -> Vec<&Arc<dyn PhysicalExpr>> {
    let mut once: Vec<&Arc<dyn PhysicalExpr>> = vec![];
    for e in exprs {
        if !once.iter().any(|o| o.eq(&e)) {
            once.push(e);
        }
    }
    once
}

/// The order of rows (as indices) that makes each value of `keys` (whose hashes are
/// `hashes`) one range, in `order` within it and ties in input order, and those ranges.
fn group(
    keys: &[ArrayRef],
    hashes: &[u64],
    order: &[SortColumn],
) -> Result<(UInt32Array, Vec<Range<usize>>)> {
    let within = LexicographicalComparator::try_new(order)?;
    let mut at: Vec<(u64, u32)> = hashes.iter().zip(0..).map(|(h, i)| (*h, i)).collect();
    at.sort_unstable_by(|a, b| {
        a.0.cmp(&b.0).then_with(|| within.compare(a.1 as usize, b.1 as usize)).then(a.1.cmp(&b.1))
    });
    let ranges = |at: &[(u64, u32)]| -> Result<(UInt32Array, Vec<Range<usize>>)> {
        let indices = UInt32Array::from_iter_values(at.iter().map(|(_, i)| *i));
        let keys = keys.iter().map(|k| Ok(take(k, &indices, None)?)).collect::<Result<Vec<_>>>()?;
        let partitions = partition(&keys)?.ranges();
        Ok((indices, partitions))
    };
    let (indices, partitions) = ranges(&at)?;
    // Two keys that share a hash may be interleaved: then two neighbouring ranges have the
    // same hash. Rare, so only then are the keys compared, and each one's rows put together.
    let collided = partitions.windows(2).any(|p| at[p[0].start].0 == at[p[1].start].0);
    if !collided {
        return Ok((indices, partitions));
    }
    let columns: Vec<SortColumn> =
        keys.iter().map(|k| SortColumn { values: k.clone(), options: None }).collect();
    let same = LexicographicalComparator::try_new(&columns)?;
    for run in at.chunk_by_mut(|a, b| a.0 == b.0) {
        run.sort_by(|a, b| same.compare(a.1 as usize, b.1 as usize));
    }
    ranges(&at)
}

/// One stream, handed to the sort that replaces the in-memory grouping.
struct Replay {
    schema: SchemaRef,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Replay")
    }
}

impl PartitionStream for Replay {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().ok().and_then(|mut s| s.take());
        taken.unwrap_or_else(|| {
            let gone = DataFusionError::Internal("a hashed window's input was read twice".into());
            Box::pin(RecordBatchStreamAdapter::new(
                self.schema.clone(),
                futures::stream::once(async { Err(gone) }),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array, StringArray, StringViewArray, TimestampMicrosecondArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use datafusion::physical_expr::expressions::col;
    use datafusion::physical_plan::displayable;

    use crate::rules::Disabled;
    use crate::testing::{answer, session_on};

    /// Sessions, times and the row's place in the input.
    fn rows() -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("session", DataType::Utf8, true),
            Field::new("ts", DataType::Int64, false),
            Field::new("n", DataType::Int64, false),
        ]);
        let sessions = ["b", "a", "c", "a", "b", "c", "a", "b"];
        let ts = [5, 3, 1, 1, 2, 1, 2, 5];
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from(
                    sessions.iter().map(|s| Some(*s)).chain([None]).collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(ts.iter().copied().chain([4]).collect::<Vec<_>>())),
                Arc::new(Int64Array::from_iter_values(0..9)),
            ],
        )
        .unwrap()
    }

    /// Each partition of `group`'s answer as (session, [n…]), sorted by session.
    fn groups(hash: impl Fn(usize) -> u64) -> Vec<(Option<String>, Vec<i64>)> {
        let rows = rows();
        let key = col("session", &rows.schema()).unwrap();
        let keys = evaluate_expressions_to_arrays([&key], &rows).unwrap();
        let hashes: Vec<u64> = (0..rows.num_rows()).map(hash).collect();
        let order = [SortColumn { values: rows.column(1).clone(), options: None }];
        let (order, partitions) = group(&keys, &hashes, &order).unwrap();
        let sorted = arrow::compute::take_record_batch(&rows, &order).unwrap();
        let session = arrow::array::as_string_array(sorted.column(0));
        let n = sorted.column(2).as_any().downcast_ref::<Int64Array>().unwrap();
        let mut out: Vec<_> = partitions
            .iter()
            .map(|p| {
                (
                    session.is_valid(p.start).then(|| session.value(p.start).to_string()),
                    p.clone().map(|i| n.value(i)).collect(),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn each_key_is_one_partition_in_time_order_with_ties_in_input_order() {
        let expected = vec![
            (None, vec![8]),
            (Some("a".into()), vec![3, 6, 1]),
            (Some("b".into()), vec![4, 0, 7]),
            (Some("c".into()), vec![2, 5]),
        ];
        let real = rows();
        let key = col("session", &real.schema()).unwrap();
        let keys = evaluate_expressions_to_arrays([&key], &real).unwrap();
        let mut hashes = vec![0; real.num_rows()];
        create_hashes(&keys, &HASHING, &mut hashes).unwrap();
        assert_eq!(groups(|i| hashes[i]), expected);
        // Every key with the same hash, and two of three with the same: still apart.
        assert_eq!(groups(|_| 7), expected);
        assert_eq!(groups(|i| if i == 2 || i == 5 { 1 } else { 2 }), expected);
    }

    /// Page views `rows` of 5,000 sessions, with long session ids that share their start.
    fn views(rows: Range<i64>) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("session", DataType::Utf8View, false),
            Field::new("ts", DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None), false),
            Field::new("url", DataType::Utf8View, false),
        ]);
        let session: StringViewArray =
            rows.clone().map(|i| Some(format!("session-0000000000-{}", i * 7919 % 5000))).collect();
        let url: StringViewArray = rows.clone().map(|i| Some(format!("/page/{}", i * 31 % 13))).collect();
        let ts = TimestampMicrosecondArray::from_iter_values(rows.map(|i| i * 104_729 % 100_000));
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(session), Arc::new(ts), Arc::new(url)]).unwrap()
    }

    const TRANSITIONS: &str = "SELECT url, next, count(*) AS n FROM (SELECT url, \
        lead(url) OVER (PARTITION BY session ORDER BY ts) AS next FROM views) GROUP BY url, next";

    #[tokio::test]
    async fn gathers_in_memory_and_sorts_with_spilling_when_the_pool_is_too_small() {
        // 400,000 rows in batches of 1,000 rows, each with buffers of its own (a slice's size
        // counts its whole buffers), in one partition: no exchange holds memory.
        let batches: Vec<RecordBatch> = (0..400).map(|b| views(b * 1000..(b + 1) * 1000)).collect();
        let bytes: usize = batches.iter().map(crate::memory::batch_bytes).sum();
        let table = Arc::new(MemTable::try_new(batches[0].schema(), vec![batches]).unwrap());
        // A sort's reservation for merging its spills (10 MiB as DataFusion comes) fits too.
        let with = |disabled: &Disabled, memory: usize| {
            let ctx = session_on(1, disabled, memory, &[]);
            ctx.register_table("views", table.clone()).unwrap();
            ctx.state_ref().write().config_mut().options_mut().execution.sort_spill_reservation_bytes =
                64 << 10;
            ctx
        };
        let expected = answer(&with(&Disabled::all(), 256 << 20), TRANSITIONS).await;
        assert!(!expected.contains("error") && expected.lines().count() > 40, "{expected}");
        // The in-memory path reserves the rows it gathers, more than the pool: it hands them to
        // DataFusion's sort, which spills.
        let small = 8 << 20;
        assert!(bytes > small, "{bytes}");
        assert_eq!(answer(&with(&Disabled::all(), small), TRANSITIONS).await, expected);
        for memory in [256 << 20, small] {
            let on = with(&Disabled::default(), memory);
            let plan = on.sql(TRANSITIONS).await.unwrap().create_physical_plan().await.unwrap();
            let plan = displayable(plan.as_ref()).indent(false).to_string();
            assert!(plan.contains("HashedWindowExec") && !plan.contains("SortExec"), "{plan}");
            assert_eq!(answer(&on, TRANSITIONS).await, expected, "with a pool of {memory} bytes");
        }
    }
}
