//! The updater: reconcile with the running containers, follow the event stream,
//! reconnect with backoff when it ends.
//!
//! Every event only says "look at container X again": X is inspected and its records
//! are set to what the inspect answer says (level-triggered), so duplicated, replayed
//! or late events are harmless. A `die` additionally carries its time: a running
//! state that started before it belongs to the incarnation that died. Events are
//! read as they come. Each container has at most one inspect in flight, different
//! containers up to `CONCURRENCY` at once: the events of a container read while
//! its inspect is in flight wait for it to end and are then looked at with one more
//! inspect (their latest `die` kept), so each container's events apply in order and
//! no container waits for another's inspect. An answer that comes back after a
//! `die` of its container was read counts an incarnation started before that `die`
//! as dead.
//!
//! A `die` removes the records of the incarnation it is about as soon as it is read,
//! before that inspect: the daemon holds the container's lock while it tears the
//! container's network down after the `die`, so an inspect then waits for the
//! teardown (tens of milliseconds). The records go only when the incarnation they
//! were registered from started before the `die` (the inspect that registered them
//! said when); the inspect that follows still decides what the container has, so a
//! restarted container is registered again from it.
//!
//! A container whose inspect fails (the daemon does not answer it within the
//! request timeout, or answers with an error other than "no such container") is
//! inspected again `RETRY_AFTER` later, and again after each further failure,
//! while every other container is kept up to date: one wedged container does not
//! hold the others back. That holds for the reconcile too: once the daemon has
//! listed the containers, the reconcile is complete for those it could inspect and
//! the rest are retried by the event loop that follows (a failed list, or a failed
//! connection, is the daemon being unreachable: the start fails, or the reconnect
//! backs off).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerInspectResponse, EventMessage, EventMessageTypeEnum};
use bollard::query_parameters::{EventsOptions, ListContainersOptions};
use dwara_records::Db;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::client::{bounded, connect};
use crate::config::{ApiVersion, DockerConfig, DockerMode};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::names::{Naming, Record, desired, health, service_of, started_at};
use crate::time::{Nanos, now, since_param};
use dwara_records::{Health, ServicePort};

/// How many containers are inspected at once.
const CONCURRENCY: usize = 16;
/// How many ready events are read at once.
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

/// The containers with events not yet looked at, in the order their first event
/// came, each with the latest `die` among them; and the ones being inspected, which
/// wait for that inspect to end before they are inspected again.
#[derive(Debug, Default)]
struct Queue {
    order: VecDeque<String>,
    pending: HashMap<String, Option<Nanos>>,
    busy: HashSet<String>,
}

impl Queue {
    fn add(&mut self, id: String, died_at: Option<Nanos>) {
        match self.pending.get_mut(&id) {
            Some(slot) => *slot = (*slot).max(died_at),
            None => {
                self.pending.insert(id.clone(), died_at);
                self.order.push_back(id);
            }
        }
    }

    /// The first pending container not being inspected, now marked busy.
    fn next_idle(&mut self) -> Option<(String, Option<Nanos>)> {
        let i = self.order.iter().position(|id| !self.busy.contains(id))?;
        let id = self.order.remove(i)?;
        let died_at = self.pending.remove(&id).flatten();
        self.busy.insert(id.clone());
        Some((id, died_at))
    }

    /// The inspect of `id` ended.
    fn done(&mut self, id: &str) {
        self.busy.remove(id);
    }

    /// The latest `die` of `id` read since its inspect was sent.
    fn died(&self, id: &str) -> Option<Nanos> {
        self.pending.get(id).copied().flatten()
    }

    fn drain(&mut self) -> Vec<(String, Option<Nanos>)> {
        self.order
            .drain(..)
            .filter_map(|id| {
                let died_at = self.pending.remove(&id)?;
                Some((id, died_at))
            })
            .collect()
    }
}

/// Sleeps until `at`; never wakes without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
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
    /// the running containers are registered before this returns, but for those
    /// whose inspect failed: the updater inspects those again once it runs.
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
            let (repair, retry) = shared.reconcile(&docker).await?;
            Ok::<_, Error>((docker, version, since, repair, retry))
        };
        let (docker, api_version, since, repair, retry) = match first.await {
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
        let task = tokio::spawn(run(shared.clone(), docker, since, retry, cancel.clone()));
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
    /// `dwara_docker_reconciles_total`, `dwara_docker_reconcile_repairs_total{change}`,
    /// `dwara_docker_bad_labels_total`, `dwara_docker_inspect_failures_total`.
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

/// The containers whose inspect failed, to be inspected again (each with the time
/// of its latest `die` read, if any).
type Retry = HashMap<String, Option<Nanos>>;

async fn run(
    shared: Arc<Shared>,
    mut docker: Docker,
    mut since: Nanos,
    mut retry: Retry,
    cancel: CancellationToken,
) {
    let backoff = shared.config.backoff;
    let mut failures: u32 = 0;
    loop {
        let opened = Instant::now();
        let end = tokio::select! {
            () = cancel.cancelled() => StreamEnd::Cancelled,
            end = shared.follow(&docker, &mut since, std::mem::take(&mut retry)) => end,
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
            // Each request of an attempt is bounded by `request_timeout` (see
            // `client::bounded`): one that is never answered fails this attempt, it
            // cannot hold up the next ones.
            tracing::debug!(attempt = failures, "connecting to the Docker daemon");
            let began = Instant::now();
            let attempt = async {
                let (d, version) = connect(&shared.config).await?;
                let list_time = now() - SINCE_MARGIN;
                let (repair, retry) = shared.reconcile(&d).await?;
                Ok::<_, Error>((d, version, list_time, repair, retry))
            };
            let outcome = tokio::select! {
                () = cancel.cancelled() => return,
                outcome = attempt => outcome,
            };
            let elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
            match outcome {
                Ok((d, version, list_time, repair, still_failing)) => {
                    shared.metrics.reconnects.inc();
                    tracing::info!(
                        api_version = %version,
                        added = repair.added,
                        removed = repair.removed,
                        attempt = failures,
                        elapsed_ms,
                        "reconnected to the Docker daemon"
                    );
                    docker = d;
                    since = since.max(list_time);
                    retry = still_failing;
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt = failures, elapsed_ms, retry_in = ?backoff.delay(failures + 1), "Docker daemon still unreachable");
                }
            }
        }
    }
}

impl Shared {
    /// Follows the event stream from `since` (advanced past every event seen) until
    /// it ends, inspecting the containers of `retry` again `RETRY_AFTER` from now.
    async fn follow(&self, docker: &Docker, since: &mut Nanos, mut retry: Retry) -> StreamEnd {
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
        let mut queue = Queue::default();
        let mut retry_at = (!retry.is_empty()).then(|| tokio::time::Instant::now() + RETRY_AFTER);
        // Inspects in flight, at most one per container: (id, its `die`, answer).
        let mut inflight = FuturesUnordered::new();
        let end = loop {
            while inflight.len() < CONCURRENCY {
                let Some((id, died_at)) = queue.next_idle() else {
                    break;
                };
                inflight.push(async move {
                    let answer = self.inspect(docker, &id).await;
                    (id, died_at, answer)
                });
            }
            tokio::select! {
                items = stream.next() => {
                    let Some(items) = items else {
                        break StreamEnd::Eof;
                    };
                    if let Some(e) = self.take_events(items, since, &mut queue) {
                        break StreamEnd::Failed(e);
                    }
                }
                Some((id, died_at, answer)) = inflight.next() => {
                    queue.done(&id);
                    if let Err((died_at, e)) = self.settle(&id, died_at, answer, queue.died(&id)) {
                        self.inspect_failed(id, died_at, &e, &mut retry);
                        retry_at.get_or_insert_with(|| tokio::time::Instant::now() + RETRY_AFTER);
                    }
                }
                () = sleep_until(retry_at) => {
                    retry_at = None;
                    tracing::debug!(containers = retry.len(), "retrying containers whose inspect failed");
                    for (id, died_at) in retry.drain() {
                        queue.add(id, died_at);
                    }
                }
            }
        };
        // What was read is looked at before the caller reconnects (which reconciles
        // anyway); failed inspects are left to that reconcile.
        while let Some((id, died_at, answer)) = inflight.next().await {
            queue.done(&id);
            let _ = self.settle(&id, died_at, answer, queue.died(&id));
        }
        let _ = self.sync_all(docker, queue.drain(), &mut retry).await;
        end
    }

    /// Takes a chunk of events into `queue` (a `die` also removes at once what it
    /// ends, see [`Shared::died`]), advancing `since`; the stream's error, if the
    /// chunk ends with one.
    fn take_events(
        &self,
        items: Vec<Result<EventMessage, BollardError>>,
        since: &mut Nanos,
        queue: &mut Queue,
    ) -> Option<BollardError> {
        for item in items {
            let event = match item {
                Ok(e) => e,
                Err(e) => return Some(e),
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
            queue.add(id, died_at);
        }
        None
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
        retry: &mut Retry,
    ) -> Repair {
        let mut total = Repair::default();
        let mut results = futures::stream::iter(work)
            .map(|(id, died_at)| async move {
                let r = self.sync(docker, &id, died_at).await;
                (id, died_at, r)
            })
            .buffer_unordered(CONCURRENCY);
        while let Some((id, died_at, r)) = results.next().await {
            match r {
                Ok(repair) => total += repair,
                Err(e) => self.inspect_failed(id, died_at, &e, retry),
            }
        }
        total
    }

    /// Counts and logs a failed inspect of `id` and puts it in `retry`.
    fn inspect_failed(
        &self,
        id: String,
        died_at: Option<Nanos>,
        e: &BollardError,
        retry: &mut Retry,
    ) {
        self.metrics.inspect_failures.inc();
        tracing::warn!(container = %id, error = %e, retry_in = ?RETRY_AFTER, "cannot inspect container; will look again");
        retry.insert(id, died_at);
    }

    /// Inspects one container and sets its records to what it should have.
    async fn sync(
        &self,
        docker: &Docker,
        id: &str,
        died_at: Option<Nanos>,
    ) -> Result<Repair, BollardError> {
        let answer = self.inspect(docker, id).await;
        self.settle(id, died_at, answer, None).map_err(|(_, e)| e)
    }

    /// The daemon's inspect answer for `id`; `None` when there is no such container.
    async fn inspect(
        &self,
        docker: &Docker,
        id: &str,
    ) -> Result<Option<ContainerInspectResponse>, BollardError> {
        let asked = Instant::now();
        let answer = bounded(
            self.config.request_timeout,
            docker.inspect_container(id, None),
        )
        .await;
        let inspect_us = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
        tracing::debug!(container = %id, inspect_us, ok = answer.is_ok(), "inspected");
        match answer {
            Ok(c) => Ok(Some(c)),
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets the records of `id` to what `answer` says it should have, a running
    /// state that started before `died_at` or `died_since` (a `die` read while the
    /// inspect was in flight) counting as dead. A failed inspect is returned with
    /// the `die` to look at again.
    fn settle(
        &self,
        id: &str,
        died_at: Option<Nanos>,
        answer: Result<Option<ContainerInspectResponse>, BollardError>,
        died_since: Option<Nanos>,
    ) -> Result<Repair, (Option<Nanos>, BollardError)> {
        let c = match answer {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(self.apply(id, BTreeSet::new(), None, Health::Unchecked, None)),
            Err(e) => return Err((died_at, e)),
        };
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
                    "bad dwara.port/dwara.service/dwara.priority/dwara.weight label; names registered without a service");
                None
            }
        };
        let want = desired(&c, &self.naming, died_at.max(died_since));
        Ok(self.apply(id, want, service.as_ref(), health(&c), started_at(&c)))
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
    async fn reconcile(&self, docker: &Docker) -> Result<(Repair, Retry)> {
        let started = Instant::now();
        let unreachable = |source| Error::Unreachable {
            socket: self.config.socket.clone(),
            source,
        };
        let listed = bounded(
            self.config.request_timeout,
            docker.list_containers(Some(ListContainersOptions::default())),
        )
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
        let mut retry = Retry::new();
        let repair = self
            .sync_all(
                docker,
                ids.into_iter().map(|id| (id, None)).collect(),
                &mut retry,
            )
            .await;
        // The daemon listed the containers: it is reachable. The ones it did not
        // answer an inspect for are left to the event loop's retries; the others
        // are not held back by them.
        if !retry.is_empty() {
            tracing::warn!(
                containers,
                failed = retry.len(),
                "reconciled except for containers whose inspect failed; they are inspected again"
            );
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
        Ok((repair, retry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::parse_rfc3339;
    use dwara_records::{DbConfig, Domain};

    const ID: &str = "af101f233493d3eee9d8737a89f96ac82889d80eff05f653d64193b01763d84f";

    fn shared() -> Shared {
        let db = Arc::new(Db::new(DbConfig::new(Domain::new("weave.local").unwrap())));
        Shared {
            config: DockerConfig::new(),
            naming: Naming {
                domain: db.domain().clone(),
                sources: "hostname".parse().unwrap(),
                network: None,
            },
            db,
            metrics: Metrics::default(),
            ours: Mutex::new(HashMap::new()),
        }
    }

    /// A running `api.weave.local` at 172.17.0.2 that started at `started`.
    fn running(started: &str) -> Result<Option<ContainerInspectResponse>, BollardError> {
        Ok(Some(
            serde_json::from_value(serde_json::json!({
                "Id": ID,
                "State": { "Status": "running", "Running": true, "StartedAt": started },
                "Config": { "Hostname": "api", "Domainname": "weave.local" },
                "NetworkSettings": { "Networks": { "bridge": { "IPAddress": "172.17.0.2" } } }
            }))
            .unwrap(),
        ))
    }

    #[test]
    fn a_die_removes_only_the_incarnation_it_ends_and_a_late_answer_of_it_stays_dead() {
        let s = shared();
        let first = "2026-12-01T08:56:11.000000000Z";
        let second = "2026-12-01T08:56:13.000000000Z";
        let t = |ts: &str| parse_rfc3339(ts).unwrap();
        let answered = |s: &Shared| !s.db.lookup("api.weave.local").is_empty();
        s.settle(ID, None, running(first), None).unwrap();
        assert!(answered(&s));
        // A replayed die of an earlier incarnation leaves this one.
        s.died(ID, t(first) - 1);
        assert!(answered(&s));
        // The die of this one removes it before any inspect.
        s.died(ID, t(first) + 1);
        assert!(!answered(&s));
        // An answer sent before that die and arriving after it is of the dead one.
        s.settle(ID, None, running(first), Some(t(first) + 1))
            .unwrap();
        assert!(!answered(&s));
        // The next incarnation is registered, and its own die removes it.
        s.settle(ID, Some(t(first) + 1), running(second), None)
            .unwrap();
        assert!(answered(&s));
        s.died(ID, t(second) + 1);
        assert!(!answered(&s));
        // No such container: nothing, and a die of it is nothing to do.
        s.settle(ID, None, Ok(None), None).unwrap();
        s.died(ID, t(second) + 2);
        assert!(s.ours.lock().is_empty());
    }

    #[test]
    fn a_container_is_inspected_once_at_a_time_and_again_after_events_meanwhile() {
        let mut q = Queue::default();
        q.add("a".into(), None);
        q.add("b".into(), Some(5));
        q.add("a".into(), Some(3));
        assert_eq!(q.next_idle(), Some(("a".into(), Some(3))));
        // Events of `a` while it is inspected: `b` goes first, `a` waits.
        q.add("a".into(), None);
        q.add("a".into(), Some(7));
        assert_eq!(q.died("a"), Some(7));
        assert_eq!(q.next_idle(), Some(("b".into(), Some(5))));
        assert_eq!(q.next_idle(), None);
        q.done("a");
        assert_eq!(q.next_idle(), Some(("a".into(), Some(7))));
        assert_eq!(q.died("a"), None);
        q.done("a");
        q.done("b");
        assert_eq!(q.next_idle(), None);
        q.add("c".into(), None);
        assert_eq!(q.drain(), vec![("c".to_owned(), None)]);
        assert_eq!(q.next_idle(), None);
    }
}
