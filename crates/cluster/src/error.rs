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
    /// A line of the key file is not a key.
    #[error("cluster key file {path}, line {line}: {source} (make a key with `dwara keygen`)")]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// The line (from 1).
        line: usize,
        /// Why.
        #[source]
        source: crate::config::KeyParseError,
    },
    /// The key file holds no key.
    #[error("cluster key file {path} holds no key (make one with `dwara keygen`)")]
    KeyFileEmpty {
        /// The key file.
        path: PathBuf,
    },
    /// The key file holds more keys than a keyring takes.
    #[error("cluster key file {path} holds more than {max} keys", max = crate::config::MAX_KEYS)]
    KeyFileTooMany {
        /// The key file.
        path: PathBuf,
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
