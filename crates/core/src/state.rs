//! Cluster state with change tracking: objects go in one change at a time, and the state
//! remembers which Services were touched since the last sync so syncs can be partial.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use crate::model::{Endpoint, EndpointSlice, NamespacedName, Node, Service, ServicePortName};
use crate::sorted::SortedVec;

/// One observed change of cluster state.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    ServiceUpserted(Service),
    ServiceDeleted(NamespacedName),
    SliceUpserted(EndpointSlice),
    SliceDeleted(NamespacedName),
    NodeUpserted(Node),
    NodeDeleted(String),
}

/// What changed since the last [`ClusterState::take_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Services whose own object or endpoints changed.
    pub services: BTreeSet<NamespacedName>,
    /// Something every Service depends on changed (the node's topology): replan everything.
    pub everything: bool,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.everything
    }
}

/// An endpoint resolved for one service port: address, port and conditions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceEndpoint {
    pub address: SocketAddr,
    pub endpoint: Endpoint,
}

/// Everything the proxy knows about the cluster, keyed by object name.
#[derive(Debug, Default)]
pub struct ClusterState {
    services: BTreeMap<NamespacedName, Service>,
    slices: BTreeMap<NamespacedName, EndpointSlice>,
    slices_by_service: BTreeMap<NamespacedName, SortedVec<NamespacedName>>,
    nodes: BTreeMap<String, Node>,
    pending: Changes,
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one change. Returns whether it changed anything (re-sending an object that
    /// is already known is not a change).
    pub fn apply(&mut self, change: Change) -> bool {
        match change {
            Change::ServiceUpserted(service) => {
                if self.services.get(&service.name) == Some(&service) {
                    return false;
                }
                self.pending.services.insert(service.name.clone());
                self.services.insert(service.name.clone(), service);
                true
            }
            Change::ServiceDeleted(name) => {
                if self.services.remove(&name).is_none() {
                    return false;
                }
                self.pending.services.insert(name);
                true
            }
            Change::SliceUpserted(slice) => {
                let old = self.slices.get(&slice.name);
                if old == Some(&slice) {
                    return false;
                }
                if let Some(old) = old
                    && old.service != slice.service
                {
                    let old_service = old.service.clone();
                    self.unindex_slice(&old_service, &slice.name);
                }
                self.pending.services.insert(slice.service.clone());
                self.slices_by_service.entry(slice.service.clone()).or_default().insert(slice.name.clone());
                self.slices.insert(slice.name.clone(), slice);
                true
            }
            Change::SliceDeleted(name) => {
                let Some(old) = self.slices.remove(&name) else {
                    return false;
                };
                self.unindex_slice(&old.service, &name);
                self.pending.services.insert(old.service);
                true
            }
            Change::NodeUpserted(node) => {
                let old = self.nodes.get(&node.name);
                if old == Some(&node) {
                    return false;
                }
                // Zone and addresses feed every Service's plan.
                self.pending.everything = true;
                self.nodes.insert(node.name.clone(), node);
                true
            }
            Change::NodeDeleted(name) => {
                if self.nodes.remove(&name).is_none() {
                    return false;
                }
                self.pending.everything = true;
                true
            }
        }
    }

    /// Records a batch of changes, as [`Self::apply`] one after the other would.
    ///
    /// A feed's first batch into an empty state (the cold start: every object at once) is
    /// loaded in bulk: each map is built in one go from its sorted entries, so its B-tree
    /// nodes are full; filled one ascending key at a time they end about half empty,
    /// megabytes at 10k Services.
    pub fn apply_all(&mut self, changes: Vec<Change>) {
        let cold = self.services.is_empty()
            && self.slices.is_empty()
            && changes.len() >= BULK_LOAD_MIN
            && !changes.iter().any(|change| matches!(change, Change::ServiceDeleted(_) | Change::SliceDeleted(_)));
        if !cold {
            for change in changes {
                self.apply(change);
            }
            return;
        }
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for change in changes {
            match change {
                Change::ServiceUpserted(service) => services.push(service),
                Change::SliceUpserted(slice) => slices.push(slice),
                other => {
                    self.apply(other);
                }
            }
        }
        // The last of several upserts of one name wins, as applying them in turn would.
        let services = last_of_each(services, |service| &service.name);
        let slices = last_of_each(slices, |slice| &slice.name);
        self.slices_by_service = group_sorted(slices.iter().map(|slice| (slice.service.clone(), slice.name.clone())));
        // Nothing was planned from an empty state: planning everything is planning these.
        self.pending.everything |= !services.is_empty() || !slices.is_empty();
        self.services = services.into_iter().map(|service| (service.name.clone(), service)).collect();
        self.slices = slices.into_iter().map(|slice| (slice.name.clone(), slice)).collect();
    }

    fn unindex_slice(&mut self, service: &NamespacedName, slice: &NamespacedName) {
        if let Some(names) = self.slices_by_service.get_mut(service) {
            names.remove(slice);
            if names.is_empty() {
                self.slices_by_service.remove(service);
            }
        }
    }

    /// Hands over what changed since the previous call and starts a new period.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.pending)
    }

    /// Whether anything changed since the last [`Self::take_changes`].
    pub fn has_pending_changes(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Marks everything as changed, for a full resync.
    pub fn mark_everything_changed(&mut self) {
        self.pending.everything = true;
    }

    pub fn service(&self, name: &NamespacedName) -> Option<&Service> {
        self.services.get(name)
    }

    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    pub fn slices(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.values()
    }

    /// The endpoints of one service port across all of its slices, sorted by address.
    ///
    /// A slice port matches by name and protocol. The same address and port in two slices
    /// (a pod moving between slices) counts once, preferring the copy that is not
    /// terminating, as kube-proxy does.
    pub fn endpoints_for(&self, port: &ServicePortName) -> Vec<ServiceEndpoint> {
        let mut by_address: BTreeMap<SocketAddr, Endpoint> = BTreeMap::new();
        let Some(slice_names) = self.slices_by_service.get(&port.service) else {
            return Vec::new();
        };
        for slice in slice_names.iter().filter_map(|name| self.slices.get(name)) {
            let Some(slice_port) = slice.ports.iter().find(|p| p.name == port.port_name && p.protocol == port.protocol)
            else {
                continue;
            };
            for endpoint in &slice.endpoints {
                let address = SocketAddr::new(endpoint.address, slice_port.port);
                match by_address.get(&address) {
                    Some(known) if !known.terminating || endpoint.terminating => {}
                    _ => {
                        by_address.insert(address, endpoint.clone());
                    }
                }
            }
        }
        by_address.into_iter().map(|(address, endpoint)| ServiceEndpoint { address, endpoint }).collect()
    }
}

/// Batches smaller than this into an empty state are applied one change at a time.
const BULK_LOAD_MIN: usize = 64;

/// `values` sorted by name, keeping the last of each name.
fn last_of_each<T>(mut values: Vec<T>, name: impl Fn(&T) -> &NamespacedName) -> Vec<T> {
    // Stable: equal names keep their order, and the last of each run is the latest.
    values.sort_by(|a, b| name(a).cmp(name(b)));
    let mut kept: Vec<T> = Vec::with_capacity(values.len());
    for value in values {
        match kept.last_mut() {
            Some(last) if name(last) == name(&value) => *last = value,
            _ => kept.push(value),
        }
    }
    kept
}

/// (key, value) pairs grouped by key into sorted sets, the map built in bulk.
fn group_sorted(
    pairs: impl Iterator<Item = (NamespacedName, NamespacedName)>,
) -> BTreeMap<NamespacedName, SortedVec<NamespacedName>> {
    let mut pairs: Vec<_> = pairs.collect();
    pairs.sort();
    let mut groups: Vec<(NamespacedName, Vec<NamespacedName>)> = Vec::new();
    for (key, value) in pairs {
        match groups.last_mut() {
            Some((last, values)) if *last == key => values.push(value),
            _ => groups.push((key, vec![value])),
        }
    }
    groups.into_iter().map(|(key, values)| (key, values.into_iter().collect())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EndpointPort, IpFamily, Node, Protocol, ServicePort};

    fn web() -> Service {
        Service::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        )
    }

    fn slice(name: &str, addresses: &[&str]) -> EndpointSlice {
        EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", name),
            service: NamespacedName::new("default", "web"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: addresses.iter().map(|a| Endpoint::ready(a.parse().unwrap(), None)).collect(),
        }
    }

    fn http_port() -> ServicePortName {
        web().port_name(&web().ports[0])
    }

    /// A cold batch: Services with two slices each (one of them sent twice, changed), in an
    /// order other than their names', and a node.
    fn cold_batch() -> Vec<Change> {
        let mut changes = vec![Change::NodeUpserted(Node { name: "node1".into(), ..Node::default() })];
        for n in (0..40).rev() {
            let mut service = web();
            service.name = NamespacedName::new("default", format!("web-{n}"));
            changes.push(Change::ServiceUpserted(service.clone()));
            for (part, address) in [("a", "198.18.129.2"), ("b", "198.18.129.3"), ("a", "198.18.129.4")] {
                let mut endpoints = slice(&format!("web-{n}-{part}"), &[address]);
                endpoints.service = service.name.clone();
                changes.push(Change::SliceUpserted(endpoints));
            }
        }
        changes
    }

    #[test]
    fn a_cold_batch_loaded_in_bulk_is_the_state_its_changes_make_one_by_one() {
        let mut bulk = ClusterState::new();
        bulk.apply_all(cold_batch());
        let mut one_by_one = ClusterState::new();
        for change in cold_batch() {
            one_by_one.apply(change);
        }
        assert_eq!(bulk.services, one_by_one.services);
        assert_eq!(bulk.slices, one_by_one.slices);
        assert_eq!(bulk.slices_by_service, one_by_one.slices_by_service);
        assert_eq!(bulk.nodes, one_by_one.nodes);
        assert_eq!((bulk.services.len(), bulk.slices.len()), (40, 80));
        // The later copy of a slice sent twice is the one kept.
        let mut port = http_port();
        port.service = NamespacedName::new("default", "web-7");
        let addresses: Vec<String> = bulk.endpoints_for(&port).iter().map(|e| e.address.to_string()).collect();
        assert_eq!(addresses, ["198.18.129.3:8080", "198.18.129.4:8080"]);
        assert!(bulk.take_changes().everything);
    }

    #[test]
    fn a_batch_into_a_state_that_holds_objects_is_applied_change_by_change() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(web()));
        state.take_changes();
        // Without the node, whose change alone asks for everything.
        state.apply_all(cold_batch().into_iter().skip(1).collect());
        let changes = state.take_changes();
        assert!(!changes.everything);
        assert_eq!(changes.services.len(), 40);
        assert_eq!(state.services.len(), 41);
    }

    #[test]
    fn adding_a_service_reports_it_as_changed() {
        let mut state = ClusterState::new();
        assert!(state.apply(Change::ServiceUpserted(web())));
        let changes = state.take_changes();
        assert_eq!(changes.services.into_iter().collect::<Vec<_>>(), vec![web().name]);
        assert!(state.take_changes().is_empty());
    }

    #[test]
    fn resending_an_unchanged_object_is_not_a_change() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(web()));
        state.apply(Change::SliceUpserted(slice("web-1", &["198.18.129.2"])));
        state.take_changes();
        assert!(!state.apply(Change::ServiceUpserted(web())));
        assert!(!state.apply(Change::SliceUpserted(slice("web-1", &["198.18.129.2"]))));
        assert!(state.take_changes().is_empty());
    }

    #[test]
    fn a_slice_change_marks_its_service_changed() {
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(web()));
        state.take_changes();
        state.apply(Change::SliceUpserted(slice("web-1", &["198.18.129.2"])));
        assert!(state.take_changes().services.contains(&web().name));
        state.apply(Change::SliceDeleted(NamespacedName::new("default", "web-1")));
        assert!(state.take_changes().services.contains(&web().name));
        assert!(state.endpoints_for(&http_port()).is_empty());
    }

    #[test]
    fn endpoints_of_all_slices_are_merged_and_sorted_by_address() {
        let mut state = ClusterState::new();
        state.apply(Change::SliceUpserted(slice("web-2", &["198.18.129.9"])));
        state.apply(Change::SliceUpserted(slice("web-1", &["198.18.129.3", "198.18.129.2"])));
        let addresses: Vec<String> = state.endpoints_for(&http_port()).iter().map(|e| e.address.to_string()).collect();
        assert_eq!(addresses, ["198.18.129.2:8080", "198.18.129.3:8080", "198.18.129.9:8080"]);
    }

    #[test]
    fn a_duplicate_endpoint_prefers_the_copy_that_is_not_terminating() {
        let mut state = ClusterState::new();
        let mut old = slice("web-1", &["198.18.129.2"]);
        old.endpoints[0].terminating = true;
        old.endpoints[0].ready = false;
        state.apply(Change::SliceUpserted(old));
        state.apply(Change::SliceUpserted(slice("web-2", &["198.18.129.2"])));
        let endpoints = state.endpoints_for(&http_port());
        assert_eq!(endpoints.len(), 1);
        assert!(endpoints[0].endpoint.ready);
    }

    #[test]
    fn a_slice_port_of_another_name_or_protocol_does_not_match() {
        let mut state = ClusterState::new();
        let mut other = slice("web-1", &["198.18.129.2"]);
        other.ports[0].protocol = Protocol::Udp;
        state.apply(Change::SliceUpserted(other));
        assert!(state.endpoints_for(&http_port()).is_empty());
    }

    #[test]
    fn a_node_change_asks_for_everything_to_be_replanned() {
        let mut state = ClusterState::new();
        state.apply(Change::NodeUpserted(Node { name: "node1".into(), ..Node::default() }));
        assert!(state.take_changes().everything);
    }
}
