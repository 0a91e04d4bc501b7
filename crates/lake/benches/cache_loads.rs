//! What the metadata caches' shared loads cost (`Caches::footer`, the same path as manifests
//! and snapshot statistics), run by hand: `cargo bench -p skiff-lake --bench cache_loads`.
//! The loads do no I/O, so the numbers are the caching and load-sharing overhead alone.
//!
//! - hit: one cached key looked up again and again;
//! - cold: distinct keys, each loaded once;
//! - shared: four tasks on two worker threads load the same fresh keys at once, so most
//!   lookups either lead a load or wait on another's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use arrow::array::{ArrayRef, Int32Array, RecordBatch};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use skiff_lake::cache::Caches;

const HITS: usize = 1_000_000;
const COLD: usize = 200_000;
const SHARED: usize = 50_000;
const TASKS: usize = 4;

fn footer() -> Arc<ParquetMetaData> {
    let batch =
        RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1, 2, 3])) as ArrayRef)]).unwrap();
    let mut file = Vec::new();
    let mut w = ArrowWriter::try_new(&mut file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    Arc::new(ParquetMetaDataReader::new().parse_and_finish(&Bytes::from(file)).unwrap())
}

fn per_op(label: &str, ops: usize, start: Instant) {
    let took = start.elapsed();
    println!(
        "{label:>7}: {ops:>9} lookups in {took:>10.2?}, {:>7.1} ns each",
        took.as_nanos() as f64 / ops as f64
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let meta = footer();
    let keys: Vec<String> =
        (0..COLD.max(SHARED)).map(|i| format!("s3://bucket/t/data/{i:08}.parquet")).collect();
    let keys = Arc::new(keys);
    rt.block_on(async {
        for round in 0..3 {
            println!("round {round}");
            let caches = Caches::new(None);
            let load = || async { Ok::<_, ()>(meta.clone()) };
            caches.footer("hot", load()).await.unwrap();
            let start = Instant::now();
            for _ in 0..HITS {
                caches.footer("hot", load()).await.unwrap();
            }
            per_op("hit", HITS, start);

            let start = Instant::now();
            for k in &keys[..COLD] {
                caches.footer(k, load()).await.unwrap();
            }
            per_op("cold", COLD, start);

            let caches = Arc::new(Caches::new(None));
            let loads = Arc::new(AtomicUsize::new(0));
            let start = Instant::now();
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (caches, keys, loads, meta) =
                        (caches.clone(), keys.clone(), loads.clone(), meta.clone());
                    tokio::spawn(async move {
                        for k in &keys[..SHARED] {
                            let load = async {
                                loads.fetch_add(1, Ordering::Relaxed);
                                // A load takes a moment, so others arrive while it runs.
                                tokio::task::yield_now().await;
                                Ok::<_, ()>(meta.clone())
                            };
                            caches.footer(k, load).await.unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            per_op("shared", TASKS * SHARED, start);
            assert_eq!(loads.load(Ordering::Relaxed), SHARED, "each key loaded once");
        }
    });
}
