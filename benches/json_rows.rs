//! skiff's JSON row encoder (`src/encode/json.rs`) against arrow-json's, run by hand:
//! `cargo bench --bench json_rows`.
//!
//! First, column by column over every type skiff encodes, whether arrow-json's own encoders
//! (explicit nulls) write the same bytes, printing the first difference. Then the speed of
//! both on 1M rows of strings, ints, timestamps and doubles with nulls: arrow-json with an
//! `EncoderFactory` that hands the timestamp column to skiff's encoder (its own writes another
//! format), checked byte-identical to skiff's output before it is timed.

// The server is a binary crate: its encoder and the error type it returns are compiled in
// here from their sources, and what the bench does not call is unused (their unit tests too,
// which a `cargo test --benches` build compiles but does not run here).
#[allow(dead_code, unused_imports)]
#[path = "../src/error.rs"]
mod error;
#[allow(dead_code, unused_imports)]
#[path = "../src/encode/json.rs"]
mod json;

use std::sync::Arc;
use std::time::Instant;

use arrow::array::*;
use arrow::datatypes::*;
use arrow::error::ArrowError;
use arrow::json::writer::{Encoder, EncoderFactory, EncoderOptions, NullableEncoder, make_encoder};

const ROWS: usize = 1_000_000;
const BATCH: usize = 8192;

/// skiff's encoding, in rows as the HTTP routes write them.
fn skiff_rows(batches: &[RecordBatch]) -> Vec<u8> {
    let mut out = vec![b'['];
    let mut first = true;
    for b in batches {
        json::write_rows(b, &mut out, &mut first).unwrap();
    }
    out.push(b']');
    out
}

/// arrow-json's encoding of the same rows: the batch as one struct, one object per row.
fn arrow_rows(batches: &[RecordBatch], options: &EncoderOptions) -> Result<Vec<u8>, ArrowError> {
    let mut out = vec![b'['];
    let mut first = true;
    for b in batches {
        let array = StructArray::from(b.clone());
        let field: FieldRef = Arc::new(Field::new("row", array.data_type().clone(), false));
        let mut enc = make_encoder(&field, &array, options)?;
        for row in 0..b.num_rows() {
            if !first {
                out.push(b',');
            }
            first = false;
            enc.encode(row, &mut out);
        }
    }
    out.push(b']');
    Ok(out)
}

/// Timestamps through skiff's encoder; everything else arrow-json's own.
#[derive(Debug)]
struct SkiffTimestamps;

struct Skiff<'a>(Box<dyn json::Encode + 'a>);

impl Encoder for Skiff<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        self.0.write(idx, out)
    }
}

impl EncoderFactory for SkiffTimestamps {
    fn make_default_encoder<'a>(
        &self,
        _field: &'a FieldRef,
        array: &'a dyn Array,
        _options: &'a EncoderOptions,
    ) -> Result<Option<NullableEncoder<'a>>, ArrowError> {
        Ok(match array.data_type() {
            DataType::Timestamp(..) => {
                Some(NullableEncoder::new(Box::new(Skiff(json::encoder(array)?)), array.nulls().cloned()))
            }
            _ => None,
        })
    }
}

/// One column per case: every type json.rs encodes, with the values where encodings part.
fn cases() -> Vec<(&'static str, ArrayRef)> {
    type F16 = <Float16Type as ArrowPrimitiveType>::Native;
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
    let mut string_map = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
    string_map.keys().append_value("k");
    string_map.values().append_value(1);
    string_map.append(true).unwrap();
    string_map.append(false).unwrap();
    string_map.append(true).unwrap();
    let mut int_map = MapBuilder::new(None, Int32Builder::new(), Int32Builder::new());
    int_map.keys().append_value(5);
    int_map.values().append_value(1);
    int_map.append(true).unwrap();
    int_map.append(false).unwrap();
    int_map.append(true).unwrap();
    let fixed = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
        vec![Some(&b"ab"[..]), None, Some(&b"\0\xff"[..])].into_iter(),
        2,
    )
    .unwrap();
    vec![
        ("int64", Arc::new(Int64Array::from(vec![Some(i64::MIN), None, Some(i64::MAX)])) as ArrayRef),
        ("uint64", Arc::new(UInt64Array::from(vec![Some(u64::MAX), None, Some(0)]))),
        ("bool", Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)]))),
        ("float64", Arc::new(Float64Array::from(vec![Some(0.1), Some(1.5), Some(-0.0)]))),
        (
            "float64 large/small",
            Arc::new(Float64Array::from(vec![Some(1e20), Some(1e-7), Some(123456789.0)])),
        ),
        ("float64 NaN/inf", Arc::new(Float64Array::from(vec![Some(f64::NAN), Some(f64::INFINITY), None]))),
        ("float32", Arc::new(Float32Array::from(vec![Some(0.1), Some(3.4e38), None]))),
        (
            "float16",
            Arc::new(Float16Array::from(vec![Some(F16::from_f32(0.1)), None, Some(F16::from_f32(2.5))])),
        ),
        (
            "decimal128",
            Arc::new(
                Decimal128Array::from(vec![Some(1230), None, Some(-5)])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
        ),
        (
            "decimal256",
            Arc::new(
                Decimal256Array::from(vec![Some(i256::from_i128(1230)), None, Some(i256::from_i128(-5))])
                    .with_precision_and_scale(40, 3)
                    .unwrap(),
            ),
        ),
        ("utf8", Arc::new(StringArray::from(vec![Some("a\"\\\n\r\t"), None, Some("é€😀/")]))),
        (
            "utf8 control",
            Arc::new(StringArray::from(vec![Some("\u{1}\u{8}\u{c}\u{1f}"), None, Some("\u{7f}")])),
        ),
        (
            "utf8view",
            Arc::new(StringViewArray::from(vec![Some("a"), None, Some("a longer string than twelve")])),
        ),
        ("binary", Arc::new(BinaryArray::from(vec![Some(&b"hi"[..]), None, Some(&b"\0\xff"[..])]))),
        ("binaryview", Arc::new(BinaryViewArray::from(vec![Some(&b"hi"[..]), None, Some(&b""[..])]))),
        ("fixedsizebinary", Arc::new(fixed)),
        ("date32", Arc::new(Date32Array::from(vec![Some(0), None, Some(20_000)]))),
        ("date64", Arc::new(Date64Array::from(vec![Some(0), None, Some(1_760_120_961_000)]))),
        ("timestamp s", Arc::new(TimestampSecondArray::from(vec![Some(1_760_120_961), None, Some(-1)]))),
        (
            "timestamp ms",
            Arc::new(TimestampMillisecondArray::from(vec![Some(1_760_120_961_123), None, Some(0)])),
        ),
        (
            "timestamp us",
            Arc::new(TimestampMicrosecondArray::from(vec![Some(1_760_120_961_000_000), None, Some(0)])),
        ),
        (
            "timestamp ns",
            Arc::new(TimestampNanosecondArray::from(vec![Some(1_760_120_961_000_000_001), None, Some(0)])),
        ),
        (
            "timestamp us UTC",
            Arc::new(TimestampMicrosecondArray::from(vec![Some(0), None, Some(1)]).with_timezone("UTC")),
        ),
        (
            "timestamp us +02:00",
            Arc::new(TimestampMicrosecondArray::from(vec![Some(0), None, Some(1)]).with_timezone("+02:00")),
        ),
        ("time32 s", Arc::new(Time32SecondArray::from(vec![Some(66_561), None, Some(0)]))),
        ("time64 us", Arc::new(Time64MicrosecondArray::from(vec![Some(66_561_000_001), None, Some(0)]))),
        ("time64 ns", Arc::new(Time64NanosecondArray::from(vec![Some(66_561_000_000_001), None, Some(0)]))),
        ("duration s", Arc::new(DurationSecondArray::from(vec![Some(90), None, Some(0)]))),
        (
            "interval month-day-nano",
            Arc::new(IntervalMonthDayNanoArray::from(vec![
                Some(IntervalMonthDayNano::new(1, 2, 3)),
                None,
                None,
            ])),
        ),
        ("list", Arc::new(list)),
        ("struct", Arc::new(strct)),
        ("dictionary", Arc::new(dict)),
        ("map string keys", Arc::new(string_map.finish())),
        ("map int keys", Arc::new(int_map.finish())),
        ("null", Arc::new(NullArray::new(3))),
    ]
}

fn compare() {
    let options = EncoderOptions::default().with_explicit_nulls(true);
    let (mut same, mut differ) = (0, 0);
    for (name, array) in cases() {
        let batch = RecordBatch::try_from_iter([("c", array)]).unwrap();
        let ours = String::from_utf8(skiff_rows(std::slice::from_ref(&batch))).unwrap();
        match arrow_rows(&[batch], &options) {
            Ok(theirs) => {
                let theirs = String::from_utf8(theirs).unwrap();
                if ours == theirs {
                    same += 1;
                    println!("  same    {name}");
                } else {
                    differ += 1;
                    println!(
                        "  DIFFER  {name}\n          skiff:      {ours}\n          arrow-json: {theirs}"
                    );
                }
            }
            Err(e) => {
                differ += 1;
                println!("  DIFFER  {name}\n          skiff:      {ours}\n          arrow-json: error: {e}");
            }
        }
    }
    println!("{same} types the same, {differ} different");
}

fn mixed() -> Vec<RecordBatch> {
    (0..ROWS / BATCH)
        .map(|b| {
            let rows = (b * BATCH..(b + 1) * BATCH).collect::<Vec<_>>();
            let s: StringArray = rows
                .iter()
                .map(|&i| (i % 7 != 0).then(|| format!("device-{:06} \"north\"", i % 100_000)))
                .collect();
            let n: Int64Array = rows.iter().map(|&i| (i % 11 != 0).then_some(i as i64 * 7919)).collect();
            let t: TimestampMicrosecondArray = rows
                .iter()
                .map(|&i| (i % 13 != 0).then_some(1_760_000_000_000_000 + i as i64 * 1_234_567))
                .collect();
            let d: Float64Array = rows.iter().map(|&i| (i % 5 != 0).then_some(i as f64 / 3.0)).collect();
            RecordBatch::try_from_iter([
                ("device", Arc::new(s) as ArrayRef),
                ("count", Arc::new(n) as ArrayRef),
                ("at", Arc::new(t) as ArrayRef),
                ("reading", Arc::new(d) as ArrayRef),
            ])
            .unwrap()
        })
        .collect()
}

fn timed(label: &str, encode: impl Fn() -> Vec<u8>) {
    let start = Instant::now();
    let out = encode();
    let took = start.elapsed();
    let mb = out.len() as f64 / 1e6;
    println!("{label:>28}: {ROWS} rows, {mb:.1} MB in {took:>9.2?}, {:.0} MB/s", mb / took.as_secs_f64());
}

fn main() {
    println!("Byte for byte, per type (arrow-json's own encoders, explicit nulls):");
    compare();

    let batches = mixed();
    let options =
        EncoderOptions::default().with_explicit_nulls(true).with_encoder_factory(Arc::new(SkiffTimestamps));
    let ours = skiff_rows(&batches);
    let theirs = arrow_rows(&batches, &options).unwrap();
    println!("\nMixed batch: arrow-json (skiff's timestamps) writes the same bytes: {}", ours == theirs);
    assert_eq!(ours, theirs, "the timed encodings must write the same bytes");
    for round in 0..3 {
        println!("round {round}");
        timed("skiff", || skiff_rows(&batches));
        timed("arrow-json + factory", || arrow_rows(&batches, &options).unwrap());
    }
}
