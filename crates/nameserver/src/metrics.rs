//! Counters and their Prometheus text rendering.
//!
//! Each UDP worker owns a [`Counters`] block (cache-line aligned, relaxed atomics) so
//! the fast path never shares a written cache line with another thread; a scrape sums
//! the blocks. TCP, forwarding and HTTP use shared blocks: they are not the hot path.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::db::Db;

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
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            queries: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            dropped: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            forward_failures: AtomicU64::new(0),
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
}

/// Every counter of one name server.
#[derive(Debug, Default)]
pub struct Metrics {
    blocks: Mutex<Vec<Arc<Counters>>>,
    shared: Arc<Counters>,
    http: Mutex<BTreeMap<u16, u64>>,
    extra: Mutex<Extra>,
}

#[derive(Default)]
struct Extra(Option<ExtraMetrics>);

impl std::fmt::Debug for Extra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// A renderer of more metrics appended to `/metrics` (the binary's dataplane uses it).
pub type ExtraMetrics = Arc<dyn Fn(&mut String) + Send + Sync>;

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

    /// Appends `extra`'s output to every rendering (replaces an earlier one).
    pub fn set_extra(&self, extra: ExtraMetrics) {
        self.extra.lock().0 = Some(extra);
    }

    /// Counts one HTTP response by status.
    pub fn record_http(&self, status: u16) {
        *self.http.lock().entry(status).or_default() += 1;
    }

    /// Total DNS queries answered (any type, any rcode) so far.
    pub fn queries_total(&self) -> u64 {
        let blocks = self.blocks.lock();
        blocks
            .iter()
            .chain(std::iter::once(&self.shared))
            .flat_map(|b| b.queries.iter().flatten())
            .map(|c| c.load(Relaxed))
            .sum()
    }

    /// Renders everything in the Prometheus text exposition format.
    pub fn render(&self, db: &Db) -> String {
        let blocks: Vec<Arc<Counters>> = {
            let b = self.blocks.lock();
            b.iter()
                .cloned()
                .chain(std::iter::once(self.shared.clone()))
                .collect()
        };
        let sum = |f: &dyn Fn(&Counters) -> u64| -> u64 { blocks.iter().map(|b| f(b)).sum() };
        let mut s = String::with_capacity(4096);
        s.push_str("# HELP dwara_dns_queries_total DNS queries answered, by query type and response code.\n");
        s.push_str("# TYPE dwara_dns_queries_total counter\n");
        for (qi, (qname, _)) in QTYPES.iter().enumerate() {
            for (ri, rname) in RCODES.iter().enumerate() {
                let v = sum(&|b| b.queries[qi][ri].load(Relaxed));
                if v > 0 {
                    let _ = writeln!(
                        s,
                        "dwara_dns_queries_total{{qtype=\"{qname}\",rcode=\"{rname}\"}} {v}"
                    );
                }
            }
        }
        let simple = [
            (
                "dwara_dns_forwarded_total",
                "DNS queries sent to the fallback servers.",
                sum(&|b| b.forwarded.load(Relaxed)),
            ),
            (
                "dwara_dns_forward_failures_total",
                "Forwarded queries no fallback server answered (SERVFAIL sent).",
                sum(&|b| b.forward_failures.load(Relaxed)),
            ),
            (
                "dwara_dns_dropped_total",
                "DNS packets that got no answer (no header, or not a query).",
                sum(&|b| b.dropped.load(Relaxed)),
            ),
        ];
        for (name, help, v) in simple {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        let _ = writeln!(
            s,
            "# HELP dwara_records_entries Live entries in the records database.\n\
             # TYPE dwara_records_entries gauge\ndwara_records_entries {}",
            db.len()
        );
        s.push_str("# HELP dwara_http_requests_total HTTP API requests, by response status.\n");
        s.push_str("# TYPE dwara_http_requests_total counter\n");
        for (status, v) in self.http.lock().iter() {
            let _ = writeln!(s, "dwara_http_requests_total{{status=\"{status}\"}} {v}");
        }
        let extra = self.extra.lock().0.clone();
        if let Some(extra) = extra {
            extra(&mut s);
        }
        s
    }
}
