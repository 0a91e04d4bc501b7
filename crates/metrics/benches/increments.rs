//! What counting costs when threads count at once, skiff's registry against the
//! `prometheus-client` crate, run by hand: `cargo bench -p skiff-metrics --bench increments`.
//! Each thread adds 1 to a labelled counter `PER_THREAD` times (a cache hit, the commonest
//! increment); then both expositions of one counter are printed, to compare their format.

use std::sync::atomic::AtomicU64;
use std::thread;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

const THREADS: usize = 2;
const PER_THREAD: usize = 10_000_000;

fn timed(label: &str, count: impl Fn() + Sync) {
    let start = Instant::now();
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..PER_THREAD {
                    count();
                }
            });
        }
    });
    let took = start.elapsed();
    let ops = THREADS * PER_THREAD;
    println!(
        "{label:>18}: {THREADS} threads x {PER_THREAD} increments in {took:>9.2?}, {:>6.1} ns each",
        took.as_nanos() as f64 / ops as f64
    );
}

type CacheLabels = [(&'static str, &'static str); 1];

fn main() {
    let family = Family::<CacheLabels, Counter<u64, AtomicU64>>::default();
    for round in 0..3 {
        println!("round {round}");
        timed("skiff-metrics", || skiff_metrics::cache_hit("manifest"));
        timed("prometheus-client", || {
            family.get_or_create(&[("cache", "manifest")]).inc();
        });
    }

    let mut registry = Registry::default();
    // Registered as the crate means it: it adds the `_total` suffix and the HELP text's period.
    registry.register("skiff_cache_hits", "Lookups answered by a cache, by cache", family);
    let mut theirs = String::new();
    encode(&mut theirs, &registry).unwrap();
    println!("\nprometheus-client:\n{theirs}");
    let ours = skiff_metrics::render(&skiff_metrics::Gauges::default());
    let start = ours.find("# HELP skiff_cache_hits_total").unwrap();
    let end = ours[start..].find("# HELP skiff_cache_misses_total").unwrap();
    println!("skiff-metrics:\n{}", &ours[start..start + end]);
}
