//! svcplane-sync: the one sync loop every mode runs under.
//!
//! Feeds send batches of [`svcplane_core::Change`]s; the loop applies them to the cluster
//! state, replans what they touched, and hands the plan with its [`svcplane_core::PlanDiff`]
//! to whichever [`svcplane_core::Dataplane`] the binary chose. It owns the timing (a
//! minimum interval between syncs, retries with backoff after a failure, checks for drift
//! behind svcplane's back) and what happens after a sync ([`AfterSync`] hooks: health-check
//! node ports, stale UDP flows, metrics). Health checks change only after a sync succeeded,
//! so a load balancer is never told "healthy" for rules that are not in the kernel.
//!
//! What it does not do: no Service policy (the core decides), no kernel API (the modes
//! spell the plan), no reading of manifests or the API (the feeds do).

pub mod health;
pub mod hooks;
mod run;

pub use health::HealthServers;
pub use hooks::{AfterSync, ReplySources, StaleUdpCleanup, Synced};
pub use run::{Backoff, LoopSettings, SyncLoop, Turn};
