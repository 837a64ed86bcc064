//! One runner for the scenario table over any mode's fake kernel: no root, no lab.
//!
//! The fixture's manifests (the very text the real-kernel lab's proxies read) go through
//! the library pipeline a proxy runs: `load_directory` -> controller `reconcile` ->
//! `convert_objects` + `SnapshotDiffer` -> `ClusterState` -> `NodePlan` per node -> the
//! mode's [`Dataplane`] over its fake (full sync first, partial syncs after each change).
//! Each row's first packet is then walked through the rules of the node that handles it by
//! the mode's tracer (and on through the other node when it is forwarded there). The tracers
//! explore every random branch, so "reaches every endpoint" is exact here; a rule a tracer
//! cannot follow fails the row.
//!
//! What only the real kernel can show (time: affinity expiry; conntrack state: established
//! flows; the health-check HTTP server) is checked here as far as the plan and rules decide
//! it, and the rest is named in the output as left to the real-kernel suites.
//!
//! A mode takes part by implementing [`FakeMode`]: how to make its dataplane over a fake,
//! how to dump what it wrote, and how to trace a packet through it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use svcplane_controller::{Allocator, AllocatorConfig};
use svcplane_core::conntrack::{FlowDestination, StaleUdpFlows, stale_udp_flows};
use svcplane_core::{ClusterState, Dataplane, HealthCheck, IpFamily, NamespacedName, NodeConfig, NodePlan, PlanDiff};
use svcplane_net::trace::{Disposition, Host, Origin, Outcome as TraceOutcome, Packet};
use svcplane_source::{ClusterObjects, SnapshotDiffer, convert_objects, load_directory};

use super::manifests::{self, OTHER_NODE, THIS_NODE};
use super::real::{Resolved, mentions_address, mentions_service, resolve};
use super::{Family, Frontend, NodePortAddresses, Outcome, Scenario, Sender, SourceSeen};

/// A mode's dataplane over its in-memory fake kernel, and its tracer.
pub trait FakeMode {
    type Backend: Dataplane;
    /// How failures name the fake ("the nftables fake").
    const KERNEL: &'static str;
    fn backend() -> Self::Backend;
    /// Everything the backend wrote, as the mode's own listing (for "not programmed" rows).
    fn dump(backend: &Self::Backend) -> String;
    /// Every end `packet` can have on a host with `host`'s addresses.
    fn trace(
        backend: &Self::Backend,
        host: &Host,
        origin: Origin,
        packet: Packet,
    ) -> Result<BTreeSet<TraceOutcome>, String>;
}

/// The source port of every traced packet.
const SOURCE_PORT: u16 = 40000;

/// One node: its plan, its fake kernel, and the stale-flow cleanups its last update asked for.
struct FakeNode<M: FakeMode> {
    index: u16,
    plan: NodePlan,
    backend: M::Backend,
    cleanups: Vec<StaleUdpFlows>,
}

impl<M: FakeMode> FakeNode<M> {
    fn host(&self) -> Host {
        Host { local_addresses: manifests::node_addresses(self.index) }
    }
}

/// The fixture's cluster in fake kernels, one per node, fed as the proxies are.
struct FakeCluster<M: FakeMode> {
    dir: TempDir,
    allocator: Allocator,
    differ: SnapshotDiffer,
    state: ClusterState,
    nodes: Vec<FakeNode<M>>,
}

fn node_config(node: u16, addresses: NodePortAddresses) -> NodeConfig {
    let node_port_addresses = match addresses {
        NodePortAddresses::Default => svcplane_core::NodePortAddresses::AllLocal,
        NodePortAddresses::Primary => svcplane_core::NodePortAddresses::Primary,
        NodePortAddresses::SecondaryOnly => svcplane_core::NodePortAddresses::Cidrs(
            [Family::V4, Family::V6].map(|family| manifests::node_secondary_ip(node, family).into()).to_vec(),
        ),
    };
    NodeConfig {
        node_name: manifests::node_name(node),
        node_ips: vec![manifests::node_ip(node, Family::V4), manifests::node_ip(node, Family::V6)],
        cluster_cidrs: vec![manifests::CLUSTER_CIDR_V4.parse().unwrap(), manifests::CLUSTER_CIDR_V6.parse().unwrap()],
        node_port_addresses,
    }
}

impl<M: FakeMode> FakeCluster<M> {
    fn start(addresses: NodePortAddresses) -> Self {
        let dir = TempDir::new();
        for (file, text) in manifests::initial_files() {
            std::fs::write(dir.path().join(file), text).expect("writing a manifest");
        }
        let config = AllocatorConfig {
            service_cidrs: vec![
                manifests::SERVICE_CIDR_V4.parse().unwrap(),
                manifests::SERVICE_CIDR_V6.parse().unwrap(),
            ],
            node_port_range: "30000-32767".parse().unwrap(),
        };
        let mut cluster = Self {
            dir,
            allocator: Allocator::new(config).expect("allocator"),
            differ: SnapshotDiffer::new(),
            state: ClusterState::new(),
            nodes: Vec::new(),
        };
        cluster.ingest();
        cluster.state.take_changes();
        for node in [THIS_NODE, OTHER_NODE] {
            let plan = NodePlan::build(&cluster.state, node_config(node, addresses));
            let mut backend = M::backend();
            backend.sync(&plan, &PlanDiff::default()).expect("a full sync into the fake applies");
            cluster.nodes.push(FakeNode { index: node, plan, backend, cleanups: Vec::new() });
        }
        cluster
    }

    /// Reads the directory as the proxy's pipeline does. Any problem with the fixture's
    /// manifests fails the test: rows must not pass because an object was left out.
    fn ingest(&mut self) {
        let loaded = load_directory(self.dir.path());
        assert!(loaded.errors.is_empty(), "the fixture's manifests do not load: {:?}", loaded.errors);
        let reconciled = svcplane_controller::reconcile(&loaded.objects, &mut self.allocator);
        assert!(reconciled.errors.is_empty(), "the controller refuses the fixture: {:?}", reconciled.errors);
        let converted = convert_objects(
            &ClusterObjects {
                services: reconciled.services,
                pods: Vec::new(),
                nodes: loaded.objects.nodes,
                slices: reconciled.slices,
                pools: Vec::new(),
            },
            &loaded.origins,
        );
        assert!(converted.errors.is_empty(), "the fixture does not convert: {:?}", converted.errors);
        for change in self.differ.diff(converted.services, converted.slices, converted.nodes) {
            self.state.apply(change);
        }
    }

    /// Rewrites a file and runs one sync on every node, as the proxy loop does.
    fn change(&mut self, file: &str, text: &str) {
        std::fs::write(self.dir.path().join(file), text).expect("writing a manifest");
        self.ingest();
        let changes = self.state.take_changes();
        for node in &mut self.nodes {
            let changed = node.plan.update(&self.state, &changes);
            node.cleanups = stale_udp_flows(&node.plan, &changed);
            node.backend.sync(&node.plan, &changed).expect("a partial sync into the fake applies");
        }
    }

    fn node(&self, index: u16) -> &FakeNode<M> {
        self.nodes.iter().find(|node| node.index == index).expect("two nodes")
    }
}

/// One end of a traced packet's path, after every node it crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct End {
    disposition: Disposition,
    destination: SocketAddr,
    masqueraded: bool,
    /// The node whose rules ended it.
    node: u16,
}

/// Which node owns `address`: a pod's node or a node's own address.
fn node_of(address: IpAddr) -> Option<u16> {
    if let Some(pod) = manifests::pod_at(address) {
        return Some(manifests::lab_pod(pod).node);
    }
    [THIS_NODE, OTHER_NODE].into_iter().find(|node| manifests::node_addresses(*node).contains(&address))
}

impl<M: FakeMode> FakeCluster<M> {
    /// Every end `packet` can have, entering at `node`; packets forwarded to the other node
    /// (to one of its pods or addresses) are followed there.
    fn walk(&self, node: u16, origin: Origin, packet: Packet, hops: usize) -> Result<Vec<End>, String> {
        let fake_node = self.node(node);
        let outcomes = M::trace(&fake_node.backend, &fake_node.host(), origin, packet)
            .map_err(|error| format!("the tracer cannot follow node{node}'s rules: {error}"))?;
        let mut ends = Vec::new();
        for outcome in outcomes {
            let destination = SocketAddr::new(outcome.destination, outcome.destination_port);
            let next = node_of(outcome.destination).filter(|next| *next != node);
            match next {
                Some(next) if outcome.disposition == Disposition::Forwarded => {
                    if hops >= 3 {
                        return Err(format!("the packet loops between nodes: {packet:?}"));
                    }
                    let source = if outcome.masqueraded {
                        let family = if packet.source.is_ipv4() { Family::V4 } else { Family::V6 };
                        manifests::node_ip(node, family)
                    } else {
                        packet.source
                    };
                    let forwarded = Packet {
                        source,
                        destination: outcome.destination,
                        destination_port: outcome.destination_port,
                        mark: 0,
                        ..packet
                    };
                    for end in self.walk(next, Origin::Network, forwarded, hops + 1)? {
                        ends.push(End { masqueraded: end.masqueraded || outcome.masqueraded, ..end });
                    }
                }
                _ => ends.push(End {
                    disposition: outcome.disposition,
                    destination,
                    masqueraded: outcome.masqueraded,
                    node,
                }),
            }
        }
        Ok(ends)
    }

    /// Every end of the row's first packet.
    fn ends(&self, row: &Scenario, resolved: &Resolved) -> Result<Vec<End>, String> {
        let target = resolved.target.expect("rows that send have a target");
        let origin = if row.from == Sender::ThisNode { Origin::LocalProcess } else { Origin::Network };
        // A process on the node talking to loopback sends from loopback.
        let source = if target.ip().is_loopback() { target.ip() } else { resolved.client_ip };
        let packet = Packet {
            source,
            destination: target.ip(),
            protocol: row.protocol.number(),
            source_port: SOURCE_PORT,
            destination_port: target.port(),
            mark: 0,
        };
        self.walk(resolved.entry_node, origin, packet, 0)
    }
}

fn describe(ends: &[End]) -> String {
    let parts: Vec<String> = ends
        .iter()
        .map(|end| {
            let who = manifests::pod_at(end.destination.ip()).map(|pod| format!(" ({pod})")).unwrap_or_default();
            let masq = if end.masqueraded { ", masqueraded" } else { "" };
            format!("{:?} {}{who}{masq} at node{}", end.disposition, end.destination, end.node)
        })
        .collect();
    format!("[{}]", parts.join("; "))
}

/// The row's Answered check on traced ends: every end forwarded to one of `by`, each of them
/// reached, and the source each sees as the row says.
fn check_answered(
    row: &Scenario,
    resolved: &Resolved,
    ends: &[End],
    by: &[&str],
    source: SourceSeen,
) -> Result<String, String> {
    if ends.is_empty() {
        return Err("the tracer found no path at all".to_owned());
    }
    let mut reached = BTreeSet::new();
    for end in ends {
        let pod = manifests::pod_at(end.destination.ip()).filter(|pod| by.contains(pod));
        let Some(pod) =
            pod.filter(|_| end.disposition == Disposition::Forwarded && end.destination.port() == resolved.target_port)
        else {
            return Err(format!("a path ends elsewhere than at {by:?}:{}: {}", resolved.target_port, describe(ends)));
        };
        reached.insert(pod);
        let hairpin = resolved.sender_pod == Some(pod);
        let expected = if hairpin { SourceSeen::NodeAddress } else { source };
        let ok = match expected {
            SourceSeen::ClientAddress => !end.masqueraded,
            SourceSeen::NodeAddress => end.masqueraded || row.from == Sender::ThisNode,
            SourceSeen::Any => true,
        };
        if !ok {
            let hairpin = if hairpin { " (hairpin)" } else { "" };
            return Err(format!(
                "{pod} would see the wrong source: expected {expected:?}{hairpin}: {}",
                describe(ends)
            ));
        }
    }
    let missing: Vec<&&str> = by.iter().filter(|pod| !reached.contains(*pod)).collect();
    if !missing.is_empty() {
        return Err(format!("{missing:?} are never reached: {}", describe(ends)));
    }
    Ok(format!("reaches {reached:?}"))
}

fn check_all(ends: &[End], disposition: Disposition) -> Result<String, String> {
    if !ends.is_empty() && ends.iter().all(|end| end.disposition == disposition) {
        Ok(format!("{disposition:?}"))
    } else {
        Err(format!("expected every path {disposition:?}: {}", describe(ends)))
    }
}

fn check_not_served<M: FakeMode>(
    cluster: &FakeCluster<M>,
    row: &Scenario,
    resolved: &Resolved,
    whole_service: bool,
) -> Result<String, String> {
    let address_frontend = matches!(
        row.to,
        Frontend::ClusterIp | Frontend::LoadBalancerIp | Frontend::ProxyModeLoadBalancerIp | Frontend::ExternalIp
    );
    let nodes: Vec<u16> = if whole_service { vec![THIS_NODE, OTHER_NODE] } else { vec![resolved.entry_node] };
    for node in nodes {
        let dump = M::dump(&cluster.node(node).backend);
        if whole_service && mentions_service(&dump, row.service) {
            return Err(format!("node{node}'s rules name the Service default/{}", row.service));
        }
        if let Some(target) = resolved.target.filter(|_| address_frontend)
            && mentions_address(&dump, target.ip())
        {
            return Err(format!("node{node}'s rules name {}", target.ip()));
        }
    }
    let Some(target) = resolved.target else {
        return Ok("in no rule".to_owned());
    };
    let ends = cluster.ends(row, resolved)?;
    if let Some(end) = ends.iter().find(|end| end.destination != target) {
        return Err(format!("a rule translates it to {}: {}", end.destination, describe(&ends)));
    }
    Ok(format!("untranslated: {}", describe(&ends)))
}

fn endpoint_of(pod: &str, family: Family, port: u16) -> SocketAddr {
    SocketAddr::new(manifests::pod_ip(pod, family), port)
}

/// The stale-flow cleanups node `node` asked for that cover the row's frontend.
fn cleanups_for<'a, M: FakeMode>(
    cluster: &'a FakeCluster<M>,
    row: &Scenario,
    resolved: &Resolved,
) -> Vec<&'a StaleUdpFlows> {
    let target = resolved.target.expect("a target");
    let family = if row.family.is_v6() { IpFamily::V6 } else { IpFamily::V4 };
    let destination = match row.to {
        Frontend::NodePort | Frontend::NodePortOnSecondaryAddress => FlowDestination::NodePort,
        _ => FlowDestination::Address(target.ip()),
    };
    cluster
        .node(resolved.entry_node)
        .cleanups
        .iter()
        .filter(|c| c.family == family && c.destination == destination && c.port == target.port())
        .collect()
}

/// Checks one non-mutating row; `Ok` carries what was seen and, where part of the row is
/// the real kernel's alone, says so.
fn check_static<M: FakeMode>(cluster: &FakeCluster<M>, row: &Scenario) -> Result<String, String> {
    let service = manifests::service(row.service).ok_or_else(|| format!("no Service {:?}", row.service))?;
    let resolved = resolve(row, service)?;
    match row.expect {
        Outcome::Answered { by } => check_answered(row, &resolved, &cluster.ends(row, &resolved)?, by, row.source),
        Outcome::Rejected => check_all(&cluster.ends(row, &resolved)?, Disposition::Rejected),
        Outcome::Dropped => check_all(&cluster.ends(row, &resolved)?, Disposition::Dropped),
        Outcome::NotServed => check_not_served(cluster, row, &resolved, false),
        Outcome::Ignored => check_not_served(cluster, row, &resolved, true),
        Outcome::HealthCheck { local_endpoints } => {
            let port = service.health_check_node_port.expect("a health-check row's Service has a port");
            let planned = cluster.node(THIS_NODE).plan.health_checks.get(&NamespacedName::new("default", row.service));
            let expected = HealthCheck { port, local_endpoints };
            if planned != Some(&expected) {
                return Err(format!("node1 plans {planned:?}, expected {expected:?}"));
            }
            Ok(format!("planned {expected:?}; the HTTP answer is the real kernel's part"))
        }
        Outcome::StickyThenFreshAfterIdle { by } | Outcome::StickyWhileTalking { by } => {
            let first = check_answered(row, &resolved, &cluster.ends(row, &resolved)?, by, row.source)?;
            Ok(format!(
                "first pick {first}; stickiness over time is the real kernel's part (the tracer keeps no affinity memory)"
            ))
        }
        Outcome::FollowsEndpointChange { .. } | Outcome::KeepsFlowAcrossEndpointChange { .. } => {
            unreachable!("mutating rows run in groups")
        }
    }
}

/// Before the change of a mutating row.
fn check_before<M: FakeMode>(cluster: &FakeCluster<M>, row: &Scenario, resolved: &Resolved) -> Result<(), String> {
    let ends = cluster.ends(row, resolved)?;
    match row.expect {
        Outcome::FollowsEndpointChange { before: [], .. } => {
            match ends.iter().find(|end| manifests::pod_at(end.destination.ip()).is_some()) {
                Some(_) => Err(format!("a path already reaches a pod: {}", describe(&ends))),
                None => Ok(()),
            }
        }
        Outcome::FollowsEndpointChange { before, .. } => {
            check_answered(row, resolved, &ends, before, row.source).map(|_| ())
        }
        Outcome::KeepsFlowAcrossEndpointChange { pod, .. } => {
            check_answered(row, resolved, &ends, &[pod], row.source).map(|_| ())
        }
        _ => unreachable!("only mutating rows"),
    }
    .map_err(|error| format!("before the change: {error}"))
}

/// After the change of a mutating row: the new rules, and the stale-flow decision.
fn check_after<M: FakeMode>(cluster: &FakeCluster<M>, row: &Scenario, resolved: &Resolved) -> Result<String, String> {
    let ends = cluster.ends(row, resolved)?;
    let port = resolved.target_port;
    match row.expect {
        Outcome::FollowsEndpointChange { before, after } => {
            check_answered(row, resolved, &ends, after, row.source).map_err(|e| format!("after the change: {e}"))?;
            let cleanups = cleanups_for(cluster, row, resolved);
            if cleanups.is_empty() {
                return Err(format!(
                    "node{} asks for no stale-flow cleanup of this frontend: the old flow would stay",
                    resolved.entry_node
                ));
            }
            for cleanup in &cleanups {
                if let Some(kept) =
                    before.iter().find(|pod| cleanup.keep_replies_from.contains(&endpoint_of(pod, row.family, port)))
                {
                    return Err(format!(
                        "the cleanup keeps flows answered by the removed endpoint {kept}: {cleanup:?}"
                    ));
                }
            }
            Ok(format!(
                "new flows to {after:?}; stale flows removed ({} cleanup(s)); the flow itself is the real kernel's part",
                cleanups.len()
            ))
        }
        Outcome::KeepsFlowAcrossEndpointChange { pod, new_flows } => {
            check_answered(row, resolved, &ends, new_flows, row.source)
                .map_err(|e| format!("after the change: {e}"))?;
            if row.protocol == super::Protocol::Udp {
                let endpoint = endpoint_of(pod, row.family, port);
                for cleanup in cleanups_for(cluster, row, resolved) {
                    if !cleanup.keep_replies_from.contains(&endpoint) {
                        return Err(format!(
                            "node{} deletes the UDP flows of {pod}, which is terminating but still serving: \
                             cleanup {cleanup:?} keeps only {:?}",
                            resolved.entry_node, cleanup.keep_replies_from
                        ));
                    }
                }
                Ok(format!("new flows to {new_flows:?}; no cleanup removes flows to serving {pod}"))
            } else {
                Ok(format!(
                    "new connections to {new_flows:?}; the established connection is conntrack state, the real kernel's part"
                ))
            }
        }
        _ => unreachable!("only mutating rows"),
    }
}

/// Runs every row (once per family) against a fresh fake cluster of mode `M` and fails
/// once, listing every failed row.
pub fn check_rows<M: FakeMode>(addresses: NodePortAddresses, rows: &[Scenario]) {
    let mut cluster = FakeCluster::<M>::start(addresses);
    let runs: Vec<Scenario> = rows.iter().flat_map(Scenario::each_family).collect();
    let mut results: Vec<(String, Result<String, String>)> = Vec::new();
    let mut groups: BTreeMap<&str, Vec<Scenario>> = BTreeMap::new();
    for run in &runs {
        if run.expect.mutates() {
            groups.entry(run.service).or_default().push(*run);
        } else {
            results.push((run.label(), check_static(&cluster, run)));
        }
    }
    for (service, group) in groups {
        let resolved: Vec<Result<Resolved, String>> = group
            .iter()
            .map(|row| {
                let service = manifests::service(row.service).ok_or_else(|| format!("no Service {:?}", row.service))?;
                let resolved = resolve(row, service)?;
                check_before(&cluster, row, &resolved)?;
                Ok(resolved)
            })
            .collect();
        let mutation = manifests::mutation(service).unwrap_or_else(|| panic!("no endpoint change for {service}"));
        let (file, text) = mutation.change();
        cluster.change(&file, &text);
        for (row, resolved) in group.iter().zip(resolved) {
            let result = resolved.and_then(|resolved| check_after(&cluster, row, &resolved));
            results.push((row.label(), result));
        }
    }
    let mut failures = Vec::new();
    for (label, result) in &results {
        match result {
            Ok(detail) => eprintln!("ok: {label} — {detail}"),
            Err(error) => {
                eprintln!("FAILED: {label}: {error}");
                failures.push(format!("row `{label}`: {error}"));
            }
        }
    }
    if !failures.is_empty() {
        panic!(
            "{} of {} scenario runs failed against {}:\n- {}",
            failures.len(),
            results.len(),
            M::KERNEL,
            failures.join("\n- ")
        );
    }
}

/// A directory of its own per fake cluster, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let unique =
            format!("svcplane-fake-scenarios-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let path = std::env::temp_dir().join(unique);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the test's temporary directory");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
