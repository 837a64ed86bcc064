//! What this process last applied to the IPVS table, per service port of the plan, and the
//! pure step from that record to a new plan.
//!
//! A sync spells only the service ports the plan's diff names ([`Applied::step`]) and diffs
//! them against the record, so one endpoint change costs one spelled port and the requests
//! that change it: no read of the kernel's table. It spells the whole plan again (and diffs
//! it against the record, still without reading the kernel) when something every port
//! depends on changed: the addresses NodePorts answer on, or the firewall marks (chosen
//! over the whole plan); and when a changed port shares a virtual service with a port
//! that did not change (two Services on one address and port, which the plan does not
//! make). The record also answers the drift check ([`Applied::missing_from`],
//! [`Applied::destinations_differ`]).
//!
//! It touches no kernel: the backend reads the table on the first sync and after a full
//! resync, and applies the changes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use svcplane_core::{IpFamily, NodePlan, PlanDiff, PlanKey};
use svcplane_ipvs::{Change, Destination, Service, ServiceEntry, ServiceKey, diff};

use crate::{Marks, node_port_addresses, plan_marks, spell_port};

/// The virtual services of each service port, as spelled.
pub type PortServices = BTreeMap<PlanKey, BTreeMap<ServiceKey, ServiceEntry>>;

/// The virtual services (with their real servers) this process wrote, and what their
/// spelling depended on beyond each port's own plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    services: BTreeMap<ServiceKey, ServiceEntry>,
    by_port: BTreeMap<PlanKey, BTreeSet<ServiceKey>>,
    owners: BTreeMap<ServiceKey, BTreeSet<PlanKey>>,
    /// Per family, the addresses NodePorts answered on.
    node_port_addresses: BTreeMap<IpFamily, Vec<IpAddr>>,
    marks: Marks,
}

/// What a sync sends to the IPVS table, and how the record changes once it is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub changes: Vec<Change>,
    /// The whole plan was spelled.
    pub full: bool,
    /// Service ports spelled.
    pub service_ports: usize,
    update: Update,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Update {
    Whole(Applied),
    /// The new spelling of each changed port (`None`: the port is gone).
    Ports(BTreeMap<PlanKey, Option<BTreeMap<ServiceKey, ServiceEntry>>>),
}

/// Every service port of `plan`, spelled.
pub fn spell_ports(plan: &NodePlan, scheduler: &str, node_addresses: &[IpAddr], marks: &Marks) -> PortServices {
    plan.service_ports
        .iter()
        .map(|(key, port)| (key.clone(), spell_port(plan, port, scheduler, node_addresses, marks)))
        .collect()
}

fn node_port_addresses_of(plan: &NodePlan, node_addresses: &[IpAddr]) -> BTreeMap<IpFamily, Vec<IpAddr>> {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|family| (family, node_port_addresses(plan, family, node_addresses)))
        .collect()
}

impl Applied {
    /// The record of the whole of `plan` spelled.
    pub fn of_plan(plan: &NodePlan, scheduler: &str, node_addresses: &[IpAddr]) -> Self {
        let marks = plan_marks(plan, node_addresses);
        let ports = spell_ports(plan, scheduler, node_addresses, &marks);
        Self::new(ports, node_port_addresses_of(plan, node_addresses), marks)
    }

    fn new(ports: PortServices, node_port_addresses: BTreeMap<IpFamily, Vec<IpAddr>>, marks: Marks) -> Self {
        let mut applied = Applied { node_port_addresses, marks, ..Applied::default() };
        applied.replace(ports.into_iter().map(|(key, services)| (key, Some(services))).collect());
        applied
    }

    /// Every virtual service written, by key.
    pub fn services(&self) -> &BTreeMap<ServiceKey, ServiceEntry> {
        &self.services
    }

    /// The step from this record to `plan`, when only the service ports in `changed` differ
    /// from the plan this record was spelled from.
    pub fn step(&self, plan: &NodePlan, changed: &PlanDiff, scheduler: &str, node_addresses: &[IpAddr]) -> Step {
        let marks = plan_marks(plan, node_addresses);
        let node_port_addresses = node_port_addresses_of(plan, node_addresses);
        if node_port_addresses != self.node_port_addresses || marks != self.marks {
            return self.whole(plan, scheduler, node_addresses, node_port_addresses, marks);
        }
        let ports: BTreeMap<PlanKey, Option<BTreeMap<ServiceKey, ServiceEntry>>> = changed
            .keys()
            .map(|key| {
                let spelled =
                    plan.service_ports.get(key).map(|port| spell_port(plan, port, scheduler, node_addresses, &marks));
                (key.clone(), spelled)
            })
            .collect();
        let before: BTreeSet<ServiceKey> =
            ports.keys().filter_map(|key| self.by_port.get(key)).flatten().copied().collect();
        let after: BTreeMap<ServiceKey, ServiceEntry> = ports.values().flatten().flat_map(Clone::clone).collect();
        // A virtual service a port outside the diff also spells: the whole plan decides it.
        let shared = before.iter().chain(after.keys()).any(|service| {
            self.owners.get(service).is_some_and(|owners| owners.iter().any(|owner| !ports.contains_key(owner)))
        });
        if shared {
            return self.whole(plan, scheduler, node_addresses, node_port_addresses, marks);
        }
        let current: Vec<ServiceEntry> = before.iter().filter_map(|key| self.services.get(key)).cloned().collect();
        let wanted: Vec<ServiceEntry> = after.into_values().collect();
        Step { changes: diff(&current, &wanted), full: false, service_ports: ports.len(), update: Update::Ports(ports) }
    }

    /// The whole plan spelled again, diffed against this record.
    fn whole(
        &self,
        plan: &NodePlan,
        scheduler: &str,
        node_addresses: &[IpAddr],
        node_port_addresses: BTreeMap<IpFamily, Vec<IpAddr>>,
        marks: Marks,
    ) -> Step {
        let ports = spell_ports(plan, scheduler, node_addresses, &marks);
        let applied = Applied::new(ports, node_port_addresses, marks);
        let current: Vec<ServiceEntry> = self.services.values().cloned().collect();
        let wanted: Vec<ServiceEntry> = applied.services.values().cloned().collect();
        Step {
            changes: diff(&current, &wanted),
            full: true,
            service_ports: plan.service_ports.len(),
            update: Update::Whole(applied),
        }
    }

    /// The step from `current` (the kernel's table, the services that are ours) to the
    /// whole of `plan`: the first sync and a full resync.
    /// `wanted` is [`Applied::of_plan`]; `service_ports` how many ports it spelled.
    pub fn from_kernel(current: &[ServiceEntry], wanted: Applied, service_ports: usize) -> Step {
        let services: Vec<ServiceEntry> = wanted.services.values().cloned().collect();
        Step { changes: diff(current, &services), full: true, service_ports, update: Update::Whole(wanted) }
    }

    /// Records `step` as applied.
    pub fn commit(&mut self, step: Step) {
        match step.update {
            Update::Whole(applied) => *self = applied,
            Update::Ports(ports) => self.replace(ports),
        }
    }

    /// The record after `step`, starting from nothing for a whole spelling.
    pub fn after(step: Step) -> Self {
        let mut applied = Applied::default();
        applied.commit(step);
        applied
    }

    fn replace(&mut self, ports: BTreeMap<PlanKey, Option<BTreeMap<ServiceKey, ServiceEntry>>>) {
        for key in ports.keys() {
            for service in self.by_port.remove(key).unwrap_or_default() {
                let owners = self.owners.entry(service).or_default();
                owners.remove(key);
                if owners.is_empty() {
                    self.owners.remove(&service);
                    self.services.remove(&service);
                }
            }
        }
        // In the plan's order: a virtual service two ports spell is the later's.
        for (key, services) in ports {
            let Some(services) = services else { continue };
            self.by_port.insert(key.clone(), services.keys().copied().collect());
            for (service, entry) in services {
                self.owners.entry(service).or_default().insert(key.clone());
                self.services.insert(service, entry);
            }
        }
    }

    /// What of this record `kernel` (every virtual service the kernel lists) lacks or holds
    /// otherwise (scheduler, persistence): a virtual service deleted or edited behind our
    /// back. `None` when every one is there as written.
    pub fn missing_from(&self, kernel: &[Service]) -> Option<String> {
        let kernel: BTreeMap<ServiceKey, &Service> = kernel.iter().map(|service| (service.key, service)).collect();
        let mut missing = self.services.keys().filter(|key| !kernel.contains_key(key));
        if let Some(first) = missing.next() {
            let more = missing.count();
            return Some(format!(
                "{} of the {} virtual services svcplane wrote are missing from the IPVS table (the first: {first})",
                more + 1,
                self.services.len()
            ));
        }
        self.services.values().find(|entry| kernel.get(&entry.service.key) != Some(&&entry.service)).map(|entry| {
            let found = kernel[&entry.service.key];
            format!(
                "IPVS service {} has scheduler {} and persistence {} s, svcplane wrote {} and {} s",
                entry.service.key,
                found.scheduler,
                found.persistence_seconds,
                entry.service.scheduler,
                entry.service.persistence_seconds
            )
        })
    }

    /// Whether the real servers the kernel lists for `key` differ from those written.
    pub fn destinations_differ(&self, key: &ServiceKey, kernel: &[Destination]) -> Option<String> {
        let entry = self.services.get(key)?;
        let kernel: BTreeMap<(IpAddr, u16), Destination> =
            kernel.iter().map(|destination| ((destination.address, destination.port), *destination)).collect();
        if kernel == entry.destinations {
            return None;
        }
        let missing = entry.destinations.keys().filter(|id| !kernel.contains_key(id)).count();
        let extra = kernel.keys().filter(|id| !entry.destinations.contains_key(id)).count();
        Some(format!(
            "IPVS service {key} has {} real servers ({missing} missing, {extra} not written by svcplane, or another \
             weight), svcplane wrote {}",
            kernel.len(),
            entry.destinations.len()
        ))
    }

    /// Up to `count` keys of this record after `after` (from the first when `None`),
    /// wrapping around: the drift check's sample, so successive checks cover every service.
    pub fn sample(&self, after: Option<ServiceKey>, count: usize) -> Vec<ServiceKey> {
        let from = match after {
            Some(after) => std::ops::Bound::Excluded(after),
            None => std::ops::Bound::Unbounded,
        };
        let mut keys: Vec<ServiceKey> =
            self.services.range((from, std::ops::Bound::Unbounded)).map(|(key, _)| *key).take(count).collect();
        if keys.len() < count {
            let first = keys.first().copied();
            let room = count - keys.len();
            keys.extend(self.services.keys().take_while(|key| Some(**key) != first).take(room).copied());
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use svcplane_core::{
        Change as StateChange, ClusterState, Endpoint, EndpointPort, EndpointSlice, NamespacedName, NodeConfig,
        NodePortAddresses, Protocol, Service as KubeService, ServicePort, ServiceType,
    };

    use super::*;

    const NODE: &str = "198.18.0.11";

    fn service(index: u8, node_port: bool) -> KubeService {
        let mut service = KubeService::cluster_ip(
            NamespacedName::new("default", format!("web{index}")),
            vec![IpAddr::from([198, 19, 0, index])],
            vec![ServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
                node_port: node_port.then_some(30000 + u16::from(index)),
            }],
        );
        if node_port {
            service.service_type = ServiceType::NodePort;
        }
        service
    }

    fn slice(index: u8, endpoints: &[u8]) -> EndpointSlice {
        EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", format!("web{index}-abc")),
            service: NamespacedName::new("default", format!("web{index}")),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: endpoints
                .iter()
                .map(|last| Endpoint::ready(IpAddr::from([198, 18, 128 + index, *last]), Some("node2")))
                .collect(),
        }
    }

    /// Three Services (the second a NodePort) with two endpoints each, planned for node1.
    fn lab() -> (ClusterState, NodePlan) {
        let mut state = ClusterState::new();
        for index in 1..=3 {
            state.apply(StateChange::ServiceUpserted(service(index, index == 2)));
            state.apply(StateChange::SliceUpserted(slice(index, &[2, 3])));
        }
        state.take_changes();
        let config = NodeConfig {
            node_name: "node1".into(),
            node_ips: vec![NODE.parse().unwrap()],
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            node_port_addresses: NodePortAddresses::AllLocal,
        };
        let plan = NodePlan::build(&state, config);
        (state, plan)
    }

    fn update(state: &mut ClusterState, plan: &mut NodePlan, change: StateChange) -> PlanDiff {
        state.apply(change);
        let changes = state.take_changes();
        plan.update(state, &changes)
    }

    fn node() -> Vec<IpAddr> {
        vec![NODE.parse().unwrap()]
    }

    fn key(index: u8) -> ServiceKey {
        ServiceKey::new(IpAddr::from([198, 19, 0, index]), Protocol::Tcp, 80)
    }

    fn real(index: u8, last: u8) -> Destination {
        Destination { address: IpAddr::from([198, 18, 128 + index, last]), port: 8080, weight: 1 }
    }

    #[test]
    fn one_moved_endpoint_spells_one_service_port_and_changes_one_real_server_without_the_kernel() {
        let (mut state, mut plan) = lab();
        let mut applied = Applied::of_plan(&plan, "rr", &node());
        assert_eq!(applied.services().len(), 4, "three ClusterIPs and a NodePort");
        let diff = update(&mut state, &mut plan, StateChange::SliceUpserted(slice(3, &[2, 4])));
        let step = applied.step(&plan, &diff, "rr", &node());
        assert!(!step.full);
        assert_eq!(step.service_ports, 1);
        assert_eq!(
            step.changes,
            vec![Change::DeleteDestination(key(3), real(3, 3)), Change::AddDestination(key(3), real(3, 4))]
        );
        applied.commit(step);
        assert_eq!(applied, Applied::of_plan(&plan, "rr", &node()), "the record is the whole plan's spelling");
    }

    #[test]
    fn a_deleted_node_port_service_deletes_both_its_virtual_services_and_leaves_the_others() {
        let (mut state, mut plan) = lab();
        let mut applied = Applied::of_plan(&plan, "rr", &node());
        let diff = update(&mut state, &mut plan, StateChange::ServiceDeleted(NamespacedName::new("default", "web2")));
        let step = applied.step(&plan, &diff, "rr", &node());
        assert!(!step.full);
        let node_port = ServiceKey::new(NODE.parse().unwrap(), Protocol::Tcp, 30002);
        let mut changes = step.changes.clone();
        changes.sort_by_key(|change| format!("{change:?}"));
        assert_eq!(changes, vec![Change::DeleteService(node_port), Change::DeleteService(key(2))]);
        applied.commit(step);
        assert_eq!(applied, Applied::of_plan(&plan, "rr", &node()));
        assert_eq!(applied.services().len(), 2);
    }

    #[test]
    fn a_new_service_is_added_with_its_real_servers() {
        let (mut state, mut plan) = lab();
        let mut applied = Applied::of_plan(&plan, "rr", &node());
        update(&mut state, &mut plan, StateChange::SliceUpserted(slice(4, &[2])));
        let diff = update(&mut state, &mut plan, StateChange::ServiceUpserted(service(4, false)));
        let step = applied.step(&plan, &diff, "rr", &node());
        assert!(!step.full);
        assert_eq!(step.changes.len(), 2, "{:?}", step.changes);
        assert!(matches!(&step.changes[0], Change::AddService(service) if service.key == key(4)));
        assert_eq!(step.changes[1], Change::AddDestination(key(4), real(4, 2)));
        applied.commit(step);
        assert_eq!(applied, Applied::of_plan(&plan, "rr", &node()));
    }

    #[test]
    fn new_node_addresses_spell_the_whole_plan_against_the_record() {
        let (state, plan) = lab();
        let mut applied = Applied::of_plan(&plan, "rr", &node());
        let moved: Vec<IpAddr> = vec!["198.18.0.12".parse().unwrap()];
        let step = applied.step(&plan, &PlanDiff::default(), "rr", &moved);
        assert!(step.full, "every NodePort moves, though no service port changed");
        let old = ServiceKey::new(NODE.parse().unwrap(), Protocol::Tcp, 30002);
        assert!(step.changes.contains(&Change::DeleteService(old)));
        assert_eq!(step.changes.iter().filter(|change| matches!(change, Change::AddService(_))).count(), 1);
        applied.commit(step);
        assert_eq!(applied, Applied::of_plan(&plan, "rr", &moved));
        drop(state);
    }

    #[test]
    fn an_unchanged_plan_sends_nothing() {
        let (_, plan) = lab();
        let applied = Applied::of_plan(&plan, "rr", &node());
        let step = applied.step(&plan, &PlanDiff::default(), "rr", &node());
        assert_eq!((step.full, step.service_ports, step.changes.len()), (false, 0, 0));
    }

    #[test]
    fn the_first_sync_diffs_the_whole_plan_against_the_kernels_table() {
        let (_, plan) = lab();
        let wanted = Applied::of_plan(&plan, "rr", &node());
        let mut current: Vec<ServiceEntry> = wanted.services().values().cloned().collect();
        current.retain(|entry| entry.service.key != key(1));
        let step = Applied::from_kernel(&current, wanted.clone(), plan.service_ports.len());
        assert!(step.full);
        assert_eq!(step.changes.len(), 3, "service 1 and its two real servers: {:?}", step.changes);
        assert_eq!(Applied::after(step), wanted);
    }

    #[test]
    fn a_virtual_service_deleted_or_changed_behind_our_back_is_found_and_an_intact_table_is_not() {
        let (_, plan) = lab();
        let applied = Applied::of_plan(&plan, "rr", &node());
        let mut kernel: Vec<Service> = applied.services().values().map(|entry| entry.service.clone()).collect();
        assert_eq!(applied.missing_from(&kernel), None);
        // Someone else's service beside ours is not drift.
        kernel.push(Service {
            key: ServiceKey::new("198.18.5.5".parse().unwrap(), Protocol::Udp, 53),
            scheduler: "rr".into(),
            persistence_seconds: 0,
        });
        assert_eq!(applied.missing_from(&kernel), None);
        let mut deleted = kernel.clone();
        deleted.retain(|service| service.key != key(2));
        let found = applied.missing_from(&deleted).expect("a deleted service is drift");
        assert!(found.contains("1 of the 4") && found.contains("198.19.0.2:80"), "{found}");
        let mut edited = kernel.clone();
        edited.iter_mut().find(|service| service.key == key(1)).unwrap().scheduler = "lc".into();
        let found = applied.missing_from(&edited).expect("another scheduler is drift");
        assert!(found.contains("scheduler lc"), "{found}");
    }

    #[test]
    fn real_servers_deleted_or_reweighted_behind_our_back_differ_from_the_record() {
        let (_, plan) = lab();
        let applied = Applied::of_plan(&plan, "rr", &node());
        assert_eq!(applied.destinations_differ(&key(1), &[real(1, 2), real(1, 3)]), None);
        assert!(applied.destinations_differ(&key(1), &[real(1, 2)]).unwrap().contains("1 missing"));
        let drained = Destination { weight: 0, ..real(1, 3) };
        assert!(applied.destinations_differ(&key(1), &[real(1, 2), drained]).is_some());
    }

    #[test]
    fn successive_drift_samples_cover_every_virtual_service_in_turn() {
        let (_, plan) = lab();
        let applied = Applied::of_plan(&plan, "rr", &node());
        let mut cursor = None;
        let mut seen = Vec::new();
        for _ in 0..2 {
            let sample = applied.sample(cursor, 3);
            assert_eq!(sample.len(), 3);
            cursor = sample.last().copied();
            seen.extend(sample);
        }
        let all: Vec<ServiceKey> = applied.services().keys().copied().collect();
        assert_eq!(&seen[..4], &all[..], "the first four are every service once");
        assert_eq!(seen[4..], all[..2], "then it wraps around");
        assert_eq!(applied.sample(None, 10).len(), 4, "never more than there are");
    }
}
