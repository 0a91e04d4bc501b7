//! Distributed execution on `datafusion-distributed` (docs/distributed.md).
//!
//! A coordinator plans as one skiff does, then [`Distribute`] cuts the plan into stages whose
//! tasks run on workers (`skiff worker`), reached over Arrow Flight. A plan travels through
//! [`codec`]: DataFusion's own nodes as DataFusion writes them, skiff's scans and nodes by
//! skiff's codecs. A plan holding a node no codec can carry runs on the coordinator alone, as
//! it would without workers: never a wrong answer, only one that is not spread.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use arrow::array::RecordBatch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{AggregateUDF, ScalarUDF, WindowUDF};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::window::StandardWindowExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec, SymmetricHashJoinExec,
};
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec, WindowUDFExpr};
use datafusion_distributed::{
    BoxCloneSyncChannel, ChannelResolver, DistributedCodec, DistributedExec, DistributedExt,
    DistributedMetricsFormat, DistributedPhysicalOptimizerRule, GetWorkerInfoRequest, NetworkBoundaryExt,
    Worker, WorkerQueryContext, WorkerResolver, WorkerServiceClient, create_worker_client,
    rewrite_distributed_plan_with_metrics,
};
use datafusion_proto::physical_plan::{
    AsExecutionPlan, ComposedPhysicalExtensionCodec, PhysicalExtensionCodec,
};
use datafusion_proto::protobuf::PhysicalPlanNode;
use futures::{Stream, StreamExt};
use prost::Message;
use skiff_lake::cache::Caches;
use skiff_lake::stats::QueryStats;
use skiff_lake::{LakeCodec, LakeScanExec};
use tonic::codegen::http::{self, HeaderValue};
use tonic::transport::Channel;
use tower::ServiceExt;
use url::Url;

use crate::error::QueryError;
use crate::fixes::{Job, Pass};
use crate::tunnel;

/// The workers a coordinator sends stages to: a fixed list.
#[derive(Debug, Clone)]
pub struct Workers(pub Vec<Url>);

impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<Url>> {
        Ok(self.0.clone())
    }
}

/// How coordinators and workers reach workers: one HTTP/2 connection per worker, reused,
/// with pings so that a worker that stops answering fails its queries within seconds instead
/// of holding them until `--query-timeout`. A worker that cannot be reached fails the query
/// with a 503 naming it. `http://` workers are reached over TCP, `ws://` and `wss://` ones
/// through a WebSocket tunnel ([`crate::tunnel`]); the worker token, if any, goes with every
/// call and every tunnel.
#[derive(Clone)]
pub struct Channels {
    connected: Arc<moka::sync::Cache<Url, BoxCloneSyncChannel>>,
    token: Option<Arc<str>>,
    tls: Arc<rustls::ClientConfig>,
}

/// How long connecting to a worker may take, and the ping interval and timeout on its
/// connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Through a tunnel, longer: on Cloudflare a worker's container that sleeps is started by the
/// first connection, and its Durable Object holds the upgrade until it answers.
const TUNNEL_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const PING: Duration = Duration::from_secs(10);

impl Channels {
    pub fn new(token: Option<&str>) -> Self {
        // Idle connections go after 5 minutes (a worker replaced meanwhile is connected anew).
        Self {
            connected: Arc::new(moka::sync::Cache::builder().time_to_idle(Duration::from_secs(300)).build()),
            token: token.map(Arc::from),
            tls: tunnel::tls(),
        }
    }

    async fn connect(&self, url: &Url) -> Result<BoxCloneSyncChannel> {
        let unreachable = |e: &dyn std::fmt::Display| {
            DataFusionError::External(Box::new(QueryError::Unavailable {
                dependency: "worker",
                message: format!("{url} cannot be reached: {e}"),
            }))
        };
        let tunneled = matches!(url.scheme(), "ws" | "wss");
        // Through a tunnel the endpoint's address only names the worker in the :authority.
        let address =
            if tunneled { format!("http://{}", url.host_str().unwrap_or("worker")) } else { url.to_string() };
        let endpoint = Channel::from_shared(address)
            .map_err(|e| unreachable(&e))?
            .connect_timeout(if tunneled { TUNNEL_CONNECT_TIMEOUT } else { CONNECT_TIMEOUT })
            .http2_keep_alive_interval(PING)
            .keep_alive_timeout(PING)
            .keep_alive_while_idle(true);
        let connected = if tunneled {
            let (url, token, tls) = (url.clone(), self.token.clone(), Arc::clone(&self.tls));
            let dial = tower::service_fn(move |_| tunnel::dial(url.clone(), token.clone(), Arc::clone(&tls)));
            endpoint.connect_with_connector(dial).await
        } else {
            endpoint.connect().await
        };
        let channel = connected.map_err(|e| unreachable(&source_chain(&e)))?;
        let Some(token) = &self.token else {
            return Ok(BoxCloneSyncChannel::new(channel));
        };
        let bearer = HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| unreachable(&"the worker token is not a valid header value"))?;
        Ok(BoxCloneSyncChannel::new(channel.map_request(move |mut request: http::Request<_>| {
            request.headers_mut().insert(http::header::AUTHORIZATION, bearer.clone());
            request
        })))
    }
}

#[async_trait]
impl ChannelResolver for Channels {
    async fn get_worker_client_for_url(&self, url: &Url) -> Result<WorkerServiceClient<BoxCloneSyncChannel>> {
        if let Some(channel) = self.connected.get(url) {
            return Ok(create_worker_client(channel));
        }
        let channel = self.connect(url).await?;
        self.connected.insert(url.clone(), channel.clone());
        Ok(create_worker_client(channel))
    }
}

/// `e` and its causes, as one line (a transport error's own text is only "transport error").
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// A coordinator's workers, and its connections to them.
pub struct Cluster {
    pub workers: Workers,
    pub channels: Channels,
}

impl Cluster {
    /// `batches`, with a failure while some worker does not answer turned into a 503 that
    /// names it. The library passes a worker's failures on as text, so which worker is found by
    /// asking each one, only when a query has failed.
    pub fn name_lost_workers(
        self: Arc<Self>,
        batches: impl Stream<Item = Result<RecordBatch>> + Send + 'static,
    ) -> impl Stream<Item = Result<RecordBatch>> + Send + 'static {
        batches.then(move |item| {
            let cluster = Arc::clone(&self);
            async move {
                match item {
                    Err(e) => Err(DataFusionError::External(Box::new(cluster.named(e).await))),
                    ok => ok,
                }
            }
        })
    }

    async fn named(&self, e: DataFusionError) -> QueryError {
        let e = QueryError::from_datafusion(e);
        let asked =
            futures::future::join_all(self.workers.0.iter().map(|url| ask(url, &self.channels))).await;
        let named = |of: Reply| {
            let urls: Vec<&str> = self
                .workers
                .0
                .iter()
                .zip(&asked)
                .filter(|(_, r)| **r == of)
                .map(|(u, _)| u.as_str())
                .collect();
            urls.join(", ")
        };
        let (silent, refusing) = (named(Reply::Silent), named(Reply::Refused));
        let message = match (silent.is_empty(), refusing.is_empty()) {
            (true, true) => return e,
            (false, _) => format!("{silent} did not answer ({e})"),
            (true, false) => format!("{refusing} refused this coordinator's --worker-token"),
        };
        QueryError::Unavailable { dependency: "worker", message }
    }
}

/// How a worker answers when asked for its information.
#[derive(PartialEq)]
enum Reply {
    Answered,
    Refused,
    Silent,
}

/// Asks the worker at `url` (for a second) whether it is there: who to name when a query
/// failed because a connection to a worker broke, or a worker refused the token.
async fn ask(url: &Url, channels: &Channels) -> Reply {
    let asked = async {
        let mut client = channels.get_worker_client_for_url(url).await.ok()?;
        match client.get_worker_info(GetWorkerInfoRequest {}).await {
            Ok(_) => Some(Reply::Answered),
            Err(s) if s.code() == tonic::Code::Unauthenticated => Some(Reply::Refused),
            Err(_) => None,
        }
    };
    tokio::time::timeout(Duration::from_secs(1), asked).await.ok().flatten().unwrap_or(Reply::Silent)
}

/// Adds to `stats` what the workers of `plan`, a query that has ended, read: their scans'
/// counts come back as plan metrics when each task ends. A query that stopped reading early
/// (a `LIMIT`) may not have every task's metrics; then only the coordinator's reads count,
/// which the log says.
pub fn count_worker_reads(plan: &Arc<dyn ExecutionPlan>, stats: &QueryStats) {
    if !plan.as_any().is::<DistributedExec>() {
        return;
    }
    let counted =
        rewrite_distributed_plan_with_metrics(Arc::clone(plan), DistributedMetricsFormat::Aggregated)
            .and_then(|plan| {
                plan.apply(|node| {
                    if let Some(metrics) = node.metrics() {
                        stats.add_reads(&metrics);
                    }
                    Ok(TreeNodeRecursion::Continue)
                })
            });
    if let Err(e) = counted {
        tracing::debug!(error = %e, "the workers' reads are not in this query's metrics");
    }
}

/// Everything a plan needs to travel: skiff's scans (reading through `caches`) and nodes.
pub fn codec(caches: Arc<Caches>) -> Arc<dyn PhysicalExtensionCodec> {
    let nodes: Arc<dyn PhysicalExtensionCodec> = Arc::new(NodeCodec);
    Arc::new(ComposedPhysicalExtensionCodec::new(vec![
        Arc::new(LakeCodec::new(caches, Arc::clone(&nodes), crate::rules::wrapped))
            as Arc<dyn PhysicalExtensionCodec>,
        nodes,
    ]))
}

/// A coordinator's session: `state` with its plans cut into stages for `workers`. `worker`
/// is a session as a worker builds it, which each distributed plan is read back in before
/// it is sent, so a plan a worker could not read runs on the coordinator instead.
pub fn coordinator(
    state: SessionState,
    workers: Workers,
    channels: Channels,
    caches: Arc<Caches>,
    worker: &SessionState,
) -> SessionState {
    let codec = codec(caches);
    let distribute = Distribute { codec: Arc::clone(&codec), check: worker.task_ctx() };
    let mut rules = state.physical_optimizers().to_vec();
    rules.push(Arc::new(distribute));
    SessionStateBuilder::new_from_existing(state)
        .with_physical_optimizer_rules(rules)
        .with_distributed_worker_resolver(workers)
        .with_distributed_channel_resolver(channels)
        .with_distributed_user_codec_arc(codec)
        .build()
}

/// A worker's session for one task: `builder` (what the library gives, with the task's
/// settings) with skiff's functions from `skiff` and skiff's codec.
fn worker(
    builder: SessionStateBuilder,
    skiff: &SessionState,
    codec: Arc<dyn PhysicalExtensionCodec>,
    channels: Channels,
) -> SessionState {
    builder
        .with_scalar_functions(skiff.scalar_functions().values().cloned().collect())
        .with_aggregate_functions(skiff.aggregate_functions().values().cloned().collect())
        .with_window_functions(skiff.window_functions().values().cloned().collect())
        .with_distributed_user_codec_arc(codec)
        .with_distributed_channel_resolver(channels)
        .build()
}

/// The worker service: each task's session is `template`'s functions over the task's own
/// settings, running in `runtime`.
pub fn worker_service(
    template: SessionState,
    runtime: Arc<RuntimeEnv>,
    caches: Arc<Caches>,
    channels: Channels,
) -> Worker {
    let template = Arc::new(template);
    let codec = codec(caches);
    Worker::from_session_builder(move |ctx: WorkerQueryContext| {
        let (template, codec, channels) = (Arc::clone(&template), Arc::clone(&codec), channels.clone());
        async move { Ok(worker(ctx.builder, &template, codec, channels)) }
    })
    .with_runtime_env(runtime)
}

/// Cuts a plan into stages (`datafusion-distributed`'s rule), then wraps skiff's scans so they
/// travel. Runs last, after every rule that shapes the plan.
#[derive(Debug)]
struct Distribute {
    codec: Arc<dyn PhysicalExtensionCodec>,
    /// A worker's task context, to read each stage back in.
    check: Arc<TaskContext>,
}

impl PhysicalOptimizerRule for Distribute {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if top_k_prunes_a_scan(&plan) {
            tracing::debug!(
                "a top-k prunes its scan with a dynamic filter: the plan runs on the coordinator alone"
            );
            return Ok(plan);
        }
        // A build side's values reach its probe side's scans in memory, so never across processes.
        let plan = crate::join_sides::without_join_sides(plan)?;
        // A capped partial aggregation's two nodes have no encoding; workers run it uncapped.
        let plan = crate::bounded_partials::without_bounded_partials(plan)?;
        // A NOT IN's subquery notes what it had for the gate over the join, in memory.
        let plan = crate::not_in::without_not_in_gates(plan)?;
        let distributed = DistributedPhysicalOptimizerRule.optimize(Arc::clone(&plan), config)?;
        if Arc::ptr_eq(&distributed, &plan) {
            return Ok(plan);
        }
        let distributed = LakeScanExec::wrap_scans(distributed)?;
        match self.travels(&distributed) {
            Ok(()) => Ok(distributed),
            Err(e) => {
                // The codec's error quotes the whole plan: its start says which node.
                let reason: String = e.to_string().chars().take(200).collect();
                tracing::debug!(%reason, "the plan runs on the coordinator alone");
                Ok(plan)
            }
        }
    }

    fn name(&self) -> &str {
        "distribute"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

impl Distribute {
    /// Whether every stage of `plan` can be written and read back as a worker reads it.
    fn travels(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
        let codec = SameFunctions {
            worker: Arc::clone(&self.check),
            inner: ComposedPhysicalExtensionCodec::new(vec![
                Arc::new(DistributedCodec),
                Arc::clone(&self.codec),
            ]),
        };
        let mut failed = None;
        plan.apply(|node| {
            // A boundary's child is the stage it reads, sent as a plan of its own.
            let children = node.children();
            let (Some(_), [stage]) = (node.as_network_boundary(), children.as_slice()) else {
                return Ok(TreeNodeRecursion::Continue);
            };
            if stage.exists(|n| Ok(loses_ignore_nulls(n.as_ref())))? {
                failed = Some(DataFusionError::NotImplemented(
                    "DataFusion's codec drops IGNORE NULLS from window functions".into(),
                ));
                return Ok(TreeNodeRecursion::Stop);
            }
            let round_trip = PhysicalPlanNode::try_from_physical_plan(Arc::clone(*stage), &codec)
                .and_then(|p| PhysicalPlanNode::decode(p.encode_to_vec().as_slice()).map_err(|e| proto(&e)))
                .and_then(|p| p.try_into_physical_plan(&self.check, &codec));
            if let Err(e) = round_trip {
                failed = Some(e);
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        failed.map_or(Ok(()), Err)
    }
}

/// Whether a top-k (a sort with a limit) reads a scan that prunes files and row groups by the
/// top-k's dynamic filter. That filter tightens as the top-k fills, on the coordinator; a plan
/// carries it to workers as it is when sent (empty), so spread, every file would be read: a
/// listing that takes 0.1 s alone took 0.5–0.8 s over workers (docs/distributed.md). Joins'
/// dynamic filters are not looked for: the search stops at a join.
fn top_k_prunes_a_scan(plan: &Arc<dyn ExecutionPlan>) -> bool {
    fn prunes(node: &Arc<dyn ExecutionPlan>) -> bool {
        if node.as_any().is::<DataSourceExec>() {
            return skiff_lake::scan_takes_dynamic_filter(node);
        }
        let any = node.as_any();
        let join = any.is::<HashJoinExec>()
            || any.is::<SortMergeJoinExec>()
            || any.is::<NestedLoopJoinExec>()
            || any.is::<CrossJoinExec>()
            || any.is::<SymmetricHashJoinExec>();
        !join && node.children().into_iter().any(prunes)
    }
    plan.exists(|node| {
        let top_k = node.as_any().downcast_ref::<SortExec>().filter(|s| s.fetch().is_some());
        Ok(top_k.is_some_and(|s| prunes(s.input())))
    })
    .unwrap_or(false)
}

/// Whether `node` computes window functions that DataFusion 53's codec would send without
/// their `IGNORE NULLS` (it writes `false` for every `WindowUDFExpr`: `lead(x) IGNORE NULLS`
/// came back as plain `lead(x)`, a wrong answer), nor whether DataFusion reversed the function
/// to share a sort (`lead` as a reversed `lag`). Both flags are private, so every such function
/// stays on the coordinator; aggregate functions over windows keep theirs. Goes when
/// datafusion-proto writes both.
fn loses_ignore_nulls(node: &dyn ExecutionPlan) -> bool {
    let exprs = if let Some(w) = node.as_any().downcast_ref::<BoundedWindowAggExec>() {
        w.window_expr()
    } else if let Some(w) = node.as_any().downcast_ref::<WindowAggExec>() {
        w.window_expr()
    } else {
        return false;
    };
    exprs.iter().any(|e| {
        e.as_any()
            .downcast_ref::<StandardWindowExpr>()
            .is_some_and(|s| s.get_standard_func_expr().as_any().is::<WindowUDFExpr>())
    })
}

/// A codec that writes functions by name (as `datafusion-distributed` does) only when the
/// worker's function of that name is the plan's: a worker reading a skiff replacement as
/// DataFusion's function, or the other way round, could compute a different answer or a
/// partial state the next stage cannot read.
#[derive(Debug)]
struct SameFunctions {
    worker: Arc<TaskContext>,
    inner: ComposedPhysicalExtensionCodec,
}

impl SameFunctions {
    fn same<F: PartialEq + ?Sized>(
        &self,
        kind: &str,
        name: &str,
        worker: Option<&Arc<F>>,
        plan: &F,
    ) -> Result<()> {
        match worker {
            Some(f) if f.as_ref() == plan => Ok(()),
            _ => Err(DataFusionError::NotImplemented(format!("the {kind} {name} is not the worker's"))),
        }
    }
}

impl PhysicalExtensionCodec for SameFunctions {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_encode_udf(&self, f: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.same("function", f.name(), self.worker.scalar_functions().get(f.name()), f)?;
        self.inner.try_encode_udf(f, buf)
    }

    fn try_encode_udaf(&self, f: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.same("aggregate", f.name(), self.worker.aggregate_functions().get(f.name()), f)?;
        self.inner.try_encode_udaf(f, buf)
    }

    fn try_encode_udwf(&self, f: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.same("window function", f.name(), self.worker.window_functions().get(f.name()), f)?;
        self.inner.try_encode_udwf(f, buf)
    }

    fn try_decode_expr(&self, buf: &[u8], inputs: &[Arc<dyn PhysicalExpr>]) -> Result<Arc<dyn PhysicalExpr>> {
        self.inner.try_decode_expr(buf, inputs)
    }

    fn try_encode_expr(&self, node: &Arc<dyn PhysicalExpr>, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_expr(node, buf)
    }
}

fn proto(e: &prost::DecodeError) -> DataFusionError {
    DataFusionError::Internal(format!("a plan: {e}"))
}

/// skiff's own plan nodes, as they travel.
#[derive(Debug)]
struct NodeCodec;

/// The first byte of each node's encoding.
const PASS: u8 = 1;

impl PhysicalExtensionCodec for NodeCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (buf, inputs) {
            ([PASS, job], [input]) => Ok(Pass::over(Job::from_byte(*job)?, Arc::clone(input))),
            _ => Err(DataFusionError::Internal("not a node of skiff's".into())),
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(job) = Pass::job_of(node.as_ref()) {
            buf.extend([PASS, job.to_byte()]);
            return Ok(());
        }
        Err(DataFusionError::NotImplemented(format!("{} does not travel to workers yet", node.name())))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::prelude::SessionContext;

    use super::*;

    #[test]
    fn every_pass_node_travels_and_comes_back_with_its_job() {
        let input: Arc<dyn ExecutionPlan> =
            Arc::new(EmptyExec::new(Arc::new(arrow::datatypes::Schema::empty())));
        let ctx = SessionContext::new().task_ctx();
        for job in Job::ALL {
            let mut buf = Vec::new();
            NodeCodec.try_encode(Pass::over(job, Arc::clone(&input)), &mut buf).unwrap();
            let back = NodeCodec.try_decode(&buf, std::slice::from_ref(&input), &ctx).unwrap();
            assert_eq!(Pass::job_of(back.as_ref()), Some(job));
        }
        let mut buf = Vec::new();
        assert!(
            NodeCodec.try_encode(input, &mut buf).is_err(),
            "DataFusion's nodes are DataFusion's codec's"
        );
    }
}
