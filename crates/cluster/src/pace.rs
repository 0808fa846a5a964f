//! Pacing of the gossip rounds the engine starts to push local changes.
//!
//! Every such round costs both sides a digest, a delta and chitchat's zstd
//! compression of them, whatever the delta holds. One round per registration made a
//! burst of registrations spend most of the CPU compressing (measured: a third of
//! the samples of a node taking 3,500 registrations a second). A [`Pacer`] lets the
//! first request for a peer through at once, so an isolated change still spreads in
//! one round trip, and folds the requests that follow within [`GAP`] into one round
//! at the end of the gap, which then carries all of them. A catch-up pull (a round
//! that brought many keys asks for the next at once) is not paced: each is full.
//!
//! Time is the monotonic clock of the caller's `now`; nothing here reads a wall clock.

use std::collections::HashMap;
use std::net::SocketAddr;

use tokio::time::{Duration, Instant};

/// The least time between two rounds the engine starts with one peer.
pub(crate) const GAP: Duration = Duration::from_millis(10);

/// When each peer last got a round from us, and which peers are owed one.
#[derive(Debug, Default)]
pub(crate) struct Pacer {
    last: HashMap<SocketAddr, Instant>,
    owed: HashMap<SocketAddr, Instant>,
}

impl Pacer {
    /// Asks for a round with `peer`. Returns whether to start it now; otherwise it is
    /// owed and [`Pacer::due`] hands it out when the gap has passed.
    pub(crate) fn request(&mut self, peer: SocketAddr, now: Instant) -> bool {
        match self.last.get(&peer) {
            Some(last) if now.saturating_duration_since(*last) < GAP => {
                self.owed.entry(peer).or_insert(*last + GAP);
                false
            }
            _ => {
                self.last.insert(peer, now);
                self.owed.remove(&peer);
                true
            }
        }
    }

    /// Records a round with `peer` started outside the pacing (a catch-up pull, which
    /// goes at once: it is full, not one of many small ones). It carries whatever
    /// was owed to the peer.
    pub(crate) fn started(&mut self, peer: SocketAddr, now: Instant) {
        self.last.insert(peer, now);
        self.owed.remove(&peer);
    }

    /// The owed rounds whose gap has passed at `now`, marked as started.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<SocketAddr> {
        let due: Vec<SocketAddr> = self
            .owed
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in &due {
            self.owed.remove(peer);
            self.last.insert(*peer, now);
        }
        due
    }

    /// When the next owed round is due, if any is.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.owed.values().min().copied()
    }

    /// Forgets peers not in `keep` (peers chitchat no longer knows).
    pub(crate) fn retain(&mut self, keep: impl Fn(&SocketAddr) -> bool) {
        self.last.retain(|peer, _| keep(peer));
        self.owed.retain(|peer, _| keep(peer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn the_first_request_goes_at_once_and_a_burst_becomes_one_round() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        assert!(p.request(addr(1), t0));
        // Another peer is paced on its own.
        assert!(p.request(addr(2), t0));
        for i in 1..100 {
            assert!(!p.request(addr(1), t0 + Duration::from_micros(i)));
        }
        assert_eq!(p.next_due(), Some(t0 + GAP));
        assert!(p.due(t0 + GAP / 2).is_empty());
        assert_eq!(p.due(t0 + GAP), [addr(1)]);
        // Owed once, handed out once.
        assert!(p.due(t0 + GAP * 3).is_empty());
        assert_eq!(p.next_due(), None);
        // After a quiet gap a request goes at once again.
        assert!(p.request(addr(1), t0 + GAP * 3));
    }

    #[test]
    fn a_round_started_directly_settles_what_was_owed() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        assert!(p.request(addr(1), t0));
        assert!(!p.request(addr(1), t0 + GAP / 2));
        // Late timer: the next request after the gap goes at once and covers it.
        assert!(p.request(addr(1), t0 + GAP * 2));
        assert_eq!(p.next_due(), None);
    }

    #[test]
    fn an_unpaced_round_settles_what_was_owed_and_starts_a_gap() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        assert!(p.request(addr(1), t0));
        assert!(!p.request(addr(1), t0 + GAP / 4));
        p.started(addr(1), t0 + GAP / 2);
        assert_eq!(p.next_due(), None);
        assert!(!p.request(addr(1), t0 + GAP));
        assert_eq!(p.due(t0 + GAP / 2 + GAP), [addr(1)]);
    }

    #[test]
    fn forgotten_peers_are_dropped() {
        let t0 = Instant::now();
        let mut p = Pacer::default();
        assert!(p.request(addr(1), t0));
        assert!(!p.request(addr(1), t0));
        p.retain(|a| *a != addr(1));
        assert_eq!(p.next_due(), None);
        assert!(p.request(addr(1), t0));
    }
}
