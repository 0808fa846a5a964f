//! Small HTTP servers that answer every request with their own address, for tests
//! that check which instance a proxy reached.
//!
//! Each [`HttpBackend`] runs on its own thread and tokio runtime (so plain `#[test]`
//! functions can use it), serves HTTP/1.1 with hyper and answers `200` with the body
//! `<ip>:<port>\n`; `GET /metrics` instead answers one sample in Prometheus' text
//! format, `backend{addr="<ip>:<port>"} 1`, so a Prometheus can scrape it. [`HttpBackend::stop`] closes the listener and every connection,
//! so new connections are refused, as when the process behind it dies.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::thread::JoinHandle;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;

/// One running backend; stopped on drop.
#[derive(Debug)]
pub struct HttpBackend {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpBackend {
    /// Starts a backend on `ip` and a free port.
    pub fn start(ip: IpAddr) -> io::Result<Self> {
        Self::start_at(SocketAddr::new(ip, 0))
    }

    /// Starts a backend on `addr` (port 0: a free one).
    pub fn start_at(addr: SocketAddr) -> io::Result<Self> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                tokio::select! {
                    () = serve(listener, addr) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection task: their sockets close.
        });
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens (and what it answers).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener and every connection.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(listener: tokio::net::TcpListener, me: SocketAddr) {
    let body = Bytes::from(format!("{me}\n"));
    let metrics = Bytes::from(format!("backend{{addr=\"{me}\"}} 1\n"));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (body, metrics) = (body.clone(), metrics.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let body = if req.uri().path() == "/metrics" {
                    metrics.clone()
                } else {
                    body.clone()
                };
                async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(body))) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
