//! Each policy's precomputed pick state, built once per endpoint set (off the pick
//! path) and published together with the set.

use crate::hash::Ring;
use crate::rng::{Draw, below};
use crate::{Endpoint, Policy};

/// Longest precomputed smooth-weighted sequence (entries).
const MAX_SEQUENCE: u64 = 1 << 16;
/// Work budget (endpoints × sequence length) for building the smooth sequence.
const MAX_SEQUENCE_WORK: u64 = 1 << 24;

/// One RFC 2782 priority group.
#[derive(Debug)]
pub(crate) struct SrvGroup {
    /// Indices into the set.
    members: Box<[u32]>,
    /// Weighted choice among `members` (see [`srv_weights`]).
    alias: AliasTable,
}

/// The pick state of one policy for one endpoint set.
#[derive(Debug)]
pub(crate) enum Picker {
    /// Round robin, equal weights: position modulo length.
    RoundRobin,
    /// Smooth weighted round robin: one precomputed period of nginx's sequence.
    SmoothWeighted(Box<[u32]>),
    /// Uniform random (equal weights).
    Random,
    /// Weighted random: Walker/Vose alias table, O(1) per pick.
    WeightedRandom(AliasTable),
    /// Power of two choices; `true` when weights differ.
    P2c(bool),
    /// RFC 2782 priority groups, lowest priority first, each with an alias table.
    Srv(Box<[SrvGroup]>),
    /// Consistent-hash ring.
    Ring(Ring),
}

/// Weight as the non-SRV policies see it: 0 counts as 1.
#[inline]
fn weight(e: &Endpoint) -> u64 {
    u64::from(e.weight.max(1))
}

fn equal_weights(eps: &[Endpoint]) -> bool {
    eps.windows(2).all(|w| weight(&w[0]) == weight(&w[1]))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The weights reduced by their gcd and, when one period would be too long to
/// precompute, scaled down proportionally (each stays at least 1).
fn sequence_weights(eps: &[Endpoint]) -> Vec<u64> {
    let mut w: Vec<u64> = eps.iter().map(weight).collect();
    let n = w.len() as u64;
    let total: u64 = w.iter().sum();
    let limit = MAX_SEQUENCE.min(MAX_SEQUENCE_WORK / n.max(1)).max(n);
    if total > limit {
        for x in &mut w {
            *x = (*x * limit / total).max(1);
        }
    }
    let g = w.iter().copied().fold(0, gcd).max(1);
    w.iter_mut().for_each(|x| *x /= g);
    w
}

/// One period of nginx's smooth weighted round robin (`ngx_http_upstream_get_peer`):
/// every endpoint gains its weight, the largest current value is picked and loses
/// the total. Each endpoint appears `w` times per period, spread out evenly.
pub(crate) fn smooth_sequence(weights: &[u64]) -> Box<[u32]> {
    let total: u64 = weights.iter().sum();
    let total_i = total as i64;
    let mut current = vec![0i64; weights.len()];
    let mut seq = Vec::with_capacity(total as usize);
    for _ in 0..total {
        let mut best = 0;
        for i in 0..current.len() {
            current[i] += weights[i] as i64;
            // strictly greater: ties go to the earlier endpoint, as in nginx
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total_i;
        seq.push(best as u32);
    }
    seq.into_boxed_slice()
}

/// The selection weights of one priority group, giving RFC 2782's distribution.
///
/// RFC 2782 draws `R` uniform in `0..=S` (`S` the sum of weights) over a running
/// sum with the weight-0 targets first: a target of weight `w` is chosen with
/// probability `w / (S + 1)` and the weight-0 targets share the remaining
/// `1 / (S + 1)`, "a very small chance". We give that share to them evenly (the
/// RFC's list order would give it all to the first), and without weight-0 targets
/// use `w / S`, exactly proportional. Scaled to integers: with `k` weight-0
/// targets, `w·k` each and 1 per weight-0 target.
fn srv_weights(weights: &[u16]) -> Vec<u64> {
    let k = weights.iter().filter(|&&w| w == 0).count() as u64;
    weights
        .iter()
        .map(|&w| match (w, k) {
            (0, _) => 1,
            (w, 0) => u64::from(w),
            (w, k) => u64::from(w) * k,
        })
        .collect()
}

fn srv_groups(eps: &[Endpoint]) -> Box<[SrvGroup]> {
    let mut order: Vec<u32> = (0..eps.len() as u32).collect();
    order.sort_by_key(|&i| (eps[i as usize].priority, i));
    order
        .chunk_by(|&a, &b| eps[a as usize].priority == eps[b as usize].priority)
        .map(|members| {
            let weights: Vec<u16> = members.iter().map(|&i| eps[i as usize].weight).collect();
            SrvGroup {
                members: members.into(),
                alias: AliasTable::from_weights(&srv_weights(&weights)),
            }
        })
        .collect()
}

/// One column of an alias table: keep `own` with probability `keep / total`, else
/// take `alias`.
#[derive(Debug, Clone, Copy)]
struct AliasColumn {
    keep: u64,
    alias: u32,
}

/// Walker's alias method (Vose's construction, in exact integer arithmetic): a
/// weighted pick is one uniform column and one biased coin, whatever the weights.
#[derive(Debug)]
pub(crate) struct AliasTable {
    columns: Box<[AliasColumn]>,
    total: u64,
}

impl AliasTable {
    /// The table for `weights` (each > 0, at least one).
    fn from_weights(weights: &[u64]) -> Self {
        let n = weights.len() as u64;
        let total: u64 = weights.iter().sum();
        // column i holds mass w_i·n out of `total` per column
        let mut mass: Vec<u64> = weights.iter().map(|w| w * n).collect();
        let mut columns: Vec<AliasColumn> = (0..weights.len() as u32)
            .map(|i| AliasColumn {
                keep: total,
                alias: i,
            })
            .collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..weights.len()).partition(|&i| mass[i] < total);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            columns[s] = AliasColumn {
                keep: mass[s],
                alias: l as u32,
            };
            mass[l] -= total - mass[s];
            if mass[l] < total {
                large.pop();
                small.push(l);
            }
        }
        Self {
            columns: columns.into(),
            total,
        }
    }

    #[inline]
    fn pick(&self, x: u64) -> usize {
        let i = below(x, self.columns.len());
        let c = self.columns[i];
        let r = below(x.rotate_left(32), self.total as usize) as u64;
        if r < c.keep { i } else { c.alias as usize }
    }
}

impl SrvGroup {
    #[inline]
    fn pick(&self, x: u64) -> usize {
        self.members[self.alias.pick(x)] as usize
    }

    pub(crate) fn members(&self) -> &[u32] {
        &self.members
    }
}

impl Picker {
    pub(crate) fn build(policy: Policy, eps: &[Endpoint]) -> Self {
        match policy {
            Policy::RoundRobin if equal_weights(eps) => Picker::RoundRobin,
            Policy::RoundRobin => Picker::SmoothWeighted(smooth_sequence(&sequence_weights(eps))),
            Policy::Random if equal_weights(eps) => Picker::Random,
            Policy::Random => Picker::WeightedRandom(AliasTable::from_weights(
                &eps.iter().map(weight).collect::<Vec<_>>(),
            )),
            Policy::P2c => Picker::P2c(!equal_weights(eps)),
            Policy::Srv => Picker::Srv(srv_groups(eps)),
            Policy::ConsistentHash => Picker::Ring(Ring::build(eps)),
        }
    }

    /// One pick: an index into `eps` (non-empty). `key` is a key hash for consistent
    /// hashing; `attempt` > 0 asks for an alternative after an ejected endpoint.
    /// Always inlined into the pick methods (see `UpstreamLb::choose`).
    #[inline(always)]
    pub(crate) fn pick(
        &self,
        eps: &[Endpoint],
        in_flight: impl Fn(usize) -> usize,
        draw: &mut impl Draw,
        key: Option<u64>,
        attempt: usize,
    ) -> usize {
        let n = eps.len();
        match self {
            Picker::RoundRobin => draw.next_below(n),
            Picker::SmoothWeighted(seq) => seq[draw.next_below(seq.len())] as usize,
            Picker::Random => below(draw.random(), n),
            Picker::WeightedRandom(table) => table.pick(draw.random()),
            Picker::P2c(weighted) => {
                if n == 1 {
                    return 0;
                }
                let x = draw.random();
                let a = below(x, n);
                let b = below(x.rotate_left(32), n - 1);
                let b = if b >= a { b + 1 } else { b };
                let (la, lb) = (in_flight(a) as u64, in_flight(b) as u64);
                let b_wins = if *weighted {
                    // fewer in flight per unit of weight; +1 so idle endpoints still
                    // compare by weight
                    (lb + 1) * weight(&eps[a]) < (la + 1) * weight(&eps[b])
                } else {
                    lb < la
                };
                if b_wins { b } else { a }
            }
            Picker::Srv(groups) => groups[0].pick(draw.random()),
            Picker::Ring(ring) => ring.lookup(key.unwrap_or_else(|| draw.random()), attempt),
        }
    }

    /// The SRV groups, lowest priority first (for the ejection fallback).
    pub(crate) fn srv_groups(&self) -> Option<&[SrvGroup]> {
        match self {
            Picker::Srv(groups) => Some(groups),
            _ => None,
        }
    }

    /// The probability mass (in units of 1/(total·n)) each endpoint gets from the
    /// alias table, for tests.
    #[cfg(test)]
    pub(crate) fn alias_mass(&self) -> Option<Vec<u64>> {
        let Picker::WeightedRandom(t) = self else {
            return None;
        };
        let mut mass = vec![0u64; t.columns.len()];
        for (i, c) in t.columns.iter().enumerate() {
            mass[i] += c.keep;
            mass[c.alias as usize] += t.total - c.keep;
        }
        Some(mass)
    }

    /// Weighted pick within one SRV group.
    pub(crate) fn srv_pick_in(group: &SrvGroup, draw: &mut impl Draw) -> usize {
        group.pick(draw.random())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srv_weights_follow_rfc_2782() {
        // weight 0 shares one unit out of S + 1
        assert_eq!(srv_weights(&[0, 99]), [1, 99]);
        assert_eq!(srv_weights(&[2, 0, 0, 3]), [4, 1, 1, 6]);
        // all zero: uniform; none zero: proportional
        assert_eq!(srv_weights(&[0, 0, 0]), [1, 1, 1]);
        assert_eq!(srv_weights(&[10, 30]), [10, 30]);
    }

    #[test]
    fn smooth_sequence_spreads_heavy_weights() {
        assert_eq!(&*smooth_sequence(&[5, 1, 1]), &[0, 0, 1, 0, 2, 0, 0]);
        assert_eq!(&*smooth_sequence(&[1, 1]), &[0, 1]);
    }
}
