//! Wiring of the name-server half (`dwara-nameserver`) into `dwara serve`.

use clap::Args;

/// Name-server flags of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct NameServerArgs {}

/// Runs the name server until shutdown.
pub(crate) async fn run(_args: NameServerArgs) -> anyhow::Result<()> {
    anyhow::bail!("the name server is not wired in yet")
}
