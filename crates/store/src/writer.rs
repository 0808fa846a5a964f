//! The group-commit writer: one thread, one write transaction per batch.
//!
//! Writers append to a queue under a short lock and get a [`Pending`]. The thread
//! takes everything queued, applies it in order in one redb write transaction,
//! commits it (one fsync for the batch) and then answers every [`Pending`] of the
//! batch. While it commits, new writes queue up for the next batch, so N concurrent
//! writers share about two fsyncs instead of paying N.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use redb::{Database, ReadableTable};
use tokio::sync::oneshot;

use crate::record::id_prefix;
use crate::{REGISTRATIONS, StoreError, Write, decode};

type Reply = oneshot::Sender<Result<(), StoreError>>;

/// A [`Write`] with its keys encoded.
#[derive(Debug)]
enum Encoded {
    /// Key and value.
    Put(Vec<u8>, Vec<u8>),
    Delete {
        prefix: Vec<u8>,
        ip: Option<std::net::IpAddr>,
        fqdn: Option<String>,
    },
}

impl Encoded {
    fn new(write: Write) -> Result<Self, StoreError> {
        Ok(match write {
            Write::Put(r) => Self::Put(r.encode()?, r.encode_value()?),
            Write::Delete { id, ip, fqdn } => Self::Delete {
                prefix: id_prefix(&id)?,
                ip,
                fqdn,
            },
        })
    }
}

#[derive(Debug, Default)]
struct Queue {
    writes: Vec<(Encoded, Reply)>,
    closing: bool,
}

/// The writer's counters ([`crate::StoreStats`] reads them).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) batches: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) failed_batches: AtomicU64,
    pub(crate) failed_writes: AtomicU64,
    pub(crate) reopens: AtomicU64,
    pub(crate) commit_micros: AtomicU64,
}

/// What the store handle and the writer thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    /// The open database; `None` after a failed commit until the writer reopens it.
    db: Mutex<Option<Database>>,
    pub(crate) incarnation: u64,
    pub(crate) stats: Stats,
    queue: Mutex<Queue>,
    wake: Condvar,
    /// Held (and released when dropped, after `db` is closed) for the store's life.
    _lock: std::fs::File,
}

impl Shared {
    pub(crate) fn new(dir: PathBuf, opened: crate::open::Opened) -> Self {
        Self {
            dir,
            db: Mutex::new(Some(opened.db)),
            incarnation: opened.incarnation,
            stats: Stats::default(),
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            _lock: opened.lock,
        }
    }

    /// The database slot (see [`Shared::db`]'s field).
    pub(crate) fn db(&self) -> MutexGuard<'_, Option<Database>> {
        self.db.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        // The queue stays consistent even if a holder panicked: it is only pushed to
        // and swapped out.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets the thread finish what is queued and stop.
    pub(crate) fn close(&self) {
        self.queue().closing = true;
        self.wake.notify_all();
    }
}

/// A submitted write: resolves once it is durable, or with why it is not.
///
/// Await it from async code, or call [`Pending::wait_blocking`] from a plain thread.
#[derive(Debug)]
#[must_use = "a write is only known to be durable once its Pending resolves"]
pub struct Pending {
    rx: oneshot::Receiver<Result<(), StoreError>>,
    dir: PathBuf,
}

impl Pending {
    /// Blocks the calling thread until the write is durable. Must not be called from
    /// an async context (await the `Pending` there).
    pub fn wait_blocking(self) -> Result<(), StoreError> {
        let dir = self.dir;
        self.rx
            .blocking_recv()
            .unwrap_or(Err(StoreError::Closed { dir }))
    }
}

impl Future for Pending {
    type Output = Result<(), StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(result)) => Poll::Ready(result),
            Poll::Ready(Err(_)) => Poll::Ready(Err(StoreError::Closed {
                dir: self.dir.clone(),
            })),
            Poll::Pending => Poll::Pending,
        }
    }
}

pub(crate) fn submit(shared: &Shared, write: Write) -> Pending {
    let (tx, rx) = oneshot::channel();
    let pending = Pending {
        rx,
        dir: shared.dir.clone(),
    };
    let write = match Encoded::new(write) {
        Ok(w) => w,
        Err(e) => {
            let _ = tx.send(Err(e));
            return pending;
        }
    };
    let mut q = shared.queue();
    if q.closing {
        // Dropping tx resolves the Pending with Closed.
        drop(tx);
    } else {
        q.writes.push((write, tx));
        if q.writes.len() == 1 {
            shared.wake.notify_one();
        }
    }
    pending
}

pub(crate) fn spawn(shared: Arc<Shared>) -> Result<std::thread::JoinHandle<()>, StoreError> {
    let dir = shared.dir.clone();
    std::thread::Builder::new()
        .name("dwara-store".to_owned())
        .spawn(move || run(&shared))
        .map_err(|source| StoreError::Io {
            dir,
            action: "start the store writer thread",
            source,
        })
}

fn run(shared: &Shared) {
    loop {
        let batch = {
            let mut q = shared.queue();
            while q.writes.is_empty() && !q.closing {
                q = shared.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
            if q.writes.is_empty() {
                return;
            }
            std::mem::take(&mut q.writes)
        };
        let (writes, replies): (Vec<Encoded>, Vec<Reply>) = batch.into_iter().unzip();
        let started = std::time::Instant::now();
        let outcome = commit_batch(shared, &writes);
        let stats = &shared.stats;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        stats.commit_micros.fetch_add(micros, Relaxed);
        let count = writes.len() as u64;
        if outcome.is_ok() {
            stats.batches.fetch_add(1, Relaxed);
            stats.writes.fetch_add(count, Relaxed);
        } else {
            stats.failed_batches.fetch_add(1, Relaxed);
            stats.failed_writes.fetch_add(count, Relaxed);
        }
        match outcome {
            Ok(()) => {
                tracing::trace!(
                    writes = writes.len(),
                    micros = started.elapsed().as_micros() as u64,
                    "store batch committed"
                );
                for reply in replies {
                    // A writer that stopped waiting does not need the answer.
                    let _ = reply.send(Ok(()));
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                let mut cause = error.to_string();
                let mut next = std::error::Error::source(&*error);
                while let Some(c) = next {
                    cause.push_str(": ");
                    cause.push_str(&c.to_string());
                    next = c.source();
                }
                tracing::error!(
                    dir = %shared.dir.display(),
                    writes = writes.len(),
                    error = %cause,
                    "store batch failed; its writes are not durable"
                );
                for reply in replies {
                    let _ = reply.send(Err(StoreError::WriteFailed {
                        source: error.clone(),
                    }));
                }
            }
        }
    }
}

/// Commits one batch, reopening the database first if the last commit failed.
///
/// redb refuses every transaction after a failed commit (an I/O error: a full disk,
/// say) until the database is closed and opened again, so a failure closes it here
/// and the next batch reopens it ([`crate::open::reopen`]): once the disk has room
/// again, writes succeed again without a restart. While the reopen fails, so does
/// every batch, each with the reopen's error.
fn commit_batch(shared: &Shared, writes: &[Encoded]) -> Result<(), StoreError> {
    let mut slot = shared.db();
    let db = match slot.take() {
        Some(db) => db,
        None => {
            let db = crate::open::reopen(&shared.dir)?;
            shared.stats.reopens.fetch_add(1, Relaxed);
            tracing::warn!(dir = %shared.dir.display(), "store reopened after a failed commit; writes are durable again");
            db
        }
    };
    match commit(&db, writes) {
        Ok(()) => {
            *slot = Some(db);
            Ok(())
        }
        Err(source) => {
            // Closed now (dropped), reopened by the next batch.
            drop(db);
            Err(StoreError::Database {
                dir: shared.dir.clone(),
                action: "commit registrations",
                source: Box::new(source),
            })
        }
    }
}

/// Applies `writes` in order in one write transaction and commits it durably.
fn commit(db: &Database, writes: &[Encoded]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(REGISTRATIONS)?;
        for write in writes {
            match write {
                Encoded::Put(key, value) => {
                    table.insert(&key[..], &value[..])?;
                }
                Encoded::Delete { prefix, ip, fqdn } => {
                    let mut doomed = Vec::new();
                    for row in table.range(&prefix[..]..)? {
                        let (key, _) = row?;
                        let key = key.value();
                        if !key.starts_with(prefix) {
                            break;
                        }
                        // Rows that do not decode are kept for the operator to see.
                        let Ok(r) = decode(key) else { continue };
                        if ip.is_none_or(|ip| ip == r.ip)
                            && fqdn.as_deref().is_none_or(|f| f == r.fqdn)
                        {
                            doomed.push(key.to_vec());
                        }
                    }
                    for key in doomed {
                        table.remove(&key[..])?;
                    }
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}
