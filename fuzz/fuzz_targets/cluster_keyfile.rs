//! Fuzz target: `dwara_fuzz_checks::cluster_keyfile`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::cluster_keyfile(data));
