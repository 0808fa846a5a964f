#![doc = include_str!("../README.md")]
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
pub use metrics::ValueRejection;
pub use node::{BUCKET_BYTES, Cluster};
pub use peers::{PeerInfo, PeerState};
pub use transport::{CODEC_WAIT, KeyReloader, SealedTransport};
