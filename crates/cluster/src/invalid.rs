//! Datagrams on the gossip port that are not chitchat messages, and chitchat's other
//! warnings a peer can trigger once per datagram.
//!
//! chitchat's UDP transport drops a datagram it cannot decode and logs one WARN line
//! for it (`invalid-chitchat-payload`, target `chitchat::transport::udp`), so a
//! flood of garbage on the gossip port becomes a flood of log lines. Its decoding is
//! crate-private, so the datagrams cannot be checked before chitchat sees them. The
//! binary's log setup therefore leaves that event out of the log and counts it here
//! instead ([`is_invalid_datagram_event`], [`count_invalid_datagram`]); each cluster
//! engine logs one summary line per [`SUMMARY_EVERY`] when the count moved, and the
//! count is `dwara_cluster_invalid_datagrams_total`. chitchat's other warnings (a
//! SYN for another cluster id, a peer answering "wrong cluster": ten a second from
//! one misconfigured neighbour, any rate from a flood) are limited by the binary to
//! [`WARNINGS_PER_WINDOW`] per [`SUMMARY_EVERY`]; the rest are counted
//! ([`count_suppressed_warning`], `dwara_cluster_suppressed_warnings_total`) and
//! reported in the same summary. The counts are per process (the events are too):
//! every cluster in one process reports the same numbers.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

/// How often an engine logs the datagrams dropped since its last summary.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// chitchat warnings let into the log per [`SUMMARY_EVERY`]; the rest are counted.
pub const WARNINGS_PER_WINDOW: u32 = 20;

static INVALID: LazyLock<Counter> = LazyLock::new(Counter::default);
static SUPPRESSED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// Whether `meta` is a warning of chitchat's (its undecodable-datagram event, which
/// [`is_invalid_datagram_event`] singles out, included).
pub fn is_chitchat_warning(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == tracing::Level::WARN
        && (meta.target() == "chitchat" || meta.target().starts_with("chitchat::"))
}

/// Counts one chitchat warning left out of the log.
pub fn count_suppressed_warning() {
    SUPPRESSED.inc();
}

/// chitchat warnings left out of the log so far in this process.
pub fn suppressed_warnings() -> u64 {
    SUPPRESSED.get()
}

/// Whether `meta` is chitchat's event for a datagram it could not decode.
pub fn is_invalid_datagram_event(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_event()
        && meta.target() == "chitchat::transport::udp"
        && *meta.level() == tracing::Level::WARN
        && meta.fields().field("payload_len").is_some()
}

/// Counts one datagram chitchat dropped as undecodable.
pub fn count_invalid_datagram() {
    INVALID.inc();
}

/// Datagrams dropped as undecodable so far in this process.
pub fn invalid_datagrams() -> u64 {
    INVALID.get()
}

/// The process-wide counter of undecodable datagrams, for a registry.
pub(crate) fn counter() -> Counter {
    INVALID.clone()
}

/// The process-wide counter of suppressed chitchat warnings, for a registry.
pub(crate) fn suppressed_counter() -> Counter {
    SUPPRESSED.clone()
}
