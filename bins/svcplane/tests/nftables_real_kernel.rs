//! Real-kernel scenarios for `svcplane proxy --mode nftables`: real packets through real
//! nftables rules in a namespace lab (needs root; see `docs/lab.md`).
//!
//! Each test builds its own two-node lab with its own proxies, so tests run in parallel;
//! the shared scenario table lives in `scenarios/` and also runs against the in-memory
//! fake kernel (`nftables_fake_kernel.rs`).

mod scenarios;

use scenarios::cluster::{Backend, Cluster};
use scenarios::manifests::{CONVERSATION_PORT, ECHO_PORT};
use scenarios::{ALL_ECHO_PODS, NodePortAddresses, Protocol, check_rows};

const NFTABLES: Backend = Backend {
    name: "nftables",
    proxy_args: &["--mode", "nftables"],
    diagnostics: &[&["nft", "list", "ruleset"]],
    ruleset: &["nft", "list", "ruleset"],
    not_applicable: scenarios::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

fn check_table(rows: &[scenarios::Scenario]) {
    let cluster = Cluster::start(NFTABLES);
    check_rows(&cluster, rows);
    cluster.teardown();
}

real_kernel_test!(
    pods_the_node_and_an_external_client_reach_a_service_through_its_cluster_ip_and_node_port,
    check_table(scenarios::REACHABILITY)
);

real_kernel_test!(
    a_service_without_endpoints_is_refused_at_once_from_a_pod_the_node_and_outside_in_both_families,
    check_table(scenarios::NO_ENDPOINTS)
);

real_kernel_test!(local_traffic_policies_keep_traffic_on_the_node_or_drop_it, check_table(scenarios::TRAFFIC_POLICY));

real_kernel_test!(
    load_balancer_ips_are_served_like_node_ports_within_their_source_ranges_unless_proxied,
    check_table(scenarios::LOAD_BALANCER)
);

real_kernel_test!(external_ips_are_served_like_load_balancer_ips, check_table(scenarios::EXTERNAL_IPS));

real_kernel_test!(health_check_node_ports_answer_with_the_local_endpoint_count, check_table(scenarios::HEALTH_CHECKS));

real_kernel_test!(terminating_endpoints_are_used_only_when_none_is_ready, check_table(scenarios::TERMINATING));

real_kernel_test!(topology_keeps_traffic_close_with_upstreams_fallbacks, check_table(scenarios::TOPOLOGY));

real_kernel_test!(
    headless_external_name_and_other_proxies_services_are_not_programmed,
    check_table(scenarios::IGNORED)
);

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
    let pods: &'static [&'static str] = ALL_ECHO_PODS;
    let cluster = Cluster::builder(NFTABLES).line_servers(Protocol::Sctp, ECHO_PORT, pods).start();
    check_rows(&cluster, scenarios::SCTP);
    cluster.teardown();
}

real_kernel_test!(
    node_ports_answer_on_every_node_address_but_loopback_by_default,
    check_table(scenarios::NODEPORT_ADDRESSES_DEFAULT)
);

#[test]
fn node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary",
    ) {
        return;
    }
    let cluster = Cluster::builder(NFTABLES).node_port_addresses(NodePortAddresses::Primary).start();
    check_rows(&cluster, scenarios::NODEPORT_ADDRESSES_PRIMARY);
    cluster.teardown();
}

#[test]
fn node_ports_answer_only_inside_nodeport_addresses_cidrs() {
    if !svcplane_testbed::can_run_real_kernel_tests("node_ports_answer_only_inside_nodeport_addresses_cidrs") {
        return;
    }
    let cluster = Cluster::builder(NFTABLES).node_port_addresses(NodePortAddresses::SecondaryOnly).start();
    check_rows(&cluster, scenarios::NODEPORT_ADDRESSES_CIDRS);
    cluster.teardown();
}

real_kernel_test!(client_ip_affinity_sticks_until_the_timeout, check_table(scenarios::AFFINITY));

#[test]
fn endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints",
    ) {
        return;
    }
    let cluster = Cluster::builder(NFTABLES)
        .line_servers(Protocol::Tcp, CONVERSATION_PORT, &["node1-pod1", "node2-pod2"])
        .start();
    check_rows(&cluster, scenarios::ENDPOINT_CHANGES);
    cluster.teardown();
}

real_kernel_test!(
    two_hundred_requests_to_a_four_endpoint_service_reach_every_endpoint_evenly,
    scenarios::common::requests_reach_every_endpoint_evenly(NFTABLES)
);

real_kernel_test!(
    a_pod_that_turns_not_ready_stops_receiving_traffic_within_five_seconds_and_returns_when_ready,
    scenarios::common::a_pod_turning_not_ready_stops_receiving_traffic_and_returns(NFTABLES)
);

real_kernel_test!(
    a_broken_service_does_not_keep_its_neighbour_in_the_same_file_from_being_programmed,
    scenarios::common::a_broken_service_does_not_keep_its_neighbour_from_being_programmed(NFTABLES)
);

real_kernel_test!(
    a_service_added_to_the_manifests_is_programmed_within_two_seconds_without_a_restart,
    scenarios::common::a_service_added_to_the_manifests_is_programmed_without_a_restart(NFTABLES)
);

real_kernel_test!(
    svcplane_cleanup_removes_the_svcplane_tables_from_the_node,
    scenarios::common::svcplane_cleanup_removes_the_svcplane_nftables_tables(NFTABLES)
);

real_kernel_test!(
    a_svcplane_table_deleted_behind_its_back_is_put_back_within_five_seconds,
    scenarios::common::a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
        NFTABLES,
        "nftables",
        &[&["nft", "delete", "table", "ip", "svcplane"]],
    )
);

real_kernel_test!(
    a_flushed_ruleset_is_put_back_within_five_seconds,
    scenarios::common::a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
        NFTABLES,
        "nftables",
        &[&["nft", "flush", "ruleset"]],
    )
);

real_kernel_test!(
    a_flushed_svcplane_table_is_put_back_within_five_seconds,
    scenarios::common::a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
        NFTABLES,
        "nftables",
        &[&["nft", "flush", "table", "ip", "svcplane"]],
    )
);

#[test]
fn the_kernels_per_endpoint_counters_grow_by_exactly_the_connections_each_endpoint_answered() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_kernels_per_endpoint_counters_grow_by_exactly_the_connections_each_endpoint_answered",
    ) {
        return;
    }
    let cluster = Cluster::start(NFTABLES);
    scenarios::real::check_connection_counters(&cluster);
    cluster.teardown();
}
