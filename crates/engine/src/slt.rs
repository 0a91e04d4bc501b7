//! Answer tests as sqllogictest files (`crates/engine/slt/*.slt`), run in-process through
//! [`Engine::execute`](crate::Engine::execute) over a demo lake written by skiff, so a query
//! goes through the same parsing, read-only check, bounds, rules and Iceberg scan as one sent
//! over HTTP.
//!
//! Every file runs in three engines and must give its expected answers in each: every rule
//! on, every rule off (DataFusion with only skiff's fixes), and every rule on with one
//! partition (what a container of less than a vCPU plans). A rule that changes an answer
//! fails the file in one mode and not the other.
//!
//! `SKIFF_SLT_COMPLETE=1` rewrites the files' expected answers from the rules-off engine; a
//! rewritten answer is checked by hand (or against DuckDB) before it is committed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use futures::TryStreamExt;
use sqllogictest::{DBOutput, DefaultColumnType};

use crate::error::QueryError;
use crate::rules::Disabled;
use crate::{Engine, Tuning};

/// Events in the demo lake the files query (its answers are deterministic in this number).
const EVENTS: u64 = 20_000;

struct Skiff(Arc<Engine>);

#[async_trait::async_trait]
impl sqllogictest::AsyncDB for Skiff {
    type Error = QueryError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, QueryError> {
        let q = self.0.execute(sql).await?;
        let types = q.schema.fields().iter().map(|f| column_type(f.data_type())).collect();
        let batches: Vec<RecordBatch> = q.stream.try_collect().await.map_err(QueryError::from)?;
        let mut rows = Vec::new();
        for b in &batches {
            rows.extend(text_rows(b));
        }
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    async fn sleep(dur: std::time::Duration) {
        tokio::time::sleep(dur).await
    }
}

fn column_type(t: &DataType) -> DefaultColumnType {
    if t.is_integer() {
        DefaultColumnType::Integer
    } else if t.is_floating() || matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..)) {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

/// Each value as text: NULL as `NULL`, an empty string as `(empty)` (whitespace is collapsed
/// when answers are compared), floats to 12 significant digits, since a sum's last digits
/// depend on the order partitions add up in.
fn text_rows(b: &RecordBatch) -> Vec<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let formatters: Vec<_> =
        b.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &options).unwrap()).collect();
    (0..b.num_rows())
        .map(|row| {
            b.columns()
                .iter()
                .zip(&formatters)
                .map(|(c, f)| {
                    if c.is_null(row) {
                        return "NULL".to_string();
                    }
                    let as_float = match c.data_type() {
                        DataType::Float64 => Some(c.as_primitive::<Float64Type>().value(row)),
                        DataType::Float32 => Some(c.as_primitive::<Float32Type>().value(row) as f64),
                        _ => None,
                    };
                    match as_float {
                        Some(v) => float(v),
                        None => match f.value(row).to_string() {
                            s if s.is_empty() => "(empty)".to_string(),
                            s => s,
                        },
                    }
                })
                .collect()
        })
        .collect()
}

/// 12 significant digits, with an exponent for very large or small values.
fn float(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let v: f64 = format!("{v:.11e}").parse().unwrap();
    if v != 0.0 && !(1e-6..1e15).contains(&v.abs()) { format!("{v:e}") } else { v.to_string() }
}

fn files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    files
}

fn runner(
    engine: &Arc<Engine>,
) -> sqllogictest::Runner<Skiff, impl sqllogictest::MakeConnection<Conn = Skiff>> {
    let engine = engine.clone();
    let mut runner = sqllogictest::Runner::new(move || {
        let engine = engine.clone();
        async move { Ok(Skiff(engine)) }
    });
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_the_same_with_rules_on_off_and_on_one_partition() {
    let dir = tempfile::tempdir().unwrap();
    let lake = crate::testing::demo_lake(dir.path(), EVENTS).await;
    let one_partition = vec![("datafusion.execution.target_partitions".to_string(), "1".to_string())];
    let modes = [
        ("rules off", Tuning { disabled: Disabled::all(), ..Tuning::default() }),
        ("rules on", Tuning::default()),
        ("rules on, one partition", Tuning { datafusion_options: one_partition, ..Tuning::default() }),
    ];
    if std::env::var_os("SKIFF_SLT_COMPLETE").is_some() {
        let engine = Arc::new(crate::testing::engine(lake, modes[0].1.clone()));
        for file in files() {
            runner(&engine)
                .update_test_file(
                    &file,
                    " ",
                    sqllogictest::default_validator,
                    sqllogictest::default_normalizer,
                    sqllogictest::strict_column_validator,
                )
                .await
                .unwrap();
        }
        return;
    }
    let mut failures = Vec::new();
    for (mode, tuning) in modes {
        let engine = Arc::new(crate::testing::engine(lake.clone(), tuning));
        for file in files() {
            if let Err(e) = runner(&engine).run_file_async(&file).await {
                failures.push(format!("{mode}: {}\n{e}", file.display()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
