//! How a cluster node is set up: [`ClusterConfig`], the failure detector's settings
//! and the cluster key file.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

use crate::datagram::Keyring;
use crate::error::{ClusterError, Result};

/// The default cluster id.
pub const DEFAULT_CLUSTER_ID: &str = "dwara";
/// The default gossip interval.
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
/// The default number of live peers a local change is pushed to at once: every peer
/// of a cluster of up to 17 nodes. A larger cluster's other nodes get the change
/// from the periodic gossip rounds, in a few rounds; pushing to all of them costs the
/// cluster an exchange per peer per change (growing with the square of its size)
/// and sends the pushing node one reply per peer at the same moment, more than a
/// default UDP receive buffer (208 KiB) holds from about 50 peers of a 100-node
/// cluster or 5 of a 1,000-node one (each reply carries the digest of every node).
pub const DEFAULT_PUSH_FANOUT: usize = 16;
/// The default time deletes are remembered (the database's `--tombstone-grace`).
pub const DEFAULT_TOMBSTONE_GRACE: Duration = Duration::from_secs(600);
/// Length of a cluster key in bytes.
pub const KEY_LEN: usize = 32;

/// The 32-byte secret every member of a closed cluster holds.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; KEY_LEN]);

impl ClusterKey {
    /// A key from its bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// A fresh random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; KEY_LEN];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// The key as standard base64 (what a key file holds).
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// A key from standard base64 of 32 bytes.
    pub fn from_base64(text: &str) -> std::result::Result<Self, KeyParseError> {
        let bytes = STANDARD.decode(text).map_err(KeyParseError::Base64)?;
        let len = bytes.len();
        let bytes: [u8; KEY_LEN] = bytes.try_into().map_err(|_| KeyParseError::Length(len))?;
        Ok(Self(bytes))
    }
}

/// Why a line of a key file is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyParseError {
    /// Not standard base64.
    #[error("not base64")]
    Base64(#[source] base64::DecodeError),
    /// Decodes to another length than [`KEY_LEN`].
    #[error("decodes to {0} bytes, a cluster key is 32")]
    Length(usize),
}

/// The most keys a key file may hold: every datagram that does not open is tried
/// against each.
pub const MAX_KEYS: usize = 16;

/// Parses the text of a key file into a keyring: one key per line (standard base64
/// of 32 bytes, as `dwara keygen` prints), the first sealing and all opening;
/// surrounding whitespace, blank lines and lines starting with `#` are ignored.
/// Errors name `path` and the line. Never panics.
pub fn parse_key_file(text: &str, path: &Path) -> Result<Keyring> {
    let mut keys = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = ClusterKey::from_base64(line).map_err(|source| ClusterError::KeyFile {
            path: path.to_owned(),
            line: index + 1,
            source,
        })?;
        if keys.len() == MAX_KEYS {
            return Err(ClusterError::KeyFileTooMany {
                path: path.to_owned(),
            });
        }
        keys.push(key);
    }
    let mut keys = keys.into_iter();
    let first = keys.next().ok_or_else(|| ClusterError::KeyFileEmpty {
        path: path.to_owned(),
    })?;
    Ok(Keyring::new(first, keys.collect()))
}

/// Reads and parses a key file ([`parse_key_file`]).
pub fn read_key_file(path: &Path) -> Result<Keyring> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::KeyFileRead {
        path: path.to_owned(),
        source,
    })?;
    parse_key_file(&text, path)
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

/// Logs a warning when the key file is readable by group or others.
#[cfg(unix)]
pub(crate) fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
            "cluster key file is readable by group or others; chmod 600 it"
        );
    }
}

/// Logs a warning when the key file is readable by group or others.
#[cfg(not(unix))]
pub(crate) fn warn_if_readable_by_others(_path: &Path) {}

/// A new random cluster key as base64, for `dwara keygen`.
pub fn generate_key() -> String {
    ClusterKey::generate().to_base64()
}

/// Where the cluster key comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// No key: the cluster runs open (anyone reaching the gossip port can add names).
    #[default]
    Open,
    /// A key file (`--gossip-key-file`, [`parse_key_file`]), read again on
    /// [`crate::KeyReloader::reload`].
    File(PathBuf),
    /// A key already in memory.
    Key(ClusterKey),
}

impl KeySource {
    /// Loads the keyring, if any.
    pub fn load(&self) -> Result<Option<Keyring>> {
        match self {
            KeySource::Open => Ok(None),
            KeySource::File(path) => read_key_file(path).map(Some),
            KeySource::Key(key) => Ok(Some(Keyring::new(key.clone(), Vec::new()))),
        }
    }
}

/// The phi-accrual failure detector's settings (chitchat's `FailureDetectorConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct FailureDetectorSettings {
    /// Phi above which a peer is declared dead. Default 8.
    pub phi_threshold: f64,
    /// Heartbeat intervals remembered per peer. Default 1000.
    pub sampling_window_size: usize,
    /// Heartbeat intervals longer than this are not sampled. Default 10 s.
    pub max_interval: Duration,
    /// How long a dead peer is remembered (its entries kept, hidden) before it is
    /// forgotten and its entries purged. Default 1 h.
    pub dead_node_grace: Duration,
}

impl Default for FailureDetectorSettings {
    fn default() -> Self {
        Self {
            phi_threshold: 8.0,
            sampling_window_size: 1000,
            max_interval: Duration::from_secs(10),
            dead_node_grace: Duration::from_secs(3600),
        }
    }
}

/// How a cluster node is set up.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id, unique in the cluster; also the origin of its entries, so it
    /// must equal the records database's origin.
    pub node_id: String,
    /// The UDP address gossip listens on.
    pub gossip_listen: SocketAddr,
    /// The address peers reach this node at (default: `gossip_listen`).
    pub gossip_advertise: Option<SocketAddr>,
    /// Seed peers: `ip:port` or `host:port` (resolved again every minute).
    pub peers: Vec<String>,
    /// Nodes only talk to nodes of the same cluster id.
    pub cluster_id: String,
    /// Time between periodic gossip rounds (local changes are pushed at once).
    pub gossip_interval: Duration,
    /// How many live peers, picked at random each time, a local change is pushed to
    /// at once; the others get it from the periodic rounds. `usize::MAX` pushes to
    /// every live peer, 0 to none. Default [`DEFAULT_PUSH_FANOUT`].
    pub push_fanout: usize,
    /// Failure detector settings.
    pub failure_detector: FailureDetectorSettings,
    /// How long a delete is remembered in gossip; use the database's tombstone grace.
    pub tombstone_grace: Duration,
    /// The cluster key.
    pub key: KeySource,
    /// This incarnation's generation; `None` picks a random one. A restart must use a
    /// new one, and should use a larger one: a peer prefers the live incarnation with
    /// the highest generation, so a random one may lose to the previous incarnation
    /// until that is declared dead. `dwara serve` passes the data dir's count of
    /// starts when it has one. No clock is read for it.
    pub generation_id: Option<u64>,
}

impl ClusterConfig {
    /// A configuration with the defaults for `node_id` listening on `gossip_listen`.
    pub fn new(node_id: impl Into<String>, gossip_listen: SocketAddr) -> Self {
        Self {
            node_id: node_id.into(),
            gossip_listen,
            gossip_advertise: None,
            peers: Vec::new(),
            cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            push_fanout: DEFAULT_PUSH_FANOUT,
            failure_detector: FailureDetectorSettings::default(),
            tombstone_grace: DEFAULT_TOMBSTONE_GRACE,
            key: KeySource::Open,
            generation_id: None,
        }
    }

    /// The advertised gossip address.
    pub fn advertise_addr(&self) -> SocketAddr {
        self.gossip_advertise.unwrap_or(self.gossip_listen)
    }

    /// Checks every setting and that the key (if any) loads. Errors name the setting
    /// or the key file.
    pub fn validate(&self) -> Result<()> {
        let invalid = |setting, reason: &str| {
            Err(ClusterError::InvalidSetting {
                setting,
                reason: reason.to_owned(),
            })
        };
        if self.node_id.is_empty() || self.node_id.len() > 255 {
            return invalid("node_id", "must be 1 to 255 bytes");
        }
        if self.cluster_id.is_empty() {
            return invalid("cluster_id", "must not be empty");
        }
        if self.gossip_interval.is_zero() {
            return invalid("gossip_interval", "must be positive");
        }
        if self.advertise_addr().ip().is_unspecified() {
            return invalid(
                "gossip_advertise",
                "must be a reachable address when gossip_listen is unspecified (0.0.0.0 or ::)",
            );
        }
        let fd = &self.failure_detector;
        if !(fd.phi_threshold.is_finite() && fd.phi_threshold > 0.0) {
            return invalid("phi_threshold", "must be a positive number");
        }
        if fd.sampling_window_size == 0 {
            return invalid("sampling_window_size", "must be positive");
        }
        if fd.max_interval < self.gossip_interval {
            return invalid("max_interval", "must be at least the gossip interval");
        }
        self.key.load()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:7946".parse().unwrap()
    }

    #[test]
    fn generated_key_round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let text = generate_key();
        std::fs::write(&path, format!("{text}\n")).unwrap();
        let ring = read_key_file(&path).unwrap();
        assert_eq!(ring.keys(), [ClusterKey::from_base64(&text).unwrap()]);
        assert_eq!(ring.ids(), read_key_file(&path).unwrap().ids());
        assert_ne!(ring.keys()[0], ClusterKey::generate());
    }

    #[test]
    fn a_key_file_holds_keys_one_per_line_first_seals() {
        let (a, b) = (ClusterKey::generate(), ClusterKey::generate());
        let text = format!(
            "# new key, seals\n  {}  \n\n# old key, still opens\n{}\n",
            a.to_base64(),
            b.to_base64()
        );
        let ring = parse_key_file(&text, Path::new("k")).unwrap();
        assert_eq!(ring.keys(), [a.clone(), b.clone()]);
        let ids = ring.ids();
        assert_eq!(ids.len(), 2);
        assert_ne!(ids[0], ids[1]);
        assert_eq!(ids[0].len(), 8);
        let many = format!("{}\n", a.to_base64()).repeat(MAX_KEYS);
        assert_eq!(
            parse_key_file(&many, Path::new("k")).unwrap().keys().len(),
            MAX_KEYS
        );
        assert!(matches!(
            parse_key_file(&format!("{many}{}", b.to_base64()), Path::new("k")),
            Err(ClusterError::KeyFileTooMany { .. })
        ));
    }

    #[test]
    fn key_file_errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let mut config = ClusterConfig::new("a", addr());
        config.key = KeySource::File(missing.clone());
        let err = config.validate().err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains(&missing.display().to_string())),
            "{err:?}"
        );

        let short = dir.path().join("short");
        std::fs::write(&short, STANDARD.encode([1u8; 16])).unwrap();
        config.key = KeySource::File(short);
        assert!(matches!(
            config.validate(),
            Err(ClusterError::KeyFile {
                line: 1,
                source: KeyParseError::Length(16),
                ..
            })
        ));

        let junk = dir.path().join("junk");
        let good = generate_key();
        std::fs::write(&junk, format!("{good}\n# fine\nnot base64 !!\n")).unwrap();
        config.key = KeySource::File(junk.clone());
        let err = config.validate();
        assert!(
            matches!(
                err,
                Err(ClusterError::KeyFile {
                    line: 3,
                    source: KeyParseError::Base64(_),
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(
            err.err()
                .map(|e| e.to_string())
                .is_some_and(|e| e.contains("line 3") && e.contains(&junk.display().to_string()))
        );

        for empty in ["", "\n\n", "# only a comment\n"] {
            assert!(matches!(
                parse_key_file(empty, Path::new("k")),
                Err(ClusterError::KeyFileEmpty { .. })
            ));
        }
    }

    #[test]
    fn validate_rejects_bad_settings() {
        let mut c = ClusterConfig::new("", addr());
        assert!(c.validate().is_err());
        c.node_id = "a".into();
        assert!(c.validate().is_ok());
        c.gossip_interval = Duration::ZERO;
        assert!(c.validate().is_err());
        c.gossip_interval = DEFAULT_GOSSIP_INTERVAL;
        c.gossip_listen = "0.0.0.0:7946".parse().unwrap();
        assert!(c.validate().is_err());
        c.gossip_advertise = Some(addr());
        assert!(c.validate().is_ok());
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let key = ClusterKey::from_bytes([7u8; KEY_LEN]);
        assert!(!format!("{key:?}").contains('7'));
    }
}
