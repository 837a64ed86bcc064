//! How many heap bytes the core's model holds at a fixed size: the cluster state and the
//! node plan of S ClusterIP Services x E endpoints (one EndpointSlice each, endpoints on
//! another node), counted by a global allocator that tracks live bytes and allocations.
//!
//!     cargo run --release -p svcplane-core --example plan_memory -- [SERVICES] [ENDPOINTS]

// A counting global allocator is the one way to see live heap bytes without a profiler.
#![allow(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};

use svcplane_core::model::{
    Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, Protocol, Service, ServicePort,
};
use svcplane_core::plan::{NodeConfig, NodePlan};
use svcplane_core::state::{Change, ClusterState};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

fn report(what: &str, before: (isize, isize), after: (isize, isize), services: usize, endpoints: usize) {
    let bytes = after.0 - before.0;
    let blocks = after.1 - before.1;
    println!(
        "{what}: {:.1} MiB in {blocks} allocations ({} bytes per Service, {} per endpoint)",
        bytes as f64 / 1048576.0,
        bytes / services as isize,
        bytes / (services * endpoints) as isize
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let services: usize = args.next().map_or(10_000, |a| a.parse().expect("SERVICES is a number"));
    let endpoints: usize = args.next().map_or(10, |a| a.parse().expect("ENDPOINTS is a number"));
    println!(
        "sizes: Endpoint {} B, EndpointSlice {} B, Service {} B, ServicePortPlan {} B",
        size_of::<Endpoint>(),
        size_of::<EndpointSlice>(),
        size_of::<Service>(),
        size_of::<svcplane_core::plan::ServicePortPlan>()
    );
    let batch = || {
        let mut changes = Vec::with_capacity(services * 2);
        for s in 0..services {
            let name = NamespacedName::new("bench", format!("svc-{s}"));
            let ip = IpAddr::V4(Ipv4Addr::new(198, 19, (s / 250) as u8, (s % 250) as u8 + 1));
            changes.push(Change::ServiceUpserted(Service::cluster_ip(
                name.clone(),
                vec![ip],
                vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
            )));
            let slice = EndpointSlice {
                last_change_trigger: None,
                name: NamespacedName::new("bench", format!("svc-{s}-slice")),
                service: name,
                family: IpFamily::V4,
                ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
                endpoints: (0..endpoints)
                    .map(|e| {
                        let n = s * endpoints + e;
                        let address = IpAddr::V4(Ipv4Addr::new(198, 18, 128 + (n >> 16) as u8, (n >> 8) as u8));
                        let address = match address {
                            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) | (n as u32 & 0xff))),
                            other => other,
                        };
                        Endpoint::ready(address, Some("node2"))
                    })
                    .collect(),
            };
            changes.push(Change::SliceUpserted(slice));
        }
        changes
    };
    // One change at a time (how later changes arrive), then the whole batch at once (how
    // the sync loop takes a feed's first batch: loaded in bulk).
    let start = live();
    let mut one_by_one = ClusterState::new();
    for change in batch() {
        one_by_one.apply(change);
    }
    drop(one_by_one.take_changes());
    report("cluster state, one change at a time", start, live(), services, endpoints);
    drop(one_by_one);
    let start = live();
    let mut state = ClusterState::new();
    state.apply_all(batch());
    let changes = state.take_changes();
    drop(changes);
    let after_state = live();
    report("cluster state, loaded in bulk", start, after_state, services, endpoints);
    let config = NodeConfig {
        node_name: "node1".into(),
        node_ips: vec!["198.18.0.11".parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        ..NodeConfig::default()
    };
    let plan = NodePlan::build(&state, config);
    let after_plan = live();
    report("node plan", after_state, after_plan, services, endpoints);
    println!("service ports planned: {}", plan.service_ports.len());
    let mut endpoint_bytes = 0usize;
    let mut shared_lists = 0usize;
    let mut routes = 0usize;
    for port in plan.service_ports.values() {
        // A list shared by two fields (serving = cluster, the usual case) is counted once.
        let lists = [&port.cluster_endpoints, &port.local_endpoints, &port.serving_endpoints];
        for (i, list) in lists.iter().enumerate() {
            if lists[..i].iter().any(|earlier| std::sync::Arc::ptr_eq(earlier, list)) {
                shared_lists += 1;
                continue;
            }
            endpoint_bytes += list.len() * size_of::<std::net::SocketAddr>();
        }
        for frontend in &port.frontends {
            routes += frontend.routes.len();
        }
    }
    println!(
        "endpoint lists: {:.1} MiB ({shared_lists} lists shared with another field of their port); {routes} routes",
        endpoint_bytes as f64 / 1048576.0,
    );
    drop(plan);
    drop(state);
}
