//! The sealed gossip datagram opener ([`dwara_cluster::datagram`]) and the gossip key
//! file parser.

use std::path::Path;

use dwara_cluster::datagram::{Keyring, MAX_DATAGRAM, MAX_PLAIN, Opener, Rejection, Sealer};
use dwara_cluster::{ClusterKey, MAX_KEYS, parse_key_file};

const CLUSTER: &str = "fuzz";

fn ring() -> Keyring {
    Keyring::new(
        ClusterKey::from_bytes([0x42; 32]),
        vec![ClusterKey::from_bytes([0x17; 32])],
    )
}

/// Any bytes as a datagram on the gossip port: opening never panics and rejects
/// them (nothing but a key holder's datagram opens; 2^-128 odds aside). The bytes as
/// a message: sealed, every datagram fits UDP and they open back to the message, once
/// (a second time is a replay); with one byte flipped or cut short a datagram does
/// not open, and under another key nothing does.
pub fn cluster_datagram(data: &[u8]) {
    let ring = ring();
    let mut opener = Opener::new();
    let got = opener.open(&ring, CLUSTER, data);
    assert!(got.is_err(), "arbitrary bytes opened: {got:?}");

    let message = &data[..data.len().min(MAX_PLAIN)];
    let mut parts = Vec::new();
    Sealer::new(data.len() as u64)
        .seal(&ring, CLUSTER, message, &mut parts)
        .unwrap();
    assert!(parts.iter().all(|p| p.len() <= MAX_DATAGRAM));
    let other = Keyring::new(ClusterKey::from_bytes([0x99; 32]), Vec::new());
    for part in &parts {
        assert_eq!(
            Opener::new().open(&other, CLUSTER, part),
            Err(Rejection::BadSeal)
        );
        let mut bent = part.clone();
        let at = data.first().map_or(0, |b| usize::from(*b)) % bent.len();
        bent[at] ^= 0x01;
        assert!(Opener::new().open(&ring, CLUSTER, &bent).is_err());
        assert!(
            Opener::new()
                .open(&ring, CLUSTER, &part[..part.len() - 1])
                .is_err()
        );
    }
    let mut whole = None;
    for part in &parts {
        if let Some(m) = opener.open(&ring, CLUSTER, part).unwrap() {
            whole = Some(m);
        }
    }
    assert_eq!(whole.as_deref(), Some(message));
    for part in &parts {
        assert_eq!(opener.open(&ring, CLUSTER, part), Err(Rejection::Replay));
    }
}

/// Any bytes as the text of a gossip key file: parsing never panics; a keyring that
/// parses holds 1 to [`MAX_KEYS`] keys, and those keys written back one per line
/// parse to the same keyring, in the same order.
pub fn cluster_keyfile(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let path = Path::new("fuzz.keys");
    if let Ok(ring) = parse_key_file(&text, path) {
        assert!((1..=MAX_KEYS).contains(&ring.keys().len()));
        let again: String = ring
            .keys()
            .iter()
            .map(|k| format!("{}\n", k.to_base64()))
            .collect();
        let back = parse_key_file(&again, path).unwrap();
        assert_eq!(back.keys(), ring.keys());
        assert_eq!(back.ids(), ring.ids());
    }
}
