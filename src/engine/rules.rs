//! Every optimizer rule, plan node and function replacement of skiff's own, in the order they
//! run, each with a name for its off switch (`--disable-rules a,b` or `all`,
//! `SKIFF_DISABLED_RULES`). Each one only changes how fast an answer comes, never the answer:
//! the differential tests run every query with all of them on and with all of them off and
//! require equal answers, and an operator can turn one off in production without a new build.
//!
//! Workarounds for DataFusion bugs (`fixes`) are not listed: they make answers right and are
//! never off.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::prelude::SessionContext;

use crate::lake::ScanOptions;

/// One of skiff's rules: its switch's name and what it does.
pub struct Rule {
    pub name: &'static str,
    pub what: &'static str,
}

const fn rule(name: &'static str, what: &'static str) -> Rule {
    Rule { name, what }
}

/// Every rule, in the order it runs: the analyzer, then logical, then physical rules, then
/// what the functions and the scan do at execution.
pub const RULES: &[Rule] = &[
    rule("share_repeated_subqueries", "a subquery repeated in a query (a CTE read twice) is computed once"),
    rule(
        "single_distinct_unless_strings",
        "DataFusion's rewrite of a lone count(DISTINCT) into a grouping is skipped for strings",
    ),
    rule("group_keys_at_scan", "group keys such as date_trunc(…) are computed right above the scan"),
    rule("whole_partition_windows", "lead/lag/row_number over sorted partitions, many at a time"),
    rule("dynamic_row_filters", "scans with a join's or top-k's runtime filter filter while decoding"),
    rule("selective_first", "a row filter tests the condition that keeps the fewest rows first"),
    rule("string_equalities", "string = literal compared as 16-byte views"),
    rule("fold_per_file", "conditions and expressions a file's bounds decide are not computed per row"),
    rule("yielding_joins", "joins yield to the runtime so a cancelled query stops promptly"),
    rule("distinct_strings_count", "count(DISTINCT string) per group in cache-sized buckets"),
    rule("date_trunc_fixed_units", "date_trunc to second…week of UTC timestamps by arithmetic"),
    rule("coalesce_views", "coalesce of string columns and literals by choosing views"),
    rule("json_once_per_document", "JSON functions parse each distinct document of a batch once"),
    rule("manifest_statistics", "row counts and column bounds from Iceberg manifests given to the planner"),
    rule("manifest_pruning", "files whose manifest bounds cannot match are not read"),
    rule("measured_row_filters", "scans filter while decoding when a sample shows few rows match"),
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

/// `state` with skiff's rules that are on put in their places among DataFusion's.
pub fn install(state: SessionState, off: &Disabled) -> SessionState {
    use super::{count_distinct, group_keys, limits, shared, string_eq, window};
    let on = |name| off.is_on(name);

    let mut physical = state.physical_optimizers().to_vec();
    // Before DataFusion's last filter push-down, which adds dynamic filters to the plan.
    let at = physical
        .iter()
        .position(|r| r.name().starts_with("FilterPushdown") && r.name().contains("Post"))
        .unwrap_or(physical.len().saturating_sub(1));
    if on("whole_partition_windows") {
        physical.insert(at, Arc::new(window::WholePartitionWindows));
    }
    let last: [(&str, Arc<dyn PhysicalOptimizerRule + Send + Sync>); 5] = [
        ("dynamic_row_filters", Arc::new(crate::lake::DynamicRowFilters)),
        ("selective_first", Arc::new(crate::lake::SelectiveFirst)),
        // It only changes how a string equality is computed, once the plan is final.
        ("string_equalities", Arc::new(string_eq::StringEqualities)),
        // After the row-filter rules, which leave it the scans they do not take.
        ("fold_per_file", Arc::new(crate::lake::FoldPerFile)),
        // After every rule that looks for joins: it wraps them so a cancel takes effect.
        ("yielding_joins", Arc::new(limits::YieldingJoins)),
    ];
    physical.extend(last.into_iter().filter(|(name, _)| on(name)).map(|(_, r)| r));

    let mut logical = if on("single_distinct_unless_strings") {
        count_distinct::keep_distinct_strings(state.optimizers())
    } else {
        state.optimizers().to_vec()
    };
    if on("group_keys_at_scan") {
        // Before the last rule (DataFusion's projection pruning), after filters are pushed down.
        logical.insert(logical.len().saturating_sub(1), Arc::new(group_keys::GroupKeysAtScan));
    }

    let scan = ScanOptions {
        statistics: on("manifest_statistics"),
        pruning: on("manifest_pruning"),
        measured_row_filters: on("measured_row_filters"),
    };
    let mut builder = SessionStateBuilder::new_from_existing(state)
        .with_optimizer_rules(logical)
        .with_physical_optimizer_rules(physical);
    builder.config().get_or_insert_with(Default::default).set_extension(Arc::new(scan));
    if on("share_repeated_subqueries") {
        builder = builder
            .with_analyzer_rule(Arc::new(shared::ShareRepeatedSubqueries))
            .with_query_planner(Arc::new(shared::Planner));
    }
    builder.build()
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
}
