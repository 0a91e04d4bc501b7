//! For in-process tests of the engine's rules and fixes: skiff's session over small in-memory
//! tables, and answers printed as sorted tables so two plans' answers compare as text.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datafusion::datasource::MemTable;
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::SessionContext;

use super::rules::Disabled;

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
        Ok(df) => df.collect().await,
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
