//! The HTTP API (axum): registrations, lookups and the domain, as a [`Router`] the
//! binary serves on its one listener (beside `/metrics` and the other components'
//! routes).
//!
//! | request | effect |
//! |---|---|
//! | `PUT /name/<id>/<ip>`, form `fqdn=…`, optional `port=1..65535`, `service=_name._tcp`, `priority=0..65535`, `weight=0..65535`, `check=tcp` | add (or replace the entry's service, port, priority, weight and check); 204; 400 with a message for a bad IP, a missing fqdn or one outside the domain or at or below `addr.<domain>` (reserved for SRV targets), a bad port, service, priority or weight, a service, priority or weight without a port, an unknown check or a check without a port |
//! | `DELETE /name/<id>/<ip>` (`fqdn` optional, form body or query) | tombstone; 204 also when nothing matched |
//! | `DELETE /name/<id>` | tombstone every entry of the id; 204 |
//! | either DELETE matching only other nodes' live entries | 409, JSON `{"error", "owners": [node…]}` |
//! | `GET /name/<fqdn>` | 200 JSON array of IPs; 404 when none |
//! | `GET /name/<service>.<fqdn>` | 200 JSON array of the service's endpoints, `"ip:port"` (`"[v6]:port"`); 404 when none |
//! | `GET /name` | 200 JSON array of every live entry (with `service`, `port`, `priority` and `weight` when it has a service, `health` when it is checked, `check` when this node runs its check); `?tombstones=true` adds tombstones, `?fqdn=<fqdn>` keeps one name's |
//! | `GET /domain` | the domain as text |
//!
//! A `port` without `service` registers the service `_<port>._tcp`. `priority` and
//! `weight` are those of the entry's SRV record (RFC 2782; 0 and 1 when not given;
//! weight 0 is allowed: a very small share beside weights above 0). With
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

/// The service form values of a registration, as given (absent: `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceForm<'a> {
    /// `port=1..65535`.
    pub port: Option<&'a str>,
    /// `service=_name._tcp|_udp`.
    pub service: Option<&'a str>,
    /// `priority=0..65535`.
    pub priority: Option<&'a str>,
    /// `weight=0..65535`.
    pub weight: Option<&'a str>,
}

/// The service of a registration from its form values: none without a port,
/// `_<port>._tcp` for a port alone; priority and weight (RFC 2782, 0–65535, default
/// 0 and 1) only with a port. Public for fuzzing.
pub fn service_param(form: ServiceForm<'_>) -> Result<Option<crate::ServicePort>, crate::Error> {
    let Some(p) = form.port else {
        dwara_records::check_portless(form.service, form.priority, form.weight)?;
        return Ok(None);
    };
    let service = match form.service {
        None => crate::ServicePort::unnamed(dwara_records::parse_port(p)?, crate::Protocol::Tcp),
        Some(s) => crate::ServicePort::parse(s, p)?,
    };
    let (priority, weight) = dwara_records::parse_rank(form.priority, form.weight)?;
    Ok(Some(service.with_priority(priority).with_weight(weight)))
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
    if let Some(reason) = reserved(state.db.domain(), &fqdn) {
        return bad_request(reason);
    }
    let [port, service, priority, weight] =
        ["port", "service", "priority", "weight"].map(|key| param(&body, query.as_deref(), key));
    let form = ServiceForm {
        port: port.as_deref(),
        service: service.as_deref(),
        priority: priority.as_deref(),
        weight: weight.as_deref(),
    };
    let service = match service_param(form) {
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

/// Why `fqdn` may not be registered, when it is `addr.<domain>` or below it: those
/// names are the targets of SRV answers (`<hex address>.addr.<domain>`), answered
/// from the addresses alone.
fn reserved(domain: &crate::Domain, fqdn: &str) -> Option<String> {
    let name = domain.normalize_member(fqdn).ok()?;
    let addr = format!("addr.{}", domain.as_str());
    (name == addr || name.ends_with(&format!(".{addr}"))).then(|| {
        format!(
            "fqdn {fqdn} is reserved: names at and below {addr} are the per-instance targets of SRV answers"
        )
    })
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
        let s = service_param(port(Some("80"), None)).unwrap();
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
        let s = service_param(port(form_value(form, "port").as_deref(), None)).unwrap();
        let c = check_param(form_value(form, "check").as_deref(), s.as_ref());
        assert_eq!(c.unwrap(), Some(CheckKind::Tcp));
    }

    /// The service form of a port and a service, no priority or weight.
    fn port<'a>(port: Option<&'a str>, service: Option<&'a str>) -> ServiceForm<'a> {
        ServiceForm {
            port,
            service,
            ..ServiceForm::default()
        }
    }

    #[test]
    fn services_come_from_port_and_service() {
        assert_eq!(service_param(port(None, None)).unwrap(), None);
        let s = service_param(port(Some("80"), Some("_HTTP._tcp")))
            .unwrap()
            .unwrap();
        assert_eq!((s.service(), s.port()), ("_http._tcp", 80));
        assert_eq!((s.priority(), s.weight()), (0, 1));
        let s = service_param(port(Some("8080"), None)).unwrap().unwrap();
        assert_eq!((s.service(), s.port()), ("_8080._tcp", 8080));
        for (port_value, service) in [
            (None, Some("_http._tcp")),
            (Some("0"), None),
            (Some("65536"), Some("_http._tcp")),
            (Some("80"), Some("http")),
            (Some("80"), Some("_http._sctp")),
        ] {
            let e = service_param(port(port_value, service)).unwrap_err();
            assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn priority_and_weight_are_rfc_2782_ranges_and_need_a_port() {
        let ranked = |priority, weight| {
            service_param(ServiceForm {
                port: Some("80"),
                service: Some("_http._tcp"),
                priority,
                weight,
            })
        };
        let s = ranked(Some("2"), Some("9")).unwrap().unwrap();
        assert_eq!((s.priority(), s.weight(), s.port()), (2, 9, 80));
        let s = ranked(Some("65535"), Some("0")).unwrap().unwrap();
        assert_eq!((s.priority(), s.weight()), (65535, 0));
        let s = ranked(None, Some(" 7 ")).unwrap().unwrap();
        assert_eq!((s.priority(), s.weight()), (0, 7));
        for (priority, weight, field, value) in [
            (Some("65536"), None, "priority", "65536"),
            (Some("-1"), None, "priority", "-1"),
            (None, Some("70000"), "weight", "70000"),
            (None, Some("heavy"), "weight", "heavy"),
            (Some("1"), Some("1.5"), "weight", "1.5"),
        ] {
            let e = ranked(priority, weight).unwrap_err().to_string();
            assert!(
                e.contains(&format!("invalid {field} {value:?}")) && e.contains("0 to 65535"),
                "{e}"
            );
        }
        // Without a port there is no SRV record to carry them.
        for (priority, weight, want) in [
            (Some("1"), None, "priority \"1\" given without a port"),
            (None, Some("9"), "weight \"9\" given without a port"),
        ] {
            let form = ServiceForm {
                priority,
                weight,
                ..ServiceForm::default()
            };
            let e = service_param(form).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
