//! What sealing costs a gossip datagram: seal + open of one message against copying
//! it, and one message sent and received over loopback through the sealed transport
//! (seal, open, and the relay through chitchat's own socket) against chitchat's
//! plain UDP transport, for a small, a typical and a largest message.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::{Ipv4Addr, SocketAddr};

use chitchat::ChitchatEnvelope;
use chitchat::transport::{Socket, Transport, UdpSocket, UdpTransport};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dwara_cluster::datagram::{Keyring, MAX_DATAGRAM, Opener, Sealer};
use dwara_cluster::{ClusterKey, SealedTransport};

const SIZES: [usize; 3] = [256, 8 * 1024, MAX_DATAGRAM];

fn keyring() -> Keyring {
    Keyring::new(ClusterKey::from_bytes([7; 32]), Vec::new())
}

fn seal_open(c: &mut Criterion) {
    let mut group = c.benchmark_group("gossip_datagram");
    let ring = keyring();
    for size in SIZES {
        let message: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("copy", size), &message, |b, m| {
            b.iter(|| std::hint::black_box(m.to_vec()));
        });
        let mut sealer = Sealer::new(1);
        let mut opener = Opener::new();
        let mut parts = Vec::new();
        group.bench_with_input(BenchmarkId::new("seal+open", size), &message, |b, m| {
            b.iter(|| {
                parts.clear();
                sealer.seal(&ring, "dwara", m, &mut parts).unwrap();
                for p in &parts {
                    std::hint::black_box(opener.open(&ring, "dwara", p).unwrap());
                }
            });
        });
    }
    group.finish();
}

/// A chitchat SYN of exactly `len` bytes (V0, empty digest, the cluster id padding).
fn syn_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0x53, 0xb0, 0, 0, 0, 0];
    bytes.extend_from_slice(&u16::try_from(len - 8).unwrap().to_le_bytes());
    bytes.resize(len, b'c');
    bytes
}

struct Decoder {
    codec: UdpSocket,
    raw: tokio::net::UdpSocket,
}

impl Decoder {
    async fn new() -> Self {
        Self {
            codec: UdpSocket::open((Ipv4Addr::LOCALHOST, 0).into())
                .await
                .unwrap(),
            raw: tokio::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .unwrap(),
        }
    }

    /// chitchat's decoding of `bytes` (not public otherwise).
    async fn envelope(&mut self, bytes: &[u8]) -> ChitchatEnvelope {
        let to = self.codec.local_addr().unwrap();
        self.raw.send_to(bytes, to).await.unwrap();
        self.codec.recv().await.unwrap().envelope
    }
}

fn transports(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("gossip_transport");
    let plain = UdpTransport;
    let sealed = SealedTransport::new("dwara", keyring());
    let mut decoder = rt.block_on(Decoder::new());
    let candidates: [(&str, &dyn Transport); 2] = [("udp", &plain), ("sealed", &sealed)];
    for (name, transport) in candidates {
        let (mut a, mut b, b_addr): (Box<dyn Socket>, Box<dyn Socket>, SocketAddr) =
            rt.block_on(async {
                let a = transport
                    .open((Ipv4Addr::LOCALHOST, 0).into())
                    .await
                    .unwrap();
                let b = transport
                    .open((Ipv4Addr::LOCALHOST, 0).into())
                    .await
                    .unwrap();
                let addr = b.local_addr().unwrap();
                (a, b, addr)
            });
        for size in SIZES {
            let bytes = syn_bytes(size);
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_function(BenchmarkId::new(name, size), |bench| {
                bench.iter_batched(
                    || rt.block_on(decoder.envelope(&bytes)),
                    |envelope| {
                        rt.block_on(async {
                            a.send(b_addr, envelope).await.unwrap();
                            std::hint::black_box(b.recv().await.unwrap());
                        })
                    },
                    BatchSize::SmallInput,
                );
            });
        }
    }
    group.finish();
}

criterion_group!(benches, seal_open, transports);
criterion_main!(benches);
