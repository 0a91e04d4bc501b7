//! `count(DISTINCT x)` per group over strings, de-duplicated in cache-sized pieces.
//!
//! DataFusion 53 has no groups accumulator for `count(DISTINCT)`: its adapter splits each
//! batch by group and every group grows one hash set. Once a set outgrows the CPU caches each
//! insert is a cache miss, and at 30M events those inserts were half the CPU of top_events and
//! unique_people (13.9M strings into sets of millions). Here a string of up to 12 bytes, which
//! is its own key (Arrow's inline view), is appended to one of its group's buckets, chosen by
//! hash. The buckets are de-duplicated, one at a time, when the group has appended twice as
//! many values as it kept the last time: each bucket then fits in cache, appends are
//! sequential, and memory stays within three times the distinct values. Longer strings, rare
//! in event data, are copied once into an arena and kept in a hash set per group. Every other
//! use of `count` goes to DataFusion's own, which this wraps under the same name.
//!
//! DataFusion plans a lone `count(DISTINCT x)` as a grouping by `x` and a count over it
//! (`SingleDistinctToGroupBy`); for strings that skips this accumulator and costs more, so
//! [`SingleDistinctUnlessStrings`] leaves those aggregations as they are.
use std::any::Any;
use std::hash::BuildHasher;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int64Array, ListArray, MAX_INLINE_VIEW_LEN, StringViewArray,
};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{ScalarValue, resources_err};
use datafusion::error::Result;
use datafusion::functions_aggregate::count::Count;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, EmitTo, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature, StatisticsArgs,
};
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, LogicalPlan};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use hashbrown::HashTable;

/// `count`, with a native groups accumulator for `count(DISTINCT <string>)`.
pub fn count() -> AggregateUDF {
    AggregateUDF::from(CountWithDistinctStrings(Count::new()))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CountWithDistinctStrings(Count);

fn distinct_strings(args: &AccumulatorArgs) -> bool {
    args.is_distinct && args.exprs.len() == 1 && args.expr_fields[0].data_type() == &DataType::Utf8View
}

impl AggregateUDFImpl for CountWithDistinctStrings {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn name(&self) -> &str {
        self.0.name()
    }

    fn signature(&self) -> &Signature {
        self.0.signature()
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.0.return_type(args)
    }

    fn is_nullable(&self) -> bool {
        self.0.is_nullable()
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.0.state_fields(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.0.accumulator(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        distinct_strings(&args) || self.0.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        if distinct_strings(&args) {
            return Ok(Box::new(DistinctStrings::default()));
        }
        self.0.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.0.create_sliding_accumulator(args)
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.0.order_sensitivity()
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        self.0.reverse_expr()
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.0.default_value(data_type)
    }

    fn value_from_stats(&self, args: &StatisticsArgs) -> Option<ScalarValue> {
        self.0.value_from_stats(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.0.documentation()
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.0.set_monotonicity(data_type)
    }
}

/// DataFusion's `SingleDistinctToGroupBy`, except for aggregations that count distinct
/// strings: at 30M events, unique_people's 13.9M values took 1.3 s of CPU to group by
/// (week, value) against about 0.5 s in this accumulator, and a grouping keeps every
/// distinct value of a partition in one table, far past the CPU caches.
#[derive(Debug)]
struct SingleDistinctUnlessStrings(Arc<dyn OptimizerRule + Send + Sync>);

/// DataFusion's `SingleDistinctToGroupBy`, wrapped in [`SingleDistinctUnlessStrings`].
pub fn single_distinct_unless_strings() -> Arc<dyn OptimizerRule + Send + Sync> {
    use datafusion::optimizer::single_distinct_to_groupby::SingleDistinctToGroupBy;
    Arc::new(SingleDistinctUnlessStrings(Arc::new(SingleDistinctToGroupBy::new())))
}

impl OptimizerRule for SingleDistinctUnlessStrings {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        self.0.apply_order()
    }

    fn rewrite(&self, plan: LogicalPlan, config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        match &plan {
            LogicalPlan::Aggregate(a) if a.aggr_expr.iter().any(|e| counts_distinct_strings(e, a)) => {
                Ok(Transformed::no(plan))
            }
            _ => self.0.rewrite(plan, config),
        }
    }
}

fn counts_distinct_strings(e: &Expr, a: &Aggregate) -> bool {
    let Expr::AggregateFunction(f) = e else { return false };
    let p = &f.params;
    f.func.inner().as_any().is::<CountWithDistinctStrings>()
        && p.distinct
        && p.args.len() == 1
        && p.args[0].get_type(a.input.schema()).is_ok_and(|t| t == DataType::Utf8View)
}

/// A group's entries before it is split into buckets: one bucket, de-duplicated as a whole.
const SPLIT_AT: usize = 1 << 15;
/// Buckets of a split group, by hash: each holds 1/256 of the values.
const BUCKETS: usize = 256;
/// Entries a group buffers before its first de-duplication.
const MIN_PENDING: usize = 4096;

/// The fewest slots a bucket is de-duplicated in.
const MIN_SLOTS: usize = 1024;

/// One group's distinct strings.
#[derive(Default)]
struct Group {
    /// Inline views (strings of up to 12 bytes): one bucket, or [`BUCKETS`] by hash.
    buckets: Vec<Vec<u128>>,
    /// Entries de-duplicated so far (the first ones of every bucket).
    kept: usize,
    /// Entries appended since, which may repeat; at twice `kept` the group is de-duplicated
    /// (measured against once and four times: fewer passes, and little more memory).
    pending: usize,
    /// Views of longer strings, pointing into the accumulator's arena.
    long: HashTable<u128>,
}

impl Group {
    fn count(&self) -> usize {
        debug_assert_eq!(self.pending, 0);
        self.kept + self.long.len()
    }

    fn capacity(&self) -> usize {
        let short: usize = self.buckets.iter().map(|b| b.capacity()).sum();
        short * std::mem::size_of::<u128>() + self.long.capacity() * (std::mem::size_of::<u128>() + 1)
    }
}

/// `count(DISTINCT <Utf8View>)` for every group of an aggregation.
#[derive(Default)]
struct DistinctStrings {
    groups: Vec<Group>,
    /// Bytes of the strings longer than 12 bytes, each stored once per group.
    arena: Vec<u8>,
    /// The slots a bucket is de-duplicated in (see [`dedup`]); reused between buckets.
    slots: Vec<u128>,
    hasher: hashbrown::DefaultHashBuilder,
}

/// An inline view with the bytes past its length cleared, so equal strings have equal views.
fn inline_key(view: u128) -> u128 {
    let len = view as u32;
    if len == MAX_INLINE_VIEW_LEN { view } else { view & ((1u128 << (32 + 8 * len)) - 1) }
}

fn slice(arena: &[u8], view: u128) -> &[u8] {
    let offset = (view >> 96) as usize;
    &arena[offset..offset + view as u32 as usize]
}

/// The bucket of a value, by the top bits of its hash ([`dedup`] places it by the low ones).
fn bucket_of(hash: u64) -> usize {
    (hash >> 56) as usize % BUCKETS
}

/// Removes repeated values from a bucket, keeping the first of each, through an open-addressing
/// table of twice the bucket's length in `slots`: one probe per value, in a table that fits in
/// cache. The hash is seeded per process, so no data can be made to collide on purpose. The
/// empty string's key is 0, the empty slot, so it is tracked on its own.
fn dedup(bucket: &mut Vec<u128>, slots: &mut Vec<u128>, hasher: &impl BuildHasher) {
    let size = (2 * bucket.len()).next_power_of_two().max(MIN_SLOTS);
    // Sized to this bucket: slots left large by a group's last compaction before its split
    // would spread each small bucket over far more memory than the cache.
    if slots.capacity() > 4 * size {
        *slots = Vec::new();
    }
    slots.clear();
    slots.resize(size, 0);
    let mut zero = false;
    bucket.retain(|&v| {
        if v == 0 {
            return !std::mem::replace(&mut zero, true);
        }
        let mut i = hasher.hash_one(v) as usize & (size - 1);
        loop {
            match slots[i] {
                0 => {
                    slots[i] = v;
                    return true;
                }
                e if e == v => return false,
                _ => i = (i + 1) & (size - 1),
            }
        }
    });
}

impl DistinctStrings {
    fn insert_short(&mut self, group: usize, key: u128) {
        let g = &mut self.groups[group];
        let b = if g.buckets.len() == 1 { 0 } else { bucket_of(self.hasher.hash_one(key)) };
        g.buckets[b].push(key);
        g.pending += 1;
        if g.pending >= (2 * g.kept).max(MIN_PENDING) {
            self.compact(group);
        }
    }

    /// De-duplicates a group's buckets, one at a time, and splits a group grown past one bucket.
    fn compact(&mut self, group: usize) {
        let Self { groups, slots, hasher, .. } = self;
        let g = &mut groups[group];
        let mut kept = 0;
        for bucket in &mut g.buckets {
            dedup(bucket, slots, hasher);
            kept += bucket.len();
        }
        (g.kept, g.pending) = (kept, 0);
        if g.buckets.len() == 1 && kept > SPLIT_AT {
            let mut split: Vec<Vec<u128>> =
                (0..BUCKETS).map(|_| Vec::with_capacity(2 * kept / BUCKETS)).collect();
            for v in g.buckets.pop().into_iter().flatten() {
                split[bucket_of(hasher.hash_one(v))].push(v);
            }
            g.buckets = split;
        }
    }

    fn insert_long(&mut self, group: usize, view: u128, bytes: &[u8]) -> Result<()> {
        let Self { groups, arena, hasher, .. } = self;
        let set = &mut groups[group].long;
        let hash = hasher.hash_one(bytes);
        // Same length and prefix (the low 64 bits), then the bytes.
        if set.find(hash, |&e| e as u64 == view as u64 && slice(arena, e) == bytes).is_some() {
            return Ok(());
        }
        let Ok(offset) = u32::try_from(arena.len()) else {
            return resources_err!("count(DISTINCT): more than 4 GiB of distinct strings in one aggregation");
        };
        arena.extend_from_slice(bytes);
        let view = (view as u64 as u128) | ((offset as u128) << 96);
        set.insert_unique(hash, view, |&e| hasher.hash_one(slice(arena, e)));
        Ok(())
    }

    fn insert_all(
        &mut self,
        values: &StringViewArray,
        groups: impl Iterator<Item = (usize, usize)>,
    ) -> Result<()> {
        let views = values.views();
        for (row, group) in groups {
            if values.is_valid(row) {
                let view = views[row];
                if view as u32 <= MAX_INLINE_VIEW_LEN {
                    self.insert_short(group, inline_key(view));
                } else {
                    self.insert_long(group, view, values.value(row).as_bytes())?;
                }
            }
        }
        Ok(())
    }

    /// Takes the groups `emit_to` names, de-duplicated, with the arena their long views point into.
    fn take(&mut self, emit_to: EmitTo) -> (Vec<Group>, Vec<u8>) {
        let n = match emit_to {
            EmitTo::All => self.groups.len(),
            EmitTo::First(n) => n,
        };
        for group in 0..n {
            if self.groups[group].pending > 0 {
                self.compact(group);
            }
        }
        match emit_to {
            EmitTo::All => (std::mem::take(&mut self.groups), std::mem::take(&mut self.arena)),
            EmitTo::First(n) => (self.groups.drain(..n).collect(), self.arena.clone()),
        }
    }

    fn ensure_groups(&mut self, total_num_groups: usize) {
        if self.groups.len() < total_num_groups {
            self.groups
                .resize_with(total_num_groups, || Group { buckets: vec![Vec::new()], ..Group::default() });
        }
    }
}

/// Rows that pass the optional FILTER clause, with their group.
fn rows<'a>(
    group_indices: &'a [usize],
    filter: Option<&'a BooleanArray>,
) -> impl Iterator<Item = (usize, usize)> + 'a {
    group_indices
        .iter()
        .copied()
        .enumerate()
        .filter(move |(row, _)| filter.is_none_or(|f| f.is_valid(*row) && f.value(*row)))
}

impl GroupsAccumulator for DistinctStrings {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.ensure_groups(total_num_groups);
        self.insert_all(values[0].as_string_view(), rows(group_indices, opt_filter))
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.ensure_groups(total_num_groups);
        let lists = values[0].as_list::<i32>();
        let offsets = lists.value_offsets();
        let inner = lists.values().as_string_view();
        for (row, group) in rows(group_indices, opt_filter) {
            if lists.is_valid(row) {
                let (from, to) = (offsets[row] as usize, offsets[row + 1] as usize);
                self.insert_all(inner, (from..to).map(|i| (i, group)))?;
            }
        }
        Ok(())
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        let (groups, _) = self.take(emit_to);
        Ok(Arc::new(Int64Array::from_iter_values(groups.iter().map(|g| g.count() as i64))))
    }

    /// Each group's distinct values as a list, the state `count(DISTINCT)` declares.
    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (groups, arena) = self.take(emit_to);
        let offsets = OffsetBuffer::from_lengths(groups.iter().map(Group::count));
        let mut views = Vec::with_capacity(groups.iter().map(Group::count).sum());
        for g in groups {
            views.extend(g.buckets.into_iter().flatten());
            views.extend(g.long);
        }
        let values =
            StringViewArray::try_new(ScalarBuffer::from(views), vec![Buffer::from_vec(arena)], None)?;
        let item = Arc::new(Field::new_list_field(DataType::Utf8View, true));
        Ok(vec![Arc::new(ListArray::try_new(item, offsets, Arc::new(values), None)?)])
    }

    fn size(&self) -> usize {
        let groups: usize = self.groups.iter().map(Group::capacity).sum();
        groups
            + self.groups.capacity() * std::mem::size_of::<Group>()
            + self.arena.capacity()
            + self.slots.capacity() * std::mem::size_of::<u128>()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    /// Rows of (group, value): short and long strings, a few nulls, many repeats.
    fn rows(n: usize, groups: usize, seed: u64) -> (Vec<usize>, StringViewArray) {
        let mut x = seed;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        let (mut g, mut v) = (Vec::new(), Vec::new());
        for _ in 0..n {
            g.push(next() % groups);
            let k = next() % 300;
            v.push(match k % 10 {
                0 => None,
                1..=5 => Some(format!("d_{k}")),
                _ => Some(format!("https://example.com/a/long/path/{k}")),
            });
        }
        (g, StringViewArray::from(v))
    }

    fn expected(batches: &[(Vec<usize>, StringViewArray)], groups: usize) -> Vec<i64> {
        let mut sets: HashMap<usize, HashSet<String>> = HashMap::new();
        for (g, v) in batches {
            for (row, group) in g.iter().enumerate() {
                if v.is_valid(row) {
                    sets.entry(*group).or_default().insert(v.value(row).to_string());
                }
            }
        }
        (0..groups).map(|g| sets.get(&g).map_or(0, |s| s.len() as i64)).collect()
    }

    fn update(acc: &mut DistinctStrings, (g, v): &(Vec<usize>, StringViewArray), groups: usize) {
        acc.update_batch(&[Arc::new(v.clone())], g, None, groups).unwrap();
    }

    fn counts(array: ArrayRef) -> Vec<i64> {
        array.as_primitive::<arrow::datatypes::Int64Type>().values().to_vec()
    }

    /// Keeps the first of each value, the empty string (key 0, the empty slot) included.
    #[test]
    fn dedup_keeps_the_first_of_each_value() {
        // 30k values, 21k of them distinct, none 0.
        let values: Vec<u128> = (0..30_000u128).map(|i| ((i % 7_000) << 64) | (i % 3 + 1)).collect();
        let mut bucket: Vec<u128> =
            values.iter().copied().chain([0, 0]).chain(values.iter().copied()).collect();
        let mut slots = Vec::new();
        dedup(&mut bucket, &mut slots, &hashbrown::DefaultHashBuilder::default());
        let mut seen = std::collections::HashSet::new();
        let want: Vec<u128> = values.iter().copied().chain([0]).filter(|v| seen.insert(*v)).collect();
        assert_eq!(bucket, want);
        assert_eq!(want.len(), 21_001);
    }

    #[test]
    fn counts_equal_a_set_per_group() {
        let batches: Vec<_> = (0..4).map(|i| rows(5000, 40, i)).collect();
        let mut acc = DistinctStrings::default();
        for b in &batches {
            update(&mut acc, b, 40);
        }
        assert_eq!(counts(acc.evaluate(EmitTo::All).unwrap()), expected(&batches, 40));
        assert!(acc.groups.is_empty());
    }

    /// Groups large enough to be split into buckets and de-duplicated many times, with a
    /// partial state emitted in between, still count every distinct value once.
    #[test]
    fn large_groups_are_split_and_still_count_each_value_once() {
        let mut x = 3u64;
        let mut next = move || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) as usize
        };
        let batches: Vec<(Vec<usize>, StringViewArray)> = (0..40)
            .map(|_| {
                let g: Vec<usize> = (0..8192).map(|_| next() % 3).collect();
                // Group 0 draws from 200k values, the others from fewer; one in 50 is long.
                let v: Vec<Option<String>> = g
                    .iter()
                    .map(|&g| {
                        let k = next() % [200_000, 30_000, 500][g];
                        match k % 50 {
                            0 => Some(format!("a string longer than twelve bytes {k}")),
                            1 => None,
                            _ => Some(format!("d_{k}")),
                        }
                    })
                    .collect();
                (g, StringViewArray::from(v))
            })
            .collect();
        let mut acc = DistinctStrings::default();
        for b in &batches {
            update(&mut acc, b, 3);
        }
        assert_eq!(acc.groups[0].buckets.len(), BUCKETS);
        assert_eq!(acc.groups[2].buckets.len(), 1);
        let state = acc.state(EmitTo::All).unwrap();
        let mut last = DistinctStrings::default();
        last.merge_batch(&state, &[0, 1, 2], None, 3).unwrap();
        last.merge_batch(&state, &[0, 1, 2], None, 3).unwrap();
        assert_eq!(counts(last.evaluate(EmitTo::All).unwrap()), expected(&batches, 3));
    }

    /// Through DataFusion's planner, over several partitions (partial and final aggregation),
    /// the registered `count` answers as DataFusion's own, with and without GROUP BY.
    #[tokio::test]
    async fn sql_answers_equal_datafusions_count() {
        use arrow::array::{RecordBatch, UInt32Array};
        use arrow::datatypes::Schema;
        use datafusion::catalog::MemTable;
        use datafusion::prelude::{SessionConfig, SessionContext};

        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::UInt32, false),
            Field::new("v", DataType::Utf8View, true),
        ]));
        let partitions: Vec<Vec<RecordBatch>> = (0..4)
            .map(|p| {
                (0..5)
                    .map(|b| {
                        let (g, v) = rows(8192, 7, 10 * p + b);
                        let g = UInt32Array::from_iter_values(g.into_iter().map(|g| g as u32));
                        RecordBatch::try_new(schema.clone(), vec![Arc::new(g), Arc::new(v)]).unwrap()
                    })
                    .collect()
            })
            .collect();
        let sql = [
            "SELECT g, count(*) AS n, count(DISTINCT v) AS d FROM t GROUP BY g ORDER BY g",
            "SELECT count(DISTINCT v) AS d FROM t",
            "SELECT g % 2 AS h, count(DISTINCT v) FILTER (WHERE g > 2) AS d FROM t GROUP BY 1 ORDER BY 1",
        ];
        let mut answers = Vec::new();
        for ours in [false, true] {
            let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
            if ours {
                ctx.register_udaf(count());
            }
            ctx.register_table("t", Arc::new(MemTable::try_new(schema.clone(), partitions.clone()).unwrap()))
                .unwrap();
            let mut results = Vec::new();
            for q in sql {
                let batches = ctx.sql(q).await.unwrap().collect().await.unwrap();
                results.push(arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string());
            }
            answers.push(results);
        }
        assert_eq!(answers[0], answers[1]);
        assert!(answers[1][0].lines().count() > 7, "{}", answers[1][0]);
    }

    #[test]
    fn inline_bytes_past_the_length_do_not_matter() {
        let clean = StringViewArray::from(vec!["abc"]).views()[0];
        let dirty = clean | (0xffu128 << 100);
        assert_ne!(clean, dirty);
        assert_eq!(inline_key(clean), inline_key(dirty));
        assert_eq!(inline_key(clean), clean);
    }

    #[test]
    fn a_filter_drops_rows() {
        let (g, v) = rows(2000, 10, 7);
        let keep =
            BooleanArray::from((0..g.len()).map(|i| (i % 3 != 0).then_some(i % 2 == 0)).collect::<Vec<_>>());
        let mut acc = DistinctStrings::default();
        acc.update_batch(&[Arc::new(v.clone())], &g, Some(&keep), 10).unwrap();
        let kept: Vec<usize> = (0..g.len()).filter(|&i| keep.is_valid(i) && keep.value(i)).collect();
        let filtered = (
            kept.iter().map(|&i| g[i]).collect(),
            StringViewArray::from(
                kept.iter().map(|&i| v.is_valid(i).then(|| v.value(i))).collect::<Vec<_>>(),
            ),
        );
        assert_eq!(counts(acc.evaluate(EmitTo::All).unwrap()), expected(&[filtered], 10));
    }

    /// Partial states, emitted in two parts, merged by a final accumulator, give the same
    /// counts; groups kept after a partial emit are renumbered and still de-duplicate.
    #[test]
    fn states_emitted_in_parts_merge_to_the_same_counts() {
        let batches: Vec<_> = (0..3).map(|i| rows(4000, 30, 100 + i)).collect();
        let mut partial = DistinctStrings::default();
        for b in &batches {
            update(&mut partial, b, 30);
        }
        let first = partial.state(EmitTo::First(12)).unwrap();
        assert_eq!(partial.groups.len(), 18);
        // The same rows again, for the groups still held (now numbered from 0): no change.
        for (g, v) in &batches {
            let kept: Vec<usize> = (0..g.len()).filter(|&i| g[i] >= 12).collect();
            let again = (
                kept.iter().map(|&i| g[i] - 12).collect(),
                StringViewArray::from(
                    kept.iter().map(|&i| v.is_valid(i).then(|| v.value(i))).collect::<Vec<_>>(),
                ),
            );
            update(&mut partial, &again, 18);
        }
        let rest = partial.state(EmitTo::All).unwrap();

        let mut last = DistinctStrings::default();
        let first_groups: Vec<usize> = (0..12).collect();
        last.merge_batch(&first, &first_groups, None, 30).unwrap();
        let rest_groups: Vec<usize> = (12..30).collect();
        last.merge_batch(&rest, &rest_groups, None, 30).unwrap();
        // Merging the same state twice changes nothing.
        last.merge_batch(&first, &first_groups, None, 30).unwrap();
        assert_eq!(counts(last.evaluate(EmitTo::All).unwrap()), expected(&batches, 30));
    }

    #[test]
    fn evaluate_first_keeps_the_rest() {
        let batches: Vec<_> = (0..2).map(|i| rows(3000, 20, 200 + i)).collect();
        let mut acc = DistinctStrings::default();
        for b in &batches {
            update(&mut acc, b, 20);
        }
        let want = expected(&batches, 20);
        let mut got = counts(acc.evaluate(EmitTo::First(5)).unwrap());
        got.extend(counts(acc.evaluate(EmitTo::All).unwrap()));
        assert_eq!(got, want);
    }

    /// Plans and answers with the engine's `count` and optimizer rules, or DataFusion's own.
    async fn plan_and_answer(skiff: bool, sql: &str) -> (String, String) {
        use datafusion::datasource::MemTable;
        use datafusion::execution::SessionStateBuilder;
        use datafusion::prelude::SessionContext;

        let state = SessionStateBuilder::new().with_default_features().build();
        let state = match skiff {
            true => {
                let rules: Vec<_> = state
                    .optimizers()
                    .iter()
                    .map(|r| match r.name() {
                        "single_distinct_aggregation_to_group_by" => single_distinct_unless_strings(),
                        _ => r.clone(),
                    })
                    .collect();
                SessionStateBuilder::new_from_existing(state).with_optimizer_rules(rules).build()
            }
            false => state,
        };
        let ctx = SessionContext::new_with_state(state);
        if skiff {
            ctx.register_udaf(count());
        }
        let (g, v) = rows(3000, 7, 5);
        let n: ArrayRef = Arc::new(Int64Array::from_iter_values((0..3000).map(|i| i % 97)));
        let g: ArrayRef = Arc::new(Int64Array::from_iter_values(g.iter().map(|&g| g as i64)));
        let batch =
            arrow::array::RecordBatch::try_from_iter([("g", g), ("s", Arc::new(v) as ArrayRef), ("n", n)])
                .unwrap();
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]]).unwrap();
        ctx.register_table("t", Arc::new(table)).unwrap();
        crate::answer_and_plan(&ctx, sql).await
    }

    #[tokio::test]
    async fn a_lone_distinct_count_of_strings_is_not_regrouped() {
        for (sql, regrouped) in [
            ("SELECT g, count(DISTINCT s) AS c FROM t GROUP BY g ORDER BY g", false),
            ("SELECT count(DISTINCT s) AS c FROM t", false),
            ("SELECT g, count(DISTINCT n) AS c FROM t GROUP BY g ORDER BY g", true),
        ] {
            let (want, _) = plan_and_answer(false, sql).await;
            let (got, plan) = plan_and_answer(true, sql).await;
            assert_eq!(got, want, "{sql}");
            assert_eq!(plan.contains("alias1"), regrouped, "{sql}\n{plan}");
        }
    }
}
