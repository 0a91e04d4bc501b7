//! The request body every query route takes: `{"query": "..."}`, checked before it is read.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use serde::Deserialize;

use crate::error::{Result, SkiffError};

/// The body every query route takes. Other fields (Basin clients send `warehouse`) are
/// accepted and ignored: skiff serves one lake.
#[derive(Debug, Deserialize)]
pub struct QueryBody {
    pub query: String,
}

/// Reads and checks a `{"query": "..."}` body within the size limit.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<QueryBody> {
    // Bodies are never decompressed: a compressed one would only fail later as bad JSON.
    if let Some(ce) = headers.get(header::CONTENT_ENCODING) {
        let ce = ce.to_str().unwrap_or("").trim().to_ascii_lowercase();
        if !ce.is_empty() && ce != "identity" {
            return Err(SkiffError::UnsupportedMediaType(format!(
                "compressed request bodies are not accepted (content-encoding: {ce}): send the JSON uncompressed"
            )));
        }
    }
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        let essence = ct.split(';').next().unwrap_or("").trim();
        // curl -d sends form-urlencoded by default; its body is still the JSON we expect.
        let ok = ["application/json", "text/plain", "application/x-www-form-urlencoded", ""]
            .contains(&essence)
            || essence.ends_with("+json");
        if !ok {
            return Err(SkiffError::UnsupportedMediaType(format!(
                "expected an application/json body, got content-type {essence}"
            )));
        }
    }
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(SkiffError::PayloadTooLarge { limit });
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if std::error::Error::source(&e).is_some_and(|c| c.is::<http_body_util::LengthLimitError>()) {
            SkiffError::PayloadTooLarge { limit }
        } else {
            SkiffError::BadRequest(format!("could not read the request body: {e}"))
        }
    })?;
    let bad = |why: &dyn std::fmt::Display| {
        SkiffError::BadRequest(format!(
            "the body must be a JSON object like {{\"query\": \"SELECT 1\"}}: {why}"
        ))
    };
    // serde reads a JSON array as a struct's fields in order: `["SELECT 1"]` is not a body.
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        return Err(bad(&"it is not an object"));
    }
    serde_json::from_slice::<QueryBody>(&bytes).map_err(|e| bad(&e))
}
