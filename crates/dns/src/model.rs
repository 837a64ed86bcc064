//! The zone's input: what cluster DNS needs to know about Services, as plain values.
//!
//! Nothing here knows Kubernetes object types; `svcplane-source` converts Services and
//! EndpointSlices into these (and validates them on the way), so the zone can trust that
//! names are DNS labels. The zone still copes with anything it is given: what it cannot
//! represent it leaves out.

use std::fmt;
use std::net::IpAddr;

/// A transport protocol of a Service port, as named in SRV records (`_tcp`, `_udp`, `_sctp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The SRV label without its underscore: `tcp`, `udp`, `sctp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The protocol an SRV label names, without its underscore, in any case.
    pub fn from_label(label: &str) -> Option<Self> {
        [Protocol::Tcp, Protocol::Udp, Protocol::Sctp].into_iter().find(|p| label.eq_ignore_ascii_case(p.as_str()))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A port of a Service or of an endpoint set. Only named ports get SRV records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DnsPort {
    /// Empty for the single unnamed port a Service may have.
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// One address of a headless Service's backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsEndpoint {
    pub ip: IpAddr,
    /// The endpoint's DNS label when set (`EndpointSlice.endpoints[].hostname`); otherwise the
    /// endpoint is named by its dashed address (`10-0-0-5`).
    pub hostname: Option<String>,
    /// `conditions.ready` (absent counts as ready).
    pub ready: bool,
    /// Kept for the day answers prefer nearby endpoints; not used for answers today.
    pub node_name: Option<String>,
}

/// Endpoints sharing one port list: what one EndpointSlice holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointSet {
    /// The ports of these endpoints (for headless SRV records: the endpoint's port number).
    pub ports: Vec<DnsPort>,
    pub endpoints: Vec<DnsEndpoint>,
}

/// What a Service's name resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceKind {
    /// A virtual IP per family (`spec.clusterIPs`).
    ClusterIp { ips: Vec<IpAddr> },
    /// `clusterIP: None`: the name resolves to the ready endpoints themselves.
    Headless {
        endpoints: Vec<EndpointSet>,
        /// `spec.publishNotReadyAddresses`: not-ready endpoints are published too.
        publish_not_ready_addresses: bool,
    },
    /// `type: ExternalName`: a CNAME to `target` (a domain name, without trailing dot or with).
    ExternalName { target: String },
}

/// One Service as cluster DNS sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsService {
    pub namespace: String,
    pub name: String,
    pub kind: ServiceKind,
    /// `spec.ports`: SRV records of ClusterIP Services, and the port names of headless ones.
    pub ports: Vec<DnsPort>,
}

/// Everything the zone is built from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterView {
    /// The namespaces that exist: `<ns>.svc.<zone>` answers NODATA rather than NXDOMAIN, and
    /// `pods insecure` records are answered only in these.
    pub namespaces: Vec<String>,
    pub services: Vec<DnsService>,
}
