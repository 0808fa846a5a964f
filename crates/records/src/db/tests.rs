//! Unit tests of the records database.

use std::net::IpAddr;
use std::time::Duration;

use super::*;
use crate::name::wire_of_text;

fn db() -> Db {
    Db::new(DbConfig::new(Domain::new("weave.local").unwrap()))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn add_lookup_remove() {
    let db = db();
    assert!(db.add("c1", ip("10.0.0.1"), "Web.Weave.Local").unwrap());
    assert!(
        !db.add("c1", ip("10.0.0.1"), "web.weave.local.").unwrap(),
        "same entry twice"
    );
    assert!(db.add("c2", ip("10.0.0.2"), "web.weave.local").unwrap());
    assert!(
        db.add("c2", ip("10.0.0.1"), "web.weave.local").unwrap(),
        "same ip, other id"
    );
    assert_eq!(
        db.lookup("WEB.weave.local"),
        vec![ip("10.0.0.1"), ip("10.0.0.2")]
    );
    assert_eq!(
        db.lookup_addr(ip("10.0.0.1")),
        vec!["web.weave.local.".to_owned()]
    );
    assert_eq!(db.len(), 3);

    assert_eq!(db.remove("c1", Some(ip("10.0.0.1")), None), 1);
    assert_eq!(
        db.lookup("web.weave.local"),
        vec![ip("10.0.0.2"), ip("10.0.0.1")]
    );
    assert_eq!(db.remove_all("c2"), 2);
    assert!(db.lookup("web.weave.local").is_empty());
    assert_eq!(db.len(), 0);
    assert_eq!(db.remove_all("c2"), 0, "already removed");

    // Tombstones stay, with higher versions.
    let entries = db.entries();
    assert_eq!(entries.len(), 3);
    assert!(entries.iter().all(|e| e.tombstone && e.version == 2));
}

#[test]
fn readding_revives_the_tombstone() {
    let db = db();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.remove_all("c1");
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    let e = db.entries();
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].version, e[0].tombstone), (3, false));
    assert_eq!(db.lookup("a.weave.local"), vec![ip("10.0.0.1")]);
}

#[test]
fn bad_names_change_nothing() {
    let db = db();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    let before = (db.entries(), db.generation());
    assert!(matches!(
        db.add("c1", ip("10.0.0.9"), "a.example.com"),
        Err(crate::Error::OutsideDomain { .. })
    ));
    assert!(matches!(
        db.add("c1", ip("10.0.0.9"), "weave.local"),
        Err(crate::Error::OutsideDomain { .. })
    ));
    assert!(matches!(
        db.add("c1", ip("10.0.0.9"), "a..weave.local"),
        Err(crate::Error::InvalidName { .. })
    ));
    assert_eq!(db.remove("c1", None, Some("..")), 0);
    assert_eq!((db.entries(), db.generation()), before);
}

#[test]
fn remove_narrowed_by_fqdn() {
    let db = db();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.add("c1", ip("10.0.0.1"), "b.weave.local").unwrap();
    assert_eq!(
        db.remove("c1", Some(ip("10.0.0.1")), Some("B.weave.local")),
        1
    );
    assert_eq!(db.lookup("a.weave.local"), vec![ip("10.0.0.1")]);
    assert!(db.lookup("b.weave.local").is_empty());
    assert_eq!(
        db.lookup_addr(ip("10.0.0.1")),
        vec!["a.weave.local.".to_owned()]
    );
}

#[test]
fn apply_merges_by_version() {
    let db = db();
    let mut e = Entry {
        id: "c9".into(),
        ip: ip("10.0.0.9"),
        fqdn: "x.weave.local.".into(),
        origin: "peer-b".into(),
        version: 3,
        tombstone: false,
        service: None,
        health: Default::default(),
    };
    assert!(db.apply(e.clone()).unwrap());
    assert!(!db.apply(e.clone()).unwrap(), "same version: no change");
    assert_eq!(db.lookup("x.weave.local"), vec![ip("10.0.0.9")]);
    // Local removals do not touch other origins' entries.
    assert_eq!(db.remove_all("c9"), 0);
    e.version = 2;
    e.tombstone = true;
    assert!(!db.apply(e.clone()).unwrap(), "older tombstone loses");
    e.version = 4;
    assert!(db.apply(e.clone()).unwrap(), "newer tombstone wins");
    assert!(db.lookup("x.weave.local").is_empty());
    e.fqdn = "x.example.com".into();
    assert!(db.apply(e).is_err());
}

#[test]
fn hidden_origins_and_purge() {
    let db = db();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.apply(Entry {
        id: "c2".into(),
        ip: ip("10.0.0.2"),
        fqdn: "a.weave.local.".into(),
        origin: "peer-b".into(),
        version: 1,
        tombstone: false,
        service: None,
        health: Default::default(),
    })
    .unwrap();
    assert_eq!(db.lookup("a.weave.local").len(), 2);
    db.hide_origin("peer-b");
    assert_eq!(db.lookup("a.weave.local"), vec![ip("10.0.0.1")]);
    assert_eq!(db.len(), 2, "hidden entries are still stored");
    db.show_origin("peer-b");
    assert_eq!(db.lookup("a.weave.local").len(), 2);
    assert_eq!(db.purge_origin("peer-b"), 1);
    assert_eq!(db.lookup("a.weave.local"), vec![ip("10.0.0.1")]);
    assert_eq!(db.entries().len(), 1);
}

#[test]
fn tombstones_are_garbage_collected() {
    let db = db();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.add("c2", ip("10.0.0.2"), "b.weave.local").unwrap();
    db.remove_all("c1");
    assert_eq!(db.gc_tombstones(Duration::from_secs(3600)), 0);
    assert_eq!(db.gc_tombstones(Duration::ZERO), 1);
    assert_eq!(db.entries().len(), 1);
    // Freed slots are reused without confusing the indexes.
    db.add("c3", ip("10.0.0.3"), "a.weave.local").unwrap();
    assert_eq!(db.lookup("a.weave.local"), vec![ip("10.0.0.3")]);
    assert_eq!(db.lookup("b.weave.local"), vec![ip("10.0.0.2")]);
}

#[test]
fn changes_are_broadcast() {
    let db = db();
    let mut rx = db.subscribe();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.remove_all("c1");
    let c = rx.try_recv().unwrap();
    assert_eq!(
        (c.kind, c.entry.version, c.entry.origin.as_str()),
        (ChangeKind::Added, 1, DEFAULT_ORIGIN)
    );
    let c = rx.try_recv().unwrap();
    assert_eq!(
        (c.kind, c.entry.version, c.entry.tombstone),
        (ChangeKind::Removed, 2, true)
    );
    assert!(rx.try_recv().is_err(), "a no-op add publishes nothing");
}

#[test]
fn tables_follow_the_db() {
    let db = db();
    let key = wire_of_text("a.weave.local.").unwrap();
    let served = |db: &Db| -> Vec<IpAddr> {
        db.tables().names.read(&key[..], |r| {
            r.map(|r| r.iter().filter(|r| r.serve).map(|r| r.ip).collect())
                .unwrap_or_default()
        })
    };
    db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.add("c2", ip("10.0.0.1"), "a.weave.local").unwrap();
    db.add("c1", ip("fd00::1"), "a.weave.local").unwrap();
    assert_eq!(
        served(&db),
        vec![ip("10.0.0.1"), ip("fd00::1")],
        "duplicates served once"
    );
    assert_eq!(db.tables().addr_refs(ip("10.0.0.1")).len(), 1);
    db.remove("c1", Some(ip("10.0.0.1")), None);
    assert_eq!(
        served(&db),
        vec![ip("10.0.0.1"), ip("fd00::1")],
        "c2 still has it"
    );
    db.remove_all("c2");
    db.remove_all("c1");
    assert!(served(&db).is_empty());
    let refs = db.tables().addr_refs(ip("10.0.0.1"));
    assert!(
        refs.iter().all(|p| !p.serve),
        "tombstones keep the name, not served"
    );
    assert_eq!(db.gc_tombstones(Duration::ZERO), 3);
    assert!(db.tables().addr_refs(ip("10.0.0.1")).is_empty());
    assert_eq!(
        db.tables().names.len() + db.tables().v4.len() + db.tables().v6.len(),
        0
    );
    assert!(db.entries().is_empty());
}

#[test]
fn services_are_attributes_that_a_new_registration_replaces() {
    use crate::ServicePort;
    let db = db();
    let mut changes = db.subscribe();
    let http = ServicePort::parse("_http._tcp", "80").unwrap();
    let alt = ServicePort::parse("_http._tcp", "8080").unwrap();
    assert!(
        db.add_service("c1", ip("10.0.0.1"), "a.weave.local", Some(&http))
            .unwrap()
    );
    assert!(
        !db.add_service("c1", ip("10.0.0.1"), "a.weave.local", Some(&http))
            .unwrap()
    );
    assert!(
        db.add_service("c1", ip("10.0.0.1"), "a.weave.local", Some(&alt))
            .unwrap()
    );
    let e = &db.entries()[0];
    assert_eq!((e.version, e.service.as_ref()), (2, Some(&alt)));
    assert_eq!(db.len(), 1, "still one entry");
    assert!(
        db.add("c1", ip("10.0.0.1"), "a.weave.local").unwrap(),
        "none replaces it"
    );
    assert_eq!(db.entries()[0].service, None);
    let seen: Vec<Option<u16>> = std::iter::from_fn(|| changes.try_recv().ok())
        .map(|c| c.entry.service.map(|s| s.port()))
        .collect();
    assert_eq!(seen, vec![Some(80), Some(8080), None]);
    // A merge with a higher version carries the service; JSON shows it beside the rest.
    let mut e = db.entries()[0].clone();
    e.origin = "peer-b".into();
    e.service = Some(http.clone());
    assert!(db.apply(e.clone()).unwrap());
    assert_eq!(
        db.lookup_service("_http._tcp.a.weave.local"),
        vec!["10.0.0.1:80".parse().unwrap()]
    );
    e.version += 1;
    e.service = Some(alt);
    assert!(db.apply(e.clone()).unwrap());
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(
        (json["service"].as_str(), json["port"].as_u64()),
        (Some("_http._tcp"), Some(8080))
    );
    let back: Entry = serde_json::from_value(json).unwrap();
    assert_eq!(back, e);
    e.service = None;
    let json = serde_json::to_value(&e).unwrap();
    assert!(json.get("port").is_none() && json.get("service").is_none());
}

#[test]
fn only_passing_entries_are_answered_until_none_passes_then_all_are() {
    let db = db();
    db.add_checked(
        "c1",
        ip("10.0.0.1"),
        "web.weave.local",
        None,
        Health::Starting,
    )
    .unwrap();
    // The only entry has no verdict yet: not answered (failing open is for
    // unhealthy entries).
    assert!(db.lookup("web.weave.local").is_empty());
    assert_eq!(db.health_counts(), ([0, 1, 0, 0], 0));
    db.add_checked(
        "c2",
        ip("10.0.0.2"),
        "web.weave.local",
        None,
        Health::Starting,
    )
    .unwrap();
    db.add("c3", ip("10.0.0.3"), "web.weave.local").unwrap();
    assert_eq!(db.lookup("web.weave.local"), vec![ip("10.0.0.3")]);

    let mut watch = db.watch();
    watch.borrow_and_update();
    let mut changes = db.subscribe();
    assert_eq!(db.set_health("c1", ip("10.0.0.1"), Health::Healthy), 1);
    assert!(watch.has_changed().unwrap());
    let change = changes.try_recv().unwrap();
    assert_eq!(
        (change.kind, change.entry.health, change.entry.version),
        (ChangeKind::Added, Health::Healthy, 2)
    );
    assert_eq!(db.set_health("c1", ip("10.0.0.1"), Health::Healthy), 0);
    assert_eq!(
        db.lookup("web.weave.local"),
        vec![ip("10.0.0.1"), ip("10.0.0.3")]
    );
    // A re-add keeps the health the checks gave.
    assert!(
        !db.add_checked(
            "c1",
            ip("10.0.0.1"),
            "web.weave.local",
            None,
            Health::Starting
        )
        .unwrap()
    );
    assert_eq!(db.lookup_addr(ip("10.0.0.2")), Vec::<String>::new());

    db.set_health("c1", ip("10.0.0.1"), Health::Unhealthy);
    db.remove_all("c3");
    // c1 unhealthy, c2 starting: none passes, the unhealthy one is answered.
    assert_eq!(db.lookup("web.weave.local"), vec![ip("10.0.0.1")]);
    assert_eq!(db.health_counts(), ([0, 1, 0, 1], 1));
    db.set_health("c2", ip("10.0.0.2"), Health::Healthy);
    assert_eq!(db.lookup("web.weave.local"), vec![ip("10.0.0.2")]);
    assert_eq!(db.health_counts(), ([0, 0, 1, 1], 0));
}

#[test]
fn fail_closed_answers_nothing_when_no_entry_passes_and_merges_carry_health() {
    let mut config = DbConfig::new(Domain::new("weave.local").unwrap());
    config.health_fail = HealthFailMode::Closed;
    let db = Db::new(config);
    db.add_checked(
        "c1",
        ip("10.0.0.1"),
        "web.weave.local",
        None,
        Health::Unhealthy,
    )
    .unwrap();
    assert!(db.lookup("web.weave.local").is_empty());
    assert!(db.lookup_addr(ip("10.0.0.1")).is_empty());
    // A peer's entry arrives unhealthy, then healthy at a higher version.
    let theirs = Entry {
        id: "p1".into(),
        ip: ip("10.0.0.9"),
        fqdn: "web.weave.local.".into(),
        origin: "peer".into(),
        version: 3,
        tombstone: false,
        service: None,
        health: Health::Unhealthy,
    };
    db.apply(theirs.clone()).unwrap();
    assert!(db.lookup("web.weave.local").is_empty());
    db.apply(Entry {
        version: 4,
        health: Health::Healthy,
        ..theirs
    })
    .unwrap();
    assert_eq!(db.lookup("web.weave.local"), vec![ip("10.0.0.9")]);
    let listed = db.entries();
    let peer = listed.iter().find(|e| e.id == "p1").unwrap();
    assert_eq!(peer.health, Health::Healthy);
}

/// The serve flags, worked out the slow way from their definition (the same function
/// `Db::verify` checks the incremental edit path with).
fn served_by_definition(db: &Db, recs: &[Rec]) -> Vec<(bool, bool, bool)> {
    let w = db.writer.lock();
    check::flags_by_definition(&w, HealthFailMode::Open, recs)
}

/// Random registrations, health changes and removals on one name, checked after
/// every change against the definition of what is served, and the PTR index.
#[test]
fn one_pass_serve_flags_match_their_definition() {
    let db = db();
    let http = ServicePort::parse("_http._tcp", "80").unwrap();
    let alt = ServicePort::parse("_http._tcp", "8080").unwrap();
    let dns = ServicePort::parse("_dns._udp", "53").unwrap();
    let services = [None, Some(&http), Some(&alt), Some(&dns)];
    let healths = [
        Health::Unchecked,
        Health::Healthy,
        Health::Starting,
        Health::Unhealthy,
    ];
    // A small linear congruential generator: the sequence is the same every run.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        usize::try_from((seed >> 33) % n).unwrap()
    };
    for _ in 0..600 {
        let id = format!("c{}", next(6));
        let addr = ip(&format!("10.0.0.{}", next(5) + 1));
        match next(4) {
            0 | 1 => {
                let health = healths[next(4)];
                db.add_checked(&id, addr, "web.weave.local", services[next(4)], health)
                    .unwrap();
            }
            2 => {
                db.set_health(&id, addr, healths[next(4)]);
            }
            _ => {
                db.remove(&id, Some(addr), None);
            }
        }
        let wire = wire_of_text("web.weave.local").unwrap();
        let recs: Vec<Rec> = db
            .tables()
            .names
            .read(&wire[..], |r| r.map(|r| r.to_vec()).unwrap_or_default());
        let got: Vec<_> = recs
            .iter()
            .map(|r| (r.serve, r.srv_serve, r.srv_addr))
            .collect();
        assert_eq!(got, served_by_definition(&db, &recs));
        for octet in 1..=5 {
            let a = ip(&format!("10.0.0.{octet}"));
            let ptr = !db.lookup_addr(a).is_empty();
            assert_eq!(ptr, recs.iter().any(|r| r.ip == a && r.serve), "{a}");
        }
    }
}

/// A generator of the same sequence every run (a linear congruential one).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        usize::try_from((self.0 >> 33) % n).unwrap()
    }
}

/// One random change of `db`, among a few names (one of them the parent of two
/// others) large enough to keep an index: local adds with services and health,
/// merges from a peer, health changes, removals by id or by address, hiding and
/// showing the peer, purging it, collecting tombstones.
fn random_change(db: &Db, rng: &mut Lcg, failing: bool) {
    let http = ServicePort::parse("_http._tcp", "80").unwrap();
    let alt = ServicePort::parse("_http._tcp", "8080").unwrap();
    let dns = ServicePort::parse("_dns._udp", "53").unwrap();
    let services = [None, Some(&http), Some(&alt), Some(&dns)];
    let names = [
        "web.weave.local",
        "a.web.weave.local",
        "b.a.web.weave.local",
        "x.y.weave.local",
    ];
    let id = format!("c{}", rng.next(24));
    let addr = if rng.next(8) == 0 {
        ip(&format!("fd00::{}", rng.next(4) + 1))
    } else {
        ip(&format!("10.0.0.{}", rng.next(12) + 1))
    };
    let fqdn = names[rng.next(4)];
    if failing && rng.next(2) == 0 {
        // A check of a live local entry fails.
        let live: Vec<Entry> = db
            .entries()
            .into_iter()
            .filter(|e| !e.tombstone && e.origin == DEFAULT_ORIGIN)
            .collect();
        if !live.is_empty() {
            let e = &live[rng.next(live.len() as u64)];
            db.set_health(
                &e.id,
                e.ip,
                [Health::Starting, Health::Unhealthy][rng.next(2)],
            );
        }
        return;
    }
    // In failing phases checks fail or have no verdict, so names start failing open.
    let health = if failing {
        [Health::Starting, Health::Unhealthy, Health::Unhealthy][rng.next(3)]
    } else {
        Health::ALL[rng.next(4)]
    };
    match rng.next(20) {
        0..=7 => {
            db.add_checked(&id, addr, fqdn, services[rng.next(4)], health)
                .unwrap();
        }
        8..=9 => {
            let version = u64::try_from(rng.next(6)).unwrap() + 1;
            db.apply(Entry {
                id,
                ip: addr,
                fqdn: fqdn.into(),
                origin: "peer".into(),
                version,
                tombstone: rng.next(3) == 0,
                service: services[rng.next(4)].cloned(),
                health,
            })
            .unwrap();
        }
        10..=12 => {
            db.set_health(&id, addr, health);
        }
        13..=14 => {
            db.remove(&id, Some(addr), None);
        }
        15 => {
            db.remove(&id, None, Some(fqdn));
        }
        16 => {
            db.remove_all(&id);
        }
        17 => {
            if rng.next(2) == 0 {
                db.hide_origin("peer");
            } else {
                db.show_origin("peer");
            }
        }
        18 => {
            if rng.next(4) == 0 {
                db.purge_origin("peer");
            }
        }
        _ => {
            if rng.next(4) == 0 {
                db.gc_tombstones(Duration::ZERO);
            }
        }
    }
}

/// The incremental edit path (serve flags of the touched addresses only, the large
/// names' indexes and counts, the PTR index, the answered-descendant counts)
/// matches a recompute from scratch after every change, failing open and closed:
/// fail-open flips, two ports on one address, revivals, hidden and shown origins,
/// forgets then re-adds, health changes.
#[test]
fn incremental_edits_match_a_recompute_from_scratch() {
    for mode in [HealthFailMode::Open, HealthFailMode::Closed] {
        let mut config = DbConfig::new(Domain::new("weave.local").unwrap());
        config.health_fail = mode;
        let db = Db::new(config);
        let mut rng = Lcg(0x2545_f491_4f6c_dd1d);
        let (mut largest, mut failing_open) = (0, 0);
        for step in 0..3_000 {
            random_change(&db, &mut rng, (step / 500) % 2 == 1);
            if let Err(e) = db.verify() {
                panic!("{mode:?}, after change {step}: {e}");
            }
            largest = largest.max(db.writer.lock().indexes.len());
            failing_open += db.health_counts().1;
        }
        assert!(largest > 0, "no name grew large enough for an index");
        if mode == HealthFailMode::Open {
            assert!(failing_open > 0, "no name failed open");
        }
    }
}

/// A name below which another name is answered is an empty non-terminal until the
/// last answered descendant goes; tombstones and hidden records do not count.
#[test]
fn ancestors_count_answered_descendants() {
    let db = db();
    let has = |db: &Db, name: &str| {
        let wire = wire_of_text(name).unwrap();
        db.tables().has_descendants(&wire)
    };
    db.add("c1", ip("10.0.0.1"), "api.prod.eu.weave.local")
        .unwrap();
    assert!(has(&db, "prod.eu.weave.local"));
    assert!(has(&db, "eu.weave.local"));
    assert!(!has(&db, "api.prod.eu.weave.local"), "nothing below it");
    assert!(!has(&db, "weave.local"), "the domain itself is not counted");
    db.add("c2", ip("10.0.0.2"), "web.prod.eu.weave.local")
        .unwrap();
    db.remove_all("c1");
    assert!(has(&db, "prod.eu.weave.local"), "web is still answered");
    db.add_checked(
        "c3",
        ip("10.0.0.3"),
        "web.prod.eu.weave.local",
        None,
        Health::Starting,
    )
    .unwrap();
    db.remove_all("c2");
    assert!(
        !has(&db, "prod.eu.weave.local"),
        "a starting record is not answered"
    );
    db.set_health("c3", ip("10.0.0.3"), Health::Healthy);
    assert!(has(&db, "eu.weave.local"));
    db.apply(Entry {
        id: "p1".into(),
        ip: ip("10.0.0.4"),
        fqdn: "db.eu.weave.local.".into(),
        origin: "peer".into(),
        version: 1,
        tombstone: false,
        service: None,
        health: Health::Unchecked,
    })
    .unwrap();
    db.remove_all("c3");
    assert!(has(&db, "eu.weave.local"), "the peer's db is answered");
    assert!(!has(&db, "prod.eu.weave.local"));
    db.hide_origin("peer");
    assert!(!has(&db, "eu.weave.local"), "hidden records do not count");
    db.show_origin("peer");
    assert!(has(&db, "eu.weave.local"));
    db.purge_origin("peer");
    assert!(!has(&db, "eu.weave.local"));
    db.verify().unwrap();
}

/// A large name (it keeps an index) starts failing open when its last passing
/// record fails, and stops when one passes again: every record's flags change.
#[test]
fn a_large_name_flips_to_failing_open_and_back() {
    let db = db();
    let addr = |i: u8| IpAddr::from([10, 0, 1, i]);
    for i in 0..20 {
        db.add_checked(
            &format!("c{i}"),
            addr(i),
            "big.weave.local",
            None,
            Health::Healthy,
        )
        .unwrap();
    }
    assert!(db.writer.lock().indexes.len() == 1, "the name has an index");
    for i in 0..20 {
        db.set_health(&format!("c{i}"), addr(i), Health::Unhealthy);
        db.verify().unwrap();
        let served = db.lookup("big.weave.local").len();
        assert_eq!(
            served,
            if i == 19 { 20 } else { 19 - usize::from(i) },
            "after {i}"
        );
    }
    db.set_health("c7", addr(7), Health::Healthy);
    db.verify().unwrap();
    assert_eq!(db.lookup("big.weave.local"), vec![addr(7)]);
}

/// A large name of a peer's and this node's records, two ports of one service at
/// one address among them: hiding and showing the peer, purging it, collecting
/// tombstones and registering again keep the index, the flags and the tables
/// right (checked against a recompute after each step).
#[test]
fn a_large_name_survives_hiding_purging_and_re_adding() {
    let db = db();
    let http = ServicePort::parse("_http._tcp", "80").unwrap();
    let alt = ServicePort::parse("_http._tcp", "8080").unwrap();
    let addr = |i: u8| IpAddr::from([10, 0, 2, i]);
    let peer = |i: u8, service: &ServicePort| Entry {
        id: format!("p{i}"),
        ip: addr(i % 4),
        fqdn: "big.weave.local.".into(),
        origin: "peer".into(),
        version: 1,
        tombstone: false,
        service: Some(service.clone()),
        health: Health::Healthy,
    };
    for i in 0..12 {
        db.apply(peer(i, if (i / 4) % 2 == 0 { &http } else { &alt }))
            .unwrap();
    }
    for i in 0..8 {
        db.add_service(
            &format!("c{i}"),
            addr(10 + i),
            "big.weave.local",
            Some(&http),
        )
        .unwrap();
    }
    db.verify().unwrap();
    let endpoints = |db: &Db| db.lookup_service("_http._tcp.big.weave.local").len();
    assert_eq!(
        endpoints(&db),
        8 + 8,
        "4 peer addresses with two ports each"
    );
    db.hide_origin("peer");
    db.verify().unwrap();
    assert_eq!(endpoints(&db), 8);
    db.show_origin("peer");
    db.verify().unwrap();
    assert_eq!(endpoints(&db), 16);
    for i in 0..6 {
        db.remove_all(&format!("c{i}"));
    }
    assert_eq!(db.purge_origin("peer"), 12);
    db.verify().unwrap();
    assert_eq!(db.gc_tombstones(Duration::ZERO), 6);
    db.verify().unwrap();
    assert!(db.writer.lock().indexes.is_empty(), "2 records: no index");
    for i in 0..20 {
        db.add(&format!("n{i}"), addr(100 + i), "big.weave.local")
            .unwrap();
        db.verify().unwrap();
    }
    assert_eq!(db.lookup("big.weave.local").len(), 22);
    assert_eq!(db.writer.lock().indexes.len(), 1);
}
