//! The decision core of svcplane: the Service model, change tracking, endpoint selection
//! and the per-node plan that every backend renders.
//!
//! Pure by design: no I/O, no async, no Kubernetes client, no kernel. Sources turn
//! Kubernetes objects into [`model`] values and [`state::Change`]s; backends turn a
//! [`plan::NodePlan`] into kernel state. Every Service rule (which endpoints are eligible,
//! when to masquerade, what to do with no endpoints) is decided here and nowhere else.

pub mod conntrack;
pub mod counters;
pub mod dataplane;
pub mod discovery;
pub mod explain;
pub mod model;
pub mod plan;
pub mod selection;
pub mod sorted;
pub mod state;

pub use dataplane::{Dataplane, DataplaneError, RuleCount, SyncReport, TableUsage};
pub use model::*;
pub use plan::{
    Destination, EndpointSetKind, Endpoints, Frontend, FrontendKind, HealthCheck, NodeConfig, NodePlan,
    NodePortAddresses, PlanDiff, PlanKey, Refusal, Route, ServicePortPlan, SourceMatch, Unrouted,
};
pub use state::{Change, Changes, ClusterState, ServiceEndpoint};
