use std::time::Duration;

use super::*;
use crate::model::{
    Endpoint, EndpointPort, EndpointSlice, LoadBalancerIngress, Service, ServicePort, ServiceType, TrafficPolicy,
};
use crate::plan::{NodeConfig, NodePortAddresses};
use crate::state::{Change, ClusterState};

const NODE_IP: &str = "198.18.0.11";
const POD_ON_NODE1: &str = "198.18.129.2";
const POD_ON_NODE2: &str = "198.18.130.2";
const EXTERNAL: &str = "198.18.1.50";

fn config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        node_ips: vec![NODE_IP.parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        node_port_addresses: NodePortAddresses::AllLocal,
    }
}

fn service(service_type: ServiceType) -> Service {
    let mut s = Service::cluster_ip(
        NamespacedName::new("default", "web"),
        vec!["198.19.0.10".parse().unwrap()],
        vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(30080) }],
    );
    s.service_type = service_type;
    s
}

fn plan(service: Service, endpoints: &[(&str, &str)]) -> (NodePlan, ClusterState) {
    plan_with(service, endpoints, config())
}

fn plan_with(service: Service, endpoints: &[(&str, &str)], config: NodeConfig) -> (NodePlan, ClusterState) {
    let mut state = ClusterState::new();
    state.apply(Change::ServiceUpserted(service));
    state.apply(Change::SliceUpserted(EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new("default", "web-abc"),
        service: NamespacedName::new("default", "web"),
        family: IpFamily::V4,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
        endpoints: endpoints.iter().map(|(ip, node)| Endpoint::ready(ip.parse().unwrap(), Some(node))).collect(),
    }));
    (NodePlan::build(&state, config), state)
}

fn ask((plan, state): &(NodePlan, ClusterState), from: &str, to: &str, protocol: Protocol) -> Explanation {
    let query = Query { source: from.parse().unwrap(), destination: to.parse().unwrap(), protocol };
    explain(plan, state, &[NODE_IP.parse().unwrap(), "198.18.0.111".parse().unwrap()], &query)
}

fn forwarded(explanation: &Explanation) -> &Forwarding {
    match &explanation.verdict {
        Verdict::Forwarded(forwarding) => forwarding,
        other => panic!("expected forwarding, got {other:?}\n{explanation}"),
    }
}

fn addresses(forwarding: &Forwarding) -> Vec<String> {
    forwarding.endpoints.iter().map(|e| e.address.ip().to_string()).collect()
}

#[test]
fn a_pod_to_a_cluster_ip_reaches_every_endpoint_with_equal_odds_and_keeps_its_address() {
    let plan = plan(service(ServiceType::ClusterIp), &[(POD_ON_NODE1, "node1"), (POD_ON_NODE2, "node2")]);
    let answer = ask(&plan, "198.18.129.9", "198.19.0.10:80", Protocol::Tcp);
    let forwarding = forwarded(&answer);
    assert_eq!(forwarding.frontend.kind, FrontendKind::ClusterIp);
    assert_eq!(forwarding.frontend.service_port.to_string(), "default/web:http/tcp");
    assert_eq!(addresses(forwarding), [POD_ON_NODE1, POD_ON_NODE2]);
    assert!(forwarding.endpoints.iter().all(|e| (e.probability - 0.5).abs() < 1e-9));
    assert!(!forwarding.masquerade);
    assert!(forwarding.masquerade_reason.contains("inside the cluster CIDR 198.18.128.0/17"));
    assert_eq!(forwarding.endpoints[0].node.as_deref(), Some("node1"));
    assert!(forwarding.endpoints[0].local && !forwarding.endpoints[1].local);
    assert!(forwarding.endpoints.iter().all(|e| e.ready && !e.terminating));
    assert_eq!((forwarding.route.number, forwarding.route.of), (2, 2));
}

#[test]
fn an_off_cluster_client_to_a_cluster_ip_is_masqueraded_and_told_why() {
    let plan = plan(service(ServiceType::ClusterIp), &[(POD_ON_NODE1, "node1")]);
    let forwarding = forwarded(&ask(&plan, EXTERNAL, "198.19.0.10:80", Protocol::Tcp)).clone();
    assert!(forwarding.masquerade);
    assert!(forwarding.masquerade_reason.contains("outside the cluster CIDR 198.18.128.0/17"));
    assert_eq!(forwarding.route.number, 1);
}

#[test]
fn the_node_itself_is_recognised_by_its_own_address() {
    let plan = plan(service(ServiceType::ClusterIp), &[(POD_ON_NODE1, "node1")]);
    let answer = ask(&plan, NODE_IP, "198.19.0.10:80", Protocol::Tcp);
    assert!(answer.from_this_node);
    assert!(forwarded(&answer).masquerade);
}

#[test]
fn a_pod_drawing_itself_is_told_it_is_masqueraded_through_hairpin() {
    let plan = plan(service(ServiceType::ClusterIp), &[(POD_ON_NODE1, "node1"), (POD_ON_NODE2, "node2")]);
    let answer = ask(&plan, POD_ON_NODE1, "198.19.0.10:80", Protocol::Tcp);
    let forwarding = forwarded(&answer);
    assert!(!forwarding.masquerade);
    assert!(forwarding.hairpin_masquerade);
    assert!(forwarding.endpoints[0].hairpin && !forwarding.endpoints[1].hairpin);
    assert!(answer.to_string().contains("hairpin"));
}

#[test]
fn a_service_without_endpoints_is_rejected_with_a_reset_for_tcp() {
    let plan = plan(service(ServiceType::NodePort), &[]);
    let answer = ask(&plan, EXTERNAL, "198.18.0.11:30080", Protocol::Tcp);
    match &answer.verdict {
        Verdict::Rejected { frontend, refusal, reason } => {
            assert_eq!(frontend.kind, FrontendKind::NodePort);
            assert_eq!(*refusal, Refusal::TcpReset);
            assert!(reason.contains("no usable IPv4 endpoint"), "{reason}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn external_local_policy_without_a_local_endpoint_drops_and_names_the_policy_and_node() {
    let mut svc = service(ServiceType::NodePort);
    svc.external_traffic_policy = TrafficPolicy::Local;
    let plan = plan(svc, &[(POD_ON_NODE2, "node2")]);
    let answer = ask(&plan, EXTERNAL, "198.18.0.11:30080", Protocol::Tcp);
    match &answer.verdict {
        Verdict::Dropped { reason, .. } => {
            assert!(reason.contains("externalTrafficPolicy Local and no local endpoint on node1"), "{reason}");
        }
        other => panic!("expected a drop, got {other:?}"),
    }
    // A pod on the node is not external: it reaches the other node's endpoint.
    let from_pod = ask(&plan, "198.18.129.9", "198.18.0.11:30080", Protocol::Tcp);
    assert_eq!(addresses(forwarded(&from_pod)), [POD_ON_NODE2]);
}

#[test]
fn external_local_policy_keeps_the_client_address_and_uses_only_local_endpoints() {
    let mut svc = service(ServiceType::NodePort);
    svc.external_traffic_policy = TrafficPolicy::Local;
    let plan = plan(svc, &[(POD_ON_NODE1, "node1"), (POD_ON_NODE2, "node2")]);
    let answer = ask(&plan, EXTERNAL, "198.18.0.111:30080", Protocol::Tcp);
    let forwarding = forwarded(&answer);
    assert_eq!(forwarding.endpoint_set, EndpointSetKind::Local);
    assert_eq!(addresses(forwarding), [POD_ON_NODE1]);
    assert!(forwarding.endpoints[0].local);
    assert!(!forwarding.masquerade);
    assert!(forwarding.masquerade_reason.contains("externalTrafficPolicy Local"));
}

#[test]
fn internal_local_policy_without_a_local_endpoint_drops_and_names_internal_traffic_policy() {
    let mut svc = service(ServiceType::ClusterIp);
    svc.internal_traffic_policy = TrafficPolicy::Local;
    let plan = plan(svc, &[(POD_ON_NODE2, "node2")]);
    match ask(&plan, "198.18.129.9", "198.19.0.10:80", Protocol::Tcp).verdict {
        Verdict::Dropped { reason, .. } => assert!(reason.starts_with("internalTrafficPolicy Local"), "{reason}"),
        other => panic!("expected a drop, got {other:?}"),
    }
}

#[test]
fn a_node_port_is_never_served_on_loopback_and_says_so() {
    let plan = plan(service(ServiceType::NodePort), &[(POD_ON_NODE1, "node1")]);
    match ask(&plan, "127.0.0.1", "127.0.0.1:30080", Protocol::Tcp).verdict {
        Verdict::NotServed { reason } => assert!(reason.contains("127.0.0.0/8"), "{reason}"),
        other => panic!("expected not served, got {other:?}"),
    }
}

#[test]
fn a_node_port_outside_the_nodeport_addresses_is_not_served() {
    let config = NodeConfig {
        node_port_addresses: NodePortAddresses::Cidrs(vec!["198.18.0.111/32".parse().unwrap()]),
        ..config()
    };
    let plan = plan_with(service(ServiceType::NodePort), &[(POD_ON_NODE1, "node1")], config);
    match ask(&plan, EXTERNAL, "198.18.0.11:30080", Protocol::Tcp).verdict {
        Verdict::NotServed { reason } => assert!(reason.contains("--nodeport-addresses"), "{reason}"),
        other => panic!("expected not served, got {other:?}"),
    }
    assert_eq!(ask(&plan, EXTERNAL, "198.18.0.111:30080", Protocol::Tcp).verdict.name(), "forwarded");
}

#[test]
fn a_node_port_on_an_address_the_node_does_not_have_is_not_served() {
    let plan = plan(service(ServiceType::NodePort), &[(POD_ON_NODE1, "node1")]);
    assert_eq!(ask(&plan, EXTERNAL, "198.18.0.99:30080", Protocol::Tcp).verdict.name(), "not-served");
}

#[test]
fn a_load_balancer_ip_drops_sources_outside_its_ranges() {
    let mut svc = service(ServiceType::LoadBalancer);
    svc.load_balancer_ingress = vec![LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
    svc.load_balancer_source_ranges = vec!["198.18.1.0/28".parse().unwrap()];
    let plan = plan(svc, &[(POD_ON_NODE1, "node1")]);
    match ask(&plan, "198.18.1.200", "198.18.100.1:80", Protocol::Tcp).verdict {
        Verdict::Dropped { reason, .. } => assert!(reason.contains("loadBalancerSourceRanges 198.18.1.0/28")),
        other => panic!("expected a drop, got {other:?}"),
    }
    let inside = ask(&plan, "198.18.1.5", "198.18.100.1:80", Protocol::Tcp);
    assert_eq!(forwarded(&inside).frontend.kind, FrontendKind::LoadBalancer);
    assert!(forwarded(&inside).masquerade);
}

#[test]
fn the_wrong_protocol_or_port_matches_no_frontend() {
    let plan = plan(service(ServiceType::ClusterIp), &[(POD_ON_NODE1, "node1")]);
    assert_eq!(ask(&plan, "198.18.129.9", "198.19.0.10:80", Protocol::Udp).verdict.name(), "not-served");
    assert_eq!(ask(&plan, "198.18.129.9", "198.19.0.10:81", Protocol::Tcp).verdict.name(), "not-served");
}

#[test]
fn session_affinity_is_reported_with_its_timeout() {
    let mut svc = service(ServiceType::ClusterIp);
    svc.session_affinity = Some(ClientIpAffinity { timeout: Duration::from_secs(30) });
    let plan = plan(svc, &[(POD_ON_NODE1, "node1")]);
    let answer = ask(&plan, "198.18.129.9", "198.19.0.10:80", Protocol::Tcp);
    assert_eq!(forwarded(&answer).affinity, Some(ClientIpAffinity { timeout: Duration::from_secs(30) }));
    assert!(answer.to_string().contains("ClientIP, 30s"));
}

#[test]
fn a_health_check_node_port_is_answered_by_the_proxy_with_the_local_endpoint_count() {
    let mut svc = service(ServiceType::LoadBalancer);
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let plan = plan(svc, &[(POD_ON_NODE1, "node1"), (POD_ON_NODE2, "node2")]);
    match ask(&plan, EXTERNAL, "198.18.0.11:32000", Protocol::Tcp).verdict {
        Verdict::HealthCheck { port, local_endpoints, .. } => assert_eq!((port, local_endpoints), (32000, 1)),
        other => panic!("expected the health check, got {other:?}"),
    }
}

#[test]
fn a_source_of_the_other_family_is_not_served() {
    let plan = plan(service(ServiceType::ClusterIp), &[(POD_ON_NODE1, "node1")]);
    assert_eq!(ask(&plan, "2001:db8::1", "198.19.0.10:80", Protocol::Tcp).verdict.name(), "not-served");
}
