//! The one error type of `dwara-store`.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// What went wrong with the store, and with which file.
///
/// The messages do not repeat their cause: it is the error's `source()`, so print
/// the chain (`{:#}` with anyhow) to see it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The data directory or a file in it could not be created, read or written.
    #[error("data dir {}: cannot {action}", dir.display())]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Another process (another `dwara`) has the store open.
    #[error("data dir {} is in use by another process (it holds {})", dir.display(), file.display())]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The store file.
        file: PathBuf,
    },
    /// The store file is not a readable database (truncated, garbage, corrupt).
    /// Nothing was written to it.
    #[error("data dir {}: the store {} is damaged and was left as it is", dir.display(), file.display())]
    Corrupt {
        /// The data directory.
        dir: PathBuf,
        /// The store file.
        file: PathBuf,
        /// What the database engine found.
        #[source]
        source: Box<redb::Error>,
    },
    /// The store file is a database but not one this program wrote (no format
    /// version in it).
    #[error("data dir {}: {} is not a dwara store (no format version); left as it is", dir.display(), file.display())]
    NotAStore {
        /// The data directory.
        dir: PathBuf,
        /// The store file.
        file: PathBuf,
    },
    /// The store was written by a newer `dwara` in a format this one cannot read.
    #[error(
        "data dir {}: the store {} has format {found}, newer than format {supported} this dwara reads; \
         left as it is (run a newer dwara or another --data-dir)",
        dir.display(), file.display()
    )]
    NewerFormat {
        /// The data directory.
        dir: PathBuf,
        /// The store file.
        file: PathBuf,
        /// The format version in the file.
        found: u64,
        /// The newest format this build reads.
        supported: u64,
    },
    /// A database operation on an open store failed.
    #[error("data dir {}: cannot {action}", dir.display())]
    Database {
        /// The data directory.
        dir: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The database engine's error.
        #[source]
        source: Box<redb::Error>,
    },
    /// A batch of writes could not be made durable; every write of the batch failed
    /// with this (shared) cause.
    #[error("the change was not stored")]
    WriteFailed {
        /// Why the batch failed.
        #[source]
        source: Arc<StoreError>,
    },
    /// The store was closed before the write was made durable.
    #[error("data dir {}: the store is closed", dir.display())]
    Closed {
        /// The data directory.
        dir: PathBuf,
    },
    /// A stored record does not decode.
    #[error("bad record: {reason}")]
    BadRecord {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A registration cannot be encoded as a record.
    #[error("cannot store the registration: {reason}")]
    Unencodable {
        /// Why.
        reason: &'static str,
    },
}
