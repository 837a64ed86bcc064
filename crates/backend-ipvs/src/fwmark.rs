//! Firewall-mark virtual services: one frontend, two endpoint sets.
//!
//! IPVS picks a virtual service by the packet's destination alone, so one (address,
//! protocol, port) service has one set of real servers. The plan can say more: under
//! `externalTrafficPolicy: Local` an external IP, load-balancer IP or NodePort sends
//! external sources to this node's endpoints (the catch-all route) but pods and the node
//! itself to every endpoint (earlier routes). Such a frontend keeps its address service
//! with the catch-all route's set, and gets a mark ([`marks`]): the nat table marks the
//! packets whose source takes a route to the other set (first matching route decides, as
//! the plan's order says), and a firewall-mark service of that mark has the other set.
//! IPVS looks up a packet's mark before its destination, so the marked packets take the
//! mark's service; IPVS needs the mark on a connection's first packet only (later ones
//! match its connection table), which is the one the nat table sees.
//!
//! A mark is `slot << 16` with the slot in 1..=4095, chosen per family from a stable hash
//! of the frontend (collisions take the next free slot, in the frontends' order), inside
//! [`MARK_MASK`]; the nat rule sets only those bits. Masqueraded packets also carry
//! kube-proxy's `0x4000` when IPVS sees them, and IPVS compares the whole mark: each mark
//! has a service for both values, so the masquerade decision stays the nat table's alone.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use svcplane_core::Protocol;
use svcplane_core::{Destination as PlanDestination, EndpointSetKind, Frontend, IpFamily, NodePlan, ServicePortPlan};

/// The bits of the packet mark the nat rules set for firewall-mark services.
pub const MARK_MASK: u32 = 0x0FFF_0000;
const SHIFT: u32 = 16;
const SLOTS: u64 = 0xFFF;

/// One frontend address that needs a mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MarkedFrontend {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

/// What a marked frontend's mark stands for: the mark and the endpoint set its service
/// balances to (the one the catch-all route does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub mark: u32,
    pub endpoints: EndpointSetKind,
}

/// The endpoint set of the route that takes any source (the last route otherwise).
pub fn catch_all_set(frontend: &Frontend) -> Option<EndpointSetKind> {
    let routes = &frontend.routes;
    routes
        .iter()
        .find(|route| route.sources == svcplane_core::SourceMatch::Any)
        .or_else(|| routes.last())
        .map(|route| route.endpoints)
}

/// The other endpoint set some of `frontend`'s routes send to, when it has endpoints and
/// they are not the catch-all set's.
pub fn other_set(port: &ServicePortPlan, frontend: &Frontend) -> Option<EndpointSetKind> {
    let catch_all = catch_all_set(frontend)?;
    frontend
        .routes
        .iter()
        .map(|route| route.endpoints)
        .find(|set| *set != catch_all)
        .filter(|set| !port.endpoints(*set).is_empty() && port.endpoints(*set) != port.endpoints(catch_all))
}

/// Whether `mark` is one this mode programs (with or without the masquerade bit).
pub fn is_ours(mark: u32, masquerade_mark: u32) -> bool {
    mark & MARK_MASK != 0 && mark & !(MARK_MASK | masquerade_mark) == 0
}

/// The marks of `family`'s frontends that need one; NodePorts listen on
/// `node_port_addresses`. The same plan and addresses give the same marks.
pub fn marks(plan: &NodePlan, family: IpFamily, node_port_addresses: &[IpAddr]) -> BTreeMap<MarkedFrontend, Mark> {
    let mut wanted: BTreeMap<MarkedFrontend, EndpointSetKind> = BTreeMap::new();
    for port in plan.service_ports.values().filter(|port| port.family == family) {
        for frontend in &port.frontends {
            let Some(set) = other_set(port, frontend) else { continue };
            let addresses = match frontend.destination {
                PlanDestination::Address(address) => vec![address],
                PlanDestination::NodePortAddresses => node_port_addresses.to_vec(),
            };
            for address in addresses.into_iter().filter(|address| IpFamily::of(address) == family) {
                wanted.insert(MarkedFrontend { address, protocol: port.protocol, port: frontend.port }, set);
            }
        }
    }
    let mut used = BTreeSet::new();
    let mut marks = BTreeMap::new();
    for (frontend, endpoints) in wanted {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        frontend.hash(&mut hasher);
        let start = hasher.finish() % SLOTS;
        // More marked frontends than slots: the rest keep one set (the catch-all's).
        let Some(slot) = (0..SLOTS).map(|step| (start + step) % SLOTS + 1).find(|slot| !used.contains(slot)) else {
            break;
        };
        used.insert(slot);
        let mark = u32::try_from(slot).expect("a slot fits 12 bits") << SHIFT;
        marks.insert(frontend, Mark { mark, endpoints });
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_marks_are_the_masked_bits_with_or_without_the_masquerade_bit() {
        assert!(is_ours(0x0001_0000, 0x4000));
        assert!(is_ours(0x0FFF_4000, 0x4000));
        assert!(!is_ours(0x4000, 0x4000), "the masquerade bit alone");
        assert!(!is_ours(0x1001_0000, 0x4000), "a bit outside the mask");
        assert!(!is_ours(0x0001_0001, 0x4000));
    }
}
