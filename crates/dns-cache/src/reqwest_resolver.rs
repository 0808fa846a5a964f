//! [`ReqwestResolver`]: the cache as reqwest's `dns::Resolve`.

use std::net::SocketAddr;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::DnsCache;

/// A [`DnsCache`] as a resolver for `reqwest::ClientBuilder::dns_resolver`.
///
/// ```no_run
/// # fn demo(cache: dwara_dns_cache::DnsCache) -> Result<(), reqwest::Error> {
/// let client = reqwest::Client::builder()
///     .dns_resolver(cache.reqwest_resolver())
///     .build()?;
/// # let _ = client; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ReqwestResolver {
    cache: DnsCache,
}

impl ReqwestResolver {
    /// Wraps `cache`.
    pub fn new(cache: DnsCache) -> Self {
        Self { cache }
    }
}

impl DnsCache {
    /// This cache as a reqwest resolver (an `Arc`, as `dns_resolver` takes one).
    pub fn reqwest_resolver(&self) -> std::sync::Arc<ReqwestResolver> {
        std::sync::Arc::new(ReqwestResolver::new(self.clone()))
    }
}

impl Resolve for ReqwestResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let cache = self.cache.clone();
        Box::pin(async move {
            // Port 0: reqwest puts the URL's (or the scheme's) port in.
            let ips = cache.resolve(name.as_str()).await?;
            let addrs: Vec<SocketAddr> = ips.iter().map(|ip| SocketAddr::new(*ip, 0)).collect();
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}
