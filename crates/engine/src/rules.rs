//! Every optimizer rule, plan node and function replacement of skiff's own, in the order they
//! run, each with a name for its off switch (`--disable-rules a,b` or `all`,
//! `SKIFF_DISABLED_RULES`). Each one only changes how fast an answer comes, never the answer:
//! the differential tests run every query with all of them on and with all of them off and
//! require equal answers, and an operator can turn one off in production without a new build.
//!
//! Workarounds for DataFusion bugs (`fixes`) are not listed: they make answers right and are
//! never off.
//!
//! Nor is `distribute` (`distributed.rs`): it runs after all of these, only on a coordinator
//! (`--workers`), and without workers it is off.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{ScalarUDF, ScalarUDFImpl};
use datafusion::optimizer::OptimizerRule;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::prelude::SessionContext;
use skiff_lake::ScanOptions;

/// One of skiff's rules: its switch's name, what it does, and the ledger against upstream:
/// what DataFusion or iceberg-rust has or is building that does the same, and when skiff's
/// copy can go.
pub struct Rule {
    pub name: &'static str,
    pub what: &'static str,
    pub upstream: &'static str,
}

const fn rule(name: &'static str, what: &'static str, upstream: &'static str) -> Rule {
    Rule { name, what, upstream }
}

/// Every rule, in the order it runs: the analyzer, then logical, then physical rules, then
/// what the functions and the scan do at execution.
pub const RULES: &[Rule] = &[
    rule(
        "share_repeated_subqueries",
        "a subquery repeated in a query (a CTE read twice) is computed once",
        "datafusion#8777 (open) and the subplan materialization epic #22676 (open); goes when a \
         shared subplan is in skiff's DataFusion and the funnel query reads each CTE once",
    ),
    rule(
        "semi_joins_first",
        "an IN/EXISTS (or NOT …) subquery filters the input of a join it reads, not the join's output",
        "no DataFusion rule or issue (Spark has it: PushLeftSemiLeftAntiThroughJoin); goes when \
         DataFusion moves semi joins itself and TPC-H q18 at scale factor 10 builds no hash table \
         of every order with it off",
    ),
    rule(
        "single_distinct_unless_strings",
        "DataFusion's rewrite of a lone count(DISTINCT) into a grouping is skipped for strings",
        "datafusion#15324, a groups accumulator for count(DISTINCT) (open); goes with \
         distinct_strings_count",
    ),
    rule(
        "constant_group_keys",
        "constant group keys are dropped from a grouping that has other keys",
        "DataFusion's EliminateGroupByConstant, left out of skiff's list because it also drops \
         the last key (difftest regression 011); goes when it keeps a grouping's last key",
    ),
    rule(
        "group_keys_at_scan",
        "group keys such as date_trunc(…) are computed right above the scan",
        "leaf expression pushdown, datafusion#20117 (merged, get_field only) and epic #25459 \
         (open); goes when scalar functions are pushed through joins to the scan",
    ),
    rule(
        "range_selectivity",
        "a filter of ranges over dates, timestamps and decimals is estimated to keep the share \
         of rows its ranges cover, not a fixed 20%",
        "DataFusion's filter estimate covers integer and float columns only (intervals::utils::\
         is_datatype_supported); no issue filed; goes when it covers dates, timestamps and \
         decimals and TPC-H q10 at SF10 builds from orders with this rule off",
    ),
    rule(
        "constant_join_keys",
        "a hash join's key pair that both inputs fix to the same value is dropped from its keys",
        "no DataFusion rule or issue; goes when DataFusion's join planning drops key pairs its \
         equivalence properties fix, and unique_people is no slower with this rule off",
    ),
    rule(
        "not_in_builds_subquery",
        "a NOT IN's hash table is built from its subquery when that is the smaller input, and \
         the outer rows stream past it",
        "DataFusion's null-aware anti join keeps the outer input as its build side (JoinSelection \
         never swaps one); no issue filed; goes when DataFusion builds a NOT IN from its subquery \
         and TPC-H q16 at SF10 is no slower with this rule off",
    ),
    rule(
        "whole_partition_windows",
        "lead/lag/row_number over sorted partitions, many at a time",
        "datafusion#23982, BoundedWindowAggExec slow for many partitions (closed by a series of \
         PRs); goes when those are in skiff's DataFusion and `paths` is no slower with it off",
    ),
    rule(
        "hashed_windows",
        "lead/lag/row_number whose output order nothing uses group partitions by a hash of their keys, not a sort",
        "no DataFusion rule or issue (Velox, StarRocks and CockroachDB partition windows by hash); \
         goes when DataFusion's windows group partitions without sorting by their keys and \
         `paths` is no slower with it off",
    ),
    rule(
        "probe_after_build",
        "an inner hash join's probe side starts once its build side has ended, so the scans \
         under it open their files with the join's filter final",
        "no DataFusion issue (HashJoinExec::execute starts its build side, and CoalescePartitionsExec \
         its inputs, when the plan starts); goes when scans wait for the dynamic filters of joins \
         above them and TPC-H q07 is no slower with it off",
    ),
    rule(
        "per_key_join_filters",
        "a join on several keys whose probe-side keys come from different scans filters each \
         scan by its own key's build-side values",
        "DataFusion's join filter is one expression over all keys (HashJoinExec::\
         create_dynamic_filter); no issue filed; goes when each key's part of a join's filter \
         is pushed on its own upstream and TPC-H q05 is no slower with this rule off",
    ),
    rule(
        "bounded_partials",
        "a partial aggregation hands on its groups whenever they fill a cache-sized table, \
         instead of holding every group until its input ends",
        "DataFusion sizes a partial aggregation's table only by the memory pool; no issue filed; \
         goes when a partial aggregation bounds its own table and TPC-H q18 at SF10 is no \
         slower with this rule off",
    ),
    rule(
        "dynamic_row_filters",
        "scans with a join's or top-k's runtime filter filter while decoding",
        "Parquet filter pushdown by default, datafusion#3463 and #23420 (open); goes when dynamic \
         filters reach the row filter by default and the FilterExec above goes",
    ),
    rule(
        "selective_first",
        "a row filter tests the condition that keeps the fewest rows first",
        "adaptive predicate evaluation, datafusion#22883 (open); goes when Parquet row filters \
         order conditions by measured selectivity",
    ),
    rule(
        "unioned_join_filters",
        "a partitioned hash join's filter on a scan is one IN list, not a CASE over hashed rows, \
         or else a CASE evaluated branch by branch",
        "DataFusion builds the CASE in hash_join/shared_bounds.rs; apache/datafusion#21931 \
         (closed) proposed dropping the routing; goes when a partitioned join's filter is one \
         lookup upstream and TPC-H q12 and q17 are no slower with it off",
    ),
    rule(
        "key_bitmap_join_filters",
        "a join filter's hash-table lookup of one integer key is answered from a bitmap of the \
         build side's key range (at most a sixteenth of the scan's rows), once it has looked up \
         as many rows as the range holds",
        "DataFusion 53's ArrayMap answers only dense build sides from an array; no issue filed; \
         goes when join filters answer a range-bounded integer key without hashing it and TPC-H \
         q09 is no slower with it off",
    ),
    rule(
        "adaptive_join_filters",
        "a join filter that keeps nearly every row stops testing rows (one batch in 16 still tested)",
        "dynamic filter selectivity tracking, apache/datafusion#19858 (measured), #20363 and \
         #22234 (proposed); goes when a filter that keeps every row costs nothing upstream and \
         TPC-H q09 at SF10 is no slower with it off",
    ),
    rule(
        "string_equalities",
        "string = literal compared as 16-byte views",
        "arrow-rs#10689 (merged, literals of up to 4 bytes); goes when arrow compares views with \
         literals of up to 12 bytes (and prefixes of longer ones) as fast",
    ),
    rule(
        "fold_per_file",
        "conditions and expressions a file's bounds decide are not computed per row",
        "constant columns per file, datafusion#19136 (merged, min = max only) and #23388 (open); \
         goes when conditions and buckets a file's range decides are folded upstream",
    ),
    rule(
        "yielding_joins",
        "joins yield to the runtime so a cancelled query stops promptly",
        "datafusion#19358, join operators do not yield (open); goes when it is fixed and a \
         cancelled cross join stops with the rule off",
    ),
    rule(
        "distinct_strings_count",
        "count(DISTINCT string) per group in cache-sized buckets",
        "datafusion#15324 (open; #21561 merged covers primitives only); goes when strings have a \
         count(DISTINCT) groups accumulator as fast",
    ),
    rule(
        "date_trunc_fixed_units",
        "date_trunc to second…week of UTC timestamps by arithmetic",
        "datafusion#23542 (merged) and #25326 (open, time zones and coarse units); goes when \
         both are in skiff's DataFusion and unique_people is no slower with it off",
    ),
    rule(
        "coalesce_views",
        "coalesce of string columns and literals by choosing views",
        "coalesce has no runtime kernel upstream (datafusion#25477, open); goes when it gets one",
    ),
    rule(
        "json_once_per_document",
        "JSON functions parse each distinct document of a batch once",
        "no upstream issue in datafusion-functions-json; goes when it parses each distinct \
         document once itself",
    ),
    rule(
        "manifest_statistics",
        "row counts and column bounds from Iceberg manifests given to the planner",
        "iceberg-rust#880 and #1428, statistics from iceberg-datafusion (open); goes when its \
         scan gives per-file statistics to DataFusion's Parquet scan",
    ),
    rule(
        "manifest_pruning",
        "files whose manifest bounds cannot match are not read",
        "iceberg-rust's own manifest evaluator, slow to decode (#3262, #3224 open); goes when its \
         planning is as fast on the first query after a commit",
    ),
    rule(
        "measured_row_filters",
        "scans filter while decoding when a sample shows few rows match",
        "datafusion#22883 (open) and #23420 (open, by projection width); goes when row filters \
         are placed by measured selectivity upstream",
    ),
];

/// The rules turned off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disabled(BTreeSet<&'static str>);

impl Disabled {
    /// From `--disable-rules`: names from [`RULES`], or `all`. An unknown name is an error
    /// that lists the known ones, so a typo never leaves a rule on unnoticed.
    pub fn parse(names: &[String]) -> Result<Self, String> {
        let mut off = BTreeSet::new();
        for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            if n == "all" {
                off.extend(Self::all().0);
                continue;
            }
            match RULES.iter().find(|r| r.name == n) {
                Some(r) => off.insert(r.name),
                None => {
                    let known: Vec<&str> = RULES.iter().map(|r| r.name).collect();
                    return Err(format!("unknown rule {n:?}; known: all, {}", known.join(", ")));
                }
            };
        }
        Ok(Self(off))
    }

    pub fn all() -> Self {
        Self(RULES.iter().map(|r| r.name).collect())
    }

    pub fn is_on(&self, name: &str) -> bool {
        debug_assert!(RULES.iter().any(|r| r.name == name), "{name} is not in RULES");
        !self.0.contains(name)
    }
}

/// `state` with the optimizer rules skiff runs: DataFusion's, with skiff's that are on in
/// their places.
pub fn install(state: SessionState, off: &Disabled) -> SessionState {
    use super::shared;
    let on = |name| off.is_on(name);
    let scan = ScanOptions {
        statistics: on("manifest_statistics"),
        pruning: on("manifest_pruning"),
        measured_row_filters: on("measured_row_filters"),
    };
    let mut builder = SessionStateBuilder::new_from_existing(state)
        .with_optimizer_rules(logical(off))
        .with_physical_optimizer_rules(physical(off));
    builder.config().get_or_insert_with(Default::default).set_extension(Arc::new(scan));
    if on("share_repeated_subqueries") {
        builder = builder
            .with_analyzer_rule(Arc::new(shared::ShareRepeatedSubqueries))
            .with_query_planner(Arc::new(shared::Planner));
    }
    builder.build()
}

type LogicalRule = Arc<dyn OptimizerRule + Send + Sync>;
type PhysicalRule = Arc<dyn PhysicalOptimizerRule + Send + Sync>;

/// DataFusion 53.1's logical rules in the order `Optimizer::new()` runs them, built here so
/// that skiff's go in their places by construction (a test checks the list against
/// DataFusion's). One is left out: `EliminateGroupByConstant` turns `GROUP BY <constant>` into
/// an aggregation without groups, which over no rows answers one row instead of none
/// (difftest regression 011); `constant_group_keys` runs in its place.
fn logical(off: &Disabled) -> Vec<LogicalRule> {
    use datafusion::optimizer::{
        common_subexpr_eliminate::CommonSubexprEliminate, decorrelate_lateral_join::DecorrelateLateralJoin,
        decorrelate_predicate_subquery::DecorrelatePredicateSubquery,
        eliminate_cross_join::EliminateCrossJoin, eliminate_duplicated_expr::EliminateDuplicatedExpr,
        eliminate_filter::EliminateFilter, eliminate_join::EliminateJoin, eliminate_limit::EliminateLimit,
        eliminate_outer_join::EliminateOuterJoin, extract_equijoin_predicate::ExtractEquijoinPredicate,
        extract_leaf_expressions::ExtractLeafExpressions, extract_leaf_expressions::PushDownLeafProjections,
        filter_null_join_keys::FilterNullJoinKeys, optimize_projections::OptimizeProjections,
        optimize_unions::OptimizeUnions, propagate_empty_relation::PropagateEmptyRelation,
        push_down_filter::PushDownFilter, push_down_limit::PushDownLimit,
        replace_distinct_aggregate::ReplaceDistinctWithAggregate,
        rewrite_set_comparison::RewriteSetComparison, scalar_subquery_to_join::ScalarSubqueryToJoin,
        simplify_expressions::SimplifyExpressions, single_distinct_to_groupby::SingleDistinctToGroupBy,
    };
    let mut rules: Vec<LogicalRule> = vec![
        Arc::new(RewriteSetComparison::new()),
        Arc::new(OptimizeUnions::new()),
        Arc::new(SimplifyExpressions::new()),
        Arc::new(ReplaceDistinctWithAggregate::new()),
        Arc::new(EliminateJoin::new()),
        Arc::new(DecorrelatePredicateSubquery::new()),
        Arc::new(ScalarSubqueryToJoin::new()),
        Arc::new(DecorrelateLateralJoin::new()),
        Arc::new(ExtractEquijoinPredicate::new()),
        Arc::new(EliminateDuplicatedExpr::new()),
        Arc::new(EliminateFilter::new()),
        Arc::new(EliminateCrossJoin::new()),
        Arc::new(EliminateLimit::new()),
        Arc::new(PropagateEmptyRelation::new()),
        Arc::new(FilterNullJoinKeys::default()),
        Arc::new(EliminateOuterJoin::new()),
        Arc::new(PushDownLimit::new()),
        Arc::new(PushDownFilter::new()),
    ];
    // Once subqueries are joins and filters are where they filter: whether a join's side is
    // read whole shows only then.
    if off.is_on("semi_joins_first") {
        rules.push(Arc::new(super::semi_joins::SemiJoinsFirst));
    }
    rules.push(if off.is_on("single_distinct_unless_strings") {
        super::count_distinct::single_distinct_unless_strings()
    } else {
        Arc::new(SingleDistinctToGroupBy::new())
    });
    // Where DataFusion's `EliminateGroupByConstant` runs, in its place.
    if off.is_on("constant_group_keys") {
        rules.push(Arc::new(super::constant_group_keys::ConstantGroupKeys));
    }
    rules.extend([
        Arc::new(CommonSubexprEliminate::new()) as LogicalRule,
        Arc::new(ExtractLeafExpressions::new()),
        Arc::new(super::fixes::NotOverUnions(Arc::new(PushDownLeafProjections::new()))),
    ]);
    // After filters are pushed down, before projections are pruned.
    if off.is_on("group_keys_at_scan") {
        rules.push(Arc::new(super::group_keys::GroupKeysAtScan));
    }
    rules.push(Arc::new(OptimizeProjections::new()));
    // A fix (no off switch), once common subexpressions are projected.
    rules.push(Arc::new(super::fixes::TruthTestsNeverNull));
    // Last: the copies of a shared subquery as the optimiser left the first.
    if off.is_on("share_repeated_subqueries") {
        rules.push(Arc::new(super::shared::CopiesAlike));
    }
    rules
}

/// DataFusion 53.1's physical rules in the order `PhysicalOptimizer::new()` runs them, with
/// skiff's in their places (a test checks the list against DataFusion's).
fn physical(off: &Disabled) -> Vec<PhysicalRule> {
    use super::{string_eq, window, yielding_joins};
    use datafusion::physical_optimizer::{
        aggregate_statistics::AggregateStatistics, combine_partial_final_agg::CombinePartialFinalAggregate,
        enforce_distribution::EnforceDistribution, enforce_sorting::EnforceSorting,
        ensure_coop::EnsureCooperative, filter_pushdown::FilterPushdown, join_selection::JoinSelection,
        limit_pushdown::LimitPushdown, limit_pushdown_past_window::LimitPushPastWindows,
        limited_distinct_aggregation::LimitedDistinctAggregation, output_requirements::OutputRequirements,
        projection_pushdown::ProjectionPushdown, pushdown_sort::PushdownSort,
        sanity_checker::SanityCheckPlan, topk_aggregation::TopKAggregation,
        update_aggr_exprs::OptimizeAggregateOrder,
    };
    let mut rules: Vec<PhysicalRule> = vec![
        // A fix, not an optimization (no off switch): first, before any rule trusts the
        // grouping-set aggregations' output properties.
        Arc::new(super::fixes::NullableGroupingSets),
        Arc::new(OutputRequirements::new_add_mode()),
        Arc::new(AggregateStatistics::new()),
    ];
    // Before JoinSelection reads the filters' estimates.
    if off.is_on("range_selectivity") {
        rules.push(Arc::new(super::range_selectivity::RangeSelectivity));
    }
    rules.push(Arc::new(JoinSelection::new()));
    // Once joins have their build sides, before their inputs are partitioned by their keys.
    if off.is_on("constant_join_keys") {
        rules.push(Arc::new(super::constant_join_keys::ConstantJoinKeys));
    }
    // Where JoinSelection would swap a join's inputs, before the build side is collected.
    if off.is_on("not_in_builds_subquery") {
        rules.push(Arc::new(super::not_in::NotInBuildsSubquery));
    }
    let rest: Vec<PhysicalRule> = vec![
        Arc::new(LimitedDistinctAggregation::new()),
        Arc::new(FilterPushdown::new()),
        Arc::new(EnforceDistribution::new()),
        Arc::new(CombinePartialFinalAggregate::new()),
        Arc::new(EnforceSorting::new()),
        Arc::new(OptimizeAggregateOrder::new()),
        Arc::new(ProjectionPushdown::new()),
        Arc::new(OutputRequirements::new_remove_mode()),
        Arc::new(TopKAggregation::new()),
        Arc::new(LimitPushPastWindows::new()),
        Arc::new(LimitPushdown::new()),
        Arc::new(ProjectionPushdown::new()),
        Arc::new(PushdownSort::new()),
        Arc::new(EnsureCooperative::new()),
    ];
    rules.extend(rest);
    // Once sorts are placed, before the last filter push-down adds dynamic filters, which
    // must find the window nodes already in their final form.
    if off.is_on("whole_partition_windows") {
        rules.push(Arc::new(window::WholePartitionWindows));
    }
    // On the windows in their final form, with the plan above them final too.
    if off.is_on("hashed_windows") {
        rules.push(Arc::new(super::hashed_windows::HashedWindows));
    }
    // On the joins in their final form, for the filter push-down after it to take each key's
    // filter to its scan.
    let sides = super::join_sides::JoinSides {
        probe_after_build: off.is_on("probe_after_build"),
        per_key_filters: off.is_on("per_key_join_filters"),
    };
    if sides.probe_after_build || sides.per_key_filters {
        rules.push(Arc::new(sides));
    }
    rules.push(Arc::new(FilterPushdown::new_post_optimization()));
    // Fixes (no off switch), once the plan's joins and sorts are final.
    rules.push(Arc::new(super::fixes::CompactJoinBuilds));
    rules.push(Arc::new(super::fixes::CompactExchangeViews));
    rules.push(Arc::new(super::fixes::CountWholeWindows));
    rules.push(Arc::new(super::fixes::SortsForMerges));
    rules.push(Arc::new(SanityCheckPlan::new()));
    let join_filters = skiff_lake::UnionedJoinFilters {
        unions: off.is_on("unioned_join_filters"),
        key_bitmaps: off.is_on("key_bitmap_join_filters"),
    };
    let last: [(bool, PhysicalRule); 8] = [
        // On the aggregations in their final form; nothing after looks for them.
        (off.is_on("bounded_partials"), Arc::new(super::bounded_partials::BoundedPartials::default())),
        // On the final plan: scans that received a dynamic filter filter while decoding.
        (off.is_on("dynamic_row_filters"), Arc::new(skiff_lake::DynamicRowFilters)),
        (off.is_on("selective_first"), Arc::new(skiff_lake::SelectiveFirst)),
        // Once joins have pushed their filters into the scans.
        (join_filters.unions || join_filters.key_bitmaps, Arc::new(join_filters)),
        // Around the join filters in the form the rule before gives them.
        (off.is_on("adaptive_join_filters"), Arc::new(skiff_lake::AdaptiveJoinFilters)),
        // It only changes how a string equality is computed, once the plan is final.
        (off.is_on("string_equalities"), Arc::new(string_eq::StringEqualities)),
        // After the row-filter rules, which leave it the scans they do not take.
        (off.is_on("fold_per_file"), Arc::new(skiff_lake::FoldPerFile::new(wrapped))),
        // After every rule that looks for joins: it wraps them so a cancel takes effect.
        (off.is_on("yielding_joins"), Arc::new(yielding_joins::YieldingJoins)),
    ];
    rules.extend(last.into_iter().filter(|(on, _)| *on).map(|(_, r)| r));
    rules
}

/// The function under one of skiff's wrappers of a function (a faster path, a fix, a bound
/// on its answer), so that rules that tell DataFusion's functions apart by type know them
/// when wrapped.
pub(crate) fn wrapped(f: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
    use super::fast_path::WithFastPath;
    use super::{bounded_functions, coalesce, date_trunc, fixes, json};
    WithFastPath::<date_trunc::FixedLengthUnits>::wrapped(f)
        .or_else(|| WithFastPath::<coalesce::FirstValidView>::wrapped(f))
        .or_else(|| WithFastPath::<json::OncePerDocument>::wrapped(f))
        .or_else(|| fixes::wrapped(f))
        .or_else(|| bounded_functions::wrapped(f))
}

/// Registers skiff's function replacements that are on.
pub fn register_functions(ctx: &mut SessionContext, off: &Disabled) -> datafusion::error::Result<()> {
    use super::{coalesce, count_distinct, date_trunc, json};
    json::register(ctx, off.is_on("json_once_per_document"))?;
    if off.is_on("date_trunc_fixed_units") {
        date_trunc::register(ctx)?;
    }
    if off.is_on("coalesce_views") {
        coalesce::register(ctx)?;
    }
    if off.is_on("distinct_strings_count") {
        ctx.register_udaf(count_distinct::count());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse() {
        let names: BTreeSet<&str> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), RULES.len());
        assert_eq!(Disabled::parse(&["all".into()]).unwrap(), Disabled::all());
        let some = Disabled::parse(&["fold_per_file".into(), " selective_first ".into()]).unwrap();
        assert!(!some.is_on("fold_per_file") && !some.is_on("selective_first"));
        assert!(some.is_on("string_equalities"));
        let err = Disabled::parse(&["fold_per_flie".into()]).unwrap_err();
        assert!(err.contains("fold_per_flie") && err.contains("fold_per_file"), "{err}");
        assert_eq!(Disabled::parse(&[]).unwrap(), Disabled::default());
    }

    /// With skiff's rules off, the lists are DataFusion's own (less the one left out) and
    /// skiff's fixes: a DataFusion upgrade that adds, drops or moves a rule fails here.
    #[test]
    fn datafusions_rules_in_datafusions_order() {
        let names = |n: Vec<&str>| n.into_iter().map(String::from).collect::<Vec<_>>();
        let ours: Vec<String> = logical(&Disabled::all())
            .iter()
            .map(|r| r.name().to_string())
            .filter(|n| n != "truth_tests_never_null")
            .collect();
        let theirs = datafusion::optimizer::Optimizer::new().rules;
        let theirs: Vec<&str> =
            theirs.iter().map(|r| r.name()).filter(|n| *n != "eliminate_group_by_constant").collect();
        assert_eq!(ours, names(theirs));
        let ours: Vec<String> = physical(&Disabled::all())
            .iter()
            .map(|r| r.name().to_string())
            .filter(|n| {
                ![
                    "nullable_grouping_sets",
                    "compact_join_builds",
                    "compact_exchange_views",
                    "count_whole_windows",
                    "sorts_for_merges",
                ]
                .contains(&n.as_str())
            })
            .collect();
        let theirs = datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
        assert_eq!(ours, names(theirs.iter().map(|r| r.name()).collect()));
    }

    /// Every function of skiff's session is a DataFusion function under its wrappers, which
    /// `wrapped` sees through: `date_trunc` (a faster path) and `round` (a fix) are found as
    /// DataFusion's, as `fold_per_file` needs them.
    #[test]
    fn wrapped_functions_are_seen_through() {
        use datafusion::execution::FunctionRegistry;
        use datafusion::functions::datetime::date_trunc::DateTruncFunc;
        use datafusion::functions::math::round::RoundFunc;
        let ctx = crate::testing::session(&Disabled::default(), 64 << 20, &[]);
        let innermost = |f: &ScalarUDF| {
            let mut f = f.clone();
            while let Some(under) = wrapped(f.inner().as_ref()) {
                f = under.clone();
            }
            f
        };
        for name in ctx.udfs() {
            let f = ctx.udf(&name).unwrap();
            assert_eq!(innermost(&f).name(), f.name(), "{name}");
        }
        let date_trunc = ctx.udf("date_trunc").unwrap();
        assert!(!date_trunc.inner().as_any().is::<DateTruncFunc>(), "date_trunc is not wrapped");
        assert!(innermost(&date_trunc).inner().as_any().is::<DateTruncFunc>());
        let round = ctx.udf("round").unwrap();
        assert!(!round.inner().as_any().is::<RoundFunc>(), "round is not wrapped");
        assert!(innermost(&round).inner().as_any().is::<RoundFunc>());
    }
}
