//! Accepting connections so that no client can exhaust them: HTTP and Flight share it.
//!
//! - At most `max` connections are open per listener (below the process's descriptor limit,
//!   which `raise_open_files` lifts to its hard limit at start). A connection arriving at the
//!   cap closes the one that has been idle longest instead of being refused, so a flood of
//!   idle or half-sent connections (slowloris) cannot lock health checks out.
//! - A connection that moves no byte for `idle` while none of its requests is in flight is
//!   closed: a client that connects and sends nothing, or half a request, or keeps an idle
//!   keep-alive connection. HTTP/2 clients (Flight) answer the server's pings, which counts
//!   as activity.
//! - `accept` failing (no descriptors left) backs off briefly instead of spinning.
//!
//! A client that stops reading a result is handled where the result is produced
//! (`engine::deadline::Bounded`): its query is cancelled and its slot freed.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How connections of one listener are bounded.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max: usize,
    pub idle: Duration,
}

/// The open connections of one listener.
pub struct Connections {
    bounds: Bounds,
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    started: Instant,
    /// For `/metrics`: connections closed because they were idle, or evicted at the cap.
    pub closed_idle: AtomicU64,
    pub evicted: AtomicU64,
}

/// What one connection has done, and how to close it.
pub struct Activity {
    /// Milliseconds since the listener started, at the last byte read or written.
    last: AtomicU64,
    /// Requests being answered (HTTP counts them; Flight's keep-alive pings stand in).
    pub in_flight: AtomicUsize,
    closed: AtomicBool,
    /// The connection's task, waiting to read: woken when the connection is closed.
    reader: AtomicWaker,
}

impl Activity {
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.reader.wake();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

impl Connections {
    pub fn new(bounds: Bounds) -> Arc<Self> {
        Arc::new(Self {
            bounds,
            next: AtomicU64::new(0),
            open: Mutex::default(),
            started: Instant::now(),
            closed_idle: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Waits for the next connection, making room for it at the cap. The connection is
    /// watched until it is dropped.
    pub async fn accept(self: &Arc<Self>, listener: &TcpListener) -> Watched {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    return self.watch(stream);
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: the
                    // idle watchdogs free descriptors; accepting again at once would spin.
                    tracing::warn!(error = %e, "accepting a connection failed; retrying shortly");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn watch(self: &Arc<Self>, stream: TcpStream) -> Watched {
        let activity = Arc::new(Activity {
            last: AtomicU64::new(self.now()),
            in_flight: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut open = self.open.lock().expect("connections");
            if open.len() >= self.bounds.max {
                // The longest idle connection without a request in flight makes room.
                let idlest = open
                    .iter()
                    .filter(|(_, a)| a.in_flight.load(Ordering::Relaxed) == 0)
                    .min_by_key(|(_, a)| a.last.load(Ordering::Relaxed))
                    .map(|(id, _)| *id);
                if let Some(evicted) = idlest.and_then(|id| open.remove(&id)) {
                    evicted.close();
                    self.evicted.fetch_add(1, Ordering::Relaxed);
                }
            }
            open.insert(id, activity.clone());
        }
        // Closes the connection once it has been idle for too long; ends when it closes.
        let (connections, watched) = (Arc::downgrade(self), activity.clone());
        let idle = self.bounds.idle;
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(idle.clamp(Duration::from_millis(10), Duration::from_secs(1)));
            loop {
                tick.tick().await;
                let Some(c) = connections.upgrade() else { return };
                if watched.is_closed() {
                    return;
                }
                let quiet = c.now().saturating_sub(watched.last.load(Ordering::Relaxed));
                if watched.in_flight.load(Ordering::Relaxed) == 0 && quiet >= idle.as_millis() as u64 {
                    c.closed_idle.fetch_add(1, Ordering::Relaxed);
                    watched.close();
                    return;
                }
            }
        });
        Watched { stream, activity, id, connections: self.clone() }
    }
}

/// A connection whose reads and writes count as activity, and that reads as closed (and
/// refuses writes) once its watchdog or the cap closes it.
pub struct Watched {
    stream: TcpStream,
    pub activity: Arc<Activity>,
    id: u64,
    connections: Arc<Connections>,
}

impl Watched {
    fn touch(&self) {
        self.activity.last.store(self.connections.now(), Ordering::Relaxed);
    }

    fn closed(&self) -> bool {
        self.activity.is_closed()
    }

    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.stream.peer_addr()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.activity.close();
        self.connections.open.lock().expect("connections").remove(&self.id);
    }
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "closed: idle, or evicted at the connection cap")
}

impl AsyncRead for Watched {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closed() {
            return Poll::Ready(Err(closed_error()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.touch();
        }
        if polled.is_pending() {
            // Woken by `close` too, so a closed connection is noticed while it waits.
            this.activity.reader.register(cx.waker());
            if this.closed() {
                return Poll::Ready(Err(closed_error()));
            }
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed() {
            return Poll::Ready(Err(closed_error()));
        }
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed() {
            return Poll::Ready(Err(closed_error()));
        }
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Lifts the soft limit on open files to the hard one (containers often start at 1024) and
/// returns the soft limit then in force.
pub fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the struct given, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}
