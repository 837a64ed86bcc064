//! Cluster IP and node port allocation for Services that do not set them.
//!
//! # How a value is chosen
//!
//! Every value a Service needs is one *unit*: a cluster IP per IP family, a node port per
//! Service port (keyed by port name), a health-check node port. Each call of
//! [`Allocator::allocate`] gets the whole set of Services and settles the units in three
//! passes, so the outcome does not depend on the order of the input:
//!
//! 1. **Held**: a unit keeps the value it had after the previous call (or in the restored
//!    [`AllocationRecord`]) if the Service still wants it: the same explicit value, or no
//!    explicit value and the old one still lies in the configured CIDR / range. Allocations
//!    are therefore sticky for as long as their Service exists, and never move because
//!    other Services come or go. A Service that disappears from the input releases
//!    everything it held.
//! 2. **Explicit**: values a manifest sets and that were not held yet, in input order. If
//!    another Service holds the value, this Service gets an error (the holder keeps it, as
//!    the API server would keep the first one).
//! 3. **Dynamic**: the remaining units in `namespace/name` order. The preferred slot is a
//!    stable hash (FNV-1a 64 with a splitmix64 finaliser, pinned by tests) of
//!    `namespace/name` (plus `:port:<name>` for a node port, `:healthCheckNodePort` for the
//!    health check) modulo the range; on collision it probes forward. Without a record, a
//!    restart with the same Services gives the same values; with a record, even probed
//!    values survive.
//!
//! # Bands and reserved addresses
//!
//! As in upstream KEP-3070 / KEP-3668, the bottom of each range (1/16 of it, at least 16 and
//! at most 256 values; nothing for ranges under 64 values) is kept for explicit values:
//! dynamic allocation uses it only when the rest is full. So a manifest that hard-codes
//! `10.96.0.10` for DNS rarely finds it taken.
//!
//! In a service CIDR, the network address (and for IPv4 the broadcast address) is never
//! allocated and refused when set explicitly. The first address after it (`10.96.0.1`) is
//! reserved for the `kubernetes` Service: dynamic allocation gives it only to
//! `default/kubernetes`, and any Service may set it explicitly (that is how a manifest
//! declares the API server's Service).
//!
//! # Errors
//!
//! A Service whose fields are invalid (bad IP, value outside the CIDRs or the range, unknown
//! type or family, ...) gets no allocation this time and keeps what it held in reserve, so
//! fixing the manifest brings back the same values. Reserved values are only kept from
//! dynamic allocation: another Service that sets one explicitly gets it. A Service that lost a conflict or found
//! the range full gets an error for that field; its other units are still held.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use serde::{Deserialize, Serialize};

use self::pools::{IpPool, PortPool};
use crate::error::{ConfigError, ControllerError, Reason, RecordError};
use crate::ip_family::IpFamily;
use crate::load_balancer::LbAllocator;
use crate::object_key::ObjectKey;
use crate::stable_hash::stable_hash;
use svcplane_net::Protocol;

/// The `version` written into and expected from an [`AllocationRecord`].
pub const RECORD_VERSION: u32 = 1;

/// The namespace and name that get the reserved first address of each service CIDR.
const KUBERNETES_SERVICE: (&str, &str) = ("default", "kubernetes");

/// An inclusive range of node ports, `30000-32767` by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePortRange {
    first: u16,
    last: u16,
}

impl NodePortRange {
    /// The Kubernetes default, `30000-32767`.
    pub const DEFAULT: NodePortRange = NodePortRange { first: 30000, last: 32767 };

    /// `first..=last`; port 0 cannot be part of it.
    pub fn new(first: u16, last: u16) -> Result<Self, ConfigError> {
        let value = || format!("{first}-{last}");
        if first == 0 {
            return Err(ConfigError::InvalidNodePortRange { value: value(), reason: "port 0 is not a port" });
        }
        if first > last {
            return Err(ConfigError::InvalidNodePortRange {
                value: value(),
                reason: "the first port is after the last",
            });
        }
        Ok(Self { first, last })
    }

    pub fn first(self) -> u16 {
        self.first
    }

    pub fn last(self) -> u16 {
        self.last
    }

    /// Whether `port` (as a Service spells it, an `i32`) lies in the range.
    pub fn contains(self, port: i32) -> bool {
        i32::from(self.first) <= port && port <= i32::from(self.last)
    }

    /// How many ports the range holds.
    pub fn size(self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }
}

impl Default for NodePortRange {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for NodePortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl FromStr for NodePortRange {
    type Err = ConfigError;

    /// Parses `first-last`, e.g. `30000-32767`.
    fn from_str(value: &str) -> Result<Self, ConfigError> {
        let invalid = |reason| ConfigError::InvalidNodePortRange { value: value.to_owned(), reason };
        let (first, last) = value.split_once('-').ok_or_else(|| invalid("expected FIRST-LAST"))?;
        let first = first.trim().parse().map_err(|_| invalid("the first port is not a number from 1 to 65535"))?;
        let last = last.trim().parse().map_err(|_| invalid("the last port is not a number from 1 to 65535"))?;
        Self::new(first, last)
    }
}

/// What the [`Allocator`] allocates from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorConfig {
    /// One CIDR per IP family; the first is the cluster's primary family.
    pub service_cidrs: Vec<IpNet>,
    pub node_port_range: NodePortRange,
}

impl Default for AllocatorConfig {
    /// `10.96.0.0/12` and `30000-32767`, the Kubernetes defaults.
    fn default() -> Self {
        Self {
            service_cidrs: vec![IpNet::new(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 0)), 12).expect("valid prefix")],
            node_port_range: NodePortRange::DEFAULT,
        }
    }
}

/// What one Service holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAllocation {
    /// Primary family first.
    #[serde(rename = "clusterIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_ips: Vec<IpAddr>,
    /// Node port by Service port name (`""` for the single unnamed port).
    #[serde(rename = "nodePorts", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_ports: BTreeMap<String, u16>,
    #[serde(rename = "healthCheckNodePort", default, skip_serializing_if = "Option::is_none")]
    pub health_check_node_port: Option<u16>,
}

impl ServiceAllocation {
    fn is_empty(&self) -> bool {
        self.cluster_ips.is_empty() && self.node_ports.is_empty() && self.health_check_node_port.is_none()
    }
}

/// The allocator's state as saved between runs: `namespace/name` → what it holds.
///
/// ```json
/// {"version": 1, "services": {"default/web": {"clusterIPs": ["10.100.7.3"], "nodePorts": {"http": 31234}}}}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    pub version: u32,
    #[serde(default)]
    pub services: BTreeMap<String, ServiceAllocation>,
}

impl Default for AllocationRecord {
    fn default() -> Self {
        Self { version: RECORD_VERSION, services: BTreeMap::new() }
    }
}

impl AllocationRecord {
    /// Reads a record written by [`to_json`](Self::to_json).
    pub fn from_json(text: &str) -> Result<Self, RecordError> {
        let record: Self = serde_json::from_str(text)?;
        if record.version != RECORD_VERSION {
            return Err(RecordError::Version { found: record.version, expected: RECORD_VERSION });
        }
        Ok(record)
    }

    /// Pretty JSON with keys in a stable order, so that saved files diff well.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a record of strings, numbers and maps always serialises")
    }
}

/// What [`Allocator::allocate`] returns.
#[derive(Debug, Clone)]
pub struct AllocationOutcome {
    /// One entry per input Service, in input order: the Service with `clusterIP(s)`,
    /// `ipFamilies`, `ipFamilyPolicy`, `ports[].nodePort`, `healthCheckNodePort` and
    /// `metadata.namespace` filled in, or what is wrong with it.
    pub services: Vec<Result<Service, Vec<ControllerError>>>,
    /// Whether any allocation was made, moved or released: time to save the record.
    pub changed: bool,
}

/// Allocates cluster IPs and node ports; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Allocator {
    config: AllocatorConfig,
    /// In configuration order: `pools[0]` is the cluster's primary family.
    pools: Vec<IpPool>,
    ports: PortPool,
    held: BTreeMap<ObjectKey, ServiceAllocation>,
    /// LoadBalancer addresses from pools (manifests mode), kept here so they stay put
    /// between reconciles like everything else this allocator gives.
    pub(crate) load_balancer: LbAllocator,
}

impl Allocator {
    /// An allocator that holds nothing yet.
    pub fn new(config: AllocatorConfig) -> Result<Self, ConfigError> {
        match config.service_cidrs.len() {
            0 => return Err(ConfigError::NoServiceCidr),
            1 | 2 => {}
            count => return Err(ConfigError::TooManyServiceCidrs { count }),
        }
        if let [first, second] = config.service_cidrs[..]
            && IpFamily::of(&first.addr()) == IpFamily::of(&second.addr())
        {
            return Err(ConfigError::SameFamilyTwice { first, second });
        }
        let pools = config.service_cidrs.iter().map(|&cidr| IpPool::new(cidr)).collect::<Result<_, _>>()?;
        let ports = PortPool::new(config.node_port_range);
        Ok(Self { config, pools, ports, held: BTreeMap::new(), load_balancer: LbAllocator::new() })
    }

    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Replaces what the allocator holds with a saved record, typically right after
    /// [`new`](Self::new). Entries whose key is not `namespace/name` are skipped; values that
    /// no longer fit the configuration are dropped at the next [`allocate`](Self::allocate).
    pub fn restore(&mut self, record: &AllocationRecord) {
        self.held = record
            .services
            .iter()
            .filter_map(|(key, allocation)| match ObjectKey::parse(key) {
                Some(key) => Some((key, allocation.clone())),
                None => {
                    tracing::warn!(key, "skipping allocation record entry whose key is not namespace/name");
                    None
                }
            })
            .collect();
    }

    /// What the allocator holds now, to be saved.
    pub fn record(&self) -> AllocationRecord {
        AllocationRecord {
            version: RECORD_VERSION,
            services: self.held.iter().map(|(key, allocation)| (key.to_string(), allocation.clone())).collect(),
        }
    }

    /// What a Service holds after the last [`allocate`](Self::allocate).
    pub fn allocation(&self, service: &ObjectKey) -> Option<&ServiceAllocation> {
        self.held.get(service)
    }

    /// Settles the allocations of exactly these Services (all of them: Services missing here
    /// release what they held) and returns them with the allocated fields filled in.
    pub fn allocate(&mut self, services: &[Service]) -> AllocationOutcome {
        let mut demands: Vec<Demand<'_>> = services.iter().map(|service| self.demand(service)).collect();
        refuse_duplicate_names(&mut demands);
        let mut by_key: Vec<usize> = (0..demands.len()).collect();
        by_key.sort_by(|&a, &b| demands[a].key.cmp(&demands[b].key));

        let mut claims = Claims::default();
        for &d in &by_key {
            self.claim_held(&mut demands, d, &mut claims);
        }
        for &d in &by_key {
            self.reserve_held_of_invalid(&demands, d, &mut claims);
        }
        for d in 0..demands.len() {
            claim_explicit(&mut demands, d, &mut claims);
        }
        for &d in &by_key {
            self.claim_dynamic(&mut demands, d, &mut claims);
        }

        // Collected, then built in one go: a map built from sorted entries has full nodes,
        // where inserting one at a time leaves them about two thirds full.
        let mut entries = Vec::new();
        for (d, demand) in demands.iter().enumerate() {
            if demand.passthrough || demand.duplicate || demand.key.name.is_empty() {
                continue;
            }
            let allocation = if demand.invalid { self.still_reserved(demand, d, &claims) } else { demand.allocation() };
            if !allocation.is_empty() {
                entries.push((demand.key.clone(), allocation));
            }
        }
        let table: BTreeMap<ObjectKey, ServiceAllocation> = entries.into_iter().collect();
        let changed = table != self.held;
        self.held = table;

        let services = demands
            .into_iter()
            .map(|demand| if demand.errors.is_empty() { Ok(demand.filled_service()) } else { Err(demand.errors) })
            .collect();
        AllocationOutcome { services, changed }
    }

    /// Settles the allocations of `changed` Services only (new or edited) and releases
    /// those of `removed` ones; every other Service keeps what it holds, untouched (its
    /// held cluster IPs and node ports are claimed first, so a changed Service can neither
    /// take them nor be given them). Costs the changed Services plus one pass over what is
    /// held, instead of a full [`allocate`](Self::allocate).
    ///
    /// Differences from a full pass: an unchanged Service's node ports block their number
    /// for every protocol (the record does not say which protocol held them), and an
    /// unchanged Service that was refused is not looked at again (pass it in `changed` to
    /// retry it).
    pub fn allocate_changed(&mut self, changed: &[Service], removed: &[ObjectKey]) -> AllocationOutcome {
        let placeholder = Service::default();
        let mut demands: Vec<Demand<'_>> = changed.iter().map(|service| self.demand(service)).collect();
        let seen = refuse_duplicate_names(&mut demands);
        let settled = demands.len();
        let mut claims = Claims::default();
        for (key, held) in &self.held {
            if seen.contains(key) || removed.contains(key) {
                continue;
            }
            let d = demands.len();
            let mut pinned = Demand::new(&placeholder, key.clone());
            pinned.passthrough = true;
            demands.push(pinned);
            for &ip in &held.cluster_ips {
                claims.ips.entry(ip).or_insert(d);
            }
            for &port in held.node_ports.values().chain(&held.health_check_node_port) {
                for protocol in Protocol::ALL {
                    claims.ports.entry((port, protocol)).or_insert(d);
                }
                claims.port_users.entry(port).or_insert(d);
            }
        }
        let mut by_key: Vec<usize> = (0..settled).collect();
        by_key.sort_by(|&a, &b| demands[a].key.cmp(&demands[b].key));
        for &d in &by_key {
            self.claim_held(&mut demands, d, &mut claims);
        }
        for &d in &by_key {
            self.reserve_held_of_invalid(&demands, d, &mut claims);
        }
        for d in 0..settled {
            claim_explicit(&mut demands, d, &mut claims);
        }
        for &d in &by_key {
            self.claim_dynamic(&mut demands, d, &mut claims);
        }

        let mut changed_any = false;
        for key in removed {
            changed_any |= self.held.remove(key).is_some();
        }
        let mut updates = Vec::new();
        for (d, demand) in demands[..settled].iter().enumerate() {
            if demand.passthrough || demand.duplicate || demand.key.name.is_empty() {
                if !demand.duplicate && !demand.key.name.is_empty() {
                    updates.push((demand.key.clone(), ServiceAllocation::default()));
                }
                continue;
            }
            let allocation = if demand.invalid { self.still_reserved(demand, d, &claims) } else { demand.allocation() };
            updates.push((demand.key.clone(), allocation));
        }
        for (key, allocation) in updates {
            let old =
                if allocation.is_empty() { self.held.remove(&key) } else { self.held.insert(key, allocation.clone()) };
            changed_any |= old.unwrap_or_default() != allocation;
        }
        let services = demands
            .into_iter()
            .take(settled)
            .map(|demand| if demand.errors.is_empty() { Ok(demand.filled_service()) } else { Err(demand.errors) })
            .collect();
        AllocationOutcome { services, changed: changed_any }
    }

    fn pool(&self, family: IpFamily) -> Option<(usize, &IpPool)> {
        self.pools.iter().enumerate().find(|(_, pool)| pool.family == family)
    }

    /// Reads what a Service asks for and validates every explicit value.
    fn demand<'s>(&self, service: &'s Service) -> Demand<'s> {
        let key = ObjectKey::of(&service.metadata);
        let mut demand = Demand::new(service, key);
        if demand.key.name.is_empty() {
            demand.reject("metadata.name", Reason::Missing);
            return demand;
        }
        let fallback = ServiceSpec::default();
        let spec = service.spec.as_ref().unwrap_or(&fallback);
        let kind = match spec.type_.as_deref() {
            None | Some("" | "ClusterIP") => Kind::ClusterIp,
            Some("NodePort") => Kind::NodePort,
            Some("LoadBalancer") => Kind::LoadBalancer,
            Some("ExternalName") => {
                demand.passthrough = true;
                return demand;
            }
            Some(other) => {
                demand.reject(
                    "spec.type",
                    Reason::Unsupported {
                        value: other.to_owned(),
                        expected: "ClusterIP, NodePort, LoadBalancer or ExternalName",
                    },
                );
                return demand;
            }
        };
        self.read_cluster_ips(&mut demand, spec, kind);
        self.read_node_ports(&mut demand, spec, kind);
        demand
    }

    fn read_cluster_ips(&self, demand: &mut Demand<'_>, spec: &ServiceSpec, kind: Kind) {
        let cluster_ip = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty());
        let cluster_ips: &[String] = spec.cluster_ips.as_deref().unwrap_or_default();
        demand.headless = cluster_ip == Some("None") || cluster_ips.first().is_some_and(|ip| ip == "None");
        let ip_field = |i: usize| {
            if i == 0 && cluster_ip.is_some() { "spec.clusterIP".to_owned() } else { format!("spec.clusterIPs[{i}]") }
        };

        let mut explicit: Vec<IpAddr> = Vec::new();
        if demand.headless {
            if kind != Kind::ClusterIp {
                let type_ = spec.type_.clone().unwrap_or_default();
                demand.reject(ip_field(0), Reason::HeadlessWithType { type_ });
            }
            if cluster_ip.is_some_and(|ip| ip != "None") || cluster_ips.first().is_some_and(|ip| ip != "None") {
                demand.reject(
                    "spec.clusterIPs[0]",
                    Reason::Inconsistent { detail: "spec.clusterIP and spec.clusterIPs[0] differ".to_owned() },
                );
            }
            if cluster_ips.len() > 1 {
                demand.reject("spec.clusterIPs", Reason::TooMany { count: cluster_ips.len() });
            }
        } else {
            if let (Some(single), Some(first)) = (cluster_ip, cluster_ips.first())
                && single != first
            {
                demand.reject(
                    "spec.clusterIPs[0]",
                    Reason::Inconsistent { detail: format!("{first} differs from spec.clusterIP {single}") },
                );
            }
            let given: Vec<&str> = if cluster_ips.is_empty() {
                cluster_ip.into_iter().collect()
            } else {
                cluster_ips.iter().map(String::as_str).collect()
            };
            if given.len() > 2 {
                demand.reject("spec.clusterIPs", Reason::TooMany { count: given.len() });
            }
            for (i, text) in given.iter().enumerate().take(2) {
                let Ok(ip) = text.parse::<IpAddr>() else {
                    demand.reject(ip_field(i), Reason::InvalidIp { value: (*text).to_owned() });
                    continue;
                };
                if i == 1 && explicit.first().is_some_and(|first| IpFamily::of(first) == IpFamily::of(&ip)) {
                    demand.reject(ip_field(i), Reason::DuplicateFamily { family: IpFamily::of(&ip) });
                    continue;
                }
                match self.pool(IpFamily::of(&ip)) {
                    Some((_, pool)) if pool.cidr.contains(&ip) => {
                        if let Err(reason) = pool.check_explicit(ip) {
                            demand.reject(ip_field(i), reason);
                        }
                    }
                    _ => demand.reject(
                        ip_field(i),
                        Reason::OutsideServiceCidrs { ip, cidrs: self.config.service_cidrs.clone() },
                    ),
                }
                explicit.push(ip);
            }
        }

        let Some(families) = self.resolve_families(demand, spec, &explicit) else { return };
        if !demand.headless {
            for (i, &family) in families.iter().enumerate() {
                let pool = self.pool(family).map_or(0, |(index, _)| index);
                demand.ips.push(IpWant {
                    family,
                    pool,
                    field: ip_field(i),
                    explicit: explicit.get(i).copied(),
                    got: None,
                });
            }
        }
        demand.families = families;
    }

    /// `spec.ipFamilies` / `spec.ipFamilyPolicy` against the configured CIDRs; `None` after
    /// rejecting the Service.
    fn resolve_families(
        &self,
        demand: &mut Demand<'_>,
        spec: &ServiceSpec,
        explicit: &[IpAddr],
    ) -> Option<Vec<IpFamily>> {
        let policy = match spec.ip_family_policy.as_deref() {
            None | Some("" | "SingleStack") => Policy::Single,
            Some("PreferDualStack") => Policy::PreferDual,
            Some("RequireDualStack") => Policy::RequireDual,
            Some(other) => {
                demand.reject(
                    "spec.ipFamilyPolicy",
                    Reason::Unsupported {
                        value: other.to_owned(),
                        expected: "SingleStack, PreferDualStack or RequireDualStack",
                    },
                );
                return None;
            }
        };
        let mut requested = Vec::new();
        let listed: &[String] = spec.ip_families.as_deref().unwrap_or_default();
        if listed.len() > 2 {
            demand.reject("spec.ipFamilies", Reason::TooMany { count: listed.len() });
            return None;
        }
        for (i, text) in listed.iter().enumerate() {
            let field = format!("spec.ipFamilies[{i}]");
            match IpFamily::from_kubernetes(text) {
                None => {
                    demand.reject(field, Reason::Unsupported { value: text.clone(), expected: "IPv4 or IPv6" });
                    return None;
                }
                Some(family) if requested.contains(&family) => {
                    demand.reject(field, Reason::DuplicateFamily { family });
                    return None;
                }
                Some(family) => requested.push(family),
            }
        }
        for (i, (&family, ip)) in requested.iter().zip(explicit).enumerate() {
            if IpFamily::of(ip) != family {
                let detail = format!("{ip} is not an {family} address as spec.ipFamilies[{i}] says");
                demand.reject(format!("spec.clusterIPs[{i}]"), Reason::Inconsistent { detail });
                return None;
            }
        }
        if requested.is_empty() {
            requested.extend(explicit.iter().map(IpFamily::of));
        }
        let primary = requested.first().copied().unwrap_or(self.pools[0].family);
        let is_configured = |family| self.pool(family).is_some();
        if !is_configured(primary) {
            if demand.errors.is_empty() {
                let reason = Reason::FamilyNotConfigured { family: primary, cidrs: self.config.service_cidrs.clone() };
                demand.reject("spec.ipFamilies[0]", reason);
            }
            return None;
        }
        let secondary = primary.other();
        match policy {
            Policy::Single => {
                if requested.len() > 1 || explicit.len() > 1 {
                    let detail = "SingleStack allows one IP family, two are given".to_owned();
                    demand.reject("spec.ipFamilyPolicy", Reason::Inconsistent { detail });
                    return None;
                }
                Some(vec![primary])
            }
            Policy::PreferDual if is_configured(secondary) => Some(vec![primary, secondary]),
            Policy::PreferDual => Some(vec![primary]),
            Policy::RequireDual if is_configured(secondary) => Some(vec![primary, secondary]),
            Policy::RequireDual => {
                let reason =
                    Reason::FamilyNotConfigured { family: secondary, cidrs: self.config.service_cidrs.clone() };
                demand.reject("spec.ipFamilyPolicy", reason);
                None
            }
        }
    }

    fn read_node_ports(&self, demand: &mut Demand<'_>, spec: &ServiceSpec, kind: Kind) {
        let range = self.config.node_port_range;
        let has_node_ports = matches!(kind, Kind::NodePort | Kind::LoadBalancer);
        let allocates = kind == Kind::NodePort
            || (kind == Kind::LoadBalancer && spec.allocate_load_balancer_node_ports != Some(false));
        let mut names = HashSet::new();
        for (index, port) in spec.ports.iter().flatten().enumerate() {
            let name = port.name.clone().unwrap_or_default();
            if !names.insert(name.clone()) {
                demand.reject(format!("spec.ports[{index}].name"), Reason::DuplicatePortName { name });
                continue;
            }
            let protocol = match protocol_of(port.protocol.as_deref()) {
                Ok(protocol) => protocol,
                Err(value) => {
                    let reason = Reason::Unsupported { value, expected: "TCP, UDP or SCTP" };
                    demand.reject(format!("spec.ports[{index}].protocol"), reason);
                    continue;
                }
            };
            if !has_node_ports {
                continue;
            }
            let field = format!("spec.ports[{index}].nodePort");
            let explicit = match port.node_port {
                None | Some(0) => None,
                Some(value) => match u16::try_from(value) {
                    Ok(value) if range.contains(i32::from(value)) => Some(value),
                    _ => {
                        demand.reject(field, Reason::NodePortOutOfRange { port: value, range });
                        continue;
                    }
                },
            };
            if explicit.is_some() || allocates {
                let slot = PortSlot::ServicePort { index, name, number: port.port };
                demand.ports.push(PortWant { slot, field, protocol, explicit, got: None });
            }
        }
        if kind == Kind::LoadBalancer && spec.external_traffic_policy.as_deref() == Some("Local") {
            let field = "spec.healthCheckNodePort".to_owned();
            let explicit = match spec.health_check_node_port {
                None | Some(0) => None,
                Some(value) => match u16::try_from(value) {
                    Ok(value) if range.contains(i32::from(value)) => Some(value),
                    _ => {
                        demand.reject(field, Reason::NodePortOutOfRange { port: value, range });
                        return;
                    }
                },
            };
            demand.ports.push(PortWant {
                slot: PortSlot::HealthCheck,
                field,
                protocol: Protocol::Tcp,
                explicit,
                got: None,
            });
        }
    }

    /// Pass 1: units keep what they held, if the Service still wants it.
    fn claim_held(&self, demands: &mut [Demand<'_>], d: usize, claims: &mut Claims) {
        let demand = &mut demands[d];
        if demand.invalid || demand.passthrough {
            return;
        }
        let Some(held) = self.held.get(&demand.key) else { return };
        for want in &mut demand.ips {
            let Some(&ip) = held.cluster_ips.iter().find(|ip| IpFamily::of(ip) == want.family) else { continue };
            let pool = &self.pools[want.pool];
            let wanted = match want.explicit {
                Some(explicit) => explicit == ip,
                None => pool.cidr.contains(&ip) && pool.check_explicit(ip).is_ok(),
            };
            if wanted && !claims.ips.contains_key(&ip) {
                claims.ips.insert(ip, d);
                want.got = Some(ip);
            }
        }
        for want in &mut demand.ports {
            let port = match &want.slot {
                PortSlot::ServicePort { name, .. } => held.node_ports.get(name).copied(),
                PortSlot::HealthCheck => held.health_check_node_port,
            };
            let Some(port) = port else { continue };
            let wanted = match want.explicit {
                Some(explicit) => explicit == port,
                None => self.config.node_port_range.contains(i32::from(port)),
            };
            if wanted && !claims.ports.contains_key(&(port, want.protocol)) {
                claims.claim_port(port, want.protocol, d);
                want.got = Some(port);
            }
        }
    }

    /// Keeps what an invalid Service held out of dynamic allocation, for when it is fixed.
    fn reserve_held_of_invalid(&self, demands: &[Demand<'_>], d: usize, claims: &mut Claims) {
        let demand = &demands[d];
        if !demand.invalid || demand.duplicate || demand.passthrough {
            return;
        }
        let Some(held) = self.held.get(&demand.key) else { return };
        for &ip in &held.cluster_ips {
            if !claims.ips.contains_key(&ip) {
                claims.reserved_ips.entry(ip).or_insert(d);
            }
        }
        for &port in held.node_ports.values().chain(&held.health_check_node_port) {
            if !claims.port_users.contains_key(&port) {
                claims.reserved_ports.entry(port).or_insert(d);
            }
        }
    }

    /// What an invalid Service still has in reserve after this round.
    fn still_reserved(&self, demand: &Demand<'_>, d: usize, claims: &Claims) -> ServiceAllocation {
        let Some(held) = self.held.get(&demand.key) else { return ServiceAllocation::default() };
        let ip_kept = |ip: &IpAddr| claims.reserved_ips.get(ip) == Some(&d);
        let port_kept = |port: &u16| claims.reserved_ports.get(port) == Some(&d);
        ServiceAllocation {
            cluster_ips: held.cluster_ips.iter().copied().filter(ip_kept).collect(),
            node_ports: held
                .node_ports
                .iter()
                .filter(|(_, port)| port_kept(port))
                .map(|(name, port)| (name.clone(), *port))
                .collect(),
            health_check_node_port: held.health_check_node_port.filter(port_kept),
        }
    }

    /// Pass 3: hash-preferred slot, probing forward.
    fn claim_dynamic(&self, demands: &mut [Demand<'_>], d: usize, claims: &mut Claims) {
        let demand = &mut demands[d];
        if demand.invalid || demand.passthrough {
            return;
        }
        let key_text = demand.key.to_string();
        let is_kubernetes = (demand.key.namespace.as_str(), demand.key.name.as_str()) == KUBERNETES_SERVICE;
        let mut failures = Vec::new();
        for want in demand.ips.iter_mut().filter(|want| want.explicit.is_none() && want.got.is_none()) {
            let pool = &self.pools[want.pool];
            let is_free = |ip: &IpAddr| !claims.ips.contains_key(ip) && !claims.reserved_ips.contains_key(ip);
            let reserved = pool.address(1);
            let ip = if is_kubernetes && is_free(&reserved) {
                Some(reserved)
            } else {
                let hash = stable_hash(&key_text);
                pool.band.find_free(hash, |offset| is_free(&pool.address(offset))).map(|offset| pool.address(offset))
            };
            match ip {
                Some(ip) => {
                    claims.ips.insert(ip, d);
                    want.got = Some(ip);
                }
                None => failures.push((want.field.clone(), Reason::ClusterIpsExhausted { cidr: pool.cidr })),
            }
        }
        for i in 0..demand.ports.len() {
            let want = &demand.ports[i];
            if want.explicit.is_some() || want.got.is_some() {
                continue;
            }
            let protocol = want.protocol;
            let is_free = |port: u16| {
                !claims.ports.contains_key(&(port, protocol))
                    && claims.port_users.get(&port).is_none_or(|&user| user == d)
                    && !claims.reserved_ports.contains_key(&port)
            };
            // TCP and UDP (or SCTP) ports of one Service with the same number share a node
            // port, as they do with the API server.
            let sibling = match want.slot {
                PortSlot::ServicePort { number, .. } => demand.ports.iter().find_map(|other| match other.slot {
                    PortSlot::ServicePort { number: n, .. } if n == number && other.protocol != protocol => {
                        other.got.filter(|&port| is_free(port))
                    }
                    _ => None,
                }),
                PortSlot::HealthCheck => None,
            };
            let port = sibling.or_else(|| {
                let hash = match &want.slot {
                    PortSlot::ServicePort { name, .. } => stable_hash(&format!("{key_text}:port:{name}")),
                    PortSlot::HealthCheck => stable_hash(&format!("{key_text}:healthCheckNodePort")),
                };
                self.ports
                    .band
                    .find_free(hash, |offset| is_free(self.ports.port(offset)))
                    .map(|offset| self.ports.port(offset))
            });
            let want = &mut demand.ports[i];
            match port {
                Some(port) => {
                    claims.claim_port(port, protocol, d);
                    want.got = Some(port);
                }
                None => failures
                    .push((want.field.clone(), Reason::NodePortsExhausted { range: self.config.node_port_range })),
            }
        }
        for (field, reason) in failures {
            demand.fail(field, reason);
        }
    }
}

/// Pass 2: explicit values not held yet, first come first served.
fn claim_explicit(demands: &mut [Demand<'_>], d: usize, claims: &mut Claims) {
    if demands[d].invalid || demands[d].passthrough {
        return;
    }
    let mut failures = Vec::new();
    for i in 0..demands[d].ips.len() {
        let want = &demands[d].ips[i];
        let (Some(ip), None) = (want.explicit, want.got) else { continue };
        match claims.ips.get(&ip) {
            Some(&holder) => {
                failures.push((want.field.clone(), Reason::ClusterIpTaken { ip, holder: demands[holder].key.clone() }));
            }
            None => {
                claims.ips.insert(ip, d);
                claims.reserved_ips.remove(&ip);
                demands[d].ips[i].got = Some(ip);
            }
        }
    }
    for i in 0..demands[d].ports.len() {
        let want = &demands[d].ports[i];
        let (Some(port), None) = (want.explicit, want.got) else { continue };
        let protocol = want.protocol;
        match claims.ports.get(&(port, protocol)) {
            Some(&holder) => failures.push((
                want.field.clone(),
                Reason::NodePortTaken {
                    port,
                    protocol: protocol.kubernetes_name(),
                    holder: demands[holder].key.clone(),
                },
            )),
            None => {
                claims.claim_port(port, protocol, d);
                claims.reserved_ports.remove(&port);
                demands[d].ports[i].got = Some(port);
            }
        }
    }
    for (field, reason) in failures {
        demands[d].fail(field, reason);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Single,
    PreferDual,
    RequireDual,
}

/// Node ports conflict per protocol (30080/TCP and 30080/UDP are different units).
/// `None` is TCP, the Kubernetes default; an unknown value is returned as the error.
fn protocol_of(value: Option<&str>) -> Result<Protocol, String> {
    match value {
        None | Some("") => Ok(Protocol::Tcp),
        Some(name) => Protocol::from_kubernetes(name).ok_or_else(|| name.to_owned()),
    }
}

/// What one Service asks for, and what it got so far.
#[derive(Debug)]
struct Demand<'s> {
    service: &'s Service,
    key: ObjectKey,
    errors: Vec<ControllerError>,
    /// Rejected while reading: allocates nothing, keeps what it held in reserve.
    invalid: bool,
    /// A second Service with the key of an earlier one.
    duplicate: bool,
    /// ExternalName: nothing to allocate, returned as it is.
    passthrough: bool,
    headless: bool,
    families: Vec<IpFamily>,
    /// Primary family first.
    ips: Vec<IpWant>,
    ports: Vec<PortWant>,
}

#[derive(Debug)]
struct IpWant {
    family: IpFamily,
    /// Index into `Allocator::pools`.
    pool: usize,
    field: String,
    explicit: Option<IpAddr>,
    got: Option<IpAddr>,
}

#[derive(Debug)]
enum PortSlot {
    /// `spec.ports[index]`, named `name`, with Service port `number`.
    ServicePort {
        index: usize,
        name: String,
        number: i32,
    },
    HealthCheck,
}

#[derive(Debug)]
struct PortWant {
    slot: PortSlot,
    field: String,
    protocol: Protocol,
    explicit: Option<u16>,
    got: Option<u16>,
}

impl<'s> Demand<'s> {
    fn new(service: &'s Service, key: ObjectKey) -> Self {
        Self {
            service,
            key,
            errors: Vec::new(),
            invalid: false,
            duplicate: false,
            passthrough: false,
            headless: false,
            families: Vec::new(),
            ips: Vec::new(),
            ports: Vec::new(),
        }
    }

    /// An error found while reading: the Service allocates nothing this round.
    fn reject(&mut self, field: impl Into<String>, reason: Reason) {
        self.invalid = true;
        self.fail(field, reason);
    }

    /// An error found while allocating: the Service is not returned, but keeps what it got.
    fn fail(&mut self, field: impl Into<String>, reason: Reason) {
        self.errors.push(ControllerError::AllocateService {
            service: self.key.clone(),
            field: field.into(),
            reason: Box::new(reason),
        });
    }

    fn allocation(&self) -> ServiceAllocation {
        let mut cluster_ips: Vec<IpAddr> = self.ips.iter().filter_map(|want| want.got).collect();
        // Held for every Service until it goes (`Allocator::held`): sized to its one or two
        // addresses, not the four a collected filter leaves room for (68 bytes a Service).
        cluster_ips.shrink_to_fit();
        let mut allocation = ServiceAllocation { cluster_ips, ..ServiceAllocation::default() };
        for want in &self.ports {
            let Some(port) = want.got else { continue };
            match &want.slot {
                PortSlot::ServicePort { name, .. } => {
                    allocation.node_ports.insert(name.clone(), port);
                }
                PortSlot::HealthCheck => allocation.health_check_node_port = Some(port),
            }
        }
        allocation
    }

    /// The Service with every allocated field written; only called without errors.
    fn filled_service(&self) -> Service {
        let mut service = self.service.clone();
        service.metadata.namespace = Some(self.key.namespace.clone());
        if self.passthrough {
            return service;
        }
        let spec = service.spec.get_or_insert_with(ServiceSpec::default);
        let ips: Vec<String> = if self.headless {
            vec!["None".to_owned()]
        } else {
            self.ips.iter().filter_map(|want| want.got).map(|ip| ip.to_string()).collect()
        };
        spec.cluster_ip = ips.first().cloned();
        spec.cluster_ips = Some(ips);
        spec.ip_families = Some(self.families.iter().map(|family| family.kubernetes_name().to_owned()).collect());
        if spec.ip_family_policy.as_deref().is_none_or(str::is_empty) {
            spec.ip_family_policy = Some("SingleStack".to_owned());
        }
        for want in &self.ports {
            let port = want.got.map(i32::from);
            match want.slot {
                PortSlot::ServicePort { index, .. } => {
                    if let Some(service_port) = spec.ports.as_mut().and_then(|ports| ports.get_mut(index)) {
                        service_port.node_port = port;
                    }
                }
                PortSlot::HealthCheck => spec.health_check_node_port = port,
            }
        }
        service
    }
}

/// Who holds what during one [`Allocator::allocate`]; holders are indices into the demands.
#[derive(Debug, Default)]
struct Claims {
    ips: HashMap<IpAddr, usize>,
    ports: HashMap<(u16, Protocol), usize>,
    /// The first holder of a port number under any protocol: dynamic allocation does not put
    /// a second Service on a number another Service uses, even under another protocol.
    port_users: HashMap<u16, usize>,
    /// Held by invalid Services; only explicit values may take them.
    reserved_ips: HashMap<IpAddr, usize>,
    reserved_ports: HashMap<u16, usize>,
}

impl Claims {
    fn claim_port(&mut self, port: u16, protocol: Protocol, holder: usize) {
        self.ports.insert((port, protocol), holder);
        self.port_users.entry(port).or_insert(holder);
    }
}

mod pools;

/// Refuses every Service whose namespace and name an earlier one in `demands` already has,
/// and returns the names seen.
fn refuse_duplicate_names(demands: &mut [Demand<'_>]) -> HashSet<ObjectKey> {
    let mut seen = HashSet::with_capacity(demands.len());
    for demand in demands {
        if demand.passthrough || demand.key.name.is_empty() {
            continue;
        }
        if !seen.insert(demand.key.clone()) {
            demand.duplicate = true;
            demand.reject("metadata.name", Reason::DuplicateObject);
        }
    }
    seen
}

#[cfg(test)]
mod tests;
