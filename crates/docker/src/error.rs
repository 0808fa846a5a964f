//! The one error type of `dwara-docker`.

use std::path::PathBuf;

use crate::config::ApiVersion;

/// What went wrong in the Docker updater, and with which input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--docker` was not `auto`, `on` or `off`.
    #[error("invalid Docker mode {input:?}: expected auto, on or off")]
    InvalidMode {
        /// The text as given.
        input: String,
    },
    /// `--docker-names` was not a comma-separated list of `hostname`, `name`, `aliases`.
    #[error("invalid Docker name sources {input:?}: {reason}")]
    InvalidNames {
        /// The text as given.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The backoff settings make no sense (zero, or the cap below the start).
    #[error("invalid Docker reconnect backoff: {reason}")]
    InvalidBackoff {
        /// Why it was rejected.
        reason: String,
    },
    /// An API version was not `MAJOR.MINOR`.
    #[error("invalid Docker API version {input:?}: expected MAJOR.MINOR, e.g. 1.41")]
    InvalidApiVersion {
        /// The text as given.
        input: String,
    },
    /// The daemon could not be reached (or answered with an error) on the socket.
    #[error("cannot reach the Docker daemon on {socket}: {source}", socket = socket.display())]
    Unreachable {
        /// The socket path.
        socket: PathBuf,
        /// What bollard reported.
        #[source]
        source: bollard::errors::Error,
    },
    /// The daemon speaks an API older than the calls this updater makes.
    #[error(
        "the Docker daemon on {socket} speaks API {daemon}, older than {oldest}, the oldest this updater supports",
        socket = socket.display()
    )]
    ApiTooOld {
        /// The socket path.
        socket: PathBuf,
        /// The daemon's (maximum) API version.
        daemon: ApiVersion,
        /// The oldest API version the updater's calls need.
        oldest: ApiVersion,
    },
    /// The daemon's `/version` answer carried no parsable API version.
    #[error("the Docker daemon on {socket} reported no usable API version (got {got:?})", socket = socket.display())]
    NoApiVersion {
        /// The socket path.
        socket: PathBuf,
        /// What it reported, if anything.
        got: Option<String>,
    },
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
