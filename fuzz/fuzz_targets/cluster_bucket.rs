//! Fuzz target: `dwara_fuzz_checks::cluster_bucket`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::cluster_bucket(data));
