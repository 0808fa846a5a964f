//! The dataplane's HTTP routes: `GET /upstreams`, for the binary's listener.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::Dataplane;

pub(crate) fn router(dataplane: Arc<Dataplane>) -> Router {
    Router::new()
        .route("/upstreams", get(upstreams))
        .with_state(dataplane)
}

async fn upstreams(State(dp): State<Arc<Dataplane>>) -> Response {
    axum::Json(dp.status_json()).into_response()
}
