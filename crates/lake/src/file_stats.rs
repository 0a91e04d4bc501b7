//! The live data files of a snapshot, from Iceberg manifests, with their statistics (record
//! counts, null counts, column bounds) as DataFusion `Statistics`. Scans are planned from
//! them, and they let DataFusion answer `count(*)`, `min` and `max` without reading data and
//! skip whole files for a top-k whose threshold a file cannot beat.
//!
//! Only what is certain is marked exact, as Iceberg Java's aggregate push-down does: record
//! and null counts, and bounds of types Iceberg never truncates (integers, decimals, dates,
//! times, timestamps, booleans). String bounds may be truncated, so they are valid bounds
//! but inexact; float bounds leave NaN out, so they are not given at all. Files with delete
//! files never reach the scan that uses these (Iceberg's reader applies the deletes).

use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::stats::Precision;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use futures::{StreamExt, TryStreamExt};
use iceberg::ErrorKind;
use iceberg::spec::{Datum, ManifestContentType, ManifestFile, PrimitiveLiteral, PrimitiveType, SnapshotRef};
use iceberg::table::Table;

use super::cache::Caches;
use super::manifest::{FileEntry, LiveFile, SnapshotFiles};

/// Manifests read at once while planning a scan.
pub(super) const MANIFEST_READS: usize = 32;

/// The live data files of the current snapshot and their statistics, cached per manifest
/// list and schema. Manifests come from the shared manifest cache, so a new snapshot decodes
/// only its new manifests; they are decoded on every core at once.
pub async fn snapshot_files(
    table: &Table,
    schema: &SchemaRef,
    caches: &Arc<Caches>,
) -> iceberg::Result<Arc<SnapshotFiles>> {
    let metadata = table.metadata();
    let Some(snapshot) = metadata.current_snapshot() else {
        return Ok(Arc::default());
    };
    let key = (snapshot.manifest_list().to_string(), metadata.current_schema_id());
    caches.snapshot_files(&key, read_snapshot_files(table, snapshot, schema, caches)).await
}

async fn read_snapshot_files(
    table: &Table,
    snapshot: &SnapshotRef,
    schema: &SchemaRef,
    caches: &Arc<Caches>,
) -> iceberg::Result<Arc<SnapshotFiles>> {
    let metadata = table.metadata();
    let list = caches.manifest_list(table, snapshot).await?;
    let has_deletes = list.entries().iter().any(|m| m.content == ManifestContentType::Deletes);
    let wanted: Vec<ManifestFile> =
        list.entries().iter().filter(|m| m.content == ManifestContentType::Data).cloned().collect();
    let loads = wanted.into_iter().map(|m| {
        let (caches, table) = (caches.clone(), table.clone());
        tokio::spawn(async move { caches.manifest(&table, &m).await })
    });
    let manifests: Vec<Arc<[FileEntry]>> = futures::stream::iter(loads)
        .buffered(MANIFEST_READS)
        .map(|joined| {
            joined
                .map_err(|e| iceberg::Error::new(ErrorKind::Unexpected, format!("reading a manifest: {e}")))?
        })
        .try_collect()
        .await?;
    // Field ids and Iceberg types of the Arrow schema's columns (same order: the schema is
    // made from this one).
    let iceberg_fields = metadata.current_schema().as_struct().fields();
    let ids: Vec<Option<(i32, PrimitiveType)>> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let field = iceberg_fields.get(i).filter(|x| x.name == *f.name())?;
            Some((field.id, field.field_type.as_primitive_type()?.clone()))
        })
        .collect();
    let mut out = SnapshotFiles { has_deletes, ..Default::default() };
    for file in manifests.iter().flat_map(|m| m.iter()) {
        out.by_path.insert(file.path.clone(), out.files.len());
        out.files.push(LiveFile {
            path: file.path.clone(),
            size: file.size,
            records: file.records,
            format: file.format,
            stats: Arc::new(file_statistics(file, schema, &ids)),
        });
    }
    Ok(Arc::new(out))
}

fn file_statistics(file: &FileEntry, schema: &SchemaRef, ids: &[Option<(i32, PrimitiveType)>]) -> Statistics {
    let rows = file.records as usize;
    let columns = schema
        .fields()
        .iter()
        .zip(ids)
        .map(|(field, id)| {
            let Some((id, ty)) = id else { return ColumnStatistics::new_unknown() };
            let nulls = of(&file.null_counts, *id).map(|n| *n as usize);
            let mut c = ColumnStatistics::new_unknown()
                .with_null_count(nulls.map(Precision::Exact).unwrap_or(Precision::Absent));
            if nulls == Some(rows) {
                return c; // every value is NULL: no bounds
            }
            // A bound that does not decode as the column's type is not used.
            let bound = |bounds: &[(i32, Vec<u8>)]| {
                of(bounds, *id)
                    .and_then(|b| Datum::try_from_bytes(b, ty.clone()).ok())
                    .and_then(|d| scalar(&d, field.data_type()))
                    .unwrap_or(Precision::Absent)
            };
            c.min_value = bound(&file.lower_bounds);
            c.max_value = bound(&file.upper_bounds);
            if c.min_value.is_exact().is_none() || c.max_value.is_exact().is_none() {
                c.min_value = Precision::Absent;
                c.max_value = Precision::Absent;
            }
            c
        })
        .collect();
    Statistics {
        num_rows: Precision::Exact(rows),
        total_byte_size: Precision::Absent,
        column_statistics: columns,
    }
}

/// The value for a field id in a list sorted by field id.
fn of<V>(by_id: &[(i32, V)], id: i32) -> Option<&V> {
    by_id.binary_search_by_key(&id, |(k, _)| *k).ok().map(|i| &by_id[i].1)
}

/// An Iceberg bound as a DataFusion value of the column's Arrow type, exact where Iceberg
/// never truncates that type.
fn scalar(d: &Datum, t: &DataType) -> Option<Precision<ScalarValue>> {
    use PrimitiveLiteral as L;
    let exact = |v| Some(Precision::Exact(v));
    match (d.literal(), t) {
        (L::Boolean(b), DataType::Boolean) => exact(ScalarValue::Boolean(Some(*b))),
        (L::Int(v), DataType::Int32) => exact(ScalarValue::Int32(Some(*v))),
        (L::Long(v), DataType::Int64) => exact(ScalarValue::Int64(Some(*v))),
        (L::Int(v), DataType::Date32) => exact(ScalarValue::Date32(Some(*v))),
        (L::Long(v), DataType::Time64(TimeUnit::Microsecond)) => {
            exact(ScalarValue::Time64Microsecond(Some(*v)))
        }
        (L::Long(v), DataType::Timestamp(TimeUnit::Microsecond, tz)) => {
            exact(ScalarValue::TimestampMicrosecond(Some(*v), tz.clone()))
        }
        (L::Long(v), DataType::Timestamp(TimeUnit::Nanosecond, tz)) => {
            exact(ScalarValue::TimestampNanosecond(Some(*v), tz.clone()))
        }
        (L::Int128(v), DataType::Decimal128(p, s)) => exact(ScalarValue::Decimal128(Some(*v), *p, *s)),
        (L::String(s), DataType::Utf8) => Some(Precision::Inexact(ScalarValue::Utf8(Some(s.clone())))),
        (L::String(s), DataType::LargeUtf8) => {
            Some(Precision::Inexact(ScalarValue::LargeUtf8(Some(s.clone()))))
        }
        (L::String(s), DataType::Utf8View) => {
            Some(Precision::Inexact(ScalarValue::Utf8View(Some(s.clone()))))
        }
        _ => None,
    }
}

/// The statistics of a set of files: counts add up; a bound is known when every file that
/// has a non-NULL value knows it, and exact when all of those are exact.
pub fn merge(files: &[&Statistics], schema: &SchemaRef) -> Statistics {
    let n = schema.fields().len();
    let mut out = Statistics::new_unknown(schema);
    if files.is_empty() || files.iter().any(|f| f.column_statistics.len() != n) {
        return out;
    }
    out.num_rows = files.iter().fold(Precision::Exact(0), |acc, f| acc.add(&f.num_rows));
    for (i, col) in out.column_statistics.iter_mut().enumerate() {
        col.null_count =
            files.iter().fold(Precision::Exact(0), |acc, f| acc.add(&f.column_statistics[i].null_count));
        let mut min: Option<Precision<ScalarValue>> = None;
        let mut max: Option<Precision<ScalarValue>> = None;
        for f in files {
            let c = &f.column_statistics[i];
            let all_null =
                matches!((&f.num_rows, &c.null_count), (Precision::Exact(r), Precision::Exact(z)) if r == z);
            if all_null {
                continue;
            }
            min = Some(match min {
                None => c.min_value.clone(),
                Some(m) => m.min(&c.min_value),
            });
            max = Some(match max {
                None => c.max_value.clone(),
                Some(m) => m.max(&c.max_value),
            });
        }
        col.min_value = min.unwrap_or(Precision::Absent);
        col.max_value = max.unwrap_or(Precision::Absent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};

    fn stats(
        rows: usize,
        nulls: usize,
        min: Precision<ScalarValue>,
        max: Precision<ScalarValue>,
    ) -> Statistics {
        Statistics {
            num_rows: Precision::Exact(rows),
            total_byte_size: Precision::Absent,
            column_statistics: vec![ColumnStatistics {
                null_count: Precision::Exact(nulls),
                min_value: min,
                max_value: max,
                ..ColumnStatistics::new_unknown()
            }],
        }
    }

    #[test]
    fn merging_skips_all_null_files_and_keeps_exactness() {
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let e = |v| Precision::Exact(ScalarValue::Int64(Some(v)));
        let a = stats(10, 0, e(5), e(9));
        let b = stats(4, 4, Precision::Absent, Precision::Absent);
        let c = stats(3, 1, e(1), e(7));
        let m = merge(&[&a, &b, &c], &schema);
        assert_eq!(m.num_rows, Precision::Exact(17));
        assert_eq!(m.column_statistics[0].null_count, Precision::Exact(5));
        assert_eq!(m.column_statistics[0].min_value, e(1));
        assert_eq!(m.column_statistics[0].max_value, e(9));
        // One file without bounds (and not all NULL): unknown.
        let d = stats(2, 0, Precision::Absent, Precision::Absent);
        let m = merge(&[&a, &d], &schema);
        assert_eq!(m.column_statistics[0].min_value, Precision::Absent);
        // One inexact bound makes the merged bound inexact.
        let f = stats(2, 0, Precision::Inexact(ScalarValue::Int64(Some(0))), e(3));
        let m = merge(&[&a, &f], &schema);
        assert_eq!(m.column_statistics[0].min_value, Precision::Inexact(ScalarValue::Int64(Some(0))));
        assert_eq!(m.column_statistics[0].max_value, e(9));
    }

    #[test]
    fn only_untruncated_types_are_exact() {
        let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
        assert_eq!(
            scalar(&Datum::timestamp_micros(7), &ts),
            Some(Precision::Exact(ScalarValue::TimestampMicrosecond(Some(7), None)))
        );
        assert_eq!(
            scalar(&Datum::string("abc"), &DataType::Utf8),
            Some(Precision::Inexact(ScalarValue::Utf8(Some("abc".into()))))
        );
        assert_eq!(scalar(&Datum::double(1.0), &DataType::Float64), None);
        // A bound whose type does not match the column is not used.
        assert_eq!(scalar(&Datum::long(1), &DataType::Int32), None);
    }
}
