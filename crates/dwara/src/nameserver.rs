//! Wiring of the name-server half (`dwara-nameserver`) into `dwara serve`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use dwara_nameserver::{Domain, Fallback, NameServer, NameServerConfig};

/// Name-server flags of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct NameServerArgs {
    /// The domain answered from the records database.
    #[arg(long, default_value = "weave.local.")]
    domain: String,
    /// DNS listen address (UDP and TCP); port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:1053")]
    dns_listen: SocketAddr,
    /// HTTP API listen address; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:6784")]
    http_listen: SocketAddr,
    /// TTL (seconds) of the answers for the domain.
    #[arg(long, default_value_t = 1)]
    ttl: u32,
    /// Fallback server for other names, IP or IP:PORT (repeatable, tried in order).
    /// When given, --resolv-conf is not read.
    #[arg(long = "fallback", value_name = "IP:PORT", value_parser = parse_server)]
    fallback: Vec<SocketAddr>,
    /// resolv.conf whose nameservers are the fallback servers (re-read when it changes).
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
    /// UDP worker threads of the DNS server (default: one per core, at most 4).
    #[arg(long)]
    dns_workers: Option<usize>,
}

fn parse_server(s: &str) -> Result<SocketAddr, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is not IP or IP:PORT ([IPv6]:PORT for IPv6)"))
}

impl NameServerArgs {
    fn config(&self) -> anyhow::Result<NameServerConfig> {
        let domain = Domain::new(&self.domain).context("--domain")?;
        let mut config = NameServerConfig::new(domain);
        config.db.ttl = self.ttl;
        config.dns.listen = self.dns_listen;
        if let Some(n) = self.dns_workers {
            config.dns.udp_workers = n.max(1);
        }
        config.http_listen = self.http_listen;
        config.fallback = if self.fallback.is_empty() {
            Fallback::ResolvConf(self.resolv_conf.clone())
        } else {
            Fallback::Servers(self.fallback.clone())
        };
        Ok(config)
    }
}

/// Runs the name server until SIGTERM or ctrl-c.
pub(crate) async fn run(args: NameServerArgs) -> anyhow::Result<()> {
    run_until(args, shutdown_signal()).await
}

/// Runs the name server until `shutdown` completes, then stops it cleanly.
pub(crate) async fn run_until(
    args: NameServerArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let config = args.config()?;
    let server = NameServer::start(config).await?;
    tracing::info!(
        dns = %server.dns_addr(),
        http = %server.http_addr(),
        domain = %server.db().domain(),
        "name server ready"
    );
    shutdown.await;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

/// Completes on ctrl-c (SIGINT) or SIGTERM. The handlers are installed by this call,
/// not when the future is first polled, so a signal during startup is not lost.
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM/SIGINT; falling back to ctrl-c");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

// --- Wiring used by `dwara serve` with a config file (owned by serve.rs's author). ---

/// Flag defaults, so a config-file value applies unless the flag was changed.
const DEFAULT_DOMAIN: &str = "weave.local.";

impl NameServerArgs {
    /// The HTTP listen address: the flag if changed, else the config file's, else the default.
    pub(crate) fn http_listen(
        &self,
        section: Option<&crate::config::NameServerSection>,
    ) -> SocketAddr {
        let default: SocketAddr = dwara_nameserver::DEFAULT_HTTP_LISTEN;
        match section.and_then(|s| s.http_listen) {
            Some(from_file) if self.http_listen == default => from_file,
            _ => self.http_listen,
        }
    }

    /// These flags over the config file's `nameserver:` section.
    fn merged(
        &self,
        section: Option<&crate::config::NameServerSection>,
    ) -> anyhow::Result<NameServerConfig> {
        let mut config = self.config()?;
        let Some(s) = section else {
            return Ok(config);
        };
        if let Some(domain) = &s.domain
            && self.domain == DEFAULT_DOMAIN
        {
            config.db.domain = Domain::new(domain).context("nameserver.domain")?;
        }
        if let Some(addr) = s.dns_listen
            && self.dns_listen == dwara_nameserver::DEFAULT_DNS_LISTEN
        {
            config.dns.listen = addr;
        }
        config.http_listen = self.http_listen(section);
        if let Some(ttl) = s.ttl
            && self.ttl == 1
        {
            config.db.ttl = ttl;
        }
        if self.fallback.is_empty() {
            if !s.fallback.is_empty() {
                config.fallback = Fallback::Servers(s.fallback.clone());
            } else if let Some(path) = &s.resolv_conf {
                config.fallback = Fallback::ResolvConf(path.clone());
            }
        }
        Ok(config)
    }
}

/// Starts the name server with the dataplane's routes and metrics beside its own.
pub(crate) async fn start(
    args: &NameServerArgs,
    section: Option<&crate::config::NameServerSection>,
    extra_routes: axum::Router,
    extra_metrics: std::sync::Arc<dyn Fn(&mut String) + Send + Sync>,
) -> anyhow::Result<NameServer> {
    let config = args.merged(section)?;
    let server = NameServer::start_with_routes(config, extra_routes).await?;
    server.metrics().set_extra(extra_metrics);
    tracing::info!(
        dns = %server.dns_addr(),
        http = %server.http_addr(),
        domain = %server.db().domain(),
        "name server ready"
    );
    Ok(server)
}
