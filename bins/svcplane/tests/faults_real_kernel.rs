//! Faults under bounded load, in the two-node lab with the real kernel: clients connect
//! continuously through a ClusterIP (from a pod), a NodePort and a load-balancer IP (from
//! outside), over TCP and UDP, while the proxy of the node they go through is killed and
//! restarted. Every request must succeed: the rules stay in the kernel while no proxy
//! runs, and a new proxy replaces them atomically.
//!
//! Each load is bounded in requests and in time and goes only to lab addresses.

mod scenarios;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use scenarios::backends::{EBPF, IPTABLES_LEGACY, NFTABLES};
use scenarios::cluster::{Backend, Cluster, ECHO_SERVICE, POD_ON_OTHER_NODE, POD_ON_THIS_NODE, THIS_NODE};
use scenarios::manifests::{EndpointSpec, LB_SERVICE, SERVICE_PORT, SliceSpec, TERMINATING_SERVICE};
use scenarios::{Family, Protocol, Sender, eventually};
use svcplane_testbed::probe::Protocol as ProbeProtocol;
use svcplane_testbed::{Load, LoadReport, LoadSpec};

/// One load per frontend and protocol, from where that frontend is used.
fn start_loads(cluster: &Cluster) -> Vec<(String, Load)> {
    let lab = cluster.lab();
    let echo = cluster.service(ECHO_SERVICE).expect("the echo Service");
    let lb = cluster.service(LB_SERVICE).expect("the load-balancer Service");
    let pod = lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    let client = lab.client(1).namespace_name().to_owned();
    let node_ip = IpAddr::V4(lab.node(THIS_NODE).ip_v4());
    let lb_ip = lb.load_balancer_ips(Family::V4, false)[0];
    let mut targets: Vec<(String, String, SocketAddr, ProbeProtocol)> = Vec::new();
    // Where the backend does not serve traffic from outside the node (the scenario table
    // says so), the NodePort load comes from a pod of the node instead.
    let outside = scenarios::REACHABILITY
        .iter()
        .filter(|row| row.from == Sender::ExternalClient)
        .all(|row| (cluster.backend().not_applicable)(row).is_none());
    for (protocol, probe) in [(Protocol::Tcp, ProbeProtocol::Tcp), (Protocol::Udp, ProbeProtocol::Udp)] {
        let cluster_ip = echo.cluster_ip_address(false).expect("an IPv4 ClusterIP");
        targets.push((format!("pod -> ClusterIP {cluster_ip}/{protocol}"), pod.clone(), cluster_ip, probe));
        let node_port = SocketAddr::new(node_ip, echo.node_port(protocol).expect("a node port"));
        if outside {
            targets.push((format!("outside -> NodePort {node_port}/{protocol}"), client.clone(), node_port, probe));
            let lb_address = SocketAddr::new(lb_ip, SERVICE_PORT);
            targets.push((format!("outside -> LB IP {lb_address}/{protocol}"), client.clone(), lb_address, probe));
        } else {
            targets.push((format!("pod -> NodePort {node_port}/{protocol}"), pod.clone(), node_port, probe));
        }
    }
    targets
        .into_iter()
        .map(|(label, namespace, target, protocol)| {
            let spec = LoadSpec {
                protocol,
                target,
                pause: Duration::from_millis(5),
                timeout: Duration::from_secs(2),
                max_requests: 5_000,
                max_duration: Duration::from_secs(40),
            };
            (label, lab.load(&namespace, spec))
        })
        .collect()
}

fn finish(loads: Vec<(String, Load)>) -> Vec<(String, LoadReport)> {
    loads.into_iter().map(|(label, load)| (label, load.finish())).collect()
}

fn assert_nothing_failed(cluster: &Cluster, fault: &str, reports: &[(String, LoadReport)]) {
    let mut failed = Vec::new();
    for (label, report) in reports {
        eprintln!("{fault}: {label}: {} sent, {} failed", report.sent, report.failed);
        assert!(report.sent > 20, "{label}: the load ran ({} requests)", report.sent);
        if report.failed > 0 {
            failed.push(format!("{label}: {} of {} failed: {:?}", report.failed, report.sent, report.first_failures));
        }
    }
    assert!(failed.is_empty(), "{fault}:\n{}\n{}", failed.join("\n"), cluster.diagnostics());
}

/// Waits until the (new) proxy of node1 has synced once.
/// How long a restarted proxy may take to finish its first full sync: an iptables full sync
/// of the fixture took 6 s while this binary's other fault tests (100k-request soaks) loaded
/// the machine. The loads keep running meanwhile; what counts is that none of them fails.
const RESTARTED_SYNC_WITHIN: Duration = Duration::from_secs(30);

fn wait_for_sync(cluster: &Cluster) {
    let synced = eventually(RESTARTED_SYNC_WITHIN, || cluster.proxy_log(THIS_NODE).contains("synced").then_some(()));
    assert!(synced.is_some(), "the restarted proxy synced\n{}", cluster.diagnostics());
}

fn proxy_restarts_lose_no_request(backend: Backend) {
    let mut cluster = Cluster::start(backend);
    let loads = start_loads(&cluster);
    std::thread::sleep(Duration::from_secs(1));
    cluster.restart_proxy(THIS_NODE, false);
    wait_for_sync(&cluster);
    std::thread::sleep(Duration::from_secs(1));
    cluster.restart_proxy(THIS_NODE, true);
    wait_for_sync(&cluster);
    std::thread::sleep(Duration::from_secs(1));
    let reports = finish(loads);
    // This test found one refused NodePort connection in about one run of three while a
    // restarted proxy's first full sync deleted and re-added the table; full syncs now keep
    // the table and its base chains (docs/reliability.md), and the count is zero again.
    assert_nothing_failed(&cluster, "SIGKILL then SIGTERM restarts of node1's proxy", &reports);
    assert!(cluster.proxy(THIS_NODE).exit_status().is_none(), "the last proxy still runs");
    cluster.teardown();
}

#[test]
fn the_nftables_proxy_killed_and_restarted_under_load_loses_no_request() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_nftables_proxy_killed_and_restarted_under_load_loses_no_request",
    ) {
        return;
    }
    proxy_restarts_lose_no_request(NFTABLES);
}

#[test]
fn the_ebpf_proxy_killed_and_restarted_under_load_loses_no_request() {
    if !svcplane_testbed::can_run_real_kernel_tests("the_ebpf_proxy_killed_and_restarted_under_load_loses_no_request") {
        return;
    }
    proxy_restarts_lose_no_request(EBPF);
}

#[test]
fn the_iptables_proxy_killed_and_restarted_under_load_loses_no_request() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_iptables_proxy_killed_and_restarted_under_load_loses_no_request",
    ) {
        return;
    }
    proxy_restarts_lose_no_request(IPTABLES_LEGACY);
}

/// Every endpoint of a Service replaced one at a time, each leaving gracefully (serving
/// while terminating, then gone), node1-pod1 and node2-pod1 giving way to node1-pod2 and
/// node2-pod2.
const ROLLING_REPLACEMENT: [&[EndpointSpec]; 5] = [
    &[EndpointSpec::ready("node1-pod1"), EndpointSpec::ready("node2-pod1")],
    &[
        EndpointSpec::serving_terminating("node1-pod1"),
        EndpointSpec::ready("node1-pod2"),
        EndpointSpec::ready("node2-pod1"),
    ],
    &[EndpointSpec::ready("node1-pod2"), EndpointSpec::ready("node2-pod1")],
    &[
        EndpointSpec::ready("node1-pod2"),
        EndpointSpec::serving_terminating("node2-pod1"),
        EndpointSpec::ready("node2-pod2"),
    ],
    &[EndpointSpec::ready("node1-pod2"), EndpointSpec::ready("node2-pod2")],
];

/// Endpoint sets a Service moves through, one per second, forever changing who serves.
const ROTATION: [&[EndpointSpec]; 4] = [
    &[EndpointSpec::ready("node1-pod1"), EndpointSpec::ready("node2-pod1")],
    &[EndpointSpec::ready("node2-pod1"), EndpointSpec::ready("node1-pod2")],
    &[EndpointSpec::ready("node1-pod2"), EndpointSpec::ready("node2-pod2")],
    &[EndpointSpec::ready("node2-pod2"), EndpointSpec::ready("node1-pod1")],
];

/// Loads through the ClusterIP of the churned Service from a pod on each node, TCP and UDP.
fn churn_loads(cluster: &Cluster, connects_per_load: u64, max_duration: Duration) -> Vec<(String, Load)> {
    let lab = cluster.lab();
    let target = cluster.service(TERMINATING_SERVICE).unwrap().cluster_ip_address(false).unwrap();
    let mut loads = Vec::new();
    for pod in [POD_ON_THIS_NODE, POD_ON_OTHER_NODE] {
        for protocol in [ProbeProtocol::Tcp, ProbeProtocol::Udp] {
            let spec = LoadSpec {
                protocol,
                target,
                pause: Duration::ZERO,
                timeout: Duration::from_secs(2),
                max_requests: connects_per_load,
                max_duration,
            };
            loads.push((
                format!("{pod} -> ClusterIP {target}/{protocol}"),
                lab.load(lab.pod(pod).namespace_name(), spec),
            ));
        }
    }
    loads
}

/// Rewrites the churned Service's slices through `sets` every `period` until every load
/// has finished (or `max_duration`), then reports.
fn churn(
    cluster: &Cluster,
    sets: &[&'static [EndpointSpec]],
    repeat: bool,
    loads: Vec<(String, Load)>,
) -> Vec<(String, LoadReport)> {
    let write = |endpoints: &'static [EndpointSpec]| {
        let slice = SliceSpec { service: TERMINATING_SERVICE, endpoints };
        cluster.write_file(&slice.file(), &slice.manifest());
    };
    write(sets[0]);
    std::thread::sleep(Duration::from_secs(1));
    let mut step = 1;
    while step < sets.len() || (repeat && !loads.iter().all(|(_, load)| load.is_finished())) {
        write(sets[step % sets.len()]);
        step += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    finish(loads)
}

fn a_rolling_replacement_loses_no_request(backend: Backend) {
    let cluster = Cluster::start(backend);
    let loads = churn_loads(&cluster, 100_000, Duration::from_secs(60));
    let reports = churn(&cluster, &ROLLING_REPLACEMENT, false, loads);
    assert_nothing_failed(&cluster, "a rolling replacement of every endpoint", &reports);
    cluster.teardown();
}

fn endpoints_changing_every_second_lose_none_of_100k_connects(backend: Backend) {
    let cluster = Cluster::start(backend);
    // 4 loads of 25k requests: 50k TCP connects and 50k UDP exchanges, bounded at 3 minutes.
    let loads = churn_loads(&cluster, 25_000, Duration::from_secs(180));
    let reports = churn(&cluster, &ROTATION, true, loads);
    assert_nothing_failed(&cluster, "endpoints changing every second", &reports);
    let sent: u64 = reports.iter().map(|(_, report)| report.sent).sum();
    assert_eq!(sent, 100_000, "every load sent its share within the time bound");
    cluster.teardown();
}

#[test]
fn a_rolling_replacement_of_every_endpoint_loses_no_request_in_nftables_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_rolling_replacement_of_every_endpoint_loses_no_request_in_nftables_mode",
    ) {
        return;
    }
    a_rolling_replacement_loses_no_request(NFTABLES);
}

#[test]
fn a_rolling_replacement_of_every_endpoint_loses_no_request_in_iptables_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_rolling_replacement_of_every_endpoint_loses_no_request_in_iptables_mode",
    ) {
        return;
    }
    a_rolling_replacement_loses_no_request(IPTABLES_LEGACY);
}

#[test]
fn endpoints_changing_every_second_lose_none_of_100k_requests_in_nftables_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "endpoints_changing_every_second_lose_none_of_100k_requests_in_nftables_mode",
    ) {
        return;
    }
    endpoints_changing_every_second_lose_none_of_100k_connects(NFTABLES);
}

#[test]
fn endpoints_changing_every_second_lose_none_of_100k_requests_in_iptables_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "endpoints_changing_every_second_lose_none_of_100k_requests_in_iptables_mode",
    ) {
        return;
    }
    endpoints_changing_every_second_lose_none_of_100k_connects(IPTABLES_LEGACY);
}

#[test]
fn a_rolling_replacement_of_every_endpoint_loses_no_request_in_ebpf_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_rolling_replacement_of_every_endpoint_loses_no_request_in_ebpf_mode",
    ) {
        return;
    }
    a_rolling_replacement_loses_no_request(EBPF);
}

#[test]
fn endpoints_changing_every_second_lose_none_of_100k_requests_in_ebpf_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "endpoints_changing_every_second_lose_none_of_100k_requests_in_ebpf_mode",
    ) {
        return;
    }
    endpoints_changing_every_second_lose_none_of_100k_connects(EBPF);
}

/// What node1's proxy programmed, without the counters the loads move: `nft -s list
/// ruleset`, or `iptables-save` without its dated comment lines and chain counters.
fn stateless_ruleset(cluster: &Cluster) -> String {
    let lab = cluster.lab();
    let command: &[&str] = match cluster.backend().name {
        "nftables" => &["nft", "-s", "list", "ruleset"],
        _ => cluster.backend().ruleset,
    };
    let text = lab
        .exec_ok(lab.node(THIS_NODE).namespace_name(), command)
        .unwrap_or_else(|error| panic!("listing node1's ruleset: {error}"));
    // Chain lines carry packet counters (`:INPUT ACCEPT [2080:208424]`): left out.
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| if line.starts_with(':') { line.rsplit_once(" [").map_or(line, |(chain, _)| chain) } else { line })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sync_failures(cluster: &Cluster, mode: &str) -> f64 {
    cluster.proxy_metric(THIS_NODE, &format!("svcplane_sync_failures_total{{mode=\"{mode}\"}}")).unwrap_or(0.0)
}

/// Which echo pods answer `requests` TCP requests from the pod on node1 to the echo
/// Service's ClusterIP.
fn answering_pods(cluster: &Cluster, requests: usize) -> std::collections::BTreeSet<String> {
    let lab = cluster.lab();
    let target = cluster.service(ECHO_SERVICE).and_then(|echo| echo.cluster_ip_address(false)).expect("a ClusterIP");
    let namespace = lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    (0..requests)
        .filter_map(|_| lab.tcp_request(&namespace, target, Duration::from_secs(2)).ok())
        .map(|reply| reply.server_name)
        .collect()
}

/// Injects `faults` (one per transaction) into node1's proxy (mode `mode`), makes an
/// endpoint change (the echo pod `pod` turns not ready, or ready again) and checks what
/// the sync loop does: with `rules_kept`, the kernel still holds the previous rules while
/// the faults last; each failure is counted once, retries back off (1 s, then 2 s), and
/// the next success brings the rules to the new state.
fn fault_then_converge(cluster: &Cluster, mode: &str, faults: &[&str], pod: &str, ready: bool, rules_kept: bool) {
    let failures_before = sync_failures(cluster, mode);
    let ruleset_before = stateless_ruleset(cluster);
    let log_before = cluster.proxy_log(THIS_NODE).len();
    cluster.queue_faults(THIS_NODE, faults);
    cluster.set_pod_ready(pod, ready);
    let failed = eventually(Duration::from_secs(10), || (sync_failures(cluster, mode) > failures_before).then_some(()));
    assert!(
        failed.is_some(),
        "{faults:?}: the injected fault failed a sync (faults still queued: {}; failures {failures_before} -> {})\n{}",
        cluster.queued_faults(THIS_NODE),
        sync_failures(cluster, mode),
        cluster.proxy_log(THIS_NODE)
    );
    if rules_kept {
        // The first failure was just counted; the retry after it comes a second later.
        assert_eq!(
            stateless_ruleset(cluster),
            ruleset_before,
            "{faults:?}: after the failed transaction node1 holds exactly the previous rules"
        );
    }
    let done = eventually(Duration::from_secs(15), || (cluster.queued_faults(THIS_NODE) == 0).then_some(()));
    assert!(done.is_some(), "{faults:?}: the proxy retried until every queued fault was taken");
    // A sync succeeded after the last failure (in iptables mode a refused restore of one
    // table can follow others of the same sync that applied, so traffic alone does not
    // show that the sync as a whole went through).
    let succeeded = eventually(Duration::from_secs(15), || {
        let log = cluster.proxy_log(THIS_NODE);
        let log = &log[log_before.min(log.len())..];
        let last_failure = log.rfind("sync failed")?;
        log[last_failure..].contains(" synced ").then_some(())
    });
    assert!(succeeded.is_some(), "{faults:?}: a sync succeeded after the faults\n{}", cluster.proxy_log(THIS_NODE));
    // Converged: the change is in the kernel, through the retry that succeeded.
    let converged = eventually(Duration::from_secs(10), || {
        let answering = answering_pods(cluster, 30);
        (answering.contains(pod) == ready).then_some(())
    });
    assert!(
        converged.is_some(),
        "{faults:?}: after the retries node1 sends {pod} {} connections\n{}",
        if ready { "new" } else { "no new" },
        cluster.diagnostics()
    );
    let failures = sync_failures(cluster, mode) - failures_before;
    assert_eq!(failures, faults.len() as f64, "{faults:?}: each injected fault failed exactly one sync");
    let log = &cluster.proxy_log(THIS_NODE)[log_before..];
    let retries: Vec<&str> =
        log.lines().filter_map(|line| line.split("retrying in ").nth(1)?.split(':').next()).collect();
    let expected: Vec<&str> = ["1s", "2s", "4s"][..faults.len()].to_vec();
    assert_eq!(retries, expected, "{faults:?}: retries back off, doubling from 1 s\n{log}");
    assert!(stateless_ruleset(cluster) != ruleset_before, "{faults:?}: the rules changed once the retry succeeded");
}

#[test]
fn kernel_transaction_failures_keep_the_rules_whole_back_off_and_converge_in_nftables_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "kernel_transaction_failures_keep_the_rules_whole_back_off_and_converge_in_nftables_mode",
    ) {
        return;
    }
    let cluster = Cluster::builder(NFTABLES).faults().start();
    let loads = start_loads(&cluster);
    let pod = scenarios::OTHER_NODE_ECHO_PODS[0];
    // The kernel refuses two transactions in a row: nothing of either applies.
    fault_then_converge(&cluster, "nftables", &["refused", "refused"], pod, false, true);
    // Replacing the table would unhook its nat chains for an instant (a new UDP flow then
    // kept no DNAT and the NodePort refused it): a refusal over a missing object is retried
    // in place.
    assert!(!cluster.proxy_log(THIS_NODE).contains("replacing svcplane's tables"), "{}", cluster.proxy_log(THIS_NODE));
    // The netlink socket is closed under the proxy: it opens a new one.
    fault_then_converge(&cluster, "nftables", &["socket-closed"], pod, true, true);
    // The kernel applied the transaction but its answer was lost: the retry, a full sync,
    // rewrites what is there and the proxy carries on.
    fault_then_converge(&cluster, "nftables", &["answers-lost"], pod, false, false);
    let reports = finish(loads);
    assert_nothing_failed(&cluster, "injected nftables transaction failures", &reports);
    cluster.teardown();
}

#[test]
fn refused_restores_keep_the_rules_whole_back_off_and_converge_in_iptables_mode() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "refused_restores_keep_the_rules_whole_back_off_and_converge_in_iptables_mode",
    ) {
        return;
    }
    let cluster = Cluster::builder(IPTABLES_LEGACY).faults().start();
    let loads = start_loads(&cluster);
    let pod = scenarios::OTHER_NODE_ECHO_PODS[0];
    // iptables-restore refuses the table twice in a row: nothing of either applies.
    fault_then_converge(&cluster, "iptables", &["refused", "refused"], pod, false, true);
    fault_then_converge(&cluster, "iptables", &["refused"], pod, true, true);
    let reports = finish(loads);
    assert_nothing_failed(&cluster, "injected iptables-restore failures", &reports);
    cluster.teardown();
}

#[test]
fn after_nftables_mode_replaces_its_tables_udp_flows_that_bypassed_the_dnat_are_removed_and_translated_ones_kept() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "after_nftables_mode_replaces_its_tables_udp_flows_that_bypassed_the_dnat_are_removed_and_translated_ones_kept",
    ) {
        return;
    }
    // Replacing a table unhooks and rehooks its nat chains within the commit: a UDP flow
    // arriving then is not translated, and its conntrack entry keeps every later packet of
    // that client port off the rules (docs/reliability.md). After a replacement the proxy
    // removes, on every UDP frontend, the entries whose replies do not come from a serving
    // endpoint. Such an entry is planted here; a translated flow is made for real.
    const TRANSLATED_PORT: u16 = 40_100;
    const BYPASSING_PORT: &str = "40200";
    let cluster = Cluster::builder(NFTABLES).faults().start();
    let lab = cluster.lab();
    let node = lab.node(THIS_NODE).namespace_name().to_owned();
    let pod = scenarios::OTHER_NODE_ECHO_PODS[0];
    let cluster_ip =
        cluster.service(ECHO_SERVICE).and_then(|echo| echo.cluster_ip_address(false)).expect("a ClusterIP");
    let (address, port) = (cluster_ip.ip().to_string(), cluster_ip.port().to_string());
    // The pod whose readiness the faults come with is not ready to start with (its
    // Service's flows are cleaned for that now, before anything is planted).
    cluster.set_pod_ready(pod, false);
    let gone = eventually(Duration::from_secs(10), || (!answering_pods(&cluster, 20).contains(pod)).then_some(()));
    assert!(gone.is_some(), "{pod} stopped getting connections\n{}", cluster.diagnostics());
    std::thread::sleep(Duration::from_secs(2));

    // The translated flow's entry must outlast the retries' back-off (UDP entries time out
    // after 30 s by default; this is the node's own namespace).
    lab.exec_ok(&node, &["sysctl", "-qw", "net.netfilter.nf_conntrack_udp_timeout=300"]).expect("the UDP timeout");
    let client = lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    let source = Some(scenarios::net::unspecified(cluster_ip, TRANSLATED_PORT));
    let reply = scenarios::net::request(lab, &client, Protocol::Udp, cluster_ip, source, Duration::from_secs(2))
        .unwrap_or_else(|error| panic!("a UDP request through {cluster_ip}: {error:?}\n{}", cluster.diagnostics()));
    let conntrack = |args: &[&str]| {
        let output = lab.exec(&node, &[&["conntrack"], args].concat()).expect("conntrack in the node");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    conntrack(&[
        "-I",
        "-p",
        "udp",
        "-s",
        "198.18.129.250",
        "-d",
        &address,
        "--sport",
        BYPASSING_PORT,
        "--dport",
        &port,
        "--timeout",
        "600",
    ]);
    let entries = |source_port: &str| {
        conntrack(&["-L", "-p", "udp", "--orig-port-src", source_port])
            .lines()
            .filter(|line| line.contains(&format!("dst={address} ")))
            .count()
    };
    assert_eq!(entries(&TRANSLATED_PORT.to_string()), 1, "the translated flow's entry (to {})", reply.server_name);
    assert_eq!(entries(BYPASSING_PORT), 1, "the planted entry without translation");

    // Two refused full syncs in a row after a refused change: the third full sync replaces
    // the tables. The change only adds an endpoint, which by itself cleans no flow.
    cluster.queue_faults(THIS_NODE, &["refused", "refused", "refused"]);
    cluster.set_pod_ready(pod, true);
    let replaced = eventually(Duration::from_secs(20), || {
        let log = cluster.proxy_log(THIS_NODE);
        let replacing = log.find("replacing svcplane's tables")?;
        log[replacing..].contains(" synced ").then_some(())
    });
    assert!(replaced.is_some(), "the proxy replaced its tables and synced\n{}", cluster.proxy_log(THIS_NODE));
    let cleaned = eventually(Duration::from_secs(10), || (entries(BYPASSING_PORT) == 0).then_some(()));
    assert!(
        cleaned.is_some(),
        "the entry that bypassed the DNAT was removed after the replacement\n{}\n{}",
        conntrack(&["-L", "-p", "udp"]),
        cluster.proxy_log(THIS_NODE)
    );
    assert_eq!(entries(&TRANSLATED_PORT.to_string()), 1, "the flow translated to a serving endpoint stays");
    let again = scenarios::net::request(lab, &client, Protocol::Udp, cluster_ip, source, Duration::from_secs(2))
        .unwrap_or_else(|error| panic!("the open flow after the replacement: {error:?}\n{}", cluster.diagnostics()));
    assert_eq!(again.server_name, reply.server_name, "the open flow stays with its endpoint");
    cluster.teardown();
}
