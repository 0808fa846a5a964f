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
