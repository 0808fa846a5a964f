//! Sends gathered per turn of a worker's event loop.
//!
//! A worker's turn wakes the tasks of the connections that became ready and polls
//! each through its whole path: hyper reads a request and, in the same poll,
//! writes it to the endpoint; reads an answer and writes it to the client. Sent
//! one by one between the reads, each send reaches its receiver (the client, the
//! endpoint) alone, and wakes it alone. HAProxy's loop does a turn's reads first
//! and then its sends, so the receivers find several ready sockets per wake-up;
//! behind dwara they called `epoll_wait` about twice as often per request (see
//! docs/PERFORMANCE.md, "HTTP upstreams").
//!
//! [`Deferred`] wraps the sockets of HTTP connections on the L4 workers: a write
//! of up to [`SMALL`] bytes (a request head, a small answer) is kept in the
//! connection's outbox, reported written and flushed, and sent when the worker is
//! about to wait for events again ([`send_all`], the runtime's `on_thread_park`),
//! or once [`BATCH`] outboxes wait. Larger writes (the pieces of a streamed body)
//! go at once, after whatever the outbox held, so bytes never change order.
//!
//! A connection's first write goes at once, and its outbox (with the duplicate of
//! its descriptor that the turn's end sends on) is made at its second: a
//! connection that writes once, such as one answer and then close, costs no
//! `fcntl`, `close` or allocation for an outbox it would not use.
//!
//! The turn's end sends through a duplicate of the socket's descriptor, without
//! waiting (`MSG_DONTWAIT`). What a full socket does not take stays in the outbox
//! and the connection's task is woken: its next poll sends the rest through tokio,
//! which watches for the socket to take more, before anything else. An error is
//! kept for that poll to return. A thread whose runtime does not call [`send_all`]
//! holds nothing: its writes go at once.
//!
//! The socket of a pooled connection to an endpoint ([`Deferred::endpoint`]) also
//! holds back a send that failed on the endpoint's reset while its answer waits to
//! be read ([`crate::early`]).

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes, BytesMut};
use nix::errno::Errno;
use nix::sys::socket::MsgFlags;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Writes up to this size wait for the end of the turn; larger ones, such as the
/// pieces of a streamed body, go at once.
const SMALL: usize = 4 * 1024;

/// Outboxes waiting at most on one thread: one more sends them all at once, so
/// that a long turn does not hold its first answers until its end.
const BATCH: usize = 64;

thread_local! {
    /// Whether this thread's runtime calls [`send_all`] before it parks.
    static ON: Cell<bool> = const { Cell::new(false) };
    /// The outboxes holding bytes, in the order they were first written to.
    static QUEUED: RefCell<Vec<Arc<Outbox>>> = const { RefCell::new(Vec::new()) };
}

/// Marks the current thread as one whose runtime calls [`send_all`] before it
/// parks (`on_thread_park`): [`Deferred`] connections made on it hold their
/// small writes until then.
pub(crate) fn enable() {
    ON.with(|on| on.set(true));
}

/// What an outbox holds.
#[derive(Default)]
struct Held {
    bytes: BytesMut,
    /// In this thread's [`QUEUED`], to be sent at the turn's end.
    queued: bool,
    /// The task that wrote last, woken when the turn's end could not send all.
    waker: Option<Waker>,
    /// A send at the turn's end failed: for the connection's next poll.
    failed: Option<io::ErrorKind>,
}

/// A connection's held bytes and the descriptor the turn's end sends them on.
struct Outbox {
    fd: OwnedFd,
    held: Mutex<Held>,
    /// Whether the turn's end left bytes (a full socket) or an error for the
    /// connection's task: set and cleared under the lock, read without it on
    /// every read and flush.
    left: AtomicBool,
}

impl Outbox {
    /// Sends what it holds without waiting; see the module docs for what a full
    /// socket or an error leaves.
    fn send(&self) {
        let mut held = self.held.lock();
        held.queued = false;
        while !held.bytes.is_empty() {
            let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
            match nix::sys::socket::send(self.fd.as_raw_fd(), &held.bytes, flags) {
                Ok(n) => held.bytes.advance(n),
                Err(Errno::EINTR) => {}
                Err(e) => {
                    if e != Errno::EAGAIN {
                        held.failed = Some(io::Error::from(e).kind());
                        held.bytes.clear();
                    }
                    self.left.store(true, Ordering::Release);
                    if let Some(w) = held.waker.take() {
                        w.wake();
                    }
                    return;
                }
            }
        }
    }
}

/// Sends every outbox waiting on this thread (the runtime's `on_thread_park`).
pub(crate) fn send_all() {
    let mut queued = QUEUED.with(|q| std::mem::take(&mut *q.borrow_mut()));
    for outbox in &queued {
        outbox.send();
    }
    queued.clear();
    // The list's allocation is kept for the next turn.
    QUEUED.with(|q| {
        let mut q = q.borrow_mut();
        if q.is_empty() {
            *q = queued;
        }
    });
}

/// A socket whose small writes wait in an outbox for the end of the worker's
/// turn (see the module docs).
pub(crate) struct Deferred<T> {
    io: T,
    /// Made at the second write; `None` before it, on a thread that does not
    /// send outboxes, or when the descriptor could not be duplicated: every write
    /// goes at once then.
    outbox: Option<Arc<Outbox>>,
    /// Whether writes may still be held: made on a thread that sends outboxes,
    /// and no duplicate of the descriptor has failed.
    may_hold: bool,
    /// Whether a write has gone to the socket (the next one makes the outbox).
    written: bool,
    /// An endpoint's socket: a send that meets the endpoint's reset while its
    /// answer waits to be read is held back ([`crate::early`]).
    endpoint: bool,
    /// Such a send failed and was held back: nothing more is sent, reads go on.
    send_failed: bool,
}

impl<T: AsFd> Deferred<T> {
    pub(crate) fn new(io: T) -> Self {
        Self {
            io,
            outbox: None,
            may_hold: ON.with(Cell::get),
            written: false,
            endpoint: false,
            send_failed: false,
        }
    }

    /// The socket of a pooled connection to an endpoint: an answer the endpoint
    /// gives before it has taken the whole request, and then resets the
    /// connection, is read past the failed send ([`crate::early`]).
    pub(crate) fn endpoint(io: T) -> Self {
        Self {
            endpoint: true,
            ..Self::new(io)
        }
    }

    /// A send failed with `e`: held back (pending; only reads go on from now) when
    /// this is an endpoint's socket with its answer waiting, else the error.
    #[cold]
    fn failed_send<R>(&mut self, e: io::Error, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        if !self.endpoint || !crate::early::answer_waits(self.io.as_fd(), &e) {
            return Poll::Ready(Err(e));
        }
        self.send_failed = true;
        // Nothing more is sent: what the outbox holds goes, and with it the
        // drain that reads and flushes would try first.
        if let Some(outbox) = &self.outbox {
            let mut held = outbox.held.lock();
            held.bytes.clear();
            held.failed = None;
            outbox.left.store(false, Ordering::Release);
        }
        // hyper reads on its next poll.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// The outbox, made now if this is a write after the first on a thread that
    /// sends outboxes.
    fn outbox(&mut self) -> Option<&Arc<Outbox>> {
        if self.outbox.is_none() && self.may_hold && self.written {
            match self.io.as_fd().try_clone_to_owned() {
                Ok(fd) => {
                    self.outbox = Some(Arc::new(Outbox {
                        fd,
                        held: Mutex::new(Held::default()),
                        left: AtomicBool::new(false),
                    }));
                }
                Err(_) => self.may_hold = false,
            }
        }
        self.outbox.as_ref()
    }
}

impl<T> Deferred<T> {
    /// The socket, and the bytes still held for it (to be written before any
    /// other), or the error a send at the turn's end met.
    pub(crate) fn into_parts(self) -> io::Result<(T, Bytes)> {
        let Some(outbox) = self.outbox else {
            return Ok((self.io, Bytes::new()));
        };
        let mut held = outbox.held.lock();
        if let Some(kind) = held.failed.take() {
            return Err(kind.into());
        }
        // Left in the queue, if there, with nothing to send.
        let bytes = held.bytes.split().freeze();
        Ok((self.io, bytes))
    }
}

impl<T: AsyncWrite + AsFd + Unpin> Deferred<T> {
    /// Sends what the outbox holds through `io`, which watches for the socket to
    /// take more when it is full; ready once nothing is held.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(outbox) = &self.outbox else {
            return Poll::Ready(Ok(()));
        };
        let mut held = outbox.held.lock();
        let failed = if let Some(kind) = held.failed.take() {
            outbox.left.store(false, Ordering::Release);
            io::Error::from(kind)
        } else {
            // Still queued or not, it goes now (the queue's turn then finds nothing).
            loop {
                if held.bytes.is_empty() {
                    outbox.left.store(false, Ordering::Release);
                    return Poll::Ready(Ok(()));
                }
                match Pin::new(&mut self.io).poll_write(cx, &held.bytes) {
                    Poll::Ready(Ok(0)) => break io::ErrorKind::WriteZero.into(),
                    Poll::Ready(Ok(n)) => held.bytes.advance(n),
                    Poll::Ready(Err(e)) => break e,
                    Poll::Pending => return Poll::Pending,
                }
            }
        };
        drop(held);
        self.failed_send(failed, cx)
    }

    /// Whether the turn's end left bytes (a full socket) or an error: the
    /// connection's task sends or returns them first. Otherwise the outbox is
    /// empty or waits for the turn's end, and counts as flushed.
    fn left(&self) -> bool {
        self.outbox
            .as_ref()
            .is_some_and(|o| o.left.load(Ordering::Acquire))
    }
}

impl<T: AsyncRead + AsyncWrite + AsFd + Unpin> AsyncRead for Deferred<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Bytes the turn's end could not send go on as the socket takes them, also
        // while the connection waits to read.
        if this.left()
            && let Poll::Ready(Err(e)) = this.drain(cx)
        {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + AsFd + Unpin> AsyncWrite for Deferred<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.send_failed {
            // Left for the reads to end (see `crate::early`).
            return Poll::Pending;
        }
        if ON.with(Cell::get)
            && let Some(outbox) = this.outbox()
        {
            let mut held = outbox.held.lock();
            let fits = held.bytes.len() + buf.len() <= SMALL;
            // Only behind bytes that wait for the turn's end too, never behind
            // bytes a full socket left.
            if fits && held.failed.is_none() && (held.queued || held.bytes.is_empty()) {
                held.bytes.extend_from_slice(buf);
                if !held.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    held.waker = Some(cx.waker().clone());
                }
                let newly = !held.queued;
                held.queued = true;
                drop(held);
                if newly {
                    let full = QUEUED.with(|q| {
                        let mut q = q.borrow_mut();
                        q.push(outbox.clone());
                        q.len() >= BATCH
                    });
                    if full {
                        send_all();
                    }
                }
                return Poll::Ready(Ok(buf.len()));
            }
        }
        match this.drain(cx) {
            Poll::Ready(Ok(())) => {
                this.written = true;
                match Pin::new(&mut this.io).poll_write(cx, buf) {
                    Poll::Ready(Err(e)) => this.failed_send(e, cx),
                    other => other,
                }
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        // Bytes waiting for the turn's end count as flushed: they are sent without
        // the task.
        if !this.left() {
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        match this.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.send_failed {
            // The endpoint reset the connection: there is nothing to shut down.
            return Poll::Ready(Ok(()));
        }
        match this.drain(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair: the writer's side held by a [`Deferred`] made on this
    /// thread, marked as one that sends outboxes, and the peer's socket, read
    /// with plain system calls (tokio's `try_read` would not look before its
    /// reactor has seen the socket ready).
    async fn pair() -> (Deferred<TcpStream>, std::net::TcpStream) {
        enable();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (far, _) = listener.accept().await.unwrap();
        let far = far.into_std().unwrap();
        far.set_nonblocking(true).unwrap();
        (Deferred::new(near), far)
    }

    /// Whatever the peer can read now, without waiting.
    fn now(mut peer: &std::net::TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = peer.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[tokio::test]
    async fn the_first_write_goes_at_once_and_makes_no_outbox() {
        let (mut near, far) = pair().await;
        near.write_all(b"answer").await.unwrap();
        assert_eq!(now(&far), b"answer", "the first write waited");
        assert!(near.outbox.is_none(), "an outbox for a single write");
        near.write_all(b"again").await.unwrap();
        assert!(near.outbox.is_some(), "no outbox at the second write");
        assert_eq!(
            now(&far),
            b"",
            "the second write went before the turn's end"
        );
        send_all();
        assert_eq!(now(&far), b"again");
    }

    #[tokio::test]
    async fn small_writes_wait_for_the_turns_end_and_bytes_keep_their_order() {
        let (mut near, far) = pair().await;
        near.write_all(b"zero ").await.unwrap();
        assert_eq!(now(&far), b"zero ");
        near.write_all(b"one ").await.unwrap();
        near.write_all(b"two ").await.unwrap();
        near.flush().await.unwrap();
        assert_eq!(now(&far), b"", "sent before the turn's end");
        // A large write goes at once, after what was held.
        let large = vec![b'x'; SMALL + 1];
        near.write_all(&large).await.unwrap();
        let mut expected = b"one two ".to_vec();
        expected.extend_from_slice(&large);
        assert_eq!(now(&far), expected);
        near.write_all(b"three").await.unwrap();
        assert_eq!(now(&far), b"");
        send_all();
        assert_eq!(now(&far), b"three");
    }

    #[tokio::test]
    async fn what_a_full_socket_does_not_take_goes_on_as_the_peer_reads() {
        let (mut near, far) = pair().await;
        // The first write goes at once; the ones after it are held.
        near.write_all(b"head").await.unwrap();
        let mut far = TcpStream::from_std(far).unwrap();
        // Both the send and the receive buffers full.
        let chunk = vec![b'f'; 65536];
        let mut filled = 0;
        while let Ok(n) = near.io.try_write(&chunk) {
            filled += n;
        }
        near.write_all(b"tail").await.unwrap();
        send_all();
        let held = near.outbox.as_ref().unwrap().held.lock().bytes.clone();
        assert_eq!(&held[..], b"tail", "the full socket took it");
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            far.read_to_end(&mut all).await.unwrap();
            all
        });
        // Sent through tokio as the peer reads, then the write side closed.
        near.shutdown().await.unwrap();
        let all = reader.await.unwrap();
        assert_eq!(all.len(), 4 + filled + 4);
        assert!(all.starts_with(b"headff"));
        assert!(all.ends_with(b"fftail"));
    }

    #[tokio::test]
    async fn a_failed_send_at_the_turns_end_is_the_next_polls_error() {
        let (mut near, far) = pair().await;
        // The first write goes at once; the ones after it are held.
        near.write_all(b"first").await.unwrap();
        assert_eq!(now(&far), b"first");
        socket2::SockRef::from(&far)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(far);
        // The reset is in once the near side has read it.
        let mut buf = [0u8; 1];
        let _ = near.io.read(&mut buf).await;
        near.write_all(b"lost").await.unwrap();
        send_all();
        let err = near.write_all(b"more").await.unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_full_batch_is_sent_without_waiting_for_the_turns_end() {
        let mut pairs = Vec::new();
        for _ in 0..BATCH {
            let (mut near, far) = pair().await;
            // The first write goes at once; the ones after it are held.
            near.write_all(b"0").await.unwrap();
            assert_eq!(now(&far), b"0");
            pairs.push((near, far));
        }
        for (i, (near, far)) in pairs.iter_mut().enumerate() {
            near.write_all(b"m").await.unwrap();
            let sent = now(far);
            if i + 1 < BATCH {
                assert_eq!(sent, b"", "connection {i} sent before the batch was full");
            } else {
                assert_eq!(sent, b"m");
            }
        }
        for (_, far) in &pairs[..BATCH - 1] {
            assert_eq!(now(far), b"m");
        }
    }

    #[tokio::test]
    async fn into_parts_hands_back_what_is_held() {
        let (mut near, far) = pair().await;
        near.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        assert_eq!(now(&far), b"HTTP/1.1 200 OK\r\n\r\n");
        near.write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
            .await
            .unwrap();
        let (_socket, held) = near.into_parts().unwrap();
        assert_eq!(&held[..], b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
        send_all();
        assert_eq!(now(&far), b"", "sent twice");
    }

    #[tokio::test]
    async fn on_a_thread_that_sends_no_outboxes_every_write_goes_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (near, far) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let far = far.unwrap().0.into_std().unwrap();
        far.set_nonblocking(true).unwrap();
        // Made on a new thread, where `enable` was not called.
        let mut near = std::thread::spawn(move || Deferred::new(near.unwrap()))
            .join()
            .unwrap();
        near.write_all(b"now").await.unwrap();
        assert_eq!(now(&far), b"now");
        near.write_all(b" and again").await.unwrap();
        assert_eq!(now(&far), b" and again");
        assert!(near.outbox.is_none());
    }
}
