//! Unit tests of the store against real files in temporary directories.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTableMetadata};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn reg(id: &str, addr: &str, fqdn: &str) -> Registration {
    Registration::new(id, ip(addr), fqdn)
}

fn put(store: &Store, r: &Registration) {
    store.submit(Write::Put(r.clone())).wait_blocking().unwrap();
}

fn delete(store: &Store, id: &str, ip: Option<&str>, fqdn: Option<&str>) {
    store
        .submit(Write::Delete {
            id: id.to_owned(),
            ip: ip.map(|s| s.parse().unwrap()),
            fqdn: fqdn.map(str::to_owned),
        })
        .wait_blocking()
        .unwrap();
}

fn stored(dir: &Path) -> BTreeSet<Registration> {
    let store = Store::open(dir).unwrap();
    let loaded = store.load().unwrap();
    assert!(loaded.undecodable.is_empty(), "{:?}", loaded.undecodable);
    loaded.registrations.into_iter().collect()
}

#[test]
fn puts_and_deletes_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let a1 = reg("a", "10.0.0.1", "x.weave.local.");
    let a2 = reg("a", "10.0.0.2", "x.weave.local.");
    let a3 = reg("a", "10.0.0.1", "y.weave.local.");
    let a4 = reg("a", "fd00::1", "y.weave.local.");
    let ab = reg("ab", "10.0.0.1", "x.weave.local.");
    let b = reg("b", "10.0.0.9", "z.weave.local.");
    {
        let store = Store::open(dir.path()).unwrap();
        for r in [&a1, &a2, &a3, &a4, &ab, &b, &b] {
            put(&store, r);
        }
    }
    assert_eq!(
        stored(dir.path()),
        BTreeSet::from([
            a1.clone(),
            a2.clone(),
            a3.clone(),
            a4.clone(),
            ab.clone(),
            b.clone()
        ])
    );
    {
        let store = Store::open(dir.path()).unwrap();
        // Narrowed to ip and fqdn, to ip only, then to fqdn only.
        delete(&store, "a", Some("10.0.0.1"), Some("x.weave.local."));
        assert_eq!(
            store.load().unwrap().registrations.len(),
            5,
            "only a1 is gone"
        );
        delete(&store, "a", Some("10.0.0.2"), None);
        delete(&store, "a", None, Some("y.weave.local."));
        // Nothing matches: fine.
        delete(&store, "nobody", None, None);
    }
    // "ab" shares a prefix of bytes with "a" but is another id.
    assert_eq!(stored(dir.path()), BTreeSet::from([ab.clone(), b.clone()]));
    {
        let store = Store::open(dir.path()).unwrap();
        delete(&store, "b", None, None);
        delete(&store, "ab", None, None);
    }
    assert_eq!(stored(dir.path()), BTreeSet::new());
}

#[test]
fn writes_apply_in_submission_order() {
    let dir = tempfile::tempdir().unwrap();
    let r = reg("c", "10.0.0.1", "x.weave.local.");
    {
        let store = Store::open(dir.path()).unwrap();
        // Submitted back to back, so they very likely share one batch: order matters.
        let pendings = vec![
            store.submit(Write::Put(r.clone())),
            store.submit(Write::Delete {
                id: "c".to_owned(),
                ip: None,
                fqdn: None,
            }),
            store.submit(Write::Put(r.clone())),
            store.submit(Write::Delete {
                id: "c".to_owned(),
                ip: Some(r.ip),
                fqdn: None,
            }),
            store.submit(Write::Put(r.clone())),
        ];
        for p in pendings {
            p.wait_blocking().unwrap();
        }
    }
    assert_eq!(stored(dir.path()), BTreeSet::from([r]));
}

#[test]
fn concurrent_writers_are_all_durable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        std::thread::scope(|s| {
            for t in 0..32 {
                let store = &store;
                s.spawn(move || {
                    for i in 0..50 {
                        let r = reg(&format!("c{t}-{i}"), "10.0.0.1", "x.weave.local.");
                        put(store, &r);
                    }
                });
            }
        });
    }
    assert_eq!(stored(dir.path()).len(), 32 * 50);
}

#[test]
fn churn_does_not_grow_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(FILE_NAME);
    let store = Store::open(dir.path()).unwrap();
    let round = |n: u32| {
        let pendings: Vec<Pending> = (0..1000)
            .map(|i| {
                store.submit(Write::Put(reg(
                    &format!("c{n}-{i}"),
                    "10.0.0.1",
                    "x.weave.local.",
                )))
            })
            .collect();
        for p in pendings {
            p.wait_blocking().unwrap();
        }
        let pendings: Vec<Pending> = (0..1000)
            .map(|i| {
                store.submit(Write::Delete {
                    id: format!("c{n}-{i}"),
                    ip: None,
                    fqdn: None,
                })
            })
            .collect();
        for p in pendings {
            p.wait_blocking().unwrap();
        }
    };
    for n in 0..3 {
        round(n);
    }
    let early = std::fs::metadata(&file).unwrap().len();
    for n in 3..30 {
        round(n);
    }
    let late = std::fs::metadata(&file).unwrap().len();
    assert!(store.load().unwrap().registrations.is_empty());
    assert!(
        late <= early * 2,
        "27 more rounds of 1000 puts and deletes grew the file from {early} to {late} bytes"
    );
}

#[test]
fn a_second_open_of_one_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.path().display().to_string()) && msg.contains("in use"),
        "{msg}"
    );
    drop(first);
    Store::open(dir.path()).unwrap();
}

#[test]
fn every_opening_gets_a_larger_incarnation() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    assert_eq!(first.incarnation(), 1);
    // A refused opening is not counted.
    assert!(Store::open(dir.path()).is_err());
    put(&first, &reg("c1", "10.0.0.1", "a.weave.local."));
    drop(first);
    let mut seen = vec![1];
    for _ in 0..3 {
        let store = Store::open(dir.path()).unwrap();
        seen.push(store.incarnation());
        // Counting starts does not disturb the registrations.
        assert_eq!(store.load().unwrap().registrations.len(), 1);
    }
    assert_eq!(seen, [1, 2, 3, 4]);
}

#[test]
fn racing_first_opens_end_with_one_store() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let results: Vec<Result<Store, StoreError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| Store::open(dir.path())))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut winners = 0;
        for r in &results {
            match r {
                Ok(store) => {
                    winners += 1;
                    put(store, &reg("c", "10.0.0.1", "x.weave.local."));
                }
                Err(StoreError::Locked { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(winners, 1);
        drop(results);
        assert_eq!(stored(dir.path()).len(), 1);
        // No temporary file is left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [LOCK_NAME, FILE_NAME]);
    }
}

/// A store with one registration, closed; returns the store file's path.
fn one_registration(dir: &Path) -> PathBuf {
    let store = Store::open(dir).unwrap();
    put(&store, &reg("c", "10.0.0.1", "x.weave.local."));
    drop(store);
    dir.join(FILE_NAME)
}

fn assert_refused_untouched(dir: &Path, bytes: &[u8], want: &str) {
    let file = dir.join(FILE_NAME);
    std::fs::write(&file, bytes).unwrap();
    let err = Store::open(dir).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{want}: {err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&file.display().to_string()) && msg.contains("damaged"),
        "{want}: {msg}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "{want}: file changed");
}

#[test]
fn damaged_files_are_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_registration(dir.path());
    let good = std::fs::read(&file).unwrap();
    assert_refused_untouched(dir.path(), b"", "empty file");
    assert_refused_untouched(dir.path(), b"this is not a database\n", "garbage");
    assert_refused_untouched(dir.path(), &vec![0xa5; good.len()], "noise");
    for cut in [1, 9, 100, 511, 4096, good.len() / 2, good.len() - 1] {
        assert_refused_untouched(dir.path(), &good[..cut], &format!("truncated to {cut}"));
    }
}

#[test]
fn a_newer_format_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_registration(dir.path());
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert("format", FORMAT_VERSION + 1)
            .unwrap();
        txn.commit().unwrap();
    }
    let before = std::fs::read(&file).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(std::fs::read(&file).unwrap(), before, "file changed");
    assert!(
        matches!(
            err,
            StoreError::NewerFormat {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer"), "{err}");
    // The data is still there.
    let db = redb::Database::open(&file).unwrap();
    let read = db.begin_read().unwrap();
    assert_eq!(read.open_table(REGISTRATIONS).unwrap().len().unwrap(), 1);
}

#[test]
fn a_foreign_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(FILE_NAME);
    {
        let db = redb::Database::create(&file).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(REGISTRATIONS).unwrap();
        txn.commit().unwrap();
    }
    let err = Store::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err:?}");
}

#[test]
fn undecodable_rows_are_reported_and_the_rest_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_registration(dir.path());
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(REGISTRATIONS)
            .unwrap()
            .insert(&b"\x01\x00\x00\x00\x01c\x09junk"[..], &b""[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let store = Store::open(dir.path()).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(
        loaded.registrations,
        vec![reg("c", "10.0.0.1", "x.weave.local.")]
    );
    assert_eq!(loaded.undecodable.len(), 1);
    assert_eq!(loaded.undecodable[0].key, b"\x01\x00\x00\x00\x01c\x09junk");
    // A delete of that id removes what decodes and keeps the rest for inspection.
    delete(&store, "c", None, None);
    let loaded = store.load().unwrap();
    assert!(loaded.registrations.is_empty());
    assert_eq!(loaded.undecodable.len(), 1);
}

#[test]
fn unencodable_writes_fail_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let err = store
        .submit(Write::Put(reg("c", "10.0.0.1", "")))
        .wait_blocking()
        .unwrap_err();
    assert!(matches!(err, StoreError::Unencodable { .. }), "{err:?}");
}

#[test]
fn a_dir_that_cannot_be_created_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"").unwrap();
    let err = Store::open(blocker.join("sub")).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("sub"), "{err}");
}

/// A store file as a crash leaves it (never closed, so redb must repair it), with
/// `n` registrations.
fn crashed_store(dir: &Path, n: u32) -> Vec<u8> {
    let file = dir.join(FILE_NAME);
    drop(Store::open(dir).unwrap());
    let db = redb::Database::open(&file).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(REGISTRATIONS).unwrap();
        for i in 0..n {
            let key = reg(&format!("c{i}"), "10.0.0.1", "x.weave.local.")
                .encode()
                .unwrap();
            table.insert(&key[..], &b""[..]).unwrap();
        }
    }
    txn.commit().unwrap();
    // Never closed: the file keeps redb's "recovery required" mark (the leaked
    // handle also keeps redb's own lock, on this inode only).
    std::mem::forget(db);
    std::fs::read(&file).unwrap()
}

#[test]
fn a_crashed_store_is_repaired_and_opens() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = crashed_store(dir.path(), 100);
    // Put the bytes on a fresh inode, as a restarted process would find them.
    let file = dir.path().join(FILE_NAME);
    std::fs::remove_file(&file).unwrap();
    std::fs::write(&file, &bytes).unwrap();
    assert_eq!(stored(dir.path()).len(), 100);
}

#[test]
fn a_crashed_and_damaged_store_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let good = crashed_store(dir.path(), 100);
    std::fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
    for cut in [100, 4096, good.len() / 2] {
        assert_refused_untouched(dir.path(), &good[..cut], &format!("truncated to {cut}"));
    }
    // Cutting only the last page may take nothing but free space: then the store
    // opens, but with every registration, never with fewer.
    let cut = good.len() - 4096;
    std::fs::write(dir.path().join(FILE_NAME), &good[..cut]).unwrap();
    match Store::open(dir.path()) {
        Ok(store) => assert_eq!(store.load().unwrap().registrations.len(), 100),
        Err(err) => {
            assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
            let file = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
            assert_eq!(file, &good[..cut], "file changed");
        }
    }
    let mut flipped = good.clone();
    for b in &mut flipped[4096..] {
        *b ^= 0x5a;
    }
    assert_refused_untouched(dir.path(), &flipped, "all pages after the header flipped");
}

/// A tmpfs of `bytes` mounted on a fresh directory, unmounted on drop. `None`
/// when this process may not mount (not root).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(bytes: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        if !status.success() {
            let uid = std::process::Command::new("id").arg("-u").output().unwrap();
            assert_ne!(
                String::from_utf8_lossy(&uid.stdout).trim(),
                "0",
                "mounting a tmpfs failed as root"
            );
            return None;
        }
        Some(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk is full; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// A disk that fills up fails the commits (and says so to every writer); once
/// space is back, the store reopens itself and takes writes again, without a
/// restart. Every write that was acknowledged is stored, and none that failed.
#[test]
fn a_full_disk_fails_writes_and_the_store_recovers_when_space_is_back() {
    let Some(disk) = SmallDisk::mount(8 << 20) else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    let data = disk.path().join("data");
    let mut acked = BTreeSet::new();
    let mut failed = 0;
    {
        let store = Store::open(&data).unwrap();
        let mut n = 0u32;
        let mut write = |store: &Store, acked: &mut BTreeSet<Registration>| {
            n += 1;
            let r = reg(
                &format!("c{n}"),
                &format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255),
                &format!("n{n}.weave.local."),
            );
            let ok = store.submit(Write::Put(r.clone())).wait_blocking().is_ok();
            if ok {
                acked.insert(r);
            }
            ok
        };
        for _ in 0..20 {
            assert!(write(&store, &mut acked), "a write before the disk is full");
        }
        let filler = disk.fill();
        // Writes fail while the disk is full (redb may still fit a few in pages it
        // has; bounded so the test cannot spin).
        for _ in 0..2000 {
            if !write(&store, &mut acked) {
                failed += 1;
                if failed == 3 {
                    break;
                }
            }
        }
        assert_eq!(failed, 3, "writes kept succeeding on a full disk");
        std::fs::remove_file(filler).unwrap();
        for _ in 0..20 {
            assert!(
                write(&store, &mut acked),
                "a write after space came back failed: the store did not recover"
            );
        }
        let stats = store.stats();
        assert_eq!(stats.failed_batches, 3, "{stats:?}");
        assert_eq!(stats.failed_writes, 3, "{stats:?}");
        assert_eq!(stats.reopens, 1, "{stats:?}");
        assert_eq!(stats.writes, acked.len() as u64, "{stats:?}");
    }
    assert_eq!(
        stored(&data),
        acked,
        "acknowledged writes, and only those, are stored"
    );
}

#[test]
fn services_survive_a_reopen_and_a_put_replaces_them() {
    let dir = tempfile::tempdir().unwrap();
    let http = |port| Some(Service::new("_http._tcp", port));
    let plain = reg("c1", "10.0.0.1", "a.weave.local.");
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, &plain);
        put(&store, &plain.clone().with_service(http(80)));
        put(
            &store,
            &reg("c2", "10.0.0.2", "a.weave.local.").with_service(http(81)),
        );
    }
    assert_eq!(
        stored(dir.path()),
        BTreeSet::from([
            plain.clone().with_service(http(80)),
            reg("c2", "10.0.0.2", "a.weave.local.").with_service(http(81)),
        ]),
        "one row per registration; the last put's service"
    );
    // A priority and weight survive a reopen too, and a put without them resets them.
    let canary = plain.clone().with_service(Some(Service {
        priority: 1,
        weight: 9,
        ..Service::new("_http._tcp", 80)
    }));
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, &canary);
    }
    assert!(stored(dir.path()).contains(&canary));
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, &plain);
        delete(&store, "c2", None, None);
    }
    assert_eq!(stored(dir.path()), BTreeSet::from([plain]));
}

#[test]
fn rows_written_before_priorities_load_with_the_defaults_beside_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = one_registration(dir.path());
    // Rows as builds before priority and weight wrote them, byte for byte: no
    // service, a service (value version 1), a service and a check (version 2).
    let key = |id: &[u8]| {
        [
            &b"\x01\x00\x00\x00\x02"[..],
            id,
            b"\x04\x0a\x00\x00\x07a.weave.local.",
        ]
        .concat()
    };
    {
        let db = redb::Database::open(&file).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(REGISTRATIONS).unwrap();
            table.insert(&key(b"o1")[..], &b""[..]).unwrap();
            table
                .insert(&key(b"o2")[..], &b"\x01\x00\x50_http._tcp"[..])
                .unwrap();
            table
                .insert(&key(b"o3")[..], &b"\x02\x00\x51\x03tcp_http._tcp"[..])
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let ranked = reg("n1", "10.0.0.8", "a.weave.local.").with_service(Some(Service {
        priority: 1,
        weight: 9,
        ..Service::new("_http._tcp", 82)
    }));
    {
        let store = Store::open(dir.path()).unwrap();
        put(&store, &ranked);
    }
    let old = |id| reg(id, "10.0.0.7", "a.weave.local.");
    assert_eq!(
        stored(dir.path()),
        BTreeSet::from([
            reg("c", "10.0.0.1", "x.weave.local."),
            old("o1"),
            old("o2").with_service(Some(Service::new("_http._tcp", 80))),
            old("o3")
                .with_service(Some(Service::new("_http._tcp", 81)))
                .with_check(Some("tcp".to_owned())),
            ranked,
        ])
    );
}
