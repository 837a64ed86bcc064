//! Errors: one enum for what goes wrong with an object ([`ControllerError`]), one for a bad
//! allocator configuration ([`ConfigError`]) and one for a bad saved record ([`RecordError`]).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::{IpFamily, NodePortRange, ObjectKey};

/// A problem with one object. The object is left out of the result; the others go on.
///
/// Displays as `Service default/web: spec.clusterIP: 10.0.0.5 is outside the service CIDRs
/// 198.19.0.0/16`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControllerError {
    /// Validating or allocating a Service's cluster IPs or node ports failed.
    #[error("Service {service}: {field}: {reason}")]
    AllocateService { service: ObjectKey, field: String, reason: Box<Reason> },
    /// Planning a Service's EndpointSlices failed.
    #[error("Service {service}: {field}: {reason}")]
    PlanSlices { service: ObjectKey, field: String, reason: Box<Reason> },
}

impl ControllerError {
    /// The Service the error is about.
    pub fn service(&self) -> &ObjectKey {
        match self {
            ControllerError::AllocateService { service, .. } | ControllerError::PlanSlices { service, .. } => service,
        }
    }

    /// The field path, e.g. `spec.ports[1].nodePort`.
    pub fn field(&self) -> &str {
        match self {
            ControllerError::AllocateService { field, .. } | ControllerError::PlanSlices { field, .. } => field,
        }
    }

    /// Why the field was refused.
    pub fn reason(&self) -> &Reason {
        match self {
            ControllerError::AllocateService { reason, .. } | ControllerError::PlanSlices { reason, .. } => reason,
        }
    }
}

/// Why a field was refused. The display text completes `<object>: <field>: `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The field must be set (e.g. `metadata.name`).
    Missing,
    /// Another object in the input has the same `namespace/name`.
    DuplicateObject,
    /// Another port of the same Service has this name.
    DuplicatePortName { name: String },
    /// A value that should be an IP address is not.
    InvalidIp { value: String },
    /// An explicit cluster IP lies in no configured service CIDR.
    OutsideServiceCidrs { ip: IpAddr, cidrs: Vec<IpNet> },
    /// An explicit cluster IP is the network or broadcast address of its CIDR.
    UnusableAddress { ip: IpAddr, cidr: IpNet, what: &'static str },
    /// The cluster IP is already held by another Service.
    ClusterIpTaken { ip: IpAddr, holder: ObjectKey },
    /// An explicit node port is outside the configured range.
    NodePortOutOfRange { port: i32, range: NodePortRange },
    /// The node port and protocol are already held by another Service (or another port of
    /// this one: then `holder` is this Service).
    NodePortTaken { port: u16, protocol: &'static str, holder: ObjectKey },
    /// Every address of the CIDR is in use.
    ClusterIpsExhausted { cidr: IpNet },
    /// Every node port of the range is in use.
    NodePortsExhausted { range: NodePortRange },
    /// A field holds a value this implementation does not know.
    Unsupported { value: String, expected: &'static str },
    /// The family is asked for but no service CIDR of that family is configured.
    FamilyNotConfigured { family: IpFamily, cidrs: Vec<IpNet> },
    /// A family is listed twice, or two cluster IPs are of one family.
    DuplicateFamily { family: IpFamily },
    /// More than two entries in a list that holds at most one per family.
    TooMany { count: usize },
    /// `clusterIPs[i]` does not agree with another field.
    Inconsistent { detail: String },
    /// `clusterIP: None` combined with a type that needs a cluster IP.
    HeadlessWithType { type_: String },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Missing => f.write_str("is required"),
            Reason::DuplicateObject => f.write_str("another object of the input has the same namespace/name"),
            Reason::DuplicatePortName { name } => write!(f, "port name {name:?} is used by another port too"),
            Reason::InvalidIp { value } => write!(f, "{value:?} is not an IP address"),
            Reason::OutsideServiceCidrs { ip, cidrs } => {
                write!(f, "{ip} is outside the service CIDRs {}", join(cidrs))
            }
            Reason::UnusableAddress { ip, cidr, what } => write!(f, "{ip} is the {what} of {cidr}"),
            Reason::ClusterIpTaken { ip, holder } => write!(f, "{ip} is already allocated to Service {holder}"),
            Reason::NodePortOutOfRange { port, range } => write!(f, "{port} is outside the node port range {range}"),
            Reason::NodePortTaken { port, protocol, holder } => {
                write!(f, "{port}/{protocol} is already allocated to Service {holder}")
            }
            Reason::ClusterIpsExhausted { cidr } => write!(f, "no free address left in {cidr}"),
            Reason::NodePortsExhausted { range } => write!(f, "no free node port left in {range}"),
            Reason::Unsupported { value, expected } => write!(f, "unsupported value {value:?}, expected {expected}"),
            Reason::FamilyNotConfigured { family, cidrs } => {
                write!(f, "{family} is not configured, the service CIDRs are {}", join(cidrs))
            }
            Reason::DuplicateFamily { family } => write!(f, "{family} is given twice"),
            Reason::TooMany { count } => write!(f, "{count} entries, at most 2 (one per IP family) are allowed"),
            Reason::Inconsistent { detail } => f.write_str(detail),
            Reason::HeadlessWithType { type_ } => {
                write!(f, "None (headless) is only valid for type ClusterIP, not {type_}")
            }
        }
    }
}

fn join(cidrs: &[IpNet]) -> String {
    cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The allocator's configuration cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no service CIDR configured")]
    NoServiceCidr,
    #[error("{count} service CIDRs configured, at most 2 (one per IP family) are allowed")]
    TooManyServiceCidrs { count: usize },
    #[error("service CIDRs {first} and {second} are of the same IP family")]
    SameFamilyTwice { first: IpNet, second: IpNet },
    #[error("service CIDR {cidr} has host bits set, the network is {network}")]
    HostBitsSet { cidr: IpNet, network: IpNet },
    #[error("service CIDR {cidr} is too small to allocate from")]
    CidrTooSmall { cidr: IpNet },
    #[error("node port range {value:?} is invalid: {reason}")]
    InvalidNodePortRange { value: String, reason: &'static str },
}

/// A saved [`AllocationRecord`](crate::AllocationRecord) cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("allocation record is not valid JSON of the expected shape: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("allocation record has version {found}, this build reads version {expected}")]
    Version { found: u32, expected: u32 },
}
