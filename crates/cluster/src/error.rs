//! The crate's error type.

use std::path::PathBuf;

/// What can go wrong configuring or starting the cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The key file could not be read.
    #[error("cannot read cluster key file {path}")]
    KeyFileRead {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key file is not base64.
    #[error("cluster key file {path} is not base64 (make one with `dwara keygen`)")]
    KeyFileBase64 {
        /// The key file.
        path: PathBuf,
        /// Why.
        #[source]
        source: base64::DecodeError,
    },
    /// The key file decodes to the wrong number of bytes.
    #[error(
        "cluster key file {path} holds {len} bytes, a cluster key is 32 (make one with `dwara keygen`)"
    )]
    KeyFileLength {
        /// The key file.
        path: PathBuf,
        /// How many bytes it decoded to.
        len: usize,
    },
    /// A setting is out of range.
    #[error("invalid cluster setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The database's origin is not this node's id.
    #[error("the records database's origin {origin:?} is not the cluster node id {node_id:?}")]
    OriginMismatch {
        /// The database's origin.
        origin: String,
        /// The configured node id.
        node_id: String,
    },
    /// chitchat failed to start (typically: the gossip address cannot be bound).
    #[error("cannot start gossip on {addr}")]
    Start {
        /// The gossip listen address.
        addr: std::net::SocketAddr,
        /// chitchat's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

/// `Result` with [`ClusterError`].
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
