//! Errors of the Kubernetes API source and controller, named after the failed operation.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig file could not be read or understood.
    #[error("reading kubeconfig {path}: {source}")]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Not in a Pod, or its service-account files are missing.
    #[error("loading the in-cluster config: {source}")]
    InClusterConfig {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The HTTP client could not be built from the config.
    #[error("building the Kubernetes client: {source}")]
    BuildClient {
        #[source]
        source: kube::Error,
    },
    /// Starting the thread or runtime the watches run on failed.
    #[error("starting the API watch thread: {source}")]
    StartRuntime {
        #[source]
        source: std::io::Error,
    },
    /// The initial lists did not complete in time (`render`).
    #[error("the initial lists from the API did not complete within {timeout:?}")]
    InitialListTimeout { timeout: std::time::Duration },
    /// A write of the controller was refused.
    #[error("{operation}: {source}")]
    Write {
        operation: String,
        #[source]
        source: kube::Error,
    },
    /// Settings that cannot work (the message names the flag).
    #[error("{0}")]
    Config(String),
}
