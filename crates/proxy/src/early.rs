//! An endpoint's answer read past a send that failed.
//!
//! An endpoint may answer before it has read the whole request (a `413` to an
//! upload too large, a `401` before the body) and close its connection. Closed
//! with the rest of the request unread in its socket, the connection is reset,
//! and dwara's next send of the body fails (`EPIPE`, `ECONNRESET`) while the
//! answer waits in dwara's receive queue: TCP delivers what came before the
//! reset. hyper's client ends a connection at the first error on either side, so
//! the answer was lost and the client got a `502` where HAProxy passes the `413`
//! on.
//!
//! [`EndpointIo`] is the socket of a pooled connection as hyper's client sees
//! it. When a send fails that way while the socket still has bytes to read, it
//! holds the error back: nothing more is sent (a write waits for ever), and reads
//! go on until the endpoint's answer and the reset behind it have been read. The
//! connection then ends on the read side, after hyper has handed the answer on.
//! A send that fails with nothing to read (an endpoint that crashed, a pooled
//! connection the endpoint had closed) fails at once, as before.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use nix::sys::socket::MsgFlags;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tracing::debug;

use crate::outbox::Deferred;

/// A pooled connection's socket (see the module docs).
pub(crate) struct EndpointIo {
    io: Deferred<TcpStream>,
    /// A send failed with the answer still to read: what is left is only read.
    send_failed: bool,
}

impl EndpointIo {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self {
            io: Deferred::new(stream),
            send_failed: false,
        }
    }

    /// Whether the failed send `e` is held back, reads going on: it met a
    /// connection the endpoint closed, and bytes wait to be read.
    #[cold]
    fn read_on(&mut self, e: &io::Error, cx: &mut Context<'_>) -> bool {
        if !matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            return false;
        }
        // Asked of the socket itself: tokio's readiness may not have seen the
        // answer yet, as the send meets the reset in the same turn.
        let mut byte = [0u8];
        let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
        match nix::sys::socket::recv(self.io.get_ref().as_raw_fd(), &mut byte, flags) {
            Ok(n) if n > 0 => {
                debug!(
                    error = %e,
                    "the endpoint closed before taking the whole request; reading its answer"
                );
                self.send_failed = true;
                // hyper reads again on its next poll.
                cx.waker().wake_by_ref();
                true
            }
            _ => false,
        }
    }
}

impl AsyncRead for EndpointIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.send_failed {
            // A read can meet the error of a send the worker's turn made.
            match Pin::new(&mut this.io).poll_read(cx, buf) {
                Poll::Ready(Err(e)) if this.read_on(&e, cx) => {}
                other => return other,
            }
        }
        Pin::new(this.io.get_mut()).poll_read(cx, buf)
    }
}

impl AsyncWrite for EndpointIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.send_failed {
            return Poll::Pending;
        }
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(Err(e)) if this.read_on(&e, cx) => Poll::Pending,
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.send_failed {
            return Poll::Pending;
        }
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(Err(e)) if this.read_on(&e, cx) => Poll::Pending,
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.send_failed {
            // The connection is gone: there is nothing to shut down.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An endpoint's socket as hyper's client has it, its peer (the endpoint), and
    /// the first bytes of a request already sent on it, unread by the peer: the
    /// peer's close resets the connection.
    async fn sent_to() -> (EndpointIo, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (peer, _) = listener.accept().unwrap();
        let mut io = EndpointIo::new(stream);
        io.write_all(b"POST /upload HTTP/1.1\r\ncontent-length: 1000000\r\n\r\n")
            .await
            .unwrap();
        (io, peer)
    }

    /// Sends body bytes on `io` until a send fails.
    async fn send_until_it_fails(wr: &mut (impl AsyncWrite + Unpin)) -> io::Error {
        let piece = [b'x'; 16 * 1024];
        loop {
            if let Err(e) = wr.write_all(&piece).await {
                return e;
            }
        }
    }

    #[tokio::test]
    async fn an_answer_before_the_reset_is_read_and_the_failed_send_waits() {
        let (io, mut peer) = sent_to().await;
        let answer = b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 0\r\n\r\n";
        peer.write_all(answer).unwrap();
        drop(peer);
        let (mut rd, mut wr) = tokio::io::split(io);
        let mut got = Vec::new();
        // The reads end after the answer, at the end of the stream or at the
        // reset (the failed send may have taken it).
        tokio::time::timeout(Duration::from_secs(10), async {
            tokio::select! {
                biased;
                e = send_until_it_fails(&mut wr) => panic!("the send failed before the answer was read: {e}"),
                _ = rd.read_to_end(&mut got) => {}
            }
        })
        .await
        .expect("the answer was not read in time");
        assert_eq!(got, answer);
    }

    #[tokio::test]
    async fn a_send_that_meets_a_reset_with_nothing_to_read_fails_at_once() {
        let (mut io, peer) = sent_to().await;
        drop(peer);
        let e = tokio::time::timeout(Duration::from_secs(10), send_until_it_fails(&mut io))
            .await
            .expect("the send did not fail in time");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            "{e}"
        );
    }
}
