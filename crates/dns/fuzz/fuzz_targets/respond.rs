//! Fuzzes the whole query path on bytes: header and message parsing, the answering
//! function over a zone with every kind of Service, and encoding (with UDP truncation).
//! Every packet must either be dropped or get an answer that parses, carries the request's
//! id, and fits the transport.

#![no_main]

use std::net::IpAddr;
use std::sync::{Arc, LazyLock};

use libfuzzer_sys::fuzz_target;
use svcplane_dns::hickory_proto::op::Message;
use svcplane_dns::{
    ClusterView, DnsEndpoint, DnsPort, DnsService, EndpointSet, Protocol, ServiceKind, Transport, WireOutcome, Zone,
    ZoneConfig, respond_to_wire,
};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

static ZONE: LazyLock<Zone> = LazyLock::new(|| {
    let http = vec![DnsPort { name: "http".into(), protocol: Protocol::Tcp, port: 80 }];
    let service = |name: &str, kind: ServiceKind| DnsService {
        namespace: "default".into(),
        name: name.into(),
        kind,
        ports: http.clone(),
    };
    let endpoints = (1..=40)
        .map(|i| DnsEndpoint {
            ip: ip(&format!("10.244.0.{i}")),
            hostname: (i % 2 == 0).then(|| format!("pod-{i}")),
            ready: i % 5 != 0,
            node_name: None,
        })
        .collect();
    let view = ClusterView {
        namespaces: vec!["default".into(), "kube-system".into()],
        services: vec![
            service("web", ServiceKind::ClusterIp { ips: vec![ip("10.96.0.10"), ip("fd00::10")] }),
            service(
                "db",
                ServiceKind::Headless {
                    endpoints: vec![EndpointSet { ports: http.clone(), endpoints }],
                    publish_not_ready_addresses: false,
                },
            ),
            service("ext", ServiceKind::ExternalName { target: "foo.example.com".into() }),
            service("alias", ServiceKind::ExternalName { target: "web.default.svc.cluster.local".into() }),
            service("loop", ServiceKind::ExternalName { target: "loop.default.svc.cluster.local".into() }),
        ],
    };
    let config = ZoneConfig::new("cluster.local").unwrap().with_forwarding(true);
    Zone::build(Arc::new(config), &view, 1)
});

fuzz_target!(|data: &[u8]| {
    for (transport, limit) in [(Transport::Udp, 4096), (Transport::Tcp, 65_535)] {
        if let WireOutcome::Send(reply) = respond_to_wire(&ZONE, data, transport) {
            assert!(reply.len() <= limit);
            let message = Message::from_vec(&reply).expect("every answer parses");
            assert_eq!(message.metadata.id, u16::from_be_bytes([data[0], data[1]]));
        }
    }
});
