//! Window functions over many small partitions. DataFusion plans `lead(url) OVER (PARTITION BY
//! session_id ORDER BY timestamp)` as its streaming `BoundedWindowAggExec`, which keeps state
//! per open partition and measured 14.5 s of compute for 1.6M rows in 300k sessions (the
//! `paths` query at 30M events). Its whole-partition `WindowAggExec` still spends about 15 µs
//! per partition (5 s there), slicing the input and building an evaluator for each.
//!
//! Over input already sorted by the partition keys, skiff computes `lead`, `lag` and
//! `row_number` for all partitions at once: find the partition boundaries in one pass, then
//! gather each row's neighbour with one `take` (`SortedWindowExec`). Other window functions
//! run in `WindowAggExec`.

use datafusion::physical_expr_common::utils::evaluate_expressions_to_arrays;
use std::any::Any;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use arrow::compute::{cast, concat_batches, take};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::expressions::Literal;
use datafusion::physical_expr::window::{StandardWindowExpr, StandardWindowFunctionExpr, WindowExpr};
use datafusion::physical_expr::{Distribution, OrderingRequirements, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec, WindowUDFExpr};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::memory::{batch_bytes, compact_views};

#[derive(Debug, Default)]
pub struct WholePartitionWindows;

impl PhysicalOptimizerRule for WholePartitionWindows {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(w) = node.as_any().downcast_ref::<BoundedWindowAggExec>() else {
                return Ok(Transformed::no(node));
            };
            // Only over fully sorted input (what WindowAggExec requires too), and only with
            // PARTITION BY: a window over the whole input stays streaming, not buffered.
            let partitioned = w.window_expr().iter().all(|e| !e.partition_by().is_empty());
            if w.input_order_mode != InputOrderMode::Sorted || !partitioned {
                return Ok(Transformed::no(node));
            }
            let input = w.input().clone();
            let can_repartition = input.properties().partitioning.partition_count() > 1;
            let whole = WindowAggExec::try_new(w.window_expr().to_vec(), input, can_repartition)?;
            if whole.schema() != node.schema() {
                return Ok(Transformed::no(node));
            }
            let plan: Arc<dyn ExecutionPlan> = match SortedWindowExec::try_new(Arc::new(whole)) {
                Ok(sorted) => Arc::new(sorted),
                Err(whole) => whole,
            };
            Ok(Transformed::yes(plan))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "whole_partition_windows"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// One window column `SortedWindowExec` computes.
#[derive(Debug, Clone)]
enum Shift {
    /// `row_number()`.
    RowNumber,
    /// `lead`/`lag` of `value`, `by` rows later (negative: earlier), `default` outside the partition.
    Neighbour { value: Arc<dyn PhysicalExpr>, by: i64, default: ScalarValue },
}

impl Shift {
    /// The shift a window expression computes, if it is one `SortedWindowExec` handles.
    fn of(e: &Arc<dyn WindowExpr>) -> Option<Shift> {
        let standard = e.as_any().downcast_ref::<StandardWindowExpr>()?;
        let udf = standard.get_standard_func_expr().as_any().downcast_ref::<WindowUDFExpr>()?;
        let name = udf.fun().name();
        // A call whose evaluator needs its whole partition (`lag`/`lead … IGNORE NULLS`, see
        // `fixes::LeadLag`) is not a plain shift.
        let evaluator = udf.create_evaluator().ok()?;
        if !evaluator.supports_bounded_execution() {
            return None;
        }
        let literal = |i: usize| -> Option<Option<ScalarValue>> {
            match udf.args().get(i) {
                None => Some(None),
                Some(a) => Some(Some(a.as_any().downcast_ref::<Literal>()?.value().clone())),
            }
        };
        match name {
            "row_number" if udf.args().is_empty() => return Some(Shift::RowNumber),
            "lead" | "lag" => {}
            _ => return None,
        }
        let value = udf.args().first()?.clone();
        let by = match literal(1)? {
            None => 1,
            Some(v) if v.is_null() => return None,
            Some(v) => i64::try_from(v.cast_to(&arrow::datatypes::DataType::Int64).ok()?).ok()?,
        };
        // The direction comes from the evaluator DataFusion would run, not from the name: to
        // share one sort with a window ordered the other way, DataFusion reverses `lag`/`lead`
        // (reversed ORDER BY, same function and name, offset negated inside the evaluator).
        // A causal shift looks back (`lag`, or a reversed `lead`), over this input's order.
        let back = evaluator.is_causal();
        let by = if back { -by.checked_abs()? } else { by.checked_abs()? };
        let field = e.field().ok()?;
        let default = match literal(2)? {
            None => ScalarValue::try_from(field.data_type()).ok()?,
            Some(v) => v.cast_to(field.data_type()).ok()?,
        };
        Some(Shift::Neighbour { value, by, default })
    }

    fn evaluate(&self, batch: &RecordBatch, partitions: &[std::ops::Range<usize>]) -> Result<ArrayRef> {
        let rows = batch.num_rows();
        match self {
            Shift::RowNumber => {
                let mut n = Vec::with_capacity(rows);
                for p in partitions {
                    n.extend(1..=p.len() as u64);
                }
                Ok(Arc::new(UInt64Array::from(n)))
            }
            Shift::Neighbour { value, by, default } => {
                let values = value.evaluate(batch)?.into_array(rows)?;
                let values = cast(&values, &default.data_type())?;
                let mut at: Vec<Option<u32>> = Vec::with_capacity(rows);
                let mut outside = false;
                for p in partitions {
                    for i in p.clone() {
                        let j = i as i64 + by;
                        let inside = j >= p.start as i64 && j < p.end as i64;
                        outside |= !inside;
                        at.push(inside.then_some(j as u32));
                    }
                }
                let neighbours = take(&values, &UInt32Array::from(at), None)?;
                if !outside || default.is_null() {
                    return Ok(neighbours);
                }
                // Rows without a neighbour take the default instead of NULL.
                let mut keep = Vec::with_capacity(rows);
                for p in partitions {
                    keep.extend(p.clone().map(|i| {
                        let j = i as i64 + by;
                        j >= p.start as i64 && j < p.end as i64
                    }));
                }
                let fallback = default.to_scalar()?;
                Ok(arrow::compute::kernels::zip::zip(&keep.into(), &neighbours, &fallback)?)
            }
        }
    }
}

/// `lead`, `lag` and `row_number` over input sorted by partition keys, many partitions at a
/// time, streaming. It takes its plan properties and input requirements from the equivalent
/// `WindowAggExec`.
#[derive(Debug, Clone)]
pub struct SortedWindowExec {
    whole: Arc<WindowAggExec>,
    shifts: Vec<Shift>,
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
}

impl SortedWindowExec {
    /// Gives `whole` back when one of its window functions is not one this computes.
    fn try_new(whole: Arc<WindowAggExec>) -> std::result::Result<Self, Arc<dyn ExecutionPlan>> {
        let exprs = whole.window_expr();
        let partition_by = exprs[0].partition_by().to_vec();
        let same = |e: &Arc<dyn WindowExpr>| e.partition_by() == partition_by.as_slice();
        let shifts: Option<Vec<Shift>> =
            exprs.iter().map(|e| same(e).then(|| Shift::of(e)).flatten()).collect();
        match shifts {
            Some(shifts) => Ok(Self { whole, shifts, partition_by }),
            None => Err(whole),
        }
    }
}

impl DisplayAs for SortedWindowExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "SortedWindowExec: ")?;
        self.fmt_windows(f)
    }
}

impl ExecutionPlan for SortedWindowExec {
    fn name(&self) -> &str {
        "SortedWindowExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.whole.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.whole.input()]
    }

    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        self.whole.required_input_ordering()
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        self.whole.required_input_distribution()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        self.whole.maintains_input_order()
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let whole = self.whole.clone().with_new_children(children)?;
        let whole = whole.as_any().downcast_ref::<WindowAggExec>().expect("a WindowAggExec").clone();
        SortedWindowExec::try_new(Arc::new(whole))
            .map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>)
            .map_err(|_| DataFusionError::Internal("window functions changed".into()))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.whole.input().execute(partition, ctx.clone())?;
        Ok(self.over_sorted(input, partition, &ctx))
    }
}

impl SortedWindowExec {
    /// `wdw=[…]`, its window functions as `EXPLAIN` shows them.
    pub(crate) fn fmt_windows(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let names: Vec<&str> = self.whole.window_expr().iter().map(|e| e.name()).collect();
        write!(f, "wdw=[{}]", names.join(", "))
    }

    pub(crate) fn partition_by(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.partition_by
    }

    /// The window over `input`, a stream sorted by the partition keys.
    pub(crate) fn over_sorted(
        &self,
        input: SendableRecordBatchStream,
        partition: usize,
        ctx: &TaskContext,
    ) -> SendableRecordBatchStream {
        let batch_size = ctx.session_config().batch_size().max(1);
        let windowing = Windowing {
            input,
            window: self.clone(),
            pending: vec![],
            rows: 0,
            wanted: batch_size,
            batch_size,
            reservation: MemoryConsumer::new(format!("SortedWindowExec[{partition}]"))
                .register(ctx.memory_pool()),
            done: false,
        };
        let batches = futures::stream::unfold(windowing, |mut w| async move {
            match w.next().await {
                Ok(Some(b)) => Some((Ok(b), w)),
                Ok(None) => None,
                Err(e) => {
                    w.done = true;
                    Some((Err(e), w))
                }
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema(), batches))
    }

    /// `rows` (sorted so that each of `partitions` is one range of them) with the window
    /// columns appended.
    pub(crate) fn append_windows(
        &self,
        rows: &RecordBatch,
        partitions: &[std::ops::Range<usize>],
    ) -> Result<RecordBatch> {
        let mut columns = rows.columns().to_vec();
        for s in &self.shifts {
            columns.push(s.evaluate(rows, partitions)?);
        }
        Ok(RecordBatch::try_new(self.schema(), columns)?)
    }
}

/// Streams the window over sorted input: rows are gathered until there are `wanted` of them,
/// every partition that ends among them is computed and sent, and the last (perhaps
/// unfinished) partition is carried over. Memory holds about one batch plus the longest
/// partition, not the whole input.
struct Windowing {
    input: SendableRecordBatchStream,
    window: SortedWindowExec,
    pending: Vec<RecordBatch>,
    rows: usize,
    /// Rows to gather before looking for finished partitions. It doubles while one partition
    /// spans everything gathered, so a long partition is copied a bounded number of times.
    wanted: usize,
    batch_size: usize,
    reservation: MemoryReservation,
    done: bool,
}

impl Windowing {
    async fn next(&mut self) -> Result<Option<RecordBatch>> {
        while !self.done {
            let finished = match self.input.next().await {
                Some(b) => {
                    let b = b?;
                    self.reservation.try_grow(batch_bytes(&b))?;
                    self.rows += b.num_rows();
                    self.pending.push(b);
                    false
                }
                None => true,
            };
            if !finished && self.rows < self.wanted {
                continue;
            }
            self.done = finished;
            // A sorted batch's views point into every buffer of the sort's input, and the
            // concatenation lists those once per batch: compacted, the operators above spend
            // their time on rows, not buffer lists (paths' filter: 560 ms → 37 ms).
            let all = compact_views(concat_batches(&self.input.schema(), &self.pending)?)?;
            self.pending.clear();
            self.reservation.try_resize(batch_bytes(&all))?;
            if all.num_rows() > u32::MAX as usize {
                return Err(DataFusionError::ResourcesExhausted(
                    "a window partition of more than 4 billion rows".into(),
                ));
            }
            if all.num_rows() == 0 {
                continue;
            }
            let keys = evaluate_expressions_to_arrays(&self.window.partition_by, &all)?;
            let mut ranges = arrow::compute::kernels::partition::partition(&keys)?.ranges();
            // The last partition may go on in the next batch, unless the input has ended.
            let carried = if finished { None } else { ranges.pop() };
            let cut = carried.as_ref().map_or(all.num_rows(), |r| r.start);
            if let Some(r) = carried {
                let tail = all.slice(r.start, r.len());
                self.rows = tail.num_rows();
                self.wanted = if cut == 0 { 2 * self.rows } else { self.rows + self.batch_size };
                self.pending.push(tail);
            }
            if cut == 0 {
                continue;
            }
            return self.window.append_windows(&all.slice(0, cut), &ranges).map(Some);
        }
        Ok(None)
    }
}
