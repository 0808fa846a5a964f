//! Host names as cache keys: normalisation, and the names that bypass the cache.
//!
//! Keys are lower case without a trailing dot, so `API.example.` and `api.example`
//! share one entry. IP literals (also bracketed IPv6, as in URLs) and `localhost`
//! (with its subdomains, RFC 6761) never reach the cache or the network.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, LazyLock};

/// The cache key of `host`; borrows when `host` is already normalised.
#[inline]
pub(crate) fn normalise(host: &str) -> Cow<'_, str> {
    let bytes = host.as_bytes();
    let clean = !bytes.iter().any(u8::is_ascii_uppercase) && bytes.last() != Some(&b'.');
    if clean {
        return Cow::Borrowed(host);
    }
    let trimmed = host.strip_suffix('.').unwrap_or(host);
    Cow::Owned(trimmed.to_ascii_lowercase())
}

static LOCALHOST: LazyLock<Arc<[IpAddr]>> = LazyLock::new(|| {
    Arc::from([
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ])
});

/// The addresses of a name that is answered without DNS: an IP literal or localhost.
/// `key` must be normalised.
pub(crate) fn bypass(key: &str) -> Option<Arc<[IpAddr]>> {
    let literal = key
        .strip_prefix('[')
        .and_then(|k| k.strip_suffix(']'))
        .unwrap_or(key);
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Some(Arc::from([ip]));
    }
    if key == "localhost" || key.ends_with(".localhost") {
        return Some(LOCALHOST.clone());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalise_lowercases_and_strips_the_trailing_dot() {
        assert!(matches!(normalise("api.test"), Cow::Borrowed("api.test")));
        assert_eq!(normalise("API.Test."), "api.test");
        assert_eq!(normalise("api.test."), "api.test");
        assert_eq!(normalise(""), "");
        assert_eq!(normalise("."), "");
    }

    #[test]
    fn literals_and_localhost_bypass() {
        assert_eq!(
            &*bypass("10.1.2.3").unwrap(),
            &["10.1.2.3".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            &*bypass("::1").unwrap(),
            &["::1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            &*bypass("[fd00::2]").unwrap(),
            &["fd00::2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(bypass("localhost").unwrap().len(), 2);
        assert_eq!(bypass("db.localhost").unwrap().len(), 2);
        assert!(bypass("api.test").is_none());
        assert!(bypass("localhost.example").is_none());
        assert!(bypass("10.1.2.3.example").is_none());
    }
}
