//! Opening (or creating) the store without ever writing to a file it then refuses.
//!
//! 1. A lock file ([`LOCK_NAME`]) in the data directory is locked exclusively for
//!    the life of the store: a second process gets [`StoreError::Locked`].
//! 2. Under that lock the store file is copied to a temporary name and the copy is
//!    opened with redb's integrity check (which also repairs what a crash left
//!    behind, as redb always does after an unclean shutdown) and its format version
//!    checked. Only when all of that succeeds is the copy renamed over the store
//!    file. Any failure removes the copy: the store file is left byte for byte as it
//!    was (a truncated or garbage file is refused, never reinitialised; redb's
//!    repair, which writes, never runs on the original).
//! 3. A missing store file is created the same way: initialised under the
//!    temporary name with its format version, then renamed into place, so a store
//!    file that exists is always a complete one.
//!
//! 4. Before it is put in place, the opened copy counts this start: the `"starts"`
//!    row of the meta table is incremented and committed, so every opening of a data
//!    directory gets a number larger than any earlier one, crashes included
//!    ([`crate::Store::incarnation`]).
//!
//! The copy costs one read and write of the file per start; the store holds tens of
//! bytes per registration.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use redb::{Database, DatabaseError, ReadableDatabase, ReadableTable};

use crate::{FILE_NAME, FORMAT_VERSION, META, REGISTRATIONS, StoreError};

/// The lock file's name inside the data directory.
pub const LOCK_NAME: &str = "LOCK";

/// redb's page cache; the store is small (tens of bytes per registration).
const CACHE_BYTES: usize = 32 << 20;

/// An open store file and the held directory lock.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) db: Database,
    pub(crate) lock: File,
    /// How many times the store has been opened, this time included.
    pub(crate) incarnation: u64,
}

fn io_err(dir: &Path, action: &'static str) -> impl FnOnce(io::Error) -> StoreError {
    move |source| StoreError::Io {
        dir: dir.to_path_buf(),
        action,
        source,
    }
}

/// Opens the store in `dir`, creating the directory and the store if needed.
pub(crate) fn open(dir: &Path) -> Result<Opened, StoreError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir, "create it"))?;
    let lock = lock(dir)?;
    let file = dir.join(FILE_NAME);
    let tmp = opening_path(dir);
    // A leftover of a process that died while opening; we hold the lock, so it is
    // nobody's.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(dir, "remove a leftover temporary store")(e)),
    }
    let exists = match std::fs::symlink_metadata(&file) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_err(dir, "look for the store file")(e)),
    };
    let prepared = if exists {
        open_copy(dir, &file, &tmp)
    } else {
        create(dir, &tmp)
    };
    let prepared = prepared.and_then(|db| {
        let incarnation = count_start(dir, &db)?;
        Ok((db, incarnation))
    });
    let (db, incarnation) = match prepared {
        Ok(opened) => opened,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let db = install(dir, db, &tmp, &file)?;
    if !exists {
        tracing::info!(file = %file.display(), "created a new registration store");
    }
    Ok(Opened {
        db,
        lock,
        incarnation,
    })
}

/// Puts the opened copy `tmp` in place of `file` (synced, renamed, the directory
/// synced); on failure removes the copy and leaves `file` as it was.
fn install(dir: &Path, db: Database, tmp: &Path, file: &Path) -> Result<Database, StoreError> {
    let installed = File::open(tmp)
        .and_then(|f| f.sync_all())
        .and_then(|()| std::fs::rename(tmp, file))
        .and_then(|()| File::open(dir)?.sync_all());
    match installed {
        Ok(()) => Ok(db),
        Err(e) => {
            drop(db);
            let _ = std::fs::remove_file(tmp);
            Err(io_err(dir, "put the opened store in place")(e))
        }
    }
}

/// Opens the store file of `dir` again, in this process, under the lock it already
/// holds: after a failed commit redb refuses every later transaction until the
/// database is reopened. The same copy, check and rename as [`open`] (so a file a
/// failed write left damaged is repaired on the copy, or refused), without counting
/// a start: it is the same incarnation. Needs room for the copy.
pub(crate) fn reopen(dir: &Path) -> Result<Database, StoreError> {
    let file = dir.join(FILE_NAME);
    let tmp = opening_path(dir);
    let _ = std::fs::remove_file(&tmp);
    match open_copy(dir, &file, &tmp) {
        Ok(db) => install(dir, db, &tmp, &file),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Where the store is copied and opened before it replaces the store file.
fn opening_path(dir: &Path) -> PathBuf {
    dir.join(format!("{FILE_NAME}.opening"))
}

fn lock(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK_NAME);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err(dir, "open the lock file"))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(TryLockError::WouldBlock) => Err(StoreError::Locked {
            dir: dir.to_path_buf(),
            file: path,
        }),
        Err(TryLockError::Error(e)) => Err(io_err(dir, "lock the lock file")(e)),
    }
}

fn builder() -> redb::Builder {
    let mut b = Database::builder();
    b.set_cache_size(CACHE_BYTES);
    // Verify every page on open: a file damaged outside redb (truncated, overwritten)
    // is then refused with an error instead of trusted.
    b.set_check_integrity_on_open(true);
    b
}

/// A new, empty store with its format version, at `tmp`.
fn create(dir: &Path, tmp: &Path) -> Result<Database, StoreError> {
    let db = builder().create(tmp).map_err(|e| open_error(dir, tmp, e))?;
    let write_format = || -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(META)?.insert("format", FORMAT_VERSION)?;
        txn.open_table(REGISTRATIONS)?;
        txn.commit()?;
        Ok(())
    };
    write_format().map_err(|source| StoreError::Database {
        dir: dir.to_path_buf(),
        action: "initialise a new store",
        source: Box::new(source),
    })?;
    Ok(db)
}

/// The store `file` copied to `tmp` and opened there, checked and repaired.
fn open_copy(dir: &Path, file: &Path, tmp: &Path) -> Result<Database, StoreError> {
    std::fs::copy(file, tmp).map_err(io_err(dir, "copy the store file to open it"))?;
    // Errors name the store file: the copy is an implementation detail.
    let db = builder().open(tmp).map_err(|e| open_error(dir, file, e))?;
    check_format(dir, file, &db)?;
    Ok(db)
}

/// Increments and commits the `"starts"` row; returns its new value.
fn count_start(dir: &Path, db: &Database) -> Result<u64, StoreError> {
    let bump = || -> Result<u64, redb::Error> {
        let txn = db.begin_write()?;
        let starts = {
            let mut meta = txn.open_table(META)?;
            let previous = meta.get("starts")?.map_or(0, |v| v.value());
            let starts = previous.saturating_add(1);
            meta.insert("starts", starts)?;
            starts
        };
        txn.commit()?;
        Ok(starts)
    };
    bump().map_err(|source| StoreError::Database {
        dir: dir.to_path_buf(),
        action: "count this start",
        source: Box::new(source),
    })
}

fn open_error(dir: &Path, file: &Path, e: DatabaseError) -> StoreError {
    let (dir, file) = (dir.to_path_buf(), file.to_path_buf());
    match e {
        DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { dir, file },
        // Permission denied and the like are about access, not the contents.
        DatabaseError::Storage(redb::StorageError::Io(source))
            if !matches!(
                source.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ) =>
        {
            StoreError::Io {
                dir,
                action: "open the store file",
                source,
            }
        }
        other => StoreError::Corrupt {
            dir,
            file,
            source: Box::new(other.into()),
        },
    }
}

fn check_format(dir: &Path, file: &Path, db: &Database) -> Result<(), StoreError> {
    let (dir, file): (PathBuf, PathBuf) = (dir.to_path_buf(), file.to_path_buf());
    let corrupt = |e: redb::Error| StoreError::Corrupt {
        dir: dir.clone(),
        file: file.clone(),
        source: Box::new(e),
    };
    let read = db.begin_read().map_err(|e| corrupt(e.into()))?;
    let meta = match read.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Err(StoreError::NotAStore { dir, file });
        }
        Err(e) => return Err(corrupt(e.into())),
    };
    let format = meta.get("format").map_err(|e| corrupt(e.into()))?;
    match format.map(|v| v.value()) {
        None => Err(StoreError::NotAStore { dir, file }),
        Some(found) if found > FORMAT_VERSION => Err(StoreError::NewerFormat {
            dir,
            file,
            found,
            supported: FORMAT_VERSION,
        }),
        Some(_) => Ok(()),
    }
}
