//! `cargo xtask perf dns`: dwara's name server vs dnsmasq and unbound under dnsperf.

/// Runs the comparison.
pub(crate) fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask perf dns` is not implemented yet")
}
