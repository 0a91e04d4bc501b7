//! A filter of ranges over dates, timestamps and decimals gets the share of rows its ranges
//! cover, not DataFusion's fixed guess.
//!
//! DataFusion estimates how many rows a filter keeps by interval analysis over the input's
//! column bounds, but only for integer and float columns; any other predicate keeps a fixed
//! 20%. Join selection then compares the guess with the other input: TPC-H q10 at SF10 keeps
//! three months of seven years of orders (573K of 15M), estimated as 3M, so the join built
//! its hash table from the 1.5M customers with all their strings instead.
//!
//! Here a filter whose every condition compares a date, timestamp or decimal column with a
//! literal (`<`, `<=`, `>`, `>=`, `=`) gets, as its default selectivity, the share of each
//! column's bounds the conditions leave, multiplied over columns (as independent), in whole
//! percent rounded up (at least 1%). Bounds are the statistics' (Iceberg manifests'). A filter
//! with any other condition, or over columns without bounds, keeps DataFusion's estimate.
//!
//! Why the answer cannot change: only the filter's estimate changes, which decides plan
//! choices such as a join's build side, never which rows pass.
//!
//! Upstream: DataFusion's interval analysis covers integers and floats only
//! (`is_datatype_supported` in `physical-expr/src/intervals/utils.rs`); no issue filed for
//! dates. Goes when its filter statistics cover dates, timestamps and decimals and TPC-H q10
//! at SF10 builds from orders with this rule off.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{ScalarValue, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, split_conjunction};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};

#[derive(Debug, Default)]
pub struct RangeSelectivity;

impl PhysicalOptimizerRule for RangeSelectivity {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(filter) = node.as_any().downcast_ref::<FilterExec>() else {
                return Ok(Transformed::no(node));
            };
            // The input's statistics only for a filter of ranges: they are computed over its
            // whole subtree.
            let Some(conditions) = conditions(filter) else {
                return Ok(Transformed::no(node));
            };
            let stats = filter.input().partition_statistics(None)?;
            let Some(share) = share(&conditions, &stats) else {
                return Ok(Transformed::no(node));
            };
            let percent = (share * 100.0).ceil().clamp(1.0, 100.0) as u8;
            if percent == filter.default_selectivity() {
                return Ok(Transformed::no(node));
            }
            let filter = FilterExecBuilder::from(filter).with_default_selectivity(percent).build()?;
            Ok(Transformed::yes(Arc::new(filter) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "range_selectivity"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `filter`'s conditions as (column, comparison, value), when every one compares a date,
/// timestamp or decimal column with a literal of its type.
fn conditions(filter: &FilterExec) -> Option<Vec<(usize, Operator, f64)>> {
    let schema = filter.input().schema();
    split_conjunction(filter.predicate())
        .into_iter()
        .map(|condition| {
            let (column, op, value) = comparison(condition)?;
            if schema.fields().get(column.index())?.data_type() != &value.data_type() {
                return None;
            }
            Some((column.index(), op, number(value)?))
        })
        .collect()
}

/// A column's bounds in the statistics, and the part of them the conditions leave.
struct Range {
    column: usize,
    min: f64,
    max: f64,
    low: f64,
    high: f64,
}

/// The share of rows `conditions` leave, when each column they compare has bounds in `stats`.
fn share(conditions: &[(usize, Operator, f64)], stats: &Statistics) -> Option<f64> {
    let mut ranges: Vec<Range> = Vec::new();
    for &(column, op, value) in conditions {
        let range = match ranges.iter().position(|r| r.column == column) {
            Some(i) => &mut ranges[i],
            None => {
                let c = stats.column_statistics.get(column)?;
                let (min, max) = (number(c.min_value.get_value()?)?, number(c.max_value.get_value()?)?);
                ranges.push(Range { column, min, max, low: min, high: max });
                ranges.last_mut()?
            }
        };
        match op {
            // Values are whole units of the column (days, ticks, the decimal's last digit).
            Operator::Gt => range.low = range.low.max(value + 1.0),
            Operator::GtEq => range.low = range.low.max(value),
            Operator::Lt => range.high = range.high.min(value - 1.0),
            Operator::LtEq => range.high = range.high.min(value),
            Operator::Eq => (range.low, range.high) = (range.low.max(value), range.high.min(value)),
            _ => return None,
        }
    }
    if ranges.is_empty() {
        return None;
    }
    Some(ranges.iter().map(|r| covered(r.min, r.max, r.low, r.high)).product())
}

/// The share of `[min, max]` that `[low, high]` covers; a single value counts as one unit
/// of the column's values (a day, a microsecond, the decimal's last digit).
fn covered(min: f64, max: f64, low: f64, high: f64) -> f64 {
    if high < low {
        return 0.0;
    }
    let width = max - min + 1.0;
    ((high - low + 1.0) / width).clamp(0.0, 1.0)
}

/// `column op literal` (or `literal op column`, turned around), with a literal of a type
/// DataFusion's own estimate does not cover.
fn comparison(condition: &Arc<dyn PhysicalExpr>) -> Option<(&Column, Operator, &ScalarValue)> {
    let binary = condition.as_any().downcast_ref::<BinaryExpr>()?;
    let (l, r) = (binary.left().as_any(), binary.right().as_any());
    let (column, literal, op) = match (l.downcast_ref::<Column>(), r.downcast_ref::<Literal>()) {
        (Some(c), Some(v)) => (c, v, *binary.op()),
        _ => (r.downcast_ref::<Column>()?, l.downcast_ref::<Literal>()?, binary.op().swap()?),
    };
    let value = literal.value();
    if !matches!(
        value,
        ScalarValue::Date32(_)
            | ScalarValue::Date64(_)
            | ScalarValue::TimestampSecond(..)
            | ScalarValue::TimestampMillisecond(..)
            | ScalarValue::TimestampMicrosecond(..)
            | ScalarValue::TimestampNanosecond(..)
            | ScalarValue::Decimal128(..)
    ) {
        return None;
    }
    Some((column, op, value))
}

/// A bound or literal as a number on the column's own scale (days, the timestamp's unit, the
/// decimal's unscaled integer); NULL and other types have none.
fn number(v: &ScalarValue) -> Option<f64> {
    Some(match v {
        ScalarValue::Date32(Some(d)) => *d as f64,
        ScalarValue::Date64(Some(ms)) => *ms as f64,
        ScalarValue::TimestampSecond(Some(t), _)
        | ScalarValue::TimestampMillisecond(Some(t), _)
        | ScalarValue::TimestampMicrosecond(Some(t), _)
        | ScalarValue::TimestampNanosecond(Some(t), _) => *t as f64,
        ScalarValue::Decimal128(Some(d), _, _) => *d as f64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use arrow::datatypes::{DataType, Field, Schema, TimestampMicrosecondType};
    use datafusion::execution::SessionStateBuilder;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, col, lit};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::prelude::SessionContext;

    use super::*;

    /// The share `predicate` gets over a table of `d` (days) and `n` (integers), with `d`
    /// bounded by 0..=999.
    fn share_of(predicate: impl Fn(&Schema) -> Arc<dyn PhysicalExpr>) -> Option<f64> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("d", DataType::Date32, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let filter =
            FilterExec::try_new(predicate(&schema), Arc::new(EmptyExec::new(Arc::clone(&schema)))).unwrap();
        let mut stats = Statistics::new_unknown(&schema);
        stats.column_statistics[0].min_value =
            datafusion::common::stats::Precision::Exact(ScalarValue::Date32(Some(0)));
        stats.column_statistics[0].max_value =
            datafusion::common::stats::Precision::Inexact(ScalarValue::Date32(Some(999)));
        share(&conditions(&filter)?, &stats)
    }

    fn day(d: i32) -> Arc<dyn PhysicalExpr> {
        lit(ScalarValue::Date32(Some(d)))
    }

    fn cmp(
        l: Arc<dyn PhysicalExpr>,
        op: Operator,
        r: Arc<dyn PhysicalExpr>,
        s: &Schema,
    ) -> Arc<dyn PhysicalExpr> {
        binary(l, op, r, s).unwrap()
    }

    #[test]
    fn a_range_of_days_keeps_its_share_of_the_bounds() {
        let d = |s: &Schema| col("d", s).unwrap();
        let both = |s: &Schema| {
            let from = cmp(d(s), Operator::GtEq, day(100), s);
            let to = cmp(d(s), Operator::Lt, day(150), s);
            cmp(from, Operator::And, to, s)
        };
        assert_eq!(share_of(both), Some(50.0 / 1000.0));
        // Turned around, and past the bounds.
        assert_eq!(share_of(|s| cmp(day(900), Operator::Gt, d(s), s)), Some(900.0 / 1000.0));
        assert_eq!(share_of(|s| cmp(d(s), Operator::GtEq, day(5000), s)), Some(0.0));
        assert_eq!(share_of(|s| cmp(d(s), Operator::Eq, day(7), s)), Some(1.0 / 1000.0));
        // DataFusion's own estimate covers integers; anything besides ranges keeps it too.
        assert_eq!(share_of(|s| cmp(col("n", s).unwrap(), Operator::Gt, lit(5i64), s)), None);
        let mixed = |s: &Schema| {
            let range = cmp(d(s), Operator::Lt, day(150), s);
            let other = cmp(col("n", s).unwrap(), Operator::Gt, lit(5i64), s);
            cmp(range, Operator::And, other, s)
        };
        assert_eq!(share_of(mixed), None);
        assert_eq!(share_of(|s| cmp(d(s), Operator::NotEq, day(7), s)), None);
    }

    /// Over an Iceberg table's manifest bounds, the filter's estimate comes near the rows it
    /// keeps, where DataFusion's is a fifth of the rows scanned.
    #[tokio::test]
    async fn over_manifest_bounds_the_estimate_comes_near_the_rows_kept() {
        let dir = tempfile::tempdir().unwrap();
        let lake = crate::testing::demo_lake(dir.path(), 20_000).await;
        let engine = crate::testing::engine(lake, crate::Tuning::default());
        let ctx = engine.session();
        let value = async |sql: &str| {
            let b = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            b[0].column(0).as_primitive::<TimestampMicrosecondType>().value(0)
        };
        let (from, to) = (
            value("SELECT min(\"timestamp\") FROM glass.events_v2").await,
            value("SELECT max(\"timestamp\") FROM glass.events_v2").await,
        );
        // A tenth of the table's time, in its middle.
        let (a, b) = (from + (to - from) * 4 / 10, from + (to - from) / 2);
        let sql = format!(
            "SELECT count(*) AS n FROM glass.events_v2 WHERE \"timestamp\" >= to_timestamp_micros({a}) \
             AND \"timestamp\" < to_timestamp_micros({b})"
        );
        let kept = ctx.sql(&sql).await.unwrap().collect().await.unwrap()[0]
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .value(0) as usize;
        assert!(kept > 0, "{kept}");
        // The plan before any physical rule, with its filter, then with this rule.
        let unoptimized = SessionContext::new_with_state(
            SessionStateBuilder::new_from_existing(ctx.state()).with_physical_optimizer_rules(vec![]).build(),
        );
        let plan = unoptimized.sql(&sql).await.unwrap().create_physical_plan().await.unwrap();
        // The filter's estimate, and the rows of the files its scan reads (manifest pruning
        // has kept only the days the range can reach).
        let estimate = |plan: &Arc<dyn ExecutionPlan>| {
            let mut rows = None;
            plan.apply(|n| {
                if let Some(f) = n.as_any().downcast_ref::<FilterExec>() {
                    let of = |p: &dyn ExecutionPlan| {
                        p.partition_statistics(None).unwrap().num_rows.get_value().copied()
                    };
                    rows = Some((of(f).unwrap(), of(f.input().as_ref()).unwrap()));
                }
                Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
            })
            .unwrap();
            rows.unwrap()
        };
        let (theirs, scanned) = estimate(&plan);
        assert_eq!(theirs, scanned / 5);
        let (ours, _) = estimate(&RangeSelectivity.optimize(plan, &ConfigOptions::default()).unwrap());
        assert!(ours >= kept / 2 && ours <= kept * 2, "estimated {ours}, kept {kept}");
    }
}
