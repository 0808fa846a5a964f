//! Docker updater: registers running containers into the name server's records
//! database and removes them when they stop, never leaving a stale name.
//!
//! [`DockerUpdater::start`] connects to the daemon's unix socket, negotiates the API
//! version, lists the running containers and **reconciles** (adds what runs and is
//! missing, removes what this updater registered for containers that no longer run),
//! then follows the event stream (`start`, `die`, `destroy`, `rename`, network
//! `connect`/`disconnect`) from the last event seen. Every event makes the updater
//! inspect the container and set its records to what its *current* state says, a
//! `die` also compared with the container's start time, so a late event of an old
//! incarnation never removes the new one and a container that dies before its
//! `start` is handled is never left registered. A `die` also removes the records of
//! the incarnation it ends as soon as it is read, without waiting for that inspect
//! (the daemon answers it only once it has torn the container's network down). When
//! the stream ends, the updater retries with capped backoff and reconciles again on
//! return.
//!
//! Names (see [`NameSources`]): `Hostname.Domainname` when it falls in the domain,
//! and optionally the container name and network aliases under the domain; the
//! addresses (IPv4 and global IPv6) of every network or of one. The record id is the
//! full container id. Only records this updater made are ever removed by it: entries
//! registered by hand over HTTP are left alone.
//!
//! Ports ([`service_of`]): the label `dwara.port=P` registers every name of the
//! container with port P, answered as SRV; `dwara.service=_name._tcp` names the
//! service, else it is `_<P>._<proto>` (`_udp` when P is exposed as UDP only). A bad
//! value is logged and counted, and the names are registered without a service.
//!
//! Oldest Docker API version the calls need: [`ApiVersion::OLDEST`] (1.24).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use dwara_docker::{DockerConfig, DockerMode, DockerUpdater, Started};
//! use dwara_records::{Db, DbConfig, Domain};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let db = Arc::new(Db::new(DbConfig::new(Domain::new("weave.local")?)));
//! let mut config = DockerConfig::new();
//! config.mode = "auto".parse::<DockerMode>()?;
//! config.names = "hostname,name".parse()?;
//! match DockerUpdater::start(config, db.clone()).await? {
//!     Started::Running(updater) => {
//!         // `docker run --hostname web1 --domainname weave.local …` is now
//!         // answered: db.lookup("web1.weave.local") has its address.
//!         updater.shutdown().await;
//!     }
//!     Started::Off(why) => tracing::info!("{why}"),
//! }
//! # Ok(())
//! # }
//! ```

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
pub use names::{PORT_LABEL, SERVICE_LABEL, desired_records, service_of};
pub use updater::{DockerOff, DockerUpdater, Repair, Started};
