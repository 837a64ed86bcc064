//! What can go wrong starting or using a control plane.

use std::path::PathBuf;
use std::time::Duration;

/// One failed operation, named after what was being done.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// The upstream binaries are not in the cache.
    #[error("{binary} is not at {path}: run scripts/k8s/build first (or set SVCPLANE_K8S_BIN)")]
    MissingBinary { binary: String, path: PathBuf },
    /// A helper command (`openssl`, `ip`, `curl`) failed.
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    /// Writing or reading a file of the control plane's directory failed.
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Starting a process failed.
    #[error("starting {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A process did not become ready in time; the tail of its log says why.
    #[error("{what} was not ready within {after:?}; last lines of {log}:\n{tail}")]
    NotReady { what: String, after: Duration, log: PathBuf, tail: String },
    /// A process exited while it was expected to run.
    #[error("{what} exited ({status}); last lines of {log}:\n{tail}")]
    Exited { what: String, status: std::process::ExitStatus, log: PathBuf, tail: String },
    /// Entering a network namespace failed.
    #[error("entering network namespace {namespace:?}: {detail}")]
    Namespace { namespace: String, detail: String },
    /// Building the Kubernetes client failed.
    #[error("building a Kubernetes client from {kubeconfig}: {detail}")]
    Client { kubeconfig: PathBuf, detail: String },
    /// A request to the API server failed.
    #[error("{operation}: {source}")]
    Api {
        operation: String,
        #[source]
        source: kube::Error,
    },
}
