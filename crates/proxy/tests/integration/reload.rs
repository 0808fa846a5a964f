//! Reload: what an upstream keeps and what it must not keep.

use std::time::Duration;

use dwara_proxy::Dataplane;
use test_support::dns_server::{FailureMode, TestDnsServer};

use crate::{WAIT, endpoints, ip, upstream};

async fn wait_endpoints(dp: &Dataplane, want: &[&str]) {
    let ok = test_support::wait_until(WAIT, || async { endpoints(dp, 0) == want }).await;
    assert!(
        ok,
        "endpoints stayed {:?}, wanted {want:?}",
        endpoints(dp, 0)
    );
}

#[tokio::test]
async fn a_changed_target_never_keeps_the_old_names_endpoints() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("old.test", &[ip(1)], 60);
    dns.set_a("new.test", &[ip(2)], 60);
    let dp = Dataplane::new();
    let mut up = upstream("api", "old.test", dns.addr());
    dp.apply(std::slice::from_ref(&up)).await.unwrap();
    wait_endpoints(&dp, &["10.0.0.1:80"]).await;

    // Same name, same policy, another host name: the old endpoints are gone at once
    // (before the first answer for the new name arrives).
    up.dns_discovery.as_mut().unwrap().hostname = "new.test".into();
    dns.set_delay(Duration::from_millis(300));
    dp.apply(std::slice::from_ref(&up)).await.unwrap();
    assert_eq!(
        endpoints(&dp, 0),
        Vec::<String>::new(),
        "old endpoints kept"
    );
    wait_endpoints(&dp, &["10.0.0.2:80"]).await;
    dns.set_delay(Duration::ZERO);

    // fail_open keeps the last set of *this* name only: a new name whose DNS fails
    // starts (and stays) empty.
    up.dns_discovery.as_mut().unwrap().hostname = "failing.test".into();
    dns.set_failure(FailureMode::ServFail);
    dp.apply(std::slice::from_ref(&up)).await.unwrap();
    assert!(dns.wait_for_queries(dns.query_count() + 1, WAIT).await);
    assert_eq!(endpoints(&dp, 0), Vec::<String>::new());
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}

#[tokio::test]
async fn an_unchanged_target_keeps_its_endpoints_across_a_reload() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("api.test", &[ip(1), ip(3)], 60);
    let dp = Dataplane::new();
    let mut up = upstream("api", "api.test", dns.addr());
    dp.apply(std::slice::from_ref(&up)).await.unwrap();
    wait_endpoints(&dp, &["10.0.0.1:80", "10.0.0.3:80"]).await;
    // Refresh knobs change, the question does not; DNS now fails: fail_open keeps
    // the set, and the reload did not drop it.
    dns.set_failure(FailureMode::ServFail);
    up.dns_discovery.as_mut().unwrap().min_endpoints = 2;
    let n = dp.apply(std::slice::from_ref(&up)).await.unwrap();
    assert_eq!(n, 2);
    assert_eq!(endpoints(&dp, 0), ["10.0.0.1:80", "10.0.0.3:80"]);
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}

#[tokio::test]
async fn a_failed_bind_changes_nothing() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("api.test", &[ip(1)], 60);
    let dp = Dataplane::new();
    let first = upstream("api", "api.test", dns.addr());
    dp.apply(std::slice::from_ref(&first)).await.unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut second = upstream("b", "api.test", dns.addr());
    second.listen = taken.local_addr().unwrap();
    let err = dp.apply(&[first.clone(), second]).await.unwrap_err();
    assert!(err.to_string().contains("cannot listen"), "{err}");
    assert_eq!(dp.generation().number, 1);
    assert_eq!(dp.listening().await, vec![first.listen]);
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}
