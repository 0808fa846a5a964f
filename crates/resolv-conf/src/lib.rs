#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr, SocketAddrV6};

/// What dwara takes from a resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// The `nameserver` lines, in order, without duplicates.
    pub nameservers: Vec<SocketAddr>,
    /// The search list (of the last `search` or `domain` line).
    pub search: Vec<String>,
}

/// Reads resolv.conf text. Never fails: what does not parse is skipped.
///
/// The grammar, line by line:
///
/// - `#` or `;` starts a comment, at the start of a line or after a value; blank
///   lines and other keywords (`options`, `sortlist` …) are ignored.
/// - `nameserver ADDRESS` adds a server, where `ADDRESS` is an IPv4 or IPv6 address
///   (port 53), an IPv6 address with a numeric zone (`fe80::1%2`), or an address
///   with a port: `IP:PORT` or `[IPv6]:PORT`. The port form is our extension (glibc
///   ignores such a line): it lets tests and unusual setups point at a server on
///   another port. Words after the address are ignored, as glibc does; a line whose
///   address does not parse, or names port 0, is skipped. A server listed twice is
///   kept once, at its first place. Every server is kept (glibc stops at three).
/// - `search NAME…` and `domain NAME` set the search list; the last such line wins.
///
/// Why one extended grammar rather than hickory's parser for both: the name server's
/// reader has always accepted `IP:PORT` and its tests and deployments rely on it;
/// a file that only uses the standard forms means what glibc says it means.
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut conf = ResolvConf::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => {
                if let Some(addr) = words.next().and_then(parse_nameserver)
                    && !conf.nameservers.contains(&addr)
                {
                    conf.nameservers.push(addr);
                }
            }
            Some("search") => conf.search = words.map(str::to_owned).collect(),
            Some("domain") => conf.search = words.take(1).map(str::to_owned).collect(),
            _ => {}
        }
    }
    conf
}

/// One `nameserver` address: `IP`, `IPv6%ZONE`, `IP:PORT` or `[IPv6]:PORT`.
fn parse_nameserver(word: &str) -> Option<SocketAddr> {
    let addr = if let Ok(ip) = word.parse::<IpAddr>() {
        SocketAddr::new(ip, 53)
    } else if let Some((ip, zone)) = word.split_once('%') {
        let ip = ip.parse().ok()?;
        SocketAddr::V6(SocketAddrV6::new(ip, 53, 0, zone.parse().ok()?))
    } else {
        word.parse().ok()?
    };
    (addr.port() != 0).then_some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(text: &str) -> Vec<String> {
        parse_resolv_conf(text)
            .nameservers
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn nameserver_lines_follow_the_grammar() {
        for (text, want) in [
            ("nameserver 127.0.0.53\n", vec!["127.0.0.53:53"]),
            ("nameserver ::1\n", vec!["[::1]:53"]),
            ("nameserver 127.0.0.1:5353\n", vec!["127.0.0.1:5353"]),
            ("nameserver [::1]:5354\n", vec!["[::1]:5354"]),
            ("nameserver fe80::1%2\n", vec!["[fe80::1%2]:53"]),
            ("nameserver fe80::1%eth0\n", vec![]),
            ("nameserver 10.0.0.1 extra\n", vec!["10.0.0.1:53"]),
            ("  nameserver\t10.0.0.1;x\n", vec!["10.0.0.1:53"]),
            ("# nameserver 10.0.0.1\n; nameserver 10.0.0.2\n", vec![]),
            ("nameserver 10.0.0.1#c\n", vec!["10.0.0.1:53"]),
            (
                "nameserver\nnameserver bogus\nnameserver 10.0.0.1:0\n",
                vec![],
            ),
            ("nameserver 1.2.3.4:99999\nnameserver 10.0.0.1:\n", vec![]),
            ("nameservers 10.0.0.1\nNAMESERVER 10.0.0.2\n", vec![]),
            (
                "nameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.1:53\n",
                vec!["10.0.0.1:53", "10.0.0.2:53"],
            ),
            (
                "nameserver 1.1.1.1\nnameserver 2.2.2.2\nnameserver 3.3.3.3\nnameserver 4.4.4.4\n",
                vec!["1.1.1.1:53", "2.2.2.2:53", "3.3.3.3:53", "4.4.4.4:53"],
            ),
        ] {
            assert_eq!(servers(text), want, "{text:?}");
        }
    }

    #[test]
    fn the_last_search_or_domain_line_sets_the_search_list() {
        let search = |text: &str| parse_resolv_conf(text).search;
        assert_eq!(search("search a.local b.local\n"), ["a.local", "b.local"]);
        assert_eq!(search("search a.local\ndomain c.local\n"), ["c.local"]);
        assert_eq!(search("domain c.local\nsearch a b # c\n"), ["a", "b"]);
        assert!(search("options ndots:2\n").is_empty());
    }
}
