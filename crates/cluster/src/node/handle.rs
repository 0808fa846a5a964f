//! The handle a caller holds: starting the engine, the node's identity, its
//! peers, router and metrics, and stopping it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::{Transport, UdpTransport};
use chitchat::{
    Chitchat, ChitchatConfig, ChitchatId, FailureDetectorConfig, ListenerHandle, ProtocolVersion,
    spawn_chitchat,
};
use dwara_records::Db;
use rand::SeedableRng;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::publish::Own;
use super::{BUCKET_PREFIX, Engine, LEGACY_PREFIX};
use crate::config::{ClusterConfig, KeySource};
use crate::datagram::Rejection;
use crate::error::{ClusterError, Result};
use crate::metrics::{Metrics, ValueRejection};
use crate::pace::Pacer;
use crate::peers::{PeerInfo, PeerState};
use crate::transport::{KeyReloader, Seal, SealedTransport};

/// A running cluster node. Dropping it stops replication (as [`Cluster::shutdown`]
/// does, without waiting).
#[derive(Debug)]
pub struct Cluster {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// What the engine shares with the handle, the router and the metrics.
pub(crate) struct Shared {
    pub(crate) node_id: String,
    pub(crate) generation: u64,
    pub(crate) gossip_addr: SocketAddr,
    pub(crate) metrics: Metrics,
    pub(crate) peers: parking_lot::Mutex<Vec<PeerInfo>>,
    /// The datagram seal, when the node has a key.
    pub(crate) seal: Option<Arc<Seal>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("node_id", &self.node_id)
            .field("generation", &self.generation)
            .field("gossip_addr", &self.gossip_addr)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// This node's row and the peers' rows.
    pub(crate) fn peers(&self) -> Vec<PeerInfo> {
        let mut out = vec![PeerInfo {
            node_id: self.node_id.clone(),
            generation: self.generation,
            gossip_addr: self.gossip_addr,
            state: PeerState::Live,
            local: true,
            entries: usize::try_from(self.metrics.entries_published.get()).unwrap_or(0),
        }];
        out.extend(self.peers.lock().iter().cloned());
        out
    }
}

impl Cluster {
    /// Starts replicating `db` over UDP gossip. `db.origin()` must be the node id.
    /// With a key every datagram is sealed ([`crate::datagram`]); without one gossip
    /// runs open, as the log says.
    pub async fn start(config: ClusterConfig, db: Arc<Db>) -> Result<Cluster> {
        config.validate()?;
        let metrics = Metrics::default();
        if let KeySource::File(path) = &config.key {
            crate::config::warn_if_readable_by_others(path);
        }
        match config.key.load()? {
            Some(keyring) => {
                let ids = keyring.ids();
                let seal = Arc::new(Seal::new(
                    config.cluster_id.clone(),
                    keyring,
                    config.key.clone(),
                    &metrics,
                ));
                tracing::info!(
                    node_id = %config.node_id,
                    keys = ?ids,
                    "cluster key loaded: every gossip datagram is sealed (XChaCha20-Poly1305) with the first key and opened with any, nodes without a key are not heard"
                );
                let transport = SealedTransport::with_seal(seal.clone());
                Self::start_inner(config, db, &transport, metrics, Some(seal)).await
            }
            None => {
                tracing::warn!(
                    node_id = %config.node_id,
                    "no cluster key: gossip runs open (unauthenticated, unencrypted); anyone reaching the gossip port can join and add, hide or delete names"
                );
                Self::start_inner(config, db, &UdpTransport, metrics, None).await
            }
        }
    }

    /// Starts replicating `db` over `transport` (chitchat's `UdpTransport`, or its
    /// in-process `ChannelTransport` in tests), unsealed: a configured key is an
    /// error, since only [`Cluster::start`]'s transport seals datagrams.
    pub async fn start_with_transport(
        config: ClusterConfig,
        db: Arc<Db>,
        transport: &dyn Transport,
    ) -> Result<Cluster> {
        config.validate()?;
        if config.key != KeySource::Open {
            return Err(ClusterError::InvalidSetting {
                setting: "key",
                reason: "a cluster key seals datagrams only over Cluster::start's UDP transport"
                    .to_owned(),
            });
        }
        Self::start_inner(config, db, transport, Metrics::default(), None).await
    }

    async fn start_inner(
        config: ClusterConfig,
        db: Arc<Db>,
        transport: &dyn Transport,
        metrics: Metrics,
        seal: Option<Arc<Seal>>,
    ) -> Result<Cluster> {
        if db.origin() != config.node_id {
            return Err(ClusterError::OriginMismatch {
                origin: db.origin().to_owned(),
                node_id: config.node_id.clone(),
            });
        }
        let generation = config.generation_id.unwrap_or_else(rand::random);
        let advertise = config.advertise_addr();
        let chitchat_config = chitchat_config(&config, generation, advertise);
        // Subscribe before anything is read so no change falls between the two.
        let changes = db.subscribe();
        // Entries of other origins are from an earlier run; a peer's current ones come
        // back from gossip.
        let foreign: HashSet<String> = db
            .entries()
            .into_iter()
            .filter(|e| e.origin != config.node_id)
            .map(|e| e.origin)
            .collect();
        for origin in foreign {
            db.purge_origin(&origin);
        }
        let handle = spawn_chitchat(chitchat_config, Vec::new(), transport)
            .await
            .map_err(|source| ClusterError::Start {
                addr: config.gossip_listen,
                source: source.into(),
            })?;
        let chitchat = handle.chitchat();
        let notify = Arc::new(Notify::new());
        let (listeners, live_rx) = {
            let cc = chitchat.lock().await;
            let listeners = notify_on_peer_keys(&cc, &config.node_id, &notify);
            (listeners, cc.live_nodes_watcher())
        };
        let shared = Arc::new(Shared {
            node_id: config.node_id.clone(),
            generation,
            gossip_addr: advertise,
            metrics,
            peers: parking_lot::Mutex::new(Vec::new()),
            seal,
        });
        tracing::info!(
            node_id = %config.node_id,
            generation,
            listen = %config.gossip_listen,
            advertise = %advertise,
            peers = ?config.peers,
            cluster_id = %config.cluster_id,
            "cluster gossip started"
        );
        let cancel = CancellationToken::new();
        let engine = Engine {
            db,
            shared: shared.clone(),
            handle,
            chitchat,
            changes,
            own: Own::new(),
            remotes: HashMap::new(),
            pacer: Pacer::default(),
            push_fanout: config.push_fanout,
            rng: rand::rngs::SmallRng::from_rng(&mut rand::rng()),
            last_flush: None,
            flush_due: None,
        };
        let backstop = (config.gossip_interval * 10).max(Duration::from_millis(100));
        let task = tokio::spawn(engine.run(notify, live_rx, listeners, cancel.clone(), backstop));
        Ok(Cluster {
            shared,
            cancel,
            task: Some(task),
        })
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.shared.node_id
    }

    /// This incarnation's generation.
    pub fn generation(&self) -> u64 {
        self.shared.generation
    }

    /// The advertised gossip address.
    pub fn gossip_addr(&self) -> SocketAddr {
        self.shared.gossip_addr
    }

    /// This node (`local: true`) and every peer known, live or dead, with their
    /// entry counts.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.shared.peers()
    }

    /// How many gossiped values were rejected for `why`.
    pub fn rejected_values(&self, why: ValueRejection) -> u64 {
        self.shared.metrics.rejected(why)
    }

    /// What re-reads the key file (SIGHUP, `POST /reload`), when the key comes from
    /// one.
    pub fn key_reloader(&self) -> Option<KeyReloader> {
        self.shared.seal.clone().and_then(KeyReloader::new)
    }

    /// How many gossip datagrams were rejected for `why` (always 0 without a key).
    pub fn rejected_datagrams(&self, why: Rejection) -> u64 {
        self.shared.seal.as_ref().map_or(0, |s| s.rejected(why))
    }

    /// How many gossip datagrams were opened (always 0 without a key).
    pub fn opened_datagrams(&self) -> u64 {
        self.shared.metrics.opened_datagrams.get()
    }

    /// `GET /peers`: [`Cluster::peers`] as JSON.
    pub fn router(&self) -> axum::Router {
        crate::peers::router(self.shared.clone())
    }

    /// Registers the cluster's metrics.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.shared.metrics.register(registry);
    }

    /// Stops gossip and waits for the engine to finish. Entries already applied stay
    /// in the database.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(err) = task.await
        {
            tracing::warn!(error = %err, "cluster task ended abnormally");
        }
    }
}

/// chitchat's configuration for this node.
fn chitchat_config(
    config: &ClusterConfig,
    generation: u64,
    advertise: SocketAddr,
) -> ChitchatConfig {
    let fd = &config.failure_detector;
    ChitchatConfig {
        chitchat_id: ChitchatId::new(config.node_id.as_str(), generation, advertise),
        cluster_id: config.cluster_id.clone(),
        gossip_interval: config.gossip_interval,
        listen_addr: config.gossip_listen,
        seed_nodes: config.peers.clone(),
        failure_detector_config: FailureDetectorConfig {
            phi_threshold: fd.phi_threshold,
            sampling_window_size: fd.sampling_window_size,
            max_interval: fd.max_interval,
            // Without this the first detection of a dead peer takes the default 5 s prior.
            initial_interval: config.gossip_interval,
            dead_node_grace_period: fd.dead_node_grace,
        },
        marked_for_deletion_grace_period: config.tombstone_grace,
        catchup_callback: None,
        extra_liveness_predicate: None,
        protocol_version: ProtocolVersion::V0,
    }
}

/// Wakes `notify` whenever a peer's entry keys change (this node's own do not).
fn notify_on_peer_keys(cc: &Chitchat, node_id: &str, notify: &Arc<Notify>) -> Vec<ListenerHandle> {
    let own: Arc<str> = Arc::from(node_id);
    [BUCKET_PREFIX, LEGACY_PREFIX]
        .into_iter()
        .map(|prefix| {
            let own = own.clone();
            let n = notify.clone();
            cc.subscribe_event(prefix, move |ev| {
                if ev.node.node_id != own {
                    n.notify_one();
                }
            })
        })
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
