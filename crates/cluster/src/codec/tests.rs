//! Unit and property tests of the record codec.

use proptest::prelude::*;

use super::*;

fn sample() -> Record {
    Record {
        id: "c0ffee".into(),
        ip: "10.1.2.3".parse().unwrap(),
        fqdn: "web.weave.local.".into(),
        version: 300,
    }
}

#[test]
fn known_encoding() {
    let bytes = encode_record(&sample());
    let mut want = vec![1, 0xac, 0x02, 0, 10, 1, 2, 3, 6];
    want.extend_from_slice(b"c0ffee");
    want.push(16);
    want.extend_from_slice(b"web.weave.local.");
    assert_eq!(bytes, want);
    assert_eq!(decode_record(&bytes), Ok(sample()));
}

#[test]
fn rejects_bad_records() {
    let good = encode_record(&sample());
    assert_eq!(decode_record(&[]), Err(DecodeError::Truncated));
    assert_eq!(decode_record(&[2]), Err(DecodeError::UnknownFormat(2)));
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(decode_record(&trailing), Err(DecodeError::Trailing));
    for cut in 0..good.len() {
        assert!(decode_record(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut flags = good.clone();
    flags[3] = 0x80;
    assert_eq!(decode_record(&flags), Err(DecodeError::UnknownFlags(0x80)));
    // An 11-byte varint.
    let mut long = vec![1];
    long.extend_from_slice(&[0xff; 10]);
    long.push(0);
    assert_eq!(decode_record(&long), Err(DecodeError::BadVarint));
    let mut bad_utf8 = good;
    bad_utf8[9] = 0xff;
    assert_eq!(decode_record(&bad_utf8), Err(DecodeError::BadField("id")));
}

#[test]
fn max_version_round_trips() {
    let mut r = sample();
    r.version = u64::MAX;
    assert_eq!(decode_record(&encode_record(&r)), Ok(r));
}

#[test]
fn values_round_trip_and_values_sealed_by_older_builds_are_rejected() {
    let v = encode_value(&sample());
    assert_eq!(decode_value(&v), Ok(sample()));
    // Builds before sealed datagrams sealed values (envelope 0x02).
    let mut old = vec![0x02];
    old.extend_from_slice(&[0u8; 60]);
    assert_eq!(
        decode_value(&URL_SAFE_NO_PAD.encode(old)),
        Err(DecodeError::UnknownFormat(0x02))
    );
    assert_eq!(decode_value(""), Err(DecodeError::Truncated));
    assert_eq!(decode_value("!"), Err(DecodeError::Base64));
}

fn record() -> impl Strategy<Value = Record> {
    (
        "[a-z0-9]{1,256}",
        any::<[u8; 16]>(),
        any::<bool>(),
        "[a-z0-9-]{1,60}\\.weave\\.local\\.",
        any::<u64>(),
    )
        .prop_map(|(id, ip, v6, fqdn, version)| Record {
            id,
            ip: if v6 {
                IpAddr::from(ip)
            } else {
                IpAddr::from([ip[0], ip[1], ip[2], ip[3]])
            },
            fqdn,
            version,
        })
}

proptest! {
    #[test]
    fn records_round_trip(r in record()) {
        prop_assert_eq!(decode_record(&encode_record(&r)), Ok(r));
    }

    #[test]
    fn values_round_trip(r in record()) {
        prop_assert_eq!(decode_value(&encode_value(&r)), Ok(r));
    }

    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = decode_record(&bytes);
        let text = URL_SAFE_NO_PAD.encode(&bytes);
        let _ = decode_value(&text);
        let _ = decode_bucket_value(&text);
        let _ = decode_value(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn mutated_records_never_panic(r in record(), pos in any::<usize>(), byte in any::<u8>()) {
        let mut bytes = encode_record(&r);
        let i = pos % bytes.len();
        bytes[i] = byte;
        let _ = decode_record(&bytes);
    }
}

fn item(id: &str, ip: &str, fqdn: &str) -> Item {
    Item {
        id: id.into(),
        ip: ip.parse().unwrap(),
        fqdn: fqdn.into(),
        service: None,
        health: Default::default(),
    }
}

fn with_service(mut i: Item, service: &str, port: &str) -> Item {
    i.service = Some(ServicePort::parse(service, port).unwrap());
    i
}

#[test]
fn buckets_with_services_are_format_3() {
    let b = Bucket {
        version: 300,
        items: vec![with_service(
            item("c0ffee", "10.1.2.3", "web.weave.local."),
            "_http._tcp",
            "8080",
        )],
    };
    let bytes = encode_bucket(&b);
    let mut want = vec![3, 0xac, 0x02, 1, 0x02, 10, 1, 2, 3, 6];
    want.extend_from_slice(b"c0ffee");
    want.push(16);
    want.extend_from_slice(b"web.weave.local.");
    want.extend_from_slice(&[0x1f, 0x90, 10]);
    want.extend_from_slice(b"_http._tcp");
    assert_eq!(bytes, want);
    assert_eq!(decode_bucket(&bytes), Ok(b.clone()));
    assert_eq!(decode_plain(&bytes), Ok(b.clone()));
    assert_eq!(b.items[0].encoded_len() + 4, bytes.len());
    // A bucket without services stays format 2, which older builds read.
    let mut plain = b.clone();
    plain.items[0].service = None;
    assert_eq!(encode_bucket(&plain)[0], BUCKET_FORMAT);
    // Mixed: format 3, the plain item without the flag.
    let mixed = Bucket {
        version: 1,
        items: vec![
            item("a", "10.0.0.1", "a.weave.local."),
            with_service(item("a", "fd00::1", "a.weave.local."), "_dns._udp", "53"),
        ],
    };
    assert_eq!(decode_bucket(&encode_bucket(&mixed)), Ok(mixed));
    // The service flag in a format 2 bucket is unknown.
    let mut two = bytes.clone();
    two[0] = 2;
    assert_eq!(decode_bucket(&two), Err(DecodeError::UnknownFlags(0x02)));
    // Port 0, an unchecked or unnormalised service: rejected.
    for (at, byte, field) in [
        (bytes.len() - 13, 0, "port"),
        (bytes.len() - 12, 0, "port"),
        (bytes.len() - 10, b'h', "service"),
        (bytes.len() - 9, b'H', "service"),
        (bytes.len() - 1, b'x', "service"),
    ] {
        let mut bad = bytes.clone();
        bad[at] = byte;
        if field == "port" {
            bad[bytes.len() - 13] = 0;
            bad[bytes.len() - 12] = 0;
        }
        assert_eq!(
            decode_bucket(&bad),
            Err(DecodeError::BadField(field)),
            "{at}"
        );
    }
    for cut in 0..bytes.len() {
        assert!(decode_bucket(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn services_with_a_priority_or_weight_are_format_4_and_old_peers_still_decode() {
    let web = |port| {
        with_service(
            item("c0ffee", "10.1.2.3", "web.weave.local."),
            "_http._tcp",
            port,
        )
    };
    // What a peer of the build before priorities sends for one service: format 3,
    // byte for byte (the encoding `buckets_with_services_are_format_3` pins).
    let mut old = vec![3, 0xac, 0x02, 1, 0x02, 10, 1, 2, 3, 6];
    old.extend_from_slice(b"c0ffee");
    old.push(16);
    old.extend_from_slice(b"web.weave.local.");
    old.extend_from_slice(&[0x1f, 0x90, 10]);
    old.extend_from_slice(b"_http._tcp");
    let decoded = decode_bucket(&old).unwrap();
    let s = decoded.items[0].service.as_ref().unwrap();
    assert_eq!((s.port(), s.priority(), s.weight()), (8080, 0, 1));
    // The defaults are still written that way, so old peers read them.
    assert_eq!(encode_bucket(&decoded), old);
    // A priority or weight of its own: format 4, flag 0x10, both after the service.
    let mut ranked = web("8080");
    ranked.service = ranked.service.map(|s| s.with_priority(2).with_weight(9));
    let b = Bucket {
        version: 300,
        items: vec![ranked, item("d", "10.1.2.4", "web.weave.local.")],
    };
    let bytes = encode_bucket(&b);
    let mut want = vec![4, 0xac, 0x02, 2, 0x12, 10, 1, 2, 3, 6];
    want.extend_from_slice(b"c0ffee");
    want.push(16);
    want.extend_from_slice(b"web.weave.local.");
    want.extend_from_slice(&[0x1f, 0x90, 10]);
    want.extend_from_slice(b"_http._tcp");
    want.extend_from_slice(&[0, 2, 0, 9]);
    want.extend_from_slice(&[0, 10, 1, 2, 4, 1, b'd', 16]);
    want.extend_from_slice(b"web.weave.local.");
    assert_eq!(bytes, want);
    assert_eq!(decode_bucket(&bytes), Ok(b.clone()));
    let planned: usize = b.items.iter().map(Item::encoded_len).sum();
    assert_eq!(planned + 4, bytes.len());
    // Weight 0 is a weight; priority alone is enough for format 4.
    for (priority, weight) in [(0, 0), (5, 1), (65535, 65535)] {
        let mut i = web("80");
        i.service = i
            .service
            .map(|s| s.with_priority(priority).with_weight(weight));
        let one = Bucket {
            version: 1,
            items: vec![i],
        };
        let bytes = encode_bucket(&one);
        assert_eq!(bytes[0], BUCKET_FORMAT_RANKED);
        assert_eq!(decode_bucket(&bytes), Ok(one));
    }
    // The flag in a format 3 bucket (what an old build writes) is unknown; so is
    // the flag without a service, and the defaults under the flag (one encoding).
    let mut three = bytes.clone();
    three[0] = 3;
    assert_eq!(decode_bucket(&three), Err(DecodeError::UnknownFlags(0x12)));
    let mut unserviced = want[..4].to_vec();
    unserviced.extend_from_slice(&[0x10, 10, 1, 2, 3, 1, b'c', 1, b'x']);
    unserviced[3] = 1;
    assert_eq!(
        decode_bucket(&unserviced),
        Err(DecodeError::UnknownFlags(0x10))
    );
    let rank_at = bytes.len() - (4 + 8 + 16);
    let mut defaults = bytes.clone();
    defaults[rank_at..rank_at + 4].copy_from_slice(&[0, 0, 0, 1]);
    assert_eq!(
        decode_bucket(&defaults),
        Err(DecodeError::BadField("priority and weight"))
    );
    for cut in 0..bytes.len() {
        assert!(decode_bucket(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}

fn sample_bucket() -> Bucket {
    Bucket {
        version: 300,
        items: vec![
            item("a", "10.0.0.1", "web.weave.local."),
            item("a", "fd00::1", "web.weave.local."),
            item("b", "10.0.0.2", "db.weave.local."),
        ],
    }
}

#[test]
fn known_bucket_encoding() {
    let b = Bucket {
        version: 300,
        items: vec![item("c0ffee", "10.1.2.3", "web.weave.local.")],
    };
    let bytes = encode_bucket(&b);
    let mut want = vec![2, 0xac, 0x02, 1, 0, 10, 1, 2, 3, 6];
    want.extend_from_slice(b"c0ffee");
    want.push(16);
    want.extend_from_slice(b"web.weave.local.");
    assert_eq!(bytes, want);
    assert_eq!(decode_bucket(&bytes), Ok(b.clone()));
    assert_eq!(
        b.items[0].encoded_len() + 4,
        bytes.len(),
        "format, two one-byte varints and the item"
    );
}

#[test]
fn rejects_bad_buckets() {
    let good = encode_bucket(&sample_bucket());
    assert_eq!(decode_bucket(&good), Ok(sample_bucket()));
    assert_eq!(decode_bucket(&[]), Err(DecodeError::Truncated));
    assert_eq!(decode_bucket(&[1]), Err(DecodeError::UnknownFormat(1)));
    assert_eq!(decode_bucket(&[2, 0, 0]), Err(DecodeError::BadOrder));
    // A count the bytes cannot hold is refused before any allocation.
    let mut huge = vec![2, 0];
    huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
    assert_eq!(decode_bucket(&huge), Err(DecodeError::Truncated));
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(decode_bucket(&trailing), Err(DecodeError::Trailing));
    for cut in 0..good.len() {
        assert!(decode_bucket(&good[..cut]).is_err(), "cut at {cut}");
    }
    for items in [
        // repeated
        vec![
            item("a", "10.0.0.1", "web.weave.local."),
            item("a", "10.0.0.1", "web.weave.local."),
        ],
        // descending
        vec![
            item("b", "10.0.0.1", "web.weave.local."),
            item("a", "10.0.0.1", "web.weave.local."),
        ],
    ] {
        let bytes = encode_bucket(&Bucket { version: 1, items });
        assert_eq!(decode_bucket(&bytes), Err(DecodeError::BadOrder));
    }
}

#[test]
fn bucket_values_read_buckets_and_single_records() {
    let v = encode_bucket_value(&sample_bucket());
    assert_eq!(decode_bucket_value(&v), Ok(sample_bucket()));
    assert_eq!(v.len(), value_len(encode_bucket(&sample_bucket()).len()));
    // What builds before buckets publish: one entry under an `n` key.
    let old = encode_value(&sample());
    assert_eq!(decode_bucket_value(&old), Ok(Bucket::from(sample())));
    // A bucket is not a record.
    assert_eq!(
        decode_value(&v),
        Err(DecodeError::UnknownFormat(BUCKET_FORMAT))
    );
}

fn bucket() -> impl Strategy<Value = Bucket> {
    let rank = proptest::option::of((any::<u16>(), any::<u16>()));
    let service = proptest::option::of(("_[a-z0-9]{1,15}\\._(tcp|udp)", 1u16.., rank));
    let item = (record(), service).prop_map(|(r, s)| {
        let mut item = Bucket::from(r).items.remove(0);
        item.service = s.map(|(name, port, rank)| {
            let (priority, weight) = rank.unwrap_or((0, 1));
            ServicePort::parse(&name, &port.to_string())
                .unwrap()
                .with_priority(priority)
                .with_weight(weight)
        });
        item
    });
    (proptest::collection::btree_set(item, 1..40), any::<u64>()).prop_map(|(items, version)| {
        Bucket {
            version,
            items: items.into_iter().collect(),
        }
    })
}

proptest! {
    #[test]
    fn buckets_round_trip(b in bucket()) {
        let bytes = encode_bucket(&b);
        let items: usize = b.items.iter().map(Item::encoded_len).sum();
        prop_assert!(bytes.len() <= BUCKET_OVERHEAD + items);
        prop_assert_eq!(decode_bucket(&bytes), Ok(b.clone()));
        let v = encode_bucket_value(&b);
        prop_assert_eq!(v.len(), value_len(bytes.len()));
        prop_assert_eq!(decode_bucket_value(&v), Ok(b));
    }

    #[test]
    fn mutated_buckets_never_panic(b in bucket(), pos in any::<usize>(), byte in any::<u8>()) {
        let mut bytes = encode_bucket(&b);
        let i = pos % bytes.len();
        bytes[i] = byte;
        let _ = decode_bucket(&bytes);
        let _ = decode_plain(&bytes);
    }
}
