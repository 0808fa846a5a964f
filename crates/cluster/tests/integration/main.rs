//! Integration tests of `dwara-cluster`: in-process clusters over chitchat's
//! `ChannelTransport`, and one over real UDP on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
