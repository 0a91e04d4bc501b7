//! Statement handles: the SQL text and any bound parameters travel inside the handle (and the
//! ticket made from it), so the server holds nothing between calls, any replica can serve any
//! call, and closing a prepared statement frees nothing because nothing was kept.

use std::panic::{AssertUnwindSafe, catch_unwind};

use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use datafusion::common::ScalarValue;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{Result, SkiffError};

/// Marks a handle as one of ours, and its layout's version.
const MAGIC: &[u8] = b"skiff-stmt-1\n";

/// A statement: SQL plus, once a client has bound them, one row of parameter values.
#[derive(Debug, Clone)]
pub struct Statement {
    pub sql: String,
    params: Option<RecordBatch>,
    /// How many values it takes, when the text says (see [`parameter_count`]).
    takes: Option<usize>,
}

impl Statement {
    /// Refuses SQL that mixes `?` and `$n` placeholders (see [`parameter_count`]).
    pub fn new(sql: String) -> Result<Self> {
        let takes = parameter_count(&sql)?;
        Ok(Self { sql, params: None, takes })
    }

    /// Binds parameter values. A prepared query runs once per execution, so exactly one row
    /// is accepted; an empty batch clears the binding. One value per placeholder: DataFusion
    /// would ignore extra values, so a client's miscount would go unnoticed.
    pub fn bind(mut self, batch: RecordBatch) -> Result<Self> {
        match batch.num_rows() {
            0 => self.params = None,
            1 => {
                let got = batch.num_columns();
                if let Some(want) = self.takes
                    && got != want
                {
                    return Err(SkiffError::BadRequest(format!(
                        "{got} parameter value(s) bound to a statement that takes {want}"
                    )));
                }
                self.params = Some(batch)
            }
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

    /// Handles come back from clients, so any byte may be forged: every check of a fresh
    /// statement and binding applies again, and no content can abort or panic the process.
    pub fn decode(handle: &[u8]) -> Result<Self> {
        let bad = || SkiffError::BadRequest("not a statement handle issued by skiff".into());
        let rest = handle.strip_prefix(MAGIC).ok_or_else(bad)?;
        let len = u32::from_le_bytes(rest.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
        let sql = rest.get(4..4 + len).ok_or_else(bad)?;
        let stmt = Self::new(String::from_utf8(sql.to_vec()).map_err(|_| bad())?)?;
        let tail = &rest[4 + len..];
        if tail.is_empty() {
            return Ok(stmt);
        }
        // Arrow's readers panic on buffers that point outside the body; nothing here is shared
        // state, so a caught panic is just one more unreadable handle.
        let batch = catch_unwind(AssertUnwindSafe(|| one_batch(tail))).ok().flatten().ok_or_else(bad)?;
        stmt.bind(batch)
    }
}

/// The one record batch of an IPC stream, or `None`. `StreamDecoder` reads only the bytes
/// that are there (a `StreamReader` allocates the body length a message claims, before
/// reading it: a forged length of a terabyte aborts the process).
fn one_batch(stream: &[u8]) -> Option<RecordBatch> {
    if !plain_stream(stream) {
        return None;
    }
    let mut buf = Buffer::from(stream);
    let mut decoder = StreamDecoder::new();
    let mut batches = Vec::new();
    while !buf.is_empty() {
        batches.extend(decoder.decode(&mut buf).ok()?);
    }
    decoder.finish().ok()?;
    (batches.len() == 1).then(|| batches.pop()).flatten()
}

/// Whether an IPC stream's messages are framed within it and each passes [`check_message`].
fn plain_stream(mut rest: &[u8]) -> bool {
    loop {
        rest = rest.strip_prefix(&[0xff; 4]).unwrap_or(rest);
        let Some((len, after)) = rest.split_first_chunk::<4>() else { return rest.is_empty() };
        let len = u32::from_le_bytes(*len) as usize;
        if len == 0 {
            return true;
        }
        let Some(message) = after.get(..len).and_then(|h| arrow::ipc::root_as_message(h).ok()) else {
            return false;
        };
        let body = usize::try_from(message.bodyLength()).ok();
        match body.filter(|&b| check_message(&message, b).is_ok()).and_then(|b| after.get(len..)?.get(b..)) {
            Some(next) => rest = next,
            None => return false,
        }
    }
}

/// Checks a client's IPC message before arrow decodes it, whose `body_len` bytes follow:
/// - no compression: each compressed buffer states its decompressed size and arrow allocates
///   that before decompressing, so one forged number aborts the process. Handles are never
///   compressed, and parameter values are one small row.
/// - every buffer within the body: arrow panics on one outside it (the panic is caught
///   anyway, but a check costs less than a panic and its backtrace in the log).
pub fn check_message(message: &arrow::ipc::Message, body_len: usize) -> Result<(), &'static str> {
    let Some(batch) =
        message.header_as_record_batch().or_else(|| message.header_as_dictionary_batch()?.data())
    else {
        return Ok(());
    };
    if batch.compression().is_some() {
        return Err("compressed buffers are not accepted");
    }
    let within = |b: &arrow::ipc::Buffer| {
        let (offset, len) = (u64::try_from(b.offset()), u64::try_from(b.length()));
        matches!((offset, len), (Ok(o), Ok(l)) if o.checked_add(l).is_some_and(|end| end <= body_len as u64))
    };
    match batch.buffers().is_none_or(|bs| bs.iter().all(within)) {
        true => Ok(()),
        false => Err("a buffer lies outside the message body"),
    }
}

/// How many values a statement takes: one per `?` (the engine numbers them `$1`, `$2`, ...),
/// else the highest `$n`. `None` when the text does not tokenize or names a placeholder
/// (`$name`): the planner has the last word then. Mixing the styles is refused, as the
/// engine numbers `?` from 1 and `SELECT $1, ?` would bind the first value twice.
fn parameter_count(sql: &str) -> Result<Option<usize>> {
    if !sql.contains(['?', '$']) {
        return Ok(Some(0));
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else { return Ok(None) };
    let (mut marks, mut highest) = (0, 0);
    for t in tokens {
        match t {
            Token::Placeholder(p) if p == "?" => marks += 1,
            Token::Placeholder(p) => match p.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()) {
                Some(n) => highest = highest.max(n),
                None => return Ok(None),
            },
            _ => {}
        }
    }
    if marks > 0 && highest > 0 {
        return Err(SkiffError::BadRequest(
            "the statement mixes `?` and `$n` placeholders; use one style or the other".into(),
        ));
    }
    Ok(Some(marks.max(highest)))
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
        let s = Statement::new("SELECT $1, $2".into()).unwrap().bind(batch.clone()).unwrap();
        let back = Statement::decode(&s.encode().unwrap()).unwrap();
        assert_eq!(back.sql, "SELECT $1, $2");
        assert_eq!(back.params().unwrap(), vec![ScalarValue::from("pageview"), ScalarValue::Int64(Some(7))]);
        assert!(Statement::decode(b"SELECT 1").is_err());
        assert!(Statement::decode(&s.encode().unwrap()[..20]).is_err());
        let short = s.encode().unwrap();
        assert!(Statement::decode(&short[..short.len() - 9]).is_err());
        // One value per placeholder, and one placeholder style.
        assert!(Statement::new("SELECT $1".into()).unwrap().bind(batch.clone()).is_err());
        assert!(Statement::new("SELECT ?, ?".into()).unwrap().bind(batch).is_ok());
        assert!(Statement::new("SELECT $1, ?".into()).is_err());
    }

    #[test]
    fn placeholders_are_counted() {
        assert_eq!(parameter_count("SELECT 1").unwrap(), Some(0));
        assert_eq!(parameter_count("SELECT ?, '?' -- ?\n, ?").unwrap(), Some(2));
        assert_eq!(parameter_count("SELECT $2, '$5'").unwrap(), Some(2));
        assert_eq!(parameter_count("SELECT $name").unwrap(), None);
        assert!(parameter_count("SELECT $1 AS a, ? AS b").is_err());
    }
}
