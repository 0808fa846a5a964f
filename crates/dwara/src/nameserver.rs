//! Wiring of the name-server half (`dwara-nameserver`) into `dwara serve`.
//!
//! Every flag is optional so that a value from the config file's `nameserver:`
//! section applies unless the flag is given: flag, then file, then default.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use dwara::auth::{Auth, Protect, Token};
use dwara_nameserver::{
    AllowEntry, DEFAULT_DNS_LISTEN, DEFAULT_HTTP_LISTEN, DEFAULT_TOMBSTONE_GRACE, Domain, Fallback,
    HealthFailMode, LocalNames, NameServerConfig,
};

use crate::http_server::HttpLimits;
use dwara::config::NameServerSection;

/// Name-server flags of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct NameServerArgs {
    /// The domain answered from the records database [default: weave.local.]
    #[arg(long)]
    domain: Option<String>,
    /// DNS listen address, UDP and TCP; port 0 picks a free port [default: 127.0.0.1:1053]
    #[arg(long)]
    dns_listen: Option<SocketAddr>,
    /// HTTP API listen address; port 0 picks a free port [default: 127.0.0.1:6784]
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// TTL in seconds of the answers for the domain [default: 1]
    #[arg(long)]
    ttl: Option<u32>,
    /// Fallback server for other names, IP or IP:PORT (repeatable, tried in order).
    /// When given, --resolv-conf is not read.
    #[arg(long = "fallback", value_name = "IP:PORT", value_parser = parse_server)]
    fallback: Vec<SocketAddr>,
    /// resolv.conf whose nameservers are the fallback servers, re-read when it changes
    /// [default: /etc/resolv.conf]
    #[arg(long)]
    resolv_conf: Option<PathBuf>,
    /// UDP worker threads of the DNS server (default: one per core, at most 4).
    #[arg(long)]
    dns_workers: Option<usize>,
    /// Datagrams each UDP worker receives and sends per system call (recvmmsg /
    /// sendmmsg); 1 = one recv/send per datagram [default: 32, at most 64]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    dns_udp_batch: Option<u64>,
    /// Receive buffer asked for each DNS/UDP socket, in bytes; the kernel grants at
    /// most net.core.rmem_max (a warning says when it caps it); 0 keeps the
    /// kernel's default [default: 4194304]
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(0..=1 << 30))]
    dns_udp_recv_buffer: Option<u64>,
    /// Seconds a DNS/TCP connection may stay silent between messages, and may take
    /// to send one message from its first byte [default: 10]
    #[arg(long = "dns-tcp-idle-timeout", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    dns_tcp_idle_timeout_s: Option<u64>,
    /// Seconds after which a DNS/TCP connection is closed at its next message
    /// boundary [default: 120]
    #[arg(long = "dns-tcp-lifetime", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=86400))]
    dns_tcp_lifetime_s: Option<u64>,
    /// DNS/TCP connections open at once; more are closed on accept [default: 512]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    dns_tcp_max_connections: Option<u64>,
    /// Seconds an HTTP client may take to send a request's headers (or stay idle
    /// between requests), and then its body [default: 10]
    #[arg(long = "http-read-timeout", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    http_read_timeout_s: Option<u64>,
    /// HTTP connections open at once; more are closed on accept [default: 1024]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    http_max_connections: Option<u64>,
    /// Largest HTTP request body in bytes; larger ones get 413 [default: 65536]
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    http_max_body: Option<u64>,
    /// Seconds a deleted entry's tombstone is kept before it is forgotten [default: 600]
    #[arg(long = "tombstone-grace", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    tombstone_grace_s: Option<u64>,
    /// Directory of the store that keeps HTTP registrations across restarts
    /// [default: none, registrations live in memory only]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// DNS clients allowed besides loopback: a CIDR prefix, or `local` for the
    /// subnets of this host's interfaces, followed as they change (repeatable).
    /// Others get REFUSED and nothing is forwarded for them [default: local]
    #[arg(long = "dns-allow", value_name = "CIDR|local", value_parser = parse_allow)]
    dns_allow: Vec<AllowEntry>,
    /// Clients outside --dns-allow still get answers for the local domain (and its
    /// reverse names); forwarding stays refused to them
    #[arg(long)]
    dns_allow_local_any: bool,
    /// DNS/UDP replies per second to one client /24 (IPv6 /56); over it a query
    /// gets no reply, or every --dns-rate-limit-slip'th an empty truncated one (the
    /// client retries over TCP, never limited). Loopback is exempt; 0 turns it off
    /// [default: 2000]
    #[arg(long, value_name = "QPS")]
    dns_rate_limit: Option<u32>,
    /// Every Nth rate-limited query gets an empty truncated reply (TC); 0: none
    /// [default: 2]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=i64::from(dwara::config::MAX_SLIP)))]
    dns_rate_limit_slip: Option<u32>,
    /// File holding the bearer token that every HTTP API write (PUT, DELETE,
    /// POST /reload) needs in `Authorization: Bearer <token>` [default: none]
    #[arg(long, value_name = "FILE")]
    http_token_file: Option<PathBuf>,
    /// Every HTTP request needs the token, reads and /metrics included
    #[arg(long, requires = "http_token_file")]
    http_token_reads: bool,
    /// Serve the HTTP API on a non-loopback address without --http-token-file
    /// (anyone who reaches it can add and delete names)
    #[arg(long)]
    http_insecure: bool,
    /// When no live entry of a name passes its health check, answer its unhealthy
    /// ones (true) or none (false) [default: true]
    #[arg(long, value_name = "BOOL")]
    health_fail_open: Option<bool>,
    /// Milliseconds between two checks of an entry registered with check=tcp (a
    /// TCP connect to its address and port, waiting at most half of it)
    /// [default: 5000]
    #[arg(long = "check-interval-ms", value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=dwara::config::MAX_CHECK_INTERVAL_MS))]
    check_interval_ms: Option<u64>,
    /// Failed checks in a row after which a check=tcp entry is unhealthy [default: 2]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(dwara::config::MAX_CHECK_MISSES)))]
    check_misses: Option<u32>,
}

fn parse_allow(s: &str) -> Result<AllowEntry, String> {
    s.parse()
        .map_err(|e: dwara_nameserver::Error| e.to_string())
}

/// Counts are range-checked by clap and the config validation; a `usize` narrower
/// than them (16-bit targets) saturates.
fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn parse_server(s: &str) -> Result<SocketAddr, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not IP or IP:PORT ([IPv6]:PORT for IPv6)"))
}

impl NameServerArgs {
    /// The HTTP listen address: flag, then config file, then the default.
    pub(crate) fn http_listen(&self, section: Option<&NameServerSection>) -> SocketAddr {
        self.http_listen
            .or_else(|| section.and_then(|s| s.http_listen))
            .unwrap_or(DEFAULT_HTTP_LISTEN)
    }

    /// The HTTP API's authentication (flags, then config file): `None` without a
    /// token file. Errors when the token file is unusable, or when `listen` is not
    /// loopback and there is neither a token nor `--http-insecure`.
    pub(crate) fn http_auth(
        &self,
        section: Option<&NameServerSection>,
        listen: SocketAddr,
    ) -> anyhow::Result<Option<Arc<Auth>>> {
        let file = self
            .http_token_file
            .clone()
            .or_else(|| section.and_then(|s| s.http_token_file.clone()));
        let reads = self.http_token_reads || section.and_then(|s| s.http_token_reads) == Some(true);
        let insecure = self.http_insecure || section.and_then(|s| s.http_insecure) == Some(true);
        let Some(file) = file else {
            if !listen.ip().to_canonical().is_loopback() && !insecure {
                anyhow::bail!(
                    "refusing to serve the HTTP API on {listen} without --http-token-file: anyone who reaches that address could add and delete names (give --http-token-file FILE, or --http-insecure to accept that)"
                );
            }
            if insecure && !listen.ip().to_canonical().is_loopback() {
                tracing::warn!(%listen, "--http-insecure: the HTTP API takes writes from anyone who reaches it");
            }
            return Ok(None);
        };
        let token = Token::load(&file)?;
        let protect = if reads {
            Protect::Everything
        } else {
            Protect::Writes
        };
        tracing::info!(path = %file.display(), ?protect, "HTTP API requests need the bearer token");
        Ok(Some(Auth::new(token, protect)))
    }

    /// The HTTP listener's limits: flags, then config file, then the defaults.
    pub(crate) fn http_limits(&self, section: Option<&NameServerSection>) -> HttpLimits {
        let mut limits = HttpLimits::default();
        if let Some(s) = self
            .http_read_timeout_s
            .or_else(|| section.and_then(|s| s.http_read_timeout_s))
        {
            limits.read_timeout = Duration::from_secs(s);
        }
        if let Some(n) = self
            .http_max_connections
            .or_else(|| section.and_then(|s| s.http_max_connections))
        {
            limits.max_connections = to_usize(n);
        }
        if let Some(n) = self
            .http_max_body
            .or_else(|| section.and_then(|s| s.http_max_body))
        {
            limits.max_body = to_usize(n);
        }
        limits
    }

    /// These flags over the config file's `nameserver:` section over the defaults.
    pub(crate) fn config(
        &self,
        section: Option<&NameServerSection>,
    ) -> anyhow::Result<NameServerConfig> {
        let empty = NameServerSection::default();
        let file = section.unwrap_or(&empty);
        let domain = match (&self.domain, &file.domain) {
            (Some(flag), _) => Domain::new(flag).context("--domain")?,
            (None, Some(from_file)) => Domain::new(from_file).context("nameserver.domain")?,
            (None, None) => Domain::new("weave.local.").context("default domain")?,
        };
        let mut config = NameServerConfig::new(domain);
        if let Some(ttl) = self.ttl.or(file.ttl) {
            config.db.ttl = ttl;
        }
        config.dns.listen = self
            .dns_listen
            .or(file.dns_listen)
            .unwrap_or(DEFAULT_DNS_LISTEN);
        if let Some(n) = self.dns_udp_batch {
            config.dns.udp_batch = usize::try_from(n).unwrap_or(1);
        }
        if let Some(n) = self.dns_udp_recv_buffer {
            config.dns.udp_recv_buffer = to_usize(n);
        }
        if let Some(s) = self.dns_tcp_idle_timeout_s.or(file.dns_tcp_idle_timeout_s) {
            config.dns.tcp_idle_timeout = Duration::from_secs(s);
        }
        if let Some(s) = self.dns_tcp_lifetime_s.or(file.dns_tcp_lifetime_s) {
            config.dns.tcp_max_lifetime = Duration::from_secs(s);
        }
        if let Some(n) = self
            .dns_tcp_max_connections
            .or(file.dns_tcp_max_connections)
        {
            config.dns.max_tcp_connections = to_usize(n);
        }
        if let Some(n) = self.dns_workers {
            config.dns.udp_workers = n.max(1);
        }
        config.tombstone_grace = self
            .tombstone_grace_s
            .or(file.tombstone_grace_s)
            .map_or(DEFAULT_TOMBSTONE_GRACE, Duration::from_secs);
        config.data_dir = self.data_dir.clone().or_else(|| file.data_dir.clone());
        config.dns.access.allow = if self.dns_allow.is_empty() {
            file.dns_allow
                .iter()
                .map(|e| e.parse())
                .collect::<Result<_, _>>()
                .context("nameserver.dns_allow")?
        } else {
            self.dns_allow.clone()
        };
        if self.dns_allow_local_any || file.dns_allow_local_any == Some(true) {
            config.dns.access.local_names = LocalNames::Anyone;
        }
        if let Some(qps) = self.dns_rate_limit.or(file.dns_rate_limit) {
            config.dns.access.rate_limit.qps = qps;
        }
        if let Some(slip) = self.dns_rate_limit_slip.or(file.dns_rate_limit_slip) {
            config.dns.access.rate_limit.slip = slip;
        }
        config.db.health_fail = match self.health_fail_open.or(file.health_fail_open) {
            Some(false) => HealthFailMode::Closed,
            Some(true) | None => HealthFailMode::Open,
        };
        if let Some(ms) = self.check_interval_ms.or(file.check_interval_ms) {
            config.checks.interval = Duration::from_millis(ms);
        }
        if let Some(n) = self.check_misses.or(file.check_misses) {
            config.checks.misses = n;
        }
        config.fallback = if !self.fallback.is_empty() {
            Fallback::Servers(self.fallback.clone())
        } else if let Some(path) = &self.resolv_conf {
            Fallback::ResolvConf(path.clone())
        } else if !file.fallback.is_empty() {
            Fallback::Servers(file.fallback.clone())
        } else {
            Fallback::ResolvConf(
                file.resolv_conf
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/etc/resolv.conf")),
            )
        };
        Ok(config)
    }
}
