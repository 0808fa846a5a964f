//! The one HTTP listener of `dwara serve`, with the limits that keep a hostile client
//! from taking it over.
//!
//! `axum::serve` has no header timeout and no connection limit, so the listener is
//! hyper's HTTP/1 connection builder over the composed axum router:
//!
//! - at most `max_connections` connections at once (`--http-max-connections`,
//!   default 1024); a connection accepted beyond that is closed at once; the
//!   kernel queues up to 4096 connections not yet accepted;
//! - a request's headers must arrive within `read_timeout` (`--http-read-timeout`,
//!   default 10 s) of the connection starting to wait for them, which also closes a
//!   keep-alive connection idle that long (hyper's `header_read_timeout`);
//! - its body must arrive within `read_timeout` of the headers (else 408), and is
//!   at most `max_body` bytes (`--http-max-body`, default 64 KiB; else 413, at once
//!   when `Content-Length` says so). Bodies are read whole before a handler runs,
//!   so a connection buffers at most `max_body` bytes of body and hyper's 64 KiB
//!   read buffer.
//!
//! With `--http-token-file` a request the token covers (every write, or every
//! request with `--http-token-reads`) is answered 401 without the token, before
//! its body is read (see `dwara::auth`).
//!
//! Shutdown stops accepting and lets the requests in flight finish (at most 5 s).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use dwara::auth::{Auth, require_token};

/// The default of `--http-read-timeout`.
pub(crate) const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The default of `--http-max-connections`.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The default of `--http-max-body`: the API's bodies are a form with one name.
pub(crate) const DEFAULT_MAX_BODY: usize = 64 * 1024;
/// hyper's read buffer, which bounds the request line and headers (431 beyond).
const MAX_HEAD: usize = 64 * 1024;

/// The limits of the HTTP listener (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpLimits {
    pub(crate) read_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) max_body: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_body: DEFAULT_MAX_BODY,
        }
    }
}

/// Reads the whole body within the limits before the handler runs.
async fn bounded_body(State(limits): State<HttpLimits>, req: Request, next: Next) -> Response {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {} bytes\n", limits.max_body),
        )
            .into_response()
    };
    let (parts, body) = req.into_parts();
    let announced = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_body as u64) {
        return too_large();
    }
    let read = Limited::new(body, limits.max_body).collect();
    let bytes = match tokio::time::timeout(limits.read_timeout, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "HTTP request body cut short");
            return (StatusCode::BAD_REQUEST, "request body cut short\n").into_response();
        }
        Err(_) => {
            return (
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {} s\n",
                    limits.read_timeout.as_secs_f64()
                ),
            )
                .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The kernel's queue of connections not yet accepted. A burst of connections
/// larger than the queue (the default is 128) has its SYNs dropped and retried a
/// second later, which a burst of hostile connections would impose on everyone.
const LISTEN_BACKLOG: u32 = 4096;

fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std's and tokio's own bind do: a restart may bind while old connections
    // linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The running listener.
pub(crate) struct HttpServer {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    /// Binds `addr` and serves `router` under `limits`, behind `auth` when given
    /// (checked first, before a body is read).
    pub(crate) async fn serve(
        addr: SocketAddr,
        router: Router,
        limits: HttpLimits,
        auth: Option<Arc<Auth>>,
    ) -> anyhow::Result<(Self, SocketAddr)> {
        let listener = bind(addr).with_context(|| format!("cannot listen on {addr} (HTTP)"))?;
        let local = listener.local_addr()?;
        let mut router = router.layer(middleware::from_fn_with_state(limits, bounded_body));
        if let Some(auth) = auth {
            router = router.layer(middleware::from_fn_with_state(auth, require_token));
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(accept_loop(listener, router, limits, stopped));
        tracing::debug!(
            addr = %local,
            read_timeout_s = limits.read_timeout.as_secs_f64(),
            max_connections = limits.max_connections,
            max_body = limits.max_body,
            "HTTP listener limits"
        );
        Ok((Self { stop, task }, local))
    }

    /// Stops accepting and finishes the requests in flight (at most 5 s).
    pub(crate) async fn shutdown(self) {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server task failed"),
            Err(_) => tracing::warn!("HTTP server did not stop within 5 s"),
        }
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: HttpLimits,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .max_buf_size(MAX_HEAD);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors, most likely: wait rather than spin.
                    tracing::debug!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut stopped => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, limit = limits.max_connections, "too many HTTP connections; closing");
            continue;
        };
        // Small request/response pairs on keep-alive connections: no Nagle delays.
        let _ = stream.set_nodelay(true);
        let conn = builder.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(router.clone()),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::trace!(%peer, error = %e, "HTTP connection ended");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
