//! What a packet tracer over a fake kernel is asked and answers, the same for every mode,
//! so one scenario runner can drive any of them.

use std::net::IpAddr;

/// A new connection's first packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Packet {
    pub source: IpAddr,
    pub destination: IpAddr,
    /// IP protocol number (6 tcp, 17 udp, 132 sctp).
    pub protocol: u8,
    pub source_port: u16,
    pub destination_port: u16,
    pub mark: u32,
}

/// Where the packet enters the host's netfilter path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Arrives on an interface: prerouting, then input or forward, then postrouting.
    Network,
    /// Sent by a process on this host: output, then postrouting (and input if local).
    LocalProcess,
}

/// What a tracer needs to know about the host itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// Addresses of this host (`fib ... type local`, `-m addrtype LOCAL`); loopback is
    /// always local.
    pub local_addresses: Vec<IpAddr>,
}

impl Host {
    pub fn is_local(&self, address: IpAddr) -> bool {
        address.is_loopback() || self.local_addresses.contains(&address)
    }
}

/// How a traced packet ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Disposition {
    /// Delivered to a local socket.
    DeliveredLocally,
    /// Routed on towards its (possibly translated) destination.
    Forwarded,
    Dropped,
    Rejected,
}

/// One possible end of a packet's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Outcome {
    pub disposition: Disposition,
    /// Destination after any DNAT.
    pub destination: IpAddr,
    pub destination_port: u16,
    /// Whether postrouting masqueraded the source.
    pub masqueraded: bool,
}
