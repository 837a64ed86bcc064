//! A lab with a real control plane: etcd and kube-apiserver run in the lab's LAN namespace
//! on 198.18.0.2 (the bridge gets that address), so every node reaches the API server over
//! the lab LAN and nothing leaves the lab. Tests write Nodes, Pods, Services and
//! EndpointSlices through [`KubeLab::client`] and run `svcplane` (or upstream components)
//! in node namespaces with the admin kubeconfig.

#![allow(dead_code, reason = "each kube_*.rs test uses its own part of the support")]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use svcplane_control_plane::{ControlPlane, ControlPlaneConfig, NetnsClient, UpstreamBinaries, objects};
use svcplane_testbed::Lab;

pub mod bench;
pub mod deploy;

/// The API server's address on the lab LAN.
pub const API_ADDRESS: &str = "198.18.0.2";
/// The Service ranges the API server allocates from (the lab's plan).
pub const SERVICE_CIDRS: [&str; 2] = ["198.19.0.0/16", "2001:db8:f::/108"];
/// The pod network, for the proxies' masquerade decision.
pub const CLUSTER_CIDRS: [&str; 2] = ["198.18.128.0/17", "2001:db8:1::/48"];
/// Every echo server in lab pods listens here.
pub const ECHO_PORT: u16 = 8080;

/// A lab, its control plane and a client inside the LAN namespace. Fields drop in order:
/// the client, then every control-plane process, then the lab's namespaces.
#[derive(Debug)]
pub struct KubeLab {
    pub client: NetnsClient,
    pub plane: ControlPlane,
    pub lab: Lab,
}

impl KubeLab {
    /// Starts the control plane in `lab`'s LAN namespace and creates one Node object per
    /// lab node (its LAN addresses, zone `zone-<n>`).
    pub fn start(binaries: &UpstreamBinaries, lab: Lab) -> KubeLab {
        Self::start_with_apiserver_args(binaries, lab, &[])
    }

    fn create_lab_nodes(&self) {
        for node in self.lab.nodes() {
            let ips: Vec<IpAddr> = node.ips().to_vec();
            self.client
                .create_node(&objects::node(node.name(), &ips, Some(&format!("zone-{}", node.index()))))
                .expect("a Node object");
        }
    }

    /// [`KubeLab::start`] with more kube-apiserver flags (e.g. feature gates).
    pub fn start_with_apiserver_args(binaries: &UpstreamBinaries, lab: Lab, apiserver_args: &[&str]) -> KubeLab {
        let kube = Self::start_control_plane(binaries, lab, apiserver_args);
        kube.create_lab_nodes();
        kube
    }

    /// The control plane only: the test writes the Nodes itself.
    pub fn start_without_nodes(binaries: &UpstreamBinaries, lab: Lab) -> KubeLab {
        Self::start_control_plane(binaries, lab, &[])
    }

    fn start_control_plane(binaries: &UpstreamBinaries, lab: Lab, apiserver_args: &[&str]) -> KubeLab {
        let lan = lab.lan_namespace().to_owned();
        lab.exec_ok(&lan, &["ip", "addr", "add", &format!("{API_ADDRESS}/24"), "dev", "br0"])
            .expect("an address for the API server on the lab bridge");
        let mut config = ControlPlaneConfig::new(&lan, API_ADDRESS.parse().unwrap());
        config.service_cidrs = SERVICE_CIDRS.iter().map(|cidr| (*cidr).to_owned()).collect();
        config.extra_apiserver_args = apiserver_args.iter().map(|arg| (*arg).to_owned()).collect();
        let plane =
            ControlPlane::start(binaries, config).unwrap_or_else(|error| panic!("starting the control plane: {error}"));
        let client = NetnsClient::connect(&lan, plane.kubeconfig()).expect("a client in the LAN namespace");
        KubeLab { client, plane, lab }
    }

    /// Starts `svcplane proxy --kubeconfig` in node `node`'s namespace (killed on drop);
    /// returns its pid and log file.
    pub fn start_svcplane_proxy(&self, node: u16, extra: &[&str]) -> (u32, PathBuf) {
        let node = self.lab.node(node);
        let mut args: Vec<String> = vec![
            "proxy".into(),
            "--kubeconfig".into(),
            self.plane.kubeconfig().display().to_string(),
            "--node-name".into(),
            node.name().into(),
        ];
        for cidr in CLUSTER_CIDRS {
            args.extend(["--cluster-cidr".to_owned(), cidr.to_owned()]);
        }
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let what = format!("svcplane-proxy-{}", node.name());
        self.plane
            .spawn(&what, node.namespace_name(), env!("CARGO_BIN_EXE_svcplane"), &args)
            .expect("starting svcplane proxy")
    }

    /// Creates a running, Ready Pod for every lab pod (labels `app=<app>`, a container port
    /// `http` 8080/TCP), on its node with its lab addresses.
    pub fn create_lab_pods(&self, app_of: impl Fn(&str) -> Option<String>) {
        for pod in self.lab.pods() {
            let Some(app) = app_of(pod.name()) else { continue };
            let node = self.lab.node(pod.node());
            let object = objects::pod("default", pod.name(), node.name(), &[("app", &app)], &[("http", 8080, "TCP")]);
            objects::create_running_pod(&self.client, &object, &pod.ips(), true).expect("a running Pod");
        }
    }
}

/// A ClusterIP Service in `default` with both families (when the cluster has them), port
/// 80 (`http`) to target port 8080, selecting `app=<name>` unless `selector` is false.
pub fn echo_service(name: &str, selector: bool, labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: (!labels.is_empty())
                .then(|| labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            selector: selector.then(|| BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ip_family_policy: Some("PreferDualStack".into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(i32::from(ECHO_PORT))),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// An IPv4 EndpointSlice of Service `service` with ready endpoints at `addresses` (pod,
/// node) on port 8080 (`http`).
pub fn echo_slice(name: &str, service: &str, endpoints: &[(IpAddr, &str)], labels: &[(&str, &str)]) -> EndpointSlice {
    let mut all_labels = BTreeMap::from([("kubernetes.io/service-name".to_owned(), service.to_owned())]);
    all_labels.extend(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(all_labels),
            ..ObjectMeta::default()
        },
        address_type: if endpoints.first().is_some_and(|(ip, _)| ip.is_ipv6()) { "IPv6" } else { "IPv4" }.into(),
        endpoints: endpoints
            .iter()
            .map(|(ip, node)| Endpoint {
                addresses: vec![ip.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                node_name: Some((*node).to_owned()),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(i32::from(ECHO_PORT)),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

/// The Service's IPv4 cluster IP.
pub fn cluster_ip_v4(service: &Service) -> IpAddr {
    let spec = service.spec.as_ref().expect("a spec");
    spec.cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .find(IpAddr::is_ipv4)
        .expect("an IPv4 cluster IP")
}

/// Polls `attempt` every 100 ms until it returns `Some` or `limit` passes.
pub fn eventually<T>(limit: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let started = Instant::now();
    loop {
        if let Some(value) = attempt() {
            return Some((value, started.elapsed()));
        }
        if started.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of a log, for failure messages.
pub fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Applies deploy/loadbalancer-pools.yaml (CRD and RBAC) and waits until the CRD is served.
pub fn install_pool_crd(client: &NetnsClient) {
    for document in deploy::manifest_documents("loadbalancer-pools.yaml") {
        let kube = client.client();
        let what = format!("{} {}", document["kind"], document["metadata"]["name"]);
        client
            .run(async move { deploy::apply_strict(kube, document).await })
            .unwrap_or_else(|e| panic!("applying {what}: {e}"));
    }
    // The CRD is served once discovery knows it.
    let started = Instant::now();
    loop {
        let kube = client.client();
        let listed = client.run(async move {
            kube::api::Api::<kube::api::DynamicObject>::all_with(kube, &svcplane_kube::load_balancer::pool_resource())
                .list(&Default::default())
                .await
        });
        if listed.is_ok() {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the LoadBalancerIPPool CRD is not served: {listed:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Creates a `LoadBalancerIPPool`.
pub fn create_pool(
    client: &NetnsClient,
    name: &str,
    spec: serde_json::Value,
) -> Result<kube::api::DynamicObject, kube::Error> {
    let resource = svcplane_kube::load_balancer::pool_resource();
    let object: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "svcplane.io/v1alpha1", "kind": "LoadBalancerIPPool",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    let kube = client.client();
    client.run(async move {
        kube::api::Api::<kube::api::DynamicObject>::all_with(kube, &resource).create(&Default::default(), &object).await
    })
}
