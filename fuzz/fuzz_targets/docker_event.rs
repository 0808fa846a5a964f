//! Fuzz target: `dwara_fuzz_checks::docker_event`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::docker_event(data));
