//! Batches over real loopback sockets: every datagram's reply goes to its sender,
//! and a refused destination does not stop the rest of a batch.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use nix::sys::socket::SockaddrStorage;

use super::super::pktinfo::{self, Family, Local};
use super::{STRIDE, Sent, UdpBatch};

fn server_socket() -> UdpSocket {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    sock
}

fn client_socket() -> UdpSocket {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    sock
}

#[test]
fn every_reply_goes_to_the_datagram_sender() {
    let server = server_socket();
    let to = server.local_addr().unwrap();
    let clients: Vec<UdpSocket> = (0..4).map(|_| client_socket()).collect();
    // All 32 are queued before the server reads, so batches hold several.
    for (c, sock) in clients.iter().enumerate() {
        for i in 0..8 {
            sock.send_to(format!("q-{c}-{i}").as_bytes(), to).unwrap();
        }
    }
    let mut batch = UdpBatch::new(16, None);
    let mut seen: HashMap<String, SocketAddr> = HashMap::new();
    let mut largest = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.len() < 32 && Instant::now() < deadline {
        let Ok(n) = batch.recv(&server) else {
            continue;
        };
        largest = largest.max(n);
        batch.answer(|packet, src, out| {
            let text = String::from_utf8(packet.to_vec()).unwrap();
            seen.insert(text.clone(), src.unwrap().addr);
            let reply = text.replacen("q-", "a-", 1);
            out[..reply.len()].copy_from_slice(reply.as_bytes());
            Some(reply.len())
        });
        assert_eq!(batch.send(&server), Sent { sent: n, failed: 0 });
    }
    assert_eq!(seen.len(), 32, "every datagram received once");
    assert!(largest > 1, "some recvmmsg returned several datagrams");
    assert!(largest <= 16, "a batch never exceeds its size");
    for (c, sock) in clients.iter().enumerate() {
        let me = sock.local_addr().unwrap();
        let mut buf = [0u8; 64];
        let mut got = Vec::new();
        for _ in 0..8 {
            let (n, from) = sock.recv_from(&mut buf).unwrap();
            assert_eq!(from, to);
            got.push(String::from_utf8(buf[..n].to_vec()).unwrap());
        }
        got.sort();
        let want: Vec<String> = (0..8).map(|i| format!("a-{c}-{i}")).collect();
        assert_eq!(got, want, "client {c} got exactly its own replies");
        for i in 0..8 {
            assert_eq!(
                seen[&format!("q-{c}-{i}")],
                me,
                "source address of q-{c}-{i}"
            );
        }
    }
}

#[test]
fn unanswered_datagrams_take_no_reply_slot() {
    let server = server_socket();
    let to = server.local_addr().unwrap();
    let client = client_socket();
    for i in 0..6 {
        client.send_to(&[i], to).unwrap();
    }
    let mut batch = UdpBatch::new(8, None);
    let mut answered = 0;
    let mut queued_per_batch = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while answered < 6 && Instant::now() < deadline {
        let Ok(_) = batch.recv(&server) else {
            continue;
        };
        batch.answer(|packet, _, out| {
            answered += 1;
            // Odd datagrams are dropped: the even ones' replies must stay intact.
            if packet[0] % 2 == 1 {
                out[0] = 0xff;
                return None;
            }
            out[0] = packet[0] + 100;
            Some(1)
        });
        queued_per_batch.push(batch.queued);
        batch.send(&server);
    }
    assert_eq!(answered, 6);
    assert_eq!(queued_per_batch.iter().sum::<usize>(), 3);
    let mut got = Vec::new();
    let mut buf = [0u8; 8];
    for _ in 0..3 {
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(n, 1);
        got.push(buf[0]);
    }
    got.sort_unstable();
    assert_eq!(got, [100, 102, 104]);
}

#[test]
fn a_refused_destination_is_skipped_and_the_rest_are_sent() {
    let server = server_socket();
    let a = client_socket();
    let b = client_socket();
    let mut batch = UdpBatch::new(4, None);
    // An IPv6 destination on an IPv4 socket: the kernel refuses that one message.
    let refused: SocketAddr = "[::1]:53".parse().unwrap();
    let dests = [a.local_addr().unwrap(), refused, b.local_addr().unwrap()];
    for (i, dest) in dests.iter().enumerate() {
        batch.tx[i * STRIDE] = i as u8;
        batch.tx_len[i] = 1;
        batch.tx_addr[i] = Some(SockaddrStorage::from(*dest));
    }
    batch.queued = 3;
    assert_eq!(batch.send(&server), Sent { sent: 2, failed: 1 });
    let mut buf = [0u8; 8];
    assert_eq!(a.recv(&mut buf).unwrap(), 1);
    assert_eq!(buf[0], 0);
    assert_eq!(b.recv(&mut buf).unwrap(), 1);
    assert_eq!(buf[0], 2);
}

#[test]
fn recv_times_out_when_idle() {
    let server = server_socket();
    let mut batch = UdpBatch::new(8, None);
    // The read timeout ends the wait (this is how a worker sees its stop flag).
    let err = batch.recv(&server).unwrap_err();
    assert_eq!(err, nix::errno::Errno::EAGAIN);
}

/// A wildcard socket with destinations reported: `n` queries to each of `asked`,
/// interleaved so the replies' sources alternate within a batch (several runs per
/// `sendmmsg` round). Every reply comes back from the address its query was sent
/// to, and the batch saw that address.
fn replies_leave_from_the_asked_address(wildcard: &str, asked: &[&str], family: Family) {
    let server = UdpSocket::bind(wildcard).unwrap();
    server
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    pktinfo::enable(&server, family).unwrap();
    let port = server.local_addr().unwrap().port();
    let targets: Vec<SocketAddr> = asked
        .iter()
        .map(|ip| SocketAddr::new(ip.parse().unwrap(), port))
        .collect();
    let clients: Vec<UdpSocket> = targets
        .iter()
        .map(|t| {
            let bind = if t.is_ipv4() {
                "127.0.0.1:0"
            } else {
                "[::1]:0"
            };
            let sock = UdpSocket::bind(bind).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            sock
        })
        .collect();
    let per_target = 6;
    for i in 0..per_target {
        for (c, (sock, to)) in clients.iter().zip(&targets).enumerate() {
            sock.send_to(&[c as u8, i], to).unwrap();
        }
    }
    let total = per_target as usize * targets.len();
    let mut batch = UdpBatch::new(16, Some(family));
    let mut seen_local: HashMap<u8, Vec<Option<Local>>> = HashMap::new();
    let mut answered = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while answered < total && Instant::now() < deadline {
        let Ok(_) = batch.recv(&server) else {
            continue;
        };
        batch.answer(|packet, peer, out| {
            answered += 1;
            seen_local
                .entry(packet[0])
                .or_default()
                .push(peer.unwrap().local);
            out[..2].copy_from_slice(packet);
            Some(2)
        });
        let queued = batch.queued;
        assert_eq!(
            batch.send(&server),
            Sent {
                sent: queued,
                failed: 0
            }
        );
    }
    assert_eq!(answered, total);
    for (c, (sock, asked)) in clients.iter().zip(&targets).enumerate() {
        let mut buf = [0u8; 8];
        for _ in 0..per_target {
            let (n, from) = sock.recv_from(&mut buf).expect("the reply arrives");
            assert_eq!(n, 2);
            assert_eq!(buf[0], c as u8);
            // A v4 client of a `[::]` socket sees the plain IPv4 source.
            assert_eq!(from, *asked, "the reply to a query sent to {asked}");
        }
        let locals = &seen_local[&(c as u8)];
        assert!(
            locals.iter().all(Option::is_some),
            "the destination of every query to {asked} was reported: {locals:?}"
        );
    }
}

#[test]
fn on_a_v4_wildcard_replies_leave_from_the_asked_address() {
    replies_leave_from_the_asked_address(
        "0.0.0.0:0",
        &["127.0.0.1", "127.0.0.2", "127.0.0.3"],
        Family::V4,
    );
}

#[test]
fn on_a_dual_stack_wildcard_replies_leave_from_the_asked_address() {
    replies_leave_from_the_asked_address("[::]:0", &["127.0.0.2", "::1", "127.0.0.3"], Family::V6);
}
