//! Serving the router over HTTP/1.1 and HTTP/2 on connections `listen` bounds, with a limit
//! on how long a request's headers may take to arrive. A request counts as in flight until
//! its response body has been sent or dropped, so a connection busy with a long query is
//! never taken for an idle one.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::listen::{Activity, Bounds, Connections};

/// Serves `router` on `listener` until `stop`; then lets the connections' responses finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    bounds: Bounds,
    header_timeout: Duration,
    stop: impl Future<Output = ()>,
) -> Arc<Connections> {
    let connections = Connections::new(bounds);
    let open = TaskTracker::new();
    let stopping = CancellationToken::new();
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            c = connections.accept(&listener) => c,
            _ = &mut stop => break,
        };
        let (router, stopping) = (router.clone(), stopping.clone());
        open.spawn(async move {
            let activity = conn.activity.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let guard = InFlight::new(activity.clone());
                let router = router.clone();
                async move {
                    let res = router.oneshot(req).await?;
                    Ok::<_, Infallible>(res.map(|body| Body::new(Guarded { body, _guard: guard })))
                }
            });
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let served = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
            tokio::pin!(served);
            tokio::select! {
                _ = served.as_mut() => {}
                _ = stopping.cancelled() => {
                    served.as_mut().graceful_shutdown();
                    let _ = served.await;
                }
            }
        });
    }
    stopping.cancel();
    open.close();
    open.wait().await;
    connections
}

/// One request in flight on its connection, until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in flight until it is sent or dropped.
struct Guarded {
    body: Body,
    _guard: InFlight,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
