//! The HTTP API (axum): registrations, lookups, the domain and metrics.
//!
//! | request | effect |
//! |---|---|
//! | `PUT /name/<id>/<ip>`, form `fqdn=…` | add; 204; 400 with a message for a bad IP, a missing fqdn or one outside the domain |
//! | `DELETE /name/<id>/<ip>` (`fqdn` optional, form body or query) | tombstone; 204 also when nothing matched |
//! | `DELETE /name/<id>` | tombstone every entry of the id; 204 |
//! | `GET /name/<fqdn>` | 200 JSON array of IPs; 404 when none |
//! | `GET /name` | 200 JSON array of every entry |
//! | `GET /domain` | the domain as text |
//! | `GET /metrics` | Prometheus text |
//!
//! With a data dir, `PUT` and `DELETE` answer only once the change is durable, and
//! 500 with a message when the store could not confirm it.
//!
//! The form value is read from the body whatever its content type (so `curl -d` and
//! bare clients both work), and from the query string as well.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;

use crate::db::Db;
use crate::metrics::Metrics;

/// What the HTTP handlers work on.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The records database.
    pub db: Arc<Db>,
    /// The metrics rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Where registrations are made durable, when a data dir is configured.
    pub(crate) durable: Option<Arc<crate::durable::Durable>>,
}

/// The API's routes. Merge more routes into it before serving if needed.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/name", get(list))
        .route("/name/{id}", get(lookup).delete(remove_all))
        .route("/name/{id}/{ip}", axum::routing::put(add).delete(remove))
        .route("/domain", get(domain))
        .route("/metrics", get(metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such endpoint\n") })
        .layer(middleware::from_fn_with_state(state.clone(), count_status))
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = listener.tap_io(|tcp| {
        // Small request/response pairs on keep-alive connections: no Nagle delays.
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn count_status(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    state.metrics.record_http(resp.status().as_u16());
    resp
}

fn bad_request(msg: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, format!("{msg}\n")).into_response()
}

/// Decodes `application/x-www-form-urlencoded` text and returns the value of `key`
/// (the first pair with that key; `+` is a space, bad `%` escapes stay literal, invalid
/// UTF-8 is replaced). Public for fuzzing.
pub fn form_value(form: &[u8], key: &str) -> Option<String> {
    form.split(|&b| b == b'&').find_map(|pair| {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        (percent_decode(k) == key.as_bytes())
            .then(|| String::from_utf8_lossy(&percent_decode(v)).into_owned())
    })
}

fn percent_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// The `fqdn` parameter from the body, else the query string; empty counts as absent.
fn fqdn_param(body: &[u8], query: Option<&str>) -> Option<String> {
    form_value(body, "fqdn")
        .or_else(|| query.and_then(|q| form_value(q.as_bytes(), "fqdn")))
        .filter(|f| !f.trim().is_empty())
}

fn parse_ip(ip: &str) -> Result<IpAddr, crate::Error> {
    ip.parse().map_err(|_| crate::Error::InvalidAddress {
        input: ip.to_owned(),
    })
}

async fn add(
    State(state): State<ApiState>,
    Path((id, ip)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let ip = match parse_ip(&ip) {
        Ok(ip) => ip,
        Err(e) => return bad_request(e),
    };
    let Some(fqdn) = fqdn_param(&body, query.as_deref()) else {
        return bad_request("missing fqdn (form value fqdn=NAME)");
    };
    if id.is_empty() {
        return bad_request("empty id");
    }
    let done = crate::durable::add(&state.db, state.durable.as_ref(), &id, ip, &fqdn).await;
    outcome(done)
}

fn outcome(done: Result<(), crate::durable::Failure>) -> Response {
    match done {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(crate::durable::Failure::Rejected(e)) => bad_request(e),
        Err(crate::durable::Failure::NotStored(e)) => {
            let msg = crate::durable::chain(&e);
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{msg}\n")).into_response()
        }
    }
}

async fn remove(
    State(state): State<ApiState>,
    Path((id, ip)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    let ip = match parse_ip(&ip) {
        Ok(ip) => ip,
        Err(e) => return bad_request(e),
    };
    let fqdn = fqdn_param(&body, query.as_deref());
    let durable = state.durable.as_ref();
    outcome(crate::durable::remove(&state.db, durable, &id, Some(ip), fqdn.as_deref()).await)
}

async fn remove_all(State(state): State<ApiState>, Path(id): Path<String>) -> Response {
    outcome(crate::durable::remove(&state.db, state.durable.as_ref(), &id, None, None).await)
}

async fn lookup(State(state): State<ApiState>, Path(fqdn): Path<String>) -> Response {
    let addrs = state.db.lookup(&fqdn);
    if addrs.is_empty() {
        return (StatusCode::NOT_FOUND, format!("no records for {fqdn}\n")).into_response();
    }
    let ips: Vec<String> = addrs.iter().map(ToString::to_string).collect();
    axum::Json(ips).into_response()
}

async fn list(State(state): State<ApiState>) -> Response {
    axum::Json(state.db.entries()).into_response()
}

async fn domain(State(state): State<ApiState>) -> Response {
    format!("{}\n", state.db.domain()).into_response()
}

async fn metrics(State(state): State<ApiState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(&state.db),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_are_decoded() {
        assert_eq!(
            form_value(b"a=1&fqdn=foo.weave.local", "fqdn").as_deref(),
            Some("foo.weave.local")
        );
        assert_eq!(
            form_value(b"fqdn=a%2Eb+c", "fqdn").as_deref(),
            Some("a.b c")
        );
        assert_eq!(form_value(b"fqdn=%zz%4", "fqdn").as_deref(), Some("%zz%4"));
        assert_eq!(form_value(b"fqdn", "fqdn").as_deref(), Some(""));
        assert_eq!(form_value(b"", "fqdn"), None);
        assert_eq!(form_value(b"%", "fqdn"), None);
        assert_eq!(
            fqdn_param(b"", Some("fqdn=x.weave.local")).as_deref(),
            Some("x.weave.local")
        );
        assert_eq!(fqdn_param(b"fqdn=", None), None);
    }
}
