//! The container image `scripts/image` assembles (docs/image.md): an OCI layout that is also
//! a `docker save` archive, whose blobs are what their names say, built the same twice, and
//! whose tools run inside it (`scripts/image --check`: a chroot, network namespaces the
//! check makes for loading the rendered rules, and skopeo reading both formats; needs root,
//! skips without it, fails without it under `SVCPLANE_REQUIRE_ROOT=1`).
//!
//! The image is built around this test build's own `svcplane` binary (`--binary`), so the
//! test costs no release build of its own: what is under test is the assembly (the tools,
//! their libraries, the archive), which is the same for either binary. The release path,
//! `scripts/image` without `--binary`, runs `cargo build --release` first and nothing else
//! differs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

const ENTRYPOINT: &str = "/usr/local/bin/svcplane";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `scripts/image --out DIR --binary <this build's svcplane>`; returns the tarball's
/// path (the one line it prints).
fn build_image(out: &Path) -> PathBuf {
    let output = Command::new(repository().join("scripts/image"))
        .arg("--out")
        .arg(out)
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_svcplane"))
        .output()
        .expect("running scripts/image");
    assert!(output.status.success(), "scripts/image failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8(output.stdout).expect("a path in UTF-8");
    let tarball = PathBuf::from(printed.trim());
    assert!(tarball.is_file(), "scripts/image printed {printed:?}, which is no file");
    tarball
}

/// One image for every test here, built once (a build takes seconds, not milliseconds),
/// under cargo's temporary directory for tests: a static is never dropped, so a temporary
/// directory of its own would outlive every run; this one is replaced by the next run.
fn image() -> &'static PathBuf {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-test");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).expect("a directory for the image");
        build_image(&out)
    })
}

/// The OCI layout directory `scripts/image` leaves beside the tarball.
fn layout(tarball: &Path) -> PathBuf {
    tarball.with_extension("")
}

fn sha256(path: &Path) -> String {
    let output = Command::new("sha256sum").arg(path).output().expect("running sha256sum");
    assert!(output.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&output.stdout).split_whitespace().next().expect("a digest").to_owned()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{} is not JSON: {error}\n{text}", path.display()))
}

/// The blob a descriptor points to, after checking that its content has the descriptor's
/// digest and size.
fn blob(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().unwrap_or_else(|| panic!("a digest in {descriptor}"));
    let hex = digest.strip_prefix("sha256:").unwrap_or_else(|| panic!("{digest} is not a sha256 digest"));
    let path = layout.join("blobs/sha256").join(hex);
    assert_eq!(sha256(&path), hex, "the blob {} holds other content than its digest says", path.display());
    let size = std::fs::metadata(&path).expect("the blob's metadata").len();
    assert_eq!(descriptor["size"].as_u64(), Some(size), "the descriptor's size of {digest}");
    path
}

#[test]
fn the_image_is_an_oci_layout_whose_blobs_are_what_their_digests_say() {
    let tarball = image();
    let layout = layout(tarball);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(read_json(&layout.join("oci-layout"))["imageLayoutVersion"], "1.0.0");

    let index = read_json(&layout.join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    let manifests = index["manifests"].as_array().expect("the index's manifests");
    assert_eq!(manifests.len(), 1, "{index}");
    let descriptor = &manifests[0];
    assert_eq!(descriptor["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(descriptor["annotations"]["io.containerd.image.name"], format!("docker.io/library/svcplane:{version}"));
    assert_eq!(descriptor["annotations"]["org.opencontainers.image.ref.name"], version);
    assert_eq!(descriptor["platform"]["os"], "linux");

    let manifest = read_json(&blob(&layout, descriptor));
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    let layers = manifest["layers"].as_array().expect("the manifest's layers");
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(layers[0]["mediaType"], "application/vnd.oci.image.layer.v1.tar");
    blob(&layout, &layers[0]);

    let config = read_json(&blob(&layout, &manifest["config"]));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], descriptor["platform"]["architecture"]);
    // The layer is an uncompressed tar, so its diff_id is its own digest.
    assert_eq!(config["rootfs"]["type"], "layers");
    assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!([layers[0]["digest"]]));
    assert_eq!(config["config"]["Entrypoint"], serde_json::json!([ENTRYPOINT]));
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(labels["org.opencontainers.image.title"], "svcplane");
    assert_eq!(manifest["annotations"], *labels);
}

#[test]
fn the_image_is_also_a_docker_archive_naming_the_same_config_and_layer() {
    let tarball = image();
    let layout = layout(tarball);
    let docker = read_json(&layout.join("manifest.json"));
    let images = docker.as_array().expect("docker's manifest.json is a list");
    assert_eq!(images.len(), 1, "{docker}");
    let image = &images[0];
    assert_eq!(image["RepoTags"], serde_json::json!([format!("svcplane:{}", env!("CARGO_PKG_VERSION"))]));

    let index = read_json(&layout.join("index.json"));
    let manifest = read_json(&blob(&layout, &index["manifests"][0]));
    let path_of = |descriptor: &Value| {
        format!("blobs/sha256/{}", descriptor["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap())
    };
    assert_eq!(image["Config"], path_of(&manifest["config"]));
    assert_eq!(image["Layers"], serde_json::json!([path_of(&manifest["layers"][0])]));

    // The tarball holds exactly the layout: what docker load, ctr import and skopeo read.
    let listing = Command::new("tar").arg("-tf").arg(tarball).output().expect("running tar -tf");
    assert!(listing.status.success());
    let names: Vec<String> = String::from_utf8_lossy(&listing.stdout).lines().map(str::to_owned).collect();
    for name in ["oci-layout", "index.json", "manifest.json"] {
        assert!(names.iter().any(|entry| entry == name), "{name} missing from the tarball: {names:?}");
    }
    let config_path = image["Config"].as_str().unwrap();
    assert!(names.iter().any(|entry| entry == config_path), "{config_path} missing from the tarball: {names:?}");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "the tarball's entries are not sorted");
}

#[test]
fn the_layer_holds_the_tools_their_libraries_and_nothing_owned_by_anyone_but_root() {
    let tarball = image();
    let layout = layout(tarball);
    let index = read_json(&layout.join("index.json"));
    let manifest = read_json(&blob(&layout, &index["manifests"][0]));
    let layer = blob(&layout, &manifest["layers"][0]);
    let listing = Command::new("tar").args(["--numeric-owner", "-tvf"]).arg(&layer).output().expect("running tar -tvf");
    assert!(listing.status.success());
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let mut names = Vec::new();
    let mut mtimes = std::collections::BTreeSet::new();
    for line in listing.lines() {
        // mode, owner/group, size, date, time, name[ -> target]
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(fields[1], "0/0", "not owned by 0/0: {line}");
        mtimes.insert((fields[3], fields[4]));
        names.push(fields[5].to_owned());
    }
    assert_eq!(mtimes.len(), 1, "every entry has the one SOURCE_DATE_EPOCH mtime, not {mtimes:?}");
    for expected in [
        "usr/local/bin/svcplane",
        "usr/sbin/nft",
        "usr/sbin/iptables-legacy",
        "usr/sbin/iptables-legacy-save",
        "usr/sbin/iptables-legacy-restore",
        "usr/sbin/iptables-nft",
        "usr/sbin/ip6tables-nft-save",
        "usr/sbin/ip6tables-nft-restore",
        "usr/sbin/conntrack",
        "usr/bin/ip",
        "usr/bin/sh",
        "usr/lib64/ld-linux-x86-64.so.2",
        "etc/passwd",
        "etc/group",
        "etc/nsswitch.conf",
        "usr/share/doc/svcplane/debian-packages",
    ] {
        if expected.contains("x86-64") && std::env::consts::ARCH != "x86_64" {
            continue;
        }
        assert!(names.iter().any(|name| name == expected), "{expected} is not in the layer:\n{listing}");
    }
    assert!(
        names.iter().any(|name| name.contains("/xtables/libxt_comment.so")),
        "the xtables extensions are not in the layer:\n{listing}"
    );
    assert!(names.iter().any(|name| name.contains("/libc.so.6")), "libc is not in the layer:\n{listing}");
}

#[test]
fn two_builds_of_the_image_are_byte_for_byte_the_same() {
    let first = image();
    let out = tempfile::tempdir().expect("a directory for the second image");
    let second = build_image(out.path());
    assert_eq!(
        sha256(first),
        sha256(&second),
        "two builds from the same binary and packages differ: compare {} and {}",
        first.display(),
        second.display()
    );
}

#[test]
fn every_tool_in_the_image_runs_inside_it() {
    if !svcplane_testbed::can_run_real_kernel_tests("every_tool_in_the_image_runs_inside_it") {
        return;
    }
    let tarball = image();
    let output = Command::new(repository().join("scripts/image"))
        .arg("--check")
        .arg(tarball)
        .output()
        .expect("running scripts/image --check");
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "scripts/image --check failed:\n{report}");
    for command in [
        format!("{ENTRYPOINT} --version"),
        format!("{ENTRYPOINT} render --manifests"),
        "nft --version".to_owned(),
        "iptables-legacy --version".to_owned(),
        "iptables-nft --version".to_owned(),
        "conntrack --version".to_owned(),
    ] {
        assert!(report.contains(&format!("ok: {command}")), "{command} did not pass:\n{report}");
    }
    assert!(report.contains("DNAT rules saved"), "{report}");
    // skopeo (scripts/install-deps) is a reader of both formats that is none of ours.
    if Command::new("skopeo").arg("--version").output().is_ok_and(|output| output.status.success()) {
        for transport in ["docker-archive", "oci-archive"] {
            assert!(report.contains(&format!("ok: skopeo reads the archive as {transport}")), "{report}");
        }
    }
    assert!(report.contains("dnat rules listed"), "{report}");
}
