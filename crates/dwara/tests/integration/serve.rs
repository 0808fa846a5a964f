//! `dwara serve` with upstreams: real processes, real DNS (dnsmasq and the
//! in-process test server, and a server that lies), TCP echo backends on 127.0.0.x.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use test_support::dns_server::TestDnsServer;
use test_support::dnsmasq::{Dnsmasq, DnsmasqOptions};
use test_support::signal;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// TCP echo servers on 127.0.0.2.. sharing one port; each greets with its IP.
pub(crate) struct Backends {
    pub(crate) port: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Backends {
    pub(crate) async fn start(ips: &[&str]) -> Self {
        'retry: loop {
            let first = TcpListener::bind((ips[0].parse::<IpAddr>().unwrap(), 0))
                .await
                .unwrap();
            let port = first.local_addr().unwrap().port();
            let mut listeners = vec![first];
            for ip in &ips[1..] {
                match TcpListener::bind((ip.parse::<IpAddr>().unwrap(), port)).await {
                    Ok(l) => listeners.push(l),
                    Err(_) => continue 'retry,
                }
            }
            let tasks = listeners
                .into_iter()
                .map(|l| tokio::spawn(echo(l)))
                .collect();
            return Self { port, tasks };
        }
    }
}

impl Drop for Backends {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn echo(listener: TcpListener) {
    let me = listener.local_addr().unwrap().ip().to_string();
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            return;
        };
        let me = me.clone();
        tokio::spawn(async move {
            if sock.write_all(format!("{me}\n").as_bytes()).await.is_err() {
                return;
            }
            let mut buf = [0u8; 1024];
            loop {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if sock.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// A client connection through the proxy: the greeting names the backend.
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
    pub(crate) backend: String,
}

impl Conn {
    /// Connects through `proxy`; `None` when the proxy closed the connection without
    /// a backend (no endpoints).
    pub(crate) async fn open(proxy: SocketAddr) -> Option<Self> {
        let stream = TcpStream::connect(proxy).await.ok()?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, reader.read_line(&mut line))
            .await
            .ok()?
            .ok()?;
        (n > 0).then(|| Self {
            reader,
            backend: line.trim().to_owned(),
        })
    }

    async fn echo(&mut self, msg: &str) -> String {
        self.reader
            .get_mut()
            .write_all(msg.as_bytes())
            .await
            .unwrap();
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(WAIT, self.reader.read_exact(&mut buf))
            .await
            .expect("echo timed out")
            .expect("echo failed");
        String::from_utf8(buf).unwrap()
    }
}

async fn backends_seen(proxy: SocketAddr, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..n {
        if let Some(c) = Conn::open(proxy).await {
            seen.push(c.backend);
        }
    }
    seen.sort();
    seen.dedup();
    seen
}

/// One request to a `dwara serve` HTTP listener: (status, body).
pub(crate) async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    test_support::http::request_async(addr, method, path, None).await
}

pub(crate) struct Serve {
    child: Child,
    pub(crate) http: SocketAddr,
    config: PathBuf,
    _dir: tempfile::TempDir,
}

impl Serve {
    pub(crate) fn spawn(config_yaml: &str) -> Self {
        Self::spawn_with(config_yaml, &[])
    }

    /// [`Serve::spawn`] logging at `filter` (a `DWARA_LOG` value), and its stderr
    /// line by line.
    pub(crate) fn spawn_logging(
        config_yaml: &str,
        filter: &str,
    ) -> (
        Self,
        tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    ) {
        let mut serve = Self::start(config_yaml, &[], Some(filter));
        let stderr = serve.child.stderr.take().unwrap();
        (serve, BufReader::new(stderr).lines())
    }

    /// `dwara serve` with `extra` flags (`--docker off` unless they name `--docker`).
    pub(crate) fn spawn_with(config_yaml: &str, extra: &[&str]) -> Self {
        Self::start(config_yaml, extra, None)
    }

    /// [`Serve::spawn_with`], its stderr piped at `log` when there is one.
    fn start(config_yaml: &str, extra: &[&str], log: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("dwara.yaml");
        std::fs::write(&config, config_yaml).unwrap();
        let http = test_support::free_addr();
        let docker_off: &[&str] = if extra.contains(&"--docker") {
            &[]
        } else {
            &["--docker", "off"]
        };
        let child = Command::new(env!("CARGO_BIN_EXE_dwara"))
            .arg("serve")
            .args(docker_off)
            .args([
                "--config",
                config.to_str().unwrap(),
                "--http-listen",
                &http.to_string(),
                "--drain-timeout",
                "5",
            ])
            .args(extra)
            // `DWARA_TEST_LOG=debug cargo test …` shows what the process logged.
            .env(
                "DWARA_LOG",
                log.map_or_else(
                    || std::env::var("DWARA_TEST_LOG").unwrap_or_else(|_| "warn".into()),
                    str::to_owned,
                ),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if log.is_some() {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            child,
            http,
            config,
            _dir: dir,
        }
    }

    pub(crate) async fn status(&self) -> serde_json::Value {
        let (code, body) = http(self.http, "GET", "/upstreams").await;
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// Endpoints of upstream 0, once the HTTP API answers.
    pub(crate) async fn endpoints(&self) -> Vec<String> {
        let v = self.status().await;
        v["upstreams"][0]["endpoints"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| e["addr"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(crate) async fn wait_endpoints(&self, want: &[String]) {
        let ok = test_support::wait_until(WAIT, || async {
            TcpStream::connect(self.http).await.is_ok() && self.endpoints().await == want
        })
        .await;
        assert!(
            ok,
            "endpoints stayed {:?}, wanted {want:?}",
            self.endpoints().await
        );
    }

    pub(crate) fn signal(&self, name: &str) {
        signal(self.child.id().unwrap(), name).unwrap();
    }

    fn rewrite(&self, yaml: &str) {
        std::fs::write(&self.config, yaml).unwrap();
    }
}

fn config(listen: SocketAddr, host: &str, port: u16, ns: SocketAddr, fail_open: bool) -> String {
    format!(
        "upstreams:
  - name: api
    listen: {listen}
    policy: round_robin
    connect_timeout_ms: 500
    dns_discovery:
      hostname: {host}
      port: {port}
      refresh_interval_s: 1
      fail_open: {fail_open}
      nameservers: [{ns}]
"
    )
}

/// A dnsmasq serving `hosts` with TTL 1.
fn dnsmasq(hosts: &str) -> Dnsmasq {
    Dnsmasq::start(DnsmasqOptions {
        hosts: hosts.into(),
        local_ttl: Some(1),
        extra_args: vec![],
    })
    .unwrap()
}

pub(crate) fn eps(port: u16, ips: &[&str]) -> Vec<String> {
    ips.iter().map(|ip| format!("{ip}:{port}")).collect()
}

#[tokio::test]
async fn traffic_follows_dns_adds_and_removals_and_old_connections_survive() {
    let backends = Backends::start(&["127.0.0.2", "127.0.0.3", "127.0.0.4"]).await;
    let mut dnsmasq = dnsmasq("127.0.0.2 api.test\n127.0.0.3 api.test\n");
    let proxy = test_support::free_addr();
    let serve = Serve::spawn(&config(
        proxy,
        "api.test",
        backends.port,
        dnsmasq.addr(),
        true,
    ));
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2", "127.0.0.3"]))
        .await;

    // Spread over both.
    assert_eq!(
        backends_seen(proxy, 10).await,
        vec!["127.0.0.2", "127.0.0.3"]
    );

    // Scale up: a new backend gets connections without a restart.
    dnsmasq
        .set_hosts("127.0.0.2 api.test\n127.0.0.3 api.test\n127.0.0.4 api.test\n")
        .unwrap();
    serve
        .wait_endpoints(&eps(
            backends.port,
            &["127.0.0.2", "127.0.0.3", "127.0.0.4"],
        ))
        .await;
    assert_eq!(
        backends_seen(proxy, 12).await,
        vec!["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    );

    // Scale down with a long-lived connection to the leaving backend.
    let mut long = loop {
        let c = Conn::open(proxy).await.unwrap();
        if c.backend == "127.0.0.2" {
            break c;
        }
    };
    dnsmasq
        .set_hosts("127.0.0.3 api.test\n127.0.0.4 api.test\n")
        .unwrap();
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.3", "127.0.0.4"]))
        .await;
    assert_eq!(
        backends_seen(proxy, 12).await,
        vec!["127.0.0.3", "127.0.0.4"]
    );
    assert_eq!(long.echo("still here").await, "still here");
    let status = serve.status().await;
    assert_eq!(status["upstreams"][0]["draining"], 1, "{status}");

    // Metrics saw it all.
    let (code, metrics) = http(serve.http, "GET", "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("dwara_upstream_connections_total{upstream=\"api\"}"),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "dwara_upstream_picks_total{{upstream=\"api\",endpoint=\"127.0.0.4:{}\"}}",
        backends.port
    )));
    drop(long);
}

#[tokio::test]
async fn fail_closed_refuses_while_dns_is_down_and_recovers() {
    let backends = Backends::start(&["127.0.0.2"]).await;
    let mut dnsmasq = dnsmasq("127.0.0.2 api.test\n");
    let proxy = test_support::free_addr();
    let serve = Serve::spawn(&config(
        proxy,
        "api.test",
        backends.port,
        dnsmasq.addr(),
        false,
    ));
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert!(Conn::open(proxy).await.is_some());

    dnsmasq.stop().unwrap();
    serve.wait_endpoints(&[]).await;
    assert!(
        Conn::open(proxy).await.is_none(),
        "a connection got through with no endpoints"
    );
    let status = serve.status().await;
    assert!(
        status["upstreams"][0]["connections"]["no_endpoints"]
            .as_u64()
            .unwrap()
            >= 1
    );
    assert_eq!(
        status["upstreams"][0]["resolutions"]["cleared"], 1,
        "{status}"
    );
    assert!(
        status["upstreams"][0]["last_resolution"]["error"].is_string(),
        "{status}"
    );

    dnsmasq.restart().unwrap();
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.2");
}

#[tokio::test]
async fn sighup_moves_traffic_to_a_new_name_and_a_broken_file_changes_nothing() {
    let backends = Backends::start(&["127.0.0.2", "127.0.0.3"]).await;
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("old.test.", &["127.0.0.2".parse().unwrap()], 1);
    dns.set_a("new.test.", &["127.0.0.3".parse().unwrap()], 1);
    let proxy = test_support::free_addr();
    let serve = Serve::spawn(&config(proxy, "old.test", backends.port, dns.addr(), true));
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    let mut long = Conn::open(proxy).await.unwrap();
    assert_eq!(long.backend, "127.0.0.2");
    assert_eq!(serve.status().await["generation"], 1);

    serve.rewrite(&config(proxy, "new.test", backends.port, dns.addr(), true));
    serve.signal("HUP");
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.3"]))
        .await;
    assert_eq!(serve.status().await["generation"], 2);
    assert_eq!(backends_seen(proxy, 6).await, vec!["127.0.0.3"]);
    // The listener kept its socket and the old connection was not cut.
    assert_eq!(long.echo("across a reload").await, "across a reload");
    // The old name is not asked again.
    let old = dns.query_count_for("old.test.");
    let new = dns.query_count_for("new.test.");
    assert!(
        test_support::wait_until(WAIT, || async {
            dns.query_count_for("new.test.") >= new + 2
        })
        .await
    );
    assert_eq!(dns.query_count_for("old.test."), old);

    // A broken file: rejected, nothing changes, the process keeps serving.
    serve.rewrite("upstreams:\n  - name: api\n    listen: [oops\n");
    serve.signal("HUP");
    let (code, body) = http(serve.http, "POST", "/reload").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("config file"), "{body}");
    assert_eq!(serve.status().await["generation"], 2);
    assert_eq!(backends_seen(proxy, 4).await, vec!["127.0.0.3"]);

    // A good file through POST /reload.
    serve.rewrite(&config(proxy, "old.test", backends.port, dns.addr(), true));
    let (code, body) = http(serve.http, "POST", "/reload").await;
    assert_eq!(code, 200, "{body}");
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert_eq!(serve.status().await["generation"], 3);
}

fn worker_accepted(status: &serde_json::Value) -> Vec<u64> {
    status["l4_workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["accepted"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn l4_workers_share_every_listener_and_follow_a_reload() {
    let backends = Backends::start(&["127.0.0.2", "127.0.0.3"]).await;
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("old.test.", &["127.0.0.2".parse().unwrap()], 1);
    dns.set_a("new.test.", &["127.0.0.3".parse().unwrap()], 1);
    let proxy = test_support::free_addr();
    // The file asks for 3 workers.
    let file = |proxy, host| {
        format!(
            "l4_workers: 3\n{}",
            config(proxy, host, backends.port, dns.addr(), true)
        )
    };
    let serve = Serve::spawn(&file(proxy, "old.test"));
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert_eq!(backends_seen(proxy, 90).await, vec!["127.0.0.2"]);
    let before = worker_accepted(&serve.status().await);
    assert_eq!(before.len(), 3, "{before:?}");
    assert_eq!(before.iter().sum::<u64>(), 90, "{before:?}");
    assert!(
        before.iter().all(|n| *n > 0),
        "a worker accepted nothing: {before:?}"
    );

    serve.rewrite(&file(proxy, "new.test"));
    serve.signal("HUP");
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.3"]))
        .await;
    assert_eq!(backends_seen(proxy, 90).await, vec!["127.0.0.3"]);
    let after = worker_accepted(&serve.status().await);
    assert!(
        after.iter().zip(&before).all(|(a, b)| a > b),
        "a worker's socket stopped accepting across the reload: {before:?} -> {after:?}"
    );
    let (_, metrics) = http(serve.http, "GET", "/metrics").await;
    assert!(
        metrics.contains(&format!(
            "dwara_l4_worker_connections_total{{worker=\"2\"}} {}",
            after[2]
        )),
        "{metrics}"
    );

    // The flag wins over the file.
    let other = test_support::free_addr();
    let serve = Serve::spawn_with(&file(other, "old.test"), &["--l4-workers", "1"]);
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert_eq!(worker_accepted(&serve.status().await).len(), 1);
}

#[tokio::test]
async fn zero_l4_workers_is_refused_with_the_key_named() {
    let dns = TestDnsServer::start().await.unwrap();
    let yaml = config(test_support::free_addr(), "a.test", 80, dns.addr(), true);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dwara.yaml");
    std::fs::write(&path, format!("l4_workers: 0\n{yaml}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dwara"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("l4_workers: must be at least 1"),
        "{stderr}"
    );
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dwara"))
        .args([
            "serve",
            "--config",
            path.to_str().unwrap(),
            "--l4-workers",
            "0",
        ])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--l4-workers"), "{stderr}");
}

#[tokio::test]
async fn sigterm_stops_accepting_and_drains_open_connections() {
    let backends = Backends::start(&["127.0.0.2"]).await;
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("api.test.", &["127.0.0.2".parse().unwrap()], 1);
    let proxy = test_support::free_addr();
    let mut serve = Serve::spawn(&config(proxy, "api.test", backends.port, dns.addr(), true));
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    let mut open = Conn::open(proxy).await.unwrap();

    serve.signal("TERM");
    // The listener closes at once...
    assert!(
        test_support::wait_until(WAIT, || async { TcpStream::connect(proxy).await.is_err() }).await,
        "still accepting after SIGTERM"
    );
    // ...while the open connection still works during the drain.
    assert_eq!(open.echo("draining").await, "draining");
    drop(open);
    let status = tokio::time::timeout(WAIT, serve.child.wait())
        .await
        .expect("no exit")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn one_file_runs_both_halves_on_one_http_listener() {
    let backends = Backends::start(&["127.0.0.2"]).await;
    let dns_listen = test_support::free_addr();
    let proxy = test_support::free_addr();
    // The upstream follows a name the name server itself answers.
    let yaml = format!(
        "nameserver:
  domain: corp.local
  dns_listen: {dns_listen}
  ttl: 1
  fallback: [127.0.0.1:9]
upstreams:
  - name: web
    listen: {proxy}
    dns_discovery:
      hostname: web.corp.local
      port: {port}
      refresh_interval_s: 1
      nameservers: [{dns_listen}]
",
        port = backends.port
    );
    let serve = Serve::spawn(&yaml);
    assert!(
        test_support::wait_until(WAIT, || async {
            TcpStream::connect(serve.http).await.is_ok()
        })
        .await
    );
    // Register through the name server's API on the same listener as /upstreams.
    let (code, body) = http(serve.http, "PUT", "/name/c1/127.0.0.2?fqdn=web.corp.local").await;
    assert_eq!(code, 204, "{body}");
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.2");

    let answer = test_support::dig::Dig::new(dns_listen)
        .query("web.corp.local", "A")
        .unwrap();
    assert_eq!(answer.data("A"), vec!["127.0.0.2"]);
    let (_, metrics) = http(serve.http, "GET", "/metrics").await;
    assert!(metrics.contains("dwara_dns_queries_total"), "{metrics}");
    assert!(
        metrics.contains("dwara_upstream_connections_total{upstream=\"web\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_removed_upstream_stops_accepting_but_keeps_its_connections() {
    let backends = Backends::start(&["127.0.0.2"]).await;
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("api.test.", &["127.0.0.2".parse().unwrap()], 1);
    let (keep, gone) = (test_support::free_addr(), test_support::free_addr());
    let two = format!(
        "{}{}",
        config(keep, "api.test", backends.port, dns.addr(), true),
        config(gone, "api.test", backends.port, dns.addr(), true)
            .replace("upstreams:\n", "")
            .replace("- name: api", "- name: other")
    );
    let serve = Serve::spawn(&two);
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2"]))
        .await;
    assert!(test_support::wait_until(WAIT, || async { Conn::open(gone).await.is_some() }).await);
    let mut open = Conn::open(gone).await.unwrap();

    serve.rewrite(&config(keep, "api.test", backends.port, dns.addr(), true));
    let (code, body) = http(serve.http, "POST", "/reload").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serve.status().await["upstreams"].as_array().unwrap().len(),
        1
    );
    assert!(
        TcpStream::connect(gone).await.is_err(),
        "removed upstream still accepts"
    );
    assert!(Conn::open(keep).await.is_some());
    assert_eq!(open.echo("still open").await, "still open");
}

#[tokio::test]
async fn ejection_stops_connect_attempts_to_a_dead_endpoint_dns_still_lists() {
    // 127.0.0.5 is in DNS but nothing listens there: every attempt is refused
    let backends = Backends::start(&["127.0.0.2"]).await;
    let dnsmasq = dnsmasq("127.0.0.2 api.test\n127.0.0.5 api.test\n");
    let proxy = test_support::free_addr();
    let yaml = config(proxy, "api.test", backends.port, dnsmasq.addr(), true).replace(
        "    connect_timeout_ms: 500\n",
        "    connect_timeout_ms: 500\n    ejection:\n      consecutive_failures: 2\n      cool_down_s: 600\n",
    );
    let serve = Serve::spawn(&yaml);
    serve
        .wait_endpoints(&eps(backends.port, &["127.0.0.2", "127.0.0.5"]))
        .await;
    let dead = format!("127.0.0.5:{}", backends.port);
    let failures = |status: &serde_json::Value| {
        status["upstreams"][0]["connections"]["connect_failures"]
            .as_u64()
            .unwrap()
    };
    let ejected = |status: &serde_json::Value, addr: &str| {
        status["upstreams"][0]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["addr"] == addr)
            .map(|e| e["ejected"].as_bool().unwrap())
    };

    // Round robin sends every other first attempt to the dead endpoint; each such
    // connection is retried on the live one, and the second failure ejects it.
    for _ in 0..6 {
        let c = Conn::open(proxy)
            .await
            .expect("served by the live endpoint");
        assert_eq!(c.backend, "127.0.0.2");
    }
    let status = serve.status().await;
    assert_eq!(ejected(&status, &dead), Some(true), "{status}");
    assert_eq!(failures(&status), 2, "{status}");
    assert_eq!(
        status["upstreams"][0]["ejection"]["consecutive_failures"], 2,
        "{status}"
    );

    // Ejected: no more connect attempts to it while DNS still lists it.
    for _ in 0..10 {
        assert_eq!(Conn::open(proxy).await.unwrap().backend, "127.0.0.2");
    }
    let status = serve.status().await;
    assert_eq!(failures(&status), 2, "{status}");
    assert_eq!(serve.endpoints().await.len(), 2, "still in the set");
    let (_, metrics) = http(serve.http, "GET", "/metrics").await;
    assert!(
        metrics.contains("dwara_upstream_endpoints_ejected{upstream=\"api\"} 1\n"),
        "{metrics}"
    );
}

/// The resolution counters of upstream 0: (answers, failures, cleared).
async fn resolutions(serve: &Serve) -> (u64, u64, u64) {
    let v = serve.status().await;
    let r = &v["upstreams"][0]["resolutions"];
    let n = |k: &str| r[k].as_u64().unwrap();
    (
        n("answers_nonempty") + n("answers_empty"),
        n("failures"),
        n("cleared"),
    )
}

/// `dwara serve` whose upstream is discovered from a lying DNS server
/// ([`test_support::liar`]): real backends on 127.0.0.2/.3 (the truth) and .4 (the
/// mixed lie's one true record), and a poison backend on 127.0.0.66 that greets
/// like the others, so a connection sent there is seen. Through every lie, clients
/// keep connecting; no connection and no published endpoint ever reaches the
/// poison. Each lie lasts until the upstream has counted a failure after another
/// resolution, or three answers (an event, not a fixed time); then the endpoints
/// are the truth (or .4 alone after the mixed lie), the truth after a failure
/// under `fail_open`, and none after a failure without it.
async fn serve_through_lies(fail_open: bool) {
    use test_support::liar::{Addresses, Lie, LyingDnsServer};
    let ip = |s: &str| s.parse::<std::net::Ipv4Addr>().unwrap();
    let backends = Backends::start(&["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.66"]).await;
    let liar = LyingDnsServer::start(Addresses {
        truth: vec![ip("127.0.0.2"), ip("127.0.0.3")],
        mixed: ip("127.0.0.4"),
        poison: ip("127.0.0.66"),
        thousands: [127, 1],
    })
    .unwrap();
    let proxy = test_support::free_addr();
    let serve = Serve::spawn(&config(
        proxy,
        "api.test",
        backends.port,
        liar.addr(),
        fail_open,
    ));
    let truth = eps(backends.port, &["127.0.0.2", "127.0.0.3"]);
    let mixed = eps(backends.port, &["127.0.0.4"]);
    serve.wait_endpoints(&truth).await;

    let mut report = Vec::new();
    let (mut refused_total, mut served_total) = (0, 0);
    for lie in Lie::ALL {
        liar.set_lie(lie);
        let (answers0, failures0, _) = resolutions(&serve).await;
        let (mut served, mut refused) = (0u32, 0u32);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let failed = loop {
            match Conn::open(proxy).await {
                Some(c) => {
                    assert_ne!(
                        c.backend, "127.0.0.66",
                        "{lie:?}: a connection reached the poison"
                    );
                    assert!(
                        ["127.0.0.2", "127.0.0.3", "127.0.0.4"].contains(&c.backend.as_str()),
                        "{lie:?}: reached {}",
                        c.backend
                    );
                    served += 1;
                }
                None => refused += 1,
            }
            let eps_now = serve.endpoints().await;
            assert!(
                eps_now.iter().all(|e| !e.starts_with("127.0.0.66:")),
                "{lie:?}: the poison was published: {eps_now:?}"
            );
            let (answers, failures, _) = resolutions(&serve).await;
            let resolved = answers - answers0 + failures - failures0;
            if failures > failures0 && resolved >= 2 {
                break true;
            }
            if answers - answers0 >= 3 {
                break false;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{lie:?}: the upstream stopped resolving"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let now = serve.endpoints().await;
        if failed {
            if fail_open {
                assert_eq!(now, truth, "{lie:?}: fail_open keeps the last good set");
            } else {
                assert!(
                    now.is_empty(),
                    "{lie:?}: without fail_open the set is cleared, is {now:?}"
                );
            }
        } else {
            let want = if lie == Lie::OtherNameMixed {
                &mixed
            } else {
                &truth
            };
            assert_eq!(&now, want, "{lie:?}");
        }
        if fail_open {
            assert_eq!(refused, 0, "{lie:?}: fail_open serves every connection");
        }
        report.push(format!(
            "{lie:?}: {} (served {served}, refused {refused})",
            if failed { "failed" } else { "answered" }
        ));
        served_total += served;
        refused_total += refused;
        liar.set_lie(Lie::Truth);
        serve.wait_endpoints(&truth).await;
    }
    let (_, failures, cleared) = resolutions(&serve).await;
    assert!(
        failures >= 3,
        "wrong IDs, TC without TCP, loops and noise fail: {failures}"
    );
    if fail_open {
        assert_eq!(cleared, 0);
    } else {
        assert!(cleared >= 3, "each failing lie clears the set: {cleared}");
        assert!(refused_total > 0, "a cleared set refuses connections");
    }
    assert!(served_total > 0);
    eprintln!(
        "dwara serve through lies (fail_open: {fail_open}): {}",
        report.join("; ")
    );
}

#[tokio::test]
async fn lying_dns_never_sends_traffic_to_a_poisoned_address() {
    serve_through_lies(true).await;
}

#[tokio::test]
async fn lying_dns_without_fail_open_clears_and_never_poisons() {
    serve_through_lies(false).await;
}

/// `dwara serve` started with a low soft limit on open files (as under systemd,
/// 1024) raises it to the hard limit: every connection holds a descriptor, an
/// HTTP one two, and the soft limit would refuse connections long before
/// `max_connections`. The log says so.
#[tokio::test]
async fn serve_raises_the_soft_open_file_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let mut child = Command::new("sh")
        .args([
            "-c",
            r#"ulimit -Sn 256 && exec "$0" serve --docker off --dns-listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --fallback 127.0.0.1:9 2>"$1""#,
            env!("CARGO_BIN_EXE_dwara"),
            log.to_str().unwrap(),
        ])
        .env("DWARA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let limits = format!("/proc/{}/limits", child.id().unwrap());
    // (soft, hard) of "Max open files", once the process is dwara.
    let open_files = || {
        let text = std::fs::read_to_string(&limits).unwrap_or_default();
        let line = text.lines().find(|l| l.starts_with("Max open files"))?;
        let mut n = line
            .split_whitespace()
            .filter_map(|w| w.parse::<u64>().ok());
        Some((n.next()?, n.next()?))
    };
    let raised = test_support::wait_until(WAIT, || async {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("raised the open-file limit"))
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(raised, "no word of the limit: {text}");
    let (soft, hard) = open_files().expect("the process's limits");
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        hard > 256,
        "the hard limit here is {hard}: nothing to raise"
    );
    assert_eq!(soft, hard.min(nr_open), "{text}");
    assert!(text.contains("from=256"), "{text}");
    child.kill().await.unwrap();
}
