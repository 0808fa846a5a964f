//! Fuzz target: `dwara_fuzz_checks::cluster_datagram`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::cluster_datagram(data));
