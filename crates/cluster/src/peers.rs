//! The peers view: [`PeerInfo`] rows and the `GET /peers` route.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::node::Shared;

/// Whether chitchat's failure detector considers a node live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PeerState {
    /// Heartbeats arrive: its entries are served.
    Live,
    /// Declared dead: its entries are hidden until it is live again.
    Dead,
}

/// One node as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerInfo {
    /// The node's id (the origin of its entries).
    pub node_id: String,
    /// The incarnation adopted.
    pub generation: u64,
    /// Where it gossips.
    pub gossip_addr: SocketAddr,
    /// Live or dead.
    pub state: PeerState,
    /// Whether this row is this node itself.
    pub local: bool,
    /// Its live entries (for this node: the ones it publishes).
    pub entries: usize,
}

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().route(
        "/peers",
        get(move || {
            let shared = shared.clone();
            async move { Json(shared.peers()) }
        }),
    )
}
