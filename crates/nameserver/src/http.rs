//! The HTTP API (axum): registrations, lookups and the domain, as a [`Router`] the
//! binary serves on its one listener (beside `/metrics` and the other components'
//! routes).
//!
//! | request | effect |
//! |---|---|
//! | `PUT /name/<id>/<ip>`, form `fqdn=…`, optional `port=1..65535`, `service=_name._tcp`, `check=tcp` | add (or replace the entry's service, port and check); 204; 400 with a message for a bad IP, a missing fqdn or one outside the domain, a bad port or service, a service without a port, an unknown check or a check without a port |
//! | `DELETE /name/<id>/<ip>` (`fqdn` optional, form body or query) | tombstone; 204 also when nothing matched |
//! | `DELETE /name/<id>` | tombstone every entry of the id; 204 |
//! | either DELETE matching only other nodes' live entries | 409, JSON `{"error", "owners": [node…]}` |
//! | `GET /name/<fqdn>` | 200 JSON array of IPs; 404 when none |
//! | `GET /name/<service>.<fqdn>` | 200 JSON array of the service's endpoints, `"ip:port"` (`"[v6]:port"`); 404 when none |
//! | `GET /name` | 200 JSON array of every live entry (with `service` and `port` when it has them, `health` when it is checked, `check` when this node runs its check); `?tombstones=true` adds tombstones, `?fqdn=<fqdn>` keeps one name's |
//! | `GET /domain` | the domain as text |
//!
//! A `port` without `service` registers the service `_<port>._tcp`. With
//! `check=tcp` this node connects to the entry's address and port every check
//! interval (see `checks`): the entry is not answered before the first connect
//! succeeds, and leaves the answers after the configured number of failures in a
//! row (unless its whole name fails open). A `PUT` without `check` on a checked
//! entry removes the check; a `DELETE` stops it.
//!
//! With a data dir, `PUT` and `DELETE` answer only once the change is durable, and
//! 500 with a message when the store could not confirm it.
//!
//! The form value is read from the body whatever its content type (so `curl -d` and
//! bare clients both work), and from the query string as well; both are decoded by
//! `form_urlencoded`.

use std::net::IpAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::checks::{CheckKind, Checks};
use crate::metrics::Metrics;
use dwara_records::{Db, Entry};

/// What the HTTP handlers work on.
#[derive(Debug, Clone)]
pub struct ApiState {
    /// The records database.
    pub db: Arc<Db>,
    /// Counts responses by status.
    pub metrics: Arc<Metrics>,
    /// Where registrations are made durable, when a data dir is configured.
    pub(crate) durable: Option<Arc<crate::durable::Durable>>,
    /// The checks of `check=tcp` registrations.
    pub(crate) checks: Checks,
}

/// The API's routes, for the binary to merge onto its listener.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/name", get(list))
        .route("/name/{id}", get(lookup).delete(remove_all))
        .route("/name/{id}/{ip}", axum::routing::put(add).delete(remove))
        .route("/domain", get(domain))
        .layer(middleware::from_fn_with_state(state.clone(), count_status))
        .with_state(state)
}

async fn count_status(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    state.metrics.record_http(resp.status().as_u16());
    resp
}

fn bad_request(msg: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, format!("{msg}\n")).into_response()
}

/// Decodes `application/x-www-form-urlencoded` text (`form_urlencoded`) and returns
/// the value of `key`: the first pair with that key; `+` is a space, bad `%` escapes
/// stay literal, invalid UTF-8 is replaced. Public for fuzzing.
pub fn form_value(form: &[u8], key: &str) -> Option<String> {
    form_urlencoded::parse(form).find_map(|(k, v)| (k == key).then(|| v.into_owned()))
}

/// The `key` parameter from the body, else the query string; empty counts as absent.
fn param(body: &[u8], query: Option<&str>, key: &str) -> Option<String> {
    form_value(body, key)
        .or_else(|| query.and_then(|q| form_value(q.as_bytes(), key)))
        .filter(|f| !f.trim().is_empty())
}

/// The `fqdn` parameter.
fn fqdn_param(body: &[u8], query: Option<&str>) -> Option<String> {
    param(body, query, "fqdn")
}

/// The service of a registration from its `port` and `service` form values: none
/// without a port, `_<port>._tcp` for a port alone. Public for fuzzing.
pub fn service_param(
    port: Option<&str>,
    service: Option<&str>,
) -> Result<Option<crate::ServicePort>, crate::Error> {
    match (port, service) {
        (None, None) => Ok(None),
        (None, Some(s)) => Err(dwara_records::Error::ServiceWithoutPort {
            service: s.to_owned(),
        }
        .into()),
        (Some(p), None) => Ok(Some(crate::ServicePort::unnamed(
            dwara_records::parse_port(p)?,
            crate::Protocol::Tcp,
        ))),
        (Some(p), Some(s)) => Ok(Some(crate::ServicePort::parse(s, p)?)),
    }
}

/// The check of a registration from its `check` form value and its service: none
/// without a value; a known kind (`tcp`) with a service, whose port it connects to.
/// Public for fuzzing.
pub fn check_param(
    check: Option<&str>,
    service: Option<&crate::ServicePort>,
) -> Result<Option<CheckKind>, crate::Error> {
    let Some(check) = check else {
        return Ok(None);
    };
    let kind = CheckKind::parse(check)?;
    if service.is_none() {
        return Err(crate::Error::CheckWithoutPort {
            check: check.to_owned(),
        });
    }
    Ok(Some(kind))
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
    let port = param(&body, query.as_deref(), "port");
    let service = param(&body, query.as_deref(), "service");
    let service = match service_param(port.as_deref(), service.as_deref()) {
        Ok(s) => s,
        Err(e) => return bad_request(e),
    };
    let check = param(&body, query.as_deref(), "check");
    let check = match check_param(check.as_deref(), service.as_ref()) {
        Ok(c) => c,
        Err(e) => return bad_request(e),
    };
    let add = crate::durable::Add {
        id: &id,
        ip,
        fqdn: &fqdn,
        service: service.as_ref(),
        check,
    };
    let durable = state.durable.as_ref();
    outcome(crate::durable::add(&state.db, &state.checks, durable, add).await)
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
    if let Some(conflict) = owned_elsewhere(&state.db, &id, Some(ip), fqdn.as_deref()) {
        return conflict;
    }
    let durable = state.durable.as_ref();
    let removed = crate::durable::remove(
        &state.db,
        &state.checks,
        durable,
        &id,
        Some(ip),
        fqdn.as_deref(),
    );
    outcome(removed.await)
}

async fn remove_all(State(state): State<ApiState>, Path(id): Path<String>) -> Response {
    if let Some(conflict) = owned_elsewhere(&state.db, &id, None, None) {
        return conflict;
    }
    let durable = state.durable.as_ref();
    outcome(crate::durable::remove(&state.db, &state.checks, durable, &id, None, None).await)
}

/// `409` naming the owners when a delete matches live entries of other nodes only:
/// a node deletes only what it owns. Nothing matched anywhere stays a `204`.
fn owned_elsewhere(db: &Db, id: &str, ip: Option<IpAddr>, fqdn: Option<&str>) -> Option<Response> {
    let origins = db.live_origins(id, ip, fqdn);
    if origins.is_empty() || origins.iter().any(|o| o == db.origin()) {
        return None;
    }
    let body = serde_json::json!({
        "error": format!("{id}: owned by other nodes; delete it on its owner"),
        "owners": origins,
    });
    Some((StatusCode::CONFLICT, axum::Json(body)).into_response())
}

async fn lookup(State(state): State<ApiState>, Path(fqdn): Path<String>) -> Response {
    let addrs = state.db.lookup(&fqdn);
    if !addrs.is_empty() {
        let ips: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        return axum::Json(ips).into_response();
    }
    let endpoints = state.db.lookup_service(&fqdn);
    if !endpoints.is_empty() {
        let eps: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
        return axum::Json(eps).into_response();
    }
    (StatusCode::NOT_FOUND, format!("no records for {fqdn}\n")).into_response()
}

async fn list(State(state): State<ApiState>, RawQuery(query): RawQuery) -> Response {
    let with_tombstones = query
        .as_deref()
        .and_then(|q| form_value(q.as_bytes(), "tombstones"))
        .is_some_and(|v| v == "true" || v == "1");
    let mut entries = state.db.entries();
    if !with_tombstones {
        entries.retain(|e| !e.tombstone);
    }
    if let Some(only) = query
        .as_deref()
        .and_then(|q| form_value(q.as_bytes(), "fqdn"))
    {
        // Compared as names: any case, trailing dot optional; a bad name matches none.
        let wire = |n: &str| {
            dwara_records::parse_name(n)
                .ok()
                .map(|n| dwara_records::wire_lower(&n))
        };
        let only = wire(&only);
        entries.retain(|e| only.is_some() && wire(&e.fqdn) == only);
    }
    let listed: Vec<Listed> = entries
        .into_iter()
        .map(|entry| Listed {
            check: (!entry.tombstone && entry.origin == state.db.origin())
                .then(|| state.checks.check_of(&entry.id, entry.ip, &entry.fqdn))
                .flatten(),
            entry,
        })
        .collect();
    axum::Json(listed).into_response()
}

/// An entry as `GET /name` lists it: with the check this node runs on it.
#[derive(serde::Serialize)]
struct Listed {
    #[serde(flatten)]
    entry: Entry,
    #[serde(skip_serializing_if = "Option::is_none")]
    check: Option<CheckKind>,
}

async fn domain(State(state): State<ApiState>) -> Response {
    format!("{}\n", state.db.domain()).into_response()
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

    #[test]
    fn checks_need_a_known_kind_and_a_port() {
        let s = service_param(Some("80"), None).unwrap();
        assert_eq!(check_param(None, s.as_ref()).unwrap(), None);
        assert_eq!(check_param(None, None).unwrap(), None);
        assert_eq!(
            check_param(Some("tcp"), s.as_ref()).unwrap(),
            Some(CheckKind::Tcp)
        );
        assert_eq!(
            check_param(Some("TCP"), s.as_ref()).unwrap(),
            Some(CheckKind::Tcp)
        );
        let e = check_param(Some("tcp"), None).unwrap_err().to_string();
        assert!(e.contains("without a port"), "{e}");
        for bad in ["http", "", "tcp;udp"] {
            let e = check_param(Some(bad), s.as_ref()).unwrap_err().to_string();
            assert!(e.contains("unknown check"), "{bad}: {e}");
        }
        // From a form, the way the handler reads it.
        let form = b"fqdn=a.weave.local&port=8080&check=tcp";
        let s = service_param(form_value(form, "port").as_deref(), None).unwrap();
        let c = check_param(form_value(form, "check").as_deref(), s.as_ref());
        assert_eq!(c.unwrap(), Some(CheckKind::Tcp));
    }

    #[test]
    fn services_come_from_port_and_service() {
        assert_eq!(service_param(None, None).unwrap(), None);
        let s = service_param(Some("80"), Some("_HTTP._tcp"))
            .unwrap()
            .unwrap();
        assert_eq!((s.service(), s.port()), ("_http._tcp", 80));
        let s = service_param(Some("8080"), None).unwrap().unwrap();
        assert_eq!((s.service(), s.port()), ("_8080._tcp", 8080));
        for (port, service) in [
            (None, Some("_http._tcp")),
            (Some("0"), None),
            (Some("65536"), Some("_http._tcp")),
            (Some("80"), Some("http")),
            (Some("80"), Some("_http._sctp")),
        ] {
            let e = service_param(port, service).unwrap_err();
            assert!(!e.to_string().is_empty());
        }
    }
}
