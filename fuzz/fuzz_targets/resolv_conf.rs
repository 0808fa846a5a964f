//! Fuzz target: `dwara_fuzz_checks::resolv_conf`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::resolv_conf(data));
