//! Validation and conversion of Kubernetes objects into the core's model.
//!
//! The core trusts what it is given, so everything it relies on is checked here: ports in
//! range, protocols it knows, addresses that parse, timeouts within bounds. An object with
//! problems is skipped whole (the rest keep working) and every problem is reported, naming
//! the object and the field. Objects the proxy does not handle (ExternalName and headless
//! Services, Services and slices that belong to another proxy, FQDN slices) are skipped
//! silently, as kube-proxy does.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use svcplane_core::model::{
    self, ClientIpAffinity, DEFAULT_AFFINITY_TIMEOUT, IpFamily, LoadBalancerIngress, NamespacedName, Protocol,
    ServiceType, TrafficDistribution, TrafficPolicy,
};
use tracing::{debug, trace};

use crate::manifests::{ClusterObjects, ObjectKind, ObjectRef, Origins, Position};

/// A Service or EndpointSlice with this label belongs to another proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// EndpointSlices of headless Services carry this label.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// A Node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Longest `sessionAffinityConfig.clientIP.timeoutSeconds` Kubernetes accepts.
const MAX_AFFINITY_TIMEOUT_SECONDS: i32 = 86_400;

/// What is wrong with a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Required,
    OutOfRange {
        value: i64,
        min: i64,
        max: i64,
    },
    Unsupported {
        value: String,
    },
    InvalidIp {
        value: String,
    },
    InvalidCidr {
        value: String,
    },
    Duplicate {
        value: String,
    },
    WrongFamily {
        value: String,
        expected: IpFamily,
    },
    /// Anything else, said in words.
    Invalid {
        reason: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Required => f.write_str("required"),
            Problem::OutOfRange { value, min, max } => write!(f, "must be between {min} and {max}, got {value}"),
            Problem::Unsupported { value } => write!(f, "unsupported value {value:?}"),
            Problem::InvalidIp { value } => write!(f, "invalid IP address {value:?}"),
            Problem::InvalidCidr { value } => write!(f, "invalid CIDR {value:?}"),
            Problem::Duplicate { value } => write!(f, "duplicate value {value:?}"),
            Problem::WrongFamily { value, expected } => {
                let family = match expected {
                    IpFamily::V4 => "IPv4",
                    IpFamily::V6 => "IPv6",
                };
                write!(f, "{value:?} is not an {family} address")
            }
            Problem::Invalid { reason } => f.write_str(reason),
        }
    }
}

/// One invalid field of one object: `<file>: <Kind> <ns>/<name>: <field>: <problem>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{object}: {field}: {problem}", origin_prefix(.origin.as_ref()))]
pub struct FieldError {
    /// Where in the manifests the object was defined, when it came from a file.
    pub origin: Option<Position>,
    pub object: ObjectRef,
    /// The field path as Kubernetes spells it, e.g. `spec.ports[1].protocol`.
    pub field: String,
    pub problem: Problem,
}

fn origin_prefix(origin: Option<&Position>) -> String {
    origin.map(|origin| format!("{origin}: ")).unwrap_or_default()
}

/// Collects the problems of one object.
struct Checker {
    object: ObjectRef,
    errors: Vec<FieldError>,
}

impl Checker {
    fn new(object: ObjectRef) -> Self {
        Self { object, errors: Vec::new() }
    }

    fn report(&mut self, field: impl Into<String>, problem: Problem) {
        self.errors.push(FieldError { origin: None, object: self.object.clone(), field: field.into(), problem });
    }

    /// A port number in 1..=65535.
    fn port(&mut self, value: i32, field: impl FnOnce() -> String) -> Option<u16> {
        match u16::try_from(value) {
            Ok(port) if port != 0 => Some(port),
            _ => {
                self.report(field(), Problem::OutOfRange { value: value.into(), min: 1, max: 65_535 });
                None
            }
        }
    }

    /// `TCP` when unset.
    fn protocol(&mut self, value: Option<&str>, field: impl FnOnce() -> String) -> Option<Protocol> {
        match value {
            None | Some("") => Some(Protocol::Tcp),
            Some(value) => Protocol::from_kubernetes(value).or_else(|| {
                self.report(field(), Problem::Unsupported { value: value.to_owned() });
                None
            }),
        }
    }

    fn ip(&mut self, value: &str, field: impl FnOnce() -> String) -> Option<IpAddr> {
        parse_ip(value).or_else(|| {
            self.report(field(), Problem::InvalidIp { value: value.to_owned() });
            None
        })
    }

    fn finish<T>(self, value: T) -> Result<Option<T>, Vec<FieldError>> {
        if self.errors.is_empty() { Ok(Some(value)) } else { Err(self.errors) }
    }
}

fn has_label(meta: &ObjectMeta, label: &str) -> bool {
    meta.labels.as_ref().is_some_and(|labels| labels.contains_key(label))
}

fn namespaced_name(reference: &ObjectRef) -> NamespacedName {
    NamespacedName::new(&*reference.namespace, &*reference.name)
}

/// Parses an IP address, also accepting the IPv4 spelling with leading zeros
/// (`010.000.000.001`, read as decimal) that old Kubernetes objects may still carry.
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then(|| IpAddr::V4(Ipv4Addr::from(octets)))
}

/// Parses a CIDR, accepting host bits (`10.0.0.1/8` is `10.0.0.0/8`) and surrounding blanks
/// as Kubernetes does.
pub fn parse_cidr(text: &str) -> Option<IpNet> {
    let (address, prefix) = text.trim().split_once('/')?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNet::new(parse_ip(address)?, prefix.parse().ok()?).ok().map(|net| net.trunc())
}

/// Converts a Service. `Ok(None)` for Services the proxy does not handle: ExternalName,
/// headless, without a cluster IP yet, or labelled for another proxy.
pub fn service_to_core(service: &Service) -> Result<Option<model::Service>, Vec<FieldError>> {
    let meta = &service.metadata;
    let reference = ObjectRef::from_meta(ObjectKind::Service, meta);
    if has_label(meta, SERVICE_PROXY_NAME_LABEL) {
        trace!(service = %reference, "skipped: belongs to another proxy");
        return Ok(None);
    }
    let Some(spec) = service.spec.as_ref() else {
        return Ok(None);
    };
    let mut check = Checker::new(reference);

    let service_type = match spec.type_.as_deref() {
        None | Some("" | "ClusterIP") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("ExternalName") => return Ok(None),
        Some(other) => {
            check.report("spec.type", Problem::Unsupported { value: other.to_owned() });
            ServiceType::ClusterIp
        }
    };

    let primary = spec.cluster_ip.as_deref().unwrap_or_default();
    let listed = spec.cluster_ips.as_deref().unwrap_or_default();
    if primary == "None" || listed.iter().any(|ip| ip == "None") {
        return Ok(None);
    }
    if primary.is_empty() && listed.is_empty() {
        // Not allocated yet (the controller does that in manifests mode).
        return Ok(None);
    }
    let cluster_ips = cluster_ips(&mut check, primary, listed);

    let ports = service_ports(&mut check, spec.ports.as_deref().unwrap_or_default(), service_type);

    let mut external_ips = Vec::new();
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        external_ips.extend(check.ip(ip, || format!("spec.externalIPs[{i}]")));
    }

    let mut load_balancer_source_ranges = Vec::new();
    for (i, range) in spec.load_balancer_source_ranges.iter().flatten().enumerate() {
        match parse_cidr(range) {
            Some(net) => load_balancer_source_ranges.push(net),
            None => check
                .report(format!("spec.loadBalancerSourceRanges[{i}]"), Problem::InvalidCidr { value: range.clone() }),
        }
    }

    let session_affinity = match spec.session_affinity.as_deref() {
        None | Some("" | "None") => None,
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|config| config.client_ip.as_ref())
                .and_then(|client_ip| client_ip.timeout_seconds);
            match timeout {
                None => Some(ClientIpAffinity { timeout: DEFAULT_AFFINITY_TIMEOUT }),
                Some(seconds @ 1..=MAX_AFFINITY_TIMEOUT_SECONDS) => {
                    Some(ClientIpAffinity { timeout: Duration::from_secs(seconds.unsigned_abs().into()) })
                }
                Some(seconds) => {
                    check.report(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        Problem::OutOfRange { value: seconds.into(), min: 1, max: MAX_AFFINITY_TIMEOUT_SECONDS.into() },
                    );
                    None
                }
            }
        }
        Some(other) => {
            check.report("spec.sessionAffinity", Problem::Unsupported { value: other.to_owned() });
            None
        }
    };

    let external_traffic_policy = match spec.external_traffic_policy.as_deref() {
        // `Global` is the name `Cluster` had before Kubernetes 1.24.
        None | Some("" | "Cluster" | "Global") => TrafficPolicy::Cluster,
        Some("Local") => TrafficPolicy::Local,
        Some(other) => {
            check.report("spec.externalTrafficPolicy", Problem::Unsupported { value: other.to_owned() });
            TrafficPolicy::Cluster
        }
    };
    // As the kube-apiserver: only a Service reachable from outside may choose.
    let externally_accessible = matches!(service_type, ServiceType::LoadBalancer | ServiceType::NodePort)
        || !spec.external_ips.as_deref().unwrap_or_default().is_empty();
    if spec.external_traffic_policy.as_deref().is_some_and(|p| !p.is_empty()) && !externally_accessible {
        check.report(
            "spec.externalTrafficPolicy",
            Problem::Invalid { reason: "may only be set for externally-accessible services".to_owned() },
        );
    }
    let internal_traffic_policy = match spec.internal_traffic_policy.as_deref() {
        None | Some("" | "Cluster") => TrafficPolicy::Cluster,
        Some("Local") => TrafficPolicy::Local,
        Some(other) => {
            check.report("spec.internalTrafficPolicy", Problem::Unsupported { value: other.to_owned() });
            TrafficPolicy::Cluster
        }
    };
    let traffic_distribution = match spec.traffic_distribution.as_deref() {
        None => None,
        Some("PreferClose" | "PreferSameZone") => Some(TrafficDistribution::PreferSameZone),
        Some("PreferSameNode") => Some(TrafficDistribution::PreferSameNode),
        Some(other) => {
            // Unknown values are ignored, as kube-proxy does, so newer values degrade softly.
            debug!(service = %check.object, value = other, "ignoring unknown spec.trafficDistribution");
            None
        }
    };

    // Only a Local LoadBalancer Service has its health checked by node; the kube-apiserver
    // refuses the field on any other Service, and so do we.
    let health_check_node_port = match spec.health_check_node_port {
        None | Some(0) => None,
        Some(_) if !(service_type == ServiceType::LoadBalancer && external_traffic_policy == TrafficPolicy::Local) => {
            check.report(
                "spec.healthCheckNodePort",
                Problem::Invalid {
                    reason: "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"
                        .to_owned(),
                },
            );
            None
        }
        Some(value) => check.port(value, || "spec.healthCheckNodePort".to_owned()),
    };

    let mut load_balancer_ingress = Vec::new();
    // A Service that is no longer a LoadBalancer keeps no load-balancer addresses, whatever
    // its status still says.
    if service_type == ServiceType::LoadBalancer {
        let ingresses =
            service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
        for (i, ingress) in ingresses.into_iter().flatten().enumerate() {
            // Hostname-only ingresses are for DNS, not for the proxy.
            let Some(ip) = ingress.ip.as_deref().filter(|ip| !ip.is_empty()) else {
                continue;
            };
            let ip = check.ip(ip, || format!("status.loadBalancer.ingress[{i}].ip"));
            let is_proxy_mode = match ingress.ip_mode.as_deref() {
                None | Some("" | "VIP") => false,
                Some("Proxy") => true,
                Some(other) => {
                    check.report(
                        format!("status.loadBalancer.ingress[{i}].ipMode"),
                        Problem::Unsupported { value: other.to_owned() },
                    );
                    false
                }
            };
            load_balancer_ingress.extend(ip.map(|ip| LoadBalancerIngress { ip, is_proxy_mode }));
        }
    }

    let name = namespaced_name(&check.object);
    check.finish(model::Service {
        name,
        service_type,
        cluster_ips,
        ports,
        external_ips,
        load_balancer_ingress,
        load_balancer_source_ranges,
        session_affinity,
        external_traffic_policy,
        internal_traffic_policy,
        health_check_node_port,
        traffic_distribution,
    })
}

/// `spec.clusterIPs` when set (primary first, at most one per family), else `spec.clusterIP`.
fn cluster_ips(check: &mut Checker, primary: &str, listed: &[String]) -> Vec<IpAddr> {
    if listed.is_empty() {
        return check.ip(primary, || "spec.clusterIP".to_owned()).into_iter().collect();
    }
    let mut ips = Vec::with_capacity(listed.len());
    for (i, ip) in listed.iter().enumerate() {
        ips.extend(check.ip(ip, || format!("spec.clusterIPs[{i}]")));
    }
    if listed.len() > 2 {
        check
            .report("spec.clusterIPs", Problem::Invalid { reason: "at most two addresses, one per family".to_owned() });
    } else if let [first, second] = ips[..]
        && IpFamily::of(&first) == IpFamily::of(&second)
    {
        check.report(
            "spec.clusterIPs[1]",
            Problem::Invalid { reason: "must be of the other IP family than spec.clusterIPs[0]".to_owned() },
        );
    }
    if !primary.is_empty()
        && let (Some(primary_ip), Some(first)) = (parse_ip(primary), parse_ip(&listed[0]))
        && primary_ip != first
    {
        check.report(
            "spec.clusterIPs[0]",
            Problem::Invalid { reason: format!("must equal spec.clusterIP {primary:?}") },
        );
    }
    ips
}

/// A port name as Kubernetes allows it (IANA service name syntax).
fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

fn service_ports(
    check: &mut Checker,
    ports: &[k8s_openapi::api::core::v1::ServicePort],
    service_type: ServiceType,
) -> Vec<model::ServicePort> {
    let mut converted: Vec<model::ServicePort> = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let number = check.port(port.port, || format!("spec.ports[{i}].port"));
        let protocol = check.protocol(port.protocol.as_deref(), || format!("spec.ports[{i}].protocol"));
        let node_port = match port.node_port {
            // 0 means "not set" (allocated later) in the Kubernetes API.
            None | Some(0) => None,
            Some(value) => check.port(value, || format!("spec.ports[{i}].nodePort")),
        };
        if node_port.is_some() && service_type == ServiceType::ClusterIp {
            check.report(
                format!("spec.ports[{i}].nodePort"),
                Problem::Invalid { reason: "may not be set when spec.type is ClusterIP".to_owned() },
            );
        }
        // The proxy never forwards to targetPort (the slices carry endpoint ports), but a
        // Service the kube-apiserver would refuse must not be programmed either.
        match &port.target_port {
            Some(IntOrString::Int(value)) if *value != 0 => {
                check.port(*value, || format!("spec.ports[{i}].targetPort"));
            }
            Some(IntOrString::String(value)) if !is_port_name(value) => check.report(
                format!("spec.ports[{i}].targetPort"),
                Problem::Invalid {
                    reason: format!(
                        "{value:?} is no port name (at most 15 lower-case letters, digits and inner single hyphens, with a letter)"
                    ),
                },
            ),
            _ => {}
        }
        let name = port.name.as_deref().unwrap_or_default();
        // Ports are told apart by name, so with more than one each needs its own.
        if ports.len() > 1 && name.is_empty() {
            check.report(format!("spec.ports[{i}].name"), Problem::Required);
        } else if converted.iter().any(|p| p.name == name) {
            check.report(format!("spec.ports[{i}].name"), Problem::Duplicate { value: name.to_owned() });
        }
        let (Some(protocol), Some(number)) = (protocol, number) else {
            continue;
        };
        if converted.iter().any(|p| p.port == number && p.protocol == protocol) {
            check.report(
                format!("spec.ports[{i}]"),
                Problem::Duplicate { value: format!("{number}/{}", protocol.as_str().to_uppercase()) },
            );
        }
        if let Some(node_port) = node_port
            && converted.iter().any(|p| p.node_port == Some(node_port) && p.protocol == protocol)
        {
            check.report(
                format!("spec.ports[{i}].nodePort"),
                Problem::Duplicate { value: format!("{node_port}/{}", protocol.as_str().to_uppercase()) },
            );
        }
        converted.push(model::ServicePort { name: name.to_owned(), protocol, port: number, node_port });
    }
    converted
}

/// Converts an EndpointSlice. `Ok(None)` for slices the proxy does not use: FQDN slices,
/// slices without a Service, and slices of headless Services or of another proxy.
pub fn slice_to_core(slice: &EndpointSlice) -> Result<Option<model::EndpointSlice>, Vec<FieldError>> {
    let meta = &slice.metadata;
    let reference = ObjectRef::from_meta(ObjectKind::EndpointSlice, meta);
    let labels = meta.labels.as_ref();
    let Some(service_name) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)).filter(|name| !name.is_empty()) else {
        trace!(slice = %reference, "skipped: no {SERVICE_NAME_LABEL} label");
        return Ok(None);
    };
    if has_label(meta, HEADLESS_LABEL) || has_label(meta, SERVICE_PROXY_NAME_LABEL) {
        trace!(slice = %reference, "skipped: headless or belongs to another proxy");
        return Ok(None);
    }
    let mut check = Checker::new(reference);
    let family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        "FQDN" => return Ok(None),
        other => {
            check.report("addressType", Problem::Unsupported { value: other.to_owned() });
            return Err(check.errors);
        }
    };

    if slice.endpoints.len() > MAX_SLICE_ENDPOINTS {
        check.report(
            "endpoints",
            Problem::Invalid {
                reason: format!("must have at most {MAX_SLICE_ENDPOINTS} items, has {}", slice.endpoints.len()),
            },
        );
        return Err(check.errors);
    }
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        // kube-proxy uses the first address only.
        let Some(address) = endpoint.addresses.first() else {
            check.report(format!("endpoints[{i}].addresses"), Problem::Required);
            continue;
        };
        let Some(ip) = check.ip(address, || format!("endpoints[{i}].addresses[0]")) else {
            continue;
        };
        if IpFamily::of(&ip) != family {
            check.report(
                format!("endpoints[{i}].addresses[0]"),
                Problem::WrongFamily { value: address.clone(), expected: family },
            );
            continue;
        }
        let conditions = endpoint.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let hints = endpoint.hints.as_ref();
        endpoints.push(model::Endpoint {
            address: ip,
            ready,
            serving: conditions.and_then(|c| c.serving).unwrap_or(ready),
            terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
            node_name: endpoint.node_name.as_deref().filter(|n| !n.is_empty()).map(model::intern),
            zone: endpoint.zone.as_deref().filter(|z| !z.is_empty()).map(model::intern),
            hints: model::EndpointHints::boxed(
                hints
                    .and_then(|h| h.for_zones.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|z| model::intern(&z.name))
                    .collect(),
                hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|n| model::intern(&n.name))
                    .collect(),
            ),
        });
    }

    // Sized for every port: most slices have one, and a pushed-to empty vector holds four.
    let mut ports = Vec::with_capacity(slice.ports.as_ref().map_or(0, Vec::len));
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        // A port without a number cannot be used (Kubernetes means "all ports"; the proxy
        // has nothing to forward to).
        let Some(value) = port.port else {
            debug!(slice = %check.object, index = i, "ignoring an EndpointSlice port without a number");
            continue;
        };
        let number = check.port(value, || format!("ports[{i}].port"));
        let protocol = check.protocol(port.protocol.as_deref(), || format!("ports[{i}].protocol"));
        if let (Some(port_number), Some(protocol)) = (number, protocol) {
            ports.push(model::EndpointPort {
                name: port.name.clone().unwrap_or_default(),
                protocol,
                port: port_number,
            });
        }
    }

    let name = namespaced_name(&check.object);
    let service = NamespacedName::new(name.namespace.clone(), service_name.clone());
    let last_change_trigger = trigger_time(meta);
    check.finish(model::EndpointSlice { name, service, family, ports, endpoints, last_change_trigger })
}

/// A slice the controller planned (one of `planned`'s), converted without being written
/// as an EndpointSlice object first: what [`slice_to_core`] makes of that object, when
/// it is sure to convert cleanly. `None` when it may not (a headless Service or one of
/// another proxy, an IPv4-mapped address [`new_slice_address_errors`] refuses, a port
/// number or protocol out of range): the caller then converts the object, so that
/// every such case keeps its one path and its messages.
pub fn planned_slice_to_core(
    planned: &svcplane_controller::ServiceSlices<'_>,
    slice: &svcplane_controller::PlannedSlice<'_>,
) -> Option<model::EndpointSlice> {
    if planned.slices_carry_label(HEADLESS_LABEL) || planned.slices_carry_label(SERVICE_PROXY_NAME_LABEL) {
        return None;
    }
    let mapped = |address: &IpAddr| matches!(address, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
    if slice.endpoints.iter().any(|endpoint| mapped(&endpoint.address)) {
        return None;
    }
    let mut ports = Vec::with_capacity(slice.ports.len());
    for port in &slice.ports {
        let number = u16::try_from(port.port?).ok().filter(|number| *number != 0)?;
        let protocol = match port.protocol.as_deref() {
            None | Some("") => Protocol::Tcp,
            Some(text) => Protocol::from_kubernetes(text)?,
        };
        ports.push(model::EndpointPort { name: port.name.clone().unwrap_or_default(), protocol, port: number });
    }
    let named = |text: Option<&str>| text.filter(|text| !text.is_empty()).map(model::intern);
    let endpoints = slice
        .endpoints
        .iter()
        .map(|endpoint| model::Endpoint {
            address: endpoint.address,
            ready: endpoint.ready,
            serving: endpoint.serving,
            terminating: endpoint.terminating,
            node_name: named(endpoint.node_name),
            zone: named(endpoint.zone),
            hints: model::EndpointHints::boxed(
                endpoint.hint_zone.into_iter().map(model::intern).collect(),
                endpoint.hint_node.into_iter().map(model::intern).collect(),
            ),
        })
        .collect();
    let service = planned.service();
    Some(model::EndpointSlice {
        name: NamespacedName::new(&*service.namespace, &*slice.name),
        service: NamespacedName::new(&*service.namespace, &*service.name),
        family: slice.family,
        ports,
        endpoints,
        last_change_trigger: None,
    })
}

/// The most endpoints one EndpointSlice may hold (the kube-apiserver's limit).
const MAX_SLICE_ENDPOINTS: usize = 1000;

/// What the kube-apiserver (v1.33 and later) refuses in a new EndpointSlice's addresses but
/// tolerates in old ones: an address not in canonical form (`2001:DB8::A`, `010.1.2.3`) and
/// an IPv4-mapped IPv6 address. A manifest is always a new object, so manifests mode refuses
/// them naming the address; the API feed does not call this (it programs what the
/// apiserver kept, as kube-proxy does).
pub fn new_slice_address_errors(slice: &EndpointSlice) -> Vec<FieldError> {
    let mut check = Checker::new(ObjectRef::from_meta(ObjectKind::EndpointSlice, &slice.metadata));
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        let Some(address) = endpoint.addresses.first() else { continue };
        let Ok(ip) = address.parse::<IpAddr>() else { continue };
        let field = || format!("endpoints[{i}].addresses[0]");
        if let IpAddr::V6(v6) = ip
            && v6.to_ipv4_mapped().is_some()
        {
            check.report(field(), Problem::Invalid { reason: format!("{address:?} is an IPv4-mapped IPv6 address") });
        } else if ip.to_string() != *address {
            check.report(
                field(),
                Problem::Invalid {
                    reason: format!("{address:?} is not in canonical form ({ip:?} is)", ip = ip.to_string()),
                },
            );
        }
    }
    check.errors
}

/// Converts a Node: its `InternalIP` then `ExternalIP` addresses (unparsable ones are
/// skipped) and its `topology.kubernetes.io/zone`.
pub fn node_to_core(node: &Node) -> model::Node {
    let meta = &node.metadata;
    let mut addresses: Vec<IpAddr> = Vec::new();
    let listed = node.status.as_ref().and_then(|s| s.addresses.as_ref()).map(Vec::as_slice).unwrap_or_default();
    for wanted in ["InternalIP", "ExternalIP"] {
        for address in listed.iter().filter(|a| a.type_ == wanted) {
            match parse_ip(&address.address) {
                Some(ip) if !addresses.contains(&ip) => addresses.push(ip),
                Some(_) => {}
                None => {
                    debug!(node = meta.name.as_deref().unwrap_or_default(), address = %address.address, "ignoring an unparsable node address");
                }
            }
        }
    }
    model::Node {
        name: meta.name.clone().unwrap_or_default(),
        addresses,
        zone: meta.labels.as_ref().and_then(|l| l.get(ZONE_LABEL)).filter(|z| !z.is_empty()).cloned(),
        leaving: meta.deletion_timestamp.is_some()
            || node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|taints| taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT)),
    }
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// The slice's last-change-trigger-time; an unparsable one is ignored (it only feeds a
/// latency metric, never the rules).
fn trigger_time(meta: &ObjectMeta) -> Option<std::time::SystemTime> {
    let text = meta.annotations.as_ref()?.get(TRIGGER_TIME_ANNOTATION)?;
    match text.parse::<jiff::Timestamp>() {
        Ok(at) => Some(std::time::SystemTime::from(at)),
        Err(error) => {
            debug!(annotation = TRIGGER_TIME_ANNOTATION, value = %text, "ignoring an unparsable trigger time: {error}");
            None
        }
    }
}

/// Everything of a snapshot the core uses, converted, with the problems found.
#[derive(Debug, Clone, Default)]
pub struct Converted {
    pub services: Vec<model::Service>,
    pub slices: Vec<model::EndpointSlice>,
    pub nodes: Vec<model::Node>,
    /// Each error names where its object was defined, when `origins` knows it.
    pub errors: Vec<FieldError>,
}

/// Converts the Services, EndpointSlices and Nodes of a snapshot (Pods are the controller's
/// business). Invalid objects are left out and reported; skipped ones are left out.
pub fn convert_objects(objects: &ClusterObjects, origins: &Origins) -> Converted {
    let mut converted = Converted {
        services: Vec::with_capacity(objects.services.len()),
        slices: Vec::with_capacity(objects.slices.len()),
        nodes: Vec::with_capacity(objects.nodes.len()),
        errors: Vec::new(),
    };
    let mut report = |mut errors: Vec<FieldError>| {
        let origin = errors.first().and_then(|e| origins.position_of(&e.object)).cloned();
        for error in &mut errors {
            error.origin.clone_from(&origin);
        }
        converted.errors.extend(errors);
    };
    let mut services = Vec::with_capacity(objects.services.len());
    for service in &objects.services {
        match service_to_core(service) {
            Ok(found) => services.extend(found),
            Err(errors) => report(errors),
        }
    }
    let mut slices = Vec::with_capacity(objects.slices.len());
    for slice in &objects.slices {
        let strict = new_slice_address_errors(slice);
        match slice_to_core(slice) {
            Ok(found) if strict.is_empty() => slices.extend(found),
            Ok(_) => report(strict),
            Err(mut errors) => {
                errors.extend(strict);
                report(errors);
            }
        }
    }
    converted.services = services;
    converted.slices = slices;
    converted.nodes = objects.nodes.iter().map(node_to_core).collect();
    converted
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;
    use std::sync::Arc;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).unwrap()
    }

    fn web(spec: serde_json::Value) -> Service {
        service(json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec}))
    }

    fn problems(result: Result<Option<model::Service>, Vec<FieldError>>) -> Vec<String> {
        result.unwrap_err().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_service_with_port_70000_is_an_error_naming_the_port_and_a_valid_one_beside_it_converts() {
        let bad = web(json!({"clusterIP": "198.19.0.10", "ports": [{"port": 70000}]}));
        let good = service(json!({"metadata": {"name": "api", "namespace": "shop"},
            "spec": {"clusterIP": "198.19.0.11", "ports": [{"port": 443}]}}));
        let objects = ClusterObjects { services: vec![bad, good], ..ClusterObjects::default() };
        let mut origins = Origins::new();
        let file: Arc<Path> = Arc::from(Path::new("manifests/web.yaml"));
        let position = Position { line: Some(12), document: Some(2), ..Position::file(&file) };
        origins.insert(ObjectRef::new(ObjectKind::Service, "shop", "web"), position);
        let converted = convert_objects(&objects, &origins);
        let errors: Vec<String> = converted.errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                "manifests/web.yaml:12 (document 2): Service shop/web: spec.ports[0].port: must be between 1 and 65535, got 70000"
            ]
        );
        assert_eq!(converted.errors[0].field, "spec.ports[0].port");
        let names: Vec<String> = converted.services.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(names, ["shop/api"]);
        assert_eq!(converted.services[0].ports[0].protocol, Protocol::Tcp);
    }

    #[test]
    fn an_unknown_protocol_is_an_error() {
        let svc = web(json!({"clusterIP": "198.19.0.10", "ports": [
            {"name": "a", "port": 80}, {"name": "b", "port": 81, "protocol": "ICMP"}]}));
        assert_eq!(
            problems(service_to_core(&svc)),
            [r#"Service shop/web: spec.ports[1].protocol: unsupported value "ICMP""#]
        );
    }

    #[test]
    fn every_problem_of_a_service_is_reported() {
        let svc = web(json!({
            "type": "NodePort",
            "clusterIPs": ["198.19.0.10", "bogus"],
            "ports": [{"port": 80, "nodePort": 70000}, {"name": "x", "port": 81}],
            "externalIPs": ["1.2.3"],
            "loadBalancerSourceRanges": ["10.0.0.0/33"],
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}},
            "externalTrafficPolicy": "Nearby",
            "internalTrafficPolicy": "Somewhere",
        }));
        let fields: Vec<String> = service_to_core(&svc).unwrap_err().into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.clusterIPs[1]",
                "spec.ports[0].nodePort",
                "spec.ports[0].name",
                "spec.externalIPs[0]",
                "spec.loadBalancerSourceRanges[0]",
                "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                "spec.externalTrafficPolicy",
                "spec.internalTrafficPolicy",
            ]
        );
    }

    #[test]
    fn headless_external_name_unallocated_and_other_proxies_services_are_skipped() {
        let headless = web(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        let external_name = web(json!({"type": "ExternalName", "externalName": "example.com"}));
        let unallocated = web(json!({"ports": [{"port": 80}]}));
        let other_proxy = service(json!({
            "metadata": {"name": "web", "labels": {SERVICE_PROXY_NAME_LABEL: "elsewhere"}},
            "spec": {"clusterIP": "198.19.0.10", "ports": [{"port": 80}]}}));
        for svc in [headless, external_name, unallocated, other_proxy] {
            assert_eq!(service_to_core(&svc), Ok(None), "{svc:?}");
        }
    }

    #[test]
    fn a_load_balancer_ingress_with_ip_mode_proxy_is_flagged() {
        let svc = service(json!({
            "metadata": {"name": "web"},
            "spec": {"type": "LoadBalancer", "clusterIP": "198.19.0.10",
                     "ports": [{"port": 80, "nodePort": 30080}],
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "203.0.113.1"}, {"ip": "203.0.113.2", "ipMode": "Proxy"}, {"hostname": "lb.example"}]}}}));
        let converted = service_to_core(&svc).unwrap().unwrap();
        assert_eq!(
            converted.load_balancer_ingress,
            [
                LoadBalancerIngress { ip: "203.0.113.1".parse().unwrap(), is_proxy_mode: false },
                LoadBalancerIngress { ip: "203.0.113.2".parse().unwrap(), is_proxy_mode: true },
            ]
        );
        assert_eq!(converted.health_check_node_port, Some(31000));
        assert_eq!(converted.external_traffic_policy, TrafficPolicy::Local);
        assert_eq!(converted.name, NamespacedName::new("default", "web"));
    }

    #[test]
    fn kubernetes_defaults_and_legacy_spellings_are_understood() {
        let svc = web(json!({
            "type": "NodePort",
            "clusterIP": "010.096.000.001",
            "clusterIPs": ["10.96.0.1", "fd00::1"],
            "ports": [{"port": 53, "protocol": "UDP"}],
            "loadBalancerSourceRanges": [" 10.0.0.1/8 "],
            "sessionAffinity": "ClientIP",
            "externalTrafficPolicy": "Global",
            "trafficDistribution": "PreferClose",
        }));
        let converted = service_to_core(&svc).unwrap().unwrap();
        assert_eq!(converted.cluster_ips, ["10.96.0.1".parse::<IpAddr>().unwrap(), "fd00::1".parse().unwrap()]);
        assert_eq!(converted.load_balancer_source_ranges, ["10.0.0.0/8".parse::<IpNet>().unwrap()]);
        assert_eq!(converted.session_affinity, Some(ClientIpAffinity { timeout: DEFAULT_AFFINITY_TIMEOUT }));
        assert_eq!(converted.external_traffic_policy, TrafficPolicy::Cluster);
        assert_eq!(converted.traffic_distribution, Some(TrafficDistribution::PreferSameZone));
        let unknown = web(json!({"clusterIP": "10.96.0.1", "trafficDistribution": "PreferSomewhereNice"}));
        assert_eq!(service_to_core(&unknown).unwrap().unwrap().traffic_distribution, None);
    }

    #[test]
    fn a_health_check_node_port_outside_a_local_load_balancer_is_an_error_naming_the_field() {
        for spec in [
            json!({"type": "NodePort", "clusterIP": "10.96.0.1", "externalTrafficPolicy": "Local",
                   "ports": [{"port": 80, "nodePort": 30080}], "healthCheckNodePort": 31000}),
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.1", "externalTrafficPolicy": "Cluster",
                   "ports": [{"port": 80, "nodePort": 30080}], "healthCheckNodePort": 31000}),
            json!({"clusterIP": "10.96.0.1", "ports": [{"port": 80}], "healthCheckNodePort": 31000}),
        ] {
            let errors = service_to_core(&web(spec.clone())).unwrap_err();
            assert_eq!(errors.len(), 1, "{spec}: {errors:?}");
            assert_eq!(errors[0].field, "spec.healthCheckNodePort");
            assert_eq!(errors[0].object.to_string(), "Service shop/web");
        }
        let ok = web(json!({"type": "LoadBalancer", "clusterIP": "10.96.0.1", "externalTrafficPolicy": "Local",
                            "ports": [{"port": 80, "nodePort": 30080}], "healthCheckNodePort": 31000}));
        assert_eq!(service_to_core(&ok).unwrap().unwrap().health_check_node_port, Some(31000));
    }

    #[test]
    fn a_bad_health_check_node_port_on_one_service_leaves_the_others_programmed() {
        let mut objects = ClusterObjects::default();
        let mut bad = web(json!({"type": "NodePort", "clusterIP": "10.96.0.1",
                                 "ports": [{"port": 80, "nodePort": 30080}], "healthCheckNodePort": 31000}));
        bad.metadata.name = Some("bad".to_owned());
        objects.services.push(bad);
        objects.services.push(web(json!({"clusterIP": "10.96.0.2", "ports": [{"port": 80}]})));
        let converted = convert_objects(&objects, &Origins::new());
        assert_eq!(converted.errors.len(), 1);
        assert_eq!(converted.errors[0].field, "spec.healthCheckNodePort");
        assert!(converted.errors[0].to_string().contains("Service shop/bad"), "{}", converted.errors[0]);
        assert_eq!(converted.services.len(), 1);
    }

    #[test]
    fn slice_endpoints_take_their_first_address_and_default_conditions() {
        let converted = slice_to_core(&slice(json!({
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["198.18.0.2", "198.18.0.99"], "nodeName": "node-1", "zone": "a",
                 "hints": {"forZones": [{"name": "a"}], "forNodes": [{"name": "node-1"}]}},
                {"addresses": ["198.18.0.3"], "conditions": {"ready": false, "terminating": true}},
                {"addresses": ["198.18.0.4"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            ],
            "ports": [{"name": "http", "port": 8080}, {"name": "all"}, {"port": 53, "protocol": "UDP"}],
        })))
        .unwrap()
        .unwrap();
        assert_eq!(converted.service, NamespacedName::new("shop", "web"));
        assert_eq!(converted.family, IpFamily::V4);
        let e = &converted.endpoints;
        assert_eq!(e[0].address, "198.18.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((e[0].ready, e[0].serving, e[0].terminating), (true, true, false));
        assert_eq!((e[0].zone_hints(), e[0].node_hints()), (&[model::intern("a")][..], &[model::intern("node-1")][..]));
        assert_eq!((e[1].ready, e[1].serving, e[1].terminating), (false, false, true));
        assert_eq!((e[2].ready, e[2].serving, e[2].terminating), (false, true, true));
        assert_eq!(
            converted.ports,
            [
                model::EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 },
                model::EndpointPort { name: String::new(), protocol: Protocol::Udp, port: 53 },
            ]
        );
    }

    #[test]
    fn fqdn_unowned_headless_and_other_proxies_slices_are_skipped() {
        let labelled = |labels: serde_json::Value, address_type: &str| {
            slice(json!({"metadata": {"name": "s", "labels": labels}, "addressType": address_type, "endpoints": []}))
        };
        let cases = [
            labelled(json!({SERVICE_NAME_LABEL: "web"}), "FQDN"),
            labelled(json!({}), "IPv4"),
            labelled(json!({SERVICE_NAME_LABEL: "web", HEADLESS_LABEL: ""}), "IPv4"),
            labelled(json!({SERVICE_NAME_LABEL: "web", SERVICE_PROXY_NAME_LABEL: "x"}), "IPv4"),
        ];
        for case in cases {
            assert_eq!(slice_to_core(&case), Ok(None), "{case:?}");
        }
    }

    #[test]
    fn a_slice_address_of_the_wrong_family_is_an_error() {
        let errors = slice_to_core(&slice(json!({
            "metadata": {"name": "s", "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["fd00::1"]}, {"addresses": []}],
            "ports": [{"port": 0}],
        })))
        .unwrap_err();
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                r#"EndpointSlice shop/s: endpoints[0].addresses[0]: "fd00::1" is not an IPv4 address"#,
                "EndpointSlice shop/s: endpoints[1].addresses: required",
                "EndpointSlice shop/s: ports[0].port: must be between 1 and 65535, got 0",
            ]
        );
    }

    #[test]
    fn a_node_has_its_internal_then_external_addresses_and_its_zone() {
        let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "node-1", "labels": {ZONE_LABEL: "zone-a"}},
        "status": {"addresses": [
            {"type": "Hostname", "address": "node-1"},
            {"type": "ExternalIP", "address": "203.0.113.7"},
            {"type": "InternalIP", "address": "10.0.0.7"},
            {"type": "InternalIP", "address": "fd00::7"},
            {"type": "ExternalIP", "address": "10.0.0.7"},
        ]}}))
        .unwrap();
        let converted = node_to_core(&node);
        let addresses: Vec<String> = converted.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(addresses, ["10.0.0.7", "fd00::7", "203.0.113.7"]);
        assert_eq!(converted.zone.as_deref(), Some("zone-a"));
        assert_eq!(converted.name, "node-1");
    }

    #[test]
    fn cidrs_and_ips_parse_as_kubernetes_reads_them() {
        assert_eq!(parse_cidr("10.0.0.1/8"), Some("10.0.0.0/8".parse().unwrap()));
        assert_eq!(parse_cidr("fd00::1/64"), Some("fd00::/64".parse().unwrap()));
        assert_eq!(parse_cidr("10.0.0.0"), None);
        assert_eq!(parse_cidr("10.0.0.0/+8"), None);
        assert_eq!(parse_ip("010.000.000.001"), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(parse_ip("1.2.3"), None);
        assert_eq!(parse_ip("256.0.0.1"), None);
    }

    #[test]
    fn a_slice_keeps_its_last_change_trigger_time_and_ignores_an_unparsable_one() {
        let with = |value: &str| {
            slice(json!({"metadata": {"name": "web-1", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"},
                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": value}},
                "addressType": "IPv4", "endpoints": []}))
        };
        let converted = slice_to_core(&with("2026-11-26T03:30:00.5Z")).unwrap().unwrap();
        let expected = std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_663_800_500);
        assert_eq!(converted.last_change_trigger, Some(expected));
        assert_eq!(slice_to_core(&with("yesterday")).unwrap().unwrap().last_change_trigger, None);
    }

    #[test]
    fn a_target_port_out_of_range_or_badly_named_and_a_local_policy_on_a_cluster_ip_service_are_errors() {
        let fields = |spec: serde_json::Value| -> Vec<String> {
            service_to_core(&web(spec)).err().unwrap_or_default().into_iter().map(|e| e.field).collect()
        };
        let port = |target: serde_json::Value| json!({"clusterIP": "198.19.0.10", "ports": [{"port": 80, "targetPort": target}]});
        assert_eq!(fields(port(json!(70000))), ["spec.ports[0].targetPort"]);
        assert_eq!(fields(port(json!("no way"))), ["spec.ports[0].targetPort"]);
        assert!(fields(port(json!("http-alt"))).is_empty());
        assert!(fields(port(json!(8080))).is_empty());
        let local = |extra: serde_json::Value| {
            let mut spec =
                json!({"clusterIP": "198.19.0.10", "ports": [{"port": 80}], "externalTrafficPolicy": "Local"});
            spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            fields(spec)
        };
        assert_eq!(local(json!({})), ["spec.externalTrafficPolicy"]);
        assert!(local(json!({"type": "NodePort"})).is_empty());
        assert!(local(json!({"externalIPs": ["198.18.100.1"]})).is_empty());
    }

    #[test]
    fn a_new_slice_with_a_non_canonical_or_ipv4_mapped_address_is_refused_naming_the_address() {
        let with = |family: &str, address: &str| {
            new_slice_address_errors(&slice(json!({"metadata": {"name": "web-1", "namespace": "shop",
                "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": family, "endpoints": [{"addresses": [address]}]})))
            .into_iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
        };
        assert!(with("IPv6", "2001:db8::a").is_empty());
        assert!(with("IPv4", "198.18.0.1").is_empty());
        let upper = with("IPv6", "2001:DB8::A");
        assert!(upper.len() == 1 && upper[0].contains("endpoints[0].addresses[0]") && upper[0].contains("canonical"));
        assert_eq!(with("IPv4", "198.018.0.1").len(), 0, "unparsable: slice_to_core reports it");
        assert!(with("IPv6", "::ffff:198.18.0.5")[0].contains("IPv4-mapped"));
    }

    #[test]
    fn a_node_being_deleted_or_tainted_by_the_autoscaler_is_leaving() {
        let node = |value: serde_json::Value| node_to_core(&serde_json::from_value(value).unwrap());
        assert!(!node(json!({"metadata": {"name": "n1"}})).leaving);
        assert!(node(json!({"metadata": {"name": "n1", "deletionTimestamp": "2026-11-26T03:30:00Z"}})).leaving);
        let tainted = json!({"metadata": {"name": "n1"},
            "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}});
        assert!(node(tainted).leaving);
    }

    #[test]
    fn a_planned_slice_converts_to_what_its_endpoint_slice_object_converts_to_or_is_left_to_that_path() {
        use k8s_openapi::api::core::v1::Pod;
        let pod = |name: &str, node: &str, ips: &[&str], ready: bool, extra: serde_json::Value| -> Pod {
            let mut value = json!({
                "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
                "spec": {"nodeName": node, "hostname": name, "subdomain": "web",
                         "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080},
                                                                 {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]},
                "status": {"podIP": ips[0], "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                           "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
            });
            if let (Some(target), Some(extra)) = (value.get_mut("metadata"), extra.as_object()) {
                for (key, field) in extra {
                    target[key] = field.clone();
                }
            }
            serde_json::from_value(value).unwrap()
        };
        let pods = vec![
            pod("a", "node1", &["198.18.129.2", "2001:db8:1:1::2"], true, json!({})),
            pod("b", "node2", &["198.18.130.3"], false, json!({})),
            pod("c", "node2", &["198.18.130.4"], true, json!({"deletionTimestamp": "2026-01-01T00:00:00Z"})),
            pod("d", "node3", &["2001:db8:1:2::5"], true, json!({})),
        ];
        let nodes: Vec<Node> = ["node1", "node2"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                serde_json::from_value(json!({"metadata": {"name": name,
                    "labels": {"topology.kubernetes.io/zone": format!("zone-{i}")}}}))
                .unwrap()
            })
            .collect();
        let web = |name: &str, spec: serde_json::Value, labels: serde_json::Value| -> Service {
            let mut value = json!({
                "metadata": {"name": name, "namespace": "shop", "labels": labels},
                "spec": {"selector": {"app": "web"}, "ipFamilies": ["IPv4", "IPv6"],
                         "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                                   {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
                                   {"name": "raw", "port": 90, "targetPort": 9090}]}
            });
            for (key, field) in spec.as_object().unwrap() {
                value["spec"][key] = field.clone();
            }
            service(value)
        };
        // (Service, whether its slices convert as planned)
        let cases = [
            (web("plain", json!({}), json!({})), true),
            (web("same-node", json!({"trafficDistribution": "PreferSameNode"}), json!({"team": "x"})), true),
            (
                web(
                    "close",
                    json!({"trafficDistribution": "PreferClose", "publishNotReadyAddresses": true}),
                    json!({}),
                ),
                true,
            ),
            (web("sctp", json!({"ports": [{"name": "s", "port": 7, "protocol": "SCTP"}]}), json!({})), true),
            (web("headless", json!({"clusterIP": "None"}), json!({})), false),
            (web("other-proxy", json!({}), json!({"service.kubernetes.io/service-proxy-name": "x"})), false),
            (
                web("port-out-of-range", json!({"ports": [{"name": "p", "port": 80, "targetPort": 70000}]}), json!({})),
                false,
            ),
        ];
        for (service, direct) in &cases {
            let name = service.metadata.name.clone().unwrap();
            let shapes = svcplane_controller::plan_slice_shapes_from(service, &pods, &nodes).unwrap().unwrap();
            assert!(!shapes.slices().is_empty(), "{name}: slices planned");
            for shape in shapes.slices() {
                let object = shapes.endpoint_slice(shape);
                let via_object = slice_to_core(&object);
                match planned_slice_to_core(&shapes, shape) {
                    Some(core) => {
                        assert!(*direct, "{name}: converted as planned");
                        assert!(new_slice_address_errors(&object).is_empty());
                        assert_eq!(via_object, Ok(Some(core)), "{name}: {object:#?}");
                    }
                    None => assert!(!*direct, "{name}: left to the object's conversion"),
                }
            }
        }

        // An IPv4-mapped address: the object's conversion refuses it, naming it.
        let mapped = vec![pod("m", "node1", &["::ffff:198.18.1.1"], true, json!({}))];
        let service = web("mapped", json!({"ipFamilies": ["IPv6"]}), json!({}));
        let shapes = svcplane_controller::plan_slice_shapes_from(&service, &mapped, &nodes).unwrap().unwrap();
        assert!(shapes.slices().iter().all(|shape| planned_slice_to_core(&shapes, shape).is_none()));
        assert!(!new_slice_address_errors(&shapes.endpoint_slice(&shapes.slices()[0])).is_empty());
    }
}
