//! Integration tests of `dwara-nameserver`: the server runs in-process, dig (and raw
//! sockets) query it, a real dnsmasq is its fallback.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod checks;
mod dns;
mod forward;
mod http;
mod rfc8906;
mod srv;
mod support;
mod udp;
