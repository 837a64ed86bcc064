//! The iptables backend against the in-memory fake: the rules read like kube-proxy's, full
//! and partial syncs always leave what a fresh full sync of the final plan would, packets
//! traced through the fake end where the plan says, and other software's rules survive.

use std::time::Duration;

use svcplane_backend_iptables::{IptablesBackend, SyncReport, render_dump};
use svcplane_core::{
    Change, ClientIpAffinity, ClusterState, Endpoint, EndpointPort, EndpointSlice, IpFamily, LoadBalancerIngress,
    NamespacedName, NodeConfig, NodePlan, NodePortAddresses, Protocol, Service, ServicePort, ServiceType,
    TrafficPolicy,
};
use svcplane_iptables::trace::{Disposition, Host, Origin, Outcome, Packet, trace};
use svcplane_iptables::{Command, FakeIptables, Family, Iptables, IptablesError, RestoreTable, Table};

const NODE: &str = "198.18.0.11";

fn config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        node_ips: vec![NODE.parse().unwrap(), "2001:db8::11".parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()],
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
    let family = if endpoints.first().is_some_and(|(ip, _)| ip.contains(':')) { IpFamily::V6 } else { IpFamily::V4 };
    EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new("default", format!("{service}-slice-{family:?}")),
        service: NamespacedName::new("default", service),
        family,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
        endpoints: endpoints.iter().map(|(ip, node)| Endpoint::ready(ip.parse().unwrap(), Some(node))).collect(),
    }
}

fn with_affinity(mut service: Service, seconds: u64) -> Service {
    service.session_affinity = Some(ClientIpAffinity { timeout: Duration::from_secs(seconds) });
    service
}

/// Drives state, plan and backend together the way the proxy loop does.
struct Harness<I> {
    state: ClusterState,
    plan: NodePlan,
    backend: IptablesBackend<I>,
}

impl<I: Iptables> Harness<I> {
    fn new(iptables: I) -> Self {
        Self {
            state: ClusterState::new(),
            plan: NodePlan::new(config()),
            backend: IptablesBackend::new(iptables).with_check_interval(Duration::ZERO),
        }
    }

    fn apply(&mut self, changes: Vec<Change>) -> Result<SyncReport, String> {
        for change in changes {
            self.state.apply(change);
        }
        let changes = self.state.take_changes();
        let changed = self.plan.update(&self.state, &changes);
        self.backend.sync(&self.plan, &changed).map_err(|e| e.to_string())
    }
}

fn full_sync_dump(state: &ClusterState, family: Family) -> String {
    let plan = NodePlan::build(state, config());
    let mut backend = IptablesBackend::new(FakeIptables::new());
    backend.sync(&plan, &Default::default()).expect("full sync applies");
    backend.iptables().dump(family)
}

fn nat_rules(fake: &FakeIptables, chain: &str) -> Vec<String> {
    fake.rules(Family::V4, Table::Nat, chain)
        .unwrap_or_else(|| panic!("chain {chain} exists"))
        .iter()
        .map(|r| format!("-A {chain} {}", r.save_args(Family::V4)))
        .collect()
}

fn web_with_two_endpoints() -> Harness<FakeIptables> {
    let mut h = Harness::new(FakeIptables::new());
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")])),
    ])
    .unwrap();
    h
}

#[test]
fn a_node_port_service_reads_line_by_line_like_kube_proxys_rules() {
    let h = web_with_two_endpoints();
    let fake = h.backend.iptables();
    let svc = "KUBE-SVC-CDGGSHYLG3RE2FKL";
    assert_eq!(svcplane_backend_iptables::names::service_chain("KUBE-SVC-", &port_name("web")), svc);
    let services = nat_rules(fake, "KUBE-SERVICES");
    assert_eq!(
        services,
        [
            format!(
                "-A KUBE-SERVICES -d 198.19.0.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j {svc}"
            ),
            "-A KUBE-SERVICES ! -d 127.0.0.0/8 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS".to_owned(),
        ]
    );
    assert_eq!(
        nat_rules(fake, "KUBE-NODEPORTS"),
        [
            "-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web:http\" -m tcp --dport 30080 -j KUBE-EXT-CDGGSHYLG3RE2FKL"
        ]
    );
    assert_eq!(
        nat_rules(fake, "KUBE-EXT-CDGGSHYLG3RE2FKL"),
        [
            "-A KUBE-EXT-CDGGSHYLG3RE2FKL -m comment --comment \"masquerade traffic for default/web:http external destinations\" -j KUBE-MARK-MASQ".to_owned(),
            format!("-A KUBE-EXT-CDGGSHYLG3RE2FKL -j {svc}"),
        ]
    );
    let cascade = nat_rules(fake, svc);
    assert_eq!(cascade.len(), 3);
    assert_eq!(
        cascade[0],
        format!(
            "-A {svc} ! -s 198.18.128.0/17 -d 198.19.0.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
        )
    );
    assert!(cascade[1].contains("-m comment --comment \"default/web:http -> 198.18.129.1:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-"), "{}", cascade[1]);
    assert!(!cascade[2].contains("statistic"), "the last endpoint is taken unconditionally: {}", cascade[2]);
    let sep = cascade[1].rsplit(' ').next().unwrap();
    assert_eq!(
        nat_rules(fake, sep),
        [
            format!("-A {sep} -s 198.18.129.1/32 -m comment --comment \"default/web:http\" -j KUBE-MARK-MASQ"),
            format!(
                "-A {sep} -p tcp -m comment --comment \"default/web:http\" -m tcp -j DNAT --to-destination 198.18.129.1:8080"
            ),
        ]
    );
    assert_eq!(
        nat_rules(fake, "KUBE-POSTROUTING"),
        [
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
        ]
    );
    assert_eq!(
        nat_rules(fake, "PREROUTING"),
        ["-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"]
    );
}

fn port_name(service: &str) -> svcplane_core::ServicePortName {
    svcplane_core::ServicePortName {
        service: NamespacedName::new("default", service),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    }
}

#[test]
fn four_endpoints_get_the_probabilities_a_quarter_a_third_a_half_and_the_rest() {
    let mut h = Harness::new(FakeIptables::new());
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice(
            "web",
            &[
                ("198.18.129.1", "node1"),
                ("198.18.129.2", "node1"),
                ("198.18.130.1", "node2"),
                ("198.18.130.2", "node2"),
            ],
        )),
    ])
    .unwrap();
    let input =
        &h.backend.iptables().restores().iter().find(|(f, r)| *f == Family::V4 && r.table == Table::Nat).unwrap().1;
    let text = input.render();
    let probabilities: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("--probability ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap())
        .collect();
    assert_eq!(probabilities, ["0.2500000000", "0.3333333333", "0.5000000000"], "written as kube-proxy writes them");
}

#[test]
fn a_service_without_endpoints_is_rejected_in_filter_and_has_no_nat_chains() {
    let mut h = Harness::new(FakeIptables::new());
    h.apply(vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort))]).unwrap();
    let fake = h.backend.iptables();
    let filter: Vec<String> = fake
        .rules(Family::V4, Table::Filter, "KUBE-SERVICES")
        .unwrap()
        .iter()
        .map(|r| r.save_args(Family::V4))
        .collect();
    assert_eq!(
        filter,
        [
            "-d 198.19.0.10/32 -p tcp -m comment --comment \"default/web:http has no endpoints\" -m tcp --dport 80 -j REJECT --reject-with tcp-reset"
        ]
    );
    let external: Vec<String> = fake
        .rules(Family::V4, Table::Filter, "KUBE-EXTERNAL-SERVICES")
        .unwrap()
        .iter()
        .map(|r| r.save_args(Family::V4))
        .collect();
    assert_eq!(
        external,
        [
            "! -d 127.0.0.0/8 -p tcp -m comment --comment \"default/web:http has no endpoints\" -m addrtype --dst-type LOCAL -m tcp --dport 30080 -j REJECT --reject-with tcp-reset"
        ]
    );
    assert_eq!(nat_rules(fake, "KUBE-SERVICES").len(), 1, "only the node-ports jump");
    let nat = fake.table(Family::V4, Table::Nat).unwrap();
    assert!(nat.chain_names().iter().all(|c| !c.starts_with("KUBE-SVC-")));
}

fn steps() -> Vec<Vec<Change>> {
    vec![
        vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort))],
        vec![Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")]))],
        vec![Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")]))],
        vec![Change::ServiceUpserted(service("db", "198.19.0.11", ServiceType::ClusterIp))],
        vec![Change::ServiceUpserted(service("alpha", "198.19.0.12", ServiceType::NodePort))],
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
        vec![Change::ServiceUpserted({
            let mut s = service("alpha", "198.19.0.12", ServiceType::LoadBalancer);
            s.load_balancer_ingress =
                vec![LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
            s.load_balancer_source_ranges = vec!["198.18.0.0/24".parse().unwrap()];
            s.external_ips = vec!["198.18.100.2".parse().unwrap()];
            s
        })],
        vec![Change::SliceUpserted(slice("alpha", &[("198.18.129.3", "node1")]))],
        vec![Change::SliceUpserted(slice("db", &[("198.18.129.2", "node1")]))],
        vec![Change::SliceDeleted(NamespacedName::new("default", "db-slice-V4"))],
        vec![Change::SliceDeleted(NamespacedName::new("default", "alpha-slice-V4"))],
        vec![Change::ServiceDeleted(NamespacedName::new("default", "web"))],
    ]
}

#[test]
fn partial_syncs_leave_the_same_tables_as_a_full_sync_of_the_final_plan() {
    let mut h = Harness::new(FakeIptables::new());
    for (index, step) in steps().into_iter().enumerate() {
        let report = h.apply(step).unwrap();
        assert_eq!(report.full, index == 0, "only the first sync is full (step {index})");
        for family in [Family::V4, Family::V6] {
            assert_eq!(h.backend.iptables().dump(family), full_sync_dump(&h.state, family), "after step {index}");
        }
    }
}

#[test]
fn one_endpoint_change_rewrites_only_that_services_chains() {
    let mut h = Harness::new(FakeIptables::new());
    let mut initial = Vec::new();
    for i in 0..50 {
        let name = format!("svc{i}");
        initial.push(Change::ServiceUpserted(service(&name, &format!("198.19.1.{i}"), ServiceType::ClusterIp)));
        initial.push(Change::SliceUpserted(slice(&name, &[("198.18.129.1", "node1"), ("198.18.129.2", "node1")])));
    }
    h.apply(initial).unwrap();
    let before = h.backend.iptables().restores().len();
    let report = h
        .apply(vec![Change::SliceUpserted(slice("svc7", &[("198.18.129.1", "node1"), ("198.18.129.3", "node1")]))])
        .unwrap();
    assert!(!report.full);
    assert_eq!((report.service_ports, report.restores), (1, 1), "one nat restore, nothing in filter");
    let (_, input) = &h.backend.iptables().restores()[before];
    let svc7 = svcplane_backend_iptables::names::service_chain("KUBE-SVC-", &port_name("svc7"));
    // The service chain is rewritten, one endpoint chain created and one deleted; the
    // dispatch rule in KUBE-SERVICES did not change and is not sent.
    assert_eq!(input.table, Table::Nat);
    assert_eq!(input.chains.len(), 3, "{}", input.render());
    assert!(input.chains.contains(&svc7));
    assert!(input.commands.iter().all(|c| c.chain() != "KUBE-SERVICES"), "{}", input.render());
    assert_eq!(input.commands.iter().filter(|c| matches!(c, Command::DeleteChain(_))).count(), 1);
    assert_eq!(h.backend.iptables().dump(Family::V4), full_sync_dump(&h.state, Family::V4));
}

#[test]
fn a_new_service_is_inserted_where_a_full_sync_would_put_it() {
    let mut h = Harness::new(FakeIptables::new());
    h.apply(vec![
        Change::ServiceUpserted(service("a", "198.19.0.10", ServiceType::ClusterIp)),
        Change::ServiceUpserted(service("c", "198.19.0.12", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("a", &[("198.18.129.1", "node1")])),
        Change::SliceUpserted(slice("c", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    h.apply(vec![
        Change::ServiceUpserted(service("b", "198.19.0.11", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("b", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    let (_, input) = h.backend.iptables().restores().last().unwrap();
    assert!(input.render().contains("-I KUBE-SERVICES 2 "), "{}", input.render());
    let services = nat_rules(h.backend.iptables(), "KUBE-SERVICES");
    assert!(services[1].contains("198.19.0.11"), "{services:?}");
    assert!(services[3].contains("KUBE-NODEPORTS"), "the node-ports jump stays last");
}

/// A kernel that refuses the next restore when told to.
struct Flaky {
    inner: FakeIptables,
    fail_next: bool,
}

impl Iptables for Flaky {
    fn restore(&mut self, family: Family, input: &RestoreTable) -> Result<(), IptablesError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(IptablesError::Restore {
                program: "iptables-restore".into(),
                family,
                table: input.table,
                line: Some(1),
                message: "injected failure".into(),
            });
        }
        self.inner.restore(family, input)
    }

    fn save(&self, family: Family, table: Table) -> Result<String, IptablesError> {
        self.inner.save(family, table)
    }

    fn save_all(&self, family: Family) -> Result<String, IptablesError> {
        self.inner.save_all(family)
    }

    fn list_chain(&self, family: Family, table: Table, chain: &str) -> Result<Option<String>, IptablesError> {
        self.inner.list_chain(family, table, chain)
    }
}

#[test]
fn a_failed_restore_leaves_the_previous_rules_and_the_next_sync_is_full() {
    let mut h = Harness::new(Flaky { inner: FakeIptables::new(), fail_next: false });
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    let before = h.backend.iptables().inner.dump(Family::V4);
    h.backend.iptables_mut().fail_next = true;
    let error = h.apply(vec![Change::SliceUpserted(slice("web", &[("198.18.129.2", "node1")]))]).unwrap_err();
    assert!(error.contains("injected failure"), "{error}");
    assert_eq!(h.backend.iptables().inner.dump(Family::V4), before, "nothing was half-applied");
    let report = h.apply(vec![]).unwrap();
    assert!(report.full, "the retry rewrites everything");
    assert_eq!(h.backend.iptables().inner.dump(Family::V4), full_sync_dump(&h.state, Family::V4));
}

/// A kernel whose tables cannot be dumped whole (as `iptables-nft-save` 1.8.9 crashes at
/// 100k chains), while listing one chain still works.
struct Unreadable(FakeIptables);

impl Iptables for Unreadable {
    fn restore(&mut self, family: Family, input: &RestoreTable) -> Result<(), IptablesError> {
        self.0.restore(family, input)
    }

    fn save(&self, family: Family, table: Table) -> Result<String, IptablesError> {
        Err(IptablesError::Read {
            program: "iptables-save".into(),
            family,
            table,
            message: "killed by signal 11".into(),
        })
    }

    fn save_all(&self, family: Family) -> Result<String, IptablesError> {
        self.save(family, Table::Filter)
    }

    fn list_chain(&self, family: Family, table: Table, chain: &str) -> Result<Option<String>, IptablesError> {
        self.0.list_chain(family, table, chain)
    }
}

#[test]
fn a_table_that_cannot_be_dumped_still_gets_full_syncs_without_duplicate_hooks() {
    let mut h = Harness::new(Unreadable(FakeIptables::new()));
    h.apply(vec![
        Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
        Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
    ])
    .unwrap();
    h.backend.request_full_sync();
    assert!(h.apply(vec![]).unwrap().full);
    assert_eq!(h.backend.iptables().0.dump(Family::V4), full_sync_dump(&h.state, Family::V4), "one copy of each hook");
}

#[test]
fn flushing_the_tables_behind_svcplanes_back_is_noticed_and_repaired_by_a_full_sync() {
    let mut h = web_with_two_endpoints();
    assert!(!h.backend.rules_changed_behind_our_back(), "nothing happened yet");
    h.backend.iptables_mut().flush_everything(Family::V4);
    assert!(h.backend.rules_changed_behind_our_back());
    let report = h.apply(vec![]).unwrap();
    assert!(report.full);
    assert_eq!(h.backend.iptables().dump(Family::V4), full_sync_dump(&h.state, Family::V4));
}

#[test]
fn flushing_only_the_nat_chains_is_noticed_too() {
    let mut h = web_with_two_endpoints();
    let mut flush = RestoreTable::new(Table::Nat);
    for chain in h.backend.iptables().table(Family::V6, Table::Nat).unwrap().chain_names() {
        if !Table::Nat.is_builtin(chain) {
            flush.declare(chain);
        }
    }
    h.backend.iptables_mut().restore(Family::V6, &flush).unwrap();
    // The nat canary is looked at every few checks only: it is the expensive one.
    let noticed =
        (0..svcplane_backend_iptables::sync::NAT_CHECK_EVERY).any(|_| h.backend.rules_changed_behind_our_back());
    assert!(noticed, "within {} checks", svcplane_backend_iptables::sync::NAT_CHECK_EVERY);
}

/// A node where Docker and an operator were there first.
const FOREIGN_NAT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:DOCKER - [0:0]\n:HOSTPORTS - [0:0]\n-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE\n-A DOCKER -i docker0 -j RETURN\n-A HOSTPORTS -p tcp -m tcp --dport 8443 -j KUBE-MARK-MASQ\nCOMMIT\n";
const FOREIGN_FILTER: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n:DOCKER-USER - [0:0]\n-A FORWARD -j DOCKER-USER\n-A DOCKER-USER -j RETURN\nCOMMIT\n";

/// The lines of `chains` in the filter and nat tables that are not svcplane's hooks.
fn foreign_lines(fake: &FakeIptables, chains: &[&str]) -> Vec<String> {
    let dump = [Table::Filter, Table::Nat].map(|t| fake.save(Family::V4, t).unwrap()).concat();
    dump.lines()
        .filter(|l| chains.iter().any(|c| l.starts_with(&format!("-A {c} ")) || l.starts_with(&format!(":{c} "))))
        .filter(|l| !l.contains("kubernetes"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn other_softwares_rules_survive_syncs_and_cleanup_untouched() {
    let mut fake = FakeIptables::new();
    // KUBE-MARK-MASQ must exist for HOSTPORTS to jump to it, as when kubelet made it.
    fake.load(Family::V4, &FOREIGN_NAT.replace(":HOSTPORTS", ":KUBE-MARK-MASQ - [0:0]\n:HOSTPORTS")).unwrap();
    fake.load(Family::V4, FOREIGN_FILTER).unwrap();
    let chains = ["PREROUTING", "POSTROUTING", "DOCKER", "HOSTPORTS", "FORWARD", "DOCKER-USER"];
    let before = foreign_lines(&fake, &chains);
    let mut h = Harness::new(fake);
    for step in steps() {
        h.apply(step).unwrap();
        assert_eq!(foreign_lines(h.backend.iptables(), &chains), before);
    }
    // Our hooks went on top of the built-in chains, before Docker's.
    let prerouting = nat_rules(h.backend.iptables(), "PREROUTING");
    assert!(prerouting[0].contains("-j KUBE-SERVICES") && prerouting[1].contains("-j DOCKER"), "{prerouting:?}");
    assert!(h.backend.cleanup().unwrap());
    let after = h.backend.iptables().dump(Family::V4);
    assert_eq!(foreign_lines(h.backend.iptables(), &chains), before);
    assert!(
        !after.contains("KUBE-SERVICES") && !after.contains("KUBE-SVC-") && !after.contains("kubernetes"),
        "{after}"
    );
    assert!(after.contains(":KUBE-MARK-MASQ"), "still jumped to by HOSTPORTS, so it stays: {after}");
    assert!(!h.backend.iptables().dump(Family::V6).contains("KUBE-"), "IPv6 is clean too");
    assert!(!h.backend.cleanup().unwrap(), "a second cleanup finds nothing of svcplane's");
}

#[test]
fn service_chains_left_by_an_earlier_run_are_deleted_by_the_first_full_sync() {
    let mut fake = FakeIptables::new();
    fake.load(
        Family::V4,
        "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-LEFTOVER00000000 - [0:0]\n:KUBE-SEP-LEFTOVER00000000 - [0:0]\n-A KUBE-SVC-LEFTOVER00000000 -j KUBE-SEP-LEFTOVER00000000\nCOMMIT\n",
    )
    .unwrap();
    let mut h = Harness::new(fake);
    h.apply(vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp))]).unwrap();
    assert!(!h.backend.iptables().dump(Family::V4).contains("LEFTOVER"));
}

#[test]
fn render_dump_prints_both_families_as_iptables_save_would() {
    let h = web_with_two_endpoints();
    let dump = render_dump(&h.plan, &[IpFamily::V4, IpFamily::V6]);
    let v6_at = dump.find("# IPv6").expect("an IPv6 section");
    assert!(dump.starts_with("# IPv4"));
    assert_eq!(&dump[dump.find('\n').unwrap() + 1..v6_at], h.backend.iptables().dump(Family::V4));
    assert!(dump[v6_at..].contains("-A KUBE-SERVICES ! -d ::1/128"), "{}", &dump[v6_at..]);
}

mod traced_packets {
    use std::collections::BTreeSet;

    use super::*;

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
        Host { local_addresses: vec![NODE.parse().unwrap(), "2001:db8::11".parse().unwrap()] }
    }

    fn outcomes(fake: &FakeIptables, origin: Origin, packet: Packet) -> BTreeSet<Outcome> {
        let family = if packet.destination.is_ipv4() { Family::V4 } else { Family::V6 };
        trace(fake, family, &host(), origin, packet).expect("the tracer understands every rule")
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

    fn programmed(changes: Vec<Change>) -> FakeIptables {
        let mut h = Harness::new(FakeIptables::new());
        h.apply(changes).unwrap();
        h.backend.iptables().clone()
    }

    #[test]
    fn a_pod_reaching_a_cluster_ip_may_land_on_any_endpoint_unmasqueraded() {
        let fake = web_with_two_endpoints().backend.iptables().clone();
        let got = outcomes(&fake, Origin::Network, tcp("198.18.129.2", "198.19.0.10", 80));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], false));
    }

    #[test]
    fn an_off_cluster_client_reaching_a_cluster_ip_is_masqueraded() {
        let fake = web_with_two_endpoints().backend.iptables().clone();
        let got = outcomes(&fake, Origin::Network, tcp("198.18.0.101", "198.19.0.10", 80));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], true));
    }

    #[test]
    fn the_node_reaching_a_cluster_ip_is_masqueraded() {
        let fake = web_with_two_endpoints().backend.iptables().clone();
        let got = outcomes(&fake, Origin::LocalProcess, tcp(NODE, "198.19.0.10", 80));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], true));
    }

    #[test]
    fn an_external_client_reaching_a_node_port_is_masqueraded() {
        let fake = web_with_two_endpoints().backend.iptables().clone();
        let got = outcomes(&fake, Origin::Network, tcp("198.18.0.101", NODE, 30080));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.130.1"], true));
    }

    #[test]
    fn a_node_port_is_not_reachable_on_loopback() {
        let fake = web_with_two_endpoints().backend.iptables().clone();
        let got = outcomes(&fake, Origin::LocalProcess, tcp("127.0.0.1", "127.0.0.1", 30080));
        let only: Vec<_> = got.into_iter().collect();
        assert_eq!(only.len(), 1);
        assert_eq!((only[0].disposition, only[0].destination_port), (Disposition::DeliveredLocally, 30080));
    }

    #[test]
    fn a_pod_reaching_itself_through_its_service_is_masqueraded() {
        let fake = web_with_two_endpoints().backend.iptables().clone();
        let got = outcomes(&fake, Origin::Network, tcp("198.18.129.1", "198.19.0.10", 80));
        let hairpin = got.iter().find(|o| o.destination.to_string() == "198.18.129.1").unwrap();
        assert!(hairpin.masqueraded);
        let other = got.iter().find(|o| o.destination.to_string() == "198.18.130.1").unwrap();
        assert!(!other.masqueraded);
    }

    #[test]
    fn a_service_without_endpoints_is_rejected_from_a_pod_the_node_and_outside() {
        let fake = programmed(vec![Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::NodePort))]);
        for (origin, packet) in [
            (Origin::Network, tcp("198.18.129.2", "198.19.0.10", 80)),
            (Origin::LocalProcess, tcp(NODE, "198.19.0.10", 80)),
            (Origin::Network, tcp("198.18.0.101", NODE, 30080)),
            (Origin::LocalProcess, tcp(NODE, NODE, 30080)),
        ] {
            let got = outcomes(&fake, origin, packet);
            assert!(
                !got.is_empty() && got.iter().all(|o| o.disposition == Disposition::Rejected),
                "{packet:?}: {got:?}"
            );
        }
    }

    #[test]
    fn external_local_policy_drops_external_traffic_on_a_node_without_local_endpoints() {
        let mut svc = service("web", "198.19.0.10", ServiceType::NodePort);
        svc.external_traffic_policy = TrafficPolicy::Local;
        let fake = programmed(vec![
            Change::ServiceUpserted(svc),
            Change::SliceUpserted(slice("web", &[("198.18.130.1", "node2")])),
        ]);
        let external = outcomes(&fake, Origin::Network, tcp("198.18.0.101", NODE, 30080));
        assert!(!external.is_empty() && external.iter().all(|o| o.disposition == Disposition::Dropped), "{external:?}");
        // A pod still short-circuits to every endpoint, and the node itself, masqueraded.
        let from_pod = outcomes(&fake, Origin::Network, tcp("198.18.129.5", NODE, 30080));
        assert_eq!(from_pod, forwarded_to(&["198.18.130.1"], false));
        let from_node = outcomes(&fake, Origin::LocalProcess, tcp(NODE, NODE, 30080));
        assert_eq!(from_node, forwarded_to(&["198.18.130.1"], true));
    }

    #[test]
    fn external_local_policy_preserves_the_client_address_on_local_endpoints() {
        let mut svc = service("web", "198.19.0.10", ServiceType::NodePort);
        svc.external_traffic_policy = TrafficPolicy::Local;
        let fake = programmed(vec![
            Change::ServiceUpserted(svc),
            Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.130.1", "node2")])),
        ]);
        let got = outcomes(&fake, Origin::Network, tcp("198.18.0.101", NODE, 30080));
        assert_eq!(got, forwarded_to(&["198.18.129.1"], false));
    }

    #[test]
    fn internal_local_policy_without_local_endpoints_drops_pod_traffic() {
        let mut svc = service("web", "198.19.0.10", ServiceType::ClusterIp);
        svc.internal_traffic_policy = TrafficPolicy::Local;
        let fake = programmed(vec![
            Change::ServiceUpserted(svc),
            Change::SliceUpserted(slice("web", &[("198.18.130.1", "node2")])),
        ]);
        let got = outcomes(&fake, Origin::Network, tcp("198.18.129.5", "198.19.0.10", 80));
        assert!(!got.is_empty() && got.iter().all(|o| o.disposition == Disposition::Dropped), "{got:?}");
    }

    fn load_balancer(ranges: &[&str]) -> Service {
        let mut svc = service("lb", "198.19.0.20", ServiceType::LoadBalancer);
        svc.load_balancer_ingress =
            vec![LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
        svc.load_balancer_source_ranges = ranges.iter().map(|r| r.parse().unwrap()).collect();
        svc
    }

    #[test]
    fn load_balancer_source_ranges_let_allowed_clients_in_and_drop_the_rest() {
        let fake = programmed(vec![
            Change::ServiceUpserted(load_balancer(&["198.18.0.0/25"])),
            Change::SliceUpserted(slice("lb", &[("198.18.129.1", "node1")])),
        ]);
        let allowed = outcomes(&fake, Origin::Network, tcp("198.18.0.101", "198.18.100.1", 80));
        assert_eq!(allowed, forwarded_to(&["198.18.129.1"], true));
        let refused = outcomes(&fake, Origin::Network, tcp("198.18.0.201", "198.18.100.1", 80));
        assert!(!refused.is_empty() && refused.iter().all(|o| o.disposition == Disposition::Dropped), "{refused:?}");
    }

    #[test]
    fn load_balancer_source_ranges_still_apply_when_there_are_no_endpoints() {
        let fake = programmed(vec![Change::ServiceUpserted(load_balancer(&["198.18.0.0/25"]))]);
        let allowed = outcomes(&fake, Origin::Network, tcp("198.18.0.101", "198.18.100.1", 80));
        assert!(allowed.iter().all(|o| o.disposition == Disposition::Rejected), "{allowed:?}");
        let refused = outcomes(&fake, Origin::Network, tcp("198.18.0.201", "198.18.100.1", 80));
        assert!(refused.iter().all(|o| o.disposition == Disposition::Dropped), "{refused:?}");
    }

    #[test]
    fn client_ip_affinity_checks_and_records_each_endpoints_recent_list() {
        let fake = programmed(vec![
            Change::ServiceUpserted(with_affinity(service("web", "198.19.0.10", ServiceType::ClusterIp), 600)),
            Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1"), ("198.18.129.2", "node1")])),
        ]);
        let svc = svcplane_backend_iptables::names::service_chain("KUBE-SVC-", &port_name("web"));
        let rules = nat_rules(&fake, &svc);
        // Masquerade, two "known client" rules, then the two-step cascade.
        assert_eq!(rules.len(), 5, "{rules:#?}");
        assert!(rules[1].contains("-m recent --rcheck --seconds 600 --reap --name KUBE-SEP-"), "{}", rules[1]);
        let sep = rules[3].rsplit(' ').next().unwrap();
        assert!(
            nat_rules(&fake, sep)[1]
                .contains(&format!("-m recent --set --name {sep} --mask 255.255.255.255 --rsource"))
        );
        // The tracer has no memory of clients: every endpoint stays possible.
        let got = outcomes(&fake, Origin::Network, tcp("198.18.129.9", "198.19.0.10", 80));
        assert_eq!(got, forwarded_to(&["198.18.129.1", "198.18.129.2"], false));
    }

    #[test]
    fn an_ipv6_service_is_traced_through_ip6tables() {
        let svc = Service::cluster_ip(
            NamespacedName::new("default", "web6"),
            vec!["2001:db8:f::10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        );
        let mut slice6 = slice("web6", &[("2001:db8:1::1", "node1"), ("2001:db8:1::2", "node2")]);
        slice6.name = NamespacedName::new("default", "web6-v6");
        let fake = programmed(vec![Change::ServiceUpserted(svc), Change::SliceUpserted(slice6)]);
        let got = outcomes(&fake, Origin::Network, tcp("2001:db8:1::5", "2001:db8:f::10", 80));
        let destinations: Vec<String> = got.iter().map(|o| o.destination.to_string()).collect();
        assert_eq!(destinations, ["2001:db8:1::1", "2001:db8:1::2"]);
        assert!(fake.dump(Family::V6).contains("--to-destination [2001:db8:1::1]:8080"));
    }

    #[test]
    fn several_cluster_cidrs_masquerade_only_sources_outside_all_of_them() {
        let mut h = Harness::new(FakeIptables::new());
        h.plan = NodePlan::new(NodeConfig {
            cluster_cidrs: vec!["198.18.128.0/18".parse().unwrap(), "198.18.192.0/18".parse().unwrap()],
            ..config()
        });
        h.apply(vec![
            Change::ServiceUpserted(service("web", "198.19.0.10", ServiceType::ClusterIp)),
            Change::SliceUpserted(slice("web", &[("198.18.129.1", "node1")])),
        ])
        .unwrap();
        let fake = h.backend.iptables().clone();
        assert!(fake.dump(Family::V4).contains(":KUBE-SRC-"), "one `! -s` cannot say outside both");
        for (source, masqueraded) in [("198.18.129.7", false), ("198.18.200.7", false), ("198.18.0.101", true)] {
            let got = outcomes(&fake, Origin::Network, tcp(source, "198.19.0.10", 80));
            assert_eq!(got, forwarded_to(&["198.18.129.1"], masqueraded), "from {source}");
        }
    }
}
