//! Endpoints and immutable endpoint sets, the vocabulary shared by discovery and the picker.

use std::cmp::Ordering;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

/// One upstream endpoint: an address plus the SRV-style weight and priority that
/// travel with it from discovery.
///
/// Ordering (and therefore the order of an [`EndpointSet`]) is by address, then
/// priority, then weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The socket address to connect to.
    pub addr: SocketAddr,
    /// Relative weight (RFC 2782 semantics for the SRV policy; `0` is treated as `1`
    /// by the round-robin, random and P2C policies).
    pub weight: u16,
    /// Priority group; lower is preferred (only the SRV policy looks at it).
    pub priority: u16,
}

impl Endpoint {
    /// An endpoint with weight 1 and priority 0.
    pub const fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            weight: 1,
            priority: 0,
        }
    }

    /// The same endpoint with `weight`.
    #[must_use]
    pub const fn with_weight(mut self, weight: u16) -> Self {
        self.weight = weight;
        self
    }

    /// The same endpoint with `priority`.
    #[must_use]
    pub const fn with_priority(mut self, priority: u16) -> Self {
        self.priority = priority;
        self
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Self {
        Self::new(addr)
    }
}

impl PartialOrd for Endpoint {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Endpoint {
    fn cmp(&self, other: &Self) -> Ordering {
        self.addr
            .cmp(&other.addr)
            .then(self.priority.cmp(&other.priority))
            .then(self.weight.cmp(&other.weight))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr.fmt(f)
    }
}

/// An immutable set of endpoints, sorted by address with at most one endpoint per
/// address. Cloning is cheap (one `Arc`).
///
/// When the input holds the same address more than once, the entry that sorts first
/// wins (lowest priority, then lowest weight): the most preferred record is kept.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EndpointSet {
    endpoints: Arc<[Endpoint]>,
}

impl EndpointSet {
    /// Builds a set from any list: sorts it and removes duplicate addresses.
    pub fn new(mut endpoints: Vec<Endpoint>) -> Self {
        endpoints.sort_unstable();
        endpoints.dedup_by_key(|e| e.addr);
        Self {
            endpoints: endpoints.into(),
        }
    }

    /// The empty set.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether the set has no endpoints.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The endpoints, sorted by address.
    pub fn iter(&self) -> std::slice::Iter<'_, Endpoint> {
        self.endpoints.iter()
    }

    /// The endpoints as a slice, sorted by address.
    pub fn as_slice(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The addresses, sorted.
    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.endpoints.iter().map(|e| e.addr)
    }

    /// The endpoint with address `addr`, if any (binary search).
    pub fn get(&self, addr: SocketAddr) -> Option<&Endpoint> {
        self.position(addr).map(|i| &self.endpoints[i])
    }

    /// Whether the set has an endpoint with address `addr`.
    pub fn contains(&self, addr: SocketAddr) -> bool {
        self.position(addr).is_some()
    }

    pub(crate) fn position(&self, addr: SocketAddr) -> Option<usize> {
        self.endpoints.binary_search_by(|e| e.addr.cmp(&addr)).ok()
    }
}

impl Default for EndpointSet {
    fn default() -> Self {
        Self {
            endpoints: Arc::from(Vec::new()),
        }
    }
}

impl fmt::Debug for EndpointSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.endpoints.iter()).finish()
    }
}

impl FromIterator<Endpoint> for EndpointSet {
    fn from_iter<I: IntoIterator<Item = Endpoint>>(iter: I) -> Self {
        Self::new(iter.into_iter().collect())
    }
}

impl FromIterator<SocketAddr> for EndpointSet {
    fn from_iter<I: IntoIterator<Item = SocketAddr>>(iter: I) -> Self {
        Self::new(iter.into_iter().map(Endpoint::new).collect())
    }
}

impl From<Vec<Endpoint>> for EndpointSet {
    fn from(endpoints: Vec<Endpoint>) -> Self {
        Self::new(endpoints)
    }
}

impl<'a> IntoIterator for &'a EndpointSet {
    type Item = &'a Endpoint;
    type IntoIter = std::slice::Iter<'a, Endpoint>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(s: &str) -> Endpoint {
        Endpoint::new(s.parse().unwrap())
    }

    #[test]
    fn sorted_and_deduplicated_by_addr() {
        let set: EndpointSet = [
            ep("10.0.0.2:80"),
            ep("10.0.0.1:80").with_priority(5),
            ep("10.0.0.1:80").with_priority(1),
            ep("10.0.0.3:80"),
        ]
        .into_iter()
        .collect();
        assert_eq!(set.len(), 3);
        let addrs: Vec<String> = set.addrs().map(|a| a.to_string()).collect();
        assert_eq!(addrs, ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]);
        assert_eq!(
            set.as_slice()[0].priority,
            1,
            "most preferred duplicate kept"
        );
        assert!(set.contains("10.0.0.3:80".parse().unwrap()));
        assert!(!set.contains("10.0.0.4:80".parse().unwrap()));
    }

    #[test]
    fn empty_and_default_agree() {
        assert_eq!(EndpointSet::empty(), EndpointSet::default());
        assert!(EndpointSet::new(Vec::new()).is_empty());
    }

    #[test]
    fn endpoint_builders() {
        let e = ep("[::1]:53").with_weight(7).with_priority(2);
        assert_eq!((e.weight, e.priority), (7, 2));
        assert_eq!(Endpoint::new(e.addr).weight, 1);
        assert_eq!(Endpoint::new(e.addr).priority, 0);
    }
}
