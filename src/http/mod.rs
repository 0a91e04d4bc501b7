//! The HTTP front end (axum): routing, auth, request ids and error responses. Handlers parse,
//! call the engine and encode; they hold no query logic.

mod basin;
pub mod query;
pub mod serve;

use std::sync::{Arc, RwLock};

use axum::body::Bytes;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use skiff_lake::catalog::CatalogToken;
use skiff_metrics as metrics;

use crate::auth::Auth;
use crate::error::SkiffError;
use crate::state::AppState;

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

/// skiff before and after it has reached its catalog. It listens from the start, so a health
/// check or a caller learns why it is not ready yet (the last attempt's error) instead of
/// finding the port closed; once ready, every request goes to the full router.
#[derive(Default)]
pub struct Startup {
    phase: RwLock<Phase>,
}

#[derive(Default)]
enum Phase {
    #[default]
    Connecting,
    /// The last attempt to reach the catalog failed: why (never with a secret).
    Failed(String),
    Ready(Router),
}

impl Startup {
    pub fn failed(&self, cause: String) {
        *self.phase.write().expect("phase") = Phase::Failed(cause);
    }

    pub fn ready(&self, router: Router) {
        *self.phase.write().expect("phase") = Phase::Ready(router);
    }

    fn router(&self) -> Result<Router, Option<String>> {
        match &*self.phase.read().expect("phase") {
            Phase::Ready(r) => Ok(r.clone()),
            Phase::Connecting => Err(None),
            Phase::Failed(cause) => Err(Some(cause.clone())),
        }
    }
}

/// What the admin route replaces while skiff runs.
pub struct Admin {
    /// The admin token.
    pub auth: Auth,
    /// The client tokens every front end checks.
    pub api: Auth,
    pub catalog_token: Arc<CatalogToken>,
}

const ADMIN_PATH: &str = "/_admin/credentials";

/// The router skiff listens with from its first moment: the admin route (when an admin token
/// is set), and everything else to the full router once it is ready, or a 503 `starting`.
pub fn front(startup: Arc<Startup>, admin: Option<Arc<Admin>>) -> Router {
    let mut front = Router::new().fallback(dispatch).with_state(startup);
    if let Some(admin) = admin {
        front = front.merge(
            Router::new().route(ADMIN_PATH, post(set_credentials).get(show_credentials)).with_state(admin),
        );
    }
    front
}

async fn dispatch(State(startup): State<Arc<Startup>>, req: Request) -> Response {
    use tower::ServiceExt;
    match startup.router() {
        Ok(router) => router.oneshot(req).await.unwrap_or_else(|never| match never {}),
        Err(cause) => starting(&req, cause),
    }
}

/// 503 `starting`, with the cause once an attempt has failed: `/_health` as a status, the
/// Basin route in its envelope (code 80001, retried by Basin clients), the rest as errors.
fn starting(req: &Request, cause: Option<String>) -> Response {
    let id = crate::observe::request_id(req.headers().get("x-request-id").and_then(|v| v.to_str().ok()));
    let path = req.uri().path();
    let message = match &cause {
        Some(c) => format!("the catalog is not reached yet: {c}"),
        None => "connecting to the catalog".to_string(),
    };
    let e = SkiffError::Starting(message);
    let mut res = if path == "/_health" {
        let body = match &cause {
            Some(c) => json!({"status": "starting", "cause": c}),
            None => json!({"status": "starting"}),
        };
        let mut res = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
        res.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        res
    } else if path.starts_with("/api/v1/accounts/") {
        basin::failure(e.basin_status(), &e)
    } else {
        e.into_response()
    };
    metrics::http_request("starting", res.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert("x-request-id", v);
    }
    res
}

/// The body of `POST /_admin/credentials`: each field given replaces what skiff holds.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Credentials {
    /// Client tokens, comma-separated (as API_TOKEN).
    api_token: Option<String>,
    /// The catalog's bearer token (as CF_API_TOKEN); empty removes it.
    catalog_token: Option<String>,
}

/// Replaces the client tokens and/or the catalog token, effective from the next request.
async fn set_credentials(State(admin): State<Arc<Admin>>, headers: HeaderMap, body: Bytes) -> Response {
    if !admin.auth.check_header(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())) {
        return SkiffError::Unauthorized.into_response();
    }
    let creds: Credentials = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return SkiffError::BadRequest(format!(
                "expected {{\"api_token\": \"a,b\", \"catalog_token\": \"…\"}} (each optional): {e}"
            ))
            .into_response();
        }
    };
    if let Some(list) = &creds.api_token {
        let tokens: Vec<String> =
            list.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect();
        // An empty list would turn auth off.
        if tokens.is_empty() {
            return SkiffError::BadRequest("api_token must hold at least one token".into()).into_response();
        }
        admin.api.replace(tokens);
    }
    if let Some(t) = creds.catalog_token.clone() {
        admin.catalog_token.set(Some(t));
    }
    tracing::info!(
        api_tokens = admin.api.count(),
        api_token_replaced = creds.api_token.is_some(),
        catalog_token_replaced = creds.catalog_token.is_some(),
        "credentials replaced through the admin route"
    );
    Json(credentials_held(&admin)).into_response()
}

async fn show_credentials(State(admin): State<Arc<Admin>>, headers: HeaderMap) -> Response {
    if !admin.auth.check_header(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())) {
        return SkiffError::Unauthorized.into_response();
    }
    Json(credentials_held(&admin)).into_response()
}

/// What is held, never the secrets themselves: how many client tokens, the catalog token's hash.
fn credentials_held(admin: &Admin) -> serde_json::Value {
    json!({"api_tokens": admin.api.count(), "catalog_token_sha256": admin.catalog_token.sha256()})
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
