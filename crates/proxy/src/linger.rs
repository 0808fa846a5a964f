//! A lingering close for a client that is still sending.
//!
//! hyper closes a client's connection after an answer that came before the
//! request's whole body (an endpoint's early `413`), without reading the rest.
//! A socket closed with bytes unread is reset. A client still sending its body
//! then meets the reset, and may never read the answer waiting in its socket:
//! curl, for one, gives up with a send error. nginx reads and drops what comes
//! after such an answer for a while before it closes (its lingering close).
//!
//! When hyper shuts the socket of a client that sent a request body down
//! ([`Unread::note`], from the socket's `poll_shutdown`) and bytes of the
//! client's still wait, a duplicate of the socket is kept. The connection's
//! task then reads and drops what the client sends ([`linger`]) until the
//! client closes, or for at most [`LINGER`], and then closes.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tracing::debug;

/// How long a client that still sends may go on before its connection closes.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// A duplicate of a client's socket that hyper shut down with the client's bytes
/// still unread.
#[derive(Debug, Default)]
pub(crate) struct Unread {
    /// Whether a request on the connection came with a body: only then is the
    /// socket looked at when it is shut down.
    bodies: AtomicBool,
    kept: Mutex<Option<OwnedFd>>,
}

impl Unread {
    /// A request on the connection came with a body.
    pub(crate) fn body_came(&self) {
        self.bodies.store(true, Ordering::Relaxed);
    }

    /// At hyper's shutdown of `socket`: keeps a duplicate of it when bytes of the
    /// client's wait unread. Asked of the socket itself (one system call), and
    /// only on a connection that had a request with a body: tokio's readiness
    /// can have been cleared by a read with the client's bytes still coming.
    pub(crate) fn note(&self, socket: &TcpStream) {
        if !self.bodies.load(Ordering::Relaxed) {
            return;
        }
        let mut kept = self.kept.lock();
        if kept.is_some() {
            return;
        }
        if crate::early::bytes_wait(socket.as_fd()) {
            *kept = socket.as_fd().try_clone_to_owned().ok();
        }
    }

    /// The duplicate kept, if any.
    pub(crate) fn take(&self) -> Option<OwnedFd> {
        self.kept.lock().take()
    }
}

/// Reads and drops what the client sends on `fd` until it closes, fails, or
/// [`LINGER`] has passed; then closes it.
pub(crate) async fn linger(fd: OwnedFd, peer: SocketAddr) {
    let mut socket = match TcpStream::from_std(std::net::TcpStream::from(fd)) {
        Ok(s) => s,
        Err(e) => return debug!(%peer, error = %e, "no lingering close"),
    };
    debug!(%peer, linger = ?LINGER, "answered before the whole request came; reading what the client still sends before closing");
    let mut buf = vec![0u8; 16 * 1024];
    let mut dropped = 0u64;
    let read = tokio::time::timeout(LINGER, async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => dropped += n as u64,
                Err(e) => return Err::<(), io::Error>(e),
            }
        }
    })
    .await;
    let how = match read {
        Ok(Ok(())) => "the client closed",
        Ok(Err(_)) => "the client's connection failed",
        Err(_) => "the linger ran out",
    };
    debug!(%peer, dropped, "{how}; closing");
}
