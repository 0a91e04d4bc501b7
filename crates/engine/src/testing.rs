//! For in-process tests of the engine's rules and fixes: skiff's session over small in-memory
//! tables, and answers printed as sorted tables so two plans' answers compare as text.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionContext;

use super::rules::{Disabled, RULES};

/// Every skiff rule off but those named in `on`.
pub fn only(on: &[&str]) -> Disabled {
    assert!(on.iter().all(|n| RULES.iter().any(|r| r.name == *n)), "{on:?} are not all rules");
    let others: Vec<String> =
        RULES.iter().filter(|r| !on.contains(&r.name)).map(|r| r.name.to_string()).collect();
    Disabled::parse(&others).unwrap()
}

/// skiff's session with 4 partitions, a memory pool of `memory` bytes and the `disabled`
/// rules off, with `tables` registered (each split into batches of at most 1,000 rows over
/// the partitions, so plans exchange rows as they do over a lake).
pub fn session(disabled: &Disabled, memory: usize, tables: &[(&str, RecordBatch)]) -> SessionContext {
    session_on(4, disabled, memory, tables)
}

/// [`session`] with `partitions` partitions (one is what a container of less than a vCPU gets).
pub fn session_on(
    partitions: usize,
    disabled: &Disabled,
    memory: usize,
    tables: &[(&str, RecordBatch)],
) -> SessionContext {
    let runtime =
        RuntimeEnvBuilder::new().with_memory_pool(Arc::new(FairSpillPool::new(memory))).build_arc().unwrap();
    let config = super::session_config().with_target_partitions(partitions).with_batch_size(1024);
    let ctx = super::session(config, runtime, disabled).unwrap();
    for (name, batch) in tables {
        let mut partitions = vec![Vec::new(); partitions];
        let mut at = 0;
        let mut i = 0;
        while at < batch.num_rows() {
            let len = (batch.num_rows() - at).min(1000);
            let n = partitions.len();
            partitions[i % n].push(batch.slice(at, len));
            at += len;
            i += 1;
        }
        let table = MemTable::try_new(batch.schema(), partitions).unwrap();
        ctx.register_table(*name, Arc::new(table)).unwrap();
    }
    ctx
}

/// A query's answer as a table with its rows sorted, or its error as text.
pub async fn answer(ctx: &SessionContext, sql: &str) -> String {
    let batches = match ctx.sql(sql).await {
        Ok(df) => {
            let schema = Arc::new(df.schema().as_arrow().clone());
            // No rows print as the columns' names whether a plan sent no batch or empty ones.
            df.collect().await.map(|b| if b.is_empty() { vec![RecordBatch::new_empty(schema)] } else { b })
        }
        Err(e) => Err(e),
    };
    match batches {
        Ok(b) => {
            let text = pretty_format_batches(&b).unwrap().to_string();
            let mut lines: Vec<&str> = text.lines().collect();
            // Header (3 lines) and last border stay; the rows between are sorted.
            if lines.len() > 4 {
                let end = lines.len() - 1;
                lines[3..end].sort();
            }
            lines.join("\n")
        }
        Err(e) => format!("error: {e}"),
    }
}

/// The query's answers with every rule on and with every rule off, which must be equal.
pub async fn on_and_off(tables: &[(&str, RecordBatch)], sql: &str) -> (String, String) {
    let on = session(&Disabled::default(), 256 << 20, tables);
    let off = session(&Disabled::all(), 256 << 20, tables);
    (answer(&on, sql).await, answer(&off, sql).await)
}

/// A demo lake of `events` events written into `dir` (Iceberg tables written by skiff, as
/// `skiff demo` writes them), connected through its SQL catalog.
pub async fn demo_lake(dir: &std::path::Path, events: u64) -> Arc<skiff_lake::Lake> {
    skiff_lake::catalog::demo::write(dir, events).await.unwrap();
    let uri = format!("sqlite://{}", dir.join("catalog.db").display());
    let warehouse = dir.join("warehouse").display().to_string();
    let conn = skiff_lake::catalog::sql::connect(&uri, &warehouse, None, Default::default()).await.unwrap();
    let caches = skiff_lake::cache::Caches::new(None);
    skiff_lake::Lake::new(conn.catalog, conn.pointers, Default::default(), caches).await.unwrap()
}

/// An engine over `lake` with test-sized limits (a 256 MiB pool, two queries at a time).
pub fn engine(lake: Arc<skiff_lake::Lake>, tuning: super::Tuning) -> super::Engine {
    use std::time::Duration;
    let limits = super::Limits {
        max_sql_bytes: 1 << 20,
        query_timeout: Duration::from_secs(30),
        write_timeout: Duration::from_secs(30),
        max_concurrent: 2,
        max_queued: 2,
        queue_timeout: Duration::from_secs(5),
        memory_limit: 256 << 20,
        plan: super::sql_bounds::PlanBounds { max_plan_nodes: 100_000, max_grouping_sets: 4096 },
        max_value_bytes: 64 << 20,
        max_array_length: 10_000_000,
        spill_bytes: 1 << 30,
        spill_dir: None,
    };
    super::Engine::new(lake, limits, tuning).unwrap()
}
