//! A minimal HTTP/1.1 client for tests against our own HTTP APIs: one request per
//! connection (`Connection: close`), an optional form-encoded body, the status and
//! body back. Blocking ([`request`]) and async ([`request_async`]) forms; both panic
//! with the request named when the server cannot be reached, does not answer within
//! [`TIMEOUT`], or answers something that is not HTTP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long a request may take in all.
pub const TIMEOUT: Duration = Duration::from_secs(10);

fn format_request(method: &str, path: &str, body: Option<&str>) -> String {
    let body = body.unwrap_or_default();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// `(status, body)` of a whole response; panics, naming `what`, on anything else.
fn parse_response(raw: &[u8], what: &str) -> (u16, String) {
    let raw = String::from_utf8_lossy(raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{what}: no complete HTTP response: {raw:?}"));
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("{what}: not an HTTP/1.1 status line: {head:?}"));
    (status, body.to_owned())
}

/// Sends one request and reads the whole response: `(status, body)`.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let what = format!("{method} http://{addr}{path}");
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)
        .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
    s.set_read_timeout(Some(TIMEOUT)).expect("set read timeout");
    s.write_all(format_request(method, path, body).as_bytes())
        .unwrap_or_else(|e| panic!("{what}: send: {e}"));
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("{what}: read: {e}"));
    parse_response(&raw, &what)
}

/// [`request`] on tokio.
pub async fn request_async(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let what = format!("{method} http://{addr}{path}");
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format_request(method, path, body).as_bytes())
            .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        std::io::Result::Ok(raw)
    };
    let raw = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{what}: no response within {TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    parse_response(&raw, &what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_parse_and_garbage_is_named() {
        assert_eq!(
            parse_response(b"HTTP/1.1 204 No Content\r\nA: b\r\n\r\n", "t"),
            (204, String::new())
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nno such name", "t"),
            (404, "no such name".to_owned())
        );
        let e = std::panic::catch_unwind(|| parse_response(b"SSH-2.0\r\n", "GET x"));
        assert!(e.is_err());
    }

    #[test]
    fn requests_carry_the_body_length() {
        let r = format_request("PUT", "/name/c1/10.0.0.1", Some("fqdn=a.weave.local"));
        assert!(r.starts_with("PUT /name/c1/10.0.0.1 HTTP/1.1\r\n"), "{r}");
        assert!(r.contains("Content-Length: 18\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\nfqdn=a.weave.local"), "{r}");
    }
}
