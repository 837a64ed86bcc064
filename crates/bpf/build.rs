//! Compiles the C BPF programs under `bpf/` with clang into OUT_DIR; the crate embeds the
//! objects. No object file is committed: the build needs clang and libbpf's headers
//! (Debian `clang`, `libbpf-dev`; `scripts/install-deps` installs them).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let source_dir = manifest.join("bpf");
    println!("cargo:rerun-if-changed={}", source_dir.display());
    let clang = std::env::var("SVCPLANE_CLANG").unwrap_or_else(|_| "clang".to_owned());
    println!("cargo:rerun-if-env-changed=SVCPLANE_CLANG");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&source_dir)
        .expect("reading crates/bpf/bpf")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    sources.sort();
    for path in &sources {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    for source in sources.iter().filter(|p| p.extension().is_some_and(|e| e == "c")) {
        compile(&clang, &source_dir, source, &out);
    }
}

fn compile(clang: &str, source_dir: &Path, source: &Path, out: &Path) {
    let stem = source.file_stem().expect("a file name").to_string_lossy().into_owned();
    let object = out.join(format!("{stem}.o"));
    let status = Command::new(clang)
        .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg(format!("-I{}", source_dir.display()))
        // No absolute build path inside the object (reproducible bytes).
        .arg(format!("-fdebug-prefix-map={}=bpf", source_dir.display()))
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(&object)
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("{clang} failed on {} ({status})", source.display()),
        Err(error) => panic!(
            "cannot run {clang} to build the BPF programs ({error}): install Debian's clang and libbpf-dev \
             (scripts/install-deps)"
        ),
    }
}
