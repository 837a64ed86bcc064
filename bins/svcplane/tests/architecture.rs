//! The architecture, checked: crate dependencies point from policy to mechanism as
//! `docs/architecture.md` says, and no two modules of a crate import each other.
//!
//! Reads the workspace's `Cargo.toml` files and sources; no build knowledge needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Which of our crates each crate may depend on (`[dependencies]`; dev-dependencies are
/// test support and free), with the reason.
const ALLOWED: &[(&str, &[&str], &str)] = &[
    ("net", &[], "the shared vocabulary is a leaf"),
    ("core", &["net"], "the decision core does no I/O and knows no mechanism"),
    ("controller", &["net"], "pure Kubernetes logic over k8s-openapi objects"),
    ("nft", &["net"], "a mechanism knows nothing of Services"),
    ("iptables", &["net"], "a mechanism knows nothing of Services"),
    ("conntrack", &["net"], "a mechanism knows nothing of Services"),
    ("bpf", &["net"], "a mechanism knows nothing of Services"),
    ("ipvs", &["net"], "a mechanism knows nothing of Services"),
    ("announce", &["net"], "a mechanism knows nothing of Services"),
    ("backend-nftables", &["core", "net", "nft"], "a mode spells the plan through one mechanism"),
    ("backend-iptables", &["core", "net", "iptables"], "a mode spells the plan through one mechanism"),
    ("backend-ebpf", &["core", "net", "bpf"], "a mode spells the plan through one mechanism"),
    ("backend-ipvs", &["core", "net", "ipvs", "iptables"], "IPVS mode needs ipset/iptables rules beside IPVS"),
    ("backend-userspace", &["core", "net", "nft"], "redirect rules in nftables, the relay in the mode"),
    ("source", &["core", "controller", "net"], "the manifests feed converts objects into the core's model"),
    (
        "kube",
        &["source", "controller", "core", "net", "metrics"],
        "the API feed converts with the source's rules; the controller counts its work in the metrics registry",
    ),
    ("sync", &["core", "conntrack", "net"], "the loop drives any Dataplane and its after-sync hooks"),
    ("dns", &["core", "net"], "DNS consumes the core's discovery model, like a mode consumes the plan"),
    ("metrics", &[], "metrics are a leaf: fed by the sync loop and the binary, served by the binary"),
    ("ops", &["core", "metrics", "sync"], "health and metrics follow the loop through a hook; they decide nothing"),
    ("testbed", &["net"], "test labs know no Service logic"),
    ("control-plane", &["testbed"], "test support: upstream processes in lab namespaces"),
    ("testing", &["core", "net", "nft", "iptables", "testbed"], "test support"),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace root")
}

/// Our crates a manifest's `[dependencies]` section names (`svcplane-x` -> `x`).
fn our_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_dependencies = false;
    let mut found = BTreeSet::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if in_dependencies && let Some(name) = line.strip_prefix("svcplane-") {
            let name = name.split([' ', '.', '=']).next().unwrap_or_default();
            found.insert(name.to_owned());
        }
    }
    found
}

#[test]
fn every_crate_depends_only_on_the_crates_its_layer_allows() {
    let root = workspace();
    let mut problems = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("crates")).expect("crates/") {
        let dir = entry.expect("a directory entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else { continue };
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let Some((_, allowed, reason)) = ALLOWED.iter().find(|(crate_name, _, _)| *crate_name == name) else {
            problems.push(format!("crates/{name} has no row in the architecture table: say what it may import"));
            continue;
        };
        checked += 1;
        for dependency in our_dependencies(&manifest) {
            if !allowed.contains(&dependency.as_str()) {
                problems.push(format!("crates/{name} depends on svcplane-{dependency}, but {reason}"));
            }
        }
    }
    assert!(checked >= 12, "the check found the crates ({checked})");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The source files of a crate with their top-level module (`crate` for lib.rs/main.rs),
/// test code left out: files named `tests.rs` and everything after a `#[cfg(test)]`.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            if !file.ends_with(".rs") || file == "tests.rs" || path.components().any(|c| c.as_os_str() == "bin") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().to_string_lossy().into_owned();
            let first = relative.split('/').next().unwrap().trim_end_matches(".rs").to_owned();
            let module = if matches!(first.as_str(), "lib" | "main") { "crate".to_owned() } else { first };
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_owned();
            out.entry(module).or_default().push_str(&code);
        }
    }
    out
}

/// A cycle among the top-level modules that `crate::module` paths connect, if any.
fn module_cycle(modules: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (module, code) in modules {
        for (index, _) in code.match_indices("crate::") {
            let rest = &code[index + "crate::".len()..];
            let target: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            // `use crate::{a, b}` names several modules at once.
            let targets: Vec<String> = if rest.starts_with('{') {
                let group = &rest[1..rest.find('}').unwrap_or(rest.len())];
                group.split(',').map(|part| part.trim().split("::").next().unwrap_or_default().to_owned()).collect()
            } else {
                vec![target]
            };
            for target in targets {
                if let Some(&target) = names.get(target.as_str())
                    && target != module
                    && module != "crate"
                {
                    edges.entry(module.as_str()).or_default().insert(target);
                }
            }
        }
    }
    fn visit<'a>(
        node: &'a str,
        edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<String> = path[start..].iter().map(|n| (*n).to_owned()).collect();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|node| visit(node, &edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_two_modules_of_any_crate_import_each_other() {
    let root = workspace();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|entry| entry.expect("a directory entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    sources.push(root.join("bins/svcplane/src"));
    let mut cycles = Vec::new();
    for src in &sources {
        if let Some(cycle) = module_cycle(&modules(src)) {
            cycles.push(format!("{}: {}", src.display(), cycle.join(" -> ")));
        }
    }
    assert!(sources.len() >= 13);
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_accepts_a_chain() {
    let cyclic = BTreeMap::from([
        ("a".to_owned(), "use crate::b::X;".to_owned()),
        ("b".to_owned(), "use crate::{a::Y, c};".to_owned()),
        ("c".to_owned(), String::new()),
    ]);
    assert_eq!(module_cycle(&cyclic), Some(vec!["a".to_owned(), "b".to_owned(), "a".to_owned()]));
    let chain = BTreeMap::from([
        ("a".to_owned(), "use crate::b::X;".to_owned()),
        ("b".to_owned(), "use crate::c::Y;".to_owned()),
        ("c".to_owned(), String::new()),
    ]);
    assert_eq!(module_cycle(&chain), None);
}

#[test]
fn dependencies_are_read_from_the_dependencies_section_only() {
    let manifest = "[package]\nname = \"x\"\n\n[dependencies]\nsvcplane-core.workspace = true\nsvcplane-net = { path = \"../net\" }\n\n[dev-dependencies]\nsvcplane-testbed.workspace = true\n";
    assert_eq!(our_dependencies(manifest), BTreeSet::from(["core".to_owned(), "net".to_owned()]));
}
