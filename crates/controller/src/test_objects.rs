//! Small constructors for the Kubernetes objects the tests need.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::{Allocator, AllocatorConfig, NodePortRange};

/// Applies `edit` to `value` and returns it: `with(pod(..), |p| ...)`.
pub fn with<T>(mut value: T, edit: impl FnOnce(&mut T)) -> T {
    edit(&mut value);
    value
}

fn meta(key: &str) -> ObjectMeta {
    let (namespace, name) = key.split_once('/').expect("keys are namespace/name");
    ObjectMeta { namespace: Some(namespace.to_owned()), name: Some(name.to_owned()), ..ObjectMeta::default() }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// A Service `namespace/name` with the spec `edit` makes of an empty one.
pub fn service(key: &str, edit: impl FnOnce(&mut ServiceSpec)) -> Service {
    let mut spec = ServiceSpec::default();
    edit(&mut spec);
    Service { metadata: meta(key), spec: Some(spec), ..Service::default() }
}

/// A ClusterIP Service selecting `app=<app>` with port `http` 80 → 8080.
pub fn app_service(key: &str, app: &str) -> Service {
    service(key, |spec| {
        spec.selector = Some(labels(&[("app", app)]));
        spec.ports = Some(vec![target_port(port("http", 80), IntOrString::Int(8080))]);
    })
}

/// A NodePort Service with the given ports.
pub fn node_port_service(key: &str, ports: Vec<ServicePort>) -> Service {
    service(key, |spec| {
        spec.type_ = Some("NodePort".to_owned());
        spec.ports = Some(ports);
    })
}

/// TCP port `name` with number `number`, no target port, no node port.
pub fn port(name: &str, number: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: number,
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

pub fn udp(mut port: ServicePort) -> ServicePort {
    port.protocol = Some("UDP".to_owned());
    port
}

pub fn with_node_port(mut port: ServicePort, node_port: i32) -> ServicePort {
    port.node_port = Some(node_port);
    port
}

pub fn target_port(mut port: ServicePort, target: IntOrString) -> ServicePort {
    port.target_port = Some(target);
    port
}

/// A running, ready Pod `namespace/name` labelled `app=<app>` on `node-a` with these IPs.
pub fn pod(key: &str, app: &str, ips: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta { labels: Some(labels(&[("app", app)])), ..meta(key) },
        spec: Some(PodSpec {
            node_name: Some("node-a".to_owned()),
            containers: vec![Container { name: "main".to_owned(), ..Container::default() }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            pod_ip: ips.first().map(|ip| (*ip).to_owned()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: (*ip).to_owned() }).collect()),
            conditions: Some(vec![condition("Ready", true)]),
            ..PodStatus::default()
        }),
    }
}

fn condition(type_: &str, status: bool) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        ..PodCondition::default()
    }
}

pub fn not_ready(mut pod: Pod) -> Pod {
    pod.status.as_mut().unwrap().conditions = Some(vec![condition("Ready", false)]);
    pod
}

pub fn terminating(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(Time(Default::default()));
    pod
}

pub fn on_node(mut pod: Pod, node: &str) -> Pod {
    pod.spec.as_mut().unwrap().node_name = Some(node.to_owned());
    pod
}

/// Adds container port `name` = `number` (TCP) to the Pod's container.
pub fn with_container_port(mut pod: Pod, name: &str, number: i32) -> Pod {
    let container = &mut pod.spec.as_mut().unwrap().containers[0];
    container.ports.get_or_insert_with(Vec::new).push(ContainerPort {
        name: Some(name.to_owned()),
        container_port: number,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    });
    pod
}

pub fn node(name: &str, zone: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels(&[("topology.kubernetes.io/zone", zone)])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

/// An allocator over these CIDRs and the default node port range.
pub fn allocator(cidrs: &[&str]) -> Allocator {
    allocator_with_ports(cidrs, NodePortRange::DEFAULT)
}

pub fn allocator_with_ports(cidrs: &[&str], node_port_range: NodePortRange) -> Allocator {
    let service_cidrs = cidrs.iter().map(|cidr| cidr.parse().expect("test CIDRs parse")).collect();
    Allocator::new(AllocatorConfig { service_cidrs, node_port_range }).expect("test configurations are valid")
}

pub fn cluster_ips(service: &Service) -> Vec<String> {
    service.spec.as_ref().and_then(|spec| spec.cluster_ips.clone()).unwrap_or_default()
}

pub fn node_ports(service: &Service) -> Vec<Option<i32>> {
    service
        .spec
        .as_ref()
        .and_then(|spec| spec.ports.as_ref())
        .map(|ports| ports.iter().map(|p| p.node_port).collect())
        .unwrap_or_default()
}

/// `(pod name, address)` of every endpoint of the slices, in slice order.
pub fn endpoint_pods(slices: &[EndpointSlice]) -> Vec<(String, String)> {
    slices
        .iter()
        .flat_map(|slice| &slice.endpoints)
        .map(|endpoint| {
            let name = endpoint.target_ref.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
            (name, endpoint.addresses[0].clone())
        })
        .collect()
}
