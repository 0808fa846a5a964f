//! SRV and A answers of a real `dwara serve` used by the programs people point at
//! it: HAProxy (`resolvers` + `server-template`, by SRV and by A, and its split by
//! SRV weight), Caddy (`reverse_proxy { dynamic srv }` and `dynamic a`, Go's
//! resolver) and Prometheus (`dns_sd_configs`, `type: SRV`), in front of small
//! HTTP backends on 127.0.0.x that answer with their own address (and a metric on
//! `/metrics`). Real processes and real HTTP requests; every wait polls with a
//! deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use test_support::http_backend::HttpBackend;

use crate::nameserver::Serve;

/// How long a proxy may take to follow a change of the answers.
const FOLLOW: Duration = Duration::from_secs(15);

/// Whether `tool` is installed (see [`test_support::require`]: a missing tool fails
/// the test under `cargo xtask ci`, else skips it with one line).
pub(crate) fn require(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run `{tool} -v`: {e}"));
    test_support::require(tool, found)
}

/// A `dwara serve` on loopback checking registrations every 100 ms.
pub(crate) fn dwara() -> Serve {
    Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--check-interval-ms",
        "100",
    ])
}

/// Registers `backend` under `fqdn` with its port and `form`'s extra fields.
fn register(s: &Serve, id: &str, backend: SocketAddr, fqdn: &str, extra: &str) {
    let form = format!("fqdn={fqdn}&port={}{extra}", backend.port());
    let (status, body) = test_support::http::request(
        s.http,
        "PUT",
        &format!("/name/{id}/{}", backend.ip()),
        Some(&form),
    );
    assert_eq!(status, 204, "PUT {id}: {body}");
}

/// A proxy process, killed on drop.
struct Proxy {
    child: Child,
    name: &'static str,
}

impl Proxy {
    fn spawn(name: &'static str, cmd: &mut Command, listens: &[SocketAddr]) -> Self {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut me = Self { child, name };
        for addr in listens {
            let up = poll(FOLLOW, || TcpStream::connect(addr).is_ok().then_some(()));
            if up.is_none() {
                let status = me.child.try_wait();
                panic!("{name} does not listen on {addr} ({status:?})");
            }
        }
        me
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("{} stopped", self.name);
    }
}

/// Polls `f` every 50 ms until it gives something or `within` passes.
fn poll<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The bodies of `n` GET requests through `proxy` (each a backend's address), or
/// `None` when one of them fails or is not a 200.
fn reached(proxy: SocketAddr, n: usize) -> Option<Vec<String>> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    (0..n)
        .map(|_| {
            let resp = client.get(format!("http://{proxy}/")).send().ok()?;
            if resp.status() != 200 {
                return None;
            }
            Some(resp.text().ok()?.trim().to_owned())
        })
        .collect()
}

/// Waits until `n` requests through `proxy` all succeed and reach exactly `want`.
fn await_reached(what: &str, proxy: SocketAddr, n: usize, want: &[&HttpBackend]) {
    let want: BTreeSet<String> = want.iter().map(|b| b.addr().to_string()).collect();
    let mut last = None;
    let ok = poll(FOLLOW, || {
        let got = reached(proxy, n);
        let set = got
            .as_ref()
            .map(|g| g.iter().cloned().collect::<BTreeSet<_>>());
        last = got;
        (set.as_ref() == Some(&want)).then_some(())
    });
    assert!(
        ok.is_some(),
        "{what}: {n} requests through {proxy} did not reach exactly {want:?}; last: {last:?}"
    );
}

/// HTTP backends on 127.0.0.`first`.. each on a port of its own.
fn backends(first: u8, n: u8) -> Vec<HttpBackend> {
    (first..first + n)
        .map(|i| HttpBackend::start(IpAddr::from([127, 0, 0, i])).unwrap())
        .collect()
}

/// HTTP backends on 127.0.0.`first`.. sharing one port (an A record has none).
fn backends_on_one_port(first: u8, n: u8) -> Vec<HttpBackend> {
    'retry: loop {
        let one = HttpBackend::start(IpAddr::from([127, 0, 0, first])).unwrap();
        let port = one.addr().port();
        let mut all = vec![one];
        for i in first + 1..first + n {
            match HttpBackend::start_at(SocketAddr::from(([127, 0, 0, i], port))) {
                Ok(b) => all.push(b),
                Err(_) => continue 'retry,
            }
        }
        return all;
    }
}

fn free_loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], test_support::free_port()))
}

/// HAProxy's `defaults`, dwara as its resolver at `dns`, and a `server-template` by
/// SRV behind `by_srv`: the README's lines.
fn haproxy_by_srv(dns: SocketAddr, by_srv: SocketAddr) -> String {
    format!(
        "\
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s

resolvers dwara
    nameserver dwara {dns}
    accepted_payload_size 4096
    timeout resolve 200ms
    timeout retry 200ms
    hold valid 200ms
    hold obsolete 0s

frontend by_srv
    bind {by_srv}
    default_backend web_srv

backend web_srv
    balance roundrobin
    server-template web 10 _http._tcp.web.weave.local resolvers dwara init-addr none
"
    )
}

/// The HAProxy configuration the README shows, with these addresses: a
/// `server-template` by SRV and one by A, resolved by dwara at `dns`.
fn haproxy_config(dns: SocketAddr, by_srv: SocketAddr, by_a: SocketAddr, a_port: u16) -> String {
    let mut c = haproxy_by_srv(dns, by_srv);
    let _ = write!(
        c,
        "
frontend by_a
    bind {by_a}
    default_backend web_a

backend web_a
    balance roundrobin
    server-template plain 10 plain.weave.local:{a_port} resolvers dwara init-addr none resolve-prefer ipv4
"
    );
    c
}

#[test]
fn haproxy_reaches_every_instance_by_srv_and_by_a_and_follows_changes() {
    if !require("haproxy") {
        return;
    }
    let s = dwara();
    // Three instances of web, each on a port of its own, checked by dwara.
    let mut web = backends(11, 3);
    for (i, b) in web.iter().enumerate() {
        let id = format!("web{i}");
        register(
            &s,
            &id,
            b.addr(),
            "web.weave.local",
            "&service=_http._tcp&check=tcp",
        );
    }
    let plain = backends_on_one_port(21, 3);
    for (i, b) in plain.iter().enumerate() {
        register(&s, &format!("plain{i}"), b.addr(), "plain.weave.local", "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (by_srv, by_a) = (free_loopback(), free_loopback());
    let config = dir.path().join("haproxy.cfg");
    let a_port = plain[0].addr().port();
    std::fs::write(&config, haproxy_config(s.dns, by_srv, by_a, a_port)).unwrap();
    let _haproxy = Proxy::spawn(
        "haproxy",
        Command::new("haproxy").arg("-db").arg("-f").arg(&config),
        &[by_srv, by_a],
    );
    // Every instance at its own port, by SRV; every address by A.
    await_reached("by SRV", by_srv, 12, &web.iter().collect::<Vec<_>>());
    await_reached("by A", by_a, 12, &plain.iter().collect::<Vec<_>>());
    // A deleted instance is left out.
    let (status, _) = test_support::http::request(s.http, "DELETE", "/name/web1", None);
    assert_eq!(status, 204);
    await_reached("after a delete", by_srv, 12, &[&web[0], &web[2]]);
    // An instance whose check fails is left out (HAProxy checks nothing itself).
    let started = Instant::now();
    web[2].stop();
    await_reached("after a failing check", by_srv, 12, &[&web[0]]);
    eprintln!(
        "HAProxy followed a failing check=tcp in {:?}",
        started.elapsed()
    );
}

/// HAProxy by SRV at `by_srv` with a stats socket at `sock`: the README's
/// `resolvers` and `server-template` lines.
fn haproxy_weights_config(dns: SocketAddr, by_srv: SocketAddr, sock: &Path) -> String {
    format!(
        "global\n    stats socket {} mode 600 level admin\n\n{}",
        sock.display(),
        haproxy_by_srv(dns, by_srv)
    )
}

/// HAProxy's own weights of the servers of `backend`, by `address:port`, from
/// `show servers state` on its stats socket (servers without an address left out).
fn haproxy_weights(sock: &Path, backend: &str) -> BTreeMap<String, u32> {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else {
        return BTreeMap::new();
    };
    let mut out = String::new();
    let asked = s.write_all(format!("show servers state {backend}\n").as_bytes());
    if asked.is_err() || s.read_to_string(&mut out).is_err() {
        return BTreeMap::new();
    }
    let mut lines = out.lines().skip_while(|l| !l.starts_with("# "));
    let Some(header) = lines.next() else {
        return BTreeMap::new();
    };
    let columns: Vec<&str> = header[2..].split_whitespace().collect();
    let at = |name: &str| columns.iter().position(|c| *c == name).unwrap();
    let (addr, port, weight) = (at("srv_addr"), at("srv_port"), at("srv_uweight"));
    lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() == columns.len() && f[port] != "0" && f[addr] != "-")
        .map(|f| {
            (
                format!("{}:{}", f[addr], f[port]),
                f[weight].parse().unwrap(),
            )
        })
        .collect()
}

/// How many of `n` requests through `proxy` each backend answered, by address.
fn counts(proxy: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let got = reached(proxy, n).expect("every request answered with a 200");
    let mut counts = BTreeMap::new();
    for body in got {
        *counts.entry(body).or_default() += 1;
    }
    counts
}

/// Registers `web` under `web.weave.local` (`_http._tcp`) with `weights`.
fn register_weighted(s: &Serve, web: &[HttpBackend], weights: [u16; 3]) {
    for (i, (b, w)) in web.iter().zip(weights).enumerate() {
        let extra = format!("&service=_http._tcp&weight={w}");
        register(s, &format!("web{i}"), b.addr(), "web.weave.local", &extra);
    }
}

/// Waits until HAProxy's weights of `web` are `want`.
fn await_haproxy_weights(sock: &Path, web: &[HttpBackend], want: [u32; 3]) {
    let want: BTreeMap<String, u32> = web
        .iter()
        .zip(want)
        .map(|(b, w)| (b.addr().to_string(), w))
        .collect();
    let mut last = BTreeMap::new();
    let ok = poll(FOLLOW, || {
        last = haproxy_weights(sock, "web_srv");
        (last == want).then_some(())
    });
    assert!(ok.is_some(), "HAProxy's weights {last:?}, want {want:?}");
}

/// HAProxy 2.6 maps an SRV weight `w` (0–65535) to its own server weight (0–256)
/// as `(w + 255) / 256` (`resolvers.c`): SRV weights 1 to 256 are all weight 1.
/// So the canary is registered at 256 beside two at 2304 (HAProxy: 1 and 9), and
/// the same split at SRV weights 1 and 9 is shown to be even, as HAProxy has it.
#[test]
fn haproxy_splits_traffic_by_srv_weight() {
    if !require("haproxy") {
        return;
    }
    let s = dwara();
    let web = backends(51, 3);
    register_weighted(&s, &web, [2304, 2304, 256]);
    let dir = tempfile::tempdir().unwrap();
    let by_srv = free_loopback();
    let sock = dir.path().join("haproxy.sock");
    let config = dir.path().join("haproxy.cfg");
    std::fs::write(&config, haproxy_weights_config(s.dns, by_srv, &sock)).unwrap();
    let _haproxy = Proxy::spawn(
        "haproxy",
        Command::new("haproxy").arg("-db").arg("-f").arg(&config),
        &[by_srv],
    );
    await_haproxy_weights(&sock, &web, [9, 9, 1]);
    const N: usize = 2000;
    let split = counts(by_srv, N);
    eprintln!("HAProxy, SRV weights 2304, 2304, 256: {N} requests {split:?}");
    let got = |b: &HttpBackend| split.get(&b.addr().to_string()).copied().unwrap_or(0);
    let (low, high) = crate::weights::binomial_band(N, 1.0 / 19.0);
    assert!(
        (low..=high).contains(&got(&web[2])),
        "canary {} of {N}, want {low}..={high} (1/19): {split:?}",
        got(&web[2])
    );
    let (low, high) = crate::weights::binomial_band(N, 9.0 / 19.0);
    for b in &web[..2] {
        assert!((low..=high).contains(&got(b)), "{split:?}");
    }
    // SRV weights 9, 9, 1 are HAProxy weights 1, 1, 1: an even split.
    register_weighted(&s, &web, [9, 9, 1]);
    await_haproxy_weights(&sock, &web, [1, 1, 1]);
    const EVEN: usize = 600;
    let split = counts(by_srv, EVEN);
    eprintln!("HAProxy, SRV weights 9, 9, 1: {EVEN} requests {split:?}");
    let (low, high) = crate::weights::binomial_band(EVEN, 1.0 / 3.0);
    for b in &web {
        let n = split.get(&b.addr().to_string()).copied().unwrap_or(0);
        assert!((low..=high).contains(&n), "{split:?}");
    }
}

/// The Caddy configuration the README shows, with these addresses: `dynamic srv`
/// and `dynamic a`, both resolved by dwara at `dns` (the SRV targets too, through
/// the transport's resolver).
fn caddy_config(dns: SocketAddr, by_srv: SocketAddr, by_a: SocketAddr, a_port: u16) -> String {
    format!(
        "\
{{
\tadmin off
\tauto_https off
}}

http://:{srv_port} {{
\tbind {srv_ip}
\treverse_proxy {{
\t\tdynamic srv _http._tcp.web.weave.local {{
\t\t\trefresh 200ms
\t\t\tresolvers {dns}
\t\t}}
\t\tlb_policy round_robin
\t\ttransport http {{
\t\t\tresolvers {dns}
\t\t}}
\t}}
}}

http://:{a_port_listen} {{
\tbind {a_ip}
\treverse_proxy {{
\t\tdynamic a plain.weave.local {a_port} {{
\t\t\trefresh 200ms
\t\t\tresolvers {dns}
\t\t}}
\t\tlb_policy round_robin
\t}}
}}
",
        srv_port = by_srv.port(),
        srv_ip = by_srv.ip(),
        a_port_listen = by_a.port(),
        a_ip = by_a.ip(),
    )
}

fn caddy(dir: &Path, config: &Path, listens: &[SocketAddr]) -> Proxy {
    Proxy::spawn(
        "caddy",
        Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(config)
            // Caddy keeps its state under these; the test's own directory.
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir)
            .env("XDG_CONFIG_HOME", dir),
        listens,
    )
}

#[test]
fn caddy_reaches_every_instance_by_srv_and_by_a() {
    if !require("caddy") {
        return;
    }
    let s = dwara();
    let web = backends(31, 3);
    for (i, b) in web.iter().enumerate() {
        register(
            &s,
            &format!("web{i}"),
            b.addr(),
            "web.weave.local",
            "&service=_http._tcp",
        );
    }
    let plain = backends_on_one_port(41, 3);
    for (i, b) in plain.iter().enumerate() {
        register(&s, &format!("plain{i}"), b.addr(), "plain.weave.local", "");
    }
    let dir = tempfile::tempdir().unwrap();
    let (by_srv, by_a) = (free_loopback(), free_loopback());
    let config = dir.path().join("Caddyfile");
    let a_port = plain[0].addr().port();
    std::fs::write(&config, caddy_config(s.dns, by_srv, by_a, a_port)).unwrap();
    let _caddy = caddy(dir.path(), &config, &[by_srv, by_a]);
    await_reached("by SRV", by_srv, 12, &web.iter().collect::<Vec<_>>());
    await_reached("by A", by_a, 12, &plain.iter().collect::<Vec<_>>());
    // A deleted instance is left out at the next refresh.
    let (status, _) = test_support::http::request(s.http, "DELETE", "/name/web1", None);
    assert_eq!(status, 204);
    await_reached("after a delete", by_srv, 12, &[&web[0], &web[2]]);
}

/// Prometheus scraping every instance of `web.weave.local` found by SRV.
fn prometheus_config() -> &'static str {
    "\
global:
  scrape_interval: 1s
  scrape_timeout: 500ms
scrape_configs:
  - job_name: web
    dns_sd_configs:
      - names: [_http._tcp.web.weave.local]
        type: SRV
        refresh_interval: 1s
"
}

/// Prometheus' active targets from `/api/v1/targets`: `__address__` → health.
fn prometheus_targets(web: SocketAddr) -> BTreeMap<String, String> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
        .unwrap();
    let Ok(resp) = client
        .get(format!("http://{web}/api/v1/targets?state=active"))
        .send()
    else {
        return BTreeMap::new();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&resp.text().unwrap_or_default()) else {
        return BTreeMap::new();
    };
    v["data"]["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let addr = t["discoveredLabels"]["__address__"].as_str()?;
            Some((addr.to_owned(), t["health"].as_str()?.to_owned()))
        })
        .collect()
}

/// Prometheus' `dns_sd_configs` (`type: SRV`) asks the servers of /etc/resolv.conf,
/// always on port 53, and scrapes each target by its name through the system
/// resolver. So dwara listens on port 53 of an address of its own in 127/8, and
/// Prometheus runs in a mount namespace (`unshare -m`) where a bind mount puts a
/// resolv.conf naming that address over /etc/resolv.conf: the host's file is
/// never touched. Every instance must appear at its registered port, by its own
/// target name, and be scraped (`up`).
#[test]
fn prometheus_dns_sd_by_srv_scrapes_every_instance() {
    if !require("prometheus") || !require("unshare") {
        return;
    }
    let started = Instant::now();
    // An address of 127/8 per process, so parallel runs do not share port 53.
    let ns_ip = IpAddr::from([127, 53, (std::process::id() % 250) as u8 + 1, 1]);
    let dns = SocketAddr::new(ns_ip, 53);
    // Port 53 needs root (or CAP_NET_BIND_SERVICE).
    let bindable = std::net::UdpSocket::bind(dns).map(drop);
    if !test_support::require(&format!("binding {dns}"), bindable) {
        return;
    }
    let s = Serve::start(&[
        "--dns-listen",
        &dns.to_string(),
        "--http-listen",
        "127.0.0.1:0",
    ]);
    let web = backends(81, 3);
    for (i, b) in web.iter().enumerate() {
        register(
            &s,
            &format!("web{i}"),
            b.addr(),
            "web.weave.local",
            "&service=_http._tcp",
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {ns_ip}\n")).unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, prometheus_config()).unwrap();
    let listen = free_loopback();
    let _prometheus = Proxy::spawn(
        "prometheus",
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/resolv.conf && exec prometheus \"$@\"")
            .arg(&resolv)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .arg("--log.level=warn"),
        &[listen],
    );
    let want: BTreeMap<String, String> = web
        .iter()
        .map(|b| {
            let target = test_support::dig::srv_target(b.addr().ip(), "weave.local");
            let target = target.trim_end_matches('.');
            (format!("{target}:{}", b.addr().port()), "up".to_owned())
        })
        .collect();
    let mut last = BTreeMap::new();
    let found = poll(Duration::from_secs(30), || {
        last = prometheus_targets(listen);
        (last == want).then_some(())
    });
    assert!(
        found.is_some(),
        "Prometheus' targets {last:?}, want {want:?}"
    );
    eprintln!(
        "Prometheus scraped all three instances {:?} after dwara started",
        started.elapsed()
    );
}
