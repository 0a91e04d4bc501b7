//! A table and file statistics for the tests of per-file folding.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, DFSchema, ScalarValue, Statistics};
use datafusion::logical_expr::{Operator, ScalarUDF, ScalarUDFImpl};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Literal;
use datafusion::prelude::SessionContext;

/// ts (a timestamp), n (an integer), x (a float).
pub(super) fn table() -> Schema {
    Schema::new(vec![
        Field::new("ts", DataType::Timestamp(arrow::datatypes::TimeUnit::Microsecond, None), true),
        Field::new("n", DataType::Int64, true),
        Field::new("x", DataType::Float64, true),
    ])
}

pub(super) fn expr(sql: &str) -> Arc<dyn PhysicalExpr> {
    expr_in(&SessionContext::new(), sql)
}

/// `sql` over [`table`], planned with the functions of `ctx`.
pub(super) fn expr_in(ctx: &SessionContext, sql: &str) -> Arc<dyn PhysicalExpr> {
    let schema = DFSchema::try_from(table()).unwrap();
    ctx.create_physical_expr(ctx.parse_sql_expr(sql, &schema).unwrap(), &schema).unwrap()
}

pub(super) fn micros(ts: &str) -> ScalarValue {
    let t = chrono::NaiveDateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S").unwrap();
    ScalarValue::TimestampMicrosecond(Some(t.and_utc().timestamp_micros()), None)
}

/// A file's statistics: ts within [from, to], n within [lo, hi], x within [0, 1]; `nulls`
/// in every column.
pub(super) fn file(from: &str, to: &str, lo: i64, hi: i64, nulls: usize) -> Statistics {
    let column = |min, max| ColumnStatistics {
        null_count: Precision::Exact(nulls),
        min_value: Precision::Exact(min),
        max_value: Precision::Exact(max),
        ..ColumnStatistics::new_unknown()
    };
    Statistics {
        num_rows: Precision::Exact(100),
        total_byte_size: Precision::Absent,
        column_statistics: vec![
            column(micros(from), micros(to)),
            column(ScalarValue::Int64(Some(lo)), ScalarValue::Int64(Some(hi))),
            column(ScalarValue::Float64(Some(0.0)), ScalarValue::Float64(Some(1.0))),
        ],
    }
}

/// `ts <op> <timestamp>`, as the server plans it (SQL here would compare nanoseconds).
pub(super) fn at(op: Operator, ts: &str) -> Arc<dyn PhysicalExpr> {
    let table = table();
    let column = datafusion::physical_expr::expressions::col("ts", &table).unwrap();
    datafusion::physical_expr::expressions::binary(column, op, Arc::new(Literal::new(micros(ts))), &table)
        .unwrap()
}

/// A session without wrappers of built-in functions.
pub(super) fn no_wrappers(_: &dyn ScalarUDFImpl) -> Option<&ScalarUDF> {
    None
}
