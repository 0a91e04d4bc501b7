//! Arrow → JSON rows: one object per row, keyed by column name, nulls explicit.
//!
//! | Arrow type | JSON |
//! |---|---|
//! | Null | `null` |
//! | Boolean | `true` / `false` |
//! | Int*, UInt* | number |
//! | Float16/32/64 | number, the shortest digits of its own width (`0.1`); NaN and ±Infinity → `null` |
//! | Decimal128/256 | number, exact decimal text (`12.30`) |
//! | Utf8, LargeUtf8, Utf8View | string |
//! | Binary, LargeBinary, BinaryView, FixedSizeBinary | string, standard base64 |
//! | Date32, Date64 | `"2026-10-10"` |
//! | Timestamp, no zone or UTC | `"2026-10-10T18:29:21.000000Z"` (nanosecond units: 9 digits), any year |
//! | Timestamp with another zone | RFC 3339 in that zone, `"…T20:29:21.000000+02:00"` |
//! | Time32/64 | `"18:29:21.000000"` |
//! | Duration, Interval | string, as Arrow prints it (`"P0DT0H0M1.5S"`-style) |
//! | List, LargeList, FixedSizeList | array |
//! | Struct | object |
//! | Map | object when keys are strings, else array of `{"key", "value"}` |
//! | Dictionary | the value it points to |
//! | Union (`json_get`) | its member's value; JSON text members (`array`, `object`) as that JSON |
//! | anything else | string, as Arrow prints it |
//!
//! Hand-written rather than arrow-json's `Encoder`: measured against arrow-json 58 with
//! explicit nulls (`benches/json_rows.rs`, 2 vCPU Intel Xeon sandbox, 2026-12-06), 17 of 35
//! column types come out different (binary as hex, timestamps and times without fixed
//! fraction digits or `Z`, Date64 with a time, `1.0e20` for `1e20`, `f16` widened to
//! `0.099975586`, `\b` and `\f` escapes, an error for maps with non-string keys), so an
//! `EncoderFactory` would have to carry most of this module anyway; and on 1M rows of
//! strings, ints, timestamps and doubles with nulls, arrow-json (given this module's
//! timestamps, for identical bytes) wrote 177–181 MB/s against 183–185 MB/s here.

use std::io::Write;

use arrow::array::*;
use arrow::datatypes::*;
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone};

/// [`write_rows`] into a buffer of its own.
pub fn rows(batch: &RecordBatch, first: &mut bool) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::with_capacity(batch.num_rows() * 64);
    write_rows(batch, &mut out, first)?;
    Ok(out)
}

/// Appends every row of `batch` to `out` as JSON objects, separated by commas; `first`
/// says whether a row has been written before (the caller writes `[` and `]`).
pub fn write_rows(batch: &RecordBatch, out: &mut Vec<u8>, first: &mut bool) -> Result<(), ArrowError> {
    let schema = batch.schema();
    let keys: Vec<Vec<u8>> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut k = Vec::new();
            write_str(&mut k, f.name());
            k.push(b':');
            k
        })
        .collect();
    let mut encoders = batch.columns().iter().map(|c| encoder(c.as_ref())).collect::<Result<Vec<_>, _>>()?;
    for row in 0..batch.num_rows() {
        if !*first {
            out.push(b',');
        }
        *first = false;
        out.push(b'{');
        for (i, enc) in encoders.iter_mut().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(&keys[i]);
            enc.write(row, out);
        }
        out.push(b'}');
    }
    Ok(())
}

/// Refuses a schema with two columns of one name: a JSON object cannot carry both keys, and
/// clients would keep one value and silently drop the other.
pub fn check_names(schema: &Schema) -> Result<(), ArrowError> {
    let mut seen = std::collections::HashSet::new();
    match schema.fields().iter().find(|f| !seen.insert(f.name())) {
        Some(f) => Err(query_fault(format!(
            "the result has more than one column named {:?}, and a JSON object cannot carry both: \
             give the columns distinct names with AS",
            f.name()
        ))),
        None => Ok(()),
    }
}

/// An encoding error that is the query's fault (400 `invalid_query`), not a bug: carried in
/// Arrow's error type to the HTTP front end, which unwraps it.
fn query_fault(message: String) -> ArrowError {
    ArrowError::ExternalError(Box::new(crate::error::SkiffError::InvalidQuery(message)))
}

/// Encodes one value of a column.
pub trait Encode {
    fn write(&mut self, row: usize, out: &mut Vec<u8>);
}

/// Writes `null` for null slots, else the inner encoder's value.
struct Nullable<'a, E> {
    nulls: Option<&'a arrow::buffer::NullBuffer>,
    inner: E,
}

impl<E: FnMut(usize, &mut Vec<u8>)> Encode for Nullable<'_, E> {
    fn write(&mut self, row: usize, out: &mut Vec<u8>) {
        if self.nulls.is_some_and(|n| n.is_null(row)) {
            out.extend_from_slice(b"null");
        } else {
            (self.inner)(row, out)
        }
    }
}

fn boxed<'a, E: FnMut(usize, &mut Vec<u8>) + 'a>(array: &'a dyn Array, inner: E) -> Box<dyn Encode + 'a> {
    Box::new(Nullable { nulls: array.nulls(), inner })
}

/// The encoder for a column, chosen once per batch.
pub fn encoder(array: &dyn Array) -> Result<Box<dyn Encode + '_>, ArrowError> {
    macro_rules! ints {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            boxed(array, move |i, out: &mut Vec<u8>| {
                out.extend_from_slice(itoa::Buffer::new().format(a.value(i)).as_bytes())
            })
        }};
    }
    macro_rules! floats {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            boxed(array, move |i, out: &mut Vec<u8>| write_float(out, a.value(i)))
        }};
    }
    Ok(match array.data_type() {
        DataType::Null => {
            Box::new(Nullable { nulls: None, inner: |_, out: &mut Vec<u8>| out.extend_from_slice(b"null") })
        }
        DataType::Boolean => {
            let a = array.as_boolean();
            boxed(array, move |i, out: &mut Vec<u8>| {
                out.extend_from_slice(if a.value(i) { b"true" } else { b"false" })
            })
        }
        DataType::Int8 => ints!(Int8Type),
        DataType::Int16 => ints!(Int16Type),
        DataType::Int32 => ints!(Int32Type),
        DataType::Int64 => ints!(Int64Type),
        DataType::UInt8 => ints!(UInt8Type),
        DataType::UInt16 => ints!(UInt16Type),
        DataType::UInt32 => ints!(UInt32Type),
        DataType::UInt64 => ints!(UInt64Type),
        DataType::Float16 => {
            let a = array.as_primitive::<Float16Type>();
            boxed(array, move |i, out: &mut Vec<u8>| write_float(out, f16_shortest(a.value(i))))
        }
        DataType::Float32 => floats!(Float32Type),
        DataType::Float64 => floats!(Float64Type),
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => {
            let f = ArrayFormatter::try_new(array, &FormatOptions::default())?;
            boxed(array, move |i, out: &mut Vec<u8>| {
                let _ = write!(out, "{}", f.value(i));
            })
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            boxed(array, move |i, out: &mut Vec<u8>| write_str(out, a.value(i)))
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            boxed(array, move |i, out: &mut Vec<u8>| write_str(out, a.value(i)))
        }
        DataType::Utf8View => {
            let a = array.as_string_view();
            boxed(array, move |i, out: &mut Vec<u8>| write_str(out, a.value(i)))
        }
        DataType::Binary => {
            let a = array.as_binary::<i32>();
            boxed(array, move |i, out: &mut Vec<u8>| write_b64(out, a.value(i)))
        }
        DataType::LargeBinary => {
            let a = array.as_binary::<i64>();
            boxed(array, move |i, out: &mut Vec<u8>| write_b64(out, a.value(i)))
        }
        DataType::BinaryView => {
            let a = array.as_binary_view();
            boxed(array, move |i, out: &mut Vec<u8>| write_b64(out, a.value(i)))
        }
        DataType::FixedSizeBinary(_) => {
            let a = array.as_fixed_size_binary();
            boxed(array, move |i, out: &mut Vec<u8>| write_b64(out, a.value(i)))
        }
        DataType::Date32 => {
            let a = array.as_primitive::<Date32Type>();
            boxed(array, move |i, out: &mut Vec<u8>| {
                write_date(out, Date32Type::to_naive_date_opt(a.value(i)))
            })
        }
        DataType::Date64 => {
            let a = array.as_primitive::<Date64Type>();
            boxed(array, move |i, out: &mut Vec<u8>| {
                write_date(out, Date64Type::to_naive_date_opt(a.value(i)))
            })
        }
        DataType::Timestamp(unit, tz) => timestamp_encoder(array, *unit, tz.as_deref())?,
        DataType::Time32(TimeUnit::Second) => {
            let a = array.as_primitive::<Time32SecondType>();
            boxed(array, move |i, out: &mut Vec<u8>| write_time(out, a.value(i) as i64 * 1_000_000, false))
        }
        DataType::Time32(_) => {
            let a = array.as_primitive::<Time32MillisecondType>();
            boxed(array, move |i, out: &mut Vec<u8>| write_time(out, a.value(i) as i64 * 1_000, false))
        }
        DataType::Time64(TimeUnit::Nanosecond) => {
            let a = array.as_primitive::<Time64NanosecondType>();
            boxed(array, move |i, out: &mut Vec<u8>| write_time(out, a.value(i), true))
        }
        DataType::Time64(_) => {
            let a = array.as_primitive::<Time64MicrosecondType>();
            boxed(array, move |i, out: &mut Vec<u8>| write_time(out, a.value(i), false))
        }
        DataType::List(_) => list_encoder(array, array.as_list::<i32>())?,
        DataType::LargeList(_) => list_encoder(array, array.as_list::<i64>())?,
        DataType::FixedSizeList(_, n) => {
            let a = array.as_fixed_size_list();
            let n = *n as usize;
            let mut values = encoder(a.values().as_ref())?;
            boxed(array, move |i, out: &mut Vec<u8>| {
                out.push(b'[');
                let start = a.value_offset(i) as usize;
                for j in 0..n {
                    if j > 0 {
                        out.push(b',');
                    }
                    values.write(start + j, out);
                }
                out.push(b']');
            })
        }
        DataType::Struct(fields) => {
            let a = array.as_struct();
            let keys: Vec<Vec<u8>> = fields
                .iter()
                .map(|f| {
                    let mut k = Vec::new();
                    write_str(&mut k, f.name());
                    k.push(b':');
                    k
                })
                .collect();
            let mut children =
                a.columns().iter().map(|c| encoder(c.as_ref())).collect::<Result<Vec<_>, _>>()?;
            boxed(array, move |i, out: &mut Vec<u8>| {
                out.push(b'{');
                for (j, c) in children.iter_mut().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(&keys[j]);
                    c.write(i, out);
                }
                out.push(b'}');
            })
        }
        DataType::Map(_, _) => {
            let a = array.as_map();
            let string_keys =
                matches!(a.key_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
            let key_strings = if string_keys {
                Some(ArrayFormatter::try_new(a.keys().as_ref(), &FormatOptions::default())?)
            } else {
                None
            };
            let mut keys = encoder(a.keys().as_ref())?;
            let mut values = encoder(a.values().as_ref())?;
            let offsets = a.value_offsets().to_vec();
            boxed(array, move |i, out: &mut Vec<u8>| {
                let (start, end) = (offsets[i] as usize, offsets[i + 1] as usize);
                out.push(if key_strings.is_some() { b'{' } else { b'[' });
                for j in start..end {
                    if j > start {
                        out.push(b',');
                    }
                    match &key_strings {
                        Some(f) => {
                            write_str(out, &f.value(j).to_string());
                            out.push(b':');
                            values.write(j, out);
                        }
                        None => {
                            out.extend_from_slice(b"{\"key\":");
                            keys.write(j, out);
                            out.extend_from_slice(b",\"value\":");
                            values.write(j, out);
                            out.push(b'}');
                        }
                    }
                }
                out.push(if key_strings.is_some() { b'}' } else { b']' });
            })
        }
        DataType::Dictionary(..) => {
            let a = array.as_any_dictionary();
            // `normalized_keys` panics on no values; then every key is null and none is read.
            let keys = if a.values().is_empty() { Vec::new() } else { a.normalized_keys() };
            let mut values = encoder(a.values().as_ref())?;
            boxed(array, move |i, out: &mut Vec<u8>| values.write(keys[i], out))
        }
        DataType::Union(fields, _) => {
            let a = array.as_union();
            let mut members = fields
                .iter()
                .map(|(id, f)| Ok((id, member_encoder(a.child(id).as_ref(), f)?)))
                .collect::<Result<Vec<_>, ArrowError>>()?;
            // A union has no nulls of its own: a null is its member's.
            Box::new(Nullable {
                nulls: None,
                inner: move |i, out: &mut Vec<u8>| {
                    let id = a.type_id(i);
                    match members.iter_mut().find(|(m, _)| *m == id) {
                        Some((_, m)) => m.write(a.value_offset(i), out),
                        None => out.extend_from_slice(b"null"),
                    }
                },
            })
        }
        _ => {
            let f = ArrayFormatter::try_new(array, &FormatOptions::default())?;
            boxed(array, move |i, out: &mut Vec<u8>| write_str(out, &f.value(i).to_string()))
        }
    })
}

/// A union member's encoder. Members marked as JSON text (Arrow's `arrow.json` extension, as
/// `json_get`'s `array` and `object`, which hold JSON its parser has read whole) are that
/// JSON, not a string holding it.
fn member_encoder<'a>(child: &'a dyn Array, field: &Field) -> Result<Box<dyn Encode + 'a>, ArrowError> {
    let json_text = field.metadata().get("ARROW:extension:name").is_some_and(|n| n == "arrow.json");
    match child.as_string_opt::<i32>() {
        Some(s) if json_text => {
            Ok(boxed(child, move |i, out: &mut Vec<u8>| out.extend_from_slice(s.value(i).as_bytes())))
        }
        _ => encoder(child),
    }
}

fn list_encoder<'a, O: OffsetSizeTrait>(
    array: &'a dyn Array,
    list: &'a GenericListArray<O>,
) -> Result<Box<dyn Encode + 'a>, ArrowError> {
    let mut values = encoder(list.values().as_ref())?;
    let offsets = list.value_offsets();
    Ok(boxed(array, move |i, out: &mut Vec<u8>| {
        out.push(b'[');
        let (start, end) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
        for j in start..end {
            if j > start {
                out.push(b',');
            }
            values.write(j, out);
        }
        out.push(b']');
    }))
}

fn timestamp_encoder<'a>(
    array: &'a dyn Array,
    unit: TimeUnit,
    tz: Option<&str>,
) -> Result<Box<dyn Encode + 'a>, ArrowError> {
    let zone: Option<arrow::array::timezone::Tz> = match tz {
        None => None,
        Some("UTC" | "utc" | "Z" | "+00:00" | "Etc/UTC") => None,
        Some(z) => Some(z.parse().map_err(|_| {
            query_fault(format!(
                "unsupported time zone {z:?}: use a zone name such as \"Europe/Paris\" or an offset such as \"+02:00\""
            ))
        })?),
    };
    // Each unit converts on its own: going through nanoseconds would lose every date outside
    // 1677-2262, and Iceberg's microseconds reach far beyond.
    let to_utc: fn(i64) -> Option<DateTime<chrono::Utc>> = match unit {
        TimeUnit::Second => |v| DateTime::from_timestamp(v, 0),
        TimeUnit::Millisecond => DateTime::from_timestamp_millis,
        TimeUnit::Microsecond => DateTime::from_timestamp_micros,
        TimeUnit::Nanosecond => |v| Some(DateTime::from_timestamp_nanos(v)),
    };
    let nanos = unit == TimeUnit::Nanosecond;
    // Every timestamp unit is an i64 underneath.
    let data = array.to_data();
    let values: arrow::buffer::ScalarBuffer<i64> =
        arrow::buffer::ScalarBuffer::new(data.buffers()[0].clone(), data.offset(), data.len());
    if let Some(i) = (0..array.len()).find(|&i| array.is_valid(i) && to_utc(values[i]).is_none()) {
        return Err(query_fault(format!(
            "the timestamp {} ({unit:?}s since 1970) is beyond the years a date can be written for",
            values[i]
        )));
    }
    Ok(boxed(array, move |i, out: &mut Vec<u8>| match to_utc(values[i]) {
        Some(dt) => write_datetime(out, dt.naive_utc(), zone.as_ref(), nanos),
        None => out.extend_from_slice(b"null"),
    }))
}

fn write_datetime(
    out: &mut Vec<u8>,
    utc: NaiveDateTime,
    zone: Option<&arrow::array::timezone::Tz>,
    nanos: bool,
) {
    let frac = if nanos { "%.9f" } else { "%.6f" };
    out.push(b'"');
    match zone {
        None => {
            let _ = write!(out, "{}{}Z", utc.format("%Y-%m-%dT%H:%M:%S"), utc.format(frac));
        }
        Some(z) => {
            let local = z.from_utc_datetime(&utc);
            let offset = local.offset().fix();
            let _ = write!(out, "{}{}{}", local.format("%Y-%m-%dT%H:%M:%S"), local.format(frac), offset);
        }
    }
    out.push(b'"');
}

fn write_date(out: &mut Vec<u8>, d: Option<NaiveDate>) {
    match d {
        Some(d) => {
            let _ = write!(out, "\"{}\"", d.format("%Y-%m-%d"));
        }
        None => out.extend_from_slice(b"null"),
    }
}

fn write_time(out: &mut Vec<u8>, v: i64, nanos_unit: bool) {
    let ns = if nanos_unit { v } else { v.saturating_mul(1_000) };
    let secs = ns.div_euclid(1_000_000_000);
    let sub = ns.rem_euclid(1_000_000_000);
    match NaiveTime::from_num_seconds_from_midnight_opt(secs as u32, sub as u32) {
        Some(t) if nanos_unit => {
            let _ = write!(out, "\"{}\"", t.format("%H:%M:%S%.9f"));
        }
        Some(t) => {
            let _ = write!(out, "\"{}\"", t.format("%H:%M:%S%.6f"));
        }
        None => out.extend_from_slice(b"null"),
    }
}

/// A float in the shortest digits of its own width (an f32 as `0.1`, not the
/// `0.10000000149011612` it widens to); NaN and ±Infinity as `null`.
fn write_float<F: ryu::Float + Into<f64>>(out: &mut Vec<u8>, v: F) {
    if v.into().is_finite() {
        out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    } else {
        out.extend_from_slice(b"null");
    }
}

/// The shortest decimal that reads back as the same `f16` (ryu has no `f16`): `0.1`, not the
/// `0.0999755859375` it is exactly.
fn f16_shortest(v: <Float16Type as ArrowPrimitiveType>::Native) -> f64 {
    type F16 = <Float16Type as ArrowPrimitiveType>::Native;
    (0..5)
        .filter_map(|p| format!("{:.p$e}", v.to_f64()).parse().ok())
        .find(|&x| F16::from_f64(x) == v)
        .unwrap_or(v.to_f64())
}

fn write_b64(out: &mut Vec<u8>, v: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(v).as_bytes());
    out.push(b'"');
}

/// Writes a JSON string literal, escaping what JSON requires.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => {
                out.extend_from_slice(&bytes[start..i]);
                let _ = write!(out, "\\u{:04x}", b);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(esc);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn rows(batch: &RecordBatch) -> serde_json::Value {
        let mut out = vec![b'['];
        let mut first = true;
        write_rows(batch, &mut out, &mut first).unwrap();
        out.push(b']');
        serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)))
    }

    #[test]
    fn scalars() {
        let batch = RecordBatch::try_from_iter(vec![
            ("i", Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef),
            ("f", Arc::new(Float64Array::from(vec![f64::NAN, 1.5])) as ArrayRef),
            ("s", Arc::new(StringArray::from(vec![Some("a\"\n\u{1}"), None])) as ArrayRef),
            ("b", Arc::new(BinaryArray::from(vec![Some(&b"hi"[..]), None])) as ArrayRef),
            (
                "t",
                Arc::new(TimestampMicrosecondArray::from(vec![Some(1_760_120_961_000_000), None]))
                    as ArrayRef,
            ),
            (
                "tz",
                Arc::new(TimestampMicrosecondArray::from(vec![Some(0), None]).with_timezone("+02:00"))
                    as ArrayRef,
            ),
            ("d", Arc::new(Date32Array::from(vec![Some(0), None])) as ArrayRef),
            (
                "dec",
                Arc::new(
                    Decimal128Array::from(vec![Some(1230), None]).with_precision_and_scale(10, 2).unwrap(),
                ) as ArrayRef,
            ),
        ])
        .unwrap();
        let v = rows(&batch);
        assert_eq!(
            v,
            serde_json::json!([
                {"i": 1, "f": null, "s": "a\"\n\u{1}", "b": "aGk=", "t": "2025-10-10T18:29:21.000000Z",
                 "tz": "1970-01-01T02:00:00.000000+02:00", "d": "1970-01-01", "dec": 12.30},
                {"i": null, "f": 1.5, "s": null, "b": null, "t": null, "tz": null, "d": null, "dec": null}
            ])
        );
    }

    #[test]
    fn nested() {
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), None]),
            None,
            Some(vec![]),
        ]);
        let strct = StructArray::from(vec![(
            Arc::new(Field::new("x", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef,
        )]);
        let dict: DictionaryArray<Int32Type> = vec!["u", "v", "u"].into_iter().collect();
        let batch = RecordBatch::try_from_iter(vec![
            ("l", Arc::new(list) as ArrayRef),
            ("s", Arc::new(strct) as ArrayRef),
            ("d", Arc::new(dict) as ArrayRef),
        ])
        .unwrap();
        assert_eq!(
            rows(&batch),
            serde_json::json!([
                {"l": [1, null], "s": {"x": "a"}, "d": "u"},
                {"l": null, "s": {"x": "b"}, "d": "v"},
                {"l": [], "s": {"x": "c"}, "d": "u"}
            ])
        );
    }
}
