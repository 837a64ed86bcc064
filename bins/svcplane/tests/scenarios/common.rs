//! Checks beside the scenario table that more than one mode runs, written once: each takes
//! the backend (and what differs between modes) and builds its own cluster. A mode's test
//! file names the test and calls the body.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::cluster::{Backend, Cluster, ECHO_SERVICE, POD_ON_THIS_NODE, ServiceSpec, THIS_NODE};
use super::manifests::CONVERSATION_PORT;
use super::{ALL_ECHO_PODS, NodePortAddresses, Protocol, Scenario, check_rows, eventually};

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Rows of the table in a cluster of their own.
pub fn check_table(backend: Backend, rows: &[Scenario]) {
    let cluster = Cluster::start(backend);
    check_rows(&cluster, rows);
    cluster.teardown();
}

/// Rows of the table with the proxies' NodePorts on `addresses`.
pub fn check_table_with_node_port_addresses(backend: Backend, addresses: NodePortAddresses, rows: &[Scenario]) {
    let cluster = Cluster::builder(backend).node_port_addresses(addresses).start();
    check_rows(&cluster, rows);
    cluster.teardown();
}

/// The endpoint-change rows, with the line servers their held connections talk to.
pub fn check_endpoint_changes(backend: Backend) {
    let cluster =
        Cluster::builder(backend).line_servers(Protocol::Tcp, CONVERSATION_PORT, &["node1-pod1", "node2-pod2"]).start();
    check_rows(&cluster, super::ENDPOINT_CHANGES);
    cluster.teardown();
}

/// Counts which pod answered each of `requests` TCP requests to the echo ClusterIP from the
/// client pod on node1. Any failed request fails the test.
pub fn answers_from_pod_on_this_node(cluster: &Cluster, requests: usize) -> BTreeMap<String, usize> {
    let lab = cluster.lab();
    let target = cluster.service(ECHO_SERVICE).unwrap().cluster_ip_address(false).unwrap();
    let namespace = lab.pod(POD_ON_THIS_NODE).namespace_name();
    let mut answers = BTreeMap::new();
    for sent in 0..requests {
        let reply = lab
            .tcp_request(namespace, target, PROBE_TIMEOUT)
            .unwrap_or_else(|error| panic!("request {} of {requests} to {target}: {error}", sent + 1));
        *answers.entry(reply.server_name).or_insert(0) += 1;
    }
    answers
}

/// 200 requests to the four-endpoint echo Service reach every endpoint evenly.
pub fn requests_reach_every_endpoint_evenly(backend: Backend) {
    let cluster = Cluster::start(backend);
    let answers = answers_from_pod_on_this_node(&cluster, 200);
    // Binomial(200, 1/4): 20 and 90 are 4.9 and 6.5 standard deviations from the mean of
    // 50, so this never flakes yet catches a broken cascade (e.g. 1/2, 1/4, 1/8, 1/8).
    let (low, high) = (20, 90);
    let names: Vec<&str> = answers.keys().map(String::as_str).collect();
    assert_eq!(names, ALL_ECHO_PODS, "every endpoint and nothing else answers: {answers:?}");
    for (pod, count) in &answers {
        assert!((low..=high).contains(count), "{pod} answered {count} of 200 (allowed {low}..={high}): {answers:?}");
    }
    cluster.teardown();
}

/// A pod turning not ready stops receiving traffic within 5 s and gets it again once ready.
pub fn a_pod_turning_not_ready_stops_receiving_traffic_and_returns(backend: Backend) {
    const POD: &str = "node1-pod2";
    const WITHIN: Duration = Duration::from_secs(5);
    // A batch without the pod has odds of 0.75^40 (1e-5) while it is still an endpoint.
    const BATCH: usize = 40;
    let cluster = Cluster::start(backend);

    cluster.set_pod_ready(POD, false);
    let gone = eventually(WITHIN, || {
        let answers = answers_from_pod_on_this_node(&cluster, BATCH);
        (!answers.contains_key(POD)).then_some(answers)
    });
    let Some((_, took)) = gone else {
        panic!("{POD} still answered {WITHIN:?} after turning not-Ready\n{}", cluster.diagnostics());
    };
    eprintln!("{POD} stopped receiving traffic {took:?} after turning not-Ready");
    // Stays out, while the three others keep answering.
    let answers = answers_from_pod_on_this_node(&cluster, BATCH);
    let names: Vec<&str> = answers.keys().map(String::as_str).collect();
    assert_eq!(names, ["node1-pod1", "node2-pod1", "node2-pod2"], "after {POD} turned not-Ready");

    cluster.set_pod_ready(POD, true);
    let back = eventually(WITHIN, || answers_from_pod_on_this_node(&cluster, 10).get(POD).copied());
    let Some((_, took)) = back else {
        panic!("{POD} did not answer again {WITHIN:?} after turning Ready\n{}", cluster.diagnostics());
    };
    eprintln!("{POD} answered again {took:?} after turning Ready");
    cluster.teardown();
}

/// A Service with a bad port beside a good one in the same file: the good one is
/// programmed, and the log names the file, the object and the field of the bad one.
pub fn a_broken_service_does_not_keep_its_neighbour_from_being_programmed(backend: Backend) {
    let sibling = ServiceSpec::cluster_ip("sibling", Ipv4Addr::new(198, 19, 0, 61));
    let broken = "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\n  namespace: default\nspec:\n  \
                  clusterIP: \"198.19.0.60\"\n  selector:\n    app: echo\n  ports:\n    - name: tcp\n      \
                  protocol: TCP\n      port: 70000\n      targetPort: 8080\n";
    let text = format!("{broken}---\n{}", sibling.manifest());
    let cluster = Cluster::builder(backend).manifest("broken-and-sibling.yaml", &text).start();
    // The fixture waited for the first sync, so the sibling must answer now.
    let lab = cluster.lab();
    let target = sibling.cluster_ip_address(false).unwrap();
    let reply = lab
        .tcp_request(lab.pod(POD_ON_THIS_NODE).namespace_name(), target, PROBE_TIMEOUT)
        .unwrap_or_else(|error| panic!("the sibling of a broken Service {target}: {error}\n{}", cluster.diagnostics()));
    assert!(ALL_ECHO_PODS.contains(&reply.server_name.as_str()), "answered by {reply:?}");

    let log = cluster.proxy_log(THIS_NODE);
    let line = log.lines().find(|line| line.contains("Service default/broken"));
    let Some(line) = line else {
        panic!("the proxy's stderr does not name `Service default/broken`:\n{log}");
    };
    eprintln!("the proxy reported: {line}");
    for needle in ["broken-and-sibling.yaml", "spec.ports[0].port", "70000"] {
        assert!(line.contains(needle), "the proxy's report lacks {needle:?}: {line}");
    }
    cluster.teardown();
}

/// A Service written into the manifests directory answers within 2 s, same proxy process.
pub fn a_service_added_to_the_manifests_is_programmed_without_a_restart(backend: Backend) {
    // The watcher polls every 200 ms; 2 s leaves room for a loaded machine.
    const WITHIN: Duration = Duration::from_secs(2);
    let mut cluster = Cluster::start(backend);
    let late = ServiceSpec::cluster_ip("late", Ipv4Addr::new(198, 19, 0, 70));
    let target = late.cluster_ip_address(false).unwrap();
    let namespace = cluster.lab().pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    // Before: nothing programmed for it, so nobody answers.
    assert!(cluster.lab().tcp_request(&namespace, target, Duration::from_millis(300)).is_err());

    cluster.add_service(late);
    let answered =
        eventually(WITHIN, || cluster.lab().tcp_request(&namespace, target, Duration::from_millis(200)).ok());
    let Some((reply, took)) = answered else {
        panic!("the new Service {target} did not answer within {WITHIN:?}\n{}", cluster.diagnostics());
    };
    eprintln!("the new Service answered after {took:?}, by {}", reply.server_name);
    assert!(ALL_ECHO_PODS.contains(&reply.server_name.as_str()), "answered by {reply:?}");
    assert!(cluster.proxy(THIS_NODE).exit_status().is_none(), "the proxy is still the same process");
    cluster.teardown();
}

/// For modes whose rules are svcplane's own nftables tables: with the proxy stopped, the
/// tables stay until `svcplane cleanup` removes them, and then the ClusterIP leads nowhere.
pub fn svcplane_cleanup_removes_the_svcplane_nftables_tables(backend: Backend) {
    let mut cluster = Cluster::start(backend);
    // Stopped first, as an operator would: the rules stay behind until cleanup.
    cluster.stop_proxy(THIS_NODE);
    let lab = cluster.lab();
    let node = lab.node(THIS_NODE).namespace_name();
    let tables = lab.exec_ok(node, &["nft", "list", "tables"]).expect("nft list tables");
    assert!(
        tables.contains("table ip svcplane") && tables.contains("table ip6 svcplane"),
        "before cleanup, both svcplane tables exist:\n{tables}"
    );

    lab.exec_ok(node, &[env!("CARGO_BIN_EXE_svcplane"), "cleanup"]).expect("svcplane cleanup");
    let tables = lab.exec_ok(node, &["nft", "list", "tables"]).expect("nft list tables");
    assert!(!tables.contains("svcplane"), "after cleanup no svcplane table is left:\n{tables}");
    let target = cluster.service(ECHO_SERVICE).unwrap().cluster_ip_address(false).unwrap();
    let probe = lab.tcp_request(node, target, Duration::from_millis(500));
    assert!(probe.is_err(), "after cleanup the ClusterIP still answered: {probe:?}");
    cluster.teardown();
}

/// What a firewall reload does behind svcplane's back (`damage`, commands run in node1),
/// then the proof that the ClusterIP answers again within 5 s, the log says what was found
/// and `/metrics` counts the repair under `mode`.
pub fn a_ruleset_change_behind_svcplanes_back_is_repaired_within_five_seconds(
    backend: Backend,
    mode: &str,
    damage: &[&[&str]],
) {
    const WITHIN: Duration = Duration::from_secs(5);
    let cluster = Cluster::start(backend);
    let lab = cluster.lab();
    let node = lab.node(THIS_NODE).namespace_name().to_owned();
    let target = cluster.service(ECHO_SERVICE).unwrap().cluster_ip_address(false).unwrap();
    for command in damage {
        lab.exec_ok(&node, command).unwrap_or_else(|e| panic!("{command:?}: {e}"));
    }
    // Whether a probe right after the damage fails depends on when the proxy's next drift
    // check comes (every second): it may already have repaired it. The repair is what
    // counts: logged and counted below.
    let repaired = eventually(WITHIN, || lab.tcp_request(&node, target, Duration::from_millis(300)).ok());
    let Some((reply, took)) = repaired else {
        panic!("the ClusterIP did not answer again within {WITHIN:?}\n{}", cluster.diagnostics());
    };
    eprintln!("{damage:?}: answering after {took:?}, by {}", reply.server_name);
    let found = eventually(WITHIN, || cluster.proxy_log(THIS_NODE).contains("behind svcplane's back").then_some(()));
    assert!(found.is_some(), "the proxy says what it found:\n{}", cluster.proxy_log(THIS_NODE));
    let repairs = cluster.proxy_metric(THIS_NODE, &format!("svcplane_drift_repairs_total{{mode=\"{mode}\"}}"));
    assert!(repairs >= Some(1.0), "the repair is counted on /metrics: {repairs:?}");
    cluster.teardown();
}
