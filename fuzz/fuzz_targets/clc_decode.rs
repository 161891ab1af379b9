#![no_main]
//! Fuzz target `clc_decode`: see `smc_tokio::fuzzing::clc_decode` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::clc_decode(data));
