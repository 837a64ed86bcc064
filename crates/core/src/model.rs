//! The Service model the core decides on: Kubernetes nouns with typed fields, already
//! validated by the source that produced them.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use ipnet::IpNet;

/// A namespaced object name, `namespace/name`.
///
/// Both parts are [`SharedStr`]s handed out by [`intern`]: a Service's name is held by its
/// state entry, its slices' back-references, its plan keys and the backends' records (a
/// dozen copies at least), and every copy is the same two allocations (the namespace one
/// for all the namespace's objects), not two new `String`s.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    pub namespace: SharedStr,
    pub name: SharedStr,
}

impl NamespacedName {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self { namespace: SharedStr::interned(namespace.as_ref()), name: SharedStr::interned(name.as_ref()) }
    }
}

/// Immutable text whose clones share one allocation (an `Arc<str>`); compares, orders,
/// hashes and prints as the text itself, and reads as a `&str`.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedStr(Arc<str>);

impl SharedStr {
    /// The shared copy of `text` ([`intern`]): equal texts made this way are one allocation.
    pub fn interned(text: &str) -> Self {
        Self(intern(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for SharedStr {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for SharedStr {
    fn from(text: &str) -> Self {
        Self::interned(text)
    }
}

impl From<String> for SharedStr {
    fn from(text: String) -> Self {
        Self::interned(&text)
    }
}

impl From<&String> for SharedStr {
    fn from(text: &String) -> Self {
        Self::interned(text)
    }
}

impl From<SharedStr> for String {
    fn from(text: SharedStr) -> Self {
        text.0.as_ref().to_owned()
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<SharedStr> for str {
    fn eq(&self, other: &SharedStr) -> bool {
        self == &*other.0
    }
}

impl PartialEq<SharedStr> for &str {
    fn eq(&self, other: &SharedStr) -> bool {
        *self == &*other.0
    }
}

impl PartialEq<SharedStr> for String {
    fn eq(&self, other: &SharedStr) -> bool {
        **self == *other.0
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub use svcplane_net::{IpFamily, Protocol};

/// Identifies one port of one Service: what kube-proxy calls a `ServicePortName`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub service: NamespacedName,
    /// `spec.ports[].name`; empty for the single unnamed port. Interned: a port plan, its
    /// key and the backends' records each hold a copy.
    pub port_name: SharedStr,
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    /// `ns/name:port` (`:port` omitted when unnamed), then `/proto` as kube-proxy logs it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.service)?;
        if !self.port_name.is_empty() {
            write!(f, ":{}", self.port_name)?;
        }
        write!(f, "/{}", self.protocol)
    }
}

/// Whether a traffic source may reach every endpoint or only those on its own node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// `spec.trafficDistribution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    PreferSameZone,
    PreferSameNode,
}

/// `spec.sessionAffinity: ClientIP` with its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientIpAffinity {
    pub timeout: Duration,
}

/// How Kubernetes defaults `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10_800);

/// The kinds of Service the proxy programs. Headless and ExternalName Services never reach
/// the core: the source drops them, as kube-proxy does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ServiceType {
    #[default]
    ClusterIp,
    NodePort,
    LoadBalancer,
}

/// One `spec.ports[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// A load-balancer ingress address from `status.loadBalancer.ingress[]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LoadBalancerIngress {
    pub ip: IpAddr,
    /// `ipMode: Proxy` addresses are handled by the load balancer, not by the node.
    pub is_proxy_mode: bool,
}

/// A Service as the proxy needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Service {
    pub name: NamespacedName,
    pub service_type: ServiceType,
    /// `spec.clusterIPs`, primary family first.
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ingress: Vec<LoadBalancerIngress>,
    pub load_balancer_source_ranges: Vec<IpNet>,
    pub session_affinity: Option<ClientIpAffinity>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    pub health_check_node_port: Option<u16>,
    pub traffic_distribution: Option<TrafficDistribution>,
}

impl Service {
    /// A ClusterIP Service with the given addresses and ports and every other field at its
    /// Kubernetes default. Tests and generators build on it.
    pub fn cluster_ip(name: NamespacedName, cluster_ips: Vec<IpAddr>, ports: Vec<ServicePort>) -> Self {
        Self {
            name,
            service_type: ServiceType::ClusterIp,
            cluster_ips,
            ports,
            external_ips: Vec::new(),
            load_balancer_ingress: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            session_affinity: None,
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            traffic_distribution: None,
        }
    }

    pub fn port_name(&self, port: &ServicePort) -> ServicePortName {
        ServicePortName {
            service: self.name.clone(),
            port_name: SharedStr::interned(&port.name),
            protocol: port.protocol,
        }
    }

    /// NodePorts, external IPs and load-balancer IPs: traffic that `externalTrafficPolicy` governs.
    pub fn is_externally_accessible(&self) -> bool {
        self.service_type != ServiceType::ClusterIp
            || !self.external_ips.is_empty()
            || self.load_balancer_ingress.iter().any(|ingress| !ingress.is_proxy_mode)
    }
}

/// One port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// A node, zone or hint name shared by every endpoint that carries it: [`intern`] hands
/// out one allocation per distinct name, so 100k endpoints on a handful of nodes hold a
/// handful of strings, not 100k.
pub type Name = Arc<str>;

/// The names handed out by [`intern`]; pruned of names nobody holds any more whenever it
/// has doubled since the last pruning, so it stays proportional to the names in use.
struct Interned {
    names: HashSet<Name>,
    prune_at: usize,
}

static INTERNED: LazyLock<Mutex<Interned>> =
    LazyLock::new(|| Mutex::new(Interned { names: HashSet::new(), prune_at: 64 }));

thread_local! {
    /// The last name this thread interned. Callers intern runs of one name (the namespace
    /// of every object in a file, the node of a Service's endpoints one after another), and
    /// with two threads planning at once the shared set's lock was contended. Holding one
    /// name per thread keeps it from being pruned, which is harmless.
    static LAST_INTERNED: std::cell::RefCell<Option<Name>> = const { std::cell::RefCell::new(None) };
}

/// The shared [`Name`] for `text`: the same allocation for the same text, from any thread.
pub fn intern(text: &str) -> Name {
    let last = LAST_INTERNED.with_borrow(|last| last.as_ref().filter(|name| ***name == *text).cloned());
    if let Some(name) = last {
        return name;
    }
    let name = intern_shared(text);
    LAST_INTERNED.with_borrow_mut(|last| *last = Some(Arc::clone(&name)));
    name
}

fn intern_shared(text: &str) -> Name {
    // A poisoned lock only means another thread panicked while holding it; the set is
    // still a valid set of names.
    let mut interned = INTERNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(name) = interned.names.get(text) {
        return Arc::clone(name);
    }
    if interned.names.len() >= interned.prune_at {
        interned.names.retain(|name| Arc::strong_count(name) > 1);
        interned.prune_at = (interned.names.len() * 2).max(64);
    }
    let name: Name = Arc::from(text);
    interned.names.insert(Arc::clone(&name));
    name
}

/// One endpoint of an EndpointSlice (its first address only, as kube-proxy does).
///
/// Kept small, since a cluster has many (64 bytes, no allocation of its own in the common
/// case): names are shared ([`intern`]) and topology hints, which most endpoints lack,
/// are boxed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub address: IpAddr,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<Name>,
    pub zone: Option<Name>,
    /// `hints`; `None` when it names no zone and no node (see [`EndpointHints::boxed`]).
    pub hints: Option<Box<EndpointHints>>,
}

/// An endpoint's topology hints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointHints {
    /// `hints.forZones[].name`.
    pub zones: Vec<Name>,
    /// `hints.forNodes[].name`.
    pub nodes: Vec<Name>,
}

impl EndpointHints {
    /// The hints as an endpoint holds them: `None` when there are none, so that an
    /// endpoint without hints compares equal however it was built.
    pub fn boxed(zones: Vec<Name>, nodes: Vec<Name>) -> Option<Box<Self>> {
        (!zones.is_empty() || !nodes.is_empty()).then(|| Box::new(Self { zones, nodes }))
    }
}

impl Endpoint {
    /// A ready endpoint with no topology: the common case in tests.
    pub fn ready(address: IpAddr, node_name: Option<&str>) -> Self {
        Self {
            address,
            ready: true,
            serving: true,
            terminating: false,
            node_name: node_name.map(intern),
            zone: None,
            hints: None,
        }
    }

    /// `hints.forZones[].name` (empty without hints).
    pub fn zone_hints(&self) -> &[Name] {
        self.hints.as_ref().map_or(&[], |hints| &hints.zones)
    }

    /// `hints.forNodes[].name` (empty without hints).
    pub fn node_hints(&self) -> &[Name] {
        self.hints.as_ref().map_or(&[], |hints| &hints.nodes)
    }

    /// Sets the hints (`None` when both are empty).
    pub fn set_hints(&mut self, zones: &[&str], nodes: &[&str]) {
        self.hints =
            EndpointHints::boxed(zones.iter().map(|z| intern(z)).collect(), nodes.iter().map(|n| intern(n)).collect());
    }
}

/// An EndpointSlice: a share of one Service's endpoints, in one address family.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointSlice {
    /// The slice's own namespaced name.
    pub name: NamespacedName,
    /// The Service it belongs to (`kubernetes.io/service-name`).
    pub service: NamespacedName,
    pub family: IpFamily,
    pub ports: Vec<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`: when the change this slice
    /// carries happened (a Pod turned ready, say); network programming latency counts from it.
    pub last_change_trigger: Option<std::time::SystemTime>,
}

/// The node the proxy runs on, as far as endpoint selection cares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Node {
    pub name: String,
    pub addresses: Vec<IpAddr>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// Being deleted (`deletionTimestamp`) or tainted `ToBeDeletedByClusterAutoscaler`:
    /// load balancers should stop sending new traffic here (`/healthz` turns 503).
    pub leaving: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_is_one_allocation_however_often_it_is_interned() {
        let first = intern("interning-test-node-a");
        let again = intern(&String::from("interning-test-node-a"));
        assert!(Arc::ptr_eq(&first, &again));
        assert_ne!(intern("interning-test-node-b"), first);
        // Another thread's names, and this thread's after another one, are the same too.
        assert!(Arc::ptr_eq(&intern("interning-test-node-a"), &first));
        let elsewhere = std::thread::spawn(|| intern("interning-test-node-a")).join().unwrap();
        assert!(Arc::ptr_eq(&elsewhere, &first));
    }

    #[test]
    fn names_nobody_holds_are_dropped_from_the_interner_as_it_grows() {
        let held = intern("interning-test-held");
        for n in 0..1000 {
            intern(&format!("interning-test-dropped-{n}"));
        }
        let interned = INTERNED.lock().unwrap();
        assert!(interned.names.len() < 500, "{} names kept", interned.names.len());
        assert!(interned.names.contains("interning-test-held"));
        drop(interned);
        drop(held);
    }

    #[test]
    fn a_name_made_again_and_its_clones_share_one_allocation_and_read_as_text() {
        let service = NamespacedName::new("default", "name-sharing-test");
        let from_a_slice_label = NamespacedName::new(String::from("default"), String::from("name-sharing-test"));
        assert_eq!(service, from_a_slice_label);
        assert!(std::ptr::eq(service.name.as_str(), from_a_slice_label.name.as_str()));
        assert!(std::ptr::eq(service.namespace.as_str(), service.clone().namespace.as_str()));
        assert_eq!(service.name, "name-sharing-test");
        assert_eq!(service.to_string(), "default/name-sharing-test");
        assert_eq!(format!("{:?}", service.name), "\"name-sharing-test\"");
        assert!(NamespacedName::new("a", "b") < NamespacedName::new("a", "c"));
        assert_eq!(size_of::<NamespacedName>(), 32);
    }

    #[test]
    fn an_endpoint_is_64_bytes_and_hints_set_empty_are_no_hints() {
        assert_eq!(size_of::<Endpoint>(), 64);
        let plain = Endpoint::ready("198.18.129.2".parse().unwrap(), Some("node1"));
        let mut emptied = plain.clone();
        emptied.set_hints(&[], &[]);
        assert_eq!(emptied, plain);
        emptied.set_hints(&["zone-a"], &[]);
        assert_eq!(emptied.zone_hints(), [intern("zone-a")]);
        assert!(emptied.node_hints().is_empty());
    }
}
