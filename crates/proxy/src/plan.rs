//! Reload as a pure plan: the running upstreams and listeners plus the new
//! configuration in, what to keep, build, bind and stop out. No sockets, no tasks:
//! [`crate::Dataplane::apply`] carries a plan out (build, bind, then commit).

use std::collections::HashSet;
use std::net::SocketAddr;

use crate::config::UpstreamConfig;

/// Why an upstream gets a fresh load balancer instead of its previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NewLbReason {
    /// No upstream of that name ran before.
    NewUpstream,
    /// The policy changed (its pick state cannot carry over).
    PolicyChanged,
    /// The ejection settings changed.
    EjectionChanged,
    /// The discovery target changed (host name, record type, port, name servers): the
    /// old endpoints belong to another name and must not keep receiving traffic.
    TargetChanged,
}

/// What happens to one upstream's load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPlan {
    /// Keep the load balancer (endpoints, in-flight counts, ejections) of the
    /// previous upstream at this index.
    Keep(usize),
    /// Start from an empty load balancer; discovery fills it.
    New(NewLbReason),
}

/// What happens to one upstream's listen address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerPlan {
    /// A listener already accepts there: point it at the new upstream.
    Retarget,
    /// Bind a new listener (before anything is committed).
    Bind,
}

/// The plan for one upstream of the new configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamPlan {
    /// Its configuration.
    pub config: UpstreamConfig,
    /// Its load balancer.
    pub lb: LbPlan,
    /// The previous upstream of the same name, whose counters carry over.
    pub counters_from: Option<usize>,
    /// Its listener.
    pub listener: ListenerPlan,
}

/// A whole reload.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// The new upstreams, in configuration order.
    pub upstreams: Vec<UpstreamPlan>,
    /// Listen addresses that no upstream uses any more: stop accepting there.
    pub stop: Vec<SocketAddr>,
}

/// Whether two upstreams ask discovery the same question.
fn same_target(a: &UpstreamConfig, b: &UpstreamConfig) -> bool {
    match (&a.dns_discovery, &b.dns_discovery) {
        (Some(x), Some(y)) => {
            x.hostname.eq_ignore_ascii_case(&y.hostname)
                && x.record_type == y.record_type
                && x.port == y.port
                && x.nameservers == y.nameservers
        }
        (None, None) => {
            a.consul == b.consul
                && a.kubernetes == b.kubernetes
                && a.address == b.address
                && a.nameservers == b.nameservers
        }
        _ => false,
    }
}

/// Plans the move from `old` (the running upstreams) and `listening` (the addresses
/// with a listener) to `new`.
pub fn plan(
    old: &[UpstreamConfig],
    listening: &HashSet<SocketAddr>,
    new: &[UpstreamConfig],
) -> Plan {
    let upstreams = new
        .iter()
        .map(|up| {
            let prev = old.iter().position(|p| p.name == up.name);
            let lb = match prev.map(|i| (i, &old[i])) {
                None => LbPlan::New(NewLbReason::NewUpstream),
                Some((_, p)) if p.policy != up.policy => LbPlan::New(NewLbReason::PolicyChanged),
                Some((_, p)) if p.ejection != up.ejection => {
                    LbPlan::New(NewLbReason::EjectionChanged)
                }
                Some((_, p)) if !same_target(p, up) => LbPlan::New(NewLbReason::TargetChanged),
                Some((i, _)) => LbPlan::Keep(i),
            };
            let listener = if listening.contains(&up.listen) {
                ListenerPlan::Retarget
            } else {
                ListenerPlan::Bind
            };
            UpstreamPlan {
                config: up.clone(),
                lb,
                counters_from: prev,
                listener,
            }
        })
        .collect();
    let mut stop: Vec<SocketAddr> = listening
        .iter()
        .filter(|addr| !new.iter().any(|u| u.listen == **addr))
        .copied()
        .collect();
    stop.sort_unstable();
    Plan { upstreams, stop }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(yaml: &str) -> UpstreamConfig {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn api() -> UpstreamConfig {
        up("name: api
listen: 127.0.0.1:9000
dns_discovery: {hostname: api.weave.local, port: 8080, nameservers: [127.0.0.1:1053]}")
    }

    fn addrs(list: &[&str]) -> HashSet<SocketAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn an_unchanged_upstream_keeps_everything() {
        let p = plan(&[api()], &addrs(&["127.0.0.1:9000"]), &[api()]);
        assert_eq!(p.upstreams[0].lb, LbPlan::Keep(0));
        assert_eq!(p.upstreams[0].counters_from, Some(0));
        assert_eq!(p.upstreams[0].listener, ListenerPlan::Retarget);
        assert!(p.stop.is_empty());
    }

    #[test]
    fn refresh_and_policy_knobs_that_keep_the_question_keep_the_lb() {
        let mut new = api();
        let dns = new.dns_discovery.as_mut().unwrap();
        dns.refresh_interval_s = 5;
        dns.fail_open = false;
        dns.min_endpoints = 3;
        dns.hostname = "API.Weave.Local".into();
        new.connect_timeout_ms = 100;
        let p = plan(&[api()], &addrs(&["127.0.0.1:9000"]), &[new]);
        assert_eq!(p.upstreams[0].lb, LbPlan::Keep(0));
    }

    #[test]
    fn a_changed_target_starts_from_an_empty_lb() {
        let changes: [fn(&mut UpstreamConfig); 4] = [
            |u| u.dns_discovery.as_mut().unwrap().hostname = "other.weave.local".into(),
            |u| u.dns_discovery.as_mut().unwrap().port = Some(9090),
            |u| {
                u.dns_discovery.as_mut().unwrap().record_type =
                    dwara_discovery_dns::RecordType::AAAA
            },
            |u| u.dns_discovery.as_mut().unwrap().nameservers = vec![],
        ];
        for change in changes {
            let mut new = api();
            change(&mut new);
            let p = plan(&[api()], &addrs(&["127.0.0.1:9000"]), &[new.clone()]);
            assert_eq!(
                p.upstreams[0].lb,
                LbPlan::New(NewLbReason::TargetChanged),
                "{new:?}"
            );
            // Counters follow the name whatever happens to the endpoints.
            assert_eq!(p.upstreams[0].counters_from, Some(0));
        }
    }

    #[test]
    fn policy_and_ejection_changes_start_over() {
        let mut new = api();
        new.policy = dwara_lb::Policy::P2c;
        let p = plan(&[api()], &HashSet::new(), &[new]);
        assert_eq!(p.upstreams[0].lb, LbPlan::New(NewLbReason::PolicyChanged));
        let mut new = api();
        new.ejection = Some(crate::EjectionSection {
            consecutive_failures: 1,
            cool_down_s: 1,
        });
        let p = plan(&[api()], &HashSet::new(), &[new]);
        assert_eq!(p.upstreams[0].lb, LbPlan::New(NewLbReason::EjectionChanged));
    }

    #[test]
    fn listeners_are_kept_by_address_bound_when_new_and_stopped_when_unused() {
        let mut moved = api();
        moved.listen = "127.0.0.1:9001".parse().unwrap();
        let mut other = api();
        other.name = "other".into();
        other.listen = "127.0.0.1:9000".parse().unwrap();
        let p = plan(
            &[api()],
            &addrs(&["127.0.0.1:9000", "127.0.0.1:9002"]),
            &[moved, other],
        );
        assert_eq!(p.upstreams[0].listener, ListenerPlan::Bind);
        assert_eq!(p.upstreams[0].lb, LbPlan::Keep(0));
        // Another upstream takes over the address: the socket stays, retargeted.
        assert_eq!(p.upstreams[1].listener, ListenerPlan::Retarget);
        assert_eq!(p.upstreams[1].lb, LbPlan::New(NewLbReason::NewUpstream));
        assert_eq!(
            p.stop,
            vec!["127.0.0.1:9002".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn an_empty_configuration_stops_every_listener() {
        let p = plan(&[api()], &addrs(&["127.0.0.1:9000"]), &[]);
        assert!(p.upstreams.is_empty());
        assert_eq!(p.stop.len(), 1);
    }
}
