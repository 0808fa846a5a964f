//! chitchat's [`Transport`] over UDP with every datagram sealed ([`crate::datagram`]).
//!
//! chitchat serialises its messages with crate-private code, so this transport lets
//! chitchat's own [`UdpSocket`] do it: each sealed socket holds one of chitchat's
//! sockets (the *codec*) and a relay socket connected to it, both on 127.0.0.1. To
//! send, the message goes through the codec to the relay, comes back as bytes, and
//! is sealed and sent from the gossip port; to receive, a datagram is opened and the
//! message inside goes from the relay to the codec, which decodes it. Loopback
//! delivery is done by the time the sending call returns, so each step waits for at
//! most one datagram ([`CODEC_WAIT`] bounds it). The relay only hears the codec (it
//! is connected), and the codec's answers count only when they come from the relay,
//! so another process on the host cannot slip an unsealed message in. The cost is
//! two loopback system calls per datagram each way; a network namespace must have
//! its loopback interface up.
//!
//! What does not open is dropped and counted by reason
//! (`dwara_cluster_rejected_datagrams_total{reason}`); the first rejection of each
//! [`crate::SUMMARY_EVERY`] is logged with its sender, and the engine's summary line
//! reports the rest.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket};
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::config::KeySource;
use crate::datagram::{Keyring, MAX_DATAGRAM, Opener, Rejection, Sealer};
use crate::metrics::{Metrics, ReasonLabel, ResultLabel};

/// How long a message may take through the codec socket over loopback before it is
/// given up (chitchat drops a message it cannot decode without a word).
pub const CODEC_WAIT: Duration = Duration::from_secs(1);

/// What every sealed socket of one cluster node shares: the keyring (swapped on
/// reload), the cluster id and the counters.
#[derive(Debug)]
pub(crate) struct Seal {
    cluster_id: String,
    keyring: RwLock<Arc<Keyring>>,
    /// Where the keyring is read again from on reload.
    source: KeySource,
    pub(crate) rejected: Family<ReasonLabel, Counter>,
    pub(crate) sealed: Counter,
    pub(crate) opened: Counter,
    pub(crate) split: Counter,
    keys: Gauge,
    reloads: Family<ResultLabel, Counter>,
}

impl Seal {
    /// A seal counting into `metrics`' datagram counters.
    pub(crate) fn new(
        cluster_id: String,
        keyring: Keyring,
        source: KeySource,
        metrics: &Metrics,
    ) -> Self {
        let keys = metrics.gossip_keys.clone();
        keys.set(i64::try_from(keyring.keys().len()).unwrap_or(i64::MAX));
        Self {
            cluster_id,
            keyring: RwLock::new(Arc::new(keyring)),
            source,
            rejected: metrics.rejected_datagrams.clone(),
            sealed: metrics.sealed_datagrams.clone(),
            opened: metrics.opened_datagrams.clone(),
            split: metrics.split_messages.clone(),
            keys,
            reloads: metrics.key_reloads.clone(),
        }
    }

    pub(crate) fn keyring(&self) -> Arc<Keyring> {
        self.keyring.read().clone()
    }

    /// Reads the key file again and swaps the keyring; on error the previous one
    /// stays. Logs and counts either way.
    fn reload(&self, path: &std::path::Path) -> crate::Result<Vec<String>> {
        crate::config::warn_if_readable_by_others(path);
        match crate::config::read_key_file(path) {
            Ok(ring) => {
                let ids = ring.ids();
                self.keys.set(i64::try_from(ids.len()).unwrap_or(i64::MAX));
                *self.keyring.write() = Arc::new(ring);
                self.reloads
                    .get_or_create(&ResultLabel { result: "ok" })
                    .inc();
                tracing::info!(
                    path = %path.display(),
                    keys = ?ids,
                    "gossip keyring reloaded: the first key seals, every key opens"
                );
                Ok(ids)
            }
            Err(err) => {
                self.reloads
                    .get_or_create(&ResultLabel { result: "error" })
                    .inc();
                tracing::warn!(
                    error = %err,
                    path = %path.display(),
                    keys = ?self.keyring().ids(),
                    "gossip key file not reloaded; the previous keyring stays"
                );
                Err(err)
            }
        }
    }

    pub(crate) fn reject(&self, why: Rejection) {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: why.reason(),
            })
            .inc();
    }

    pub(crate) fn rejected(&self, why: Rejection) -> u64 {
        self.rejected
            .get_or_create(&ReasonLabel {
                reason: why.reason(),
            })
            .get()
    }
}

/// Reads a node's key file again ([`crate::Cluster::key_reloader`]); cheap to clone.
#[derive(Debug, Clone)]
pub struct KeyReloader {
    seal: Arc<Seal>,
    path: std::path::PathBuf,
}

impl KeyReloader {
    pub(crate) fn new(seal: Arc<Seal>) -> Option<Self> {
        match &seal.source {
            KeySource::File(path) => Some(Self {
                path: path.clone(),
                seal: seal.clone(),
            }),
            _ => None,
        }
    }

    /// Reads the key file again: on success the new keyring seals and opens from the
    /// next datagram on, and the key ids (first seals) are returned; on error
    /// (unreadable, a bad line, no key) the previous keyring stays. Both are logged
    /// and counted (`dwara_cluster_key_reloads_total{result}`).
    pub fn reload(&self) -> crate::Result<Vec<String>> {
        self.seal.reload(&self.path)
    }

    /// The key ids of the keyring in use, the sealing one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.seal.keyring().ids()
    }
}

/// chitchat's transport with every datagram sealed under a keyring (what
/// [`crate::Cluster::start`] uses with a key; public for benchmarks and simulations).
#[derive(Debug, Clone)]
pub struct SealedTransport {
    seal: Arc<Seal>,
}

impl SealedTransport {
    /// A transport sealing for `cluster_id` under `keyring`, with counters of its own.
    pub fn new(cluster_id: impl Into<String>, keyring: Keyring) -> Self {
        let metrics = Metrics::default();
        let source = KeySource::Key(keyring.keys()[0].clone());
        Self::with_seal(Arc::new(Seal::new(
            cluster_id.into(),
            keyring,
            source,
            &metrics,
        )))
    }

    pub(crate) fn with_seal(seal: Arc<Seal>) -> Self {
        Self { seal }
    }

    /// Datagrams rejected so far for `why`.
    pub fn rejected(&self, why: Rejection) -> u64 {
        self.seal.rejected(why)
    }
}

#[async_trait]
impl Transport for SealedTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let outer = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .with_context(|| format!("failed to bind to {listen_addr}/UDP for gossip"))?;
        let loopback: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
        let codec = UdpSocket::open(loopback)
            .await
            .context("cannot bind the gossip codec socket on 127.0.0.1 (is loopback up?)")?;
        let codec_addr = codec.local_addr()?;
        let relay = tokio::net::UdpSocket::bind(loopback)
            .await
            .context("cannot bind the gossip relay socket on 127.0.0.1")?;
        relay
            .connect(codec_addr)
            .await
            .context("cannot connect the gossip relay socket")?;
        let relay_addr = relay.local_addr()?;
        Ok(Box::new(SealedSocket {
            outer,
            codec,
            relay,
            relay_addr,
            seal: self.seal.clone(),
            sealer: Sealer::new(rand::random()),
            opener: Opener::new(),
            pending: VecDeque::new(),
            deadline: None,
            relay_stale: false,
            buf: vec![0u8; MAX_DATAGRAM + 1].into_boxed_slice(),
            parts: Vec::new(),
            last_warning: None,
        }))
    }
}

struct SealedSocket {
    /// The gossip port.
    outer: tokio::net::UdpSocket,
    /// chitchat's socket, which serialises and decodes messages.
    codec: UdpSocket,
    /// Connected to the codec.
    relay: tokio::net::UdpSocket,
    relay_addr: SocketAddr,
    seal: Arc<Seal>,
    sealer: Sealer,
    opener: Opener,
    /// Senders of the messages handed to the codec to decode, oldest first, and when
    /// the oldest is given up (chitchat cancels `recv` every gossip round, so the wait
    /// must outlive one call).
    pending: VecDeque<SocketAddr>,
    deadline: Option<tokio::time::Instant>,
    /// An encoding may still be on its way to the relay after a timeout.
    relay_stale: bool,
    buf: Box<[u8]>,
    parts: Vec<Vec<u8>>,
    last_warning: Option<tokio::time::Instant>,
}

fn is_transient(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::OutOfMemory
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionRefused
    )
}

impl SealedSocket {
    fn rejected(&mut self, from: SocketAddr, why: Rejection, len: usize) {
        self.seal.reject(why);
        let now = tokio::time::Instant::now();
        // Rate limiting of a log line only; nothing is decided on this time.
        if self
            .last_warning
            .is_none_or(|at| now.duration_since(at) >= crate::invalid::SUMMARY_EVERY)
        {
            self.last_warning = Some(now);
            tracing::warn!(
                from = %from,
                reason = why.reason(),
                len,
                every_s = crate::invalid::SUMMARY_EVERY.as_secs(),
                "gossip datagram rejected (a node without this cluster's key, or not gossip); further rejections are counted and summarised"
            );
        }
    }

    /// Waits for the codec to decode the oldest pending message.
    async fn decoded(&mut self) -> anyhow::Result<Option<RecvOutcome>> {
        loop {
            let Some(&from) = self.pending.front() else {
                return Ok(None);
            };
            let deadline = *self
                .deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + CODEC_WAIT);
            match tokio::time::timeout_at(deadline, self.codec.recv()).await {
                Ok(Ok(outcome)) if outcome.from_addr == self.relay_addr => {
                    self.pending.pop_front();
                    self.deadline = None;
                    return Ok(Some(RecvOutcome {
                        from_addr: from,
                        envelope: outcome.envelope,
                        num_bytes_received: outcome.num_bytes_received,
                    }));
                }
                // Not from the relay: another process on this host. Ignored.
                Ok(Ok(outcome)) => {
                    tracing::debug!(from = %outcome.from_addr, "message on the gossip codec socket not from its relay ignored");
                }
                Ok(Err(err)) => return Err(err),
                Err(_) => {
                    // chitchat could not decode what opened (it logs and drops such
                    // datagrams): from a key holder, so a bug, not an attack.
                    self.pending.clear();
                    self.deadline = None;
                    self.rejected(from, Rejection::Undecodable, 0);
                    // A late answer must not be taken for the next message's.
                    while let Ok(Ok(late)) =
                        tokio::time::timeout(Duration::ZERO, self.codec.recv()).await
                    {
                        tracing::debug!(from = %late.from_addr, "late message of the gossip codec dropped");
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Socket for SealedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.outer
            .local_addr()
            .context("failed to get UDP socket address")
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        if self.relay_stale {
            while self.relay.try_recv(&mut self.buf).is_ok() {}
            self.relay_stale = false;
        }
        self.codec.send(self.relay_addr, envelope).await?;
        let len = match tokio::time::timeout(CODEC_WAIT, self.relay.recv(&mut self.buf)).await {
            Ok(len) => len.context("gossip relay socket failed")?,
            Err(_) => {
                self.relay_stale = true;
                anyhow::bail!("chitchat's encoding of a message did not reach the relay socket");
            }
        };
        let ring = self.seal.keyring();
        self.parts.clear();
        self.sealer.seal(
            &ring,
            &self.seal.cluster_id,
            &self.buf[..len],
            &mut self.parts,
        )?;
        if self.parts.len() > 1 {
            self.seal.split.inc();
        }
        let mut num_bytes_sent = 0;
        for part in &self.parts {
            num_bytes_sent += self
                .outer
                .send_to(part, to)
                .await
                .context("failed to send chitchat message to peer")?;
            self.seal.sealed.inc();
        }
        Ok(SendOutcome { num_bytes_sent })
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            if let Some(outcome) = self.decoded().await? {
                return Ok(outcome);
            }
            let (len, from) = match self.outer.recv_from(&mut self.buf).await {
                Ok(got) => got,
                Err(err) if is_transient(&err) => {
                    tracing::warn!(error = %err, "transient UDP recv error");
                    continue;
                }
                Err(err) => return Err(err).context("fatal UDP recv error"),
            };
            let ring = self.seal.keyring();
            match self
                .opener
                .open(&ring, &self.seal.cluster_id, &self.buf[..len])
            {
                Ok(Some(message)) => {
                    self.seal.opened.inc();
                    self.relay
                        .send(&message)
                        .await
                        .context("gossip relay socket failed")?;
                    self.pending.push_back(from);
                }
                Ok(None) => {
                    self.seal.opened.inc();
                }
                Err(why) => self.rejected(from, why, len),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterKey;
    use crate::datagram::MAX_PART;

    /// A chitchat SYN of exactly `len` bytes (protocol V0, empty digest): the cluster
    /// id is the one field chitchat writes as is, so its length sets the message's.
    fn syn_bytes(len: usize) -> Vec<u8> {
        let id_len = len - 8;
        let mut bytes = vec![0x53, 0xb0, 0, 0, 0, 0];
        bytes.extend_from_slice(&u16::try_from(id_len).unwrap().to_le_bytes());
        bytes.resize(len, b'c');
        bytes
    }

    /// The envelope chitchat decodes from `bytes` (its decoding is not public).
    async fn decode(bytes: &[u8]) -> ChitchatEnvelope {
        let mut codec = UdpSocket::open((Ipv4Addr::LOCALHOST, 0).into())
            .await
            .unwrap();
        let raw = tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        raw.send_to(bytes, codec.local_addr().unwrap())
            .await
            .unwrap();
        codec.recv().await.unwrap().envelope
    }

    /// chitchat fills a message up to the UDP limit; sealed, the largest ones go as
    /// two datagrams that each fit, and arrive whole.
    #[tokio::test]
    async fn messages_up_to_the_udp_limit_arrive_whole() {
        let metrics = Metrics::default();
        let key = ClusterKey::generate();
        let seal = Arc::new(Seal::new(
            "c".repeat(8),
            Keyring::new(key.clone(), Vec::new()),
            KeySource::Key(key),
            &metrics,
        ));
        let transport = SealedTransport::with_seal(seal.clone());
        let mut a = transport
            .open((Ipv4Addr::LOCALHOST, 0).into())
            .await
            .unwrap();
        let mut b = transport
            .open((Ipv4Addr::LOCALHOST, 0).into())
            .await
            .unwrap();
        let b_addr = b.local_addr().unwrap();
        let mut splits = 0;
        for len in [100, MAX_PART, MAX_PART + 1, MAX_DATAGRAM] {
            let bytes = syn_bytes(len);
            let sent = a.send(b_addr, decode(&bytes).await).await.unwrap();
            let got = b.recv().await.unwrap();
            assert_eq!(got.envelope, decode(&bytes).await, "{len}");
            assert_eq!(got.num_bytes_received, len);
            assert_eq!(got.from_addr, a.local_addr().unwrap());
            if len > MAX_PART {
                splits += 1;
                assert_eq!(sent.num_bytes_sent, len + 2 * crate::datagram::OVERHEAD);
            } else {
                assert_eq!(sent.num_bytes_sent, len + crate::datagram::OVERHEAD);
            }
            assert_eq!(metrics.split_messages.get(), splits, "{len}");
        }
        let rejected: u64 = Rejection::ALL.iter().map(|w| seal.rejected(*w)).sum();
        assert_eq!(rejected, 0);
        assert_eq!(metrics.opened_datagrams.get(), 6);
    }
}
