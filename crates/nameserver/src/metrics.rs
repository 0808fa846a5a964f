//! Counters of the name server, exposed through a `prometheus-client` collector.
//!
//! Each UDP worker owns a [`Counters`] block (cache-line aligned, relaxed atomics) so
//! the fast path never shares a written cache line with another thread; a scrape sums
//! the blocks. TCP, forwarding and HTTP use shared blocks: they are not the hot path.
//! [`NameServerCollector`] reads the blocks (the database's size, and with a data dir
//! the registration store's counters) at scrape time;
//! the text format is `prometheus-client`'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::durable::Durable;
use dwara_records::Db;

const QTYPES: [(&str, Option<u16>); 12] = [
    ("A", Some(1)),
    ("NS", Some(2)),
    ("CNAME", Some(5)),
    ("SOA", Some(6)),
    ("PTR", Some(12)),
    ("MX", Some(15)),
    ("TXT", Some(16)),
    ("AAAA", Some(28)),
    ("SRV", Some(33)),
    ("ANY", Some(255)),
    ("other", None),
    ("none", None),
];
const OTHER_QTYPE: usize = 10;
const NO_QTYPE: usize = 11;

const RCODES: [&str; 8] = [
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "BADVERS", "other",
];

fn qtype_index(qtype: Option<u16>) -> usize {
    match qtype {
        None => NO_QTYPE,
        Some(t) => QTYPES[..OTHER_QTYPE]
            .iter()
            .position(|(_, v)| *v == Some(t))
            .unwrap_or(OTHER_QTYPE),
    }
}

fn rcode_index(rcode: u16) -> usize {
    match rcode {
        0..=5 => usize::from(rcode),
        16 => 6,
        _ => 7,
    }
}

/// One block of DNS counters.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Counters {
    queries: [[AtomicU64; RCODES.len()]; QTYPES.len()],
    dropped: AtomicU64,
    forwarded: AtomicU64,
    forward_failures: AtomicU64,
    refused: [AtomicU64; REFUSED_REASONS.len()],
    rate_limited: [AtomicU64; RATE_LIMIT_ACTIONS.len()],
    udp_request_bytes: AtomicU64,
    udp_reply_bytes: AtomicU64,
}

/// Why a query was refused (`dwara_dns_refused{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The client is not on the allow list.
    ClientNotAllowed = 0,
    /// The client is not on the allow list and the name would be forwarded
    /// (`--dns-allow-local-any`).
    ForwardNotAllowed = 1,
}

const REFUSED_REASONS: [&str; 2] = ["client_not_allowed", "forward_not_allowed"];

/// What the rate limit did with a query (`dwara_dns_rate_limited{action}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateLimited {
    /// An empty truncated reply.
    Slipped = 0,
    /// No reply.
    Dropped = 1,
}

const RATE_LIMIT_ACTIONS: [&str; 2] = ["slipped", "dropped"];

impl Default for Counters {
    fn default() -> Self {
        Self {
            queries: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            dropped: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            forward_failures: AtomicU64::new(0),
            refused: std::array::from_fn(|_| AtomicU64::new(0)),
            rate_limited: std::array::from_fn(|_| AtomicU64::new(0)),
            udp_request_bytes: AtomicU64::new(0),
            udp_reply_bytes: AtomicU64::new(0),
        }
    }
}

impl Counters {
    /// Counts one answered query.
    #[inline]
    pub(crate) fn record(&self, qtype: Option<u16>, rcode: u16) {
        self.queries[qtype_index(qtype)][rcode_index(rcode)].fetch_add(1, Relaxed);
    }

    /// Counts one packet that got no answer (garbage without a header, responses).
    #[inline]
    pub(crate) fn dropped(&self) {
        self.dropped.fetch_add(1, Relaxed);
    }

    /// Counts one query sent to the fallback servers.
    pub(crate) fn forwarded(&self) {
        self.forwarded.fetch_add(1, Relaxed);
    }

    /// Counts one query no fallback server answered.
    pub(crate) fn forward_failed(&self) {
        self.forward_failures.fetch_add(1, Relaxed);
    }

    /// Counts one refused query.
    #[inline]
    pub(crate) fn refused(&self, reason: Refused) {
        self.refused[reason as usize].fetch_add(1, Relaxed);
    }

    /// Counts one rate-limited query.
    #[inline]
    pub(crate) fn rate_limited(&self, action: RateLimited) {
        self.rate_limited[action as usize].fetch_add(1, Relaxed);
    }

    /// Counts one UDP datagram received.
    #[inline]
    pub(crate) fn udp_request(&self, bytes: usize) {
        self.udp_request_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Counts one UDP reply sent.
    #[inline]
    pub(crate) fn udp_reply(&self, bytes: usize) {
        self.udp_reply_bytes.fetch_add(bytes as u64, Relaxed);
    }
}

/// The result of one health check (`dwara_health_checks{result}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The check passed (the connection was accepted).
    Pass = 0,
    /// The check failed (refused, unreachable or timed out).
    Fail = 1,
}

const PROBE_RESULTS: [&str; 2] = ["pass", "fail"];

/// Every counter of one name server.
#[derive(Debug, Default)]
pub struct Metrics {
    blocks: Mutex<Vec<Arc<Counters>>>,
    shared: Arc<Counters>,
    http: Mutex<BTreeMap<u16, u64>>,
    /// Rate-limit buckets evicted while still limiting (the limiter counts here).
    evictions: Arc<AtomicU64>,
    /// Health checks run, by [`Probe`].
    checks: [AtomicU64; PROBE_RESULTS.len()],
    /// Checkers running on this node.
    checks_running: AtomicU64,
}

impl Metrics {
    /// Fresh, zeroed metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new counter block for one worker thread.
    pub(crate) fn worker_block(&self) -> Arc<Counters> {
        let block = Arc::new(Counters::default());
        self.blocks.lock().push(block.clone());
        block
    }

    /// The block shared by TCP connections and forwarding tasks.
    pub(crate) fn shared(&self) -> &Arc<Counters> {
        &self.shared
    }

    /// Counts one HTTP response by status.
    pub fn record_http(&self, status: u16) {
        *self.http.lock().entry(status).or_default() += 1;
    }

    /// Counts one health check.
    pub(crate) fn record_check(&self, probe: Probe) {
        self.checks[probe as usize].fetch_add(1, Relaxed);
    }

    /// Sets how many checkers run on this node.
    pub(crate) fn set_checks_running(&self, n: usize) {
        self.checks_running.store(n as u64, Relaxed);
    }

    /// The counter the rate limiter counts its evictions in.
    pub(crate) fn rate_limit_evictions(&self) -> &Arc<AtomicU64> {
        &self.evictions
    }

    fn blocks(&self) -> Vec<Arc<Counters>> {
        let b = self.blocks.lock();
        b.iter()
            .cloned()
            .chain(std::iter::once(self.shared.clone()))
            .collect()
    }
}

/// The name server's metrics as a `prometheus-client` collector: DNS queries by
/// type and response code, forwarding, dropped packets, live entries and their
/// health, HTTP requests by status. Register it with [`crate::NameServer::register_metrics`].
#[derive(Debug)]
pub struct NameServerCollector {
    metrics: Arc<Metrics>,
    db: Arc<Db>,
    durable: Option<Arc<Durable>>,
}

impl NameServerCollector {
    /// A collector over `metrics` and `db`.
    pub fn new(metrics: Arc<Metrics>, db: Arc<Db>) -> Self {
        Self {
            metrics,
            db,
            durable: None,
        }
    }

    /// Adds the registration store's metrics (`dwara_store_*`, with `--data-dir`).
    pub(crate) fn with_durable(mut self, durable: Option<Arc<Durable>>) -> Self {
        self.durable = durable;
        self
    }
}

/// `dwara_store_*`: the registration store's writer.
fn encode_store(
    encoder: &mut DescriptorEncoder<'_>,
    stats: &dwara_store::StoreStats,
) -> Result<(), std::fmt::Error> {
    for (name, help, ok, failed) in [
        (
            "dwara_store_batches",
            "Registration store commits (one per batch of writes), by result",
            stats.batches,
            stats.failed_batches,
        ),
        (
            "dwara_store_writes",
            "Writes (puts and deletes) to the registration store, by result",
            stats.writes,
            stats.failed_writes,
        ),
    ] {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (result, v) in [("committed", ok), ("failed", failed)] {
            ConstCounter::new(v).encode(family.encode_family(&[("result", result)])?)?;
        }
    }
    counter(
        encoder,
        "dwara_store_reopens",
        "Reopens of the registration store after a failed commit",
        stats.reopens,
    )?;
    let seconds = ConstCounter::new(stats.commit_seconds);
    seconds.encode(encoder.encode_descriptor(
        "dwara_store_commit_seconds",
        "Time spent committing to the registration store (fsync included)",
        None,
        seconds.metric_type(),
    )?)
}

fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
}

impl NameServerCollector {
    /// The DNS server's counters, summed over the workers' blocks.
    fn encode_dns(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let blocks = self.metrics.blocks();
        let sum = |f: &dyn Fn(&Counters) -> u64| -> u64 { blocks.iter().map(|b| f(b)).sum() };
        {
            let mut family = encoder.encode_descriptor(
                "dwara_dns_queries",
                "DNS queries answered, by query type and response code",
                None,
                MetricType::Counter,
            )?;
            for (qi, (qname, _)) in QTYPES.iter().enumerate() {
                for (ri, rname) in RCODES.iter().enumerate() {
                    let v = sum(&|b| b.queries[qi][ri].load(Relaxed));
                    if v > 0 {
                        let labels = [("qtype", *qname), ("rcode", *rname)];
                        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
                    }
                }
            }
        }
        counter(
            encoder,
            "dwara_dns_forwarded",
            "DNS queries sent to the fallback servers",
            sum(&|b| b.forwarded.load(Relaxed)),
        )?;
        counter(
            encoder,
            "dwara_dns_forward_failures",
            "Forwarded queries no fallback server answered (SERVFAIL sent)",
            sum(&|b| b.forward_failures.load(Relaxed)),
        )?;
        counter(
            encoder,
            "dwara_dns_dropped",
            "DNS packets that got no answer (no header, or not a query)",
            sum(&|b| b.dropped.load(Relaxed)),
        )?;
        for (name, help, labels, field) in [
            (
                "dwara_dns_refused",
                "DNS queries answered REFUSED by the allow list, by reason",
                ("reason", &REFUSED_REASONS[..]),
                (|b: &Counters, i: usize| b.refused[i].load(Relaxed))
                    as fn(&Counters, usize) -> u64,
            ),
            (
                "dwara_dns_rate_limited",
                "DNS/UDP queries over their client prefix's rate limit: given an empty truncated reply (slipped) or none (dropped)",
                ("action", &RATE_LIMIT_ACTIONS[..]),
                |b: &Counters, i: usize| b.rate_limited[i].load(Relaxed),
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (i, value) in labels.1.iter().enumerate() {
                let v = sum(&|b| field(b, i));
                ConstCounter::new(v).encode(family.encode_family(&[(labels.0, *value)])?)?;
            }
        }
        counter(
            encoder,
            "dwara_dns_udp_request_bytes",
            "Bytes of DNS/UDP datagrams received",
            sum(&|b| b.udp_request_bytes.load(Relaxed)),
        )?;
        counter(
            encoder,
            "dwara_dns_udp_reply_bytes",
            "Bytes of DNS/UDP replies sent (forwarded answers included)",
            sum(&|b| b.udp_reply_bytes.load(Relaxed)),
        )?;
        counter(
            encoder,
            "dwara_dns_rate_limit_evictions",
            "Rate-limit buckets evicted from the full table while still limiting their prefix",
            self.metrics.evictions.load(Relaxed),
        )?;
        Ok(())
    }

    /// The records database's entries and health, and the checks this node runs.
    fn encode_records(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let live = ConstGauge::new(i64::try_from(self.db.len()).unwrap_or(i64::MAX));
        live.encode(encoder.encode_descriptor(
            "dwara_records_entries",
            "Live entries in the records database",
            None,
            live.metric_type(),
        )?)?;
        let (by_health, failing_open) = self.db.health_counts();
        {
            let mut family = encoder.encode_descriptor(
                "dwara_records_health",
                "Live, visible entries by the state of their check (unchecked: no check)",
                None,
                MetricType::Gauge,
            )?;
            for (h, n) in crate::Health::ALL.iter().zip(by_health) {
                let v = ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
                v.encode(family.encode_family(&[("health", h.as_str())])?)?;
            }
        }
        let open = ConstGauge::new(i64::try_from(failing_open).unwrap_or(i64::MAX));
        open.encode(encoder.encode_descriptor(
            "dwara_records_names_failing_open",
            "Names none of whose live entries passes its check, answered with all of them",
            None,
            open.metric_type(),
        )?)?;
        {
            let mut family = encoder.encode_descriptor(
                "dwara_health_checks",
                "Health checks (check=tcp connects) this node ran, by result",
                None,
                MetricType::Counter,
            )?;
            for (i, result) in PROBE_RESULTS.iter().enumerate() {
                let v = ConstCounter::new(self.metrics.checks[i].load(Relaxed));
                v.encode(family.encode_family(&[("result", *result)])?)?;
            }
        }
        let running = ConstGauge::new(
            i64::try_from(self.metrics.checks_running.load(Relaxed)).unwrap_or(i64::MAX),
        );
        running.encode(encoder.encode_descriptor(
            "dwara_health_checks_running",
            "Entries registered over HTTP whose check this node runs",
            None,
            running.metric_type(),
        )?)?;
        Ok(())
    }

    /// The HTTP API's requests by status.
    fn encode_http(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let http: Vec<(u16, u64)> = self
            .metrics
            .http
            .lock()
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        let mut family = encoder.encode_descriptor(
            "dwara_http_requests",
            "HTTP API requests, by response status",
            None,
            MetricType::Counter,
        )?;
        for (status, v) in http {
            let labels = [("status", status.to_string())];
            ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Collector for NameServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.encode_dns(&mut encoder)?;
        self.encode_records(&mut encoder)?;
        self.encode_http(&mut encoder)?;
        if let Some(durable) = &self.durable {
            encode_store(&mut encoder, &durable.stats())?;
        }
        Ok(())
    }
}
