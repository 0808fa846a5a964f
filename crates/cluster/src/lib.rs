//! Replication of the name server's records database over chitchat gossip.
//!
//! Every node runs a [`Cluster`] beside its [`dwara_records::Db`]. The node
//! publishes its own entries (origin = its node id) as chitchat key-values, a bucket
//! of up to [`BUCKET_BYTES`] of entries per key, merges
//! every peer's entries into its database under the peer's node id, hides the entries
//! of a peer chitchat's failure detector declares dead and shows them again when it
//! is back, replaces a restarted peer's old entries with its new ones, and forgets a
//! peer chitchat forgets. A local change is pushed to the live peers at once (the
//! changes that follow within 10 ms go in one round at the end of that gap); the
//! periodic gossip rounds are the anti-entropy backstop. No decision reads a clock.
//!
//! With a [`ClusterKey`] every gossip datagram is sealed (XChaCha20-Poly1305, random
//! nonce, bound to the cluster id; [`datagram`]) and opened on arrival; what does not
//! open is dropped and counted by reason. What the key protects, and what it does not:
//!
//! - **Protected:** a node without the key is not heard: it never appears among the
//!   peers, cannot add, change, hide or delete a name, keep a removed one, or fake a
//!   heartbeat, and reads no name or address. A datagram a node has accepted is
//!   refused a second time (a per-sender replay window, no clock).
//! - **Not protected:** a node that never heard a sender accepts that sender's
//!   captured datagrams once each; chitchat ignores their versions when it knows
//!   newer ones, and a fresh node replaces what it learnt from them at the next round
//!   with a key holder. Datagram sizes, rate and endpoints are visible. Key holders
//!   are trusted alike: any of them can publish any name. Values are not sealed one
//!   by one (see [`codec`]). Without a key gossip runs open: anyone reaching the
//!   gossip port can join and change names, and the log says so.
//!
//! A key file ([`parse_key_file`]) may hold several keys: the first seals, all open.
//! [`Cluster::key_reloader`] reads it again (the binary does on SIGHUP and `POST
//! /reload`), and a file that does not parse leaves the keyring as it was, so a
//! cluster changes its key without downtime: add the new key everywhere, make it
//! first everywhere, remove the old one.
//!
//! The wire encoding is described in [`codec`].
//!
//! ```no_run
//! # async fn demo(db: std::sync::Arc<dwara_records::Db>) -> Result<(), dwara_cluster::ClusterError> {
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
pub mod datagram;
mod error;
mod invalid;
mod metrics;
mod node;
mod pace;
mod peers;
mod transport;

pub use chitchat::transport::{ChannelTransport, Transport, UdpTransport};
pub use config::{
    ClusterConfig, ClusterKey, DEFAULT_CLUSTER_ID, DEFAULT_GOSSIP_INTERVAL, DEFAULT_PUSH_FANOUT,
    DEFAULT_TOMBSTONE_GRACE, FailureDetectorSettings, KEY_LEN, KeyParseError, KeySource, MAX_KEYS,
    generate_key, parse_key_file, read_key_file,
};
pub use error::{ClusterError, Result};
pub use invalid::{
    SUMMARY_EVERY, WARNINGS_PER_WINDOW, count_invalid_datagram, count_suppressed_warning,
    invalid_datagrams, is_chitchat_warning, is_invalid_datagram_event, suppressed_warnings,
};
pub use node::{BUCKET_BYTES, Cluster};
pub use peers::{PeerInfo, PeerState};
pub use transport::{CODEC_WAIT, KeyReloader, SealedTransport};
