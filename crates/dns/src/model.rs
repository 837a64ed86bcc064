//! The zone's input: the core's discovery model ([`svcplane_core::discovery`]), re-exported
//! so the zone and its callers name one set of types. The zone still copes with anything it
//! is given: what it cannot represent it leaves out.

pub use svcplane_core::discovery::{ClusterView, DnsEndpoint, DnsPort, DnsService, EndpointSet, ServiceKind};
pub use svcplane_net::Protocol;

/// The protocol an SRV label names, without its underscore, in any case (`tcp`, `UDP`).
pub fn protocol_from_srv_label(label: &str) -> Option<Protocol> {
    Protocol::ALL.into_iter().find(|p| label.eq_ignore_ascii_case(p.as_str()))
}
