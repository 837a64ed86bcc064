//! Real-kernel scenarios for `svcplane proxy --mode nftables`: real packets through real
//! nftables rules in a namespace lab (needs root; see `docs/lab.md`).
//!
//! Each test builds its own two-node lab with its own proxies, so tests run in parallel;
//! the shared scenario table lives in `scenarios/` and also runs against the in-memory
//! fake kernel (`nftables_fake_kernel.rs`).

mod scenarios;

use scenarios::backends::NFTABLES;
use scenarios::cluster::{Backend, Cluster};
use scenarios::manifests::ECHO_PORT;
use scenarios::{ALL_ECHO_PODS, Protocol, check_rows};

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

/// Nftables mode with the Services spread over four tables per family, the shape a large
/// cluster gets (one table per ~1000 service ports), forced on the small fixture.
const NFTABLES_IN_FOUR_TABLES: Backend =
    Backend { name: "nft4", proxy_args: &["--mode", "nftables", "--nftables-tables", "4"], ..NFTABLES };

#[test]
fn every_static_row_passes_with_the_services_spread_over_four_tables_per_family() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "every_static_row_passes_with_the_services_spread_over_four_tables_per_family",
    ) {
        return;
    }
    let cluster = Cluster::start(NFTABLES_IN_FOUR_TABLES);
    let lab = cluster.lab();
    let node = lab.node(scenarios::manifests::THIS_NODE).namespace_name();
    let tables = lab.exec_ok(node, &["nft", "list", "tables"]).expect("nft list tables");
    for table in ["ip svcplane", "ip svcplane-1", "ip svcplane-2", "ip svcplane-3", "ip6 svcplane-3"] {
        assert!(tables.lines().any(|line| line.trim() == format!("table {table}")), "no {table} in:\n{tables}");
    }
    // SCTP needs a kernel module this host lacks; the guest runs those rows.
    let rows: Vec<scenarios::Scenario> = scenarios::STATIC_TABLES
        .iter()
        .filter(|(name, _)| *name != "sctp")
        .flat_map(|(_, rows)| rows.iter().copied())
        .collect();
    check_rows(&cluster, &rows);
    cluster.teardown();
}

#[test]
fn endpoint_changes_land_in_the_right_table_when_services_are_spread_over_four() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "endpoint_changes_land_in_the_right_table_when_services_are_spread_over_four",
    ) {
        return;
    }
    scenarios::common::check_endpoint_changes(NFTABLES_IN_FOUR_TABLES);
}

#[test]
fn the_per_endpoint_counters_are_read_from_every_table() {
    if !svcplane_testbed::can_run_real_kernel_tests("the_per_endpoint_counters_are_read_from_every_table") {
        return;
    }
    let cluster = Cluster::start(NFTABLES_IN_FOUR_TABLES);
    scenarios::real::check_connection_counters(&cluster);
    cluster.teardown();
}

#[test]
fn svcplane_cleanup_removes_every_one_of_the_four_tables() {
    if !svcplane_testbed::can_run_real_kernel_tests("svcplane_cleanup_removes_every_one_of_the_four_tables") {
        return;
    }
    scenarios::common::svcplane_cleanup_removes_the_svcplane_nftables_tables(NFTABLES_IN_FOUR_TABLES);
}

#[test]
fn a_restarted_proxy_leaves_tables_that_hold_its_plan_untouched_and_then_follows_endpoint_changes() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_restarted_proxy_leaves_tables_that_hold_its_plan_untouched_and_then_follows_endpoint_changes",
    ) {
        return;
    }
    let mut cluster = Cluster::builder(NFTABLES_IN_FOUR_TABLES)
        .line_servers(Protocol::Tcp, scenarios::manifests::CONVERSATION_PORT, &["node1-pod1", "node2-pod2"])
        .start();
    // With handles (`-a`): a rewritten rule gets a new handle even when its text is the same.
    let listing = |cluster: &Cluster| {
        let lab = cluster.lab();
        let node = lab.node(scenarios::manifests::THIS_NODE).namespace_name();
        lab.exec_ok(node, &["nft", "-a", "list", "ruleset"]).expect("nft -a list ruleset")
    };
    let before = listing(&cluster);
    cluster.restart_proxy(scenarios::manifests::THIS_NODE, false);
    let synced = scenarios::eventually(std::time::Duration::from_secs(30), || {
        cluster.proxy_log(scenarios::manifests::THIS_NODE).contains("synced").then_some(())
    });
    assert!(synced.is_some(), "the restarted proxy synced\n{}", cluster.diagnostics());
    let log = cluster.proxy_log(scenarios::manifests::THIS_NODE);
    assert!(log.contains("were left as they are"), "the restart kept the tables:\n{log}");
    assert_eq!(listing(&cluster), before, "the restart rewrote rules");
    check_rows(&cluster, scenarios::ENDPOINT_CHANGES);
    cluster.teardown();
}

#[test]
fn svcplane_cleanup_finds_and_removes_the_tables_without_the_nft_command() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "svcplane_cleanup_finds_and_removes_the_tables_without_the_nft_command",
    ) {
        return;
    }
    // The `nft` command lists tables by fetching the whole ruleset, which at 10k Services
    // outlasted the callers' patience; cleanup reads table names over netlink instead, so
    // it works with no `nft` on PATH at all.
    let lab = svcplane_testbed::Lab::builder().nodes(1).build().expect("a lab");
    let node = lab.node(1).namespace_name().to_owned();
    for table in ["ip svcplane", "ip svcplane-3", "ip6 svcplane", "ip other"] {
        let (family, name) = table.split_once(' ').unwrap();
        lab.exec_ok(&node, &["nft", "add", "table", family, name]).expect("nft add table");
    }
    let output = lab
        .exec(&node, &["env", "PATH=/nonexistent", env!("CARGO_BIN_EXE_svcplane"), "cleanup"])
        .expect("svcplane cleanup ran");
    let tables = lab.exec_ok(&node, &["nft", "list", "tables"]).expect("nft list tables");
    assert!(
        !tables.contains("svcplane"),
        "svcplane's tables are gone:\n{tables}\ncleanup said: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(tables.contains("table ip other"), "another table stays:\n{tables}");
}
