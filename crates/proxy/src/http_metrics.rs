//! The metrics of HTTP upstreams, encoded with the dataplane's collector
//! ([`crate::metrics`]): requests by status class, retries, 5xx made by dwara by
//! reason (and 408s), response bodies cut off, clients that stopped reading, requests cancelled because their client went away, upgrades and the
//! tunnels open, pool sizes per endpoint, the DNS cache of an `address:` upstream
//! and a latency histogram.

use std::sync::atomic::Ordering;

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::dataplane::Generation;
use crate::http_stats::{HttpStats, LATENCY_BOUNDS};
use crate::metrics::encode_value;
use crate::reverse::HttpUpstream;

type Read = fn(&HttpStats) -> u64;

const COUNTERS: [(&str, &str, Read); 13] = [
    ("dwara_http_retries", "Tries after a request's first", |s| {
        s.retries.load(Ordering::Relaxed)
    }),
    (
        "dwara_http_retry_budget_exhausted",
        "Retries not made because the retry budget was spent",
        |s| s.budget_exhausted.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_cancelled",
        "Requests given up before their answer because the client went away",
        |s| s.cancelled.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_response_body_timeouts",
        "Response bodies cut off because the endpoint sent nothing for the body timeout",
        |s| s.body_timeouts.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_client_send_timeouts",
        "Client connections closed because the client took no byte for the send timeout",
        |s| s.send_timeouts.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_upgrades",
        "Requests whose endpoint switched protocols (101): each made its client connection a tunnel",
        |s| s.upgrades.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_tunnels",
        "Tunnels (upgraded connections, e.g. WebSocket) open now",
        |s| s.tunnels.load(Ordering::Relaxed),
    ),
    ("dwara_http_connects", "New connections to endpoints", |s| {
        s.connects.load(Ordering::Relaxed)
    }),
    (
        "dwara_http_connect_failures",
        "Failed connection attempts to endpoints",
        |s| s.connect_failures.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_reused",
        "Requests sent on a pooled keep-alive connection",
        |s| s.reused.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_client_connections_refused",
        "Client connections closed at once at the connection limit",
        |s| s.client_refused.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_client_connections",
        "Client connections accepted and open now",
        |s| s.client_connections.load(Ordering::Relaxed),
    ),
    (
        "dwara_http_answered",
        "Requests answered (every status)",
        HttpStats::requests,
    ),
];

fn http_upstreams(g: &Generation) -> impl Iterator<Item = (&str, &HttpUpstream)> {
    g.upstreams.iter().filter_map(|u| {
        u.target
            .http
            .as_deref()
            .map(|h| (u.config.name.as_str(), h))
    })
}

/// Encodes every HTTP upstream's metrics.
pub(crate) fn encode(
    g: &Generation,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    for (name, help, read) in COUNTERS {
        let kind = if matches!(name, "dwara_http_client_connections" | "dwara_http_tunnels") {
            MetricType::Gauge
        } else {
            MetricType::Counter
        };
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for (up, h) in http_upstreams(g) {
            encode_value(&mut family, kind, &[("upstream", up)], read(&h.stats))?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "dwara_http_requests",
        "Requests answered, by upstream and status class",
        None,
        MetricType::Counter,
    )?;
    for (up, h) in http_upstreams(g) {
        for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
            let n = h.stats.by_class[i].load(Ordering::Relaxed);
            let labels = [("upstream", up), ("class", *class)];
            encode_value(&mut family, MetricType::Counter, &labels, n)?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "dwara_http_generated",
        "Responses dwara made itself, by upstream and status (503: nothing to route to, 502: no endpoint answered, 504: response timeout or request body not taken, 408: request body not sent, 400: request body failed)",
        None,
        MetricType::Counter,
    )?;
    for (up, h) in http_upstreams(g) {
        let s = &h.stats;
        for (status, c) in [
            ("503", &s.no_endpoints),
            ("502", &s.bad_gateway),
            ("504", &s.timeouts),
            ("408", &s.client_timeouts),
            ("400", &s.bad_requests),
            ("501", &s.not_implemented),
        ] {
            let labels = [("upstream", up), ("status", status)];
            encode_value(
                &mut family,
                MetricType::Counter,
                &labels,
                c.load(Ordering::Relaxed),
            )?;
        }
    }
    encode_pools(g, encoder)?;
    encode_dns(g, encoder)?;
    encode_latency(g, encoder)
}

fn encode_pools(
    g: &Generation,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "dwara_http_pool_connections",
        "Pooled connections to endpoints now, by upstream, endpoint and state (idle, busy)",
        None,
        MetricType::Gauge,
    )?;
    for (up, h) in http_upstreams(g) {
        for (addr, sizes) in h.pool.sizes() {
            let addr = addr.to_string();
            for (state, n) in [("idle", sizes.idle), ("busy", sizes.busy)] {
                let labels = [
                    ("upstream", up),
                    ("endpoint", addr.as_str()),
                    ("state", state),
                ];
                encode_value(&mut family, MetricType::Gauge, &labels, n as u64)?;
            }
        }
    }
    Ok(())
}

fn encode_dns(g: &Generation, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "dwara_http_dns_cache",
        "Lookups of an HTTP upstream's DNS cache (the host of address:, or the SRV targets answers name without addresses), by upstream and outcome (hit, miss, stale: an expired answer served while DNS failed)",
        None,
        MetricType::Counter,
    )?;
    for (up, h) in http_upstreams(g) {
        let Some(cache) = h.dial.cache() else {
            continue;
        };
        let c = cache.stats();
        for (outcome, n) in [
            ("hit", c.hits),
            ("miss", c.misses),
            ("stale", c.stale_served),
        ] {
            let labels = [("upstream", up), ("outcome", outcome)];
            encode_value(&mut family, MetricType::Counter, &labels, n)?;
        }
    }
    Ok(())
}

fn encode_latency(
    g: &Generation,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "dwara_http_request_duration_seconds",
        "Time from a request's head to its response's head, by upstream",
        None,
        MetricType::Histogram,
    )?;
    for (up, h) in http_upstreams(g) {
        let s = &h.stats;
        let mut cumulative = 0u64;
        let mut buckets = Vec::with_capacity(LATENCY_BOUNDS.len() + 1);
        for (i, bound) in LATENCY_BOUNDS
            .iter()
            .chain([f64::INFINITY].iter())
            .enumerate()
        {
            let n = s.latency[i].load(Ordering::Relaxed);
            cumulative += n;
            buckets.push((*bound, n));
        }
        let sum = s.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let labels = [("upstream", up)];
        let mut metric = family.encode_family(&labels)?;
        metric.encode_histogram::<NoLabelSet>(sum, cumulative, &buckets, None)?;
    }
    Ok(())
}
