//! The query engine: one DataFusion session over the lake, the read-only rules, and the one
//! entry point every front end calls: SQL in, a record-batch stream and its costs out.

pub mod admission;
mod bounded_functions;
mod bounded_partials;
mod coalesce;
mod constant_group_keys;
mod constant_join_keys;
mod count_distinct;
mod date_trunc;
pub mod deadline;
mod dialect;
pub mod distributed;
pub mod error;
mod fast_path;
mod fixes;
mod functions;
mod group_keys;
mod hashed_windows;
mod join_sides;
mod json;
pub mod memory;
mod not_in;
pub mod panics;
pub mod queries;
mod range_selectivity;
pub mod readonly;
pub mod results;
#[cfg(test)]
mod rule_snapshots;
pub mod rules;
mod semi_joins;
mod shared;
#[cfg(test)]
mod slt;
pub mod sql_bounds;
mod string_eq;
mod system;
#[cfg(test)]
mod testing;
pub mod tunnel;
mod window;
mod yielding_joins;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use datafusion::catalog::CatalogProvider;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext};
use futures::{StreamExt, TryStreamExt};
use skiff_lake::cache::Caches;
use skiff_lake::stats::QueryStats;
use skiff_lake::{Lake, Names};
use skiff_metrics::Gauges;
use tokio_util::sync::CancellationToken;

use crate::error::{QueryError, Result};
use admission::{Admission, CANCELLED_AT_SHUTDOWN};
use deadline::Bounded;
use results::{CacheUse, ResultCache};

/// The name SQL can give the lake's catalog (`lake.glass.events`); it is also the default,
/// so `glass.events` resolves as Basin SQL resolves it.
pub const CATALOG: &str = "lake";

pub struct Engine {
    planner: Planner,
    lake: Arc<Lake>,
    limits: Limits,
    admission: Admission,
    /// Set when shutdown begins: no new query starts.
    draining: AtomicBool,
    /// Cancelled when the shutdown grace period ends: every query still running fails.
    shutdown: CancellationToken,
    /// Where queries execute (see [`execute_on`]).
    runtime: QueryRuntime,
}

/// The engine's limits (see `config` for each one's meaning and default).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_sql_bytes: usize,
    pub query_timeout: Duration,
    /// How long a result may wait for its client to take the next part before the query is
    /// cancelled.
    pub write_timeout: Duration,
    pub max_concurrent: usize,
    pub max_queued: usize,
    pub queue_timeout: Duration,
    pub memory_limit: usize,
    /// What one statement may ask the planner for.
    pub plan: sql_bounds::PlanBounds,
    /// How large a value a function may make.
    pub max_value_bytes: usize,
    pub max_array_length: usize,
    /// Disk that spill files may take, and their folder (`None`: the temporary directory).
    pub spill_bytes: usize,
    pub spill_dir: Option<std::path::PathBuf>,
}

/// DataFusion's settings as skiff changes them (`--datafusion-option` goes over these).
pub fn session_config() -> SessionConfig {
    let mut config = SessionConfig::new();
    let opts = config.options_mut();
    // The lake scan makes its own file groups (balanced by bytes and file count, newest
    // first, more of them on a remote store); DataFusion re-splitting them would undo that.
    opts.optimizer.repartition_file_scans = false;
    // DataFusion 53's dynamic filter for min/max ORs the bounds found so far, so a row
    // that holds one aggregate's value but NULL in another's column can be filtered out
    // before that other bound is found: `max(c), min(b)` answered NULL. Off for answers.
    opts.optimizer.enable_aggregate_dynamic_filter_pushdown = false;
    // DataFusion 53's top-k aggregation (`ORDER BY max(x) LIMIT n` keeping n groups) drops
    // groups whose aggregate is NULL: 65 of 66 groups under LIMIT 1000 (difftest regression
    // 002). Off for answers.
    opts.optimizer.enable_topk_aggregation = false;
    // A join whose build side is estimated (from manifest statistics) under 1M rows and 32 MiB
    // builds one shared hash table instead of hash-partitioning both sides (DataFusion: 128K
    // rows, 1 MiB): the probe side, often lineitem-sized, is then not repartitioned
    // (measured in docs/performance.md).
    opts.optimizer.hash_join_single_partition_threshold = 32 << 20;
    opts.optimizer.hash_join_single_partition_threshold_rows = 1 << 20;
    config
}

/// The session every query runs in, before the lake is registered: DataFusion's functions
/// and rules with the fixes (`fixes`), and skiff's own rules and functions except the
/// `disabled` ones.
pub fn session(
    config: SessionConfig,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    disabled: &rules::Disabled,
) -> Result<SessionContext> {
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_default_features()
        .build();
    // Before skiff's rules, which then see the plan the fixes leave.
    let skiff_count = disabled.is_on("distinct_strings_count").then(|| Arc::new(count_distinct::count()));
    let mut fixed = SessionStateBuilder::new_from_existing(state);
    for rule in fixes::analyzer_rules(skiff_count) {
        fixed = fixed.with_analyzer_rule(rule);
    }
    let state = fixed.build();
    let mut ctx = SessionContext::new_with_state(rules::install(state, disabled));
    fixes::register(&mut ctx)?;
    rules::register_functions(&mut ctx, disabled)?;
    ctx.register_udaf(functions::approx_top_k());
    Ok(ctx)
}

/// [`session`] with the functions bounded by `limits`: what queries run in, on a coordinator
/// and on a worker alike.
fn bounded_session(
    config: SessionConfig,
    runtime: Arc<datafusion::execution::runtime_env::RuntimeEnv>,
    limits: &Limits,
    disabled: &rules::Disabled,
) -> Result<SessionContext> {
    let mut ctx = session(config, runtime, disabled)?;
    let values = bounded_functions::ValueBounds {
        max_value_bytes: limits.max_value_bytes,
        max_array_length: limits.max_array_length,
        max_call_bytes: limits.memory_limit / 4,
    };
    bounded_functions::register(&mut ctx, values)?;
    Ok(ctx)
}

/// Fair shares of one pool: each running query may use its part, and operators that can
/// spill (sorts, aggregations, joins) go to local disk before failing.
fn runtime(limits: &Limits) -> Result<Arc<datafusion::execution::runtime_env::RuntimeEnv>> {
    let mut disk = DiskManagerBuilder::default().with_max_temp_directory_size(limits.spill_bytes as u64);
    if let Some(dir) = &limits.spill_dir {
        disk = disk.with_mode(DiskManagerMode::Directories(vec![dir.clone()]));
    }
    Ok(RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::new(FairSpillPool::new(limits.memory_limit)))
        .with_disk_manager_builder(disk)
        .build_arc()?)
}

/// A distributed worker (`skiff worker`): runs the stages coordinators send it, with skiff's
/// functions under `limits`, its memory pool and spill disk, reading data files through
/// `caches`. It reaches other workers (a stage reads the stages under it) with `token`.
pub fn worker(
    limits: &Limits,
    disabled: &rules::Disabled,
    caches: Arc<Caches>,
    token: Option<&str>,
) -> Result<datafusion_distributed::Worker> {
    let runtime = runtime(limits)?;
    let template = bounded_session(session_config(), Arc::clone(&runtime), limits, disabled)?.state();
    Ok(distributed::worker_service(template, runtime, caches, distributed::Channels::new(token)))
}

/// Parquet decoding errors name no file: a data error that names none gets the files being
/// decoded around the time it happened (open, or closed last); one of them is the culprit.
fn name_open_files(
    e: datafusion::error::DataFusionError,
    stats: &QueryStats,
) -> datafusion::error::DataFusionError {
    let e = match QueryError::from_datafusion(e) {
        QueryError::DataError(m) => {
            let open = stats.recent_files();
            let named = open.iter().any(|f| m.contains(f.rsplit('/').next().unwrap_or(f)));
            if open.is_empty() || named {
                QueryError::DataError(m)
            } else {
                QueryError::DataError(format!("{m} (while reading one of: {})", open.join(", ")))
            }
        }
        other => other,
    };
    datafusion::error::DataFusionError::External(Box::new(e))
}

/// The schema of a response: string views (how the lake's strings are read, see
/// `lake::scan::arrow_schema`) become `Utf8`, inside lists, structs and maps too, so every
/// front end answers strings as Basin SQL types them and clients without view types can read
/// them.
pub fn response_schema(schema: &Schema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_data_type(plain_type(f.data_type())))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// `t` with every string view in it a `Utf8`.
fn plain_type(t: &DataType) -> DataType {
    let field = |f: &FieldRef| Arc::new(f.as_ref().clone().with_data_type(plain_type(f.data_type())));
    match t {
        DataType::Utf8View => DataType::Utf8,
        DataType::List(f) => DataType::List(field(f)),
        DataType::LargeList(f) => DataType::LargeList(field(f)),
        DataType::FixedSizeList(f, n) => DataType::FixedSizeList(field(f), *n),
        DataType::Struct(fs) => DataType::Struct(fs.iter().map(field).collect()),
        DataType::Map(f, sorted) => DataType::Map(field(f), *sorted),
        DataType::Dictionary(k, v) => DataType::Dictionary(k.clone(), Box::new(plain_type(v))),
        other => other.clone(),
    }
}

/// A batch in its response schema (see [`response_schema`]). The copy is of the answer only,
/// which is small next to what the query read.
fn plain_strings(
    batch: RecordBatch,
    schema: &SchemaRef,
) -> std::result::Result<RecordBatch, datafusion::error::DataFusionError> {
    let same = |(c, f): (&ArrayRef, &FieldRef)| c.data_type() == f.data_type();
    if batch.columns().iter().zip(schema.fields()).all(same) {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| if same((c, f)) { Ok(c.clone()) } else { arrow::compute::cast(c, f.data_type()) })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let opts = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(schema.clone(), columns, &opts)?)
}

/// Settings that change speed, not answers.
#[derive(Debug, Clone, Default)]
pub struct Tuning {
    /// Bounds the result cache (0 turns it off).
    pub result_cache_bytes: usize,
    /// DataFusion settings (`datafusion.…`), applied over skiff's own.
    pub datafusion_options: Vec<(String, String)>,
    /// skiff's own rules turned off (`--disable-rules`).
    pub disabled: rules::Disabled,
    /// Distributed workers to run stages on (`--workers`); none: every query runs here.
    pub workers: Vec<url::Url>,
    /// Sent to workers as a bearer token (`--worker-token`).
    pub worker_token: Option<String>,
    /// Run on a thread of its own each time the last running query ends (the binary gives
    /// the allocator's freed memory back to the system).
    pub when_idle: Option<fn()>,
}

/// What a planned but not started query returns and takes.
pub struct Described {
    pub schema: SchemaRef,
    pub parameters: SchemaRef,
}

/// A running query: its schema, its batches as they are produced, and what it has cost so far.
pub struct Query {
    pub schema: SchemaRef,
    pub stream: SendableRecordBatchStream,
    pub stats: Arc<QueryStats>,
    /// What identifies the answer (see [`results::fingerprint`]); `None` when the answer can
    /// change without a new snapshot.
    pub fingerprint: Option<String>,
}

impl Engine {
    pub fn new(lake: Arc<Lake>, limits: Limits, tuning: Tuning) -> Result<Self> {
        let default_schema = lake.namespaces().into_iter().next().unwrap_or_else(|| "public".into());
        let mut config = session_config()
            .with_information_schema(true)
            .with_default_catalog_and_schema(CATALOG, &default_schema)
            .with_create_default_catalog_and_schema(false);
        for (key, value) in &tuning.datafusion_options {
            config
                .options_mut()
                .set(key, value)
                .map_err(|e| QueryError::BadRequest(format!("--datafusion-option {key}={value}: {e}")))?;
        }
        // A stage has at most one task per partition of its scans: with workers, plan at least
        // one partition per worker, or a coordinator with fewer CPUs than workers leaves some idle.
        let set = |key: &str| tuning.datafusion_options.iter().any(|(k, _)| k == key);
        if !set("datafusion.execution.target_partitions") {
            let partitions = config.target_partitions().max(tuning.workers.len());
            config = config.with_target_partitions(partitions);
        }
        let mut ctx = bounded_session(config, runtime(&limits)?, &limits, &tuning.disabled)?;
        let cluster = (!tuning.workers.is_empty()).then(|| {
            Arc::new(distributed::Cluster {
                workers: distributed::Workers(tuning.workers.clone()),
                channels: distributed::Channels::new(tuning.worker_token.as_deref()),
            })
        });
        if let Some(cluster) = &cluster {
            let worker =
                bounded_session(session_config(), ctx.runtime_env(), &limits, &tuning.disabled)?.state();
            ctx = SessionContext::new_with_state(distributed::coordinator(
                ctx.state(),
                cluster.workers.clone(),
                cluster.channels.clone(),
                lake.caches(),
                &worker,
            ));
        }
        ctx.register_catalog(CATALOG, system::with_system_schema(lake.catalog_provider(Names::Versioned)));
        // The same session with every table name one physical table, for the Basin route; its
        // own catalog list, since registering `lake` in a list the two shared would replace it.
        let physical = SessionContext::new_with_state(
            SessionStateBuilder::new_from_existing(ctx.state())
                .with_catalog_list(Arc::new(datafusion::catalog::MemoryCatalogProviderList::new()))
                .build(),
        );
        physical
            .register_catalog(CATALOG, system::with_system_schema(lake.catalog_provider(Names::Physical)));
        let admission =
            Admission::new(limits.max_concurrent, limits.max_queued, limits.queue_timeout, tuning.when_idle);
        let runtime = QueryRuntime::new()?;
        let planner = Planner {
            ctx,
            physical,
            results: ResultCache::new(tuning.result_cache_bytes).map(Arc::new),
            bounds: limits.plan,
            runtime: runtime.handle().clone(),
            cluster,
        };
        Ok(Self {
            planner,
            lake,
            limits,
            admission,
            draining: AtomicBool::new(false),
            shutdown: CancellationToken::new(),
            runtime,
        })
    }

    /// Stops accepting queries; running ones go on.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Cancels every query still queued, planning or running.
    pub fn cancel_all(&self) {
        self.shutdown.cancel();
    }

    /// The engine's live numbers for `/metrics`.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            running: self.admission.running(),
            queued: self.admission.queued(),
            memory_reserved: self.planner.ctx.runtime_env().memory_pool.reserved(),
            memory_limit: self.limits.memory_limit,
            draining: self.is_draining(),
        }
    }

    pub fn lake(&self) -> &Arc<Lake> {
        &self.lake
    }

    /// The session every query starts from (its functions, its settings).
    pub fn session(&self) -> &SessionContext {
        &self.planner.ctx
    }

    /// The catalog SQL sees (lake namespaces and `information_schema`), for front ends that
    /// list tables without running SQL.
    pub fn catalog(&self) -> Option<Arc<dyn CatalogProvider>> {
        self.planner.ctx.catalog(CATALOG)
    }

    /// Plans a query without running it: its result schema and the types of its `$n`
    /// parameters (`Null` where SQL leaves one open). Flight SQL needs both before execution.
    ///
    /// With values for the parameters, the schema is exactly the one execution will produce
    /// (a bound literal is not nullable, an open placeholder is).
    pub async fn describe(&self, sql: &str, params: Vec<ScalarValue>) -> Result<Described> {
        self.check_text(sql)?;
        // Planning alone can take a slot's worth of work: it waits for one as a query does.
        let deadline = tokio::time::Instant::now() + self.limits.query_timeout;
        let permit = self.admit(deadline).await?;
        let planner = self.planner.clone();
        let sql = sql.to_string();
        let (mut plan, _permit) = self
            .until(
                deadline,
                self.on_query_runtime(permit, async move { planner.plan(&planner.ctx.state(), &sql).await }),
            )
            .await?;
        if !params.is_empty() {
            plan = plan.with_param_values(ParamValues::from(params))?;
        }
        let mut params: Vec<(usize, DataType)> = plan
            .get_parameter_types()?
            .into_iter()
            .filter_map(|(name, ty)| {
                let n = name.trim_start_matches('$').parse::<usize>().ok()?;
                Some((n, ty.unwrap_or(DataType::Null)))
            })
            .collect();
        params.sort_by_key(|(n, _)| *n);
        let fields: Vec<Field> =
            params.into_iter().map(|(n, ty)| Field::new(format!("${n}"), ty, true)).collect();
        Ok(Described {
            schema: response_schema(plan.schema().as_arrow()),
            parameters: response_schema(&Schema::new(fields)),
        })
    }

    /// Plans and starts one query. Errors in planning (syntax, unknown tables and columns,
    /// refused statements, an unreachable catalog) come back here, before any row.
    pub async fn execute(&self, sql: &str) -> Result<Query> {
        self.execute_with(sql, Vec::new()).await
    }

    /// [`Engine::execute`] with values for the query's `$1`, `$2`, ... parameters.
    pub async fn execute_with(&self, sql: &str, params: Vec<ScalarValue>) -> Result<Query> {
        self.execute_in(Names::Versioned, sql, params).await
    }

    /// [`Engine::execute_with`], with table names resolved as `names` says.
    pub async fn execute_in(&self, names: Names, sql: &str, params: Vec<ScalarValue>) -> Result<Query> {
        self.check_text(sql)?;
        // One deadline covers waiting for a slot, planning, running and streaming.
        let deadline = tokio::time::Instant::now() + self.limits.query_timeout;
        let permit = self.admit(deadline).await?;
        let planner = self.planner.clone();
        let sql = sql.to_string();
        let (started, permit) = self
            .until(
                deadline,
                self.on_query_runtime(permit, async move { planner.start(names, &sql, params).await }),
            )
            .await?;
        Ok(Query {
            stream: Box::pin(Bounded::new(
                started.stream,
                deadline,
                self.limits.write_timeout,
                self.shutdown.clone(),
                permit,
                started.stats.clone(),
            )),
            ..started
        })
    }

    /// A slot to plan or run a query in, unless skiff is draining.
    async fn admit(&self, deadline: tokio::time::Instant) -> Result<admission::Permit> {
        if self.is_draining() {
            return Err(QueryError::ShuttingDown("no new queries are accepted; retry".into()));
        }
        self.admission.admit(deadline, &self.shutdown).await
    }

    /// Runs `work` (planning) on the query runtime, so that however long it takes the
    /// runtime serving requests and health checks goes on. The task holds `permit` until it
    /// really ends: dropping the returned future (a timeout, a client gone) aborts it at its
    /// next await.
    async fn on_query_runtime<T: Send + 'static>(
        &self,
        permit: admission::Permit,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<(T, admission::Permit)> {
        use tracing::Instrument;
        let work = async move { unwinding(work).await.map(|done| (done, permit)) };
        let mut task = AbortOnDrop(self.runtime.handle().spawn(work.instrument(tracing::Span::current())));
        match (&mut task.0).await {
            Ok(done) => done,
            Err(e) if e.is_panic() => Err(panicked()),
            Err(_) => Err(QueryError::Internal("planning was stopped".into())),
        }
    }

    /// `work`, failing at `deadline` or when shutdown cancels what is still running.
    async fn until<T>(
        &self,
        deadline: tokio::time::Instant,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::select! {
            done = tokio::time::timeout_at(deadline, work) => done.map_err(|_| QueryError::Timeout)?,
            _ = self.shutdown.cancelled() => Err(QueryError::ShuttingDown(CANCELLED_AT_SHUTDOWN.into())),
        }
    }

    fn check_text(&self, sql: &str) -> Result<()> {
        if sql.len() > self.limits.max_sql_bytes {
            return Err(QueryError::BadRequest(format!(
                "SQL text is {} bytes, over the limit of {} bytes",
                sql.len(),
                self.limits.max_sql_bytes
            )));
        }
        if sql.trim().is_empty() {
            return Err(QueryError::BadRequest("the query is empty".into()));
        }
        Ok(())
    }
}

/// What planning a query needs, cloned into the task that plans it.
#[derive(Clone)]
struct Planner {
    ctx: SessionContext,
    /// The same session with every table name resolved as one physical table (Basin SQL's
    /// names, for the Basin route).
    physical: SessionContext,
    /// `None` when turned off.
    results: Option<Arc<ResultCache>>,
    bounds: sql_bounds::PlanBounds,
    /// Where queries execute (see [`execute_on`]).
    runtime: tokio::runtime::Handle,
    /// The workers queries are spread over, if any.
    cluster: Option<Arc<distributed::Cluster>>,
}

/// The first of `tables` that no schema of the session holds, if any.
fn missing_table(
    state: &datafusion::execution::SessionState,
    tables: &[datafusion::sql::TableReference],
) -> Option<String> {
    tables.iter().find_map(|t| {
        let held = state.schema_for_ref(t.clone()).is_ok_and(|schema| schema.table_exist(t.table()));
        (!held).then(|| t.to_string())
    })
}

impl Planner {
    /// SQL to a checked logical plan: dialect rewrites, then the read-only rules.
    async fn plan(&self, state: &datafusion::execution::SessionState, sql: &str) -> Result<LogicalPlan> {
        let numbered = dialect::number_placeholders(sql);
        let sql = numbered.as_deref().unwrap_or(sql);
        let rewritten = dialect::rewrite(sql);
        let parser_dialect = state.config().options().sql_parser.dialect;
        let text = rewritten.as_deref().unwrap_or(sql);
        let statement = state.sql_to_statement(text, &parser_dialect)?;
        sql_bounds::check(&statement, &self.bounds)?;
        let plan = match state.statement_to_plan(statement).await {
            Ok(plan) => plan,
            // DataFusion reports a missing table as a planning error with only text to it:
            // the catalog says which table is missing. The statement went into planning, so
            // the text is parsed again, on this failed path only.
            Err(e) => {
                let statement = state.sql_to_statement(text, &parser_dialect)?;
                let tables = state.resolve_table_references(&statement)?;
                return Err(
                    missing_table(state, &tables).map_or_else(|| e.into(), |t| error::table_not_found(&t))
                );
            }
        };
        readonly::check(&plan)?;
        Ok(plan)
    }

    /// Plans a query and returns its stream. Nothing executes until the stream is first
    /// polled, so a front end can still answer "not modified" from the fingerprint alone.
    async fn start(&self, names: Names, sql: &str, params: Vec<ScalarValue>) -> Result<Query> {
        let session = match names {
            Names::Versioned => &self.ctx,
            Names::Physical => &self.physical,
        };
        let mut state = session.state();
        let stats = Arc::new(QueryStats::default());
        state.config_mut().set_extension(stats.clone());
        let mut plan = self.plan(&state, sql).await?;
        // A query with placeholders and no values fails here, naming the missing one.
        if !params.is_empty() || !plan.get_parameter_types()?.is_empty() {
            plan = plan.with_param_values(ParamValues::from(params))?;
        }
        let fingerprint = results::fingerprint(&plan);
        let cache = match (&self.results, &fingerprint) {
            (None, _) => CacheUse::Off,
            (Some(_), None) => CacheUse::Bypass,
            (Some(results), Some(fp)) => match results.get(fp) {
                Some((schema, stream)) => {
                    stats.set_result_cache(CacheUse::Hit.as_str());
                    return Ok(Query { schema, stream, stats, fingerprint });
                }
                None => CacheUse::Miss,
            },
        };
        stats.set_result_cache(cache.as_str());
        let df = DataFrame::new(state, plan);
        let schema = response_schema(df.schema().as_arrow());
        let open = stats.clone();
        let out = schema.clone();
        let lazy = execute_on(&self.runtime, df, stats.clone()).map_err(move |e| name_open_files(e, &open));
        let lazy = match &self.cluster {
            Some(cluster) => Arc::clone(cluster).name_lost_workers(lazy).boxed(),
            None => lazy.boxed(),
        };
        let lazy = lazy.and_then(move |b| futures::future::ready(plain_strings(b, &out)));
        let mut stream: SendableRecordBatchStream =
            Box::pin(RecordBatchStreamAdapter::new(schema.clone(), lazy));
        if let (Some(results), Some(fp)) = (&self.results, &fingerprint) {
            stream = results.fill(fp.clone(), stream);
        }
        Ok(Query { schema, stream, stats, fingerprint })
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `planning`, with a panic in it turned into a 500 `internal` error (the panic hook has
/// logged where it happened).
async fn unwinding<T>(planning: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(planning).catch_unwind().await.unwrap_or_else(|_| Err(panicked()))
}

/// What a query that panicked fails with. The panic's message and location are in the log,
/// under the request's id, not in the response: the message may quote data.
fn panicked() -> QueryError {
    QueryError::Internal(
        "the query hit a bug in skiff (a panic); it is logged under this request's id".into(),
    )
}

/// A runtime of its own for executing queries. On the runtime that serves requests, a
/// CPU-bound query (a large join) kept health checks waiting for seconds and let timeouts,
/// the admission queue's 429s and shutdown fire 5–20 s late: their timers only run when a
/// worker is free to poll them.
struct QueryRuntime(Option<tokio::runtime::Runtime>);

impl QueryRuntime {
    fn new() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("skiff-query")
            // Physical planning and execution recurse over the plan, as planning does.
            .thread_stack_size(8 << 20)
            .enable_all()
            .build()
            .map_err(|e| QueryError::Internal(format!("starting the query runtime: {e}")))?;
        Ok(Self(Some(runtime)))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("the runtime lives as long as the engine").handle()
    }
}

impl Drop for QueryRuntime {
    /// Dropped inside the serving runtime, which must not block on it.
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.shutdown_background();
        }
    }
}

/// Executes `df` on `runtime`, from its first poll (so "not modified" still executes
/// nothing), and hands its batches over: the caller only waits for them. When the caller
/// drops the stream the query stops, and a query that panics ends in an error, never in
/// what would look like a complete answer. Workers' reads are added to `stats` before the
/// end reaches the caller, who reads them then.
fn execute_on(
    runtime: &tokio::runtime::Handle,
    df: DataFrame,
    stats: Arc<QueryStats>,
) -> impl futures::Stream<Item = datafusion::error::Result<RecordBatch>> + Send + 'static {
    use datafusion::error::DataFusionError;
    use futures::StreamExt;
    use tracing::Instrument;
    let runtime = runtime.clone();
    // The request's span, so that a panic in the query's tasks is logged under its id.
    let span = tracing::Span::current();
    futures::stream::once(async move {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let task = runtime.spawn(
            async move {
                let task = Arc::new(df.task_ctx());
                let started = df.create_physical_plan().await.and_then(|plan| {
                    Ok((datafusion::physical_plan::execute_stream(Arc::clone(&plan), task)?, plan))
                });
                let (mut batches, plan) = match started {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                loop {
                    let next = tokio::select! {
                        _ = tx.closed() => return,
                        next = batches.next() => next,
                    };
                    let Some(item) = next else {
                        distributed::count_worker_reads(&plan, &stats);
                        return;
                    };
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
            }
            .instrument(span),
        );
        futures::stream::unfold((rx, Some(task)), |(mut rx, task)| async move {
            if let Some(item) = rx.recv().await {
                return Some((item, (rx, task)));
            }
            // The sender is gone: a clean end, unless the task panicked.
            match task?.await {
                Err(e) if e.is_panic() => {
                    Some((Err(DataFusionError::External(Box::new(panicked()))), (rx, None)))
                }
                _ => None,
            }
        })
    })
    .flatten()
}

/// For tests: a query's answer and its EXPLAIN, each printed as a table.
#[cfg(test)]
pub(crate) async fn answer_and_plan(ctx: &SessionContext, sql: &str) -> (String, String) {
    use arrow::util::pretty::pretty_format_batches;
    let answer = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let plan = ctx.sql(&format!("EXPLAIN {sql}")).await.unwrap().collect().await.unwrap();
    (pretty_format_batches(&answer).unwrap().to_string(), pretty_format_batches(&plan).unwrap().to_string())
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use arrow::datatypes::DataType;
    use datafusion::logical_expr::{
        ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
    };
    use futures::StreamExt;
    use tracing::Instrument;

    use super::*;

    /// A function that panics while the query runs, or, with `in_planning`, while it is
    /// planned: a stand-in for a bug anywhere in skiff or DataFusion.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct Panics {
        in_planning: bool,
        signature: Signature,
    }

    impl ScalarUDFImpl for Panics {
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn name(&self) -> &str {
            if self.in_planning { "panics_in_planning" } else { "panics_in_execution" }
        }
        fn signature(&self) -> &Signature {
            &self.signature
        }
        fn return_type(&self, _: &[DataType]) -> datafusion::error::Result<DataType> {
            assert!(!self.in_planning, "a bug found while planning");
            Ok(DataType::Int64)
        }
        fn invoke_with_args(&self, _: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
            panic!("a bug found while executing");
        }
    }

    /// Everything the process logs, from every thread.
    fn captured() -> &'static Mutex<Vec<u8>> {
        static LOG: std::sync::OnceLock<&'static Mutex<Vec<u8>>> = std::sync::OnceLock::new();
        LOG.get_or_init(|| {
            let log: &'static Mutex<Vec<u8>> = Box::leak(Box::default());
            struct Writer(&'static Mutex<Vec<u8>>);
            impl Write for Writer {
                fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                    self.0.lock().unwrap().extend_from_slice(b);
                    Ok(b.len())
                }
                fn flush(&mut self) -> std::io::Result<()> {
                    Ok(())
                }
            }
            let subscriber =
                tracing_subscriber::fmt().with_ansi(false).with_writer(move || Writer(log)).finish();
            tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
            panics::install();
            log
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_is_an_internal_error_logged_with_its_request_and_place() {
        let log = captured();
        let dir = tempfile::tempdir().unwrap();
        let lake = crate::testing::demo_lake(dir.path(), 2000).await;
        let engine = crate::testing::engine(lake, Tuning::default());
        for in_planning in [true, false] {
            let f = Panics { in_planning, signature: Signature::any(1, Volatility::Immutable) };
            engine.session().register_udf(ScalarUDF::new_from_impl(f));
        }
        for (sql, id) in [
            ("SELECT panics_in_planning(1)", "req-planning"),
            ("SELECT panics_in_execution(event) FROM glass.events", "req-execution"),
        ] {
            let span = tracing::info_span!("query", request_id = id, route = "test");
            let outcome = async {
                let mut q = engine.execute(sql).await?;
                while let Some(b) = q.stream.next().await {
                    b?;
                }
                Ok::<_, QueryError>(())
            }
            .instrument(span)
            .await;
            let e = outcome.expect_err(sql);
            assert!(matches!(e, QueryError::Internal(_)), "{sql}: {e:?}");
            let text = String::from_utf8_lossy(&log.lock().unwrap()).to_string();
            let line = text.lines().find(|l| l.contains(id) && l.contains("panicked")).unwrap_or_else(|| {
                panic!("no panic line for {id} in:\n{text}");
            });
            assert!(line.contains("crates/engine/src/lib.rs:"), "the place: {line}");
        }
        // The engine goes on.
        let mut q = engine.execute("SELECT count(*) FROM glass.events").await.unwrap();
        assert!(q.stream.next().await.unwrap().is_ok());
    }
}
