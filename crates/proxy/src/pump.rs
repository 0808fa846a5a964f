//! One direction of a forwarded connection: bytes from one socket to the other.
//!
//! A direction starts by copying through a small user-space buffer, allocated when
//! the source is readable and kept once it has given a byte (an idle connection
//! holds none). Once a read fills that
//! buffer the direction carries a long transfer and switches to `splice(2)` through
//! a pipe of its own: socket → pipe → socket, the bytes never leave the kernel. Short
//! request/response exchanges thus cost no pipe, and bulk bodies cost no copies.
//! Where the kernel refuses to splice (`EINVAL`, `ENOSYS`, no pipe for lack of file
//! descriptors) the direction goes back to copying for good, without losing bytes.
//!
//! Both directions of a connection run in one task on shared references to the two
//! sockets, driven by tokio's readiness (`poll_read_ready`/`poll_write_ready` +
//! `try_io`). The poll functions keep one waker per socket and direction, which is
//! all this needs (one reader and one writer per socket), without the waiter list
//! that `readable()`/`writable()` lock on every wait. When the
//! source reaches end of stream the destination's write side is shut down (the
//! half-close is passed on) and the direction is done; the counter given to it grows
//! by every chunk written, so byte counters are live while the connection is open.

use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, SpliceFFlags, splice};
use nix::unistd::pipe2;
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tracing::debug;

/// The copy buffer; a read that fills it marks a long transfer.
const COPY_CHUNK: usize = 16 * 1024;
/// At most this much per splice call: the default pipe capacity (16 pages).
const SPLICE_CHUNK: usize = 64 * 1024;

/// One direction: `from` → `to`, counting the bytes written into `bytes`.
pub(crate) struct Direction<'a> {
    pub(crate) from: &'a TcpStream,
    pub(crate) to: &'a TcpStream,
    pub(crate) bytes: &'a AtomicU64,
}

/// How a direction moves its bytes now.
enum Mode {
    /// Copying; the buffer exists once the source was first readable.
    Copy(Option<Box<[u8]>>),
    /// Splicing through this pipe.
    Splice(Pipe),
    /// Copying for good: splicing failed once.
    CopyOnly(Box<[u8]>),
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
        let mut mode = Mode::Copy(None);
        loop {
            let moved = match &mut mode {
                Mode::Copy(slot) => {
                    poll_fn(|cx| self.from.poll_read_ready(cx)).await?;
                    let buf = slot.get_or_insert_with(|| vec![0; COPY_CHUNK].into_boxed_slice());
                    let Some(n) = self.try_read_into(buf)? else {
                        if total == 0 {
                            // Readiness without data before the first byte (a
                            // fresh socket can be reported readable once): an
                            // idle connection keeps no buffer.
                            *slot = None;
                        }
                        continue;
                    };
                    self.write_all(&buf[..n]).await?;
                    if n == COPY_CHUNK {
                        match Pipe::new() {
                            Ok(pipe) => mode = Mode::Splice(pipe),
                            Err(e) => {
                                debug!(error = %e, "no pipe for splicing: copying");
                                mode = Mode::CopyOnly(std::mem::take(buf));
                            }
                        }
                    }
                    n
                }
                Mode::CopyOnly(buf) => self.copy_once(buf).await?,
                Mode::Splice(pipe) => match self.splice_once(pipe).await? {
                    Spliced::Moved(n) => n,
                    Spliced::Unsupported => {
                        mode = Mode::CopyOnly(vec![0; COPY_CHUNK].into_boxed_slice());
                        continue;
                    }
                },
            };
            if moved == 0 {
                break;
            }
            total += moved as u64;
        }
        // The peer may have closed already; a failed shutdown changes nothing.
        let _ = SockRef::from(self.to).shutdown(Shutdown::Write);
        Ok(total)
    }

    /// One read into `buf` and writing all of it; 0 at end of stream.
    async fn copy_once(&self, buf: &mut [u8]) -> io::Result<usize> {
        let n = loop {
            poll_fn(|cx| self.from.poll_read_ready(cx)).await?;
            if let Some(n) = self.try_read_into(buf)? {
                break n;
            }
        };
        self.write_all(&buf[..n]).await?;
        Ok(n)
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
                    self.bytes.fetch_add(m as u64, Ordering::Relaxed);
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
                    self.bytes.fetch_add(m as u64, Ordering::Relaxed);
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
