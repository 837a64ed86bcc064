//! EndpointSlices for Services with a selector, planned from Pods the way the upstream
//! EndpointSlice controller lays them out.
//!
//! - Pods are selected from the Service's namespace when their labels contain every
//!   key/value of `spec.selector`. An absent *or empty* selector selects nothing: such
//!   Services get their endpoints from explicit EndpointSlices (the API server drops an
//!   empty selector the same way).
//! - Pods that are terminal (`Succeeded`, `Failed`), not scheduled (no `spec.nodeName`) or
//!   without an IP are never endpoints. Terminating Pods (with `deletionTimestamp`) are,
//!   with `terminating: true`.
//! - Conditions: `serving` is the Pod's `Ready` condition; `ready` is `serving` and not
//!   terminating, or always true with `spec.publishNotReadyAddresses`.
//! - Address families are the Service's `spec.ipFamilies` (else the family of
//!   `spec.clusterIP`, else both), each Pod contributing its first IP of each family.
//! - Each Service port's `targetPort` is resolved per Pod: a number as is, a name through
//!   the Pod's container ports of the same protocol (sidecar init containers included),
//!   nothing means the Service port. A Pod lacking a named port is published without that
//!   port; Pods are grouped by the resulting port list, and each (family, port list) group
//!   is cut into slices of at most [`MAX_ENDPOINTS_PER_SLICE`] endpoints, sorted by address.
//! - Slice names are `<service>-<suffix>`, the suffix a stable hash of the Service, family,
//!   port list and chunk index: planning the same input twice gives the same names.
//! - There is no placeholder slice for a Service without endpoints: it just has no slices.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Container, Node, ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::error::{ControllerError, Reason};
use crate::ip_family::IpFamily;
use crate::object_key::{DEFAULT_NAMESPACE, ObjectKey, namespace_of};
use crate::stable_hash::stable_suffix;

/// At most this many endpoints go into one slice, as upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The label naming the Service a slice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Present (with an empty value) on slices of headless Services; kube-proxy skips those.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Our value of [`LABEL_MANAGED_BY`]. Upstream's is `endpointslice-controller.k8s.io`; a
/// different value lets both run against one API server without fighting over slices.
pub const MANAGED_BY: &str = "endpointslice-controller.svcplane.io";

const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
const SUFFIX_LEN: usize = 10;

/// The EndpointSlices of one Service, from any set of Pods (other namespaces are ignored)
/// and, for `zone`, optionally the Nodes. Scans every Pod: to plan many Services over the
/// same Pods, use a [`SlicePlanner`].
///
/// Returns no slices for Services without a selector and for ExternalName Services; fails
/// only for a Service without `metadata.name`.
pub fn plan_slices(
    service: &Service,
    pods: &[Pod],
    nodes: Option<&[Node]>,
) -> Result<Vec<EndpointSlice>, ControllerError> {
    plan_slices_from(service, pods, nodes.unwrap_or_default())
}

/// The same as [`plan_slices`] over Pods the caller already narrowed down (for an
/// incremental controller that indexes Pods itself): of `candidates`, those in the
/// Service's namespace that can be endpoints and carry every selector label are used.
/// The candidates are anything that answers [`PodFacts`]: `k8s-openapi` Pods, or a feed's
/// own compact records, which then need not be made into Pods first.
pub fn plan_slices_from<P: PodFacts>(
    service: &Service,
    candidates: &[P],
    nodes: &[Node],
) -> Result<Vec<EndpointSlice>, ControllerError> {
    Ok(plan_slice_shapes_from(service, candidates, nodes)?.map(|planned| planned.endpoint_slices()).unwrap_or_default())
}

/// The same as [`plan_slices_from`], with the slices as planned rather than written as
/// objects (`None` for a Service that gets no slices from us): for a feed that converts
/// slices into a model of its own, which then need not be built as objects first.
pub fn plan_slice_shapes_from<'a, P: PodFacts>(
    service: &'a Service,
    candidates: &'a [P],
    nodes: &'a [Node],
) -> Result<Option<ServiceSlices<'a>>, ControllerError> {
    let Some(target) = Target::of(service)? else { return Ok(None) };
    let zones = Zones::new(nodes);
    let selected: Vec<&P> = candidates
        .iter()
        .filter(|pod| {
            namespace_or_default(pod.namespace()) == target.key.namespace
                && is_endpoint_candidate(*pod)
                && has_labels(*pod, target.selector)
        })
        .collect();
    let slices = target.plan(&selected, &zones);
    Ok(Some(ServiceSlices { target, slices }))
}

/// A Service's EndpointSlices as planned ([`plan_slice_shapes_from`]).
#[derive(Debug)]
pub struct ServiceSlices<'a> {
    target: Target<'a>,
    slices: Vec<PlannedSlice<'a>>,
}

impl<'a> ServiceSlices<'a> {
    /// The slices, IPv4 ones first, in the order [`plan_slices`] returns them.
    pub fn slices(&self) -> &[PlannedSlice<'a>] {
        &self.slices
    }

    /// The Service the slices are for.
    pub fn service(&self) -> &ObjectKey {
        &self.target.key
    }

    /// Whether every slice of the Service carries the label `key` (its own labels are
    /// copied onto its slices, with the ones this controller sets).
    pub fn slices_carry_label(&self, key: &str) -> bool {
        match key {
            LABEL_SERVICE_NAME | LABEL_MANAGED_BY => true,
            LABEL_HEADLESS => self.target.headless,
            _ => self.target.service.metadata.labels.as_ref().is_some_and(|labels| labels.contains_key(key)),
        }
    }

    /// `slice` (one of [`Self::slices`]) written as the EndpointSlice object.
    pub fn endpoint_slice(&self, slice: &PlannedSlice<'_>) -> EndpointSlice {
        self.target.endpoint_slice(slice)
    }

    /// Every slice written as an EndpointSlice object.
    pub fn endpoint_slices(&self) -> Vec<EndpointSlice> {
        self.slices.iter().map(|slice| self.endpoint_slice(slice)).collect()
    }
}

/// One EndpointSlice as planned, before it is written as an object.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedSlice<'a> {
    pub name: String,
    pub family: IpFamily,
    /// As the slice lists them: name, protocol and number always set.
    pub ports: Vec<EndpointPort>,
    /// Sorted by address, then Pod name.
    pub endpoints: Vec<PlannedEndpoint<'a>>,
}

/// One endpoint of a [`PlannedSlice`], its strings borrowed from its Pod and the Nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlannedEndpoint<'a> {
    pub address: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<&'a str>,
    /// The zone of its node.
    pub zone: Option<&'a str>,
    /// The Pod's `spec.hostname`, when its `spec.subdomain` is the Service's name.
    pub hostname: Option<&'a str>,
    /// The zone it is hinted for (`forZones`), if any.
    pub hint_zone: Option<&'a str>,
    /// The node it is hinted for (`forNodes`), if any.
    pub hint_node: Option<&'a str>,
    pub pod_name: Option<&'a str>,
    pub pod_uid: Option<&'a str>,
}

/// What slice planning reads of a Pod, and all it reads: the planner sees Pods only
/// through this. Implemented for `k8s-openapi` Pods; a feed that holds Pods in a compact form of its own implements it for
/// that form.
pub trait PodFacts {
    /// `metadata.namespace` as written (absent or empty means `default`).
    fn namespace(&self) -> Option<&str>;
    /// `metadata.name`.
    fn name(&self) -> Option<&str>;
    /// `metadata.uid`.
    fn uid(&self) -> Option<&str>;
    /// The value of the label `key`.
    fn label(&self, key: &str) -> Option<&str>;
    /// `status.phase`.
    fn phase(&self) -> Option<&str>;
    /// `spec.nodeName`.
    fn node_name(&self) -> Option<&str>;
    /// `spec.hostname`.
    fn hostname(&self) -> Option<&str>;
    /// `spec.subdomain`.
    fn subdomain(&self) -> Option<&str>;
    /// `metadata.deletionTimestamp` is set.
    fn is_terminating(&self) -> bool;
    /// A `Ready` condition with status `True`.
    fn is_ready(&self) -> bool;
    /// `status.podIPs`, else `status.podIP`, in order; strings that are not addresses are
    /// skipped.
    fn ip_addresses(&self) -> impl Iterator<Item = IpAddr> + '_;
    /// The number of the container port called `name` with `protocol` (a port without a
    /// protocol is TCP), in the containers, then the sidecars (init containers with
    /// `restartPolicy: Always`); the first that matches.
    fn named_port(&self, name: &str, protocol: &str) -> Option<i32>;
}

impl PodFacts for Pod {
    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }
    fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }
    fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }
    fn phase(&self) -> Option<&str> {
        self.status.as_ref()?.phase.as_deref()
    }
    fn node_name(&self) -> Option<&str> {
        self.spec.as_ref()?.node_name.as_deref()
    }
    fn hostname(&self) -> Option<&str> {
        self.spec.as_ref()?.hostname.as_deref()
    }
    fn subdomain(&self) -> Option<&str> {
        self.spec.as_ref()?.subdomain.as_deref()
    }
    fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
    fn is_ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }
    fn ip_addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let status = self.status.as_ref();
        let listed = status.and_then(|s| s.pod_ips.as_deref()).filter(|ips| !ips.is_empty());
        let single = if listed.is_none() { status.and_then(|s| s.pod_ip.as_deref()) } else { None };
        listed.into_iter().flatten().map(|ip| ip.ip.as_str()).chain(single).filter_map(|text| text.parse().ok())
    }
    fn named_port(&self, name: &str, protocol: &str) -> Option<i32> {
        let spec = self.spec.as_ref()?;
        let sidecars = spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
        spec.containers
            .iter()
            .chain(sidecars)
            .flat_map(|container: &Container| container.ports.iter().flatten())
            .find_map(|port| {
                let port_protocol = port.protocol.as_deref().filter(|p| !p.is_empty()).unwrap_or("TCP");
                (port.name.as_deref() == Some(name) && port_protocol == protocol).then_some(port.container_port)
            })
    }
}

/// A Pod's namespace as planning compares it: absent or empty is `default`.
fn namespace_or_default(namespace: Option<&str>) -> &str {
    namespace.filter(|namespace| !namespace.is_empty()).unwrap_or(DEFAULT_NAMESPACE)
}

/// Plans the slices of many Services over one set of Pods, through a [`PodIndex`].
#[derive(Debug)]
pub struct SlicePlanner<'a> {
    pods: PodIndex<'a>,
    zones: Zones<'a>,
}

impl<'a> SlicePlanner<'a> {
    pub fn new(pods: &'a [Pod], nodes: Option<&'a [Node]>) -> Self {
        Self { pods: PodIndex::new(pods), zones: Zones::new(nodes.unwrap_or_default()) }
    }

    /// The same as [`plan_slices`] with this planner's Pods and Nodes.
    pub fn plan(&self, service: &Service) -> Result<Vec<EndpointSlice>, ControllerError> {
        let Some(target) = Target::of(service)? else { return Ok(Vec::new()) };
        let selected = self.pods.select(&target.key.namespace, target.selector);
        Ok(target.slices(&selected, &self.zones))
    }
}

/// The Pods that can be endpoints at all (not terminal, scheduled, with an IP), by namespace
/// and by label `key=value`, so that a selector costs the size of its rarest label rather
/// than a scan of every Pod.
#[derive(Debug, Default)]
pub struct PodIndex<'a> {
    namespaces: HashMap<&'a str, NamespacePods<'a>>,
}

#[derive(Debug, Default)]
struct NamespacePods<'a> {
    pods: Vec<&'a Pod>,
    /// `(key, value)` → indices into `pods`, ascending.
    by_label: HashMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> PodIndex<'a> {
    pub fn new(pods: &'a [Pod]) -> Self {
        let mut namespaces: HashMap<&'a str, NamespacePods<'a>> = HashMap::new();
        for pod in pods.iter().filter(|pod| is_endpoint_candidate(*pod)) {
            let namespace = namespaces.entry(namespace_of(&pod.metadata)).or_default();
            let index = namespace.pods.len();
            namespace.pods.push(pod);
            for (key, value) in pod.metadata.labels.iter().flatten() {
                namespace.by_label.entry((key.as_str(), value.as_str())).or_default().push(index);
            }
        }
        Self { namespaces }
    }

    /// The indexed Pods of `namespace` whose labels contain all of `selector`, in input
    /// order. An empty selector selects every indexed Pod of the namespace.
    pub fn select(&self, namespace: &str, selector: &BTreeMap<String, String>) -> Vec<&'a Pod> {
        let Some(pods) = self.namespaces.get(namespace) else { return Vec::new() };
        let mut postings = Vec::with_capacity(selector.len());
        for (key, value) in selector {
            match pods.by_label.get(&(key.as_str(), value.as_str())) {
                Some(list) => postings.push(list),
                None => return Vec::new(),
            }
        }
        let Some(rarest) = postings.iter().min_by_key(|list| list.len()) else { return pods.pods.clone() };
        rarest.iter().map(|&index| pods.pods[index]).filter(|pod| has_labels(*pod, selector)).collect()
    }
}

/// Node name → `topology.kubernetes.io/zone`.
#[derive(Debug, Default)]
struct Zones<'a> {
    by_node: HashMap<&'a str, &'a str>,
}

impl<'a> Zones<'a> {
    fn new(nodes: &'a [Node]) -> Self {
        let by_node = nodes
            .iter()
            .filter_map(|node| {
                let name = node.metadata.name.as_deref()?;
                let zone = node.metadata.labels.as_ref()?.get(LABEL_ZONE)?;
                Some((name, zone.as_str()))
            })
            .collect();
        Self { by_node }
    }

    fn of(&self, node: &str) -> Option<&'a str> {
        self.by_node.get(node).copied()
    }
}

/// A Service that gets slices from us, with what planning needs from it.
#[derive(Debug)]
struct Target<'s> {
    service: &'s Service,
    key: ObjectKey,
    selector: &'s BTreeMap<String, String>,
    ports: &'s [ServicePort],
    families: Vec<IpFamily>,
    headless: bool,
    publish_not_ready: bool,
    hints: Hints,
}

/// Which topology hints `spec.trafficDistribution` asks the endpoints to carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hints {
    None,
    /// `PreferClose` / `PreferSameZone`: each endpoint hinted for its own zone.
    SameZone,
    /// `PreferSameNode`: each endpoint hinted for its own node (and zone, as a fallback).
    SameNode,
}

impl Hints {
    fn of(traffic_distribution: Option<&str>) -> Self {
        match traffic_distribution {
            Some("PreferClose" | "PreferSameZone") => Hints::SameZone,
            Some("PreferSameNode") => Hints::SameNode,
            // Unknown values are ignored, as upstream does.
            _ => Hints::None,
        }
    }
}

impl<'s> Target<'s> {
    fn of(service: &'s Service) -> Result<Option<Self>, ControllerError> {
        let key = ObjectKey::of(&service.metadata);
        if key.name.is_empty() {
            return Err(ControllerError::PlanSlices {
                service: key,
                field: "metadata.name".into(),
                reason: Box::new(Reason::Missing),
            });
        }
        let Some(spec) = service.spec.as_ref() else { return Ok(None) };
        if spec.type_.as_deref() == Some("ExternalName") {
            return Ok(None);
        }
        let Some(selector) = spec.selector.as_ref().filter(|selector| !selector.is_empty()) else { return Ok(None) };
        let mut families: Vec<IpFamily> = Vec::new();
        for family in spec.ip_families.iter().flatten().filter_map(|text| IpFamily::from_kubernetes(text)) {
            if !families.contains(&family) {
                families.push(family);
            }
        }
        let cluster_ip = spec.cluster_ip.as_deref();
        if families.is_empty() {
            match cluster_ip.and_then(|ip| ip.parse::<IpAddr>().ok()) {
                Some(ip) => families.push(IpFamily::of(&ip)),
                None => families.extend([IpFamily::V4, IpFamily::V6]),
            }
        }
        Ok(Some(Self {
            service,
            key,
            selector,
            ports: spec.ports.as_deref().unwrap_or_default(),
            families,
            headless: cluster_ip == Some("None"),
            publish_not_ready: spec.publish_not_ready_addresses == Some(true),
            hints: Hints::of(spec.traffic_distribution.as_deref()),
        }))
    }

    fn slices<P: PodFacts>(&self, pods: &[&P], zones: &Zones<'_>) -> Vec<EndpointSlice> {
        self.plan(pods, zones).iter().map(|slice| self.endpoint_slice(slice)).collect()
    }

    /// The slices of `pods` (already selected), as planned: see the module documentation.
    fn plan<'p, P: PodFacts>(&self, pods: &[&'p P], zones: &Zones<'p>) -> Vec<PlannedSlice<'p>> {
        // Pods grouped by their resolved target ports (`None`: the named port is missing),
        // then by family (`[IPv4, IPv6]`).
        type Group<'p> = [Vec<PlannedEndpoint<'p>>; 2];
        let mut groups: BTreeMap<Vec<Option<i32>>, Group<'p>> = BTreeMap::new();
        for &pod in pods {
            let resolved: Vec<Option<i32>> = self.ports.iter().map(|port| resolve_target_port(port, pod)).collect();
            let group = groups.entry(resolved).or_default();
            let mut seen = [false; 2];
            for ip in pod.ip_addresses() {
                let family = IpFamily::of(&ip);
                let slot = family_slot(family);
                if !self.families.contains(&family) || seen[slot] {
                    continue;
                }
                seen[slot] = true;
                group[slot].push(self.endpoint(pod, ip, zones));
            }
        }

        let mut by_family: [Vec<PlannedSlice<'p>>; 2] = Default::default();
        for (resolved, group) in groups {
            let ports: Vec<EndpointPort> = self
                .ports
                .iter()
                .zip(&resolved)
                .filter_map(|(port, number)| Some(endpoint_port(port, (*number)?)))
                .collect();
            let port_text: Vec<String> = ports.iter().map(port_identity).collect();
            for (slot, mut endpoints) in group.into_iter().enumerate() {
                if endpoints.is_empty() {
                    continue;
                }
                let family = [IpFamily::V4, IpFamily::V6][slot];
                endpoints.sort_by(|a, b| {
                    a.address
                        .cmp(&b.address)
                        .then_with(|| a.pod_name.unwrap_or_default().cmp(b.pod_name.unwrap_or_default()))
                });
                let mut endpoints = endpoints.into_iter().peekable();
                let mut index = 0;
                while endpoints.peek().is_some() {
                    let chunk: Vec<PlannedEndpoint<'p>> = endpoints.by_ref().take(MAX_ENDPOINTS_PER_SLICE).collect();
                    let identity = format!("{}/{family}/{}/{index}", self.key, port_text.join(","));
                    let name = format!("{}-{}", self.key.name, stable_suffix(&identity, SUFFIX_LEN));
                    by_family[slot].push(PlannedSlice { name, family, ports: ports.clone(), endpoints: chunk });
                    index += 1;
                }
            }
        }
        let [mut slices, ipv6] = by_family;
        slices.extend(ipv6);
        slices
    }

    fn endpoint<'p, P: PodFacts>(&self, pod: &'p P, address: IpAddr, zones: &Zones<'p>) -> PlannedEndpoint<'p> {
        let serving = pod.is_ready();
        let terminating = pod.is_terminating();
        let node_name = pod.node_name();
        let hostname =
            pod.hostname().filter(|hostname| !hostname.is_empty() && pod.subdomain() == Some(self.key.name.as_str()));
        let zone = node_name.and_then(|node| zones.of(node));
        // Only ready endpoints carry hints, as upstream: the proxy weighs hints over ready ones.
        let ready = self.publish_not_ready || (serving && !terminating);
        PlannedEndpoint {
            address,
            ready,
            serving,
            terminating,
            node_name,
            zone,
            hostname,
            hint_zone: zone.filter(|_| ready && self.hints != Hints::None),
            hint_node: node_name.filter(|_| ready && self.hints == Hints::SameNode),
            pod_name: pod.name(),
            pod_uid: pod.uid(),
        }
    }

    /// `planned` written as the EndpointSlice object.
    fn endpoint_slice(&self, planned: &PlannedSlice<'_>) -> EndpointSlice {
        EndpointSlice {
            metadata: self.slice_metadata(planned.name.clone()),
            address_type: planned.family.kubernetes_name().to_owned(),
            endpoints: planned.endpoints.iter().map(|endpoint| self.endpoint_object(endpoint)).collect(),
            ports: Some(planned.ports.clone()),
        }
    }

    fn endpoint_object(&self, planned: &PlannedEndpoint<'_>) -> Endpoint {
        let for_zones = planned.hint_zone.map(|zone| vec![ForZone { name: zone.to_owned() }]);
        let for_nodes = planned.hint_node.map(|node| vec![ForNode { name: node.to_owned() }]);
        let hints = (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints { for_zones, for_nodes });
        Endpoint {
            addresses: vec![planned.address.to_string()],
            hints,
            conditions: Some(EndpointConditions {
                ready: Some(planned.ready),
                serving: Some(planned.serving),
                terminating: Some(planned.terminating),
            }),
            hostname: planned.hostname.map(str::to_owned),
            zone: planned.zone.map(str::to_owned),
            node_name: planned.node_name.map(str::to_owned),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".to_owned()),
                namespace: Some(self.key.namespace.clone()),
                name: planned.pod_name.map(str::to_owned),
                uid: planned.pod_uid.map(str::to_owned),
                ..ObjectReference::default()
            }),
            ..Endpoint::default()
        }
    }

    fn slice_metadata(&self, name: String) -> ObjectMeta {
        let mut labels = self.service.metadata.labels.clone().unwrap_or_default();
        labels.remove(LABEL_HEADLESS);
        labels.insert(LABEL_SERVICE_NAME.to_owned(), self.key.name.clone());
        labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
        if self.headless {
            labels.insert(LABEL_HEADLESS.to_owned(), String::new());
        }
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.key.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Service".to_owned(),
                name: self.key.name.clone(),
                uid: self.service.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        }
    }
}

/// The target port of `service_port` on `pod`; `None` when it is a name the Pod has no
/// container port for.
fn resolve_target_port<P: PodFacts>(service_port: &ServicePort, pod: &P) -> Option<i32> {
    match &service_port.target_port {
        None | Some(IntOrString::Int(0)) => Some(service_port.port),
        Some(IntOrString::Int(number)) => Some(*number),
        Some(IntOrString::String(name)) if name.is_empty() => Some(service_port.port),
        Some(IntOrString::String(name)) => pod.named_port(name, protocol_of(service_port)),
    }
}

fn protocol_of(service_port: &ServicePort) -> &str {
    service_port.protocol.as_deref().filter(|p| !p.is_empty()).unwrap_or("TCP")
}

fn endpoint_port(service_port: &ServicePort, number: i32) -> EndpointPort {
    EndpointPort {
        name: Some(service_port.name.clone().unwrap_or_default()),
        protocol: Some(protocol_of(service_port).to_owned()),
        port: Some(number),
        app_protocol: service_port.app_protocol.clone(),
    }
}

/// `name:protocol:port[:appProtocol]`, part of the slice name's hash input.
fn port_identity(port: &EndpointPort) -> String {
    let mut text = format!(
        "{}:{}:{}",
        port.name.as_deref().unwrap_or_default(),
        port.protocol.as_deref().unwrap_or_default(),
        port.port.unwrap_or_default()
    );
    if let Some(app_protocol) = &port.app_protocol {
        text.push(':');
        text.push_str(app_protocol);
    }
    text
}

fn family_slot(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 0,
        IpFamily::V6 => 1,
    }
}

/// Not terminal, scheduled and with at least one IP.
fn is_endpoint_candidate<P: PodFacts>(pod: &P) -> bool {
    let terminal = matches!(pod.phase(), Some("Succeeded" | "Failed"));
    let scheduled = pod.node_name().is_some_and(|node| !node.is_empty());
    !terminal && scheduled && pod.ip_addresses().next().is_some()
}

fn has_labels<P: PodFacts>(pod: &P, selector: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(key, value)| pod.label(key) == Some(value.as_str()))
}

#[cfg(test)]
mod tests;
