//! The header rewriting of the HTTP path, as pure functions over `http::HeaderMap`
//! (fuzzed: `fuzz/fuzz_targets/http_headers.rs`).
//!
//! A proxy must not pass on the hop-by-hop headers of RFC 9110 §7.6.1 (they describe
//! one connection, not the message): `Connection` itself, every header that
//! `Connection` names, and the classic list (`Keep-Alive`, `Proxy-Connection`, `TE`,
//! `Transfer-Encoding`, `Upgrade`, `Proxy-Authenticate`, `Proxy-Authorization`).
//! `Trailer` is not one of them (RFC 9110 §6.6.2: it is the message's, and hyper
//! sends only the trailer fields it announces), and a request whose `TE` accepts
//! trailers goes on with `TE: trailers` (and `Connection: te`, as §10.1.4 asks),
//! since this hop passes trailers on both ways. hyper frames each side's body itself (chunked or
//! `Content-Length`), so dropping `Transfer-Encoding` loses nothing; a
//! `Content-Length` beside it goes too (RFC 9112 §6.3: the chunks decided where
//! the body ended, not the length). hyper undoes only the chunked coding: a
//! message whose `Transfer-Encoding` names another ([`UnknownCoding`]) is
//! reported, for the caller to refuse. `Expect` is
//! answered by this hop (hyper sends `100 Continue` when the body is first read),
//! so it is dropped from the request too. Towards the endpoint the client's address
//! is appended to `X-Forwarded-For` and `X-Forwarded-Proto` says `http`; `Host` is
//! passed on as the client sent it, except when the request target carries a host
//! (an HTTP/1.1 request line in absolute form, HTTP/2's `:authority`): then `Host`
//! is that host and port, whatever the client sent beside it (RFC 9112 §3.2.2), so
//! the endpoint never routes by a different host than the one the request named.
//! A request with more than one `Host`, or one that is not a host and port, or an
//! HTTP/1.1 request with none, is
//! refused ([`check_host`]). `Connection` cannot take `Host` away.

use std::fmt;
use std::net::IpAddr;

use http::Uri;
use http::header::{self, Entry, HeaderMap, HeaderName, HeaderValue};

/// The hop-by-hop headers every message loses, whatever `Connection` says, that
/// `http` knows as standard headers (compared as such: no string comparison).
static STANDARD_HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
];

/// The other hop-by-hop headers every message loses (lowercase, as
/// `HeaderName::as_str` gives them).
const OTHER_HOP_BY_HOP: [&str; 2] = ["keep-alive", "proxy-connection"];

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Whether `name` is one of the hop-by-hop headers of RFC 9110 §7.6.1's list.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    STANDARD_HOP_BY_HOP.contains(name) || OTHER_HOP_BY_HOP.contains(&name.as_str())
}

/// A message whose `Transfer-Encoding` names a coding other than `chunked`
/// (`gzip, chunked`, say): hyper undoes only the chunks, so passed on without its
/// `Transfer-Encoding` the body would still carry the other coding, unannounced.
/// The rewrite is done all the same; the caller refuses the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownCoding;

impl fmt::Display for UnknownCoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a transfer coding other than chunked")
    }
}

impl std::error::Error for UnknownCoding {}

/// Removes the hop-by-hop headers: those named in `Connection` (every value, comma
/// separated, names that are not header names skipped) and the fixed list.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) -> Result<(), UnknownCoding> {
    remove_listed(headers, is_hop_by_hop, Message::Response)
}

/// Which way a message goes, for what [`remove_listed`] puts back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    /// To the endpoint: a `TE` that accepted trailers comes back as
    /// `TE: trailers`.
    Request,
    /// To the client.
    Response,
}

/// Whether a `Transfer-Encoding` value names a coding other than `chunked`.
fn other_coding(value: &HeaderValue) -> bool {
    let Ok(text) = value.to_str() else {
        return true;
    };
    text.split(',')
        .map(str::trim)
        .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))
}

/// Removes the headers `Connection` names and every header for which `listed` is
/// true (`Connection` itself must be listed); [`UnknownCoding`] when a
/// `Transfer-Encoding` so removed named a coding other than `chunked`. On a
/// request, a removed `TE` that accepted trailers is put back as
/// `TE: trailers` with `Connection: te`.
fn remove_listed(
    headers: &mut HeaderMap,
    listed: fn(&HeaderName) -> bool,
    message: Message,
) -> Result<(), UnknownCoding> {
    // Most messages carry none of them, or only `Connection` (a response's
    // `keep-alive`): one pass over the names finds out, where a removal of each
    // listed name would hash every one of them.
    let (mut any, mut only_connection) = (false, true);
    for name in headers.keys().filter(|n| listed(n)) {
        any = true;
        only_connection &= name == header::CONNECTION;
    }
    if !any {
        return Ok(());
    }
    // `Connection` goes first, its values read as they are taken out (one lookup).
    let named = match headers.entry(header::CONNECTION) {
        Entry::Occupied(e) => connection_tokens(e.remove_entry_mult().1),
        Entry::Vacant(_) => Vec::new(),
    };
    for name in named {
        headers.remove(&name);
    }
    if only_connection {
        return Ok(());
    }
    let mut coding = Ok(());
    let mut trailers = false;
    while let Some(name) = headers.keys().find(|n| listed(n)).cloned() {
        if message == Message::Request && name == header::TE {
            trailers = headers.get_all(&name).iter().any(accepts_trailers);
        }
        if name == header::TRANSFER_ENCODING {
            if headers.get_all(&name).iter().any(other_coding) {
                coding = Err(UnknownCoding);
            }
            // Transfer-Encoding overrides Content-Length, and an intermediary
            // removes the length before it passes the message on (RFC 9112 §6.3):
            // hyper read the body by its chunks, so the length was never checked
            // against it.
            headers.remove(header::CONTENT_LENGTH);
        }
        headers.remove(&name);
    }
    if trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("te"));
    }
    coding
}

/// Whether a `TE` value lists `trailers` (RFC 9110 §10.1.4).
fn accepts_trailers(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|text| {
        text.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
    })
}

/// The header names `Connection`'s values list, beside those of the fixed list
/// (`keep-alive`, the usual value, is one of them, and `close` seldom names a
/// header: neither costs an allocation). A token that is not a header name is
/// skipped.
fn connection_tokens(values: impl Iterator<Item = HeaderValue>) -> Vec<HeaderName> {
    let mut names = Vec::new();
    for value in values {
        let Ok(text) = value.to_str() else { continue };
        for token in text.split(',') {
            let token = token.trim();
            // `Host` is the request's, not the connection's: a `Connection` that
            // names it does not take it away (nor can the answer to
            // [`check_host`] then change).
            if token.is_empty()
                || token.eq_ignore_ascii_case("keep-alive")
                || token.eq_ignore_ascii_case("close")
                || token.eq_ignore_ascii_case("host")
            {
                continue;
            }
            if let Ok(name) = HeaderName::from_bytes(token.as_bytes())
                && !is_hop_by_hop(&name)
            {
                names.push(name);
            }
        }
    }
    names
}

/// Whether `name` goes from every request: hop-by-hop, or `Expect`.
fn is_dropped_from_requests(name: &HeaderName) -> bool {
    name == header::EXPECT || is_hop_by_hop(name)
}

/// The value this hop adds to `X-Forwarded-For` for a client at `client` (its
/// IPv4 form when it is an IPv4-mapped IPv6 address); made once per client
/// connection.
pub fn forwarded_for(client: IpAddr) -> HeaderValue {
    use std::io::Write;
    // Formatted on the stack (the longest address text is 39 bytes): the value
    // is the only allocation.
    let mut text = [0u8; 48];
    let written = match client.to_canonical() {
        IpAddr::V4(v4) => Ok(ipv4_text(v4, &mut text)),
        v6 => {
            let mut at = &mut text[..];
            write!(at, "{v6}").map(|()| 48 - at.len())
        }
    };
    // An address's text always fits and is always a valid header value.
    written
        .ok()
        .and_then(|n| HeaderValue::from_bytes(&text[..n]).ok())
        .unwrap_or_else(|| HeaderValue::from_static("unknown"))
}

/// Writes the dotted-decimal text of `ip` at the start of `out` and says how
/// long it is (at most 15 bytes). Written out digit by digit: through `Display`
/// and the formatting machinery it took about a thousand instructions, a
/// noticeable part of what a new client connection costs.
fn ipv4_text(ip: std::net::Ipv4Addr, out: &mut [u8; 48]) -> usize {
    let mut n = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            out[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            out[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        out[n] = b'0' + octet % 10;
        n += 1;
    }
    n
}

/// Rewrites a request's headers for the endpoint: hop-by-hop and `Expect` removed,
/// `X-Forwarded-For` appended with `client`, `X-Forwarded-Proto: http`, and `Host`
/// set to `authority` (the request target's host and port, when it has one).
/// [`UnknownCoding`]: the request is to be refused (the rewrite is done all the
/// same).
pub fn to_upstream(
    headers: &mut HeaderMap,
    client: IpAddr,
    authority: Option<&str>,
) -> Result<(), UnknownCoding> {
    rewrite_request(headers, &forwarded_for(client), authority)
}

/// [`to_upstream`] with the client's `X-Forwarded-For` value made already (see
/// [`forwarded_for`]).
pub fn rewrite_request(
    headers: &mut HeaderMap,
    client: &HeaderValue,
    authority: Option<&str>,
) -> Result<(), UnknownCoding> {
    let coding = remove_listed(headers, is_dropped_from_requests, Message::Request);
    // Appended to the last value, as HAProxy's and nginx's $proxy_add_x_forwarded_for
    // do; several header lines are joined into one, which means the same.
    match headers.entry(&X_FORWARDED_FOR) {
        Entry::Vacant(e) => {
            e.insert(client.clone());
        }
        Entry::Occupied(mut e) => {
            let mut joined = String::new();
            for v in e.iter().filter_map(|v| v.to_str().ok()) {
                joined.push_str(v);
                joined.push_str(", ");
            }
            joined.push_str(client.to_str().unwrap_or_default());
            if let Ok(v) = HeaderValue::from_str(&joined) {
                e.insert(v);
            }
        }
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    if let Some(a) = authority
        && let Ok(v) = HeaderValue::from_str(a)
    {
        headers.insert(header::HOST, v);
    }
    coding
}

/// Joins the `Cookie` lines of an HTTP/2 request into one, `; ` between them, as
/// RFC 9113 §8.2.3 asks before the request goes on as HTTP/1.1: HTTP/2 clients
/// send each cookie as a field of its own (for HPACK), and an HTTP/1.1 request
/// may carry only one `Cookie` line (RFC 6265 §5.4), so an endpoint may read only
/// the first or refuse the request.
pub fn join_cookies(headers: &mut HeaderMap) {
    let Entry::Occupied(mut cookies) = headers.entry(header::COOKIE) else {
        return;
    };
    if cookies.iter().nth(1).is_none() {
        return;
    }
    let mut joined = Vec::new();
    for value in cookies.iter() {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(value.as_bytes());
    }
    // Valid values joined by "; " are a valid value.
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        cookies.insert(value);
    }
}

/// The bytes a `Host` value may hold: a reg-name, an IP literal or IPv4 address,
/// and a port (unreserved characters, percent-encoding, sub-delimiters, `:` and
/// the brackets of an IPv6 literal). A table: one load per byte of every request's
/// `Host`.
static IN_HOST: [bool; 256] = {
    let mut t = [false; 256];
    let extra = b"-._~%!$&'()*+,;=:[]";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    let mut b = 0;
    while b < 128 {
        if (b as u8).is_ascii_alphanumeric() {
            t[b] = true;
        }
        b += 1;
    }
    t
};

/// Whether the request goes on with a `Host` (after [`rewrite_request`]), or why
/// its `Host` lines make it one to refuse with a `400` (RFC 9112 §3.2): more than
/// one, or a value that is not a host and port. `Ok(false)` when there is none
/// (refused for HTTP/1.1; HTTP/1.0 and HTTP/2 requests go on with the endpoint's
/// address); `Ok(true)` for one that is fine, and
/// whatever they are when the request target (`target`) names its host (an
/// absolute-form request line, HTTP/2's `:authority`), which replaces them.
pub fn check_host(headers: &HeaderMap, target: &Uri) -> Result<bool, &'static str> {
    if target.host().is_some() {
        return Ok(true);
    }
    let mut hosts = headers.get_all(header::HOST).iter();
    let Some(first) = hosts.next() else {
        return Ok(false);
    };
    if hosts.next().is_some() {
        return Err("more than one Host header");
    }
    // (Empty is allowed: the target had no authority.)
    let fine = first.as_bytes().iter().all(|&b| IN_HOST[usize::from(b)]);
    if fine {
        Ok(true)
    } else {
        Err("a Host header that is not a host and port")
    }
}

/// Rewrites a response's headers for the client: hop-by-hop removed.
/// [`UnknownCoding`]: the response is not to be passed on (the rewrite is done
/// all the same).
pub fn to_client(headers: &mut HeaderMap) -> Result<(), UnknownCoding> {
    remove_hop_by_hop(headers)
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
        to_upstream(&mut h, "10.1.2.3".parse().unwrap(), None).unwrap();
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        // `TE: trailers` is put back for this hop, which passes trailers on.
        assert_eq!(
            left,
            [
                "connection",
                "host",
                "te",
                "x-forwarded-for",
                "x-forwarded-proto",
                "x-kept"
            ]
        );
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["host"], "web.local");
        assert_eq!(h["te"], "trailers");
        assert_eq!(h["connection"], "te");
    }

    #[test]
    fn trailers_are_announced_end_to_end_and_te_asks_this_hop_for_them() {
        // `Trailer` is the message's: it stays on requests and responses.
        let mut r = map(&[("trailer", "x-sum"), ("transfer-encoding", "chunked")]);
        to_client(&mut r).unwrap();
        assert_eq!(
            r.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["trailer"]
        );
        // A request's `TE` goes; it comes back as `TE: trailers` only when it
        // accepted trailers, whatever else it listed and however it was spelt.
        for (te, kept) in [
            ("trailers", true),
            ("gzip;q=0.5, Trailers", true),
            (" deflate , trailers ", true),
            ("gzip", false),
            ("trailersx", false),
            ("", false),
        ] {
            let mut h = map(&[
                ("te", te),
                ("connection", "TE, x-hop"),
                ("x-hop", "1"),
                ("trailer", "x-check"),
                ("host", "web.local"),
            ]);
            to_upstream(&mut h, "10.0.0.1".parse().unwrap(), None).unwrap();
            assert_eq!(h.get("x-hop"), None, "{te:?}");
            assert_eq!(h["trailer"], "x-check", "{te:?}");
            if kept {
                assert_eq!(h.get_all("te").iter().collect::<Vec<_>>(), ["trailers"]);
                assert_eq!(h.get_all("connection").iter().collect::<Vec<_>>(), ["te"]);
            } else {
                assert_eq!(h.get("te"), None, "{te:?}");
                assert_eq!(h.get("connection"), None, "{te:?}");
            }
        }
    }

    #[test]
    fn connection_tokens_in_any_case_name_what_goes_and_nothing_else() {
        // A response's usual `Connection: keep-alive` goes alone.
        let mut r = map(&[
            ("date", "Thu, 03 Dec 2026 10:00:00 GMT"),
            ("connection", "keep-alive"),
            ("content-type", "text/plain"),
            ("x-app", "1"),
        ]);
        to_client(&mut r).unwrap();
        let mut left: Vec<&str> = r.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "date", "x-app"]);
        // Tokens name standard and other headers in any case, present or not; the
        // fixed list goes whatever `Connection` says.
        let mut r = map(&[
            ("Connection", "Keep-Alive, X-App,Date , x-absent, Upgrade"),
            ("keep-alive", "timeout=5"),
            ("date", "Thu, 03 Dec 2026 10:00:00 GMT"),
            ("x-app", "1"),
            ("x-app", "2"),
            ("upgrade", "websocket"),
            ("proxy-connection", "keep-alive"),
            ("content-length", "3"),
        ]);
        to_client(&mut r).unwrap();
        let left: Vec<&str> = r.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["content-length"]);
        // Without `Connection`, only the fixed list goes.
        let mut r = map(&[("te", "trailers"), ("x-app", "1")]);
        to_client(&mut r).unwrap();
        assert_eq!(
            r.keys().map(HeaderName::as_str).collect::<Vec<_>>(),
            ["x-app"]
        );
    }

    #[test]
    fn a_transfer_coding_other_than_chunked_is_reported_and_its_length_goes() {
        for te in ["gzip, chunked", "chunked, gzip", "x-custom", "chunked\u{0}"] {
            let Ok(v) = HeaderValue::from_str(te) else {
                continue;
            };
            let mut h = HeaderMap::new();
            h.insert(header::TRANSFER_ENCODING, v);
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
            assert_eq!(to_client(&mut h.clone()), Err(UnknownCoding), "{te}");
            assert_eq!(
                to_upstream(&mut h, "10.0.0.1".parse().unwrap(), None),
                Err(UnknownCoding)
            );
            // Rewritten all the same.
            assert!(
                h.get(header::TRANSFER_ENCODING).is_none()
                    && h.get(header::CONTENT_LENGTH).is_none()
            );
        }
        for te in ["chunked", "Chunked", " chunked ,", "chunked, chunked"] {
            let mut h = map(&[("transfer-encoding", te)]);
            assert_eq!(to_client(&mut h), Ok(()), "{te}");
        }
    }

    #[test]
    fn an_h2_requests_cookie_lines_become_one() {
        let mut h = map(&[
            ("cookie", "a=1"),
            ("x-app", "1"),
            ("cookie", "b=2; c=3"),
            ("cookie", "d=4"),
        ]);
        join_cookies(&mut h);
        assert_eq!(
            h.get_all("cookie").iter().collect::<Vec<_>>(),
            ["a=1; b=2; c=3; d=4"]
        );
        assert_eq!(h["x-app"], "1");
        // One line, or none, is left as it is.
        for pairs in [&[("cookie", "a=1")][..], &[("x-app", "1")][..]] {
            let mut h = map(pairs);
            join_cookies(&mut h);
            assert_eq!(h, map(pairs));
        }
    }

    /// A request target in origin form (no host of its own).
    fn origin() -> Uri {
        Uri::from_static("/path")
    }

    /// A request target in absolute form.
    fn absolute() -> Uri {
        Uri::from_static("http://web.local:8080/path")
    }

    #[test]
    fn a_doubled_or_malformed_host_is_a_problem_unless_the_target_names_one() {
        let one = map(&[("host", "web.local:8080")]);
        assert_eq!(check_host(&one, &origin()), Ok(true));
        assert_eq!(
            check_host(&map(&[("host", "[::1]:80")]), &origin()),
            Ok(true)
        );
        assert_eq!(check_host(&map(&[("host", "")]), &origin()), Ok(true));
        assert_eq!(check_host(&HeaderMap::new(), &origin()), Ok(false));
        assert_eq!(check_host(&HeaderMap::new(), &absolute()), Ok(true));
        // Named in Connection, Host stays.
        let mut h = map(&[("connection", "host, x-a"), ("host", "web"), ("x-a", "1")]);
        to_upstream(&mut h, "10.0.0.1".parse().unwrap(), None).unwrap();
        assert_eq!(h["host"], "web");
        assert!(h.get("x-a").is_none());
        let two = map(&[("host", "a"), ("host", "b")]);
        assert_eq!(
            check_host(&two, &origin()),
            Err("more than one Host header")
        );
        assert_eq!(check_host(&two, &absolute()), Ok(true));
        for bad in ["a b", "a/b", "user@a", "a?b", "a#b", "a\\b"] {
            assert!(
                check_host(&map(&[("host", bad)]), &origin()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn forwarded_for_is_the_address_text_of_every_length() {
        for (ip, text) in [
            ("10.0.0.9", "10.0.0.9"),
            ("0.0.0.0", "0.0.0.0"),
            ("1.20.100.255", "1.20.100.255"),
            ("109.90.199.9", "109.90.199.9"),
            ("255.255.255.255", "255.255.255.255"),
            ("::ffff:255.255.255.255", "255.255.255.255"),
            (
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ),
            // Only a mapped address is written with its IPv4 part.
            ("::ffff:0:255.255.255.255", "::ffff:0:ffff:ffff"),
            (
                "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ),
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(forwarded_for(ip), text, "{ip:?}");
        }
        // Every octet value in every place, against the standard library's text.
        for o in 0..=255u8 {
            let ip = std::net::Ipv4Addr::new(o, 255 - o, o / 2, o.wrapping_mul(7));
            assert_eq!(forwarded_for(ip.into()), ip.to_string().as_str());
        }
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
        )
        .unwrap();
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 2.2.2.2, 10.0.0.9");
        assert_eq!(h["host"], "web.local:8080");
        // The request target's host wins over the one the client sent beside it.
        let mut h = map(&[("host", "other.local"), ("host", "third.local")]);
        to_upstream(&mut h, "10.0.0.9".parse().unwrap(), Some("web.local")).unwrap();
        assert_eq!(h.get_all("host").iter().collect::<Vec<_>>(), ["web.local"]);
        // Without one, the client's stays.
        let mut h = map(&[("host", "other.local")]);
        to_upstream(&mut h, "10.0.0.9".parse().unwrap(), None).unwrap();
        assert_eq!(h["host"], "other.local");
        let mut r = map(&[("connection", "keep-alive"), ("content-length", "3")]);
        to_client(&mut r).unwrap();
        assert_eq!(r.len(), 1);
        // A length beside chunks is not passed on.
        let mut r = map(&[
            ("content-length", "5"),
            ("transfer-encoding", "chunked"),
            ("x-kept", "1"),
        ]);
        to_client(&mut r).unwrap();
        assert_eq!(r.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
    }
}
