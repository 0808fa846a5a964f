//! Health checks this node runs on the entries registered over HTTP with
//! `check=tcp`.
//!
//! A checked entry starts [`Health::Starting`] (not answered until its first
//! verdict). Every [`CheckConfig::interval`] its checker connects over TCP to the
//! entry's address and port, waiting at most half the interval: a connection that is
//! accepted makes the entry [`Health::Healthy`]; [`CheckConfig::misses`] failures in
//! a row make it [`Health::Unhealthy`]; the next success makes it healthy again. The
//! verdict is set on the entry ([`Db`]), so it is replicated like any other change
//! and every cluster node answers alike; only the node that took the registration
//! runs its check.
//!
//! Each check is a task of its own; at most [`CheckConfig::max_concurrent`] connects
//! are in flight at once, so many entries share the work without one slow connect
//! holding up the others, and a node with more checks than that can connect to
//! within a timeout checks them less often rather than piling up connections.
//!
//! A checker stops when its check is removed (`PUT` without `check`, which leaves
//! the entry unchecked), when its entry is deleted, or when the name server stops;
//! one whose entry is no longer live here (removed by other means) stops at its next
//! tick.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::metrics::{Metrics, Probe};
use dwara_records::Db;
use dwara_records::Health;
use dwara_records::ServicePort;

/// The default time between two checks of an entry (`--check-interval-ms`).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// The default number of failed checks in a row that make an entry unhealthy
/// (`--check-misses`).
pub const DEFAULT_CHECK_MISSES: u32 = 2;
/// The default number of connects in flight at once, over all checks.
pub const DEFAULT_MAX_CONCURRENT_CHECKS: usize = 256;

/// The kind of check an entry registered over HTTP carries (`check=tcp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum CheckKind {
    /// A TCP connect to the entry's address and port.
    Tcp,
}

impl CheckKind {
    /// The kind from its name (`tcp`, any case); an error naming the input
    /// otherwise.
    pub fn parse(input: &str) -> Result<Self> {
        if input.trim().eq_ignore_ascii_case("tcp") {
            Ok(Self::Tcp)
        } else {
            Err(Error::UnknownCheck {
                input: input.to_owned(),
            })
        }
    }

    /// The kind's name, as in forms, JSON and the registration store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
        }
    }
}

impl std::fmt::Display for CheckKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether checks connect to anything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Probing {
    /// Checks connect to their entries (what `dwara serve` does).
    #[default]
    Connect,
    /// Checks are registered and shown but never connect, so checked entries stay
    /// [`Health::Starting`]: for driving the HTTP API with arbitrary addresses (a
    /// fuzzer) without sending traffic to them.
    Off,
}

/// How checks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckConfig {
    /// Time between two checks of one entry (the first runs at once; at least a
    /// millisecond); each connect waits at most half of it.
    pub interval: Duration,
    /// Failed checks in a row that make an entry unhealthy (at least 1).
    pub misses: u32,
    /// Connects in flight at once over all checks (at least 1).
    pub max_concurrent: usize,
    /// Whether checks connect.
    pub probing: Probing,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_CHECK_INTERVAL,
            misses: DEFAULT_CHECK_MISSES,
            max_concurrent: DEFAULT_MAX_CONCURRENT_CHECKS,
            probing: Probing::Connect,
        }
    }
}

impl CheckConfig {
    /// How long one connect may take: half the interval (at least a millisecond).
    pub fn timeout(&self) -> Duration {
        (self.interval / 2).max(Duration::from_millis(1))
    }
}

/// The health of a checked entry after one check: `now` is its health before,
/// `misses` the failed checks in a row so far, this one included.
pub(crate) fn verdict(now: Health, probe: Probe, misses: u32, limit: u32) -> Health {
    match probe {
        Probe::Pass => Health::Healthy,
        Probe::Fail if misses >= limit.max(1) => Health::Unhealthy,
        Probe::Fail => now,
    }
}

/// One checked entry: its identity as this node's entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    id: String,
    ip: IpAddr,
    /// The name, lower-cased wire form.
    wire: Vec<u8>,
}

/// A running checker.
#[derive(Debug)]
struct Task {
    kind: CheckKind,
    port: u16,
    /// Tells this checker from an earlier one of the same entry.
    generation: u64,
    handle: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Running {
    tasks: HashMap<Key, Task>,
    next_generation: u64,
}

#[derive(Debug)]
struct Inner {
    db: Arc<Db>,
    config: CheckConfig,
    metrics: Arc<Metrics>,
    permits: Semaphore,
    runtime: tokio::runtime::Handle,
    /// Locked before the database's writer, never after.
    running: Mutex<Running>,
}

/// The checks of this node's HTTP registrations.
#[derive(Debug, Clone)]
pub(crate) struct Checks {
    inner: Arc<Inner>,
}

impl Checks {
    /// No checks yet; checkers will run on the current tokio runtime. Fails outside
    /// one.
    pub(crate) fn new(db: Arc<Db>, config: CheckConfig, metrics: Arc<Metrics>) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| Error::Io {
            context: "starting the health checks (no tokio runtime)".to_owned(),
            source: std::io::Error::other(e),
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                permits: Semaphore::new(config.max_concurrent.max(1)),
                config,
                metrics,
                runtime,
                running: Mutex::new(Running::default()),
            }),
        })
    }

    /// Registers `ip` under `fqdn` for `id` as [`Db::add_checked`] does, checked by
    /// `check` when given: a new check (or one whose kind or port changed) starts a
    /// checker and puts the entry back to [`Health::Starting`]; the same check again
    /// keeps its checker and verdict; no check stops a running one and leaves the
    /// entry unchecked. Fails, changing nothing, for a name outside the domain or a
    /// check without a service (and so without a port).
    pub(crate) fn register(
        &self,
        id: &str,
        ip: IpAddr,
        fqdn: &str,
        service: Option<&ServicePort>,
        check: Option<CheckKind>,
    ) -> Result<()> {
        let inner = &self.inner;
        let wire = inner.db.domain().member_wire(fqdn)?;
        let port = match (check, service) {
            (Some(kind), None) => {
                return Err(Error::CheckWithoutPort {
                    check: kind.to_string(),
                });
            }
            (_, s) => s.map(ServicePort::port),
        };
        let key = Key {
            id: id.to_owned(),
            ip,
            wire,
        };
        let mut running = inner.running.lock();
        let start = match check {
            Some(_) => Health::Starting,
            None => Health::Unchecked,
        };
        inner.db.add_checked(id, ip, fqdn, service, start)?;
        let same = running
            .tasks
            .get(&key)
            .is_some_and(|t| Some(t.kind) == check && Some(t.port) == port);
        match (check, port) {
            _ if same => {}
            (Some(kind), Some(port)) => {
                if let Some(old) = running.tasks.remove(&key) {
                    old.handle.abort();
                }
                inner
                    .db
                    .set_entry_health(id, ip, &key.wire, Health::Starting);
                running.next_generation += 1;
                let generation = running.next_generation;
                let handle = inner.runtime.spawn(run(
                    inner.clone(),
                    key.clone(),
                    fqdn.to_owned(),
                    port,
                    generation,
                ));
                running.tasks.insert(
                    key,
                    Task {
                        kind,
                        port,
                        generation,
                        handle,
                    },
                );
            }
            _ => {
                if let Some(old) = running.tasks.remove(&key) {
                    old.handle.abort();
                    inner
                        .db
                        .set_entry_health(id, ip, &key.wire, Health::Unchecked);
                }
            }
        }
        inner.metrics.set_checks_running(running.tasks.len());
        Ok(())
    }

    /// Stops the checkers of `id`, narrowed to one address and/or one name when
    /// given (as a delete is). Returns how many stopped.
    pub(crate) fn forget(&self, id: &str, ip: Option<IpAddr>, fqdn: Option<&str>) -> usize {
        let wire = match fqdn.map(|f| self.inner.db.domain().member_wire(f)) {
            None => None,
            Some(Ok(w)) => Some(w),
            // A name outside the domain has no entry, so no check.
            Some(Err(_)) => return 0,
        };
        let mut running = self.inner.running.lock();
        let before = running.tasks.len();
        running.tasks.retain(|k, t| {
            let matches = k.id == id
                && ip.is_none_or(|ip| ip == k.ip)
                && wire.as_deref().is_none_or(|w| w == &k.wire[..]);
            if matches {
                t.handle.abort();
            }
            !matches
        });
        let stopped = before - running.tasks.len();
        self.inner.metrics.set_checks_running(running.tasks.len());
        stopped
    }

    /// The check this node runs on its entry of `id` at `ip` under `fqdn`, if any.
    pub(crate) fn check_of(&self, id: &str, ip: IpAddr, fqdn: &str) -> Option<CheckKind> {
        let wire = self.inner.db.domain().member_wire(fqdn).ok()?;
        let key = Key {
            id: id.to_owned(),
            ip,
            wire,
        };
        self.inner.running.lock().tasks.get(&key).map(|t| t.kind)
    }

    /// Stops every checker (the name server is stopping).
    pub(crate) fn stop_all(&self) {
        let mut running = self.inner.running.lock();
        for (_, t) in running.tasks.drain() {
            t.handle.abort();
        }
        self.inner.metrics.set_checks_running(0);
    }
}

impl Inner {
    /// The entry's health while `generation` is still its checker and the entry is
    /// live here; otherwise `None`, and a checker whose entry is gone is forgotten.
    /// Called with `running` locked.
    fn current(&self, running: &mut Running, key: &Key, generation: u64) -> Option<Health> {
        if running.tasks.get(key).map(|t| t.generation) != Some(generation) {
            return None;
        }
        let health = self.db.local_health(&key.id, key.ip, &key.wire);
        if health.is_none() {
            running.tasks.remove(key);
            self.metrics.set_checks_running(running.tasks.len());
        }
        health
    }

    /// One TCP connect to `target`, within the timeout, once a permit is free.
    async fn probe(&self, target: SocketAddr) -> Probe {
        let Ok(_permit) = self.permits.acquire().await else {
            return Probe::Fail;
        };
        match tokio::time::timeout(
            self.config.timeout(),
            tokio::net::TcpStream::connect(target),
        )
        .await
        {
            Ok(Ok(_stream)) => Probe::Pass,
            Ok(Err(_)) | Err(_) => Probe::Fail,
        }
    }
}

/// The checker of one entry: check every interval, set the verdict when it changes.
async fn run(inner: Arc<Inner>, key: Key, fqdn: String, port: u16, generation: u64) {
    let target = SocketAddr::new(key.ip, port);
    // tokio's interval refuses a zero period.
    let every = inner.config.interval.max(Duration::from_millis(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut misses: u32 = 0;
    loop {
        tick.tick().await;
        if inner
            .current(&mut inner.running.lock(), &key, generation)
            .is_none()
        {
            return;
        }
        if inner.config.probing == Probing::Off {
            continue;
        }
        let probe = inner.probe(target).await;
        inner.metrics.record_check(probe);
        misses = match probe {
            Probe::Pass => 0,
            Probe::Fail => misses.saturating_add(1),
        };
        let mut running = inner.running.lock();
        let Some(now) = inner.current(&mut running, &key, generation) else {
            return;
        };
        let next = verdict(now, probe, misses, inner.config.misses);
        if next != now {
            inner.db.set_entry_health(&key.id, key.ip, &key.wire, next);
            tracing::info!(fqdn = %fqdn, ip = %key.ip, port, id = %key.id, from = %now,
                to = %next, misses, "health check verdict changed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_passes_and_misses_in_a_row() {
        use Health::*;
        use Probe::*;
        // A pass is healthy at once, from any state.
        for now in [Starting, Healthy, Unhealthy] {
            assert_eq!(verdict(now, Pass, 0, 2), Healthy);
        }
        // Fewer misses than the limit keep the state; the limit makes it unhealthy.
        assert_eq!(verdict(Starting, Fail, 1, 2), Starting);
        assert_eq!(verdict(Healthy, Fail, 1, 2), Healthy);
        assert_eq!(verdict(Starting, Fail, 2, 2), Unhealthy);
        assert_eq!(verdict(Healthy, Fail, 2, 2), Unhealthy);
        assert_eq!(verdict(Unhealthy, Fail, 7, 2), Unhealthy);
        // A limit of 0 counts as 1.
        assert_eq!(verdict(Healthy, Fail, 1, 0), Unhealthy);
    }

    #[test]
    fn check_kinds_parse_by_name() {
        assert_eq!(CheckKind::parse("tcp").unwrap(), CheckKind::Tcp);
        assert_eq!(CheckKind::parse(" TCP ").unwrap(), CheckKind::Tcp);
        for bad in ["", "http", "tcp6", "udp"] {
            let e = CheckKind::parse(bad).unwrap_err();
            assert!(e.to_string().contains("unknown check"), "{e}");
        }
        assert_eq!(CheckKind::Tcp.to_string(), "tcp");
    }

    #[test]
    fn the_timeout_is_half_the_interval() {
        let c = CheckConfig::default();
        assert_eq!(c.timeout(), Duration::from_millis(2500));
        let c = CheckConfig {
            interval: Duration::from_millis(1),
            ..c
        };
        assert_eq!(c.timeout(), Duration::from_millis(1));
    }
}
