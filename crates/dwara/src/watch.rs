//! `dwara watch`: follows one name through DNS discovery and prints every change of
//! the published endpoint set (and the first set once at start).
//!
//! It runs exactly what an upstream of `dwara serve` runs — `DnsSource`, the refresh
//! loop and an `UpstreamLb` — so what it prints is what a proxy would route to.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dwara_discovery::{DiscoverySnapshot, DiscoveryStats, DiscoveryTasks};
use dwara_discovery_dns::upstream_discovery;
use dwara_discovery_dns::{DnsDiscoveryConfig, RecordType};
use dwara_lb::{Policy, UpstreamLb};

/// Arguments of `dwara watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// The host name to follow (for SRV, the full service name).
    host: String,
    /// Record type: a, aaaa or srv.
    #[arg(long = "type", default_value = "a")]
    record_type: String,
    /// Port of the endpoints (required for a/aaaa; srv takes ports from the records).
    #[arg(long)]
    port: Option<u64>,
    /// Upper bound of the time between resolutions, in seconds.
    #[arg(long, default_value_t = 30)]
    refresh: u64,
    /// Keep the last set when DNS fails (the default).
    #[arg(long, conflicts_with = "fail_closed")]
    fail_open: bool,
    /// Clear the set when DNS fails, until it recovers.
    #[arg(long)]
    fail_closed: bool,
    /// Answers with fewer endpoints keep the previous set.
    #[arg(long, default_value_t = 1)]
    min_endpoints: usize,
    /// Name server to ask (IP:PORT, repeatable); default: the system's resolv.conf.
    #[arg(long = "nameserver")]
    nameservers: Vec<SocketAddr>,
    /// Print one JSON object per line.
    #[arg(long)]
    json: bool,
}

impl WatchArgs {
    fn discovery_config(&self) -> anyhow::Result<DnsDiscoveryConfig> {
        let config = DnsDiscoveryConfig {
            hostname: self.host.clone(),
            record_type: self.record_type.parse()?,
            port: self.port,
            refresh_interval_s: self.refresh,
            fail_open: !self.fail_closed,
            min_endpoints: self.min_endpoints,
            nameservers: self.nameservers.clone(),
        };
        config.validate()?;
        Ok(config)
    }
}

fn print_set(
    args: &WatchArgs,
    config: &DnsDiscoveryConfig,
    lb: &UpstreamLb,
    stats: &DiscoveryStats,
) {
    let set = lb.endpoints();
    let mut eps: Vec<_> = set.iter().collect();
    eps.sort_by_key(|e| e.addr.to_string());
    let endpoints: Vec<String> = eps.iter().map(|e| e.addr.to_string()).collect();
    // SRV records carry a priority and weight per endpoint; A/AAAA answers do not.
    let srv = config.record_type == RecordType::SRV;
    let last = stats.last();
    if args.json {
        let mut line = serde_json::json!({
            "endpoints": endpoints,
            "host": config.hostname,
            "type": config.record_type.to_string(),
            "changes": stats.counters().updates,
            "outcome": last.as_ref().map(|l| l.outcome),
            "decision": last.as_ref().map(|l| l.decision),
            "error": last.as_ref().and_then(|l| l.error.clone()),
        });
        if srv {
            line["srv"] = eps
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "addr": e.addr.to_string(),
                        "priority": e.priority,
                        "weight": e.weight,
                    })
                })
                .collect();
        }
        println!("{line}");
    } else {
        let outcome = last.map(|l| l.outcome).unwrap_or("none");
        let shown: Vec<String> = if srv {
            eps.iter()
                .map(|e| format!("{} (priority {}, weight {})", e.addr, e.priority, e.weight))
                .collect()
        } else {
            endpoints.clone()
        };
        println!(
            "{} {} -> [{}] ({} endpoints, last resolution: {outcome})",
            config.record_type,
            config.hostname,
            shown.join(", "),
            endpoints.len()
        );
    }
}

/// Runs `dwara watch` until ctrl-c or SIGTERM.
pub(crate) async fn run(args: WatchArgs) -> anyhow::Result<()> {
    let config = args.discovery_config().context("invalid arguments")?;
    let lb = Arc::new(UpstreamLb::new(Policy::RoundRobin));
    let up = upstream_discovery("watch", &config, lb.clone())?;
    let stats = up.stats.clone();
    let mut resolved = stats.subscribe_resolutions();
    let mut changes = stats.subscribe_changes();
    let mut tasks = DiscoveryTasks::new();
    tasks.respawn(&DiscoverySnapshot {
        generation: 1,
        upstreams: vec![up],
    });

    let shutdown = crate::signals::shutdown();
    tokio::pin!(shutdown);
    tokio::select! {
        r = resolved.wait_for(|n| *n >= 1) => { r.context("discovery stopped")?; }
        () = &mut shutdown => return Ok(()),
    }
    changes.borrow_and_update();
    print_set(&args, &config, &lb, &stats);
    loop {
        tokio::select! {
            r = changes.changed() => {
                r.context("discovery stopped")?;
                print_set(&args, &config, &lb, &stats);
            }
            () = &mut shutdown => break,
        }
    }
    tasks.shutdown().await;
    Ok(())
}
