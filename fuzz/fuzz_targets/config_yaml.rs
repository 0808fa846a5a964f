//! Fuzz target: `dwara_fuzz_checks::config_yaml`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::config_yaml(data));
