#![no_main]
//! Fuzz target `shm_rx`: see `smc_tokio::fuzzing::shm_rx` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::shm_rx(data));
