//! The harness: engine check, image, container guard, in-process DNS queries, the
//! socket proxy the reconnect tests cut and restore.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dwara_docker::{Backoff, DockerConfig, DockerMode, DockerUpdater, Started};
use dwara_nameserver::QueryHandler;
use dwara_records::{Db, DbConfig, Domain};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use test_support::docker::{Scope, busybox_image, engine_reachable};

/// The locally built test image.
pub(crate) use test_support::docker::BUSYBOX_IMAGE as IMAGE;
pub(crate) use test_support::docker::{docker, docker_async};
/// The real daemon socket.
pub(crate) const SOCKET: &str = "/var/run/docker.sock";

/// One test's view of the engine: its containers and networks (removed on drop),
/// its database.
pub(crate) struct Harness {
    scope: Scope,
    pub(crate) db: Arc<Db>,
}

impl Harness {
    /// `None` (after printing why) when no Docker engine is reachable.
    pub(crate) fn new(test: &str) -> Option<Self> {
        test_support::init_tracing();
        if !test_support::require(&format!("a Docker engine for {test}"), engine_reachable()) {
            return None;
        }
        busybox_image().expect("build the test image");
        Some(Self {
            scope: Scope::new(format!("dwt-{test}-{}", std::process::id())),
            db: new_db(),
        })
    }

    /// The full name of this test's container `name`.
    pub(crate) fn name(&self, name: &str) -> String {
        self.scope.name(name)
    }

    /// `docker run -d --name PREFIX-name ARGS… IMAGE CMD…`; the full container id.
    pub(crate) async fn run(&self, name: &str, args: &[&str], cmd: &[&str]) -> String {
        self.scope
            .run_async(name, args, IMAGE, cmd)
            .await
            .expect("docker run")
    }

    /// A container that sleeps, with hostname `host` in `weave.local`.
    pub(crate) async fn run_host(&self, name: &str, host: &str) -> String {
        self.run(
            name,
            &["--hostname", host, "--domainname", "weave.local"],
            &["sleep", "100000"],
        )
        .await
    }

    /// Creates a user-defined network named after the test.
    pub(crate) async fn network(&self, name: &str) -> String {
        self.scope
            .network_async(name)
            .await
            .expect("network create")
    }

    /// Starts an updater on the real socket with `tweak` applied to the config.
    pub(crate) async fn updater(&self, tweak: impl FnOnce(&mut DockerConfig)) -> DockerUpdater {
        start_updater(self.db.clone(), SOCKET, tweak).await
    }
}

/// A fresh records database for `weave.local`.
pub(crate) fn new_db() -> Arc<Db> {
    Arc::new(Db::new(DbConfig::new(Domain::new("weave.local").unwrap())))
}

/// Starts an updater (`on`, short backoff) on `socket`; panics if it does not run.
pub(crate) async fn start_updater(
    db: Arc<Db>,
    socket: impl Into<PathBuf>,
    tweak: impl FnOnce(&mut DockerConfig),
) -> DockerUpdater {
    let mut config = DockerConfig::with_socket(socket);
    config.mode = DockerMode::On;
    config.backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(400)).unwrap();
    tweak(&mut config);
    match DockerUpdater::start(config, db)
        .await
        .expect("updater starts")
    {
        Started::Running(u) => u,
        Started::Off(why) => panic!("updater is off: {why}"),
    }
}

/// The container's addresses as Docker reports them (every network).
pub(crate) async fn container_ips(id: &str) -> BTreeSet<IpAddr> {
    let out = docker_async(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.GlobalIPv6Address}} {{end}}",
        id,
    ])
    .await
    .unwrap_or_default();
    out.split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The addresses the database has for `fqdn`, as a set.
pub(crate) fn lookup(db: &Db, fqdn: &str) -> BTreeSet<IpAddr> {
    db.lookup(fqdn).into_iter().collect()
}

/// Live entries whose id is `id`.
pub(crate) fn entries_of(db: &Db, id: &str) -> usize {
    db.entries()
        .iter()
        .filter(|e| e.id == id && !e.tombstone)
        .count()
}

/// Waits up to `timeout` for `check`; the result is what the test asserts.
pub(crate) async fn wait(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    test_support::wait_until(timeout, || std::future::ready(check())).await
}

/// An A query answered by the name server's own packet handler: (rcode, addresses).
pub(crate) fn dns_a(db: &Db, fqdn: &str) -> (ResponseCode, Vec<Ipv4Addr>) {
    let mut m = Message::new(0x4242, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(fqdn).unwrap(), RecordType::A));
    let packet = m.to_vec().unwrap();
    let mut handler = QueryHandler::new(db);
    let answer = handler
        .answer_udp(&packet)
        .expect("an answer from the handler");
    let r = Message::from_vec(answer).unwrap();
    let ips = r
        .answers
        .iter()
        .filter_map(|a| match &a.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    (r.metadata.response_code, ips)
}

/// The updater's metrics in the text format.
pub(crate) fn metrics_text(updater: &DockerUpdater) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    updater.register_metrics(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

/// The value of the metric line starting with `series` (0 when absent).
pub(crate) fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// What the [`Proxy`] does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Every connection is spliced to the daemon.
    Pass,
    /// New connections are closed at once.
    Cut,
    /// New connections are accepted and never answered, nor closed (until the proxy
    /// is dropped).
    Silent,
    /// New connections are spliced, but only the head of the daemon's first answer
    /// is passed on: its body never comes, and the proxy never closes the connection
    /// (the client may).
    HeadOnly,
}

/// A unix-socket proxy to the real daemon that the test can cut (every connection
/// closed, new ones closed at once), stall (every connection closed, new ones held
/// unanswered: [`Mode::Silent`], [`Mode::HeadOnly`]) and restore. A held connection
/// stays held after a restore: only the client giving up (its timeout) frees it.
pub(crate) struct Proxy {
    pub(crate) path: PathBuf,
    mode: tokio::sync::watch::Sender<Mode>,
    held: tokio::sync::watch::Sender<usize>,
    /// In [`Mode::Pass`], a request whose bytes hold this text is not passed on and
    /// its connection is held (counted in `held`) until the client closes it.
    wedged: tokio::sync::watch::Sender<Option<String>>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (mode, watch) = tokio::sync::watch::channel(Mode::Pass);
        let held = tokio::sync::watch::Sender::new(0usize);
        let counter = held.clone();
        let wedged = tokio::sync::watch::Sender::new(None::<String>);
        let wedge = wedged.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let now = *watch.borrow();
                match now {
                    Mode::Cut => drop(client),
                    Mode::Silent => {
                        counter.send_modify(|n| *n += 1);
                        tokio::spawn(hold(client, watch.clone()));
                    }
                    Mode::Pass | Mode::HeadOnly => {
                        let wedged = wedge.borrow().clone();
                        tokio::spawn(splice(
                            client,
                            (now, wedged),
                            watch.clone(),
                            counter.clone(),
                        ));
                    }
                }
            }
        });
        Self {
            path,
            mode,
            held,
            wedged,
            _dir: dir,
            task,
        }
    }

    /// From now on, new connections hold every inspect of container `id` unanswered
    /// (a wedged container: the daemon answers everything else), until
    /// [`Proxy::unwedge`].
    pub(crate) fn wedge(&self, id: &str) {
        self.wedged
            .send_replace(Some(format!("/containers/{id}/json")));
    }

    pub(crate) fn unwedge(&self) {
        self.wedged.send_replace(None);
    }

    pub(crate) fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    /// From now on, new connections are held as `mode` says.
    pub(crate) fn stall(&self, mode: Mode) {
        assert!(matches!(mode, Mode::Silent | Mode::HeadOnly));
        self.mode.send_replace(mode);
    }

    pub(crate) fn restore(&self) {
        self.mode.send_replace(Mode::Pass);
    }

    /// Waits up to `timeout` until at least `n` connections have been held.
    pub(crate) async fn held_at_least(&self, n: usize, timeout: Duration) -> bool {
        let mut held = self.held.subscribe();
        tokio::time::timeout(timeout, held.wait_for(|h| *h >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Keeps `conn` open, unanswered, until the proxy is dropped.
async fn hold<T>(conn: T, mut watch: tokio::sync::watch::Receiver<Mode>) {
    while watch.changed().await.is_ok() {}
    drop(conn);
}

/// Splices `client` to the daemon until the proxy leaves [`Mode::Pass`] (then both
/// are closed). In [`Mode::HeadOnly`], passes the request on and only the head of
/// the daemon's answer back, counts the connection as held, and keeps it open until
/// the client closes it. With `wedged`, a request holding that text is not passed
/// on: the connection is counted as held and kept open until the client closes it.
async fn splice(
    mut client: tokio::net::UnixStream,
    (mode, wedged): (Mode, Option<String>),
    mut watch: tokio::sync::watch::Receiver<Mode>,
    held: tokio::sync::watch::Sender<usize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut daemon) = tokio::net::UnixStream::connect(SOCKET).await else {
        return;
    };
    if let (Mode::Pass, Some(needle)) = (mode, wedged) {
        let (mut client_read, mut client_write) = client.into_split();
        let (mut daemon_read, mut daemon_write) = daemon.into_split();
        let up = async {
            let mut buf = [0u8; 8192];
            loop {
                let n = client_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                if buf[..n]
                    .windows(needle.len())
                    .any(|w| w == needle.as_bytes())
                {
                    held.send_modify(|h| *h += 1);
                    // Read (and drop) until the client gives up and closes.
                    while client_read.read(&mut buf).await? > 0 {}
                    return Ok(());
                }
                daemon_write.write_all(&buf[..n]).await?;
            }
        };
        tokio::select! {
            _ = up => {}
            _ = tokio::io::copy(&mut daemon_read, &mut client_write) => {}
            _ = watch.wait_for(|m| *m != Mode::Pass) => {}
        }
        return;
    }
    if mode == Mode::Pass {
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut daemon) => {}
            _ = watch.wait_for(|m| *m != Mode::Pass) => {}
        }
        return;
    }
    let run = async {
        let (mut up, mut down) = ([0u8; 4096], [0u8; 4096]);
        let mut answer: Vec<u8> = Vec::new();
        let mut headed = false;
        loop {
            tokio::select! {
                n = client.read(&mut up) => {
                    let n = n?;
                    if n == 0 {
                        return Ok::<_, std::io::Error>(());
                    }
                    daemon.write_all(&up[..n]).await?;
                }
                n = daemon.read(&mut down), if !headed => {
                    let n = n?;
                    if n == 0 {
                        return Ok(());
                    }
                    answer.extend_from_slice(&down[..n]);
                    if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
                        client.write_all(&answer[..end + 4]).await?;
                        headed = true;
                        held.send_modify(|h| *h += 1);
                    }
                }
            }
        }
    };
    let _ = run.await;
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
