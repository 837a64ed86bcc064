use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service, ServiceSpec, ServiceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;

fn pool(name: &str, spec: serde_json::Value) -> Pool {
    Pool::parse(name, &spec).unwrap_or_else(|e| panic!("{e}"))
}

fn lb(namespace: &str, name: &str, tweak: impl FnOnce(&mut Service)) -> Service {
    let mut service = Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..ObjectMeta::default() },
        spec: Some(ServiceSpec { type_: Some("LoadBalancer".into()), ..ServiceSpec::default() }),
        ..Service::default()
    };
    tweak(&mut service);
    service
}

fn spec(service: &mut Service) -> &mut ServiceSpec {
    service.spec.as_mut().unwrap()
}

fn with_status(mut service: Service, ips: &[&str]) -> Service {
    service.status = Some(ServiceStatus {
        load_balancer: Some(LoadBalancerStatus {
            ingress: Some(
                ips.iter().map(|ip| LoadBalancerIngress { ip: Some((*ip).into()), ..Default::default() }).collect(),
            ),
        }),
        ..ServiceStatus::default()
    });
    service
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn ips_of(outcome: &LbOutcome, namespace: &str, name: &str) -> Vec<IpAddr> {
    outcome.services[&ObjectKey::new(namespace, name)].ips()
}

fn reasons_of(outcome: &LbOutcome, namespace: &str, name: &str) -> Vec<LbReason> {
    outcome.services[&ObjectKey::new(namespace, name)].problems.iter().map(|p| p.reason).collect()
}

#[test]
fn a_pool_parses_cidrs_and_ranges_of_both_families() {
    let p = pool(
        "p",
        json!({"blocks": [{"cidr": "198.18.100.0/30"}, {"start": "2001:db8:100::10", "stop": "2001:db8:100::13"}]}),
    );
    assert_eq!(p.size_of(IpFamily::V4), 4);
    assert_eq!(p.size_of(IpFamily::V6), 4);
    assert!(p.contains(ip("198.18.100.3")) && !p.contains(ip("198.18.100.4")));
    assert!(p.contains(ip("2001:db8:100::13")) && !p.contains(ip("2001:db8:100::14")));
}

#[test]
fn a_broken_pool_is_refused_naming_the_pool_and_the_field() {
    let cases = [
        (json!({"blocks": []}), "spec.blocks"),
        (json!({"blocks": [{"cidr": "198.18.100.1/24"}]}), "spec.blocks[0].cidr"),
        (json!({"blocks": [{"cidr": "nope"}]}), "spec.blocks[0].cidr"),
        (json!({"blocks": [{"start": "198.18.100.9", "stop": "198.18.100.1"}]}), "spec.blocks[0]"),
        (json!({"blocks": [{"start": "198.18.100.1", "stop": "2001:db8::1"}]}), "spec.blocks[0]"),
        (json!({"blocks": [{"cidr": "198.18.100.0/24", "start": "198.18.100.1"}]}), "spec.blocks[0]"),
        (json!({"blocks": [{"cidr": "198.18.100.0/24"}, {"cidr": "198.18.100.128/25"}]}), "spec.blocks[1]"),
        (
            json!({"blocks": [{"cidr": "198.18.100.0/24"}], "serviceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}),
            "spec.serviceSelector",
        ),
        (json!({"blocks": [{"cidr": "198.18.100.0/24"}], "colour": "blue"}), "spec"),
    ];
    for (spec, field) in cases {
        let error = Pool::parse("broken", &spec).expect_err(&spec.to_string());
        assert_eq!(error.field, field, "{spec}: {error}");
        assert!(error.to_string().starts_with("LoadBalancerIPPool broken: "), "{error}");
    }
}

#[test]
fn each_family_of_a_service_gets_one_address_from_a_pool_and_the_status_order_follows_ip_families() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}, {"cidr": "2001:db8:100::/124"}]}))];
    let service = lb("default", "web", |s| spec(s).ip_families = Some(vec!["IPv6".into(), "IPv4".into()]));
    let outcome = LbAllocator::new().allocate(&pools, &[service]);
    let ips = ips_of(&outcome, "default", "web");
    assert_eq!(ips.len(), 2, "{outcome:?}");
    assert!(ips[0].is_ipv6() && ips[1].is_ipv4());
    assert!(ips.iter().all(|ip| pools[0].contains(*ip)));
    assert_eq!(outcome.pools["p"].used, 2);
}

#[test]
fn services_of_another_class_or_type_are_left_alone() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]}))];
    let other = lb("default", "other", |s| spec(s).load_balancer_class = Some("example.com/cloud".into()));
    let mine = lb("default", "mine", |s| spec(s).load_balancer_class = Some(LOAD_BALANCER_CLASS.into()));
    let cluster_ip = lb("default", "plain", |s| spec(s).type_ = Some("ClusterIP".into()));
    let outcome = LbAllocator::new().allocate(&pools, &[other, mine, cluster_ip]);
    assert_eq!(outcome.services.keys().map(ToString::to_string).collect::<Vec<_>>(), ["default/mine"]);
}

#[test]
fn the_outcome_does_not_depend_on_input_order_and_a_new_allocator_gives_the_same_addresses() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/29"}]}))];
    let services: Vec<Service> = (0..6).map(|i| lb("default", &format!("s{i}"), |_| {})).collect();
    let forward = LbAllocator::new().allocate(&pools, &services);
    let mut reversed = services.clone();
    reversed.reverse();
    let backward = LbAllocator::new().allocate(&pools, &reversed);
    assert_eq!(forward, backward);
    let all: std::collections::BTreeSet<IpAddr> = forward.services.values().flat_map(LbAssignment::ips).collect();
    assert_eq!(all.len(), 6, "never given twice: {forward:?}");
}

#[test]
fn an_address_stays_with_its_service_when_others_come_and_go() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/29"}]}))];
    let mut allocator = LbAllocator::new();
    let first = allocator.allocate(&pools, &[lb("default", "b", |_| {})]);
    let b = ips_of(&first, "default", "b");
    let services: Vec<Service> = ["a", "b", "c", "d"].iter().map(|n| lb("default", n, |_| {})).collect();
    let second = allocator.allocate(&pools, &services);
    assert_eq!(ips_of(&second, "default", "b"), b);
}

#[test]
fn after_a_restart_the_status_written_before_is_kept_even_where_the_hash_would_choose_otherwise() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/29"}]}))];
    let fresh = LbAllocator::new().allocate(&pools, &[lb("default", "web", |_| {})]);
    let hashed = ips_of(&fresh, "default", "web")[0];
    let other = pools[0].ranges[0].nth((as_u128(hashed) - as_u128(pools[0].ranges[0].first) + 3) % 8);
    let restored = with_status(lb("default", "web", |_| {}), &[&other.to_string()]);
    let outcome = LbAllocator::new().allocate(&pools, &[restored]);
    assert_eq!(ips_of(&outcome, "default", "web"), [other]);
}

#[test]
fn two_services_claiming_one_address_in_status_keep_it_for_the_first_and_move_the_other() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/29"}]}))];
    let a = with_status(lb("default", "a", |_| {}), &["198.18.100.5"]);
    let b = with_status(lb("default", "b", |_| {}), &["198.18.100.5"]);
    let outcome = LbAllocator::new().allocate(&pools, &[b, a]);
    assert_eq!(ips_of(&outcome, "default", "a"), [ip("198.18.100.5")]);
    let moved = ips_of(&outcome, "default", "b");
    assert_eq!(moved.len(), 1);
    assert_ne!(moved[0], ip("198.18.100.5"));
}

#[test]
fn a_full_pool_is_a_pool_exhausted_problem_naming_the_pool() {
    let pools = [pool("tiny", json!({"blocks": [{"start": "198.18.100.1", "stop": "198.18.100.2"}]}))];
    let services: Vec<Service> = ["a", "b", "c"].iter().map(|n| lb("default", n, |_| {})).collect();
    let outcome = LbAllocator::new().allocate(&pools, &services);
    assert_eq!(reasons_of(&outcome, "default", "c"), [LbReason::PoolExhausted]);
    assert!(ips_of(&outcome, "default", "c").is_empty());
    let message = &outcome.services[&ObjectKey::new("default", "c")].problems[0].message;
    assert!(message.contains("pool tiny"), "{message}");
    assert_eq!(outcome.pools["tiny"].used, 2);
}

#[test]
fn deleting_a_service_frees_its_address_for_a_waiting_one() {
    let pools = [pool("tiny", json!({"blocks": [{"cidr": "198.18.100.7/32"}]}))];
    let mut allocator = LbAllocator::new();
    let both = allocator.allocate(&pools, &[lb("default", "a", |_| {}), lb("default", "b", |_| {})]);
    assert_eq!(reasons_of(&both, "default", "b"), [LbReason::PoolExhausted]);
    let changed_type = lb("default", "a", |s| spec(s).type_ = Some("NodePort".into()));
    let after = allocator.allocate(&pools, &[changed_type, lb("default", "b", |_| {})]);
    assert_eq!(ips_of(&after, "default", "b"), [ip("198.18.100.7")]);
    assert!(!after.services.contains_key(&ObjectKey::new("default", "a")));
}

#[test]
fn a_later_pool_overlapping_an_earlier_one_is_not_used_and_says_with_which() {
    // b-second overlaps a-first; only b-second selects the Service (label pool=b).
    let pools = [
        pool(
            "b-second",
            json!({"blocks": [{"cidr": "198.18.100.8/29"}], "serviceSelector": {"matchLabels": {"pool": "b"}}}),
        ),
        pool("a-first", json!({"blocks": [{"cidr": "198.18.100.0/28"}], "namespaces": ["elsewhere"]})),
    ];
    let web = lb("default", "web", |s| s.metadata.labels = Some(BTreeMap::from([("pool".into(), "b".into())])));
    let outcome = LbAllocator::new().allocate(&pools, &[web]);
    let conflict = outcome.pools["b-second"].conflict.clone().expect("a conflict");
    assert!(conflict.contains("pool a-first") && conflict.contains("198.18.100.8-198.18.100.15"), "{conflict}");
    assert!(outcome.pools["a-first"].conflict.is_none());
    assert_eq!(reasons_of(&outcome, "default", "web"), [LbReason::NoPoolSelects]);
}

#[test]
fn selectors_and_namespaces_choose_the_pool() {
    let pools = [
        pool(
            "blue",
            json!({"blocks": [{"cidr": "198.18.100.0/29"}], "serviceSelector": {"matchLabels": {"team": "blue"}}}),
        ),
        pool(
            "prod",
            json!({"blocks": [{"cidr": "198.18.100.8/29"}], "namespaces": ["prod"],
            "serviceSelector": {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["blue"]}]}}),
        ),
    ];
    let blue = lb("dev", "blue", |s| s.metadata.labels = Some(BTreeMap::from([("team".into(), "blue".into())])));
    let prod = lb("prod", "api", |_| {});
    let dev = lb("dev", "api", |_| {});
    let outcome = LbAllocator::new().allocate(&pools, &[blue, prod, dev]);
    assert!(pools[0].contains(ips_of(&outcome, "dev", "blue")[0]));
    assert!(pools[1].contains(ips_of(&outcome, "prod", "api")[0]));
    assert_eq!(reasons_of(&outcome, "dev", "api"), [LbReason::NoPoolSelects]);
}

#[test]
fn a_requested_address_is_given_by_field_or_by_either_annotation() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}, {"cidr": "2001:db8:100::/124"}]}))];
    let by_field = lb("default", "f", |s| spec(s).load_balancer_ip = Some("198.18.100.9".into()));
    let by_metallb = lb("default", "m", |s| {
        s.metadata.annotations = Some(BTreeMap::from([(
            "metallb.universe.tf/loadBalancerIPs".into(),
            "198.18.100.10, 2001:db8:100::a".into(),
        )]));
        spec(s).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    });
    let by_cilium = lb("default", "c", |s| {
        s.metadata.annotations = Some(BTreeMap::from([("lbipam.cilium.io/ips".into(), "198.18.100.11".into())]));
    });
    let outcome = LbAllocator::new().allocate(&pools, &[by_field, by_metallb, by_cilium]);
    assert_eq!(ips_of(&outcome, "default", "f"), [ip("198.18.100.9")]);
    assert_eq!(ips_of(&outcome, "default", "m"), [ip("198.18.100.10"), ip("2001:db8:100::a")]);
    assert_eq!(ips_of(&outcome, "default", "c"), [ip("198.18.100.11")]);
}

#[test]
fn a_requested_address_outside_every_pool_is_refused_saying_so() {
    let pools = [
        pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]})),
        pool("q", json!({"blocks": [{"cidr": "198.18.100.16/28"}], "namespaces": ["other"]})),
    ];
    let nowhere = lb("default", "nowhere", |s| spec(s).load_balancer_ip = Some("198.18.101.1".into()));
    let not_mine = lb("default", "notmine", |s| spec(s).load_balancer_ip = Some("198.18.100.17".into()));
    let outcome = LbAllocator::new().allocate(&pools, &[nowhere, not_mine]);
    assert_eq!(reasons_of(&outcome, "default", "nowhere"), [LbReason::RequestOutsidePools]);
    assert!(ips_of(&outcome, "default", "nowhere").is_empty());
    let message = &outcome.services[&ObjectKey::new("default", "notmine")].problems[0].message;
    assert!(message.contains("pool q") && message.contains("does not select"), "{message}");
}

#[test]
fn a_conflicting_request_is_refused_naming_the_holder_who_keeps_it() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]}))];
    let mut allocator = LbAllocator::new();
    let first = allocator
        .allocate(&pools, &[lb("default", "zz-holder", |s| spec(s).load_balancer_ip = Some("198.18.100.3".into()))]);
    assert_eq!(ips_of(&first, "default", "zz-holder"), [ip("198.18.100.3")]);
    // The latecomer sorts first by name: holding beats the name order.
    let latecomer = lb("default", "aa-late", |s| spec(s).load_balancer_ip = Some("198.18.100.3".into()));
    let holder = lb("default", "zz-holder", |s| spec(s).load_balancer_ip = Some("198.18.100.3".into()));
    let second = allocator.allocate(&pools, &[latecomer, holder]);
    assert_eq!(ips_of(&second, "default", "zz-holder"), [ip("198.18.100.3")]);
    assert_eq!(reasons_of(&second, "default", "aa-late"), [LbReason::RequestConflict]);
    let message = &second.services[&ObjectKey::new("default", "aa-late")].problems[0].message;
    assert!(message.contains("default/zz-holder"), "{message}");
}

#[test]
fn a_malformed_request_is_an_invalid_request_naming_the_field() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]}))];
    let bad = lb("default", "bad", |s| spec(s).load_balancer_ip = Some("198.18.100.300".into()));
    let two = lb("default", "two", |s| {
        s.metadata.annotations =
            Some(BTreeMap::from([("lbipam.cilium.io/ips".into(), "198.18.100.1,198.18.100.2".into())]));
    });
    let outcome = LbAllocator::new().allocate(&pools, &[bad, two]);
    for name in ["bad", "two"] {
        assert_eq!(reasons_of(&outcome, "default", name), [LbReason::InvalidRequest]);
    }
    assert!(outcome.services[&ObjectKey::new("default", "bad")].problems[0].message.contains("spec.loadBalancerIP"));
}

#[test]
fn changing_the_request_moves_the_service_to_the_new_address() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]}))];
    let mut allocator = LbAllocator::new();
    allocator.allocate(&pools, &[lb("default", "web", |_| {})]);
    let asked = lb("default", "web", |s| spec(s).load_balancer_ip = Some("198.18.100.14".into()));
    let outcome = allocator.allocate(&pools, &[asked]);
    assert_eq!(ips_of(&outcome, "default", "web"), [ip("198.18.100.14")]);
}

#[test]
fn a_disabled_pool_gives_nothing_new_and_its_held_addresses_are_released() {
    let enabled = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]}))];
    let disabled = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}], "disabled": true}))];
    let mut allocator = LbAllocator::new();
    allocator.allocate(&enabled, &[lb("default", "web", |_| {})]);
    let outcome = allocator.allocate(&disabled, &[lb("default", "web", |_| {})]);
    assert!(ips_of(&outcome, "default", "web").is_empty());
    assert_eq!(reasons_of(&outcome, "default", "web"), [LbReason::NoPoolSelects]);
}

#[test]
fn a_dual_stack_service_with_only_an_ipv4_pool_gets_ipv4_unless_it_requires_both() {
    let pools = [pool("p", json!({"blocks": [{"cidr": "198.18.100.0/28"}]}))];
    let prefer = lb("default", "prefer", |s| spec(s).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]));
    let require = lb("default", "require", |s| {
        spec(s).ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        spec(s).ip_family_policy = Some("RequireDualStack".into());
    });
    let outcome = LbAllocator::new().allocate(&pools, &[prefer, require]);
    assert_eq!(ips_of(&outcome, "default", "prefer").len(), 1);
    assert!(reasons_of(&outcome, "default", "prefer").is_empty());
    assert_eq!(reasons_of(&outcome, "default", "require"), [LbReason::NoPoolSelects]);
}
