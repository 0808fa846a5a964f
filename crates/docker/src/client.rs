//! Connecting to the daemon and choosing the API version the requests carry.
//!
//! bollard 0.21.1 means to prefix every path with its client version, but builds the
//! URL with `Url::join` of an absolute path, which drops the prefix (bollard #736):
//! every request goes out unversioned, `negotiate_version()` included, and the daemon
//! answers in its own newest API version, whatever the client version says. So the
//! version is chosen here: one unversioned `GET /version` (the daemon's API version),
//! then every request is rewritten to carry `/v{min(daemon, bollard's)}` (or the
//! pinned version): what the daemon answers is then the shape bollard's models
//! describe, and the same code keeps working once bollard fixes the prefix.
//!
//! bollard's own timeout ends when the response head arrives: the body is read
//! without one, so an answer whose body never completes would hold its caller for
//! ever. Every request the updater makes (the event stream aside) goes through
//! [`bounded`], which bounds the whole answer by `request_timeout`.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::{API_DEFAULT_VERSION, BollardRequest, ClientVersion, Docker};

use crate::config::{ApiVersion, DockerConfig};
use crate::error::{Error, Result};

/// A client for `config.socket`, speaking the negotiated (or pinned) API version.
pub(crate) async fn connect(config: &DockerConfig) -> Result<(Docker, ApiVersion)> {
    let socket = &config.socket;
    let unreachable = |source| Error::Unreachable {
        socket: socket.clone(),
        source,
    };
    let version = match config.api_version {
        Some(pinned) => pinned,
        None => {
            let probe = client(socket, config.request_timeout, API_DEFAULT_VERSION)
                .map_err(unreachable)?
                .with_request_modifier(unversioned);
            let answer = bounded(config.request_timeout, probe.version())
                .await
                .map_err(unreachable)?;
            let daemon: ApiVersion = answer
                .api_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::NoApiVersion {
                    socket: socket.clone(),
                    got: answer.api_version.clone(),
                })?;
            if daemon < ApiVersion::OLDEST {
                return Err(Error::ApiTooOld {
                    socket: socket.clone(),
                    daemon,
                    oldest: ApiVersion::OLDEST,
                });
            }
            daemon.min(bollard_version())
        }
    };
    let client_version = ClientVersion {
        major_version: usize::from(version.major),
        minor_version: usize::from(version.minor),
    };
    let docker = client(socket, config.request_timeout, &client_version)
        .map_err(unreachable)?
        .with_request_modifier(move |req| versioned(req, version));
    if config.api_version.is_some() {
        // Nothing was asked yet: make sure the daemon answers at that version.
        bounded(config.request_timeout, docker.ping())
            .await
            .map_err(unreachable)?;
    }
    Ok((docker, version))
}

/// `request`, head and body, within `timeout`; bollard's `RequestTimeoutError` when
/// it takes longer.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = Result<T, BollardError>>,
) -> Result<T, BollardError> {
    tokio::time::timeout(timeout, request)
        .await
        .unwrap_or(Err(BollardError::RequestTimeoutError))
}

/// The newest API version this bollard speaks.
fn bollard_version() -> ApiVersion {
    let v = API_DEFAULT_VERSION;
    ApiVersion::new(
        u16::try_from(v.major_version).unwrap_or(u16::MAX),
        u16::try_from(v.minor_version).unwrap_or(u16::MAX),
    )
}

fn client(
    socket: &Path,
    timeout: Duration,
    version: &ClientVersion,
) -> Result<Docker, BollardError> {
    // Whole seconds, rounded up: `bounded` applies the exact timeout first.
    let secs = (timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0)).max(1);
    Docker::connect_with_unix(&socket.to_string_lossy(), secs, version)
}

/// The request without any `/vMAJOR.MINOR` path prefix.
fn unversioned(req: BollardRequest) -> BollardRequest {
    rewrite_path(req, |path| strip_version(path).unwrap_or(path).to_owned())
}

/// The request with exactly one `/v{version}` path prefix.
fn versioned(req: BollardRequest, version: ApiVersion) -> BollardRequest {
    rewrite_path(req, |path| {
        format!("/v{version}{}", strip_version(path).unwrap_or(path))
    })
}

fn rewrite_path(mut req: BollardRequest, f: impl FnOnce(&str) -> String) -> BollardRequest {
    let uri = req.uri().clone();
    let Some(pq) = uri.path_and_query() else {
        return req;
    };
    let new = f(pq.as_str());
    let mut parts = uri.into_parts();
    parts.path_and_query = new.parse().ok();
    if let Ok(uri) = http::Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
    req
}

/// `/v1.53/version?x` → `/version?x`; `None` when there is no version prefix.
fn strip_version(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v")?;
    let end = rest.find('/')?;
    let version = &rest[..end];
    let is_version = version.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
    });
    is_version.then(|| &rest[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_only_a_version_prefix() {
        assert_eq!(strip_version("/v1.53/version"), Some("/version"));
        assert_eq!(
            strip_version("/v1.41/events?since=1"),
            Some("/events?since=1")
        );
        assert_eq!(strip_version("/version"), None);
        assert_eq!(strip_version("/volumes/x"), None);
        assert_eq!(strip_version("/v1/x"), None);
    }

    fn request(uri: &str) -> BollardRequest {
        let body = http_body_util::Either::Left(http_body_util::Full::new(Default::default()));
        http::Request::builder().uri(uri).body(body).unwrap()
    }

    #[test]
    fn requests_carry_exactly_the_chosen_version() {
        let v = ApiVersion::new(1, 41);
        let host = "unix://2f7661722f72756e2f646f636b65722e736f636b";
        for path in ["/events?since=1.5", "/v1.53/events?since=1.5"] {
            let r = versioned(request(&format!("{host}{path}")), v);
            assert_eq!(
                r.uri().path_and_query().unwrap().as_str(),
                "/v1.41/events?since=1.5"
            );
            let r = unversioned(request(&format!("{host}{path}")));
            assert_eq!(
                r.uri().path_and_query().unwrap().as_str(),
                "/events?since=1.5"
            );
        }
    }
}
