//! The crate's arrows point down: no module imports one of a higher layer. The layers, lowest
//! first:
//!
//! 0. `proto`: wire formats and sans-IO state machines;
//! 1. `sys`: raw system calls, descriptors from other processes;
//! 2. vocabulary and settings: `transport`, `error`, `config`, `stats`;
//! 3. `link`: links that move bytes (shared memory, verbs) and their reactor glue;
//! 4. `smc`: SMC connections, link groups and the manager that owns them;
//! 5. negotiation: `handshake`, `door`, `kernel`, `connect`, `accept`, `negative_cache`, `faults`,
//!    and `context`, the handle that owns a set of link groups, settings and counters;
//! 6. `net`: the public types (`SmcListener`, `SmcStream` and friends).
//!
//! Modules of one layer may use each other (a connection and its group, a stream and its
//! halves). The crate root and the fuzzing entry points sit above everything. A `crate::` path
//! in code (not in comments, not in `#[cfg(test)] mod tests`) counts as an import; a new
//! module must be given a layer here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const LAYERS: &[(&str, u8)] = &[
    ("proto", 0),
    ("sys", 1),
    ("transport", 2),
    ("error", 2),
    ("config", 2),
    ("stats", 2),
    ("link", 3),
    ("smc", 4),
    ("handshake", 5),
    ("door", 5),
    ("kernel", 5),
    ("connect", 5),
    ("accept", 5),
    ("negative_cache", 5),
    ("context", 5),
    ("faults", 5),
    ("net", 6),
    ("fuzzing", 7),
    ("crate", 7),
];

fn layer(module: &str) -> Option<u8> {
    let top = module.split("::").next().unwrap_or(module);
    LAYERS.iter().find(|(name, _)| *name == top).map(|&(_, l)| l)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `net/listener.rs` is `net::listener`, `sys/mod.rs` is `sys`, `lib.rs` is `crate`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] {
        return "crate".into();
    }
    parts.join("::")
}

/// The `crate::` paths a source file's code names (comments and unit-test modules left out).
fn crate_paths(text: &str) -> Vec<String> {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let path: String = after
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || *c == ':' || c.is_ascii_digit())
                .collect();
            out.push(path.trim_end_matches(':').to_string());
            rest = after;
        }
    }
    out
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files.iter().map(|f| (module_of(&src, f), f.clone())).collect();
    let mut upward = Vec::new();
    let mut edges = 0;
    for (module, file) in &modules {
        let from = layer(module).unwrap_or_else(|| panic!("module {module} has no layer in tests/layers.rs"));
        for path in crate_paths(&std::fs::read_to_string(file).unwrap()) {
            // The longest prefix of the path that is a module is what is imported.
            let parts: Vec<&str> = path.split("::").collect();
            let Some(target) = (1..=parts.len()).rev().map(|k| parts[..k].join("::")).find(|m| modules.contains_key(m))
            else {
                continue;
            };
            if &target == module || module.starts_with(&format!("{target}::")) {
                continue;
            }
            edges += 1;
            let to = layer(&target).unwrap_or_else(|| panic!("module {target} has no layer in tests/layers.rs"));
            if to > from {
                upward.push(format!("{module} (layer {from}) -> {target} (layer {to})"));
            }
        }
    }
    upward.sort();
    upward.dedup();
    assert!(edges > 100, "the check saw only {edges} imports: it is not reading the sources");
    assert!(upward.is_empty(), "imports that point up:\n{}", upward.join("\n"));
}
