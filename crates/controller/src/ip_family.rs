//! IP families as Services (`spec.ipFamilies`) and EndpointSlices (`addressType`) name them.

use std::fmt;
use std::net::IpAddr;

/// An IP family. Its Kubernetes spelling (`IPv4`, `IPv6`) is used both for
/// `spec.ipFamilies` and for `EndpointSlice.addressType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    Ipv4,
    Ipv6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => IpFamily::Ipv4,
            IpAddr::V6(_) => IpFamily::Ipv6,
        }
    }

    /// `IPv4` or `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "IPv4",
            IpFamily::Ipv6 => "IPv6",
        }
    }

    /// Parses the Kubernetes spelling; anything else is `None`.
    pub fn from_kubernetes(value: &str) -> Option<Self> {
        match value {
            "IPv4" => Some(IpFamily::Ipv4),
            "IPv6" => Some(IpFamily::Ipv6),
            _ => None,
        }
    }

    /// The other family.
    pub fn other(self) -> Self {
        match self {
            IpFamily::Ipv4 => IpFamily::Ipv6,
            IpFamily::Ipv6 => IpFamily::Ipv4,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
