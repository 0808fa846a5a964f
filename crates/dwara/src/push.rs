//! The two halves by push: upstreams whose name lies in this process's own name
//! server's domain follow its records database directly instead of polling DNS.
//!
//! [`DbSources`] is the dataplane's [`LocalSources`]: for a `dns_discovery` block
//! whose `hostname` is in the domain (and whose `nameservers`, if any, include this
//! name server's DNS address: an upstream that names other servers asked for
//! them), it hands out a [`DbSource`]. That source answers from [`Db::lookup`],
//! (or, for SRV, [`Db::lookup_srv`]: the entries registered with that service, at
//! their ports, with their priorities and weights), which is what a DNS query would
//! be answered from, and its
//! [`DiscoverySource::changes`] is [`Db::watch`], so the refresh loop resolves again
//! as soon as the database changes (a `PUT`, a `DELETE`, a Docker event, a peer's
//! gossip, a peer going down), with the loop's usual policy: the `min_endpoints`
//! floor applies as to a DNS answer (no entries is an empty answer, as NXDOMAIN
//! is), `fail_open` has nothing to do because reading the database cannot fail, and
//! the refresh interval stays as a backstop.
//!
//! The name-server crates and the dataplane crates never depend on each other; this
//! module is where they meet.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use dwara_discovery::{DiscoveryError, DiscoverySource, Resolution};
use dwara_discovery_dns::{DnsDiscoveryConfig, RecordType};
use dwara_lb::{Endpoint, EndpointSet};
use dwara_nameserver::{Db, is_own_address};
use dwara_proxy::LocalSources;
use tokio::sync::watch;

/// Hands out [`DbSource`]s for the upstreams this process's name server answers.
#[derive(Debug)]
pub(crate) struct DbSources {
    db: Arc<Db>,
    /// The name server's DNS address: an upstream that lists name servers follows
    /// the database only when this is one of them.
    dns_addr: SocketAddr,
}

impl DbSources {
    pub(crate) fn new(db: Arc<Db>, dns_addr: SocketAddr) -> Self {
        Self { db, dns_addr }
    }

    /// Whether an upstream with this block follows the database.
    fn follows(&self, dns: &DnsDiscoveryConfig) -> bool {
        let asks_us = dns.nameservers.is_empty()
            || dns
                .nameservers
                .iter()
                .any(|ns| is_own_address(*ns, self.dns_addr));
        asks_us && self.db.domain().normalize_member(&dns.hostname).is_ok()
    }
}

impl LocalSources for DbSources {
    fn source(&self, upstream: &str, dns: &DnsDiscoveryConfig) -> Option<Arc<dyn DiscoverySource>> {
        if !self.follows(dns) {
            return None;
        }
        let fqdn = self.db.domain().normalize_member(&dns.hostname).ok()?;
        tracing::info!(upstream, hostname = %fqdn, record_type = %dns.record_type, "upstream follows the records database by push");
        Some(Arc::new(DbSource {
            db: self.db.clone(),
            fqdn,
            record_type: dns.record_type,
            port: dns.port_u16().unwrap_or_default(),
        }))
    }
}

/// One upstream's endpoints, read from the records database.
#[derive(Debug)]
pub(crate) struct DbSource {
    db: Arc<Db>,
    /// Normalised: lower-case, fully qualified.
    fqdn: String,
    record_type: RecordType,
    port: u16,
}

impl DbSource {
    /// The endpoints the database serves for the name now: for SRV, the entries
    /// registered with the service (`<service>.<fqdn>`) at their ports, with the
    /// priority and weight the name server answers them with.
    fn endpoints(&self) -> EndpointSet {
        if self.record_type == RecordType::SRV {
            return self
                .db
                .lookup_srv(&self.fqdn)
                .into_iter()
                .map(|t| {
                    Endpoint::new(t.addr)
                        .with_weight(t.weight)
                        .with_priority(t.priority)
                })
                .collect();
        }
        let family = |ip: &IpAddr| match self.record_type {
            RecordType::AAAA => ip.is_ipv6(),
            _ => ip.is_ipv4(),
        };
        self.db
            .lookup(&self.fqdn)
            .into_iter()
            .filter(family)
            .map(|ip| Endpoint::new(SocketAddr::new(ip, self.port)))
            .collect()
    }
}

#[async_trait::async_trait]
impl DiscoverySource for DbSource {
    fn describe(&self) -> String {
        match self.record_type {
            RecordType::SRV => format!("db SRV {} (push)", self.fqdn),
            _ => format!("db {} {}:{} (push)", self.record_type, self.fqdn, self.port),
        }
    }

    async fn resolve(&self) -> Result<Resolution, DiscoveryError> {
        Ok(Resolution {
            endpoints: self.endpoints(),
            // Changes arrive by push; the refresh interval is only the backstop.
            ttl: None,
        })
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.db.watch())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dwara_nameserver::{DbConfig, Domain};

    fn sources() -> (Arc<Db>, DbSources) {
        let db = Arc::new(Db::new(DbConfig::new(Domain::new("weave.local").unwrap())));
        let dns_addr = "127.0.0.1:1053".parse().unwrap();
        (db.clone(), DbSources::new(db, dns_addr))
    }

    fn block(yaml: &str) -> DnsDiscoveryConfig {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn only_names_in_the_domain_asked_of_us_follow_the_db() {
        let (_, s) = sources();
        let yes = [
            "{hostname: api.weave.local, port: 80}",
            "{hostname: API.Weave.Local., port: 80, record_type: AAAA}",
            "{hostname: api.weave.local, port: 80, nameservers: [127.0.0.1:1053]}",
            "{hostname: api.weave.local, port: 80, nameservers: [10.9.9.9:53, 127.0.0.1:1053]}",
            "{hostname: _http._tcp.api.weave.local, record_type: SRV}",
        ];
        for y in yes {
            assert!(s.source("u", &block(y)).is_some(), "{y}");
        }
        let no = [
            "{hostname: api.example.com, port: 80}",
            "{hostname: weave.local, port: 80}",
            "{hostname: api.weave.local, port: 80, nameservers: [127.0.0.1:53]}",
        ];
        for y in no {
            assert!(s.source("u", &block(y)).is_none(), "{y}");
        }
    }

    #[tokio::test]
    async fn answers_the_served_family_and_is_told_of_changes() {
        let (db, s) = sources();
        let v4 = s
            .source("u", &block("{hostname: api.weave.local, port: 80}"))
            .unwrap();
        let v6 = s
            .source(
                "u",
                &block("{hostname: api.weave.local, port: 81, record_type: AAAA}"),
            )
            .unwrap();
        let mut changes = v4.changes().unwrap();
        changes.borrow_and_update();
        db.add("c1", "10.0.0.1".parse().unwrap(), "api.weave.local")
            .unwrap();
        db.add("c2", "fd00::1".parse().unwrap(), "api.weave.local")
            .unwrap();
        assert!(changes.has_changed().unwrap());
        let got = v4.resolve().await.unwrap().endpoints;
        assert_eq!(
            got.iter().map(|e| e.addr.to_string()).collect::<Vec<_>>(),
            ["10.0.0.1:80"]
        );
        let got = v6.resolve().await.unwrap().endpoints;
        assert_eq!(
            got.iter().map(|e| e.addr.to_string()).collect::<Vec<_>>(),
            ["[fd00::1]:81"]
        );
        changes.borrow_and_update();
        db.remove_all("c1");
        assert!(changes.has_changed().unwrap());
        assert!(v4.resolve().await.unwrap().endpoints.is_empty());
    }

    #[tokio::test]
    async fn srv_takes_the_ports_of_the_entries_registered_with_the_service() {
        let (db, s) = sources();
        let srv = s
            .source(
                "u",
                &block("{hostname: _http._tcp.api.weave.local, record_type: SRV}"),
            )
            .unwrap();
        let http = dwara_nameserver::ServicePort::parse("_http._tcp", "8080").unwrap();
        db.add_service(
            "c1",
            "10.0.0.1".parse().unwrap(),
            "api.weave.local",
            Some(&http),
        )
        .unwrap();
        // Without the service: not an SRV endpoint.
        db.add("c2", "10.0.0.2".parse().unwrap(), "api.weave.local")
            .unwrap();
        // With a priority and weight of its own: the endpoint carries them.
        let canary = http.clone().with_priority(1).with_weight(9);
        db.add_service(
            "c3",
            "10.0.0.3".parse().unwrap(),
            "api.weave.local",
            Some(&canary),
        )
        .unwrap();
        let got = srv.resolve().await.unwrap().endpoints;
        assert_eq!(
            got.iter()
                .map(|e| (e.addr.to_string(), e.priority, e.weight))
                .collect::<Vec<_>>(),
            [
                ("10.0.0.1:8080".to_owned(), 0, 1),
                ("10.0.0.3:8080".to_owned(), 1, 9)
            ]
        );
        assert_eq!(srv.describe(), "db SRV _http._tcp.api.weave.local. (push)");
    }
}
