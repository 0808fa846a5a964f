//! `dwara`: the thin binary over the dwara crates.
//!
//! Parses the command line, installs tracing, builds the runtime and hands over to
//! the libraries. A configuration error exits non-zero with one clear line.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

mod cluster;
mod dns_cmd;
mod docker;
mod http_server;
mod nameserver;
mod push;
mod serve;
mod signals;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// DNS-based service discovery and a WeaveDNS-style name server.
#[derive(Debug, Parser)]
#[command(name = "dwara", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the name server and/or the configured upstreams.
    Serve(Box<serve::ServeArgs>),
    /// Follow one name through DNS discovery and print endpoint-set changes.
    Watch(watch::WatchArgs),
    /// Validate a configuration file without serving.
    Check {
        /// The YAML configuration file.
        #[arg(long)]
        config: std::path::PathBuf,
    },
    /// Talk to a running name server's HTTP API.
    #[command(subcommand)]
    Dns(dns_cmd::DnsCommand),
    /// Print a new random cluster key (base64) for --gossip-key-file.
    Keygen,
}

/// Logs to stderr at `DWARA_LOG` (default `info`). chitchat's line per datagram it
/// cannot decode is counted instead of logged, and its other warnings are limited to
/// `dwara_cluster::WARNINGS_PER_WINDOW` per 10 s (see `dwara_cluster::invalid`): a
/// flood on the gossip port must not become a flood of log lines.
fn init_tracing() {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = tracing_subscriber::EnvFilter::try_from_env("DWARA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter.and(ChitchatWarnings::default()));
    // Its own filter, so no other event is enabled for it, and a level hint so the
    // global maximum stays the env filter's (disabled callsites stay free).
    let count = CountInvalidDatagrams.with_filter(
        filter_fn(dwara_cluster::is_invalid_datagram_event)
            .with_max_level_hint(tracing::Level::WARN),
    );
    tracing_subscriber::registry().with(log).with(count).init();
}

/// Counts chitchat's undecodable-datagram events (the only ones its filter lets in).
struct CountInvalidDatagrams;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountInvalidDatagrams {
    fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        dwara_cluster::count_invalid_datagram();
    }
}

/// Keeps chitchat's undecodable-datagram warnings out of the log (they are counted by
/// [`CountInvalidDatagrams`]), lets at most `dwara_cluster::WARNINGS_PER_WINDOW` of
/// its other warnings in per `dwara_cluster::SUMMARY_EVERY` and counts the rest;
/// every other event passes.
#[derive(Default)]
struct ChitchatWarnings {
    /// The current window's start and how many warnings it let through.
    window: std::sync::Mutex<Option<(std::time::Instant, u32)>>,
}

impl<S> tracing_subscriber::layer::Filter<S> for ChitchatWarnings {
    fn enabled(
        &self,
        meta: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        !dwara_cluster::is_invalid_datagram_event(meta)
    }

    fn callsite_enabled(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if dwara_cluster::is_invalid_datagram_event(meta) {
            tracing::subscriber::Interest::never()
        } else if dwara_cluster::is_chitchat_warning(meta) {
            // Decided per event (the window), so never cached.
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::always()
        }
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if !dwara_cluster::is_chitchat_warning(event.metadata()) {
            return true;
        }
        let now = std::time::Instant::now();
        let mut window = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (start, let_in) = window.get_or_insert((now, 0));
        if now.duration_since(*start) >= dwara_cluster::SUMMARY_EVERY {
            *start = now;
            *let_in = 0;
        }
        if *let_in < dwara_cluster::WARNINGS_PER_WINDOW {
            *let_in += 1;
            true
        } else {
            dwara_cluster::count_suppressed_warning();
            false
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
}

/// An error and its causes on one line, `a: b: c`, leaving out a cause whose text
/// the line already holds (errors that show their source in their own message).
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// Loads a configuration file; errors name the file.
fn load_config(path: &std::path::Path) -> anyhow::Result<dwara::config::Config> {
    use dwara::config::{Config, ConfigError};
    match Config::load(path) {
        Ok(config) => Ok(config),
        // The read error names the file already.
        Err(e @ ConfigError::Read { .. }) => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("config file {}", path.display()))),
    }
}

fn check(path: &std::path::Path) -> anyhow::Result<()> {
    let config = load_config(path)?;
    println!(
        "{}: ok ({} upstreams, name server {})",
        path.display(),
        config.upstreams.len(),
        if config.nameserver.is_some() {
            "configured"
        } else {
            "not configured"
        }
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Command::Serve(args) = &cli.command
        && let Some(n) = args.worker_threads
    {
        builder.worker_threads(usize::from(n));
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dwara: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Watch(args) => watch::run(args).await,
            Command::Check { config } => check(&config),
            Command::Dns(cmd) => dns_cmd::run(cmd).await,
            Command::Keygen => {
                println!("{}", dwara_cluster::generate_key());
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dwara: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}
