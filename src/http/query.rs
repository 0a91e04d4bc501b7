//! `POST /query` (JSON rows) and `POST /streaming-query` (Arrow IPC): both stream.
//!
//! The first batch is awaited and encoded before the response starts, so planning errors,
//! errors in the first moments of execution and errors encoding the first rows get a real
//! status. An error after streaming began aborts the response (no clean end of array or
//! end-of-stream marker), so a client can never take a cut-short result for a whole one. A
//! client that goes away drops the stream, which cancels the query.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use serde::Deserialize;
use skiff_engine::Query;
use skiff_lake::Names;
use skiff_lake::stats::QueryStats;

use super::RequestId;
use crate::encode::arrow_ipc::{self, IpcEncoder};
use crate::encode::json;
use crate::error::{Result, SkiffError};
use crate::observe::QueryLog;
use crate::state::{AppState, Cap};

/// The body every query route takes. Other fields (Basin clients send `warehouse`) are
/// accepted and ignored: skiff serves one lake.
#[derive(Debug, Deserialize)]
pub struct QueryBody {
    pub query: String,
}

pub async fn json_rows(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(&state, id, "/query", &headers, body, JsonArray, "application/json").await
}

pub async fn arrow_stream(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(&state, id, "/streaming-query", &headers, body, ArrowStream(None), arrow_ipc::CONTENT_TYPE).await
}

async fn respond<E: Encoder>(
    state: &AppState,
    id: RequestId,
    route: &'static str,
    headers: &HeaderMap,
    body: Body,
    encoder: E,
    content_type: &'static str,
) -> Response {
    let mut log = QueryLog::new(id.0, route);
    match begin(state, headers, body, &mut log, Names::Versioned).await {
        Ok(Begun::NotModified(etag)) => not_modified(etag, log),
        Ok(Begun::Started(s)) => {
            let head = s.head();
            match body_stream(s, encoder, log, state.result_cap()) {
                Ok(body) => streaming(body, content_type, head),
                Err(e) => e.into_response(),
            }
        }
        Err(e) => {
            log.finish(Err(&e));
            e.into_response()
        }
    }
}

/// A started query, or the client's copy of the answer is current.
pub enum Begun {
    Started(Started),
    /// The request's `If-None-Match` names the answer's ETag: nothing was executed.
    NotModified(HeaderValue),
}

/// Reads the body and starts its query, with table names resolved as `names` says, noting in
/// the log what it needs.
pub async fn begin(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    log: &mut QueryLog,
    names: Names,
) -> Result<Begun> {
    let body = read_body(headers, body, state.max_body_bytes).await?;
    log.set_sql(&body.query);
    let started = Instant::now();
    let query = match names {
        Names::Versioned => state.engine.execute(&body.query).instrument(log.span()).await?,
        Names::Physical => {
            state.engine.execute_in(names, &body.query, Vec::new()).instrument(log.span()).await?
        }
    };
    log.set_stats(query.stats.clone());
    let etag = query.fingerprint.as_deref().map(etag);
    if let Some(etag) = &etag
        && if_none_match(headers, etag)
    {
        return Ok(Begun::NotModified(etag.clone()));
    }
    first_batch(query, etag, started).await.map(Begun::Started)
}

/// A weak ETag: the same answer, though not always the same bytes (rows without an ORDER BY
/// may come in another order).
fn etag(fingerprint: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("W/\"{fingerprint}\"")).expect("hex is a valid header value")
}

/// Whether `If-None-Match` holds `etag` (or `*`), compared weakly as RFC 9110 says.
fn if_none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
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

/// A 200 response whose body is the given stream, with the given headers.
pub fn streaming(
    stream: impl futures::Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
    content_type: &'static str,
    head: HeaderMap,
) -> Response {
    let mut res = Body::from_stream(stream).into_response();
    res.headers_mut().extend(head);
    res.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
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

/// A query that has produced its first batch (or finished) without error.
pub struct Started {
    pub schema: SchemaRef,
    pub first: Option<RecordBatch>,
    pub rest: SendableRecordBatchStream,
    pub stats: Arc<QueryStats>,
    etag: Option<HeaderValue>,
    /// From the request to the first batch.
    first_after: Duration,
}

impl Started {
    /// What the query cost up to its first batch, as response headers. For a result that
    /// comes in one batch (an aggregation) that is the whole query; the log line,
    /// `system.queries` and the Basin envelope have the final numbers of a long stream.
    pub fn head(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(etag) = &self.etag {
            h.insert(header::ETAG, etag.clone());
        }
        let st = &self.stats;
        h.insert("x-skiff-result-cache", HeaderValue::from_static(st.result_cache()));
        for (name, n) in [
            ("x-skiff-files-planned", st.files_planned()),
            ("x-skiff-files-pruned", st.files_pruned()),
            ("x-skiff-files-scanned", st.files_scanned()),
            ("x-skiff-bytes-scanned", st.bytes_scanned()),
        ] {
            h.insert(name, HeaderValue::from(n));
        }
        let ms = self.first_after.as_secs_f64() * 1000.0;
        if let Ok(v) = HeaderValue::from_str(&format!("first-batch;dur={ms:.1}")) {
            h.insert("server-timing", v);
        }
        h
    }
}

/// Waits for a started query's first batch.
pub async fn first_batch(mut q: Query, etag: Option<HeaderValue>, since: Instant) -> Result<Started> {
    // The first batch with rows, or none: `first == None` means the result is empty.
    let first = loop {
        match q.stream.next().await {
            Some(Ok(b)) if b.num_rows() == 0 => continue,
            Some(Ok(b)) => break Some(b),
            Some(Err(e)) => return Err(e.into()),
            None => break None,
        }
    };
    Ok(Started {
        schema: q.schema,
        first,
        rest: q.stream,
        stats: q.stats,
        etag,
        first_after: since.elapsed(),
    })
}

/// Turns batches into response bytes.
pub trait Encoder: Send + 'static {
    fn head(&mut self, schema: &SchemaRef) -> Result<Vec<u8>, arrow::error::ArrowError>;
    fn batch(
        &mut self,
        batch: &RecordBatch,
        first_row: &mut bool,
    ) -> Result<Vec<u8>, arrow::error::ArrowError>;
    fn tail(&mut self) -> Result<Vec<u8>, arrow::error::ArrowError>;
    /// Ends a result cut at a limit, saying so, if this encoding has a way to say it. Without
    /// one the response fails instead, so a cut result is never taken for a whole one.
    fn tail_truncated(&mut self, _why: &str) -> Option<Result<Vec<u8>, arrow::error::ArrowError>> {
        None
    }
}

pub struct JsonArray;

impl Encoder for JsonArray {
    fn head(&mut self, schema: &SchemaRef) -> Result<Vec<u8>, arrow::error::ArrowError> {
        json::check_names(schema)?;
        Ok(b"[".to_vec())
    }
    fn batch(
        &mut self,
        batch: &RecordBatch,
        first_row: &mut bool,
    ) -> Result<Vec<u8>, arrow::error::ArrowError> {
        let mut out = Vec::with_capacity(batch.num_rows() * 64);
        json::write_rows(batch, &mut out, first_row)?;
        Ok(out)
    }
    fn tail(&mut self) -> Result<Vec<u8>, arrow::error::ArrowError> {
        Ok(b"]".to_vec())
    }
}

pub struct ArrowStream(Option<IpcEncoder>);

impl Encoder for ArrowStream {
    fn head(&mut self, schema: &SchemaRef) -> Result<Vec<u8>, arrow::error::ArrowError> {
        let (enc, head) = IpcEncoder::new(schema)?;
        self.0 = Some(enc);
        Ok(head)
    }
    fn batch(&mut self, batch: &RecordBatch, _: &mut bool) -> Result<Vec<u8>, arrow::error::ArrowError> {
        self.0.as_mut().expect("head first").batch(batch)
    }
    fn tail(&mut self) -> Result<Vec<u8>, arrow::error::ArrowError> {
        self.0.take().expect("head first").finish()
    }
}

enum Phase {
    /// Batches are still coming.
    Body,
    /// A cap was reached: the result ends here, saying why.
    Truncated(String),
    /// The tail is encoded.
    Done,
}

struct BodyState<E> {
    phase: Phase,
    /// Encoded but not yet handed to the response: the head and the first batch.
    pending: Option<Vec<u8>>,
    cap: Cap,
    /// Bytes of rows encoded so far, what `cap.bytes` limits.
    encoded: u64,
    rest: SendableRecordBatchStream,
    encoder: E,
    first_row: bool,
    log: QueryLog,
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body: the head and the first batch, every later batch as it comes, the tail.
///
/// The head and the first batch are encoded here, before the response is committed: an error
/// there (an unsupported time zone, duplicate column names for JSON, a first batch already over
/// a cap the encoding cannot mark as cut) is logged and returned, for an error response with
/// its status instead of a 200 whose body breaks off before its first byte.
pub fn body_stream<E: Encoder>(
    s: Started,
    encoder: E,
    log: QueryLog,
    cap: Cap,
) -> Result<impl futures::Stream<Item = Result<Bytes, BoxError>> + Send, SkiffError> {
    let mut st = BodyState {
        phase: Phase::Body,
        pending: None,
        cap,
        encoded: 0,
        rest: s.rest,
        encoder,
        first_row: true,
        log,
    };
    if let Err(e) = st.open(&s.schema, s.first) {
        // Nothing was sent.
        (st.log.rows, st.log.bytes, st.log.truncated) = (0, 0, false);
        st.log.finish(Err(&e));
        return Err(e);
    }
    Ok(futures::stream::unfold(st, |mut st| async move {
        loop {
            let item = match st.pending.take() {
                Some(bytes) => Ok(bytes),
                None => match st.phase {
                    Phase::Body => match st.rest.next().await {
                        Some(Ok(b)) => st.emit(&b),
                        Some(Err(e)) => Err(e.into()),
                        None => {
                            st.phase = Phase::Done;
                            st.encoder.tail().map_err(SkiffError::from)
                        }
                    },
                    Phase::Truncated(ref why) => {
                        let why = why.clone();
                        st.truncate(why)
                    }
                    Phase::Done => return None,
                },
            };
            return match item {
                Ok(bytes) => {
                    st.log.bytes += bytes.len() as u64;
                    if matches!(st.phase, Phase::Done) {
                        st.log.finish(Ok(()));
                    } else if bytes.is_empty() {
                        continue;
                    }
                    Some((Ok(Bytes::from(bytes)), st))
                }
                Err(e) => Some((Err(st.fail(e)), st)),
            };
        }
    }))
}

impl<E: Encoder> BodyState<E> {
    /// Encodes the head and the first batch into `pending`.
    fn open(&mut self, schema: &SchemaRef, first: Option<RecordBatch>) -> Result<(), SkiffError> {
        let mut out = self.encoder.head(schema)?;
        if let Some(b) = first {
            out.extend(self.emit(&b)?);
        }
        if let Phase::Truncated(ref why) = self.phase {
            let why = why.clone();
            out.extend(self.truncate(why)?);
        }
        self.pending = Some(out);
        Ok(())
    }

    /// Encodes a batch within the result caps; at a cap, keeps what fits and moves on to
    /// ending the response as truncated.
    fn emit(&mut self, batch: &RecordBatch) -> Result<Vec<u8>, SkiffError> {
        let room = self.cap.rows.saturating_sub(self.log.rows);
        let batch = if (batch.num_rows() as u64) > room {
            self.phase = Phase::Truncated(format!(
                "the result has more than {} rows (--max-result-rows)",
                self.cap.rows
            ));
            batch.slice(0, room as usize)
        } else {
            batch.clone()
        };
        self.log.rows += batch.num_rows() as u64;
        let out =
            if batch.num_rows() > 0 { self.encoder.batch(&batch, &mut self.first_row)? } else { Vec::new() };
        self.encoded += out.len() as u64;
        if self.encoded > self.cap.bytes && matches!(self.phase, Phase::Body) {
            self.phase = Phase::Truncated(format!(
                "the result is larger than {} bytes (--max-result-bytes)",
                self.cap.bytes
            ));
        }
        Ok(out)
    }

    /// Ends a result cut at a cap in the encoding's own words (Basin's `messages`), or, when it
    /// has none, with an error, so a cut result is never taken for a whole one.
    fn truncate(&mut self, why: String) -> Result<Vec<u8>, SkiffError> {
        self.phase = Phase::Done;
        let tail = self.encoder.tail_truncated(&why).ok_or(SkiffError::ResultTooLarge(why))??;
        self.log.truncated = true;
        Ok(tail)
    }
}

impl<E> BodyState<E> {
    fn fail(&mut self, e: SkiffError) -> BoxError {
        self.phase = Phase::Done;
        self.log.finish(Err(&e));
        Box::new(e)
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
