#![no_main]
//! Fuzz target `side_decode`: see `smc_tokio::fuzzing::side_decode` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::side_decode(data));
