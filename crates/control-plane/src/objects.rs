//! The objects a test writes in place of a kubelet: Nodes with addresses, Pods with an IP
//! and a Ready condition.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Node, NodeAddress, NodeStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use crate::client::NetnsClient;
use crate::error::ControlPlaneError;

/// A Node named `name` with `InternalIP` addresses and, optionally, a zone label.
pub fn node(name: &str, ips: &[IpAddr], zone: Option<&str>) -> Node {
    let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())]);
    if let Some(zone) = zone {
        labels.insert("topology.kubernetes.io/zone".to_owned(), zone.to_owned());
    }
    Node {
        metadata: ObjectMeta { name: Some(name.to_owned()), labels: Some(labels), ..ObjectMeta::default() },
        status: Some(NodeStatus {
            addresses: Some(
                ips.iter().map(|ip| NodeAddress { type_: "InternalIP".to_owned(), address: ip.to_string() }).collect(),
            ),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

/// A Pod scheduled on `node` with `labels` and one container exposing `ports`
/// (`(name, number, protocol)`).
pub fn pod(namespace: &str, name: &str, node: &str, labels: &[(&str, &str)], ports: &[(&str, i32, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            containers: vec![Container {
                name: "app".to_owned(),
                image: Some("registry.invalid/none".to_owned()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(port_name, number, protocol)| ContainerPort {
                            name: (!port_name.is_empty()).then(|| (*port_name).to_owned()),
                            container_port: *number,
                            protocol: Some((*protocol).to_owned()),
                            ..ContainerPort::default()
                        })
                        .collect(),
                ),
                ..Container::default()
            }],
            // Deleting a Pod then leaves it terminating until a test removes it for good.
            termination_grace_period_seconds: Some(30),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// The status patch a kubelet would write for a running Pod with `ips`.
pub fn running_status(ips: &[IpAddr], ready: bool) -> serde_json::Value {
    let condition = if ready { "True" } else { "False" };
    json!({
        "status": {
            "phase": "Running",
            "podIP": ips.first().map(ToString::to_string),
            "podIPs": ips.iter().map(|ip| json!({ "ip": ip.to_string() })).collect::<Vec<_>>(),
            "conditions": [
                { "type": "Ready", "status": condition },
                { "type": "ContainersReady", "status": condition },
                { "type": "PodScheduled", "status": "True" },
            ],
        }
    })
}

/// Creates `pod` and marks it running with `ips`, Ready or not.
pub fn create_running_pod(
    client: &NetnsClient,
    pod: &Pod,
    ips: &[IpAddr],
    ready: bool,
) -> Result<Pod, ControlPlaneError> {
    let created = client.create(pod)?;
    let namespace = created.metadata.namespace.clone().unwrap_or_default();
    let name = created.metadata.name.clone().unwrap_or_default();
    client.merge_patch::<Pod>(&namespace, &name, running_status(ips, ready), true)
}

/// Flips the Ready condition of a running Pod.
pub fn set_ready(client: &NetnsClient, namespace: &str, name: &str, ready: bool) -> Result<Pod, ControlPlaneError> {
    let condition = if ready { "True" } else { "False" };
    // Conditions are a list keyed by type: a strategic merge would be needed to patch one,
    // so all three are written.
    let patch = json!({ "status": { "conditions": [
        { "type": "Ready", "status": condition },
        { "type": "ContainersReady", "status": condition },
        { "type": "PodScheduled", "status": "True" },
    ] } });
    client.merge_patch::<Pod>(namespace, name, patch, true)
}
