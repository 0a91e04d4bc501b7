//! A panic is a bug in skiff (or in a library under it), never the caller's fault: it is
//! logged once, where it happens, with its location and the request it happened in, and the
//! query that hit it fails with 500 `internal`. The process goes on.
//!
//! The request's span reaches every task a query spawns: the engine's own execution task and,
//! through DataFusion's `JoinSetTracer`, the tasks DataFusion spawns (exchanges, joins), so
//! the log line of a panic deep in an operator names the request id too.

use std::any::Any;

use datafusion::common::runtime::{JoinSetTracer, set_join_set_tracer};
use futures::FutureExt;
use futures::future::BoxFuture;
use tracing::Instrument;

/// Installs the panic hook and the span tracer; once, at start.
pub fn install() {
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| l.to_string()).unwrap_or_else(|| "unknown".into());
        let thread = std::thread::current();
        tracing::error!(
            target: "skiff::panic",
            location = %location,
            thread = thread.name().unwrap_or("unnamed"),
            message = %message(info.payload()),
            "skiff panicked: this is a bug"
        );
    }));
    // Set once per process; a second call (tests) leaves the first in place.
    let _ = set_join_set_tracer(&SpanTracer);
}

/// The text a panic was raised with (`panic!("…")`, `unwrap` and `expect` give one).
pub fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs DataFusion's spawned futures and blocking closures in the span that spawned them.
struct SpanTracer;

impl JoinSetTracer for SpanTracer {
    fn trace_future(
        &self,
        fut: BoxFuture<'static, Box<dyn Any + Send>>,
    ) -> BoxFuture<'static, Box<dyn Any + Send>> {
        fut.in_current_span().boxed()
    }

    fn trace_block(
        &self,
        f: Box<dyn FnOnce() -> Box<dyn Any + Send> + Send>,
    ) -> Box<dyn FnOnce() -> Box<dyn Any + Send> + Send> {
        let span = tracing::Span::current();
        Box::new(move || span.in_scope(f))
    }
}
