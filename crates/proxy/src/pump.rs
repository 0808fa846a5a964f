//! One direction of a forwarded connection: bytes from one socket to the other.
//!
//! A direction starts by copying through its worker thread's scratch buffer: a read
//! and the writes that the destination takes at once happen in one go, and only
//! bytes the destination cannot take yet are kept, in a buffer of the connection's
//! own until they are written (an idle or request/response connection holds no
//! buffer). Once a read fills the scratch buffer the direction carries a long
//! transfer and switches to `splice(2)` through a pipe of its own: socket → pipe →
//! socket, the bytes never leave the kernel. Short request/response exchanges thus
//! cost no pipe, and bulk bodies cost no copies.
//! Where the kernel refuses to splice (`EINVAL`, `ENOSYS`, no pipe for lack of file
//! descriptors) the direction goes back to copying for good, without losing bytes.
//!
//! Both directions of a connection run in one task on shared references to the two
//! sockets, driven by tokio's readiness (`poll_read_ready`/`poll_write_ready` +
//! `try_io`). The poll functions keep one waker per socket and direction, which is
//! all this needs (one reader and one writer per socket), without the waiter list
//! that `readable()`/`writable()` lock on every wait. When the
//! source reaches end of stream the destination's write side is shut down (the
//! half-close is passed on; when the destination has ended its own stream already,
//! the connection closes next and the close sends the FIN) and the direction is
//! done; the counter given to it grows by every chunk written, so byte counters are
//! live while the connection is open.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, SpliceFFlags, splice};
use nix::unistd::pipe2;
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tracing::debug;

/// The scratch buffer; a read that fills it marks a long transfer.
const COPY_CHUNK: usize = 16 * 1024;

thread_local! {
    /// Each thread's copy buffer: used between a read and the writes that follow
    /// it at once, never across an await.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; COPY_CHUNK].into_boxed_slice());
}
/// At most this much per splice call: the default pipe capacity (16 pages).
const SPLICE_CHUNK: usize = 64 * 1024;

/// One direction: `from` → `to`, counting the bytes written into `bytes`.
pub(crate) struct Direction<'a> {
    pub(crate) from: &'a TcpStream,
    pub(crate) to: &'a TcpStream,
    pub(crate) bytes: &'a AtomicU64,
    /// Also counts the bytes written, when given (a tunnel's own count, which its
    /// idle timeout watches).
    pub(crate) also: Option<&'a AtomicU64>,
    /// Set when `from` has reached end of stream.
    pub(crate) ended: &'a AtomicBool,
    /// The other direction's `ended`: `to` has reached end of stream.
    pub(crate) to_ended: &'a AtomicBool,
}

/// How a direction moves its bytes now.
enum Mode {
    /// Copying, ready to splice after a full read.
    Copy,
    /// Splicing through this pipe.
    Splice(Pipe),
    /// Copying for good: splicing failed once.
    CopyOnly,
}

/// Both ends of a non-blocking pipe.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Self> {
        let (read, write) = pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        Ok(Self { read, write })
    }
}

/// Whether a splice error means "this pair of files cannot be spliced" rather than
/// a failure of the connection.
fn unsupported(e: Errno) -> bool {
    matches!(e, Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP)
}

const FLAGS: SpliceFFlags = SpliceFFlags::SPLICE_F_MOVE.union(SpliceFFlags::SPLICE_F_NONBLOCK);

impl Direction<'_> {
    /// Moves bytes until `from` reaches end of stream, then shuts down the write side
    /// of `to`. Returns the bytes moved.
    pub(crate) async fn run(self) -> io::Result<u64> {
        let mut total = 0u64;
        let mut mode = Mode::Copy;
        loop {
            let moved = match &mut mode {
                Mode::Copy => {
                    let n = self.copy_once().await?;
                    if n == COPY_CHUNK {
                        match Pipe::new() {
                            Ok(pipe) => mode = Mode::Splice(pipe),
                            Err(e) => {
                                debug!(error = %e, "no pipe for splicing: copying");
                                mode = Mode::CopyOnly;
                            }
                        }
                    }
                    n
                }
                Mode::CopyOnly => self.copy_once().await?,
                Mode::Splice(pipe) => match self.splice_once(pipe).await? {
                    Spliced::Moved(n) => n,
                    Spliced::Unsupported => {
                        mode = Mode::CopyOnly;
                        continue;
                    }
                },
            };
            if moved == 0 {
                break;
            }
            total += moved as u64;
        }
        self.ended.store(true, Ordering::Relaxed);
        if !self.to_ended.load(Ordering::Relaxed) {
            // The peer may have closed already; a failed shutdown changes nothing.
            let _ = SockRef::from(self.to).shutdown(Shutdown::Write);
        }
        Ok(total)
    }

    fn count(&self, n: usize) {
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(also) = self.also {
            also.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// One read through the scratch buffer and writing all of it; 0 at end of
    /// stream.
    async fn copy_once(&self) -> io::Result<usize> {
        loop {
            poll_fn(|cx| self.from.poll_read_ready(cx)).await?;
            let step = SCRATCH.with_borrow_mut(|buf| self.read_and_write(buf))?;
            match step {
                None => continue,
                Some((n, None)) => return Ok(n),
                Some((n, Some(rest))) => {
                    self.write_all(&rest).await?;
                    return Ok(n);
                }
            }
        }
    }

    /// One read into `buf`, then writes while `to` takes them: `None` when `from`
    /// had nothing, else the bytes read and those `to` did not take yet.
    fn read_and_write(&self, buf: &mut [u8]) -> io::Result<Option<(usize, Option<Vec<u8>>)>> {
        let Some(n) = self.try_read_into(buf)? else {
            return Ok(None);
        };
        let mut written = 0;
        while written < n {
            match self.to.try_write(&buf[written..n]) {
                Ok(m) => {
                    written += m;
                    self.count(m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let rest = (written < n).then(|| buf[written..n].to_vec());
        Ok(Some((n, rest)))
    }

    /// One read attempt; `None` when the socket had nothing (readiness cleared).
    fn try_read_into(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // A short read took everything the socket had: report it as "would block"
        // too, so tokio clears the readiness now and the next read waits for the
        // next event instead of costing a system call that finds nothing. (tokio
        // never clears the read-closed bit, so a FIN that came with the data is
        // not missed.)
        let mut short = 0;
        let r = self.from.try_io(Interest::READABLE, || {
            let n = nix::unistd::read(self.from, buf)?;
            if n > 0 && n < buf.len() {
                short = n;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(n)
        });
        match r {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && short > 0 => Ok(Some(short)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes all of `data` to `to`, counting as it goes.
    async fn write_all(&self, data: &[u8]) -> io::Result<()> {
        let mut written = 0;
        while written < data.len() {
            poll_fn(|cx| self.to.poll_write_ready(cx)).await?;
            match self.to.try_write(&data[written..]) {
                Ok(m) => {
                    written += m;
                    self.count(m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One splice from `from` into the (empty) pipe and splicing all of it out to
    /// `to`; `Moved(0)` at end of stream.
    async fn splice_once(&self, pipe: &Pipe) -> io::Result<Spliced> {
        let n = loop {
            poll_fn(|cx| self.from.poll_read_ready(cx)).await?;
            let r = self.from.try_io(Interest::READABLE, || {
                splice(self.from, None, &pipe.write, None, SPLICE_CHUNK, FLAGS)
                    .map_err(io::Error::from)
            });
            match r {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                // The pipe is empty here, so nothing is lost by copying instead.
                Err(e)
                    if e.raw_os_error()
                        .is_some_and(|c| unsupported(Errno::from_raw(c))) =>
                {
                    debug!(error = %e, "splice refused: copying");
                    return Ok(Spliced::Unsupported);
                }
                Err(e) => return Err(e),
            }
        };
        let mut left = n;
        while left > 0 {
            poll_fn(|cx| self.to.poll_write_ready(cx)).await?;
            let r = self.to.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, self.to, None, left, FLAGS).map_err(io::Error::from)
            });
            match r {
                Ok(m) => {
                    left -= m;
                    self.count(m);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e)
                    if e.raw_os_error()
                        .is_some_and(|c| unsupported(Errno::from_raw(c))) =>
                {
                    debug!(error = %e, "splice out of the pipe refused: copying");
                    self.drain_pipe(pipe, left).await?;
                    return Ok(Spliced::Unsupported);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Spliced::Moved(n))
    }

    /// Reads the `left` bytes still in the pipe and writes them with plain writes.
    async fn drain_pipe(&self, pipe: &Pipe, mut left: usize) -> io::Result<()> {
        let mut buf = vec![0; left.min(SPLICE_CHUNK)];
        while left > 0 {
            let want = left.min(buf.len());
            let n = nix::unistd::read(&pipe.read, &mut buf[..want])?;
            if n == 0 {
                break;
            }
            self.write_all(&buf[..n]).await?;
            left -= n;
        }
        Ok(())
    }
}

/// What one splice round did.
enum Spliced {
    Moved(usize),
    /// The kernel does not splice these files; nothing was lost.
    Unsupported,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (b, _) = listener.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn bytes_the_destination_cannot_take_yet_wait_and_arrive_in_order() {
        // `to` is full (its peer does not read yet): a read of 15,000 bytes (one
        // copy, under the scratch size) cannot be written at once and waits in the
        // connection's own buffer.
        let (mut source, from) = pair().await;
        let (to, mut sink) = pair().await;
        let mut full = 0usize;
        loop {
            match to.try_write(&[0xee; 4096]) {
                Ok(n) => full += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let msg: Vec<u8> = (0..15_000u32).map(|i| (i % 251) as u8).collect();
        source.write_all(&msg).await.unwrap();
        source.shutdown().await.unwrap();
        let (bytes, ended, to_ended) = (
            AtomicU64::new(0),
            AtomicBool::new(false),
            AtomicBool::new(false),
        );
        let dir = Direction {
            from: &from,
            to: &to,
            bytes: &bytes,
            also: None,
            ended: &ended,
            to_ended: &to_ended,
        };
        let mut got = Vec::new();
        let (moved, read) = tokio::join!(dir.run(), sink.read_to_end(&mut got));
        assert_eq!(moved.unwrap(), 15_000);
        read.unwrap();
        assert_eq!(got.len(), full + msg.len());
        assert!(got[..full].iter().all(|b| *b == 0xee));
        assert!(got[full..] == msg, "bytes changed or lost");
        assert_eq!(bytes.load(Ordering::Relaxed), 15_000);
        assert!(ended.load(Ordering::Relaxed));
    }
}
