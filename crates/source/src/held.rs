//! The compact record the manifests feed keeps of each Pod: [`PodRecord`] holds only what
//! EndpointSlice planning and cluster DNS read (a few hundred bytes instead of the several
//! kilobytes of a parsed `k8s-openapi` Pod) and is parsed straight from the document.
//! What the store keeps of every kind (`store::Held`) is decided where the store is.
//!
//! The record the parse threads make is remade by the store ([`PodRecord::shared`]) with
//! the strings that repeat over Pods (namespace, label sets, node name, phase) shared
//! through an [`Interner`]: at 10k Services x 10 Pods, ten Pods share one label set and
//! 10,000 Pods one node name.
//!
//! Services are kept the same way by the store ([`ServiceRecord`]): as the JSON text of
//! the Service as read (absent fields left out) with the selector at hand, decoded again
//! when the controller step allocates or plans one.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer};
use svcplane_controller::PodFacts;

use crate::FastSet;

/// The parts of a Pod that EndpointSlice planning and cluster DNS read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PodRecord {
    name: Box<str>,
    namespace: Arc<str>,
    /// In key order.
    labels: LabelSet,
    node_name: Option<Arc<str>>,
    /// `uid`, `deletionTimestamp`, `hostname`, `subdomain` and named ports, which most
    /// manifests' Pods do not have: one pointer when none is there.
    rare: Option<Box<RareFields>>,
    phase: Option<Arc<str>>,
    pod_ip: Option<Box<str>>,
    /// `status.podIPs`, empty when [`Self::pod_ips_is_pod_ip`] (the usual `[podIP]`).
    pod_ips: Box<[Box<str>]>,
    /// `status.podIPs` is exactly `[status.podIP]` (kept once).
    pod_ips_is_pod_ip: bool,
    /// A `Ready` condition with status `True`.
    ready: bool,
}

/// The fields of a [`PodRecord`] most Pods written as manifests leave out.
#[derive(Debug, Clone, Default, PartialEq)]
struct RareFields {
    uid: Option<Box<str>>,
    deletion_timestamp: Option<Time>,
    hostname: Option<Box<str>>,
    subdomain: Option<Box<str>>,
    /// Named container ports of the containers, then of the sidecar init containers
    /// (`restartPolicy: Always`), in order: what a named `targetPort` resolves through.
    ports: Box<[NamedPort]>,
}

impl RareFields {
    fn boxed_unless_empty(self) -> Option<Box<Self>> {
        (self != Self::default()).then(|| Box::new(self))
    }
}

/// A Service as the store keeps it: the JSON text of the Service as read (k8s-openapi
/// leaves absent fields out, so a few hundred bytes in one allocation instead of the
/// ~1.5 KB in a dozen allocations of the parsed Service and its selector map), and its
/// selector in key order, shared through the [`Interner`] with the Pods' label sets it
/// usually equals. The controller step reads the selector for every changed Pod and
/// decodes the whole Service only when it allocates or plans it. Kept whole when the text
/// does not decode to exactly the Service it was made from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ServiceRecord {
    selector: Option<LabelSet>,
    form: ServiceForm,
}

#[derive(Debug, Clone, PartialEq)]
enum ServiceForm {
    /// `serde_json` of the Service; equal Services give equal text, and the text decodes to
    /// the Service (checked when made), so equal text means equal Services.
    Json(Box<[u8]>),
    Whole(Box<Service>),
}

impl ServiceRecord {
    /// The record of `service`, made on this thread (the parsed Service is then dropped).
    pub(crate) fn new(service: Box<Service>, interner: &mut Interner) -> Self {
        let selector = service.spec.as_ref().and_then(|spec| spec.selector.as_ref()).map(|selector| {
            let labels: Vec<(Arc<str>, Arc<str>)> =
                selector.iter().map(|(key, value)| (interner.string(key), interner.string(value))).collect();
            interner.label_set(&labels)
        });
        let form = match serde_json::to_vec(&*service) {
            Ok(text) if serde_json::from_slice::<Service>(&text).is_ok_and(|decoded| decoded == *service) => {
                ServiceForm::Json(text.into_boxed_slice())
            }
            _ => ServiceForm::Whole(service),
        };
        Self { selector, form }
    }

    /// The Service as read.
    pub(crate) fn service(&self) -> Service {
        match &self.form {
            ServiceForm::Json(text) => {
                serde_json::from_slice(text).expect("a Service record's text decodes (checked when it was made)")
            }
            ServiceForm::Whole(service) => Service::clone(service),
        }
    }

    /// `spec.selector`, in key order (`None` without one).
    pub(crate) fn selector(&self) -> Option<&[(Arc<str>, Arc<str>)]> {
        self.selector.as_deref()
    }

    /// The first label of the selector (in key order), which the controller step indexes
    /// Services by.
    pub(crate) fn first_selector_label(&self) -> Option<(&str, &str)> {
        self.selector()?.first().map(|(key, value)| (&**key, &**value))
    }

    #[cfg(test)]
    fn is_text(&self) -> bool {
        matches!(self.form, ServiceForm::Json(_))
    }
}

/// A named container port: name, protocol as written, number.
type NamedPort = (Box<str>, Option<Box<str>>, i32);

/// A Pod's labels, in key order; shared by the Pods that have the same ones.
type LabelSet = Arc<[(Arc<str>, Arc<str>)]>;

/// A held Pod's node and phase, shared by the Pods that have the same pair (at 10k
/// Services x 10 Pods, ten nodes and one phase): one pointer in each [`HeldPod`] instead of
/// two 16-byte ones, which brings a held Pod's allocation from 112 to 80 bytes.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Placement {
    node_name: Option<Arc<str>>,
    phase: Option<Arc<str>>,
}

/// The strings, label sets and placements records share. Entries no record holds any more
/// are dropped by [`Interner::forget_unused`], so edits do not make it grow for good.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    strings: FastSet<Arc<str>>,
    label_sets: FastSet<LabelSet>,
    placements: FastSet<Arc<Placement>>,
    /// Entries after the last [`Interner::forget_unused`].
    kept: usize,
}

impl Interner {
    fn string(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(text) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = Arc::from(text);
        self.strings.insert(Arc::clone(&shared));
        shared
    }

    fn label_set(&mut self, labels: &[(Arc<str>, Arc<str>)]) -> LabelSet {
        if let Some(shared) = self.label_sets.get(labels) {
            return Arc::clone(shared);
        }
        let shared: LabelSet =
            labels.iter().map(|(key, value)| (self.string(key), self.string(value))).collect::<Vec<_>>().into();
        self.label_sets.insert(Arc::clone(&shared));
        shared
    }

    fn placement(&mut self, node_name: Option<&str>, phase: Option<&str>) -> Arc<Placement> {
        let placement = Placement {
            node_name: node_name.map(|node| self.string(node)),
            phase: phase.map(|phase| self.string(phase)),
        };
        if let Some(shared) = self.placements.get(&placement) {
            return Arc::clone(shared);
        }
        let shared = Arc::new(placement);
        self.placements.insert(Arc::clone(&shared));
        shared
    }

    /// Drops the entries only the interner holds, once it has doubled since the last time
    /// (so the cost is spread over the insertions that made it grow).
    pub(crate) fn forget_unused(&mut self) {
        if self.len() < 2 * self.kept.max(1024) {
            return;
        }
        // Label sets and placements first: the strings only they held are then unused too.
        self.label_sets.retain(|set| Arc::strong_count(set) > 1);
        self.placements.retain(|placement| Arc::strong_count(placement) > 1);
        self.strings.retain(|text| Arc::strong_count(text) > 1);
        self.kept = self.len();
    }

    pub(crate) fn len(&self) -> usize {
        self.strings.len() + self.label_sets.len() + self.placements.len()
    }
}

/// A Pod manifest as the record reads it: only the fields [`PodRecord`] keeps, every other
/// field skipped by the parser (no `k8s-openapi` Pod is built: parsing one allocated
/// several kilobytes per Pod, most of it for fields nothing here reads). Optional
/// everywhere, so that `null` and a missing field mean the same, as for `k8s-openapi`.
/// Strings are borrowed from the document where the parser can lend them (the fast
/// reader always can), so reading one allocates only the record.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodDocument<'a> {
    #[serde(borrow)]
    metadata: Option<PodMetadata<'a>>,
    #[serde(borrow)]
    spec: Option<PodSpecDocument<'a>>,
    #[serde(borrow)]
    status: Option<PodStatusDocument<'a>>,
}

/// A string of a document: borrowed from its text when the parser lends it, else owned.
#[derive(Debug, Default, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Text<'a>(std::borrow::Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> serde::de::Visitor<'de> for TextVisitor {
            type Value = Text<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a string")
            }

            fn visit_borrowed_str<E: serde::de::Error>(self, text: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(text)))
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Owned(text.to_owned())))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Text<'de>, E> {
                Ok(Text(std::borrow::Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(TextVisitor)
    }
}

fn boxed_text(text: Option<Text<'_>>) -> Option<Box<str>> {
    text.map(|text| Box::from(&*text))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodMetadata<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    namespace: Option<Text<'a>>,
    #[serde(borrow)]
    uid: Option<Text<'a>>,
    #[serde(borrow)]
    labels: Option<BTreeMap<Text<'a>, Text<'a>>>,
    #[serde(rename = "deletionTimestamp")]
    deletion_timestamp: Option<Time>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodSpecDocument<'a> {
    #[serde(rename = "nodeName", borrow)]
    node_name: Option<Text<'a>>,
    #[serde(borrow)]
    hostname: Option<Text<'a>>,
    #[serde(borrow)]
    subdomain: Option<Text<'a>>,
    #[serde(borrow)]
    containers: Option<Vec<ContainerDocument<'a>>>,
    #[serde(rename = "initContainers", borrow)]
    init_containers: Option<Vec<ContainerDocument<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerDocument<'a> {
    #[serde(rename = "restartPolicy", borrow)]
    restart_policy: Option<Text<'a>>,
    #[serde(borrow)]
    ports: Option<Vec<ContainerPortDocument<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ContainerPortDocument<'a> {
    #[serde(borrow)]
    name: Option<Text<'a>>,
    #[serde(borrow)]
    protocol: Option<Text<'a>>,
    #[serde(rename = "containerPort")]
    container_port: i32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodStatusDocument<'a> {
    #[serde(borrow)]
    phase: Option<Text<'a>>,
    #[serde(rename = "podIP", borrow)]
    pod_ip: Option<Text<'a>>,
    #[serde(rename = "podIPs", borrow)]
    pod_ips: Option<Vec<PodIpDocument<'a>>>,
    #[serde(borrow)]
    conditions: Option<Vec<ConditionDocument<'a>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodIpDocument<'a> {
    #[serde(borrow)]
    ip: Text<'a>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ConditionDocument<'a> {
    #[serde(rename = "type", borrow)]
    type_: Text<'a>,
    #[serde(borrow)]
    status: Text<'a>,
}

/// A Pod as the store keeps it: its [`PodRecord`] without the name and namespace (the
/// store's name for the object holds them), with the strings that repeat over Pods shared
/// and the usual addresses (`podIP` an IPv4 address, `podIPs` just that one) in four
/// bytes: 40 bytes and no allocation of its own, where the record is 128 bytes and two
/// allocations (name, address). What most Pods lack (the rare fields, other addresses)
/// is boxed together behind one pointer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeldPod {
    /// In key order.
    labels: LabelSet,
    placement: Arc<Placement>,
    extra: Option<Box<Extra>>,
    /// The address when `form` is [`AddressForm::V4`].
    v4: [u8; 4],
    form: AddressForm,
    ready: bool,
}

/// Where a [`HeldPod`]'s addresses are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AddressForm {
    /// Neither `podIP` nor `podIPs`.
    None,
    /// `podIP` is the IPv4 address in `v4`, spelled the usual way, and `podIPs` is `[podIP]`.
    V4,
    /// Anything else, in the [`Extra`].
    Other,
}

/// The parts of a [`HeldPod`] most Pods written as manifests do not have.
#[derive(Debug, Clone, Default, PartialEq)]
struct Extra {
    /// Default when the Pod has none of them.
    rare: RareFields,
    /// Unused unless the form is [`AddressForm::Other`].
    addresses: RecordAddresses,
}

/// `status.podIP` and `status.podIPs` as a [`HeldPod`] has them, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Addresses<'a> {
    None,
    V4([u8; 4]),
    Other(&'a RecordAddresses),
}

/// `podIP`, `podIPs` and whether `podIPs` is `[podIP]`, as a [`PodRecord`] holds them.
type RecordAddresses = (Option<Box<str>>, Box<[Box<str>]>, bool);

/// How a record's addresses are held: the form, the inline IPv4 address, the fields when
/// they are anything else.
fn hold_addresses(
    pod_ip: Option<&str>,
    pod_ips: &[Box<str>],
    pod_ips_is_pod_ip: bool,
) -> (AddressForm, [u8; 4], Option<RecordAddresses>) {
    if let Some(text) = pod_ip
        && pod_ips_is_pod_ip
        && let Ok(address) = text.parse::<std::net::Ipv4Addr>()
        && address.to_string() == text
    {
        return (AddressForm::V4, address.octets(), None);
    }
    if pod_ip.is_none() && pod_ips.is_empty() && !pod_ips_is_pod_ip {
        return (AddressForm::None, [0; 4], None);
    }
    let pod_ips = pod_ips.iter().map(|ip| Box::from(&**ip)).collect();
    (AddressForm::Other, [0; 4], Some((pod_ip.map(Box::from), pod_ips, pod_ips_is_pod_ip)))
}

impl Addresses<'_> {
    /// `podIP`, `podIPs` and whether `podIPs` is `[podIP]`, as the record holds them.
    fn to_record(self) -> RecordAddresses {
        match self {
            Addresses::None => (None, Box::default(), false),
            Addresses::V4(octets) => {
                (Some(std::net::Ipv4Addr::from(octets).to_string().into_boxed_str()), Box::default(), true)
            }
            Addresses::Other(fields) => fields.clone(),
        }
    }
}

impl HeldPod {
    /// The record this was made from, given the Pod's namespace and name.
    pub(crate) fn to_record(&self, namespace: &str, name: &str) -> PodRecord {
        let (pod_ip, pod_ips, pod_ips_is_pod_ip) = self.addresses().to_record();
        PodRecord {
            name: Box::from(name),
            namespace: Arc::from(namespace),
            labels: Arc::clone(&self.labels),
            node_name: self.placement.node_name.clone(),
            rare: self.rare().cloned().and_then(RareFields::boxed_unless_empty),
            phase: self.placement.phase.clone(),
            pod_ip,
            pod_ips,
            pod_ips_is_pod_ip,
            ready: self.ready,
        }
    }

    /// A Pod with just the recorded fields (see [`PodRecord::to_pod`]), made without the
    /// record in between (tests: the Pod a [`NamedPod`] must read as).
    #[cfg(test)]
    pub(crate) fn to_pod(&self, namespace: &str, name: &str) -> Pod {
        let (pod_ip, pod_ips, pod_ips_is_pod_ip): (Option<String>, &[Box<str>], bool) = match self.addresses() {
            Addresses::None => (None, &[], false),
            Addresses::V4(octets) => (Some(std::net::Ipv4Addr::from(octets).to_string()), &[], true),
            Addresses::Other(fields) => (fields.0.as_deref().map(str::to_owned), &fields.1, fields.2),
        };
        build_pod(PodParts {
            name,
            namespace,
            labels: &self.labels,
            node_name: self.placement.node_name.as_deref(),
            phase: self.placement.phase.as_deref(),
            rare: self.rare(),
            pod_ip,
            pod_ips,
            pod_ips_is_pod_ip,
            ready: self.ready,
        })
    }

    /// The rare fields, when the Pod has any.
    fn rare(&self) -> Option<&RareFields> {
        self.extra.as_ref().map(|extra| &extra.rare).filter(|rare| **rare != RareFields::default())
    }

    fn addresses(&self) -> Addresses<'_> {
        match (self.form, &self.extra) {
            (AddressForm::V4, _) => Addresses::V4(self.v4),
            (AddressForm::Other, Some(extra)) => Addresses::Other(&extra.addresses),
            _ => Addresses::None,
        }
    }

    pub(crate) fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.iter().map(|(key, value)| (&**key, &**value))
    }

    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*self.labels[i].1)
    }
}

/// A held Pod under the name the store keeps it by: what the slice planner reads of it
/// ([`PodFacts`]), answered from the record itself, so that planning a Service builds no
/// `k8s-openapi` Pod per candidate (that was half of planning a first read).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NamedPod<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) name: &'a str,
    pub(crate) pod: &'a HeldPod,
}

impl PodFacts for NamedPod<'_> {
    fn namespace(&self) -> Option<&str> {
        Some(self.namespace)
    }
    fn name(&self) -> Option<&str> {
        Some(self.name)
    }
    fn uid(&self) -> Option<&str> {
        self.pod.rare()?.uid.as_deref()
    }
    fn label(&self, key: &str) -> Option<&str> {
        self.pod.label(key)
    }
    fn phase(&self) -> Option<&str> {
        self.pod.placement.phase.as_deref()
    }
    fn node_name(&self) -> Option<&str> {
        self.pod.placement.node_name.as_deref()
    }
    fn hostname(&self) -> Option<&str> {
        self.pod.rare()?.hostname.as_deref()
    }
    fn subdomain(&self) -> Option<&str> {
        self.pod.rare()?.subdomain.as_deref()
    }
    fn is_terminating(&self) -> bool {
        self.pod.rare().is_some_and(|rare| rare.deletion_timestamp.is_some())
    }
    fn is_ready(&self) -> bool {
        self.pod.ready
    }
    fn ip_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        // `podIPs` when it lists any, else `podIP`, as for a Pod.
        let (inline, texts): (Option<IpAddr>, &[Box<str>]) = match self.pod.addresses() {
            Addresses::None => (None, &[]),
            Addresses::V4(octets) => (Some(IpAddr::from(octets)), &[]),
            Addresses::Other(fields) => {
                let (pod_ip, pod_ips, pod_ips_is_pod_ip) = fields;
                if *pod_ips_is_pod_ip || pod_ips.is_empty() { (None, pod_ip.as_slice()) } else { (None, &pod_ips[..]) }
            }
        };
        inline.into_iter().chain(texts.iter().filter_map(|text| text.parse().ok()))
    }
    fn named_port(&self, name: &str, protocol: &str) -> Option<i32> {
        let ports = self.pod.rare().map(|rare| &rare.ports[..]).unwrap_or_default();
        ports.iter().find_map(|(port_name, port_protocol, number)| {
            let port_protocol = port_protocol.as_deref().filter(|p| !p.is_empty()).unwrap_or("TCP");
            (&**port_name == name && port_protocol == protocol).then_some(*number)
        })
    }
}

impl<'de> Deserialize<'de> for PodRecord {
    /// Reads a Pod manifest straight into its record (see [`PodDocument`]); errors name
    /// the field, as a `k8s-openapi` Pod's did, for the fields read.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        PodDocument::deserialize(deserializer).map(PodRecord::from_document)
    }
}

impl PodRecord {
    fn from_document(document: PodDocument<'_>) -> Self {
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
            .filter_map(|port| Some((Box::from(&*port.name?), boxed_text(port.protocol), port.container_port)))
            .collect();
        let ready = status.conditions.iter().flatten().any(|c| &*c.type_ == "Ready" && &*c.status == "True");
        let pod_ips: Vec<Text<'_>> = status.pod_ips.into_iter().flatten().map(|ip| ip.ip).collect();
        let pod_ips_is_pod_ip = matches!((&status.pod_ip, &pod_ips[..]), (Some(ip), [only]) if ip == only);
        Self {
            name: Box::from(name.as_deref().unwrap_or_default()),
            namespace: Arc::from(namespace.as_deref().unwrap_or_default()),
            labels: labels.into_iter().flatten().map(|(key, value)| (Arc::from(&*key), Arc::from(&*value))).collect(),
            node_name: spec.node_name.as_deref().map(Arc::from),
            rare: RareFields {
                uid: boxed_text(uid),
                deletion_timestamp,
                hostname: boxed_text(spec.hostname),
                subdomain: boxed_text(spec.subdomain),
                ports: ports.into_boxed_slice(),
            }
            .boxed_unless_empty(),
            phase: status.phase.as_deref().map(Arc::from),
            pod_ip: boxed_text(status.pod_ip),
            pod_ips: if pod_ips_is_pod_ip {
                Box::default()
            } else {
                pod_ips.iter().map(|ip| Box::from(&**ip)).collect()
            },
            pod_ips_is_pod_ip,
            ready,
        }
    }

    /// The record as the store keeps it ([`HeldPod`]), made anew on this thread with the
    /// strings that repeat over Pods shared through `interner` (the parse threads' record,
    /// with its temporaries beside it, is then dropped).
    pub(crate) fn shared(&self, interner: &mut Interner) -> HeldPod {
        let (form, v4, other) = hold_addresses(self.pod_ip.as_deref(), &self.pod_ips, self.pod_ips_is_pod_ip);
        HeldPod {
            labels: interner.label_set(&self.labels),
            placement: interner.placement(self.node_name.as_deref(), self.phase.as_deref()),
            extra: (self.rare.is_some() || other.is_some()).then(|| {
                Box::new(Extra {
                    rare: self.rare.as_deref().cloned().unwrap_or_default(),
                    addresses: other.unwrap_or_default(),
                })
            }),
            v4,
            form,
            ready: self.ready,
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
        self.namespace = Arc::from(namespace);
    }

    /// A Pod with just the recorded fields: planning it gives the same slices as planning
    /// the Pod it was made from.
    pub(crate) fn to_pod(&self) -> Pod {
        build_pod(PodParts {
            name: &self.name,
            namespace: &self.namespace,
            labels: &self.labels,
            node_name: self.node_name.as_deref(),
            phase: self.phase.as_deref(),
            rare: self.rare.as_deref(),
            pod_ip: self.pod_ip.as_deref().map(str::to_owned),
            pod_ips: &self.pod_ips,
            pod_ips_is_pod_ip: self.pod_ips_is_pod_ip,
            ready: self.ready,
        })
    }
}

/// What a Pod with just the recorded fields is made of, borrowed from a record or a held
/// Pod.
struct PodParts<'a> {
    name: &'a str,
    namespace: &'a str,
    labels: &'a [(Arc<str>, Arc<str>)],
    node_name: Option<&'a str>,
    phase: Option<&'a str>,
    rare: Option<&'a RareFields>,
    pod_ip: Option<String>,
    /// `status.podIPs` unless it is `[podIP]` (then empty, and `pod_ips_is_pod_ip`).
    pod_ips: &'a [Box<str>],
    pod_ips_is_pod_ip: bool,
    ready: bool,
}

fn build_pod(parts: PodParts<'_>) -> Pod {
    let PodParts { name, namespace, labels, node_name, phase, rare, pod_ip, pod_ips, pod_ips_is_pod_ip, ready } = parts;
    let pod_ips: Option<Vec<PodIP>> = if pod_ips_is_pod_ip {
        pod_ip.clone().map(|ip| vec![PodIP { ip }])
    } else {
        (!pod_ips.is_empty()).then(|| pod_ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect())
    };
    let text = |value: &Option<Box<str>>| value.as_deref().map(str::to_owned);
    let labels: BTreeMap<String, String> =
        labels.iter().map(|(key, value)| (key.to_string(), value.to_string())).collect();
    let ports: Vec<ContainerPort> = rare
        .map(|rare| &rare.ports[..])
        .unwrap_or_default()
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
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: rare.and_then(|rare| text(&rare.uid)),
            labels: (!labels.is_empty()).then_some(labels),
            deletion_timestamp: rare.and_then(|rare| rare.deletion_timestamp.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: node_name.map(str::to_owned),
            hostname: rare.and_then(|rare| text(&rare.hostname)),
            subdomain: rare.and_then(|rare| text(&rare.subdomain)),
            containers,
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: phase.map(str::to_owned),
            pod_ip,
            pod_ips,
            conditions: ready.then(|| {
                vec![PodCondition { type_: "Ready".to_owned(), status: "True".to_owned(), ..PodCondition::default() }]
            }),
            ..PodStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServicePort;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn bench_pod(name: &str, app: &str) -> PodRecord {
        PodRecord::of(pod(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "198.18.129.2", "podIPs": [{"ip": "198.18.129.2"}],
                       "conditions": [{"type": "Ready", "status": "True"}]}
        })))
    }

    #[test]
    fn shared_records_hold_repeated_strings_once_and_the_interner_forgets_what_no_record_holds() {
        let mut interner = Interner::default();
        let (a, b) = (bench_pod("a", "web"), bench_pod("b", "web"));
        let (shared_a, shared_b) = (a.shared(&mut interner), b.shared(&mut interner));
        assert_eq!(shared_a.to_record("shop", "a"), a);
        assert_eq!(shared_a.to_pod("shop", "a"), a.to_pod());
        assert!(Arc::ptr_eq(&shared_a.labels, &shared_b.labels));
        assert!(Arc::ptr_eq(&shared_a.placement, &shared_b.placement), "one node and phase, one placement");
        assert_eq!(shared_a.addresses(), Addresses::V4([198, 18, 129, 2]), "podIP and podIPs in four bytes");
        assert!(size_of::<HeldPod>() <= 56, "{} bytes", size_of::<HeldPod>());
        assert!(shared_a.extra.is_none(), "no uid, hostname, subdomain, deletion or named port: nothing rare kept");
        let held = interner.len();
        for i in 0..3000 {
            let mut pod = bench_pod(&format!("p-{i}"), &format!("app-{i}"));
            pod.node_name = Some(Arc::from(format!("node-x{i}")));
            drop(pod.shared(&mut interner));
        }
        assert!(interner.len() >= held + 4 * 3000, "every new label set, value, node and placement was interned");
        interner.forget_unused();
        assert_eq!(interner.len(), held, "only what the two records still hold stays");
        assert_eq!(shared_b.label("app"), Some("web"));
    }

    #[test]
    fn a_service_kept_as_text_decodes_to_the_service_as_read_and_shares_its_selector_with_the_pods_labels() {
        let mut interner = Interner::default();
        let pod = bench_pod("a", "web").shared(&mut interner);
        let read = |value: serde_json::Value| -> Box<Service> { Box::new(serde_json::from_value(value).unwrap()) };
        let web = read(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "annotations": {"a": "b"}},
            "spec": {"type": "NodePort", "selector": {"app": "web"}, "clusterIP": "198.19.0.5",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080}],
                     "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}
        }));
        let record = ServiceRecord::new(web.clone(), &mut interner);
        assert!(record.is_text());
        assert_eq!(record.service(), *web);
        assert!(Arc::ptr_eq(record.selector.as_ref().unwrap(), &pod.labels), "the selector is the Pods' label set");
        assert_eq!(record.first_selector_label(), Some(("app", "web")));
        assert_eq!(ServiceRecord::new(web.clone(), &mut interner), record);
        let mut other = web.clone();
        other.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
        assert_ne!(ServiceRecord::new(other, &mut interner), record);
        let headless = read(serde_json::json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}}));
        let record = ServiceRecord::new(headless.clone(), &mut interner);
        assert_eq!((record.selector(), record.service()), (None, *headless));
    }

    #[test]
    fn a_pod_rebuilt_from_its_record_and_a_held_pod_read_in_place_plan_the_same_slices_as_the_pod() {
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
            pod(serde_json::json!({
                "metadata": {"name": "d", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"containers": []},
                "status": {"phase": "Pending"}
            })),
            pod(serde_json::json!({
                "metadata": {"name": "e", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-1", "containers": []},
                "status": {"podIP": "198.18.129.5", "podIPs": [{"ip": "198.18.129.5"}],
                           "conditions": [{"type": "Ready", "status": "True"}]}
            })),
            // podIPs that differ from podIP win; a named port of another protocol does not
            // resolve; a hostname under another subdomain is not published.
            pod(serde_json::json!({
                "metadata": {"name": "f", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-1", "hostname": "f", "subdomain": "other",
                         "containers": [{"name": "app", "image": "i",
                                         "ports": [{"name": "http", "containerPort": 8081, "protocol": "UDP"},
                                                   {"name": "metrics", "containerPort": 9091, "protocol": ""}]}]},
                "status": {"podIP": "198.18.129.6", "podIPs": [{"ip": "2001:db8:1:1::6"}, {"ip": "198.18.129.7"}],
                           "conditions": [{"type": "Ready", "status": "True"}]}
            })),
            // An address spelled unusually, one that is no address, an empty podIPs.
            pod(serde_json::json!({
                "metadata": {"name": "g", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-2", "containers": []},
                "status": {"podIP": "2001:DB8:1:1::8", "podIPs": [],
                           "conditions": [{"type": "Ready", "status": "True"}]}
            })),
            pod(serde_json::json!({
                "metadata": {"name": "h", "namespace": "shop", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-2", "containers": []},
                "status": {"podIPs": [{"ip": "not-an-address"}, {"ip": "198.18.130.9"}]}
            })),
            // Another namespace and a Pod the selector does not select.
            pod(serde_json::json!({
                "metadata": {"name": "i", "namespace": "other", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-2", "containers": []},
                "status": {"podIP": "198.18.130.10"}
            })),
            pod(serde_json::json!({
                "metadata": {"name": "j", "namespace": "shop", "labels": {"app": "api"}},
                "spec": {"nodeName": "node-2", "containers": []},
                "status": {"podIP": "198.18.130.11"}
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
        let mut interner = Interner::default();
        let held: Vec<HeldPod> = pods.iter().map(|p| PodRecord::of(p.clone()).shared(&mut interner)).collect();
        let names: Vec<(&str, &str)> = pods
            .iter()
            .map(|p| (p.metadata.namespace.as_deref().unwrap(), p.metadata.name.as_deref().unwrap()))
            .collect();
        let held_pods: Vec<Pod> =
            held.iter().zip(&names).map(|(pod, (namespace, name))| pod.to_pod(namespace, name)).collect();
        assert_eq!(held_pods, rebuilt, "a held Pod gives back its record's Pod, whatever its addresses");
        let original = svcplane_controller::plan_slices(&service, &pods, None).unwrap();
        let from_records = svcplane_controller::plan_slices(&service, &rebuilt, None).unwrap();
        assert!(!original.is_empty());
        assert_eq!(original, from_records);
        let in_place: Vec<NamedPod<'_>> =
            held.iter().zip(&names).map(|(pod, &(namespace, name))| NamedPod { namespace, name, pod }).collect();
        let from_held = svcplane_controller::plan_slices_from(&service, &in_place, &[]).unwrap();
        assert_eq!(from_held, original, "the planner reads a held Pod as it reads the Pod");
        let endpoints: usize = original.iter().map(|slice| slice.endpoints.len()).sum();
        assert_eq!(endpoints, 8, "a and f in both families, b, e, g, h; not c, d, i, j: {original:#?}");
        let record = PodRecord::of(pods[0].clone()).shared(&mut interner);
        assert_eq!(record.label("tier"), Some("x"));
        assert_eq!(record.labels().count(), 2);
    }
}
