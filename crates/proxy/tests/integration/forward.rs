//! Forwarding through a real listener to a real backend: long transfers (which the
//! dataplane splices) arrive intact both ways, half-closes pass through, and the
//! byte counters move while the connection is open.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use dwara_proxy::{Dataplane, UpstreamConfig};
use test_support::dns_server::TestDnsServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{WAIT, upstream};

/// Large enough that every direction leaves the copy buffer for splicing.
const BIG: usize = 8 << 20;

/// A deterministic byte pattern that differs at every offset mod 251.
fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ salt)
        .collect::<Vec<u8>>()
}

/// A dataplane with one upstream whose only endpoint is `backend`.
async fn proxy_to(backend: SocketAddr) -> (Arc<Dataplane>, UpstreamConfig, TestDnsServer) {
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("backend.test", &[Ipv4Addr::LOCALHOST], 60);
    let mut up = upstream("api", "backend.test", dns.addr());
    up.dns_discovery.as_mut().unwrap().port = Some(u64::from(backend.port()));
    dwara_proxy::validate_upstreams(std::slice::from_ref(&up)).unwrap();
    let dp = Dataplane::new();
    dp.apply(std::slice::from_ref(&up)).await.unwrap();
    let want = vec![backend.to_string()];
    assert!(test_support::wait_until(WAIT, || async { crate::endpoints(&dp, 0) == want }).await);
    (dp, up, dns)
}

fn connections(dp: &Dataplane) -> serde_json::Value {
    dp.status_json()["upstreams"][0]["connections"].clone()
}

#[tokio::test]
async fn long_transfers_arrive_intact_both_ways_and_half_close_passes_through() {
    test_support::init_tracing();
    // The backend reads until the client's half-close arrives, then answers with
    // what it read, followed by a block of its own, and closes.
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut sock, _) = backend.accept().await.unwrap();
        let mut got = Vec::new();
        sock.read_to_end(&mut got).await.unwrap();
        sock.write_all(&got).await.unwrap();
        sock.write_all(&pattern(BIG, 0x5a)).await.unwrap();
        sock.shutdown().await.unwrap();
        got.len()
    });
    let (dp, up, dns) = proxy_to(backend_addr).await;

    let mut client = TcpStream::connect(up.listen).await.unwrap();
    let sent = pattern(BIG, 0xa5);
    client.write_all(&sent).await.unwrap();
    client.shutdown().await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, client.read_to_end(&mut back))
        .await
        .expect("the answer did not end: a half-close was lost")
        .unwrap();
    assert_eq!(server.await.unwrap(), BIG, "bytes lost on the way up");
    assert_eq!(back.len(), 2 * BIG, "bytes lost on the way down");
    assert!(back[..BIG] == sent[..], "upstream bytes changed on the way");
    assert!(
        back[BIG..] == pattern(BIG, 0x5a)[..],
        "downstream bytes changed on the way"
    );
    assert!(test_support::wait_until(WAIT, || async { connections(&dp)["active"] == 0 }).await);
    let c = connections(&dp);
    assert_eq!(c["bytes_to_upstream"], BIG as u64, "{c}");
    assert_eq!(c["bytes_to_client"], 2 * BIG as u64, "{c}");
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}

#[tokio::test]
async fn a_streaming_echo_keeps_every_byte_in_order_while_both_ways_are_busy() {
    test_support::init_tracing();
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = backend.accept().await.unwrap();
        let (mut r, mut w) = sock.split();
        tokio::io::copy(&mut r, &mut w).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let (dp, up, dns) = proxy_to(backend_addr).await;

    let client = TcpStream::connect(up.listen).await.unwrap();
    let (mut r, mut w) = client.into_split();
    let sent = pattern(BIG, 0x33);
    let writer = {
        let sent = sent.clone();
        tokio::spawn(async move {
            // Uneven writes, so chunk boundaries fall everywhere.
            for chunk in sent.chunks(100_003) {
                w.write_all(chunk).await.unwrap();
            }
            w.shutdown().await.unwrap();
        })
    };
    let mut back = Vec::new();
    tokio::time::timeout(WAIT, r.read_to_end(&mut back))
        .await
        .expect("echo did not end")
        .unwrap();
    writer.await.unwrap();
    assert_eq!(back.len(), sent.len());
    assert!(back == sent, "echoed bytes differ");
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}

#[tokio::test]
async fn byte_counters_move_while_the_connection_is_open() {
    test_support::init_tracing();
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut sock, _) = backend.accept().await.unwrap();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            sock.write_all(&buf[..n]).await.unwrap();
        }
    });
    let (dp, up, dns) = proxy_to(backend_addr).await;
    let mut registry = prometheus_client::registry::Registry::default();
    dp.register_metrics(&mut registry);

    let mut client = TcpStream::connect(up.listen).await.unwrap();
    // A small exchange (copied) and a long one (spliced), the connection still open.
    for len in [1000, 3 << 20] {
        let msg = pattern(len, 7);
        client.write_all(&msg).await.unwrap();
        let mut back = vec![0u8; len];
        tokio::time::timeout(WAIT, client.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert!(back == msg);
    }
    let total = 1000 + (3 << 20) as u64;
    let c = connections(&dp);
    assert_eq!(c["active"], 1, "{c}");
    assert_eq!(c["bytes_to_upstream"], total, "{c}");
    // The echo has been read in full, so it has been written to the client.
    assert_eq!(c["bytes_to_client"], total, "{c}");
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(&format!(
            "dwara_upstream_bytes_to_upstream_total{{upstream=\"api\"}} {total}"
        )),
        "{text}"
    );
    drop(client);
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}
