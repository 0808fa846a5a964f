//! Durable registrations: what the HTTP API adds and removes, mirrored into a
//! [`dwara_store::Store`] before the answer is sent.
//!
//! Only the HTTP handlers come through here, so only this node's hand-made
//! registrations are stored, with their service (port, priority, weight) and check
//! (a stored check starts again when the store is loaded). The Docker updater and
//! replication write to the [`Db`] directly and rebuild their entries themselves.
//!
//! Ordering: a change is applied to the [`Db`] and queued for the store under one
//! lock, so the store sees changes in the order the database did; the handler then
//! waits for durability outside the lock, and concurrent handlers share the store's
//! group commit.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use dwara_store::{Registration, Service, Store, StoreError, Write};
use parking_lot::Mutex;

use crate::checks::{CheckKind, Checks};
use crate::error::{Error, Result};
use dwara_records::Db;
use dwara_records::ServicePort;

/// The store and the lock that orders changes into it.
#[derive(Debug)]
pub(crate) struct Durable {
    store: Store,
    order: Mutex<()>,
}

/// Why a change was not (durably) made.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request is wrong (bad name): nothing changed.
    Rejected(Error),
    /// The database changed but the store did not confirm it.
    NotStored(StoreError),
}

impl Durable {
    /// The data dir.
    pub(crate) fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// Opens the store in `dir` and loads its registrations into the database, starting
    /// the checks of those stored with one.
    pub(crate) async fn open(dir: &Path, checks: &Checks) -> Result<Self> {
        let dir = dir.to_path_buf();
        let (store, loaded) = tokio::task::spawn_blocking(move || {
            let store = Store::open(&dir)?;
            let loaded = store.load()?;
            Ok::<_, StoreError>((store, loaded))
        })
        .await
        .map_err(|e| Error::Io {
            context: "opening the registration store".to_owned(),
            source: std::io::Error::other(e),
        })??;
        if !loaded.undecodable.is_empty() {
            let keys: Vec<String> = loaded
                .undecodable
                .iter()
                .map(|u| format!("{} ({})", u.key.escape_ascii(), chain(&u.error)))
                .collect();
            tracing::error!(
                dir = %store.dir().display(),
                lost = loaded.undecodable.len(),
                keys = ?keys,
                "registrations in the store do not decode and were not loaded (kept in the file)"
            );
        }
        let mut skipped = 0;
        for r in &loaded.registrations {
            let service = match r.service.as_ref().map(stored_service).transpose() {
                Ok(s) => s,
                // Not a service this build accepts: the name is still loaded.
                Err(e) => {
                    tracing::warn!(id = %r.id, ip = %r.ip, fqdn = %r.fqdn, error = %chain(&e),
                        "stored service not loaded; the registration is, without it");
                    None
                }
            };
            let check = match r.check.as_deref().map(CheckKind::parse).transpose() {
                Ok(c) => c,
                // Not a check this build runs: the name is loaded, unchecked.
                Err(e) => {
                    tracing::warn!(id = %r.id, ip = %r.ip, fqdn = %r.fqdn, error = %chain(&e),
                        "stored check not loaded; the registration is, without it");
                    None
                }
            };
            let added = match checks.register(&r.id, r.ip, &r.fqdn, service.as_ref(), check) {
                // A check whose service did not load: the name without either.
                Err(Error::CheckWithoutPort { .. }) => {
                    checks.register(&r.id, r.ip, &r.fqdn, None, None)
                }
                other => other,
            };
            if let Err(e) = added {
                skipped += 1;
                tracing::warn!(id = %r.id, ip = %r.ip, fqdn = %r.fqdn, error = %chain(&e),
                    "stored registration not loaded");
            }
        }
        tracing::info!(
            dir = %store.dir().display(),
            loaded = loaded.registrations.len() - skipped,
            skipped,
            "registrations loaded from the store"
        );
        Ok(Self {
            store,
            order: Mutex::new(()),
        })
    }

    /// The store's count of openings, this one included.
    pub(crate) fn incarnation(&self) -> u64 {
        self.store.incarnation()
    }

    /// The store writer's counters.
    pub(crate) fn stats(&self) -> dwara_store::StoreStats {
        self.store.stats()
    }
}

/// A stored service as the database takes it (checked again: the store keeps bytes).
fn stored_service(s: &Service) -> Result<ServicePort> {
    let port = std::num::NonZeroU16::new(s.port).ok_or(dwara_records::Error::InvalidPort {
        input: s.port.to_string(),
    })?;
    Ok(ServicePort::new(&s.name, port)?
        .with_priority(s.priority)
        .with_weight(s.weight))
}

/// `e` and its causes on one line, `: `-separated.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

fn log_not_stored(e: &StoreError, what: &str, id: &str) {
    tracing::error!(id, error = %chain(e), "{what} applied in memory but not stored");
}

/// What a `PUT` registers.
pub(crate) struct Add<'a> {
    pub(crate) id: &'a str,
    pub(crate) ip: IpAddr,
    pub(crate) fqdn: &'a str,
    pub(crate) service: Option<&'a ServicePort>,
    pub(crate) check: Option<CheckKind>,
}

/// `Checks::register` (the database, and the entry's checker), then (with a store)
/// the durable put.
pub(crate) async fn add(
    db: &Db,
    checks: &Checks,
    durable: Option<&Arc<Durable>>,
    add: Add<'_>,
) -> Result<(), Failure> {
    let Add {
        id,
        ip,
        fqdn,
        service,
        check,
    } = add;
    let Some(d) = durable else {
        return checks
            .register(id, ip, fqdn, service, check)
            .map_err(Failure::Rejected);
    };
    // The form the database keeps, so that deletes narrowed to a name match it.
    let fqdn = db
        .domain()
        .normalize_member(fqdn)
        .map_err(|e| Failure::Rejected(e.into()))?;
    let pending = {
        let _order = d.order.lock();
        checks
            .register(id, ip, &fqdn, service, check)
            .map_err(Failure::Rejected)?;
        // Also when the entry was live already (e.g. made by the Docker updater):
        // it is now a hand-made registration too.
        let service = service.map(|s| Service {
            priority: s.priority(),
            weight: s.weight(),
            ..Service::new(s.service(), s.port())
        });
        d.store.submit(Write::Put(
            Registration::new(id, ip, fqdn)
                .with_service(service)
                .with_check(check.map(|c| c.as_str().to_owned())),
        ))
    };
    pending.await.map_err(|e| {
        log_not_stored(&e, "registration", id);
        Failure::NotStored(e)
    })
}

/// `Db::remove` and the checks of what it removed, then (with a store) the durable
/// delete with the same narrowing.
pub(crate) async fn remove(
    db: &Db,
    checks: &Checks,
    durable: Option<&Arc<Durable>>,
    id: &str,
    ip: Option<IpAddr>,
    fqdn: Option<&str>,
) -> Result<(), Failure> {
    let Some(d) = durable else {
        db.remove(id, ip, fqdn);
        checks.forget(id, ip, fqdn);
        return Ok(());
    };
    let fqdn = match fqdn.map(|f| db.domain().normalize_member(f)) {
        None => None,
        Some(Ok(f)) => Some(f),
        // A name outside the domain matches nothing, here or in the store.
        Some(Err(_)) => return Ok(()),
    };
    let pending = {
        let _order = d.order.lock();
        db.remove(id, ip, fqdn.as_deref());
        checks.forget(id, ip, fqdn.as_deref());
        d.store.submit(Write::Delete {
            id: id.to_owned(),
            ip,
            fqdn,
        })
    };
    pending.await.map_err(|e| {
        log_not_stored(&e, "removal", id);
        Failure::NotStored(e)
    })
}
