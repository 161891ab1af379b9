#![no_main]
//! Fuzz target `handshake_server`: see `smc_tokio::fuzzing::handshake_server` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| smc_tokio::fuzzing::handshake_server(data));
