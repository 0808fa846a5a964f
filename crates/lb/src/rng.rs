//! Seedable position and random sources for picks: one shared by every thread that
//! picks through the [`UpstreamLb`](crate::UpstreamLb), and one private to each
//! [`LbHandle`](crate::LbHandle).
//!
//! SplitMix64 over a counter: output `k` is `mix(seed + k·γ)`, so a pick costs one
//! counter increment (a `fetch_add` on the shared counter, the same cache line round
//! robin already uses; a plain add on a handle's) and a few multiplications, and a
//! test that fixes the seed sees the same sequence every run.

use std::sync::atomic::{AtomicUsize, Ordering};

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser (also used by [`crate::hash`]).
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Maps a uniform `x` to `0..n` without a division (Lemire's multiply-shift).
#[inline]
pub(crate) fn below(x: u64, n: usize) -> usize {
    ((u128::from(x) * n as u128) >> 64) as usize
}

/// Where a pick draws its round-robin positions and random numbers from.
pub(crate) trait Draw {
    /// The next round-robin position in `0..n` (`n` > 0): 0, 1, …, n − 1, 0, … while
    /// `n` stays the same.
    fn next_below(&mut self, n: usize) -> usize;
    /// The next random `u64`.
    fn random(&mut self) -> u64;
}

#[inline]
fn output(seed: u64, k: u64) -> u64 {
    mix64(seed.wrapping_add(k.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// The shared ticket counter: round robin reads it as a position, the random policies
/// as the index of a SplitMix64 output.
#[derive(Debug)]
#[repr(align(128))] // its own cache line: every pick writes it
pub(crate) struct Ticket {
    counter: AtomicUsize,
    seed: u64,
}

impl Ticket {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            counter: AtomicUsize::new(0),
            seed,
        }
    }

    /// The next position (0, 1, 2, …, wrapping).
    #[inline]
    pub(crate) fn next(&self) -> usize {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// The next random `u64`.
    #[inline]
    pub(crate) fn random(&self) -> u64 {
        output(self.seed, self.next() as u64)
    }
}

impl Draw for &Ticket {
    #[inline]
    fn next_below(&mut self, n: usize) -> usize {
        Ticket::next(self) % n
    }

    #[inline]
    fn random(&mut self) -> u64 {
        Ticket::random(self)
    }
}

/// A position and a counter of one's own: no atomic operation and no division per
/// pick. Seeded from the shared ticket, so handles of a seeded load balancer repeat
/// too, and two handles start at different positions and draw different sequences.
#[derive(Debug)]
pub(crate) struct LocalTicket {
    /// The next round-robin position (reduced when the set shrinks below it).
    position: usize,
    counter: u64,
    seed: u64,
}

impl LocalTicket {
    pub(crate) fn from_shared(shared: &Ticket) -> Self {
        let seed = shared.random();
        Self {
            // round robin starts somewhere else on every handle
            position: mix64(seed) as usize,
            counter: 0,
            seed,
        }
    }
}

impl Draw for LocalTicket {
    #[inline]
    fn next_below(&mut self, n: usize) -> usize {
        let mut p = self.position;
        if p >= n {
            p %= n;
        }
        self.position = if p + 1 == n { 0 } else { p + 1 };
        p
    }

    #[inline]
    fn random(&mut self) -> u64 {
        let k = self.counter;
        self.counter = k.wrapping_add(1);
        output(self.seed, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sequences_repeat_and_differ_by_seed() {
        let a: Vec<u64> = (0..8)
            .map({
                let t = Ticket::new(7);
                move |_| t.random()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let t = Ticket::new(7);
                move |_| t.random()
            })
            .collect();
        let c: Vec<u64> = (0..8)
            .map({
                let t = Ticket::new(8);
                move |_| t.random()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let t = Ticket::new(1);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[below(t.random(), 10)] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
        assert_eq!(below(u64::MAX, 3), 2);
        assert_eq!(below(0, 3), 0);
    }
}
