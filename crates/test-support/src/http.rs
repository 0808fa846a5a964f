//! HTTP requests for tests against our own HTTP APIs, on reqwest: an optional
//! form-encoded body, the status and body back. Async ([`request_async`]) and
//! blocking ([`request`]: the async one on a runtime of its own) forms; both panic
//! with the request named when the server cannot be reached, does not answer within
//! [`TIMEOUT`], or answers something that is not HTTP.

use std::net::SocketAddr;
use std::time::Duration;

/// How long a request may take in all.
pub const TIMEOUT: Duration = Duration::from_secs(10);

fn method(m: &str) -> reqwest::Method {
    reqwest::Method::from_bytes(m.as_bytes()).unwrap_or_else(|_| panic!("bad method {m:?}"))
}

/// Sends one request and reads the whole response: `(status, body)`. `body` is sent
/// as `application/x-www-form-urlencoded` text, as given.
///
/// [`request_async`] on a current-thread runtime of its own, on a thread of its own
/// (so it may be called from anywhere, async code included); its panic is this one.
pub fn request(
    addr: SocketAddr,
    method_name: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("{method_name} http://{addr}{path}: runtime: {e}"))
                .block_on(request_async(addr, method_name, path, body))
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// [`request`] from async code: the same request, on the caller's tokio runtime.
pub async fn request_async(
    addr: SocketAddr,
    method_name: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    let what = format!("{method_name} {url}");
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{what}: client: {e}"));
    let resp = client
        .request(method(method_name), &url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.unwrap_or_default().to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let status = resp.status().as_u16();
    let text = resp
        .text()
        .await
        .unwrap_or_else(|e| panic!("{what}: body: {e:?}"));
    (status, text)
}
