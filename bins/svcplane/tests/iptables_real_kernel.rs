//! Real-kernel scenarios for `svcplane proxy --mode iptables`, once with
//! `--iptables-backend legacy` and once with `--iptables-backend nft`: real packets through
//! real iptables rules in a namespace lab (needs root; see `docs/lab.md`). Nothing
//! here runs iptables outside the lab's namespaces.
//!
//! Each test builds its own two-node lab with its own proxies, so tests run in parallel;
//! the shared scenario table lives in `scenarios/` and also runs against the in-memory
//! iptables fake (`iptables_fake_kernel.rs`). Beyond the table: the node's tables read
//! exactly as `svcplane render --mode iptables` prints them, a flush behind svcplane's back
//! is repaired, and other software's rules survive svcplane and its cleanup.

mod scenarios;

use std::net::Ipv4Addr;
use std::time::Duration;

use scenarios::backends::{IPTABLES_LEGACY as LEGACY, IPTABLES_NFT as NFT};
use scenarios::cluster::{Backend, Cluster, ECHO_SERVICE, POD_ON_THIS_NODE, ServiceSpec, THIS_NODE};
use scenarios::manifests::{self, CONVERSATION_PORT, ECHO_PORT};
use scenarios::{Family, NodePortAddresses, Protocol, check_rows, eventually};

fn check_table(backend: Backend, rows: &[scenarios::Scenario]) {
    let cluster = Cluster::start(backend);
    check_rows(&cluster, rows);
    cluster.teardown();
}

fn check_table_with(backend: Backend, addresses: NodePortAddresses, rows: &[scenarios::Scenario]) {
    let cluster = Cluster::builder(backend).node_port_addresses(addresses).start();
    check_rows(&cluster, rows);
    cluster.teardown();
}

/// `iptables-<variant>` program names of a backend.
fn program(backend: Backend, family: Family, tool: &str) -> String {
    let variant = backend.name.trim_start_matches("iptables-");
    let stem = if family == Family::V6 { "ip6tables" } else { "iptables" };
    if tool.is_empty() { format!("{stem}-{variant}") } else { format!("{stem}-{variant}-{tool}") }
}

/// The IPv4 or IPv6 section of `svcplane render --mode iptables` output.
fn render_section(render: &str, family: Family) -> String {
    let v6_at = render.find("# IPv6").expect("render prints an IPv6 section");
    let section = if family == Family::V6 { &render[v6_at..] } else { &render[..v6_at] };
    // The health-check comments `render` appends are no iptables rules.
    section.lines().filter(|l| !l.starts_with("# health-check")).collect::<Vec<_>>().join("\n")
}

fn the_node_reads_exactly_as_render_prints(backend: Backend) {
    let cluster = Cluster::start(backend);
    let lab = cluster.lab();
    let node = lab.node(THIS_NODE).namespace_name().to_owned();
    let manifests_dir = cluster.manifests_dir().to_string_lossy().into_owned();
    let [v4, v6] = [Family::V4, Family::V6].map(|f| manifests::node_ip(THIS_NODE, f).to_string());
    let args = [
        env!("CARGO_BIN_EXE_svcplane"),
        "render",
        "--mode",
        "iptables",
        "--manifests",
        &manifests_dir,
        "--node-name",
        &manifests::node_name(THIS_NODE),
        "--node-ip",
        &v4,
        "--node-ip",
        &v6,
        "--cluster-cidr",
        manifests::CLUSTER_CIDR_V4,
        "--cluster-cidr",
        manifests::CLUSTER_CIDR_V6,
        "--service-cidr",
        manifests::SERVICE_CIDR_V4,
        "--service-cidr",
        manifests::SERVICE_CIDR_V6,
    ];
    let render = lab.exec_ok(&node, &args).expect("svcplane render");
    for family in [Family::V4, Family::V6] {
        let saved = lab.exec_ok(&node, &[program(backend, family, "save")]).expect("iptables-save");
        let saved = svcplane_iptables::canonical(&saved).expect("iptables-save output parses");
        let rendered = svcplane_iptables::canonical(&render_section(&render, family)).expect("render output parses");
        if saved != rendered {
            let diff: Vec<String> = saved
                .lines()
                .filter(|l| !rendered.contains(l))
                .map(|l| format!("kernel only: {l}"))
                .chain(rendered.lines().filter(|l| !saved.contains(l)).map(|l| format!("render only: {l}")))
                .collect();
            panic!("{} {family}: the node's tables differ from `svcplane render`:\n{}", backend.name, diff.join("\n"));
        }
    }
    cluster.teardown();
}

fn a_flush_behind_svcplanes_back_is_repaired(backend: Backend) {
    // Found within 4 s (nat canary); a full sync takes well under a second here.
    const WITHIN: Duration = Duration::from_secs(5);
    let cluster = Cluster::start(backend);
    let lab = cluster.lab();
    let node = lab.node(THIS_NODE).namespace_name().to_owned();
    let target = cluster.service(ECHO_SERVICE).unwrap().cluster_ip_address(false).unwrap();
    let restore = program(backend, Family::V4, "restore");
    // What a careless firewall script does: flush and delete every chain of filter and nat,
    // in one step (as separate `-F` and `-X` commands, the proxy may put rules back in
    // between, and `-X` then fails on a referenced chain).
    let script = format!("printf '*filter\\nCOMMIT\\n*nat\\nCOMMIT\\n' | {restore}");
    lab.exec_ok(&node, &["sh", "-c", script.as_str()]).unwrap_or_else(|e| panic!("{restore} of empty tables: {e}"));
    assert!(lab.tcp_request(&node, target, Duration::from_millis(300)).is_err(), "the flush broke the ClusterIP");
    let repaired = eventually(WITHIN, || lab.tcp_request(&node, target, Duration::from_millis(300)).ok());
    let Some((reply, took)) = repaired else {
        panic!("{}: the ClusterIP did not answer again within {WITHIN:?}\n{}", backend.name, cluster.diagnostics());
    };
    eprintln!("repaired after {took:?}, answered by {}", reply.server_name);
    let log = cluster.proxy_log(THIS_NODE);
    assert!(log.contains("changed behind its back"), "the proxy says why it resynced:\n{log}");
    let repairs = cluster.proxy_metric(THIS_NODE, "svcplane_drift_repairs_total{mode=\"iptables\"}");
    assert!(repairs >= Some(1.0), "the repair is counted on /metrics: {repairs:?}");
    for table in ["nat", "filter"] {
        let rules = cluster.proxy_metric(
            THIS_NODE,
            &format!("kubeproxy_sync_proxy_rules_iptables_total{{ip_family=\"IPv4\",table=\"{table}\"}}"),
        );
        assert!(rules > Some(0.0), "the {table} table's rules are counted: {rules:?}");
    }
    cluster.teardown();
}

fn other_rules_survive_svcplane_and_its_cleanup(backend: Backend) {
    let mut cluster = Cluster::start(backend);
    let node = cluster.lab().node(THIS_NODE).namespace_name().to_owned();
    let iptables = program(backend, Family::V4, "");
    let save = program(backend, Family::V4, "save");
    let foreign: [&[&str]; 5] = [
        &["-t", "nat", "-N", "OPERATOR"],
        &["-t", "nat", "-A", "OPERATOR", "-p", "tcp", "--dport", "2222", "-j", "RETURN"],
        &["-t", "nat", "-A", "PREROUTING", "-j", "OPERATOR"],
        &["-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "2222", "-j", "ACCEPT"],
        &["-t", "nat", "-A", "OPERATOR", "-p", "tcp", "--dport", "2223", "-j", "KUBE-MARK-MASQ"],
    ];
    for args in foreign {
        let mut command = vec![iptables.as_str()];
        command.extend(args);
        cluster.lab().exec_ok(&node, &command).unwrap_or_else(|e| panic!("{command:?}: {e}"));
    }
    let foreign_lines = |cluster: &Cluster| -> Vec<String> {
        let text = cluster.lab().exec_ok(&node, &[save.as_str()]).expect("iptables-save");
        text.lines()
            .filter(|l| l.contains("OPERATOR") || l.contains("2222") || l.contains("2223"))
            .map(str::to_owned)
            .collect()
    };
    let before = foreign_lines(&cluster);
    assert_eq!(before.len(), 5, "{before:?}");
    // A partial sync (a new Service) and a restart (full sync) later, they are untouched.
    cluster.add_service(ServiceSpec::cluster_ip("late", Ipv4Addr::new(198, 19, 0, 70)));
    let target = "198.19.0.70:80".parse().unwrap();
    let namespace = cluster.lab().pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    let answered = eventually(Duration::from_secs(3), || {
        cluster.lab().tcp_request(&namespace, target, Duration::from_millis(200)).ok()
    });
    assert!(answered.is_some(), "the new Service answers\n{}", cluster.diagnostics());
    assert_eq!(foreign_lines(&cluster), before, "after a partial sync");
    cluster.stop_proxy(THIS_NODE);
    let lab = cluster.lab();
    lab.exec_ok(&node, &[env!("CARGO_BIN_EXE_svcplane"), "cleanup"]).expect("svcplane cleanup");
    assert_eq!(foreign_lines(&cluster), before, "after cleanup");
    for family in [Family::V4, Family::V6] {
        let text = lab.exec_ok(&node, &[program(backend, family, "save")]).expect("iptables-save");
        let leftovers: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("KUBE-") && !l.contains("OPERATOR") && *l != ":KUBE-MARK-MASQ - [0:0]")
            .filter(|l| !l.starts_with("-A KUBE-MARK-MASQ"))
            .collect();
        assert!(leftovers.is_empty(), "{family}: svcplane left {leftovers:#?}");
        if family == Family::V4 {
            assert!(text.contains(":KUBE-MARK-MASQ"), "the operator's rule still jumps to KUBE-MARK-MASQ, so it stays");
        }
    }
    cluster.teardown();
}

/// The same tests for each variant: `legacy::…` and `nft::…`.
macro_rules! variant_tests {
    ($variant:ident, $backend:expr) => {
        mod $variant {
            use super::*;

            #[test]
            fn pods_the_node_and_an_external_client_reach_a_service_through_its_cluster_ip_and_node_port() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "pods_the_node_and_an_external_client_reach_a_service_through_its_cluster_ip_and_node_port",
                ) {
                    return;
                }
                check_table($backend, scenarios::REACHABILITY);
            }

            #[test]
            fn a_service_without_endpoints_is_refused_at_once_from_a_pod_the_node_and_outside_in_both_families() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "a_service_without_endpoints_is_refused_at_once_from_a_pod_the_node_and_outside_in_both_families",
                ) {
                    return;
                }
                check_table($backend, scenarios::NO_ENDPOINTS);
            }

            #[test]
            fn local_traffic_policies_keep_traffic_on_the_node_or_drop_it() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "local_traffic_policies_keep_traffic_on_the_node_or_drop_it",
                ) {
                    return;
                }
                check_table($backend, scenarios::TRAFFIC_POLICY);
            }

            #[test]
            fn load_balancer_ips_are_served_like_node_ports_within_their_source_ranges_unless_proxied() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "load_balancer_ips_are_served_like_node_ports_within_their_source_ranges_unless_proxied",
                ) {
                    return;
                }
                check_table($backend, scenarios::LOAD_BALANCER);
            }

            #[test]
            fn external_ips_are_served_like_load_balancer_ips() {
                if !svcplane_testbed::can_run_real_kernel_tests("external_ips_are_served_like_load_balancer_ips") {
                    return;
                }
                check_table($backend, scenarios::EXTERNAL_IPS);
            }

            #[test]
            fn health_check_node_ports_answer_with_the_local_endpoint_count() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "health_check_node_ports_answer_with_the_local_endpoint_count",
                ) {
                    return;
                }
                check_table($backend, scenarios::HEALTH_CHECKS);
            }

            #[test]
            fn terminating_endpoints_are_used_only_when_none_is_ready() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "terminating_endpoints_are_used_only_when_none_is_ready",
                ) {
                    return;
                }
                check_table($backend, scenarios::TERMINATING);
            }

            #[test]
            fn topology_keeps_traffic_close_with_upstreams_fallbacks() {
                if !svcplane_testbed::can_run_real_kernel_tests("topology_keeps_traffic_close_with_upstreams_fallbacks")
                {
                    return;
                }
                check_table($backend, scenarios::TOPOLOGY);
            }

            #[test]
            fn headless_external_name_and_other_proxies_services_are_not_programmed() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "headless_external_name_and_other_proxies_services_are_not_programmed",
                ) {
                    return;
                }
                check_table($backend, scenarios::IGNORED);
            }

            #[test]
            fn sctp_services_work_where_the_kernel_has_sctp() {
                if !svcplane_testbed::can_run_real_kernel_tests("sctp_services_work_where_the_kernel_has_sctp") {
                    return;
                }
                if let Err(reason) = scenarios::net::sctp_supported() {
                    for row in scenarios::SCTP.iter().flat_map(scenarios::Scenario::each_family) {
                        eprintln!("SKIPPED on this kernel ({reason}): {}", row.label());
                    }
                    return;
                }
                let pods: &'static [&'static str] = scenarios::ALL_ECHO_PODS;
                let cluster = Cluster::builder($backend).line_servers(Protocol::Sctp, ECHO_PORT, pods).start();
                check_rows(&cluster, scenarios::SCTP);
                cluster.teardown();
            }

            #[test]
            fn node_ports_answer_on_every_node_address_but_loopback_by_default() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "node_ports_answer_on_every_node_address_but_loopback_by_default",
                ) {
                    return;
                }
                check_table($backend, scenarios::NODEPORT_ADDRESSES_DEFAULT);
            }

            #[test]
            fn node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary",
                ) {
                    return;
                }
                check_table_with($backend, NodePortAddresses::Primary, scenarios::NODEPORT_ADDRESSES_PRIMARY);
            }

            #[test]
            fn node_ports_answer_only_inside_nodeport_addresses_cidrs() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "node_ports_answer_only_inside_nodeport_addresses_cidrs",
                ) {
                    return;
                }
                check_table_with($backend, NodePortAddresses::SecondaryOnly, scenarios::NODEPORT_ADDRESSES_CIDRS);
            }

            #[test]
            fn client_ip_affinity_sticks_until_the_timeout() {
                if !svcplane_testbed::can_run_real_kernel_tests("client_ip_affinity_sticks_until_the_timeout") {
                    return;
                }
                check_table($backend, scenarios::AFFINITY);
            }

            #[test]
            fn endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints",
                ) {
                    return;
                }
                let cluster = Cluster::builder($backend)
                    .line_servers(Protocol::Tcp, CONVERSATION_PORT, &["node1-pod1", "node2-pod2"])
                    .start();
                check_rows(&cluster, scenarios::ENDPOINT_CHANGES);
                cluster.teardown();
            }

            #[test]
            fn two_hundred_requests_to_a_four_endpoint_service_reach_every_endpoint_evenly() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "two_hundred_requests_to_a_four_endpoint_service_reach_every_endpoint_evenly",
                ) {
                    return;
                }
                scenarios::common::requests_reach_every_endpoint_evenly($backend);
            }

            #[test]
            fn a_pod_that_turns_not_ready_stops_receiving_traffic_within_five_seconds_and_returns_when_ready() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "a_pod_that_turns_not_ready_stops_receiving_traffic_within_five_seconds_and_returns_when_ready",
                ) {
                    return;
                }
                scenarios::common::a_pod_turning_not_ready_stops_receiving_traffic_and_returns($backend);
            }

            #[test]
            fn the_nodes_tables_read_exactly_as_svcplane_render_prints_them() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "the_nodes_tables_read_exactly_as_svcplane_render_prints_them",
                ) {
                    return;
                }
                the_node_reads_exactly_as_render_prints($backend);
            }

            #[test]
            fn a_flush_of_the_filter_and_nat_tables_behind_svcplanes_back_is_repaired_within_seconds() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "a_flush_of_the_filter_and_nat_tables_behind_svcplanes_back_is_repaired_within_seconds",
                ) {
                    return;
                }
                a_flush_behind_svcplanes_back_is_repaired($backend);
            }

            #[test]
            fn other_softwares_rules_survive_svcplanes_syncs_and_its_cleanup() {
                if !svcplane_testbed::can_run_real_kernel_tests(
                    "other_softwares_rules_survive_svcplanes_syncs_and_its_cleanup",
                ) {
                    return;
                }
                other_rules_survive_svcplane_and_its_cleanup($backend);
            }
        }
    };
}

variant_tests!(legacy, LEGACY);
variant_tests!(nft, NFT);

#[test]
fn the_kernels_per_endpoint_counters_grow_by_exactly_the_connections_each_endpoint_answered_in_both_variants() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_kernels_per_endpoint_counters_grow_by_exactly_the_connections_each_endpoint_answered_in_both_variants",
    ) {
        return;
    }
    for backend in [LEGACY, NFT] {
        let cluster = Cluster::start(backend);
        scenarios::real::check_connection_counters(&cluster);
        cluster.teardown();
    }
}
