//! The HTTP front end (axum): routing, auth, request ids and error responses. Handlers parse,
//! call the engine and encode; they hold no query logic.

mod basin;
pub mod query;
pub mod serve;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::auth::Auth;
use crate::engine::Engine;
use crate::error::SkiffError;
use crate::observe::metrics;

/// What every handler shares.
pub struct AppState {
    pub engine: Engine,
    pub auth: Auth,
    pub catalog_kind: &'static str,
    pub max_body_bytes: usize,
    pub max_result_rows: u64,
    pub max_result_bytes: u64,
    /// `/metrics` without a token.
    pub metrics_public: bool,
}

pub fn router(state: Arc<AppState>) -> Router {
    let mut authed = Router::new()
        .route("/", get(welcome))
        .route("/query", post(query::json_rows))
        .route("/streaming-query", post(query::arrow_stream));
    let mut public = Router::new();
    if state.metrics_public {
        public = public.route("/metrics", get(prometheus));
    } else {
        authed = authed.route("/metrics", get(prometheus));
    }
    let authed = authed.route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    public
        .route("/_health", get(health))
        // The Basin route answers auth failures in Basin's envelope, so it checks tokens itself.
        .route("/api/v1/accounts/{account}/basin-sql/query/{bucket}", post(basin::query))
        .route("/api/v1/accounts/{account}/r2-sql/query/{bucket}", post(basin::query))
        .merge(authed)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn(count_request))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

/// Counts each response by the route's pattern (never the raw path: account ids and
/// scanners' made-up paths would make a label per request).
async fn count_request(req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string());
    let res = next.run(req).await;
    metrics::http_request(route.as_deref().unwrap_or("unmatched"), res.status().as_u16());
    res
}

/// The id of one request: the caller's `x-request-id` when it is sane, else a new UUID.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

async fn request_id(mut req: Request, next: Next) -> Response {
    let id = crate::observe::request_id(req.headers().get("x-request-id").and_then(|v| v.to_str().ok()));
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut res = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert("x-request-id", v);
    }
    res
}

async fn require_token(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let header = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if state.auth.check_header(header) {
        next.run(req).await
    } else {
        SkiffError::Unauthorized.into_response()
    }
}

/// 503 while shutting down, so a load balancer stops sending queries here.
async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "draining"}))).into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

/// Prometheus text exposition.
async fn prometheus(State(state): State<Arc<AppState>>) -> Response {
    let body = metrics::render(&state.engine.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

async fn welcome(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let lake = state.engine.lake();
    let tables: Vec<String> = lake
        .namespaces()
        .iter()
        .flat_map(|ns| lake.table_names(ns).into_iter().map(move |t| format!("{ns}.{t}")))
        .collect();
    Json(json!({
        "name": "skiff",
        "version": env!("CARGO_PKG_VERSION"),
        "catalog": state.catalog_kind,
        "tables": tables,
        "endpoints": [
            "GET /_health",
            "GET /metrics",
            "POST /query",
            "POST /streaming-query",
            "POST /api/v1/accounts/{account}/basin-sql/query/{bucket}",
            "POST /api/v1/accounts/{account}/r2-sql/query/{bucket}",
        ],
        "system_tables": ["system.queries"],
    }))
}

/// axum's own 405 has an empty body; every error here has the JSON envelope.
async fn method_not_allowed(req: Request) -> Response {
    SkiffError::MethodNotAllowed(format!("{} {}", req.method(), req.uri().path())).into_response()
}

async fn not_found(req: Request) -> Response {
    SkiffError::RouteNotFound(format!("{} {}", req.method(), req.uri().path())).into_response()
}

impl IntoResponse for SkiffError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut res = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(secs) = self.retry_after() {
            res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(secs));
        }
        res
    }
}
