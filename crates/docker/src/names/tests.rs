//! Unit tests of the name and liveness rules, on inspect answers shaped like the
//! daemon's (API 1.41).

use super::*;

const ID: &str = "af101f233493d3eee9d8737a89f96ac82889d80eff05f653d64193b01763d84f";

fn inspect(json: serde_json::Value) -> ContainerInspectResponse {
    serde_json::from_value(json).unwrap()
}

fn running(host: &str, domain: &str) -> ContainerInspectResponse {
    container("running", Restarting::No, host, domain)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Restarting {
    No,
    Yes,
}

fn container(
    status: &str,
    restarting: Restarting,
    host: &str,
    domain: &str,
) -> ContainerInspectResponse {
    let restarting = restarting == Restarting::Yes;
    inspect(serde_json::json!({
        "Id": ID,
        "Name": "/web_1",
        "State": {
            "Status": status, "Running": status == "running" || restarting,
            "Restarting": restarting, "Paused": false,
            "StartedAt": "2026-12-01T08:56:11.510697296Z"
        },
        "Config": { "Hostname": host, "Domainname": domain },
        "NetworkSettings": { "Networks": {
            "bridge": { "IPAddress": "172.17.0.2", "GlobalIPv6Address": "", "Aliases": null },
            "front": {
                "IPAddress": "10.5.0.3", "GlobalIPv6Address": "fd00::3",
                "Aliases": ["api", "af101f233493", "db.weave.local"]
            }
        }}
    }))
}

fn naming(sources: &str, network: Option<&str>) -> Naming {
    Naming {
        domain: Domain::new("weave.local").unwrap(),
        sources: sources.parse().unwrap(),
        network: network.map(str::to_owned),
    }
}

fn names_of(records: &BTreeSet<Record>) -> BTreeSet<String> {
    records.iter().map(|(_, n)| n.clone()).collect()
}

#[test]
fn hostname_and_domainname_in_the_domain_register_every_address() {
    let c = running("web1", "weave.local");
    let got = desired(&c, &naming("hostname", None), None);
    let want: BTreeSet<Record> = ["172.17.0.2", "10.5.0.3", "fd00::3"]
        .iter()
        .map(|ip| (ip.parse().unwrap(), "web1.weave.local.".to_owned()))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn a_hostname_carrying_the_domain_counts_and_case_is_folded() {
    let c = running("Web1.Weave.Local", "");
    let got = desired(&c, &naming("hostname", Some("bridge")), None);
    assert_eq!(
        names_of(&got),
        BTreeSet::from(["web1.weave.local.".to_owned()])
    );
}

#[test]
fn outside_the_domain_registers_nothing() {
    for (host, dom) in [
        ("web1", ""),
        ("web1", "example.com"),
        ("weave", "local"),
        ("", "weave.local"),
    ] {
        let c = running(host, dom);
        assert!(
            desired(&c, &naming("hostname", None), None).is_empty(),
            "{host:?} {dom:?}"
        );
    }
}

#[test]
fn names_and_aliases_come_under_the_domain_when_enabled() {
    let c = running("web1", "example.com");
    let got = desired(&c, &naming("name,aliases", None), None);
    assert_eq!(
        names_of(&got),
        BTreeSet::from([
            "web_1.weave.local.".to_owned(),
            "api.weave.local.".to_owned(),
            "db.weave.local.".to_owned(),
        ]),
        "the short-id alias is skipped"
    );
    // An alias answers with its own network's addresses only.
    let api: BTreeSet<IpAddr> = got
        .iter()
        .filter(|(_, n)| n == "api.weave.local.")
        .map(|(ip, _)| *ip)
        .collect();
    assert_eq!(
        api,
        BTreeSet::from(["10.5.0.3".parse().unwrap(), "fd00::3".parse().unwrap()])
    );
}

#[test]
fn one_network_narrows_the_addresses() {
    let c = running("web1", "weave.local");
    let got = desired(&c, &naming("hostname", Some("front")), None);
    let ips: BTreeSet<IpAddr> = got.iter().map(|(ip, _)| *ip).collect();
    assert_eq!(
        ips,
        BTreeSet::from(["10.5.0.3".parse().unwrap(), "fd00::3".parse().unwrap()])
    );
    assert!(desired(&c, &naming("hostname", Some("absent")), None).is_empty());
}

#[test]
fn only_running_and_paused_containers_are_live() {
    use Restarting::{No, Yes};
    for (status, restarting, live) in [
        ("running", No, true),
        ("paused", No, true),
        ("running", Yes, false),
        ("restarting", Yes, false),
        ("exited", No, false),
        ("created", No, false),
        ("dead", No, false),
        ("removing", No, false),
    ] {
        let c = container(status, restarting, "web1", "weave.local");
        assert_eq!(
            is_live(&c, None),
            live,
            "{status} restarting={restarting:?}"
        );
        assert_eq!(
            desired(&c, &naming("hostname", None), None).is_empty(),
            !live
        );
    }
}

#[test]
fn a_die_after_the_current_start_means_that_incarnation_is_gone() {
    let c = running("web1", "weave.local");
    let started = started_at(&c).unwrap();
    // A late die of an older incarnation leaves the new one registered.
    assert!(is_live(&c, Some(started - 1_000_000)));
    // A die at or after the start of what inspect shows: that start is stale.
    assert!(!is_live(&c, Some(started)));
    assert!(!is_live(&c, Some(started + 5)));
}

#[test]
fn empty_or_broken_addresses_are_skipped() {
    let c = inspect(serde_json::json!({
        "Id": ID, "Name": "/x",
        "State": { "Status": "running", "Running": true, "StartedAt": "junk" },
        "Config": { "Hostname": "web1", "Domainname": "weave.local" },
        "NetworkSettings": { "Networks": {
            "host": { "IPAddress": "", "GlobalIPv6Address": "" },
            "odd": { "IPAddress": "not-an-ip" }
        }}
    }));
    assert!(desired(&c, &naming("hostname", None), None).is_empty());
    // An unparsable start time does not block registration.
    assert!(is_live(&c, Some(0)));
}

fn labelled(labels: serde_json::Value, exposed: serde_json::Value) -> ContainerInspectResponse {
    inspect(serde_json::json!({
        "Id": ID,
        "Config": { "Hostname": "web", "Labels": labels, "ExposedPorts": exposed },
    }))
}

#[test]
fn labels_give_the_service_and_port() {
    let service = |labels, exposed| {
        service_of(&labelled(labels, exposed))
            .map(|s| s.map(|s| (s.service().to_owned(), s.port())))
            .map_err(|e| e.to_string())
    };
    let none = serde_json::Value::Null;
    let want = |s: &str, p| Ok::<_, String>(Some((s.to_owned(), p)));
    assert_eq!(service(serde_json::json!({}), none.clone()), Ok(None));
    assert_eq!(service(none.clone(), none.clone()), Ok(None));
    assert_eq!(
        service(
            serde_json::json!({"dwara.port": "80", "dwara.service": "_HTTP._tcp"}),
            none.clone()
        ),
        want("_http._tcp", 80)
    );
    // The default service: `_<port>._<proto>`, the protocol from the exposure.
    assert_eq!(
        service(serde_json::json!({"dwara.port": "80"}), none.clone()),
        want("_80._tcp", 80)
    );
    assert_eq!(
        service(
            serde_json::json!({"dwara.port": "53"}),
            serde_json::json!({"53/udp": {}})
        ),
        want("_53._udp", 53)
    );
    assert_eq!(
        service(
            serde_json::json!({"dwara.port": "53"}),
            serde_json::json!({"53/udp": {}, "53/tcp": {}})
        ),
        want("_53._tcp", 53)
    );
    assert_eq!(
        service(
            serde_json::json!({"dwara.port": "53"}),
            serde_json::json!({"54/udp": {}})
        ),
        want("_53._tcp", 53)
    );
    for labels in [
        serde_json::json!({"dwara.port": "0"}),
        serde_json::json!({"dwara.port": "http"}),
        serde_json::json!({"dwara.port": "70000"}),
        serde_json::json!({"dwara.port": "80", "dwara.service": "http"}),
        serde_json::json!({"dwara.service": "_http._tcp"}),
    ] {
        let got = service(labels.clone(), none.clone());
        assert!(got.is_err(), "{labels}: {got:?}");
    }
}

#[test]
fn labels_give_the_priority_and_weight() {
    let rank = |labels| {
        service_of(&labelled(labels, serde_json::Value::Null))
            .map(|s| s.map(|s| (s.port(), s.priority(), s.weight())))
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        rank(serde_json::json!({"dwara.port": "80"})),
        Ok(Some((80, 0, 1)))
    );
    assert_eq!(
        rank(serde_json::json!({"dwara.port": "80", "dwara.weight": "9", "dwara.priority": "2"})),
        Ok(Some((80, 2, 9)))
    );
    assert_eq!(
        rank(
            serde_json::json!({"dwara.port": "80", "dwara.service": "_web._tcp", "dwara.weight": "0"})
        ),
        Ok(Some((80, 0, 0)))
    );
    for (labels, want) in [
        (
            serde_json::json!({"dwara.port": "80", "dwara.weight": "heavy"}),
            "invalid weight \"heavy\"",
        ),
        (
            serde_json::json!({"dwara.port": "80", "dwara.priority": "65536"}),
            "invalid priority \"65536\"",
        ),
        (
            serde_json::json!({"dwara.weight": "9"}),
            "weight \"9\" given without a port",
        ),
        (
            serde_json::json!({"dwara.priority": "1"}),
            "priority \"1\" given without a port",
        ),
    ] {
        let got = rank(labels.clone());
        assert!(
            got.as_ref().is_err_and(|e| e.contains(want)),
            "{labels}: {got:?}"
        );
    }
}
