//! Where `scripts/k8s/build` caches the upstream binaries.

use std::path::{Path, PathBuf};

use crate::error::ControlPlaneError;

/// `scripts/k8s/versions`, the one place the upstream versions are written.
const VERSIONS_FILE: &str = include_str!("../../../scripts/k8s/versions");

/// The upstream versions the binaries are built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    pub kubernetes: String,
    pub etcd: String,
    pub coredns: String,
}

impl Versions {
    /// The versions of `scripts/k8s/versions`.
    pub fn pinned() -> Self {
        let value = |key: &str| {
            VERSIONS_FILE
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("scripts/k8s/versions has no {key}"))
                .trim()
                .to_owned()
        };
        Self { kubernetes: value("K8S_VERSION"), etcd: value("ETCD_VERSION"), coredns: value("COREDNS_VERSION") }
    }
}

/// The directory holding kube-apiserver, kube-controller-manager, kube-proxy, etcd and
/// coredns.
#[derive(Debug, Clone)]
pub struct UpstreamBinaries {
    dir: PathBuf,
}

impl UpstreamBinaries {
    /// `$SVCPLANE_K8S_BIN` when set, else `${SVCPLANE_CACHE:-$HOME/.cache/svcplane}/k8s/<version>`
    /// as `scripts/k8s/build` fills it. Fails when kube-apiserver or etcd is missing there.
    pub fn locate() -> Result<Self, ControlPlaneError> {
        let dir = match std::env::var_os("SVCPLANE_K8S_BIN") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let cache = match std::env::var_os("SVCPLANE_CACHE") {
                    Some(cache) => PathBuf::from(cache),
                    None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                        .join(".cache/svcplane"),
                };
                cache.join("k8s").join(Versions::pinned().kubernetes)
            }
        };
        let found = Self { dir };
        for binary in ["kube-apiserver", "etcd"] {
            found.require(binary)?;
        }
        Ok(found)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of `binary`, failing when it was not built.
    pub fn require(&self, binary: &str) -> Result<PathBuf, ControlPlaneError> {
        let path = self.dir.join(binary);
        if path.is_file() {
            Ok(path)
        } else {
            Err(ControlPlaneError::MissingBinary { binary: binary.to_owned(), path })
        }
    }
}

/// For tests: the binaries, or `None` (after saying why on stderr) when they or root are
/// missing, so that `cargo test` on a machine without the upstream build still passes.
/// With `SVCPLANE_REQUIRE_K8S=1` (as CI sets it) a missing build fails the test instead.
pub fn binaries_for_test(test: &str) -> Option<UpstreamBinaries> {
    let required = std::env::var_os("SVCPLANE_REQUIRE_K8S").is_some_and(|v| v == "1");
    let problem = if !nix::unistd::Uid::effective().is_root() {
        "needs root (network namespaces)".to_owned()
    } else {
        match UpstreamBinaries::locate() {
            Ok(binaries) => return Some(binaries),
            Err(error) => error.to_string(),
        }
    };
    assert!(!required, "{test}: {problem}");
    eprintln!("skipping {test}: {problem}");
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_versions_are_read_from_the_scripts_versions_file() {
        let versions = Versions::pinned();
        assert!(versions.kubernetes.starts_with("v1."), "{versions:?}");
        assert!(versions.etcd.starts_with("v3."), "{versions:?}");
        assert!(versions.coredns.starts_with("v1."), "{versions:?}");
    }
}
