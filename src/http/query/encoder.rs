//! The encodings a query route streams: JSON rows and Arrow IPC.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

use crate::encode::arrow_ipc::IpcEncoder;
use crate::encode::json;

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
        json::rows(batch, first_row)
    }
    fn tail(&mut self) -> Result<Vec<u8>, arrow::error::ArrowError> {
        Ok(b"]".to_vec())
    }
}

#[derive(Default)]
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
