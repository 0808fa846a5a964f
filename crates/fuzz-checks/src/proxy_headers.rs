//! `http_headers`: arbitrary header lines through the HTTP path's request and
//! response rewriting (`dwara_proxy::headers`), and the first line as an
//! `address:` value (`dwara_proxy::split_address`).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Headers that must never reach the other side as they came (a request's `TE`
/// and `Connection` come back as `TE: trailers`, `Connection: te` when its `TE`
/// accepted trailers). `Trailer` is the message's and goes on.
const HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
    "expect",
];

/// Parses `data` as `name: value` lines (lines that are not valid headers are
/// skipped), rewrites them as a request and as a response, and checks: no
/// hop-by-hop header and nothing `Connection` named is left (but `Host` and the
/// `X-Forwarded-*` pair, which the rewrite sets itself, and on a request whose `TE`
/// listed `trailers` exactly `TE: trailers` and `Connection: te`), nor a
/// `Content-Length` beside `Transfer-Encoding`; every other header is kept,
/// `X-Forwarded-For` ends with the client and `X-Forwarded-Proto` is `http`.
/// A successful `split_address` gives a port that is not 0 and a host without `:`
/// unless it is an IPv6 literal. `Cookie` lines joined (an HTTP/2 request's) are
/// one line of them all.
pub fn http_headers(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Some(first) = text.lines().next()
        && let Ok((host, port)) = dwara_proxy::split_address(first)
    {
        assert_ne!(port, 0);
        assert!(!host.contains(':') || host.parse::<std::net::Ipv6Addr>().is_ok());
    }
    let mut headers = HeaderMap::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }
    let named: HashSet<String> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        // `Host` is the request's: a `Connection` that names it leaves it. `close`
        // is the connection option, not a header named so.
        .filter(|t| t != "host" && t != "close")
        .collect();
    // A length beside Transfer-Encoding goes with it (RFC 9112 §6.3).
    let chunked = headers.contains_key("transfer-encoding");
    let gone = |name: &str| {
        HOP.contains(&name) || named.contains(name) || (chunked && name == "content-length")
    };
    let client = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));

    // Refused (but rewritten all the same) exactly when a Transfer-Encoding names a
    // coding other than chunked.
    let other_coding = headers
        .get_all("transfer-encoding")
        .iter()
        .any(names_another_coding);
    let mut request = headers.clone();
    let coding = dwara_proxy::headers::to_upstream(&mut request, client, Some("example.test:80"));
    assert_eq!(coding.is_err(), other_coding);
    // The rewrite sets these itself, after taking away what `Connection` named:
    // Host from the authority (whatever the client sent), the `X-Forwarded-*` pair.
    let set_here = |n: &str| n == "host" || n.starts_with("x-forwarded-");
    check_te(&headers, &mut request);
    for name in request.keys() {
        assert!(
            set_here(name.as_str()) || !gone(name.as_str()),
            "{name} passed on"
        );
    }
    assert_eq!(
        request.get_all("host").iter().collect::<Vec<_>>(),
        ["example.test:80"]
    );
    for name in headers.keys() {
        let n = name.as_str();
        if !gone(n) && !n.starts_with("x-forwarded-") && n != "host" {
            assert_eq!(
                request.get_all(name).iter().count(),
                headers.get_all(name).iter().count(),
                "{n} lost"
            );
        }
    }
    if let Some(xff) = request.get("x-forwarded-for") {
        assert!(xff.to_str().unwrap_or_default().ends_with("192.0.2.7"));
    } else {
        // Only when the earlier values could not be joined into one header.
        assert!(headers.contains_key("x-forwarded-for"));
    }
    assert_eq!(request["x-forwarded-proto"], "http");
    assert!(request.contains_key("host"));

    check_hosts(&headers);
    check_cookies(&headers);

    check_response(&headers, &gone, other_coding);
}

/// `to_client` refuses exactly when a Transfer-Encoding names another coding
/// (`other_coding`), takes away every header `gone` names but `Expect` (which
/// only requests lose), and keeps every other one whole.
fn check_response(headers: &HeaderMap, gone: &dyn Fn(&str) -> bool, other_coding: bool) {
    let mut response = headers.clone();
    assert_eq!(
        dwara_proxy::headers::to_client(&mut response).is_err(),
        other_coding
    );
    for name in response.keys() {
        let n = name.as_str();
        assert!(n == "expect" || !gone(n), "{n} passed on");
    }
    for name in headers.keys() {
        let n = name.as_str();
        if !gone(n) && n != "expect" {
            assert_eq!(
                response.get_all(name).iter().count(),
                headers.get_all(name).iter().count(),
                "{n} lost from a response"
            );
        }
    }
}

/// Whether a `Transfer-Encoding` value names a coding other than chunked.
fn names_another_coding(value: &HeaderValue) -> bool {
    value.to_str().map_or(true, |t| {
        t.split(',')
            .map(str::trim)
            .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))
    })
}

/// More than one Host is refused, none is not, and a target that names its host
/// makes the Host lines moot.
fn check_hosts(headers: &HeaderMap) {
    let hosts = headers.get_all("host").iter().count();
    let origin = http::Uri::from_static("/");
    let checked = dwara_proxy::headers::check_host(headers, &origin);
    match hosts {
        0 => assert_eq!(checked, Ok(false)),
        1 => assert!(checked != Ok(false), "{checked:?}"),
        _ => assert!(checked.is_err(), "{hosts} Host lines"),
    }
    let absolute = http::Uri::from_static("http://example.test:80/");
    assert_eq!(
        dwara_proxy::headers::check_host(headers, &absolute),
        Ok(true)
    );
}

/// `join_cookies` leaves one `Cookie` line holding every line's value in order,
/// `; ` between them, and touches nothing else.
fn check_cookies(headers: &HeaderMap) {
    let lines: Vec<&[u8]> = headers
        .get_all("cookie")
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let mut joined = headers.clone();
    dwara_proxy::headers::join_cookies(&mut joined);
    let after: Vec<&[u8]> = joined
        .get_all("cookie")
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    if lines.is_empty() {
        assert!(after.is_empty());
    } else {
        assert_eq!(after, [lines.join(&b"; "[..]).as_slice()]);
    }
    joined.remove("cookie");
    let mut others = headers.clone();
    others.remove("cookie");
    assert_eq!(joined, others);
}

/// A request whose `TE` listed `trailers` goes on with exactly `TE: trailers` and
/// `Connection: te` (taken out of `request` here, for the checks that follow).
fn check_te(headers: &HeaderMap, request: &mut HeaderMap) {
    let trailers = headers.get_all("te").iter().any(|v| {
        v.to_str().is_ok_and(|t| {
            t.split(',')
                .any(|c| c.trim().eq_ignore_ascii_case("trailers"))
        })
    });
    let te: Vec<_> = request.get_all("te").iter().map(|v| v.as_bytes()).collect();
    let connection: Vec<_> = request
        .get_all("connection")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if trailers {
        assert_eq!(
            (te.as_slice(), connection.as_slice()),
            (&[&b"trailers"[..]][..], &[&b"te"[..]][..])
        );
        request.remove("te");
        request.remove("connection");
    }
}
