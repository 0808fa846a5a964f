#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod open;
mod record;
mod writer;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

pub use error::StoreError;
pub use open::LOCK_NAME;
pub use record::{DEFAULT_PRIORITY, DEFAULT_WEIGHT, Registration, Service, decode, decode_row};
pub use writer::Pending;

/// The newest store format this build reads and the one it writes.
pub const FORMAT_VERSION: u64 = 1;

/// The store's file name inside the data directory.
pub const FILE_NAME: &str = "registrations.redb";

/// `"format"` → the store format version; `"starts"` → how many times it was opened.
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// Encoded [`Registration`] → empty.
const REGISTRATIONS: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("registrations");

/// One change to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Store this registration (a no-op if it is there already).
    Put(Registration),
    /// Remove the registrations of `id`, narrowed to one address and/or one fqdn
    /// when given (the fqdn compares as stored, byte for byte).
    Delete {
        /// The container id.
        id: String,
        /// Only this address.
        ip: Option<IpAddr>,
        /// Only this name.
        fqdn: Option<String>,
    },
}

/// A row of the store that does not decode.
#[derive(Debug)]
pub struct Undecodable {
    /// The row's key as stored.
    pub key: Vec<u8>,
    /// What is wrong with it.
    pub error: StoreError,
}

/// What [`Store::load`] read.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every registration, in key order (grouped by id).
    pub registrations: Vec<Registration>,
    /// Rows that do not decode; they stay in the file.
    pub undecodable: Vec<Undecodable>,
}

/// The writer's counters since the store was opened ([`Store::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreStats {
    /// Batches committed.
    pub batches: u64,
    /// Writes in the committed batches.
    pub writes: u64,
    /// Batches whose commit (or the reopen before it) failed.
    pub failed_batches: u64,
    /// Writes in the failed batches (each got the error).
    pub failed_writes: u64,
    /// Reopens after a failed commit that succeeded.
    pub reopens: u64,
    /// Time spent committing (and reopening), in seconds.
    pub commit_seconds: f64,
}

/// An open store: one redb file in a data directory, locked for this process,
/// and its group-commit writer thread. Dropping it finishes the queued writes.
#[derive(Debug)]
pub struct Store {
    shared: Arc<writer::Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Store {
    /// Opens the store in `dir`, creating the directory and an empty store if needed.
    ///
    /// Fails without writing anything when the directory cannot be created, another
    /// process has the store open, the file is not a readable dwara store, or it has
    /// a newer format.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        let opened = open::open(&dir)?;
        let shared = Arc::new(writer::Shared::new(dir, opened));
        let thread = writer::spawn(shared.clone())?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The store file.
    pub fn file(&self) -> PathBuf {
        self.shared.dir.join(FILE_NAME)
    }

    /// How many times this store has been opened, this opening included: larger than
    /// the number any earlier process got from the same data directory (it is
    /// committed before [`Store::open`] returns). A cluster node uses it as its
    /// gossip generation, so a restarted node always outranks its previous
    /// incarnation without consulting a clock.
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// The writer's counters so far.
    pub fn stats(&self) -> StoreStats {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.shared.stats;
        StoreStats {
            batches: s.batches.load(Relaxed),
            writes: s.writes.load(Relaxed),
            failed_batches: s.failed_batches.load(Relaxed),
            failed_writes: s.failed_writes.load(Relaxed),
            reopens: s.reopens.load(Relaxed),
            commit_seconds: s.commit_micros.load(Relaxed) as f64 / 1e6,
        }
    }

    /// Every stored registration, and the rows that do not decode.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let dir = &self.shared.dir;
        let db_err = |action| {
            move |e: redb::Error| StoreError::Database {
                dir: dir.clone(),
                action,
                source: Box::new(e),
            }
        };
        let slot = self.shared.db();
        let Some(db) = slot.as_ref() else {
            // Closed by a failed commit; the next write reopens it.
            return Err(StoreError::Closed { dir: dir.clone() });
        };
        let read = db
            .begin_read()
            .map_err(|e| db_err("begin a read")(e.into()))?;
        let table = match read.open_table(REGISTRATIONS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Loaded::default()),
            Err(e) => return Err(db_err("open the registrations table")(e.into())),
        };
        let mut loaded = Loaded::default();
        let rows = table
            .iter()
            .map_err(|e| db_err("read the registrations")(e.into()))?;
        for row in rows {
            let (key, value) = row.map_err(|e| db_err("read the registrations")(e.into()))?;
            let key = key.value();
            match decode_row(key, value.value()) {
                Ok(r) => loaded.registrations.push(r),
                Err(error) => loaded.undecodable.push(Undecodable {
                    key: key.to_vec(),
                    error,
                }),
            }
        }
        Ok(loaded)
    }

    /// Queues `write` behind every write submitted before it. The returned
    /// [`Pending`] resolves once the write is durable (or failed).
    ///
    /// Submitting never blocks on the disk, so a caller may submit under the same
    /// lock that orders its in-memory change.
    pub fn submit(&self, write: Write) -> Pending {
        writer::submit(&self.shared, write)
    }

    /// Waits for every queued write, then stops the writer thread and closes the file.
    pub fn close(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.close();
        if let Some(thread) = self.thread.take() {
            // The writer does not panic on its own; if it did, there is nothing to add.
            let _ = thread.join();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests;
