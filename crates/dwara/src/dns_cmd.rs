//! `dwara dns …`: a small client of the name server's HTTP API, on reqwest.
//!
//! Every request has a connect timeout and an overall timeout; when the server
//! cannot be reached the error is one line naming the URL.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use dwara::auth::Token;
use reqwest::{Method, StatusCode, Url};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the API is, and the token it wants.
#[derive(Debug, Args)]
pub(crate) struct ApiArgs {
    /// Base URL of the name server's HTTP API.
    #[arg(long, default_value = "http://127.0.0.1:6784")]
    api: String,
    /// File holding the API's bearer token (the server's --http-token-file)
    /// [default: the DWARA_TOKEN environment variable, else no token]
    #[arg(long, value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
}

/// The environment variable `dwara dns` takes the token from without --token-file.
const TOKEN_ENV: &str = "DWARA_TOKEN";

impl ApiArgs {
    /// The `Authorization` header value: from --token-file, else `DWARA_TOKEN`.
    fn authorization(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.token_file {
            return Ok(Some(Token::load(path)?.header_value()));
        }
        match std::env::var_os(TOKEN_ENV) {
            None => Ok(None),
            Some(v) => {
                let token = Token::parse(v.as_encoded_bytes())
                    .map_err(|e| anyhow::anyhow!("{TOKEN_ENV}: {e}"))?;
                Ok(Some(token.header_value()))
            }
        }
    }
}

/// `dwara dns` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DnsCommand {
    /// Register IP under FQDN for container ID (with --port, also answered as SRV at
    /// SERVICE.FQDN, with --priority and --weight; with --check tcp, answered only
    /// while IP:PORT accepts connections).
    Add {
        /// The container (or any owner) id.
        id: String,
        /// The address.
        ip: IpAddr,
        /// The name, inside the served domain.
        fqdn: String,
        /// The port of the service (1–65535), answered as SRV.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
        port: Option<u16>,
        /// The service (`_http._tcp`); default `_<port>._tcp`. Needs --port.
        #[arg(long, requires = "port")]
        service: Option<String>,
        /// The SRV priority (0–65535, lower is preferred; RFC 2782) [default: 0].
        /// Needs --port.
        #[arg(long, requires = "port")]
        priority: Option<u16>,
        /// The SRV weight (0–65535, the share among instances of one priority;
        /// RFC 2782) [default: 1]. Needs --port.
        #[arg(long, requires = "port")]
        weight: Option<u16>,
        /// Check the entry: `tcp` connects to IP:PORT every check interval of the
        /// server; the name is answered only while it passes. Needs --port.
        #[arg(long, requires = "port", value_parser = ["tcp"])]
        check: Option<String>,
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
    /// Look a name up through the HTTP API (prints one address per line; for a
    /// service name, `_http._tcp.FQDN`, one `ip:port` per line).
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
        DnsCommand::Add {
            id,
            ip,
            fqdn,
            port,
            service,
            priority,
            weight,
            check,
            api,
        } => {
            let url = api.url(&["name", &id, &ip.to_string()])?;
            let [port, priority, weight] =
                [port, priority, weight].map(|v| v.map(|v| v.to_string()));
            let mut form = vec![("fqdn", fqdn.as_str())];
            form.extend(port.as_deref().map(|p| ("port", p)));
            form.extend(service.as_deref().map(|s| ("service", s)));
            form.extend(priority.as_deref().map(|p| ("priority", p)));
            form.extend(weight.as_deref().map(|w| ("weight", w)));
            form.extend(check.as_deref().map(|c| ("check", c)));
            expect_ok(request(Method::PUT, url, Some(&form), &api).await?)?;
        }
        DnsCommand::Rm { id, ip, api } => {
            let url = match ip {
                Some(ip) => api.url(&["name", &id, &ip.to_string()])?,
                None => api.url(&["name", &id])?,
            };
            expect_ok(request(Method::DELETE, url, None, &api).await?)?;
        }
        DnsCommand::Lookup { fqdn, api } => {
            let resp = request(Method::GET, api.url(&["name", &fqdn])?, None, &api).await?;
            if resp.status == StatusCode::NOT_FOUND {
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

impl ApiArgs {
    /// The base URL with `segments` appended, each percent-encoded as one path segment.
    fn url(&self, segments: &[&str]) -> anyhow::Result<Url> {
        let mut url = Url::parse(&self.api).with_context(|| format!("--api {:?}", self.api))?;
        if url.scheme() != "http" {
            bail!("--api {:?}: only http:// URLs are supported", self.api);
        }
        url.path_segments_mut()
            .map_err(|()| anyhow::anyhow!("--api {:?}: not a base URL", self.api))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }
}

struct Response {
    status: StatusCode,
    body: String,
}

fn expect_ok(resp: Response) -> anyhow::Result<String> {
    if resp.status.is_success() {
        Ok(resp.body)
    } else {
        bail!(
            "the API answered {}: {}",
            resp.status.as_u16(),
            resp.body.trim()
        )
    }
}

/// One request; `form` goes in a form body; the token, if any, in `Authorization`.
async fn request(
    method: Method,
    url: Url,
    form: Option<&[(&str, &str)]>,
    api: &ApiArgs,
) -> anyhow::Result<Response> {
    let authorization = api.authorization()?;
    let client = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .no_proxy()
        .build()
        .context("building the HTTP client")?;
    let mut req = client.request(method.clone(), url.clone());
    if let Some(form) = form {
        req = req.form(form);
    }
    if let Some(value) = authorization {
        req = req.header(reqwest::header::AUTHORIZATION, value);
    }
    let what = format!("{method} {url}");
    let resp = req.send().await.map_err(|e| {
        let why = if e.is_connect() {
            "cannot connect to the name server API"
        } else if e.is_timeout() {
            "the name server API did not answer in time"
        } else {
            "request failed"
        };
        anyhow::anyhow!("{what}: {why} ({})", root_cause(&e))
    })?;
    let status = resp.status();
    let body = resp
        .text()
        .await
        .with_context(|| format!("{what}: reading the reply"))?;
    Ok(Response { status, body })
}

/// The innermost error's text (reqwest's own chain repeats the URL).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_each_segment() {
        let api = |s: &str| ApiArgs {
            api: s.to_owned(),
            token_file: None,
        };
        assert_eq!(
            api("http://127.0.0.1:6784")
                .url(&["name", "a b/c", "10.0.0.1"])
                .unwrap()
                .as_str(),
            "http://127.0.0.1:6784/name/a%20b%2Fc/10.0.0.1"
        );
        assert_eq!(
            api("http://localhost/api/")
                .url(&["name", "x"])
                .unwrap()
                .as_str(),
            "http://localhost/api/name/x"
        );
        assert!(api("https://x").url(&["name"]).is_err());
        assert!(
            api("ftp://x")
                .url(&["name"])
                .unwrap_err()
                .to_string()
                .contains("http://")
        );
    }
}
