#![no_main]
//! Fuzz target `handback_decode`: see `smc_tokio::fuzzing::handback_decode` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::handback_decode(data));
