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
