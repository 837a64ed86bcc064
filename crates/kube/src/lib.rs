//! svcplane-kube: svcplane on a real Kubernetes API server.
//!
//! - [`ClusterAccess`]: a kubeconfig file or the in-cluster config of a Pod.
//! - [`spawn_watch`]: kube-rs watchers over Services, EndpointSlices and the proxy's own
//!   Node, handing on [`Batch`]es of what a [`Keep`] keeps of each object as it arrives:
//!   the same k8s-openapi objects the manifests source produces (less `managedFields`), or
//!   for the proxy their conversion to the core's model, so no list of API objects is ever
//!   held.
//! - [`feed`]: the API as a feed, converted with `svcplane-source` exactly as in manifests
//!   mode: changes of the core's model for the proxy, discovery views for cluster DNS. Nothing leaves before every initial list is complete; restarts of the API server
//!   and expired watches end in a relist whose difference is what is passed on (no
//!   duplicate, no lost update). What upstream kube-proxy ignores is filtered on the server
//!   side for the proxy (`service.kubernetes.io/service-proxy-name`, headless slices).
//! - [`ObjectMirror`]: the current objects rebuilt from batches, for consumers that need the
//!   whole picture (cluster DNS).
//! - [`controller`]: the EndpointSlice controller against the API: slices planned by
//!   `svcplane-controller` from Pods, written with owner references and the upstream labels,
//!   at most 100 endpoints per slice, and only the slices that must change.
//! - [`lease`]: leader election through a `coordination.k8s.io/v1` Lease (client-go's
//!   semantics), so that of several controller replicas only one writes.
//!
//! - [`load_balancer`]: LoadBalancer addresses from `LoadBalancerIPPool`s (assigned by
//!   `svcplane-controller`'s allocator), written to Service status with a condition naming
//!   any cause of a missing address.
//!
//! - [`announce`]: which node announces each LoadBalancer Service's addresses on the LAN,
//!   decided with one Lease per Service (candidates: every node, or under
//!   `externalTrafficPolicy: Local` the nodes with a ready local endpoint).
//!
//! What it deliberately does not do: no Service policy (that is `svcplane-core`), no
//! conversion rules of its own (`svcplane-source` has them), no ClusterIP or NodePort
//! allocation (the API server does that), and no writes besides EndpointSlices, the
//! controller's leader election Lease, LoadBalancer Service / pool status and their Events, and the
//! per-Service L2 announcement Leases.

mod access;
pub mod announce;
pub mod controller;
mod error;
pub mod feed;
mod initial_list;
pub mod lease;
pub mod load_balancer;
mod mirror;
mod source;

pub use access::ClusterAccess;
pub use error::KubeError;
pub use feed::{ApiConversion, ProxyBatch, initial_changes, spawn_change_feed, spawn_discovery_feed};
pub use mirror::ObjectMirror;
pub use source::{Batch, HEADLESS_LABEL, Keep, ObjectChange, SERVICE_PROXY_NAME_LABEL, WatchOptions, spawn_watch};
