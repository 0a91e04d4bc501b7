//! Statement handles: the SQL text and any bound parameters travel inside the handle (and the
//! ticket made from it), so the server holds nothing between calls, any replica can serve any
//! call, and closing a prepared statement frees nothing because nothing was kept.

use std::io::Cursor;

use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use datafusion::common::ScalarValue;

use crate::error::{Result, SkiffError};

/// Marks a handle as one of ours, and its layout's version.
const MAGIC: &[u8] = b"skiff-stmt-1\n";

/// A statement: SQL plus, once a client has bound them, one row of parameter values.
#[derive(Debug, Clone)]
pub struct Statement {
    pub sql: String,
    params: Option<RecordBatch>,
}

impl Statement {
    pub fn new(sql: String) -> Self {
        Self { sql, params: None }
    }

    /// Binds parameter values. A prepared query runs once per execution, so exactly one row
    /// is accepted; an empty batch clears the binding.
    pub fn bind(mut self, batch: RecordBatch) -> Result<Self> {
        match batch.num_rows() {
            0 => self.params = None,
            1 => self.params = Some(batch),
            n => {
                return Err(SkiffError::BadRequest(format!(
                    "{n} parameter rows were bound; a query takes one row of parameter values"
                )));
            }
        }
        Ok(self)
    }

    /// The bound values, in order, for `$1`, `$2`, ...
    pub fn params(&self) -> Result<Vec<ScalarValue>> {
        let Some(b) = &self.params else { return Ok(Vec::new()) };
        b.columns()
            .iter()
            .map(|c| ScalarValue::try_from_array(c, 0))
            .collect::<Result<_, _>>()
            .map_err(|e| SkiffError::BadRequest(format!("unusable parameter value: {e}")))
    }

    pub fn encode(&self) -> Result<Bytes> {
        let mut out = Vec::with_capacity(MAGIC.len() + 4 + self.sql.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.sql.len() as u32).to_le_bytes());
        out.extend_from_slice(self.sql.as_bytes());
        if let Some(b) = &self.params {
            let mut w = StreamWriter::try_new(&mut out, &b.schema())?;
            w.write(b)?;
            w.finish()?;
        }
        Ok(out.into())
    }

    pub fn decode(handle: &[u8]) -> Result<Self> {
        let bad = || SkiffError::BadRequest("not a statement handle issued by skiff".into());
        let rest = handle.strip_prefix(MAGIC).ok_or_else(bad)?;
        let len = u32::from_le_bytes(rest.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
        let sql = rest.get(4..4 + len).ok_or_else(bad)?;
        let sql = String::from_utf8(sql.to_vec()).map_err(|_| bad())?;
        let tail = &rest[4 + len..];
        let params = if tail.is_empty() {
            None
        } else {
            let mut r = StreamReader::try_new(Cursor::new(tail), None).map_err(|_| bad())?;
            Some(r.next().ok_or_else(bad)?.map_err(|_| bad())?)
        };
        Ok(Self { sql, params })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn round_trip_with_parameters() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("$1", DataType::Utf8, true),
            Field::new("$2", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(StringArray::from(vec!["pageview"])), Arc::new(Int64Array::from(vec![7]))],
        )
        .unwrap();
        let s = Statement::new("SELECT $1, $2".into()).bind(batch).unwrap();
        let back = Statement::decode(&s.encode().unwrap()).unwrap();
        assert_eq!(back.sql, "SELECT $1, $2");
        assert_eq!(back.params().unwrap(), vec![ScalarValue::from("pageview"), ScalarValue::Int64(Some(7))]);
        assert!(Statement::decode(b"SELECT 1").is_err());
        assert!(Statement::decode(&s.encode().unwrap()[..20]).is_err());
    }
}
