//! The controller's metrics, under kube-controller-manager's names where upstream has one
//! (`endpoint_slice_controller_*` of the EndpointSlice controller, client-go's
//! `leader_election_master_status`), in the workspace's metrics registry.
//!
//! `svcplane_controller_allocation_conflicts_total` is svcplane's own: slice writes the API
//! server refused with 409 Conflict (someone else changed the slice first, or a slice of
//! that name already existed). Against the API the controller allocates no addresses (the
//! API server does), so these are the only conflicts it meets; each costs a retry of the
//! Service.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use svcplane_metrics::{Desc, Kind, Registry};

pub const CHANGES: &str = "endpoint_slice_controller_changes";
pub const CHANGES_TOTAL: &str = "endpoint_slice_controller_changes_total";
pub const SYNCS: &str = "endpoint_slice_controller_syncs";
pub const ENDPOINTS_DESIRED: &str = "endpoint_slice_controller_endpoints_desired";
pub const NUM_ENDPOINT_SLICES: &str = "endpoint_slice_controller_num_endpoint_slices";
pub const ALLOCATION_CONFLICTS: &str = "svcplane_controller_allocation_conflicts_total";
pub const LEADER_STATUS: &str = "leader_election_master_status";

fn descs() -> Vec<Desc> {
    let d = |name, kind, help, labels: &'static [&'static str]| Desc { name, kind, help, labels, buckets: vec![] };
    vec![
        d(
            CHANGES,
            Kind::Counter,
            "EndpointSlice writes by operation (kube-controller-manager's older name)",
            &["operation"],
        ),
        d(CHANGES_TOTAL, Kind::Counter, "EndpointSlice writes by operation", &["operation"]),
        d(SYNCS, Kind::Counter, "Service syncs by result", &["result"]),
        d(ENDPOINTS_DESIRED, Kind::Gauge, "Endpoints the Services' slices should hold, summed over Services", &[]),
        d(NUM_ENDPOINT_SLICES, Kind::Gauge, "EndpointSlices the controller owns", &[]),
        d(ALLOCATION_CONFLICTS, Kind::Counter, "Slice writes refused with 409 Conflict", &[]),
        d(
            LEADER_STATUS,
            Kind::Gauge,
            "1 while this process holds the leader election lease named by `name`, 0 while it waits",
            &["name"],
        ),
    ]
}

/// The controller's metrics; shared between the controller loop, the elector and the
/// HTTP server.
#[derive(Debug)]
pub struct ControllerMetrics {
    registry: Registry,
    lease: Mutex<Option<(String, Arc<AtomicBool>)>>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    pub fn new() -> Self {
        let registry = Registry::with(descs());
        for operation in ["create", "update", "delete"] {
            registry.add(CHANGES, &[operation], 0.0);
            registry.add(CHANGES_TOTAL, &[operation], 0.0);
        }
        for result in ["success", "error"] {
            registry.add(SYNCS, &[result], 0.0);
        }
        Self { registry, lease: Mutex::new(None) }
    }

    /// Reports `leading` as `leader_election_master_status{name=<lease>}`.
    pub fn track_leadership(&self, lease: &str, leading: Arc<AtomicBool>) {
        *self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((lease.to_owned(), leading));
    }

    pub(crate) fn changed(&self, operation: &str, count: usize) {
        if count > 0 {
            self.registry.add(CHANGES, &[operation], count as f64);
            self.registry.add(CHANGES_TOTAL, &[operation], count as f64);
        }
    }

    pub(crate) fn synced(&self, ok: bool) {
        self.registry.add(SYNCS, &[if ok { "success" } else { "error" }], 1.0);
    }

    pub(crate) fn conflict(&self) {
        self.registry.add(ALLOCATION_CONFLICTS, &[], 1.0);
    }

    pub(crate) fn desired(&self, endpoints: usize, slices: usize) {
        self.registry.set(ENDPOINTS_DESIRED, &[], endpoints as f64);
        self.registry.set(NUM_ENDPOINT_SLICES, &[], slices as f64);
    }

    /// A counter's or gauge's value (tests, tools).
    pub fn value(&self, name: &str, labels: &[&str]) -> f64 {
        self.registry.value(name, labels)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        if let Some((name, leading)) = &*self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            self.registry.set(LEADER_STATUS, &[name], if leading.load(Ordering::Acquire) { 1.0 } else { 0.0 });
        }
        self.registry.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_metrics_render_under_kube_controller_managers_names() {
        let metrics = ControllerMetrics::new();
        let leading = Arc::new(AtomicBool::new(false));
        metrics.track_leadership("svcplane-controller", Arc::clone(&leading));
        metrics.changed("create", 2);
        metrics.synced(true);
        metrics.synced(false);
        metrics.conflict();
        metrics.desired(7, 3);
        let text = metrics.render();
        for line in [
            r#"endpoint_slice_controller_changes{operation="create"} 2"#,
            r#"endpoint_slice_controller_changes{operation="delete"} 0"#,
            r#"endpoint_slice_controller_changes_total{operation="create"} 2"#,
            r#"endpoint_slice_controller_syncs{result="success"} 1"#,
            r#"endpoint_slice_controller_syncs{result="error"} 1"#,
            "endpoint_slice_controller_endpoints_desired 7",
            "svcplane_controller_allocation_conflicts_total 1",
            r#"leader_election_master_status{name="svcplane-controller"} 0"#,
            "# TYPE endpoint_slice_controller_changes counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        leading.store(true, Ordering::Release);
        assert!(metrics.render().contains(r#"leader_election_master_status{name="svcplane-controller"} 1"#));
    }
}
