//! `svcplane explain` end to end on the lab's example manifests: flags in, the core's
//! verdict out as text and JSON. No root, no kernel: explain only reads and plans.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const CLUSTER_CIDR: &str = "198.18.128.0/17";
const SERVICE_CIDR: &str = "198.19.0.0/16";

fn explain(extra: &[&str]) -> (bool, String) {
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab");
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .arg("explain")
        .arg("--manifests")
        .arg(&manifests)
        .args(["--service-cidr", SERVICE_CIDR, "--cluster-cidr", CLUSTER_CIDR, "--node", "node1"])
        .args(extra)
        .output()
        .expect("running svcplane explain");
    let text = if output.status.success() { output.stdout } else { output.stderr };
    (output.status.success(), String::from_utf8_lossy(&text).into_owned())
}

/// The echo Service's allocated ClusterIP and TCP NodePort, as `explain` found them.
fn echo_frontends() -> (String, u16) {
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["controller", "--manifests"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab"))
        .args(["--service-cidr", SERVICE_CIDR])
        .output()
        .expect("running svcplane controller");
    let listing = String::from_utf8_lossy(&output.stdout).into_owned();
    let cluster_ip = listing
        .lines()
        .find_map(|line| line.trim().strip_prefix("clusterIP: "))
        .expect("an allocated clusterIP")
        .trim_matches('"')
        .to_owned();
    let node_port = listing
        .lines()
        .find_map(|line| line.trim().strip_prefix("nodePort: "))
        .expect("an allocated nodePort")
        .parse()
        .expect("a port number");
    (cluster_ip, node_port)
}

#[test]
fn explain_names_the_frontend_the_endpoints_and_why_a_pod_keeps_its_address() {
    let (cluster_ip, _) = echo_frontends();
    let (ok, text) = explain(&["--from", "198.18.128.9", "--to", &format!("{cluster_ip}:80/tcp")]);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("ClusterIP {cluster_ip}:80 of default/echo:http/tcp")), "{text}");
    assert!(text.contains("forwarded (DNAT) to one of 3 cluster endpoint(s)"), "{text}");
    assert!(text.contains("33.3%"), "{text}");
    assert!(text.contains("masquerade: no: the source 198.18.128.9 is inside the cluster CIDR"), "{text}");
}

#[test]
fn explain_prints_json_with_the_verdict_endpoints_and_masquerade_decision() {
    let (_, node_port) = echo_frontends();
    let (ok, text) =
        explain(&["--from", "198.18.1.2", "--to", &format!("198.18.0.11:{node_port}/tcp"), "--output", "json"]);
    assert!(ok, "{text}");
    let json: Value = serde_json::from_str(&text).expect("explain --output json prints JSON");
    assert_eq!(json["verdict"], "forwarded");
    assert_eq!(json["frontend"]["kind"], "NodePort");
    assert_eq!(json["masquerade"], true);
    assert_eq!(json["endpoints"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["endpoints"][0]["node"], "node1");
}

#[test]
fn explain_says_an_address_no_service_uses_is_not_served() {
    let (ok, text) = explain(&["--from", "198.18.1.2", "--to", "198.19.255.254:80/udp", "--output", "json"]);
    assert!(ok, "{text}");
    let json: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["verdict"], "not-served");
    assert!(json["reason"].as_str().unwrap_or_default().contains("no Service frontend on node1"));
}

#[test]
fn explain_refuses_a_destination_without_a_protocol_and_says_the_shape() {
    let (ok, text) = explain(&["--from", "198.18.1.2", "--to", "198.19.0.1:80"]);
    assert!(!ok);
    assert!(text.contains("ADDRESS:PORT/PROTO"), "{text}");
}
