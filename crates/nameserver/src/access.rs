//! Who may ask: the DNS allow list (`--dns-allow`).
//!
//! An allow list is a set of CIDR prefixes ([`Cidr`]) and, optionally, the word
//! `local` ([`AllowEntry::LocalSubnets`]): the subnets of this host's own interfaces,
//! as dnsmasq's `--local-service` computes them. Loopback (`127.0.0.0/8`, `::1`) is
//! always allowed. Without `--dns-allow` the list is `local`.
//!
//! The interface subnets are read with `getifaddrs` at start and again whenever the
//! kernel announces an address or link change (a `NETLINK_ROUTE` socket subscribed
//! to those groups), and at least every [`RESCAN_EVERY`] in case an announcement was
//! lost (or netlink is unavailable). The compiled list ([`Rules`]) is swapped
//! atomically: a query reads it with one atomic load and checks a handful of masks.
//!
//! Addresses compare in one form: IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`), so
//! the IPv4 clients of a dual-stack `[::]` socket match IPv4 prefixes.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::error::{Error, Result};

/// How often the interface subnets are re-read even without a netlink event.
pub const RESCAN_EVERY: Duration = Duration::from_secs(30);

/// An IP prefix, `10.0.0.0/8` or `fd00::/8`; a bare address is a host prefix. Host
/// bits are cleared (`192.168.1.7/24` is `192.168.1.0/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    len: u8,
}

impl Cidr {
    /// The prefix `addr/len` (host bits cleared); `None` when `len` is longer than
    /// the address.
    pub fn new(addr: IpAddr, len: u8) -> Option<Self> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if len > max {
            return None;
        }
        let addr = match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Some(Self { addr, len })
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether `ip` is inside (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        Rule::from(*self).matches(key(ip))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Cidr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidCidr {
            input: s.chars().take(64).collect(),
            reason: reason.to_owned(),
        };
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (s, None),
        };
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| bad("not an IP address or ADDRESS/LENGTH"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(len) => {
                if len.is_empty() || len.len() > 3 || !len.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("the prefix length must be a number"));
                }
                len.parse::<u8>()
                    .map_err(|_| bad("the prefix length must be a number"))?
            }
        };
        Cidr::new(ip, len).ok_or_else(|| {
            bad(if max == 32 {
                "an IPv4 prefix length is at most 32"
            } else {
                "an IPv6 prefix length is at most 128"
            })
        })
    }
}

/// One entry of an allow list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllowEntry {
    /// Clients in this prefix.
    Cidr(Cidr),
    /// Clients in the subnets of this host's interfaces, kept up to date (`local`).
    LocalSubnets,
}

impl FromStr for AllowEntry {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.eq_ignore_ascii_case("local") {
            Ok(Self::LocalSubnets)
        } else {
            s.parse().map(Self::Cidr)
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cidr(c) => c.fmt(f),
            Self::LocalSubnets => f.write_str("local"),
        }
    }
}

/// Parses an allow list written as entries separated by commas and/or white space
/// (`"local, 10.0.0.0/8 fd00::/8"`). An empty text is an empty list.
pub fn parse_allow_list(text: &str) -> Result<Vec<AllowEntry>> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}

/// An address in the one form rules compare: IPv4 as IPv4-mapped IPv6.
#[inline]
pub(crate) fn key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Whether `ip` is a loopback address (IPv4-mapped loopback included).
#[inline]
pub(crate) fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// One compiled prefix: `key & mask == net`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rule {
    net: u128,
    mask: u128,
}

impl Rule {
    #[inline]
    fn matches(&self, key: u128) -> bool {
        key & self.mask == self.net
    }
}

impl From<Cidr> for Rule {
    fn from(c: Cidr) -> Self {
        let bits = match c.addr {
            IpAddr::V4(_) => 96 + u32::from(c.len),
            IpAddr::V6(_) => u32::from(c.len),
        };
        let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
        Self {
            net: key(c.addr) & mask,
            mask,
        }
    }
}

/// A compiled allow list: the prefixes in force right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rules {
    rules: Box<[Rule]>,
    /// The same, readable, for logs.
    cidrs: Vec<Cidr>,
}

impl Rules {
    fn new(mut cidrs: Vec<Cidr>) -> Self {
        cidrs.sort_by_key(|c| (key(c.addr), c.len));
        cidrs.dedup();
        Self {
            rules: cidrs.iter().copied().map(Rule::from).collect(),
            cidrs,
        }
    }

    #[inline]
    fn allows(&self, key: u128) -> bool {
        self.rules.iter().any(|r| r.matches(key))
    }
}

/// The subnets of this host's interfaces (every address with a netmask), loopback
/// left out (it is always allowed).
pub(crate) fn interface_subnets() -> Vec<Cidr> {
    let addrs = match nix::ifaddrs::getifaddrs() {
        Ok(addrs) => addrs,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this host's interface addresses; only loopback and the configured prefixes are allowed");
            return Vec::new();
        }
    };
    let mut subnets = Vec::new();
    for ifa in addrs {
        let (Some(addr), Some(mask)) = (ifa.address, ifa.netmask) else {
            continue;
        };
        let (ip, len) = if let (Some(a), Some(m)) = (addr.as_sockaddr_in(), mask.as_sockaddr_in()) {
            (IpAddr::V4(a.ip()), u32::from(m.ip()).leading_ones())
        } else if let (Some(a), Some(m)) = (addr.as_sockaddr_in6(), mask.as_sockaddr_in6()) {
            (IpAddr::V6(a.ip()), u128::from(m.ip()).leading_ones())
        } else {
            continue;
        };
        if ip.is_loopback() {
            continue;
        }
        // leading_ones of a 32- or 128-bit mask is at most 128.
        if let Some(c) = Cidr::new(ip, len as u8) {
            subnets.push(c);
        }
    }
    subnets
}

/// The allow list in force, shared by every listener; with `local` in it, kept up
/// to date with the host's interfaces by a watcher thread.
#[derive(Debug)]
pub(crate) struct AllowList {
    rules: ArcSwap<Rules>,
    entries: Vec<AllowEntry>,
}

impl AllowList {
    /// The list of `entries` (empty: `local`), compiled now.
    pub(crate) fn new(entries: &[AllowEntry]) -> Arc<Self> {
        let entries = if entries.is_empty() {
            vec![AllowEntry::LocalSubnets]
        } else {
            entries.to_vec()
        };
        let list = Arc::new(Self {
            rules: ArcSwap::from_pointee(Rules::default()),
            entries,
        });
        list.refresh();
        list
    }

    /// Whether the list follows the host's interfaces.
    pub(crate) fn follows_interfaces(&self) -> bool {
        self.entries.contains(&AllowEntry::LocalSubnets)
    }

    /// Recompiles the list (re-reading the interfaces when it has `local`);
    /// returns whether it changed.
    pub(crate) fn refresh(&self) -> bool {
        let mut cidrs = Vec::new();
        for e in &self.entries {
            match e {
                AllowEntry::Cidr(c) => cidrs.push(*c),
                AllowEntry::LocalSubnets => cidrs.extend(interface_subnets()),
            }
        }
        let rules = Rules::new(cidrs);
        if **self.rules.load() == rules {
            return false;
        }
        tracing::debug!(
            allowed = %rules.cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
            "DNS clients allowed (and loopback)"
        );
        self.rules.store(Arc::new(rules));
        true
    }

    /// Whether `ip` may ask: loopback, or inside one of the prefixes.
    #[inline]
    pub(crate) fn allows(&self, ip: IpAddr) -> bool {
        is_loopback(ip) || self.rules.load().allows(key(ip))
    }

    /// The prefixes in force (without loopback).
    pub(crate) fn cidrs(&self) -> Vec<Cidr> {
        self.rules.load().cidrs.clone()
    }
}

/// Keeps `list`'s interface subnets up to date until `stop` is set: re-reads them on
/// every netlink address or link announcement (at most every 100 ms) and at least
/// every [`RESCAN_EVERY`]. Does nothing for a list without `local`.
pub(crate) fn spawn_interface_watcher(
    list: Arc<AllowList>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    if !list.follows_interfaces() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("dwara-dns-ifwatch".into())
        .spawn(move || {
            let events = match netlink::Events::open() {
                Ok(events) => Some(events),
                Err(e) => {
                    tracing::warn!(error = %e, every = ?RESCAN_EVERY, "no netlink address events; the interface subnets of the DNS allow list are re-read periodically");
                    None
                }
            };
            let mut last_scan = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let announced = match &events {
                    Some(events) => events.wait(Duration::from_millis(500)),
                    None => {
                        std::thread::sleep(Duration::from_millis(500));
                        false
                    }
                };
                if announced || last_scan.elapsed() >= RESCAN_EVERY {
                    // Let a burst of announcements (an interface with several
                    // addresses coming up) settle into one re-read.
                    if announced && let Some(events) = &events {
                        std::thread::sleep(Duration::from_millis(100));
                        events.drain();
                    }
                    last_scan = Instant::now();
                    // The start-up line said what was allowed; a change is news.
                    if list.refresh() {
                        tracing::info!(
                            allowed = %list.cidrs().iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
                            "the host's interfaces changed: DNS clients allowed (and loopback)"
                        );
                    }
                }
            }
        })
        .map(drop)
}

/// A `NETLINK_ROUTE` socket subscribed to link and address changes.
mod netlink {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use nix::sys::socket::{
        AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, socket,
    };

    /// `RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR`.
    const GROUPS: u32 = 0x1 | 0x10 | 0x100;

    pub(super) struct Events(socket2::Socket);

    impl Events {
        pub(super) fn open() -> std::io::Result<Self> {
            let fd = socket(
                AddressFamily::Netlink,
                SockType::Raw,
                SockFlag::SOCK_CLOEXEC,
                SockProtocol::NetlinkRoute,
            )?;
            bind(fd.as_raw_fd(), &NetlinkAddr::new(0, GROUPS))?;
            Ok(Self(socket2::Socket::from(fd)))
        }

        /// Waits up to `timeout` for an announcement; whether one came.
        pub(super) fn wait(&self, timeout: Duration) -> bool {
            if self.0.set_read_timeout(Some(timeout)).is_err() {
                std::thread::sleep(timeout);
                return false;
            }
            let mut buf = [0u8; 8192];
            // Any message (or an overrun, ENOBUFS: some were lost) means re-read.
            match (&self.0).read(&mut buf) {
                // A message of any length (or an empty read) is an announcement.
                Ok(_len) => true,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ),
            }
        }

        /// Reads whatever else is queued, without waiting.
        pub(super) fn drain(&self) {
            if self.0.set_nonblocking(true).is_err() {
                return;
            }
            let mut buf = [0u8; 8192];
            while (&self.0).read(&mut buf).is_ok() {}
            let _ = self.0.set_nonblocking(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_parse_normalise_and_match() {
        let c: Cidr = "192.168.1.7/24".parse().unwrap();
        assert_eq!(c.to_string(), "192.168.1.0/24");
        assert!(c.contains(ip("192.168.1.200")));
        assert!(c.contains(ip("::ffff:192.168.1.9")));
        assert!(!c.contains(ip("192.168.2.1")));
        let host: Cidr = "10.0.0.1".parse().unwrap();
        assert_eq!(host.prefix_len(), 32);
        assert!(host.contains(ip("10.0.0.1")) && !host.contains(ip("10.0.0.2")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")) && !all.contains(ip("2001:db8::1")));
        let v6: Cidr = "fd00::1/8".parse().unwrap();
        assert_eq!(v6.to_string(), "fd00::/8");
        assert!(v6.contains(ip("fdff::1")) && !v6.contains(ip("fe80::1")));
        let any6: Cidr = "::/0".parse().unwrap();
        assert!(any6.contains(ip("2001:db8::1")));
        for bad in [
            "",
            "/",
            "10.0.0.0/",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            "10.0.0/8",
            "local/8",
            "10.0.0.0/0008",
            "x",
        ] {
            let e = bad.parse::<Cidr>().unwrap_err().to_string();
            assert!(e.contains("CIDR") || e.contains("prefix"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn allow_lists_parse_with_local() {
        let list = parse_allow_list("local, 10.0.0.0/8  fd00::/8,").unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list[0], AllowEntry::LocalSubnets);
        assert_eq!(list[1].to_string(), "10.0.0.0/8");
        assert!(parse_allow_list("").unwrap().is_empty());
        assert!(parse_allow_list("10.0.0.0/8,nonsense").is_err());
    }

    #[test]
    fn loopback_is_always_allowed_and_lists_are_exact() {
        let list = AllowList::new(&[AllowEntry::Cidr("10.1.0.0/16".parse().unwrap())]);
        assert!(!list.follows_interfaces());
        assert!(list.allows(ip("127.0.0.1")));
        assert!(list.allows(ip("127.9.9.9")));
        assert!(list.allows(ip("::1")));
        assert!(list.allows(ip("::ffff:127.0.0.1")));
        assert!(list.allows(ip("10.1.200.3")));
        assert!(!list.allows(ip("10.2.0.1")));
        assert!(!list.allows(ip("2001:db8::1")));
        assert!(!list.refresh(), "an unchanged list is not swapped");
    }

    #[test]
    fn the_default_follows_the_interfaces() {
        let list = AllowList::new(&[]);
        assert!(list.follows_interfaces());
        // Whatever this host has, each of its interface addresses is allowed.
        for c in interface_subnets() {
            assert!(list.allows(c.addr()), "{c}");
        }
        assert!(
            !list.allows(ip("192.0.2.1"))
                || list.cidrs().iter().any(|c| c.contains(ip("192.0.2.1")))
        );
    }
}
