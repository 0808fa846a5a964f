//! A lock-free, seedable random source shared by every thread that picks.
//!
//! SplitMix64 over one atomic counter: output `k` is `mix(seed + k·γ)`, so a pick costs
//! one `fetch_add` (the same cache line round robin already uses) and a few
//! multiplications, and a test that fixes the seed sees the same sequence every run.

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
        let k = self.next() as u64;
        mix64(
            self.seed
                .wrapping_add(k.wrapping_add(1).wrapping_mul(GAMMA)),
        )
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
