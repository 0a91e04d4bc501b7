//! `POST /query` (JSON rows) and `POST /streaming-query` (Arrow IPC): both stream.
//!
//! The first batch is awaited and encoded before the response starts, so planning errors,
//! errors in the first moments of execution and errors encoding the first rows get a real
//! status. An error after streaming began aborts the response (no clean end of array or
//! end-of-stream marker), so a client can never take a cut-short result for a whole one. A
//! client that goes away drops the stream, which cancels the query.
//!
//! Here: the routes and starting a query; `body` reads the request, `etag` answers a client
//! whose copy is current, `stream` makes the response body, `encoder` the bytes of each
//! encoding.

mod body;
pub mod encoder;
pub mod etag;
pub mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use skiff_engine::Query;
use skiff_lake::Names;
use skiff_lake::stats::QueryStats;

use super::RequestId;
use crate::encode::arrow_ipc;
use crate::error::Result;
use crate::observe::QueryLog;
use crate::state::AppState;
use body::read_body;
use encoder::{ArrowStream, Encoder, JsonArray};
use etag::{etag, if_none_match, not_modified};
use stream::{body_stream, streaming};

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
    respond(&state, id, "/streaming-query", &headers, body, ArrowStream::default(), arrow_ipc::CONTENT_TYPE)
        .await
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
