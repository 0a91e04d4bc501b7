//! skiff: a read-only SQL server over Apache Iceberg lakes, DataFusion inside.
//!
//! The request path: front end (`http`) → `auth` → `engine` (session, read-only rules) →
//! `lake` (versioned tables, scans) → `catalog` + object store; results go back through
//! `encode`. `config` holds every setting, `error` every failure and its status.

mod auth;
mod config;
mod encode;
mod error;
mod flight;
mod http;
mod listen;
mod malloc;
mod observe;
mod state;
mod worker;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use skiff_engine as engine;
use skiff_lake as lake;
use skiff_lake::catalog;
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, Command, ServeConfig};
use crate::error::{StartError, StartResult};

fn main() -> ExitCode {
    malloc::tune();
    // A bare `skiff` (what `cargo run --release` runs) serves with the environment's settings,
    // and the demo lake when they name no catalog: the one way the demo is implied.
    let args: Vec<String> = std::env::args().collect();
    let mut cli = if args.len() == 1 { Cli::parse_from(["skiff", "serve"]) } else { Cli::parse() };
    if let Some(Command::Serve(cfg)) = cli.command.as_mut() {
        cfg.normalize();
        if args.len() == 1 && cfg.catalog_uri.is_none() {
            cfg.demo = true;
        }
    }
    let json_logs = match &cli.command {
        Some(Command::Serve(cfg)) => cfg.log_format == "json",
        Some(Command::Worker(cfg)) => cfg.settings.log_format == "json",
        _ => false,
    };
    init_tracing(json_logs);
    engine::panics::install();
    // Planning recurses over the query's tree: 8 MiB (tokio's default is 2) leaves room for
    // the deepest query `engine::sql_bounds::MAX_NESTING` lets through.
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(8 << 20).build() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skiff: cannot start the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
    let result = runtime.block_on(async {
        match cli.command.expect("serve is the default") {
            Command::Serve(cfg) => serve(*cfg).await,
            Command::Worker(cfg) => worker::run(*cfg).await,
            Command::Rules => {
                for r in engine::rules::RULES {
                    println!("{:<32} {}\n{:<32} upstream: {}", r.name, r.what, "", r.upstream);
                }
                Ok(())
            }
            Command::Demo(args) => {
                catalog::demo::write(&args.out, args.events).await?;
                println!("wrote a demo lake with {} events to {}", args.events, args.out.display());
                Ok(())
            }
        }
    });
    // Tasks still blocked (a connection a client never reads) must not hold the exit up.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json_logs {
                tracing::error!(error = %e, "skiff could not start");
            }
            eprintln!("skiff: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `RUST_LOG` filters them; `--log-format json` makes them JSON lines.
fn init_tracing(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(cfg: ServeConfig) -> StartResult<()> {
    let pinned = cfg.validate().map_err(StartError::Msg)?;
    // Before anything slow, so that a signal during start-up (a catalog that does not answer)
    // is a clean stop, not a kill.
    let mut signals = Signals::new()?;
    observe::init(cfg.log_sql, cfg.query_history);
    let auth = auth::Auth::new(cfg.api_tokens());
    let catalog_token = catalog::CatalogToken::new(cfg.catalog_token());
    // Both listeners first: skiff answers at once (503 `starting` until the catalog is reached),
    // and a port already taken stops it before anything else.
    let listener = bind(cfg.http_addr, "--http-addr").await?;
    let addr = listener.local_addr()?;
    let flight_listener = match cfg.flight_addr.0 {
        Some(a) => Some(bind(a, "--flight-addr").await?),
        None => None,
    };
    let startup = Arc::new(http::Startup::default());
    let admin = cfg.admin_token.clone().map(|t| {
        Arc::new(http::Admin {
            auth: auth::Auth::new(vec![t]),
            api: auth.clone(),
            catalog_token: catalog_token.clone(),
        })
    });
    let bounds = listen::Bounds { max: connection_cap(cfg.max_connections), idle: cfg.idle_timeout };
    let stop_listening = tokio_util::sync::CancellationToken::new();
    let mut server = tokio::spawn(http::serve::serve(
        listener,
        http::front(startup.clone(), admin),
        bounds,
        cfg.header_timeout,
        stop_listening.clone().cancelled_owned(),
    ));
    tracing::info!(http = %format!("http://{addr}"), "listening; connecting to the catalog");
    let Some((conn, lake)) =
        connect_until_ready(&cfg, &pinned, &catalog_token, &startup, &mut signals).await?
    else {
        tracing::info!("stopped before start-up finished");
        stop_listening.cancel();
        let _ = tokio::time::timeout(WIND_DOWN, &mut server).await;
        return Ok(());
    };
    lake.spawn_refresh(cfg.refresh_interval);
    if cfg.warm_on_start {
        lake.spawn_warm();
    }
    let engine = engine::Engine::new(
        lake.clone(),
        cfg.limits(),
        engine::Tuning {
            result_cache_bytes: cfg.result_cache_bytes,
            datafusion_options: cfg.datafusion_options.clone(),
            disabled: cfg.disabled_rules().map_err(StartError::Msg)?,
            workers: cfg.workers.clone(),
            worker_token: cfg.worker_tokens().map_err(StartError::Msg)?.into_iter().next(),
            when_idle: malloc::when_idle(),
        },
    )?;
    let flight_addr = flight_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    tracing::info!(
        catalog = conn.kind,
        location = %conn.location,
        tables = lake.table_count(),
        http = %format!("http://{addr}"),
        flight = %flight_addr.map(|a| format!("grpc://{a}")).unwrap_or_else(|| "off".into()),
        auth = if auth.enabled() { "bearer token" } else { "off" },
        "skiff {} ready",
        env!("CARGO_PKG_VERSION")
    );
    if !auth.enabled() {
        tracing::warn!("API_TOKEN is not set: anyone who can reach {addr} can query the lake");
    }
    let state = Arc::new(state::AppState {
        engine,
        auth,
        catalog_kind: conn.kind,
        max_body_bytes: cfg.max_body_bytes,
        max_result_rows: cfg.max_result_rows,
        max_result_bytes: cfg.max_result_bytes as u64,
        metrics_public: cfg.metrics_public,
    });
    startup.ready(http::router(state.clone()));
    // Flight follows the same shutdown: refused new queries while draining, closed with HTTP.
    let flight = flight_listener.map(|l| {
        let (state, stop) = (state.clone(), stop_listening.clone());
        tokio::spawn(async move {
            if let Err(e) = flight::serve(l, state, bounds, stop.cancelled_owned()).await {
                tracing::error!(error = %e, "the Flight SQL server failed");
            }
        })
    });
    tokio::select! {
        _ = signals.next() => {}
        done = &mut server => {
            done.map_err(|e| StartError::Msg(format!("the HTTP server failed: {e}")))?;
            return Err(StartError::Msg("the HTTP server stopped".into()));
        }
    }
    drain(&state.engine, cfg.shutdown_grace, &mut signals).await;
    // Close the listeners and let responses still in flight end (cancelled ones end as failures).
    stop_listening.cancel();
    let wound_down = tokio::time::timeout(WIND_DOWN, async {
        let _ = (&mut server).await;
        if let Some(f) = flight {
            let _ = f.await;
        }
    });
    match wound_down.await {
        Ok(()) => tracing::info!("skiff stopped"),
        Err(_) => tracing::warn!("connections still open after {WIND_DOWN:?}; closing them"),
    }
    Ok(())
}

/// Listens on `addr`, which `flag` gave.
async fn bind(addr: std::net::SocketAddr, flag: &str) -> StartResult<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| StartError::Msg(format!("cannot listen on {addr} ({flag}): {e}")))
}

/// Connects to the catalog and lists the lake, again and again (backing off from 1 s to 30 s,
/// or at once when the admin route brings a new catalog token) until it works, `--catalog-wait`
/// has passed (then the last error), or a signal comes (then `None`). Meanwhile `startup`
/// holds the last error, which every request is answered with.
async fn connect_until_ready(
    cfg: &ServeConfig,
    pinned: &lake::versions::PinnedVersions,
    catalog_token: &Arc<catalog::CatalogToken>,
    startup: &http::Startup,
    signals: &mut Signals,
) -> StartResult<Option<(catalog::Connection, Arc<lake::Lake>)>> {
    let deadline = cfg.catalog_wait.0.map(|w| tokio::time::Instant::now() + w);
    let mut delay = Duration::from_secs(1);
    for attempt in 1u32.. {
        let token_generation = catalog_token.get().0;
        let connected = async {
            let conn = catalog::connect(&cfg.catalog_options(), catalog_token).await?;
            let data = cfg.data_cache().map_err(StartError::Msg)?;
            let lake = lake::Lake::new(
                conn.catalog.clone(),
                conn.pointers.clone(),
                pinned.clone(),
                lake::cache::Caches::new(data),
            )
            .await?;
            StartResult::Ok((conn, lake))
        };
        let error = tokio::select! {
            c = connected => match c {
                Ok(ready) => return Ok(Some(ready)),
                Err(e) => e,
            },
            _ = signals.next() => return Ok(None),
        };
        if deadline.is_some_and(|d| tokio::time::Instant::now() + delay > d) {
            return Err(error);
        }
        let cause = error.to_string();
        tracing::warn!(attempt, error = %cause, retry_in = ?delay, "the catalog is not reached yet; answering 503 starting meanwhile");
        startup.failed(cause);
        // A token that arrived during this attempt is tried at once.
        if catalog_token.get().0 != token_generation {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = catalog_token.changed() => tracing::info!("a new catalog token: trying again now"),
            _ = signals.next() => return Ok(None),
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
    unreachable!("the attempts never run out")
}

/// `wanted` connections per listener, lowered so that both listeners' connections and the
/// files queries open stay under the open-file limit (raised to its hard limit first).
fn connection_cap(wanted: usize) -> usize {
    let files = listen::raise_open_files();
    // Data files, spill files, caches and the runtime's own descriptors.
    let room = files.saturating_sub(512) / 2;
    let cap = wanted.min(room as usize).max(16);
    if cap < wanted {
        tracing::warn!(
            wanted,
            cap,
            open_file_limit = files,
            "--max-connections lowered to fit the open-file limit"
        );
    }
    cap
}

/// How long, after the drain, open connections get to finish sending; a response stuck on a
/// client that does not read is then cut (the client sees a failed, not a short, response).
const WIND_DOWN: Duration = Duration::from_secs(2);

/// Shutdown's first part: health checks say `draining` and new queries are refused (the
/// listener stays open so the platform's health checks are answered), running queries get
/// up to `grace` to finish, then whatever is left is cancelled. A second signal skips the
/// rest of the grace period.
async fn drain(engine: &engine::Engine, grace: Duration, signals: &mut Signals) {
    engine.drain();
    let running = engine::queries::running_count();
    tracing::info!(running, grace = ?grace, "shutting down: no new queries; waiting for running ones");
    let deadline = tokio::time::Instant::now() + grace;
    tokio::select! {
        _ = engine::queries::all_finished() => return,
        _ = tokio::time::sleep_until(deadline) => {}
        _ = signals.next() => tracing::warn!("second signal: not waiting any longer"),
    }
    let left = engine::queries::running_count();
    tracing::warn!(queries = left, "grace period over: cancelling the queries still running");
    engine.cancel_all();
}

/// SIGTERM (what container platforms send) and SIGINT (Ctrl-C).
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
