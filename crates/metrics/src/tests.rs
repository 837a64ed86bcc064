use super::*;

/// kube-proxy's metric names (pkg/proxy/metrics, namespace `kubeproxy`, as listed in the
/// upstream metrics reference for recent releases) that svcplane can
/// feed: the winkernel/ipvs-only and conntrack-reconciler families are left out.
const UPSTREAM: &[&str] = &[
    "kubeproxy_network_programming_duration_seconds",
    "kubeproxy_proxy_healthz_total",
    "kubeproxy_proxy_livez_total",
    "kubeproxy_sync_full_proxy_rules_duration_seconds",
    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_duration_seconds",
    "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
    "kubeproxy_sync_proxy_rules_endpoint_changes_total",
    "kubeproxy_sync_proxy_rules_iptables_last",
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
    "kubeproxy_sync_proxy_rules_iptables_total",
    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
    "kubeproxy_sync_proxy_rules_service_changes_pending",
    "kubeproxy_sync_proxy_rules_service_changes_total",
];

#[test]
fn our_metric_names_are_exactly_the_upstream_names_we_feed() {
    let mut ours = Registry::kube_proxy().names();
    ours.sort_unstable();
    assert_eq!(ours, UPSTREAM);
}

#[test]
fn a_histogram_renders_cumulative_buckets_sum_and_count() {
    let r = Registry::kube_proxy();
    r.observe(SYNC_PROXY_RULES_DURATION, &["IPv4"], 0.003);
    let text = r.render();
    assert!(text.contains("# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram\n"), "{text}");
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.002\"} 0\n"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.004\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family=\"IPv4\",le=\"+Inf\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family=\"IPv4\"} 0.003\n"), "{text}");
    assert!(text.contains("kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1\n"), "{text}");
}

#[test]
fn labelled_counters_render_one_line_per_label_set_with_escaped_values() {
    let r = Registry::kube_proxy();
    r.add(PROXY_HEALTHZ_TOTAL, &["200"], 1.0);
    r.add(PROXY_HEALTHZ_TOTAL, &["503"], 2.0);
    r.set(NO_LOCAL_ENDPOINTS_TOTAL, &["IPv4", "internal"], 3.0);
    let text = r.render();
    assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1\n"), "{text}");
    assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 2\n"), "{text}");
    assert!(
        text.contains(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"} 3\n"
        ),
        "{text}"
    );
    assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

#[test]
fn unlabelled_families_are_exposed_at_zero_before_any_sync() {
    let text = Registry::kube_proxy().render();
    assert!(text.contains("kubeproxy_sync_proxy_rules_service_changes_total 0\n"), "{text}");
}

#[test]
fn families_carry_upstreams_types_and_label_names() {
    let descs = kube_proxy_descs();
    let find = |n: &str| descs.iter().find(|d| d.name == n).expect("registered");
    assert_eq!(find(NO_LOCAL_ENDPOINTS_TOTAL).kind, Kind::Gauge);
    assert_eq!(find(NO_LOCAL_ENDPOINTS_TOTAL).labels, ["ip_family", "traffic_policy"]);
    assert_eq!(find(IPTABLES_TOTAL).labels, ["ip_family", "table"]);
    assert_eq!(find(NETWORK_PROGRAMMING_DURATION).labels, ["ip_family"]);
    assert!(find(SERVICE_CHANGES_PENDING).labels.is_empty());
    assert_eq!(find(PROXY_LIVEZ_TOTAL).labels, ["code"]);
    assert_eq!(find(SYNC_PROXY_RULES_DURATION).buckets.len(), 15);
}
