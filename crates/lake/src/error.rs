//! The lake's errors, typed where they arise: a missing table, a catalog or object store that
//! cannot be reached, a file that cannot be decoded, a request the lake cannot serve. The
//! server maps them to statuses; the lake only says which it is.

/// What went wrong reading the lake. Messages never hold a secret.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LakeError {
    /// No such table or namespace.
    #[error("{0}")]
    TableNotFound(String),
    /// The catalog could not be asked or refused (down, credentials rejected): retryable.
    #[error("catalog is unavailable: {0}")]
    CatalogUnavailable(String),
    /// The object store could not be read: retryable.
    #[error("object store is unavailable: {0}")]
    StoreUnavailable(String),
    /// A data or metadata file that was read but is not what it should be (corrupt,
    /// truncated): retrying will not help.
    #[error("unreadable data: {0}")]
    Unreadable(String),
    /// What the lake cannot serve as asked (a feature Iceberg does not support here, versions
    /// whose schemas do not union): the query's, not the lake's.
    #[error("{0}")]
    Invalid(String),
}

impl LakeError {
    /// Classifies an Iceberg error from reading the lake's files by its kind and cause. An
    /// outage here is the object store's: callers that asked the catalog say so themselves
    /// (see `Lake::load`).
    pub fn from_iceberg(e: &iceberg::Error) -> Self {
        use iceberg::ErrorKind as K;
        let message = clean(&e.to_string());
        match e.kind() {
            K::TableNotFound | K::NamespaceNotFound => Self::TableNotFound(message),
            K::DataInvalid | K::FeatureUnsupported | K::PreconditionFailed => Self::Invalid(message),
            // The store answered, but the file is shorter than the table's metadata says (a
            // read past its end: an S3 416), or it does not decode (a corrupt manifest arrives
            // as an I/O-kind error caused by `DataInvalid`): retrying will not help.
            _ if caused_by(e, |c| {
                c.downcast_ref::<opendal::Error>()
                    .is_some_and(|o| o.kind() == opendal::ErrorKind::RangeNotSatisfied)
                    || c.downcast_ref::<iceberg::Error>().is_some_and(|i| i.kind() == K::DataInvalid)
            }) =>
            {
                Self::Unreadable(message)
            }
            _ => Self::StoreUnavailable(message),
        }
    }
}

impl From<iceberg::Error> for LakeError {
    fn from(e: iceberg::Error) -> Self {
        Self::from_iceberg(&e)
    }
}

/// Whether an Iceberg error came from the storage layer (OpenDAL) rather than from the
/// catalog: a SQL catalog reads a table's metadata file itself, so its failures mix both.
pub fn from_storage(e: &iceberg::Error) -> bool {
    caused_by(e, |c| c.is::<opendal::Error>())
}

/// Whether anything in `e`'s chain of causes is `what`.
fn caused_by(e: &iceberg::Error, what: impl Fn(&(dyn std::error::Error + 'static)) -> bool) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if what(c) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Names the file an Iceberg error is about, unless its message already does.
pub fn with_file(e: iceberg::Error, location: &str) -> iceberg::Error {
    let msg = e.to_string();
    if msg.contains(location) { e } else { e.with_context("file", location) }
}

/// Drops DataFusion's "Error during planning: " style prefixes that say nothing to a client.
pub fn clean(m: &str) -> String {
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

/// Why a catalog could not be connected to (or a demo lake written): printed on the console
/// by the server when it cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0}")]
    Msg(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("catalog: {0}")]
    Iceberg(#[from] iceberg::Error),
    #[error("catalog database: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("{0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("{0}")]
    Lake(#[from] LakeError),
}

pub type SetupResult<T> = std::result::Result<T, SetupError>;
