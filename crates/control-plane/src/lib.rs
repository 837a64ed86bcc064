//! svcplane-control-plane: a real Kubernetes control plane for svcplane's tests and
//! benchmarks, running inside network namespaces the caller owns.
//!
//! - [`UpstreamBinaries`] finds the upstream binaries `scripts/k8s/build` caches
//!   (kube-apiserver, kube-controller-manager, kube-proxy, etcd, CoreDNS) by the versions in
//!   `scripts/k8s/versions`.
//! - [`ControlPlane`] generates a CA, a serving certificate, service-account keys and an
//!   admin token with `openssl`, starts etcd and kube-apiserver in a network namespace on an
//!   address of that namespace, waits for `/readyz`, writes an admin kubeconfig, can restart
//!   the API server, and starts further upstream components (kube-controller-manager,
//!   kube-proxy) in any namespace. Dropping it kills every process it started and removes
//!   its directory.
//! - [`NetnsClient`] is a `kube::Client` whose connections live in a given network
//!   namespace, with blocking helpers for tests (create, patch status, delete, list).
//! - [`objects`] builds the Nodes and Pods a test writes itself: there is no kubelet and no
//!   scheduler, so tests set `spec.nodeName` and the Pod status (IP, Ready) themselves.
//! - [`BareNamespace`] is a network namespace with only loopback, for tests that need an
//!   API server and nothing else.
//!
//! What it does not do: it builds nothing (that is `scripts/k8s/build`), it never listens on
//! or talks to the machine's own interfaces (every process runs inside a namespace the
//! caller created), it has no kubelet or scheduler, and it knows nothing of svcplane itself.
//! Everything here needs root.

mod binaries;
mod client;
mod error;
mod namespace;
pub mod objects;
mod pki;
mod plane;

pub use binaries::{UpstreamBinaries, Versions, binaries_for_test};
pub use client::NetnsClient;
pub use error::ControlPlaneError;
pub use namespace::BareNamespace;
pub use plane::{API_PORT, ControlPlane, ControlPlaneConfig, Upstream};
