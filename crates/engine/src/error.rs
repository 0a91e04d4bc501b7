//! The engine's errors: what a query can fail for, in the terms a client can act on, with
//! DataFusion's errors (which carry the lake's inside them) classified by their type. The
//! server maps each to an HTTP status, an error code and a Basin code; the engine does not.

use datafusion::error::DataFusionError;
use skiff_lake::error::{LakeError, clean};

/// Why a query failed. Messages never hold a secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueryError {
    /// A request the engine refuses before planning (empty, too long, a bad option).
    #[error("{0}")]
    BadRequest(String),
    #[error("SQL syntax error: {0}")]
    SqlSyntax(String),
    #[error("{0}")]
    InvalidQuery(String),
    #[error("{0}")]
    TableNotFound(String),
    /// A statement that would write, or a file or URL read as a table.
    #[error("{0}")]
    ReadOnly(String),
    /// A dependency (`catalog`, `object store`) could not be reached: retryable.
    #[error("{dependency} is unavailable: {message}")]
    Unavailable { dependency: &'static str, message: String },
    #[error("query exceeded its memory or spill limit (--memory-limit, --max-spill-bytes): {0}")]
    ResourcesExhausted(String),
    /// No query slot became free in time.
    #[error("overloaded: {0}; retry later")]
    Overloaded(String),
    #[error("query timed out (--query-timeout)")]
    Timeout,
    /// The client stopped reading a result that was still coming.
    #[error("{0}")]
    Stalled(String),
    /// The server is draining: no new queries, and what outlives the grace period is cancelled.
    #[error("skiff is shutting down: {0}")]
    ShuttingDown(String),
    /// A data or metadata file that cannot be read as what it should be (corrupt, truncated).
    #[error("unreadable data: {0}")]
    DataError(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = QueryError> = std::result::Result<T, E>;

impl From<LakeError> for QueryError {
    fn from(e: LakeError) -> Self {
        match e {
            LakeError::TableNotFound(m) => Self::TableNotFound(m),
            LakeError::CatalogUnavailable(message) => Self::Unavailable { dependency: "catalog", message },
            LakeError::StoreUnavailable(message) => Self::Unavailable { dependency: "object store", message },
            LakeError::Unreadable(m) => Self::DataError(m),
            LakeError::Invalid(m) => Self::InvalidQuery(m),
        }
    }
}

impl From<iceberg::Error> for QueryError {
    fn from(e: iceberg::Error) -> Self {
        LakeError::from_iceberg(&e).into()
    }
}

impl From<DataFusionError> for QueryError {
    fn from(e: DataFusionError) -> Self {
        Self::from_datafusion(e)
    }
}

impl QueryError {
    /// Classifies a DataFusion error (which wraps the lake's, Iceberg's and I/O errors) by
    /// its cause's type.
    pub fn from_datafusion(e: DataFusionError) -> Self {
        use datafusion::physical_optimizer::{PhysicalOptimizerRule, sanity_checker::SanityCheckPlan};
        // The optimiser's last check found a plan that does not give its nodes the order or
        // partitioning they need: the planner's bug (a DataFusion one), never the query's.
        if let DataFusionError::Context(rule, _) = &e
            && rule == SanityCheckPlan::new().name()
        {
            return Self::Internal(clean(&e.strip_backtrace()));
        }
        match e.find_root() {
            DataFusionError::SQL(p, _) => Self::SqlSyntax(p.to_string()),
            DataFusionError::ResourcesExhausted(m) => Self::ResourcesExhausted(m.clone()),
            DataFusionError::External(inner) => {
                if let Some(q) = inner.downcast_ref::<QueryError>() {
                    return q.clone_shallow();
                }
                if let Some(l) = inner.downcast_ref::<LakeError>() {
                    return l.clone().into();
                }
                if let Some(ie) = inner.downcast_ref::<iceberg::Error>() {
                    return LakeError::from_iceberg(ie).into();
                }
                // A worker's own errors come back as DataFusion's; a bare gRPC status is the
                // connection to a worker failing.
                if let Some(status) = inner.downcast_ref::<tonic::Status>() {
                    return Self::Unavailable { dependency: "worker", message: status.message().to_string() };
                }
                Self::InvalidQuery(clean(&e.strip_backtrace()))
            }
            DataFusionError::ParquetError(pe) => match pe.as_ref() {
                // Reads go through Iceberg's FileIO: its errors are storage outages.
                parquet::errors::ParquetError::External(inner) => {
                    if let Some(ie) = inner.downcast_ref::<iceberg::Error>() {
                        return LakeError::from_iceberg(ie).into();
                    }
                    // A row filter evaluates the query's own conditions while decoding: their
                    // failures (a cast that does not hold) are the query's, not the file's.
                    // DataFusion hands each on as a compute error, the one kind of error only a
                    // kernel run on decoded values gives (a file that does not decode is a
                    // Parquet error of its own kind).
                    if let Some(arrow::error::ArrowError::ComputeError(_)) = inner.downcast_ref() {
                        return Self::InvalidQuery(clean(&pe.to_string()));
                    }
                    Self::DataError(clean(&pe.to_string()))
                }
                other => Self::DataError(clean(&other.to_string())),
            },
            DataFusionError::IoError(io) => {
                Self::Unavailable { dependency: "object store", message: io.to_string() }
            }
            DataFusionError::ObjectStore(os) => {
                Self::Unavailable { dependency: "object store", message: os.to_string() }
            }
            DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Configuration(_) => Self::InvalidQuery(clean(&e.strip_backtrace())),
            DataFusionError::Internal(_) => Self::Internal(clean(&e.strip_backtrace())),
            // A batch that does not fit its plan's schema is a bug in the plan, not the query
            // (DataFusion 53 prunes a recursive CTE's columns that its recursive term reads).
            DataFusionError::ArrowError(ae, _)
                if matches!(ae.as_ref(), arrow::error::ArrowError::SchemaError(_)) =>
            {
                Self::Internal(clean(&e.strip_backtrace()))
            }
            // A task DataFusion spawned panicked or was cancelled: skiff's bug, not the query's.
            DataFusionError::ExecutionJoin(j) => Self::Internal(if j.is_panic() {
                "the query hit a bug in skiff (a panic in one of its tasks); it is logged under this request's id"
                    .into()
            } else {
                format!("a task of the query ended early: {j}")
            }),
            _ => Self::InvalidQuery(clean(&e.strip_backtrace())),
        }
    }

    /// A copy for errors that crossed DataFusion boxed inside `External`.
    fn clone_shallow(&self) -> Self {
        match self {
            Self::Unavailable { dependency, message } => {
                Self::Unavailable { dependency, message: message.clone() }
            }
            Self::TableNotFound(m) => Self::TableNotFound(m.clone()),
            Self::Timeout => Self::Timeout,
            Self::Stalled(m) => Self::Stalled(m.clone()),
            Self::ShuttingDown(m) => Self::ShuttingDown(m.clone()),
            Self::Overloaded(m) => Self::Overloaded(m.clone()),
            Self::InvalidQuery(m) => Self::InvalidQuery(m.clone()),
            Self::ReadOnly(m) => Self::ReadOnly(m.clone()),
            Self::DataError(m) => Self::DataError(m.clone()),
            Self::BadRequest(m) => Self::BadRequest(m.clone()),
            Self::ResourcesExhausted(m) => Self::ResourcesExhausted(m.clone()),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// A missing table, with a clearer word when the "table" was really a file path or URL,
/// which skiff never reads.
pub fn table_not_found(name: &str) -> QueryError {
    if name.contains('/') || name.contains("://") || name.contains('\\') {
        return QueryError::ReadOnly(format!("reading files or URLs as tables is not allowed: {name}"));
    }
    QueryError::TableNotFound(format!("table not found: {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_failing_while_decoding_is_the_query_and_a_bad_file_the_data() {
        use arrow::error::ArrowError;
        use parquet::errors::ParquetError;
        let decoding =
            |e: ArrowError| DataFusionError::ParquetError(Box::new(ParquetError::External(Box::new(e))));
        let e = decoding(ArrowError::ComputeError("Cannot cast string 'x' to value of Float64 type".into()));
        assert!(matches!(QueryError::from(e), QueryError::InvalidQuery(_)));
        let e = decoding(ArrowError::InvalidArgumentError("column lengths differ".into()));
        assert!(matches!(QueryError::from(e), QueryError::DataError(_)));
    }

    #[test]
    fn a_batch_off_its_schema_is_a_bug_and_a_bad_value_is_the_query() {
        use arrow::error::ArrowError;
        let e =
            DataFusionError::ArrowError(Box::new(ArrowError::SchemaError("project index 1".into())), None);
        assert!(matches!(QueryError::from(e), QueryError::Internal(_)));
        let e = DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None);
        assert!(matches!(QueryError::from(e), QueryError::InvalidQuery(_)));
    }

    /// DataFusion 53 plans this valid query without the sort its window needs (the partition
    /// key is a constant), and its own check refuses the plan: skiff's failure (500), not the
    /// caller's. When this query plans, DataFusion has the fix and the test needs another.
    #[tokio::test]
    async fn a_plan_the_optimiser_got_wrong_is_an_internal_error() {
        use arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
        use arrow::datatypes::{DataType, Field, Schema};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("ts", DataType::Int64, true),
            Field::new("v", DataType::Float64, true),
        ]));
        let t = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from_iter_values((0..100).map(|i| format!("a{}", i % 7)))),
                Arc::new(Int64Array::from_iter_values((0..100).map(|i| (i * 37) % 101))),
                Arc::new(Float64Array::from_iter_values((0..100).map(f64::from))),
            ],
        )
        .unwrap();
        let ctx = crate::testing::session(&Default::default(), 64 << 20, &[("t", t)]);
        let sql = "SELECT id, row_number() OVER (PARTITION BY id) AS r, lag(v) OVER (ORDER BY ts, id) AS l \
                   FROM t WHERE id = 'a3' ORDER BY id DESC LIMIT 10";
        let e = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap_err();
        assert!(matches!(QueryError::from(e), QueryError::Internal(_)));
    }

    #[test]
    fn lake_errors_keep_their_kind() {
        let e = DataFusionError::External(Box::new(LakeError::CatalogUnavailable("down".into())));
        assert!(matches!(QueryError::from(e), QueryError::Unavailable { dependency: "catalog", .. }));
        let e = DataFusionError::External(Box::new(LakeError::Unreadable("bad".into())));
        assert!(matches!(QueryError::from(e), QueryError::DataError(_)));
    }
}
