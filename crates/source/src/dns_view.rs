//! Cluster DNS's view of the cluster: Services (ClusterIP, headless with the endpoints of
//! their EndpointSlices, ExternalName) and the namespaces that exist, converted into
//! [`svcplane_core::discovery::ClusterView`] with validation.
//!
//! Unlike [`crate::convert`], which skips a whole object with any problem (the proxy must
//! not program half a Service), DNS leaves out only what is broken: a port with an invalid
//! name loses its SRV record but the Service keeps its A record, and an endpoint with an
//! unparsable address is dropped while its neighbours stay. A Service whose name, namespace,
//! addresses or ExternalName cannot be served is left out whole. Every problem is reported,
//! naming the object and the field; one broken Service never stops the others.
//!
//! Services labelled for another proxy are still served: DNS is not the proxy's business.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcplane_core::discovery::{
    ClusterView, DnsEndpoint, DnsPort, DnsService, EndpointSet, Protocol, ServiceKind, is_dns_label, is_domain_name,
};
use tracing::trace;

use crate::convert::{FieldError, Problem, SERVICE_NAME_LABEL, parse_ip};
use crate::manifests::{ClusterObjects, ObjectKind, ObjectRef, Origins};

/// Namespaces every Kubernetes cluster has, whether or not the manifests mention them.
pub const BUILT_IN_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// The DNS view of a snapshot, with the problems found.
#[derive(Debug, Clone, Default)]
pub struct DnsView {
    pub view: ClusterView,
    /// Each error names where its object was defined, when the origins know it.
    pub errors: Vec<FieldError>,
}

/// Converts a snapshot: `objects.services` should have their cluster IPs allocated and
/// `objects.slices` hold the EndpointSlices (generated and explicit), as the controller's
/// `reconcile` returns them. Pods and slices only add to the namespaces that exist.
pub fn dns_view(objects: &ClusterObjects, origins: &Origins) -> DnsView {
    let services: Vec<DnsServicePart> = objects.services.iter().map(DnsServicePart::of).collect();
    let slices: Vec<DnsSlicePart> = objects.slices.iter().map(DnsSlicePart::of).collect();
    let mut result = assemble_view(
        services.iter(),
        &slices.iter().collect::<Vec<_>>(),
        objects.pods.iter().map(|pod| namespace_of(&pod.metadata)),
    );
    for error in &mut result.errors {
        error.origin = origins.position_of(&error.object).cloned();
    }
    result
}

/// What DNS keeps of one Service between changes, converted the moment it arrives (a
/// watch keeps this instead of the API object): the Service as DNS serves it (a headless
/// one still without endpoints: those come from its slices when a view is assembled) and
/// the problems found in it.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsServicePart {
    pub service: Option<DnsService>,
    pub errors: Vec<FieldError>,
}

impl DnsServicePart {
    pub fn of(service: &Service) -> Self {
        let (service, errors) = service_to_dns(service, &[]);
        Self { service, errors }
    }
}

/// What DNS keeps of one EndpointSlice between changes: the Service it belongs to (its
/// `kubernetes.io/service-name` label), its endpoints and ports, and the problems found in
/// it (reported only while the slice's Service is headless, the only kind that uses them).
#[derive(Debug, Clone, PartialEq)]
pub struct DnsSlicePart {
    pub namespace: String,
    pub service: Option<String>,
    pub set: Option<EndpointSet>,
    pub errors: Vec<FieldError>,
}

impl DnsSlicePart {
    pub fn of(slice: &EndpointSlice) -> Self {
        let service = slice.metadata.labels.as_ref().and_then(|labels| labels.get(SERVICE_NAME_LABEL)).cloned();
        let (set, errors) = if service.is_some() { endpoint_set(slice) } else { (None, Vec::new()) };
        Self { namespace: namespace_of(&slice.metadata).to_owned(), service, set, errors }
    }
}

/// The view of converted Services and slices (`slices` in the order their endpoints are
/// listed), with the namespaces of `more_namespaces` also existing. Errors carry no origin.
pub fn assemble_view<'a>(
    services: impl Iterator<Item = &'a DnsServicePart>,
    slices: &[&DnsSlicePart],
    more_namespaces: impl Iterator<Item = &'a str>,
) -> DnsView {
    let mut slices_by_service: HashMap<(&str, &str), Vec<&DnsSlicePart>> = HashMap::new();
    for slice in slices {
        if let Some(service) = &slice.service {
            slices_by_service.entry((slice.namespace.as_str(), service.as_str())).or_default().push(slice);
        }
    }
    let mut namespaces: BTreeSet<String> = BUILT_IN_NAMESPACES.iter().map(|ns| (*ns).to_owned()).collect();
    namespaces.extend(more_namespaces.map(str::to_owned));
    namespaces.extend(slices.iter().map(|slice| slice.namespace.clone()));

    let mut result = DnsView::default();
    for part in services {
        result.errors.extend(part.errors.iter().cloned());
        let Some(service) = &part.service else { continue };
        let mut service = service.clone();
        if let ServiceKind::Headless { endpoints, .. } = &mut service.kind {
            let own = slices_by_service.get(&(service.namespace.as_str(), service.name.as_str()));
            for slice in own.map(Vec::as_slice).unwrap_or_default() {
                result.errors.extend(slice.errors.iter().cloned());
                endpoints.extend(slice.set.iter().cloned());
            }
        }
        namespaces.insert(service.namespace.clone());
        result.view.services.push(service);
    }
    result.view.namespaces = namespaces.into_iter().collect();
    result
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace.as_deref().filter(|ns| !ns.is_empty()).unwrap_or(crate::manifests::DEFAULT_NAMESPACE)
}

/// Collects the problems of one object.
struct Report {
    object: ObjectRef,
    errors: Vec<FieldError>,
}

impl Report {
    fn new(object: ObjectRef) -> Self {
        Self { object, errors: Vec::new() }
    }

    fn add(&mut self, field: impl Into<String>, problem: Problem) {
        self.errors.push(FieldError { origin: None, object: self.object.clone(), field: field.into(), problem });
    }

    fn invalid(&mut self, field: impl Into<String>, reason: &str) {
        self.add(field, Problem::Invalid { reason: reason.to_owned() });
    }
}

/// Converts one Service with the EndpointSlices labelled as its own (used when it is
/// headless). Returns the Service when it can be served, and every problem found, in the
/// Service or in its slices.
pub fn service_to_dns(service: &Service, slices: &[&EndpointSlice]) -> (Option<DnsService>, Vec<FieldError>) {
    let reference = ObjectRef::from_meta(ObjectKind::Service, &service.metadata);
    let mut report = Report::new(reference.clone());
    let Some(spec) = service.spec.as_ref() else {
        trace!(service = %reference, "skipped: no spec");
        return (None, Vec::new());
    };
    if !is_dns_label(&reference.name) {
        report.invalid("metadata.name", "must be a DNS label (1 to 63 letters, digits or inner hyphens)");
    }
    if !is_dns_label(&reference.namespace) {
        report.invalid("metadata.namespace", "must be a DNS label (1 to 63 letters, digits or inner hyphens)");
    }
    if !report.errors.is_empty() {
        return (None, report.errors);
    }

    let ports = service_ports(&mut report, spec.ports.as_deref().unwrap_or_default());
    let kind = match spec.type_.as_deref() {
        Some("ExternalName") => match spec.external_name.as_deref().map(str::trim) {
            None | Some("") => {
                report.add("spec.externalName", Problem::Required);
                None
            }
            Some(target) if !is_domain_name(target) => {
                report.invalid("spec.externalName", &format!("{target:?} is not a domain name"));
                None
            }
            Some(target) => Some(ServiceKind::ExternalName { target: target.to_owned() }),
        },
        None | Some("" | "ClusterIP" | "NodePort" | "LoadBalancer") => {
            let primary = spec.cluster_ip.as_deref().unwrap_or_default();
            let listed = spec.cluster_ips.as_deref().unwrap_or_default();
            if primary == "None" || listed.first().is_some_and(|ip| ip == "None") {
                let mut endpoints = Vec::with_capacity(slices.len());
                for slice in slices {
                    let (set, errors) = endpoint_set(slice);
                    report.errors.extend(errors);
                    endpoints.extend(set);
                }
                let publish_not_ready_addresses = spec.publish_not_ready_addresses == Some(true);
                Some(ServiceKind::Headless { endpoints, publish_not_ready_addresses })
            } else {
                cluster_ips(&mut report, primary, listed).map(|ips| ServiceKind::ClusterIp { ips })
            }
        }
        Some(other) => {
            report.add("spec.type", Problem::Unsupported { value: other.to_owned() });
            None
        }
    };
    let converted = kind.map(|kind| DnsService {
        namespace: reference.namespace.to_string(),
        name: reference.name.to_string(),
        kind,
        ports,
    });
    (converted, report.errors)
}

/// `spec.clusterIPs` when set, else `spec.clusterIP`. `None` when there is no usable address
/// (not allocated yet is no error).
fn cluster_ips(report: &mut Report, primary: &str, listed: &[String]) -> Option<Vec<IpAddr>> {
    let given: Vec<(String, &str)> = if listed.is_empty() {
        if primary.is_empty() { Vec::new() } else { vec![("spec.clusterIP".to_owned(), primary)] }
    } else {
        listed.iter().enumerate().map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.as_str())).collect()
    };
    if given.is_empty() {
        trace!(service = %report.object, "skipped: no cluster IP allocated");
        return None;
    }
    let mut ips = Vec::with_capacity(given.len());
    for (field, text) in given {
        match parse_ip(text) {
            Some(ip) => ips.push(ip),
            None => report.add(field, Problem::InvalidIp { value: text.to_owned() }),
        }
    }
    (!ips.is_empty()).then_some(ips)
}

fn protocol(report: &mut Report, value: Option<&str>, field: impl FnOnce() -> String) -> Option<Protocol> {
    match value {
        None | Some("" | "TCP") => Some(Protocol::Tcp),
        Some("UDP") => Some(Protocol::Udp),
        Some("SCTP") => Some(Protocol::Sctp),
        Some(other) => {
            report.add(field(), Problem::Unsupported { value: other.to_owned() });
            None
        }
    }
}

fn port_number(report: &mut Report, value: i32, field: impl FnOnce() -> String) -> Option<u16> {
    match u16::try_from(value) {
        Ok(port) if port != 0 => Some(port),
        _ => {
            report.add(field(), Problem::OutOfRange { value: value.into(), min: 1, max: 65_535 });
            None
        }
    }
}

/// A port name is used as an SRV label: it must be a DNS label (or empty: no SRV record).
fn port_name(report: &mut Report, name: Option<&str>, field: impl FnOnce() -> String) -> Option<String> {
    let name = name.unwrap_or_default();
    if !name.is_empty() && !is_dns_label(name) {
        report.invalid(field(), &format!("{name:?} is not a DNS label, so it gets no SRV record"));
        return None;
    }
    Some(name.to_owned())
}

fn service_ports(report: &mut Report, ports: &[k8s_openapi::api::core::v1::ServicePort]) -> Vec<DnsPort> {
    let mut converted = Vec::with_capacity(ports.len());
    for (i, port) in ports.iter().enumerate() {
        let name = port_name(report, port.name.as_deref(), || format!("spec.ports[{i}].name"));
        let protocol = protocol(report, port.protocol.as_deref(), || format!("spec.ports[{i}].protocol"));
        let number = port_number(report, port.port, || format!("spec.ports[{i}].port"));
        if let (Some(name), Some(protocol), Some(port)) = (name, protocol, number) {
            converted.push(DnsPort { name, protocol, port });
        }
    }
    converted
}

/// The endpoints of one EndpointSlice; `None` for FQDN slices and slices of an unknown
/// address type.
fn endpoint_set(slice: &EndpointSlice) -> (Option<EndpointSet>, Vec<FieldError>) {
    let mut report = Report::new(ObjectRef::from_meta(ObjectKind::EndpointSlice, &slice.metadata));
    let is_v6 = match slice.address_type.as_str() {
        "IPv4" => false,
        "IPv6" => true,
        "FQDN" => return (None, Vec::new()),
        other => {
            report.add("addressType", Problem::Unsupported { value: other.to_owned() });
            return (None, report.errors);
        }
    };
    let mut ports = Vec::new();
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        // A port without a number means "all ports": nothing to put in an SRV record.
        let Some(value) = port.port else { continue };
        let name = port_name(&mut report, port.name.as_deref(), || format!("ports[{i}].name"));
        let protocol = protocol(&mut report, port.protocol.as_deref(), || format!("ports[{i}].protocol"));
        let number = port_number(&mut report, value, || format!("ports[{i}].port"));
        if let (Some(name), Some(protocol), Some(port)) = (name, protocol, number) {
            ports.push(DnsPort { name, protocol, port });
        }
    }
    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        let hostname = match endpoint.hostname.as_deref() {
            None | Some("") => None,
            Some(hostname) if is_dns_label(hostname) => Some(hostname.to_owned()),
            Some(hostname) => {
                report.invalid(
                    format!("endpoints[{i}].hostname"),
                    &format!("{hostname:?} is not a DNS label; the endpoint is named by its address"),
                );
                None
            }
        };
        let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        if endpoint.addresses.is_empty() {
            report.add(format!("endpoints[{i}].addresses"), Problem::Required);
        }
        for (j, address) in endpoint.addresses.iter().enumerate() {
            let field = || format!("endpoints[{i}].addresses[{j}]");
            let Some(ip) = parse_ip(address) else {
                report.add(field(), Problem::InvalidIp { value: address.clone() });
                continue;
            };
            if ip.is_ipv6() != is_v6 {
                let expected =
                    if is_v6 { svcplane_core::model::IpFamily::V6 } else { svcplane_core::model::IpFamily::V4 };
                report.add(field(), Problem::WrongFamily { value: address.clone(), expected });
                continue;
            }
            endpoints.push(DnsEndpoint {
                ip,
                hostname: hostname.clone(),
                ready,
                node_name: endpoint.node_name.as_deref().map(svcplane_core::model::intern),
            });
        }
    }
    (Some(EndpointSet { ports, endpoints }), report.errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).unwrap()
    }

    fn view_of(services: Vec<Service>, slices: Vec<EndpointSlice>) -> DnsView {
        let objects = ClusterObjects { services, slices, ..ClusterObjects::default() };
        dns_view(&objects, &Origins::new())
    }

    fn messages(view: &DnsView) -> Vec<String> {
        view.errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_cluster_ip_service_keeps_its_addresses_and_ports() {
        let web = service(json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": "NodePort", "clusterIPs": ["10.96.0.10", "fd00::10"],
                     "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}}));
        let view = view_of(vec![web], vec![]);
        assert!(view.errors.is_empty(), "{:?}", messages(&view));
        let [converted] = view.view.services.as_slice() else { panic!() };
        assert_eq!(
            converted.kind,
            ServiceKind::ClusterIp { ips: vec!["10.96.0.10".parse().unwrap(), "fd00::10".parse().unwrap()] }
        );
        assert_eq!(
            converted.ports,
            [
                DnsPort { name: "http".into(), protocol: Protocol::Tcp, port: 80 },
                DnsPort { name: "dns".into(), protocol: Protocol::Udp, port: 53 }
            ]
        );
        assert!(view.view.namespaces.contains(&"shop".to_owned()));
        assert!(view.view.namespaces.contains(&"kube-system".to_owned()));
    }

    #[test]
    fn a_headless_service_takes_the_endpoints_of_its_own_slices_only() {
        let db = service(json!({"metadata": {"name": "db"},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "ports": [{"name": "sql", "port": 5432}]}}));
        let own = slice(json!({"metadata": {"name": "db-1", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "ports": [{"name": "sql", "port": 15432, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "hostname": "db-0", "conditions": {"ready": true}, "nodeName": "n1"},
            {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
        ]}));
        let other = slice(json!({"metadata": {"name": "x-1", "labels": {"kubernetes.io/service-name": "x"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.9.9"]}]}));
        let view = view_of(vec![db], vec![own, other]);
        assert!(view.errors.is_empty(), "{:?}", messages(&view));
        let ServiceKind::Headless { endpoints, publish_not_ready_addresses } = &view.view.services[0].kind else {
            panic!("not headless")
        };
        assert!(publish_not_ready_addresses);
        assert_eq!(endpoints.len(), 1);
        assert_eq!(endpoints[0].ports, [DnsPort { name: "sql".into(), protocol: Protocol::Tcp, port: 15432 }]);
        let addresses: Vec<(String, Option<String>, bool)> =
            endpoints[0].endpoints.iter().map(|e| (e.ip.to_string(), e.hostname.clone(), e.ready)).collect();
        assert_eq!(addresses, [("10.0.0.1".into(), Some("db-0".into()), true), ("10.0.0.2".into(), None, false)]);
    }

    #[test]
    fn an_external_name_service_becomes_a_cname_target_and_a_bad_one_is_reported() {
        let ext = service(
            json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName", "externalName": "foo.example.com"}}),
        );
        let bad =
            service(json!({"metadata": {"name": "bad"}, "spec": {"type": "ExternalName", "externalName": "foo bar"}}));
        let missing = service(json!({"metadata": {"name": "missing"}, "spec": {"type": "ExternalName"}}));
        let view = view_of(vec![ext, bad, missing], vec![]);
        assert_eq!(view.view.services.len(), 1);
        assert_eq!(view.view.services[0].kind, ServiceKind::ExternalName { target: "foo.example.com".into() });
        assert_eq!(
            messages(&view),
            [
                r#"Service default/bad: spec.externalName: "foo bar" is not a domain name"#,
                "Service default/missing: spec.externalName: required",
            ]
        );
    }

    #[test]
    fn a_bad_port_name_loses_only_its_srv_record_and_is_reported() {
        let web = service(json!({"metadata": {"name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [
                {"name": "HTTP_alt", "port": 8080}, {"name": "http", "port": 80}, {"name": "x", "port": 0},
                {"name": "y", "port": 9, "protocol": "ICMP"}]}}));
        let view = view_of(vec![web], vec![]);
        assert_eq!(view.view.services[0].ports, [DnsPort { name: "http".into(), protocol: Protocol::Tcp, port: 80 }]);
        assert_eq!(
            messages(&view),
            [
                r#"Service default/web: spec.ports[0].name: "HTTP_alt" is not a DNS label, so it gets no SRV record"#,
                "Service default/web: spec.ports[2].port: must be between 1 and 65535, got 0",
                r#"Service default/web: spec.ports[3].protocol: unsupported value "ICMP""#,
            ]
        );
    }

    #[test]
    fn broken_endpoints_are_dropped_and_reported_while_their_neighbours_stay() {
        let db = service(json!({"metadata": {"name": "db"}, "spec": {"clusterIP": "None"}}));
        let broken = slice(json!({"metadata": {"name": "db-1", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.0.0.1"], "hostname": "Not_A_Label"},
            {"addresses": ["fd00::1"]},
            {"addresses": ["10.0.0.300"]},
            {"addresses": ["10.0.0.4"]},
        ]}));
        let view = view_of(vec![db], vec![broken]);
        let ServiceKind::Headless { endpoints, .. } = &view.view.services[0].kind else { panic!() };
        let kept: Vec<String> = endpoints[0].endpoints.iter().map(|e| e.ip.to_string()).collect();
        assert_eq!(kept, ["10.0.0.1", "10.0.0.4"]);
        assert_eq!(endpoints[0].endpoints[0].hostname, None);
        assert_eq!(
            messages(&view),
            [
                r#"EndpointSlice default/db-1: endpoints[0].hostname: "Not_A_Label" is not a DNS label; the endpoint is named by its address"#,
                r#"EndpointSlice default/db-1: endpoints[1].addresses[0]: "fd00::1" is not an IPv4 address"#,
                r#"EndpointSlice default/db-1: endpoints[2].addresses[0]: invalid IP address "10.0.0.300""#,
            ]
        );
    }

    #[test]
    fn one_broken_service_never_stops_the_others() {
        let bad_ip = service(json!({"metadata": {"name": "a"}, "spec": {"clusterIP": "10.96.0.999"}}));
        let bad_name = service(json!({"metadata": {"name": "b.c"}, "spec": {"clusterIP": "10.96.0.2"}}));
        let bad_type = service(json!({"metadata": {"name": "d"}, "spec": {"type": "Magic", "clusterIP": "10.96.0.3"}}));
        let good = service(json!({"metadata": {"name": "e"}, "spec": {"clusterIP": "10.96.0.4"}}));
        let unallocated = service(json!({"metadata": {"name": "f"}, "spec": {}}));
        let view = view_of(vec![bad_ip, bad_name, bad_type, good, unallocated], vec![]);
        let names: Vec<&str> = view.view.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["e"]);
        assert_eq!(
            messages(&view),
            [
                r#"Service default/a: spec.clusterIP: invalid IP address "10.96.0.999""#,
                "Service default/b.c: metadata.name: must be a DNS label (1 to 63 letters, digits or inner hyphens)",
                r#"Service default/d: spec.type: unsupported value "Magic""#,
            ]
        );
    }

    #[test]
    fn namespaces_come_from_services_pods_slices_and_the_built_in_ones() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "jobs"}})).unwrap();
        let objects = ClusterObjects { pods: vec![pod], ..ClusterObjects::default() };
        let view = dns_view(&objects, &Origins::new());
        assert_eq!(view.view.namespaces, ["default", "jobs", "kube-node-lease", "kube-public", "kube-system"]);
    }
}
