//! The proxy's healthz and metrics servers, read the way a kubelet probe and Prometheus
//! read kube-proxy's, from inside a lab node where the real `svcplane proxy` runs:
//! `/healthz` and `/livez` with their JSON, 503 on a node tainted for deletion, `/metrics`
//! fed by real syncs (network programming latency from a slice's trigger time),
//! `/proxyMode`.

mod scenarios;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use scenarios::Family;
use scenarios::backends::NFTABLES;
use scenarios::cluster::{Cluster, THIS_NODE};
use scenarios::eventually;
use scenarios::manifests::{node_name, nodes_manifest, pod_ip};
use svcplane_ops::http;

const HEALTHZ: &str = "0.0.0.0:10256";
const METRICS: &str = "127.0.0.1:10249";

struct Node {
    namespace: String,
}

impl Node {
    fn get(&self, address: &str, path: &str) -> (u16, String) {
        let address: SocketAddr = address.replace("0.0.0.0", "127.0.0.1").parse().unwrap();
        let path = path.to_owned();
        let (status, _, body) = svcplane_testbed::run_in_namespace(&self.namespace, move || http::get(address, &path))
            .expect("entering the node's namespace")
            .unwrap_or_else(|error| panic!("GET {address}: {error}"));
        (status, body)
    }

    /// The value of one series in `/metrics` (the line starting with `series `).
    fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get(METRICS, "/metrics");
        body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }
}

/// node1's manifest with the cluster autoscaler's deletion taint added.
fn nodes_with_node1_tainted() -> String {
    nodes_manifest()
        .split("---\n")
        .filter(|doc| !doc.is_empty())
        .map(|doc| {
            if doc.contains(&format!("name: {}\n", node_name(THIS_NODE))) {
                doc.replacen(
                    "status:\n",
                    "spec:\n  taints:\n    - key: ToBeDeletedByClusterAutoscaler\n      effect: NoSchedule\nstatus:\n",
                    1,
                )
            } else {
                doc.to_owned()
            }
        })
        .map(|doc| format!("---\n{doc}"))
        .collect()
}

#[test]
fn healthz_livez_and_metrics_answer_like_kube_proxys_and_follow_real_syncs() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "healthz_livez_and_metrics_answer_like_kube_proxys_and_follow_real_syncs",
    ) {
        return;
    }
    let cluster = Cluster::start(NFTABLES);
    let node = Node { namespace: cluster.lab().node(THIS_NODE).namespace_name().to_owned() };

    let (status, body) = node.get(HEALTHZ, "/healthz");
    assert_eq!(status, 200, "{body}");
    for part in ["\"nodeEligible\":true", "\"healthy\":true", "\"IPv4\":{\"lastUpdated\":", "\"IPv6\":{"] {
        assert!(body.contains(part), "/healthz lacks {part}: {body}");
    }
    let (status, body) = node.get(HEALTHZ, "/livez");
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("nodeEligible"), "/livez says nothing of the node: {body}");
    assert_eq!(node.get(METRICS, "/proxyMode"), (200, "nftables".to_owned()));
    assert_eq!(node.get(METRICS, "/healthz"), (200, "ok".to_owned()));

    let synced_at = node.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}").unwrap();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(synced_at > now - 120.0 && synced_at <= now, "last sync {synced_at}, now {now}");
    let full_syncs = node.metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}");
    assert!(full_syncs >= Some(1.0), "a full sync was timed: {full_syncs:?}");
    assert_eq!(node.metric("kubeproxy_sync_proxy_rules_endpoint_changes_pending"), Some(0.0));
    assert_eq!(node.metric("kubeproxy_proxy_healthz_total{code=\"200\"}"), Some(1.0), "the one /healthz above");

    // An endpoint change stamped with its trigger time: one latency observation, and the
    // change is counted.
    let programming = "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}";
    let before = node.metric(programming).unwrap_or(0.0);
    let changes_before = node.metric("kubeproxy_sync_proxy_rules_endpoint_changes_total").unwrap();
    let trigger = jiff::Timestamp::now();
    cluster.write_file(
        "latency.yaml",
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: latency\n  namespace: default\nspec:\n  ports:\n    - port: 8080\n---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: latency-1\n  namespace: default\n  \
             labels:\n    kubernetes.io/service-name: latency\n  annotations:\n    \
             endpoints.kubernetes.io/last-change-trigger-time: \"{trigger}\"\naddressType: IPv4\n\
             endpoints:\n  - addresses: [\"{}\"]\nports:\n  - port: 8080\n",
            pod_ip("node1-pod1", Family::V4)
        ),
    );
    let observed =
        eventually(Duration::from_secs(10), || (node.metric(programming).unwrap_or(0.0) >= before + 1.0).then_some(()));
    assert!(observed.is_some(), "one network programming latency observed\n{}", cluster.proxy_log(THIS_NODE));
    assert_eq!(node.metric(programming), Some(before + 1.0), "exactly one");
    assert!(node.metric("kubeproxy_sync_proxy_rules_endpoint_changes_total").unwrap() > changes_before);
    let partial = node.metric("kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}");
    assert!(partial >= Some(1.0), "the change was a partial sync: {partial:?}");

    // The cluster autoscaler is about to delete node1: /healthz turns 503, /livez stays 200.
    cluster.write_file("nodes.yaml", &nodes_with_node1_tainted());
    let leaving = eventually(Duration::from_secs(10), || (node.get(HEALTHZ, "/healthz").0 == 503).then_some(()));
    assert!(leaving.is_some(), "/healthz turned 503 on the tainted node\n{}", cluster.proxy_log(THIS_NODE));
    let (_, body) = node.get(HEALTHZ, "/healthz");
    assert!(body.contains("\"nodeEligible\":false") && body.contains("\"healthy\":true"), "{body}");
    assert_eq!(node.get(HEALTHZ, "/livez").0, 200);
    assert!(node.metric("kubeproxy_proxy_healthz_total{code=\"503\"}") >= Some(1.0));
    cluster.teardown();
}
