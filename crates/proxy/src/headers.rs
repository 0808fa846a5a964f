//! The header rewriting of the HTTP path, as pure functions over `http::HeaderMap`
//! (fuzzed: `fuzz/fuzz_targets/http_headers.rs`).
//!
//! A proxy must not pass on the hop-by-hop headers of RFC 9110 §7.6.1 (they describe
//! one connection, not the message): `Connection` itself, every header that
//! `Connection` names, and the classic list (`Keep-Alive`, `Proxy-Connection`, `TE`,
//! `Trailer`, `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate`,
//! `Proxy-Authorization`). hyper frames each side's body itself (chunked or
//! `Content-Length`), so dropping `Transfer-Encoding` loses nothing. `Expect` is
//! answered by this hop (hyper sends `100 Continue` when the body is first read),
//! so it is dropped from the request too. Towards the endpoint the client's address
//! is appended to `X-Forwarded-For` and `X-Forwarded-Proto` says `http`; `Host` is
//! passed on as the client sent it (taken from the URI's authority when the request
//! line was in absolute form).

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The hop-by-hop headers every message loses, whatever `Connection` says.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Removes the hop-by-hop headers: those named in `Connection` (every value, comma
/// separated, names that are not header names skipped) and the fixed list.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests carry no Connection header (HTTP/1.1 keep-alive is the default).
    if let Some(named) = connection_tokens(headers) {
        for name in named {
            headers.remove(&name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The header names listed in `Connection`, or `None` without one.
fn connection_tokens(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut values = headers.get_all(header::CONNECTION).iter().peekable();
    values.peek()?;
    let mut names = Vec::new();
    for value in values {
        let Ok(text) = value.to_str() else { continue };
        for token in text.split(',') {
            let token = token.trim();
            if token.is_empty() {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes()) {
                names.push(name);
            }
        }
    }
    Some(names)
}

/// Rewrites a request's headers for the endpoint: hop-by-hop and `Expect` removed,
/// `X-Forwarded-For` appended with `client`, `X-Forwarded-Proto: http`, and `Host`
/// set from `authority` when the request had none.
pub fn to_upstream(headers: &mut HeaderMap, client: IpAddr, authority: Option<&str>) {
    remove_hop_by_hop(headers);
    headers.remove(header::EXPECT);
    let client = client.to_canonical().to_string();
    // Appended to the last value, as HAProxy's and nginx's $proxy_add_x_forwarded_for
    // do; several header lines are joined into one, which means the same.
    let prior: Vec<&str> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let forwarded = if prior.is_empty() {
        client
    } else {
        format!("{}, {client}", prior.join(", "))
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    if !headers.contains_key(header::HOST)
        && let Some(v) = authority.and_then(|a| HeaderValue::from_str(a).ok())
    {
        headers.insert(header::HOST, v);
    }
}

/// Rewrites a response's headers for the client: hop-by-hop removed.
pub fn to_client(headers: &mut HeaderMap) {
    remove_hop_by_hop(headers);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = map(&[
            ("connection", "close, X-Secret , bad header,"),
            ("connection", "x-other"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic x"),
            ("expect", "100-continue"),
            ("x-kept", "3"),
            ("host", "web.local"),
        ]);
        to_upstream(&mut h, "10.1.2.3".parse().unwrap(), None);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            ["host", "x-forwarded-for", "x-forwarded-proto", "x-kept"]
        );
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["host"], "web.local");
    }

    #[test]
    fn forwarded_for_appends_and_host_comes_from_the_authority() {
        let mut h = map(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "2.2.2.2"),
        ]);
        to_upstream(
            &mut h,
            "::ffff:10.0.0.9".parse().unwrap(),
            Some("web.local:8080"),
        );
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.0.0.9");
        assert_eq!(h["host"], "web.local:8080");
        let mut r = map(&[("connection", "keep-alive"), ("content-length", "3")]);
        to_client(&mut r);
        assert_eq!(r.len(), 1);
    }
}
