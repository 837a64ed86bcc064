//! The network words every svcplane crate shares: [`IpFamily`], [`Protocol`], and in
//! [`trace`] the one packet / outcome vocabulary every packet tracer (over the nftables and
//! the iptables fakes) speaks.
//!
//! A leaf: it imports nothing, so the decision core, the kernel mechanisms, the DNS server
//! and the tests can all speak of "IPv6" and "UDP" with one type instead of one each. It
//! holds no Kubernetes object, no policy and no I/O.

pub mod trace;

use std::fmt;
use std::net::IpAddr;

/// Transport protocols a Service port may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// Lower-case name as nftables, iptables and conntrack spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn from_kubernetes(value: &str) -> Option<Self> {
        match value {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Parses the lower-case name or the protocol number, as iptables and nft print them
    /// (`tcp` or `6`).
    pub fn from_name(name: &str) -> Option<Self> {
        Protocol::ALL.into_iter().find(|p| name == p.as_str() || name.parse() == Ok(p.number()))
    }

    /// The Kubernetes spelling (`TCP`, `UDP`, `SCTP`).
    pub fn kubernetes_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The IP protocol number (`IPPROTO_*`).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IP family of an address or a rule set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(addr: &IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn is_v6(self) -> bool {
        self == IpFamily::V6
    }

    /// `ipv4` / `ipv6`, as conntrack and most tools name the family.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        }
    }

    /// `IPv4` / `IPv6`: the Kubernetes spelling (`spec.ipFamilies`, `addressType`).
    pub fn kubernetes_name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// Parses the Kubernetes spelling; anything else is `None`.
    pub fn from_kubernetes(value: &str) -> Option<Self> {
        IpFamily::BOTH.into_iter().find(|family| family.kubernetes_name() == value)
    }

    /// The other family.
    pub fn other(self) -> Self {
        match self {
            IpFamily::V4 => IpFamily::V6,
            IpFamily::V6 => IpFamily::V4,
        }
    }
}

impl fmt::Display for IpFamily {
    /// The Kubernetes spelling, `IPv4` / `IPv6`, as people read it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kubernetes_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_read_and_write_the_kubernetes_spelling() {
        for protocol in Protocol::ALL {
            assert_eq!(Protocol::from_kubernetes(protocol.kubernetes_name()), Some(protocol));
        }
        assert_eq!(Protocol::from_kubernetes("tcp"), None);
    }

    #[test]
    fn protocols_read_their_tool_name_or_number() {
        assert_eq!(Protocol::from_name("sctp"), Some(Protocol::Sctp));
        assert_eq!(Protocol::from_name("17"), Some(Protocol::Udp));
        assert_eq!(Protocol::from_name("icmp"), None);
    }

    #[test]
    fn families_read_and_write_the_kubernetes_spelling() {
        for family in IpFamily::BOTH {
            assert_eq!(IpFamily::from_kubernetes(family.kubernetes_name()), Some(family));
            assert_eq!(family.other().other(), family);
        }
        assert_eq!(IpFamily::from_kubernetes("ipv4"), None);
    }

    #[test]
    fn an_address_knows_its_family() {
        assert_eq!(IpFamily::of(&"198.18.0.1".parse().unwrap()), IpFamily::V4);
        assert_eq!(IpFamily::of(&"2001:db8::1".parse().unwrap()), IpFamily::V6);
    }
}
