//! Scenario rows that need kernel modules the host kernel lacks, run inside the guest
//! kernel (`scripts/in-guest`, see `docs/guest-kernel.md`): the SCTP rows, with a real SCTP
//! client and server, in nftables mode and in iptables mode (legacy and nft), and the whole
//! scenario table in ipvs mode.
//!
//! The guest-side tests are ignored on the host and do nothing outside the guest. One
//! host-side test boots the guest once and re-runs this test binary there with the batch's
//! names; it skips (saying why) where no guest can be booted, and fails instead when `CI`
//! or `SVCPLANE_REQUIRE_GUEST=1` is set. Inside the guest every lab is made of network
//! namespaces the test creates and deletes, as on the host.

// The IPVS benchmark's harness (benches/common), smoke-tested here on a few Services.
#[path = "../benches/common/mod.rs"]
mod bench_common;
mod scenarios;

use std::time::Duration;

use scenarios::backends::{IPTABLES_LEGACY, IPTABLES_NFT, NFTABLES};
use scenarios::cluster::{Backend, Cluster, THIS_NODE};
use scenarios::manifests::ECHO_PORT;
use scenarios::{ALL_ECHO_PODS, NodePortAddresses, Protocol, check_rows};
use svcplane_testbed::guest;

const IPVS: Backend = Backend {
    name: "ipvs",
    proxy_args: &["--mode", "ipvs", "--iptables-backend", "nft"],
    diagnostics: &[
        &["ip", "addr", "show", "dev", "kube-ipvs0"],
        &["cat", "/proc/net/ip_vs"],
        &["iptables-nft-save", "-t", "nat"],
        &["ip6tables-nft-save", "-t", "nat"],
        &["iptables-nft-save", "-t", "filter"],
        &["ip6tables-nft-save", "-t", "filter"],
    ],
    ruleset: &["cat", "/proc/net/ip_vs"],
    not_applicable: ipvs_not_applicable,
    node_cgroups: false,
    relays_from_the_node: false,
};

/// The host-side test that runs the guest-side ones.
const HOST_TEST: &str = "the_guest_kernel_rows_pass_in_one_boot_of_the_guest";

/// The guest-side tests, run in one boot.
const GUEST_TESTS: &[&str] = &[
    "sctp_rows_pass_in_the_guest_in_nftables_mode",
    "sctp_rows_pass_in_the_guest_in_iptables_mode_with_the_legacy_backend",
    "sctp_rows_pass_in_the_guest_in_iptables_mode_with_the_nft_backend",
    "ipvs_mode_passes_every_static_scenario_table_in_the_guest_and_cleanup_removes_it",
    "ipvs_mode_answers_node_ports_only_where_nodeport_addresses_say_in_the_guest",
    "ipvs_mode_keeps_client_ip_affinity_through_persistence_in_the_guest",
    "ipvs_mode_follows_endpoint_changes_and_drains_terminating_endpoints_in_the_guest",
    "the_ipvs_benchmark_harness_programs_changes_reads_back_and_connects_in_every_mode",
];

/// How long the proxies get to program the fixture in the guest: their first full sync
/// takes 10-17 s under emulation (debug build, two proxies on two emulated CPUs).
const PROGRAMMED_IN_GUEST_WITHIN: Duration = Duration::from_secs(60);

/// How long `svcplane cleanup` gets in the guest: it undoes every mode (nftables tables,
/// iptables chains of both backends and families, ipsets, IPVS, BPF pins), about twenty
/// program starts, each 1-3 s under emulation on a loaded machine; 30 s was once too short.
const CLEANUP_IN_GUEST_WITHIN: Duration = Duration::from_secs(180);

/// The whole batch's limit in the guest (boot included): the ipvs tables start five labs.
const GUEST_TIMEOUT: Duration = Duration::from_secs(40 * 60);

#[test]
fn the_guest_kernel_rows_pass_in_one_boot_of_the_guest() {
    if !guest::can_boot_guest(HOST_TEST) {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's own path");
    let run = guest::run_tests_in_guest(&exe, GUEST_TESTS, GUEST_TIMEOUT).expect("running the batch in the guest");
    if let Err(failure) = run.check_tests_passed(GUEST_TESTS) {
        panic!("guest-kernel tests failed:\n{failure}");
    }
}

/// What a node running svcplane has loaded by the time its proxy starts: SCTP and the
/// netfilter modules the nftables mode's rules use. Left to autoload, the first nftables
/// transaction loads them one `modprobe` at a time (the kernel replays the batch after
/// each): 9 s under emulation instead of 0.3 s, beyond the fixture's time to program.
const NODE_MODULES: &[&str] = &[
    "sctp",
    "nf_conntrack_netlink",
    "nft_chain_nat",
    "nft_ct",
    "nft_nat",
    "nft_masq",
    "nft_numgen",
    "nft_fib_ipv4",
    "nft_fib_ipv6",
    "nft_reject_ipv4",
    "nft_reject_ipv6",
];

/// What IPVS mode needs loaded: the kernel does not autoload `ip_vs` for generic netlink;
/// the set types and `-m set` would load on first use, one `modprobe` at a time (about 10 s
/// under emulation, in the proxy's first sync).
const IPVS_MODULES: &[&str] = &[
    "ip_vs",
    "ip_vs_rr",
    "ip_set",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
    "xt_set",
];

/// Loads [`NODE_MODULES`] once per test process.
fn load_node_modules() {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    if let Err(error) = LOADED.get_or_init(|| guest::load_modules(NODE_MODULES)) {
        panic!("loading the node's kernel modules in the guest: {error}");
    }
}

/// The SCTP rows against `backend`: SCTP line servers in every echo pod, real SCTP
/// associations from a pod, the node and an external client.
fn sctp_rows_pass(test: &str, backend: Backend) {
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_node_modules();
    if let Err(reason) = scenarios::net::sctp_supported() {
        panic!("the guest kernel must have SCTP: {reason}");
    }
    let cluster = Cluster::builder(backend)
        .line_servers(Protocol::Sctp, ECHO_PORT, ALL_ECHO_PODS)
        .programmed_within(PROGRAMMED_IN_GUEST_WITHIN)
        .start();
    check_rows(&cluster, scenarios::SCTP);
    cluster.teardown();
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn sctp_rows_pass_in_the_guest_in_nftables_mode() {
    sctp_rows_pass("sctp_rows_pass_in_the_guest_in_nftables_mode", NFTABLES);
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn sctp_rows_pass_in_the_guest_in_iptables_mode_with_the_legacy_backend() {
    sctp_rows_pass("sctp_rows_pass_in_the_guest_in_iptables_mode_with_the_legacy_backend", IPTABLES_LEGACY);
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn sctp_rows_pass_in_the_guest_in_iptables_mode_with_the_nft_backend() {
    sctp_rows_pass("sctp_rows_pass_in_the_guest_in_iptables_mode_with_the_nft_backend", IPTABLES_NFT);
}

/// Why a row cannot apply to IPVS mode (`None`: it runs); the runner prints each row left
/// out with this reason.
///
/// Session affinity that ends after a silence: IPVS persistence keeps a client's template
/// while any connection it controls is still in IPVS's connection table (UDP entries live
/// `--ipvs-udp-timeout`, 300 s by default; a closed TCP connection's TIME_WAIT entry 120 s,
/// which no setting changes), so a client that falls silent keeps its endpoint well beyond
/// the Service's `timeoutSeconds`. Upstream kube-proxy's IPVS mode programs the same
/// persistence and behaves the same. Affinity itself, and its renewal by use, run
/// (`StickyWhileTalking`).
fn ipvs_not_applicable(row: &scenarios::Scenario) -> Option<&'static str> {
    match row.expect {
        scenarios::Outcome::StickyThenFreshAfterIdle { .. } => Some(
            "IPVS keeps a persistence template while connections it controls are in its table (UDP \
             --ipvs-udp-timeout, TCP TIME_WAIT 120 s), so affinity outlives a silence of timeoutSeconds, \
             as in upstream's IPVS mode",
        ),
        _ => None,
    }
}

/// The rows of every static table of the scenario runner (reachability, no endpoints,
/// traffic policy, load balancers, external IPs, health checks, terminating, topology,
/// ignored Services, SCTP, default NodePort addresses).
fn ipvs_rows() -> Vec<scenarios::Scenario> {
    scenarios::STATIC_TABLES.iter().flat_map(|(_, rows)| rows.iter()).copied().collect()
}

/// Loads what a node in ipvs mode has loaded before its proxy starts.
fn load_ipvs_node_modules() {
    load_node_modules();
    if let Err(error) = guest::load_modules(IPVS_MODULES) {
        panic!("loading the IPVS modules in the guest: {error}");
    }
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvs_mode_passes_every_static_scenario_table_in_the_guest_and_cleanup_removes_it() {
    let test = "ipvs_mode_passes_every_static_scenario_table_in_the_guest_and_cleanup_removes_it";
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_ipvs_node_modules();
    let rows = ipvs_rows();
    assert!(rows.iter().any(|row| row.protocol == Protocol::Sctp), "an SCTP row is among them");
    let mut cluster = Cluster::builder(IPVS)
        .line_servers(Protocol::Sctp, ECHO_PORT, ALL_ECHO_PODS)
        .programmed_within(PROGRAMMED_IN_GUEST_WITHIN)
        .start();
    check_rows(&cluster, &rows);
    cleanup_removes_what_ipvs_mode_programmed(&mut cluster);
    cluster.teardown();
}

/// `svcplane cleanup` on a node that ran ipvs mode: no virtual service (by address or by
/// firewall mark), no `kube-ipvs0`, no set and no chain of the mode is left.
fn cleanup_removes_what_ipvs_mode_programmed(cluster: &mut Cluster) {
    let node = cluster.lab().node(THIS_NODE).namespace_name().to_owned();
    let before = cluster.lab().exec_ok(&node, &["ipset", "list", "-n"]).expect("ipset list");
    assert!(before.lines().any(|name| name == "KUBE-CLUSTER-IP"), "ipvs mode made its sets: {before}");
    // The mutating rows run last and put their Services back as they end; the sync of that
    // last change may still be under way (an IPVS sync is many netlink requests, not one
    // transaction: once CI read the table with the address services of an
    // externalTrafficPolicy Local IP rewritten and its firewall-mark services not yet back).
    let read = || cluster.lab().exec_ok(&node, &["cat", "/proc/net/ip_vs"]).expect("reading the IPVS table");
    let marked = scenarios::eventually(Duration::from_secs(60), || {
        let services = read();
        services.lines().any(|line| line.starts_with("FWM")).then_some(())
    });
    assert!(marked.is_some(), "firewall-mark services before cleanup: {}\n{}", read(), cluster.diagnostics());
    cluster.stop_proxy(THIS_NODE);
    let lab = cluster.lab();
    let started = std::time::Instant::now();
    let cleanup = lab
        .exec_with_timeout(&node, &[env!("CARGO_BIN_EXE_svcplane"), "cleanup"], CLEANUP_IN_GUEST_WITHIN)
        .expect("svcplane cleanup");
    assert!(cleanup.status.success(), "svcplane cleanup failed: {}", String::from_utf8_lossy(&cleanup.stderr));
    eprintln!("svcplane cleanup in the guest took {:?}", started.elapsed());
    let services = lab.exec_ok(&node, &["cat", "/proc/net/ip_vs"]).expect("reading the IPVS table");
    let left: Vec<&str> = services
        .lines()
        .filter(|line| ["TCP", "UDP", "SCTP", "FWM"].iter().any(|kind| line.starts_with(kind)))
        .collect();
    assert!(left.is_empty(), "cleanup left virtual services {left:#?} in:\n{services}");
    let links = lab.exec_ok(&node, &["ip", "-o", "link"]).expect("ip link");
    assert!(!links.contains("kube-ipvs0"), "{links}");
    let sets = lab.exec_ok(&node, &["ipset", "list", "-n"]).expect("ipset list");
    assert!(!sets.lines().any(|name| name.starts_with("KUBE-")), "sets left: {sets}");
    for save in ["iptables-nft-save", "ip6tables-nft-save"] {
        let text = lab.exec_ok(&node, &[save]).expect("iptables-save");
        let left: Vec<&str> = text.lines().filter(|line| line.contains("KUBE-")).collect();
        assert!(left.is_empty(), "{save}: cleanup left {left:#?}");
    }
}

/// The two `--nodeport-addresses` configurations (the default one is a static table): the
/// NodePort virtual services exist only on the node addresses the plan admits.
#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvs_mode_answers_node_ports_only_where_nodeport_addresses_say_in_the_guest() {
    let test = "ipvs_mode_answers_node_ports_only_where_nodeport_addresses_say_in_the_guest";
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_ipvs_node_modules();
    for (addresses, rows) in [
        (NodePortAddresses::Primary, scenarios::NODEPORT_ADDRESSES_PRIMARY),
        (NodePortAddresses::SecondaryOnly, scenarios::NODEPORT_ADDRESSES_CIDRS),
    ] {
        let cluster =
            Cluster::builder(IPVS).node_port_addresses(addresses).programmed_within(PROGRAMMED_IN_GUEST_WITHIN).start();
        check_rows(&cluster, rows);
        cluster.teardown();
    }
}

/// ClientIP affinity as IPVS persistence with the Service's timeout.
#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvs_mode_keeps_client_ip_affinity_through_persistence_in_the_guest() {
    let test = "ipvs_mode_keeps_client_ip_affinity_through_persistence_in_the_guest";
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_ipvs_node_modules();
    let cluster = Cluster::builder(IPVS).programmed_within(PROGRAMMED_IN_GUEST_WITHIN).start();
    let left_out = scenarios::AFFINITY.iter().filter(|row| ipvs_not_applicable(row).is_some()).count();
    assert!(left_out < scenarios::AFFINITY.len(), "some affinity row runs in ipvs mode");
    check_rows(&cluster, scenarios::AFFINITY);
    cluster.teardown();
}

/// The endpoint-change rows: UDP flows follow a moved endpoint, open flows to an endpoint
/// that starts terminating go on (its real server drains at weight 0).
#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvs_mode_follows_endpoint_changes_and_drains_terminating_endpoints_in_the_guest() {
    let test = "ipvs_mode_follows_endpoint_changes_and_drains_terminating_endpoints_in_the_guest";
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_ipvs_node_modules();
    let cluster = Cluster::builder(IPVS)
        .line_servers(Protocol::Tcp, scenarios::manifests::CONVERSATION_PORT, &["node1-pod1", "node2-pod2"])
        .programmed_within(PROGRAMMED_IN_GUEST_WITHIN)
        .start();
    check_rows(&cluster, scenarios::ENDPOINT_CHANGES);
    cluster.teardown();
}

/// The harness of `benches/ipvs.rs` (scripts/bench-ipvs) on 10 Services: each of svcplane's
/// modes programs them cold in a fresh lab, takes two endpoint changes, reads them back
/// from the kernel (the harness fails when a Service or a moved endpoint is missing), and
/// connects through the ClusterIP and straight to the pod. The benchmark's own sizes and
/// the API-server part run only with scripts/bench-ipvs.
#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn the_ipvs_benchmark_harness_programs_changes_reads_back_and_connects_in_every_mode() {
    let test = "the_ipvs_benchmark_harness_programs_changes_reads_back_and_connects_in_every_mode";
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_node_modules();
    if let Err(error) = guest::load_modules(bench_common::modes::IPVS_MODULES) {
        panic!("loading the IPVS modules in the guest: {error}");
    }
    let started = std::time::Instant::now();
    for mode in bench_common::modes::Mode::ALL {
        let options = bench_common::modes::Options { services: 10, endpoints: 3, changes: 2, connects: 20 };
        let measured = bench_common::modes::measure(mode, options)
            .unwrap_or_else(|error| panic!("{} mode: {error:#}", mode.name()));
        eprintln!("{measured:?}");
        assert_eq!(measured.changes, 2);
        assert!(measured.cold > Duration::ZERO && measured.change_max >= measured.change_median, "{measured:?}");
        let connect = measured.connect.unwrap_or_else(|| panic!("{} mode: no connects measured", mode.name()));
        assert!(connect.service.1 >= connect.service.0 && connect.direct.1 >= connect.direct.0, "{connect:?}");
    }
    eprintln!("the benchmark harness in every mode took {:?}", started.elapsed());
}
