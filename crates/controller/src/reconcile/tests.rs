use k8s_openapi::api::discovery::v1::Endpoint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::test_objects::*;

fn explicit_slice(key: &str, service: &str, managed_by: Option<&str>) -> EndpointSlice {
    let (namespace, name) = key.split_once('/').unwrap();
    let mut labels = std::collections::BTreeMap::from([(crate::LABEL_SERVICE_NAME.to_owned(), service.to_owned())]);
    if let Some(managed_by) = managed_by {
        labels.insert(LABEL_MANAGED_BY.to_owned(), managed_by.to_owned());
    }
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint { addresses: vec!["192.0.2.10".into()], ..Endpoint::default() }],
        ports: None,
    }
}

fn slice_names(reconciled: &Reconciled) -> Vec<String> {
    reconciled.slices.iter().map(|s| s.metadata.name.clone().unwrap()).collect()
}

#[test]
fn reconcile_fills_allocations_and_plans_slices_from_the_filled_services() {
    let mut allocator = allocator(&["10.96.0.0/12", "fd00:96::/108"]);
    let mut web = app_service("default/web", "web");
    web.spec.as_mut().unwrap().ip_family_policy = Some("PreferDualStack".into());
    let input = ClusterObjects {
        services: vec![web, app_service("default/api", "api")],
        pods: vec![
            pod("default/web-1", "web", &["10.0.0.1", "fd00::1"]),
            pod("default/api-1", "api", &["10.0.0.2", "fd00::2"]),
        ],
        nodes: vec![node("node-a", "zone-1")],
        slices: vec![],
        pools: Vec::new(),
    };
    let reconciled = reconcile(&input, &mut allocator);
    assert_eq!(reconciled.errors, []);
    assert!(reconciled.allocations_changed);
    assert_eq!(cluster_ips(&reconciled.services[0]).len(), 2);
    assert_eq!(cluster_ips(&reconciled.services[1]).len(), 1);
    // The dual-stack Service gets a slice per family; the single-stack one only IPv4.
    let got: Vec<(String, String)> = reconciled
        .slices
        .iter()
        .map(|s| (s.metadata.labels.as_ref().unwrap()[crate::LABEL_SERVICE_NAME].clone(), s.address_type.clone()))
        .collect();
    assert_eq!(got, [("web".into(), "IPv4".into()), ("web".into(), "IPv6".into()), ("api".into(), "IPv4".into())]);
    assert_eq!(reconciled.slices[0].endpoints[0].zone.as_deref(), Some("zone-1"));

    let again = reconcile(&input, &mut allocator);
    assert!(!again.allocations_changed);
    assert_eq!(again.slices, reconciled.slices);
}

#[test]
fn a_service_with_an_error_is_left_out_and_the_others_continue() {
    let mut allocator = allocator(&["198.19.0.0/16"]);
    let mut broken = app_service("default/web", "web");
    broken.spec.as_mut().unwrap().cluster_ip = Some("10.0.0.5".into());
    let input = ClusterObjects {
        services: vec![broken, app_service("default/api", "api")],
        pods: vec![pod("default/web-1", "web", &["10.0.0.1"]), pod("default/api-1", "api", &["10.0.0.2"])],
        ..ClusterObjects::default()
    };
    let reconciled = reconcile(&input, &mut allocator);
    let messages: Vec<String> = reconciled.errors.iter().map(ToString::to_string).collect();
    assert_eq!(messages, ["Service default/web: spec.clusterIP: 10.0.0.5 is outside the service CIDRs 198.19.0.0/16"]);
    let services: Vec<_> = reconciled.services.iter().map(|s| s.metadata.name.clone().unwrap()).collect();
    assert_eq!(services, ["api"]);
    assert_eq!(endpoint_pods(&reconciled.slices), [("api-1".to_owned(), "10.0.0.2".to_owned())]);
}

#[test]
fn explicit_slices_are_passed_through_after_the_generated_ones() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let selectorless = service("default/external-db", |spec| spec.ports = Some(vec![port("sql", 5432)]));
    let input = ClusterObjects {
        services: vec![selectorless, app_service("default/web", "web")],
        pods: vec![pod("default/web-1", "web", &["10.0.0.1"])],
        slices: vec![
            explicit_slice("default/external-db-1", "external-db", None),
            explicit_slice("default/web-extra", "web", Some("someone-else")),
        ],
        ..ClusterObjects::default()
    };
    let reconciled = reconcile(&input, &mut allocator);
    let names = slice_names(&reconciled);
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names[0].starts_with("web-"));
    assert_eq!(names[1..], ["external-db-1", "web-extra"]);
    assert_eq!(reconciled.slices[1], input.slices[0]);
}

#[test]
fn slices_of_ours_in_the_input_are_not_duplicated() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let mut input = ClusterObjects {
        services: vec![app_service("default/web", "web")],
        pods: vec![pod("default/web-1", "web", &["10.0.0.1"])],
        ..ClusterObjects::default()
    };
    let first = reconcile(&input, &mut allocator);
    // The previous output written back into the directory.
    input.slices = first.slices.clone();
    input.slices.push(explicit_slice("default/web-stale", "web", Some(MANAGED_BY)));
    let second = reconcile(&input, &mut allocator);
    assert_eq!(second.slices, first.slices);
}

#[test]
fn external_name_services_are_returned_without_slices() {
    let mut allocator = allocator(&["10.96.0.0/12"]);
    let mut external = app_service("default/search", "web");
    external.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
    external.spec.as_mut().unwrap().external_name = Some("search.example.com".into());
    let input = ClusterObjects {
        services: vec![external.clone()],
        pods: vec![pod("default/web-1", "web", &["10.0.0.1"])],
        ..ClusterObjects::default()
    };
    let reconciled = reconcile(&input, &mut allocator);
    assert_eq!(reconciled.services, [external]);
    assert_eq!(reconciled.slices, []);
}
