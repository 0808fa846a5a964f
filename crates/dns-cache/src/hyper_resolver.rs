//! [`HyperResolver`]: the cache as hyper-util's resolver (`tower::Service<Name>`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

use crate::{DnsCache, DnsCacheError};

/// A [`DnsCache`] as a resolver for `hyper_util::client::legacy::connect::HttpConnector`.
///
/// ```no_run
/// # fn demo(cache: dwara_dns_cache::DnsCache) {
/// use hyper_util::client::legacy::connect::HttpConnector;
/// let connector = HttpConnector::new_with_resolver(cache.hyper_resolver());
/// # let _ = connector; }
/// ```
#[derive(Debug, Clone)]
pub struct HyperResolver {
    cache: DnsCache,
}

impl HyperResolver {
    /// Wraps `cache`.
    pub fn new(cache: DnsCache) -> Self {
        Self { cache }
    }
}

impl DnsCache {
    /// This cache as a hyper-util resolver.
    pub fn hyper_resolver(&self) -> HyperResolver {
        HyperResolver::new(self.clone())
    }
}

impl tower::Service<Name> for HyperResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = DnsCacheError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let cache = self.cache.clone();
        Box::pin(async move {
            // Port 0: the connector puts the URI's port in.
            let addrs = cache.resolve_socket_addrs(name.as_str(), 0).await?;
            Ok(addrs.into_iter())
        })
    }
}
