//! Real-kernel scenarios for `svcplane proxy --mode ebpf`: the shared scenario table, run
//! by the same runner as the other modes, with each lab node a network namespace plus a
//! cgroup of its own (the probes of the node and of its pods run in it) and each proxy
//! pinning under a bpf root of its own (needs root; see `docs/lab.md`).

mod scenarios;

use scenarios::backends::{EBPF, EBPF_DSR};
use std::time::Duration;

use scenarios::cluster::{Cluster, ECHO_SERVICE, POD_ON_THIS_NODE, THIS_NODE};
use scenarios::manifests::CONVERSATION_PORT;
use scenarios::manifests::UDP_MOVING_SERVICE;
use scenarios::manifests::{LB_SERVICE, SERVICE_PORT};
use scenarios::{Family, NodePortAddresses, Protocol, Scenario, check_rows, eventually};

fn check_table(rows: &[Scenario]) {
    let cluster = Cluster::start(EBPF);
    check_rows(&cluster, rows);
    cluster.teardown();
}

macro_rules! table_test {
    ($name:ident, $rows:expr) => {
        #[test]
        fn $name() {
            if !svcplane_testbed::can_run_real_kernel_tests(stringify!($name)) {
                return;
            }
            check_table($rows);
        }
    };
}

table_test!(pods_and_the_node_reach_a_service_through_its_cluster_ip_and_node_port, scenarios::REACHABILITY);
table_test!(a_service_without_endpoints_is_refused_at_connect_from_a_pod_and_the_node, scenarios::NO_ENDPOINTS);
table_test!(local_traffic_policies_keep_traffic_on_the_node_or_drop_it, scenarios::TRAFFIC_POLICY);
table_test!(load_balancer_ips_are_served_like_node_ports_unless_proxied, scenarios::LOAD_BALANCER);
table_test!(external_ips_are_served_like_load_balancer_ips, scenarios::EXTERNAL_IPS);
table_test!(health_check_node_ports_answer_with_the_local_endpoint_count, scenarios::HEALTH_CHECKS);
table_test!(terminating_endpoints_are_used_only_when_none_is_ready, scenarios::TERMINATING);
table_test!(topology_keeps_traffic_close_with_upstreams_fallbacks, scenarios::TOPOLOGY);
table_test!(headless_external_name_and_other_proxies_services_are_not_programmed, scenarios::IGNORED);
table_test!(node_ports_answer_on_every_node_address_but_loopback_by_default, scenarios::NODEPORT_ADDRESSES_DEFAULT);
table_test!(client_ip_affinity_sticks_until_the_timeout, scenarios::AFFINITY);

#[test]
fn node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary",
    ) {
        return;
    }
    let cluster = Cluster::builder(EBPF).node_port_addresses(NodePortAddresses::Primary).start();
    check_rows(&cluster, scenarios::NODEPORT_ADDRESSES_PRIMARY);
    cluster.teardown();
}

#[test]
fn node_ports_answer_only_inside_nodeport_addresses_cidrs() {
    if !svcplane_testbed::can_run_real_kernel_tests("node_ports_answer_only_inside_nodeport_addresses_cidrs") {
        return;
    }
    let cluster = Cluster::builder(EBPF).node_port_addresses(NodePortAddresses::SecondaryOnly).start();
    check_rows(&cluster, scenarios::NODEPORT_ADDRESSES_CIDRS);
    cluster.teardown();
}

#[test]
fn endpoint_changes_move_connected_udp_flows_and_keep_flows_to_terminating_endpoints() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "endpoint_changes_move_connected_udp_flows_and_keep_flows_to_terminating_endpoints",
    ) {
        return;
    }
    let cluster =
        Cluster::builder(EBPF).line_servers(Protocol::Tcp, CONVERSATION_PORT, &["node1-pod1", "node2-pod2"]).start();
    check_rows(&cluster, scenarios::ENDPOINT_CHANGES);
    cluster.teardown();
}

#[test]
fn detached_programs_are_attached_again_within_five_seconds() {
    if !svcplane_testbed::can_run_real_kernel_tests("detached_programs_are_attached_again_within_five_seconds") {
        return;
    }
    let cluster = Cluster::start(EBPF);
    let target = cluster.service(ECHO_SERVICE).expect("echo").cluster_ip_address(false).expect("an IPv4 ClusterIP");
    let pod = cluster.lab().pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    let ask = || cluster.lab().tcp_request(&pod, target, Duration::from_millis(300));
    assert!(ask().is_ok(), "the ClusterIP answers before the damage");
    // Unpinning a link detaches its program: nothing else holds it.
    let links = cluster.bpf_root(THIS_NODE).join("links");
    let mut removed = 0;
    for entry in std::fs::read_dir(&links).expect("the links directory") {
        std::fs::remove_file(entry.expect("an entry").path()).expect("unpinning a link");
        removed += 1;
    }
    assert!(removed >= 8, "every socket program had a pinned link ({removed})");
    // (Whether a probe fails in between depends on how fast the proxy is: it checks every
    // second.) The proxy must notice, say what it found, and attach everything again.
    let noticed = eventually(Duration::from_secs(5), || cluster.proxy_log(THIS_NODE).contains("is gone").then_some(()));
    assert!(noticed.is_some(), "the proxy did not notice within 5 s\n{}", cluster.diagnostics());
    let repaired = eventually(Duration::from_secs(5), || {
        let pinned = std::fs::read_dir(&links).map(Iterator::count).unwrap_or(0);
        (pinned >= removed && ask().is_ok()).then_some(())
    });
    assert!(repaired.is_some(), "the programs were not attached again within 5 s\n{}", cluster.diagnostics());
    let repairs = cluster.proxy_metric(THIS_NODE, "svcplane_drift_repairs_total{mode=\"ebpf\"}");
    assert!(repairs >= Some(1.0), "the repair is counted on /metrics: {repairs:?}");
    cluster.teardown();
}

#[test]
fn the_per_endpoint_counters_grow_by_exactly_the_connections_each_endpoint_answered() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_per_endpoint_counters_grow_by_exactly_the_connections_each_endpoint_answered",
    ) {
        return;
    }
    let cluster = Cluster::start(EBPF);
    scenarios::real::check_connection_counters(&cluster);
    cluster.teardown();
}

#[test]
fn a_connected_udp_socket_moves_to_a_live_endpoint_within_two_and_a_half_seconds() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_connected_udp_socket_moves_to_a_live_endpoint_within_two_and_a_half_seconds",
    ) {
        return;
    }
    let cluster = Cluster::start(EBPF);
    let service = cluster.service(UDP_MOVING_SERVICE).expect("the moving Service");
    let target = service.cluster_ip_address(false).expect("an IPv4 ClusterIP");
    let pod = cluster.lab().pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    // One socket, connected once, kept across the change.
    let socket = cluster
        .lab()
        .run_in(&pod, || {
            let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
            socket.connect(target).expect("connect");
            socket.set_read_timeout(Some(Duration::from_millis(300))).expect("a timeout");
            socket
        })
        .expect("the pod's namespace");
    let ask = || -> Option<String> {
        socket.send(b"svcplane-probe\n").ok()?;
        let mut reply = [0u8; 512];
        let n = socket.recv(&mut reply).ok()?;
        Some(String::from_utf8_lossy(&reply[..n]).split_whitespace().next()?.to_owned())
    };
    let first = eventually(Duration::from_secs(5), ask).expect("an answer before the change").0;
    assert_eq!(first, "node1-pod1", "the Service's only endpoint answers first");
    let mutation = scenarios::manifests::mutation(UDP_MOVING_SERVICE).expect("the change");
    let (file, text) = mutation.change();
    cluster.write_file(&file, &text);
    let moved = eventually(Duration::from_millis(2500), || ask().filter(|pod| pod == "node2-pod1"));
    assert!(moved.is_some(), "the connected socket still went to {first} 2.5 s after it stopped serving");
    cluster.teardown();
}

#[test]
fn with_direct_server_return_external_traffic_keeps_the_client_address_and_every_other_row_still_holds() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "with_direct_server_return_external_traffic_keeps_the_client_address_and_every_other_row_still_holds",
    ) {
        return;
    }
    let cluster = Cluster::start(EBPF_DSR);
    for rows in [scenarios::REACHABILITY, scenarios::LOAD_BALANCER, scenarios::EXTERNAL_IPS, scenarios::TRAFFIC_POLICY]
    {
        check_rows(&cluster, rows);
    }
    // External client -> NodePort and load-balancer IP under Cluster policy, both families: endpoints
    // on both nodes answer, each sees the client's own address, and the client's sockets
    // (connected: they accept only the address they sent to) got every reply.
    let lab = cluster.lab();
    let echo = cluster.service(ECHO_SERVICE).expect("the echo Service");
    let lb = cluster.service(LB_SERVICE).expect("the load-balancer Service");
    let client = lab.client(1);
    for (family, protocol) in
        [Family::V4, Family::V6].into_iter().flat_map(|f| [(f, Protocol::Tcp), (f, Protocol::Udp)])
    {
        let client_ip = scenarios::manifests::client_ip(1, family);
        let node_ip = scenarios::manifests::node_ip(THIS_NODE, family);
        let targets = [
            std::net::SocketAddr::new(node_ip, echo.node_port(protocol).expect("a node port")),
            std::net::SocketAddr::new(lb.load_balancer_ips(family, false)[0], SERVICE_PORT),
        ];
        for target in targets {
            let mut answered = std::collections::BTreeSet::new();
            for sent in 0..40 {
                let reply = scenarios::net::request(
                    lab,
                    client.namespace_name(),
                    protocol,
                    target,
                    None,
                    Duration::from_secs(2),
                )
                .unwrap_or_else(|error| {
                    panic!("{protocol} request {} to {target}: {error}\n{}", sent + 1, cluster.diagnostics())
                });
                assert_eq!(
                    reply.client_addr.ip(),
                    client_ip,
                    "{protocol} to {target}: {} saw the client's own address",
                    reply.server_name
                );
                answered.insert(reply.server_name);
            }
            assert!(
                scenarios::OTHER_NODE_ECHO_PODS.iter().any(|pod| answered.contains(*pod)),
                "{protocol} to {target}: endpoints on the other node answered directly ({answered:?})"
            );
            eprintln!("ok: {protocol} to {target} by direct server return, answered by {answered:?}");
        }
    }
    cluster.teardown();
}

/// node `node`'s gauge for one eBPF map, as /metrics shows it.
fn map_gauge(cluster: &Cluster, node: u16, gauge: &str, map: &str) -> Option<f64> {
    cluster.proxy_metric(node, &format!("{gauge}{{mode=\"ebpf\",table=\"{map}\"}}"))
}

/// Eight TCP ports, NodePort, dual-stack: a few hundred frontend entries.
const MANY_PORTS_SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: many-ports
  namespace: default
spec:
  type: NodePort
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  selector:
    app: echo
  ports:
    - {name: p1, port: 1001, targetPort: 8080}
    - {name: p2, port: 1002, targetPort: 8080}
    - {name: p3, port: 1003, targetPort: 8080}
    - {name: p4, port: 1004, targetPort: 8080}
    - {name: p5, port: 1005, targetPort: 8080}
    - {name: p6, port: 1006, targetPort: 8080}
    - {name: p7, port: 1007, targetPort: 8080}
    - {name: p8, port: 1008, targetPort: 8080}
";

#[test]
fn a_service_that_does_not_fit_the_maps_is_refused_whole_shown_in_metrics_and_the_rest_keeps_working() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_service_that_does_not_fit_the_maps_is_refused_whole_shown_in_metrics_and_the_rest_keeps_working",
    ) {
        return;
    }
    const SERVICES: &str = "svcplane_services";
    // How many frontend entries the fixture takes on the busier node, from a first cluster.
    let sizing = Cluster::start(EBPF);
    let needed = [THIS_NODE, scenarios::cluster::OTHER_NODE]
        .iter()
        .map(|node| map_gauge(&sizing, *node, "svcplane_dataplane_table_entries", SERVICES).expect("the gauge") as u64)
        .max()
        .expect("two nodes");
    sizing.teardown();
    assert!(needed > 100, "the fixture takes {needed} entries");
    // Room for the fixture and 20 more, not for the eight-port Service.
    let capacity = needed + 20;
    let cluster = Cluster::builder(EBPF).proxy_args(&["--bpf-map-services".to_owned(), capacity.to_string()]).start();
    assert_eq!(map_gauge(&cluster, THIS_NODE, "svcplane_dataplane_table_capacity", SERVICES), Some(capacity as f64));
    assert_eq!(map_gauge(&cluster, THIS_NODE, "svcplane_dataplane_table_full", SERVICES), Some(0.0));
    let before = map_gauge(&cluster, THIS_NODE, "svcplane_dataplane_table_entries", SERVICES).expect("the gauge");

    cluster.write_file("service-many-ports.yaml", MANY_PORTS_SERVICE);
    let full = eventually(Duration::from_secs(10), || {
        (map_gauge(&cluster, THIS_NODE, "svcplane_dataplane_table_full", SERVICES) == Some(1.0)).then_some(())
    });
    assert!(full.is_some(), "the services map is reported full\n{}", cluster.diagnostics());
    let log = cluster.proxy_log(THIS_NODE);
    assert!(
        log.contains("BPF map svcplane_services is full")
            && log.contains(&format!("{capacity} entries"))
            && log.contains("`svcplane proxy --bpf-map-services`"),
        "the failed sync names the map, its size and the option that raises it\n{log}"
    );
    assert_eq!(
        map_gauge(&cluster, THIS_NODE, "svcplane_dataplane_table_entries", SERVICES),
        Some(before),
        "nothing of the Service that does not fit was written"
    );
    // Everything else still works: pods reach the echo Service.
    let lab = cluster.lab();
    let echo = cluster.service(ECHO_SERVICE).and_then(|s| s.cluster_ip_address(false)).expect("a ClusterIP");
    let pod = lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    for _ in 0..10 {
        lab.tcp_request(&pod, echo, Duration::from_secs(2))
            .unwrap_or_else(|error| panic!("the echo Service while the maps are full: {error}"));
    }

    // Removing the Service that did not fit clears the condition.
    std::fs::remove_file(cluster.manifests_dir().join("service-many-ports.yaml")).expect("removing the manifest");
    let cleared = eventually(Duration::from_secs(10), || {
        (map_gauge(&cluster, THIS_NODE, "svcplane_dataplane_table_full", SERVICES) == Some(0.0)).then_some(())
    });
    assert!(cleared.is_some(), "the condition clears once a sync succeeds\n{}", cluster.diagnostics());
    cluster.teardown();
}

#[test]
fn the_nodes_own_connected_udp_socket_to_an_endpoint_that_went_away_is_closed_and_a_new_one_reaches_a_live_endpoint() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_nodes_own_connected_udp_socket_to_an_endpoint_that_went_away_is_closed_and_a_new_one_reaches_a_live_endpoint",
    ) {
        return;
    }
    let cluster = Cluster::start(EBPF);
    let service = cluster.service(UDP_MOVING_SERVICE).expect("the moving Service");
    let target = service.cluster_ip_address(false).expect("an IPv4 ClusterIP");
    let node = cluster.lab().node(THIS_NODE).namespace_name().to_owned();
    let connect = || {
        cluster
            .lab()
            .run_in(&node, || {
                let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
                socket.connect(target).expect("connect");
                socket.set_read_timeout(Some(Duration::from_millis(300))).expect("a timeout");
                socket
            })
            .expect("the node's namespace")
    };
    let ask = |socket: &std::net::UdpSocket| -> Result<String, std::io::Error> {
        socket.send(b"svcplane-probe\n")?;
        let mut reply = [0u8; 512];
        let n = socket.recv(&mut reply)?;
        Ok(String::from_utf8_lossy(&reply[..n]).split_whitespace().next().unwrap_or_default().to_owned())
    };
    // The node's socket is balanced at connect(): it talks to the endpoint itself.
    let socket = connect();
    let first = eventually(Duration::from_secs(5), || ask(&socket).ok()).expect("an answer before the change").0;
    assert_eq!(first, "node1-pod1", "the Service's only endpoint answers first");
    let mutation = scenarios::manifests::mutation(UDP_MOVING_SERVICE).expect("the change");
    let (file, text) = mutation.change();
    cluster.write_file(&file, &text);
    // Within 2.5 s the socket is closed under the application (as Cilium closes such
    // sockets): it is no longer connected, so a send fails with EDESTADDRREQ and a receive
    // with ECONNABORTED, and the application opens a new one.
    let closed = eventually(Duration::from_millis(2500), || match ask(&socket) {
        Err(error) if matches!(error.raw_os_error(), Some(libc_errno) if libc_errno == 89 || libc_errno == 103) => {
            Some(())
        }
        _ => None,
    });
    assert!(
        closed.is_some(),
        "the socket connected to {first} was not closed 2.5 s after it stopped serving\n{}",
        cluster.proxy_log(THIS_NODE)
    );
    let fresh = connect();
    let now = eventually(Duration::from_secs(2), || ask(&fresh).ok()).expect("an answer on a new socket").0;
    assert_eq!(now, "node2-pod1", "a new socket is balanced to the live endpoint");
    assert!(cluster.proxy_log(THIS_NODE).contains("closed the node's UDP sockets"), "the proxy logged the closing");
    cluster.teardown();
}

// ---------------------------------------------------------------------------------------
// The backend alone: a cold start loads the programs on threads of their own while it
// fills the maps; it must leave exactly what a cold start on one thread leaves, be adopted
// by a later process, and be followed by right partial syncs.

mod cold_start {
    use std::collections::BTreeMap;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};
    use std::path::PathBuf;
    use std::process::Command;

    use svcplane_backend_ebpf::{EbpfBackend, EbpfOptions};
    use svcplane_bpf::{BackendValue, Scope, ServiceKey, ServiceValue};
    use svcplane_core::{
        Change, ClusterState, Dataplane, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig,
        NodePlan, PlanDiff, Protocol, Service, ServicePort,
    };

    const SERVICES: usize = 40;
    const ENDPOINTS: usize = 3;

    /// A network namespace, a cgroup and a bpf root of the test's own, removed on drop.
    struct Sandbox {
        netns: String,
        cgroup: PathBuf,
        bpf_root: PathBuf,
    }

    impl Sandbox {
        fn new(tag: &str) -> Self {
            let netns = format!("svcp-cold-{}-{tag}", std::process::id());
            let status = Command::new("ip").args(["netns", "add", &netns]).status().expect("ip netns add");
            assert!(status.success(), "ip netns add {netns}");
            let cgroup = svcplane_testbed::cgroup::cgroup2_mount().expect("a cgroup2 mount").join(&netns);
            std::fs::create_dir(&cgroup).expect("creating the test's cgroup");
            let bpf_root = std::env::temp_dir().join(format!("{netns}-bpf"));
            Self { netns, cgroup, bpf_root }
        }

        /// The backends array has room for every endpoint plus one changed set: a restart
        /// must adopt the slots already written, not write them all again beside them.
        fn backend(&self, cold_start_on_one_thread: bool) -> EbpfBackend {
            let sizes = svcplane_bpf::MapSizes {
                backends: (SERVICES * ENDPOINTS + ENDPOINTS) as u32,
                ..svcplane_bpf::MapSizes::default()
            };
            EbpfBackend::new(EbpfOptions {
                bpf_root: self.bpf_root.clone(),
                cgroup: Some(self.cgroup.clone()),
                cold_start_on_one_thread,
                sizes,
                ..EbpfOptions::default()
            })
        }

        /// A sync from inside the namespace (the backend reads the node from its thread).
        fn sync(&self, backend: &mut EbpfBackend, plan: &NodePlan, diff: &PlanDiff) -> svcplane_core::SyncReport {
            svcplane_testbed::run_in_namespace(&self.netns, || backend.sync(plan, diff))
                .expect("entering the namespace")
                .expect("the sync")
        }

        /// Every entry of the services map, and the backends array's slots.
        fn maps(&self) -> (BTreeMap<ServiceKey, ServiceValue>, Vec<BackendValue>) {
            let (services, backends) =
                svcplane_bpf::sock_lb::open_pinned_services(&self.bpf_root).expect("opening the pinned maps");
            (services.iter().map(Result::unwrap).collect(), backends.iter().map(Result::unwrap).collect())
        }
    }

    impl Drop for Sandbox {
        fn drop(&mut self) {
            let _ = svcplane_bpf::cleanup(&self.bpf_root);
            let _ = std::fs::remove_dir(&self.cgroup);
            let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
        }
    }

    fn service_ip(s: usize) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(198, 19, 0, s as u8 + 1))
    }

    fn slice(s: usize, first: IpAddr) -> EndpointSlice {
        let service = NamespacedName::new("cold", format!("svc-{s}"));
        let mut addresses: Vec<IpAddr> =
            (0..ENDPOINTS).map(|e| IpAddr::V4(Ipv4Addr::new(198, 18, 128 + e as u8, s as u8 + 1))).collect();
        addresses[0] = first;
        EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("cold", format!("svc-{s}-slice")),
            service,
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: addresses.iter().map(|ip| Endpoint::ready(*ip, Some("node2"))).collect(),
        }
    }

    fn cluster() -> ClusterState {
        let mut state = ClusterState::new();
        for s in 0..SERVICES {
            let name = NamespacedName::new("cold", format!("svc-{s}"));
            let port = ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None };
            state.apply(Change::ServiceUpserted(Service::cluster_ip(name, vec![service_ip(s)], vec![port])));
            state.apply(Change::SliceUpserted(slice(s, IpAddr::V4(Ipv4Addr::new(198, 18, 128, s as u8 + 1)))));
        }
        state
    }

    fn node_config() -> NodeConfig {
        NodeConfig {
            node_name: "node1".into(),
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            ..NodeConfig::default()
        }
    }

    /// The endpoints a pod of the node reaches through Service `s`, as the maps say.
    fn endpoints_of(
        s: usize,
        services: &BTreeMap<ServiceKey, ServiceValue>,
        backends: &[BackendValue],
    ) -> Vec<SocketAddr> {
        let value = pod_frontend(s, services);
        (value.first..value.first + value.count)
            .map(|index| {
                let slot = backends.get(index as usize).unwrap_or_else(|| panic!("slot {index} of Service {s}"));
                assert_ne!(slot.port, 0, "slot {index} of Service {s} is written");
                slot.address()
            })
            .collect()
    }

    /// What a pod of the node finds for Service `s` in the services map.
    fn pod_frontend(s: usize, services: &BTreeMap<ServiceKey, ServiceValue>) -> ServiceValue {
        let key = ServiceKey::new(SocketAddr::new(service_ip(s), 80), svcplane_bpf::maps::PROTO_TCP, Scope::Pod);
        *services.get(&key).unwrap_or_else(|| panic!("Service {s} is in the services map"))
    }

    /// Slots of the backends array that hold an endpoint.
    fn written(backends: &[BackendValue]) -> usize {
        backends.iter().filter(|slot| slot.port != 0).count()
    }

    #[test]
    fn a_cold_start_loading_on_threads_leaves_what_one_thread_leaves_is_adopted_and_partial_syncs_follow_right() {
        if !svcplane_testbed::can_run_real_kernel_tests("ebpf cold start on threads") {
            return;
        }
        let mut state = cluster();
        let mut plan = NodePlan::build(&state, node_config());
        state.take_changes();

        let threaded = Sandbox::new("threads");
        let one_thread = Sandbox::new("one");
        let mut backend = threaded.backend(false);
        assert!(threaded.sync(&mut backend, &plan, &PlanDiff::default()).full, "the first sync is a full one");
        let mut serial = one_thread.backend(true);
        assert!(one_thread.sync(&mut serial, &plan, &PlanDiff::default()).full, "the first sync is a full one");
        drop(serial);
        assert_eq!(svcplane_bpf::sock_lb::missing_pins(&threaded.bpf_root), Vec::<PathBuf>::new(), "every pin");
        let phases: Vec<&str> = backend.last_sync_phases().iter().map(|(name, _)| *name).collect();
        assert!(
            phases.contains(&"loading and attaching the socket programs (own thread)")
                && phases.contains(&"loading the tc program (own thread)"),
            "the programs were loaded on threads of their own: {phases:?}"
        );

        let (services, backends) = threaded.maps();
        assert_eq!((services.clone(), backends.clone()), one_thread.maps(), "the same entries either way");
        assert_eq!(written(&backends), SERVICES * ENDPOINTS, "one slot per endpoint");
        assert_eq!(
            endpoints_of(7, &services, &backends),
            (0..ENDPOINTS)
                .map(|e| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 128 + e as u8, 8)), 8080))
                .collect::<Vec<_>>(),
            "Service 7's endpoints in slot order"
        );

        // A new process adopts the pinned maps and links: its cold start gives fresh ids and
        // keeps every set in the range that already holds its endpoints (no slot written).
        drop(backend);
        let mut backend = threaded.backend(false);
        assert!(threaded.sync(&mut backend, &plan, &PlanDiff::default()).full, "a new process syncs in full");
        let (adopted_services, adopted_backends) = threaded.maps();
        assert_eq!(
            adopted_services.keys().collect::<Vec<_>>(),
            services.keys().collect::<Vec<_>>(),
            "the same frontends"
        );
        assert_eq!(adopted_backends, backends, "no slot written again");
        assert!(
            adopted_services
                .values()
                .zip(services.values())
                .all(|(new, old)| new.backend_set != old.backend_set || new.count == 0),
            "fresh set ids"
        );
        assert!(
            adopted_services
                .values()
                .zip(services.values())
                .all(|(new, old)| (new.first, new.count) == (old.first, old.count)),
            "the same ranges"
        );
        assert_eq!(endpoints_of(7, &adopted_services, &adopted_backends), endpoints_of(7, &services, &backends));

        // A partial sync after the cold start: Service 7's first endpoint moves.
        let moved = IpAddr::V4(Ipv4Addr::new(198, 18, 254, 1));
        state.apply(Change::SliceUpserted(slice(7, moved)));
        let changes = state.take_changes();
        let diff = plan.update(&state, &changes);
        assert!(!threaded.sync(&mut backend, &plan, &diff).full, "a partial sync");
        let (after_services, after_backends) = threaded.maps();
        let endpoints = endpoints_of(7, &after_services, &after_backends);
        assert!(endpoints.contains(&SocketAddr::new(moved, 8080)), "the moved endpoint is in: {endpoints:?}");
        assert!(
            !endpoints.contains(&SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 128, 8)), 8080)),
            "the old one is out: {endpoints:?}"
        );
        assert_eq!(endpoints.len(), ENDPOINTS);
        let (old_range, new_range) = (pod_frontend(7, &adopted_services), pod_frontend(7, &after_services));
        assert!(
            new_range.first >= old_range.first + old_range.count
                || new_range.first + new_range.count <= old_range.first,
            "the changed set was written to a new range, not over the one its frontends named: {old_range:?} -> {new_range:?}"
        );
        assert_eq!(new_range.backend_set, old_range.backend_set, "the set keeps its id (affinity, Maglev)");
        assert!(
            after_services.values().all(|v| v.count == 0 || v.first != old_range.first),
            "no frontend names the old range"
        );
        for s in (0..SERVICES).filter(|s| *s != 7) {
            assert_eq!(pod_frontend(s, &after_services), pod_frontend(s, &adopted_services), "Service {s} untouched");
            assert_eq!(
                endpoints_of(s, &after_services, &after_backends),
                endpoints_of(s, &adopted_services, &adopted_backends),
                "Service {s} untouched"
            );
        }
    }

    #[test]
    fn objects_opened_ahead_of_the_first_plan_are_pinned_empty_and_the_first_sync_fills_them_as_a_cold_start_does() {
        if !svcplane_testbed::can_run_real_kernel_tests("ebpf objects opened ahead") {
            return;
        }
        let mut state = cluster();
        let plan = NodePlan::build(&state, node_config());
        state.take_changes();

        let ahead = Sandbox::new("ahead");
        let mut backend = ahead.backend(false);
        svcplane_testbed::run_in_namespace(&ahead.netns, || backend.open_ahead())
            .expect("entering the namespace")
            .expect("opening ahead");
        // The threads create and pin the maps and attach the socket programs before any plan.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let missing = svcplane_bpf::sock_lb::missing_pins(&ahead.bpf_root);
            if missing.is_empty() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never pinned: {missing:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let (services, backends) = ahead.maps();
        assert!(services.is_empty(), "no frontend is written before the first plan: {services:?}");
        assert_eq!(written(&backends), 0, "no endpoint slot is written before the first plan");

        assert!(ahead.sync(&mut backend, &plan, &PlanDiff::default()).full, "the first sync is a full one");
        let phases: Vec<&str> = backend.last_sync_phases().iter().map(|(name, _)| *name).collect();
        assert!(
            phases.contains(&"loading the tc program (own thread)"),
            "the first sync took over the threads opened ahead: {phases:?}"
        );
        let cold = Sandbox::new("not-ahead");
        let mut reference = cold.backend(false);
        assert!(cold.sync(&mut reference, &plan, &PlanDiff::default()).full);
        assert_eq!(ahead.maps(), cold.maps(), "the same entries as a cold start that opened in its sync");

        // A backend removed while its objects are still being opened leaves nothing behind.
        let removed = Sandbox::new("removed");
        let mut early = removed.backend(false);
        svcplane_testbed::run_in_namespace(&removed.netns, || early.open_ahead())
            .expect("entering the namespace")
            .expect("opening ahead");
        assert!(early.cleanup().expect("the cleanup"), "the objects opened ahead were there to remove");
        assert!(!removed.bpf_root.exists(), "nothing is left under the bpf root");
    }
}

/// A restart whose programs differ from the ones pinned links run moves every link onto the
/// new programs in place, while a client keeps connecting through a ClusterIP.
mod upgrade_in_place {
    use std::io::{Read, Write};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use svcplane_backend_ebpf::{EbpfBackend, EbpfOptions};
    use svcplane_bpf::MapSizes;
    use svcplane_bpf::upgrade::{self, LinkedProgram};
    use svcplane_core::{
        Change, ClusterState, Dataplane, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig,
        NodePlan, PlanDiff, Protocol, Service, ServicePort,
    };
    use svcplane_testbed::cgroup::NodeCgroups;

    const SERVICE: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1)), 80);
    const ENDPOINTS: [Ipv4Addr; 2] = [Ipv4Addr::new(198, 18, 128, 1), Ipv4Addr::new(198, 18, 128, 2)];
    /// The node's interfaces besides loopback (a veth pair inside the namespace), where the
    /// tc program is linked.
    const INTERFACES: [&str; 2] = ["svcp-up0", "svcp-up1"];
    /// Bounds of the client loop, whatever happens.
    const MAX_CONNECTS: usize = 200_000;
    const MAX_LOOP: Duration = Duration::from_secs(90);

    /// A network namespace with both endpoints' addresses, a threaded cgroup and a bpf root
    /// of the test's own, removed on drop.
    struct Node {
        netns: String,
        cgroups: NodeCgroups,
        bpf_root: PathBuf,
    }

    impl Node {
        fn new() -> Self {
            let netns = format!("svcp-upg-{}", std::process::id());
            let ip = |args: &[&str]| {
                let status = Command::new("ip").args(["-n", &netns]).args(args).status().expect("running ip");
                assert!(status.success(), "ip -n {netns} {args:?}");
            };
            let status = Command::new("ip").args(["netns", "add", &netns]).status().expect("ip netns add");
            assert!(status.success(), "ip netns add {netns}");
            let cgroups = NodeCgroups::create(&netns, [1]).expect("a threaded cgroup for the node");
            let node =
                Self { bpf_root: std::env::temp_dir().join(format!("{netns}-bpf")), netns: netns.clone(), cgroups };
            ip(&["link", "set", "lo", "up"]);
            for endpoint in ENDPOINTS {
                ip(&["addr", "add", &format!("{endpoint}/32"), "dev", "lo"]);
            }
            ip(&["link", "add", INTERFACES[0], "type", "veth", "peer", "name", INTERFACES[1]]);
            for interface in INTERFACES {
                ip(&["link", "set", interface, "up"]);
            }
            node
        }

        fn cgroup(&self) -> &Path {
            self.cgroups.path(1).expect("the node's cgroup")
        }

        fn backend(&self, sizes: MapSizes) -> EbpfBackend {
            EbpfBackend::new(EbpfOptions {
                bpf_root: self.bpf_root.clone(),
                cgroup: Some(self.cgroup().to_owned()),
                sizes,
                ..EbpfOptions::default()
            })
        }

        /// A new process's first sync, from inside the namespace: how long it took.
        fn restart(&self, sizes: MapSizes, plan: &NodePlan) -> Duration {
            let mut backend = self.backend(sizes);
            let started = Instant::now();
            let report = svcplane_testbed::run_in_namespace(&self.netns, || backend.sync(plan, &PlanDiff::default()))
                .expect("entering the namespace")
                .expect("the first sync of a new process");
            assert!(report.full, "a new process syncs in full");
            started.elapsed()
        }

        /// What every pinned link runs: the eight socket programs' links, then the tc links.
        fn linked(&self) -> Vec<(String, LinkedProgram)> {
            let links = self.bpf_root.join("links");
            svcplane_bpf::sock_lb::PROGRAMS
                .iter()
                .map(ToString::to_string)
                .chain(INTERFACES.map(|interface| format!("tc-{interface}")))
                .map(|name| {
                    let program = upgrade::linked_program(&links.join(&name))
                        .unwrap_or_else(|error| panic!("the link {name}: {error}"));
                    (name, program)
                })
                .collect()
        }

        fn services_map_id(&self) -> u32 {
            upgrade::pinned_map_id(&self.bpf_root.join(svcplane_bpf::maps::SERVICES_MAP)).expect("the services map")
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            let _ = svcplane_bpf::cleanup(&self.bpf_root);
            let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
            let _ = self.cgroups.remove();
        }
    }

    /// The test's threads (echo server, client), stopped and joined on drop, so that a
    /// failed assertion still leaves the cgroup empty for the node's cleanup.
    struct Threads {
        stop: Arc<AtomicBool>,
        running: Vec<std::thread::JoinHandle<()>>,
    }

    impl Threads {
        fn stop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            for thread in self.running.drain(..) {
                thread.join().expect("a test thread panicked");
            }
        }
    }

    impl Drop for Threads {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            for thread in self.running.drain(..) {
                let _ = thread.join();
            }
        }
    }

    fn plan() -> NodePlan {
        let mut state = ClusterState::new();
        let name = NamespacedName::new("upgrade", "web");
        let port = ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: SERVICE.port(), node_port: None };
        state.apply(Change::ServiceUpserted(Service::cluster_ip(name.clone(), vec![SERVICE.ip()], vec![port])));
        state.apply(Change::SliceUpserted(EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("upgrade", "web-1"),
            service: name,
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: ENDPOINTS.iter().map(|ip| Endpoint::ready(IpAddr::V4(*ip), Some("node1"))).collect(),
        }));
        let config = NodeConfig {
            node_name: "node1".into(),
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            ..NodeConfig::default()
        };
        NodePlan::build(&state, config)
    }

    /// One request through the Service: connected, answered by an endpoint, and the socket
    /// names the Service as its peer.
    fn request() -> Result<(), String> {
        let mut stream =
            TcpStream::connect_timeout(&SERVICE, Duration::from_secs(1)).map_err(|e| format!("connect: {e}"))?;
        let peer = stream.peer_addr().map_err(|e| format!("getpeername: {e}"))?;
        if peer != SERVICE {
            return Err(format!("the peer is {peer}, not the Service"));
        }
        stream.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
        stream.write_all(b"ping\n").map_err(|e| format!("write: {e}"))?;
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(|e| format!("read: {e}"))?;
        if answer.starts_with("upgrade ") { Ok(()) } else { Err(format!("answered {answer:?}")) }
    }

    #[test]
    fn a_restart_with_other_programs_moves_every_pinned_link_onto_them_while_connects_keep_succeeding() {
        if !svcplane_testbed::can_run_real_kernel_tests("ebpf upgrade in place") {
            return;
        }
        let node = Node::new();
        let plan = plan();
        let sizes = MapSizes { services: 4096, backends: 4096, affinity: 1024, reverse: 4096 };
        let server = svcplane_testbed::run_in_namespace(&node.netns, || {
            let addresses: Vec<SocketAddr> =
                ENDPOINTS.iter().map(|ip| SocketAddr::new(IpAddr::V4(*ip), 8080)).collect();
            svcplane_testbed::echo::EchoServer::bind("upgrade", &addresses)
        })
        .expect("entering the namespace")
        .expect("binding the endpoints");
        let stop = Arc::new(AtomicBool::new(false));
        // Declared after the node: dropped (stopped, joined) before it.
        let mut threads = Threads { stop: Arc::clone(&stop), running: Vec::new() };
        threads.running.push({
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                server.serve_until(Some(MAX_LOOP + Duration::from_secs(30)), &stop).expect("serving");
            })
        });

        node.restart(sizes, &plan);
        let first = node.linked();
        assert_eq!(upgrade::recorded_identity(&node.bpf_root), Some(upgrade::identity(sizes)), "this build recorded");

        // A client in the node's cgroup connects through the Service all along.
        let done = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        threads.running.push({
            let (stop, done, failures) = (Arc::clone(&stop), Arc::clone(&done), Arc::clone(&failures));
            let (netns, cgroup) = (node.netns.clone(), node.cgroup().to_owned());
            std::thread::spawn(move || {
                svcplane_testbed::run_in_namespace_within(&netns, Some(&cgroup), || {
                    let started = Instant::now();
                    while !stop.load(Ordering::Relaxed)
                        && done.load(Ordering::Relaxed) < MAX_CONNECTS
                        && started.elapsed() < MAX_LOOP
                    {
                        if let Err(error) = request() {
                            failures.lock().unwrap().push(error);
                        }
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .expect("entering the namespace and cgroup");
            })
        });
        let wait_for_requests = |count: usize| {
            let until = Instant::now() + Duration::from_secs(20);
            let target = done.load(Ordering::Relaxed) + count;
            while done.load(Ordering::Relaxed) < target && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait_for_requests(50);

        // 1. Pins that another build left: the recorded identity differs.
        upgrade::record_identity(&node.bpf_root, upgrade::identity(sizes) ^ 1).expect("recording another identity");
        let services_map = node.services_map_id();
        let before = done.load(Ordering::Relaxed);
        let took = node.restart(sizes, &plan);
        let during = done.load(Ordering::Relaxed) - before;
        let second = node.linked();
        for ((link, old), (_, new)) in first.iter().zip(&second) {
            assert_ne!(old.id, new.id, "{link} runs a program loaded by the new process");
            assert_eq!(old.tag, new.tag, "{link}: the same instructions (the same build underneath)");
        }
        assert_eq!(node.services_map_id(), services_map, "maps of an unchanged layout are kept");
        assert_eq!(upgrade::recorded_identity(&node.bpf_root), Some(upgrade::identity(sizes)), "this build recorded");
        eprintln!("upgrade with the same maps: {took:?}, {during} requests meanwhile");
        wait_for_requests(50);

        // 2. The same build again: the links are adopted as they are.
        node.restart(sizes, &plan);
        let third = node.linked();
        assert_eq!(third, second, "nothing is replaced when the build is the one recorded");
        wait_for_requests(50);

        // 3. Bigger maps: the services map's layout changed, so it is created anew, filled,
        // and the programs (which held the old one) are replaced after that.
        let bigger = MapSizes { services: 8192, ..sizes };
        let frontends = || -> std::collections::BTreeSet<svcplane_bpf::ServiceKey> {
            let (services, _) = svcplane_bpf::sock_lb::open_pinned_services(&node.bpf_root).expect("the pinned maps");
            services.keys().map(Result::unwrap).collect()
        };
        let old_frontends = frontends();
        assert!(!old_frontends.is_empty(), "the Service has frontends");
        let before = done.load(Ordering::Relaxed);
        let took = node.restart(bigger, &plan);
        let during_resize = done.load(Ordering::Relaxed) - before;
        let fourth = node.linked();
        let new_services_map = node.services_map_id();
        assert_ne!(new_services_map, services_map, "the services map was created anew");
        for ((link, old), (_, new)) in third.iter().zip(&fourth) {
            assert_ne!(old.id, new.id, "{link} runs a new program");
            assert!(!new.map_ids.contains(&services_map), "{link} no longer uses the old services map");
            // The programs that look Services up (recvmsg and getpeername only read the
            // socket's own storage).
            if link.contains("connect") || link.contains("sendmsg") || link.starts_with("tc-") {
                assert!(new.map_ids.contains(&new_services_map), "{link} uses the new one: {:?}", new.map_ids);
            }
        }
        assert_eq!(frontends(), old_frontends, "the new map holds every frontend the old one held");
        eprintln!("upgrade with a new services map: {took:?}, {during_resize} requests meanwhile");
        wait_for_requests(50);

        threads.stop();
        let failures = failures.lock().unwrap();
        let total = done.load(Ordering::Relaxed);
        assert!(failures.is_empty(), "{} of {total} requests failed, first: {:?}", failures.len(), failures.first());
        assert!(total >= 200, "the client kept going ({total} requests)");
        assert!(during > 0 && during_resize > 0, "requests ran during both upgrades ({during}, {during_resize})");
    }
}
