//! Large plans spread over several tables per family (the kernel re-validates a whole table
//! on each commit that adds a DNAT rule, so a change must land in a small one): against the
//! in-memory fake, which tables exist, where a change goes, growth, restarts and cleanup,
//! and packets traced through every table.

use std::collections::BTreeSet;

use svcplane_backend_nftables::NftablesBackend;
use svcplane_backend_nftables::render::{table_index, tables_table_name};
use svcplane_core::{
    Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig, NodePlan,
    NodePortAddresses, PlanKey, Protocol, Service, ServicePort, ServicePortName,
};
use svcplane_nft::trace::{Disposition, Host, Origin, Packet, trace};
use svcplane_nft::{Element, FakeNftables, Family, NftError, Nftables, Set, TableName, Transaction};

fn config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        node_ips: vec!["198.18.0.11".parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        node_port_addresses: NodePortAddresses::AllLocal,
    }
}

fn name(index: u32) -> String {
    format!("svc-{index}")
}

fn cluster_ip(index: u32) -> String {
    format!("198.19.{}.{}", index / 250, index % 250 + 1)
}

fn endpoint(index: u32, generation: u32) -> String {
    format!("198.18.{}.{}", 129 + index / 250 + generation * 20, index % 250 + 1)
}

/// Service `index`: a ClusterIP with one ready endpoint on this node.
fn service_with_endpoint(index: u32, generation: u32) -> Vec<Change> {
    let service = Service::cluster_ip(
        NamespacedName::new("default", name(index)),
        vec![cluster_ip(index).parse().unwrap()],
        vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
    );
    let slice = EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new("default", format!("{}-slice", name(index))),
        service: NamespacedName::new("default", name(index)),
        family: IpFamily::V4,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
        endpoints: vec![Endpoint::ready(endpoint(index, generation).parse().unwrap(), Some("node1"))],
    };
    vec![Change::ServiceUpserted(service), Change::SliceUpserted(slice)]
}

fn services(range: std::ops::Range<u32>) -> Vec<Change> {
    range.flat_map(|index| service_with_endpoint(index, 0)).collect()
}

fn port_name(index: u32) -> ServicePortName {
    ServicePortName {
        service: NamespacedName::new("default", name(index)),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    }
}

/// A fake kernel that remembers which table each transaction went to.
#[derive(Debug, Default)]
struct Recording {
    inner: FakeNftables,
    tables_written: Vec<TableName>,
}

impl Nftables for Recording {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        self.tables_written.push(transaction.table.clone());
        self.inner.apply(transaction)
    }

    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError> {
        self.inner.delete_table(table)
    }

    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        self.inner.count_rules(table, chain)
    }

    fn list_tables(&mut self, family: Family) -> Result<Vec<String>, NftError> {
        self.inner.list_tables(family)
    }

    fn holds_element(&mut self, table: &TableName, set: &Set, element: &Element) -> Result<Option<bool>, NftError> {
        self.inner.holds_element(table, set, element)
    }
}

struct Harness {
    state: ClusterState,
    plan: NodePlan,
    backend: NftablesBackend<Recording>,
}

impl Harness {
    fn new(backend: NftablesBackend<Recording>) -> Self {
        Self { state: ClusterState::new(), plan: NodePlan::new(config()), backend }
    }

    fn apply(&mut self, changes: Vec<Change>) -> svcplane_backend_nftables::SyncReport {
        for change in changes {
            self.state.apply(change);
        }
        let changes = self.state.take_changes();
        let changed = self.plan.update(&self.state, &changes);
        self.backend.nftables_mut().tables_written.clear();
        self.backend.sync(&self.plan, &changed).expect("the sync applies")
    }

    fn tables(&mut self, family: Family) -> Vec<String> {
        let mut names = self.backend.nftables_mut().list_tables(family).unwrap();
        names.sort();
        names
    }

    fn fake(&self) -> &FakeNftables {
        &self.backend.nftables().inner
    }
}

/// What a fresh process's full sync of the same state writes.
fn fresh_full_sync_dump(state: &ClusterState) -> String {
    let plan = NodePlan::build(state, config());
    let mut backend = NftablesBackend::new(FakeNftables::new());
    backend.sync(&plan, &Default::default()).expect("full sync applies");
    backend.nftables().dump()
}

fn reaches(nft: &FakeNftables, index: u32) -> BTreeSet<(Disposition, String)> {
    let packet = Packet {
        source: "198.18.200.7".parse().unwrap(),
        destination: cluster_ip(index).parse().unwrap(),
        protocol: 6,
        source_port: 40000,
        destination_port: 80,
        mark: 0,
    };
    let host = Host { local_addresses: vec!["198.18.0.11".parse().unwrap()] };
    trace(nft, Family::Ip, &host, Origin::Network, packet)
        .expect("the tracer understands every rule")
        .into_iter()
        .map(|outcome| (outcome.disposition, outcome.destination.to_string()))
        .collect()
}

fn forwarded_to(address: String) -> BTreeSet<(Disposition, String)> {
    [(Disposition::Forwarded, address)].into()
}

#[test]
fn a_plan_of_2500_service_ports_is_spread_over_four_tables_per_family_and_every_service_is_reached() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    let report = h.apply(services(0..2500));
    assert!(report.full);
    assert_eq!(h.backend.tables(), 4);
    assert_eq!(h.tables(Family::Ip), ["svcplane", "svcplane-1", "svcplane-2", "svcplane-3"]);
    assert_eq!(h.tables(Family::Ip6), ["svcplane", "svcplane-1", "svcplane-2", "svcplane-3"]);
    let mut per_table = [0usize; 4];
    for index in 0..2500 {
        per_table[table_index(&port_name(index), 4)] += 1;
    }
    assert!(per_table.iter().all(|&count| (450..800).contains(&count)), "uneven: {per_table:?}");
    for index in [0, 1, 2, 3, 1234, 2499] {
        assert_eq!(reaches(h.fake(), index), forwarded_to(endpoint(index, 0)), "service {index}");
    }
}

#[test]
fn a_change_to_one_service_is_one_transaction_to_the_one_table_it_lives_in() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..2500));
    for index in [7, 1500, 2222] {
        let report = h.apply(service_with_endpoint(index, 1));
        assert!(!report.full);
        let expected = tables_table_name(IpFamily::V4, table_index(&port_name(index), 4));
        assert_eq!(h.backend.nftables().tables_written, [expected], "service {index}");
        assert_eq!(reaches(h.fake(), index), forwarded_to(endpoint(index, 1)));
    }
    assert_eq!(h.fake().dump(), fresh_full_sync_dump(&h.state), "partial syncs left what a full sync writes");
}

#[test]
fn growing_past_its_tables_brings_one_full_sync_over_twice_as_many_that_leaves_nothing_stale() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..900));
    assert_eq!(h.backend.tables(), 1);
    let report = h.apply(services(900..1100));
    assert!(report.full, "1100 ports outgrow one table");
    assert_eq!(h.backend.tables(), 2);
    assert_eq!(h.fake().dump(), fresh_full_sync_dump(&h.state));
    // Services that moved to the new table are not dispatched from the old one any more.
    let moved = (0..900).find(|&index| table_index(&port_name(index), 2) == 1).expect("some service moved");
    assert_eq!(reaches(h.fake(), moved), forwarded_to(endpoint(moved, 0)));
    let first = h.fake().table(&tables_table_name(IpFamily::V4, 0)).unwrap();
    let key = PlanKey { family: IpFamily::V4, name: port_name(moved) };
    let element = first.element(
        "service-ips",
        &[
            svcplane_nft::Value::Address(cluster_ip(moved).parse().unwrap()),
            svcplane_nft::Value::Protocol(6),
            svcplane_nft::Value::Port(80),
        ],
    );
    assert!(element.is_none(), "{key:?} is still dispatched from the first table");
}

#[test]
fn a_smaller_cluster_keeps_its_tables_while_running_but_a_restart_removes_those_it_no_longer_needs() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..2500));
    let removals: Vec<Change> = (100..2500)
        .flat_map(|index| {
            [
                Change::SliceDeleted(NamespacedName::new("default", format!("{}-slice", name(index)))),
                Change::ServiceDeleted(NamespacedName::new("default", name(index))),
            ]
        })
        .collect();
    h.apply(removals);
    assert_eq!(h.backend.tables(), 4, "no shrinking while running");
    for index in [0, 50, 99] {
        assert_eq!(reaches(h.fake(), index), forwarded_to(endpoint(index, 0)));
    }

    let kernel = std::mem::take(h.backend.nftables_mut());
    let state = std::mem::take(&mut h.state);
    let mut restarted = Harness::new(NftablesBackend::new(kernel));
    restarted.state = state;
    restarted.plan = NodePlan::build(&restarted.state, config());
    let plan = restarted.plan.clone();
    let report = restarted.backend.sync(&plan, &Default::default()).unwrap();
    assert!(report.full);
    assert_eq!(restarted.backend.tables(), 1);
    assert_eq!(restarted.tables(Family::Ip), ["svcplane"]);
    assert_eq!(restarted.tables(Family::Ip6), ["svcplane"]);
    for index in [0, 50, 99] {
        assert_eq!(reaches(restarted.fake(), index), forwarded_to(endpoint(index, 0)));
    }
}

/// A new process's backend on the kernel `h` leaves, with `h`'s state changed by `changes`
/// while no proxy ran; its first (full) sync done.
fn restart_after(h: &mut Harness, changes: Vec<Change>) -> (Harness, svcplane_backend_nftables::SyncReport) {
    let kernel = Recording { inner: std::mem::take(&mut h.backend.nftables_mut().inner), tables_written: Vec::new() };
    let mut restarted = Harness::new(NftablesBackend::new(kernel));
    restarted.state = std::mem::take(&mut h.state);
    for change in changes {
        restarted.state.apply(change);
    }
    restarted.state.take_changes();
    restarted.plan = NodePlan::build(&restarted.state, config());
    let plan = restarted.plan.clone();
    let report = restarted.backend.sync(&plan, &Default::default()).expect("the restart's full sync applies");
    (restarted, report)
}

#[test]
fn a_restart_with_the_plan_the_tables_already_hold_writes_nothing_even_after_partial_syncs() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..2500));
    for index in [7, 1500, 2222] {
        h.apply(service_with_endpoint(index, 1));
    }
    let before = h.fake().dump();
    let (mut restarted, report) = restart_after(&mut h, Vec::new());
    assert!(report.full);
    assert_eq!(report.operations, 0, "nothing written");
    assert!(
        restarted.backend.nftables().tables_written.is_empty(),
        "{:?}",
        restarted.backend.nftables().tables_written
    );
    assert_eq!(restarted.fake().dump(), before);
    // The new process then follows changes as if it had written the tables itself.
    let report = restarted.apply(service_with_endpoint(1500, 2));
    assert!(!report.full);
    assert_eq!(reaches(restarted.fake(), 1500), forwarded_to(endpoint(1500, 2)));
    assert_eq!(restarted.fake().dump(), fresh_full_sync_dump(&restarted.state));
}

#[test]
fn a_restart_rewrites_only_the_table_of_a_service_that_changed_while_no_proxy_ran() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..2500));
    let (restarted, report) = restart_after(&mut h, service_with_endpoint(1500, 1));
    assert!(report.full);
    let expected = tables_table_name(IpFamily::V4, table_index(&port_name(1500), 4));
    assert_eq!(restarted.backend.nftables().tables_written, [expected]);
    assert_eq!(reaches(restarted.fake(), 1500), forwarded_to(endpoint(1500, 1)));
    assert_eq!(restarted.fake().dump(), fresh_full_sync_dump(&restarted.state));
}

#[test]
fn a_restart_rewrites_a_table_whose_chains_were_flushed_though_its_digest_survived() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..2500));
    let flushed = tables_table_name(IpFamily::V4, table_index(&port_name(7), 4));
    let flush = Transaction {
        table: flushed.clone(),
        operations: ["services", "nat-prerouting"]
            .map(|chain| svcplane_nft::Operation::FlushChain(chain.to_owned()))
            .to_vec(),
    };
    h.backend.nftables_mut().inner.apply(&flush).unwrap();
    let (restarted, _) = restart_after(&mut h, Vec::new());
    assert_eq!(restarted.backend.nftables().tables_written, [flushed]);
    assert_eq!(reaches(restarted.fake(), 7), forwarded_to(endpoint(7, 0)));
}

#[test]
fn cleanup_removes_every_table_of_every_family() {
    let mut h = Harness::new(NftablesBackend::new(Recording::default()));
    h.apply(services(0..2500));
    // A table numbered beyond this process's count, as an earlier run with more Services left.
    let stray = Transaction { table: tables_table_name(IpFamily::V4, 9), operations: vec![] };
    h.backend
        .nftables_mut()
        .inner
        .apply(&Transaction { operations: vec![svcplane_nft::Operation::AddTable { comment: None }], ..stray })
        .unwrap();
    assert!(h.backend.cleanup().unwrap());
    assert!(h.tables(Family::Ip).is_empty(), "{:?}", h.tables(Family::Ip));
    assert!(h.tables(Family::Ip6).is_empty());
}

#[test]
fn a_fixed_number_of_tables_spreads_even_a_small_plan_and_each_table_is_drift_checked() {
    let mut h = Harness::new(
        NftablesBackend::new(Recording::default()).with_tables(4).with_drift_check_interval(std::time::Duration::ZERO),
    );
    h.apply(services(0..40));
    assert_eq!(h.tables(Family::Ip), ["svcplane", "svcplane-1", "svcplane-2", "svcplane-3"]);
    for index in 0..40 {
        assert_eq!(reaches(h.fake(), index), forwarded_to(endpoint(index, 0)), "service {index}");
    }
    assert_eq!(h.backend.find_drift(), None);
    h.backend.nftables_mut().inner.delete_table(&tables_table_name(IpFamily::V4, 2)).unwrap();
    let drift = h.backend.find_drift().expect("a deleted table is found");
    assert!(drift.contains("svcplane-2"), "{drift}");
}
