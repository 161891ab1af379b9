//! The crate's arrows point down: no module imports one of a higher layer. The layers, lowest
//! first:
//!
//! 0. `proto`: wire formats and sans-IO state machines;
//! 1. `sys`: raw system calls, descriptors from other processes;
//! 2. vocabulary and settings: `transport`, `error`, `config`, `stats`, and `hash` (the
//!    maps' keyed hash);
//! 3. `link`: links that move bytes (shared memory, verbs) and their reactor glue;
//! 4. `smc`: SMC connections, link groups and the manager that owns them;
//! 5. negotiation: `handshake`, `door`, `kernel`, `connect`, `listen`, `negative_cache`, `faults`,
//!    and `context`, the handle that owns a set of link groups, settings and counters;
//! 6. `net`: the public types (`SmcListener`, `SmcStream` and friends).
//!
//! Modules of one layer may use each other (a connection and its group, a stream and its
//! halves). The crate root, the fuzzing entry points and the unit tests' helpers (`testing`)
//! sit above everything. A `crate::` path
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
    ("hash", 2),
    ("link", 3),
    ("smc", 4),
    ("handshake", 5),
    ("door", 5),
    ("kernel", 5),
    ("connect", 5),
    ("listen", 5),
    ("negative_cache", 5),
    ("context", 5),
    ("faults", 5),
    ("net", 6),
    ("fuzzing", 7),
    ("testing", 7),
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

/// `text` without its `#[cfg(test)] mod name { ... }` blocks (braces counted; the crate's test
/// modules hold no unbalanced brace in a string or char literal).
fn without_test_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]\nmod ") {
        out.push_str(&rest[..i]);
        let block = &rest[i..];
        let Some(open) = block.find('{') else { return out };
        let mut depth = 0usize;
        let mut end = block.len();
        for (k, c) in block[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &block[end..];
    }
    out.push_str(rest);
    out
}

/// The `crate::` paths a source file's code names (comments and unit-test modules left out).
fn crate_paths(text: &str) -> Vec<String> {
    let code = without_test_modules(text);
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

/// Every module of `src` and the modules each imports (by `crate::` path; `super::` paths stay
/// within a module's own subtree, as do the parent's imports of its children).
fn module_graph(src: &Path) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<String, PathBuf> = files.iter().map(|f| (module_of(src, f), f.clone())).collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let mut deps = std::collections::BTreeSet::new();
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
            deps.insert(target);
        }
        graph.insert(module.clone(), deps);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn cycles(graph: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, std::collections::BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: std::collections::BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.g.contains_key(w) {
                continue;
            }
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: Default::default(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The `static` items of a source file's code (mutable state or lazily made handles), by name.
fn statics(text: &str) -> Vec<String> {
    without_test_modules(text)
        .lines()
        .map(str::trim_start)
        .filter(|l| !l.starts_with("//"))
        .filter_map(|l| l.strip_prefix("static ").or_else(|| l.strip_prefix("pub(crate) static ")))
        .filter_map(|l| l.split(':').next())
        .map(|n| n.trim().to_string())
        .collect()
}

/// Prints the module graph: its import cycles, and the process-wide statics of each module.
/// Run with `cargo test -p smc-tokio --test layers -- --nocapture`. Fails on a cycle that spans
/// layers (cycles inside one layer are the natural pairs).
#[test]
fn module_graph_has_no_cycle_across_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    let edges: usize = graph.values().map(|d| d.len()).sum();
    println!("{} modules, {edges} module-to-module imports", graph.len());
    let cycles = cycles(&graph);
    let mut across = Vec::new();
    for c in &cycles {
        println!("cycle of {}: {}", c.len(), c.join(", "));
        let layers: std::collections::BTreeSet<u8> = c.iter().filter_map(|m| layer(m)).collect();
        if layers.len() > 1 {
            across.push(c.join(", "));
        }
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut total = 0;
    for f in &files {
        let names = statics(&std::fs::read_to_string(f).unwrap());
        if !names.is_empty() {
            total += names.len();
            println!("statics in {}: {}", module_of(&src, f), names.join(", "));
        }
    }
    println!("{total} statics");
    assert!(edges > 100, "the graph has only {edges} imports: it is not reading the sources");
    assert!(across.is_empty(), "import cycles across layers:\n{}", across.join("\n"));
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    let mut upward = Vec::new();
    let mut edges = 0;
    for (module, deps) in &graph {
        let from = layer(module).unwrap_or_else(|| panic!("module {module} has no layer in tests/layers.rs"));
        for target in deps {
            edges += 1;
            let to = layer(target).unwrap_or_else(|| panic!("module {target} has no layer in tests/layers.rs"));
            if to > from {
                upward.push(format!("{module} (layer {from}) -> {target} (layer {to})"));
            }
        }
    }
    upward.sort();
    assert!(edges > 100, "the check saw only {edges} imports: it is not reading the sources");
    assert!(upward.is_empty(), "imports that point up:\n{}", upward.join("\n"));
}

#[test]
fn test_modules_are_left_out_and_nothing_else() {
    let text =
        "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() { let _ = {}; }\n}\nuse crate::c;\n";
    assert_eq!(crate_paths(text), ["a", "c"]);
}
