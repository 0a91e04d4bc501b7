//! One error type for every front end, and the one place that maps it to an HTTP status,
//! a machine-readable code and a Basin SQL error code, so HTTP, Basin and Flight never disagree.
//! The engine's and the lake's typed errors arrive through `From`, variant by variant.

use axum::http::StatusCode;
use datafusion::error::DataFusionError;
use skiff_engine::error::QueryError;
use skiff_lake::error::{LakeError, SetupError};

/// What went wrong, in the terms a client can act on. Messages never hold a secret.
#[derive(Debug, thiserror::Error)]
pub enum SkiffError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("missing or invalid bearer token")]
    Unauthorized,
    #[error("SQL syntax error: {0}")]
    SqlSyntax(String),
    #[error("{0}")]
    InvalidQuery(String),
    #[error("{0}")]
    TableNotFound(String),
    #[error("{0}")]
    ReadOnly(String),
    #[error("not found: {0}")]
    RouteNotFound(String),
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    #[error("{dependency} is unavailable: {message}")]
    Unavailable { dependency: &'static str, message: String },
    #[error("query exceeded its memory or spill limit (--memory-limit, --max-spill-bytes): {0}")]
    ResourcesExhausted(String),
    #[error("overloaded: {0}; retry later")]
    Overloaded(String),
    #[error("query timed out (--query-timeout)")]
    Timeout,
    /// The client stopped reading a result that was still coming.
    #[error("{0}")]
    Stalled(String),
    /// The server is draining before it exits: no new queries, and what outlives the grace
    /// period is cancelled. Retryable: another instance (or this one, restarted) will answer.
    #[error("skiff is shutting down: {0}")]
    ShuttingDown(String),
    /// Listening, but not yet connected to the catalog; the message says what the last attempt
    /// met (an unreachable catalog, refused credentials). Retryable.
    #[error("skiff is starting: {0}")]
    Starting(String),
    #[error("{0}")]
    ResultTooLarge(String),
    /// A data or metadata file that cannot be read as what it should be (corrupt, truncated).
    #[error("unreadable data: {0}")]
    DataError(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = SkiffError> = std::result::Result<T, E>;

/// Why skiff could not start (or write a demo lake): printed on the console.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Msg(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Connecting to the catalog, reading its table list, writing the demo lake.
    #[error(transparent)]
    Lake(#[from] SetupError),
    /// Setting up the engine (its options, its runtime).
    #[error("{0}")]
    Engine(#[from] QueryError),
}

impl From<LakeError> for StartError {
    fn from(e: LakeError) -> Self {
        Self::Lake(e.into())
    }
}

pub type StartResult<T> = std::result::Result<T, StartError>;

impl SkiffError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) | Self::SqlSyntax(_) | Self::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            Self::ReadOnly(_) => StatusCode::FORBIDDEN,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::TableNotFound(_) | Self::RouteNotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unavailable { .. } | Self::ShuttingDown(_) | Self::Starting(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::ResourcesExhausted(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Self::Stalled(_) => StatusCode::REQUEST_TIMEOUT,
            Self::ResultTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::DataError(_) => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The status on the Basin-compatible route: Basin answers 400 for every query error
    /// (its code says which), so a missing table is 400 there, not 404.
    pub fn basin_status(&self) -> StatusCode {
        match self {
            Self::TableNotFound(_) | Self::ReadOnly(_) | Self::RouteNotFound(_) => StatusCode::BAD_REQUEST,
            other => other.status(),
        }
    }

    /// The gRPC code on the Flight SQL front end.
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Self::BadRequest(_)
            | Self::SqlSyntax(_)
            | Self::InvalidQuery(_)
            | Self::UnsupportedMediaType(_) => Code::InvalidArgument,
            Self::MethodNotAllowed(_) => Code::Unimplemented,
            Self::TableNotFound(_) | Self::RouteNotFound(_) => Code::NotFound,
            Self::Unauthorized => Code::Unauthenticated,
            Self::ReadOnly(_) => Code::PermissionDenied,
            Self::Timeout | Self::Stalled(_) => Code::DeadlineExceeded,
            Self::Unavailable { .. } | Self::ShuttingDown(_) | Self::Starting(_) => Code::Unavailable,
            Self::Overloaded(_)
            | Self::ResourcesExhausted(_)
            | Self::ResultTooLarge(_)
            | Self::PayloadTooLarge { .. } => Code::ResourceExhausted,
            Self::DataError(_) => Code::DataLoss,
            Self::Internal(_) => Code::Internal,
        }
    }

    /// Seconds a client should wait before retrying, for errors worth retrying.
    pub fn retry_after(&self) -> Option<&'static str> {
        match self {
            Self::Unavailable { .. } | Self::Overloaded(_) | Self::ShuttingDown(_) | Self::Starting(_) => {
                Some("1")
            }
            _ => None,
        }
    }

    /// Stable, machine-readable code for the JSON error body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::Unauthorized => "unauthorized",
            Self::SqlSyntax(_) => "sql_syntax_error",
            Self::InvalidQuery(_) => "invalid_query",
            Self::TableNotFound(_) => "table_not_found",
            Self::ReadOnly(_) => "read_only",
            Self::RouteNotFound(_) => "not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::Unavailable { .. } => "unavailable",
            Self::ResourcesExhausted(_) => "resources_exhausted",
            Self::Overloaded(_) => "overloaded",
            Self::Timeout => "timeout",
            Self::Stalled(_) => "client_stalled",
            Self::ShuttingDown(_) => "shutting_down",
            Self::Starting(_) => "starting",
            Self::ResultTooLarge(_) => "result_too_large",
            Self::DataError(_) => "data_error",
            Self::Internal(_) => "internal",
        }
    }

    /// Basin SQL's numeric error code (40003 syntax, 40004 invalid query, 40010 missing
    /// table, 80001 retryable outage), as Basin clients branch on them.
    pub fn basin_code(&self) -> u32 {
        match self {
            Self::SqlSyntax(_) => 40003,
            Self::TableNotFound(_) => 40010,
            Self::Unauthorized => 10000,
            Self::Unavailable { .. } | Self::ShuttingDown(_) | Self::Starting(_) => 80001,
            Self::Internal(_) => 10001,
            Self::Overloaded(_) => 42900,
            Self::Timeout | Self::Stalled(_) => 40008,
            Self::BadRequest(_)
            | Self::UnsupportedMediaType(_)
            | Self::PayloadTooLarge { .. }
            | Self::InvalidQuery(_)
            | Self::ReadOnly(_)
            | Self::RouteNotFound(_)
            | Self::MethodNotAllowed(_)
            | Self::ResultTooLarge(_)
            | Self::DataError(_)
            | Self::ResourcesExhausted(_) => 40004,
        }
    }
}

impl From<QueryError> for SkiffError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::BadRequest(m) => Self::BadRequest(m),
            QueryError::SqlSyntax(m) => Self::SqlSyntax(m),
            QueryError::InvalidQuery(m) => Self::InvalidQuery(m),
            QueryError::TableNotFound(m) => Self::TableNotFound(m),
            QueryError::ReadOnly(m) => Self::ReadOnly(m),
            QueryError::Unavailable { dependency, message } => Self::Unavailable { dependency, message },
            QueryError::ResourcesExhausted(m) => Self::ResourcesExhausted(m),
            QueryError::Overloaded(m) => Self::Overloaded(m),
            QueryError::Timeout => Self::Timeout,
            QueryError::Stalled(m) => Self::Stalled(m),
            QueryError::ShuttingDown(m) => Self::ShuttingDown(m),
            QueryError::DataError(m) => Self::DataError(m),
            QueryError::Internal(m) => Self::Internal(m),
        }
    }
}

impl From<DataFusionError> for SkiffError {
    fn from(e: DataFusionError) -> Self {
        QueryError::from_datafusion(e).into()
    }
}

impl From<arrow::error::ArrowError> for SkiffError {
    fn from(e: arrow::error::ArrowError) -> Self {
        match e {
            // An encoder's word that the query is at fault (`json::query_fault`).
            arrow::error::ArrowError::ExternalError(inner) => match inner.downcast::<SkiffError>() {
                Ok(e) => *e,
                Err(other) => SkiffError::Internal(format!("encoding the result: {other}")),
            },
            e => SkiffError::Internal(format!("encoding the result: {e}")),
        }
    }
}

impl From<SkiffError> for tonic::Status {
    fn from(e: SkiffError) -> Self {
        tonic::Status::new(e.grpc_code(), e.to_string())
    }
}

impl From<arrow_flight::error::FlightError> for SkiffError {
    fn from(e: arrow_flight::error::FlightError) -> Self {
        match e {
            arrow_flight::error::FlightError::Tonic(s) => match s.code() {
                tonic::Code::InvalidArgument => Self::BadRequest(s.message().to_string()),
                _ => Self::Internal(s.message().to_string()),
            },
            other => Self::Internal(format!("Flight encoding: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lake_outages_keep_their_dependency() {
        let e = DataFusionError::External(Box::new(LakeError::StoreUnavailable("gone".into())));
        let e = SkiffError::from(e);
        assert_eq!((e.code(), e.status().as_u16()), ("unavailable", 503));
        assert!(matches!(e, SkiffError::Unavailable { dependency: "object store", .. }));
    }

    #[test]
    fn codes_agree() {
        let e = SkiffError::Unavailable { dependency: "catalog", message: "down".into() };
        assert_eq!((e.status().as_u16(), e.basin_code()), (503, 80001));
        assert_eq!(SkiffError::SqlSyntax("x".into()).basin_code(), 40003);
        assert_eq!(SkiffError::TableNotFound("x".into()).basin_code(), 40010);
    }
}
