//! The keys and values of the BPF maps, byte for byte as `bpf/common.h` lays them out.
//!
//! Addresses are 16 bytes in network order (IPv4 as `::ffff:a.b.c.d`, so one map serves
//! both families); ports are kept in network order as the programs read them.

use std::fmt;
use std::mem::size_of;

use aya::Ebpf;
pub use aya::maps::MapError;

use crate::BpfError;
use aya::maps::Map;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The map names, as pinned under the bpf root. First those only the tc program has.
pub const TC_CONFIG_MAP: &str = "svcplane_tc_config";
pub const CLUSTER_CIDRS_MAP: &str = "svcplane_cluster_cidrs";
pub const SOURCE_RANGES_MAP: &str = "svcplane_source_ranges";
pub const CT_MAP: &str = "svcplane_ct";
pub const MAGLEV_MAP: &str = "svcplane_maglev";
/// The maps of the socket programs (the tc program shares some of them).
pub const SERVICES_MAP: &str = "svcplane_services";
pub const BACKENDS_MAP: &str = "svcplane_backends";
/// UDP sockets' reverse translations, in socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`):
/// nothing preallocated, no size.
pub const REV_SOCK_MAP: &str = "svcplane_sock_rev";
/// TCP sockets' reverse translations by socket cookie (a hash without preallocation,
/// sized `reverse`), deleted as each socket is released.
pub const TCP_REV_MAP: &str = "svcplane_tcp_rev";
/// The node's own connected UDP sockets the balancer connected (LRU, 16384 entries).
pub const UDP_SOCKETS_MAP: &str = "svcplane_udp_sockets";
/// Maps earlier versions pinned and this one no longer has, removed by [`crate::cleanup`]:
/// the reverse translations as a preallocated LRU hash keyed by socket cookie.
pub const RETIRED_MAPS: [&str; 1] = ["svcplane_rev_sock"];
pub const AFFINITY_MAP: &str = "svcplane_affinity";
pub const CONFIG_MAP: &str = "svcplane_config";
pub const LIVE_MAP: &str = "svcplane_live";
pub const UDP_FLOWS_MAP: &str = "svcplane_udp_flows";
pub const COUNTERS_MAP: &str = "svcplane_counters";
pub const PORT_NAMES_MAP: &str = "svcplane_port_names";
/// Every map of the socket-level balancer.
pub const SOCK_LB_MAPS: [&str; 11] = [
    SERVICES_MAP,
    BACKENDS_MAP,
    REV_SOCK_MAP,
    TCP_REV_MAP,
    AFFINITY_MAP,
    CONFIG_MAP,
    LIVE_MAP,
    UDP_FLOWS_MAP,
    COUNTERS_MAP,
    PORT_NAMES_MAP,
    UDP_SOCKETS_MAP,
];

/// IP protocol numbers as the programs see them.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

/// Takes map `name` out of a loaded object, typed.
pub(crate) fn typed<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, BpfError>
where
    T: TryFrom<Map, Error = MapError>,
{
    let map = ebpf.take_map(name).ok_or(BpfError::MissingMap { map: name })?;
    T::try_from(map).map_err(|source| BpfError::Map {
        map: name,
        what: "opening with its key and value types".into(),
        source: Box::new(source),
    })
}

/// An address as the maps store it.
pub fn address_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The address the maps' bytes stand for (IPv4-mapped bytes are IPv4).
pub fn address_of(bytes: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(bytes);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn port_net(port: u16) -> u16 {
    u16::from_ne_bytes(port.to_be_bytes())
}

fn port_host(stored: u16) -> u16 {
    u16::from_be_bytes(stored.to_ne_bytes())
}

/// Whose socket a lookup is for: the plan may send the node itself and its pods to
/// different endpoint sets (or refuse one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Scope {
    /// A socket in the node's own network namespace.
    Node = 0,
    /// A socket in any other network namespace of the cgroup: a pod of this node (and, in
    /// the tc programs, a packet from a pod of another node: inside the cluster CIDRs).
    Pod = 1,
    /// A packet from outside the cluster arriving at the node (tc programs only).
    External = 2,
}

/// A Service frontend: address, port, protocol, for one scope.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ServiceKey {
    pub addr: [u8; 16],
    pub port: u16,
    pub proto: u8,
    pub scope: u8,
}

impl ServiceKey {
    pub fn new(address: SocketAddr, proto: u8, scope: Scope) -> Self {
        Self { addr: address_bytes(address.ip()), port: port_net(address.port()), proto, scope: scope as u8 }
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.addr), port_host(self.port))
    }

    pub fn scope(&self) -> Scope {
        match self.scope {
            0 => Scope::Node,
            1 => Scope::Pod,
            _ => Scope::External,
        }
    }
}

impl fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({:?})", self.address(), protocol_name(self.proto), self.scope())
    }
}

/// The name of an IP protocol number, for tables.
pub fn protocol_name(proto: u8) -> &'static str {
    match proto {
        PROTO_TCP => "tcp",
        PROTO_UDP => "udp",
        PROTO_SCTP => "sctp",
        _ => "?",
    }
}

/// `svc_value.flags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceFlags;

impl ServiceFlags {
    /// No endpoint at all: connect() fails with ECONNREFUSED.
    pub const REJECT: u32 = 1;
    /// Endpoints exist, but not for this traffic: dropped (EPERM locally).
    pub const DROP: u32 = 2;
    /// ClientIP affinity with `affinity_timeout` seconds.
    pub const AFFINITY: u32 = 4;
    /// Translate the source to the node's address (tc programs; sockets translate nothing).
    pub const MASQUERADE: u32 = 8;
    /// Only sources inside the frontend's `loadBalancerSourceRanges` (tc programs).
    pub const SOURCE_RANGES: u32 = 16;
}

/// What a frontend leads to: a backend set, its size and how to treat it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceValue {
    /// The set's id (affinity entries and Maglev tables are kept per set).
    pub backend_set: u32,
    pub count: u32,
    pub flags: u32,
    pub affinity_timeout: u32,
    /// The service port the frontend belongs to (for [`LiveKey`]).
    pub port_id: u32,
    /// The set's slots are `svcplane_backends[first .. first + count)`.
    pub first: u32,
}

/// An endpoint, as one slot of a backend set (`svcplane_backends` is an array of them; a
/// slot whose port is 0 is empty).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BackendValue {
    pub addr: [u8; 16],
    pub port: u16,
    pub pad: u16,
}

impl BackendValue {
    /// `pad` of an endpoint on this node, in the backends map.
    pub const LOCAL: u16 = 1;

    pub fn new(address: SocketAddr) -> Self {
        Self { addr: address_bytes(address.ip()), port: port_net(address.port()), pad: 0 }
    }

    /// An endpoint, marked as running on this node or not (direct server return attaches
    /// the Service address only to flows to other nodes).
    pub fn with_locality(address: SocketAddr, local: bool) -> Self {
        Self { pad: if local { Self::LOCAL } else { 0 }, ..Self::new(address) }
    }

    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.addr), port_host(self.port))
    }
}

impl fmt::Debug for BackendValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.address())
    }
}

/// Endpoints a socket's reverse translation keeps (`REV_SLOTS` in `common.h`).
pub const REV_SLOTS: usize = 4;

/// One endpoint a socket was balanced to and the Service address it asked for
/// (`struct rev_entry`). A slot never used is all zeros.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RevEntry {
    pub backend_addr: [u8; 16],
    pub backend_port: u16,
    pub pad: u16,
    pub addr: [u8; 16],
    pub port: u16,
    pub pad2: u16,
}

impl RevEntry {
    /// The endpoint the socket was balanced to.
    pub fn backend(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.backend_addr), port_host(self.backend_port))
    }

    /// The Service address the socket asked for.
    pub fn frontend(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.addr), port_host(self.port))
    }
}

/// A socket's own reverse translations (`struct rev_sock`, its value in the socket-local
/// storage map `svcplane_sock_rev`): its last [`REV_SLOTS`] endpoints.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RevSock {
    pub slots: [RevEntry; REV_SLOTS],
    pub next: u32,
    pub pad: u32,
}

impl RevSock {
    /// The value as the kernel returns it (native byte order), if it has the right size.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != size_of::<RevSock>() {
            return None;
        }
        let array = |at: usize| -> [u8; 16] { bytes[at..at + 16].try_into().expect("16 bytes") };
        let u16_at = |at: usize| u16::from_ne_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let entry = size_of::<RevEntry>();
        let slots = std::array::from_fn(|i| {
            let at = i * entry;
            RevEntry {
                backend_addr: array(at),
                backend_port: u16_at(at + 16),
                pad: u16_at(at + 18),
                addr: array(at + 20),
                port: u16_at(at + 36),
                pad2: u16_at(at + 38),
            }
        });
        let end = REV_SLOTS * entry;
        Some(RevSock { slots, next: u32_at(end), pad: u32_at(end + 4) })
    }

    /// The Service address the socket asked for when it was balanced to `backend`.
    pub fn frontend_of(&self, backend: SocketAddr) -> Option<SocketAddr> {
        self.slots.iter().find(|slot| slot.backend_port != 0 && slot.backend() == backend).map(RevEntry::frontend)
    }
}

/// One of the node's own connected UDP sockets (by cookie) and the endpoint it was
/// balanced to (`svcplane_udp_sockets`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RevKey {
    pub cookie: u64,
    pub addr: [u8; 16],
    pub port: u16,
    pub pad: [u16; 3],
}

impl RevKey {
    /// The endpoint the socket was balanced to.
    pub fn backend(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.addr), port_host(self.port))
    }
}

/// The Service address that socket asked for.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RevValue {
    pub addr: [u8; 16],
    pub port: u16,
    pub pad: u16,
}

impl RevValue {
    /// The Service address the socket connected to.
    pub fn frontend(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.addr), port_host(self.port))
    }
}

/// A client (its network namespace cookie at the socket level) and a backend set.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    pub client: u64,
    pub backend_set: u32,
    pub pad: u32,
}

/// The backend a client sticks to, and when it last used it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AffinityValue {
    pub last_used_ns: u64,
    pub backend: BackendValue,
    pub tail: u32,
}

/// An endpoint that still serves (ready or terminating) a service port: UDP flows of that
/// port may stay on it (`svcplane_live`, defined in `sock_lb.c`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LiveKey {
    pub port_id: u32,
    pub addr: [u8; 16],
    pub port: u16,
    pub pad: u16,
}

impl LiveKey {
    /// The endpoint.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::new(address_of(self.addr), port_host(self.port))
    }

    pub fn new(port_id: u32, address: SocketAddr) -> Self {
        Self { port_id, addr: address_bytes(address.ip()), port: port_net(address.port()), pad: 0 }
    }
}

/// The name of a service port id (`svcplane_port_names`): `namespace/name:port`, NUL-padded.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PortName {
    pub name: [u8; 124],
    pub proto: u8,
    pub pad: [u8; 3],
}

impl PortName {
    /// `name` cut to 124 bytes (at a character boundary).
    pub fn new(name: &str, proto: u8) -> Self {
        let mut bytes = [0u8; 124];
        let mut end = name.len().min(bytes.len());
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        bytes[..end].copy_from_slice(&name.as_bytes()[..end]);
        Self { name: bytes, proto, pad: [0; 3] }
    }

    pub fn name(&self) -> String {
        let end = self.name.iter().position(|b| *b == 0).unwrap_or(self.name.len());
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

impl fmt::Debug for PortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name(), protocol_name(self.proto))
    }
}

/// Node-wide settings the programs read.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Config {
    pub host_netns_cookie: u64,
}

// A layout change in `common.h` that is not mirrored here fails the build.
const _: () = {
    assert!(size_of::<ServiceKey>() == 20);
    assert!(size_of::<ServiceValue>() == 24);
    assert!(size_of::<BackendValue>() == 20);
    assert!(size_of::<RevKey>() == 32);
    assert!(size_of::<RevValue>() == 20);
    assert!(size_of::<RevEntry>() == 40);
    assert!(size_of::<RevSock>() == 168);
    assert!(size_of::<AffinityKey>() == 16);
    assert!(size_of::<AffinityValue>() == 32);
    assert!(size_of::<Config>() == 8);
    assert!(size_of::<LiveKey>() == 24);
    assert!(size_of::<PortName>() == 128);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_frontend_is_stored_ipv4_mapped_with_its_port_in_network_order() {
        let key = ServiceKey::new("198.19.0.10:80".parse().unwrap(), PROTO_TCP, Scope::Pod);
        assert_eq!(&key.addr[10..], &[0xff, 0xff, 198, 19, 0, 10]);
        assert_eq!(key.port.to_ne_bytes(), [0, 80]);
        assert_eq!(key.address(), "198.19.0.10:80".parse::<SocketAddr>().unwrap());
    }

    #[test]
    fn an_ipv6_backend_reads_back_as_the_same_socket_address() {
        let address: SocketAddr = "[2001:db8:1::2]:8080".parse().unwrap();
        assert_eq!(BackendValue::new(address).address(), address);
    }

    #[test]
    fn a_sockets_reverse_translations_read_from_the_kernels_bytes_name_the_service_per_endpoint() {
        let entry = |backend: &str, frontend: &str| {
            let (backend, frontend): (SocketAddr, SocketAddr) = (backend.parse().unwrap(), frontend.parse().unwrap());
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&address_bytes(backend.ip()));
            bytes.extend_from_slice(&port_net(backend.port()).to_ne_bytes());
            bytes.extend_from_slice(&[0, 0]);
            bytes.extend_from_slice(&address_bytes(frontend.ip()));
            bytes.extend_from_slice(&port_net(frontend.port()).to_ne_bytes());
            bytes.extend_from_slice(&[0, 0]);
            bytes
        };
        let mut bytes = [
            entry("198.18.1.2:53", "198.19.0.10:53"),
            entry("[2001:db8:1::2]:8053", "[2001:db8:f::1]:53"),
            vec![0; 40],
            vec![0; 40],
        ]
        .concat();
        bytes.extend_from_slice(&2u32.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        let rev = RevSock::from_bytes(&bytes).expect("168 bytes");
        assert_eq!(rev.next, 2);
        assert_eq!(rev.frontend_of("198.18.1.2:53".parse().unwrap()), Some("198.19.0.10:53".parse().unwrap()));
        assert_eq!(
            rev.frontend_of("[2001:db8:1::2]:8053".parse().unwrap()),
            Some("[2001:db8:f::1]:53".parse().unwrap())
        );
        assert_eq!(rev.frontend_of("198.18.1.3:53".parse().unwrap()), None, "an endpoint it was not balanced to");
        assert_eq!(rev.frontend_of("[::]:0".parse().unwrap()), None, "an empty slot names nothing");
        assert_eq!(RevSock::from_bytes(&bytes[..100]), None, "a value of another size");
    }
}
