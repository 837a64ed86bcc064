//! What runs after a sync: each hook sees the plan that is now in the kernel and what
//! changed, or hears that a sync failed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;
use svcplane_conntrack::{ConntrackCli, UdpFlowFilter};
use svcplane_core::conntrack::{FlowDestination, stale_udp_flows, udp_flows_not_to_serving_endpoints};

use svcplane_core::{Change, ClusterState, DataplaneError, NodePlan, PlanDiff, SyncReport};
use tracing::{info, warn};

use crate::health::HealthServers;

/// One successful sync, as hooks see it.
#[derive(Debug, Clone, Copy)]
pub struct Synced<'a> {
    /// What is now in the kernel.
    pub plan: &'a NodePlan,
    /// What this sync changed.
    pub diff: &'a PlanDiff,
    pub report: &'a SyncReport,
    /// How long the dataplane took.
    pub elapsed: Duration,
    /// The cluster state the plan was made from.
    pub state: &'a ClusterState,
    /// Rules the mode owns per family and table (empty for modes without rule tables).
    pub rule_counts: &'a [svcplane_core::RuleCount],
}

/// Something that follows the kernel's state.
pub trait AfterSync: Send + std::fmt::Debug {
    /// A sync succeeded.
    fn synced(&mut self, sync: &Synced<'_>);

    /// A sync failed: the kernel still holds the last state that synced.
    fn failed(&mut self, _error: &DataplaneError) {}

    /// A batch of changes from the feed, before it is applied (they wait for a sync now).
    fn ingested(&mut self, _changes: &[Change]) {}

    /// The mode found its kernel state changed behind svcplane's back (`found` says what);
    /// a full resync follows.
    fn drifted(&mut self, _found: &str) {}

    /// After each sync, successful or not, for modes with fixed-size tables: how full
    /// each is (a full one is why a sync failed).
    fn table_usage(&mut self, _usage: &[svcplane_core::TableUsage]) {}

    /// Called on every turn of the loop, synced or not (a few times a second), with the
    /// plan in force; for hooks that publish the plan only when someone looks.
    fn tick(&mut self, _plan: &NodePlan, _state: &ClusterState) {}
}

impl AfterSync for HealthServers {
    fn synced(&mut self, sync: &Synced<'_>) {
        self.update(&sync.plan.health_checks);
        self.set_proxy_healthy(true);
    }

    fn failed(&mut self, _error: &DataplaneError) {
        // The kernel may not hold what the counts describe: answer 503, as kube-proxy does
        // when it is not healthy, until a sync succeeds.
        self.set_proxy_healthy(false);
    }
}

/// Deletes the UDP conntrack entries the core calls stale after each sync, once the rules
/// that replace them are in (modes whose traffic goes through the kernel's conntrack).
///
/// The deleting runs on a thread of its own: each filter is one walk of the whole
/// conntrack table, and with a busy node's table (a hundred thousand entries) one endpoint
/// leaving many Services cost seconds, during which the sync loop, had it waited, would
/// have programmed nothing new. Filters queued while the thread is busy are merged.
pub struct StaleUdpCleanup {
    filters: mpsc::Sender<Vec<UdpFlowFilter>>,
    /// Reply sources that stand for a serving endpoint in the mode's kernel state.
    also_keep: Option<ReplySources>,
}

/// Reads, after each sync, the reply sources a mode puts in front of its endpoints.
pub type ReplySources = Box<dyn Fn() -> BTreeSet<SocketAddr> + Send>;

impl std::fmt::Debug for StaleUdpCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaleUdpCleanup").field("also_keep", &self.also_keep.is_some()).finish_non_exhaustive()
    }
}

impl Default for StaleUdpCleanup {
    fn default() -> Self {
        Self::new(ConntrackCli::default())
    }
}

impl StaleUdpCleanup {
    pub fn new(conntrack: ConntrackCli) -> Self {
        let (filters, queue) = mpsc::channel::<Vec<UdpFlowFilter>>();
        let worker = move || {
            while let Ok(first) = queue.recv() {
                let mut pending: BTreeSet<UdpFlowFilter> = first.into_iter().collect();
                for more in queue.try_iter() {
                    pending.extend(more);
                }
                for filter in pending {
                    match conntrack.delete_udp_flows(&filter) {
                        Ok(0) => {}
                        Ok(deleted) => info!(deleted, port = filter.port, "removed stale UDP flows"),
                        Err(error) => warn!("removing stale UDP flows: {error}"),
                    }
                }
            }
        };
        // Without the thread, filters queue unread and nothing is deleted: logged, not fatal.
        if let Err(error) = std::thread::Builder::new().name("stale-udp-cleanup".to_owned()).spawn(worker) {
            warn!("starting the stale UDP flow cleanup thread: {error}");
        }
        Self { filters, also_keep: None }
    }

    /// Also keeps the flows whose replies come from one of `sources()`, read after each
    /// sync: for a mode whose kernel NAT points flows at its own listeners rather than at
    /// endpoints (userspace), where those flows end when their endpoint does, on their own.
    #[must_use]
    pub fn keeping_replies_from(mut self, sources: ReplySources) -> Self {
        self.also_keep = Some(sources);
        self
    }

    /// The conntrack filters for a sync's stale flows: those of what changed, and after
    /// rules replaced wholesale, those of every UDP frontend.
    fn filters(&self, plan: &NodePlan, diff: &PlanDiff, report: &SyncReport) -> Vec<UdpFlowFilter> {
        let mut stale = stale_udp_flows(plan, diff);
        if report.rules_replaced {
            let every = udp_flows_not_to_serving_endpoints(plan);
            info!(frontends = every.len(), "the rules were replaced: removing UDP flows that bypassed them");
            stale.extend(every);
        }
        if stale.is_empty() {
            return Vec::new();
        }
        let also_keep = self.also_keep.as_ref().map(|sources| sources()).unwrap_or_default();
        stale
            .into_iter()
            .map(|stale| UdpFlowFilter {
                family: stale.family,
                destination: match stale.destination {
                    FlowDestination::Address(address) => Some(address),
                    FlowDestination::NodePort => None,
                },
                port: stale.port,
                keep_replies_from: stale.keep_replies_from.into_iter().chain(also_keep.iter().copied()).collect(),
            })
            .collect()
    }
}

impl AfterSync for StaleUdpCleanup {
    fn synced(&mut self, sync: &Synced<'_>) {
        let filters = self.filters(sync.plan, sync.diff, sync.report);
        if !filters.is_empty() {
            // Fails only once the thread is gone, and then there is nobody left to tell.
            let _ = self.filters.send(filters);
        }
    }
}

#[cfg(test)]
mod tests {
    use svcplane_core::model::{
        Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, Protocol, Service, ServicePort,
    };
    use svcplane_core::{NodeConfig, PlanDiff};

    use super::*;

    /// A plan with one UDP and one TCP ClusterIP Service, each with one ready endpoint.
    fn plan() -> NodePlan {
        let mut state = ClusterState::new();
        for (name, ip, protocol) in [("dns", "198.19.0.10", Protocol::Udp), ("web", "198.19.0.11", Protocol::Tcp)] {
            let service = NamespacedName::new("shop", name);
            state.apply(Change::ServiceUpserted(Service::cluster_ip(
                service.clone(),
                vec![ip.parse().unwrap()],
                vec![ServicePort { name: "p".into(), protocol, port: 53, node_port: None }],
            )));
            state.apply(Change::SliceUpserted(EndpointSlice {
                last_change_trigger: None,
                name: NamespacedName::new("shop", format!("{name}-1")),
                service,
                family: IpFamily::V4,
                ports: vec![EndpointPort { name: "p".into(), protocol, port: 5353 }],
                endpoints: vec![Endpoint::ready("198.18.129.2".parse().unwrap(), Some("node1"))],
            }));
        }
        NodePlan::build(&state, NodeConfig { node_name: "node1".into(), ..NodeConfig::default() })
    }

    #[test]
    fn rules_replaced_wholesale_clean_every_udp_frontend_and_an_in_place_sync_with_no_change_cleans_nothing() {
        let cleanup = StaleUdpCleanup::default();
        let plan = plan();
        let in_place = SyncReport { full: true, service_ports: 2, operations: 10, rules_replaced: false };
        assert!(cleanup.filters(&plan, &PlanDiff::default(), &in_place).is_empty());
        let replaced = SyncReport { rules_replaced: true, ..in_place };
        let filters = cleanup.filters(&plan, &PlanDiff::default(), &replaced);
        assert_eq!(filters.len(), 1, "the UDP Service's ClusterIP only: {filters:?}");
        assert_eq!(filters[0].destination, Some("198.19.0.10".parse().unwrap()));
        assert_eq!(filters[0].port, 53);
        assert_eq!(filters[0].keep_replies_from, BTreeSet::from(["198.18.129.2:5353".parse().unwrap()]));
    }
}
