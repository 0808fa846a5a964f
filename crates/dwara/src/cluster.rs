//! Wiring of `dwara-cluster` into `dwara serve`: flags over the config file's
//! `cluster:` section. Gossip runs when `--gossip-listen` (or `gossip_listen:`) is set.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use dwara_cluster::{ClusterConfig, KeySource};

use dwara::config::ClusterSection;

/// Cluster flags of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    /// This node's id, unique in the cluster; its entries carry it [default: the host name]
    #[arg(long)]
    node_id: Option<String>,
    /// UDP address to gossip on; turns the cluster on
    #[arg(long, value_name = "ADDR")]
    gossip_listen: Option<SocketAddr>,
    /// The address peers reach this node at [default: --gossip-listen]
    #[arg(long, value_name = "ADDR")]
    gossip_advertise: Option<SocketAddr>,
    /// A seed peer's gossip address, host:port (repeatable)
    #[arg(long = "peer", value_name = "ADDR")]
    peers: Vec<String>,
    /// Nodes talk only to nodes with the same cluster id [default: dwara]
    #[arg(long)]
    cluster_id: Option<String>,
    /// Milliseconds between periodic gossip rounds; changes are pushed at once [default: 100]
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    gossip_interval_ms: Option<u64>,
    /// Live peers a local change is pushed to at once, picked at random each time;
    /// the rest get it from the periodic rounds [default: 16]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    gossip_push_fanout: Option<u64>,
    /// File of cluster keys, one base64 key per line (`dwara keygen`): the first seals gossip, all open it; re-read on SIGHUP and POST /reload. Without it the cluster runs open
    #[arg(long, value_name = "PATH")]
    gossip_key_file: Option<PathBuf>,
}

/// The host name, for the default node id.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

impl ClusterArgs {
    /// The node id when one was given (flag, then file); `None` otherwise.
    pub(crate) fn explicit_node_id(&self, section: Option<&ClusterSection>) -> Option<String> {
        self.node_id
            .clone()
            .or_else(|| section.and_then(|s| s.node_id.clone()))
    }

    /// The cluster's configuration, or `None` when no gossip address is set.
    /// `tombstone_grace` is the records database's (deletes live as long in gossip).
    pub(crate) fn config(
        &self,
        section: Option<&ClusterSection>,
        tombstone_grace: Duration,
    ) -> anyhow::Result<Option<ClusterConfig>> {
        let empty = ClusterSection::default();
        let file = section.unwrap_or(&empty);
        let Some(listen) = self.gossip_listen.or(file.gossip_listen) else {
            return Ok(None);
        };
        let node_id = self
            .explicit_node_id(section)
            .or_else(hostname)
            .context("no --node-id and the host name cannot be read")?;
        let mut config = ClusterConfig::new(node_id, listen);
        config.gossip_advertise = self.gossip_advertise.or(file.gossip_advertise);
        config.peers = if self.peers.is_empty() {
            file.peers.clone()
        } else {
            self.peers.clone()
        };
        if let Some(id) = self.cluster_id.clone().or_else(|| file.cluster_id.clone()) {
            config.cluster_id = id;
        }
        if let Some(ms) = self.gossip_interval_ms.or(file.gossip_interval_ms) {
            config.gossip_interval = Duration::from_millis(ms);
        }
        if let Some(n) = self.gossip_push_fanout.or(file.push_fanout) {
            config.push_fanout = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(phi) = file.phi_threshold {
            config.failure_detector.phi_threshold = phi;
        }
        if let Some(s) = file.dead_node_grace_s {
            config.failure_detector.dead_node_grace = Duration::from_secs(s);
        }
        config.tombstone_grace = tombstone_grace;
        config.key = match self
            .gossip_key_file
            .clone()
            .or_else(|| file.gossip_key_file.clone())
        {
            Some(path) => KeySource::File(path),
            None => KeySource::Open,
        };
        // Validation reads the key file; the cluster keeps its path to read it again
        // on SIGHUP and `POST /reload`.
        config.validate()?;
        Ok(Some(config))
    }
}
