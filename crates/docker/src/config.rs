//! How the Docker updater is set up: socket, mode, name sources, network, backoff.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// The socket used when `DOCKER_HOST` names none.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// Whether the updater runs (`--docker auto|on|off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DockerMode {
    /// On when the socket exists and the daemon answers; off (logged) otherwise.
    #[default]
    Auto,
    /// Always on: an unreachable daemon at start is an error.
    On,
    /// Never on.
    Off,
}

impl FromStr for DockerMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(Error::InvalidMode {
                input: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for DockerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        })
    }
}

/// Where a container's names come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NameSource {
    /// `Hostname.Domainname` (or a hostname that carries the domain), when it falls
    /// inside the served domain.
    Hostname,
    /// The container's name, under the served domain.
    Name,
    /// The container's network aliases, under the served domain.
    Aliases,
}

impl NameSource {
    fn as_str(self) -> &'static str {
        match self {
            Self::Hostname => "hostname",
            Self::Name => "name",
            Self::Aliases => "aliases",
        }
    }
}

/// A non-empty set of [`NameSource`]s (`--docker-names hostname,name,aliases`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameSources(BTreeSet<NameSource>);

impl NameSources {
    /// The set holding only `source`.
    pub fn only(source: NameSource) -> Self {
        Self(BTreeSet::from([source]))
    }

    /// Every source.
    pub fn all() -> Self {
        Self(BTreeSet::from([
            NameSource::Hostname,
            NameSource::Name,
            NameSource::Aliases,
        ]))
    }

    /// Whether `source` is enabled.
    pub fn contains(&self, source: NameSource) -> bool {
        self.0.contains(&source)
    }

    /// The enabled sources, in a fixed order.
    pub fn iter(&self) -> impl Iterator<Item = NameSource> + '_ {
        self.0.iter().copied()
    }
}

impl Default for NameSources {
    /// Only [`NameSource::Hostname`], as WeaveDNS does.
    fn default() -> Self {
        Self::only(NameSource::Hostname)
    }
}

impl FromStr for NameSources {
    type Err = Error;

    /// Parses `hostname,name,aliases` (any subset, any order, at least one).
    fn from_str(s: &str) -> Result<Self> {
        let mut set = BTreeSet::new();
        for part in s.split(',') {
            let source = match part.trim().to_ascii_lowercase().as_str() {
                "hostname" => NameSource::Hostname,
                "name" => NameSource::Name,
                "aliases" => NameSource::Aliases,
                "" => {
                    return Err(Error::InvalidNames {
                        input: s.to_owned(),
                        reason: "empty entry; expected a comma-separated list of hostname, name, aliases"
                            .to_owned(),
                    });
                }
                other => {
                    return Err(Error::InvalidNames {
                        input: s.to_owned(),
                        reason: format!(
                            "unknown source {other:?}; expected hostname, name or aliases"
                        ),
                    });
                }
            };
            set.insert(source);
        }
        Ok(Self(set))
    }
}

impl fmt::Display for NameSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for s in &self.0 {
            if !first {
                f.write_str(",")?;
            }
            f.write_str(s.as_str())?;
            first = false;
        }
        Ok(())
    }
}

/// How the updater waits between attempts to reach a daemon that went away:
/// `initial`, doubling after every failed attempt, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    /// A backoff from `initial` up to `max`; fails when either is zero or `max < initial`.
    pub fn new(initial: Duration, max: Duration) -> Result<Self> {
        if initial.is_zero() {
            return Err(Error::InvalidBackoff {
                reason: "the initial wait must be above zero".to_owned(),
            });
        }
        if max < initial {
            return Err(Error::InvalidBackoff {
                reason: format!("the cap {max:?} is below the initial wait {initial:?}"),
            });
        }
        Ok(Self { initial, max })
    }

    /// The wait after `failures` consecutive failed attempts (1 = the first failure).
    pub fn delay(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(20);
        self.initial
            .checked_mul(1u32 << shift)
            .map_or(self.max, |d| d.min(self.max))
    }
}

impl Default for Backoff {
    /// 200 ms doubling up to 10 s.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

/// A Docker Engine API version (`MAJOR.MINOR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// The major version (1 for every release so far).
    pub major: u16,
    /// The minor version.
    pub minor: u16,
}

impl ApiVersion {
    /// The oldest API version whose calls the updater needs: container list and
    /// inspect with `NetworkSettings.Networks` (aliases, IPv6), and the event stream
    /// with `type`/`event` filters, `Action`/`Actor` and `timeNano`. The integration
    /// tests run the updater pinned to it.
    pub const OLDEST: ApiVersion = ApiVersion {
        major: 1,
        minor: 24,
    };

    /// A version.
    pub const fn new(major: u16, minor: u16) -> Self {
        Self { major, minor }
    }
}

impl FromStr for ApiVersion {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidApiVersion {
            input: s.to_owned(),
        };
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let (major, minor) = t.split_once('.').ok_or_else(bad)?;
        Ok(Self {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Everything the Docker updater needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerConfig {
    /// The daemon's unix socket (`--docker-socket`).
    pub socket: PathBuf,
    /// Whether to run at all (`--docker`).
    pub mode: DockerMode,
    /// Where names come from (`--docker-names`).
    pub names: NameSources,
    /// Take addresses only from this network (`--docker-network`); every network when `None`.
    pub network: Option<String>,
    /// Waits between attempts to reach a daemon that went away.
    pub backoff: Backoff,
    /// Timeout of each request to the daemon, its answer's body included (the event
    /// stream itself has none). A reconnect attempt whose request is not answered
    /// within it fails and the next one follows the backoff.
    pub request_timeout: Duration,
    /// Use this API version instead of negotiating one with the daemon.
    pub api_version: Option<ApiVersion>,
}

impl DockerConfig {
    /// The defaults: socket from `DOCKER_HOST` (if `unix://`) or [`DEFAULT_SOCKET`],
    /// mode `auto`, names from the hostname, every network, default backoff.
    pub fn new() -> Self {
        Self::with_socket(default_socket(std::env::var("DOCKER_HOST").ok().as_deref()))
    }

    /// The defaults with an explicit socket.
    pub fn with_socket(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            mode: DockerMode::Auto,
            names: NameSources::default(),
            network: None,
            backoff: Backoff::default(),
            request_timeout: Duration::from_secs(30),
            api_version: None,
        }
    }
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The default socket for a `DOCKER_HOST` value: its path when it is `unix://PATH`,
/// [`DEFAULT_SOCKET`] otherwise (unset, empty, `tcp://…`: this updater only speaks
/// to a local socket).
pub fn default_socket(docker_host: Option<&str>) -> PathBuf {
    match docker_host.and_then(|h| h.trim().strip_prefix("unix://")) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => Path::new(DEFAULT_SOCKET).to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_reject_clearly() {
        assert_eq!("auto".parse::<DockerMode>().ok(), Some(DockerMode::Auto));
        assert_eq!(" ON ".parse::<DockerMode>().ok(), Some(DockerMode::On));
        assert_eq!("off".parse::<DockerMode>().ok(), Some(DockerMode::Off));
        let err = "yes".parse::<DockerMode>().err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("invalid Docker mode \"yes\": expected auto, on or off")
        );
    }

    #[test]
    fn name_sources_parse_any_subset() {
        let all: NameSources = "hostname,name,aliases".parse().unwrap();
        assert_eq!(all, NameSources::all());
        let two: NameSources = " aliases , Name ".parse().unwrap();
        assert!(two.contains(NameSource::Name) && two.contains(NameSource::Aliases));
        assert!(!two.contains(NameSource::Hostname));
        assert_eq!(two.to_string(), "name,aliases");
        assert_eq!(NameSources::default().to_string(), "hostname");
        let dup: NameSources = "name,name".parse().unwrap();
        assert_eq!(dup, NameSources::only(NameSource::Name));
    }

    #[test]
    fn name_sources_reject_unknown_and_empty() {
        let e = "hostname,labels"
            .parse::<NameSources>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"hostname,labels\"") && e.contains("\"labels\""),
            "{e}"
        );
        let e = "".parse::<NameSources>().unwrap_err().to_string();
        assert!(e.contains("empty entry"), "{e}");
        let e = "name,".parse::<NameSources>().unwrap_err().to_string();
        assert!(e.contains("empty entry"), "{e}");
    }

    #[test]
    fn default_socket_follows_unix_docker_host_only() {
        assert_eq!(default_socket(None), PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(
            default_socket(Some("unix:///run/user/1000/docker.sock")),
            PathBuf::from("/run/user/1000/docker.sock")
        );
        assert_eq!(
            default_socket(Some("tcp://10.0.0.1:2375")),
            PathBuf::from(DEFAULT_SOCKET)
        );
        assert_eq!(
            default_socket(Some("unix://")),
            PathBuf::from(DEFAULT_SOCKET)
        );
        assert_eq!(default_socket(Some("")), PathBuf::from(DEFAULT_SOCKET));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700)).unwrap();
        let waits: Vec<u128> = (1..=6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 700, 700, 700]);
        assert_eq!(b.delay(u32::MAX), Duration::from_millis(700));
        assert!(Backoff::new(Duration::ZERO, Duration::from_secs(1)).is_err());
        assert!(Backoff::new(Duration::from_secs(2), Duration::from_secs(1)).is_err());
    }

    #[test]
    fn api_versions_parse_and_order() {
        assert_eq!(
            "1.41".parse::<ApiVersion>().ok(),
            Some(ApiVersion::new(1, 41))
        );
        assert_eq!("v1.24".parse::<ApiVersion>().ok(), Some(ApiVersion::OLDEST));
        assert!("1".parse::<ApiVersion>().is_err());
        assert!("1.x".parse::<ApiVersion>().is_err());
        assert!(ApiVersion::new(1, 9) < ApiVersion::new(1, 41));
        assert_eq!(ApiVersion::new(1, 41).to_string(), "1.41");
    }
}
