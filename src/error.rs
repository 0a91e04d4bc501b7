//! One error type for every front end, and the one place that maps it to an HTTP status,
//! a machine-readable code and a Basin SQL error code, so HTTP, Basin and Flight never disagree.

use axum::http::StatusCode;
use datafusion::error::DataFusionError;

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
    #[error("catalog: {0}")]
    Iceberg(#[from] iceberg::Error),
    #[error("catalog database: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("{0}")]
    DataFusion(#[from] DataFusionError),
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{0}")]
    Query(#[from] SkiffError),
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

    /// Classifies a DataFusion error (which wraps Iceberg and I/O errors) by its cause.
    pub fn from_datafusion(e: DataFusionError) -> Self {
        match e.find_root() {
            DataFusionError::SQL(p, _) => Self::SqlSyntax(p.to_string()),
            DataFusionError::ResourcesExhausted(m) => Self::ResourcesExhausted(m.clone()),
            DataFusionError::External(inner) => {
                if let Some(s) = inner.downcast_ref::<SkiffError>() {
                    return s.clone_shallow();
                }
                if let Some(ie) = inner.downcast_ref::<iceberg::Error>() {
                    return Self::from_iceberg(ie);
                }
                Self::classify_message(&e.strip_backtrace())
            }
            DataFusionError::ParquetError(pe) => match pe.as_ref() {
                // Reads go through Iceberg's FileIO: its errors are storage outages.
                parquet::errors::ParquetError::External(inner) => {
                    if let Some(ie) = inner.downcast_ref::<iceberg::Error>() {
                        return Self::from_iceberg(ie);
                    }
                    // A row filter evaluates the query's own conditions while decoding: their
                    // failures (a cast that does not hold) are the query's, not the file's.
                    if let Some(arrow::error::ArrowError::ComputeError(m)) = inner.downcast_ref()
                        && m.starts_with("Error evaluating filter predicate")
                    {
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
            | DataFusionError::Configuration(_) => {
                let m = e.strip_backtrace();
                if let Some(t) = missing_table(&m) {
                    return table_not_found(&t);
                }
                Self::InvalidQuery(clean(&m))
            }
            DataFusionError::Internal(_) => Self::Internal(clean(&e.strip_backtrace())),
            // A task DataFusion spawned panicked or was cancelled: skiff's bug, not the query's.
            DataFusionError::ExecutionJoin(j) => Self::Internal(if j.is_panic() {
                "the query hit a bug in skiff (a panic in one of its tasks); it is logged under this request's id"
                    .into()
            } else {
                format!("a task of the query ended early: {j}")
            }),
            _ => Self::classify_message(&e.strip_backtrace()),
        }
    }

    /// Iceberg errors: a missing table is the client's, a failed catalog or storage
    /// call is an outage (retryable), and anything else names the file or table it hit.
    pub fn from_iceberg(e: &iceberg::Error) -> Self {
        use iceberg::ErrorKind as K;
        let message = clean(&e.to_string());
        match e.kind() {
            K::TableNotFound | K::NamespaceNotFound => Self::TableNotFound(message),
            K::DataInvalid | K::FeatureUnsupported | K::PreconditionFailed => Self::InvalidQuery(message),
            // The store answered, but the file is shorter than the table's metadata says:
            // the file is broken, retrying will not help.
            _ if shorter_than_listed(&message)
                || invalid_data_inside(e)
                || message.contains("source: DataInvalid") =>
            {
                Self::DataError(message)
            }
            _ => Self::Unavailable {
                dependency: if message.contains("catalog") { "catalog" } else { "object store" },
                message,
            },
        }
    }

    fn classify_message(m: &str) -> Self {
        Self::InvalidQuery(clean(m))
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

impl From<DataFusionError> for SkiffError {
    fn from(e: DataFusionError) -> Self {
        Self::from_datafusion(e)
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

impl From<iceberg::Error> for SkiffError {
    fn from(e: iceberg::Error) -> Self {
        Self::from_iceberg(&e)
    }
}

/// opendal's words for a read past a file's end ("reader got too little data", an S3 416):
/// the file is shorter than the size its manifest lists. A body cut short in transit is
/// "http response got too little data" instead, and is an outage (opendal retries it).
fn shorter_than_listed(m: &str) -> bool {
    m.contains("reader got too little data") || m.contains("RangeNotSatisfied")
}

/// A file that was read but could not be decoded (a corrupt manifest or manifest list)
/// arrives as an I/O-kind error whose cause is `DataInvalid`.
fn invalid_data_inside(e: &iceberg::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.downcast_ref::<iceberg::Error>().is_some_and(|ie| ie.kind() == iceberg::ErrorKind::DataInvalid) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The table a "not found" planning error names, if that is what it is.
fn missing_table(m: &str) -> Option<String> {
    let rest = m.split("table '").nth(1)?;
    let name = rest.split("' not found").next()?;
    m.contains("not found").then(|| name.to_string())
}

/// A missing table, with a clearer word when the "table" was really a file path or URL,
/// which skiff never reads.
pub fn table_not_found(name: &str) -> SkiffError {
    if name.contains('/') || name.contains("://") || name.contains('\\') {
        return SkiffError::ReadOnly(format!("reading files or URLs as tables is not allowed: {name}"));
    }
    SkiffError::TableNotFound(format!("table not found: {name}"))
}

/// Drops DataFusion's "Error during planning: " style prefixes that say nothing to a client.
fn clean(m: &str) -> String {
    let mut s = m.trim();
    for p in [
        "Error during planning: ",
        "External error: ",
        "Execution error: ",
        "Schema error: ",
        "This feature is not implemented: ",
        "Internal error: ",
    ] {
        while let Some(r) = s.strip_prefix(p) {
            s = r;
        }
    }
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tables_are_recognised() {
        let e = DataFusionError::Plan("table 'datafusion.glass.nope' not found".into());
        assert!(matches!(SkiffError::from(e), SkiffError::TableNotFound(m) if m.contains("glass.nope")));
        let e = DataFusionError::Plan("table 'datafusion.public./etc/passwd' not found".into());
        assert!(matches!(SkiffError::from(e), SkiffError::ReadOnly(_)));
    }

    #[test]
    fn codes_agree() {
        let e = SkiffError::Unavailable { dependency: "catalog", message: "down".into() };
        assert_eq!((e.status().as_u16(), e.basin_code()), (503, 80001));
        assert_eq!(SkiffError::SqlSyntax("x".into()).basin_code(), 40003);
        assert_eq!(SkiffError::TableNotFound("x".into()).basin_code(), 40010);
    }
}
