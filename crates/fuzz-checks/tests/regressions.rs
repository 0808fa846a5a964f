//! Replays every committed fuzz input (`fuzz/regressions/<target>/*`) through the
//! same checks the fuzz targets run.

#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        eprintln!("replaying {}", path.display());
        check(&data);
        n += 1;
    }
    assert!(n > 0, "no inputs in {}", dir.display());
}

#[test]
fn dns_packet_regressions() {
    replay("dns_packet", dwara_fuzz_checks::dns_packet);
}

#[test]
fn config_yaml_regressions() {
    replay("config_yaml", dwara_fuzz_checks::config_yaml);
}

#[test]
fn resolv_conf_regressions() {
    replay("resolv_conf", dwara_fuzz_checks::resolv_conf);
}

#[test]
fn http_form_regressions() {
    replay("http_form", dwara_fuzz_checks::http_form);
}

#[test]
fn dns_udp_regressions() {
    replay("dns_udp", dwara_fuzz_checks::dns_udp);
}

#[test]
fn dns_tcp_regressions() {
    replay("dns_tcp", dwara_fuzz_checks::dns_tcp);
}

#[test]
fn dns_differential_regressions() {
    replay("dns_differential", dwara_fuzz_checks::dns_differential);
}

#[test]
fn dns_answers_regressions() {
    replay("dns_answers", dwara_fuzz_checks::dns_answers);
}

#[test]
fn http_path_regressions() {
    replay("http_path", dwara_fuzz_checks::http_path);
}

#[test]
fn cluster_value_regressions() {
    replay("cluster_value", dwara_fuzz_checks::cluster_value);
}

#[test]
fn cluster_bucket_regressions() {
    replay("cluster_bucket", dwara_fuzz_checks::cluster_bucket);
}

#[test]
fn records_db_regressions() {
    replay("records_db", dwara_fuzz_checks::records_db);
}

#[test]
fn store_record_regressions() {
    replay("store_record", dwara_fuzz_checks::store_record);
}

#[test]
fn docker_event_regressions() {
    replay("docker_event", dwara_fuzz_checks::docker_event);
}

#[test]
fn cluster_datagram_regressions() {
    replay("cluster_datagram", dwara_fuzz_checks::cluster_datagram);
}

#[test]
fn cluster_keyfile_regressions() {
    replay("cluster_keyfile", dwara_fuzz_checks::cluster_keyfile);
}

#[test]
fn allow_list_regressions() {
    replay("allow_list", dwara_fuzz_checks::allow_list);
}

#[test]
fn http_auth_regressions() {
    replay("http_auth", dwara_fuzz_checks::http_auth);
}

#[test]
fn http_headers_regressions() {
    replay("http_headers", dwara_fuzz_checks::http_headers);
}
