//! The real control plane itself: etcd and kube-apiserver (built by `scripts/k8s/build`)
//! in a network namespace of the test's own, reached from inside it.
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use svcplane_control_plane::{BareNamespace, ControlPlane, ControlPlaneConfig, NetnsClient, binaries_for_test};

#[test]
fn a_service_created_through_a_real_api_server_reads_back_with_an_allocated_cluster_ip() {
    let Some(binaries) = binaries_for_test("kube_control_plane") else { return };
    let namespace = BareNamespace::create().expect("a namespace for the control plane");
    let address: IpAddr = "198.18.0.2".parse().unwrap();
    namespace.add_loopback_address(address).unwrap();
    let plane = ControlPlane::start(&binaries, ControlPlaneConfig::new(namespace.name(), address))
        .unwrap_or_else(|error| panic!("starting the control plane: {error}"));
    let client = NetnsClient::connect(namespace.name(), plane.kubeconfig()).unwrap();

    let service = Service {
        metadata: ObjectMeta { name: Some("web".into()), namespace: Some("default".into()), ..ObjectMeta::default() },
        spec: Some(ServiceSpec {
            selector: Some([("app".to_owned(), "web".to_owned())].into()),
            ports: Some(vec![ServicePort { name: Some("http".into()), port: 80, ..ServicePort::default() }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    client.create(&service).unwrap();
    let read: Service = client.get("default", "web").unwrap();
    let spec = read.spec.expect("a spec");
    let cluster_ip: IpAddr = spec.cluster_ip.as_deref().expect("an allocated cluster IP").parse().unwrap();
    assert!(
        "198.19.0.0/16".parse::<ipnet::IpNet>().unwrap().contains(&cluster_ip),
        "{cluster_ip} is outside --service-cluster-ip-range"
    );
    let ports = spec.ports.expect("ports");
    assert_eq!(
        (ports[0].name.as_deref(), ports[0].port, ports[0].protocol.as_deref()),
        (Some("http"), 80, Some("TCP"))
    );

    // The API server advertises the address it was given as the `kubernetes` Service's
    // endpoint. Its bootstrap controller creates that Service a moment after the server
    // answers (a CI run under load read it too early), so it is waited for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let kubernetes: Service = loop {
        match client.get("default", "kubernetes") {
            Ok(service) => break service,
            Err(error) if std::time::Instant::now() < deadline => {
                eprintln!("the kubernetes Service is not there yet: {error}");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err(error) => panic!("the kubernetes Service never appeared: {error}"),
        }
    };
    assert_eq!(kubernetes.spec.and_then(|s| s.cluster_ip).as_deref(), Some("198.19.0.1"));
}
