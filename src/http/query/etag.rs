//! ETags of answers: a client whose copy is current gets 304 and nothing is executed.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::observe::QueryLog;

/// A weak ETag: the same answer, though not always the same bytes (rows without an ORDER BY
/// may come in another order).
pub fn etag(fingerprint: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("W/\"{fingerprint}\"")).expect("hex is a valid header value")
}

/// Whether `If-None-Match` holds `etag` (or `*`), compared weakly as RFC 9110 says.
pub fn if_none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_string();
    let ours = opaque(etag.to_str().unwrap_or(""));
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim() == "*" || opaque(t) == ours)
}

/// 304 Not Modified: no body, the ETag again.
pub fn not_modified(etag: HeaderValue, mut log: QueryLog) -> Response {
    log.finish(Ok(()));
    let mut res = StatusCode::NOT_MODIFIED.into_response();
    res.headers_mut().insert(header::ETAG, etag);
    res
}
