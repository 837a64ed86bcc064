use super::*;
use crate::test_objects::*;

fn plan(service: &Service, pods: &[Pod]) -> Vec<EndpointSlice> {
    plan_slices(service, pods, None).unwrap()
}

/// The only endpoint of the only slice.
fn single_endpoint(slices: &[EndpointSlice]) -> &Endpoint {
    assert_eq!(slices.len(), 1, "{slices:?}");
    assert_eq!(slices[0].endpoints.len(), 1, "{slices:?}");
    &slices[0].endpoints[0]
}

/// `(ready, serving, terminating)`.
fn conditions(endpoint: &Endpoint) -> (bool, bool, bool) {
    let c = endpoint.conditions.as_ref().unwrap();
    (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
}

/// `(name, port)` of each port of a slice.
fn ports(slice: &EndpointSlice) -> Vec<(String, i32)> {
    slice.ports.iter().flatten().map(|p| (p.name.clone().unwrap(), p.port.unwrap())).collect()
}

fn names(slices: &[EndpointSlice]) -> Vec<String> {
    slices.iter().map(|s| s.metadata.name.clone().unwrap()).collect()
}

#[test]
fn a_ready_pod_is_published_as_ready_and_serving() {
    let slices = plan(&app_service("default/web", "web"), &[pod("default/web-1", "web", &["10.0.0.1"])]);
    let endpoint = single_endpoint(&slices);
    assert_eq!(endpoint.addresses, ["10.0.0.1"]);
    assert_eq!(conditions(endpoint), (true, true, false));
    assert_eq!(endpoint.node_name.as_deref(), Some("node-a"));
    assert_eq!(slices[0].address_type, "IPv4");
    assert_eq!(ports(&slices[0]), [("http".to_owned(), 8080)]);
    let port = &slices[0].ports.as_ref().unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
}

#[test]
fn a_pod_that_is_not_ready_is_published_as_not_ready() {
    let slices = plan(&app_service("default/web", "web"), &[not_ready(pod("default/web-1", "web", &["10.0.0.1"]))]);
    assert_eq!(conditions(single_endpoint(&slices)), (false, false, false));
}

#[test]
fn publish_not_ready_addresses_marks_every_endpoint_ready() {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    let pods = [
        not_ready(pod("default/web-1", "web", &["10.0.0.1"])),
        terminating(pod("default/web-2", "web", &["10.0.0.2"])),
        pod("default/web-3", "web", &["10.0.0.3"]),
    ];
    let slices = plan(&service, &pods);
    let got: Vec<_> = slices[0].endpoints.iter().map(conditions).collect();
    assert_eq!(got, [(true, false, false), (true, true, true), (true, true, false)]);
}

#[test]
fn a_terminating_pod_is_published_as_terminating_and_not_ready_but_still_serving() {
    let slices = plan(&app_service("default/web", "web"), &[terminating(pod("default/web-1", "web", &["10.0.0.1"]))]);
    assert_eq!(conditions(single_endpoint(&slices)), (false, true, true));
}

#[test]
fn terminal_unscheduled_and_address_less_pods_are_left_out() {
    let finished = with(pod("default/done", "web", &["10.0.0.2"]), |p| {
        p.status.as_mut().unwrap().phase = Some("Succeeded".to_owned());
    });
    let failed = with(pod("default/failed", "web", &["10.0.0.3"]), |p| {
        p.status.as_mut().unwrap().phase = Some("Failed".to_owned());
    });
    let unscheduled = with(pod("default/pending", "web", &["10.0.0.4"]), |p| p.spec.as_mut().unwrap().node_name = None);
    let no_ip = pod("default/starting", "web", &[]);
    let garbage_ip = pod("default/garbage", "web", &["not-an-ip"]);
    let pods = [finished, failed, unscheduled, no_ip, garbage_ip, pod("default/running", "web", &["10.0.0.1"])];
    let slices = plan(&app_service("default/web", "web"), &pods);
    assert_eq!(endpoint_pods(&slices), [("running".to_owned(), "10.0.0.1".to_owned())]);
}

#[test]
fn pod_ip_is_used_when_pod_ips_is_absent() {
    let legacy = with(pod("default/web-1", "web", &["10.0.0.1"]), |p| p.status.as_mut().unwrap().pod_ips = None);
    let slices = plan(&app_service("default/web", "web"), &[legacy]);
    assert_eq!(single_endpoint(&slices).addresses, ["10.0.0.1"]);
}

#[test]
fn only_pods_in_the_service_namespace_with_all_selector_labels_are_selected() {
    let mut service = app_service("shop/web", "web");
    service.spec.as_mut().unwrap().selector.as_mut().unwrap().insert("tier".into(), "front".into());
    let front = |key: &str, app: &str, ip: &str| {
        with(pod(key, app, &[ip]), |p| {
            p.metadata.labels.as_mut().unwrap().insert("tier".into(), "front".into());
        })
    };
    let pods = [
        front("shop/match", "web", "10.0.0.1"),
        front("other/same-labels", "web", "10.0.0.2"),
        pod("shop/no-tier", "web", &["10.0.0.3"]),
        front("shop/other-app", "db", "10.0.0.4"),
    ];
    let slices = plan(&service, &pods);
    assert_eq!(endpoint_pods(&slices), [("match".to_owned(), "10.0.0.1".to_owned())]);
}

#[test]
fn a_service_without_a_selector_gets_no_slices() {
    let pods = [pod("default/web-1", "web", &["10.0.0.1"])];
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().selector = None;
    assert_eq!(plan(&service, &pods), []);
    service.spec.as_mut().unwrap().selector = Some(BTreeMap::new());
    assert_eq!(plan(&service, &pods), []);
}

#[test]
fn an_external_name_service_gets_no_slices() {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().type_ = Some("ExternalName".to_owned());
    assert_eq!(plan(&service, &[pod("default/web-1", "web", &["10.0.0.1"])]), []);
}

#[test]
fn a_service_without_a_name_is_an_error() {
    let mut service = app_service("default/web", "web");
    service.metadata.name = None;
    let error = plan_slices(&service, &[], None).unwrap_err();
    assert_eq!(error.to_string(), "Service default/: metadata.name: is required");
}

#[test]
fn a_named_target_port_resolves_from_the_container_port() {
    let service = service("default/web", |spec| {
        spec.selector = Some([("app".to_owned(), "web".to_owned())].into());
        spec.ports = Some(vec![target_port(port("http", 80), IntOrString::String("web-http".into()))]);
    });
    let pods = [
        with_container_port(pod("default/web-1", "web", &["10.0.0.1"]), "web-http", 8080),
        with_container_port(pod("default/web-2", "web", &["10.0.0.2"]), "web-http", 9090),
    ];
    let slices = plan(&service, &pods);
    // Different numbers behind one name: one slice per port mapping.
    assert_eq!(slices.len(), 2);
    type PortsAndAddresses = (Vec<(String, i32)>, Vec<String>);
    let by_port: Vec<PortsAndAddresses> =
        slices.iter().map(|s| (ports(s), s.endpoints.iter().map(|e| e.addresses[0].clone()).collect())).collect();
    assert!(by_port.contains(&(vec![("http".into(), 8080)], vec!["10.0.0.1".into()])), "{by_port:?}");
    assert!(by_port.contains(&(vec![("http".into(), 9090)], vec!["10.0.0.2".into()])), "{by_port:?}");
}

#[test]
fn a_named_target_port_must_match_the_protocol() {
    let service = service("default/dns", |spec| {
        spec.selector = Some([("app".to_owned(), "dns".to_owned())].into());
        spec.ports = Some(vec![target_port(udp(port("dns", 53)), IntOrString::String("dns".into()))]);
    });
    // The container port called `dns` is TCP: the UDP Service port does not resolve.
    let pods = [with_container_port(pod("default/dns-1", "dns", &["10.0.0.1"]), "dns", 5353)];
    let slices = plan(&service, &pods);
    assert_eq!(ports(&slices[0]), []);
}

#[test]
fn a_named_target_port_resolves_from_a_sidecar_container() {
    let service = service("default/web", |spec| {
        spec.selector = Some([("app".to_owned(), "web".to_owned())].into());
        spec.ports = Some(vec![target_port(port("proxy", 80), IntOrString::String("proxy".into()))]);
    });
    let with_sidecar = with(pod("default/web-1", "web", &["10.0.0.1"]), |p| {
        let spec = p.spec.as_mut().unwrap();
        let mut sidecar = with_container_port(pod("x/x", "x", &[]), "proxy", 15001).spec.unwrap().containers.remove(0);
        sidecar.restart_policy = Some("Always".to_owned());
        spec.init_containers = Some(vec![sidecar]);
    });
    let slices = plan(&service, &[with_sidecar]);
    assert_eq!(ports(&slices[0]), [("proxy".to_owned(), 15001)]);
}

#[test]
fn pods_without_the_named_port_are_published_without_that_port() {
    let service = service("default/web", |spec| {
        spec.selector = Some([("app".to_owned(), "web".to_owned())].into());
        spec.ports =
            Some(vec![port("plain", 80), target_port(port("metrics", 9000), IntOrString::String("metrics".into()))]);
    });
    let pods = [
        with_container_port(pod("default/with", "web", &["10.0.0.1"]), "metrics", 9100),
        pod("default/without", "web", &["10.0.0.2"]),
    ];
    let slices = plan(&service, &pods);
    let mut got: Vec<_> = slices.iter().map(|s| (ports(s), endpoint_pods(std::slice::from_ref(s)))).collect();
    got.sort();
    assert_eq!(
        got,
        [
            (vec![("plain".into(), 80)], vec![("without".into(), "10.0.0.2".into())]),
            (vec![("plain".into(), 80), ("metrics".into(), 9100)], vec![("with".into(), "10.0.0.1".into())]),
        ]
    );
}

#[test]
fn a_missing_target_port_defaults_to_the_service_port() {
    let service = service("default/web", |spec| {
        spec.selector = Some([("app".to_owned(), "web".to_owned())].into());
        spec.ports = Some(vec![port("http", 80), target_port(port("alt", 81), IntOrString::Int(0))]);
    });
    let slices = plan(&service, &[pod("default/web-1", "web", &["10.0.0.1"])]);
    assert_eq!(ports(&slices[0]), [("http".to_owned(), 80), ("alt".to_owned(), 81)]);
}

#[test]
fn more_than_100_pods_are_split_over_several_slices() {
    let pods: Vec<Pod> = (0..250)
        .map(|i| pod(&format!("default/web-{i}"), "web", &[&format!("10.0.{}.{}", i / 200, i % 200)]))
        .collect();
    let slices = plan(&app_service("default/web", "web"), &pods);
    let sizes: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
    assert_eq!(sizes, [100, 100, 50]);
    let addresses: std::collections::BTreeSet<String> = endpoint_pods(&slices).into_iter().map(|(_, ip)| ip).collect();
    assert_eq!(addresses.len(), 250);
    let unique_names: std::collections::BTreeSet<String> = names(&slices).into_iter().collect();
    assert_eq!(unique_names.len(), 3);
}

#[test]
fn endpoints_are_sorted_by_address() {
    let pods = [
        pod("default/c", "web", &["10.0.0.10"]),
        pod("default/a", "web", &["10.0.0.9"]),
        pod("default/b", "web", &["10.0.0.100"]),
    ];
    let slices = plan(&app_service("default/web", "web"), &pods);
    let addresses: Vec<_> = endpoint_pods(&slices).into_iter().map(|(_, ip)| ip).collect();
    assert_eq!(addresses, ["10.0.0.9", "10.0.0.10", "10.0.0.100"]);
}

#[test]
fn dual_stack_pods_get_one_slice_per_family() {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let slices = plan(&service, &[pod("default/web-1", "web", &["10.0.0.1", "fd00::1"])]);
    let got: Vec<_> = slices.iter().map(|s| (s.address_type.clone(), s.endpoints[0].addresses.clone())).collect();
    assert_eq!(
        got,
        [("IPv4".to_owned(), vec!["10.0.0.1".to_owned()]), ("IPv6".to_owned(), vec!["fd00::1".to_owned()])]
    );
}

#[test]
fn a_single_stack_service_publishes_only_its_family() {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()]);
    let slices = plan(&service, &[pod("default/web-1", "web", &["10.0.0.1", "fd00::1"])]);
    assert_eq!(endpoint_pods(&slices), [("web-1".to_owned(), "fd00::1".to_owned())]);
    assert_eq!(slices[0].address_type, "IPv6");
}

#[test]
fn without_ip_families_the_cluster_ip_decides_the_family() {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().cluster_ip = Some("fd00:96::5".into());
    let slices = plan(&service, &[pod("default/web-1", "web", &["10.0.0.1", "fd00::1"])]);
    assert_eq!(names(&slices).len(), 1);
    assert_eq!(slices[0].address_type, "IPv6");
}

#[test]
fn replanning_gives_the_same_slice_names() {
    let pods: Vec<Pod> = (0..150).map(|i| pod(&format!("default/web-{i}"), "web", &[&format!("10.0.1.{i}")])).collect();
    let first = plan(&app_service("default/web", "web"), &pods);
    let reversed: Vec<Pod> = pods.iter().rev().cloned().collect();
    let second = plan(&app_service("default/web", "web"), &reversed);
    assert_eq!(first, second);
    let other = plan(&app_service("default/api", "web"), &pods);
    for name in names(&first) {
        assert!(name.starts_with("web-") && name.len() == "web-".len() + 10, "{name}");
        assert!(!names(&other).contains(&name));
    }
}

#[test]
fn slices_carry_the_service_labels_and_an_owner_reference() {
    let mut service = app_service("shop/web", "web");
    service.metadata.uid = Some("1234-abcd".into());
    service.metadata.labels = Some([("team".to_owned(), "payments".to_owned())].into());
    let slices = plan(&service, &[pod("shop/web-1", "web", &["10.0.0.1"])]);
    let meta = &slices[0].metadata;
    assert_eq!(meta.namespace.as_deref(), Some("shop"));
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels.get(LABEL_SERVICE_NAME).map(String::as_str), Some("web"));
    assert_eq!(labels.get(LABEL_MANAGED_BY).map(String::as_str), Some("endpointslice-controller.svcplane.io"));
    assert_eq!(labels.get("team").map(String::as_str), Some("payments"));
    assert!(!labels.contains_key(LABEL_HEADLESS));
    assert_eq!(
        meta.owner_references,
        Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Service".into(),
            name: "web".into(),
            uid: "1234-abcd".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }])
    );
    let target = slices[0].endpoints[0].target_ref.as_ref().unwrap();
    assert_eq!(
        (target.kind.as_deref(), target.namespace.as_deref(), target.name.as_deref()),
        (Some("Pod"), Some("shop"), Some("web-1"))
    );
}

#[test]
fn a_headless_service_slices_carry_the_headless_label() {
    let mut service = app_service("default/db", "db");
    service.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let slices = plan(&service, &[pod("default/db-0", "db", &["10.0.0.1", "fd00::1"])]);
    // No ipFamilies and no address: both families, as upstream does for headless Services.
    assert_eq!(slices.len(), 2);
    for slice in &slices {
        assert_eq!(slice.metadata.labels.as_ref().unwrap().get(LABEL_HEADLESS).map(String::as_str), Some(""));
    }
}

#[test]
fn the_pod_hostname_is_published_when_its_subdomain_is_the_service() {
    let mut service = app_service("default/db", "db");
    service.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let named = |key: &str, ip: &str, subdomain: &str| {
        with(pod(key, "db", &[ip]), |p| {
            let spec = p.spec.as_mut().unwrap();
            spec.hostname = Some(p.metadata.name.clone().unwrap());
            spec.subdomain = Some(subdomain.to_owned());
        })
    };
    let slices = plan(&service, &[named("default/db-0", "10.0.0.1", "db"), named("default/db-1", "10.0.0.2", "other")]);
    let hostnames: Vec<_> = slices[0].endpoints.iter().map(|e| e.hostname.clone()).collect();
    assert_eq!(hostnames, [Some("db-0".to_owned()), None]);
}

#[test]
fn the_zone_comes_from_the_node_label() {
    let pods =
        [pod("default/web-1", "web", &["10.0.0.1"]), on_node(pod("default/web-2", "web", &["10.0.0.2"]), "node-x")];
    let nodes = [node("node-a", "zone-1")];
    let slices = plan_slices(&app_service("default/web", "web"), &pods, Some(&nodes)).unwrap();
    let zones: Vec<_> = slices[0].endpoints.iter().map(|e| e.zone.clone()).collect();
    assert_eq!(zones, [Some("zone-1".to_owned()), None]);
    let without_nodes = plan(&app_service("default/web", "web"), &pods);
    assert!(without_nodes[0].endpoints.iter().all(|e| e.zone.is_none()));
}

fn hinted(traffic_distribution: Option<&str>) -> Vec<(Vec<String>, Vec<String>)> {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().traffic_distribution = traffic_distribution.map(str::to_owned);
    let pods = [on_node(pod("default/web-1", "web", &["10.0.0.1"]), "node-a")];
    let slices = plan_slices(&service, &pods, Some(&[node("node-a", "zone-1")])).unwrap();
    slices[0]
        .endpoints
        .iter()
        .map(|e| {
            let hints = e.hints.clone().unwrap_or_default();
            let zones = hints.for_zones.unwrap_or_default().into_iter().map(|z| z.name).collect();
            let nodes = hints.for_nodes.unwrap_or_default().into_iter().map(|n| n.name).collect();
            (zones, nodes)
        })
        .collect()
}

#[test]
fn prefer_close_hints_each_endpoint_for_its_own_zone() {
    assert_eq!(hinted(Some("PreferClose")), [(vec!["zone-1".to_owned()], vec![])]);
    assert_eq!(hinted(Some("PreferSameZone")), [(vec!["zone-1".to_owned()], vec![])]);
}

#[test]
fn prefer_same_node_hints_each_endpoint_for_its_own_node_and_zone() {
    assert_eq!(hinted(Some("PreferSameNode")), [(vec!["zone-1".to_owned()], vec!["node-a".to_owned()])]);
}

#[test]
fn endpoints_that_are_not_ready_carry_no_hints() {
    let mut service = app_service("default/web", "web");
    service.spec.as_mut().unwrap().traffic_distribution = Some("PreferClose".into());
    let pods = [not_ready(on_node(pod("default/web-1", "web", &["10.0.0.1"]), "node-a"))];
    let slices = plan_slices(&service, &pods, Some(&[node("node-a", "zone-1")])).unwrap();
    assert_eq!(slices[0].endpoints[0].hints, None);
}

#[test]
fn without_a_traffic_distribution_endpoints_carry_no_hints() {
    assert_eq!(hinted(None), [(vec![], vec![])]);
    assert_eq!(hinted(Some("SomethingNew")), [(vec![], vec![])]);
}

#[test]
fn the_planner_selects_the_same_pods_as_a_scan() {
    let mut pods = Vec::new();
    for i in 0..60 {
        let namespace = ["a", "b"][i % 2];
        let app = ["web", "db", "cache"][i % 3];
        let mut p = pod(&format!("{namespace}/p{i}"), app, &[&format!("10.1.0.{i}")]);
        p.metadata.labels.as_mut().unwrap().insert("shard".into(), (i % 4).to_string());
        if i % 7 == 0 {
            p = not_ready(p);
        }
        pods.push(p);
    }
    let planner = SlicePlanner::new(&pods, None);
    for namespace in ["a", "b", "c"] {
        for app in ["web", "db", "cache", "none"] {
            for shard in [None, Some("1"), Some("2")] {
                let mut service = app_service(&format!("{namespace}/svc"), app);
                if let Some(shard) = shard {
                    service.spec.as_mut().unwrap().selector.as_mut().unwrap().insert("shard".into(), shard.into());
                }
                assert_eq!(planner.plan(&service).unwrap(), plan(&service, &pods), "{namespace} {app} {shard:?}");
            }
        }
    }
    assert_eq!(endpoint_pods(&planner.plan(&app_service("a/svc", "web")).unwrap()).len(), 10);
}

#[test]
fn the_pod_index_selects_by_every_label() {
    let pods = [
        pod("default/a", "web", &["10.0.0.1"]),
        with(pod("default/b", "web", &["10.0.0.2"]), |p| {
            p.metadata.labels.as_mut().unwrap().insert("tier".into(), "front".into());
        }),
        pod("default/c", "db", &["10.0.0.3"]),
    ];
    let index = PodIndex::new(&pods);
    let select = |pairs: &[(&str, &str)]| -> Vec<String> {
        let selector = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        index.select("default", &selector).iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    };
    assert_eq!(select(&[("app", "web")]), ["a", "b"]);
    assert_eq!(select(&[("app", "web"), ("tier", "front")]), ["b"]);
    assert_eq!(select(&[("app", "web"), ("tier", "back")]), Vec::<String>::new());
    assert_eq!(select(&[]), ["a", "b", "c"]);
    assert!(index.select("elsewhere", &BTreeMap::new()).is_empty());
}
