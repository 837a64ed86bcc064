//! `svcplane proxy --kubeconfig` against a real kube-apiserver: a one-node lab whose node
//! runs the proxy, the control plane on the lab LAN, objects written through the API, and
//! real packets from a pod through the ClusterIPs.
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

mod kube_support;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_support::{KubeLab, cluster_ip_v4, echo_service, echo_slice, eventually, log_tail};
use svcplane_control_plane::binaries_for_test;
use svcplane_testbed::{Lab, tcp_request_in};

const CLIENT_POD: &str = "node1-client";
/// How long a change written to the API may take to reach the kernel in these tests.
const REACHES_KERNEL_WITHIN: Duration = Duration::from_secs(20);

fn lab_with_two_echo_pods() -> Lab {
    let lab = Lab::builder().nodes(1).pods_per_node(2).pod(1, CLIENT_POD).build().expect("a lab");
    for pod in ["node1-pod1", "node1-pod2"] {
        lab.start_echo(pod, kube_support::ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane")))
            .expect("an echo server");
    }
    lab
}

fn pod_v4(kube: &KubeLab, pod: &str) -> IpAddr {
    IpAddr::V4(kube.lab.pod(pod).ip_v4())
}

/// Which pods answered `count` requests to `ip:80` from the client pod (`None` for a failed request).
fn answers(kube: &KubeLab, ip: IpAddr, count: usize) -> BTreeSet<Option<String>> {
    let namespace = kube.lab.pod(CLIENT_POD).namespace_name().to_owned();
    (0..count)
        .map(|_| {
            tcp_request_in(&namespace, SocketAddr::new(ip, 80), Duration::from_millis(500))
                .ok()
                .map(|reply| reply.server_name)
        })
        .collect()
}

fn answered_by(names: &[&str]) -> BTreeSet<Option<String>> {
    names.iter().map(|name| Some((*name).to_owned())).collect()
}

/// Waits until requests to `ip` are answered exactly by `pods` (empty: none answers).
fn expect_answers(kube: &KubeLab, log: &Path, what: &str, ip: IpAddr, pods: &[&str]) -> Duration {
    let wanted = if pods.is_empty() { BTreeSet::from([None]) } else { answered_by(pods) };
    let result = eventually(REACHES_KERNEL_WITHIN, || {
        let seen = answers(kube, ip, 12);
        (seen == wanted).then_some(())
    });
    match result {
        Some(((), elapsed)) => elapsed,
        None => panic!(
            "{what}: {ip}:80 is not answered by {wanted:?} within {REACHES_KERNEL_WITHIN:?} (last: {:?})\nproxy log:\n{}",
            answers(kube, ip, 12),
            log_tail(log)
        ),
    }
}

fn create_service_with_slice(kube: &KubeLab, name: &str, pods: &[&str], labels: &[(&str, &str)]) -> IpAddr {
    let service: Service = kube.client.create(&echo_service(name, false, labels)).expect("a Service");
    let endpoints: Vec<(IpAddr, &str)> = pods.iter().map(|pod| (pod_v4(kube, pod), "node1")).collect();
    kube.client.create(&echo_slice(&format!("{name}-1"), name, &endpoints, labels)).expect("an EndpointSlice");
    cluster_ip_v4(&service)
}

/// Makes `pod` the only endpoint of the `echo` Service (its slice `echo-1`).
fn move_echo_endpoint_to(kube: &KubeLab, pod: &str) {
    kube.client
        .merge_patch::<EndpointSlice>(
            "default",
            "echo-1",
            serde_json::json!({ "endpoints": [{
                "addresses": [pod_v4(kube, pod).to_string()],
                "conditions": { "ready": true },
                "nodeName": "node1",
            }] }),
            false,
        )
        .expect("moving the endpoint");
}

fn nft_ruleset(kube: &KubeLab) -> String {
    kube.lab.exec_ok(kube.lab.node(1).namespace_name(), &["nft", "list", "ruleset"]).expect("nft list ruleset")
}

#[test]
fn services_and_slices_written_to_the_api_reach_the_kernel_and_what_upstream_ignores_does_not() {
    let Some(binaries) = binaries_for_test("kube_proxy") else { return };
    let kube = KubeLab::start(&binaries, lab_with_two_echo_pods());
    let echo = create_service_with_slice(&kube, "echo", &["node1-pod1", "node1-pod2"], &[]);
    let other_proxy = create_service_with_slice(
        &kube,
        "other",
        &["node1-pod1"],
        &[("service.kubernetes.io/service-proxy-name", "x")],
    );
    let (_, log) = kube.start_svcplane_proxy(1, &[]);

    let first = expect_answers(&kube, &log, "the initial state", echo, &["node1-pod1", "node1-pod2"]);
    eprintln!("initial state in the kernel {first:?} after the proxy started");
    let text = std::fs::read_to_string(&log).expect("the proxy's log");
    assert!(!text.contains("page by page"), "this API server streams lists, but the proxy paged them:\n{text}");
    let ruleset = nft_ruleset(&kube);
    assert!(ruleset.contains(&echo.to_string()), "{echo} is not programmed:\n{ruleset}");
    assert!(
        !ruleset.contains(&other_proxy.to_string()),
        "{other_proxy} belongs to another proxy but is programmed:\n{ruleset}"
    );

    // One endpoint leaves.
    let only_pod2 = echo_slice("echo-1", "echo", &[(pod_v4(&kube, "node1-pod2"), "node1")], &[]);
    let current: EndpointSlice = kube.client.get("default", "echo-1").unwrap();
    let mut replacement = only_pod2.clone();
    replacement.metadata.resource_version = current.metadata.resource_version;
    kube.client
        .run({
            let api = kube::Api::<EndpointSlice>::namespaced(kube.client.client(), "default");
            async move { api.replace("echo-1", &kube::api::PostParams::default(), &replacement).await }
        })
        .expect("replacing the slice");
    expect_answers(&kube, &log, "after an endpoint left", echo, &["node1-pod2"]);

    // A new Service with its slice.
    let late = create_service_with_slice(&kube, "late", &["node1-pod1"], &[]);
    let elapsed = expect_answers(&kube, &log, "a Service created later", late, &["node1-pod1"]);
    eprintln!("a new Service reached the kernel within {elapsed:?}");

    // Deleting the Service removes its rules.
    kube.client.delete::<Service>("default", "late", None).unwrap();
    expect_answers(&kube, &log, "after the Service was deleted", late, &[]);
    kube.plane.check_running("svcplane-proxy-node1").expect("the proxy still runs");

    // SIGTERM ends the proxy and its watches promptly and cleanly; the rules stay.
    kube.plane.terminate("svcplane-proxy-node1");
    let exited = eventually(Duration::from_secs(5), || kube.plane.check_running("svcplane-proxy-node1").err());
    let (error, _) = exited.unwrap_or_else(|| panic!("the proxy ignored SIGTERM:\n{}", log_tail(&log)));
    assert!(error.to_string().contains("exit status: 0"), "{error}");
    assert_eq!(answers(&kube, echo, 4), answered_by(&["node1-pod2"]), "the rules stay after a stop");
}

#[test]
fn an_api_server_that_does_not_stream_lists_is_listed_page_by_page_and_every_change_still_reaches_the_kernel() {
    let Some(binaries) = binaries_for_test("kube_proxy") else { return };
    // Streaming lists are the `WatchList` feature; off by default in Kubernetes 1.27-1.31 and 1.33.
    let kube =
        KubeLab::start_with_apiserver_args(&binaries, lab_with_two_echo_pods(), &["--feature-gates=WatchList=false"]);
    let echo = create_service_with_slice(&kube, "echo", &["node1-pod1", "node1-pod2"], &[]);
    let (_, log) = kube.start_svcplane_proxy(1, &[]);

    expect_answers(&kube, &log, "the initial state", echo, &["node1-pod1", "node1-pod2"]);
    let text = std::fs::read_to_string(&log).expect("the proxy's log");
    for kind in ["Service", "EndpointSlice"] {
        assert!(
            text.lines()
                .any(|line| line.contains("does not stream lists") && line.contains(&format!("kind=\"{kind}\""))),
            "no {kind} fallback to paged lists logged:\n{text}"
        );
    }
    move_echo_endpoint_to(&kube, "node1-pod2");
    expect_answers(&kube, &log, "a slice changed after the paged list", echo, &["node1-pod2"]);
    let late = create_service_with_slice(&kube, "late", &["node1-pod1"], &[]);
    expect_answers(&kube, &log, "a Service created after the paged list", late, &["node1-pod1"]);
    kube.plane.check_running("svcplane-proxy-node1").expect("the proxy still runs");
}

#[test]
fn the_proxy_survives_an_api_server_restart_and_catches_up_with_changes_made_right_after_it() {
    let Some(binaries) = binaries_for_test("kube_proxy") else { return };
    let mut kube = KubeLab::start(&binaries, lab_with_two_echo_pods());
    let echo = create_service_with_slice(&kube, "echo", &["node1-pod1"], &[]);
    let doomed = create_service_with_slice(&kube, "doomed", &["node1-pod1"], &[]);
    let (_, log) = kube.start_svcplane_proxy(1, &[]);
    expect_answers(&kube, &log, "the initial state", echo, &["node1-pod1"]);
    expect_answers(&kube, &log, "the initial state", doomed, &["node1-pod1"]);

    kube.plane.kill_apiserver();
    // The rules stay while the API server is gone.
    assert_eq!(answers(&kube, echo, 4), answered_by(&["node1-pod1"]));
    std::thread::sleep(Duration::from_secs(2));
    kube.plane.start_apiserver_again().expect("the API server starts again");

    // Changes made at once, while the proxy's watches are still reconnecting.
    move_echo_endpoint_to(&kube, "node1-pod2");
    kube.client.delete::<Service>("default", "doomed", None).unwrap();
    kube.client.delete::<EndpointSlice>("default", "doomed-1", None).unwrap();
    let fresh = create_service_with_slice(&kube, "fresh", &["node1-pod2"], &[]);

    expect_answers(&kube, &log, "a slice changed after the restart", echo, &["node1-pod2"]);
    expect_answers(&kube, &log, "a Service deleted after the restart", doomed, &[]);
    expect_answers(&kube, &log, "a Service created after the restart", fresh, &["node1-pod2"]);
    kube.plane.check_running("svcplane-proxy-node1").expect("the proxy still runs");
}

#[test]
fn with_etcd_and_the_api_server_down_for_30_seconds_no_request_fails_and_changes_after_are_applied() {
    let Some(binaries) = binaries_for_test("kube_proxy") else { return };
    let mut kube = KubeLab::start(&binaries, lab_with_two_echo_pods());
    let echo = create_service_with_slice(&kube, "echo", &["node1-pod1"], &[]);
    let (_, log) = kube.start_svcplane_proxy(1, &[]);
    expect_answers(&kube, &log, "the initial state", echo, &["node1-pod1"]);

    // The lab's echo Service is TCP only (its EndpointSlice names one TCP port).
    let client = kube.lab.pod(CLIENT_POD).namespace_name().to_owned();
    let spec = svcplane_testbed::LoadSpec {
        protocol: svcplane_testbed::probe::Protocol::Tcp,
        target: SocketAddr::new(echo, 80),
        pause: Duration::from_millis(10),
        timeout: Duration::from_secs(2),
        max_requests: 20_000,
        max_duration: Duration::from_secs(90),
    };
    let load = svcplane_testbed::Load::start(&client, spec);
    kube.plane.kill_etcd_and_apiserver();
    std::thread::sleep(Duration::from_secs(30));
    kube.plane.start_etcd_and_apiserver_again().expect("etcd and the API server start again");
    {
        let report = load.finish();
        eprintln!("while the control plane was down: {} sent, {} failed", report.sent, report.failed);
        assert!(report.sent > 100, "the load ran");
        assert_eq!(report.failed, 0, "{:?}\nproxy log:\n{}", report.first_failures, log_tail(&log));
        assert_eq!(report.answered_by.keys().collect::<Vec<_>>(), ["node1-pod1"], "nothing was removed meanwhile");
    }

    // A change made once the API answers again reaches the kernel.
    move_echo_endpoint_to(&kube, "node1-pod2");
    expect_answers(&kube, &log, "a slice changed after the outage", echo, &["node1-pod2"]);
    kube.plane.check_running("svcplane-proxy-node1").expect("the proxy still runs");
}
