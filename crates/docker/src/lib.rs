#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod config;
mod error;
mod metrics;
mod names;
mod time;
mod updater;

pub use config::{
    ApiVersion, Backoff, DEFAULT_SOCKET, DockerConfig, DockerMode, NameSource, NameSources,
    default_socket,
};
pub use error::{Error, Result};
#[doc(hidden)]
pub use names::{
    PORT_LABEL, PRIORITY_LABEL, SERVICE_LABEL, WEIGHT_LABEL, desired_records, service_of,
};
pub use updater::{DockerOff, DockerUpdater, Repair, Started};
