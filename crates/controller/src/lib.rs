//! svcplane-controller: what kube-controller-manager and the API server would have done to
//! Services and Pods, for a cluster described by a directory of manifests.
//!
//! With no API server present, nobody assigns `spec.clusterIP` or `spec.ports[].nodePort`
//! and nobody turns Pods into EndpointSlices. This crate does both, as pure functions over
//! `k8s-openapi` objects:
//!
//! - [`Allocator`] fills in cluster IPs (one per IP family), node ports and health-check node
//!   ports, validates the values a manifest set explicitly, and keeps every allocation where
//!   it is for as long as its Service exists. Its state can be saved and restored as an
//!   [`AllocationRecord`] (JSON), so allocations also survive restarts.
//! - [`plan_slices`] / [`SlicePlanner`] compute the EndpointSlices of a Service with a
//!   selector from the Pods (and optionally Nodes, for zones), the way the upstream
//!   EndpointSlice controller would. The planner reads a Pod only through [`PodFacts`], so
//!   a feed that keeps Pods in a compact form of its own plans from that form directly
//!   ([`plan_slices_from`]).
//! - [`load_balancer`] assigns `type: LoadBalancer` addresses from `LoadBalancerIPPool`s
//!   (held, requested, hashed), never one address twice, and names the cause when a Service
//!   gets none (pool exhausted, no pool selects it, requested address outside the pools or
//!   in use, overlapping pools). Used against the API by `svcplane-kube` and here for the
//!   pools of a manifests directory.
//! - [`reconcile`] runs them over a whole set of parsed manifests ([`ClusterObjects`]) and
//!   returns the Services with their allocated fields, the generated plus the explicit
//!   EndpointSlices, and one [`ControllerError`] per problem, naming the object and field.
//!
//! What it deliberately does not do:
//!
//! - No I/O and no async. Reading manifests and saving the [`AllocationRecord`] is the
//!   manifests feed's job (`svcplane-source`): this crate only (de)serialises it.
//! - No writes to a Kubernetes API: the controller against a real API server lives in
//!   `svcplane-kube`, which reuses [`plan_slices`] and diffs the result against the slices it
//!   finds (which is also why slice names are deterministic here).
//! - No placeholder slices for Services without endpoints, no mirroring of the legacy
//!   Endpoints API, nothing about nftables or any other mode.

pub mod allocation;
mod error;
mod ip_family;
pub mod load_balancer;
mod object_key;
mod reconcile;
pub mod slices;
mod stable_hash;

#[cfg(test)]
mod test_objects;

pub use allocation::{
    AllocationOutcome, AllocationRecord, Allocator, AllocatorConfig, NodePortRange, RECORD_VERSION, ServiceAllocation,
};
pub use error::{ConfigError, ControllerError, Reason, RecordError};
pub use ip_family::IpFamily;
pub use load_balancer::{LbAllocator, LbAssignment, LbOutcome, LbProblem, LbReason, Pool, PoolError, PoolUse};
pub use object_key::ObjectKey;
pub use reconcile::{ClusterObjects, Reconciled, assign_load_balancers, is_managed_by_us, reconcile};
pub use slices::{
    LABEL_HEADLESS, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY, MAX_ENDPOINTS_PER_SLICE, PlannedEndpoint,
    PlannedSlice, PodFacts, PodIndex, ServiceSlices, SlicePlanner, plan_slice_shapes_from, plan_slices,
    plan_slices_from,
};
