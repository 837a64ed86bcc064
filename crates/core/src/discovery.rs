//! The discovery model: what cluster DNS needs to know about Services (ClusterIP,
//! headless with their endpoints, ExternalName), as plain values.
//!
//! The proxy's [`crate::model`] leaves headless and ExternalName Services out; DNS needs
//! them, so sources fill this second view of the same cluster. Nothing here knows
//! Kubernetes object types: sources convert and validate, so names are DNS labels.

use std::net::IpAddr;

pub use svcplane_net::Protocol;

/// Longest DNS label, in bytes.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest domain name in presentation form without the trailing dot.
pub const MAX_NAME_LEN: usize = 253;

/// An RFC 1123 label as Kubernetes accepts it for names: 1 to 63 of `a-z`, `0-9` and `-`,
/// starting and ending with a letter or digit. Upper case is accepted (DNS ignores case).
pub fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A domain name an ExternalName may point to: labels as [`is_dns_label`] (underscores are
/// allowed too, as in `_sip._tcp.example.com`), at most 253 characters, one trailing dot
/// allowed.
pub fn is_domain_name(text: &str) -> bool {
    let text = text.strip_suffix('.').unwrap_or(text);
    !text.is_empty()
        && text.len() <= MAX_NAME_LEN
        && text.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= MAX_LABEL_LEN
                && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        })
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
    /// Shared between endpoints ([`crate::model::intern`]).
    pub node_name: Option<crate::model::Name>,
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
