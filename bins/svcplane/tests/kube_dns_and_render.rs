//! `svcplane dns --kubeconfig` and `svcplane render --kubeconfig` against a real API server
//! in a namespace of the test's own, and the command line's choice of source.
//!
//! The API tests are skipped when the upstream binaries are not built or the test is not
//! root, unless `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

mod kube_support;

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube_support::{cluster_ip_v4, echo_service, echo_slice, eventually, log_tail};
use svcplane_control_plane::{
    BareNamespace, ControlPlane, ControlPlaneConfig, NetnsClient, binaries_for_test, objects,
};

const DNS_PORT: &str = "1053";

fn dig(namespace: &str, name: &str) -> Vec<String> {
    let output = Command::new("ip")
        .args([
            "netns",
            "exec",
            namespace,
            "dig",
            "+short",
            "+time=1",
            "+tries=1",
            "-p",
            DNS_PORT,
            "@127.0.0.1",
            name,
            "A",
        ])
        .output()
        .expect("running dig");
    let mut answers: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect();
    answers.sort();
    answers
}

#[test]
fn cluster_dns_and_render_follow_services_and_slices_written_to_the_api() {
    let Some(binaries) = binaries_for_test("kube_dns_and_render") else { return };
    let namespace = BareNamespace::create().expect("a namespace");
    let address: IpAddr = "198.18.0.2".parse().unwrap();
    namespace.add_loopback_address(address).unwrap();
    let plane = ControlPlane::start(&binaries, ControlPlaneConfig::new(namespace.name(), address))
        .unwrap_or_else(|error| panic!("starting the control plane: {error}"));
    let client = NetnsClient::connect(namespace.name(), plane.kubeconfig()).unwrap();
    client.create_node(&objects::node("node1", &[address], Some("zone-a"))).unwrap();
    let kubeconfig = plane.kubeconfig().display().to_string();

    let web: Service = client.create(&echo_service("web", false, &[])).unwrap();
    let web_ip = cluster_ip_v4(&web);
    let endpoint: IpAddr = "198.18.129.7".parse().unwrap();
    client.create(&echo_slice("web-1", "web", &[(endpoint, "node1")], &[])).unwrap();

    // render: the initial lists, printed.
    let rendered = Command::new("ip")
        .args([
            "netns",
            "exec",
            namespace.name(),
            env!("CARGO_BIN_EXE_svcplane"),
            "render",
            "--kubeconfig",
            &kubeconfig,
        ])
        .args(["--node-name", "node1"])
        .output()
        .expect("running svcplane render");
    let text = String::from_utf8_lossy(&rendered.stdout);
    assert!(rendered.status.success(), "render failed: {}", String::from_utf8_lossy(&rendered.stderr));
    assert!(text.contains(&web_ip.to_string()), "render does not show {web_ip}:\n{text}");
    assert!(text.contains(&endpoint.to_string()), "render does not show the endpoint {endpoint}:\n{text}");

    // dns: a ClusterIP Service, then a headless one whose slice comes later.
    let args: Vec<String> =
        ["dns", "--kubeconfig", &kubeconfig, "--listen", &format!("127.0.0.1:{DNS_PORT}")].map(String::from).to_vec();
    let (_, log) = plane.spawn("svcplane-dns", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
    let answered = eventually(Duration::from_secs(20), || {
        (dig(namespace.name(), "web.default.svc.cluster.local") == [web_ip.to_string()]).then_some(())
    });
    assert!(
        answered.is_some(),
        "no A record for web: {:?}\n{}",
        dig(namespace.name(), "web.default.svc.cluster.local"),
        log_tail(&log)
    );

    let mut headless = echo_service("db", false, &[]);
    if let Some(spec) = headless.spec.as_mut() {
        spec.cluster_ip = Some("None".into());
        spec.ip_family_policy = None;
    }
    client.create(&headless).unwrap();
    let pods: Vec<IpAddr> = ["198.18.129.8", "198.18.129.9"].iter().map(|ip| ip.parse().unwrap()).collect();
    client
        .create(&echo_slice(
            "db-1",
            "db",
            &[(pods[0], "node1"), (pods[1], "node1")],
            &[("service.kubernetes.io/headless", "")],
        ))
        .unwrap();
    let wanted: Vec<String> = pods.iter().map(ToString::to_string).collect();
    let answered = eventually(Duration::from_secs(20), || {
        (dig(namespace.name(), "db.default.svc.cluster.local") == wanted).then_some(())
    });
    assert!(
        answered.is_some(),
        "headless db: {:?}\n{}",
        dig(namespace.name(), "db.default.svc.cluster.local"),
        log_tail(&log)
    );

    client.delete::<Service>("default", "web", None).unwrap();
    let gone = eventually(Duration::from_secs(20), || {
        dig(namespace.name(), "web.default.svc.cluster.local").is_empty().then_some(())
    });
    assert!(gone.is_some(), "web still answers after its deletion");
    plane.check_running("svcplane-dns").expect("svcplane dns still runs");
}

#[test]
fn manifests_and_kubeconfig_exclude_each_other_and_one_of_them_is_required() {
    let both = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["render", "--manifests", "/nonexistent", "--kubeconfig", "/nonexistent", "--node-name", "n"])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "clap refuses both: {}", String::from_utf8_lossy(&both.stderr));
    let neither = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["render", "--node-name", "n"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(!neither.status.success());
    let stderr = String::from_utf8_lossy(&neither.stderr);
    assert!(stderr.contains("--manifests") && stderr.contains("--kubeconfig"), "{stderr}");
    let unreadable = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["render", "--kubeconfig", "/nonexistent/kubeconfig", "--node-name", "n"])
        .output()
        .unwrap();
    assert!(!unreadable.status.success());
    assert!(String::from_utf8_lossy(&unreadable.stderr).contains("/nonexistent/kubeconfig"));
}
