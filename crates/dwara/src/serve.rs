//! `dwara serve`: runs the name-server half and, from a config file, the upstreams.

use clap::Args;

use crate::nameserver::NameServerArgs;

/// Arguments of `dwara serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) nameserver: NameServerArgs,
}

/// Runs `dwara serve` until SIGTERM or ctrl-c.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    crate::nameserver::run(args.nameserver).await
}
