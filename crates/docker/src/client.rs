//! Connecting to the daemon and choosing the API version the requests carry.
//!
//! bollard prefixes every request path with its client version (`/v1.53/…` in
//! 0.21.1) and its `negotiate_version()` asks `/v1.53/version`, which a daemon older
//! than API 1.53 refuses ("client version 1.53 is too new"). So the version is
//! negotiated here: one unversioned `GET /version` (the daemon answers it with its
//! own API version), then every request carries `min(daemon, bollard's)`.

use std::path::Path;
use std::time::Duration;

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
            let answer = probe.version().await.map_err(unreachable)?;
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
    let docker = client(socket, config.request_timeout, &client_version).map_err(unreachable)?;
    if config.api_version.is_some() {
        // Nothing was asked yet: make sure the daemon answers at that version.
        docker.ping().await.map_err(unreachable)?;
    }
    Ok((docker, version))
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
) -> Result<Docker, bollard::errors::Error> {
    let secs = timeout.as_secs().max(1);
    Docker::connect_with_unix(&socket.to_string_lossy(), secs, version)
}

/// Drops the `/vMAJOR.MINOR` prefix bollard puts on the path.
fn unversioned(mut req: BollardRequest) -> BollardRequest {
    let uri = req.uri().clone();
    let Some(pq) = uri.path_and_query() else {
        return req;
    };
    let Some(rest) = strip_version(pq.as_str()).map(str::to_owned) else {
        return req;
    };
    let mut parts = uri.into_parts();
    parts.path_and_query = rest.parse().ok();
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
}
