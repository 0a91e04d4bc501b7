//! Configuration: one struct, every flag with an environment variable, checked at start.
//!
//! The names here are a contract (scripts, the Worker and the Dockerfile set them), so they
//! change only with care. Validation turns a bad value into a message the user can act on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use skiff_engine as engine;
use skiff_engine::rules::Disabled;
use skiff_lake::catalog::{CatalogOptions, redact_uri};
use skiff_lake::data_cache::DataCache;
use skiff_lake::versions::PinnedVersions;

#[derive(Debug, Parser)]
#[command(
    name = "skiff",
    version,
    about = "SQL over Apache Iceberg lakes: DataFusion, read-only, Basin SQL-compatible"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve SQL over HTTP (the default command).
    Serve(Box<ServeConfig>),
    /// Run stages of distributed queries for coordinators (`skiff serve --workers`), over Arrow
    /// Flight. Takes `serve`'s settings, so one environment configures both; those about the
    /// catalog and the front ends are not used.
    Worker(Box<WorkerConfig>),
    /// Write a demo lake shaped like the one Cloudflare Pipelines writes.
    Demo(DemoArgs),
    /// List skiff's own optimizer rules, in the order they run, by the names
    /// `--disable-rules` takes.
    Rules,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Folder for catalog.db and warehouse/ (created; an existing lake there is replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of events to write across glass.events and glass.events_v2.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
}

/// `skiff worker`: where it listens, and the settings it shares with `serve`.
#[derive(Debug, Clone, Args)]
pub struct WorkerConfig {
    /// gRPC (Arrow Flight) listen address for coordinators. Anything but a loopback address
    /// needs `--worker-token`.
    #[arg(long, env = "SKIFF_WORKER_ADDR", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// HTTP listen address of the WebSocket tunnel to the gRPC server, for where only HTTP
    /// reaches a worker (Cloudflare Containers): `GET /_health`, and `GET /_worker…` upgraded
    /// to a WebSocket carrying gRPC. Needs `--worker-token`. Default: off.
    #[arg(long, env = "SKIFF_WORKER_TUNNEL_ADDR", default_value = "off", value_parser = parse_listen)]
    pub tunnel: Listen,
    #[command(flatten)]
    pub settings: ServeConfig,
}

/// Everything `skiff serve` can be told. A catalog is required, unless the demo lake is asked
/// for (`--demo`, or `skiff` with no arguments at all).
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Iceberg catalog: `sqlite:///abs/catalog.db`, `sqlite://rel/catalog.db`, `postgres://…`,
    /// or `http(s)://…` for an Iceberg REST catalog such as Basin Catalog. Required unless
    /// `--demo`.
    #[arg(long, env = "SKIFF_CATALOG_URI", hide_env_values = true)]
    pub catalog_uri: Option<String>,

    /// Serve the demo lake in `./lake` (written first if missing) instead of a catalog. Never
    /// implied by a missing catalog, so a deployment whose catalog setting went missing fails
    /// at start instead of answering over synthetic data.
    #[arg(long, env = "SKIFF_DEMO", default_value_t = false)]
    pub demo: bool,

    /// How long skiff keeps trying to reach the catalog at start (`30s`, `5m`, or `forever`).
    /// It listens meanwhile, answering 503 `starting` with the last attempt's error; past this
    /// it exits with that error. `0s`: exit at the first failure.
    #[arg(long, env = "SKIFF_CATALOG_WAIT", default_value = "forever", value_parser = parse_wait)]
    pub catalog_wait: Wait,

    /// Warehouse: `file:///…`, a plain path, `s3://bucket/prefix`, or a REST warehouse name
    /// (Basin Catalog: `<ACCOUNT_ID>_<BUCKET>`). Unset with no catalog: `./lake/warehouse`.
    #[arg(long, env = "SKIFF_WAREHOUSE")]
    pub warehouse: Option<String>,

    /// Catalog name in a SQL catalog (`catalog_name` column). Default: the only one present.
    #[arg(long, env = "SKIFF_CATALOG_NAME")]
    pub catalog_name: Option<String>,

    /// Bearer token for a REST catalog (Basin Catalog: a Cloudflare API token).
    /// Falls back to `CF_API_TOKEN`.
    #[arg(long, env = "SKIFF_CATALOG_TOKEN", hide_env_values = true)]
    pub catalog_token: Option<String>,

    /// HTTP listen address.
    #[arg(long, env = "SKIFF_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,

    /// Arrow Flight SQL listen address; empty or `off` turns Flight off. On Cloudflare only
    /// HTTP reaches a container (through the Worker), so Flight serves direct deployments.
    #[arg(long, env = "SKIFF_FLIGHT_ADDR", default_value = "127.0.0.1:32010", value_parser = parse_listen)]
    pub flight_addr: Listen,

    /// Client tokens; a comma-separated list allows rotation. Also read from `SKIFF_API_TOKEN`.
    /// Unset: no auth (a warning is logged).
    #[arg(long, env = "API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,

    /// Token of the admin route (`POST /_admin/credentials`), which replaces the client tokens
    /// and the catalog token while skiff runs. Unset: no admin route.
    #[arg(long, env = "SKIFF_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Pinned table versions, as the Worker lists them: `events=1,2;identities=1`.
    /// Unset: versions are discovered from the catalog.
    #[arg(long, env = "LAKE_VERSIONS")]
    pub lake_versions: Option<String>,

    /// How often the table list is re-read from the catalog (`30s`, `5m`).
    #[arg(long, env = "SKIFF_REFRESH_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub refresh_interval: Duration,

    /// Read every table's current manifests and data files' Parquet footers at start, in the
    /// background, so the first queries plan and open files from memory (`false` leaves each
    /// table to its first query).
    #[arg(long, env = "SKIFF_WARM_ON_START", default_value_t = true, action = clap::ArgAction::Set)]
    pub warm_on_start: bool,

    /// S3-compatible endpoint for `s3://` warehouses (R2: `https://<ACCOUNT_ID>.r2.cloudflarestorage.com`).
    #[arg(long, env = "SKIFF_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// S3 region (R2: `auto`).
    #[arg(long, env = "SKIFF_S3_REGION")]
    pub s3_region: Option<String>,
    /// S3 access key id (REST catalogs usually vend credentials instead).
    #[arg(long, env = "SKIFF_S3_ACCESS_KEY_ID", hide_env_values = true)]
    pub s3_access_key_id: Option<String>,
    /// S3 secret access key.
    #[arg(long, env = "SKIFF_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub s3_secret_access_key: Option<String>,
    /// Use path-style S3 URLs (most local S3-compatible servers need it).
    #[arg(long, env = "SKIFF_S3_PATH_STYLE", default_value_t = false)]
    pub s3_path_style: bool,

    /// Connections open at once on each listener (HTTP, Flight); one more closes the one idle
    /// longest. Lowered at start to fit the open-file limit.
    #[arg(long, env = "SKIFF_MAX_CONNECTIONS", default_value_t = 1024)]
    pub max_connections: usize,

    /// How long a connection may stay open without moving a byte while no request of its is
    /// being answered (`30s`): idle keep-alive connections, and clients that send nothing or
    /// half a request, are closed then.
    #[arg(long, env = "SKIFF_IDLE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Longest an HTTP request's headers may take to arrive (`10s`).
    #[arg(long, env = "SKIFF_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// Largest accepted request body, in bytes.
    #[arg(long, env = "SKIFF_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Longest accepted SQL text, in bytes.
    #[arg(long, env = "SKIFF_MAX_SQL_BYTES", default_value_t = 256 * 1024)]
    pub max_sql_bytes: usize,

    /// Longest a query may take, from arrival to its last byte: queueing, planning,
    /// execution and streaming (`30s`, `2m`). The query is cancelled then.
    #[arg(long, env = "SKIFF_QUERY_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub query_timeout: Duration,

    /// How long a result waits for its client to read the next part (`20s`): a client that
    /// stops reading longer has its query cancelled and its slot freed (HTTP and Flight).
    #[arg(long, env = "SKIFF_WRITE_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// Queries executing at once; more wait in the queue.
    #[arg(long, env = "SKIFF_MAX_CONCURRENT_QUERIES", default_value_t = 4)]
    pub max_concurrent_queries: usize,

    /// Queries waiting for a slot; more are turned away with 429.
    #[arg(long, env = "SKIFF_MAX_QUEUED_QUERIES", default_value_t = 64)]
    pub max_queued_queries: usize,

    /// Longest a query waits for a slot before a 429 (`10s`).
    #[arg(long, env = "SKIFF_QUEUE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub queue_timeout: Duration,

    /// Memory shared by running queries (`512MiB`, `4GiB`); past it they spill to disk or
    /// fail. Default: 60% of the container's (cgroup) or machine's memory.
    #[arg(long, env = "SKIFF_MEMORY_LIMIT", value_parser = parse_bytes)]
    pub memory_limit: Option<usize>,

    /// The longest string a function may make (`repeat`, `lpad`, `replace`, …), in bytes.
    #[arg(long, env = "SKIFF_MAX_VALUE_BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    pub max_value_bytes: usize,

    /// The most elements an array or series a function makes may have (`array_repeat`,
    /// `range`, …).
    #[arg(long, env = "SKIFF_MAX_ARRAY_LENGTH", default_value_t = 10_000_000)]
    pub max_array_length: usize,

    /// The most grouping sets one GROUP BY may expand to (`CUBE` of 12 columns is 4096).
    #[arg(long, env = "SKIFF_MAX_GROUPING_SETS", default_value_t = 4096)]
    pub max_grouping_sets: u64,

    /// The largest statement, in syntax nodes once each CTE reference is expanded as the
    /// planner inlines it.
    #[arg(long, env = "SKIFF_MAX_PLAN_NODES", default_value_t = 100_000)]
    pub max_plan_nodes: u64,

    /// Local disk that queries may spill to when their memory runs out (`20GiB`); a query
    /// that needs more fails with 507. Default: half of what is free in `--spill-dir` at start.
    #[arg(long, env = "SKIFF_MAX_SPILL_BYTES", value_parser = parse_bytes)]
    pub max_spill_bytes: Option<usize>,

    /// Folder for spill files (default: the temporary directory).
    #[arg(long, env = "SKIFF_SPILL_DIR")]
    pub spill_dir: Option<PathBuf>,

    /// Most rows a result may have. The Basin route stops there and says so in `messages`;
    /// `/query` and `/streaming-query` fail rather than return a cut result.
    #[arg(long, env = "SKIFF_MAX_RESULT_ROWS", default_value_t = 10_000_000)]
    pub max_result_rows: u64,

    /// Most bytes an encoded result may have (`256MiB`), enforced like `--max-result-rows`.
    #[arg(long, env = "SKIFF_MAX_RESULT_BYTES", default_value = "1GiB", value_parser = parse_bytes)]
    pub max_result_bytes: usize,

    /// Memory for finished answers, reused while every table they read is at the same
    /// snapshot (`64MiB`; `0` turns the cache off). An answer over a quarter of it is not kept.
    #[arg(long, env = "SKIFF_RESULT_CACHE_BYTES", default_value = "64MiB", value_parser = parse_bytes_or_zero)]
    pub result_cache_bytes: usize,

    /// Memory for data-file bytes read from a remote store (S3, R2), reused by later
    /// queries (`256MiB`; `0` turns this tier off). Local files are not cached: the OS is.
    #[arg(long, env = "SKIFF_DATA_CACHE_MEMORY", default_value = "256MiB", value_parser = parse_bytes_or_zero)]
    pub data_cache_memory: usize,

    /// Local disk for data-file bytes from a remote store, behind the memory tier (`1GiB`;
    /// `0` turns this tier off).
    #[arg(long, env = "SKIFF_DATA_CACHE_DISK", default_value = "1GiB", value_parser = parse_bytes_or_zero)]
    pub data_cache_disk: usize,

    /// Folder of the disk tier (default: `skiff-data-cache` in the temporary directory).
    /// Each process keeps its files in a `skiff-<pid>` folder there, removed when it stops
    /// (or at the next start, after a crash).
    #[arg(long, env = "SKIFF_DATA_CACHE_DIR")]
    pub data_cache_dir: Option<PathBuf>,

    /// DataFusion settings, `key=value`, comma-separated or repeated
    /// (`datafusion.execution.batch_size=16384`); an unknown key stops skiff at start.
    #[arg(long = "datafusion-option", env = "SKIFF_DATAFUSION_OPTIONS", value_delimiter = ',', value_parser = parse_key_value)]
    pub datafusion_options: Vec<(String, String)>,

    /// skiff's own optimizer rules to turn off, comma-separated, or `all` (`skiff rules` lists
    /// them). Each only changes speed, so turning one off is the remedy for a rule suspected of
    /// a wrong answer, without a new build. Default: none. An unknown name stops skiff at start.
    #[arg(long = "disable-rules", env = "SKIFF_DISABLED_RULES", value_delimiter = ',')]
    pub disable_rules: Vec<String>,

    /// Distributed workers (`skiff worker`) that queries are spread over, comma-separated
    /// (`http://10.0.0.2:50051,http://10.0.0.3:50051`). Unset: every query runs in this
    /// process. See docs/distributed.md.
    #[arg(long, env = "SKIFF_WORKERS", value_delimiter = ',', value_parser = parse_worker_url)]
    pub workers: Vec<url::Url>,

    /// The secret coordinators and workers share: a worker accepts only calls and tunnels that
    /// bring it as a bearer token, and a coordinator sends it. Needed by a worker that listens
    /// beyond loopback or has a tunnel, and by a coordinator with `ws://`/`wss://` workers.
    #[arg(long, env = "SKIFF_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,

    /// Log each query's SQL text, and show it in `system.queries` (it may contain user data).
    #[arg(long, env = "SKIFF_LOG_SQL", default_value_t = false)]
    pub log_sql: bool,

    /// Log lines as `text` (for a terminal) or `json` (one object per line, for log services).
    #[arg(long, env = "SKIFF_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Serve `GET /metrics` without a token (for a scraper on a private network).
    #[arg(long, env = "SKIFF_METRICS_PUBLIC", default_value_t = false)]
    pub metrics_public: bool,

    /// Finished queries kept for `system.queries` (running ones are always listed).
    #[arg(long, env = "SKIFF_QUERY_HISTORY", default_value_t = 1000)]
    pub query_history: usize,

    /// On SIGTERM or SIGINT, how long running queries may go on before they are cancelled
    /// and skiff exits (`30s`; Cloudflare sends SIGKILL 15 minutes after SIGTERM).
    #[arg(long, env = "SKIFF_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

impl ServeConfig {
    /// An empty catalog URI or warehouse (a var left blank) is none at all.
    pub fn normalize(&mut self) {
        for v in [&mut self.catalog_uri, &mut self.warehouse] {
            if v.as_deref().is_some_and(|s| s.trim().is_empty()) {
                *v = None;
            }
        }
    }
    /// The client tokens, from `--api-token`/`API_TOKEN`, else `SKIFF_API_TOKEN`.
    pub fn api_tokens(&self) -> Vec<String> {
        let raw =
            self.api_token.clone().or_else(|| std::env::var("SKIFF_API_TOKEN").ok()).unwrap_or_default();
        raw.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect()
    }

    /// The worker tokens (`--worker-token`, comma-separated so that workers can accept a new
    /// one before the old one goes); the first is the one sent.
    pub fn worker_tokens(&self) -> Result<Vec<String>, String> {
        let tokens = self.worker_token.as_deref().unwrap_or_default().split(',');
        let tokens: Vec<String> = tokens.map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
        if self.worker_token.is_some() && tokens.is_empty() {
            return Err("--worker-token is empty".into());
        }
        Ok(tokens)
    }

    /// The REST catalog token, falling back to `CF_API_TOKEN` as Cloudflare deployments set it.
    pub fn catalog_token(&self) -> Option<String> {
        self.catalog_token.clone().or_else(|| std::env::var("CF_API_TOKEN").ok()).filter(|t| !t.is_empty())
    }

    /// What the catalog crate needs to connect, taken from these settings.
    pub fn catalog_options(&self) -> CatalogOptions {
        CatalogOptions {
            uri: self.catalog_uri.clone(),
            name: self.catalog_name.clone(),
            warehouse: self.warehouse.clone(),
            s3_endpoint: self.s3_endpoint.clone(),
            s3_region: self.s3_region.clone(),
            s3_access_key_id: self.s3_access_key_id.clone(),
            s3_secret_access_key: self.s3_secret_access_key.clone(),
            s3_path_style: self.s3_path_style,
        }
    }

    /// Checks what clap cannot: values that parse but cannot work together.
    pub fn validate(&self) -> Result<PinnedVersions, String> {
        if self.admin_token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err("--admin-token is empty".into());
        }
        self.worker_tokens()?;
        if self.worker_token.is_none() && self.workers.iter().any(|w| w.scheme() != "http") {
            return Err("workers reached through a WebSocket (ws://, wss://) need --worker-token".into());
        }
        if let Some(uri) = &self.catalog_uri {
            let ok = ["sqlite:", "postgres://", "postgresql://", "http://", "https://"]
                .iter()
                .any(|p| uri.starts_with(p));
            if !ok {
                return Err(format!(
                    "--catalog-uri must start with sqlite:, postgres://, http:// or https:// (got {:?})",
                    redact_uri(uri)
                ));
            }
            let is_sql = !uri.starts_with("http");
            if is_sql && self.warehouse.is_none() {
                return Err("--warehouse is required with a SQL catalog (a path, file:///… or s3://…)".into());
            }
        } else if self.warehouse.is_some() {
            return Err("--warehouse was given without --catalog-uri".into());
        }
        if self.s3_access_key_id.is_some() != self.s3_secret_access_key.is_some() {
            return Err("--s3-access-key-id and --s3-secret-access-key go together".into());
        }
        if self.max_connections == 0 || self.idle_timeout.is_zero() || self.header_timeout.is_zero() {
            return Err("--max-connections, --idle-timeout and --header-timeout must be positive".into());
        }
        if self.max_body_bytes == 0 || self.max_sql_bytes == 0 {
            return Err("--max-body-bytes and --max-sql-bytes must be positive".into());
        }
        if self.max_concurrent_queries == 0 || self.max_result_rows == 0 || self.max_result_bytes == 0 {
            return Err(
                "--max-concurrent-queries, --max-result-rows and --max-result-bytes must be positive".into(),
            );
        }
        if self.query_timeout.is_zero() || self.write_timeout.is_zero() {
            return Err("--query-timeout and --write-timeout must be positive".into());
        }
        if self.refresh_interval < Duration::from_secs(1) {
            return Err("--refresh-interval must be at least 1s".into());
        }
        self.disabled_rules()?;
        // Last, so a bad value of another flag is reported as such even without a catalog.
        if self.demo && self.catalog_uri.is_some() {
            return Err("--demo serves the demo lake: it does not go with --catalog-uri".into());
        }
        if !self.demo && self.catalog_uri.is_none() {
            return Err(
                "no catalog configured: set --catalog-uri (SKIFF_CATALOG_URI), or pass --demo to serve \
                 a demo lake in ./lake"
                    .into(),
            );
        }
        PinnedVersions::parse(self.lake_versions.as_deref().unwrap_or(""))
            .map_err(|e| format!("LAKE_VERSIONS: {e}"))
    }

    /// The engine's limits, from these settings.
    pub fn limits(&self) -> engine::Limits {
        engine::Limits {
            max_sql_bytes: self.max_sql_bytes,
            query_timeout: self.query_timeout,
            write_timeout: self.write_timeout,
            max_concurrent: self.max_concurrent_queries,
            max_queued: self.max_queued_queries,
            queue_timeout: self.queue_timeout,
            memory_limit: self.memory_limit.unwrap_or_else(engine::memory::default_memory_limit),
            plan: engine::sql_bounds::PlanBounds {
                max_plan_nodes: self.max_plan_nodes,
                max_grouping_sets: self.max_grouping_sets,
            },
            max_value_bytes: self.max_value_bytes,
            max_array_length: self.max_array_length,
            spill_bytes: self.max_spill_bytes.unwrap_or_else(|| {
                engine::memory::default_spill_bytes(
                    &self.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
                )
            }),
            spill_dir: self.spill_dir.clone(),
        }
    }

    /// The data cache these settings ask for.
    pub fn data_cache(&self) -> Result<Option<Arc<DataCache>>, String> {
        let dir =
            self.data_cache_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("skiff-data-cache"));
        DataCache::new(self.data_cache_memory as u64, self.data_cache_disk as u64, &dir)
            .map_err(|e| format!("--data-cache-dir {}: {e}", dir.display()))
    }

    /// The rules `--disable-rules` turns off.
    pub fn disabled_rules(&self) -> Result<Disabled, String> {
        Disabled::parse(&self.disable_rules).map_err(|e| format!("--disable-rules: {e}"))
    }
}

/// A worker's address: `http://host:port` (gRPC without TLS, for a private network), or
/// `ws://`/`wss://host/path` (gRPC inside a WebSocket: a worker's `--tunnel`, or the Worker's
/// `/_worker/N` route on Cloudflare).
pub fn parse_worker_url(s: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(s.trim())
        .map_err(|e| format!("{s:?} is not a URL like http://10.0.0.2:50051: {e}"))?;
    if !matches!(url.scheme(), "http" | "ws" | "wss")
        || url.host().is_none()
        || url.port_or_known_default().is_none()
    {
        return Err(format!(
            "{s:?} is not a worker address like http://10.0.0.2:50051 or wss://skiff.example.com/_worker/0"
        ));
    }
    Ok(url)
}

/// A time limit, or none.
#[derive(Debug, Clone, Copy)]
pub struct Wait(pub Option<Duration>);

pub fn parse_wait(s: &str) -> Result<Wait, String> {
    match s.trim() {
        "forever" | "none" => Ok(Wait(None)),
        d => parse_duration(d).map(|d| Wait(Some(d))),
    }
}

/// A listen address, or none when a listener is turned off.
#[derive(Debug, Clone, Copy)]
pub struct Listen(pub Option<SocketAddr>);

pub fn parse_listen(s: &str) -> Result<Listen, String> {
    match s.trim() {
        "" | "off" | "none" => Ok(Listen(None)),
        a => a
            .parse()
            .map(|a| Listen(Some(a)))
            .map_err(|e| format!("{a:?} is not an address like 127.0.0.1:32010: {e}")),
    }
}

/// Parses `500ms`, `30s`, `2m`, `1h` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a duration: {s:?} (try 30s, 2m)"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        u => {
            return Err(format!("unknown duration unit {u:?} in {s:?} (use ms, s, m or h)"));
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `512MiB`, `4GiB`, `1GB`, `64k` (a bare number is bytes).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    match parse_bytes_or_zero(s)? {
        0 => Err(format!("{s:?} is less than one byte")),
        n => Ok(n),
    }
}

/// `key=value`.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("expected key=value, got {s:?}")),
    }
}

/// A size where 0 means "none" (`--result-cache-bytes 0` turns the cache off).
pub fn parse_bytes_or_zero(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a size: {s:?} (try 512MiB, 4GiB)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        u => return Err(format!("unknown size unit {u:?} in {s:?} (use KiB, MiB, GiB)")),
    };
    Ok((n * mult) as usize)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert_eq!(parse_bytes("1.5kb").unwrap(), 1500);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("0").is_err());
        assert_eq!(parse_bytes_or_zero("0").unwrap(), 0);
        assert_eq!(parse_key_value(" a.b = 1 ").unwrap(), ("a.b".into(), "1".into()));
        assert!(parse_key_value("=1").is_err() && parse_key_value("a.b").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }

    #[test]
    fn waits() {
        assert!(parse_wait("forever").unwrap().0.is_none());
        assert_eq!(parse_wait("0s").unwrap().0, Some(Duration::ZERO));
        assert_eq!(parse_wait("2m").unwrap().0, Some(Duration::from_secs(120)));
        assert!(parse_wait("later").is_err());
    }

    /// `args` parsed as the command line of `skiff serve` or `skiff worker`.
    pub(crate) fn cli(args: &[&str]) -> Result<Command, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("skiff").chain(args.iter().copied()))?;
        Ok(cli.command.expect("a command"))
    }

    fn serve(args: &[&str]) -> ServeConfig {
        match cli(&[&["serve", "--catalog-uri", "sqlite://c.db", "--warehouse", "w"], args].concat()) {
            Ok(Command::Serve(cfg)) => *cfg,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn worker_addresses() {
        for ok in
            ["http://10.0.0.2:50051", "ws://127.0.0.1:9000/_worker/0", "wss://skiff.example.com/_worker/3"]
        {
            assert_eq!(parse_worker_url(ok).unwrap().scheme(), ok.split(':').next().unwrap());
        }
        for bad in ["https://a.example.com", "10.0.0.2:50051", "grpc://a:1", "ws://"] {
            assert!(parse_worker_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn worker_tokens_are_a_list_whose_first_is_sent_and_tunnels_need_one() {
        let cfg = serve(&["--worker-token", " new , old ,"]);
        assert_eq!(cfg.worker_tokens().unwrap(), ["new", "old"]);
        assert!(cfg.validate().is_ok());
        assert!(serve(&["--worker-token", " , "]).validate().unwrap_err().contains("empty"));
        let tunneled = serve(&["--workers", "http://10.0.0.2:50051,wss://s.example.com/_worker/1"]);
        assert!(tunneled.validate().unwrap_err().contains("--worker-token"));
        assert!(serve(&["--workers", "http://10.0.0.2:50051"]).validate().is_ok());
    }
}
