//! Arrow IPC stream encoding, one message at a time, so a response can stream.

use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;

pub const CONTENT_TYPE: &str = "application/vnd.apache.arrow.stream";

/// Writes the schema message first, then each batch, then the end-of-stream marker; each
/// call hands back the bytes produced so far.
pub struct IpcEncoder {
    writer: StreamWriter<Vec<u8>>,
}

impl IpcEncoder {
    /// Starts a stream; the returned bytes hold the schema message.
    pub fn new(schema: &SchemaRef) -> Result<(Self, Vec<u8>), ArrowError> {
        let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
        let head = std::mem::take(writer.get_mut());
        Ok((Self { writer }, head))
    }

    pub fn batch(&mut self, batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
        self.writer.write(batch)?;
        Ok(std::mem::take(self.writer.get_mut()))
    }

    /// The end-of-stream marker: only a stream that ends with it finished successfully.
    pub fn finish(mut self) -> Result<Vec<u8>, ArrowError> {
        self.writer.finish()?;
        Ok(std::mem::take(self.writer.get_mut()))
    }
}
