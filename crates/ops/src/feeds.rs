//! The sync loop's hook that feeds health and metrics: it hears every batch of changes,
//! every sync and every failure, and turns them into kube-proxy's metric families and the
//! healthz state. It only records; the servers read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use svcplane_core::plan::{EndpointSetKind, FrontendKind};
use svcplane_core::{Change, DataplaneError, IpFamily, NodePlan};
use svcplane_metrics::{
    ENDPOINT_CHANGES_PENDING, ENDPOINT_CHANGES_TOTAL, IPTABLES_RESTORE_FAILURES_TOTAL, IPTABLES_TOTAL,
    NETWORK_PROGRAMMING_DURATION, NFTABLES_SYNC_FAILURES_TOTAL, NO_LOCAL_ENDPOINTS_TOTAL, Registry,
    SERVICE_CHANGES_PENDING, SERVICE_CHANGES_TOTAL, SYNC_FULL_PROXY_RULES_DURATION, SYNC_PARTIAL_PROXY_RULES_DURATION,
    SYNC_PROXY_RULES_DURATION, SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP, SYNC_PROXY_RULES_LAST_TIMESTAMP,
};
use svcplane_sync::{AfterSync, Synced};

use crate::proxy_health::{ProxyHealth, family_label};

/// Both families: every mode programs IPv4 and IPv6 in each sync, as kube-proxy does on a
/// dual-stack-capable node.
const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

/// Turns the loop's events into metrics and health.
#[derive(Debug)]
pub struct OpsFeed {
    metrics: Arc<Registry>,
    health: Arc<ProxyHealth>,
    node_name: String,
    mode: &'static str,
    /// Trigger times older than this are from before the proxy started: not latency.
    started: SystemTime,
    pending_service_changes: u64,
    pending_endpoint_changes: u64,
    /// Per family: when the changes waiting for the next sync were triggered.
    pending_triggers: BTreeMap<IpFamily, Vec<SystemTime>>,
}

impl OpsFeed {
    pub fn new(metrics: Arc<Registry>, health: Arc<ProxyHealth>, node_name: &str, mode: &'static str) -> Self {
        Self {
            metrics,
            health,
            node_name: node_name.to_owned(),
            mode,
            started: SystemTime::now(),
            pending_service_changes: 0,
            pending_endpoint_changes: 0,
            pending_triggers: BTreeMap::new(),
        }
    }

    fn publish_pending(&self) {
        self.metrics.set(SERVICE_CHANGES_PENDING, &[], self.pending_service_changes as f64);
        self.metrics.set(ENDPOINT_CHANGES_PENDING, &[], self.pending_endpoint_changes as f64);
    }

    /// kube-proxy's count of Services with a Local policy whose endpoints are all elsewhere
    /// (traffic to them here is dropped), by family and by which policy is Local.
    fn publish_no_local_endpoints(&self, plan: &NodePlan) {
        let mut counts: BTreeMap<(IpFamily, &str), u64> = BTreeMap::new();
        for family in FAMILIES {
            counts.insert((family, "internal"), 0);
            counts.insert((family, "external"), 0);
        }
        for port in plan.service_ports.values() {
            if port.cluster_endpoints.is_empty() || !port.local_endpoints.is_empty() {
                continue;
            }
            let local_route = |internal: bool| {
                port.frontends.iter().any(|frontend| {
                    (frontend.kind == FrontendKind::ClusterIp) == internal
                        && frontend.routes.iter().any(|route| route.endpoints == EndpointSetKind::Local)
                })
            };
            for (policy, internal) in [("internal", true), ("external", false)] {
                if local_route(internal) {
                    *counts.entry((port.family, policy)).or_default() += 1;
                }
            }
        }
        for ((family, policy), count) in counts {
            self.metrics.set(NO_LOCAL_ENDPOINTS_TOTAL, &[family_label(family), policy], count as f64);
        }
    }
}

impl AfterSync for OpsFeed {
    fn ingested(&mut self, changes: &[Change]) {
        let now = SystemTime::now();
        for change in changes {
            match change {
                Change::ServiceUpserted(_) | Change::ServiceDeleted(_) => {
                    self.pending_service_changes += 1;
                    self.metrics.add(SERVICE_CHANGES_TOTAL, &[], 1.0);
                }
                Change::SliceUpserted(slice) => {
                    self.pending_endpoint_changes += 1;
                    self.metrics.add(ENDPOINT_CHANGES_TOTAL, &[], 1.0);
                    if let Some(trigger) = slice.last_change_trigger.filter(|t| *t > self.started) {
                        self.pending_triggers.entry(slice.family).or_default().push(trigger);
                    }
                }
                Change::SliceDeleted(_) => {
                    self.pending_endpoint_changes += 1;
                    self.metrics.add(ENDPOINT_CHANGES_TOTAL, &[], 1.0);
                }
                Change::NodeUpserted(node) if node.name == self.node_name => {
                    self.health.set_node_leaving(Some(node.leaving));
                }
                Change::NodeDeleted(name) if *name == self.node_name => self.health.set_node_leaving(None),
                Change::NodeUpserted(_) | Change::NodeDeleted(_) => {}
            }
        }
        let wakes = changes.iter().any(|c| !matches!(c, Change::NodeUpserted(_) | Change::NodeDeleted(_)));
        if wakes {
            for family in FAMILIES {
                self.health.queued(family, now);
                self.metrics.set(SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP, &[family_label(family)], unix_seconds(now));
            }
        }
        self.publish_pending();
    }

    fn synced(&mut self, sync: &Synced<'_>) {
        let now = SystemTime::now();
        let seconds = sync.elapsed.as_secs_f64();
        let partial_or_full =
            if sync.report.full { SYNC_FULL_PROXY_RULES_DURATION } else { SYNC_PARTIAL_PROXY_RULES_DURATION };
        for family in FAMILIES {
            let label = family_label(family);
            self.metrics.observe(SYNC_PROXY_RULES_DURATION, &[label], seconds);
            self.metrics.observe(partial_or_full, &[label], seconds);
            self.metrics.set(SYNC_PROXY_RULES_LAST_TIMESTAMP, &[label], unix_seconds(now));
            self.health.updated(family, now);
        }
        for (family, triggers) in std::mem::take(&mut self.pending_triggers) {
            for trigger in triggers {
                let latency = now.duration_since(trigger).unwrap_or(Duration::ZERO);
                self.metrics.observe(NETWORK_PROGRAMMING_DURATION, &[family_label(family)], latency.as_secs_f64());
            }
        }
        self.pending_service_changes = 0;
        self.pending_endpoint_changes = 0;
        self.publish_pending();
        self.publish_no_local_endpoints(sync.plan);
        for count in sync.rule_counts {
            self.metrics.set(IPTABLES_TOTAL, &[family_label(count.family), count.table], count.rules as f64);
        }
        if let Some(node) = sync.state.node(&self.node_name) {
            self.health.set_node_leaving(Some(node.leaving));
        }
    }

    fn failed(&mut self, _error: &DataplaneError) {
        // kube-proxy counts per family, one failure per proxier; each mode syncs both
        // families in one transaction, so a failure is a failure of both.
        let family_counter = match self.mode {
            "nftables" => Some(NFTABLES_SYNC_FAILURES_TOTAL),
            "iptables" => Some(IPTABLES_RESTORE_FAILURES_TOTAL),
            _ => None,
        };
        if let Some(counter) = family_counter {
            for family in FAMILIES {
                self.metrics.add(counter, &[family_label(family)], 1.0);
            }
        }
        self.metrics.add(SYNC_FAILURES_TOTAL, &[self.mode], 1.0);
    }

    fn drifted(&mut self, _found: &str) {
        self.metrics.add(DRIFT_REPAIRS_TOTAL, &[self.mode], 1.0);
    }

    fn table_usage(&mut self, usage: &[svcplane_core::TableUsage]) {
        for table in usage {
            let labels = [self.mode, table.table];
            self.metrics.set(TABLE_ENTRIES, &labels, table.entries as f64);
            self.metrics.set(TABLE_CAPACITY, &labels, table.capacity as f64);
            self.metrics.set(TABLE_FULL, &labels, if table.full { 1.0 } else { 0.0 });
        }
    }
}

/// svcplane's own: entries in use in a mode's fixed-size kernel tables (eBPF maps).
pub const TABLE_ENTRIES: &str = "svcplane_dataplane_table_entries";
/// svcplane's own: the capacity of those tables (`--bpf-map-*`).
pub const TABLE_CAPACITY: &str = "svcplane_dataplane_table_capacity";
/// svcplane's own: 1 while syncs fail because the table is full.
pub const TABLE_FULL: &str = "svcplane_dataplane_table_full";

/// svcplane's own: kernel state found changed behind svcplane's back, each repaired by a full sync.
pub const DRIFT_REPAIRS_TOTAL: &str = "svcplane_drift_repairs_total";

/// svcplane's own: failed syncs by mode (every mode, where kube-proxy's counters name one).
pub const SYNC_FAILURES_TOTAL: &str = "svcplane_sync_failures_total";

fn unix_seconds(time: SystemTime) -> f64 {
    time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}
