//! Fallback servers from a resolv.conf file, followed as it changes.
//!
//! The file is read by [`dwara_resolv_conf::parse_resolv_conf`], the workspace's one
//! resolv.conf reader, so the fallback forwarder and the dataplane's resolver agree
//! on what a file means: `nameserver IP` (port 53), `nameserver IP:PORT` and
//! `[IPv6]:PORT` for a server on another port (tests and unusual setups), comments
//! after `#` or `;`; only `nameserver` lines matter here. An entry equal to our own
//! DNS listen address is dropped, so a host whose resolv.conf points at us does not
//! make us forward to ourselves.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::forward::Forwarder;

/// The fallback servers named in resolv.conf text, by
/// [`dwara_resolv_conf::parse_resolv_conf`]'s grammar (port 53 unless given).
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    dwara_resolv_conf::parse_resolv_conf(text).nameservers
}

/// Whether `server` is our own listen address `own` (also when we listen on the
/// unspecified address and `server` is a loopback or unspecified address on our port).
pub fn is_own_address(server: SocketAddr, own: SocketAddr) -> bool {
    if server == own {
        return true;
    }
    own.ip().is_unspecified()
        && server.port() == own.port()
        && (server.ip().is_loopback() || server.ip().is_unspecified())
}

/// Reads the servers of `path`, without `own`. A missing or unreadable file is no
/// servers (then every forwarded query is answered SERVFAIL).
pub fn load_resolv_conf(path: &Path, own: SocketAddr) -> Vec<SocketAddr> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_resolv_conf(&text)
            .into_iter()
            .filter(|s| !is_own_address(*s, own))
            .collect(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read resolv.conf; no fallback servers");
            Vec::new()
        }
    }
}

/// Polls `path` every `interval` and gives `forwarder` the new servers whenever the
/// list changes. Runs until the task is aborted.
pub fn spawn_resolv_conf_watcher(
    path: PathBuf,
    own: SocketAddr,
    forwarder: Arc<Forwarder>,
    interval: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_text: Option<String> = std::fs::read_to_string(&path).ok();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let text = tokio::fs::read_to_string(&path).await.ok();
            if text == last_text {
                continue;
            }
            last_text = text;
            let servers = load_resolv_conf(&path, own);
            if *forwarder.servers() != servers {
                tracing::info!(path = %path.display(), servers = ?servers, "resolv.conf changed; new fallback servers");
                forwarder.set_servers(servers);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nameserver_lines() {
        let text = "# comment\nsearch example\nnameserver 127.0.0.53\nnameserver ::1 # v6\n\
                    nameserver 127.0.0.1:5353\nnameserver [::1]:5354\nnameserver bogus\noptions ndots:2\n";
        let got = parse_resolv_conf(text);
        let want: Vec<SocketAddr> = ["127.0.0.53:53", "[::1]:53", "127.0.0.1:5353", "[::1]:5354"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(got, want);
    }

    /// The fallback forwarder and the resolver (discovery, the dial-path cache) read
    /// the same resolv.conf the same way.
    #[test]
    fn fallback_servers_are_the_resolvers_servers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        let own: SocketAddr = "127.0.0.1:1053".parse().unwrap();
        for text in [
            "nameserver 127.0.0.53\nnameserver ::1\n",
            "nameserver 127.0.0.1:5353\nnameserver [::1]:5354\nnameserver 10.0.0.1\n",
            "nameserver fe80::1%2\nnameserver 10.0.0.2 extra words\n",
            "  nameserver\t10.0.0.3 ; comment\n# nameserver 10.0.0.4\nnameserver 10.0.0.3\n",
            "nameserver 10.0.0.5:0\nnameserver bogus\nnameserver 10.0.0.6\n",
        ] {
            std::fs::write(&path, text).unwrap();
            let resolver = dwara_resolver::DnsResolver::new(dwara_resolver::ResolverConfig {
                resolv_conf: path.clone(),
                ..dwara_resolver::ResolverConfig::default()
            })
            .unwrap();
            assert_eq!(
                load_resolv_conf(&path, own),
                resolver.source().servers(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn own_address_is_recognised() {
        let own: SocketAddr = "127.0.0.1:1053".parse().unwrap();
        assert!(is_own_address(own, own));
        assert!(!is_own_address("127.0.0.1:53".parse().unwrap(), own));
        let any: SocketAddr = "0.0.0.0:53".parse().unwrap();
        assert!(is_own_address("127.0.0.1:53".parse().unwrap(), any));
        assert!(!is_own_address(
            "127.0.0.2:53".parse().unwrap(),
            "127.0.0.1:53".parse().unwrap()
        ));
    }
}
