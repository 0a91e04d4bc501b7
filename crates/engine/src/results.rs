//! The result cache. An answer is kept under its query's fingerprint: the query's plan and
//! the exact version (snapshot and schema) of every table it reads. Snapshots and the files
//! they list never change, so an answer under a fingerprint never goes stale and nothing is
//! ever invalidated: a new snapshot makes a new fingerprint. The fingerprint is also the HTTP
//! `ETag`, so a client holding an answer can be told "not modified" without any execution.

use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source_as_provider;
use datafusion::error::Result as DFResult;
use datafusion::execution::RecordBatchStream;
use datafusion::logical_expr::{Expr, LogicalPlan, Volatility};
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::memory::MemoryStream;
use futures::Stream;
use sha2::{Digest, Sha256};
use skiff_lake::versions_read;
use skiff_metrics as metrics;

/// How a query's answer relates to the result cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheUse {
    /// Served from the cache, nothing executed.
    Hit,
    /// Executed; the answer is kept if it is small enough.
    Miss,
    /// Its answer can change without a new snapshot (a volatile function such as `now()` or
    /// `random()`, or a table outside the lake such as `system.queries`): never cached.
    Bypass,
    /// The cache is turned off (`--result-cache-bytes 0`).
    Off,
}

impl CacheUse {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Bypass => "bypass",
            Self::Off => "off",
        }
    }
}

/// What identifies a query's answer: a hash of its (unoptimised, parameters bound) plan and
/// of the versions of the tables it reads. `None` when the answer may change without a new
/// snapshot. The plan is hashed before optimisation, because the optimiser folds `now()`
/// into a literal.
pub fn fingerprint(plan: &LogicalPlan) -> Option<String> {
    let mut hash = Sha256::new();
    let mut versions = Vec::new();
    let mut deterministic = true;
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            match source_as_provider(&scan.source).ok().and_then(|p| versions_read(p.as_ref())) {
                Some(v) => versions.extend(v),
                None => deterministic = false,
            }
        }
        // EXPLAIN ANALYZE answers with this run's timings.
        if matches!(node, LogicalPlan::Analyze(_)) || node.expressions().iter().any(is_volatile) {
            deterministic = false;
        }
        Ok(if deterministic { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
    })
    .ok()?;
    if !deterministic {
        return None;
    }
    // The plan's own `Hash` covers every detail: each literal, every row of a VALUES list,
    // EXPLAIN's options, DESCRIBE's table. Its display abbreviates them, so hashing that let
    // two queries with different answers share a fingerprint.
    plan.hash(&mut Sha(&mut hash));
    versions.sort();
    versions.dedup();
    for v in versions {
        hash.update(v);
        hash.update("\n");
    }
    let digest = hash.finalize();
    Some(digest.iter().take(16).map(|b| format!("{b:02x}")).collect())
}

/// Feeds a `Hash` implementation into SHA-256 (`finish` is never used).
struct Sha<'a>(&'a mut Sha256);

impl Hasher for Sha<'_> {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        0
    }
}

/// Whether an expression calls a function whose answer may differ between two calls with the
/// same arguments (`random()`), or between two queries (`now()`, which is "stable").
fn is_volatile(expr: &Expr) -> bool {
    expr.exists(|e| {
        Ok(match e {
            Expr::ScalarFunction(f) => f.func.signature().volatility != Volatility::Immutable,
            Expr::AggregateFunction(f) => f.func.signature().volatility != Volatility::Immutable,
            Expr::WindowFunction(f) => f.fun.signature().volatility != Volatility::Immutable,
            _ => false,
        })
    })
    .unwrap_or(true)
}

struct Answer {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

/// Finished answers by fingerprint, bounded by their size in memory.
pub struct ResultCache {
    answers: moka::sync::Cache<String, Arc<Answer>>,
    /// Larger answers are not kept: one big answer would push out many small ones.
    max_answer_bytes: usize,
}

impl ResultCache {
    /// A cache of at most `bytes` (in Arrow memory), or `None` for 0 (off).
    pub fn new(bytes: usize) -> Option<Self> {
        (bytes > 0).then(|| Self {
            answers: moka::sync::Cache::builder()
                .weigher(|_, a: &Arc<Answer>| size_of(&a.batches).min(u32::MAX as usize) as u32)
                .max_capacity(bytes as u64)
                .build(),
            max_answer_bytes: bytes / 4,
        })
    }

    /// The kept answer for a fingerprint, as a stream.
    pub fn get(&self, fingerprint: &str) -> Option<(SchemaRef, SendableRecordBatchStream)> {
        let Some(a) = self.answers.get(fingerprint) else {
            metrics::cache_miss("result");
            return None;
        };
        metrics::cache_hit("result");
        let stream = MemoryStream::try_new(a.batches.clone(), a.schema.clone(), None).ok()?;
        Some((a.schema.clone(), Box::pin(stream)))
    }

    /// Passes a query's batches through, keeping a copy that is stored once the stream ends
    /// cleanly (an error, a cancelled query or an answer over the size bound keeps nothing).
    pub fn fill(
        self: &Arc<Self>,
        fingerprint: String,
        inner: SendableRecordBatchStream,
    ) -> SendableRecordBatchStream {
        Box::pin(Filling { cache: self.clone(), fingerprint, inner, kept: Some(Vec::new()), bytes: 0 })
    }
}

fn size_of(batches: &[RecordBatch]) -> usize {
    batches.iter().map(RecordBatch::get_array_memory_size).sum()
}

struct Filling {
    cache: Arc<ResultCache>,
    fingerprint: String,
    inner: SendableRecordBatchStream,
    /// `None` once the answer is known not to be kept.
    kept: Option<Vec<RecordBatch>>,
    bytes: usize,
}

impl Stream for Filling {
    type Item = DFResult<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = futures::ready!(self.inner.as_mut().poll_next(cx));
        let this = &mut *self;
        match &item {
            Some(Ok(batch)) => {
                this.bytes += super::memory::batch_bytes(batch);
                if this.bytes > this.cache.max_answer_bytes {
                    this.kept = None;
                } else if let Some(kept) = this.kept.as_mut() {
                    kept.push(batch.clone());
                }
            }
            Some(Err(_)) => this.kept = None,
            None => {
                // Kept as one compact copy: a slice would hold on to the whole array it came from.
                let schema = this.inner.schema();
                let compact = this.kept.take().map(|b| arrow::compute::concat_batches(&schema, &b));
                if let Some(Ok(batch)) = compact {
                    let answer = Answer { schema, batches: vec![batch] };
                    this.cache.answers.insert(std::mem::take(&mut this.fingerprint), Arc::new(answer));
                }
            }
        }
        Poll::Ready(item)
    }
}

impl RecordBatchStream for Filling {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}
