//! `/metrics` text of the dataplane, read back with a real Prometheus text parser.

use std::sync::Arc;
use std::time::Duration;

use dwara_proxy::Dataplane;
use openmetrics_parser::prometheus::parse_prometheus;
use test_support::dns_server::TestDnsServer;

use crate::{WAIT, endpoints, ip, upstream};

#[tokio::test]
async fn any_upstream_name_survives_the_text_format() {
    test_support::init_tracing();
    let dns = TestDnsServer::start().await.unwrap();
    dns.set_a("api.test", &[ip(7)], 60);
    let names = ["quote\"d", "back\\slash", "new\nline", "plain"];
    let ups: Vec<_> = names
        .iter()
        .map(|n| upstream(n, "api.test", dns.addr()))
        .collect();
    dwara_proxy::validate_upstreams(&ups).unwrap();
    let dp: Arc<Dataplane> = Dataplane::new();
    dp.apply(&ups).await.unwrap();
    assert!(
        test_support::wait_until(WAIT, || async {
            (0..names.len()).all(|i| endpoints(&dp, i) == ["10.0.0.7:80"])
        })
        .await
    );
    let mut registry = prometheus_client::registry::Registry::default();
    dp.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
    let parsed = parse_prometheus(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
    let family = &parsed.families["dwara_upstream_endpoints"];
    let mut seen: Vec<String> = family
        .iter_samples()
        .map(|s| {
            let labels = s.get_labelset().unwrap();
            labels.get_label_value("upstream").unwrap().to_owned()
        })
        .collect();
    seen.sort();
    let mut want: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    want.sort();
    assert_eq!(seen, want, "{text}");
    assert!(parsed.families.contains_key("dwara_config_generation"));
    assert!(
        parsed
            .families
            .contains_key("dwara_upstream_connections_total")
    );
    // One series per L4 worker.
    let workers = &parsed.families["dwara_l4_worker_connections_total"];
    assert_eq!(workers.iter_samples().count(), dp.l4_workers(), "{text}");
    dp.shutdown(Duration::from_secs(1)).await;
    dns.shutdown().await;
}
