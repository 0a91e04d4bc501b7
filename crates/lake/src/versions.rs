//! Versioned tables: a Pipelines stream's schema never changes, so each new schema is a new
//! table (`events`, `events_v2`, `events_v3`, …). skiff reads `<ns>.<base>` as every version
//! in version order, one UNION ALL by column name, padding what a version lacks with a
//! typed NULL.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};

/// Splits a physical table name into its base and version: `events_v2` → (`events`, 2),
/// `events` → (`events`, 1). `_v0` and `_v1` suffixes are not versions of another table.
pub fn split_version(name: &str) -> (&str, u32) {
    if let Some((base, v)) = name.rsplit_once("_v")
        && !base.is_empty()
        && !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && !v.starts_with('0')
        && let Ok(n) = v.parse::<u32>()
        && n >= 2
    {
        return (base, n);
    }
    (name, 1)
}

/// The physical table name of version `v` of `base`.
pub fn version_name(base: &str, v: u32) -> String {
    if v == 1 { base.to_string() } else { format!("{base}_v{v}") }
}

/// `LAKE_VERSIONS`: the versions to read per base name, as the Worker lists them
/// (`events=1,2;identities=1`). Applies in every namespace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PinnedVersions(BTreeMap<String, Vec<u32>>);

impl PinnedVersions {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (base, list) = part
                .split_once('=')
                .ok_or_else(|| format!("expected base=versions, like events=1,2 (got {part:?})"))?;
            let base = base.trim();
            if base.is_empty() {
                return Err(format!("missing table name in {part:?}"));
            }
            let mut versions = Vec::new();
            for v in list.split(',').map(str::trim).filter(|v| !v.is_empty()) {
                let n: u32 = v.parse().map_err(|_| format!("version {v:?} of {base} is not a number"))?;
                if n == 0 {
                    return Err(format!("versions start at 1 (got 0 for {base})"));
                }
                if !versions.contains(&n) {
                    versions.push(n);
                }
            }
            if versions.is_empty() {
                return Err(format!("no versions listed for {base}"));
            }
            versions.sort_unstable();
            map.insert(base.to_string(), versions);
        }
        Ok(Self(map))
    }

    pub fn get(&self, base: &str) -> Option<&[u32]> {
        self.0.get(base).map(Vec::as_slice)
    }
}

/// The union schema of the versions (each given as its table name and schema), by name in
/// first-appearance order. A column is nullable unless every version has it non-null; types
/// that differ are widened where Iceberg allows (int→long, float→double), else refused.
pub fn union_schema(versions: &[(String, SchemaRef)]) -> Result<SchemaRef, String> {
    let mut fields: Vec<(Field, String)> = Vec::new();
    for (table, schema) in versions {
        for f in schema.fields() {
            match fields.iter_mut().find(|(u, _)| u.name() == f.name()) {
                None => fields.push((f.as_ref().clone(), table.clone())),
                Some((u, first)) => {
                    let t = widen(u.data_type(), f.data_type()).ok_or_else(|| {
                        format!(
                            "column {} is {} in {first} but {} in {table}: versions of a table must agree on column types",
                            f.name(),
                            u.data_type(),
                            f.data_type()
                        )
                    })?;
                    let nullable = u.is_nullable() || f.is_nullable();
                    *u = Field::new(u.name(), t, nullable);
                }
            }
        }
    }
    // A column some version lacks is NULL in that version's rows.
    let out: Vec<Field> = fields
        .into_iter()
        .map(|(f, _)| {
            let everywhere = versions.iter().all(|(_, s)| s.field_with_name(f.name()).is_ok());
            if everywhere { f } else { f.with_nullable(true) }
        })
        .collect();
    Ok(Arc::new(Schema::new(out)))
}

/// The common type of two versions' column, if Iceberg's type promotion allows one.
fn widen(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::*;
    match (a, b) {
        _ if a == b => Some(a.clone()),
        (Int32, Int64) | (Int64, Int32) => Some(Int64),
        (Float32, Float64) | (Float64, Float32) => Some(Float64),
        (Decimal128(p1, s1), Decimal128(p2, s2)) if s1 == s2 => Some(Decimal128(*p1.max(p2), *s1)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(split_version("events_v2"), ("events", 2));
        assert_eq!(split_version("events"), ("events", 1));
        assert_eq!(split_version("events_v1"), ("events_v1", 1));
        assert_eq!(split_version("events_v02"), ("events_v02", 1));
        assert_eq!(split_version("_v3"), ("_v3", 1));
        assert_eq!(split_version("a_vx"), ("a_vx", 1));
        assert_eq!(version_name("events", 1), "events");
        assert_eq!(version_name("events", 3), "events_v3");
    }

    #[test]
    fn pinned() {
        let p = PinnedVersions::parse("events=1,2; identities=1").unwrap();
        assert_eq!(p.get("events"), Some(&[1, 2][..]));
        assert_eq!(p.get("identities"), Some(&[1][..]));
        assert_eq!(p.get("other"), None);
        assert!(PinnedVersions::parse("events").is_err());
        assert!(PinnedVersions::parse("events=x").is_err());
        assert!(PinnedVersions::parse("events=0").is_err());
        assert_eq!(PinnedVersions::parse("").unwrap(), PinnedVersions::default());
    }

    fn s(fields: Vec<Field>) -> SchemaRef {
        Arc::new(Schema::new(fields))
    }

    #[test]
    fn union_by_name() {
        let v1 = s(vec![Field::new("a", DataType::Int32, false), Field::new("b", DataType::Utf8, true)]);
        let v2 = s(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("c", DataType::Float64, false),
            Field::new("b", DataType::Utf8, true),
        ]);
        let u = union_schema(&[("t".into(), v1), ("t_v2".into(), v2)]).unwrap();
        let got: Vec<_> =
            u.fields().iter().map(|f| (f.name().as_str(), f.data_type().clone(), f.is_nullable())).collect();
        assert_eq!(
            got,
            vec![("a", DataType::Int64, false), ("b", DataType::Utf8, true), ("c", DataType::Float64, true)]
        );
        let bad = union_schema(&[
            ("t".into(), s(vec![Field::new("a", DataType::Int64, true)])),
            ("t_v2".into(), s(vec![Field::new("a", DataType::Utf8, true)])),
        ]);
        let msg = bad.unwrap_err();
        assert!(msg.contains("column a") && msg.contains("t_v2"), "{msg}");
    }
}
