//! `dwara dns …`: a small client of the name server's HTTP API.

use clap::Subcommand;

/// `dwara dns` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum DnsCommand {
    /// Look a name up through the HTTP API.
    Lookup {
        /// The fully qualified name.
        fqdn: String,
    },
}

/// Runs one `dwara dns` subcommand.
pub(crate) async fn run(_cmd: DnsCommand) -> anyhow::Result<()> {
    anyhow::bail!("`dwara dns` is not wired in yet")
}
