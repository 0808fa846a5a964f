//! Three nodes over real UDP on loopback.

use std::net::SocketAddr;

use test_support::{free_port, wait_until};

use dwara_cluster::UdpTransport;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_udp_converge_and_delete() {
    test_support::init_tracing();
    let addrs: Vec<SocketAddr> = (0..3)
        .map(|i| SocketAddr::from(([127, 0, 0, 1 + i], free_port())))
        .collect();
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let seeds = if i == 0 { vec![] } else { vec![addrs[0]] };
        nodes.push(start(&UdpTransport, &format!("u{i}"), *addr, &seeds, None).await);
    }
    assert!(all_live(&nodes).await, "udp nodes never all live");
    nodes[1]
        .db
        .add("c", "10.7.0.1".parse().unwrap(), "udp.weave.local")
        .unwrap();
    assert!(
        wait_until(WAIT, || async {
            nodes.iter().all(|n| n.sees("udp.weave.local", "10.7.0.1"))
        })
        .await
    );
    nodes[1].db.remove_all("c");
    assert!(
        wait_until(WAIT, || async {
            nodes
                .iter()
                .all(|n| n.db.lookup("udp.weave.local").is_empty())
        })
        .await
    );
    for n in &mut nodes {
        n.stop().await;
    }
}
