//! A real dnsmasq on a loopback port, serving a hosts file the test controls.
//!
//! dnsmasq runs in the foreground with no system configuration (`--conf-file=/dev/null`,
//! `--no-resolv`, `--no-hosts`), answers the names of its `--addn-hosts` file
//! authoritatively for itself and refuses nothing else in particular. `set_hosts`
//! rewrites the file and sends SIGHUP, which makes dnsmasq re-read it. Names from
//! hosts files get `--local-ttl` (dnsmasq's default is 0).

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Options for [`Dnsmasq::start`].
#[derive(Debug, Clone, Default)]
pub struct DnsmasqOptions {
    /// Contents of the `--addn-hosts` file (`IP name…` per line).
    pub hosts: String,
    /// `--local-ttl` for names from the hosts file (dnsmasq defaults to 0).
    pub local_ttl: Option<u32>,
    /// Further dnsmasq arguments.
    pub extra_args: Vec<String>,
}

/// A running dnsmasq; killed on drop.
#[derive(Debug)]
pub struct Dnsmasq {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    options: DnsmasqOptions,
}

impl Dnsmasq {
    /// Starts dnsmasq on a free `127.0.0.1` port and waits until it answers.
    pub fn start(options: DnsmasqOptions) -> io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, crate::free_port()));
        let mut me = Self {
            child: None,
            addr,
            dir,
            options,
        };
        me.write_hosts()?;
        me.spawn()?;
        Ok(me)
    }

    /// The UDP and TCP address dnsmasq listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The hosts file dnsmasq reads.
    pub fn hosts_path(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    /// Process id of the running dnsmasq, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Rewrites the hosts file and makes dnsmasq re-read it (SIGHUP).
    pub fn set_hosts(&mut self, hosts: &str) -> io::Result<()> {
        hosts.clone_into(&mut self.options.hosts);
        self.write_hosts()?;
        if let Some(pid) = self.pid() {
            crate::signal(pid, "HUP")?;
        }
        Ok(())
    }

    /// Stops dnsmasq (SIGKILL) and waits for it to exit: the port goes silent.
    pub fn stop(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts dnsmasq again on the same port with the current hosts file.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        self.spawn()
    }

    fn write_hosts(&self) -> io::Result<()> {
        // Write then rename, so dnsmasq never reads half a file.
        let tmp = self.dir.path().join("hosts.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(self.options.hosts.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.hosts_path())
    }

    fn spawn(&mut self) -> io::Result<()> {
        let hosts = self.hosts_path();
        let mut cmd = Command::new(dnsmasq_binary());
        cmd.arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null")
            .arg("--no-resolv")
            .arg("--no-hosts")
            .arg("--no-negcache")
            .arg("--bind-interfaces")
            .arg("--user=root")
            .arg("--pid-file=")
            .arg(format!("--listen-address={}", self.addr.ip()))
            .arg(format!("--port={}", self.addr.port()))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .arg("--log-facility=-");
        if let Some(ttl) = self.options.local_ttl {
            cmd.arg(format!("--local-ttl={ttl}"));
        }
        cmd.args(&self.options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start dnsmasq (apt-get install -y dnsmasq): {e}"),
            )
        })?;
        self.child = Some(child);
        wait_answering(self.addr, Duration::from_secs(10)).inspect_err(|_| {
            let _ = self.stop();
        })
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn dnsmasq_binary() -> &'static Path {
    for p in ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"] {
        if Path::new(p).exists() {
            return Path::new(p);
        }
    }
    Path::new("dnsmasq")
}

/// Waits until a DNS server at `addr` answers any UDP query.
pub fn wait_answering(addr: SocketAddr, timeout: Duration) -> io::Result<()> {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    // A query for "probe." type A, id 0x4242, RD set.
    let query: &[u8] = &[
        0x42, 0x42, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 5, b'p', b'r', b'o', b'b', b'e', 0, 0, 1,
        0, 1,
    ];
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 512];
    while Instant::now() < deadline {
        sock.send_to(query, addr)?;
        if let Ok((n, _)) = sock.recv_from(&mut buf)
            && n >= 2
            && buf[..2] == [0x42, 0x42]
        {
            return Ok(());
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no DNS server answered on {addr} within {timeout:?}"),
    ))
}
