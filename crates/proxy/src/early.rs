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
//! The sockets of pooled connections (a [`Deferred`] made with
//! [`Deferred::endpoint`]) hold such a send error back when the socket still has
//! bytes to read ([`answer_waits`]): nothing more is sent (a write waits for
//! ever), and reads go on until the endpoint's answer and the reset behind it
//! have been read. The connection then ends on the read side, after hyper has
//! handed the answer on. A send that fails with nothing to read (an endpoint that
//! crashed, a pooled connection the endpoint had closed) fails at once, as before.
//!
//! [`Deferred`]: crate::outbox::Deferred
//! [`Deferred::endpoint`]: crate::outbox::Deferred::endpoint

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nix::sys::socket::MsgFlags;
use tracing::debug;

/// Whether the failed send `e` is held back: it met a connection the endpoint
/// closed, and bytes wait to be read on `fd`.
#[cold]
pub(crate) fn answer_waits(fd: BorrowedFd<'_>, e: &io::Error) -> bool {
    if !matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
    ) {
        return false;
    }
    // Asked of the socket itself: tokio's readiness may not have seen the answer
    // yet, as the send meets the reset in the same turn.
    if !bytes_wait(fd) {
        return false;
    }
    debug!(
        error = %e,
        "the endpoint closed before taking the whole request; reading its answer"
    );
    true
}

/// Whether bytes wait to be read on the socket `fd`: one `recv` with
/// `MSG_PEEK | MSG_DONTWAIT`, which reads nothing and never blocks.
pub(crate) fn bytes_wait(fd: BorrowedFd<'_>) -> bool {
    let mut byte = [0u8];
    let flags = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    matches!(nix::sys::socket::recv(fd.as_raw_fd(), &mut byte, flags), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use std::io::{self, Write};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::outbox::Deferred;

    /// An endpoint's socket as hyper's client has it, its peer (the endpoint), and
    /// the first bytes of a request already sent on it, unread by the peer: the
    /// peer's close resets the connection.
    async fn sent_to() -> (Deferred<TcpStream>, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (peer, _) = listener.accept().unwrap();
        let mut io = Deferred::endpoint(stream);
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
