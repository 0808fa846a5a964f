//! Fuzz target: `dwara_fuzz_checks::store_record`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::store_record(data));
