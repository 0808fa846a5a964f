//! End-to-end tests of the `dwara` binary against real servers (dnsmasq, dig,
//! the in-process test DNS server and other `dwara` processes).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod cluster;
mod docker;
mod faults;
mod guard;
mod hostile;
mod hostile_http;
mod http_upstreams;
mod http_wiring;
mod interop;
mod nameserver;
mod push;
mod serve;
mod slow_bodies;
mod store;
mod upgrades;
mod watch;
mod weights;
