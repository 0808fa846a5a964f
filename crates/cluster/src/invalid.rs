//! Datagrams on the gossip port that are not chitchat messages.
//!
//! chitchat's UDP transport drops a datagram it cannot decode and logs one WARN line
//! for it (`invalid-chitchat-payload`, target `chitchat::transport::udp`), so a
//! flood of garbage on the gossip port becomes a flood of log lines. Its decoding is
//! crate-private, so the datagrams cannot be checked before chitchat sees them. The
//! binary's log setup therefore leaves that event out of the log and counts it here
//! instead ([`is_invalid_datagram_event`], [`count_invalid_datagram`]); each cluster
//! engine logs one summary line per [`SUMMARY_EVERY`] when the count moved, and the
//! count is `dwara_cluster_invalid_datagrams_total`. The count is per process (the
//! event is too): every cluster in one process reports the same number.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

/// How often an engine logs the datagrams dropped since its last summary.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

static INVALID: LazyLock<Counter> = LazyLock::new(Counter::default);

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

/// The process-wide counter, for a registry.
pub(crate) fn counter() -> Counter {
    INVALID.clone()
}
