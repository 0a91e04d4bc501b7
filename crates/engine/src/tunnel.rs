//! gRPC to a worker inside a WebSocket, for where only HTTP reaches a worker (Cloudflare: a
//! container is reached through its Durable Object, which passes WebSockets on). The
//! WebSocket's binary messages carry the HTTP/2 connection's bytes unchanged, so gRPC's
//! streams, trailers and pings cross as they would over TCP. docs/distributed.md.

use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{Connector, WebSocketStream};
use url::Url;

/// How many bytes one message carries at most, and what each direction buffers.
const CHUNK: usize = 64 * 1024;

/// Opens a WebSocket to `url` (`ws://` or `wss://`), sending `token` as a bearer token, and
/// returns its byte stream for an HTTP/2 client.
pub async fn dial(
    url: Url,
    token: Option<Arc<str>>,
    tls: Arc<rustls::ClientConfig>,
) -> io::Result<TokioIo<DuplexStream>> {
    let mut request = url.as_str().into_client_request().map_err(io::Error::other)?;
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| io::Error::other("the worker token is not a valid header value"))?;
        request.headers_mut().insert("authorization", value);
    }
    let (ws, _) =
        tokio_tungstenite::connect_async_tls_with_config(request, None, false, Some(Connector::Rustls(tls)))
            .await
            .map_err(|e| io::Error::other(format!("WebSocket to {url}: {e}")))?;
    let (near, far) = tokio::io::duplex(CHUNK);
    tokio::spawn(bridge(ws, far));
    Ok(TokioIo::new(near))
}

/// TLS for `wss://` workers: webpki's roots, on ring (the provider reqwest uses too; naming it
/// keeps rustls from needing a process-wide default).
pub fn tls() -> Arc<rustls::ClientConfig> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports rustls's default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    Arc::new(config)
}

/// Copies bytes both ways between `ws` and `io` until either side ends or fails; then both
/// are closed, the WebSocket with a Close frame (the answer to the peer's, if it sent one).
/// Pings are answered by the WebSocket library as they are read.
pub async fn bridge<S, T>(ws: WebSocketStream<S>, io: T)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite,
{
    let (mut sink, mut messages) = ws.split();
    let (mut reader, mut writer) = tokio::io::split(io);
    let out = async {
        let mut buf = BytesMut::with_capacity(CHUNK);
        loop {
            buf.reserve(CHUNK);
            if reader.read_buf(&mut buf).await? == 0 {
                return Ok::<_, io::Error>(());
            }
            sink.send(Message::Binary(buf.split().freeze())).await.map_err(io::Error::other)?;
        }
    };
    let back = async {
        while let Some(message) = messages.next().await {
            match message.map_err(io::Error::other)? {
                Message::Binary(bytes) => writer.write_all(&bytes).await?,
                Message::Close(_) => break,
                // Text is not part of the tunnel; pings and pongs are the library's.
                _ => {}
            }
        }
        writer.shutdown().await
    };
    let ended = tokio::select! {
        r = out => r,
        r = back => r,
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "a worker tunnel ended");
    }
    // A peer that is gone must not hold the task.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), sink.close()).await;
}
