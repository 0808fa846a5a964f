//! Unit tests that need no server: name validation and family merging.

use super::*;

#[test]
fn empty_and_root_names_are_rejected() {
    assert!(matches!(
        parse_name(""),
        Err(ResolveError::InvalidName { .. })
    ));
    assert!(matches!(
        parse_name("."),
        Err(ResolveError::InvalidName { .. })
    ));
    assert!(parse_name("api.weave.local").is_ok());
}

fn nodata() -> ResolveError {
    ResolveError::NoRecords {
        name: "x".into(),
        record_type: RecordType::A,
        nxdomain: false,
        negative_ttl: None,
    }
}

fn nxdomain() -> ResolveError {
    ResolveError::NoRecords {
        name: "x".into(),
        record_type: RecordType::A,
        nxdomain: true,
        negative_ttl: None,
    }
}

#[test]
fn one_empty_family_is_fine_but_a_failure_is_not() {
    let v4 = vec![(IpAddr::from([10, 0, 0, 1]), 5)];
    assert_eq!(merge_families(Ok(v4.clone()), Err(nodata())).unwrap(), v4);
    let timeout = ResolveError::Timeout {
        name: "x".into(),
        record_type: RecordType::AAAA,
    };
    assert!(matches!(
        merge_families(Ok(v4), Err(timeout)),
        Err(ResolveError::Timeout { .. })
    ));
    let both_empty = merge_families(Err(nodata()), Err(nxdomain())).unwrap_err();
    assert!(matches!(
        both_empty,
        ResolveError::NoRecords { nxdomain: true, .. }
    ));
}

#[test]
fn transport_failures_keep_the_hickory_error_as_their_source() {
    use std::error::Error as _;
    use std::sync::Arc;

    let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    let e = ResolveError::from_net(
        "api.test.",
        RecordType::A,
        hickory_resolver::net::NetError::from(io),
    );
    assert_eq!(e.kind(), "transport", "{e:?}");
    let source = e.source().expect("a transport error keeps its source");
    let net = source
        .downcast_ref::<Arc<hickory_resolver::net::NetError>>()
        .expect("the source is hickory's NetError");
    assert!(
        matches!(&**net, hickory_resolver::net::NetError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused),
        "{net:?}"
    );
}
