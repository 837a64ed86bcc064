//! The compact record the manifests feed keeps of each Pod: [`PodRecord`] holds only what
//! EndpointSlice planning and cluster DNS read (a few hundred bytes instead of the several
//! kilobytes of a parsed `k8s-openapi` Pod) and is parsed straight from the document.
//! What the store keeps of every kind (`store::Held`) is decided where the store is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodCondition, PodIP, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer};

/// The parts of a Pod that EndpointSlice planning and cluster DNS read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodRecord {
    name: Box<str>,
    namespace: Box<str>,
    uid: Option<Box<str>>,
    /// In key order.
    labels: Box<[(Box<str>, Box<str>)]>,
    deletion_timestamp: Option<Time>,
    node_name: Option<Box<str>>,
    hostname: Option<Box<str>>,
    subdomain: Option<Box<str>>,
    phase: Option<Box<str>>,
    pod_ip: Option<Box<str>>,
    pod_ips: Box<[Box<str>]>,
    /// A `Ready` condition with status `True`.
    ready: bool,
    /// Named container ports of the containers, then of the sidecar init containers
    /// (`restartPolicy: Always`), in order: what a named `targetPort` resolves through.
    ports: Box<[NamedPort]>,
}

/// A named container port: name, protocol as written, number.
type NamedPort = (Box<str>, Option<Box<str>>, i32);

fn boxed(text: Option<String>) -> Option<Box<str>> {
    text.map(String::into_boxed_str)
}

/// A Pod manifest as the record reads it: only the fields [`PodRecord`] keeps, every other
/// field skipped by the parser (no `k8s-openapi` Pod is built: parsing one allocated
/// several kilobytes per Pod, most of it for fields nothing here reads). Optional
/// everywhere, so that `null` and a missing field mean the same, as for `k8s-openapi`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodDocument {
    metadata: Option<PodMetadata>,
    spec: Option<PodSpecDocument>,
    status: Option<PodStatusDocument>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodMetadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<Time>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodSpecDocument {
    #[serde(rename = "nodeName")]
    node_name: Option<String>,
    hostname: Option<String>,
    subdomain: Option<String>,
    containers: Option<Vec<ContainerDocument>>,
    #[serde(rename = "initContainers")]
    init_containers: Option<Vec<ContainerDocument>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerDocument {
    #[serde(rename = "restartPolicy")]
    restart_policy: Option<String>,
    ports: Option<Vec<ContainerPortDocument>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerPortDocument {
    name: Option<String>,
    protocol: Option<String>,
    #[serde(rename = "containerPort")]
    container_port: i32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodStatusDocument {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<PodIpDocument>>,
    conditions: Option<Vec<ConditionDocument>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodIpDocument {
    ip: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConditionDocument {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

impl<'de> Deserialize<'de> for PodRecord {
    /// Reads a Pod manifest straight into its record (see [`PodDocument`]); errors name
    /// the field, as a `k8s-openapi` Pod's did, for the fields read.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        PodDocument::deserialize(deserializer).map(PodRecord::from_document)
    }
}

impl PodRecord {
    fn from_document(document: PodDocument) -> Self {
        let PodDocument { metadata, spec, status } = document;
        let PodMetadata { name, namespace, uid, labels, deletion_timestamp } = metadata.unwrap_or_default();
        let spec = spec.unwrap_or_default();
        let status = status.unwrap_or_default();
        let sidecars =
            spec.init_containers.into_iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let ports: Vec<NamedPort> = spec
            .containers
            .into_iter()
            .flatten()
            .chain(sidecars)
            .flat_map(|container| container.ports.into_iter().flatten())
            .filter_map(|port| Some((port.name?.into_boxed_str(), boxed(port.protocol), port.container_port)))
            .collect();
        let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
        Self {
            name: name.unwrap_or_default().into_boxed_str(),
            namespace: namespace.unwrap_or_default().into_boxed_str(),
            uid: boxed(uid),
            labels: labels
                .into_iter()
                .flatten()
                .map(|(key, value)| (key.into_boxed_str(), value.into_boxed_str()))
                .collect(),
            deletion_timestamp,
            node_name: boxed(spec.node_name),
            hostname: boxed(spec.hostname),
            subdomain: boxed(spec.subdomain),
            phase: boxed(status.phase),
            pod_ip: boxed(status.pod_ip),
            pod_ips: status.pod_ips.into_iter().flatten().map(|ip| ip.ip.into_boxed_str()).collect(),
            ready,
            ports: ports.into_boxed_slice(),
        }
    }

    /// The record of a `k8s-openapi` Pod (tests: the record of a Pod parsed whole).
    #[cfg(test)]
    pub(crate) fn of(pod: Pod) -> Self {
        serde_json::from_value(serde_json::to_value(pod).expect("a Pod serializes")).expect("a Pod reads as a record")
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(crate) fn set_namespace(&mut self, namespace: &str) {
        self.namespace = namespace.into();
    }

    /// A Pod with just the recorded fields: planning it gives the same slices as planning
    /// the Pod it was made from.
    pub(crate) fn to_pod(&self) -> Pod {
        let text = |value: &Option<Box<str>>| value.as_deref().map(str::to_owned);
        let labels: BTreeMap<String, String> =
            self.labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
        let ports: Vec<ContainerPort> = self
            .ports
            .iter()
            .map(|(name, protocol, port)| ContainerPort {
                name: Some(name.to_string()),
                protocol: text(protocol),
                container_port: *port,
                ..ContainerPort::default()
            })
            .collect();
        let containers = if ports.is_empty() {
            Vec::new()
        } else {
            vec![Container { name: "ports".to_owned(), ports: Some(ports), ..Container::default() }]
        };
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                namespace: Some(self.namespace.to_string()),
                uid: text(&self.uid),
                labels: (!labels.is_empty()).then_some(labels),
                deletion_timestamp: self.deletion_timestamp.clone(),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: text(&self.node_name),
                hostname: text(&self.hostname),
                subdomain: text(&self.subdomain),
                containers,
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: text(&self.phase),
                pod_ip: text(&self.pod_ip),
                pod_ips: (!self.pod_ips.is_empty())
                    .then(|| self.pod_ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
                conditions: self.ready.then(|| {
                    vec![PodCondition {
                        type_: "Ready".to_owned(),
                        status: "True".to_owned(),
                        ..PodCondition::default()
                    }]
                }),
                ..PodStatus::default()
            }),
        }
    }

    pub(crate) fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.iter().map(|(key, value)| (&**key, &**value))
    }

    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*self.labels[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use k8s_openapi::api::core::v1::{Service, ServicePort};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_pod_rebuilt_from_its_record_plans_the_same_slices() {
        let pods = vec![
            pod(serde_json::json!({
                "metadata": {"name": "a", "namespace": "shop", "uid": "u-1", "labels": {"app": "web", "tier": "x"},
                             "annotations": {"big": "ignored"}},
                "spec": {"nodeName": "node-1", "hostname": "a", "subdomain": "web",
                         "containers": [{"name": "app", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]}],
                         "initContainers": [{"name": "side", "restartPolicy": "Always",
                                             "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "podIP": "198.18.129.2", "podIPs": [{"ip": "198.18.129.2"}, {"ip": "2001:db8:1:1::2"}],
                           "conditions": [{"type": "Ready", "status": "True"}]}
            })),
            pod(serde_json::json!({
                "metadata": {"name": "b", "namespace": "shop", "labels": {"app": "web"},
                             "deletionTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "node-2", "containers": [{"name": "app", "image": "i"}]},
                "status": {"podIP": "198.18.130.3", "conditions": [{"type": "Ready", "status": "False"}]}
            })),
            pod(serde_json::json!({
                "metadata": {"name": "c", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-2", "containers": []},
                "status": {"phase": "Succeeded", "podIP": "198.18.130.4"}
            })),
        ];
        let service = Service {
            metadata: ObjectMeta { name: Some("web".into()), namespace: Some("shop".into()), ..ObjectMeta::default() },
            spec: Some(ServiceSpec {
                selector: Some([("app".to_owned(), "web".to_owned())].into()),
                ip_families: Some(vec!["IPv4".into(), "IPv6".into()]),
                ports: Some(vec![
                    ServicePort {
                        name: Some("http".into()),
                        port: 80,
                        target_port: Some(IntOrString::String("http".into())),
                        ..ServicePort::default()
                    },
                    ServicePort {
                        name: Some("metrics".into()),
                        port: 90,
                        target_port: Some(IntOrString::String("metrics".into())),
                        ..ServicePort::default()
                    },
                ]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        };
        let rebuilt: Vec<Pod> = pods.iter().map(|p| PodRecord::of(p.clone()).to_pod()).collect();
        let original = svcplane_controller::plan_slices(&service, &pods, None).unwrap();
        let from_records = svcplane_controller::plan_slices(&service, &rebuilt, None).unwrap();
        assert!(!original.is_empty());
        assert_eq!(original, from_records);
        let record = PodRecord::of(pods[0].clone());
        assert_eq!(record.label("tier"), Some("x"));
        assert_eq!(record.labels().count(), 2);
    }
}
