//! skiff: a read-only SQL server over Apache Iceberg lakes, DataFusion inside.
//!
//! The request path: front end (`http`) → `auth` → `engine` (session, read-only rules) →
//! `lake` (versioned tables, scans) → `catalog` + object store; results go back through
//! `encode`. `config` holds every setting, `error` every failure and its status.

mod auth;
mod catalog;
mod config;
mod encode;
mod engine;
mod error;
mod flight;
mod http;
mod lake;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, Command, ServeConfig};
use crate::error::{StartError, StartResult};

fn main() -> ExitCode {
    // A bare `skiff` serves with defaults and the environment.
    let args: Vec<String> = std::env::args().collect();
    let cli = if args.len() == 1 { Cli::parse_from(["skiff", "serve"]) } else { Cli::parse() };
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skiff: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command.expect("serve is the default") {
            Command::Serve(cfg) => serve(*cfg).await,
            Command::Demo(args) => {
                catalog::demo::write(&args.out, args.events).await?;
                println!("wrote a demo lake with {} events to {}", args.events, args.out.display());
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skiff: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr; `RUST_LOG` filters them, `SKIFF_LOG_FORMAT=json` makes them JSON.
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if std::env::var("SKIFF_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(cfg: ServeConfig) -> StartResult<()> {
    let pinned = cfg.validate().map_err(StartError::Msg)?;
    let conn = catalog::connect(&cfg).await?;
    let lake = lake::Lake::new(conn.catalog.clone(), pinned).await?;
    lake.spawn_refresh(cfg.refresh_interval);
    let limits = engine::Limits {
        max_sql_bytes: cfg.max_sql_bytes,
        query_timeout: cfg.query_timeout,
        max_concurrent: cfg.max_concurrent_queries,
        max_queued: cfg.max_queued_queries,
        queue_timeout: cfg.queue_timeout,
        memory_limit: cfg.memory_limit.unwrap_or_else(engine::limits::default_memory_limit),
    };
    let engine = engine::Engine::new(lake.clone(), limits)?;
    let auth = auth::Auth::new(cfg.api_tokens());
    let listener = tokio::net::TcpListener::bind(cfg.http_addr)
        .await
        .map_err(|e| StartError::Msg(format!("cannot listen on {}: {e}", cfg.http_addr)))?;
    let addr = listener.local_addr()?;
    let flight_listener = match cfg.flight_addr.0 {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| StartError::Msg(format!("cannot listen on {a} (--flight-addr): {e}")))?,
        ),
        None => None,
    };
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
    let state = Arc::new(http::AppState {
        engine,
        auth,
        catalog_kind: conn.kind,
        max_body_bytes: cfg.max_body_bytes,
        max_result_rows: cfg.max_result_rows,
        max_result_bytes: cfg.max_result_bytes as u64,
        log_sql: cfg.log_sql,
    });
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    let flight = flight_listener.map(|l| {
        let (state, stop) = (state.clone(), stop.clone());
        tokio::spawn(async move { flight::serve(l, state, stop.cancelled_owned()).await })
    });
    axum::serve(listener, http::router(state)).with_graceful_shutdown(stop.clone().cancelled_owned()).await?;
    if let Some(f) = flight {
        match f.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the Flight SQL server failed"),
            Err(e) => tracing::error!(error = %e, "the Flight SQL server panicked"),
        }
    }
    tracing::info!("skiff stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing the SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down: no new connections, finishing running queries");
}
