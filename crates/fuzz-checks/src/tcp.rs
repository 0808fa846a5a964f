//! `dns_tcp`: arbitrary byte streams to a live DNS/TCP listener (an in-process
//! [`DnsServer`] on loopback), written in chunks so frames split across reads and
//! several frames arrive in one.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dwara_nameserver::{
    Db, DnsServer, DnsServerConfig, Forwarder, ForwarderConfig, HealthFailMode, Metrics,
};
use hickory_proto::op::{Message, ResponseCode};

use crate::dns::comparable;
use crate::{handler, zone_db};

/// The server, its runtime and its database, for the whole process.
struct Live {
    addr: SocketAddr,
    _server: DnsServer,
    _db: Db,
    _runtime: tokio::runtime::Runtime,
}

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let db = zone_db(HealthFailMode::Open);
        let mut config = DnsServerConfig::new("127.0.0.1:0".parse().unwrap());
        config.udp_workers = 1;
        config.tcp_idle_timeout = Duration::from_secs(5);
        // No fallback servers: a query to forward gets SERVFAIL at once.
        let forwarder = Arc::new(Forwarder::new(Vec::new(), ForwarderConfig::default()));
        let server = runtime
            .block_on(DnsServer::start(
                config,
                &db,
                forwarder,
                Arc::new(Metrics::new()),
            ))
            .unwrap();
        Live {
            addr: server.local_addr(),
            _server: server,
            _db: db,
            _runtime: runtime,
        }
    })
}

/// What the server must send for one complete frame.
enum Expect {
    /// This response (answers compared as a set).
    Answer(Vec<u8>),
    /// SERVFAIL with this ID: a query the server forwards, and there is no fallback.
    ServFail([u8; 2]),
}

/// The first byte is the write size (0: everything in one write), the rest is the
/// stream: 2-byte lengths and messages, possibly ending inside a frame. The server
/// answers every complete frame in order exactly as [`dwara_nameserver::QueryHandler::answer_tcp`]
/// does (SERVFAIL for what it would forward, nothing for what it drops), ignores
/// a trailing partial frame, closes the connection when the client is done and
/// keeps accepting new connections.
pub fn dns_tcp(data: &[u8]) {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let mut expected = Vec::new();
    {
        let mut guard = handler(HealthFailMode::Open)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut rest = stream;
        while let Some((len, tail)) = rest.split_first_chunk::<2>() {
            let len = usize::from(u16::from_be_bytes(*len));
            let Some(frame) = tail.get(..len) else { break };
            rest = &tail[len..];
            if let Some(reply) = guard.answer_tcp(frame) {
                expected.push(Expect::Answer(reply.to_vec()));
            } else if frame.len() >= 12 && frame[2] & 0x80 == 0 {
                expected.push(Expect::ServFail([frame[0], frame[1]]));
            }
        }
    }
    let mut conn = TcpStream::connect(live().addr).expect("the DNS/TCP listener is gone");
    conn.set_nodelay(true).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = conn.try_clone().unwrap();
    let received = std::thread::scope(|s| {
        let read = s.spawn(move || {
            let mut all = Vec::new();
            reader
                .read_to_end(&mut all)
                .expect("the server did not close the connection after the client's end");
            all
        });
        let size = if chunk == 0 {
            stream.len().max(1)
        } else {
            usize::from(chunk)
        };
        for piece in stream.chunks(size) {
            // The server may close first after a frame it cannot take; fine.
            if conn.write_all(piece).is_err() {
                break;
            }
            conn.flush().ok();
        }
        let _ = conn.shutdown(Shutdown::Write);
        read.join().unwrap()
    });
    let mut rest = &received[..];
    let mut frames = Vec::new();
    while let Some((len, tail)) = rest.split_first_chunk::<2>() {
        let len = usize::from(u16::from_be_bytes(*len));
        let frame = tail
            .get(..len)
            .unwrap_or_else(|| panic!("partial response frame: {received:02x?}"));
        frames.push(frame.to_vec());
        rest = &tail[len..];
    }
    assert!(rest.is_empty(), "bytes after the last response frame");
    assert_eq!(
        frames.len(),
        expected.len(),
        "{} responses for {} answerable frames",
        frames.len(),
        expected.len()
    );
    for (got, want) in frames.iter().zip(&expected) {
        match want {
            // TCP replies are never cut short of 64 KiB.
            Expect::Answer(want) => assert_eq!(comparable(got, 65_535), comparable(want, 65_535)),
            Expect::ServFail(id) => {
                assert_eq!(&got[..2], id, "SERVFAIL for another ID");
                let m = Message::from_vec(got).unwrap();
                assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
            }
        }
    }
}
