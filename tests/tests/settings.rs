//! `SMC_TOKIO_*` environment variables and their precedence against builders, in child
//! processes (the environment is read once per process).

use std::collections::HashMap;

fn run(env: &[(&str, &str)]) -> HashMap<String, String> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_smc-test-peer"));
    cmd.arg("settings");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("SMC_TOKIO_")) {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn has(line: &str, field: &str) -> bool {
    line.contains(field)
}

/// The fields of the nested struct `name` in a `Debug` line (`shm: ShmConfig { .. }`), so a
/// field that exists in several (`enabled`) is checked where it belongs.
fn section<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line.find(&format!(" {name}: ")).unwrap_or_else(|| panic!("no {name} in {line}"));
    let open = start + line[start..].find('{').unwrap_or_else(|| panic!("{name} is not a struct in {line}"));
    let close = open + line[open..].find('}').unwrap_or_else(|| panic!("{name} is not closed in {line}"));
    &line[open..=close]
}

#[test]
fn defaults_without_environment() {
    let o = run(&[]);
    let g = &o["GLOBAL"];
    assert!(has(g, "policy: Auto"), "{g}");
    assert!(has(g, "limit_handshake: true"), "{g}");
    assert!(has(g, "max_pending_handshakes: 1024"), "{g}");
    assert!(has(g, "handshake_timeout: 2s"), "{g}");
    assert!(has(section(g, "shm"), "rmb_size: 262144"), "{g}");
    assert!(has(section(g, "shm"), "enabled: true"), "{g}");
    assert!(has(section(g, "rdma"), "enabled: true"), "{g}");
}

#[test]
fn every_variable_is_read() {
    let o = run(&[
        ("SMC_TOKIO_POLICY", "tcp-only"),
        ("SMC_TOKIO_SHM", "0"),
        ("SMC_TOKIO_LIMIT_HANDSHAKE", "off"),
        ("SMC_TOKIO_MAX_PENDING_HANDSHAKES", "64"),
        ("SMC_TOKIO_HANDSHAKE_TIMEOUT_MS", "500"),
        ("SMC_TOKIO_PEEK_TIMEOUT_MS", "50"),
        ("SMC_TOKIO_NEGATIVE_CACHE_TTL_MS", "1000"),
        ("SMC_TOKIO_RMB_SIZE", "1m"),
        ("SMC_TOKIO_BUSY_POLL_US", "50"),
        ("SMC_TOKIO_AUTOCORK", "4k"),
        ("SMC_TOKIO_INLINE_MAX", "0"),
        ("SMC_TOKIO_ADAPTIVE_MIN_BYTES", "1024"),
        ("SMC_TOKIO_RDMA_LINK_TEST_MS", "1500"),
    ]);
    let g = &o["GLOBAL"];
    // SMC_TOKIO_SHM switches shared memory off, and only that.
    assert!(has(section(g, "shm"), "enabled: false"), "{g}");
    assert!(has(section(g, "rdma"), "enabled: true"), "{g}");
    for want in [
        "policy: TcpOnly",
        "limit_handshake: false",
        "max_pending_handshakes: 64",
        "handshake_timeout: 500ms",
        "peek_timeout: 50ms",
        "negative_cache_ttl: 1s",
        "rmb_size: 1048576",
        "busy_poll: 50µs",
        "autocork: 4096",
        "inline_max: 0",
        "adaptive_min_bytes: 1024",
        "link_test: 1.5s",
    ] {
        assert!(has(g, want), "missing {want} in {g}");
    }
}

#[test]
fn builders_override_the_environment_and_run_time_changes_apply() {
    let o = run(&[("SMC_TOKIO_MAX_PENDING_HANDSHAKES", "64"), ("SMC_TOKIO_HANDSHAKE_TIMEOUT_MS", "500")]);
    let b = &o["BUILDER"];
    assert!(has(b, "max_pending_handshakes: 7") && has(b, "handshake_timeout: 1.234s"), "{b}");
    let l = &o["LISTENER"];
    assert!(has(l, "limit_handshake: false") && has(l, "max_pending_handshakes: 64"), "{l}");
    let c = &o["CHANGED"];
    assert!(has(c, "limit_handshake: true") && has(c, "max_pending_handshakes: 3"), "{c}");
    let r = &o["RUNTIME"];
    assert!(has(r, "max_pending_handshakes: 99") && has(r, "handshake_timeout: 500ms"), "{r}");
}

#[test]
fn bad_values_are_ignored() {
    let o = run(&[("SMC_TOKIO_MAX_PENDING_HANDSHAKES", "lots"), ("SMC_TOKIO_POLICY", "sometimes")]);
    let g = &o["GLOBAL"];
    assert!(has(g, "max_pending_handshakes: 1024") && has(g, "policy: Auto"), "{g}");
}

/// Every shared-memory variable holds under a builder that set another shared-memory field
/// (before, the builder's whole `ShmConfig` replaced the environment's), and a connection made
/// with such builders honours `SMC_TOKIO_SHM=0`.
#[test]
fn shared_memory_variables_survive_a_builder_that_sets_another_field() {
    let o = run(&[
        ("SMC_TOKIO_SHM", "0"),
        ("SMC_TOKIO_SHM_ALLOW_UIDS", "1000,2000"),
        ("SMC_TOKIO_RMB_MAX", "2m"),
        ("SMC_TOKIO_ADAPTIVE_POLL_US", "0"),
        ("SMC_TOKIO_BUSY_POLL_US", "30"),
        ("SMC_TOKIO_AUTOCORK", "0"),
        ("SMC_TOKIO_INLINE_MAX", "0"),
        // With RDMA off too, this side has nothing to offer.
        ("SMC_TOKIO_RDMA", "0"),
    ]);
    let b = section(&o["SHM_BUILDER"], "shm");
    for want in [
        "rmb_size: 65536",
        "enabled: false",
        "allowed_uids: [1000, 2000]",
        "rmb_max: 2097152",
        "adaptive_poll: 0ns",
        "busy_poll: 30µs",
        "autocork: 0",
        "inline_max: 0",
    ] {
        assert!(has(b, want), "missing {want} in {b}");
    }
    let c = &o["SHM_CONNECT"];
    // Said as what it is: switched off here, not "no listener".
    assert!(c.starts_with("client=tcp (smc disabled on this side") && c.contains("server=tcp ("), "{c}");
    // Without the variable the same builders get shared memory.
    let o = run(&[]);
    assert_eq!(o["SHM_CONNECT"], "client=smc-d server=smc-d");
}
