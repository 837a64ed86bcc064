//! How many heap bytes the nftables backend keeps after a full sync of S ClusterIP
//! Services x E endpoints (one EndpointSlice each, endpoints on another node): its record
//! of what it wrote, what partial syncs diff against. The transaction goes to an
//! `Nftables` that discards it (no kernel), under a global allocator that counts live
//! bytes, so the figure is the backend's own and the same on any machine.
//!
//!     cargo run --release -p svcplane-backend-nftables --example record_memory -- [SERVICES] [ENDPOINTS]

// A counting global allocator is the one way to see live heap bytes without a profiler.
#![allow(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use svcplane_backend_nftables::NftablesBackend;
use svcplane_core::model::{
    Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, Protocol, Service, ServicePort,
};
use svcplane_core::plan::{NodeConfig, NodePlan, PlanDiff};
use svcplane_core::state::{Change, ClusterState};
use svcplane_nft::{Family, NftError, Nftables, TableName, Transaction};

#[path = "../../core/examples/support/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::live;

/// Accepts every transaction and keeps nothing: what is left on the heap is the backend's.
#[derive(Debug, Default)]
struct Discard {
    operations: usize,
}

impl Nftables for Discard {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        self.operations += transaction.operations.len();
        Ok(())
    }

    fn delete_table(&mut self, _table: &TableName) -> Result<bool, NftError> {
        Ok(false)
    }

    fn count_rules(&mut self, _table: &TableName, _chain: &str) -> Result<usize, NftError> {
        Ok(1)
    }

    fn list_tables(&mut self, _family: Family) -> Result<Vec<String>, NftError> {
        Ok(Vec::new())
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let services: usize = args.next().map_or(10_000, |a| a.parse().expect("SERVICES is a number"));
    let endpoints: usize = args.next().map_or(10, |a| a.parse().expect("ENDPOINTS is a number"));
    let mut changes = Vec::with_capacity(services * 2);
    for s in 0..services {
        let name = NamespacedName::new("bench", format!("svc-{s}"));
        let ip = IpAddr::V4(Ipv4Addr::new(198, 19, (s / 250) as u8, (s % 250) as u8 + 1));
        changes.push(Change::ServiceUpserted(Service::cluster_ip(
            name.clone(),
            vec![ip],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        )));
        changes.push(Change::SliceUpserted(EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("bench", format!("svc-{s}-slice")),
            service: name,
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: (0..endpoints)
                .map(|e| {
                    let n = (s * endpoints + e) as u32;
                    Endpoint::ready(
                        IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + n)),
                        Some("node2"),
                    )
                })
                .collect(),
        }));
    }
    let mut state = ClusterState::new();
    state.apply_all(changes);
    let config = NodeConfig {
        node_name: "node1".into(),
        node_ips: vec!["198.18.0.11".parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        ..NodeConfig::default()
    };
    let mut plan = NodePlan::new(config);
    let changes = state.take_changes();
    let diff: PlanDiff = plan.update(&state, &changes);
    let before = live();
    let mut backend = NftablesBackend::with_families(Discard::default(), vec![IpFamily::V4]);
    let started = Instant::now();
    let report = backend.sync(&plan, &diff).expect("a full sync into a discarding nftables");
    let elapsed = started.elapsed();
    let after = live();
    let bytes = after.0 - before.0;
    println!("full sync of {} service ports ({} operations) in {elapsed:?}", report.service_ports, report.operations);
    println!(
        "backend kept: {:.1} MiB in {} allocations ({} bytes per service port, {} per endpoint)",
        bytes as f64 / 1048576.0,
        after.1 - before.1,
        bytes / services as isize,
        bytes / (services * endpoints) as isize
    );
    drop(backend);
    drop(plan);
    drop(state);
}
