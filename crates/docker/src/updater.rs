//! The updater: reconcile with the running containers, follow the event stream,
//! reconnect with backoff when it ends.
//!
//! Every event only says "look at container X again": X is inspected and its records
//! are set to what the inspect answer says (level-triggered), so duplicated, replayed
//! or late events are harmless. A `die` additionally carries its time: a running
//! state that started before it belongs to the incarnation that died. Events are
//! taken from the stream in batches of what is ready; within a batch each container
//! is looked at once (its latest `die` kept) and different containers concurrently;
//! a batch is finished before the next one starts, so each container's events apply
//! in order.
//!
//! A `die` removes the records of the incarnation it is about as soon as it is read,
//! before that inspect: the daemon holds the container's lock while it tears the
//! container's network down after the `die`, so an inspect then waits for the
//! teardown (tens of milliseconds). The records go only when the incarnation they
//! were registered from started before the `die` (the inspect that registered them
//! said when); the inspect that follows still decides what the container has, so a
//! restarted container is registered again from it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{EventMessage, EventMessageTypeEnum};
use bollard::query_parameters::{EventsOptions, ListContainersOptions};
use dwara_nameserver::Db;
use futures::StreamExt;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::client::connect;
use crate::config::{ApiVersion, DockerConfig, DockerMode};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::names::{Naming, Record, desired, health, service_of, started_at};
use crate::time::{Nanos, now, since_param};
use dwara_nameserver::{Health, ServicePort};

/// How many containers are inspected at once.
const CONCURRENCY: usize = 16;
/// How many ready events are taken as one batch.
const BATCH: usize = 512;
/// How far before the reconcile's container list a fresh stream starts, against a
/// daemon clock slightly behind ours (replayed events are harmless).
const SINCE_MARGIN: Nanos = 2_000_000_000;
/// How soon a container whose inspect failed is looked at again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The outcome of [`DockerUpdater::start`].
#[derive(Debug)]
#[must_use]
pub enum Started {
    /// The updater runs.
    Running(DockerUpdater),
    /// Docker is off; the caller logs why and serves on.
    Off(DockerOff),
}

/// Why the updater is not running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DockerOff {
    /// `--docker off`.
    #[error("Docker updater disabled (--docker off)")]
    Disabled,
    /// `auto` and the socket does not exist.
    #[error("Docker updater off: no socket at {}", socket.display())]
    NoSocket {
        /// The socket looked for.
        socket: PathBuf,
    },
    /// `auto`, the socket exists, but the daemon did not answer.
    #[error("Docker updater off: {source}")]
    Unreachable {
        /// What failed.
        #[source]
        source: Error,
    },
}

/// What one reconciliation changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repair {
    /// Records added.
    pub added: u64,
    /// Records removed.
    pub removed: u64,
}

impl std::ops::AddAssign for Repair {
    fn add_assign(&mut self, other: Self) {
        self.added += other.added;
        self.removed += other.removed;
    }
}

/// A running Docker updater (see the crate docs).
#[derive(Debug)]
pub struct DockerUpdater {
    shared: Arc<Shared>,
    api_version: ApiVersion,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// What the background task and the handle share.
#[derive(Debug)]
struct Shared {
    config: DockerConfig,
    db: Arc<Db>,
    naming: Naming,
    metrics: Metrics,
    /// What this updater registered, by container id: the only records it ever removes.
    ours: Mutex<HashMap<String, Registered>>,
}

/// One container's records, as this updater registered them.
#[derive(Debug, Default)]
struct Registered {
    records: BTreeSet<Record>,
    /// When the incarnation they were read from started, if the daemon said.
    started_at: Option<Nanos>,
}

impl DockerUpdater {
    /// Starts the updater as `config.mode` says.
    ///
    /// `on`: the daemon must answer (API version negotiated, running containers
    /// registered) or this fails. `auto`: a missing socket or a daemon that does not
    /// answer gives [`Started::Off`]. `off`: [`Started::Off`] at once. When it runs,
    /// the running containers are registered before this returns.
    pub async fn start(config: DockerConfig, db: Arc<Db>) -> Result<Started> {
        match config.mode {
            DockerMode::Off => return Ok(Started::Off(DockerOff::Disabled)),
            DockerMode::Auto if !config.socket.exists() => {
                return Ok(Started::Off(DockerOff::NoSocket {
                    socket: config.socket.clone(),
                }));
            }
            DockerMode::Auto | DockerMode::On => {}
        }
        let mode = config.mode;
        let naming = Naming {
            domain: db.domain().clone(),
            sources: config.names.clone(),
            network: config.network.clone(),
        };
        let shared = Arc::new(Shared {
            config,
            db,
            naming,
            metrics: Metrics::default(),
            ours: Mutex::new(HashMap::new()),
        });
        let first = async {
            let (docker, version) = connect(&shared.config).await?;
            let since = now() - SINCE_MARGIN;
            let repair = shared.reconcile(&docker).await?;
            Ok::<_, Error>((docker, version, since, repair))
        };
        let (docker, api_version, since, repair) = match first.await {
            Ok(v) => v,
            Err(e) if mode == DockerMode::On => return Err(e),
            Err(source) => return Ok(Started::Off(DockerOff::Unreachable { source })),
        };
        tracing::debug!(
            socket = %shared.config.socket.display(),
            api_version = %api_version,
            names = %shared.config.names,
            network = shared.config.network.as_deref().unwrap_or("*"),
            registered = repair.added,
            "Docker updater running"
        );
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(shared.clone(), docker, since, cancel.clone()));
        Ok(Started::Running(Self {
            shared,
            api_version,
            cancel,
            task,
        }))
    }

    /// The Docker socket the updater talks to.
    pub fn socket(&self) -> &std::path::Path {
        &self.shared.config.socket
    }

    /// The API version the requests carry.
    pub fn api_version(&self) -> ApiVersion {
        self.api_version
    }

    /// What this updater has registered: container id → (address, name) pairs.
    pub fn registered(&self) -> BTreeMap<String, Vec<(IpAddr, String)>> {
        self.shared
            .ours
            .lock()
            .iter()
            .map(|(id, reg)| (id.clone(), reg.records.iter().cloned().collect()))
            .collect()
    }

    /// Registers the updater's metrics: `dwara_docker_containers_registered`,
    /// `dwara_docker_events_total{action}`, `dwara_docker_reconnects_total`,
    /// `dwara_docker_reconciles_total`, `dwara_docker_reconcile_repairs_total{change}`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.shared.metrics.register(registry);
    }

    /// Stops following the daemon. The records stay (the process is going away, or
    /// another updater takes over).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "Docker updater task failed"),
            Err(_) => tracing::warn!("Docker updater did not stop within 5 s"),
        }
        tracing::info!("Docker updater stopped");
    }

    /// Stops following the daemon and removes every record this updater registered
    /// (Docker turned off while the name server serves on). Returns how many.
    pub async fn shutdown_and_unregister(self) -> usize {
        let shared = self.shared.clone();
        self.shutdown().await;
        let ours = std::mem::take(&mut *shared.ours.lock());
        shared.metrics.containers.set(0);
        ours.iter()
            .flat_map(|(id, reg)| reg.records.iter().map(move |r| (id, r)))
            .map(|(id, (ip, fqdn))| shared.db.remove(id, Some(*ip), Some(fqdn)))
            .sum()
    }
}

/// How a followed event stream ended.
enum StreamEnd {
    Cancelled,
    Eof,
    Failed(BollardError),
}

async fn run(shared: Arc<Shared>, mut docker: Docker, mut since: Nanos, cancel: CancellationToken) {
    let backoff = shared.config.backoff;
    let mut failures: u32 = 0;
    loop {
        let opened = Instant::now();
        let end = tokio::select! {
            () = cancel.cancelled() => StreamEnd::Cancelled,
            end = shared.follow(&docker, &mut since) => end,
        };
        match end {
            StreamEnd::Cancelled => return,
            StreamEnd::Eof => tracing::warn!("Docker event stream ended; reconnecting"),
            StreamEnd::Failed(e) => {
                tracing::warn!(error = %e, "Docker event stream failed; reconnecting");
            }
        }
        // A stream that lived a while was a healthy connection: start over with the
        // shortest wait. One that ends at once keeps backing off.
        if opened.elapsed() > backoff.max {
            failures = 0;
        }
        loop {
            failures = failures.saturating_add(1);
            let wait = backoff.delay(failures);
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let attempt = async {
                let (d, version) = connect(&shared.config).await?;
                let list_time = now() - SINCE_MARGIN;
                let repair = shared.reconcile(&d).await?;
                Ok::<_, Error>((d, version, list_time, repair))
            };
            let outcome = tokio::select! {
                () = cancel.cancelled() => return,
                outcome = attempt => outcome,
            };
            match outcome {
                Ok((d, version, list_time, repair)) => {
                    shared.metrics.reconnects.inc();
                    tracing::info!(
                        api_version = %version,
                        added = repair.added,
                        removed = repair.removed,
                        "reconnected to the Docker daemon"
                    );
                    docker = d;
                    since = since.max(list_time);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt = failures, retry_in = ?backoff.delay(failures + 1), "Docker daemon still unreachable");
                }
            }
        }
    }
}

impl Shared {
    /// Follows the event stream from `since` (advanced past every event seen) until
    /// it ends.
    async fn follow(&self, docker: &Docker, since: &mut Nanos) -> StreamEnd {
        let filters = HashMap::from([
            (
                "type".to_owned(),
                vec!["container".to_owned(), "network".to_owned()],
            ),
            (
                "event".to_owned(),
                // `health_status` matches `health_status: healthy` etc. (the
                // daemon compares that one by prefix).
                [
                    "start",
                    "die",
                    "destroy",
                    "rename",
                    "connect",
                    "disconnect",
                    "health_status",
                ]
                .map(str::to_owned)
                .to_vec(),
            ),
        ]);
        let options = EventsOptions {
            since: Some(since_param(*since)),
            until: None,
            filters: Some(filters),
        };
        let mut stream = docker.events(Some(options)).ready_chunks(BATCH);
        let mut retry: HashMap<String, Option<Nanos>> = HashMap::new();
        loop {
            let batch = if retry.is_empty() {
                stream.next().await
            } else {
                tokio::select! {
                    b = stream.next() => b,
                    () = tokio::time::sleep(RETRY_AFTER) => {
                        let again: Vec<_> = retry.drain().collect();
                        tracing::debug!(containers = again.len(), "retrying containers whose inspect failed");
                        let _ = self.sync_all(docker, again, &mut retry).await;
                        continue;
                    }
                }
            };
            let Some(items) = batch else {
                return StreamEnd::Eof;
            };
            let mut work: Vec<(String, Option<Nanos>)> = Vec::new();
            let mut index: HashMap<String, usize> = HashMap::new();
            let mut failed = None;
            for item in items {
                let event = match item {
                    Ok(e) => e,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                };
                let Some((id, action, at)) = self.event_target(&event) else {
                    continue;
                };
                self.metrics.event(&action);
                if let Some(at) = at {
                    *since = (*since).max(at);
                }
                let died_at = if action == "die" { at } else { None };
                // How long after the daemon's own timestamp the event was read.
                let age_us = at.map(|at| i64::try_from((now() - at) / 1000).unwrap_or(i64::MAX));
                tracing::debug!(container = %id, action = %action, age_us, "Docker event");
                if let Some(died) = died_at {
                    self.died(&id, died);
                }
                match index.get(&id) {
                    Some(&i) => {
                        let slot = &mut work[i].1;
                        *slot = (*slot).max(died_at);
                    }
                    None => {
                        index.insert(id.clone(), work.len());
                        work.push((id, died_at));
                    }
                }
            }
            for (id, died_at) in retry.drain() {
                match index.get(&id) {
                    Some(&i) => work[i].1 = work[i].1.max(died_at),
                    None => work.push((id, died_at)),
                }
            }
            // Failed inspects are in `retry`; the stream itself decides whether to go on.
            let _ = self.sync_all(docker, work, &mut retry).await;
            if let Some(e) = failed {
                return StreamEnd::Failed(e);
            }
        }
    }

    /// The container an event is about, its action and its time.
    fn event_target(&self, event: &EventMessage) -> Option<(String, String, Option<Nanos>)> {
        // `health_status: healthy` → `health_status`: the state is read by inspect.
        let action = event
            .action
            .as_deref()?
            .split(':')
            .next()?
            .trim()
            .to_owned();
        let actor = event.actor.as_ref()?;
        let id = match event.typ {
            Some(EventMessageTypeEnum::CONTAINER) => actor.id.clone()?,
            Some(EventMessageTypeEnum::NETWORK) => {
                actor.attributes.as_ref()?.get("container")?.clone()
            }
            _ => return None,
        };
        let at = event
            .time_nano
            .map(Nanos::from)
            .or_else(|| event.time.map(|t| Nanos::from(t) * 1_000_000_000));
        Some((id, action, at))
    }

    /// Removes the records of `id` at once when they were registered from an
    /// incarnation that started before a `die` at `died` (see the module docs); the
    /// inspect that follows decides the rest.
    fn died(&self, id: &str, died: Nanos) {
        let dead = self
            .ours
            .lock()
            .get(id)
            .is_some_and(|reg| reg.started_at.is_some_and(|started| started < died));
        if dead {
            self.apply(id, BTreeSet::new(), None, Health::Unchecked, None);
        }
    }

    /// Looks at each container again (concurrently); the ones whose inspect failed
    /// for another reason than "no such container" go to `retry`.
    async fn sync_all(
        &self,
        docker: &Docker,
        work: Vec<(String, Option<Nanos>)>,
        retry: &mut HashMap<String, Option<Nanos>>,
    ) -> (Repair, Option<BollardError>) {
        let mut total = Repair::default();
        let mut first_error = None;
        let mut results = futures::stream::iter(work)
            .map(|(id, died_at)| async move {
                let r = self.sync(docker, &id, died_at).await;
                (id, died_at, r)
            })
            .buffer_unordered(CONCURRENCY);
        while let Some((id, died_at, r)) = results.next().await {
            match r {
                Ok(repair) => total += repair,
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "cannot inspect container; will look again");
                    retry.insert(id, died_at);
                    first_error.get_or_insert(e);
                }
            }
        }
        (total, first_error)
    }

    /// Inspects one container and sets its records to what it should have.
    async fn sync(
        &self,
        docker: &Docker,
        id: &str,
        died_at: Option<Nanos>,
    ) -> Result<Repair, BollardError> {
        let asked = Instant::now();
        let answer = docker.inspect_container(id, None).await;
        let inspect_us = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        tracing::debug!(container = %id, inspect_us, ok = answer.is_ok(), "inspected");
        let want = match answer {
            Ok(c) => {
                // Events carry the full id; keep records under the full id always.
                match c.id.as_deref() {
                    Some(full) if full != id => {
                        tracing::debug!(container = %id, full = %full, "event id is not the full id");
                    }
                    _ => {}
                }
                let service = match service_of(&c) {
                    Ok(s) => s,
                    Err(e) => {
                        self.metrics.bad_labels.inc();
                        tracing::warn!(container = %id, error = %e,
                            "bad dwara.port/dwara.service label; names registered without a service");
                        None
                    }
                };
                let want = desired(&c, &self.naming, died_at);
                (want, service, health(&c), started_at(&c))
            }
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => (BTreeSet::new(), None, Health::Unchecked, None),
            Err(e) => return Err(e),
        };
        Ok(self.apply(id, want.0, want.1.as_ref(), want.2, want.3))
    }

    /// Makes this updater's records of `id` exactly `want`, with `service` (a
    /// container's labels, so its service, never change), in `health` (what the
    /// container's `HEALTHCHECK` says; `starting` is not answered yet), read from the
    /// incarnation that started at `started_at`.
    fn apply(
        &self,
        id: &str,
        want: BTreeSet<Record>,
        service: Option<&ServicePort>,
        health: Health,
        started_at: Option<Nanos>,
    ) -> Repair {
        let mut repair = Repair::default();
        let mut ours = self.ours.lock();
        let have = ours.remove(id).unwrap_or_default().records;
        for (ip, fqdn) in have.difference(&want) {
            repair.removed += self.db.remove(id, Some(*ip), Some(fqdn)) as u64;
            tracing::info!(container = %id, %ip, %fqdn, "unregistered");
        }
        let mut kept: BTreeSet<Record> = have.intersection(&want).cloned().collect();
        let addrs: BTreeSet<IpAddr> = kept.iter().map(|(ip, _)| *ip).collect();
        for ip in addrs {
            if self.db.set_health(id, ip, health) > 0 {
                tracing::info!(container = %id, %ip, %health, "health changed");
            }
        }
        for (ip, fqdn) in want.difference(&have) {
            match self.db.add_checked(id, *ip, fqdn, service, health) {
                Ok(true) => {
                    repair.added += 1;
                    let service = service.map(ToString::to_string);
                    tracing::info!(container = %id, %ip, %fqdn, service, %health, "registered");
                    kept.insert((*ip, fqdn.clone()));
                }
                // Already live: someone else's record (by hand), not ours to remove.
                Ok(false) => {
                    tracing::debug!(container = %id, %ip, %fqdn, "already registered by someone else");
                }
                Err(e) => {
                    tracing::warn!(container = %id, %ip, %fqdn, error = %e, "cannot register")
                }
            }
        }
        if !kept.is_empty() {
            let records = kept;
            ours.insert(
                id.to_owned(),
                Registered {
                    records,
                    started_at,
                },
            );
        }
        self.metrics
            .containers
            .set(i64::try_from(ours.len()).unwrap_or(i64::MAX));
        repair
    }

    /// Lists the running containers and makes the records match: every running one
    /// gets what it should have; every one this updater registered that is no longer
    /// listed is inspected (it may have started since the list) and cleared if gone.
    /// Records of ours removed from the database by someone else are put back.
    async fn reconcile(&self, docker: &Docker) -> Result<Repair> {
        let started = Instant::now();
        let unreachable = |source| Error::Unreachable {
            socket: self.config.socket.clone(),
            source,
        };
        let listed = docker
            .list_containers(Some(ListContainersOptions::default()))
            .await
            .map_err(unreachable)?;
        let origin = self.db.origin().to_owned();
        let present: HashSet<(String, IpAddr, String)> = self
            .db
            .entries()
            .into_iter()
            .filter(|e| !e.tombstone && e.origin == origin)
            .map(|e| (e.id, e.ip, e.fqdn))
            .collect();
        let mut ids: Vec<String> = listed.into_iter().filter_map(|c| c.id).collect();
        {
            let mut ours = self.ours.lock();
            for (id, reg) in ours.iter_mut() {
                reg.records
                    .retain(|(ip, fqdn)| present.contains(&(id.clone(), *ip, fqdn.clone())));
            }
            let listed: HashSet<String> = ids.iter().cloned().collect();
            ids.extend(ours.keys().filter(|id| !listed.contains(*id)).cloned());
        }
        let containers = ids.len();
        let mut retry = HashMap::new();
        let (repair, failed) = self
            .sync_all(
                docker,
                ids.into_iter().map(|id| (id, None)).collect(),
                &mut retry,
            )
            .await;
        if let Some(source) = failed {
            // The daemon is not answering well: this reconcile is not complete.
            return Err(unreachable(source));
        }
        self.metrics.reconciles.inc();
        self.metrics.repaired(repair.added, repair.removed);
        let elapsed_ms = started.elapsed().as_millis() as u64;
        if repair.added + repair.removed > 0 {
            tracing::info!(
                containers,
                added = repair.added,
                removed = repair.removed,
                elapsed_ms,
                "reconciled with the running containers"
            );
        } else {
            tracing::debug!(containers, elapsed_ms, "reconciled: nothing to change");
        }
        Ok(repair)
    }
}
