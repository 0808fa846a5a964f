//! Fuzz target: `dwara_fuzz_checks::http_headers`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::http_headers(data));
