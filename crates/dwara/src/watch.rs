//! `dwara watch`: follows one name through DNS discovery.

use clap::Args;

/// Arguments of `dwara watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// The host name to follow.
    host: String,
}

/// Runs `dwara watch` until ctrl-c.
pub(crate) async fn run(_args: WatchArgs) -> anyhow::Result<()> {
    anyhow::bail!("`dwara watch` is not wired in yet")
}
