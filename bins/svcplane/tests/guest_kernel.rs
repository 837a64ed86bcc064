//! Scenario rows that need kernel modules the host kernel lacks, run inside the guest
//! kernel (`scripts/in-guest`, see `docs/guest-kernel.md`): today the SCTP rows, with a real
//! SCTP client and server, in nftables mode and in iptables mode (legacy and nft).
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

use scenarios::cluster::{Backend, Cluster};
use scenarios::manifests::ECHO_PORT;
use scenarios::{ALL_ECHO_PODS, Protocol, check_rows};
use svcplane_testbed::guest;

const NFTABLES: Backend = Backend {
    name: "nftables",
    proxy_args: &["--mode", "nftables"],
    diagnostics: &[&["nft", "list", "ruleset"]],
    ruleset: &["nft", "list", "ruleset"],
    not_applicable: scenarios::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

const IPTABLES_LEGACY: Backend = Backend {
    name: "iptables-legacy",
    proxy_args: &["--mode", "iptables", "--iptables-backend", "legacy"],
    diagnostics: &[&["iptables-legacy-save"], &["ip6tables-legacy-save"]],
    ruleset: &["sh", "-c", "iptables-legacy-save && ip6tables-legacy-save"],
    not_applicable: scenarios::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

const IPTABLES_NFT: Backend = Backend {
    name: "iptables-nft",
    proxy_args: &["--mode", "iptables", "--iptables-backend", "nft"],
    diagnostics: &[&["iptables-nft-save"], &["ip6tables-nft-save"]],
    ruleset: &["sh", "-c", "iptables-nft-save && ip6tables-nft-save"],
    not_applicable: scenarios::cluster::every_row_applies,
    node_cgroups: false,
    relays_from_the_node: false,
};

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
    not_applicable: scenarios::cluster::every_row_applies,
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
    "ipvs_mode_passes_the_static_scenario_tables_in_the_guest_but_the_rows_listed_as_not_yet",
    "the_ipvs_benchmark_harness_programs_changes_reads_back_and_connects_in_every_mode",
];

/// How long the proxies get to program the fixture in the guest: their first full sync
/// takes 10-17 s under emulation (debug build, two proxies on two emulated CPUs).
const PROGRAMMED_IN_GUEST_WITHIN: Duration = Duration::from_secs(60);

/// The whole batch's limit in the guest (boot included).
const GUEST_TIMEOUT: Duration = Duration::from_secs(15 * 60);

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

/// Rows of the scenario table that IPVS mode does not pass yet, with the reason: each needs
/// something docs/backend-ipvs.md lists as not done.
const IPVS_NOT_YET: &[(&str, &str)] = &[
    (
        "pod on this node to an external IP of an externalTrafficPolicy Local Service reaches every endpoint and keeps its own address",
        "one endpoint set per virtual service: IPVS sends every source to the local set",
    ),
    (
        "pod on this node to an externalTrafficPolicy Local load-balancer IP reaches every endpoint and keeps its own address",
        "one endpoint set per virtual service: IPVS sends every source to the local set",
    ),
    (
        "the node itself to an externalTrafficPolicy Local load-balancer IP reaches every endpoint",
        "one endpoint set per virtual service: IPVS sends every source to the local set",
    ),
];

/// The rows IPVS mode runs: every static table of the scenario runner (reachability, no
/// endpoints, traffic policy, load balancers, external IPs, health checks, terminating,
/// topology, ignored Services, SCTP, default NodePort addresses) except [`IPVS_NOT_YET`],
/// whose names and reasons are printed. The endpoint-change, affinity and NodePort-address
/// configuration tables are not run in ipvs mode yet.
fn ipvs_rows() -> Vec<scenarios::Scenario> {
    for (name, reason) in IPVS_NOT_YET {
        eprintln!("not run in ipvs mode: {name}: {reason}");
    }
    let rows: Vec<scenarios::Scenario> = scenarios::STATIC_TABLES
        .iter()
        .flat_map(|(_, rows)| rows.iter())
        .filter(|row| !IPVS_NOT_YET.iter().any(|(name, _)| *name == row.name))
        .copied()
        .collect();
    let known = |name: &str| scenarios::STATIC_TABLES.iter().any(|(_, rows)| rows.iter().any(|row| row.name == name));
    for (name, _) in IPVS_NOT_YET {
        assert!(known(name), "IPVS_NOT_YET names a row the table does not have: {name}");
    }
    rows
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvs_mode_passes_the_static_scenario_tables_in_the_guest_but_the_rows_listed_as_not_yet() {
    let test = "ipvs_mode_passes_the_static_scenario_tables_in_the_guest_but_the_rows_listed_as_not_yet";
    if !guest::guest_only(test, HOST_TEST) || !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    load_node_modules();
    if let Err(error) = guest::load_modules(IPVS_MODULES) {
        panic!("loading the IPVS modules in the guest: {error}");
    }
    let rows = ipvs_rows();
    assert!(rows.iter().any(|row| row.protocol == Protocol::Sctp), "an SCTP row is among them");
    let cluster = Cluster::builder(IPVS)
        .line_servers(Protocol::Sctp, ECHO_PORT, ALL_ECHO_PODS)
        .programmed_within(PROGRAMMED_IN_GUEST_WITHIN)
        .start();
    check_rows(&cluster, &rows);
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
