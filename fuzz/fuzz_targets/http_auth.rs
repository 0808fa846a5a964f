//! Fuzz target: `dwara_fuzz_checks::http_auth`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::http_auth(data));
