//! svcplane's userspace mode: the kernel DNATs every frontend of the plan (ClusterIP,
//! NodePort, external and load-balancer IPs; from pods, from the node itself and from
//! outside) to a listener of a relay in the proxy process, which chooses an endpoint from
//! the plan's route and relays the bytes: TCP with `splice`, UDP as a session per client.
//!
//! It decides no Service rule: which sources take which route (and so which endpoint set),
//! what is refused or dropped, the affinity and its timeout all come from the plan. Its own
//! choices are how to relay: round robin within the set, a failed connect retried on the
//! next eligible endpoint, connections to removed endpoints closed after a grace period,
//! and the limits. The endpoint sees the node's address, never the client's: source IP is
//! not preserved in this mode by design. The redirect rules go through `svcplane-nft` in
//! svcplane's own table, rewritten whole at each sync (see `docs/backend-userspace.md`).

pub mod options;
pub mod pool;
pub mod relay;
pub mod render;
pub mod stats;
mod tcp;
mod udp;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use svcplane_core::counters::EndpointCounter;
use svcplane_core::{Dataplane, DataplaneError, IpFamily, NodePlan, PlanDiff, PlanKey, SyncReport};
use svcplane_nft::Nftables;

pub use options::Options;
pub use relay::Relay;
pub use render::{ListenerPorts, TABLE, render_family, table_name};
pub use stats::Stats;

/// How often the drift check may look at the kernel.
const DRIFT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum UserspaceError {
    #[error("starting the relay: {0}")]
    Start(#[source] std::io::Error),
    #[error("opening the relay's listener for {service_port} on {address}: {source}")]
    Listen { service_port: String, address: IpAddr, source: std::io::Error },
    #[error("writing the {family} redirect rules ({operations} operations): {source}")]
    Apply { family: IpFamily, operations: usize, source: svcplane_nft::NftError },
}

/// A service port's pool, as the view lists them.
type PoolEntry = (PlanKey, Arc<pool::Pool>);

/// What the proxy process reads of a running relay (`/metrics`, `/status`), apart from
/// the sync loop that owns the backend.
#[derive(Debug, Clone, Default)]
pub struct RelayView {
    stats: Arc<Stats>,
    pools: Arc<Mutex<Vec<PoolEntry>>>,
    listeners: Arc<Mutex<BTreeSet<SocketAddr>>>,
}

impl RelayView {
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The relay's counters as Prometheus text.
    pub fn prometheus(&self) -> String {
        let mut text = self.stats.prometheus();
        let pools = self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        text.push_str(
            "# HELP svcplane_userspace_service_connections Open connections and UDP sessions per service port.\n\
             # TYPE svcplane_userspace_service_connections gauge\n",
        );
        for (key, pool) in pools.iter() {
            text.push_str(&format!(
                "svcplane_userspace_service_connections{{service_port=\"{}\",protocol=\"{}\",family=\"{}\"}} {}\n",
                pool.name,
                key.name.protocol,
                key.family,
                pool.active()
            ));
        }
        text
    }

    /// Where the relay listens, as of the last sync: a UDP conntrack entry whose replies
    /// come from one of these is a relayed flow. The relay ends such a session itself when
    /// its endpoint stops serving, so the entry is never stale, and deleting it would make
    /// a reply already on its way leave with the listener's address instead of the
    /// Service's.
    pub fn listener_addresses(&self) -> BTreeSet<SocketAddr> {
        self.listeners.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// New connections per endpoint, as every mode reports them.
    pub fn counters(&self) -> Vec<EndpointCounter> {
        let pools = self.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut counters = Vec::new();
        for (key, pool) in pools.iter() {
            for (endpoint, connections) in pool.connection_counts() {
                counters.push(EndpointCounter {
                    service_port: pool.name.clone(),
                    protocol: key.name.protocol,
                    endpoint,
                    connections,
                });
            }
        }
        counters
    }
}

/// The userspace mode: redirect rules through `N`, the relay in a runtime of its own
/// (started at the first sync, so `render` and `cleanup` start nothing).
#[derive(Debug)]
pub struct UserspaceBackend<N> {
    nft: N,
    families: Vec<IpFamily>,
    options: Options,
    relay: Option<Relay>,
    view: RelayView,
    /// Families whose missing node address was already reported.
    warned_no_address: HashSet<IpFamily>,
    last_drift_check: Option<Instant>,
    synced: bool,
}

impl<N: Nftables> UserspaceBackend<N> {
    pub fn new(nft: N, options: Options) -> Self {
        Self {
            nft,
            families: vec![IpFamily::V4, IpFamily::V6],
            options,
            relay: None,
            view: RelayView::default(),
            warned_no_address: HashSet::new(),
            last_drift_check: None,
            synced: false,
        }
    }

    /// A view of the relay for the proxy's servers; valid before the relay starts.
    pub fn view(&self) -> RelayView {
        self.view.clone()
    }

    /// The address the relay listens on in `family`: the node's first of that family.
    fn relay_address(plan: &NodePlan, family: IpFamily) -> Option<IpAddr> {
        plan.config.node_ips.iter().copied().find(|ip| IpFamily::of(ip) == family)
    }

    fn sync_plan(&mut self, plan: &NodePlan) -> Result<SyncReport, UserspaceError> {
        let started = Instant::now();
        if self.relay.is_none() {
            self.relay =
                Some(Relay::start(self.options.clone(), self.view.stats.clone()).map_err(UserspaceError::Start)?);
        }
        let relay = self.relay.as_mut().expect("started above");
        let mut keep = HashSet::new();
        let mut addresses = BTreeMap::new();
        for &family in &self.families {
            let address = Self::relay_address(plan, family);
            let ports_of_family = plan.service_ports.iter().filter(|(key, p)| {
                key.family == family && render::relayed(p.protocol) && !render::used_sets(p).is_empty()
            });
            for (key, port_plan) in ports_of_family {
                let Some(address) = address else {
                    if self.warned_no_address.insert(family) {
                        tracing::error!(
                            "userspace mode has no {family} node address to relay on (--node-ip, or the Node \
                             object's addresses): {family} Services are refused until it has one"
                        );
                    }
                    continue;
                };
                relay.update_pool(key, port_plan);
                for set in render::used_sets(port_plan) {
                    relay.ensure_listener(key, set, port_plan.protocol, address).map_err(|source| {
                        UserspaceError::Listen { service_port: relay::port_label(port_plan), address, source }
                    })?;
                    keep.insert((key.clone(), set));
                }
            }
            addresses.insert(family, address);
        }
        let relay_ready = started.elapsed();
        let ports = relay.ports();
        let mut operations = 0;
        for &family in &self.families {
            let transaction = render_family(plan, family, addresses[&family], &ports);
            operations += transaction.operations.len();
            self.nft.apply(&transaction).map_err(|source| UserspaceError::Apply {
                family,
                operations: transaction.operations.len(),
                source,
            })?;
        }
        tracing::debug!(?relay_ready, rules_written = ?started.elapsed(), "userspace sync");
        // Only now, with no rule left pointing at them, do unused listeners close.
        relay.retain(&keep);
        *self.view.pools.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            relay.pools().map(|(key, pool)| (key.clone(), pool.clone())).collect();
        *self.view.listeners.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = relay.listener_addresses();
        self.synced = true;
        Ok(SyncReport { full: true, service_ports: plan.service_ports.len(), operations, rules_replaced: false })
    }
}

impl<N: Nftables + Send + std::fmt::Debug> Dataplane for UserspaceBackend<N> {
    fn mode(&self) -> &'static str {
        "userspace"
    }

    /// Every sync rewrites both tables whole (one atomic transaction each) and brings
    /// every pool up to date: the relay's state is cheap to compare, and its listeners
    /// keep their ports across syncs.
    fn sync(&mut self, plan: &NodePlan, _diff: &PlanDiff) -> Result<SyncReport, DataplaneError> {
        Ok(self.sync_plan(plan)?)
    }

    fn request_full_resync(&mut self) {}

    fn detect_drift(&mut self) -> Option<String> {
        if !self.synced || self.last_drift_check.is_some_and(|at| at.elapsed() < DRIFT_CHECK_INTERVAL) {
            return None;
        }
        self.last_drift_check = Some(Instant::now());
        for &family in &self.families {
            match self.nft.count_rules(&table_name(family), render::DRIFT_CHAIN) {
                Ok(0) => return Some(format!("the {family} redirect rules of table {TABLE} are gone")),
                Ok(_) => {}
                Err(error) => return Some(format!("reading the {family} table {TABLE}: {error}")),
            }
        }
        None
    }

    fn render(&self, plan: &NodePlan) -> Result<String, DataplaneError> {
        // Listener ports exist only in a running relay: 0 stands for "chosen at sync".
        let mut ports = ListenerPorts::new();
        for (key, port_plan) in &plan.service_ports {
            for set in render::used_sets(port_plan) {
                ports.insert((key.clone(), set), 0);
            }
        }
        let mut text = String::new();
        for &family in &self.families {
            let transaction = render_family(plan, family, Self::relay_address(plan, family), &ports);
            text.push_str(&svcplane_nft::render(&transaction)?);
        }
        Ok(text)
    }

    fn cleanup(&mut self) -> Result<bool, DataplaneError> {
        let mut removed = false;
        for &family in &self.families {
            removed |= self.nft.delete_table(&table_name(family))?;
        }
        self.synced = false;
        Ok(removed)
    }

    fn counters(&mut self) -> Result<Vec<EndpointCounter>, DataplaneError> {
        if self.relay.is_none() {
            return Err(
                "the userspace relay runs in the proxy process: its counters are on the proxy's /metrics".into()
            );
        }
        Ok(self.view.counters())
    }
}
