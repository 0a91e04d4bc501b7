//! The response body of a started query: its head and first batch encoded before the
//! response is committed, every later batch as it comes, within the result caps, then the
//! tail, or an abort that no client can take for a whole result.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;

use super::Started;
use super::encoder::Encoder;
use crate::error::SkiffError;
use crate::observe::QueryLog;
use crate::state::Cap;

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
