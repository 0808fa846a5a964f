//! Tests of the dataplane library against real sockets and the in-process test DNS
//! server: forwarding, reload semantics, the L4 workers and the metrics it exposes.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod forward;
mod metrics;
mod reload;
mod workers;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use dwara_proxy::UpstreamConfig;

pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// An upstream following `host` A records on `dns`, listening on a free port.
pub(crate) fn upstream(name: &str, host: &str, dns: SocketAddr) -> UpstreamConfig {
    let yaml = format!(
        "name: x\nlisten: {}\ndns_discovery: {{hostname: {host}, port: 80, refresh_interval_s: 1, nameservers: ['{dns}']}}",
        test_support::free_addr(),
    );
    let mut up: UpstreamConfig = serde_yaml_ng::from_str(&yaml).unwrap();
    up.name = name.to_owned();
    up
}

/// The endpoints of upstream `i` of the running generation, as `ip:port` strings.
pub(crate) fn endpoints(dp: &dwara_proxy::Dataplane, i: usize) -> Vec<String> {
    let g = dp.generation();
    let mut v: Vec<String> = g.upstreams[i]
        .discovery
        .as_ref()
        .expect("a discovery upstream")
        .lb
        .endpoints()
        .iter()
        .map(|e| e.addr.to_string())
        .collect();
    v.sort();
    v
}

pub(crate) fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}
