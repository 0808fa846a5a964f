//! A bare name server for tuning the UDP path: `N` generated names
//! (`hostI.weave.local` -> 10.0.0.0/8 addresses, one each), a given number of UDP
//! workers and a given `udp_batch`, no fallback, no HTTP.
//!
//! ```text
//! cargo run --release -p dwara-nameserver --example udp_serve -- \
//!     [--listen 127.0.0.1:5300] [--workers 2] [--batch 32] [--names 1000]
//! ```
//!
//! Prints `ready` when every name is loaded, then serves until killed.

#![allow(clippy::print_stdout)]

use std::net::{Ipv4Addr, SocketAddr};

use dwara_nameserver::{Domain, Fallback, NameServer, NameServerConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen: SocketAddr = "127.0.0.1:5300".parse()?;
    let (mut workers, mut batch, mut names) = (2usize, 32usize, 1000usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => listen = value.parse()?,
            "--workers" => workers = value.parse()?,
            "--batch" => batch = value.parse()?,
            "--names" => names = value.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut config = NameServerConfig::new(Domain::new("weave.local")?);
    config.dns.listen = listen;
    config.dns.udp_workers = workers;
    config.dns.udp_batch = batch;
    config.fallback = Fallback::Servers(Vec::new());
    let server = rt.block_on(NameServer::start(config))?;
    for i in 0..names {
        let ip = Ipv4Addr::from(0x0a00_0001 + i as u32);
        server
            .db()
            .add(&format!("c{i}"), ip.into(), &format!("host{i}.weave.local"))?;
    }
    println!("ready");
    rt.block_on(std::future::pending::<()>());
    Ok(())
}
