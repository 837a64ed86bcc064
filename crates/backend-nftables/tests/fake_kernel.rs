//! The nftables backend against the in-memory fake kernel: full and partial syncs must
//! always leave the same ruleset a fresh full sync of the final plan would.

use std::net::IpAddr;

use svcplane_backend_nftables::{NftablesBackend, table_name};
use svcplane_core::{
    Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig, NodePlan,
    NodePortAddresses, Protocol, Service, ServicePort, ServiceType, TrafficPolicy,
};
use svcplane_nft::{FakeNftables, NftError, Nftables, TableName, Transaction, Value};

fn config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        node_ips: vec!["198.18.0.11".parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        node_port_addresses: NodePortAddresses::AllLocal,
    }
}

fn service(name: &str, ip: &str, service_type: ServiceType) -> Service {
    let mut s = Service::cluster_ip(
        NamespacedName::new("default", name),
        vec![ip.parse().unwrap()],
        vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(30080) }],
    );
    s.service_type = service_type;
    s
}

fn slice(service: &str, endpoints: &[(&str, &str)]) -> EndpointSlice {
    EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new("default", format!("{service}-slice")),
        service: NamespacedName::new("default", service),
        family: IpFamily::V4,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
        endpoints: endpoints.iter().map(|(ip, node)| Endpoint::ready(ip.parse().unwrap(), Some(node))).collect(),
    }
}

fn with_affinity(mut service: Service, seconds: u64) -> Service {
    service.session_affinity =
        Some(svcplane_core::ClientIpAffinity { timeout: std::time::Duration::from_secs(seconds) });
    service
}

/// Drives state, plan and backend together the way the proxy loop does.
struct Harness<N> {
    state: ClusterState,
    plan: NodePlan,
    backend: NftablesBackend<N>,
}

impl<N: Nftables> Harness<N> {
    fn new(nft: N) -> Self {
        Self { state: ClusterState::new(), plan: NodePlan::new(config()), backend: NftablesBackend::new(nft) }
    }

    fn apply(&mut self, changes: Vec<Change>) -> Result<svcplane_backend_nftables::SyncReport, String> {
        for change in changes {
            self.state.apply(change);
        }
        let changes = self.state.take_changes();
        let changed = self.plan.update(&self.state, &changes);
        self.backend.sync(&self.plan, &changed).map_err(|e| e.to_string())
    }
}

fn full_sync_dump(state: &ClusterState) -> String {
    let plan = NodePlan::build(state, config());
    let mut backend = NftablesBackend::new(FakeNftables::new());
    backend.sync(&plan, &Default::default()).expect("full sync applies");
    backend.nftables().dump()
}

fn v4() -> TableName {
    table_name(IpFamily::V4)
}

#[test]
fn a_full_sync_writes_both_family_tables_into_the_fake() {
    let mut h = Harness::new(FakeNftables::new());
    let report = h
        .apply(vec![
            Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort)),
            Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")])),
        ])
        .unwrap();
    assert!(report.full);
    let fake = h.backend.nftables();
    assert!(fake.table(&v4()).is_some());
    assert!(fake.table(&table_name(IpFamily::V6)).is_some());
    let table = fake.table(&v4()).unwrap();
    let dispatch = table
        .element("service-ips", &[Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)])
        .expect("the ClusterIP is dispatched");
    assert!(format!("{dispatch:?}").contains("internal-"), "ClusterIP goes through its route chain: {dispatch:?}");
    assert_eq!(
        table.rules("service-ULMVA6XW-default/web/tcp/http").map(<[_]>::len),
        None,
        "name includes the hash of the real base"
    );
    let chain = table.chains().into_iter().find(|c| c.name.starts_with("service-")).expect("endpoint chain");
    assert_eq!(table.rules(&chain.name).unwrap().len(), 2, "one cascade rule per endpoint");
    assert!(table.element("service-nodeports", &[Value::Protocol(6), Value::Port(30080)]).is_some());
}

#[test]
fn a_service_without_endpoints_is_rejected_and_not_dispatched() {
    let mut h = Harness::new(FakeNftables::new());
    h.apply(vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp))]).unwrap();
    let table = h.backend.nftables().table(&v4()).unwrap();
    let key = [Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)];
    assert!(table.element("service-ips", &key).is_none());
    let reject = table.element("no-endpoint-services", &key).expect("reject element");
    assert!(
        format!("{reject:?}").contains("reject-with-reset"),
        "a TCP port is refused with a reset, as the plan says"
    );
}

#[test]
fn partial_syncs_leave_the_same_ruleset_as_a_full_sync_of_the_final_plan() {
    let mut h = Harness::new(FakeNftables::new());
    let steps: Vec<Vec<Change>> = vec![
        vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort))],
        vec![Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")]))],
        vec![Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")]))],
        vec![Change::ServiceUpserted(service("db", "198.19.0.11", ServiceType::ClusterIp))],
        vec![Change::SliceUpserted(slice("db", &[("198.18.129.1", "node1")]))],
        vec![Change::ServiceUpserted({
            let mut s = service("web", "198.19.0.10", ServiceType::NodePort);
            s.external_traffic_policy = TrafficPolicy::Local;
            s
        })],
        vec![Change::SliceUpserted(slice("web", &[("198.18.130.1", "node2")]))],
        vec![Change::ServiceUpserted(with_affinity(service("db", "198.19.0.11", ServiceType::ClusterIp), 60))],
        vec![Change::SliceUpserted(slice("db", &[("198.18.129.1", "node1"), ("198.18.129.2", "node1")]))],
        vec![Change::ServiceUpserted(with_affinity(service("db", "198.19.0.11", ServiceType::ClusterIp), 30))],
        vec![Change::SliceUpserted(slice("db", &[("198.18.129.2", "node1")]))],
        vec![Change::SliceDeleted(NamespacedName::new("default", "db-slice"))],
        vec![Change::ServiceDeleted(NamespacedName::new("default", "web"))],
    ];
    for (index, step) in steps.into_iter().enumerate() {
        let report = h.apply(step).unwrap();
        assert_eq!(report.full, index == 0, "only the first sync is full (step {index})");
        assert_eq!(h.backend.nftables().dump(), full_sync_dump(&h.state), "after step {index}");
    }
}

#[test]
fn client_ip_affinity_gives_each_endpoint_a_set_of_recent_clients() {
    let mut h = Harness::new(FakeNftables::new());
    h.apply(vec![
        Change::ServiceUpserted(with_affinity(service("web", "198.19.0.10", ServiceType::ClusterIp), 600)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.129.2", "node1")])),
    ])
    .unwrap();
    let table = h.backend.nftables().table(&v4()).unwrap();
    let affinity: Vec<_> = table.sets().into_iter().filter(|s| s.name.starts_with("affinity-")).collect();
    assert_eq!(affinity.len(), 2);
    assert!(affinity.iter().all(|s| s.dynamic_timeout == Some(std::time::Duration::from_secs(600))));
    assert!(affinity[0].name.ends_with("__198.18.129.1/8080"), "{}", affinity[0].name);
    let chain = table.chains().into_iter().find(|c| c.name.starts_with("service-")).unwrap();
    // Two "known client" rules, then the two-step cascade.
    assert_eq!(table.rules(&chain.name).unwrap().len(), 4);
}

#[test]
fn one_endpoint_change_rewrites_only_that_service() {
    let mut h = Harness::new(FakeNftables::new());
    let mut initial = Vec::new();
    for i in 0..50 {
        let name = format!("svc{i}");
        initial.push(Change::ServiceUpserted(service(&name, &format!("198.19.1.{i}"), ServiceType::ClusterIp)));
        initial.push(Change::SliceUpserted(slice(&name, &[("198.18.129.1", "node1"), ("198.18.129.2", "node1")])));
    }
    h.apply(initial).unwrap();
    let report = h
        .apply(vec![Change::SliceUpserted(slice("svc7", &[("198.18.129.1", "node1"), ("198.18.129.3", "node1")]))])
        .unwrap();
    assert!(!report.full);
    assert_eq!(report.service_ports, 1);
    // Flush and two cascade rules, a hairpin element for the new endpoint (the old one is
    // still used by the other services), and the table's digest replaced (flush, add).
    assert_eq!(report.operations, 6);
}

#[test]
fn a_hairpin_element_stays_while_any_service_still_uses_the_endpoint() {
    let mut h = Harness::new(FakeNftables::new());
    h.apply(vec![
        Change::ServiceUpserted(service("a", "198.19.0.10", ServiceType::ClusterIp)),
        Change::ServiceUpserted(service("b", "198.19.0.11", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("a", &[("198.18.129.1", "node1")])),
        Change::SliceUpserted(slice("b", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    let hairpin = |h: &Harness<FakeNftables>| {
        let ip: IpAddr = "198.18.129.1".parse().unwrap();
        h.backend
            .nftables()
            .table(&v4())
            .unwrap()
            .element("hairpin-endpoints", &[Value::Address(ip), Value::Address(ip)])
            .is_some()
    };
    h.apply(vec![Change::SliceDeleted(NamespacedName::new("default", "a-slice"))]).unwrap();
    assert!(hairpin(&h), "service b still sends to the endpoint");
    h.apply(vec![Change::SliceDeleted(NamespacedName::new("default", "b-slice"))]).unwrap();
    assert!(!hairpin(&h));
}

/// A kernel that refuses the next transactions with the errors it is given, one each.
struct Flaky {
    inner: FakeNftables,
    failures: std::collections::VecDeque<NftError>,
    /// For each transaction offered, refused or not: whether it deleted the table.
    replaced_table: Vec<bool>,
}

impl Flaky {
    fn new() -> Self {
        Self { inner: FakeNftables::new(), failures: Default::default(), replaced_table: Vec::new() }
    }
}

impl Nftables for Flaky {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        self.replaced_table.push(transaction.operations.contains(&svcplane_nft::Operation::DeleteTable));
        if let Some(error) = self.failures.pop_front() {
            return Err(error);
        }
        self.inner.apply(transaction)
    }

    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError> {
        self.inner.delete_table(table)
    }

    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        self.inner.count_rules(table, chain)
    }

    fn list_tables(&mut self, family: svcplane_nft::Family) -> Result<Vec<String>, NftError> {
        self.inner.list_tables(family)
    }
}

#[test]
fn a_failed_transaction_leaves_the_previous_ruleset_and_the_next_sync_is_full() {
    let mut h = Harness::new(Flaky::new());
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    let before = h.backend.nftables().inner.dump();
    h.fail_next_with(NftError::Apply { table: v4(), message: "injected failure".into() });
    let error = h.apply(vec![Change::SliceUpserted(slice("web", &[("198.18.129.2", "node1")]))]).unwrap_err();
    assert!(error.contains("injected failure"), "{error}");
    assert_eq!(h.backend.nftables().inner.dump(), before, "nothing was half-applied");
    let report = h.apply(vec![]).unwrap();
    assert!(report.full, "the retry rewrites everything");
    assert_eq!(h.backend.nftables().inner.dump(), full_sync_dump(&h.state));
}

fn missing_chain() -> NftError {
    NftError::NotFound { kind: svcplane_nft::ObjectKind::Chain, name: "svcplane-fault-injected".into() }
}

/// A harness whose last sync was refused, so that its next sync is a full one.
fn refused_once(first: NftError) -> Harness<Flaky> {
    let mut h = Harness::new(Flaky::new());
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    h.fail_next_with(first);
    h.apply(vec![Change::SliceUpserted(slice("web", &[("198.18.129.2", "node1")]))]).unwrap_err();
    h
}

impl Harness<Flaky> {
    fn fail_next_with(&mut self, error: NftError) {
        self.backend.nftables_mut().failures.push_back(error);
    }

    /// Runs the next sync (a retry: no new changes) and says whether it replaced the table.
    fn retry_replaced_table(&mut self) -> Result<bool, String> {
        let offered = self.backend.nftables().replaced_table.len();
        let result = self.apply(Vec::new());
        let replaced = self.backend.nftables().replaced_table[offered..].iter().any(|r| *r);
        result.map(|report| {
            assert!(report.full, "a retry after a refused sync is a full one");
            assert_eq!(report.rules_replaced, replaced, "the report says whether the table was replaced");
            replaced
        })
    }
}

#[test]
fn a_full_sync_refused_for_a_missing_object_is_retried_in_place_keeping_the_nat_hooks() {
    let mut h = refused_once(missing_chain());
    h.fail_next_with(missing_chain());
    assert!(h.retry_replaced_table().is_err(), "the injected refusal of the full sync");
    assert_eq!(h.retry_replaced_table(), Ok(false), "the table, and its base chains' hooks, stay");
    assert_eq!(h.backend.nftables().inner.dump(), full_sync_dump(&h.state));
}

#[test]
fn a_full_sync_refused_over_a_definition_the_table_holds_replaces_the_table_on_retry() {
    let mut h = refused_once(missing_chain());
    h.fail_next_with(NftError::Exists { kind: svcplane_nft::ObjectKind::Set, name: "service-ips".into() });
    assert!(h.retry_replaced_table().is_err());
    assert_eq!(h.retry_replaced_table(), Ok(true));
    assert_eq!(h.backend.nftables().inner.dump(), full_sync_dump(&h.state));
}

#[test]
fn a_second_refused_full_sync_in_a_row_replaces_the_table_whatever_the_reason() {
    let mut h = refused_once(missing_chain());
    h.fail_next_with(missing_chain());
    h.fail_next_with(missing_chain());
    assert!(h.retry_replaced_table().is_err());
    assert!(h.retry_replaced_table().is_err());
    assert_eq!(h.retry_replaced_table(), Ok(true));
    assert_eq!(h.backend.nftables().inner.dump(), full_sync_dump(&h.state));
}

mod traced_packets {
    use std::collections::BTreeSet;

    use svcplane_nft::Family;
    use svcplane_nft::trace::{Disposition, Host, Origin, Outcome, Packet, trace};

    use super::*;

    const NODE: &str = "198.18.0.11";

    fn programmed(changes: Vec<Change>) -> FakeNftables {
        let mut h = Harness::new(FakeNftables::new());
        h.apply(changes).unwrap();
        h.backend.nftables().clone()
    }

    fn tcp(source: &str, destination: &str, port: u16) -> Packet {
        Packet {
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
            protocol: 6,
            source_port: 40000,
            destination_port: port,
            mark: 0,
        }
    }

    fn host() -> Host {
        Host { local_addresses: vec![NODE.parse().unwrap()] }
    }

    fn outcomes(nft: &FakeNftables, origin: Origin, packet: Packet) -> BTreeSet<Outcome> {
        trace(nft, Family::Ip, &host(), origin, packet).expect("the tracer understands every rule")
    }

    fn forwarded_to(endpoints: &[&str], masqueraded: bool) -> BTreeSet<Outcome> {
        endpoints
            .iter()
            .map(|e| Outcome {
                disposition: Disposition::Forwarded,
                destination: e.parse().unwrap(),
                destination_port: 8080,
                masqueraded,
            })
            .collect()
    }

    fn web_with_two_endpoints() -> FakeNftables {
        programmed(vec![
            Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort)),
            Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")])),
        ])
    }

    #[test]
    fn a_pod_reaching_a_cluster_ip_may_land_on_any_endpoint_unmasqueraded() {
        let nft = web_with_two_endpoints();
        let got = outcomes(&nft, Origin::Network, tcp("198.18.129.2", "198.19.0.10", 80));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], false));
    }

    #[test]
    fn an_off_cluster_client_reaching_a_cluster_ip_is_masqueraded() {
        let nft = web_with_two_endpoints();
        let got = outcomes(&nft, Origin::Network, tcp("198.18.0.101", "198.19.0.10", 80));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], true));
    }

    #[test]
    fn an_external_client_reaching_a_node_port_is_masqueraded() {
        let nft = web_with_two_endpoints();
        let got = outcomes(&nft, Origin::Network, tcp("198.18.0.101", NODE, 30080));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], true));
    }

    #[test]
    fn a_node_port_is_not_reachable_on_loopback() {
        let nft = web_with_two_endpoints();
        let got = outcomes(&nft, Origin::LocalProcess, tcp("127.0.0.1", "127.0.0.1", 30080));
        assert_eq!(got.len(), 1);
        let only = got.into_iter().next().unwrap();
        assert_eq!((only.disposition, only.destination_port), (Disposition::DeliveredLocally, 30080));
    }

    #[test]
    fn a_pod_reaching_itself_through_its_service_is_masqueraded() {
        let nft = web_with_two_endpoints();
        let got = outcomes(&nft, Origin::Network, tcp("198.18.129.1", "198.19.0.10", 80));
        let hairpin = got.iter().find(|o| o.destination.to_string() == "198.18.129.1").unwrap();
        assert!(hairpin.masqueraded);
        let other = got.iter().find(|o| o.destination.to_string() == "198.18.130.1").unwrap();
        assert!(!other.masqueraded);
    }

    #[test]
    fn a_cluster_ip_without_endpoints_is_rejected() {
        let nft = programmed(vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort))]);
        for (origin, packet) in [
            (Origin::Network, tcp("198.18.129.2", "198.19.0.10", 80)),
            (Origin::LocalProcess, tcp(NODE, "198.19.0.10", 80)),
            (Origin::Network, tcp("198.18.0.101", NODE, 30080)),
        ] {
            let got = outcomes(&nft, origin, packet);
            assert!(
                got.iter().all(|o| o.disposition == Disposition::Rejected) && !got.is_empty(),
                "{packet:?}: {got:?}"
            );
        }
    }

    #[test]
    fn external_local_policy_drops_external_traffic_on_a_node_without_local_endpoints() {
        let mut svc = service("web", "198.19.0.10", ServiceType::NodePort);
        svc.external_traffic_policy = TrafficPolicy::Local;
        let nft = programmed(vec![
            Change::ServiceUpserted(svc),
            Change::SliceUpserted(slice("web", &[("198.18.130.1", "node2")])),
        ]);
        let external = outcomes(&nft, Origin::Network, tcp("198.18.0.101", NODE, 30080));
        assert!(external.iter().all(|o| o.disposition == Disposition::Dropped), "{external:?}");
        // A pod still short-circuits to every endpoint.
        let from_pod = outcomes(&nft, Origin::Network, tcp("198.18.129.5", NODE, 30080));
        assert_eq!(from_pod, forwarded_to(&["198.18.130.1"], false));
    }

    #[test]
    fn external_local_policy_preserves_the_client_address_on_local_endpoints() {
        let mut svc = service("web", "198.19.0.10", ServiceType::NodePort);
        svc.external_traffic_policy = TrafficPolicy::Local;
        let nft = programmed(vec![
            Change::ServiceUpserted(svc),
            Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")])),
        ]);
        let got = outcomes(&nft, Origin::Network, tcp("198.18.0.101", NODE, 30080));
        assert_eq!(got, forwarded_to(&["198.18.129.1"], false));
    }
}

#[test]
fn a_table_deleted_behind_our_back_is_found_and_the_next_sync_rewrites_it() {
    let mut h = Harness::new(FakeNftables::new());
    h.backend = NftablesBackend::new(FakeNftables::new()).with_drift_check_interval(std::time::Duration::ZERO);
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    assert_eq!(h.backend.find_drift(), None, "an intact table is no drift");

    h.backend.nftables_mut().delete_table(&v4()).unwrap();
    let found = h.backend.find_drift().expect("the deleted table is noticed");
    assert!(found.contains("table ip svcplane"), "{found}");
    let report = h.apply(Vec::new()).unwrap();
    assert!(report.full, "the repair is a full sync");
    let table = h.backend.nftables().table(&v4()).expect("the table is back");
    let key = [Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)];
    assert!(table.element("service-ips", &key).is_some());
    assert_eq!(h.backend.find_drift(), None);
}

#[test]
fn drift_is_not_looked_for_more_often_than_the_check_interval() {
    let mut h = Harness::new(FakeNftables::new());
    h.apply(vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp))]).unwrap();
    assert_eq!(h.backend.find_drift(), None);
    h.backend.nftables_mut().delete_table(&v4()).unwrap();
    assert_eq!(h.backend.find_drift(), None, "the default interval (1 s) has not passed");
}

#[test]
fn a_full_sync_keeps_the_table_and_replaces_its_contents_in_place() {
    let mut h = Harness::new(FakeNftables::new());
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
        Change::ServiceUpserted(service("gone", "198.19.0.11", ServiceType::ClusterIp)),
    ])
    .unwrap();
    // A new process: its first sync is a full one over the table the last one left.
    h.backend = NftablesBackend::new(std::mem::take(h.backend.nftables_mut()));
    h.apply(vec![Change::ServiceDeleted(NamespacedName::new("default", "gone"))]).unwrap();
    let transactions = svcplane_backend_nftables::render_full(&h.plan, &[IpFamily::V4]);
    assert!(
        !transactions[0].operations.contains(&svcplane_nft::Operation::DeleteTable),
        "the table (and its base chains' hooks) is never deleted by a full sync"
    );
    let table = h.backend.nftables().table(&v4()).unwrap();
    let web = [Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)];
    let gone = [Value::Address("198.19.0.11".parse().unwrap()), Value::Protocol(6), Value::Port(80)];
    assert!(table.element("service-ips", &web).is_some());
    assert!(table.element("no-endpoint-services", &gone).is_none(), "the flushed maps no longer know the gone Service");
}
