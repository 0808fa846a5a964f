//! The refresh loop: resolve → apply policy → publish → sleep → repeat.
//!
//! The decisions are pure functions ([`decide`], [`next_delay`]) so they can be
//! tested without clocks or servers; [`run`] wires them to a source, an
//! [`UpstreamLb`], tokio's timer and the upstream's [`DiscoveryStats`].
//!
//! Policy, as in the design:
//! - sleep `min(refresh_interval, TTL)`, never less than `min_refresh` (TTL 0, as
//!   Consul serves by default, would otherwise spin), minus up to `jitter` of it so
//!   many upstreams do not ask the resolver in lockstep;
//! - after a failure, back off from `failure_backoff` doubling up to the refresh
//!   interval (Envoy's `dns_failure_refresh_rate`);
//! - a failure keeps the last set when `fail_open`, else clears it;
//! - an answer with fewer than `min_endpoints` keeps the previous set (an empty
//!   previous set is replaced by any non-empty answer: the floor protects a working
//!   set from collapse, it never holds the upstream at zero);
//! - an unchanged answer publishes nothing;
//! - a push source ([`DiscoverySource::changes`]) is resolved again as soon as it
//!   says it changed, without the floor (its changes are events, not a TTL that
//!   could spin); the refresh interval stays as a backstop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use dwara_lb::{EndpointSet, UpstreamLb};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{DiscoveryError, DiscoverySource, Resolution};

/// Timing and policy of one upstream's refresh loop.
#[derive(Debug, Clone, PartialEq)]
pub struct RefreshPolicy {
    /// Upper bound of the time between resolutions.
    pub refresh_interval: Duration,
    /// Keep the last set on failure (true) or clear it (false).
    pub fail_open: bool,
    /// Answers with fewer endpoints keep the previous set.
    pub min_endpoints: usize,
    /// Floor of the time between resolutions (guards against TTL 0).
    pub min_refresh: Duration,
    /// First retry delay after a failure; doubles up to `refresh_interval`.
    pub failure_backoff: Duration,
    /// Fraction (0..1) by which a delay may be shortened at random.
    pub jitter: f64,
    /// Upper bound of one resolution, whatever the source does.
    pub resolve_timeout: Duration,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_secs(30),
            fail_open: true,
            min_endpoints: 1,
            min_refresh: Duration::from_secs(1),
            failure_backoff: Duration::from_secs(1),
            jitter: 0.1,
            resolve_timeout: Duration::from_secs(30),
        }
    }
}

/// What the loop did with one resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The answer differs from the published set: publish it.
    Publish(EndpointSet),
    /// The answer equals the published set: nothing to do.
    Unchanged,
    /// Fewer endpoints than `min_endpoints`: keep the previous set.
    KeepBelowFloor,
    /// Failure with `fail_open`: keep the previous set.
    KeepOnFailure,
    /// Failure with `fail_open: false`: clear the set.
    Clear,
}

impl Decision {
    /// Short label for logs, metrics and the status API.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Publish(_) => "published",
            Self::Unchanged => "unchanged",
            Self::KeepBelowFloor => "kept_below_floor",
            Self::KeepOnFailure => "kept_on_failure",
            Self::Clear => "cleared",
        }
    }
}

/// Decides what one resolution means for the published set.
pub fn decide(
    policy: &RefreshPolicy,
    current: &EndpointSet,
    result: &Result<Resolution, DiscoveryError>,
) -> Decision {
    match result {
        Ok(res) if res.endpoints == *current => Decision::Unchanged,
        Ok(res) if res.endpoints.len() < policy.min_endpoints && !current.is_empty() => {
            Decision::KeepBelowFloor
        }
        Ok(res) => Decision::Publish(res.endpoints.clone()),
        Err(_) if policy.fail_open => Decision::KeepOnFailure,
        Err(_) if current.is_empty() => Decision::Unchanged,
        Err(_) => Decision::Clear,
    }
}

/// The time until the next resolution. `failures` counts consecutive failures
/// including this one; `unit` is a uniform random number in `[0, 1)` for jitter.
pub fn next_delay(
    policy: &RefreshPolicy,
    result: &Result<Resolution, DiscoveryError>,
    failures: u32,
    unit: f64,
) -> Duration {
    let base = match result {
        Ok(res) => res.ttl.map_or(policy.refresh_interval, |ttl| {
            ttl.min(policy.refresh_interval)
        }),
        Err(_) => {
            let shift = failures.saturating_sub(1).min(16);
            policy
                .failure_backoff
                .saturating_mul(1 << shift)
                .min(policy.refresh_interval)
        }
    };
    let jitter = policy.jitter.clamp(0.0, 0.5) * unit.clamp(0.0, 1.0);
    base.mul_f64(1.0 - jitter).max(policy.min_refresh)
}

/// How the last resolution went, for the status API.
#[derive(Debug, Clone, Serialize)]
pub struct LastResolution {
    /// When it finished, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// `ok`, `empty` or the failure kind (`timeout`, `servfail`, …).
    pub outcome: &'static str,
    /// What the loop did (`published`, `unchanged`, `kept_below_floor`, …).
    pub decision: &'static str,
    /// Endpoints in the answer (not necessarily published).
    pub answer_endpoints: usize,
    /// TTL of the answer, in seconds.
    pub ttl_s: Option<u64>,
    /// The failure, if any.
    pub error: Option<String>,
    /// Delay until the next resolution, in milliseconds.
    pub next_in_ms: u64,
}

/// Counters of one upstream's loop, one per outcome: every resolution is counted
/// exactly once as a non-empty answer, an empty answer or a failure, so a reader
/// never derives one count from two others read at different moments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Answers with at least one endpoint.
    pub answers_nonempty: u64,
    /// Authoritative empty answers (NXDOMAIN, NODATA, zero endpoints).
    pub answers_empty: u64,
    /// Failures (timeouts, SERVFAIL, transport errors …).
    pub failures: u64,
    /// New sets published (including clears).
    pub updates: u64,
    /// Answers held back by the `min_endpoints` floor.
    pub below_floor: u64,
    /// Sets cleared by `fail_open: false`.
    pub cleared: u64,
}

impl Counters {
    /// Answers of either kind.
    pub fn answers(&self) -> u64 {
        self.answers_nonempty.saturating_add(self.answers_empty)
    }

    /// Resolutions finished: every answer and every failure.
    pub fn resolutions(&self) -> u64 {
        self.answers().saturating_add(self.failures)
    }
}

/// Shared, live statistics of one upstream's discovery; survives respawns when the
/// caller passes the same `Arc` to the next generation.
#[derive(Debug)]
pub struct DiscoveryStats {
    answers_nonempty: AtomicU64,
    answers_empty: AtomicU64,
    failures: AtomicU64,
    updates: AtomicU64,
    below_floor: AtomicU64,
    cleared: AtomicU64,
    last: Mutex<Option<LastResolution>>,
    changes: watch::Sender<u64>,
    resolved: watch::Sender<u64>,
}

impl Default for DiscoveryStats {
    fn default() -> Self {
        Self {
            answers_nonempty: AtomicU64::new(0),
            answers_empty: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            updates: AtomicU64::new(0),
            below_floor: AtomicU64::new(0),
            cleared: AtomicU64::new(0),
            last: Mutex::new(None),
            changes: watch::Sender::new(0),
            resolved: watch::Sender::new(0),
        }
    }
}

impl DiscoveryStats {
    /// A snapshot of the counters. Each field is read on its own: fields may be a
    /// resolution apart, but none is ever derived from another.
    pub fn counters(&self) -> Counters {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            answers_nonempty: get(&self.answers_nonempty),
            answers_empty: get(&self.answers_empty),
            failures: get(&self.failures),
            updates: get(&self.updates),
            below_floor: get(&self.below_floor),
            cleared: get(&self.cleared),
        }
    }

    /// Counts one finished resolution; returns its outcome label (`ok`, `empty` or
    /// the failure kind).
    pub(crate) fn record_resolution(
        &self,
        result: &Result<Resolution, DiscoveryError>,
    ) -> &'static str {
        match result {
            Ok(res) if res.endpoints.is_empty() => {
                self.answers_empty.fetch_add(1, Ordering::Relaxed);
                "empty"
            }
            Ok(_) => {
                self.answers_nonempty.fetch_add(1, Ordering::Relaxed);
                "ok"
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                e.kind()
            }
        }
    }

    /// The last resolution, if any happened.
    pub fn last(&self) -> Option<LastResolution> {
        self.last.lock().clone()
    }

    /// A receiver that sees the number of published changes each time the set
    /// changes (a new set or a clear).
    pub fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// A receiver that sees the number of finished resolutions after each one.
    pub fn subscribe_resolutions(&self) -> watch::Receiver<u64> {
        self.resolved.subscribe()
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn diff(old: &EndpointSet, new: &EndpointSet) -> (Vec<String>, Vec<String>) {
    let added = new
        .iter()
        .filter(|e| !old.contains(e.addr))
        .map(ToString::to_string)
        .collect();
    let removed = old
        .iter()
        .filter(|e| !new.contains(e.addr))
        .map(ToString::to_string)
        .collect();
    (added, removed)
}

/// Runs the refresh loop of one upstream until the task is aborted.
pub async fn run(
    upstream: Arc<str>,
    source: Arc<dyn DiscoverySource>,
    lb: Arc<UpstreamLb>,
    policy: RefreshPolicy,
    stats: Arc<DiscoveryStats>,
) {
    let mut rng = SmallRng::from_os_rng();
    let mut failures = 0u32;
    let mut changes = source.changes();
    info!(upstream = %upstream, source = %source.describe(), push = changes.is_some(), "discovery started");
    // The last answer, and when the next timed resolution is due.
    let mut last_answer: Option<EndpointSet> = None;
    let mut due = Instant::now();
    let mut wake = Wake::Timer;
    loop {
        // Marked seen before resolving: a change during the resolution wakes the
        // next wait at once, so none is lost.
        if let Some(rx) = &mut changes {
            rx.borrow_and_update();
        }
        let result = match tokio::time::timeout(policy.resolve_timeout, source.resolve()).await {
            Ok(r) => r,
            Err(_) => Err(DiscoveryError::Timeout {
                source_name: source.describe(),
                after: policy.resolve_timeout,
            }),
        };
        // A push source says "something changed", not "this changed": an answer
        // equal to the last one is not a resolution worth counting or logging (an
        // upstream held below its floor would warn at every change of any name).
        if wake == Wake::Push {
            let same = match (&result, &last_answer) {
                (Ok(res), Some(last)) => res.endpoints == *last,
                _ => false,
            };
            if same {
                wake = wait(&upstream, &mut changes, due).await;
                continue;
            }
        }
        last_answer = result.as_ref().ok().map(|r| r.endpoints.clone());
        let outcome = stats.record_resolution(&result);
        failures = match &result {
            Ok(_) => 0,
            Err(_) => failures.saturating_add(1),
        };

        let current = lb.endpoints();
        let decision = decide(&policy, &current, &result);
        let changed = apply(
            &upstream, &lb, &stats, &policy, &current, &decision, &result,
        );

        let delay = next_delay(&policy, &result, failures, rng.random::<f64>());
        if let Err(e) = &result {
            let kept = matches!(decision, Decision::KeepOnFailure);
            warn!(upstream = %upstream, error = %e, consecutive_failures = failures, kept_endpoints = if kept { current.len() } else { 0 }, retry_in_ms = delay.as_millis() as u64, "discovery resolution failed");
        }
        record_last(&stats, outcome, &decision, &result, delay);
        // Notify after `last` is recorded, so a watcher sees this resolution's outcome.
        if changed {
            stats.changes.send_modify(|v| *v += 1);
        }
        stats.resolved.send_modify(|v| *v += 1);
        due = Instant::now() + delay;
        wake = wait(&upstream, &mut changes, due).await;
    }
}

/// Carries a decision out on the load balancer, counting and logging it; whether
/// the endpoint set changed.
fn apply(
    upstream: &str,
    lb: &UpstreamLb,
    stats: &DiscoveryStats,
    policy: &RefreshPolicy,
    current: &EndpointSet,
    decision: &Decision,
    result: &Result<Resolution, DiscoveryError>,
) -> bool {
    let mut changed = false;
    match &decision {
        Decision::Publish(set) => {
            if lb.update(set.clone()) {
                let (added, removed) = diff(current, set);
                stats.updates.fetch_add(1, Ordering::Relaxed);
                changed = true;
                info!(upstream = %upstream, endpoints = set.len(), ?added, ?removed, "endpoint set updated");
            }
        }
        Decision::Clear => {
            if lb.clear() {
                stats.updates.fetch_add(1, Ordering::Relaxed);
                stats.cleared.fetch_add(1, Ordering::Relaxed);
                changed = true;
                warn!(upstream = %upstream, removed = current.len(), "DNS failing and fail_open is false: endpoint set cleared until DNS recovers");
            }
        }
        Decision::KeepBelowFloor => {
            stats.below_floor.fetch_add(1, Ordering::Relaxed);
            let got = result.as_ref().map_or(0, |r| r.endpoints.len());
            warn!(upstream = %upstream, got, min_endpoints = policy.min_endpoints, kept = current.len(), "answer below min_endpoints: keeping the previous set");
        }
        Decision::KeepOnFailure => {}
        Decision::Unchanged => {
            debug!(upstream = %upstream, endpoints = current.len(), "endpoint set unchanged");
        }
    }
    changed
}

/// Records the resolution's outcome for `GET /upstreams`.
fn record_last(
    stats: &DiscoveryStats,
    outcome: &'static str,
    decision: &Decision,
    result: &Result<Resolution, DiscoveryError>,
    delay: Duration,
) {
    *stats.last.lock() = Some(LastResolution {
        at_unix_ms: unix_ms(SystemTime::now()),
        outcome,
        decision: decision.label(),
        answer_endpoints: result.as_ref().map_or(0, |r| r.endpoints.len()),
        ttl_s: result
            .as_ref()
            .ok()
            .and_then(|r| r.ttl)
            .map(|t| t.as_secs()),
        error: result.as_ref().err().map(ToString::to_string),
        next_in_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
    });
}

/// What ended a wait of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// The next resolution was due.
    Timer,
    /// A push source said it changed.
    Push,
}

/// Sleeps until `due`, or until a push source marks a change.
async fn wait(upstream: &str, changes: &mut Option<watch::Receiver<u64>>, due: Instant) -> Wake {
    let Some(rx) = changes else {
        tokio::time::sleep_until(due).await;
        return Wake::Timer;
    };
    tokio::select! {
        () = tokio::time::sleep_until(due) => Wake::Timer,
        changed = rx.changed() => match changed {
            Ok(()) => Wake::Push,
            Err(_) => {
                // The source's sender is gone: poll from now on.
                warn!(upstream = %upstream, "push source closed; polling it from now on");
                *changes = None;
                Wake::Timer
            }
        },
    }
}

#[cfg(test)]
mod tests;
