//! Real-kernel scenarios for `svcplane proxy --mode nftables`: real packets through real
//! nftables rules in a namespace lab (needs root; see `docs/lab.md`).
//!
//! Each test builds its own two-node lab with its own proxies, so tests run in parallel;
//! the shared scenario table lives in `scenarios/` and also runs against the in-memory
//! fake kernel (`nftables_fake_kernel.rs`).

mod scenarios;

use scenarios::cluster::{Backend, Cluster};
use scenarios::manifests::ECHO_PORT;
use scenarios::{ALL_ECHO_PODS, Protocol, check_rows};

const NFTABLES: Backend = Backend {
    name: "nftables",
    proxy_args: &["--mode", "nftables"],
    diagnostics: &[&["nft", "list", "ruleset"]],
    ruleset: &["nft", "list", "ruleset"],
    not_applicable: scenarios::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

scenario_table_tests!(NFTABLES);
nftables_table_tests!(NFTABLES, "nftables");

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
