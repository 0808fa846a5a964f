//! What every DNS query passes before the handler: the rate limit (UDP only), then
//! the allow list.
//!
//! 1. A UDP query from a client other than loopback is charged to its prefix's
//!    bucket (see `rate_limit`); over the limit it gets no reply, or every `slip`th
//!    time an empty truncated one. DNS/TCP is never limited: its source cannot be
//!    forged, and it is where limited clients retry.
//! 2. A client the allow list does not hold (see `access`) gets `REFUSED` for every
//!    name; with [`LocalNames::Anyone`] (`--dns-allow-local-any`) it gets answers
//!    for the local domain and its reverse names, and `REFUSED` for what would be
//!    forwarded. A refused query is never forwarded.
//!
//! Each outcome is counted by reason (`dwara_dns_refused`, `dwara_dns_rate_limited`).
//! Loopback clients skip both steps with one comparison.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::access::{AllowEntry, AllowList, is_loopback, spawn_interface_watcher};
use crate::handler::{Handler, Outcome, Transport, refused, truncated};
use crate::metrics::{Counters, Metrics, RateLimited, Refused};
use crate::rate_limit::{RateLimit, RateLimiter, Verdict};
use crate::wire::FastRng;

/// Whether clients outside the allow list get answers for the local domain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LocalNames {
    /// The allow list decides for every name (the default).
    #[default]
    AllowedClients,
    /// Anyone gets answers for the local domain (`--dns-allow-local-any`);
    /// forwarding stays for the allow list.
    Anyone,
}

/// Who may ask the DNS server, and how fast.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessConfig {
    /// Clients allowed besides loopback; empty: `local` (the subnets of this
    /// host's interfaces).
    pub allow: Vec<AllowEntry>,
    /// Whether others get the local domain's answers.
    pub local_names: LocalNames,
    /// The UDP response rate limit for clients other than loopback.
    pub rate_limit: RateLimit,
}

/// The running checks, shared by the UDP workers and the TCP connections.
#[derive(Debug)]
pub(crate) struct Guard {
    allow: Arc<AllowList>,
    local_names: LocalNames,
    limiter: Option<RateLimiter>,
}

impl Guard {
    /// Compiles `config` (reading the interfaces when the list has `local`) and
    /// starts the interface watcher, which ends when `stop` is set.
    pub(crate) fn start(
        config: &AccessConfig,
        metrics: &Metrics,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<Self> {
        let allow = AllowList::new(&config.allow);
        spawn_interface_watcher(allow.clone(), stop)?;
        let limiter = RateLimiter::new(&config.rate_limit, metrics.rate_limit_evictions().clone());
        match &limiter {
            Some(_) => tracing::debug!(
                qps = config.rate_limit.qps,
                burst = if config.rate_limit.burst == 0 {
                    config.rate_limit.qps
                } else {
                    config.rate_limit.burst
                },
                slip = config.rate_limit.slip,
                "DNS/UDP replies rate-limited per client /24 (IPv6 /56), loopback exempt"
            ),
            None => tracing::debug!("DNS/UDP rate limit off"),
        }
        Ok(Self {
            allow,
            local_names: config.local_names,
            limiter,
        })
    }

    /// The allow list in force.
    pub(crate) fn allow_list(&self) -> &Arc<AllowList> {
        &self.allow
    }

    /// The checks, then `handler` for what passes them.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn handle(
        &self,
        handler: &Handler,
        client: IpAddr,
        packet: &[u8],
        out: &mut [u8],
        transport: Transport,
        rng: &mut FastRng,
        counters: &Counters,
    ) -> Outcome {
        if is_loopback(client) {
            return handler.handle(packet, out, transport, rng, counters);
        }
        if transport == Transport::Udp
            && let Some(limiter) = &self.limiter
        {
            match limiter.check(client, Instant::now()) {
                Verdict::Pass => {}
                Verdict::Slip => {
                    counters.rate_limited(RateLimited::Slipped);
                    return truncated(packet, out).map_or(Outcome::Drop, Outcome::Reply);
                }
                Verdict::Drop => {
                    counters.rate_limited(RateLimited::Dropped);
                    return Outcome::Drop;
                }
            }
        }
        if self.allow.allows(client) {
            return handler.handle(packet, out, transport, rng, counters);
        }
        let reason = match self.local_names {
            LocalNames::AllowedClients => Refused::ClientNotAllowed,
            LocalNames::Anyone => match handler.handle(packet, out, transport, rng, counters) {
                Outcome::Forward { .. } => Refused::ForwardNotAllowed,
                other => return other,
            },
        };
        match refused(packet, out) {
            Some((len, qtype)) => {
                counters.refused(reason);
                counters.record(qtype, crate::wire::rcode::REFUSED.into());
                Outcome::Reply(len)
            }
            None => {
                counters.dropped();
                Outcome::Drop
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::AllowEntry;
    use crate::handler::MAX_MESSAGE;
    use crate::rate_limit::RateLimit;
    use dwara_records::Domain;
    use dwara_records::{Db, DbConfig};

    fn query(name: &[u8]) -> Vec<u8> {
        let mut p = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(name);
        p.extend_from_slice(&[0, 1, 0, 1]);
        p
    }

    fn with_edns(mut p: Vec<u8>) -> Vec<u8> {
        p[11] = 1;
        p.extend_from_slice(&[0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        p
    }

    fn guard(config: &AccessConfig) -> Guard {
        Guard::start(config, &Metrics::new(), Arc::new(AtomicBool::new(true))).unwrap()
    }

    #[test]
    fn refused_and_limited_replies_are_never_larger_than_the_query() {
        let db = Db::new(DbConfig::new(Domain::new("weave.local").unwrap()));
        for i in 0..40u8 {
            db.add(&format!("c{i}"), [10, 32, 0, i].into(), "big.weave.local")
                .unwrap();
        }
        let handler = Handler::new(&db);
        let g = guard(&AccessConfig {
            allow: vec![AllowEntry::Cidr("10.0.0.0/8".parse().unwrap())],
            local_names: LocalNames::AllowedClients,
            rate_limit: RateLimit {
                qps: 1,
                burst: 1,
                slip: 1,
                ..RateLimit::default()
            },
        });
        let counters = Counters::default();
        let mut rng = FastRng::seeded(1);
        let mut out = vec![0u8; MAX_MESSAGE];
        // One query through the guard; the reply (if any) is in `out`.
        let mut ask = |client: IpAddr, q: &[u8], transport: Transport, out: &mut [u8]| {
            g.handle(&handler, client, q, out, transport, &mut rng, &counters)
        };
        let big = query(b"\x03big\x05weave\x05local\x00");
        for (edns, q) in [(false, big.clone()), (true, with_edns(big))] {
            // Allowed, first in its bucket: the whole answer (much larger).
            let client: IpAddr = if edns { "10.1.1.1" } else { "10.2.2.2" }.parse().unwrap();
            let Outcome::Reply(n) = ask(client, &q, Transport::Udp, &mut out) else {
                panic!("no answer")
            };
            assert!(n > q.len());
            // Over the limit: an empty truncated reply, no larger than the query.
            let Outcome::Reply(n) = ask(client, &q, Transport::Udp, &mut out) else {
                panic!("no slip")
            };
            assert!(n <= q.len() && out[2] & 0x02 != 0, "{:02x?}", &out[..n]);
            assert_eq!(&out[6..8], &[0, 0], "no answers");
            // Over TCP the same client is never limited.
            let Outcome::Reply(n) = ask(client, &q, Transport::Tcp, &mut out) else {
                panic!("no TCP answer")
            };
            assert!(n > q.len());
            // Outside the list: REFUSED, no larger than the query.
            let outsider: IpAddr = if edns { "192.0.2.1" } else { "198.51.100.1" }
                .parse()
                .unwrap();
            let Outcome::Reply(n) = ask(outsider, &q, Transport::Tcp, &mut out) else {
                panic!("no REFUSED")
            };
            assert!(n <= q.len());
            assert_eq!(out[3] & 0x0f, crate::wire::rcode::REFUSED);
        }
        // Loopback is neither limited nor refused.
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let q = query(b"\x03big\x05weave\x05local\x00");
        for _ in 0..10 {
            let outcome = ask(lo, &q, Transport::Udp, &mut out);
            assert!(matches!(outcome, Outcome::Reply(n) if n > q.len()));
        }
        // A forwarded name from an outsider is refused, never forwarded; from an
        // allowed client it is forwarded.
        let q = query(b"\x07example\x03com\x00");
        let outsider: IpAddr = "192.0.2.9".parse().unwrap();
        assert!(matches!(
            ask(outsider, &q, Transport::Tcp, &mut out),
            Outcome::Reply(_)
        ));
        let allowed: IpAddr = "10.9.9.9".parse().unwrap();
        assert!(matches!(
            ask(allowed, &q, Transport::Tcp, &mut out),
            Outcome::Forward { .. }
        ));
    }
}
