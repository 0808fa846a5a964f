//! Fuzz target: `dwara_fuzz_checks::records_db`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::records_db(data));
