//! `dwara serve`: composes the name-server half and/or the upstreams of a config file
//! behind one HTTP listener.
//!
//! Without `--config` it is a name server on its defaults. With `--config` the
//! file decides: its `nameserver:` section runs the name server (command-line flags
//! override the section's values), its `upstreams:` run the L4 dataplane. Each
//! component is built from its section and hands over its routes and metrics; this
//! module owns the listener (`GET /upstreams`, `POST /reload`, `GET /metrics` and,
//! with the name server, its API and `GET /peers`; served by `http_server` within
//! its limits) and the one metrics registry.
//! The name-server half is the name server plus what writes into its database: the
//! cluster (with `--gossip-listen`) and the Docker updater (`--docker`, default
//! `auto`).
//!
//! An upstream whose `dns_discovery.hostname` lies in the name server's domain
//! follows the records database by push (`push`) instead of polling DNS; the name
//! server therefore starts before the upstreams.
//!
//! The upstreams' connections are accepted and forwarded by the dataplane's L4
//! worker threads (`--l4-workers`, or `l4_workers:` in the file; one per core by
//! default), apart from the runtime (`--worker-threads`) that serves HTTP, DNS over
//! TCP and gossip and runs discovery.
//!
//! SIGHUP and `POST /reload` re-read the file and apply its upstreams (a reload
//! either fully applies or changes nothing; `l4_workers` takes effect at a start),
//! and re-read the gossip key file (one that does not parse leaves the keyring as it
//! was); SIGTERM and ctrl-c stop accepting, stop discovery and drain connections up
//! to `--drain-timeout`.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use dwara_cluster::{Cluster, KeyReloader};
use dwara_docker::{DockerUpdater, Started};
use dwara_nameserver::NameServer;
use dwara_proxy::Dataplane;
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use crate::cluster::ClusterArgs;
use crate::docker::DockerArgs;
use crate::http_server::HttpServer;
use crate::nameserver::NameServerArgs;
use crate::push::DbSources;
use dwara::config::Config;

/// Arguments of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// YAML configuration file (name server and/or upstreams); SIGHUP reloads it.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// How long connections may drain after SIGTERM, in seconds.
    #[arg(long = "drain-timeout", default_value_t = 10)]
    pub(crate) drain_timeout_s: u64,
    /// Threads of the async runtime (HTTP, DNS over TCP, gossip, discovery) [default: one per core]; the L4 workers (--l4-workers) and the DNS/UDP workers (--dns-workers) are threads of their own
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) worker_threads: Option<u16>,
    /// L4 worker threads: each accepts and forwards upstream connections on its own SO_REUSEPORT socket per listen address [config: l4_workers; default: one per core]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) l4_workers: Option<u16>,
    #[command(flatten)]
    pub(crate) nameserver: NameServerArgs,
    #[command(flatten)]
    pub(crate) cluster: ClusterArgs,
    #[command(flatten)]
    pub(crate) docker: DockerArgs,
}

/// Re-reads the config file and applies its upstreams, and re-reads the gossip key
/// file.
struct Reloader {
    path: Option<PathBuf>,
    keys: Option<KeyReloader>,
    dataplane: Arc<Dataplane>,
    /// `--l4-workers`, which wins over the file's `l4_workers`.
    l4_workers_flag: bool,
}

/// What a reload applied.
#[derive(Debug, serde::Serialize)]
struct Reloaded {
    /// The upstreams' generation, with a config file.
    #[serde(skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
    /// The gossip keyring's key ids (the first seals), with a key file.
    #[serde(skip_serializing_if = "Option::is_none")]
    gossip_keys: Option<Vec<String>>,
}

impl Reloader {
    /// Reloads the config file and the key file, each on its own: what fails keeps
    /// running as it was, is logged, and makes the whole reload an error.
    async fn reload(&self) -> anyhow::Result<Reloaded> {
        if self.path.is_none() && self.keys.is_none() {
            anyhow::bail!("nothing to reload: no --config file and no --gossip-key-file");
        }
        let mut errors = Vec::new();
        let gossip_keys = match self.keys.as_ref().map(KeyReloader::reload) {
            Some(Ok(ids)) => Some(ids),
            Some(Err(e)) => {
                errors.push(crate::one_line(&anyhow::Error::from(e)));
                None
            }
            None => None,
        };
        let generation = match &self.path {
            Some(path) => match self.reload_config(path).await {
                Ok(n) => Some(n),
                Err(e) => {
                    errors.push(crate::one_line(&e));
                    None
                }
            },
            None => None,
        };
        if !errors.is_empty() {
            anyhow::bail!("{}", errors.join("; "));
        }
        Ok(Reloaded {
            generation,
            gossip_keys,
        })
    }

    /// On any error the running generation stays and the error is logged and returned.
    async fn reload_config(&self, path: &std::path::Path) -> anyhow::Result<u64> {
        let result = match crate::load_config(path) {
            Ok(config) => {
                let running = self.dataplane.l4_workers();
                if let Some(n) = config
                    .l4_workers
                    .filter(|n| !self.l4_workers_flag && usize::from(*n) != running)
                {
                    warn!(
                        l4_workers = n,
                        running, "l4_workers changed: it takes effect at the next start"
                    );
                }
                self.dataplane
                    .apply(&config.upstreams)
                    .await
                    .map_err(anyhow::Error::from)
            }
            Err(e) => Err(e),
        };
        match &result {
            Ok(n) => info!(generation = n, path = %path.display(), "configuration reloaded"),
            Err(e) => {
                error!(error = %crate::one_line(e), path = %path.display(), "reload rejected; the previous configuration keeps running")
            }
        }
        result
    }
}

async fn reload(State(reloader): State<Arc<Reloader>>) -> Response {
    match reloader.reload().await {
        Ok(reloaded) => axum::Json(reloaded).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({ "error": crate::one_line(&e) })),
        )
            .into_response(),
    }
}

async fn metrics(State(registry): State<Arc<Registry>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The name-server half: the name server, and the cluster and Docker updater that
/// write into its database.
struct NameHalf {
    nameserver: NameServer,
    cluster: Option<Cluster>,
    docker: Option<DockerUpdater>,
    /// Why the Docker updater does not run, for the start-up line.
    docker_off: Option<String>,
    /// The DNS/UDP response rate limit, for the start-up line.
    rate_limit: dwara_nameserver::RateLimit,
}

impl NameHalf {
    async fn start(
        args: &ServeArgs,
        config: &Config,
        registry: &mut Registry,
    ) -> anyhow::Result<Self> {
        let section = config.nameserver.as_ref();
        let mut ns_config = args.nameserver.config(section)?;
        let cluster_section = config.cluster.as_ref();
        let cluster_config = args
            .cluster
            .config(cluster_section, ns_config.tombstone_grace)?;
        // The entries this node makes carry its node id, the name peers know it by.
        if let Some(c) = &cluster_config {
            ns_config.db.origin = c.node_id.clone();
        } else if let Some(id) = args.cluster.explicit_node_id(cluster_section) {
            ns_config.db.origin = id;
        }
        let docker_config = args.docker.config(config.docker.as_ref())?;

        let rate_limit = ns_config.dns.access.rate_limit;
        let nameserver = NameServer::start(ns_config).await?;
        nameserver.register_metrics(registry);
        let db = nameserver.db().clone();
        let cluster = match cluster_config {
            Some(mut c) => {
                // With a data dir every start outranks the previous one, so peers
                // switch to this incarnation as soon as they hear of it; without one
                // the generation is random and a peer may keep preferring the old
                // incarnation until it is declared dead.
                if c.generation_id.is_none() {
                    c.generation_id = nameserver.incarnation();
                }
                let cluster = Cluster::start(c, db.clone()).await?;
                cluster.register_metrics(registry);
                Some(cluster)
            }
            None => None,
        };
        let (docker, docker_off) = match DockerUpdater::start(docker_config, db).await? {
            Started::Running(updater) => {
                updater.register_metrics(registry);
                (Some(updater), None)
            }
            Started::Off(why) => (None, Some(why.to_string())),
        };
        Ok(Self {
            nameserver,
            cluster,
            docker,
            docker_off,
            rate_limit,
        })
    }

    /// What runs, in the fields of the one start-up line.
    fn summary(&self) -> Summary {
        let ns = &self.nameserver;
        let data_dir = match ns.data_dir() {
            Some(dir) => dir.display().to_string(),
            None => "none (registrations live in memory only; --data-dir keeps them)".to_owned(),
        };
        let cluster = match &self.cluster {
            Some(c) => format!("node {} gossiping on {}", c.node_id(), c.gossip_addr()),
            None => "off (no --gossip-listen: this node serves its own entries only)".to_owned(),
        };
        let docker = match (&self.docker, &self.docker_off) {
            (Some(d), _) => format!(
                "{} (API {}, {} containers registered)",
                d.socket().display(),
                d.api_version(),
                d.registered().len()
            ),
            (None, Some(why)) => why.clone(),
            (None, None) => "off".to_owned(),
        };
        let fallback = ns.forwarder().servers();
        let fallback = if fallback.is_empty() {
            "none (names outside the domain get SERVFAIL)".to_owned()
        } else {
            fallback
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut dns_allow: Vec<String> = ns.dns_allowed().iter().map(ToString::to_string).collect();
        dns_allow.insert(0, "loopback".to_owned());
        let limit = &self.rate_limit;
        let rate_limit = if limit.qps == 0 {
            "off".to_owned()
        } else {
            format!(
                "{} qps per client /24 (IPv6 /56), loopback exempt, slip {}",
                limit.qps, limit.slip
            )
        };
        Summary {
            dns: ns.dns_addr().to_string(),
            domain: ns.db().domain().to_string(),
            dns_allow: dns_allow.join(","),
            rate_limit,
            data_dir,
            cluster,
            docker,
            fallback,
        }
    }

    fn router(&self) -> Router {
        let router = self.nameserver.router();
        match &self.cluster {
            Some(cluster) => router.merge(cluster.router()),
            None => router,
        }
    }

    /// Docker first (it writes into the database), then gossip, then DNS.
    async fn shutdown(self) {
        if let Some(docker) = self.docker {
            docker.shutdown().await;
        }
        if let Some(cluster) = self.cluster {
            cluster.shutdown().await;
        }
        self.nameserver.shutdown().await;
    }
}

/// The fields of the start-up line of a name server.
struct Summary {
    dns: String,
    domain: String,
    dns_allow: String,
    rate_limit: String,
    data_dir: String,
    cluster: String,
    docker: String,
    fallback: String,
}

/// Raises the soft limit on open files to the hard one (at most the kernel's
/// `fs.nr_open`): every client and endpoint connection holds a descriptor, an HTTP
/// one two (its socket, and the duplicate that the sends gathered at the end of a
/// worker's turn go through), and the usual soft limit of 1024 would refuse
/// connections long before `max_connections`. Go's runtime does the same at start.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => return warn!(error = %e, "could not read the open-file limit"),
    };
    let most = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map_or(hard, |nr_open| hard.min(nr_open));
    if soft >= most {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, most, hard) {
        Ok(()) => info!(from = soft, to = most, "raised the open-file limit"),
        Err(e) => warn!(soft, hard, error = %e, "could not raise the open-file limit"),
    }
}

/// Runs `dwara serve` until SIGTERM or ctrl-c.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    raise_open_file_limit();
    let config = match &args.config {
        Some(path) => crate::load_config(path)?,
        None => Config::default(),
    };
    let mut registry = Registry::default();
    // Checked before anything starts: a refusal is one line and nothing listens.
    let section = config.nameserver.as_ref();
    let http_listen = args.nameserver.http_listen(section);
    let auth = args.nameserver.http_auth(section, http_listen)?;
    if let Some(auth) = &auth {
        registry.register_collector(Box::new(auth.collector()));
    }

    let l4_workers = args.l4_workers.or(config.l4_workers);
    let dataplane = match l4_workers.and_then(|n| NonZeroUsize::new(usize::from(n))) {
        Some(n) => Dataplane::with_l4_workers(n),
        None => Dataplane::new(),
    };

    // The name server first: upstreams in its domain follow its database by push.
    let mut name_half = None;
    if args.config.is_none() || section.is_some() {
        let half = NameHalf::start(&args, &config, &mut registry).await?;
        let ns = &half.nameserver;
        dataplane.set_local_sources(Arc::new(DbSources::new(ns.db().clone(), ns.dns_addr())));
        name_half = Some(half);
    } else if config.cluster.is_some() || config.docker.is_some() {
        anyhow::bail!(
            "the cluster: and docker: sections need the name server: add a nameserver: section"
        );
    }

    dataplane.apply(&config.upstreams).await?;
    dataplane.register_metrics(&mut registry);
    let reloader = Arc::new(Reloader {
        path: args.config.clone(),
        keys: name_half
            .as_ref()
            .and_then(|h| h.cluster.as_ref())
            .and_then(Cluster::key_reloader),
        dataplane: dataplane.clone(),
        l4_workers_flag: args.l4_workers.is_some(),
    });
    let mut router = dataplane.router().merge(
        Router::new()
            .route("/reload", post(reload))
            .with_state(reloader.clone()),
    );
    if let Some(half) = &name_half {
        router = router.merge(half.router());
    }
    let router = router
        .route("/metrics", get(metrics).with_state(Arc::new(registry)))
        .fallback(|| async { (StatusCode::NOT_FOUND, "no such endpoint\n") });
    let (admin, http) = HttpServer::serve(
        http_listen,
        router,
        args.nameserver.http_limits(section),
        auth,
    )
    .await?;
    // One line that says what runs; the components log their details at debug.
    let upstreams = config.upstreams.len();
    match name_half.as_ref().map(NameHalf::summary) {
        Some(s) => info!(
            dns = %s.dns,
            %http,
            domain = %s.domain,
            dns_allow = %s.dns_allow,
            rate_limit = %s.rate_limit,
            data_dir = %s.data_dir,
            cluster = %s.cluster,
            docker = %s.docker,
            fallback = %s.fallback,
            upstreams,
            "name server ready"
        ),
        None => info!(%http, upstreams, "upstreams ready (no name server)"),
    }

    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let shutdown = crate::signals::shutdown();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = hup.recv() => {
                info!("SIGHUP: reloading the configuration and the gossip key file");
                let _ = reloader.reload().await;
            }
            () = &mut shutdown => break,
        }
    }
    info!("shutting down");
    admin.shutdown().await;
    if let Some(half) = name_half {
        half.shutdown().await;
    }
    dataplane
        .shutdown(Duration::from_secs(args.drain_timeout_s))
        .await;
    info!("stopped");
    Ok(())
}
