//! DNS request packets against a small fixed zone: the wire decoder and the answering
//! function (`respond_to_wire`), as the UDP and TCP servers call them.
//!
//! The first byte picks the transport and the zone (complete, complete and forwarding,
//! with `pods insecure`, or not yet built), the rest is the packet. Properties: nothing
//! panics or hangs; every response decodes, is a response, carries the request's ID, and
//! fits the UDP size limit when it goes over UDP.

#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use libfuzzer_sys::fuzz_target;
use svcplane_dns::hickory_proto::op::{Message, MessageType};
use svcplane_dns::wire::MAX_UDP_PAYLOAD;
use svcplane_dns::{
    ClusterView, DnsEndpoint, DnsPort, DnsService, EndpointSet, PodRecords, Protocol, ServiceKind, Transport,
    WireOutcome, Zone, ZoneConfig, respond_to_wire,
};

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address")
}

fn port(name: &str, protocol: Protocol, port: u16) -> DnsPort {
    DnsPort { name: name.to_owned(), protocol, port }
}

fn service(namespace: &str, name: &str, kind: ServiceKind, ports: Vec<DnsPort>) -> DnsService {
    DnsService { namespace: namespace.to_owned(), name: name.to_owned(), kind, ports }
}

/// ClusterIP (single and dual stack), headless with named and unnamed endpoints, and
/// ExternalName Services in two namespaces.
fn view() -> ClusterView {
    let endpoint = |address: &str, hostname: Option<&str>, ready: bool| DnsEndpoint {
        ip: ip(address),
        hostname: hostname.map(str::to_owned),
        ready,
        node_name: None,
    };
    let mysql = vec![port("mysql", Protocol::Tcp, 3306)];
    ClusterView {
        namespaces: vec!["default".into(), "kube-system".into()],
        services: vec![
            service(
                "default",
                "web",
                ServiceKind::ClusterIp { ips: vec![ip("198.19.0.10")] },
                vec![port("http", Protocol::Tcp, 80), port("dns", Protocol::Udp, 53)],
            ),
            service(
                "default",
                "dual",
                ServiceKind::ClusterIp { ips: vec![ip("198.19.0.11"), ip("2001:db8::11")] },
                vec![port("", Protocol::Tcp, 80)],
            ),
            service(
                "kube-system",
                "kube-dns",
                ServiceKind::ClusterIp { ips: vec![ip("198.19.0.53")] },
                vec![port("dns", Protocol::Udp, 53), port("dns-tcp", Protocol::Tcp, 53)],
            ),
            service(
                "default",
                "db",
                ServiceKind::Headless {
                    endpoints: vec![EndpointSet {
                        ports: mysql.clone(),
                        endpoints: vec![
                            endpoint("198.18.0.1", Some("db-0"), true),
                            endpoint("198.18.0.2", None, true),
                            endpoint("2001:db8:1::3", Some("db-2"), false),
                        ],
                    }],
                    publish_not_ready_addresses: false,
                },
                mysql,
            ),
            service("default", "ext", ServiceKind::ExternalName { target: "www.example.com".into() }, vec![]),
        ],
    }
}

static ZONES: LazyLock<[Zone; 4]> = LazyLock::new(|| {
    let config = || ZoneConfig::new("cluster.local").expect("a valid zone");
    let view = view();
    [
        Zone::build(Arc::new(config()), &view, 1),
        Zone::build(Arc::new(config().with_forwarding(true)), &view, 2),
        Zone::build(Arc::new(config().with_pod_records(PodRecords::Insecure)), &view, 3),
        Zone::pending(Arc::new(config())),
    ]
});

fuzz_target!(|data: &[u8]| {
    let Some((&selector, packet)) = data.split_first() else { return };
    let transport = if selector & 1 == 0 { Transport::Udp } else { Transport::Tcp };
    let zone = &ZONES[usize::from(selector >> 1) % 4];
    let WireOutcome::Send(bytes) = respond_to_wire(zone, packet, transport) else { return };
    let response = Message::from_vec(&bytes).expect("a response that decodes");
    assert_eq!(response.metadata.message_type, MessageType::Response);
    assert_eq!(response.metadata.id, u16::from_be_bytes([packet[0], packet[1]]), "the request's ID");
    if transport == Transport::Udp {
        assert!(bytes.len() <= usize::from(MAX_UDP_PAYLOAD), "{} bytes over UDP", bytes.len());
    }
});
