#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    NameServerConfig, ResolveHosts, ResolverConfig as HickoryConfig, ResolverOpts,
    ServerOrderingStrategy,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RData, Record};
use tracing::{debug, info, warn};

pub use dwara_resolv_conf::{ResolvConf, parse_resolv_conf};
pub use error::ResolveError;
/// The DNS record type carried by [`ResolveError`], re-exported so callers need not
/// depend on hickory-proto.
pub use hickory_resolver::proto::rr::RecordType;

/// Google's public resolvers, the last resort when nothing else is configured.
pub const GOOGLE_NAMESERVERS: [SocketAddr; 2] = [
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(8, 8, 8, 8)), 53),
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(8, 8, 4, 4)), 53),
];

/// How a [`DnsResolver`] is built.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Explicit name servers (`IP:port`), asked in this order. Empty: use `resolv_conf`.
    pub nameservers: Vec<SocketAddr>,
    /// The resolv.conf to read when no explicit list is given.
    pub resolv_conf: PathBuf,
    /// Timeout of one query to one server.
    pub timeout: Duration,
    /// How many times a query is tried per server.
    pub attempts: usize,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        Self {
            nameservers: Vec::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            timeout: Duration::from_secs(2),
            attempts: 2,
        }
    }
}

/// Where the resolver's name servers came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameServerSource {
    /// The explicit list of the configuration.
    Explicit(Vec<SocketAddr>),
    /// A readable resolv.conf (path and the servers it listed).
    ResolvConf(PathBuf, Vec<SocketAddr>),
    /// Neither: Google's public resolvers.
    Google,
}

impl NameServerSource {
    /// The servers in the order they are asked.
    pub fn servers(&self) -> &[SocketAddr] {
        match self {
            Self::Explicit(s) | Self::ResolvConf(_, s) => s,
            Self::Google => &GOOGLE_NAMESERVERS,
        }
    }
}

/// How many SRV targets [`DnsResolver::lookup_srv`] resolves at the same time.
const SRV_TARGETS_AT_ONCE: usize = 8;

/// One resolved SRV target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrvTarget {
    /// An address of the target host.
    pub ip: IpAddr,
    /// The service port from the SRV record.
    pub port: u16,
    /// RFC 2782 priority (lower is preferred).
    pub priority: u16,
    /// RFC 2782 weight within a priority.
    pub weight: u16,
    /// min(SRV TTL, address TTL), in seconds.
    pub ttl: u32,
}

/// A DNS client for A, AAAA and SRV with TTLs. Cheap to clone.
#[derive(Clone)]
pub struct DnsResolver {
    inner: TokioResolver,
    source: NameServerSource,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Picks the name servers: explicit list, else a readable resolv.conf (read by
/// [`parse_resolv_conf`]), else Google. Also returns the file's search list.
fn select_source(config: &ResolverConfig) -> (NameServerSource, Vec<String>) {
    if !config.nameservers.is_empty() {
        return (
            NameServerSource::Explicit(config.nameservers.clone()),
            Vec::new(),
        );
    }
    let path = &config.resolv_conf;
    match std::fs::read(path) {
        Ok(data) => {
            let parsed = parse_resolv_conf(&String::from_utf8_lossy(&data));
            if parsed.nameservers.is_empty() {
                warn!(path = %path.display(), "resolv.conf lists no usable name server; using Google's public resolvers");
                (NameServerSource::Google, parsed.search)
            } else {
                let source = NameServerSource::ResolvConf(path.clone(), parsed.nameservers);
                (source, parsed.search)
            }
        }
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read resolv.conf; using Google's public resolvers");
            (NameServerSource::Google, Vec::new())
        }
    }
}

fn nameserver(addr: SocketAddr) -> NameServerConfig {
    let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
    for conn in &mut ns.connections {
        conn.port = addr.port();
    }
    // An NXDOMAIN from the first server is the answer; don't ask the next one.
    ns.trust_negative_responses = true;
    ns
}

impl DnsResolver {
    /// Builds a resolver; the name-server choice is logged at info level.
    pub fn new(config: ResolverConfig) -> Result<Self, ResolveError> {
        let (source, search) = select_source(&config);
        // A search domain that is not a valid name is skipped, as hickory's own
        // reader does.
        let search = search
            .iter()
            .filter_map(|d| Name::from_utf8(d).ok())
            .collect();
        let servers = source.servers().iter().copied().map(nameserver).collect();
        let hickory = HickoryConfig::from_parts(None, search, servers);

        let mut opts = ResolverOpts::default();
        opts.cache_size = 0;
        opts.use_hosts_file = ResolveHosts::Never;
        opts.timeout = config.timeout;
        opts.attempts = config.attempts.max(1);
        opts.server_ordering_strategy = ServerOrderingStrategy::UserProvidedOrder;
        opts.num_concurrent_reqs = 1;
        opts.preserve_intermediates = true;

        let inner = TokioResolver::builder_with_config(hickory, TokioRuntimeProvider::default())
            .with_options(opts)
            .build()
            .map_err(|e| ResolveError::Config(Arc::new(e)))?;
        match &source {
            NameServerSource::Explicit(s) => info!(servers = ?s, "resolver: explicit name servers"),
            NameServerSource::ResolvConf(p, s) => {
                info!(path = %p.display(), servers = ?s, "resolver: name servers from resolv.conf")
            }
            NameServerSource::Google => {
                info!(servers = ?GOOGLE_NAMESERVERS, "resolver: no configured name servers, using Google's public resolvers")
            }
        }
        Ok(Self { inner, source })
    }

    /// Where the name servers came from.
    pub fn source(&self) -> &NameServerSource {
        &self.source
    }

    /// A records of `host` with their TTLs.
    pub async fn lookup_a(&self, host: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        self.lookup_addrs(host, RecordType::A).await
    }

    /// AAAA records of `host` with their TTLs.
    pub async fn lookup_aaaa(&self, host: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        self.lookup_addrs(host, RecordType::AAAA).await
    }

    /// A and AAAA records of `host`, queried concurrently; IPv4 first.
    ///
    /// An empty answer for one family is fine as long as the other has addresses;
    /// a failure of either is a failure (a half answer would silently drop addresses).
    pub async fn lookup_ip(&self, host: &str) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        let (v4, v6) = tokio::join!(self.lookup_a(host), self.lookup_aaaa(host));
        merge_families(v4, v6)
    }

    /// SRV records of `name`, each target resolved to its addresses (A and AAAA).
    ///
    /// A target whose A/AAAA records are in the answer's additional section takes its
    /// addresses from there (dwara and dnsmasq put them there; a name server that
    /// gives each instance a target of its own would otherwise cost two queries per
    /// instance). The other targets are resolved explicitly, each distinct name once
    /// and at most eight at a time however many records name it. A target with no
    /// address records is skipped with a warning; a failure resolving any target
    /// fails the whole lookup, so a caller never mistakes half an answer for the
    /// whole set. The target `.` ("service not available", RFC 2782) yields nothing.
    pub async fn lookup_srv(&self, name: &str) -> Result<Vec<SrvTarget>, ResolveError> {
        self.lookup_srv_with(name, |target| async move { self.lookup_ip(&target).await })
            .await
    }

    /// [`lookup_srv`](Self::lookup_srv), with the targets that the answer gives
    /// without addresses resolved by `resolve_target` (called with each such name,
    /// in ASCII, once; `ResolveError::NoRecords` skips the target) instead of by
    /// this resolver: e.g. through a cache on a dial path.
    pub async fn lookup_srv_with<F, Fut>(
        &self,
        name: &str,
        resolve_target: F,
    ) -> Result<Vec<SrvTarget>, ResolveError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<(IpAddr, u32)>, ResolveError>>,
    {
        let qname = parse_name(name)?;
        let lookup = self
            .inner
            .lookup(qname, RecordType::SRV)
            .await
            .map_err(|e| ResolveError::from_net(name, RecordType::SRV, e))?;
        let names = answer_names(lookup.query().name(), lookup.answers());
        let srvs: Vec<_> = lookup
            .answers()
            .iter()
            .filter(|r| names.contains(&r.name.to_lowercase()))
            .filter_map(|r| match &r.data {
                RData::SRV(srv) => Some((srv.clone(), r.ttl)),
                _ => None,
            })
            .collect();
        if srvs.is_empty() {
            return Err(ResolveError::NoRecords {
                name: name.to_owned(),
                record_type: RecordType::SRV,
                nxdomain: false,
                negative_ttl: None,
            });
        }
        // Each distinct target is asked for once, a few at a time: an answer that
        // names one target in thousands of records (or thousands of targets) must
        // not turn into thousands of concurrent lookups, each of which the same
        // upstream may answer with thousands of records again.
        let given = additional_addrs(lookup.additionals());
        let target_names: BTreeSet<Name> = srvs
            .iter()
            .map(|(srv, _)| srv.target.to_lowercase())
            .filter(|target| !target.is_root() && !given.contains_key(target))
            .collect();
        let mut addrs: HashMap<Name, Vec<(IpAddr, u32)>> = stream::iter(target_names)
            .map(|target| {
                let ascii = target.to_ascii();
                let lookup = resolve_target(ascii.clone());
                async move {
                    match lookup.await {
                        Ok(a) => Ok((target, a)),
                        Err(ResolveError::NoRecords { .. }) => {
                            warn!(srv = name, target = %ascii, "SRV target has no address records; skipped");
                            Ok((target, Vec::new()))
                        }
                        Err(e) => Err(e),
                    }
                }
            })
            .buffer_unordered(SRV_TARGETS_AT_ONCE)
            .try_collect()
            .await?;
        addrs.extend(given);
        let mut targets: Vec<SrvTarget> = srvs
            .iter()
            .flat_map(|(srv, ttl)| {
                addrs
                    .get(&srv.target.to_lowercase())
                    .into_iter()
                    .flatten()
                    .map(|&(ip, addr_ttl)| SrvTarget {
                        ip,
                        port: srv.port,
                        priority: srv.priority,
                        weight: srv.weight,
                        ttl: (*ttl).min(addr_ttl),
                    })
            })
            .collect();
        targets.sort();
        targets.dedup();
        debug!(srv = name, targets = targets.len(), "resolved SRV");
        Ok(targets)
    }

    async fn lookup_addrs(
        &self,
        host: &str,
        rtype: RecordType,
    ) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
        let qname = parse_name(host)?;
        let lookup = self
            .inner
            .lookup(qname, rtype)
            .await
            .map_err(|e| ResolveError::from_net(host, rtype, e))?;
        let names = answer_names(lookup.query().name(), lookup.answers());
        let mut out: Vec<(IpAddr, u32)> = lookup
            .answers()
            .iter()
            .filter(|r| names.contains(&r.name.to_lowercase()))
            .filter_map(|r| match &r.data {
                RData::A(a) if rtype == RecordType::A => Some((IpAddr::V4(a.0), r.ttl)),
                RData::AAAA(a) if rtype == RecordType::AAAA => Some((IpAddr::V6(a.0), r.ttl)),
                _ => None,
            })
            .collect();
        if out.is_empty() {
            // Only a CNAME chain, or records of another type: no addresses.
            return Err(ResolveError::NoRecords {
                name: host.to_owned(),
                record_type: rtype,
                nxdomain: false,
                negative_ttl: None,
            });
        }
        out.sort();
        out.dedup_by_key(|(ip, _)| *ip);
        Ok(out)
    }
}

/// The A/AAAA records of an additional section by owner (lower-cased), with their
/// TTLs, each address once, IPv4 first.
fn additional_addrs(records: &[Record]) -> HashMap<Name, Vec<(IpAddr, u32)>> {
    let mut by_name: HashMap<Name, Vec<(IpAddr, u32)>> = HashMap::new();
    for r in records {
        let ip = match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        by_name
            .entry(r.name.to_lowercase())
            .or_default()
            .push((ip, r.ttl));
    }
    for addrs in by_name.values_mut() {
        addrs.sort();
        addrs.dedup_by_key(|(ip, _)| *ip);
    }
    by_name
}

/// The owner names (lower-cased) whose records answer a question for `qname`:
/// `qname` itself and the names its CNAME records in `answers` lead to. Records for
/// any other name are an upstream's lie or junk and must never become endpoints.
/// Linear in the answer: a long chain or a CNAME loop costs one pass each.
fn answer_names(qname: &Name, answers: &[Record]) -> HashSet<Name> {
    let mut cnames: HashMap<Name, Vec<Name>> = HashMap::new();
    for r in answers {
        if let RData::CNAME(target) = &r.data {
            cnames
                .entry(r.name.to_lowercase())
                .or_default()
                .push(target.0.to_lowercase());
        }
    }
    let mut names = HashSet::from([qname.to_lowercase()]);
    let mut todo = vec![qname.to_lowercase()];
    while let Some(name) = todo.pop() {
        for target in cnames.get(&name).into_iter().flatten() {
            if names.insert(target.clone()) {
                todo.push(target.clone());
            }
        }
    }
    names
}

fn merge_families(
    v4: Result<Vec<(IpAddr, u32)>, ResolveError>,
    v6: Result<Vec<(IpAddr, u32)>, ResolveError>,
) -> Result<Vec<(IpAddr, u32)>, ResolveError> {
    match (v4, v6) {
        (Ok(mut a), Ok(b)) => {
            a.extend(b);
            Ok(a)
        }
        (Ok(a), Err(ResolveError::NoRecords { .. }))
        | (Err(ResolveError::NoRecords { .. }), Ok(a)) => Ok(a),
        (
            Err(e @ ResolveError::NoRecords { nxdomain: true, .. }),
            Err(ResolveError::NoRecords { .. }),
        )
        | (Err(ResolveError::NoRecords { .. }), Err(e @ ResolveError::NoRecords { .. })) => Err(e),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

fn parse_name(host: &str) -> Result<Name, ResolveError> {
    let invalid = |reason: String| ResolveError::InvalidName {
        name: host.to_owned(),
        reason,
    };
    if host.is_empty() {
        return Err(invalid("empty name".to_owned()));
    }
    let name = Name::from_utf8(host).map_err(|e| invalid(e.to_string()))?;
    if name.is_root() {
        return Err(invalid("the root name has no addresses".to_owned()));
    }
    Ok(name)
}

#[cfg(test)]
mod tests;
