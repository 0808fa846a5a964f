//! Opening (or creating) the store file without ever overwriting one that exists.
//!
//! A new store is initialised under a temporary name (format version written and
//! committed), then hard-linked to [`FILE_NAME`]: linking fails if the name exists,
//! so two processes starting at once on an empty directory cannot replace each
//! other's store, and a store file that exists is always a complete one. Any file
//! found under [`FILE_NAME`] (empty, truncated, garbage) is opened as it is or
//! refused; it is never reinitialised.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{Database, DatabaseError, ReadableDatabase};

use crate::{FILE_NAME, FORMAT_VERSION, META, StoreError};

/// redb's page cache; the store is small (tens of bytes per registration).
const CACHE_BYTES: usize = 32 << 20;

/// Opens the store in `dir`, creating the directory and the store if needed.
pub(crate) fn open(dir: &Path) -> Result<Database, StoreError> {
    let io_err = |action| {
        move |source| StoreError::Io {
            dir: dir.to_path_buf(),
            action,
            source,
        }
    };
    std::fs::create_dir_all(dir).map_err(io_err("create it"))?;
    let file = dir.join(FILE_NAME);
    match std::fs::symlink_metadata(&file) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(db) = create(dir, &file)? {
                return Ok(db);
            }
            // Another process created it meanwhile: open theirs.
        }
        Err(e) => return Err(io_err("look for the store file")(e)),
    }
    let db = builder()
        .open(&file)
        .map_err(|e| open_error(dir, &file, e))?;
    check_format(dir, &file, &db)?;
    Ok(db)
}

fn builder() -> redb::Builder {
    let mut b = Database::builder();
    b.set_cache_size(CACHE_BYTES);
    // Verify every page on open: a file damaged outside redb (truncated, overwritten)
    // is then refused with an error instead of trusted. The store is small, so
    // reading it whole at start is cheap.
    b.set_check_integrity_on_open(true);
    b
}

/// Initialises a new store under a temporary name and links it into place.
/// `None` when a store file appeared meanwhile.
fn create(dir: &Path, file: &Path) -> Result<Option<Database>, StoreError> {
    let io_err = |action| {
        move |source| StoreError::Io {
            dir: dir.to_path_buf(),
            action,
            source,
        }
    };
    static ATTEMPT: AtomicU64 = AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("{FILE_NAME}.new.{}.{attempt}", std::process::id()));
    // A leftover of a crashed process with our pid: nobody else can be using it.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("remove a leftover temporary store")(e)),
    }
    let db = builder()
        .create(&tmp)
        .map_err(|e| open_error(dir, &tmp, e))?;
    let write_format = || -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(META)?.insert("format", FORMAT_VERSION)?;
        txn.open_table(crate::REGISTRATIONS)?;
        txn.commit()?;
        Ok(())
    };
    if let Err(source) = write_format() {
        drop(db);
        let _ = std::fs::remove_file(&tmp);
        return Err(StoreError::Database {
            dir: dir.to_path_buf(),
            action: "initialise a new store",
            source: Box::new(source),
        });
    }
    let linked = std::fs::hard_link(&tmp, file);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            sync_dir(dir).map_err(io_err("sync the directory"))?;
            tracing::info!(file = %file.display(), "created a new registration store");
            Ok(Some(db))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(io_err("link the new store into place")(e)),
    }
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
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
