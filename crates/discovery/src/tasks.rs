//! [`DiscoveryTasks`]: the refresh loops of one configuration generation.

use std::sync::Arc;

use dwara_lb::UpstreamLb;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, info_span};

use crate::DiscoverySource;
use crate::refresh::{self, DiscoveryStats, RefreshPolicy};

/// Discovery of one upstream: where to publish, what to ask, how often.
#[derive(Debug, Clone)]
pub struct UpstreamDiscovery {
    /// Upstream name (logs, metrics, status).
    pub name: Arc<str>,
    /// The load balancer the loop publishes into.
    pub lb: Arc<UpstreamLb>,
    /// The source of endpoints.
    pub source: Arc<dyn DiscoverySource>,
    /// Timing and policy.
    pub policy: RefreshPolicy,
    /// Live statistics (share the `Arc` across generations to keep counting).
    pub stats: Arc<DiscoveryStats>,
}

impl UpstreamDiscovery {
    /// Discovery of `name` with fresh statistics.
    pub fn new(
        name: impl Into<Arc<str>>,
        lb: Arc<UpstreamLb>,
        source: Arc<dyn DiscoverySource>,
        policy: RefreshPolicy,
    ) -> Self {
        Self {
            name: name.into(),
            lb,
            source,
            policy,
            stats: Arc::new(DiscoveryStats::default()),
        }
    }
}

/// What discovery runs for one configuration generation.
#[derive(Debug, Clone, Default)]
pub struct DiscoverySnapshot {
    /// Generation number of the configuration (increases on every reload).
    pub generation: u64,
    /// The upstreams that follow a source.
    pub upstreams: Vec<UpstreamDiscovery>,
}

/// Owns every discovery task of the running generation in one `JoinSet`.
///
/// [`respawn`](Self::respawn) replaces the whole generation; [`abort_all`](Self::abort_all)
/// and `Drop` stop everything (aborted tasks make no further queries).
#[derive(Debug, Default)]
pub struct DiscoveryTasks {
    set: JoinSet<()>,
    generation: Option<u64>,
}

impl DiscoveryTasks {
    /// No tasks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Aborts every task of the previous generation and spawns one refresh loop per
    /// upstream of `snapshot`. Must be called inside a tokio runtime.
    pub fn respawn(&mut self, snapshot: &DiscoverySnapshot) {
        let previous = self.set.len();
        self.abort_all();
        for up in &snapshot.upstreams {
            let span =
                info_span!("discovery", upstream = %up.name, generation = snapshot.generation);
            self.set.spawn(
                refresh::run(
                    up.name.clone(),
                    up.source.clone(),
                    up.lb.clone(),
                    up.policy.clone(),
                    up.stats.clone(),
                )
                .instrument(span),
            );
        }
        self.generation = Some(snapshot.generation);
        // A name server without upstreams has nothing to report here.
        if previous == 0 && snapshot.upstreams.is_empty() {
            debug!(generation = snapshot.generation, "no discovery tasks");
        } else {
            info!(
                generation = snapshot.generation,
                aborted = previous,
                spawned = snapshot.upstreams.len(),
                "discovery tasks respawned"
            );
        }
    }

    /// Aborts every task. Dropping the old `JoinSet` aborts its tasks; they are
    /// cancelled at their next await point and make no further queries.
    pub fn abort_all(&mut self) {
        let old = std::mem::take(&mut self.set);
        drop(old);
    }

    /// Aborts every task and waits until all have stopped.
    pub async fn shutdown(&mut self) {
        self.set.abort_all();
        while self.set.join_next().await.is_some() {}
    }

    /// Number of running tasks.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether no task runs.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Generation of the running tasks, if any were spawned.
    pub fn generation(&self) -> Option<u64> {
        self.generation
    }
}

impl Drop for DiscoveryTasks {
    fn drop(&mut self) {
        self.set.abort_all();
    }
}
