//! Replication of the name server's records database over chitchat gossip.
//!
//! Every node runs a [`Cluster`] beside its [`dwara_nameserver::Db`]. The node
//! publishes its own entries (origin = its node id) as chitchat key-values, a bucket
//! of up to [`BUCKET_BYTES`] of entries per key, merges
//! every peer's entries into its database under the peer's node id, hides the entries
//! of a peer chitchat's failure detector declares dead and shows them again when it
//! is back, replaces a restarted peer's old entries with its new ones, and forgets a
//! peer chitchat forgets. A local change is pushed to the live peers at once (the
//! changes that follow within 10 ms go in one round at the end of that gap); the
//! periodic gossip rounds are the anti-entropy backstop. No decision reads a clock.
//!
//! With a [`ClusterKey`] every value is sealed (XChaCha20-Poly1305, bound to the
//! cluster id, the publishing node id and generation and the key); values that do
//! not open are rejected and counted. What the key protects, and what it does not:
//!
//! - **Protected:** no node without the key can add a name, change a name's address
//!   or id, move a sealed value to another key, node or incarnation, or replay a
//!   node's old value under a newer version (the sealed record carries the chitchat
//!   version it was published at). Names and addresses are encrypted.
//! - **Not protected:** chitchat's own messages are not authenticated (its message
//!   serialisation is crate-private, so datagrams cannot be sealed without forking
//!   it). A node without the key can still join the gossip, appear in `/peers`, fake
//!   heartbeats, and forge deletes or a higher-version state for another node's keys,
//!   which removes or hides names, or keeps names that node removed from being
//!   removed (denial of service), but never adds one. The number
//!   of entries per node and their churn are visible to anyone on the network.
//!
//! The wire encoding is described in [`codec`].
//!
//! ```no_run
//! # async fn demo(db: std::sync::Arc<dwara_nameserver::Db>) -> Result<(), dwara_cluster::ClusterError> {
//! use dwara_cluster::{Cluster, ClusterConfig, KeySource};
//! let mut config = ClusterConfig::new(db.origin(), "10.0.0.1:6783".parse().unwrap());
//! config.peers = vec!["10.0.0.2:6783".into()];
//! config.key = KeySource::File("/etc/dwara/cluster.key".into());
//! let cluster = Cluster::start(config, db).await?;
//! let _router = cluster.router(); // GET /peers
//! for peer in cluster.peers() {
//!     println!("{} {:?} {} entries", peer.node_id, peer.state, peer.entries);
//! }
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod codec;
mod config;
mod error;
mod invalid;
mod metrics;
mod node;
mod pace;
mod peers;

pub use chitchat::transport::{ChannelTransport, Transport, UdpTransport};
pub use config::{
    ClusterConfig, ClusterKey, DEFAULT_CLUSTER_ID, DEFAULT_GOSSIP_INTERVAL,
    DEFAULT_TOMBSTONE_GRACE, FailureDetectorSettings, KEY_LEN, KeySource, generate_key,
};
pub use error::{ClusterError, Result};
pub use invalid::{
    SUMMARY_EVERY, WARNINGS_PER_WINDOW, count_invalid_datagram, count_suppressed_warning,
    invalid_datagrams, is_chitchat_warning, is_invalid_datagram_event, suppressed_warnings,
};
pub use node::{BUCKET_BYTES, Cluster};
pub use peers::{PeerInfo, PeerState};
