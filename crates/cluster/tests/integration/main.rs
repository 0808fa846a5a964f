//! Integration tests of `dwara-cluster`: in-process clusters over chitchat's
//! `ChannelTransport` (links cut and healed with `remove_link`/`add_link`), and one
//! over real UDP on loopback. Every wait is on an observable condition with a timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod buckets;
mod clock;
mod membership;
mod replication;
mod sealed;
mod support;
mod udp;
