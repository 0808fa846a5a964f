//! Hostile traffic against a running `dwara serve`: a flood of random UDP packets,
//! idle, slow and oversized TCP connections, and a fallback server that lies. In
//! every case valid queries keep being answered correctly and the process stays up.
//!
//! The limits exercised are the name server's defaults (`DnsServerConfig::new`,
//! `ForwarderConfig::default`): a DNS/TCP connection idle for 10 s (or that takes
//! longer than 10 s to send a message from its first byte) is closed, at most 512
//! are open at once, and a forwarded query waits at most 1.5 s per fallback server
//! and 3 s in all before it gets SERVFAIL; and the same limits set lower with
//! `--dns-tcp-idle-timeout`, `--dns-tcp-lifetime` and `--dns-tcp-max-connections`.
//! Both TCP listeners (DNS and HTTP) queue up to 4,096 connects.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::cluster::await_that;
use super::nameserver::Serve;

/// The local name every test registers, and its address.
pub(super) const LOCAL: &str = "web.weave.local";
pub(super) const LOCAL_IP: [u8; 4] = [10, 32, 0, 1];

/// The server closes a DNS/TCP connection idle this long (`DnsServerConfig::new`).
const TCP_IDLE: Duration = Duration::from_secs(10);
/// The forwarder's overall deadline (`ForwarderConfig::default`).
const FORWARD_DEADLINE: Duration = Duration::from_secs(3);

pub(super) const A: u16 = 1;

/// `dwara serve` on free loopback ports with `LOCAL` registered over the HTTP API.
fn serve_with_local(fallbacks: &[SocketAddr]) -> Serve {
    serve_with_local_and(fallbacks, &[])
}

/// [`serve_with_local`] with more `dwara serve` arguments.
pub(super) fn serve_with_local_and(fallbacks: &[SocketAddr], more: &[&str]) -> Serve {
    let fallbacks: Vec<String> = fallbacks.iter().map(ToString::to_string).collect();
    let mut args = vec![
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ];
    for f in &fallbacks {
        args.extend(["--fallback", f.as_str()]);
    }
    args.extend(more);
    let s = Serve::start(&args);
    let put = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .put(format!("http://{}/name/c1/10.32.0.1", s.http))
        .body(format!("fqdn={LOCAL}"))
        .send()
        .unwrap();
    assert_eq!(put.status(), 204);
    s
}

/// A DNS query (RD set, class IN) for `name`.
pub(super) fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(u8::try_from(label.len()).unwrap());
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&1u16.to_be_bytes());
    q
}

/// What a reply says, once it is known to answer `query` (same ID, a response, the
/// same question).
#[derive(Debug, PartialEq)]
pub(super) struct Reply {
    pub(super) rcode: u8,
    /// The A records of the answer section.
    pub(super) a: Vec<[u8; 4]>,
}

fn u16_at(p: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(i)?, *p.get(i + 1)?]))
}

/// The end of the (possibly compressed) name starting at `i`.
fn skip_name(p: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let len = *p.get(i)?;
        match len {
            0 => return Some(i + 1),
            l if l & 0xc0 == 0xc0 => return Some(i + 2),
            l => i += 1 + usize::from(l),
        }
    }
}

/// Decodes `reply` as an answer to `query`; `None` when it is not one, or is
/// malformed.
pub(super) fn decode(query: &[u8], reply: &[u8]) -> Option<Reply> {
    let question_end = query.len();
    if reply.len() < question_end
        || reply[..2] != query[..2]
        || reply[2] & 0x80 == 0
        || u16_at(reply, 4)? != 1
        || !reply[12..question_end].eq_ignore_ascii_case(&query[12..question_end])
    {
        return None;
    }
    let rcode = reply[3] & 0x0f;
    let mut a = Vec::new();
    let mut i = question_end;
    for _ in 0..u16_at(reply, 6)? {
        i = skip_name(reply, i)?;
        let rtype = u16_at(reply, i)?;
        let rdlen = usize::from(u16_at(reply, i + 8)?);
        let rdata = reply.get(i + 10..i + 10 + rdlen)?;
        if rtype == A {
            a.push(rdata.try_into().ok()?);
        }
        i += 10 + rdlen;
    }
    Some(Reply { rcode, a })
}

/// Whether the `dwara serve` process is still running.
pub(super) fn alive(s: &mut Serve) -> bool {
    s.child.try_wait().unwrap().is_none()
}

pub(super) fn local_ok() -> Reply {
    Reply {
        rcode: 0,
        a: vec![LOCAL_IP],
    }
}

/// Sends `q` over UDP and waits for its answer, resending every `retry` until
/// `deadline`; returns the answer, the time from the first send, and whether the
/// first send was answered.
pub(super) fn udp_exchange(
    sock: &UdpSocket,
    server: SocketAddr,
    q: &[u8],
    retry: Duration,
    deadline: Duration,
) -> Option<(Reply, Duration, bool)> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    let mut sends = 0u32;
    while start.elapsed() < deadline {
        sock.send_to(q, server).unwrap();
        sends += 1;
        let resend_at = start.elapsed() + retry;
        while start.elapsed() < resend_at {
            sock.set_read_timeout(Some(resend_at - start.elapsed() + Duration::from_millis(1)))
                .unwrap();
            match sock.recv_from(&mut buf) {
                Ok((n, from)) if from == server => {
                    if let Some(reply) = decode(q, &buf[..n]) {
                        return Some((reply, start.elapsed(), sends == 1));
                    }
                }
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("receiving a DNS reply: {e}"),
            }
        }
    }
    None
}

/// One query over an open TCP connection; the reply within `timeout`.
pub(super) fn tcp_exchange(
    stream: &mut TcpStream,
    q: &[u8],
    timeout: Duration,
) -> std::io::Result<Vec<u8>> {
    stream.set_read_timeout(Some(timeout))?;
    let mut msg = u16::try_from(q.len()).unwrap().to_be_bytes().to_vec();
    msg.extend_from_slice(q);
    stream.write_all(&msg)?;
    tcp_read_frame(stream)
}

pub(super) fn tcp_read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    stream.read_exact(&mut len)?;
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut reply)?;
    Ok(reply)
}

/// xorshift64*: random bytes for the flood without a dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One hostile datagram: pure noise, a header that claims a query followed by
/// noise, or a valid query with a few bytes changed.
fn hostile_datagram(rng: &mut Rng, valid: &[u8], out: &mut Vec<u8>) {
    out.clear();
    match rng.below(3) {
        0 => {
            let len = rng.below(700) as usize;
            out.extend((0..len).map(|_| rng.next() as u8));
        }
        1 => {
            // ID, a query with RD, one question, then garbage for the name.
            out.extend_from_slice(&[rng.next() as u8, rng.next() as u8, 0x01, 0, 0, 1]);
            out.extend_from_slice(&[0, 0, 0, 0, 0, rng.below(2) as u8]);
            let len = rng.below(300) as usize;
            out.extend((0..len).map(|_| rng.next() as u8 & 0x3f));
        }
        _ => {
            out.extend_from_slice(valid);
            for _ in 0..=rng.below(4) {
                let i = rng.below(out.len() as u64) as usize;
                out[i] = rng.next() as u8;
            }
            out.truncate(rng.below(out.len() as u64 + 1) as usize);
        }
    }
}

pub(super) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Up to 200,000 random datagrams or 10 s of them, whichever comes first, while a
/// second client keeps asking for a local name: every one of its queries is
/// answered correctly (resent every 250 ms, within 5 s), and the server answers as
/// before once the flood is over.
#[test]
fn udp_flood_leaves_valid_queries_answered() {
    // Port 9 (discard) has no listener: whatever the noise gets forwarded fails at once.
    let mut s = serve_with_local(&["127.0.0.1:9".parse().unwrap()]);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let valid = query(1, LOCAL, A);
    let (reply, ..) = udp_exchange(
        &client,
        s.dns,
        &valid,
        Duration::from_secs(1),
        Duration::from_secs(5),
    )
    .expect("no answer before the flood");
    assert_eq!(reply, local_ok());

    let flooding = Arc::new(AtomicBool::new(true));
    let flood = {
        let flooding = flooding.clone();
        let (target, valid) = (s.dns, valid.clone());
        std::thread::spawn(move || {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let mut packet = Vec::with_capacity(1024);
            let start = Instant::now();
            let mut sent = 0u64;
            while sent < 200_000 && start.elapsed() < Duration::from_secs(10) {
                hostile_datagram(&mut rng, &valid, &mut packet);
                // Our own socket's buffer may be full for a moment; that packet is lost.
                if sock.send_to(&packet, target).is_ok() {
                    sent += 1;
                }
            }
            flooding.store(false, Ordering::Relaxed);
            (sent, start.elapsed())
        })
    };

    let mut latencies = Vec::new();
    let mut first_try = 0usize;
    let mut id = 2u16;
    while flooding.load(Ordering::Relaxed) {
        let q = query(id, LOCAL, A);
        let (reply, latency, first) = udp_exchange(
            &client,
            s.dns,
            &q,
            Duration::from_millis(250),
            Duration::from_secs(5),
        )
        .unwrap_or_else(|| panic!("query {id} unanswered for 5 s during the flood"));
        assert_eq!(reply, local_ok(), "query {id} during the flood");
        latencies.push(latency);
        first_try += usize::from(first);
        id = id.wrapping_add(1);
    }
    let (sent, took) = flood.join().unwrap();
    assert!(alive(&mut s), "dwara serve died during the flood");

    for n in 0..20u16 {
        let q = query(0x8000 + n, LOCAL, A);
        let (reply, ..) = udp_exchange(
            &client,
            s.dns,
            &q,
            Duration::from_secs(1),
            Duration::from_secs(2),
        )
        .unwrap_or_else(|| panic!("no answer after the flood"));
        assert_eq!(reply, local_ok());
    }

    assert!(!latencies.is_empty(), "no query was made during the flood");
    latencies.sort();
    eprintln!(
        "UDP flood: {sent} random datagrams in {:.1} s ({:.0}/s); {} valid queries during \
         it, {:.1}% answered on the first send, all answered; latency p50 {:?} p99 {:?} \
         max {:?}",
        took.as_secs_f64(),
        sent as f64 / took.as_secs_f64(),
        latencies.len(),
        100.0 * first_try as f64 / latencies.len() as f64,
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1],
    );
}

/// Waits (at most `within`) for the server to close `stream`, and says when.
pub(super) fn closed_by_server(
    stream: &mut TcpStream,
    since: Instant,
    within: Duration,
) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    loop {
        let left = within.checked_sub(since.elapsed())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return Some(since.elapsed()),
            // An answer to what the connection sent (a garbage DNS frame gets
            // FORMERR, a cut-off HTTP request a 408): dropped.
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Some(since.elapsed()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("reading from a DNS/TCP connection: {e}"),
        }
    }
}

/// 480 connections that send half a length prefix and nothing more, one that
/// announces 65,535 bytes and sends 100, and three that send a frame one byte a
/// second: valid TCP queries (one per connection, and several in one write on one
/// connection) are answered meanwhile, and the server closes every hostile
/// connection within its idle timeout (plus slack).
#[test]
fn idle_slow_and_oversized_tcp_connections_leave_tcp_queries_answered() {
    let mut s = serve_with_local(&["127.0.0.1:9".parse().unwrap()]);
    let opened = Instant::now();
    let mut hostile: Vec<TcpStream> = (0..480)
        .map(|_| {
            let mut c = TcpStream::connect(s.dns).unwrap();
            c.write_all(&[0]).unwrap();
            c
        })
        .collect();
    let mut oversized = TcpStream::connect(s.dns).unwrap();
    oversized.write_all(&[0xff, 0xff]).unwrap();
    oversized.write_all(&[0x55; 100]).unwrap();
    hostile.push(oversized);

    // One byte a second of a 100-byte frame: never idle for a second, but the frame
    // would take 102 s.
    let slow: Vec<_> = (0..3)
        .map(|_| {
            let target = s.dns;
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(target).unwrap();
                let start = Instant::now();
                let frame = [&[0u8, 100][..], &[0x33; 100]].concat();
                for byte in frame.iter().cycle() {
                    // A write fails once the server has closed (and reset) the connection.
                    if c.write_all(&[*byte]).is_err() {
                        return start.elapsed();
                    }
                    assert!(
                        start.elapsed() < TCP_IDLE * 3,
                        "a one-byte-a-second connection was never closed"
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
                unreachable!("the frame cycles forever")
            })
        })
        .collect();

    // Valid queries: each on a fresh connection, then 20 in one write on one connection.
    let answer_time = Duration::from_secs(5);
    for n in 0..20u16 {
        let q = query(n, LOCAL, A);
        let mut c = TcpStream::connect(s.dns).unwrap();
        let reply = tcp_exchange(&mut c, &q, answer_time)
            .unwrap_or_else(|e| panic!("TCP query {n} with 480 idle connections open: {e}"));
        assert_eq!(decode(&q, &reply), Some(local_ok()), "TCP query {n}");
    }
    let mut c = TcpStream::connect(s.dns).unwrap();
    c.set_read_timeout(Some(answer_time)).unwrap();
    let queries: Vec<Vec<u8>> = (100..120u16).map(|n| query(n, LOCAL, A)).collect();
    let mut batch = Vec::new();
    for q in &queries {
        batch.extend_from_slice(&u16::try_from(q.len()).unwrap().to_be_bytes());
        batch.extend_from_slice(q);
    }
    c.write_all(&batch).unwrap();
    for q in &queries {
        let reply = tcp_read_frame(&mut c).unwrap();
        assert_eq!(decode(q, &reply), Some(local_ok()), "pipelined TCP query");
    }
    let answered_at = opened.elapsed();

    // Every half-open connection is closed by the server: idle timeout plus slack
    // (the connections were opened over a few hundred milliseconds).
    let bound = TCP_IDLE + Duration::from_secs(5);
    let mut latest = Duration::ZERO;
    for (i, c) in hostile.iter_mut().enumerate() {
        let at = closed_by_server(c, opened, bound)
            .unwrap_or_else(|| panic!("hostile connection {i} still open after {bound:?}"));
        latest = latest.max(at);
    }
    let slow_closed: Vec<Duration> = slow.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(alive(&mut s), "dwara serve died");
    // The server still takes new TCP queries.
    let q = query(999, LOCAL, A);
    let reply = tcp_exchange(&mut TcpStream::connect(s.dns).unwrap(), &q, answer_time).unwrap();
    assert_eq!(decode(&q, &reply), Some(local_ok()));
    eprintln!(
        "TCP: 40 valid queries answered {answered_at:?} after opening 484 hostile \
         connections; the last of those closed by the server {latest:?} after opening; \
         one-byte-a-second connections noticed closed after {slow_closed:?}"
    );
}

/// How the lying fallback answers a question, chosen by its first label.
fn lie(query: &[u8], rng: &mut Rng) -> Vec<Vec<u8>> {
    let Some(end) = skip_name(query, 12)
        .map(|e| e + 4)
        .filter(|&e| e <= query.len())
    else {
        return Vec::new();
    };
    let label_len = usize::from(query[12]);
    let label = query.get(13..13 + label_len).unwrap_or_default();
    // The truthful answer: one A record, 6.6.6.6.
    let mut truth = query[..end].to_vec();
    truth[2] = 0x81;
    truth[3] = 0x80;
    truth[6..12].copy_from_slice(&[0, 1, 0, 0, 0, 0]);
    truth.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 6, 6, 6, 6]);
    match label {
        b"wrongid" => {
            let mut r = truth;
            r[0] ^= 0xff;
            vec![r.clone(), r]
        }
        b"garbage" => {
            // The right ID and the response bit, then noise.
            let mut r = vec![query[0], query[1], 0x81, 0x80];
            r.extend((0..rng.below(200)).map(|_| rng.next() as u8));
            vec![r, (0..40).map(|_| rng.next() as u8).collect()]
        }
        // Cut inside the question.
        b"truncated" => vec![truth[..12 + label_len / 2].to_vec(), truth[..12].to_vec()],
        // Cut inside the answer record.
        b"cutanswer" => vec![truth[..truth.len() - 3].to_vec()],
        b"othername" => {
            // The right ID, an answer for another name.
            let mut r = truth;
            r[13] = b'X';
            vec![r]
        }
        _ => Vec::new(), // "silent", and anything else: never answers.
    }
}

const LIES: [&str; 6] = [
    "wrongid",
    "garbage",
    "truncated",
    "cutanswer",
    "othername",
    "silent",
];

/// A fallback server that lies on UDP and on TCP (same port), per [`lie`].
fn lying_fallback(stop: Arc<AtomicBool>) -> SocketAddr {
    // A port below the ephemeral range, free for both protocols: a UDP port 0 bind
    // can land on a TCP port that a client socket (or TIME_WAIT) holds.
    let addr = test_support::free_addr();
    let udp = UdpSocket::bind(addr).unwrap();
    let tcp = TcpListener::bind(addr).unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let udp_stop = stop.clone();
    std::thread::spawn(move || {
        let mut rng = Rng(7);
        let mut buf = [0u8; 4096];
        while !udp_stop.load(Ordering::Relaxed) {
            if let Ok((n, from)) = udp.recv_from(&mut buf) {
                for r in lie(&buf[..n], &mut rng) {
                    let _ = udp.send_to(&r, from);
                }
            }
        }
    });
    tcp.set_nonblocking(false).unwrap();
    std::thread::spawn(move || {
        for conn in tcp.incoming() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut rng = Rng(11);
                let Ok(q) = tcp_read_frame(&mut conn) else {
                    return;
                };
                for r in lie(&q, &mut rng) {
                    let mut msg = u16::try_from(r.len()).unwrap().to_be_bytes().to_vec();
                    msg.extend_from_slice(&r);
                    let _ = conn.write_all(&msg);
                }
                if q.get(13..20) == Some(&b"garbage"[..]) {
                    // And a frame that announces more than ever comes.
                    let _ = conn.write_all(&[0xff, 0xff, 1, 2, 3]);
                }
                // Keep the connection open, silent, until the forwarder gives up.
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = conn.read(&mut [0u8; 1]);
            });
        }
    });
    addr
}

/// A fallback that answers with a wrong ID, noise, a packet cut short, an answer for
/// another name, or nothing, over UDP and TCP: every forwarded query gets SERVFAIL
/// within the forwarding deadline, and local names are answered meanwhile.
#[test]
fn lying_fallback_gives_servfail_and_local_names_still_answer() {
    let stop = Arc::new(AtomicBool::new(false));
    let liar = lying_fallback(stop.clone());
    // Listed twice: the forwarder tries it twice (1.5 s each) and so reaches its 3 s
    // deadline.
    let mut s = serve_with_local(&[liar, liar]);
    let server = s.dns;
    let started = Instant::now();
    let forwarded: Vec<_> = LIES
        .iter()
        .enumerate()
        .flat_map(|(i, lie)| {
            let name = format!("{lie}.example.com");
            let id = u16::try_from(i).unwrap();
            let udp = {
                let name = name.clone();
                std::thread::spawn(move || {
                    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
                    let q = query(id, &name, A);
                    // One send (a resend would start a second forward).
                    let (reply, took, _) = udp_exchange(
                        &sock,
                        server,
                        &q,
                        Duration::from_secs(8),
                        Duration::from_secs(8),
                    )
                    .unwrap_or_else(|| panic!("UDP {name}: no answer"));
                    (format!("UDP {name}"), reply, took)
                })
            };
            let tcp = std::thread::spawn(move || {
                let q = query(id + 100, &name, A);
                let start = Instant::now();
                let mut c = TcpStream::connect(server).unwrap();
                let reply = tcp_exchange(&mut c, &q, Duration::from_secs(8))
                    .unwrap_or_else(|e| panic!("TCP {name}: {e}"));
                let reply =
                    decode(&q, &reply).unwrap_or_else(|| panic!("TCP {name}: not an answer"));
                (format!("TCP {name}"), reply, start.elapsed())
            });
            [udp, tcp]
        })
        .collect();

    // Local names are answered at once while the forwards hang.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut local_queries = 0u32;
    while started.elapsed() < FORWARD_DEADLINE {
        // IDs wrap (tens of thousands of queries in 3 s); one is in flight at a time.
        let q = query(1000u16.wrapping_add(local_queries as u16), LOCAL, A);
        let (reply, ..) = udp_exchange(
            &sock,
            server,
            &q,
            Duration::from_millis(500),
            Duration::from_secs(2),
        )
        .expect("a local name went unanswered while forwards hung");
        assert_eq!(reply, local_ok());
        local_queries += 1;
    }

    let slack = Duration::from_millis(1500);
    let mut times = Vec::new();
    for t in forwarded {
        let (what, reply, took) = t.join().unwrap();
        assert_eq!(
            reply,
            Reply {
                rcode: 2,
                a: Vec::new()
            },
            "{what}: the lie got through"
        );
        assert!(
            took <= FORWARD_DEADLINE + slack,
            "{what}: SERVFAIL only after {took:?}"
        );
        times.push(format!("{what} {took:.1?}"));
    }
    assert!(alive(&mut s), "dwara serve died");
    stop.store(true, Ordering::Relaxed);
    eprintln!(
        "lying fallback: SERVFAIL for every lie ({}); {local_queries} local queries \
         answered meanwhile",
        times.join(", ")
    );
}

/// Whether the server has closed `stream`, looking for at most `wait`: a read of 0
/// bytes or a reset.
fn closed_now(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    match stream.read(&mut [0u8; 512]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
    }
}

/// With `--dns-tcp-idle-timeout 2 --dns-tcp-lifetime 6 --dns-tcp-max-connections 64`:
/// clients that send a valid query one byte every 1.5 s (never idle for the timeout)
/// are cut 2 s after the first byte of their frame; clients that send a whole valid
/// query every 1.5 s are answered and then closed once their lifetime is over; the
/// connections beyond 64 are closed on accept; and valid TCP queries on fresh
/// connections keep being answered all along.
#[test]
fn drip_fed_and_long_lived_tcp_connections_are_cut_within_their_bounds() {
    let idle = Duration::from_secs(2);
    let lifetime = Duration::from_secs(6);
    let mut s = serve_with_local_and(
        &["127.0.0.1:9".parse().unwrap()],
        &[
            "--dns-tcp-idle-timeout",
            "2",
            "--dns-tcp-lifetime",
            "6",
            "--dns-tcp-max-connections",
            "64",
        ],
    );
    let target = s.dns;
    let step = Duration::from_millis(1500);
    let drippers: Vec<_> = (0..3u16)
        .map(|n| {
            std::thread::spawn(move || {
                let q = query(200 + n, LOCAL, A);
                let frame = [&u16::try_from(q.len()).unwrap().to_be_bytes()[..], &q].concat();
                let mut c = TcpStream::connect(target).unwrap();
                let start = Instant::now();
                for byte in frame.iter().cycle() {
                    if c.write_all(&[*byte]).is_err() {
                        return start.elapsed();
                    }
                    // Waiting for the next byte doubles as watching for the close.
                    if closed_now(&mut c, step) {
                        return start.elapsed();
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(20),
                        "a drip-fed DNS/TCP connection was never closed"
                    );
                }
                unreachable!("the frame cycles forever")
            })
        })
        .collect();
    let steady: Vec<_> = (0..2u16)
        .map(|n| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(target).unwrap();
                let start = Instant::now();
                let mut answered = 0u32;
                loop {
                    let q = query(300 + n * 100 + answered as u16, LOCAL, A);
                    match tcp_exchange(&mut c, &q, Duration::from_secs(5)) {
                        Ok(reply) => {
                            assert_eq!(decode(&q, &reply), Some(local_ok()), "steady query");
                            answered += 1;
                        }
                        // Closed by the server at a message boundary.
                        Err(_) => return (start.elapsed(), answered),
                    }
                    if closed_now(&mut c, step) {
                        return (start.elapsed(), answered);
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(30),
                        "a steady DNS/TCP connection outlived its lifetime"
                    );
                }
            })
        })
        .collect();

    // Meanwhile, fresh connections are answered; 8 s covers the steady clients'
    // lifetime.
    let started = Instant::now();
    let mut fresh = 0u32;
    while started.elapsed() < lifetime + idle {
        let q = query(1000 + fresh as u16, LOCAL, A);
        let mut c = TcpStream::connect(target).unwrap();
        let reply = tcp_exchange(&mut c, &q, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("fresh TCP query {fresh}: {e}"));
        assert_eq!(
            decode(&q, &reply),
            Some(local_ok()),
            "fresh TCP query {fresh}"
        );
        fresh += 1;
        std::thread::sleep(Duration::from_millis(100));
    }

    let slack = Duration::from_secs(2);
    let dripped: Vec<Duration> = drippers.into_iter().map(|t| t.join().unwrap()).collect();
    for d in &dripped {
        // The frame's first byte goes out at once; the frame must be whole 2 s later.
        // (A deadline per read would let it live 3.5 s: the length in 1.5 s, then
        // 2 s for the body.)
        assert!(
            *d <= idle + Duration::from_secs(1),
            "a drip-fed connection lived {d:?}"
        );
    }
    let lived: Vec<(Duration, u32)> = steady.into_iter().map(|t| t.join().unwrap()).collect();
    for (d, answered) in &lived {
        assert!(*answered >= 2, "a steady connection got {answered} answers");
        assert!(
            *d >= lifetime && *d <= lifetime + idle + slack,
            "a steady connection lived {d:?} (lifetime {lifetime:?})"
        );
    }

    // The connection limit: of 80 silent connections, those beyond 64 are closed on
    // accept, long before the idle timeout.
    let opened = Instant::now();
    let mut silent: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(target).unwrap())
        .collect();
    // Those closed on accept: polled until 16 are seen, for less than the idle time.
    let mut closed = vec![false; silent.len()];
    while closed.iter().filter(|c| **c).count() < 16 && opened.elapsed() < idle / 2 {
        for (c, done) in silent.iter_mut().zip(&mut closed) {
            *done = *done || closed_now(c, Duration::from_millis(1));
        }
    }
    let refused = closed.iter().filter(|c| **c).count();
    let refused_within = opened.elapsed();
    assert!(
        refused >= 16 && refused_within < idle / 2,
        "{refused} of 80 connections closed on accept (limit 64) within {refused_within:?}"
    );
    for (i, c) in silent.iter_mut().enumerate() {
        assert!(
            closed_by_server(c, opened, idle + slack).is_some(),
            "silent connection {i} still open after {:?}",
            idle + slack
        );
    }
    let q = query(9999, LOCAL, A);
    let reply = tcp_exchange(
        &mut TcpStream::connect(target).unwrap(),
        &q,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(decode(&q, &reply), Some(local_ok()));
    assert!(alive(&mut s), "dwara serve died");
    eprintln!(
        "DNS/TCP limits: drip-fed connections closed after {dripped:?}; steady ones after \
         {lived:?} (time, answers); {refused} of 80 closed on accept; {fresh} fresh \
         queries answered meanwhile"
    );
}

/// The accept queue of the TCP listener on `addr`, as the kernel reports it (`ss`:
/// Send-Q of a listening socket is its backlog).
fn listen_backlog(addr: SocketAddr) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", &format!("sport = :{}", addr.port())])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&addr.to_string()))
        .unwrap_or_else(|| panic!("no listener on {addr} in: {text}"));
    line.split_whitespace()
        .nth(2)
        .and_then(|q| q.parse().ok())
        .unwrap_or_else(|| panic!("no Send-Q in {line:?}"))
}

/// Both TCP listeners queue a burst of connects: the DNS/TCP and HTTP backlogs are
/// 4,096 (or the kernel's `somaxconn` where that is lower), not std's 128, which
/// drops SYNs when many clients fall back to TCP at once.
#[test]
fn dns_and_http_listeners_have_deep_accept_queues() {
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = somaxconn.min(4096);
    let s = serve_with_local(&[]);
    assert_eq!(listen_backlog(s.dns), want, "DNS/TCP backlog");
    assert_eq!(listen_backlog(s.http), want, "HTTP backlog");
}

/// Two hosts on a bridge (network namespaces): `dwara serve` on `[::]:53` on one,
/// dig on the other asking each of the server's addresses: its primary IPv4
/// address, a secondary one on the same interface, a unique-local IPv6 address and
/// an IPv6 link-local one (where the reply must also leave by the interface the
/// query came in on). dig refuses a reply from any other address than the one it
/// asked. Before replies carried their source, the secondary IPv4 address timed out.
#[test]
fn across_hosts_a_wildcard_listener_answers_from_every_asked_address() {
    use super::cluster::{Netns, ip};
    let Some(ns) = Netns::required(2) else {
        return;
    };
    let (server_ns, client_ns) = (&ns.nodes[0], &ns.nodes[1]);
    let add = |netns: &str, addr: &str| {
        ip(&["-n", netns, "addr", "add", addr, "dev", "eth0", "nodad"]).unwrap();
    };
    add(server_ns, "10.99.0.11/24");
    add(server_ns, "fd00:99::1/64");
    add(server_ns, "fe80::99:1/64");
    add(client_ns, "fd00:99::2/64");
    add(client_ns, "fe80::99:2/64");
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", server_ns, super::nameserver::BIN])
        .args(["serve", "--docker", "off", "--fallback", "127.0.0.1:9"])
        .args(["--dns-listen", "[::]:53", "--http-listen", "127.0.0.1:0"]);
    let _server = Serve::spawn(cmd);
    let primary = Netns::addr(0).to_string();
    for asked in [
        primary.as_str(),
        "10.99.0.11",
        "fd00:99::1",
        "fe80::99:1%eth0",
    ] {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", client_ns, "dig", &format!("@{asked}")])
            .args([
                "-p",
                "53",
                "nothing.weave.local",
                "A",
                "+tries=1",
                "+time=3",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("status: NXDOMAIN") && !text.contains("unexpected source"),
            "dig @{asked}: {text}"
        );
    }
}

/// On a wildcard address every UDP reply leaves from the address its query was
/// sent to (`IP_PKTINFO` / `IPV6_PKTINFO`), whether answered locally or forwarded,
/// on the batched path and the per-datagram one, over IPv4 and from a dual-stack
/// `[::]`. Without it the reply to 127.0.0.2 came from 127.0.0.1 and a client
/// dropped it.
#[test]
fn on_a_wildcard_listener_replies_leave_from_the_asked_address() {
    let upstream = super::nameserver::fallback();
    let fallback = upstream.addr().to_string();
    let cases: [(&str, &str, &[&str]); 3] = [
        ("0.0.0.0:0", "32", &["127.0.0.2", "127.0.0.3"]),
        ("0.0.0.0:0", "1", &["127.0.0.2", "127.0.0.3"]),
        ("[::]:0", "32", &["127.0.0.2", "::1"]),
    ];
    for (listen, batch, asked) in cases {
        let s = Serve::start(&[
            "--dns-listen",
            listen,
            "--http-listen",
            "127.0.0.1:0",
            "--dns-udp-batch",
            batch,
            "--fallback",
            &fallback,
        ]);
        assert!(
            !s.logged("without IP_PKTINFO"),
            "{listen}: the kernel refused IP_PKTINFO"
        );
        for (i, ip) in asked.iter().enumerate() {
            let to = SocketAddr::new(ip.parse().unwrap(), s.dns.port());
            let bind = if to.is_ipv4() {
                "127.0.0.1:0"
            } else {
                "[::1]:0"
            };
            let sock = UdpSocket::bind(bind).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // A local name (NXDOMAIN from our database) and a forwarded one
            // (dnsmasq's hosts file: 127.0.0.99).
            for (n, (name, rcode)) in [("nothing.weave.local", 3), ("fallback-host.example", 0)]
                .into_iter()
                .enumerate()
            {
                let id = u16::try_from(i * 2 + n).unwrap();
                sock.send_to(&query(id, name, A), to).unwrap();
                let mut buf = [0u8; 512];
                let (len, from) = sock.recv_from(&mut buf).unwrap_or_else(|e| {
                    panic!("{listen} batch {batch}: {name} asked at {to}: {e}")
                });
                assert_eq!(
                    from, to,
                    "{listen} batch {batch}: the reply for {name} came from {from}"
                );
                assert_eq!(u16::from_be_bytes([buf[0], buf[1]]), id);
                assert_eq!(buf[3] & 0x0f, rcode, "{name}: rcode");
                if rcode == 0 {
                    assert!(
                        buf[..len].windows(4).any(|w| w == [127, 0, 0, 99]),
                        "{name}: the forwarded answer holds 127.0.0.99"
                    );
                }
            }
        }
    }
}

/// Garbage on the gossip port: chitchat drops each datagram with a WARN line of its
/// own; the binary counts those instead (`dwara_cluster_invalid_datagrams_total`)
/// and the engine logs one summary per 10 s, so a flood does not flood the log.
/// Sent in batches, each awaited in the counter, so no datagram is lost to a full
/// socket buffer and the count is exact.
#[test]
fn garbage_on_the_gossip_port_is_counted_not_logged_per_datagram() {
    let gossip = test_support::free_addr();
    let s = Serve::start(&[
        "--dns-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--gossip-listen",
        &gossip.to_string(),
    ]);
    let counted = || -> f64 {
        s.metric("dwara_cluster_invalid_datagrams_total")
            .expect("the counter is exported")
    };
    assert_eq!(counted(), 0.0);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut rng = Rng(23);
    let (batches, per_batch) = (10u32, 50u32);
    for b in 1..=batches {
        for i in 0..per_batch {
            let len = 1 + usize::try_from(rng.next() % 300).unwrap() + usize::try_from(i).unwrap();
            let junk: Vec<u8> = (0..len).map(|_| rng.next().to_le_bytes()[0]).collect();
            sock.send_to(&junk, gossip).unwrap();
        }
        await_that(
            &format!("batch {b} counted"),
            Duration::from_secs(10),
            || counted() >= f64::from(b * per_batch),
        );
    }
    assert_eq!(counted(), f64::from(batches * per_batch));
    let summary = format!("dropped={}", batches * per_batch);
    await_that(
        &format!("a summary line with {summary}"),
        Duration::from_secs(15),
        || s.logged(&summary),
    );
    assert!(
        !s.logged("invalid-chitchat-payload"),
        "chitchat's line per datagram reached the log"
    );
    // Still serving.
    let q = query(9, "nothing.weave.local", A);
    let dns = UdpSocket::bind("127.0.0.1:0").unwrap();
    dns.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    dns.send_to(&q, s.dns).unwrap();
    let mut buf = [0u8; 512];
    let (n, _) = dns
        .recv_from(&mut buf)
        .expect("the name server still answers");
    assert!(n >= 12 && buf[3] & 0x0f == 3, "NXDOMAIN");
}

/// A neighbour with another cluster id gossiping at us: chitchat warns on every
/// datagram (a SYN for another cluster, a "wrong cluster" answer: about 20 lines a
/// second here). At most 20 of its warnings a 10 s window reach the log; the rest
/// are counted (`dwara_cluster_suppressed_warnings_total`) and reported in one line.
#[test]
fn chitchat_warnings_from_a_foreign_cluster_are_limited() {
    let (a, b) = (test_support::free_addr(), test_support::free_addr());
    let node = |me: SocketAddr, peer: SocketAddr, id: &str| {
        Serve::start(&[
            "--dns-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--gossip-listen",
            &me.to_string(),
            "--peer",
            &peer.to_string(),
            "--cluster-id",
            id,
        ])
    };
    let started = Instant::now();
    let alpha = node(a, b, "alpha");
    let _beta = node(b, a, "beta");
    await_that(
        "a summary of suppressed warnings",
        Duration::from_secs(30),
        || alpha.logged("chitchat warnings beyond the limit"),
    );
    let elapsed = started.elapsed().as_secs();
    let chitchat_lines = alpha
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(" WARN chitchat"))
        .count();
    let windows = usize::try_from(elapsed / 10 + 2).unwrap();
    assert!(chitchat_lines > 0, "the first warnings are logged");
    assert!(
        chitchat_lines <= 20 * windows,
        "{chitchat_lines} chitchat lines in {elapsed} s"
    );
    let suppressed = alpha
        .metric("dwara_cluster_suppressed_warnings_total")
        .expect("the counter is exported");
    assert!(suppressed > 0.0, "suppressed warnings are counted");
}
