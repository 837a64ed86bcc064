//! LoadBalancer address pools in manifests mode: the same `LoadBalancerIPPool` objects as
//! the CRD's, in the directory. `svcplane controller --manifests` prints the Services with
//! `status.loadBalancer.ingress` filled from the pools and warns, naming the cause, about
//! an unusable pool and a Service left without an address; `svcplane render` programs the
//! assigned address. No root needed.

use std::process::Command;

use serde_json::Value;

const MANIFESTS: &str = r#"
apiVersion: svcplane.io/v1alpha1
kind: LoadBalancerIPPool
metadata: {name: lan}
spec:
  blocks: [{start: 198.18.0.224, stop: 198.18.0.225}]
---
apiVersion: svcplane.io/v1alpha1
kind: LoadBalancerIPPool
metadata: {name: broken}
spec:
  blocks: [{start: 198.18.0.230, stop: 198.18.0.229}]
---
apiVersion: v1
kind: Service
metadata: {name: a, namespace: default}
spec: {type: LoadBalancer, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: default}
spec: {type: LoadBalancer, loadBalancerIP: 198.18.0.225, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: c, namespace: default}
spec: {type: LoadBalancer, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: default}
spec: {type: LoadBalancer, loadBalancerClass: example.com/cloud, ports: [{port: 80}]}
"#;

fn ingress(documents: &[Value], name: &str) -> Vec<String> {
    let service = documents
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no Service {name} in the output"));
    service["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn pools_in_a_manifests_directory_fill_load_balancer_ingress_and_name_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("all.yaml"), MANIFESTS).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["controller", "--manifests"])
        .arg(dir.path())
        .args(["--service-cidr", "198.19.0.0/16"])
        .env("SVCPLANE_LOG", "warn")
        .output()
        .expect("running svcplane controller");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let documents: Vec<Value> = serde_saphyr::from_multiple(&stdout).expect("a YAML stream");

    assert_eq!(ingress(&documents, "b"), ["198.18.0.225"], "the requested address");
    assert_eq!(ingress(&documents, "a"), ["198.18.0.224"], "the pool's other address");
    assert!(ingress(&documents, "c").is_empty(), "the pool is full");
    assert!(ingress(&documents, "other").is_empty(), "another class is left alone");
    assert!(stderr.contains("Service default/c: PoolExhausted") && stderr.contains("pool lan"), "{stderr}");
    assert!(stderr.contains("LoadBalancerIPPool broken: spec.blocks[0]") && stderr.contains("after stop"), "{stderr}");

    // The proxy programs the assigned address.
    let rendered = Command::new(env!("CARGO_BIN_EXE_svcplane"))
        .args(["render", "--manifests"])
        .arg(dir.path())
        .args(["--service-cidr", "198.19.0.0/16", "--node-name", "node1"])
        .env("SVCPLANE_LOG", "error")
        .output()
        .expect("running svcplane render");
    let ruleset = String::from_utf8_lossy(&rendered.stdout);
    assert!(rendered.status.success(), "{}", String::from_utf8_lossy(&rendered.stderr));
    assert!(ruleset.contains("198.18.0.224") && ruleset.contains("198.18.0.225"), "{ruleset}");
}
