//! The counters of an HTTP upstream (kept across reloads by name) and its retry
//! budget.
//!
//! The latency histogram has fixed buckets (upper bounds in seconds, Prometheus
//! style, cumulative at scrape time) and counts per bucket in atomics, so recording
//! a request is a few relaxed additions. The retry budget allows a retry while the
//! retries of the last 10 s stay within 20% of the requests of the last 10 s (with
//! a floor of [`MIN_RETRIES`], so that an upstream with little traffic can still
//! ride over one endpoint going away); it counts in ten one-second buckets. Only
//! retries of a request that may have reached an endpoint take from it (see
//! [`crate::reverse`]): a request never written multiplies no endpoint's load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Upper bounds of the latency buckets, in seconds (the last bucket is +Inf).
pub(crate) const LATENCY_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why dwara itself answered a request (counted, and logged at debug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Made {
    /// 503: nothing to route to.
    NoEndpoints,
    /// 502: every try failed to connect or the connection failed.
    BadGateway,
    /// 504: no response head within the response timeout, or the endpoint took
    /// no byte of the request body for the body timeout.
    Timeout,
    /// 408: the client sent no byte of its request body for the body timeout.
    ClientTimeout,
    /// 400: the client's request body failed (a malformed chunk, or its
    /// connection or stream failed while sending it).
    BadRequest,
    /// 501: a `CONNECT`, which asks for a tunnel this gateway does not open.
    NotImplemented,
    /// 400: more than one `Host`, or one that is not a host and port.
    BadHost,
    /// 501: a request body in a transfer coding other than chunked.
    UnknownCoding,
}

/// The counters of one HTTP upstream.
#[derive(Debug, Default)]
pub(crate) struct HttpStats {
    /// Requests answered, by status class (index 0 is 1xx … 4 is 5xx).
    pub(crate) by_class: [AtomicU64; 5],
    /// Tries after the first, over all requests.
    pub(crate) retries: AtomicU64,
    /// Retries refused by the retry budget.
    pub(crate) budget_exhausted: AtomicU64,
    /// 503s for want of an endpoint.
    pub(crate) no_endpoints: AtomicU64,
    /// 502s made by dwara.
    pub(crate) bad_gateway: AtomicU64,
    /// 504s made by dwara.
    pub(crate) timeouts: AtomicU64,
    /// 408s made by dwara: request bodies the client stopped sending.
    pub(crate) client_timeouts: AtomicU64,
    /// 400s made by dwara: request bodies that failed on the client's side, and
    /// requests with more than one `Host` or a malformed one.
    pub(crate) bad_requests: AtomicU64,
    /// 501s made by dwara: `CONNECT` requests, and request bodies in a transfer
    /// coding other than chunked.
    pub(crate) not_implemented: AtomicU64,
    /// Response bodies cut off because the endpoint sent no byte of them for the
    /// body timeout.
    pub(crate) body_timeouts: AtomicU64,
    /// Client connections closed because their client took no byte for the send
    /// timeout.
    pub(crate) send_timeouts: AtomicU64,
    /// Requests given up before their answer because their client went away (it
    /// closed its connection or reset its HTTP/2 stream, or the connection was
    /// closed at shutdown): the request to the endpoint ends with them.
    pub(crate) cancelled: AtomicU64,
    /// Requests answered `101 Switching Protocols` by their endpoint: each made
    /// its client connection a tunnel to the endpoint (see [`crate::tunnel`]).
    pub(crate) upgrades: AtomicU64,
    /// Tunnels open now.
    pub(crate) tunnels: AtomicU64,
    /// New connections to endpoints (dialled and handshaken).
    pub(crate) connects: AtomicU64,
    /// Failed connection attempts to endpoints.
    pub(crate) connect_failures: AtomicU64,
    /// Requests sent on a pooled connection instead of a new one.
    pub(crate) reused: AtomicU64,
    /// Client connections open now.
    pub(crate) client_connections: AtomicU64,
    /// Client connections refused at the connection limit.
    pub(crate) client_refused: AtomicU64,
    /// Latency histogram (request head in to response head out): counts per bucket,
    /// the last one +Inf.
    pub(crate) latency: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    /// Sum of the latencies, in microseconds.
    pub(crate) latency_sum_us: AtomicU64,
    pub(crate) budget: RetryBudget,
}

impl HttpStats {
    /// Counts one answered request.
    pub(crate) fn answered(&self, status: u16, took: Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].fetch_add(1, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Counts an answer that dwara made.
    pub(crate) fn made(&self, why: Made) {
        let c = match why {
            Made::NoEndpoints => &self.no_endpoints,
            Made::BadGateway => &self.bad_gateway,
            Made::Timeout => &self.timeouts,
            Made::ClientTimeout => &self.client_timeouts,
            Made::BadRequest | Made::BadHost => &self.bad_requests,
            Made::NotImplemented | Made::UnknownCoding => &self.not_implemented,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a client connection closed.
    pub(crate) fn client_connections_done(&self) {
        self.client_connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Requests answered in all.
    pub(crate) fn requests(&self) -> u64 {
        self.by_class
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// The floor of the retry budget: retries allowed per window whatever the traffic.
pub(crate) const MIN_RETRIES: u64 = 10;
/// Retries allowed per request over the window.
const RETRY_RATIO: f64 = 0.2;
/// Seconds in the window.
const WINDOW_S: usize = 10;

/// Requests and retries of the last [`WINDOW_S`] seconds.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    start: Instant,
    buckets: Mutex<[(u64, u64, u64); WINDOW_S]>,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            buckets: Mutex::new([(u64::MAX, 0, 0); WINDOW_S]),
        }
    }
}

impl RetryBudget {
    fn at(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start).as_secs()
    }

    /// The bucket of second `now`, reset when it held an older second.
    fn bucket(buckets: &mut [(u64, u64, u64); WINDOW_S], now: u64) -> &mut (u64, u64, u64) {
        let b = &mut buckets[(now % WINDOW_S as u64) as usize];
        if b.0 != now {
            *b = (now, 0, 0);
        }
        b
    }

    /// Counts a request that came at `now`.
    pub(crate) fn request(&self, now: Instant) {
        let now = self.at(now);
        let mut buckets = self.buckets.lock();
        Self::bucket(&mut buckets, now).1 += 1;
    }

    /// Takes a retry from the budget; `false` when it is spent.
    pub(crate) fn try_retry(&self) -> bool {
        self.try_retry_at(Instant::now())
    }

    /// [`try_retry`](Self::try_retry) at `now`.
    fn try_retry_at(&self, now: Instant) -> bool {
        let now = self.at(now);
        let mut buckets = self.buckets.lock();
        let oldest = now.saturating_sub(WINDOW_S as u64 - 1);
        let (requests, retries) = buckets
            .iter()
            .filter(|b| b.0 != u64::MAX && b.0 >= oldest && b.0 <= now)
            .fold((0, 0), |(q, r), b| (q + b.1, r + b.2));
        let allowed = MIN_RETRIES.max((requests as f64 * RETRY_RATIO) as u64);
        if retries >= allowed {
            return false;
        }
        Self::bucket(&mut buckets, now).2 += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_allows_a_fifth_of_the_requests_with_a_floor() {
        let b = RetryBudget::default();
        let granted = (0..100).filter(|_| b.try_retry()).count() as u64;
        assert_eq!(granted, MIN_RETRIES);
        for _ in 0..1000 {
            b.request(Instant::now());
        }
        let granted = (0..1000).filter(|_| b.try_retry()).count() as u64;
        assert_eq!(granted + MIN_RETRIES, 200);
    }

    #[test]
    fn the_budget_counts_only_the_last_ten_seconds() {
        let b = RetryBudget::default();
        let t0 = b.start;
        for _ in 0..100 {
            b.request(t0);
        }
        // 20 of 100 requests, and not one more within the window.
        let granted = (0..50).filter(|_| b.try_retry_at(t0)).count();
        assert_eq!(granted, 20);
        let late = t0 + Duration::from_millis(9_900);
        assert!(!b.try_retry_at(late), "second 9 still holds second 0");
        // Second 10: second 0's requests and retries have left the window; the
        // floor is what is left.
        let next = t0 + Duration::from_secs(10);
        let granted = (0..50).filter(|_| b.try_retry_at(next)).count() as u64;
        assert_eq!(granted, MIN_RETRIES);
        // Requests of the new window raise it again.
        for _ in 0..200 {
            b.request(next);
        }
        let granted = (0..50).filter(|_| b.try_retry_at(next)).count() as u64;
        assert_eq!(granted + MIN_RETRIES, 40);
    }

    #[test]
    fn classes_and_buckets() {
        let s = HttpStats::default();
        s.answered(204, Duration::from_micros(300));
        s.answered(503, Duration::from_secs(60));
        assert_eq!(s.by_class[1].load(Ordering::Relaxed), 1);
        assert_eq!(s.by_class[4].load(Ordering::Relaxed), 1);
        assert_eq!(s.latency[0].load(Ordering::Relaxed), 1);
        assert_eq!(s.latency[LATENCY_BOUNDS.len()].load(Ordering::Relaxed), 1);
        assert_eq!(s.requests(), 2);
    }
}
