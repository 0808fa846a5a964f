//! Record decoders fed by peers, files and the Docker daemon: the cluster's
//! key-value codec, the durable store's keys, the Docker inspect → records mapping.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::OnceLock;

use bollard::models::ContainerInspectResponse;
use dwara_cluster::codec::{
    BUCKET_FORMAT, BUCKET_FORMAT_RANKED, BUCKET_FORMAT_SERVICES, BUCKET_OVERHEAD, Bucket, Item,
    MAX_FQDN_LEN, MAX_ID_LEN, RECORD_FORMAT, Record, bucket_format, decode_bucket,
    decode_bucket_value, decode_plain, decode_record, decode_value, encode_bucket,
    encode_bucket_value, encode_record, encode_value, value_len,
};
use dwara_docker::{NameSource, NameSources, desired_records};
use dwara_nameserver::Domain;
use dwara_store::Registration;

/// Splits `data` at the first `0xff` byte (not UTF-8, so never inside a string).
fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Any bytes as a cluster record and as a chitchat value: decoding never panics; a
/// record that decodes has fields in their limits and survives encode → decode, bare
/// and as a value.
pub fn cluster_value(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(r) = decode_value(&text) {
        round_trip_record(&r);
    }
    let decoded = decode_record(data);
    if let Ok(r) = &decoded {
        assert!(
            (1..=MAX_ID_LEN).contains(&r.id.len()),
            "id length {}",
            r.id.len()
        );
        assert!((1..=MAX_FQDN_LEN).contains(&r.fqdn.len()));
        round_trip_record(r);
    }
    // A record built from the bytes: id and fqdn either side of the first 0xff.
    let (id, rest) = split(data);
    let (fqdn, ip) = split(rest);
    let ip = match ip.len() {
        16.. => IpAddr::from(<[u8; 16]>::try_from(&ip[..16]).unwrap()),
        4.. => IpAddr::from(<[u8; 4]>::try_from(&ip[..4]).unwrap()),
        _ => IpAddr::from([10, 0, 0, 1]),
    };
    let (Ok(id), Ok(fqdn)) = (std::str::from_utf8(id), std::str::from_utf8(fqdn)) else {
        return;
    };
    let r = Record {
        id: id.to_owned(),
        ip,
        fqdn: fqdn.to_owned(),
        version: data.len() as u64 * 0x0123_4567_89ab,
    };
    let valid = (1..=MAX_ID_LEN).contains(&id.len()) && (1..=MAX_FQDN_LEN).contains(&fqdn.len());
    match decode_record(&encode_record(&r)) {
        Ok(back) => {
            assert!(valid, "a record outside the limits decodes: {r:?}");
            assert_eq!(back, r);
            round_trip_record(&r);
        }
        Err(e) => assert!(!valid, "valid record {r:?} does not decode: {e}"),
    }
}

/// `r` round-trips bare and as a value.
fn round_trip_record(r: &Record) {
    assert_eq!(decode_record(&encode_record(r)).as_ref(), Ok(r));
    assert_eq!(decode_value(&encode_value(r)).as_ref(), Ok(r));
}

/// Any bytes as a bucket, as either plain form and as a chitchat value: decoding
/// never panics; a bucket that decodes holds at least one item, in strictly
/// ascending order, each within the field limits, and survives encode → decode, bare
/// and as a value. A bucket built from the bytes (items between `0xff` bytes)
/// round-trips, and the sizes the publisher plans with are the sizes it gets.
pub fn cluster_bucket(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(b) = decode_bucket_value(&text) {
        check_bucket(&b);
    }
    if let Ok(b) = decode_bucket(data) {
        check_bucket(&b);
    }
    match (data.first(), decode_plain(data)) {
        (Some(&RECORD_FORMAT), plain) => {
            assert_eq!(plain, decode_record(data).map(Bucket::from));
        }
        (Some(&(BUCKET_FORMAT | BUCKET_FORMAT_SERVICES | BUCKET_FORMAT_RANKED)), plain) => {
            assert_eq!(plain, decode_bucket(data));
        }
        (_, plain) => assert!(plain.is_err(), "{plain:?}"),
    }
    // Items from the bytes: id, name, id, name, … between 0xff bytes.
    let mut parts = data.split(|&b| b == 0xff);
    let mut items = BTreeSet::new();
    let mut valid = true;
    while let (Some(id), Some(fqdn)) = (parts.next(), parts.next()) {
        let (Ok(id), Ok(fqdn)) = (std::str::from_utf8(id), std::str::from_utf8(fqdn)) else {
            return;
        };
        valid &= (1..=MAX_ID_LEN).contains(&id.len()) && (1..=MAX_FQDN_LEN).contains(&fqdn.len());
        let n = items.len() as u8;
        let ip = if n.is_multiple_of(2) {
            IpAddr::from([10, 0, 0, n])
        } else {
            IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)])
        };
        // An id that is a valid service gives the item that service, on port n + 1,
        // with a priority and weight of its own every third item.
        let service = dwara_nameserver::ServicePort::parse(id, &(u16::from(n) + 1).to_string())
            .ok()
            .map(|s| match n % 3 {
                0 => s.with_priority(u16::from(n)).with_weight(fqdn.len() as u16),
                _ => s,
            });
        items.insert(Item {
            id: id.to_owned(),
            ip,
            fqdn: fqdn.to_owned(),
            service,
            health: dwara_nameserver::Health::from_code(n % 4).unwrap_or_default(),
        });
    }
    if items.is_empty() {
        return;
    }
    let b = Bucket {
        version: data.len() as u64 * 0x0123_4567_89ab,
        items: items.into_iter().collect(),
    };
    let bytes = encode_bucket(&b);
    let planned: usize = BUCKET_OVERHEAD + b.items.iter().map(Item::encoded_len).sum::<usize>();
    assert!(bytes.len() <= planned, "{} > {planned}", bytes.len());
    match decode_bucket(&bytes) {
        Ok(back) => {
            assert!(
                valid,
                "a bucket with fields outside the limits decodes: {b:?}"
            );
            assert_eq!(back, b);
            check_bucket(&b);
        }
        Err(e) => assert!(!valid, "valid bucket {b:?} does not decode: {e}"),
    }
}

/// `b` is well-formed and round-trips bare and as a value, at the length the
/// publisher plans for.
fn check_bucket(b: &Bucket) {
    assert!(!b.items.is_empty());
    assert!(b.items.windows(2).all(|w| w[0] < w[1]), "{b:?}");
    for item in &b.items {
        assert!((1..=MAX_ID_LEN).contains(&item.id.len()));
        assert!((1..=MAX_FQDN_LEN).contains(&item.fqdn.len()));
        if let Some(s) = &item.service {
            // Only the checked, normalised form decodes.
            let again = dwara_nameserver::ServicePort::parse(s.service(), &s.port().to_string())
                .map(|a| a.with_priority(s.priority()).with_weight(s.weight()));
            assert_eq!(again.as_ref().ok(), Some(s));
        }
    }
    let plain = encode_bucket(b);
    let ranked = b
        .items
        .iter()
        .any(|i| i.service.as_ref().is_some_and(|s| !s.has_default_rank()));
    let attributes = b
        .items
        .iter()
        .any(|i| i.service.is_some() || i.health != dwara_nameserver::Health::Unchecked);
    let want = match (ranked, attributes) {
        (true, _) => BUCKET_FORMAT_RANKED,
        (false, true) => BUCKET_FORMAT_SERVICES,
        (false, false) => BUCKET_FORMAT,
    };
    assert_eq!(
        plain[0], want,
        "format 4 iff a priority or weight, else 3 iff a service or a checked entry"
    );
    assert_eq!(bucket_format(&b.items), want);
    assert_eq!(decode_bucket(&plain).as_ref(), Ok(b));
    let v = encode_bucket_value(b);
    assert_eq!(v.len(), value_len(plain.len()));
    assert_eq!(decode_bucket_value(&v).as_ref(), Ok(b));
}

/// Any bytes as a store key, and as a row (key, then value after the first `0xff`):
/// decoding never panics, and a key or row that decodes is exactly the encoding of
/// what it decodes to (one key per registration); a registration built from the
/// bytes, with and without a service and a check, survives encode → decode.
pub fn store_record(data: &[u8]) {
    if let Ok(r) = dwara_store::decode(data) {
        assert!(!r.fqdn.is_empty());
        let again = r.encode().expect("a decoded registration encodes");
        assert_eq!(again, data, "two keys for one registration {r:?}");
    }
    let (row_key, row_value) = split(data);
    if let Ok(r) = dwara_store::decode_row(row_key, row_value) {
        assert_eq!(r.encode().expect("a decoded row encodes"), row_key);
        let value = r.encode_value().expect("a decoded value encodes");
        assert_eq!(value, row_value, "two values for one registration {r:?}");
        if let Some(s) = &r.service {
            assert!(s.port != 0 && !s.name.is_empty());
        }
    }
    let (id, rest) = split(data);
    let (fqdn, ip) = split(rest);
    let (Ok(id), Ok(fqdn)) = (std::str::from_utf8(id), std::str::from_utf8(fqdn)) else {
        return;
    };
    let ip = if ip.len() >= 16 {
        IpAddr::from(<[u8; 16]>::try_from(&ip[..16]).unwrap())
    } else {
        IpAddr::from([192, 168, 0, ip.len() as u8])
    };
    let r = Registration::new(id, ip, fqdn);
    match r.encode() {
        Ok(key) => {
            assert_eq!(dwara_store::decode(&key).as_ref().ok(), Some(&r));
            // With a service named by the id and a port from the length, and a
            // priority and weight from the bytes (the defaults for short inputs).
            let port = (data.len() % 65_536) as u16;
            let rank = |i: usize, default| {
                data.get(i..i + 2)
                    .map_or(default, |b| u16::from_be_bytes([b[0], b[1]]))
            };
            let with = r.clone().with_service(Some(dwara_store::Service {
                priority: rank(0, dwara_store::DEFAULT_PRIORITY),
                weight: rank(2, dwara_store::DEFAULT_WEIGHT),
                ..dwara_store::Service::new(id, port)
            }));
            match with.encode_value() {
                Ok(value) => {
                    assert_eq!(
                        dwara_store::decode_row(&key, &value).ok(),
                        Some(with.clone())
                    );
                    // And with a check named by the fqdn.
                    let checked = with.with_check(Some(fqdn.to_owned()));
                    match checked.encode_value() {
                        Ok(value) => {
                            assert_eq!(dwara_store::decode_row(&key, &value).ok(), Some(checked))
                        }
                        Err(_) => assert!(fqdn.len() > 255),
                    }
                }
                Err(_) => assert!(port == 0 || id.is_empty()),
            }
            // The key starts with the prefix every registration of the id shares.
            let other = Registration::new(id, IpAddr::from([1, 2, 3, 4]), "x");
            let other = other.encode().unwrap();
            let prefix = 1 + 4 + id.len();
            assert_eq!(key[..prefix], other[..prefix]);
        }
        Err(_) => assert!(fqdn.is_empty(), "{r:?} does not encode"),
    }
}

/// The addresses a container's networks list, as the mapping may use them.
fn listed_ips(c: &ContainerInspectResponse, network: Option<&str>) -> BTreeSet<IpAddr> {
    let Some(nets) = c
        .network_settings
        .as_ref()
        .and_then(|n| n.networks.as_ref())
    else {
        return BTreeSet::new();
    };
    nets.iter()
        .filter(|(name, _)| network.is_none_or(|n| n == *name))
        .flat_map(|(_, ep)| [ep.ip_address.clone(), ep.global_ipv6_address.clone()])
        .flatten()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// The first byte picks the name sources (bits 0–2), a network filter (bit 3) and
/// a `die` time (bits 4–6); the rest is JSON for a container inspect answer. Its
/// `dwara.port` / `dwara.service` / `dwara.priority` / `dwara.weight` labels give a
/// checked service or an error.
/// Every record's name is a normalised name strictly below the domain, every
/// address is one the selected networks list, and the mapping is a pure function
/// of the container (the same after a JSON round trip).
pub fn docker_event(data: &[u8]) {
    static DOMAIN: OnceLock<Domain> = OnceLock::new();
    let domain = DOMAIN.get_or_init(|| Domain::new("weave.local").unwrap());
    let Some((&opts, json)) = data.split_first() else {
        return;
    };
    let Ok(c) = serde_json::from_slice::<ContainerInspectResponse>(json) else {
        return;
    };
    let wanted: Vec<&str> = [
        (NameSource::Hostname, "hostname"),
        (NameSource::Name, "name"),
        (NameSource::Aliases, "aliases"),
    ]
    .iter()
    .enumerate()
    .filter(|(i, _)| opts & (1 << i) != 0)
    .map(|(_, (_, text))| *text)
    .collect();
    let sources: NameSources = if wanted.is_empty() {
        NameSources::all()
    } else {
        wanted.join(",").parse().unwrap()
    };
    let network = (opts & 0x08 != 0).then_some("bridge");
    let died_at = match (opts >> 4) & 0x07 {
        0 => None,
        1 => Some(0),
        2 => Some(i128::MIN),
        3 => Some(i128::MAX),
        4 => Some(1_700_000_000_000_000_000),
        5 => Some(-62_135_596_800_000_000_000), // Docker's zero time, year 1.
        _ => Some(i128::from(i64::MAX)),
    };
    // The labels give a service only in the checked form, with the labelled port.
    if let Ok(Some(s)) = dwara_docker::service_of(&c) {
        let labels = c.config.as_ref().and_then(|c| c.labels.as_ref());
        let port = labels.and_then(|l| l.get(dwara_docker::PORT_LABEL));
        assert_eq!(
            port.map(|p| p.trim().parse::<u16>().ok()),
            Some(Some(s.port()))
        );
        let again = dwara_nameserver::ServicePort::parse(s.service(), &s.port().to_string())
            .map(|a| a.with_priority(s.priority()).with_weight(s.weight()));
        assert_eq!(again.ok().as_ref(), Some(&s));
        // The labelled priority and weight, or the defaults without them.
        for (label, got, default) in [
            (dwara_docker::PRIORITY_LABEL, s.priority(), 0),
            (dwara_docker::WEIGHT_LABEL, s.weight(), 1),
        ] {
            let value = labels.and_then(|l| l.get(label));
            assert_eq!(
                value.map_or(Some(default), |v| v.trim().parse::<u16>().ok()),
                Some(got),
                "{label}"
            );
        }
    }
    let records = desired_records(&c, domain, &sources, network, died_at);
    let ips = listed_ips(&c, network);
    for (ip, name) in &records {
        assert!(ips.contains(ip), "{ip} is not an address of the container");
        assert_eq!(
            domain.normalize_member(name).ok().as_deref(),
            Some(name.as_str()),
            "{name:?} is not a normalised name below the domain"
        );
    }
    if c.state.is_none() {
        assert!(records.is_empty(), "a container without state has records");
    }
    let again: ContainerInspectResponse =
        serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
    assert_eq!(
        desired_records(&again, domain, &sources, network, died_at),
        records,
        "the mapping changed after a JSON round trip"
    );
}

/// One change of the records database read from 5 bytes: what (add, merge from a
/// peer, health, removals, hiding, purging, collecting tombstones), then the id,
/// the address, the name and the service and health.
fn records_change(db: &dwara_nameserver::Db, op: &[u8]) {
    use dwara_nameserver::{Entry, Health, ServicePort};
    const NAMES: [&str; 5] = [
        "web.weave.local",
        "a.web.weave.local",
        "b.a.web.weave.local",
        "x.y.weave.local",
        "other.weave.local",
    ];
    let [what, id, ip, name, attrs] = [op[0], op[1], op[2], op[3], op[4]];
    let id = format!("c{}", id % 24);
    let ip = if ip & 0x80 != 0 {
        IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(ip % 4)])
    } else {
        IpAddr::from([10, 0, 0, ip % 12])
    };
    let fqdn = NAMES[usize::from(name) % NAMES.len()];
    let service = match attrs & 0x03 {
        0 => None,
        1 => ServicePort::parse("_http._tcp", "80").ok(),
        2 => ServicePort::parse("_http._tcp", "8080").ok(),
        _ => ServicePort::parse("_dns._udp", "53").ok(),
    };
    let health = Health::from_code((attrs >> 2) & 0x03).unwrap_or_default();
    match what % 12 {
        0..=3 => drop(db.add_checked(&id, ip, fqdn, service.as_ref(), health)),
        4 | 5 => drop(db.apply(Entry {
            id,
            ip,
            fqdn: fqdn.to_owned(),
            origin: "peer".to_owned(),
            version: u64::from(attrs >> 4),
            tombstone: name & 0x80 != 0,
            service,
            health,
        })),
        6 => drop(db.set_health(&id, ip, health)),
        7 => drop(db.remove(&id, Some(ip), None)),
        8 => drop(db.remove(&id, None, Some(fqdn))),
        9 if attrs & 0x10 != 0 => db.hide_origin("peer"),
        9 => db.show_origin("peer"),
        10 => drop(db.purge_origin("peer")),
        _ => drop(db.gc_tombstones(std::time::Duration::ZERO)),
    }
}

/// Bytes as a sequence of changes to a records database (the first byte picks
/// failing open or closed, then 5 bytes per change, see `records_change`): after
/// every change, what the edit path keeps incrementally (serve flags, the large
/// names' indexes, the PTR index, the counts that make empty non-terminals) is what
/// a recompute from scratch gives (`Db::verify`).
pub fn records_db(data: &[u8]) {
    use dwara_nameserver::{Db, DbConfig, HealthFailMode};
    let Some((&mode, ops)) = data.split_first() else {
        return;
    };
    let mut config = DbConfig::new(Domain::new("weave.local").expect("static domain"));
    config.health_fail = if mode & 1 == 0 {
        HealthFailMode::Open
    } else {
        HealthFailMode::Closed
    };
    let db = Db::new(config);
    for (i, op) in ops.chunks_exact(5).take(400).enumerate() {
        records_change(&db, op);
        if let Err(e) = db.verify() {
            panic!("after change {i} ({op:?}): {e}");
        }
    }
}
