//! IPVS mode against a real kernel: its ipsets, `--ipvs-exclude-cidrs`, strict ARP, and
//! what `ipvsadm -Ln` and `ipset list` show next to upstream's listings. The host kernel has
//! no `ip_vs` nor `ip_set`, so the real tests run inside the guest kernel
//! (`scripts/in-guest`, `docs/guest-kernel.md`): a host-side test boots the guest once and
//! re-runs this binary's ignored guest-side tests there. Inside the guest everything happens
//! in network namespaces the tests create and delete; addresses come from 198.18.0.0/15.

use std::process::Command;
use std::time::Duration;

use svcplane_backend_ipvs::{IpvsBackend, IpvsConfig, STRICT_ARP, ipset, rules};
use svcplane_core::{
    Change, ClusterState, Dataplane, Endpoint, EndpointPort, EndpointSlice, IpFamily, LoadBalancerIngress,
    NamespacedName, NodeConfig, NodePlan, NodePortAddresses, PlanDiff, Protocol, Service, ServicePort, ServiceType,
};
use svcplane_iptables::{IptablesCli, Variant};
use svcplane_ipvs::{Ipvs, ServiceKey};
use svcplane_testbed::guest;

const HOST_TEST: &str = "ipvs_mode_sets_exclusions_strict_arp_and_listings_pass_in_the_guest_kernel";
const GUEST_TESTS: &[&str] = &[
    "the_sets_are_synced_as_a_difference_and_a_failed_update_leaves_them_as_they_were",
    "virtual_services_in_excluded_cidrs_survive_sync_and_cleanup",
    "strict_arp_sets_arp_ignore_and_arp_announce_in_the_nodes_namespace_only",
    "ipvsadm_and_ipset_list_show_what_upstreams_listings_show",
];

#[test]
fn ipvs_mode_sets_exclusions_strict_arp_and_listings_pass_in_the_guest_kernel() {
    if !guest::can_boot_guest(HOST_TEST) {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's own path");
    let run = guest::run_tests_in_guest(&exe, GUEST_TESTS, Duration::from_secs(400)).expect("running the guest batch");
    if let Err(failure) = run.check_tests_passed(GUEST_TESTS) {
        panic!("guest-kernel tests failed:\n{failure}");
    }
}

/// A network namespace standing for a node, made for the test and deleted on drop: loopback
/// up (IPVS needs a local routing table) and the node address on a dummy LAN interface.
struct Node(String);

const NODE_IP: &str = "198.18.0.11";

impl Node {
    fn create(name: &str) -> Self {
        guest::load_modules(&[
            "ip_vs",
            "ip_vs_rr",
            "dummy",
            "ip_set_hash_ipport",
            "ip_set_hash_ipportip",
            "ip_set_hash_ipportnet",
            "ip_set_hash_net",
            "ip_set_bitmap_port",
            "xt_set",
        ])
        .expect("loading ip_vs, dummy and the set types");
        run(&["ip", "netns", "add", name]);
        let node = Node(name.to_owned());
        run(&["ip", "-n", name, "link", "set", "lo", "up"]);
        run(&["ip", "-n", name, "link", "add", "eth0", "type", "dummy"]);
        run(&["ip", "-n", name, "addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
        run(&["ip", "-n", name, "link", "set", "eth0", "up"]);
        node
    }

    /// Runs `work` on a thread inside the namespace.
    fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> T {
        svcplane_testbed::namespace::run_in_namespace(&self.0, work).expect("entering the node namespace")
    }

    /// A command's stdout, run in the namespace.
    fn output(&self, command: &[&str]) -> String {
        let mut args = vec!["ip", "netns", "exec", &self.0];
        args.extend_from_slice(command);
        run(&args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs a command, requires success, returns its stdout.
fn run(command: &[&str]) -> String {
    let output = Command::new(command[0]).args(&command[1..]).output().expect("running a command");
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn backend(config: IpvsConfig) -> IpvsBackend {
    IpvsBackend::new(config, IptablesCli::new(Variant::Nft))
}

/// A Service of `service_type` with `ports` ((protocol, port, node port, target port)) and
/// ready endpoints on node1.
struct Spec<'a> {
    name: &'a str,
    service_type: ServiceType,
    cluster_ip: &'a str,
    load_balancer_ip: Option<&'a str>,
    ports: Vec<(Protocol, u16, Option<u16>, u16)>,
    endpoints: Vec<&'a str>,
}

fn plan(specs: &[Spec<'_>]) -> NodePlan {
    let mut state = ClusterState::new();
    for spec in specs {
        let name = NamespacedName::new("default", spec.name);
        let ports = spec
            .ports
            .iter()
            .enumerate()
            .map(|(index, (protocol, port, node_port, _))| ServicePort {
                name: format!("p{index}"),
                protocol: *protocol,
                port: *port,
                node_port: *node_port,
            })
            .collect();
        let mut service = Service::cluster_ip(name.clone(), vec![spec.cluster_ip.parse().unwrap()], ports);
        service.service_type = spec.service_type;
        if let Some(ip) = spec.load_balancer_ip {
            service.load_balancer_ingress = vec![LoadBalancerIngress { ip: ip.parse().unwrap(), is_proxy_mode: false }];
        }
        state.apply(Change::ServiceUpserted(service));
        let slice = EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", format!("{}-abc", spec.name)),
            service: name,
            family: IpFamily::V4,
            ports: spec
                .ports
                .iter()
                .enumerate()
                .map(|(index, (protocol, _, _, target))| EndpointPort {
                    name: format!("p{index}"),
                    protocol: *protocol,
                    port: *target,
                })
                .collect(),
            endpoints: spec.endpoints.iter().map(|ip| Endpoint::ready(ip.parse().unwrap(), Some("node1"))).collect(),
        };
        state.apply(Change::SliceUpserted(slice));
    }
    NodePlan::build(
        &state,
        NodeConfig {
            node_name: "node1".into(),
            node_ips: vec![NODE_IP.parse().unwrap()],
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            node_port_addresses: NodePortAddresses::AllLocal,
        },
    )
}

fn web<'a>(name: &'a str, cluster_ip: &'a str, endpoint: &'a str) -> Spec<'a> {
    Spec {
        name,
        service_type: ServiceType::NodePort,
        cluster_ip,
        load_balancer_ip: None,
        ports: vec![(Protocol::Tcp, 80, Some(30080), 8080)],
        endpoints: vec![endpoint],
    }
}

/// Every set of ours and its members, as the kernel has them.
fn our_sets() -> std::collections::BTreeMap<String, ipset::SavedSet> {
    let mut sets = ipset::IpsetCli::default().save().expect("ipset save");
    sets.retain(|name, _| rules::is_our_set(name));
    sets
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn the_sets_are_synced_as_a_difference_and_a_failed_update_leaves_them_as_they_were() {
    if !guest::guest_only(GUEST_TESTS[0], HOST_TEST) {
        return;
    }
    let node = Node::create("svcplane-ipvs-sets");
    node.run(|| {
        let mut backend = backend(IpvsConfig::default());
        let two = plan(&[web("a", "198.19.0.10", "198.18.129.2"), web("b", "198.19.0.11", "198.18.129.3")]);
        backend.sync(&two, &PlanDiff::default()).expect("the first sync");
        let sets = our_sets();
        let members = |name: &str| sets[name].members.iter().cloned().collect::<Vec<_>>();
        assert_eq!(members("KUBE-CLUSTER-IP"), vec!["198.19.0.10,tcp:80", "198.19.0.11,tcp:80"]);
        assert_eq!(members("KUBE-NODE-PORT-TCP"), vec!["30080"]);
        assert!(sets.contains_key("KUBE-6-CLUSTER-IP"), "IPv6 sets exist too: {:?}", sets.keys());

        // The wanted sets of the same plan again: nothing to send.
        let wanted = |plan: &NodePlan| {
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .flat_map(|family| rules::family_rules(plan, family, &[NODE_IP.parse().unwrap()]).sets)
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let current = ipset::IpsetCli::default().save().unwrap();
        let again = ipset::changes(&current, &wanted(&two), rules::is_our_set);
        assert!(again.script.is_empty() && again.stale.is_empty(), "{again:?}");

        // One Service gone: its members only.
        let one = plan(&[web("a", "198.19.0.10", "198.18.129.2")]);
        let current = ipset::IpsetCli::default().save().unwrap();
        let next = ipset::changes(&current, &wanted(&one), rules::is_our_set);
        assert_eq!(
            next.script,
            vec!["del KUBE-CLUSTER-IP 198.19.0.11,tcp:80", "del KUBE-LOOP-BACK 198.18.129.3,tcp:8080,198.18.129.3"]
        );
        backend.sync(&one, &PlanDiff::default()).expect("the second sync");
        assert_eq!(our_sets()["KUBE-CLUSTER-IP"].members.len(), 1);

        // An update that fails part-way (the kernel refuses an address of the wrong family
        // after a valid member was added): the sets are put back as they were.
        let before = our_sets();
        let mut bad = wanted(&one);
        let cluster = bad.get_mut("KUBE-CLUSTER-IP").unwrap();
        cluster.members.insert("198.19.0.12,tcp:80".into());
        cluster.members.insert("2001:db8:f::1,tcp:80".into());
        bad.get_mut("KUBE-NODE-PORT-TCP").unwrap().members.insert("30081".into());
        let changes = ipset::changes(&ipset::IpsetCli::default().save().unwrap(), &bad, rules::is_our_set);
        // Members only: the change goes over netlink, and what the kernel took is taken back.
        assert_eq!(changes.members.len(), changes.script.len());
        let error = ipset::IpsetCli::default().apply(&changes).expect_err("an IPv6 member in an IPv4 set is refused");
        assert!(error.contains("2001:db8:f::1,tcp:80 to ipset KUBE-CLUSTER-IP"), "{error}");
        assert!(error.contains("taken back"), "{error}");
        assert_eq!(our_sets(), before, "a failed update leaves every set as it was");

        // The iptables rules name the sets, and cleanup removes rules and sets.
        let nat = run(&["iptables-nft-save", "-t", "nat"]);
        assert!(
            nat.contains("! -s 198.18.128.0/17 -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"),
            "{nat}"
        );
        assert!(backend.cleanup().expect("cleanup"));
        assert!(our_sets().is_empty(), "{:?}", our_sets().keys());
    });
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn virtual_services_in_excluded_cidrs_survive_sync_and_cleanup() {
    if !guest::guest_only(GUEST_TESTS[1], HOST_TEST) {
        return;
    }
    let node = Node::create("svcplane-ipvs-exclude");
    node.run(|| {
        // A virtual service another program made on the node's address (where NodePorts
        // are, so a sync would take it for one of its own).
        let foreign = ServiceKey::new(NODE_IP.parse().unwrap(), Protocol::Tcp, 8443);
        let service = svcplane_ipvs::Service { key: foreign, scheduler: "rr".into(), persistence_seconds: 0 };
        let mut ipvs = Ipvs::new().expect("IPVS in the namespace");
        ipvs.apply(&[svcplane_ipvs::Change::AddService(service.clone())]).expect("adding the foreign service");
        let keys = |ipvs: &mut Ipvs| ipvs.table().unwrap().into_iter().map(|e| e.service.key).collect::<Vec<_>>();

        let one = plan(&[web("a", "198.19.0.10", "198.18.129.2")]);
        let excluding = IpvsConfig { exclude_cidrs: vec!["198.18.0.0/24".parse().unwrap()], ..IpvsConfig::default() };
        let mut backend = backend(excluding.clone());
        backend.sync(&one, &PlanDiff::default()).expect("a sync excluding the node network");
        assert!(keys(&mut ipvs).contains(&foreign), "an excluded address's service stays: {:?}", keys(&mut ipvs));
        let node_port = ServiceKey { port: 30080, ..foreign };
        assert!(keys(&mut ipvs).contains(&node_port), "a service the plan wants there is still written");
        backend.cleanup().expect("cleanup");
        assert!(keys(&mut ipvs).contains(&foreign), "cleanup leaves it too");

        // Without the exclusion, the same sync removes it.
        let mut plain = backend_of_default();
        plain.sync(&one, &PlanDiff::default()).expect("a sync without exclusions");
        assert!(!keys(&mut ipvs).contains(&foreign), "{:?}", keys(&mut ipvs));
        plain.cleanup().expect("cleanup");
    });
}

fn backend_of_default() -> IpvsBackend {
    backend(IpvsConfig::default())
}

fn sysctl(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {path}: {error}")).trim().to_owned()
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn strict_arp_sets_arp_ignore_and_arp_announce_in_the_nodes_namespace_only() {
    if !guest::guest_only(GUEST_TESTS[2], HOST_TEST) {
        return;
    }
    let outside: Vec<String> = STRICT_ARP.iter().map(|(path, _)| sysctl(path)).collect();
    let node = Node::create("svcplane-ipvs-arp");
    node.run(|| {
        let one = plan(&[web("a", "198.19.0.10", "198.18.129.2")]);
        let mut plain = backend_of_default();
        plain.sync(&one, &PlanDiff::default()).expect("a sync without strict ARP");
        for (path, _) in STRICT_ARP {
            assert_eq!(sysctl(path), "0", "{path} is left alone without strict ARP");
        }
        let mut strict = backend(IpvsConfig { strict_arp: true, ..IpvsConfig::default() });
        strict.sync(&one, &PlanDiff::default()).expect("a sync with strict ARP");
        assert_eq!(sysctl("/proc/sys/net/ipv4/conf/all/arp_ignore"), "1");
        assert_eq!(sysctl("/proc/sys/net/ipv4/conf/all/arp_announce"), "2");
        strict.cleanup().expect("cleanup");
    });
    let after: Vec<String> = STRICT_ARP.iter().map(|(path, _)| sysctl(path)).collect();
    assert_eq!(after, outside, "the namespace outside is untouched");
}

/// `ipvsadm -Ln` as upstream's listings show it: the header, then each virtual service
/// (`TCP  address:port rr`) with its real servers (`  -> address:port  Masq  1  0  0`),
/// whitespace runs made single.
fn ipvsadm_lines(node: &Node) -> Vec<String> {
    node.output(&["ipvsadm", "-Ln"])
        .lines()
        .map(|line| {
            let indent = if line.starts_with("  ->") { "  " } else { "" };
            format!("{indent}{}", line.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvsadm_and_ipset_list_show_what_upstreams_listings_show() {
    if !guest::guest_only(GUEST_TESTS[3], HOST_TEST) {
        return;
    }
    let node = Node::create("svcplane-ipvs-listing");
    // The Services of upstream's listings, in the lab's address plan: a ClusterIP with two
    // pods (`TCP 10.233.56.44:80 rr`), the `test` LoadBalancer with DNS and metrics ports
    // (53:32083/UDP, 53:30321/TCP, 9153:32257/TCP), a NodePort with three pods on 18080
    // (80:30180/TCP), and a ClusterIP to three pods on 8080.
    let specs = [
        Spec {
            name: "cluster",
            service_type: ServiceType::ClusterIp,
            cluster_ip: "198.19.56.44",
            load_balancer_ip: None,
            ports: vec![(Protocol::Tcp, 80, None, 80)],
            endpoints: vec!["198.18.129.141", "198.18.129.142"],
        },
        Spec {
            name: "test",
            service_type: ServiceType::LoadBalancer,
            cluster_ip: "198.19.0.10",
            load_balancer_ip: Some("198.18.100.3"),
            ports: vec![
                (Protocol::Udp, 53, Some(32083), 53),
                (Protocol::Tcp, 53, Some(30321), 53),
                (Protocol::Tcp, 9153, Some(32257), 9153),
            ],
            endpoints: vec!["198.18.129.141", "198.18.129.142"],
        },
        Spec {
            name: "demo-nodeport",
            service_type: ServiceType::NodePort,
            cluster_ip: "198.19.1.101",
            load_balancer_ip: None,
            ports: vec![(Protocol::Tcp, 80, Some(30180), 18080)],
            endpoints: vec!["198.18.129.87", "198.18.129.88", "198.18.129.89"],
        },
        Spec {
            name: "three",
            service_type: ServiceType::ClusterIp,
            cluster_ip: "198.19.1.100",
            load_balancer_ip: None,
            ports: vec![(Protocol::Tcp, 80, None, 8080)],
            endpoints: vec!["198.18.129.2", "198.18.130.3", "198.18.131.4"],
        },
    ];
    node.run(|| backend_of_default().sync(&plan(&specs), &PlanDiff::default()).expect("programming the Services"));

    let lines = ipvsadm_lines(&node);
    assert!(lines[0].starts_with("IP Virtual Server version "), "{lines:#?}");
    assert_eq!(lines[1], "Prot LocalAddress:Port Scheduler Flags");
    assert_eq!(lines[2], "  -> RemoteAddress:Port Forward Weight ActiveConn InActConn");
    let service =
        |text: &str| lines.iter().position(|line| line == text).unwrap_or_else(|| panic!("no {text:?} in {lines:#?}"));
    let reals = |text: &str| -> Vec<String> {
        lines[service(text) + 1..].iter().take_while(|line| line.starts_with("  ->")).cloned().collect()
    };
    let masq = |pods: &[&str], port: u16| -> Vec<String> {
        pods.iter().map(|pod| format!("  -> {pod}:{port} Masq 1 0 0")).collect()
    };
    assert_eq!(reals("TCP 198.19.56.44:80 rr"), masq(&["198.18.129.141", "198.18.129.142"], 80));
    assert_eq!(reals(&format!("TCP {NODE_IP}:32257 rr")), masq(&["198.18.129.141", "198.18.129.142"], 9153));
    assert_eq!(reals(&format!("UDP {NODE_IP}:32083 rr")), masq(&["198.18.129.141", "198.18.129.142"], 53));
    assert_eq!(reals("TCP 198.18.100.3:53 rr"), masq(&["198.18.129.141", "198.18.129.142"], 53));
    let demo = masq(&["198.18.129.87", "198.18.129.88", "198.18.129.89"], 18080);
    assert_eq!(reals(&format!("TCP {NODE_IP}:30180 rr")), demo);
    assert_eq!(reals("TCP 198.19.1.101:80 rr"), demo);
    assert_eq!(reals("TCP 198.19.1.100:80 rr"), masq(&["198.18.129.2", "198.18.130.3", "198.18.131.4"], 8080));
    // Every Service address is on kube-ipvs0, as a /32.
    let addresses = node.output(&["ip", "-4", "addr", "show", "dev", "kube-ipvs0"]);
    for address in ["198.19.56.44", "198.19.0.10", "198.18.100.3", "198.19.1.101", "198.19.1.100"] {
        assert!(addresses.contains(&format!("inet {address}/32 scope global kube-ipvs0")), "{addresses}");
    }

    // `ipset list`: upstream's names, types and member format.
    let listing = node.output(&["ipset", "list"]);
    let set = |name: &str| -> (String, Vec<String>) {
        let block = listing
            .split("\n\n")
            .find(|block| block.lines().next() == Some(&format!("Name: {name}")))
            .unwrap_or_else(|| panic!("no set {name} in:\n{listing}"));
        let set_type = block.lines().find_map(|line| line.strip_prefix("Type: ")).unwrap().to_owned();
        let mut members: Vec<String> =
            block.split("Members:\n").nth(1).unwrap_or("").lines().map(str::to_owned).collect();
        members.sort();
        (set_type, members)
    };
    let strings = |items: &[&str]| items.iter().map(|item| (*item).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        set("KUBE-CLUSTER-IP"),
        (
            "hash:ip,port".to_owned(),
            strings(&[
                "198.19.0.10,tcp:53",
                "198.19.0.10,tcp:9153",
                "198.19.0.10,udp:53",
                "198.19.1.100,tcp:80",
                "198.19.1.101,tcp:80",
                "198.19.56.44,tcp:80"
            ])
        )
    );
    assert_eq!(
        set("KUBE-LOAD-BALANCER"),
        ("hash:ip,port".to_owned(), strings(&["198.18.100.3,tcp:53", "198.18.100.3,tcp:9153", "198.18.100.3,udp:53"]))
    );
    assert_eq!(set("KUBE-NODE-PORT-TCP"), ("bitmap:port".to_owned(), strings(&["30180", "30321", "32257"])));
    assert_eq!(set("KUBE-NODE-PORT-UDP"), ("bitmap:port".to_owned(), strings(&["32083"])));
    let (loop_type, loop_back) = set("KUBE-LOOP-BACK");
    assert_eq!(loop_type, "hash:ip,port,ip");
    assert!(loop_back.contains(&"198.18.129.87,tcp:18080,198.18.129.87".to_owned()), "{loop_back:?}");
    assert_eq!(set("KUBE-6-CLUSTER-IP").0, "hash:ip,port");
    for name in ["KUBE-EXTERNAL-IP", "KUBE-LOAD-BALANCER-FW", "KUBE-LOAD-BALANCER-SOURCE-CIDR"] {
        assert!(set(name).1.is_empty(), "{name} is empty");
    }

    // The nat rules match the sets, as upstream's `KUBE-SERVICES` does.
    let nat = node.output(&["iptables-nft-save", "-t", "nat"]);
    for expected in [
        "-A PREROUTING -j KUBE-SERVICES",
        "-A POSTROUTING -j KUBE-POSTROUTING",
        "-m set --match-set KUBE-CLUSTER-IP dst,dst",
        "-m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-MARK-MASQ",
        "-m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        "-A KUBE-POSTROUTING -j MASQUERADE --random-fully",
    ] {
        assert!(nat.contains(expected), "no {expected:?} in:\n{nat}");
    }
    let rules = nat.lines().filter(|line| line.starts_with("-A KUBE-SERVICES")).count();
    assert!(rules <= 8, "the rules do not grow with the Services: {rules} in\n{nat}");
    node.run(|| backend_of_default().cleanup().expect("cleanup"));
}
