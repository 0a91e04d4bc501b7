//! Iceberg manifests read straight from their Avro bytes, for what scan planning needs.
//!
//! iceberg-rust decodes a manifest through apache-avro's generic reader: it parses the file's
//! schema twice, resolves every value against a second schema and deserializes through serde,
//! so even a manifest of a few files costs about a millisecond of CPU. On a cold start that
//! was most of a query's planning (62% of the CPU of a first `count(*)` at 30M events, ~270
//! manifests at 3M). Planning needs only each live data file's path, format, size, record
//! count, null counts and bounds, so this reads those by the file's own Avro schema and skips
//! everything else. A file it does not expect (another codec, another shape, a damaged block)
//! goes to iceberg-rust's reader instead, which then reads it or reports it as before.

use std::borrow::Cow;
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use apache_avro::Codec;
use datafusion::common::Statistics;
use iceberg::spec::{DataContentType, DataFileFormat, Manifest, ManifestStatus};
use serde_json::Value;

/// A live (added or existing) data file, as its manifest lists it. Bounds stay in Iceberg's
/// binary single-value form, to be typed against the table's schema where they are used.
#[derive(Clone, Debug, PartialEq)]
pub struct FileEntry {
    pub path: String,
    pub format: DataFileFormat,
    pub records: u64,
    pub size: u64,
    /// (field id, value), by field id.
    pub null_counts: Vec<(i32, u64)>,
    pub lower_bounds: Vec<(i32, Vec<u8>)>,
    pub upper_bounds: Vec<(i32, Vec<u8>)>,
}

/// The live data files a manifest lists.
pub fn live_files(avro: &[u8]) -> iceberg::Result<Vec<FileEntry>> {
    match read(avro) {
        Ok(files) => Ok(files),
        Err(Unread::TooLarge) => Err(iceberg::Error::new(iceberg::ErrorKind::DataInvalid, TOO_LARGE)),
        Err(Unread::Unexpected(why)) => {
            tracing::debug!(why, "manifest read by iceberg-rust");
            Ok(from_iceberg(&Manifest::parse_avro(avro)?))
        }
    }
}

/// The same from a manifest iceberg-rust decoded (an encrypted one, or one `read` did not take).
pub fn from_iceberg(manifest: &Manifest) -> Vec<FileEntry> {
    let bounds = |m: &HashMap<i32, iceberg::spec::Datum>| {
        let mut v: Vec<(i32, Vec<u8>)> =
            m.iter().filter_map(|(id, d)| Some((*id, d.to_bytes().ok()?.into_vec()))).collect();
        v.sort_unstable_by_key(|(id, _)| *id);
        v
    };
    manifest
        .entries()
        .iter()
        .filter(|e| e.is_alive())
        .map(|e| {
            let f = e.data_file();
            let mut null_counts: Vec<(i32, u64)> =
                f.null_value_counts().iter().map(|(k, v)| (*k, *v)).collect();
            null_counts.sort_unstable_by_key(|(id, _)| *id);
            FileEntry {
                path: f.file_path().to_string(),
                format: f.file_format(),
                records: f.record_count(),
                size: f.file_size_in_bytes(),
                null_counts,
                lower_bounds: bounds(f.lower_bounds()),
                upper_bounds: bounds(f.upper_bounds()),
            }
        })
        .collect()
}

/// Why `read` did not read a file.
#[derive(Debug)]
enum Unread {
    /// Not what this reader expects: iceberg-rust reads it.
    Unexpected(String),
    /// A schema past `MAX_NODES`: refused, since iceberg-rust would expand it without a bound.
    TooLarge,
}

type R<T> = Result<T, Unread>;

fn unexpected<T>(why: impl Into<String>) -> R<T> {
    Err(Unread::Unexpected(why.into()))
}

/// An Avro object container: magic, metadata, sync marker, then blocks of entries.
fn read(avro: &[u8]) -> R<Vec<FileEntry>> {
    let mut r = Reader(avro);
    if r.take(4)? != b"Obj\x01" {
        return unexpected("not an Avro container");
    }
    let mut meta: HashMap<&[u8], &[u8]> = HashMap::new();
    r.blocks(|r| {
        let key = r.bytes()?;
        meta.insert(key, r.bytes()?);
        Ok(())
    })?;
    let sync = r.take(16)?;
    if meta.get(&b"content"[..]).is_some_and(|c| *c != b"data") {
        return unexpected("not a data manifest");
    }
    let codec = match meta.get(&b"avro.codec"[..]) {
        None => Codec::Null,
        Some(name) => std::str::from_utf8(name)
            .ok()
            .and_then(|n| Codec::from_str(n).ok())
            .map_or_else(|| unexpected(format!("codec {}", String::from_utf8_lossy(name))), Ok)?,
    };
    let Some(schema) = meta.get(&b"avro.schema"[..]) else {
        return unexpected("no schema");
    };
    let json: Value = serde_json::from_slice(schema).or_else(|e| unexpected(format!("schema: {e}")))?;
    let Schema::Record(fields) = parse(&json, &mut Parsed::default())? else {
        return unexpected("entries are not records");
    };
    let mut files = Vec::new();
    while !r.0.is_empty() {
        let count = r.long()?;
        let size = r.len()?;
        let block = r.take(size)?;
        let data: Cow<[u8]> = match codec {
            Codec::Null => Cow::Borrowed(block),
            codec => {
                let mut v = block.to_vec();
                codec.decompress(&mut v).or_else(|e| unexpected(format!("block: {e}")))?;
                Cow::Owned(v)
            }
        };
        // Each entry takes at least a byte, so a damaged count cannot make this loop run long.
        if count < 0 || count as u64 > data.len() as u64 {
            return unexpected("entry count out of range");
        }
        let mut b = Reader(&data);
        for _ in 0..count {
            if let Some(file) = b.entry(&fields)? {
                files.push(file);
            }
        }
        if !b.0.is_empty() || r.take(16)? != sync {
            return unexpected("block does not end where its size says");
        }
    }
    Ok(files)
}

/// An Avro schema, as much of it as decoding needs: names, defaults and logical types do
/// not change how a value is encoded.
#[derive(Clone, Debug)]
enum Schema {
    Null,
    Boolean,
    /// `int`, `long` and `enum`: a zigzag varint.
    Long,
    Float,
    Double,
    /// `bytes` and `string`.
    Bytes,
    Fixed(usize),
    Array(Box<Schema>),
    Map(Box<Schema>),
    Union(Vec<Schema>),
    Record(Vec<(String, Schema)>),
}

/// Schema nodes allowed, each reference to a named type counting that type's nodes again.
/// A manifest's schema has about a hundred. The bound keeps a schema whose references nest
/// (each level doubling the tree) from taking the memory and time it would: such a file is
/// refused as undecodable.
const MAX_NODES: usize = 10_000;
const TOO_LARGE: &str = "the manifest's Avro schema is too large";

/// What parsing has seen: the named types, with their node counts, and the nodes so far.
#[derive(Default)]
struct Parsed {
    names: HashMap<String, (Schema, usize)>,
    nodes: usize,
}

impl Parsed {
    fn count(&mut self, nodes: usize) -> R<()> {
        self.nodes += nodes;
        if self.nodes > MAX_NODES {
            return Err(Unread::TooLarge);
        }
        Ok(())
    }
}

/// Parses a schema, remembering named types so later references to them resolve.
fn parse(v: &Value, seen: &mut Parsed) -> R<Schema> {
    let first = seen.nodes;
    seen.count(1)?;
    let o = match v {
        Value::String(name) => {
            if let Some(p) = primitive(name) {
                return Ok(p);
            }
            let Some((schema, nodes)) = seen.names.get(name).cloned() else {
                return unexpected(format!("type {name}"));
            };
            seen.count(nodes)?;
            return Ok(schema);
        }
        Value::Array(branches) => {
            return Ok(Schema::Union(branches.iter().map(|b| parse(b, seen)).collect::<R<_>>()?));
        }
        Value::Object(o) => o,
        _ => return unexpected("schema is not a name, union or object"),
    };
    let schema = match o.get("type") {
        Some(Value::String(t)) if t == "record" || t == "error" => {
            let Some(Value::Array(fields)) = o.get("fields") else {
                return unexpected("record without fields");
            };
            let fields = fields
                .iter()
                .map(|f| match (f.get("name").and_then(Value::as_str), f.get("type")) {
                    (Some(n), Some(t)) => Ok((n.to_string(), parse(t, seen)?)),
                    _ => unexpected("record field without a name or type"),
                })
                .collect::<R<_>>()?;
            Schema::Record(fields)
        }
        Some(Value::String(t)) if t == "enum" => Schema::Long,
        Some(Value::String(t)) if t == "array" => {
            Schema::Array(Box::new(parse(o.get("items").unwrap_or(&Value::Null), seen)?))
        }
        Some(Value::String(t)) if t == "map" => {
            Schema::Map(Box::new(parse(o.get("values").unwrap_or(&Value::Null), seen)?))
        }
        Some(Value::String(t)) if t == "fixed" => match o.get("size").and_then(Value::as_u64) {
            Some(n) => Schema::Fixed(n as usize),
            None => return unexpected("fixed without a size"),
        },
        Some(t) => parse(t, seen)?,
        None => return unexpected("schema object without a type"),
    };
    if let Some(name) = o.get("name").and_then(Value::as_str) {
        let named = (schema.clone(), seen.nodes - first);
        if let Some(ns) = o.get("namespace").and_then(Value::as_str) {
            seen.names.insert(format!("{ns}.{name}"), named.clone());
        }
        seen.names.insert(name.to_string(), named);
    }
    Ok(schema)
}

fn primitive(name: &str) -> Option<Schema> {
    Some(match name {
        "null" => Schema::Null,
        "boolean" => Schema::Boolean,
        "int" | "long" => Schema::Long,
        "float" => Schema::Float,
        "double" => Schema::Double,
        "bytes" | "string" => Schema::Bytes,
        _ => return None,
    })
}

/// Avro's binary encoding, read from the front of a slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.0.len() {
            return unexpected("truncated");
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// A zigzag varint (`int` and `long`).
    fn long(&mut self) -> R<i64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let [b, rest @ ..] = self.0 else { return unexpected("truncated") };
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok((v >> 1) as i64 ^ -((v & 1) as i64));
            }
        }
        unexpected("varint longer than 10 bytes")
    }

    /// A length, which can be no more than the bytes left.
    fn len(&mut self) -> R<usize> {
        let n = self.long()?;
        match usize::try_from(n) {
            Ok(n) if n <= self.0.len() => Ok(n),
            _ => unexpected("length out of range"),
        }
    }

    fn bytes(&mut self) -> R<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }

    /// Arrays and maps come in blocks: a count (negative when the block's byte size follows),
    /// the items, and a zero count at the end.
    fn blocks(&mut self, mut item: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        loop {
            let n = self.long()?;
            if n == 0 {
                return Ok(());
            }
            if n < 0 {
                self.long()?;
            }
            let n = n.unsigned_abs();
            if n > self.0.len() as u64 {
                return unexpected("count out of range");
            }
            for _ in 0..n {
                item(self)?;
            }
        }
    }

    fn skip(&mut self, s: &Schema) -> R<()> {
        match s {
            Schema::Null => {}
            Schema::Boolean => _ = self.take(1)?,
            Schema::Long => _ = self.long()?,
            Schema::Float => _ = self.take(4)?,
            Schema::Double => _ = self.take(8)?,
            Schema::Bytes => _ = self.bytes()?,
            Schema::Fixed(n) => _ = self.take(*n)?,
            Schema::Array(items) => self.blocks(|r| r.skip(items))?,
            Schema::Map(values) => self.blocks(|r| {
                r.bytes()?;
                r.skip(values)
            })?,
            Schema::Union(_) => {
                let branch = self.branch(s)?;
                self.skip(branch)?
            }
            Schema::Record(fields) => {
                for (_, f) in fields {
                    self.skip(f)?;
                }
            }
        }
        Ok(())
    }

    /// The branch a union value takes (a schema that is not a union is its own branch).
    fn branch<'s>(&mut self, s: &'s Schema) -> R<&'s Schema> {
        match s {
            Schema::Union(branches) => {
                let i = usize::try_from(self.long()?).ok();
                match i.and_then(|i| branches.get(i)) {
                    Some(b) => Ok(b),
                    None => unexpected("union branch out of range"),
                }
            }
            s => Ok(s),
        }
    }

    fn int(&mut self, s: &Schema) -> R<Option<i64>> {
        match self.branch(s)? {
            Schema::Null => Ok(None),
            Schema::Long => Ok(Some(self.long()?)),
            _ => unexpected("expected an integer"),
        }
    }

    fn blob(&mut self, s: &Schema) -> R<Option<&'a [u8]>> {
        match self.branch(s)? {
            Schema::Null => Ok(None),
            Schema::Bytes => Ok(Some(self.bytes()?)),
            _ => unexpected("expected bytes"),
        }
    }

    /// An Iceberg map keyed by field id: an array of `{key, value}` records (or null).
    fn by_field<V>(
        &mut self,
        s: &Schema,
        mut value: impl FnMut(&mut Self, &Schema) -> R<Option<V>>,
    ) -> R<Vec<(i32, V)>> {
        let mut out = Vec::new();
        let Schema::Array(items) = self.branch(s)? else {
            return Ok(out); // null: no map
        };
        let Schema::Record(fields) = items.as_ref() else {
            return unexpected("map items are not records");
        };
        self.blocks(|r| {
            let (mut key, mut val) = (None, None);
            for (name, f) in fields {
                match name.as_str() {
                    "key" => key = r.int(f)?.and_then(|k| i32::try_from(k).ok()),
                    "value" => val = value(r, f)?,
                    _ => r.skip(f)?,
                }
            }
            if let (Some(k), Some(v)) = (key, val) {
                out.push((k, v));
            }
            Ok(())
        })?;
        out.sort_unstable_by_key(|(id, _)| *id);
        Ok(out)
    }

    /// One manifest entry: the data file it lists, when that file is live.
    fn entry(&mut self, fields: &[(String, Schema)]) -> R<Option<FileEntry>> {
        let (mut status, mut file) = (None, None);
        for (name, f) in fields {
            match name.as_str() {
                "status" => status = self.int(f)?,
                "data_file" => file = Some(self.data_file(f)?),
                _ => self.skip(f)?,
            }
        }
        let (Some(status), Some(file)) = (status, file) else {
            return unexpected("entry without a status or data file");
        };
        match status {
            s if s == ManifestStatus::Deleted as i64 => Ok(None),
            s if s == ManifestStatus::Added as i64 || s == ManifestStatus::Existing as i64 => Ok(Some(file)),
            _ => unexpected("unknown entry status"),
        }
    }

    fn data_file(&mut self, s: &Schema) -> R<FileEntry> {
        let Schema::Record(fields) = self.branch(s)? else {
            return unexpected("data_file is not a record");
        };
        let (mut content, mut path, mut format, mut records, mut size) = (None, None, None, None, None);
        let mut file = FileEntry {
            path: String::new(),
            format: DataFileFormat::Parquet,
            records: 0,
            size: 0,
            null_counts: vec![],
            lower_bounds: vec![],
            upper_bounds: vec![],
        };
        for (name, f) in fields {
            match name.as_str() {
                "content" => content = self.int(f)?,
                "file_path" => path = self.blob(f)?,
                "file_format" => format = self.blob(f)?,
                "record_count" => records = self.int(f)?,
                "file_size_in_bytes" => size = self.int(f)?,
                "null_value_counts" => {
                    file.null_counts =
                        self.by_field(f, |r, s| Ok(r.int(s)?.and_then(|v| u64::try_from(v).ok())))?
                }
                "lower_bounds" => {
                    file.lower_bounds = self.by_field(f, |r, s| Ok(r.blob(s)?.map(<[u8]>::to_vec)))?
                }
                "upper_bounds" => {
                    file.upper_bounds = self.by_field(f, |r, s| Ok(r.blob(s)?.map(<[u8]>::to_vec)))?
                }
                _ => self.skip(f)?,
            }
        }
        // Version 1 manifests have no content field: every file in them holds data.
        if content.unwrap_or(0) != DataContentType::Data as i64 {
            return unexpected("not a data file");
        }
        let text = |b: Option<&'a [u8]>| -> Option<&'a str> { std::str::from_utf8(b?).ok() };
        let (Some(p), Some(fmt), Some(records), Some(size)) = (text(path), text(format), records, size)
        else {
            return unexpected("data file without a path, format, record count or size");
        };
        file.path = p.to_string();
        file.format = DataFileFormat::from_str(fmt).or_else(|_| unexpected(format!("file format {fmt}")))?;
        file.records = u64::try_from(records).or_else(|_| unexpected("negative record count"))?;
        file.size = u64::try_from(size).or_else(|_| unexpected("negative file size"))?;
        Ok(file)
    }
}

/// Every live data file of one snapshot, with its statistics over the table's Arrow schema.
/// Built by `file_stats` from the decoded manifests; defined here, below the cache that keeps
/// it, so the cache does not depend on the module that fills it.
#[derive(Debug, Default)]
pub struct SnapshotFiles {
    pub files: Vec<LiveFile>,
    pub(super) by_path: HashMap<String, usize>,
    /// Whether the snapshot has delete manifests: its files are then planned by Iceberg,
    /// which matches each data file with its delete files.
    pub has_deletes: bool,
}

#[derive(Debug)]
pub struct LiveFile {
    pub path: String,
    pub size: u64,
    pub records: u64,
    pub format: DataFileFormat,
    pub stats: Arc<Statistics>,
}

impl SnapshotFiles {
    pub fn get(&self, path: &str) -> Option<&Arc<Statistics>> {
        self.by_path.get(path).map(|&i| &self.files[i].stats)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::io::FileIO;
    use iceberg::spec::{
        DataFile, DataFileBuilder, Datum, Literal, ManifestWriterBuilder, NestedField, PartitionSpec,
        PrimitiveType, Schema as IcebergSchema, Struct, Transform, Type,
    };

    use serde_json::json;

    use super::*;

    /// Manifests PyIceberg wrote (deflate) for one copy-on-write delete: its new files, the
    /// files it removed, and a file it kept.
    const PYICEBERG: [(&str, &[u8], usize); 3] = [
        ("added", include_bytes!("../../../tests/fixtures/manifests/pyiceberg-added.avro"), 2),
        ("deleted", include_bytes!("../../../tests/fixtures/manifests/pyiceberg-deleted.avro"), 0),
        ("existing", include_bytes!("../../../tests/fixtures/manifests/pyiceberg-existing.avro"), 1),
    ];

    fn iceberg_reads(avro: &[u8]) -> Vec<FileEntry> {
        from_iceberg(&Manifest::parse_avro(avro).expect("iceberg-rust reads it"))
    }

    #[test]
    fn pyiceberg_manifests_read_as_iceberg_rust_reads_them() {
        for (name, avro, live) in PYICEBERG {
            let ours = read(avro).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(ours, iceberg_reads(avro), "{name}");
            assert_eq!(ours.len(), live, "{name}");
            for f in &ours {
                assert!(f.path.ends_with(".parquet") && f.records > 0 && f.size > 0, "{name}: {f:?}");
                assert_eq!(f.format, DataFileFormat::Parquet);
                // Every column of these tables has a null count, and most have bounds.
                assert!(f.null_counts.len() >= 17 && f.lower_bounds.len() >= 6, "{name}: {f:?}");
            }
        }
    }

    fn data_file(path: &str, metrics: bool) -> DataFile {
        let mut b = DataFileBuilder::default();
        b.content(DataContentType::Data)
            .file_path(format!("memory:///data/{path}.parquet"))
            .file_format(DataFileFormat::Parquet)
            .file_size_in_bytes(4096)
            .record_count(100)
            .partition_spec_id(0)
            .partition(Struct::from_iter([Some(Literal::int(3))]));
        if metrics {
            b.null_value_counts(HashMap::from([(1, 0), (2, 7), (3, 0), (4, 100)]))
                .lower_bounds(HashMap::from([
                    (1, Datum::long(-5)),
                    (2, Datum::string("ab")),
                    (3, Datum::timestamp_micros(1_700_000_000_000_000)),
                    (5, Datum::double(-0.5)),
                    (6, Datum::bool(false)),
                    (7, Datum::date(20_000)),
                    (8, Datum::int(3)),
                ]))
                .upper_bounds(HashMap::from([
                    (1, Datum::long(1i64 << 40)),
                    (2, Datum::string("zz\u{e9}")),
                    (3, Datum::timestamp_micros(1_800_000_000_000_000)),
                    (5, Datum::double(2.5)),
                    (6, Datum::bool(true)),
                    (7, Datum::date(20_100)),
                    (8, Datum::int(3)),
                ]));
        }
        b.build().unwrap()
    }

    /// A manifest iceberg-rust wrote (no compression): two files added, one kept, one deleted.
    async fn written(version: u8) -> Vec<u8> {
        let ty = |t| Type::Primitive(t);
        let fields = [
            NestedField::required(1, "id", ty(PrimitiveType::Long)),
            NestedField::optional(2, "name", ty(PrimitiveType::String)),
            NestedField::required(3, "ts", ty(PrimitiveType::Timestamp)),
            NestedField::optional(4, "gone", ty(PrimitiveType::String)),
            NestedField::optional(5, "score", ty(PrimitiveType::Double)),
            NestedField::optional(6, "ok", ty(PrimitiveType::Boolean)),
            NestedField::optional(7, "day", ty(PrimitiveType::Date)),
            NestedField::required(8, "n", ty(PrimitiveType::Int)),
        ];
        let schema = Arc::new(
            IcebergSchema::builder()
                .with_schema_id(0)
                .with_fields(fields.into_iter().map(Arc::new))
                .build()
                .unwrap(),
        );
        let spec = PartitionSpec::builder(schema.clone())
            .with_spec_id(0)
            .add_partition_field("n", "n", Transform::Identity)
            .unwrap()
            .build()
            .unwrap();
        let io = FileIO::new_with_memory();
        let path = format!("memory:///metadata/v{version}-m0.avro");
        let builder = ManifestWriterBuilder::new(io.new_output(&path).unwrap(), Some(9), schema, spec);
        let mut w = if version == 1 { builder.build_v1() } else { builder.build_v2_data() };
        w.add_file(data_file("a", true), 1).unwrap();
        w.add_existing_file(data_file("b", true), 8, 1, Some(1)).unwrap();
        w.add_delete_file(data_file("c", true), 1, Some(1)).unwrap();
        w.add_file(data_file("d", false), 1).unwrap();
        w.write_manifest_file().await.unwrap();
        io.new_input(&path).unwrap().read().await.unwrap().to_vec()
    }

    fn zigzag(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        while z >= 0x80 {
            out.push(z as u8 | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    }

    /// The same container with its blocks compressed by `codec` (the original's are not).
    fn recoded(avro: &[u8], codec: &str) -> Vec<u8> {
        rewritten(avro, Some(codec), None)
    }

    /// The same container with another schema (its blocks unread).
    fn with_schema(avro: &[u8], schema: &[u8]) -> Vec<u8> {
        rewritten(avro, None, Some(schema))
    }

    fn rewritten(avro: &[u8], codec: Option<&str>, schema: Option<&[u8]>) -> Vec<u8> {
        let mut r = Reader(avro);
        r.take(4).unwrap();
        let mut meta = vec![];
        r.blocks(|r| {
            let key = r.bytes()?.to_vec();
            meta.push((key, r.bytes()?.to_vec()));
            Ok(())
        })
        .unwrap();
        for (key, value) in [("avro.codec", codec.map(str::as_bytes)), ("avro.schema", schema)] {
            if let Some(v) = value {
                meta.retain(|(k, _)| k != key.as_bytes());
                meta.push((key.as_bytes().to_vec(), v.to_vec()));
            }
        }
        let sync = r.take(16).unwrap();
        let mut out = b"Obj\x01".to_vec();
        zigzag(&mut out, meta.len() as i64);
        for (k, v) in &meta {
            zigzag(&mut out, k.len() as i64);
            out.extend(k);
            zigzag(&mut out, v.len() as i64);
            out.extend(v);
        }
        zigzag(&mut out, 0);
        out.extend(sync);
        while !r.0.is_empty() {
            let count = r.long().unwrap();
            let size = r.len().unwrap();
            let mut block = r.take(size).unwrap().to_vec();
            assert_eq!(r.take(16).unwrap(), sync);
            if let Some(codec) = codec {
                Codec::from_str(codec).unwrap().compress(&mut block).unwrap();
            }
            zigzag(&mut out, count);
            zigzag(&mut out, block.len() as i64);
            out.extend(block);
            out.extend(sync);
        }
        out
    }

    #[tokio::test]
    async fn iceberg_rust_manifests_read_the_same_in_every_version_and_codec() {
        for version in [1, 2] {
            let plain = written(version).await;
            for codec in ["null", "deflate", "snappy", "zstandard"] {
                let avro = recoded(&plain, codec);
                let ours = read(&avro).unwrap_or_else(|e| panic!("v{version} {codec}: {e:?}"));
                assert_eq!(ours, iceberg_reads(&avro), "v{version} {codec}");
                let paths: Vec<&str> = ours.iter().map(|f| f.path.rsplit('/').next().unwrap()).collect();
                assert_eq!(paths, ["a.parquet", "b.parquet", "d.parquet"], "the deleted file is not live");
                let a = &ours[0];
                assert_eq!((a.records, a.size), (100, 4096));
                assert_eq!(a.null_counts, [(1, 0), (2, 7), (3, 0), (4, 100)]);
                let lower = |id| a.lower_bounds.iter().find(|(k, _)| *k == id).map(|(_, b)| b.clone());
                assert_eq!(lower(1), Some((-5i64).to_le_bytes().to_vec()));
                assert_eq!(lower(2), Some(b"ab".to_vec()));
                assert!(ours[2].null_counts.is_empty() && ours[2].upper_bounds.is_empty());
            }
        }
    }

    #[test]
    fn damaged_manifests_are_refused_without_panicking() {
        let (_, avro, _) = PYICEBERG[0];
        let whole = read(avro).unwrap();
        for cut in 0..avro.len() {
            // A cut at a block's end leaves fewer files (as iceberg-rust reads it too); any
            // other cut is refused.
            if let Ok(files) = read(&avro[..cut]) {
                assert!(whole.starts_with(&files), "cut at {cut}");
            }
        }
        for i in 0..avro.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut damaged = avro.to_vec();
                damaged[i] ^= flip;
                let _ = read(&damaged);
            }
        }
    }

    #[test]
    fn schemas_whose_references_multiply_are_refused() {
        // r1 holds two r0s, r2 two r1s, …: 2^40 records once references are expanded.
        let mut types =
            vec![json!({"type": "record", "name": "r0", "fields": [{"name": "x", "type": "null"}]})];
        for i in 1..=40 {
            let prev = format!("r{}", i - 1);
            types.push(json!({"type": "record", "name": format!("r{i}"),
                "fields": [{"name": "a", "type": prev}, {"name": "b", "type": prev}]}));
        }
        let fields: Vec<_> =
            types.into_iter().enumerate().map(|(i, t)| json!({"name": format!("f{i}"), "type": t})).collect();
        let schema = json!({"type": "record", "name": "manifest_entry", "fields": fields});
        assert!(parse(&schema, &mut Parsed::default()).is_err());
        let (_, avro, _) = PYICEBERG[0];
        let json = serde_json::to_vec(&schema).unwrap();
        let err = live_files(&with_schema(avro, &json)).unwrap_err();
        assert!(err.to_string().contains(TOO_LARGE), "{err}");
        // Nine levels are 2^10 - 1 records: allowed.
        let nine = json!({"type": "record", "name": "manifest_entry", "fields": schema["fields"].as_array().unwrap()[..10]});
        let mut parsed = Parsed::default();
        assert!(parse(&nine, &mut parsed).is_ok());
        assert!(parsed.nodes > 2 << 10, "{}", parsed.nodes);
    }

    #[test]
    fn what_is_not_read_here_goes_to_iceberg_rust() {
        let (_, avro, _) = PYICEBERG[0];
        // A codec this build lacks: refused here, and iceberg-rust's own error comes back.
        let bzip = {
            let mut v = avro.to_vec();
            let at = v.windows(7).position(|w| w == b"deflate").unwrap();
            // Same length, so the metadata still parses: "deflate" → "bzip2xx".
            v[at..at + 7].copy_from_slice(b"bzip2xx");
            v
        };
        assert!(read(&bzip).is_err());
        assert!(live_files(&bzip).is_err());
        assert_eq!(live_files(avro).unwrap(), read(avro).unwrap());
    }
}
