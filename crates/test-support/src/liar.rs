//! A DNS server that lies, written at the wire level: a plain UDP socket on
//! 127.0.0.1 (no TCP listener, so a truncated answer cannot be retried), answering
//! every A question per the current [`Lie`] and counting the queries it receives.
//!
//! Its addresses are set by the test ([`Addresses`]), so the same liar serves a
//! discovery test (unroutable 10.x addresses) and a `dwara serve` test (loopback
//! backends that really accept, and a poison address whose backend counts anything
//! that reaches it).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the liar answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lie {
    /// The truth: [`Addresses::truth`], TTL 1.
    Truth,
    /// The truth, with the message ID changed.
    WrongId,
    /// An empty answer with TC=1; there is no TCP listener to retry on.
    TruncatedNoTcp,
    /// An answer whose owner name is a pointer to itself (carrying the poison).
    CompressionLoop,
    /// The truth's addresses with TTL 0.
    ZeroTtl,
    /// Only a record for another name (`evil.`, the poison).
    OtherName,
    /// [`Addresses::mixed`] for the asked name and the poison for another one.
    OtherNameMixed,
    /// 3,000 A records for the asked name ([`Addresses::thousands`]`.x.y`); more
    /// than hickory takes over UDP (4,096 bytes), so the resolution fails.
    Thousands,
    /// The right ID and the response bit, then noise.
    Garbage,
}

impl Lie {
    /// Every lie, in the order the tests go through them.
    pub const ALL: [Lie; 8] = [
        Lie::WrongId,
        Lie::TruncatedNoTcp,
        Lie::CompressionLoop,
        Lie::ZeroTtl,
        Lie::OtherName,
        Lie::OtherNameMixed,
        Lie::Thousands,
        Lie::Garbage,
    ];
}

/// The addresses the liar puts in its answers.
#[derive(Debug, Clone)]
pub struct Addresses {
    /// The true answer.
    pub truth: Vec<Ipv4Addr>,
    /// The one record for the asked name in [`Lie::OtherNameMixed`] (a true answer).
    pub mixed: Ipv4Addr,
    /// The address that must never be published.
    pub poison: Ipv4Addr,
    /// The first two octets of the [`Lie::Thousands`] records.
    pub thousands: [u8; 2],
}

impl Addresses {
    /// The [`Lie::Thousands`] addresses.
    pub fn thousands(&self) -> Vec<Ipv4Addr> {
        let [a, b] = self.thousands;
        (0..3000u16)
            .map(|n| {
                let [hi, lo] = n.to_be_bytes();
                Ipv4Addr::new(a, b, hi, lo)
            })
            .collect()
    }
}

/// An A record whose owner is a pointer to `owner` (an offset in the message).
fn a_record(out: &mut Vec<u8>, owner: u16, ttl: u32, ip: Ipv4Addr) {
    out.extend_from_slice(&(0xc000 | owner).to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 1]);
    out.extend_from_slice(&ttl.to_be_bytes());
    out.extend_from_slice(&[0, 4]);
    out.extend_from_slice(&ip.octets());
}

/// `query` turned into a response header with `answers` records (the question kept).
fn header(query: &[u8], question_end: usize, answers: u16, flags: u8) -> Vec<u8> {
    let mut r = query[..question_end].to_vec();
    r[2] = 0x84 | flags; // QR, AA (and TC when asked).
    r[3] = 0x80; // RA, NOERROR.
    r[6..8].copy_from_slice(&answers.to_be_bytes());
    r[8..12].fill(0);
    r
}

/// The end of the question of `query` (one uncompressed name, type, class).
fn question_end(query: &[u8]) -> Option<usize> {
    let mut i = 12;
    loop {
        let len = usize::from(*query.get(i)?);
        if len == 0 {
            return Some(i + 5).filter(|&e| e <= query.len());
        }
        i += 1 + len;
    }
}

fn answer(query: &[u8], lie: Lie, addrs: &Addresses, noise: &mut u64) -> Option<Vec<u8>> {
    let end = question_end(query)?;
    let truth = |ttl| {
        let count = u16::try_from(addrs.truth.len()).unwrap_or(u16::MAX);
        let mut r = header(query, end, count, 0);
        for ip in &addrs.truth {
            a_record(&mut r, 12, ttl, *ip);
        }
        r
    };
    Some(match lie {
        Lie::Truth => truth(1),
        Lie::ZeroTtl => truth(0),
        Lie::WrongId => {
            let mut r = truth(1);
            r[0] ^= 0x5a;
            r
        }
        Lie::TruncatedNoTcp => header(query, end, 0, 0x02),
        Lie::CompressionLoop => {
            let mut r = header(query, end, 1, 0);
            let me = u16::try_from(r.len()).ok()?;
            a_record(&mut r, me, 1, addrs.poison);
            r
        }
        Lie::OtherName | Lie::OtherNameMixed => {
            let mixed = lie == Lie::OtherNameMixed;
            let mut r = header(query, end, 1 + u16::from(mixed), 0);
            // `evil.` A poison, its owner name written out.
            r.extend_from_slice(b"\x04evil\x00\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04");
            r.extend_from_slice(&addrs.poison.octets());
            if mixed {
                a_record(&mut r, 12, 1, addrs.mixed);
            }
            r
        }
        Lie::Thousands => {
            let many = addrs.thousands();
            let mut r = header(query, end, 3000, 0);
            for ip in many {
                a_record(&mut r, 12, 1, ip);
            }
            r
        }
        Lie::Garbage => {
            let mut r = vec![query[0], query[1], 0x84, 0x80];
            for _ in 0..200 {
                *noise ^= *noise << 13;
                *noise ^= *noise >> 7;
                *noise ^= *noise << 17;
                r.push(*noise as u8);
            }
            r
        }
    })
}

/// The running liar; stops when dropped.
#[derive(Debug)]
pub struct LyingDnsServer {
    addr: SocketAddr,
    lie: Arc<Mutex<Lie>>,
    queries: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl LyingDnsServer {
    /// Starts telling the truth on a free 127.0.0.1 UDP port.
    pub fn start(addrs: Addresses) -> std::io::Result<Self> {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let addr = sock.local_addr()?;
        let lie = Arc::new(Mutex::new(Lie::Truth));
        let queries = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, q, s) = (lie.clone(), queries.clone(), stop.clone());
        std::thread::Builder::new()
            .name("lying-dns".into())
            .spawn(move || {
                let mut buf = [0u8; 4096];
                let mut noise = 0x2545_f491_4f6c_dd1d_u64;
                while !s.load(Ordering::Relaxed) {
                    let Ok((n, from)) = sock.recv_from(&mut buf) else {
                        continue;
                    };
                    q.fetch_add(1, Ordering::Relaxed);
                    let lie = *l.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(r) = answer(&buf[..n], lie, &addrs, &mut noise) {
                        let _ = sock.send_to(&r, from);
                    }
                }
            })?;
        Ok(Self {
            addr,
            lie,
            queries,
            stop,
        })
    }

    /// Its UDP address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers with `lie` from now on.
    pub fn set_lie(&self, lie: Lie) {
        *self.lie.lock().unwrap_or_else(|e| e.into_inner()) = lie;
    }

    /// Queries received so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

impl Drop for LyingDnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
