//! Bursts of UDP queries from several client sockets at once, on the batched path
//! (`recvmmsg`/`sendmmsg`, one `SO_REUSEPORT` socket per worker) and on the
//! per-datagram path (`udp_batch` 1): every reply carries the asking query's ID and
//! the right answer, and arrives at the socket that asked.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use crate::support::TestServer;

const NAMES: usize = 200;
const CLIENTS: usize = 6;
const PER_CLIENT: usize = 150;
/// Queries a client has in flight at once: its socket's default receive buffer
/// holds about 150 small datagrams, and a batched server answers faster than a
/// client that is still sending reads.
const WAVE: usize = 50;

fn address_of(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250) as u8 + 1)
}

fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// The ID and the single A address of a reply (the fast path's layout: header,
/// question, one answer ending in the four address bytes).
fn parse_reply(reply: &[u8]) -> (u16, u8, Option<Ipv4Addr>) {
    assert!(reply.len() >= 12, "short reply");
    let id = u16::from_be_bytes([reply[0], reply[1]]);
    let rcode = reply[3] & 0x0f;
    let answers = u16::from_be_bytes([reply[6], reply[7]]);
    let addr = (answers == 1).then(|| {
        let n = reply.len();
        Ipv4Addr::new(reply[n - 4], reply[n - 3], reply[n - 2], reply[n - 1])
    });
    (id, rcode, addr)
}

/// One client socket's bursts: sends `WAVE` queries back to back, then collects
/// replies, `PER_CLIENT / WAVE` times; what is still missing after a quiet second is
/// sent again (UDP may drop under a burst; a wrong or misdirected reply fails at
/// once). Returns the number of resends.
fn burst(server: SocketAddr, client: usize) -> usize {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut resends = 0;
    for wave in 0..PER_CLIENT / WAVE {
        resends += burst_wave(&sock, server, client, wave * WAVE..(wave + 1) * WAVE);
    }
    resends
}

fn burst_wave(
    sock: &UdpSocket,
    server: SocketAddr,
    client: usize,
    queries: std::ops::Range<usize>,
) -> usize {
    // ID -> the name index asked (IDs are unique across clients, so a reply sent to
    // the wrong socket is caught by the lookup).
    let mut pending: HashMap<u16, usize> = queries
        .map(|i| {
            let id = (client * PER_CLIENT + i) as u16 + 1;
            (id, (client * 7 + i * 13) % NAMES)
        })
        .collect();
    let mut resends = 0;
    let mut first = true;
    for _attempt in 0..10 {
        if pending.is_empty() {
            break;
        }
        if !first {
            resends += pending.len();
        }
        first = false;
        for (&id, &name) in &pending {
            sock.send_to(&query(id, &format!("host{name}.weave.local")), server)
                .unwrap();
        }
        let mut buf = [0u8; 512];
        while !pending.is_empty() {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                break;
            };
            assert_eq!(from, server, "reply from the server's address");
            let (id, rcode, addr) = parse_reply(&buf[..n]);
            let Some(name) = pending.remove(&id) else {
                let mine = (client * PER_CLIENT + 1..=(client + 1) * PER_CLIENT)
                    .contains(&usize::from(id));
                assert!(
                    mine,
                    "client {client} got reply id {id} meant for another socket"
                );
                // A duplicate of an answered resend.
                continue;
            };
            assert_eq!(rcode, 0, "NOERROR for id {id}");
            assert_eq!(
                addr,
                Some(address_of(name)),
                "answer for id {id} (host{name})"
            );
        }
    }
    assert!(
        pending.is_empty(),
        "client {client}: {} queries never answered",
        pending.len()
    );
    resends
}

fn burst_from_several_sockets(udp_batch: usize) {
    let s = TestServer::start_with(|c| c.dns.udp_batch = udp_batch);
    for i in 0..NAMES {
        s.db()
            .add(
                &format!("c{i}"),
                address_of(i).into(),
                &format!("host{i}.weave.local"),
            )
            .unwrap();
    }
    let dns = s.dns;
    let resends: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| scope.spawn(move || burst(dns, c)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    // Resends are allowed (loss under a burst is UDP's), but not most of them.
    assert!(
        resends < CLIENTS * PER_CLIENT / 2,
        "{resends} of {} queries had to be resent",
        CLIENTS * PER_CLIENT
    );
}

#[test]
fn a_burst_from_several_sockets_is_answered_on_the_batched_path() {
    burst_from_several_sockets(32);
}

#[test]
fn a_burst_from_several_sockets_is_answered_on_the_per_datagram_path() {
    burst_from_several_sockets(1);
}
