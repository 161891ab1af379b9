#![no_main]
//! Fuzz target `handshake_client`: see `smc_tokio::fuzzing::handshake_client` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::handshake_client(data));
