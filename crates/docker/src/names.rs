//! What a container should have registered: (address, name) pairs derived from its
//! inspect answer, the configured name sources and network, and whether it lives;
//! and the service and port its labels give every one of them.
//!
//! Labels: `dwara.port=80` registers the container's names with port 80, answered as
//! SRV; `dwara.service=_http._tcp` names the service. Without `dwara.service` the
//! service is `_<port>._<proto>`, the protocol from the port's exposure in the
//! container's config (`80/udp` exposed and `80/tcp` not: `_udp`; else `_tcp`).
//! `dwara.priority` and `dwara.weight` (0–65535 each, RFC 2782; default 0 and 1)
//! set the SRV record's priority and weight, and need `dwara.port`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use bollard::models::{
    ContainerInspectResponse, ContainerStateStatusEnum, EndpointSettings, HealthStatusEnum,
};
use dwara_records::{
    Domain, Error as NameError, Health, Protocol, ServicePort, check_portless, parse_port,
    parse_rank,
};

use crate::config::{NameSource, NameSources};
use crate::time::{Nanos, parse_rfc3339};

/// One registration: an address under a normalised (lower-case, fully qualified) name.
pub(crate) type Record = (IpAddr, String);

/// What names to derive and from where.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    pub(crate) domain: Domain,
    pub(crate) sources: NameSources,
    pub(crate) network: Option<String>,
}

/// Whether the container, as inspected, should be registered at all.
///
/// `running` and `paused` keep their addresses; `restarting` (Docker reports it with
/// `Running: true`), `created`, `exited`, `dead`, `removing` do not. When a `die`
/// event at `died_at` is being handled, a running state whose start is not later
/// than the `die` belongs to the incarnation that died: not live either.
pub(crate) fn is_live(c: &ContainerInspectResponse, died_at: Option<Nanos>) -> bool {
    let Some(state) = &c.state else {
        return false;
    };
    if state.restarting == Some(true) {
        return false;
    }
    let up = match state.status {
        Some(ContainerStateStatusEnum::RUNNING | ContainerStateStatusEnum::PAUSED) => true,
        Some(_) => false,
        // No status (very old daemons): trust `Running`.
        None => state.running == Some(true),
    };
    if !up {
        return false;
    }
    match (died_at, started_at(c)) {
        (Some(died), Some(started)) => started > died,
        _ => true,
    }
}

/// What the container's `HEALTHCHECK` says now: [`Health::Unchecked`] without one
/// (or when the daemon reports none).
pub(crate) fn health(c: &ContainerInspectResponse) -> Health {
    let status = c
        .state
        .as_ref()
        .and_then(|s| s.health.as_ref())
        .and_then(|h| h.status);
    match status {
        Some(HealthStatusEnum::STARTING) => Health::Starting,
        Some(HealthStatusEnum::HEALTHY) => Health::Healthy,
        Some(HealthStatusEnum::UNHEALTHY) => Health::Unhealthy,
        Some(HealthStatusEnum::NONE | HealthStatusEnum::EMPTY) | None => Health::Unchecked,
    }
}

/// When the current incarnation started, if the daemon says.
pub(crate) fn started_at(c: &ContainerInspectResponse) -> Option<Nanos> {
    c.state
        .as_ref()
        .and_then(|s| s.started_at.as_deref())
        .and_then(parse_rfc3339)
}

/// The records `c` should have (empty when it is not live).
pub(crate) fn desired(
    c: &ContainerInspectResponse,
    naming: &Naming,
    died_at: Option<Nanos>,
) -> BTreeSet<Record> {
    let mut out = BTreeSet::new();
    if !is_live(c, died_at) {
        return out;
    }
    let id = c.id.as_deref().unwrap_or_default();
    let networks: Vec<&EndpointSettings> = c
        .network_settings
        .as_ref()
        .and_then(|n| n.networks.as_ref())
        .map(|nets| {
            nets.iter()
                .filter(|(name, _)| naming.network.as_deref().is_none_or(|want| want == *name))
                .map(|(_, ep)| ep)
                .collect()
        })
        .unwrap_or_default();
    let all_ips: BTreeSet<IpAddr> = networks.iter().flat_map(|ep| endpoint_ips(ep)).collect();
    if all_ips.is_empty() {
        return out;
    }
    let mut names = BTreeSet::new();
    for source in naming.sources.iter() {
        match source {
            NameSource::Hostname => {
                if let Some(n) = hostname_name(c, &naming.domain) {
                    names.insert(n);
                }
            }
            NameSource::Name => {
                let name = c
                    .name
                    .as_deref()
                    .unwrap_or_default()
                    .trim_start_matches('/');
                if let Some(n) = under_domain(name, &naming.domain) {
                    names.insert(n);
                }
            }
            // Aliases answer with the addresses of their own network only.
            NameSource::Aliases => {
                for ep in &networks {
                    let ips = endpoint_ips(ep);
                    for alias in ep.aliases.iter().flatten() {
                        if is_id_alias(alias, id) {
                            continue;
                        }
                        if let Some(n) = under_domain(alias, &naming.domain) {
                            out.extend(ips.iter().map(|ip| (*ip, n.clone())));
                        }
                    }
                }
            }
        }
    }
    for name in names {
        out.extend(all_ips.iter().map(|ip| (*ip, name.clone())));
    }
    out
}

/// The label giving a container's port.
pub const PORT_LABEL: &str = "dwara.port";
/// The label naming a container's service.
pub const SERVICE_LABEL: &str = "dwara.service";
/// The label giving the SRV priority of a container's service.
pub const PRIORITY_LABEL: &str = "dwara.priority";
/// The label giving the SRV weight of a container's service.
pub const WEIGHT_LABEL: &str = "dwara.weight";

/// The service and port the container's labels ask for, with their priority and
/// weight: `None` without `dwara.port`; an error naming the bad label value
/// otherwise.
pub fn service_of(c: &ContainerInspectResponse) -> Result<Option<ServicePort>, NameError> {
    let config = c.config.as_ref();
    let labels = config.and_then(|c| c.labels.as_ref());
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let Some(port) = label(PORT_LABEL) else {
        check_portless(
            label(SERVICE_LABEL),
            label(PRIORITY_LABEL),
            label(WEIGHT_LABEL),
        )?;
        return Ok(None);
    };
    let port = parse_port(port)?;
    let (priority, weight) = parse_rank(label(PRIORITY_LABEL), label(WEIGHT_LABEL))?;
    let service = match label(SERVICE_LABEL) {
        Some(service) => ServicePort::new(service.trim(), port)?,
        None => {
            let exposed = |proto: &str| {
                config
                    .and_then(|c| c.exposed_ports.as_ref())
                    .is_some_and(|e| e.iter().any(|p| *p == format!("{port}/{proto}")))
            };
            let protocol = if exposed("udp") && !exposed("tcp") {
                Protocol::Udp
            } else {
                Protocol::Tcp
            };
            ServicePort::unnamed(port, protocol)
        }
    };
    Ok(Some(service.with_priority(priority).with_weight(weight)))
}

/// [`desired`] from public parts, for the fuzz target in `dwara-fuzz-checks`: the
/// records an inspect answer maps to, `died_at` in nanoseconds since the epoch. Not
/// a stable API.
#[doc(hidden)]
pub fn desired_records(
    c: &ContainerInspectResponse,
    domain: &Domain,
    sources: &NameSources,
    network: Option<&str>,
    died_at: Option<i128>,
) -> BTreeSet<(IpAddr, String)> {
    let naming = Naming {
        domain: domain.clone(),
        sources: sources.clone(),
        network: network.map(str::to_owned),
    };
    desired(c, &naming, died_at)
}

/// `Hostname.Domainname` (or a hostname that already carries the domain) when it
/// falls inside the served domain.
fn hostname_name(c: &ContainerInspectResponse, domain: &Domain) -> Option<String> {
    let config = c.config.as_ref()?;
    let host = config
        .hostname
        .as_deref()
        .unwrap_or_default()
        .trim_end_matches('.');
    if host.is_empty() {
        return None;
    }
    let fqdn = match config.domainname.as_deref().map(|d| d.trim_matches('.')) {
        Some(d) if !d.is_empty() => format!("{host}.{d}"),
        _ => host.to_owned(),
    };
    domain.normalize_member(&fqdn).ok()
}

/// A name or alias under the domain: as is when it already lies inside it,
/// otherwise with the domain appended. `None` when the result is not a valid name.
fn under_domain(label: &str, domain: &Domain) -> Option<String> {
    let label = label.trim_end_matches('.');
    if label.is_empty() {
        return None;
    }
    if let Ok(n) = domain.normalize_member(label) {
        return Some(n);
    }
    domain
        .normalize_member(&format!("{label}.{}", domain.as_str()))
        .ok()
}

/// Docker (before API 1.45) adds the short container id to the aliases of every
/// user-defined network; that is not a name anyone chose.
fn is_id_alias(alias: &str, id: &str) -> bool {
    alias.len() >= 12 && id.starts_with(alias)
}

fn endpoint_ips(ep: &EndpointSettings) -> Vec<IpAddr> {
    [ep.ip_address.as_deref(), ep.global_ipv6_address.as_deref()]
        .into_iter()
        .flatten()
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests;
