//! `dwara serve`: runs the name-server half and/or the upstreams of a config file.
//!
//! Without `--config` it is a name server on its defaults. With `--config` the
//! file decides: its `nameserver:` section runs the name server (command-line flags
//! override the section's values), its `upstreams:` run the L4 dataplane. Either
//! way one HTTP listener serves the name-server API (when it runs), `GET /upstreams`,
//! `POST /reload` and `GET /metrics`.
//!
//! SIGHUP and `POST /reload` re-read the file (see [`crate::dataplane`]); SIGTERM
//! and ctrl-c stop accepting, stop discovery and drain connections up to
//! `--drain-timeout`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use crate::dataplane::Dataplane;
use crate::nameserver::NameServerArgs;
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
    #[command(flatten)]
    pub(crate) nameserver: NameServerArgs,
}

fn dataplane_routes(dataplane: Arc<Dataplane>) -> Router {
    Router::new()
        .route("/upstreams", get(upstreams))
        .route("/reload", post(reload))
        .with_state(dataplane)
}

async fn upstreams(State(dp): State<Arc<Dataplane>>) -> Response {
    axum::Json(dp.status_json()).into_response()
}

async fn reload(State(dp): State<Arc<Dataplane>>) -> Response {
    match dp.reload().await {
        Ok(generation) => {
            axum::Json(serde_json::json!({ "generation": generation })).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({ "error": format!("{e:#}") })),
        )
            .into_response(),
    }
}

/// Runs `dwara serve` until SIGTERM or ctrl-c.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let run_nameserver = args.config.is_none() || config.nameserver.is_some();
    let dataplane = Dataplane::new(args.config.clone());
    dataplane.apply(&config).await?;

    let dp_metrics = dataplane.clone();
    let render = Arc::new(move |out: &mut String| dp_metrics.render_metrics(out));
    let http = if run_nameserver {
        let ns = crate::nameserver::start(
            &args.nameserver,
            config.nameserver.as_ref(),
            dataplane_routes(dataplane.clone()),
            render,
        )
        .await?;
        Http::NameServer(ns)
    } else {
        let addr = args.nameserver.http_listen(config.nameserver.as_ref());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (HTTP)"))?;
        info!(http = %listener.local_addr()?, "HTTP status API listening");
        let router = dataplane_routes(dataplane.clone()).route(
            "/metrics",
            get(move || async move {
                let mut out = String::new();
                render(&mut out);
                out
            }),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Http::Own { stop, task }
    };

    let mut hup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let shutdown = crate::signals::shutdown();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = hup.recv() => {
                info!("SIGHUP: reloading the configuration");
                let _ = dataplane.reload().await;
            }
            () = &mut shutdown => break,
        }
    }
    info!("shutting down");
    match http {
        Http::NameServer(ns) => ns.shutdown().await,
        Http::Own { stop, task } => {
            let _ = stop.send(());
            let _ = task.await;
        }
    }
    dataplane
        .shutdown(Duration::from_secs(args.drain_timeout_s))
        .await;
    info!("stopped");
    Ok(())
}

enum Http {
    NameServer(dwara_nameserver::NameServer),
    Own {
        stop: tokio::sync::oneshot::Sender<()>,
        task: tokio::task::JoinHandle<std::io::Result<()>>,
    },
}
