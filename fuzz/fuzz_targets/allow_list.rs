//! Fuzz target: `dwara_fuzz_checks::allow_list`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::allow_list(data));
