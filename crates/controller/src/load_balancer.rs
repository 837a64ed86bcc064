//! LoadBalancer addresses from address pools, where no cloud provider assigns them.
//!
//! A pool is a `LoadBalancerIPPool` object (group [`POOL_GROUP`], served by a CRD against
//! the API, or the same document in a manifests directory): IPv4 and IPv6 blocks (a CIDR or
//! a `start`..`stop` range, every address in it usable), which Services may draw from it
//! (`serviceSelector` on the Service's labels, `namespaces` by name; both empty = all), and
//! `disabled`. [`LbAllocator::allocate`] gets every pool and every Service and returns, for
//! each Service that is ours, the addresses it holds or why it has none, and for each pool
//! its use or why it is not used. It is a pure function of its input and of what the
//! allocator remembers from its previous call.
//!
//! Which Services are ours: `type: LoadBalancer` with no `spec.loadBalancerClass` or with
//! [`LOAD_BALANCER_CLASS`]; any other class is left alone (no address, no status).
//!
//! # How an address is chosen
//!
//! One address per IP family in `spec.ipFamilies` (IPv4 when empty), settled in three
//! passes so the outcome does not depend on input order:
//!
//! 1. **Held**: the addresses the Service had (the allocator's memory, else its
//!    `status.loadBalancer.ingress`, which is how assignments survive a restart) stay
//!    while they still lie in a usable pool that selects the Service and match its request.
//!    Two Services claiming one address: the first in `namespace/name` order keeps it.
//! 2. **Requested**: `spec.loadBalancerIP` or one of [`REQUESTED_IPS_ANNOTATIONS`]
//!    (comma-separated, one address per family). An address in no pool selecting the
//!    Service, or held by another Service, is refused with a status naming why.
//! 3. **Dynamic**: pools that select the Service in name order; in each, the preferred
//!    slot is a stable hash of `namespace/name` modulo the pool's size, probing forward.
//!
//! An address is never given to two Services. Overlapping pools: the pool whose name sorts
//! first keeps the shared addresses; each later pool that overlaps is not used at all and
//! reports the conflict (as Cilium's LB IPAM does), so an operator sees it at once.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Serialize};

use crate::ip_family::IpFamily;
use crate::object_key::ObjectKey;
use crate::stable_hash::stable_hash;

/// The pool CRD's API group.
pub const POOL_GROUP: &str = "svcplane.io";
/// The pool CRD's version.
pub const POOL_VERSION: &str = "v1alpha1";
/// The pool's kind.
pub const POOL_KIND: &str = "LoadBalancerIPPool";
/// The pool CRD's plural resource name.
pub const POOL_PLURAL: &str = "loadbalancerippools";
/// `spec.loadBalancerClass` of the Services this allocator serves (besides those with none).
pub const LOAD_BALANCER_CLASS: &str = "svcplane.io/l2";
/// Annotations naming the addresses a Service asks for, comma-separated: MetalLB's and
/// Cilium LB IPAM's, so Services written for either keep working.
pub const REQUESTED_IPS_ANNOTATIONS: [&str; 2] = ["metallb.universe.tf/loadBalancerIPs", "lbipam.cilium.io/ips"];
/// The condition this allocator writes on a Service it serves.
pub const SERVICE_CONDITION: &str = "svcplane.io/LoadBalancerAddress";

/// A `LoadBalancerIPPool` object as a manifests directory holds it (against the API the
/// same object comes from the CRD).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIPPool {
    #[serde(default)]
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(default)]
    pub spec: PoolSpec,
}

/// Assigns addresses to the Services of ours among `services` from `pools` (manifests
/// mode) and writes them to each one's `status.loadBalancer.ingress`. Returns one message
/// per problem: a pool that cannot be used (naming the pool and the field) or a Service
/// without the address it wants (naming the Service and the cause).
pub fn assign_in_place(
    pools: &[LoadBalancerIPPool],
    services: &mut [Service],
    allocator: &mut LbAllocator,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut valid = Vec::new();
    for object in pools {
        let name = object.metadata.name.clone().unwrap_or_default();
        match Pool::from_spec(&name, &object.spec) {
            Ok(pool) => valid.push(pool),
            Err((field, message)) => problems.push(PoolError { pool: name, field, message }.to_string()),
        }
    }
    let outcome = allocator.allocate(&valid, services);
    for (name, use_) in &outcome.pools {
        if let Some(conflict) = &use_.conflict {
            problems.push(format!("{POOL_KIND} {name}: Conflict: {conflict}"));
        }
    }
    for service in services.iter_mut() {
        let key = ObjectKey::of(&service.metadata);
        let Some(assignment) = outcome.services.get(&key) else { continue };
        for problem in &assignment.problems {
            problems.push(format!("Service {key}: {}: {}", problem.reason, problem.message));
        }
        let ingress: Vec<k8s_openapi::api::core::v1::LoadBalancerIngress> = assignment
            .ips()
            .iter()
            .map(|ip| k8s_openapi::api::core::v1::LoadBalancerIngress {
                ip: Some(ip.to_string()),
                ip_mode: Some("VIP".into()),
                ..Default::default()
            })
            .collect();
        let status = service.status.get_or_insert_with(Default::default);
        status.load_balancer = Some(k8s_openapi::api::core::v1::LoadBalancerStatus { ingress: Some(ingress) });
    }
    problems
}

/// A pool's `spec`, as the CRD's schema defines it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolSpec {
    #[serde(default)]
    pub blocks: Vec<PoolBlock>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default)]
    pub disabled: bool,
}

/// One block: `cidr`, or `start` and `stop` (inclusive, one family).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolBlock {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
}

/// An inclusive range of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AddressRange {
    pub first: IpAddr,
    pub last: IpAddr,
}

impl AddressRange {
    pub fn family(&self) -> IpFamily {
        family_of(self.first)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        family_of(ip) == self.family() && as_u128(self.first) <= as_u128(ip) && as_u128(ip) <= as_u128(self.last)
    }

    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.family() == other.family()
            && as_u128(self.first) <= as_u128(other.last)
            && as_u128(other.first) <= as_u128(self.last)
    }

    /// How many addresses, saturated at `u128::MAX`.
    pub fn size(&self) -> u128 {
        (as_u128(self.last) - as_u128(self.first)).saturating_add(1)
    }

    fn nth(&self, n: u128) -> IpAddr {
        from_u128(self.family(), as_u128(self.first) + n)
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// A parsed, valid pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    pub ranges: Vec<AddressRange>,
    pub selector: Option<LabelSelector>,
    pub namespaces: Vec<String>,
    pub disabled: bool,
}

/// A pool object that cannot be used as written: names the pool and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{POOL_KIND} {pool}: {field}: {message}")]
pub struct PoolError {
    pub pool: String,
    pub field: String,
    pub message: String,
}

impl Pool {
    /// Parses a pool's `spec` (as JSON) under its name; the error names the field.
    pub fn parse(name: &str, spec: &serde_json::Value) -> Result<Pool, PoolError> {
        let error = |field: String, message: String| PoolError { pool: name.to_owned(), field, message };
        let spec: PoolSpec = serde_json::from_value(spec.clone()).map_err(|e| error("spec".into(), e.to_string()))?;
        Pool::from_spec(name, &spec).map_err(|(field, message)| error(field, message))
    }

    fn from_spec(name: &str, spec: &PoolSpec) -> Result<Pool, (String, String)> {
        if spec.blocks.is_empty() {
            return Err(("spec.blocks".into(), "at least one block is required".into()));
        }
        let mut ranges = Vec::new();
        for (i, block) in spec.blocks.iter().enumerate() {
            let field = |what: &str| format!("spec.blocks[{i}]{what}");
            let range = match (&block.cidr, &block.start, &block.stop) {
                (Some(cidr), None, None) => {
                    let net: IpNet = cidr
                        .trim()
                        .parse()
                        .map_err(|_| (field(".cidr"), format!("{cidr:?} is not a CIDR (address/prefix)")))?;
                    if net.network() != net.addr() {
                        return Err((
                            field(".cidr"),
                            format!("{cidr:?} has host bits set; did you mean {}?", net.trunc()),
                        ));
                    }
                    AddressRange { first: net.network(), last: net.broadcast() }
                }
                (None, Some(start), Some(stop)) => {
                    let first: IpAddr = start
                        .trim()
                        .parse()
                        .map_err(|_| (field(".start"), format!("{start:?} is not an IP address")))?;
                    let last: IpAddr =
                        stop.trim().parse().map_err(|_| (field(".stop"), format!("{stop:?} is not an IP address")))?;
                    if family_of(first) != family_of(last) {
                        return Err((field(""), format!("start {first} and stop {last} are of different IP families")));
                    }
                    if as_u128(first) > as_u128(last) {
                        return Err((field(""), format!("start {first} is after stop {last}")));
                    }
                    AddressRange { first, last }
                }
                _ => return Err((field(""), "set either cidr, or both start and stop".into())),
            };
            if let Some(other) = ranges.iter().find(|r: &&AddressRange| r.overlaps(&range)) {
                return Err((field(""), format!("{range} overlaps {other}, another block of this pool")));
            }
            ranges.push(range);
        }
        if let Some(selector) = &spec.service_selector {
            check_selector(selector).map_err(|m| ("spec.serviceSelector".to_owned(), m))?;
        }
        Ok(Pool {
            name: name.to_owned(),
            ranges,
            selector: spec.service_selector.clone(),
            namespaces: spec.namespaces.clone(),
            disabled: spec.disabled,
        })
    }

    /// Whether `service` may draw from this pool (disabled pools select nothing).
    pub fn selects(&self, service: &Service) -> bool {
        if self.disabled {
            return false;
        }
        let key = ObjectKey::of(&service.metadata);
        if !self.namespaces.is_empty() && !self.namespaces.contains(&key.namespace) {
            return false;
        }
        let empty = BTreeMap::new();
        let labels = service.metadata.labels.as_ref().unwrap_or(&empty);
        self.selector.as_ref().is_none_or(|selector| selector_matches(selector, labels))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ranges.iter().any(|r| r.contains(ip))
    }

    pub fn size_of(&self, family: IpFamily) -> u128 {
        self.ranges.iter().filter(|r| r.family() == family).fold(0u128, |n, r| n.saturating_add(r.size()))
    }

    fn nth_of(&self, family: IpFamily, mut n: u128) -> IpAddr {
        for range in self.ranges.iter().filter(|r| r.family() == family) {
            if n < range.size() {
                return range.nth(n);
            }
            n -= range.size();
        }
        unreachable!("n is below size_of(family)")
    }
}

fn check_selector(selector: &LabelSelector) -> Result<(), String> {
    for (i, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let values = expression.values.as_deref().unwrap_or_default();
        match expression.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!("matchExpressions[{i}]: operator {} needs values", expression.operator));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!("matchExpressions[{i}]: operator {} takes no values", expression.operator));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => return Err(format!("matchExpressions[{i}]: unknown operator {other:?}")),
        }
    }
    Ok(())
}

/// A `metav1.LabelSelector` against labels (the selector is checked by [`Pool::parse`]).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}

/// Why a Service has no address (or not every address it wants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LbReason {
    /// Every pool that selects the Service is full.
    PoolExhausted,
    /// No usable pool selects the Service (for this family).
    NoPoolSelects,
    /// The requested address lies in no pool that selects the Service.
    RequestOutsidePools,
    /// The requested address is held by another Service.
    RequestConflict,
    /// The request is malformed (not an address, two of one family, ...).
    InvalidRequest,
}

impl LbReason {
    /// The condition / Event reason (CamelCase).
    pub fn as_str(self) -> &'static str {
        match self {
            LbReason::PoolExhausted => "PoolExhausted",
            LbReason::NoPoolSelects => "NoPoolSelects",
            LbReason::RequestOutsidePools => "RequestedAddressOutsidePools",
            LbReason::RequestConflict => "RequestedAddressInUse",
            LbReason::InvalidRequest => "InvalidRequest",
        }
    }
}

impl fmt::Display for LbReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbProblem {
    pub reason: LbReason,
    pub message: String,
}

/// What one Service of ours gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LbAssignment {
    /// The addresses it holds, in `spec.ipFamilies` order, each with its pool.
    pub addresses: Vec<(IpAddr, String)>,
    /// Why an address it wants is missing (empty when it has all it wants).
    pub problems: Vec<LbProblem>,
}

impl LbAssignment {
    pub fn ips(&self) -> Vec<IpAddr> {
        self.addresses.iter().map(|(ip, _)| *ip).collect()
    }
}

/// How one pool is used.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolUse {
    /// Addresses per family the pool holds (saturated).
    pub size: u128,
    /// Addresses assigned from it.
    pub used: u128,
    /// Why the pool is not used at all (overlap with an earlier pool), if so.
    pub conflict: Option<String>,
}

/// The outcome of one [`LbAllocator::allocate`] call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LbOutcome {
    /// Every Service of ours, by `namespace/name`.
    pub services: BTreeMap<ObjectKey, LbAssignment>,
    /// Every valid pool, by name.
    pub pools: BTreeMap<String, PoolUse>,
}

/// Assigns LoadBalancer addresses; remembers its last answer, so an address does not move
/// while a status write is in flight.
#[derive(Debug, Clone, Default)]
pub struct LbAllocator {
    held: BTreeMap<ObjectKey, Vec<IpAddr>>,
}

/// Whether `service` is a LoadBalancer Service this allocator serves.
pub fn is_ours(service: &Service) -> bool {
    let Some(spec) = &service.spec else { return false };
    spec.type_.as_deref() == Some("LoadBalancer")
        && spec.load_balancer_class.as_deref().is_none_or(|class| class == LOAD_BALANCER_CLASS)
}

/// The addresses in `service.status.loadBalancer.ingress[].ip`.
pub fn ingress_ips(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

/// What a Service asks for: per family, at most one address.
fn requested(service: &Service) -> Result<Vec<IpAddr>, String> {
    let mut texts: Vec<(String, String)> = Vec::new();
    if let Some(ip) = service.spec.as_ref().and_then(|s| s.load_balancer_ip.as_deref()).filter(|s| !s.is_empty()) {
        texts.push(("spec.loadBalancerIP".into(), ip.to_owned()));
    }
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    for name in REQUESTED_IPS_ANNOTATIONS {
        if let Some(value) = annotations.get(name) {
            for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                texts.push((format!("metadata.annotations[{name}]"), part.to_owned()));
            }
        }
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    for (field, text) in texts {
        let ip: IpAddr = text.parse().map_err(|_| format!("{field}: {text:?} is not an IP address"))?;
        if ips.contains(&ip) {
            continue;
        }
        if ips.iter().any(|other| family_of(*other) == family_of(ip)) {
            return Err(format!("{field}: {ip} is a second {} address; one per family", family_of(ip)));
        }
        ips.push(ip);
    }
    Ok(ips)
}

/// The families a Service wants addresses of: `spec.ipFamilies`, else those of its request,
/// else IPv4.
fn wanted_families(service: &Service, requested: &[IpAddr]) -> Vec<IpFamily> {
    let mut families: Vec<IpFamily> = Vec::new();
    for family in service.spec.as_ref().and_then(|s| s.ip_families.as_ref()).into_iter().flatten() {
        let family = match family.as_str() {
            "IPv6" => IpFamily::V6,
            _ => IpFamily::V4,
        };
        if !families.contains(&family) {
            families.push(family);
        }
    }
    if families.is_empty() {
        families = requested.iter().map(|ip| family_of(*ip)).collect();
    }
    if families.is_empty() {
        families.push(IpFamily::V4);
    }
    families
}

fn require_dual_stack(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.ip_family_policy.as_deref()) == Some("RequireDualStack")
}

impl LbAllocator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Settles every Service's addresses. `pools` are the valid pools (parse errors are the
    /// caller's to report); Services not ours are left out of the outcome.
    pub fn allocate(&mut self, pools: &[Pool], services: &[Service]) -> LbOutcome {
        let mut outcome = LbOutcome::default();
        // Pools: name order; a pool overlapping an earlier usable one is not used.
        let mut sorted: Vec<&Pool> = pools.iter().collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut usable: Vec<&Pool> = Vec::new();
        for pool in sorted {
            let size = pool.size_of(IpFamily::V4).saturating_add(pool.size_of(IpFamily::V6));
            let mut entry = PoolUse { size, ..PoolUse::default() };
            if !pool.disabled {
                let clash = usable.iter().find_map(|earlier| {
                    pool.ranges.iter().find_map(|mine| {
                        earlier.ranges.iter().find(|theirs| mine.overlaps(theirs)).map(|theirs| (earlier, mine, theirs))
                    })
                });
                match clash {
                    Some((earlier, mine, theirs)) => {
                        entry.conflict = Some(format!(
                            "{mine} overlaps {theirs} of pool {}; the pool whose name sorts first keeps the addresses, this one is not used",
                            earlier.name
                        ));
                    }
                    None => usable.push(pool),
                }
            }
            outcome.pools.insert(pool.name.clone(), entry);
        }
        let pool_of = |ip: IpAddr| usable.iter().find(|p| p.contains(ip)).map(|p| p.name.clone());

        // Services of ours, in key order.
        let mut ours: Vec<(ObjectKey, &Service)> =
            services.iter().filter(|s| is_ours(s)).map(|s| (ObjectKey::of(&s.metadata), s)).collect();
        ours.sort_by(|a, b| a.0.cmp(&b.0));
        ours.dedup_by(|a, b| a.0 == b.0);

        struct Want<'a> {
            key: ObjectKey,
            service: &'a Service,
            selecting: Vec<&'a Pool>,
            families: Vec<IpFamily>,
            requested: Vec<IpAddr>,
            got: Vec<(IpAddr, String)>,
            problems: Vec<LbProblem>,
        }
        let mut wants: Vec<Want<'_>> = Vec::new();
        for (key, service) in &ours {
            let selecting: Vec<&Pool> = usable.iter().copied().filter(|p| p.selects(service)).collect();
            let mut want = Want {
                key: key.clone(),
                service,
                selecting,
                families: Vec::new(),
                requested: Vec::new(),
                got: Vec::new(),
                problems: Vec::new(),
            };
            match requested(service) {
                Ok(ips) => want.requested = ips,
                Err(message) => {
                    want.problems.push(LbProblem { reason: LbReason::InvalidRequest, message });
                    wants.push(want);
                    continue;
                }
            }
            want.families = wanted_families(service, &want.requested);
            wants.push(want);
        }

        let mut taken: BTreeMap<IpAddr, ObjectKey> = BTreeMap::new();
        // 1. Held.
        for want in wants.iter_mut().filter(|w| w.problems.is_empty()) {
            let held = match self.held.get(&want.key) {
                Some(ips) => ips.clone(),
                None => ingress_ips(want.service),
            };
            for ip in held {
                let family = family_of(ip);
                if !want.families.contains(&family) || want.got.iter().any(|(g, _)| family_of(*g) == family) {
                    continue;
                }
                if want.requested.iter().any(|r| family_of(*r) == family && *r != ip) {
                    continue;
                }
                let Some(pool) = want.selecting.iter().find(|p| p.contains(ip)) else { continue };
                if taken.contains_key(&ip) {
                    continue;
                }
                taken.insert(ip, want.key.clone());
                want.got.push((ip, pool.name.clone()));
            }
        }
        // 2. Requested.
        for want in wants.iter_mut().filter(|w| w.problems.is_empty()) {
            for ip in want.requested.clone() {
                if want.got.iter().any(|(g, _)| *g == ip) {
                    continue;
                }
                let Some(pool) = want.selecting.iter().find(|p| p.contains(ip)) else {
                    let message = match pool_of(ip) {
                        Some(pool) => {
                            format!("requested address {ip} is in pool {pool}, which does not select this Service")
                        }
                        None => format!("requested address {ip} is in no address pool"),
                    };
                    want.problems.push(LbProblem { reason: LbReason::RequestOutsidePools, message });
                    continue;
                };
                if let Some(holder) = taken.get(&ip) {
                    want.problems.push(LbProblem {
                        reason: LbReason::RequestConflict,
                        message: format!("requested address {ip} is already assigned to Service {holder}"),
                    });
                    continue;
                }
                taken.insert(ip, want.key.clone());
                want.got.push((ip, pool.name.clone()));
            }
        }
        // 3. Dynamic.
        for want in wants.iter_mut().filter(|w| w.problems.is_empty()) {
            let mut missing_families = Vec::new();
            for family in want.families.clone() {
                if want.got.iter().any(|(g, _)| family_of(*g) == family)
                    || want.requested.iter().any(|r| family_of(*r) == family)
                {
                    continue;
                }
                let pools: Vec<&Pool> = want.selecting.iter().copied().filter(|p| p.size_of(family) > 0).collect();
                if pools.is_empty() {
                    missing_families.push(family);
                    continue;
                }
                let hash = u128::from(stable_hash(&want.key.to_string()));
                let found = pools.iter().find_map(|pool| {
                    let size = pool.size_of(family);
                    let start = hash % size;
                    // Bounded: a pool larger than this many addresses is never full in practice.
                    let tries = size.min(1 << 20);
                    (0..tries)
                        .map(|i| pool.nth_of(family, (start + i) % size))
                        .find(|ip| !taken.contains_key(ip))
                        .map(|ip| (ip, pool.name.clone()))
                });
                match found {
                    Some((ip, pool)) => {
                        taken.insert(ip, want.key.clone());
                        want.got.push((ip, pool));
                    }
                    None => {
                        let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
                        want.problems.push(LbProblem {
                            reason: LbReason::PoolExhausted,
                            message: format!(
                                "no free {family} address: every address of pool {} is assigned",
                                names.join(", pool ")
                            ),
                        });
                    }
                }
            }
            let all_missing = missing_families.len() == want.families.len();
            if !missing_families.is_empty() && (all_missing || require_dual_stack(want.service)) {
                let families: Vec<String> = missing_families.iter().map(ToString::to_string).collect();
                want.problems.push(LbProblem {
                    reason: LbReason::NoPoolSelects,
                    message: format!(
                        "no enabled address pool with {} addresses selects this Service",
                        families.join(" or ")
                    ),
                });
            }
        }

        self.held.clear();
        for mut want in wants {
            want.got.sort_by_key(|(ip, _)| want.families.iter().position(|f| *f == family_of(*ip)));
            for (_, pool) in &want.got {
                if let Some(entry) = outcome.pools.get_mut(pool) {
                    entry.used += 1;
                }
            }
            self.held.insert(want.key.clone(), want.got.iter().map(|(ip, _)| *ip).collect());
            outcome.services.insert(want.key, LbAssignment { addresses: want.got, problems: want.problems });
        }
        outcome
    }
}

fn family_of(ip: IpAddr) -> IpFamily {
    match ip {
        IpAddr::V4(_) => IpFamily::V4,
        IpAddr::V6(_) => IpFamily::V6,
    }
}

fn as_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn from_u128(family: IpFamily, value: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(u32::try_from(value).unwrap_or(u32::MAX).into()),
        IpFamily::V6 => IpAddr::V6(value.into()),
    }
}

#[cfg(test)]
mod tests;
