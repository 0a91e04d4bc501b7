//! The Basin SQL-compatible route: `POST /api/v1/accounts/{account}/basin-sql/query/{bucket}`
//! (and the legacy `r2-sql` path), Basin's envelope, type names and error codes, so a client
//! of Basin SQL switches to skiff by changing its base URL.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use skiff_lake::Names;
use skiff_lake::stats::QueryStats;

use super::RequestId;
use super::query::encoder::Encoder;
use super::query::etag::not_modified;
use super::query::stream::{body_stream, streaming};
use super::query::{Begun, begin};
use crate::encode::{basin, json};
use crate::error::SkiffError;
use crate::observe::QueryLog;
use crate::state::AppState;

/// The account and bucket in the path are not read (skiff serves one lake), so not extracted
/// either: a path segment that is not UTF-8 would otherwise be refused in plain text, before
/// auth and outside Basin's envelope.
pub async fn query(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut log = QueryLog::new(id.0.clone(), "basin");
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if !state.auth.check_header(auth) {
        // Basin tells a missing token (401) from a wrong one (403).
        let status = if auth.is_some() { StatusCode::FORBIDDEN } else { StatusCode::UNAUTHORIZED };
        let e = SkiffError::Unauthorized;
        log.finish(Err(&e));
        return failure(status, &e);
    }
    let names = match expand_versions(&headers) {
        Ok(true) => Names::Versioned,
        Ok(false) => Names::Physical,
        Err(e) => {
            log.finish(Err(&e));
            return failure(e.basin_status(), &e);
        }
    };
    match begin(&state, &headers, body, &mut log, names).await {
        Ok(Begun::NotModified(etag)) => not_modified(etag, log),
        Ok(Begun::Started(s)) => {
            let encoder = Envelope { request_id: id.0, has_rows: s.first.is_some(), stats: s.stats.clone() };
            let head = s.head();
            match body_stream(s, encoder, log, state.result_cap()) {
                Ok(body) => streaming(body, "application/json", head),
                Err(e) => failure(e.basin_status(), &e),
            }
        }
        Err(e) => {
            log.finish(Err(&e));
            failure(e.basin_status(), &e)
        }
    }
}

/// The request header that makes this route read `glass.events` as every version of the
/// table, as `/query` does. Without it each name is one physical table, as in Basin SQL, so
/// SQL that already unions the versions (as a Basin client writes it) counts every row once.
pub const EXPAND_VERSIONS: &str = "x-skiff-expand-versions";

fn expand_versions(headers: &HeaderMap) -> Result<bool, SkiffError> {
    let Some(v) = headers.get(EXPAND_VERSIONS) else { return Ok(false) };
    match v.to_str().unwrap_or("").trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        other => {
            Err(SkiffError::BadRequest(format!("{EXPAND_VERSIONS} must be true or false (got {other:?})")))
        }
    }
}

pub(crate) fn failure(status: StatusCode, e: &SkiffError) -> Response {
    let mut res = (status, axum::Json(basin::failure(e))).into_response();
    if let Some(secs) = e.retry_after() {
        res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(secs));
    }
    res
}

/// Streams the success envelope: everything up to `"rows": [` first, the rows as they come,
/// then the metrics, which are only final once the last row is out.
struct Envelope {
    request_id: String,
    has_rows: bool,
    stats: Arc<QueryStats>,
}

impl Encoder for Envelope {
    fn head(&mut self, schema: &SchemaRef) -> Result<Vec<u8>, arrow::error::ArrowError> {
        json::check_names(schema)?;
        // Basin answers an empty result with an empty schema.
        let schema = if self.has_rows { basin::schema(schema) } else { serde_json::Value::Array(vec![]) };
        let mut out = br#"{"success":true,"errors":[],"result":{"request_id":"#.to_vec();
        json::write_str(&mut out, &self.request_id);
        out.extend_from_slice(br#","schema":"#);
        out.extend_from_slice(schema.to_string().as_bytes());
        out.extend_from_slice(br#","rows":["#);
        Ok(out)
    }

    fn batch(
        &mut self,
        batch: &RecordBatch,
        first_row: &mut bool,
    ) -> Result<Vec<u8>, arrow::error::ArrowError> {
        json::rows(batch, first_row)
    }

    fn tail(&mut self) -> Result<Vec<u8>, arrow::error::ArrowError> {
        Ok(self.close(serde_json::json!([])))
    }

    /// Basin clients read `messages`: a cut result says so there.
    fn tail_truncated(&mut self, why: &str) -> Option<Result<Vec<u8>, arrow::error::ArrowError>> {
        let message = serde_json::json!([{"code": 10100, "message": format!("result truncated: {why}")}]);
        Some(Ok(self.close(message)))
    }
}

impl Envelope {
    fn close(&self, messages: serde_json::Value) -> Vec<u8> {
        let metrics = serde_json::json!({
            "r2_requests_count": self.stats.requests(),
            "files_scanned": self.stats.files_scanned(),
            "bytes_scanned": self.stats.bytes_scanned(),
            "files_planned": self.stats.files_planned(),
            "files_pruned": self.stats.files_pruned(),
            "result_cache": self.stats.result_cache(),
        });
        format!(r#"],"metrics":{metrics}}},"messages":{messages}}}"#).into_bytes()
    }
}
