//! The cluster's Prometheus metrics (prometheus-client).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label of a peer-count gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct StateLabel {
    pub(crate) state: &'static str,
}

/// Label of the key-reload counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    pub(crate) result: &'static str,
}

/// Label of the rejected-values counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: &'static str,
}

/// Why a gossiped value was not applied (the `reason` label of
/// `dwara_cluster_rejected_values`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueRejection {
    /// The value does not decode (see [`crate::codec::DecodeError`]).
    Malformed,
    /// The value was published for another chitchat version than the key's: a replay.
    Version,
    /// An entry's name is not inside this node's domain.
    OutsideDomain,
}

impl ValueRejection {
    /// Every reason, in label order.
    pub const ALL: [ValueRejection; 3] = [Self::Malformed, Self::Version, Self::OutsideDomain];

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Version => "version",
            Self::OutsideDomain => "outside_domain",
        }
    }
}

/// The counters and gauges one cluster node keeps.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) peers: Family<StateLabel, Gauge>,
    pub(crate) entries_published: Gauge,
    pub(crate) buckets_published: Gauge,
    pub(crate) entries_applied: Counter,
    pub(crate) rejected_values: Family<ReasonLabel, Counter>,
    pub(crate) pushes: Counter,
    pub(crate) resyncs: Counter,
    pub(crate) pulls: Counter,
    pub(crate) peer_resets: Counter,
    pub(crate) rejected_datagrams: Family<ReasonLabel, Counter>,
    pub(crate) sealed_datagrams: Counter,
    pub(crate) opened_datagrams: Counter,
    pub(crate) split_messages: Counter,
    pub(crate) gossip_keys: Gauge,
    pub(crate) key_reloads: Family<ResultLabel, Counter>,
}

impl Metrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "dwara_cluster_peers",
            "Peers (this node excluded) by failure-detector state",
            self.peers.clone(),
        );
        registry.register(
            "dwara_cluster_entries_published",
            "This node's live entries published in gossip",
            self.entries_published.clone(),
        );
        registry.register(
            "dwara_cluster_buckets_published",
            "chitchat keys (buckets of entries) this node publishes",
            self.buckets_published.clone(),
        );
        registry.register(
            "dwara_cluster_entries_applied",
            "Peer entries (and deletes) merged into the records database",
            self.entries_applied.clone(),
        );
        registry.register(
            "dwara_cluster_rejected_values",
            "Gossiped values not applied, by reason (malformed, version, outside_domain)",
            self.rejected_values.clone(),
        );
        registry.register(
            "dwara_cluster_pushes",
            "Gossip rounds started at once to push a local change",
            self.pushes.clone(),
        );
        registry.register(
            "dwara_cluster_pulls",
            "Gossip rounds started at once to catch up with a peer that sent a large delta",
            self.pulls.clone(),
        );
        registry.register(
            "dwara_cluster_invalid_datagrams",
            "Datagrams on the gossip port that were not chitchat messages, dropped (per process)",
            crate::invalid::counter(),
        );
        registry.register(
            "dwara_cluster_suppressed_warnings",
            "chitchat warnings left out of the log beyond its limit per 10 s (per process)",
            crate::invalid::suppressed_counter(),
        );
        registry.register(
            "dwara_cluster_peer_resets",
            "Times a peer's entries were compared whole because gossip reset its state (its tombstones were collected before this node saw them)",
            self.peer_resets.clone(),
        );
        registry.register(
            "dwara_cluster_rejected_datagrams",
            "Gossip datagrams dropped by the seal, by reason (malformed, bad_seal, replay, undecodable); 0 without a key",
            self.rejected_datagrams.clone(),
        );
        registry.register(
            "dwara_cluster_sealed_datagrams",
            "Gossip datagrams sealed and sent (0 without a key)",
            self.sealed_datagrams.clone(),
        );
        registry.register(
            "dwara_cluster_opened_datagrams",
            "Gossip datagrams that opened with a key of the keyring (0 without a key)",
            self.opened_datagrams.clone(),
        );
        registry.register(
            "dwara_cluster_split_messages",
            "Gossip messages sent as two sealed datagrams because one would be over the UDP limit",
            self.split_messages.clone(),
        );
        registry.register(
            "dwara_cluster_gossip_keys",
            "Keys in the gossip keyring (the first seals, all open; 0 without a key)",
            self.gossip_keys.clone(),
        );
        registry.register(
            "dwara_cluster_key_reloads",
            "Key file reloads (SIGHUP, POST /reload) by result (ok, error: the previous keyring stays)",
            self.key_reloads.clone(),
        );
        registry.register(
            "dwara_cluster_resyncs",
            "Times the local change feed lagged and the published keys were rebuilt from the database",
            self.resyncs.clone(),
        );
    }

    pub(crate) fn reject(&self, why: ValueRejection) {
        self.rejected_values
            .get_or_create(&ReasonLabel {
                reason: why.reason(),
            })
            .inc();
    }

    /// The rejected-values count for one reason.
    pub(crate) fn rejected(&self, why: ValueRejection) -> u64 {
        self.rejected_values
            .get_or_create(&ReasonLabel {
                reason: why.reason(),
            })
            .get()
    }
}
