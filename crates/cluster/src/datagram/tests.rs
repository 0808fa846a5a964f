//! Unit tests of the sealed datagram: round trips, the UDP limit, keys, tampering and replays.

use super::*;

const CLUSTER: &str = "dwara";

fn ring(byte: u8) -> Keyring {
    Keyring::new(ClusterKey::from_bytes([byte; 32]), Vec::new())
}

fn seal_one(sealer: &mut Sealer, ring: &Keyring, message: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    sealer.seal(ring, CLUSTER, message, &mut out).unwrap();
    out
}

#[test]
fn a_message_round_trips_and_is_not_in_clear() {
    let ring = ring(1);
    let mut sealer = Sealer::new(7);
    let message = b"web.weave.local 10.0.0.1".to_vec();
    let parts = seal_one(&mut sealer, &ring, &message);
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].len(), message.len() + OVERHEAD);
    assert!(!parts[0].windows(9).any(|w| w == b"web.weave"));
    let mut opener = Opener::new();
    assert_eq!(opener.open(&ring, CLUSTER, &parts[0]), Ok(Some(message)));
}

#[test]
fn an_empty_message_round_trips() {
    let ring = ring(1);
    let parts = seal_one(&mut Sealer::new(1), &ring, &[]);
    assert_eq!(parts.len(), 1);
    assert_eq!(
        Opener::new().open(&ring, CLUSTER, &parts[0]),
        Ok(Some(Vec::new()))
    );
}

#[test]
fn messages_at_the_udp_limit_are_split_in_two_datagrams_that_fit() {
    let ring = ring(1);
    let mut sealer = Sealer::new(9);
    let mut opener = Opener::new();
    // The largest message that still fits one datagram, and the smallest that does not.
    for len in [MAX_PART, MAX_PART + 1, MAX_PLAIN] {
        let message: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let parts = seal_one(&mut sealer, &ring, &message);
        assert_eq!(parts.len(), if len <= MAX_PART { 1 } else { 2 }, "{len}");
        assert!(parts.iter().all(|p| p.len() <= MAX_DATAGRAM), "{len}");
        // The second part may come first.
        let mut got = None;
        for part in parts.iter().rev() {
            if let Some(m) = opener.open(&ring, CLUSTER, part).unwrap() {
                assert!(got.is_none());
                got = Some(m);
            }
        }
        assert_eq!(got.as_deref(), Some(&message[..]), "{len}");
    }
    let mut out = Vec::new();
    assert_eq!(
        sealer.seal(&ring, CLUSTER, &vec![0; MAX_PLAIN + 1], &mut out),
        Err(TooLong { len: MAX_PLAIN + 1 })
    );
}

#[test]
fn another_key_or_cluster_id_does_not_open() {
    let parts = seal_one(&mut Sealer::new(1), &ring(1), b"hello");
    assert_eq!(
        Opener::new().open(&ring(2), CLUSTER, &parts[0]),
        Err(Rejection::BadSeal)
    );
    assert_eq!(
        Opener::new().open(&ring(1), "other", &parts[0]),
        Err(Rejection::BadSeal)
    );
}

#[test]
fn every_key_of_the_ring_opens_and_the_first_seals() {
    let old = ClusterKey::from_bytes([1; 32]);
    let new = ClusterKey::from_bytes([2; 32]);
    let both = Keyring::new(new.clone(), vec![old.clone()]);
    let only_old = Keyring::new(old.clone(), Vec::new());
    let only_new = Keyring::new(new, Vec::new());
    let mut opener = Opener::new();
    let from_old = seal_one(&mut Sealer::new(1), &only_old, b"a");
    assert_eq!(
        opener.open(&both, CLUSTER, &from_old[0]),
        Ok(Some(b"a".to_vec()))
    );
    let from_both = seal_one(&mut Sealer::new(2), &both, b"b");
    assert_eq!(
        Opener::new().open(&only_new, CLUSTER, &from_both[0]),
        Ok(Some(b"b".to_vec()))
    );
    assert_eq!(
        Opener::new().open(&only_old, CLUSTER, &from_both[0]),
        Err(Rejection::BadSeal)
    );
}

#[test]
fn tampering_anywhere_is_rejected() {
    let ring = ring(3);
    let parts = seal_one(&mut Sealer::new(5), &ring, b"some gossip message");
    for at in 0..parts[0].len() {
        let mut bad = parts[0].clone();
        bad[at] ^= 0x20;
        let got = Opener::new().open(&ring, CLUSTER, &bad);
        assert!(
            matches!(got, Err(Rejection::BadSeal | Rejection::Malformed)),
            "byte {at}: {got:?}"
        );
    }
}

#[test]
fn truncated_garbage_and_plain_chitchat_are_malformed() {
    let ring = ring(3);
    let parts = seal_one(&mut Sealer::new(5), &ring, b"x");
    let mut opener = Opener::new();
    for len in 0..parts[0].len() {
        let got = opener.open(&ring, CLUSTER, &parts[0][..len]);
        assert!(
            matches!(got, Err(Rejection::Malformed | Rejection::BadSeal)),
            "{len}: {got:?}"
        );
    }
    // A plain chitchat datagram starts with its magic number.
    let mut plain = vec![0x53, 0xb0, 0, 0];
    plain.resize(100, 0);
    assert_eq!(
        opener.open(&ring, CLUSTER, &plain),
        Err(Rejection::Malformed)
    );
    // Part headers that make no sense.
    for part in [0x00, 0x03, 0x11, 0x22, 0xf1] {
        let mut bad = parts[0].clone();
        bad[1] = part;
        assert_eq!(
            opener.open(&ring, CLUSTER, &bad),
            Err(Rejection::Malformed),
            "{part:#x}"
        );
    }
    assert_eq!(
        opener.open(&ring, CLUSTER, &parts[0]),
        Ok(Some(b"x".to_vec()))
    );
}

#[test]
fn a_datagram_opens_once_and_reordering_within_the_window_is_fine() {
    let ring = ring(4);
    let mut sealer = Sealer::new(11);
    let datagrams: Vec<Vec<u8>> = (0..200u32)
        .map(|i| seal_one(&mut sealer, &ring, &i.to_le_bytes()).remove(0))
        .collect();
    let mut opener = Opener::new();
    assert!(
        opener
            .open(&ring, CLUSTER, &datagrams[150])
            .unwrap()
            .is_some()
    );
    // Behind the newest, inside the window: accepted once.
    assert!(
        opener
            .open(&ring, CLUSTER, &datagrams[100])
            .unwrap()
            .is_some()
    );
    assert_eq!(
        opener.open(&ring, CLUSTER, &datagrams[100]),
        Err(Rejection::Replay)
    );
    assert_eq!(
        opener.open(&ring, CLUSTER, &datagrams[150]),
        Err(Rejection::Replay)
    );
    // Older than the window: refused even if never seen.
    assert_eq!(
        opener.open(&ring, CLUSTER, &datagrams[0]),
        Err(Rejection::Replay)
    );
    assert!(
        opener
            .open(&ring, CLUSTER, &datagrams[199])
            .unwrap()
            .is_some()
    );
    assert_eq!(
        opener.open(&ring, CLUSTER, &datagrams[199]),
        Err(Rejection::Replay)
    );
    // Another sender has its own window.
    let other = seal_one(&mut Sealer::new(12), &ring, b"o");
    assert!(opener.open(&ring, CLUSTER, &other[0]).unwrap().is_some());
}

#[test]
fn a_forged_datagram_does_not_move_the_window() {
    let ring = ring(4);
    let mut sealer = Sealer::new(11);
    let first = seal_one(&mut sealer, &ring, b"1").remove(0);
    let mut opener = Opener::new();
    // A forgery claiming the sender's far future sequence number.
    let mut forged = first.clone();
    forged[10..18].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        opener.open(&ring, CLUSTER, &forged),
        Err(Rejection::BadSeal)
    );
    assert!(opener.open(&ring, CLUSTER, &first).unwrap().is_some());
}

#[test]
fn the_sender_table_is_bounded() {
    let ring = ring(4);
    let mut opener = Opener::new();
    for sender in 0..(MAX_SENDERS as u64 + 10) {
        let d = seal_one(&mut Sealer::new(sender), &ring, b"s");
        assert!(opener.open(&ring, CLUSTER, &d[0]).unwrap().is_some());
    }
    assert_eq!(opener.senders.len(), MAX_SENDERS);
}

#[test]
fn a_lone_part_waits_and_the_table_of_parts_is_bounded() {
    let ring = ring(4);
    let mut sealer = Sealer::new(3);
    let mut opener = Opener::new();
    let big = vec![7u8; MAX_PART + 10];
    let mut firsts = Vec::new();
    for _ in 0..(MAX_PARTIALS + 3) {
        let parts = seal_one(&mut sealer, &ring, &big);
        assert_eq!(opener.open(&ring, CLUSTER, &parts[0]), Ok(None));
        firsts.push(parts);
    }
    assert_eq!(opener.partials.len(), MAX_PARTIALS);
    // The newest message still completes; the oldest was dropped and waits again.
    let last = firsts.last().unwrap();
    assert_eq!(opener.open(&ring, CLUSTER, &last[1]), Ok(Some(big.clone())));
}
