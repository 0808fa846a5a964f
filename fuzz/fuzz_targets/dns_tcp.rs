//! Fuzz target: `dwara_fuzz_checks::dns_tcp`.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dwara_fuzz_checks::dns_tcp(data));
