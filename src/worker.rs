//! `skiff worker`: serves the stages of distributed queries to coordinators over gRPC, and,
//! where only HTTP reaches it (Cloudflare Containers), through a WebSocket tunnel to that same
//! gRPC server (docs/distributed.md).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::TokioIo;
use skiff_engine as engine;
use skiff_lake as lake;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::auth::Auth;
use crate::config::WorkerConfig;
use crate::error::{StartError, StartResult};
use crate::{Signals, bind, connection_cap, flight, http, listen};

/// Serves stages to coordinators until a signal comes.
pub async fn run(cfg: WorkerConfig) -> StartResult<()> {
    let settings = &cfg.settings;
    let tokens = worker_tokens(&cfg).map_err(StartError::Msg)?;
    let mut signals = Signals::new()?;
    let caches = Arc::new(lake::cache::Caches::new(settings.data_cache().map_err(StartError::Msg)?));
    let service = engine::worker(
        &settings.limits(),
        &settings.disabled_rules().map_err(StartError::Msg)?,
        caches,
        tokens.first().map(String::as_str),
    )?;
    let listener = bind(cfg.listen, "--listen").await?;
    let addr = listener.local_addr()?;
    let tunnel_listener = match cfg.tunnel.0 {
        Some(a) => Some(bind(a, "--tunnel").await?),
        None => None,
    };
    let auth = Auth::new(tokens);
    let bounds =
        listen::Bounds { max: connection_cap(settings.max_connections), idle: settings.idle_timeout };
    let stop = tokio_util::sync::CancellationToken::new();
    let tunnel_addr = tunnel_listener.as_ref().map(|l| l.local_addr()).transpose()?;
    let tunnel = tunnel_listener.map(|l| {
        let routes = router(Arc::new(Tunnel { auth: auth.clone(), grpc: loopback(addr) }));
        let stopped = stop.clone().cancelled_owned();
        tokio::spawn(http::serve::serve(l, routes, bounds, settings.header_timeout, stopped))
    });
    tracing::info!(
        grpc = %format!("http://{addr}"),
        tunnel = %tunnel_addr.map_or("off".into(), |a| format!("http://{a}")),
        auth = if auth.enabled() { "bearer token" } else { "off" },
        "skiff {} worker ready",
        env!("CARGO_PKG_VERSION")
    );
    let checked =
        tonic::service::interceptor::InterceptedService::new(service.into_worker_server(), move |req| {
            check(&auth, req)
        });
    flight::serve_grpc(listener, bounds, checked, async move {
        signals.next().await;
    })
    .await
    .map_err(|e| StartError::Msg(format!("the worker's gRPC server failed: {e}")))?;
    stop.cancel();
    if let Some(t) = tunnel {
        let _ = t.await;
    }
    tracing::info!("skiff worker stopped");
    Ok(())
}

/// The tokens a worker accepts; the first is the one it sends to other workers. Fails closed:
/// a worker that can be reached from beyond its own machine must have one.
fn worker_tokens(cfg: &WorkerConfig) -> Result<Vec<String>, String> {
    let tokens = cfg.settings.worker_tokens()?;
    if tokens.is_empty() && cfg.tunnel.0.is_some() {
        return Err(
            "--tunnel needs --worker-token (SKIFF_WORKER_TOKEN): the tunnel is reached over HTTP".into()
        );
    }
    if tokens.is_empty() && !cfg.listen.ip().is_loopback() {
        return Err(format!(
            "--listen {} is reachable from other machines: set --worker-token (SKIFF_WORKER_TOKEN), \
             which coordinators must send",
            cfg.listen
        ));
    }
    Ok(tokens)
}

/// Refuses a gRPC call without one of the worker's tokens.
fn check(auth: &Auth, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    let header = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
    if auth.check_header(header) {
        Ok(req)
    } else {
        Err(tonic::Status::unauthenticated("this worker needs its token (--worker-token)"))
    }
}

/// Where the tunnel sends its bytes: the gRPC server, over loopback when it listens on every
/// interface.
fn loopback(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            [127, 0, 0, 1].into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    addr
}

struct Tunnel {
    auth: Auth,
    grpc: SocketAddr,
}

fn router(tunnel: Arc<Tunnel>) -> Router {
    Router::new()
        .route("/_health", get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }))
        .route("/_worker", get(open))
        .route("/_worker/{*rest}", get(open))
        .with_state(tunnel)
}

/// Upgrades a request with the worker's token to a WebSocket, whose binary messages are then
/// the bytes of a connection to the gRPC server.
async fn open(State(tunnel): State<Arc<Tunnel>>, mut req: Request) -> Response {
    let headers = req.headers();
    if !tunnel.auth.check_header(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())) {
        return (StatusCode::UNAUTHORIZED, "this worker needs its token (--worker-token)\n").into_response();
    }
    let names = |name, value: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(value))
    };
    let key = headers.get(header::SEC_WEBSOCKET_KEY).map(|k| derive_accept_key(k.as_bytes()));
    let version = headers.get(header::SEC_WEBSOCKET_VERSION).is_some_and(|v| v == "13");
    let (Some(accept), true, true, true) =
        (key, version, names(header::UPGRADE, "websocket"), names(header::CONNECTION, "upgrade"))
    else {
        return (
            StatusCode::UPGRADE_REQUIRED,
            [(header::UPGRADE, "websocket")],
            "the worker tunnel is a WebSocket (version 13)\n",
        )
            .into_response();
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(u) => u,
            Err(e) => return tracing::debug!(error = %e, "a worker tunnel's upgrade failed"),
        };
        let grpc = match tokio::net::TcpStream::connect(tunnel.grpc).await {
            Ok(s) => s,
            Err(e) => return tracing::error!(error = %e, "the worker tunnel cannot reach the gRPC server"),
        };
        let _ = grpc.set_nodelay(true);
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        engine::tunnel::bridge(ws, grpc).await;
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [(header::UPGRADE, "websocket"), (header::CONNECTION, "upgrade")],
        [(header::SEC_WEBSOCKET_ACCEPT, accept)],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;
    use crate::config::{Command, tests::cli};

    fn worker(args: &[&str]) -> WorkerConfig {
        match cli(&[&["worker"], args].concat()) {
            Ok(Command::Worker(cfg)) => *cfg,
            other => panic!("not worker: {other:?}"),
        }
    }

    #[test]
    fn a_worker_reachable_from_elsewhere_needs_a_token() {
        assert!(worker_tokens(&worker(&[])).unwrap().is_empty(), "loopback alone needs none");
        let open = worker_tokens(&worker(&["--listen", "0.0.0.0:50051"])).unwrap_err();
        assert!(open.contains("--worker-token"), "{open}");
        let tunnel = worker_tokens(&worker(&["--tunnel", "127.0.0.1:8080"])).unwrap_err();
        assert!(tunnel.contains("--worker-token"), "{tunnel}");
        let both =
            worker(&["--listen", "0.0.0.0:50051", "--tunnel", "0.0.0.0:8080", "--worker-token", "t1,t0"]);
        assert_eq!(worker_tokens(&both).unwrap(), ["t1", "t0"]);
        assert_eq!(loopback(both.listen), "127.0.0.1:50051".parse().unwrap());
    }

    /// What the tunnel answers a request that is not a WebSocket upgrade with the token (the
    /// upgrade itself is tested with processes, in tests/distributed.rs).
    #[tokio::test]
    async fn the_tunnel_refuses_requests_without_the_token_or_the_upgrade() {
        let tunnel =
            Arc::new(Tunnel { auth: Auth::new(vec!["t1".into()]), grpc: "127.0.0.1:1".parse().unwrap() });
        let status = |auth: Option<&str>, upgrade: bool, path: &str| {
            let mut req = axum::http::Request::get(path);
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            if upgrade {
                req = req
                    .header("upgrade", "websocket")
                    .header("connection", "keep-alive, Upgrade")
                    .header("sec-websocket-version", "13")
                    .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
            }
            let router = router(Arc::clone(&tunnel));
            async move { router.oneshot(req.body(axum::body::Body::empty()).unwrap()).await.unwrap().status() }
        };
        assert_eq!(status(None, false, "/_health").await, StatusCode::OK);
        assert_eq!(status(None, true, "/_worker/0").await, StatusCode::UNAUTHORIZED);
        assert_eq!(status(Some("Bearer t2"), true, "/_worker/0").await, StatusCode::UNAUTHORIZED);
        assert_eq!(status(Some("Bearer t1"), false, "/_worker").await, StatusCode::UPGRADE_REQUIRED);
        assert_eq!(status(Some("Bearer t1"), true, "/elsewhere").await, StatusCode::NOT_FOUND);
    }
}
