#![no_main]
//! Fuzz target `door_decode`: see `smc_tokio::fuzzing::door_decode` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::door_decode(data));
