use super::*;
use crate::test_objects::*;

/// Allocates and unwraps every Service, failing the test on any error.
fn allocate_ok(allocator: &mut Allocator, services: &[Service]) -> Vec<Service> {
    allocator
        .allocate(services)
        .services
        .into_iter()
        .map(|result| result.unwrap_or_else(|errors| panic!("unexpected errors: {errors:?}")))
        .collect()
}

/// The error messages of an outcome, in order.
fn messages(outcome: &AllocationOutcome) -> Vec<String> {
    outcome.services.iter().filter_map(|r| r.as_ref().err()).flatten().map(ToString::to_string).collect()
}

/// The names of the Services an outcome returned without error.
fn accepted(outcome: &AllocationOutcome) -> Vec<String> {
    outcome
        .services
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|service| service.metadata.name.clone().unwrap())
        .collect()
}

fn ip_of(service: &Service) -> IpAddr {
    cluster_ips(service)[0].parse().unwrap()
}

fn cluster_ip_service(key: &str) -> Service {
    service(key, |_| {})
}

fn with_cluster_ip(key: &str, ip: &str) -> Service {
    service(key, |spec| spec.cluster_ip = Some(ip.to_owned()))
}

fn dual_stack(key: &str, policy: &str) -> Service {
    service(key, |spec| spec.ip_family_policy = Some(policy.to_owned()))
}

fn local_load_balancer(key: &str) -> Service {
    service(key, |spec| {
        spec.type_ = Some("LoadBalancer".to_owned());
        spec.external_traffic_policy = Some("Local".to_owned());
        spec.ports = Some(vec![port("http", 80)]);
    })
}

fn key(text: &str) -> ObjectKey {
    ObjectKey::parse(text).unwrap()
}

/// `(name, cluster IP)` of each Service, sorted by name.
fn ips_by_name(services: &[Service]) -> Vec<(String, String)> {
    let mut pairs: Vec<_> =
        services.iter().map(|s| (s.metadata.name.clone().unwrap(), cluster_ips(s)[0].clone())).collect();
    pairs.sort();
    pairs
}

// ---- cluster IPs ----

#[test]
fn a_service_without_cluster_ip_gets_one_from_the_service_cidr() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[cluster_ip_service("default/web")]);
    let spec = services[0].spec.as_ref().unwrap();
    let ip = ip_of(&services[0]);
    assert!("10.96.0.0/12".parse::<IpNet>().unwrap().contains(&ip), "{ip} outside the CIDR");
    assert_eq!(spec.cluster_ip.as_deref(), Some(ip.to_string().as_str()));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_owned()]));
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(allocator.allocation(&key("default/web")).unwrap().cluster_ips, vec![ip]);
}

#[test]
fn a_service_without_namespace_is_in_the_default_namespace() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let mut unnamespaced = cluster_ip_service("default/web");
    unnamespaced.metadata.namespace = None;
    let services = allocate_ok(&mut allocator, &[unnamespaced]);
    assert_eq!(services[0].metadata.namespace.as_deref(), Some("default"));
    assert!(allocator.allocation(&key("default/web")).is_some());
}

#[test]
fn the_network_broadcast_and_first_addresses_are_never_allocated() {
    // A /29 has .0 (network), .1 (kept for `kubernetes`), .2-.6, .7 (broadcast).
    let mut allocator = allocator(&["10.0.0.0/29"]);
    let services: Vec<Service> = (0..6).map(|i| cluster_ip_service(&format!("default/s{i}"))).collect();
    let outcome = allocator.allocate(&services);
    let mut got: Vec<String> =
        outcome.services.iter().filter_map(|r| r.as_ref().ok()).map(|s| cluster_ips(s)[0].clone()).collect();
    got.sort();
    assert_eq!(got, ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
    assert_eq!(messages(&outcome), ["Service default/s5: spec.clusterIPs[0]: no free address left in 10.0.0.0/29"]);
}

#[test]
fn the_kubernetes_service_gets_the_first_address() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[cluster_ip_service("default/kubernetes")]);
    assert_eq!(cluster_ips(&services[0]), ["10.96.0.1"]);
}

#[test]
fn any_service_may_set_the_first_address_explicitly() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[with_cluster_ip("kube-system/apiserver", "10.96.0.1")]);
    assert_eq!(cluster_ips(&services[0]), ["10.96.0.1"]);
}

#[test]
fn an_explicit_cluster_ip_outside_the_service_cidrs_is_an_error() {
    let mut allocator = allocator(&["198.19.0.0/16"]);
    let outcome = allocator.allocate(&[with_cluster_ip("default/web", "10.0.0.5"), cluster_ip_service("default/ok")]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.clusterIP: 10.0.0.5 is outside the service CIDRs 198.19.0.0/16"]
    );
    assert_eq!(accepted(&outcome), ["ok"]);
    let error = outcome.services[0].as_ref().unwrap_err()[0].clone();
    assert_eq!(error.service(), &key("default/web"));
    assert_eq!(error.field(), "spec.clusterIP");
}

#[test]
fn an_explicit_network_or_broadcast_address_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/24"]);
    let outcome = allocator
        .allocate(&[with_cluster_ip("default/net", "10.96.0.0"), with_cluster_ip("default/bcast", "10.96.0.255")]);
    assert_eq!(
        messages(&outcome),
        [
            "Service default/net: spec.clusterIP: 10.96.0.0 is the network address of 10.96.0.0/24",
            "Service default/bcast: spec.clusterIP: 10.96.0.255 is the broadcast address of 10.96.0.0/24",
        ]
    );
}

#[test]
fn an_unparsable_cluster_ip_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[with_cluster_ip("default/web", "10.96.0.300")]);
    assert_eq!(messages(&outcome), ["Service default/web: spec.clusterIP: \"10.96.0.300\" is not an IP address"]);
}

#[test]
fn a_duplicate_cluster_ip_is_an_error_for_the_second_service_only() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[
        with_cluster_ip("default/a", "10.96.0.10"),
        with_cluster_ip("default/b", "10.96.0.10"),
        cluster_ip_service("default/c"),
    ]);
    assert_eq!(
        messages(&outcome),
        ["Service default/b: spec.clusterIP: 10.96.0.10 is already allocated to Service default/a"]
    );
    assert_eq!(accepted(&outcome), ["a", "c"]);
}

#[test]
fn a_holder_keeps_its_cluster_ip_against_a_newcomer_that_sets_it() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    allocate_ok(&mut allocator, &[with_cluster_ip("default/z", "10.96.0.10")]);
    // `a` sorts and comes first in the input, but `z` held the address already.
    let outcome =
        allocator.allocate(&[with_cluster_ip("default/a", "10.96.0.10"), with_cluster_ip("default/z", "10.96.0.10")]);
    assert_eq!(
        messages(&outcome),
        ["Service default/a: spec.clusterIP: 10.96.0.10 is already allocated to Service default/z"]
    );
}

#[test]
fn cluster_ip_and_cluster_ips_that_disagree_are_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[service("default/web", |spec| {
        spec.cluster_ip = Some("10.96.0.10".to_owned());
        spec.cluster_ips = Some(vec!["10.96.0.11".to_owned()]);
    })]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.clusterIPs[0]: 10.96.0.11 differs from spec.clusterIP 10.96.0.10"]
    );
}

#[test]
fn a_changed_explicit_cluster_ip_releases_the_old_one() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    allocate_ok(&mut allocator, &[with_cluster_ip("default/a", "10.96.0.10")]);
    let services = allocate_ok(
        &mut allocator,
        &[with_cluster_ip("default/a", "10.96.0.11"), with_cluster_ip("default/b", "10.96.0.10")],
    );
    assert_eq!(ips_by_name(&services), [("a".into(), "10.96.0.11".into()), ("b".into(), "10.96.0.10".into())]);
}

#[test]
fn a_headless_service_gets_no_cluster_ip() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[with_cluster_ip("default/db", "None")]);
    let spec = services[0].spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(cluster_ips(&services[0]), ["None"]);
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_owned()]));
    assert_eq!(allocator.allocation(&key("default/db")), None);
}

#[test]
fn a_headless_node_port_service_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let mut headless = node_port_service("default/db", vec![port("sql", 5432)]);
    headless.spec.as_mut().unwrap().cluster_ip = Some("None".to_owned());
    let outcome = allocator.allocate(&[headless]);
    assert_eq!(
        messages(&outcome),
        ["Service default/db: spec.clusterIP: None (headless) is only valid for type ClusterIP, not NodePort"]
    );
}

#[test]
fn an_external_name_service_is_returned_untouched() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let external = service("default/search", |spec| {
        spec.type_ = Some("ExternalName".to_owned());
        spec.external_name = Some("search.example.com".to_owned());
    });
    let services = allocate_ok(&mut allocator, std::slice::from_ref(&external));
    assert_eq!(services[0], external);
    assert_eq!(allocator.record().services.len(), 0);
}

#[test]
fn an_unknown_service_type_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[service("default/web", |spec| spec.type_ = Some("Nodeport".to_owned()))]);
    assert_eq!(
        messages(&outcome),
        [
            "Service default/web: spec.type: unsupported value \"Nodeport\", expected ClusterIP, NodePort, LoadBalancer or ExternalName"
        ]
    );
}

#[test]
fn a_second_service_with_the_same_name_is_an_error_for_the_second_copy() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[cluster_ip_service("default/web"), cluster_ip_service("default/web")]);
    assert!(outcome.services[0].is_ok());
    assert_eq!(
        messages(&outcome),
        ["Service default/web: metadata.name: another object of the input has the same namespace/name"]
    );
}

#[test]
fn a_service_without_a_name_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let mut nameless = cluster_ip_service("default/x");
    nameless.metadata.name = None;
    let outcome = allocator.allocate(&[nameless]);
    assert_eq!(messages(&outcome), ["Service default/: metadata.name: is required"]);
}

// ---- dual stack ----

#[test]
fn prefer_dual_stack_gives_one_cluster_ip_per_family_primary_first() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let services = allocate_ok(&mut allocator, &[dual_stack("default/web", "PreferDualStack")]);
    let ips: Vec<IpAddr> = cluster_ips(&services[0]).iter().map(|ip| ip.parse().unwrap()).collect();
    assert_eq!(ips.len(), 2);
    assert!(ips[0].is_ipv4() && ips[1].is_ipv6(), "{ips:?}");
    assert!("fd00:96::/108".parse::<IpNet>().unwrap().contains(&ips[1]));
    assert_eq!(services[0].spec.as_ref().unwrap().ip_families, Some(vec!["IPv4".to_owned(), "IPv6".to_owned()]));
    assert_eq!(services[0].spec.as_ref().unwrap().cluster_ip, Some(ips[0].to_string()));
}

#[test]
fn ip_families_listing_ipv6_first_makes_ipv6_the_primary() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let mut web = dual_stack("default/web", "RequireDualStack");
    web.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".to_owned()]);
    let services = allocate_ok(&mut allocator, &[web]);
    let ips = cluster_ips(&services[0]);
    assert!(ips[0].contains(':') && !ips[1].contains(':'), "{ips:?}");
    assert_eq!(services[0].spec.as_ref().unwrap().ip_families, Some(vec!["IPv6".to_owned(), "IPv4".to_owned()]));
}

#[test]
fn without_ip_families_the_first_service_cidr_is_the_primary_family() {
    let mut allocator = allocator(&["fd00:96::/108", "10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[cluster_ip_service("default/web")]);
    assert!(cluster_ips(&services[0])[0].starts_with("fd00:96::"), "{:?}", cluster_ips(&services[0]));
}

#[test]
fn prefer_dual_stack_on_a_single_stack_cluster_gives_one_cluster_ip() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[dual_stack("default/web", "PreferDualStack")]);
    assert_eq!(cluster_ips(&services[0]).len(), 1);
    assert_eq!(services[0].spec.as_ref().unwrap().ip_families, Some(vec!["IPv4".to_owned()]));
}

#[test]
fn require_dual_stack_on_a_single_stack_cluster_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[dual_stack("default/web", "RequireDualStack")]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.ipFamilyPolicy: IPv6 is not configured, the service CIDRs are 10.96.0.0/12"]
    );
}

#[test]
fn an_explicit_primary_with_require_dual_stack_gets_its_secondary_allocated() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let mut web = dual_stack("default/web", "RequireDualStack");
    web.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.10".to_owned());
    let services = allocate_ok(&mut allocator, &[web]);
    let ips = cluster_ips(&services[0]);
    assert_eq!(ips[0], "10.96.0.10");
    assert!(ips[1].starts_with("fd00:96::"), "{ips:?}");
}

#[test]
fn an_ipv6_family_on_an_ipv4_cluster_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome =
        allocator.allocate(&[service("default/web", |spec| spec.ip_families = Some(vec!["IPv6".to_owned()]))]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.ipFamilies[0]: IPv6 is not configured, the service CIDRs are 10.96.0.0/12"]
    );
}

#[test]
fn two_cluster_ips_with_single_stack_are_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let outcome = allocator.allocate(&[service("default/web", |spec| {
        spec.cluster_ips = Some(vec!["10.96.0.10".to_owned(), "fd00:96::10".to_owned()]);
    })]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.ipFamilyPolicy: SingleStack allows one IP family, two are given"]
    );
}

#[test]
fn two_cluster_ips_with_one_ip_family_listed_and_single_stack_are_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let outcome = allocator.allocate(&[service("default/web", |spec| {
        spec.ip_families = Some(vec!["IPv4".to_owned()]);
        spec.cluster_ips = Some(vec!["10.96.0.10".to_owned(), "fd00:96::10".to_owned()]);
    })]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.ipFamilyPolicy: SingleStack allows one IP family, two are given"]
    );
}

#[test]
fn two_cluster_ips_of_one_family_are_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let outcome = allocator.allocate(&[service("default/web", |spec| {
        spec.ip_family_policy = Some("RequireDualStack".to_owned());
        spec.cluster_ips = Some(vec!["10.96.0.10".to_owned(), "10.96.0.11".to_owned()]);
    })]);
    assert_eq!(messages(&outcome), ["Service default/web: spec.clusterIPs[1]: IPv4 is given twice"]);
}

// ---- node ports ----

#[test]
fn a_node_port_service_gets_a_node_port_for_every_port() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services =
        allocate_ok(&mut allocator, &[node_port_service("default/web", vec![port("http", 80), port("https", 443)])]);
    let ports = node_ports(&services[0]);
    let (a, b) = (ports[0].unwrap(), ports[1].unwrap());
    assert!(NodePortRange::DEFAULT.contains(a) && NodePortRange::DEFAULT.contains(b), "{ports:?}");
    assert_ne!(a, b);
    let held = allocator.allocation(&key("default/web")).unwrap();
    assert_eq!(held.node_ports.get("http").copied().map(i32::from), Some(a));
    assert_eq!(held.node_ports.get("https").copied().map(i32::from), Some(b));
}

#[test]
fn a_cluster_ip_service_gets_no_node_ports() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services =
        allocate_ok(&mut allocator, &[service("default/web", |spec| spec.ports = Some(vec![port("http", 80)]))]);
    assert_eq!(node_ports(&services[0]), [None]);
}

#[test]
fn a_load_balancer_without_node_port_allocation_keeps_only_explicit_node_ports() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(
        &mut allocator,
        &[service("default/lb", |spec| {
            spec.type_ = Some("LoadBalancer".to_owned());
            spec.allocate_load_balancer_node_ports = Some(false);
            spec.ports = Some(vec![port("http", 80), with_node_port(port("https", 443), 30443)]);
        })],
    );
    assert_eq!(node_ports(&services[0]), [None, Some(30443)]);
}

#[test]
fn a_load_balancer_gets_node_ports_by_default() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(
        &mut allocator,
        &[service("default/lb", |spec| {
            spec.type_ = Some("LoadBalancer".to_owned());
            spec.ports = Some(vec![port("http", 80)]);
        })],
    );
    assert!(node_ports(&services[0])[0].is_some());
    assert_eq!(services[0].spec.as_ref().unwrap().health_check_node_port, None);
}

#[test]
fn a_local_load_balancer_gets_a_health_check_node_port() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(&mut allocator, &[local_load_balancer("default/lb")]);
    let spec = services[0].spec.as_ref().unwrap();
    let health = spec.health_check_node_port.expect("a health check node port");
    assert!(NodePortRange::DEFAULT.contains(health));
    assert_ne!(Some(health), spec.ports.as_ref().unwrap()[0].node_port);
    assert_eq!(allocator.allocation(&key("default/lb")).unwrap().health_check_node_port.map(i32::from), Some(health));
}

#[test]
fn a_node_port_outside_the_range_is_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[node_port_service(
        "default/web",
        vec![port("http", 80), with_node_port(port("https", 443), 32768)],
    )]);
    assert_eq!(
        messages(&outcome),
        ["Service default/web: spec.ports[1].nodePort: 32768 is outside the node port range 30000-32767"]
    );
}

#[test]
fn a_duplicate_node_port_is_an_error_for_the_second_service_only() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[
        node_port_service("default/a", vec![with_node_port(port("http", 80), 30080)]),
        node_port_service("default/b", vec![with_node_port(port("http", 80), 30080)]),
        node_port_service("default/c", vec![port("http", 80)]),
    ]);
    assert_eq!(
        messages(&outcome),
        ["Service default/b: spec.ports[0].nodePort: 30080/TCP is already allocated to Service default/a"]
    );
    assert_eq!(accepted(&outcome), ["a", "c"]);
    assert_ne!(node_ports(outcome.services[2].as_ref().unwrap()), [Some(30080)]);
}

#[test]
fn one_node_port_number_may_be_set_for_tcp_and_udp_of_different_services() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[
        node_port_service("default/a", vec![with_node_port(port("dns", 53), 30053)]),
        node_port_service("default/b", vec![udp(with_node_port(port("dns", 53), 30053))]),
    ]);
    assert_eq!(messages(&outcome), Vec::<String>::new());
}

#[test]
fn tcp_and_udp_ports_with_the_same_number_share_one_node_port() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = allocate_ok(
        &mut allocator,
        &[node_port_service("kube-system/dns", vec![udp(port("dns", 53)), port("dns-tcp", 53)])],
    );
    let ports = node_ports(&services[0]);
    assert!(ports[0].is_some());
    assert_eq!(ports[0], ports[1]);
}

#[test]
fn dynamic_node_ports_avoid_numbers_another_service_uses_under_another_protocol() {
    let mut allocator = allocator_with_ports(&["10.96.0.0/12"], NodePortRange::new(30000, 30001).unwrap());
    let services = allocate_ok(
        &mut allocator,
        &[
            node_port_service("default/a", vec![udp(with_node_port(port("dns", 53), 30000))]),
            node_port_service("default/b", vec![port("http", 80)]),
        ],
    );
    assert_eq!(node_ports(&services[1]), [Some(30001)]);
}

#[test]
fn an_exhausted_node_port_range_is_an_error_for_the_service_that_does_not_fit() {
    let mut allocator = allocator_with_ports(&["10.96.0.0/12"], NodePortRange::new(30000, 30001).unwrap());
    let outcome = allocator.allocate(&[node_port_service("default/a", vec![port("a", 1), port("b", 2), port("c", 3)])]);
    assert_eq!(
        messages(&outcome),
        ["Service default/a: spec.ports[2].nodePort: no free node port left in 30000-30001"]
    );
}

#[test]
fn duplicate_port_names_are_an_error() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let outcome = allocator.allocate(&[node_port_service("default/a", vec![port("http", 80), port("http", 81)])]);
    assert_eq!(
        messages(&outcome),
        ["Service default/a: spec.ports[1].name: port name \"http\" is used by another port too"]
    );
}

// ---- stability ----

#[test]
fn allocations_do_not_move_when_another_service_is_removed() {
    // Small pool and range: collisions and probing are certain.
    let mut allocator = allocator_with_ports(&["10.0.0.0/28"], NodePortRange::new(30000, 30012).unwrap());
    let all: Vec<Service> =
        (0..12).map(|i| node_port_service(&format!("default/s{i:02}"), vec![port("p", 80)])).collect();
    let before = allocate_ok(&mut allocator, &all);
    let kept: Vec<Service> = all.iter().step_by(2).cloned().collect();
    let after = allocate_ok(&mut allocator, &kept);
    let expected: Vec<&Service> = before.iter().step_by(2).collect();
    for (was, is) in expected.iter().zip(&after) {
        assert_eq!(cluster_ips(was), cluster_ips(is), "{:?}", is.metadata.name);
        assert_eq!(node_ports(was), node_ports(is), "{:?}", is.metadata.name);
    }
}

#[test]
fn allocations_do_not_move_when_services_that_sort_first_are_added() {
    let mut allocator = allocator_with_ports(&["10.0.0.0/28"], NodePortRange::new(30000, 30012).unwrap());
    let late: Vec<Service> = (0..6).map(|i| node_port_service(&format!("default/z{i}"), vec![port("p", 80)])).collect();
    let before = allocate_ok(&mut allocator, &late);
    let mut all: Vec<Service> =
        (0..6).map(|i| node_port_service(&format!("default/a{i}"), vec![port("p", 80)])).collect();
    all.extend(late);
    let after = allocate_ok(&mut allocator, &all);
    for (was, is) in before.iter().zip(&after[6..]) {
        assert_eq!(cluster_ips(was), cluster_ips(is));
        assert_eq!(node_ports(was), node_ports(is));
    }
}

#[test]
fn allocations_do_not_depend_on_the_input_order() {
    let services: Vec<Service> = (0..12).map(|i| cluster_ip_service(&format!("default/s{i}"))).collect();
    let forward = allocate_ok(&mut allocator(&["10.0.0.0/28"]), &services);
    let reversed_input: Vec<Service> = services.iter().rev().cloned().collect();
    let reversed = allocate_ok(&mut allocator(&["10.0.0.0/28"]), &reversed_input);
    assert_eq!(ips_by_name(&forward), ips_by_name(&reversed));
}

#[test]
fn the_preferred_address_comes_from_the_hash_of_the_service_key() {
    let mut allocator = allocator(&["10.0.0.0/29"]);
    let services = allocate_ok(&mut allocator, &[cluster_ip_service("default/web")]);
    // /29: dynamic offsets 2..7, no static band under 64 addresses.
    let offset = 2 + stable_hash("default/web") % 5;
    assert_eq!(cluster_ips(&services[0]), [format!("10.0.0.{offset}")]);
}

#[test]
fn a_restored_record_gives_the_same_allocations_after_restart() {
    // Two Services whose preferred slots collide in a /29; `y` sorts first.
    let x = "default/zz";
    let y = (0..).map(|i| format!("default/a{i}")).find(|y| stable_hash(y) % 5 == stable_hash(x) % 5).unwrap();
    let services = [cluster_ip_service(&y), cluster_ip_service(x)];

    // First run: `x` alone takes the slot, then `y` arrives and probes past it.
    let mut first_run = allocator(&["10.0.0.0/29"]);
    allocate_ok(&mut first_run, &services[1..]);
    let before = allocate_ok(&mut first_run, &services);
    let saved = first_run.record().to_json();

    // A restart without the record would hand the slot to `y`, which sorts first ...
    let forgetful = allocate_ok(&mut allocator(&["10.0.0.0/29"]), &services);
    assert_ne!(ips_by_name(&forgetful), ips_by_name(&before));

    // ... with it, nothing moves.
    let mut second_run = allocator(&["10.0.0.0/29"]);
    second_run.restore(&AllocationRecord::from_json(&saved).unwrap());
    let after = second_run.allocate(&services);
    assert!(!after.changed, "restoring and re-allocating the same Services changes nothing");
    let after: Vec<Service> = after.services.into_iter().map(Result::unwrap).collect();
    assert_eq!(ips_by_name(&after), ips_by_name(&before));
}

#[test]
fn an_allocation_is_released_when_its_service_is_removed() {
    // A /30 has exactly one allocatable address, .2.
    let mut allocator = allocator(&["10.0.0.0/30"]);
    let first = allocator.allocate(&[cluster_ip_service("default/a")]);
    assert!(first.changed);
    let second = allocator.allocate(&[cluster_ip_service("default/b")]);
    assert!(second.changed);
    assert_eq!(cluster_ips(second.services[0].as_ref().unwrap()), ["10.0.0.2"]);
    assert_eq!(allocator.allocation(&key("default/a")), None);
}

#[test]
fn allocating_the_same_services_again_changes_nothing() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services = [node_port_service("default/a", vec![port("http", 80)]), local_load_balancer("default/lb")];
    assert!(allocator.allocate(&services).changed);
    let again = allocator.allocate(&services);
    assert!(!again.changed);
}

#[test]
fn a_service_with_an_error_keeps_its_allocations_for_when_it_is_fixed() {
    let mut allocator = allocator(&["10.0.0.0/30"]);
    allocate_ok(&mut allocator, &[cluster_ip_service("default/a")]);
    let broken = dual_stack("default/a", "PerferDualStack");

    let outcome = allocator.allocate(&[broken, cluster_ip_service("default/b")]);
    assert_eq!(
        messages(&outcome),
        [
            "Service default/a: spec.ipFamilyPolicy: unsupported value \"PerferDualStack\", expected SingleStack, PreferDualStack or RequireDualStack",
            "Service default/b: spec.clusterIPs[0]: no free address left in 10.0.0.0/30",
        ]
    );
    assert_eq!(allocator.record().services["default/a"].cluster_ips, ["10.0.0.2".parse::<IpAddr>().unwrap()]);

    let fixed = allocate_ok(&mut allocator, &[cluster_ip_service("default/a")]);
    assert_eq!(cluster_ips(&fixed[0]), ["10.0.0.2"]);
}

#[test]
fn an_explicit_value_may_take_what_an_invalid_service_kept_in_reserve() {
    let mut allocator = allocator(&["10.0.0.0/30"]);
    allocate_ok(&mut allocator, &[cluster_ip_service("default/a")]);
    let outcome = allocator.allocate(&[dual_stack("default/a", "Bogus"), with_cluster_ip("default/b", "10.0.0.2")]);
    assert_eq!(accepted(&outcome), ["b"]);
    assert_eq!(allocator.allocation(&key("default/a")), None);
}

#[test]
fn dynamic_allocations_stay_out_of_the_band_kept_for_explicit_values() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let services: Vec<Service> =
        (0..300).map(|i| node_port_service(&format!("default/s{i}"), vec![port("p", 80)])).collect();
    for service in allocate_ok(&mut allocator, &services) {
        let ip = match ip_of(&service) {
            IpAddr::V4(ip) => u32::from(ip),
            IpAddr::V6(_) => unreachable!(),
        };
        // 1/16 of the /12, capped at 256 addresses after the two reserved ones.
        assert!(ip - u32::from(Ipv4Addr::new(10, 96, 0, 0)) >= 2 + 256, "{ip}");
        // 2768 ports / 16 = 173.
        assert!(node_ports(&service)[0].unwrap() >= 30000 + 173);
    }
}

#[test]
fn the_band_kept_for_explicit_values_is_used_once_the_rest_is_full() {
    // /25: offsets 2..127 (125 addresses), the first 16 kept for explicit values.
    let mut allocator = allocator(&["10.0.0.0/25"]);
    let services: Vec<Service> = (0..125).map(|i| cluster_ip_service(&format!("default/s{i}"))).collect();
    let allocated = allocate_ok(&mut allocator, &services);
    let low = allocated.iter().filter(|s| matches!(ip_of(s), IpAddr::V4(ip) if ip.octets()[3] < 18)).count();
    assert_eq!(low, 16);
    let outcome = allocator.allocate(&[services.clone(), vec![cluster_ip_service("default/one-more")]].concat());
    assert_eq!(
        messages(&outcome),
        ["Service default/one-more: spec.clusterIPs[0]: no free address left in 10.0.0.0/25"]
    );
}

#[test]
fn held_values_outside_a_changed_configuration_are_reallocated() {
    let mut old = allocator(&["10.0.0.0/24"]);
    allocate_ok(&mut old, &[cluster_ip_service("default/a")]);
    let mut new = allocator(&["10.1.0.0/24"]);
    new.restore(&old.record());
    let services = allocate_ok(&mut new, &[cluster_ip_service("default/a")]);
    assert!(cluster_ips(&services[0])[0].starts_with("10.1.0."));
}

// ---- record and configuration ----

#[test]
fn a_record_round_trips_through_json() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    allocate_ok(&mut allocator, &[dual_stack("default/web", "RequireDualStack"), local_load_balancer("default/lb")]);
    let record = allocator.record();
    let json = record.to_json();
    assert!(
        json.contains("\"clusterIPs\"") && json.contains("\"nodePorts\"") && json.contains("\"healthCheckNodePort\""),
        "{json}"
    );
    assert_eq!(AllocationRecord::from_json(&json).unwrap(), record);
}

#[test]
fn a_record_of_another_version_is_refused() {
    let error = AllocationRecord::from_json(r#"{"version": 2, "services": {}}"#).unwrap_err();
    assert_eq!(error.to_string(), "allocation record has version 2, this build reads version 1");
    assert!(AllocationRecord::from_json("{").is_err());
}

#[test]
fn record_entries_with_bad_keys_are_skipped_on_restore() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let record = AllocationRecord::from_json(
        r#"{"version": 1, "services": {"nonsense": {"clusterIPs": ["10.96.0.50"]}, "default/a": {"clusterIPs": ["10.96.0.60"]}}}"#,
    )
    .unwrap();
    allocator.restore(&record);
    assert_eq!(allocator.record().services.keys().collect::<Vec<_>>(), ["default/a"]);
    let services = allocate_ok(&mut allocator, &[cluster_ip_service("default/a")]);
    assert_eq!(cluster_ips(&services[0]), ["10.96.0.60"]);
}

#[test]
fn the_default_configuration_is_the_kubernetes_default() {
    let config = AllocatorConfig::default();
    assert_eq!(config.service_cidrs, ["10.96.0.0/12".parse::<IpNet>().unwrap()]);
    assert_eq!(config.node_port_range.to_string(), "30000-32767");
}

#[test]
fn bad_configurations_are_refused() {
    let config = |cidrs: &[&str]| AllocatorConfig {
        service_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        node_port_range: NodePortRange::DEFAULT,
    };
    let error = |cidrs: &[&str]| Allocator::new(config(cidrs)).unwrap_err().to_string();
    assert_eq!(error(&[]), "no service CIDR configured");
    assert_eq!(
        error(&["10.96.0.0/12", "10.128.0.0/12"]),
        "service CIDRs 10.96.0.0/12 and 10.128.0.0/12 are of the same IP family"
    );
    assert_eq!(error(&["10.96.0.1/12"]), "service CIDR 10.96.0.1/12 has host bits set, the network is 10.96.0.0/12");
    assert_eq!(error(&["10.0.0.0/31"]), "service CIDR 10.0.0.0/31 is too small to allocate from");
    assert!(Allocator::new(config(&["fd00::/64", "10.0.0.0/30"])).is_ok());
}

#[test]
fn node_port_ranges_parse_from_first_dash_last() {
    assert_eq!("30000-32767".parse::<NodePortRange>().unwrap(), NodePortRange::DEFAULT);
    assert_eq!(NodePortRange::DEFAULT.size(), 2768);
    assert_eq!(
        "32767-30000".parse::<NodePortRange>().unwrap_err().to_string(),
        "node port range \"32767-30000\" is invalid: the first port is after the last"
    );
    assert!("30000".parse::<NodePortRange>().is_err());
    assert!("0-10".parse::<NodePortRange>().is_err());
    assert!("1-70000".parse::<NodePortRange>().is_err());
}

#[test]
fn a_whole_ipv6_range_is_usable() {
    let mut allocator = allocator(&["::/0"]);
    let services = allocate_ok(&mut allocator, &[cluster_ip_service("default/a")]);
    assert!(ip_of(&services[0]).is_ipv6());
}

#[test]
fn allocating_only_the_changed_services_keeps_everyone_elses_and_never_hands_out_a_held_address() {
    // A /29 has six usable addresses: small enough that a new Service would be hashed onto
    // a held one if the held ones were not claimed first.
    let mut full = allocator(&["10.0.0.0/29"]);
    let mut incremental = allocator(&["10.0.0.0/29"]);
    let first: Vec<Service> = ["a/one", "a/two", "a/three"].into_iter().map(cluster_ip_service).collect();
    let settled = allocate_ok(&mut full, &first);
    incremental.allocate(&first);
    assert_eq!(incremental.record(), full.record());

    // A new Service and an explicit one taking a held address; one removed.
    let added = cluster_ip_service("b/four");
    let held_by_two = ip_of(&settled[1]).to_string();
    let taker = with_cluster_ip("b/five", &held_by_two);
    let outcome = incremental.allocate_changed(&[added, taker], &[key("a/three")]);
    assert!(outcome.changed);
    assert_eq!(accepted(&outcome), ["four"]);
    assert_eq!(messages(&outcome).len(), 1, "{:?}", messages(&outcome));
    assert!(messages(&outcome)[0].contains("a/two"), "{:?}", messages(&outcome));
    let record = incremental.record();
    assert_eq!(record.services.len(), 3, "{record:?}");
    for (name, service) in ["a/one", "a/two"].iter().zip(&settled) {
        assert_eq!(record.services[*name].cluster_ips, vec![ip_of(service)], "{name} kept its address");
    }
    let four = record.services["b/four"].cluster_ips[0];
    assert!(!settled[..2].iter().any(|s| ip_of(s) == four), "{four} is held by another Service");

    // The same state through a full pass gives the same record.
    let everyone = vec![cluster_ip_service("a/one"), cluster_ip_service("a/two"), cluster_ip_service("b/four")];
    let mut replay = allocator(&["10.0.0.0/29"]);
    replay.restore(&record);
    let outcome = replay.allocate(&everyone);
    assert!(!outcome.changed, "a full pass agrees with the incremental one");
}
