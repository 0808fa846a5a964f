//! `dwara dns …`: a small client of the name server's HTTP API.
//!
//! Speaks just enough HTTP/1.1 over a plain TCP connection (one request,
//! `Connection: close`) to drive the API: no TLS, no redirects, no chunked bodies
//! (the API always sends a `Content-Length`).

use std::net::IpAddr;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Where the API is.
#[derive(Debug, Args)]
pub(crate) struct ApiArgs {
    /// Base URL of the name server's HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:6784")]
    api: String,
}

/// `dwara dns` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DnsCommand {
    /// Register IP under FQDN for container ID.
    Add {
        /// The container (or any owner) id.
        id: String,
        /// The address.
        ip: IpAddr,
        /// The name, inside the served domain.
        fqdn: String,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Remove the records of ID (only those with IP when given).
    Rm {
        /// The container id.
        id: String,
        /// Only this address.
        ip: Option<IpAddr>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Look a name up through the HTTP API (prints one address per line).
    Lookup {
        /// The fully qualified name.
        fqdn: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// Runs one `dwara dns` subcommand.
#[allow(clippy::print_stdout)]
pub(crate) async fn run(cmd: DnsCommand) -> anyhow::Result<()> {
    match cmd {
        DnsCommand::Add { id, ip, fqdn, api } => {
            let path = format!("/name/{}/{}", encode(&id), ip);
            let body = format!("fqdn={}", encode(&fqdn));
            expect_ok(request(&api.api, "PUT", &path, Some(&body)).await?)?;
        }
        DnsCommand::Rm { id, ip, api } => {
            let path = match ip {
                Some(ip) => format!("/name/{}/{}", encode(&id), ip),
                None => format!("/name/{}", encode(&id)),
            };
            expect_ok(request(&api.api, "DELETE", &path, None).await?)?;
        }
        DnsCommand::Lookup { fqdn, api } => {
            let resp = request(&api.api, "GET", &format!("/name/{}", encode(&fqdn)), None).await?;
            if resp.status == 404 {
                bail!("{fqdn}: no records");
            }
            let body = expect_ok(resp)?;
            let ips: Vec<String> =
                serde_json::from_str(&body).with_context(|| format!("unexpected reply: {body}"))?;
            for ip in ips {
                println!("{ip}");
            }
        }
    }
    Ok(())
}

struct Response {
    status: u16,
    body: String,
}

fn expect_ok(resp: Response) -> anyhow::Result<String> {
    if (200..300).contains(&resp.status) {
        Ok(resp.body)
    } else {
        bail!("the API answered {}: {}", resp.status, resp.body.trim())
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Splits `http://host:port/prefix` into (`host:port`, `/prefix`).
fn split_url(url: &str) -> anyhow::Result<(String, String)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("--api {url:?}: only http:// URLs are supported");
    };
    let (authority, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        bail!("--api {url:?}: no host");
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, prefix.to_owned()))
}

async fn request(
    api: &str,
    method: &str,
    path: &str,
    form: Option<&str>,
) -> anyhow::Result<Response> {
    let (authority, prefix) = split_url(api)?;
    let mut stream = TcpStream::connect(&authority)
        .await
        .with_context(|| format!("cannot connect to the name server API at {api}"))?;
    let body = form.unwrap_or_default();
    let mut req = format!(
        "{method} {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if form.is_some() {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream
        .write_all(req.as_bytes())
        .await
        .context("sending the request")?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .await
        .context("reading the reply")?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP reply")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("malformed HTTP status line")?;
    Ok(Response {
        status,
        body: body.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_encoding() {
        assert_eq!(
            split_url("http://127.0.0.1:6784").unwrap(),
            ("127.0.0.1:6784".to_owned(), String::new())
        );
        assert_eq!(
            split_url("http://localhost/api/").unwrap(),
            ("localhost:80".to_owned(), "/api".to_owned())
        );
        assert!(split_url("https://x").is_err());
        assert_eq!(encode("a b/c.d"), "a%20b%2Fc.d");
    }
}
