//! The dataplane's metrics as a `prometheus-client` collector: read from the running
//! generation at scrape time, one series per upstream (label values are escaped by
//! the encoder, so any upstream name is safe).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::dataplane::{Dataplane, Upstream};

/// Collects the [`Dataplane`]'s counters; see [`Dataplane::register_metrics`].
#[derive(Debug)]
pub(crate) struct DataplaneCollector {
    pub(crate) dataplane: Arc<Dataplane>,
}

type Read = fn(&Upstream) -> u64;

const PER_UPSTREAM: [(&str, &str, MetricType, Read); 9] = [
    (
        "dwara_upstream_connections",
        "Client connections accepted",
        MetricType::Counter,
        |u| u.target.stats.accepted.load(Ordering::Relaxed),
    ),
    (
        "dwara_upstream_connections_active",
        "Client connections being forwarded now",
        MetricType::Gauge,
        |u| u.target.stats.active.load(Ordering::Relaxed),
    ),
    (
        "dwara_upstream_no_endpoints",
        "Client connections closed at once because the upstream had no endpoints",
        MetricType::Counter,
        |u| u.target.stats.no_endpoints.load(Ordering::Relaxed),
    ),
    (
        "dwara_upstream_connect_failures",
        "Failed connection attempts to endpoints (each retry counts)",
        MetricType::Counter,
        |u| u.target.stats.connect_failures.load(Ordering::Relaxed),
    ),
    (
        "dwara_upstream_bytes_to_upstream",
        "Bytes forwarded from clients to endpoints",
        MetricType::Counter,
        |u| u.target.stats.bytes_to_upstream.load(Ordering::Relaxed),
    ),
    (
        "dwara_upstream_bytes_to_client",
        "Bytes forwarded from endpoints to clients",
        MetricType::Counter,
        |u| u.target.stats.bytes_to_client.load(Ordering::Relaxed),
    ),
    (
        "dwara_upstream_endpoints",
        "Endpoints in the upstream's current set",
        MetricType::Gauge,
        |u| u.target.lb.endpoints().len() as u64,
    ),
    (
        "dwara_upstream_endpoint_updates",
        "Changes of the endpoint set published by discovery",
        MetricType::Counter,
        |u| {
            u.discovery
                .as_ref()
                .map_or(0, |d| d.stats.counters().updates)
        },
    ),
    (
        "dwara_upstream_endpoints_ejected",
        "Endpoints skipped by passive ejection now",
        MetricType::Gauge,
        |u| {
            let stats = u.target.lb.stats();
            stats.endpoints.iter().filter(|e| e.ejected).count() as u64
        },
    ),
];

pub(crate) fn encode_value(
    family: &mut prometheus_client::encoding::MetricEncoder<'_>,
    kind: MetricType,
    labels: &[(&str, &str)],
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric = family.encode_family(&labels)?;
    match kind {
        MetricType::Gauge => {
            ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)
        }
        _ => ConstCounter::new(value).encode(metric),
    }
}

impl Collector for DataplaneCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let generation = self.dataplane.generation();
        let g = ConstGauge::new(i64::try_from(generation.number).unwrap_or(i64::MAX));
        g.encode(encoder.encode_descriptor(
            "dwara_config_generation",
            "Number of the running upstreams configuration (increases on every reload)",
            None,
            g.metric_type(),
        )?)?;
        for (name, help, kind, read) in PER_UPSTREAM {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for up in &generation.upstreams {
                encode_value(
                    &mut family,
                    kind,
                    &[("upstream", &up.config.name)],
                    read(up),
                )?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "dwara_upstream_picks",
            "Connections forwarded, by upstream and endpoint",
            None,
            MetricType::Counter,
        )?;
        for up in &generation.upstreams {
            let picks: Vec<_> = up
                .target
                .stats
                .picks
                .lock()
                .iter()
                .map(|(a, n)| (a.to_string(), *n))
                .collect();
            for (addr, n) in picks {
                let labels = [("upstream", up.config.name.as_str()), ("endpoint", &addr)];
                encode_value(&mut family, MetricType::Counter, &labels, n)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "dwara_l4_worker_connections",
            "Client connections accepted, by L4 worker thread",
            None,
            MetricType::Counter,
        )?;
        for (i, n) in self.dataplane.worker_accepted().enumerate() {
            let worker = i.to_string();
            encode_value(&mut family, MetricType::Counter, &[("worker", &worker)], n)?;
        }
        let mut family = encoder.encode_descriptor(
            "dwara_discovery_resolutions",
            "Discovery resolutions, by upstream and outcome (ok: endpoints, empty: an authoritative empty answer, failure)",
            None,
            MetricType::Counter,
        )?;
        for up in &generation.upstreams {
            let Some(d) = &up.discovery else { continue };
            let c = d.stats.counters();
            for (outcome, n) in [
                ("ok", c.answers_nonempty),
                ("empty", c.answers_empty),
                ("failure", c.failures),
            ] {
                let labels = [("upstream", up.config.name.as_str()), ("outcome", outcome)];
                encode_value(&mut family, MetricType::Counter, &labels, n)?;
            }
        }
        crate::http_metrics::encode(&generation, &mut encoder)
    }
}
