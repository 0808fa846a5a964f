//! The L4 workers: each has its own socket per listen address, the kernel spreads
//! connections over them, and reloads keep, retarget and stop every worker's socket.

use std::net::{Ipv4Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::time::Duration;

use dwara_proxy::{Dataplane, UpstreamConfig};
use test_support::dns_server::TestDnsServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{WAIT, upstream};

const WORKERS: usize = 4;

/// A backend that answers each connection with `tag` and closes it.
async fn tagged_backend(tag: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let _ = sock.write_all(tag).await;
            });
        }
    });
    addr
}

/// One connection through `listen`: what the backend said.
async fn fetch(listen: SocketAddr) -> Vec<u8> {
    let mut client = TcpStream::connect(listen).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, client.read_to_end(&mut got))
        .await
        .expect("the backend's answer did not end")
        .unwrap();
    got
}

fn accepted(dp: &Dataplane) -> Vec<u64> {
    dp.status_json()["l4_workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["accepted"].as_u64().unwrap())
        .collect()
}

fn pointed_at(up: &mut UpstreamConfig, backend: SocketAddr) {
    up.dns_discovery.as_mut().unwrap().port = Some(u64::from(backend.port()));
}

async fn wait_endpoints(dp: &Dataplane, backend: SocketAddr) {
    let want = vec![backend.to_string()];
    assert!(
        test_support::wait_until(WAIT, || async { crate::endpoints(dp, 0) == want }).await,
        "endpoints {:?}, wanted {want:?}",
        crate::endpoints(dp, 0)
    );
}

#[tokio::test]
async fn connections_spread_over_every_workers_socket_and_reloads_keep_them() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("backend.test", &[Ipv4Addr::LOCALHOST], 60);
    let one = tagged_backend(b"one").await;
    let two = tagged_backend(b"two").await;
    let dp = Dataplane::with_l4_workers(NonZeroUsize::new(WORKERS).unwrap());
    assert_eq!(dp.l4_workers(), WORKERS);
    assert_eq!(accepted(&dp), vec![0; WORKERS]);

    let mut up = upstream("api", "backend.test", dns.addr());
    pointed_at(&mut up, one);
    dwara_proxy::validate_upstreams(std::slice::from_ref(&up)).unwrap();
    dp.apply(std::slice::from_ref(&up)).await.unwrap();
    wait_endpoints(&dp, one).await;
    // Each connection comes from a new source port, which the kernel hashes onto
    // one of the workers' sockets.
    for _ in 0..200 {
        assert_eq!(fetch(up.listen).await, b"one");
    }
    let first = accepted(&dp);
    assert_eq!(first.iter().sum::<u64>(), 200, "{first:?}");
    assert!(
        first.iter().all(|n| *n > 0),
        "a worker accepted nothing: {first:?}"
    );

    // Same address, another endpoint: every worker's socket follows the new target.
    pointed_at(&mut up, two);
    assert_eq!(dp.apply(std::slice::from_ref(&up)).await.unwrap(), 2);
    wait_endpoints(&dp, two).await;
    for _ in 0..200 {
        assert_eq!(fetch(up.listen).await, b"two");
    }
    let second = accepted(&dp);
    assert!(
        second.iter().zip(&first).all(|(b, a)| b > a),
        "a retargeted worker socket accepted nothing: {first:?} -> {second:?}"
    );

    // Another address: the old one stops on every worker, the new one accepts.
    let old = up.listen;
    up.listen = test_support::free_addr();
    assert_eq!(dp.apply(std::slice::from_ref(&up)).await.unwrap(), 3);
    assert_eq!(dp.listening().await, vec![up.listen]);
    for _ in 0..20 {
        let refused = TcpStream::connect(old).await;
        assert!(refused.is_err(), "the removed address still accepts");
    }
    wait_endpoints(&dp, two).await;
    for _ in 0..200 {
        assert_eq!(fetch(up.listen).await, b"two");
    }
    let third = accepted(&dp);
    assert!(
        third.iter().zip(&second).all(|(c, b)| c > b),
        "a worker's socket on the new address accepted nothing: {second:?} -> {third:?}"
    );
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}

#[tokio::test]
async fn an_address_another_reuseport_socket_listens_on_is_refused() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("backend.test", &[Ipv4Addr::LOCALHOST], 60);
    // What a second dwara on the same address would hold: SO_REUSEPORT sockets.
    let other = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    other.set_reuse_port(true).unwrap();
    other
        .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .unwrap();
    other.listen(16).unwrap();
    let taken = other.local_addr().unwrap().as_socket().unwrap();
    let dp = Dataplane::with_l4_workers(NonZeroUsize::new(2).unwrap());
    let mut up = upstream("api", "backend.test", dns.addr());
    up.listen = taken;
    let err = dp.apply(std::slice::from_ref(&up)).await.unwrap_err();
    assert!(err.to_string().contains("cannot listen"), "{err}");
    assert_eq!(dp.generation().number, 0);
    assert!(dp.listening().await.is_empty());
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}
