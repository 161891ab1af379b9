#![no_main]
//! Fuzz target `cdc_decode`: see `smc_tokio::fuzzing::cdc_decode` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::cdc_decode(data));
