//! The lab's address plan (see `docs/lab.md`), as constants and pure functions.
//!
//! Numbering: nodes are `1..=MAX_NODES`, pods are numbered `1..` on their node, external
//! clients are `1..=MAX_CLIENTS`. IPv6 addresses spell the same decimal number as the IPv4
//! plan, read as hex digits, so they are easy to match by eye: node 1 is `198.18.0.11` and
//! `2001:db8::11`, its first pod is `198.18.129.1` and `2001:db8:1:1::1`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The node network (the "LAN" between nodes and external clients), IPv4.
pub const LAN_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 24);
/// The node network, IPv6.
pub const LAN_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 64);
/// All pod addresses, IPv4 (one /24 per node).
pub const POD_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 128, 0), 17);
/// All pod addresses, IPv6 (one /64 per node).
pub const POD_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0), 48);
/// The Service (ClusterIP) range tests use, IPv4.
pub const SERVICE_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 19, 0, 0), 16);
/// The Service (ClusterIP) range tests use, IPv6.
pub const SERVICE_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, 0), 108);
/// LoadBalancer and external IPs, IPv4.
pub const LOAD_BALANCER_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 100, 0), 24);
/// LoadBalancer and external IPs, IPv6.
pub const LOAD_BALANCER_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0), 64);

/// LoadBalancer addresses announced on the LAN by ARP / NDP (L2 announcement): inside the
/// node network, so an external client on the LAN reaches them with no route to any node;
/// above every client address (`MAX_CLIENTS` keeps clients below it).
pub const LAN_LOAD_BALANCER_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 224), 28);
/// L2-announced LoadBalancer addresses, IPv6 (inside the node network's /64).
pub const LAN_LOAD_BALANCER_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0x224, 0), 124);

/// Every range of the plan. The lab refuses to route anything else.
pub const LAB_RANGES: [IpNet; 8] = [
    IpNet::V4(LAN_V4),
    IpNet::V6(LAN_V6),
    IpNet::V4(POD_V4),
    IpNet::V6(POD_V6),
    IpNet::V4(SERVICE_V4),
    IpNet::V6(SERVICE_V6),
    IpNet::V4(LOAD_BALANCER_V4),
    IpNet::V6(LOAD_BALANCER_V6),
];

/// The link-local gateway every pod routes through (answered by the node's proxy ARP).
pub const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The link-local address of the node side of every pod veth: the pods' IPv6 gateway.
pub const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Highest node number: node addresses `198.18.0.(10+N)` must stay below the clients' `.100`.
pub const MAX_NODES: u16 = 89;
/// Highest pod number on one node (`198.18.(128+N).k`, `k` in `1..=253`).
pub const MAX_PODS_PER_NODE: u16 = 253;
/// Highest external client number (`198.18.0.(100+k)`): clients stay below the
/// L2-announced LoadBalancer range `198.18.0.224/28`.
pub const MAX_CLIENTS: u16 = 119;

/// Reads the decimal spelling of `n` as hex digits (`11` -> `0x11`), for IPv6 groups.
fn decimal_as_hex(n: u16) -> u16 {
    debug_assert!(n <= 9999, "{n} does not fit one IPv6 group as decimal digits");
    let mut value = 0u16;
    let mut shift = 0u32;
    let mut rest = n;
    loop {
        value |= (rest % 10) << shift;
        rest /= 10;
        shift += 4;
        if rest == 0 {
            return value;
        }
    }
}

/// Node `n`'s address on the LAN: `198.18.0.(10+n)`.
pub fn node_ip_v4(node: u16) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, lan_host(10 + node))
}

/// Node `n`'s address on the LAN: `2001:db8::(10+n)`.
pub fn node_ip_v6(node: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, decimal_as_hex(10 + node))
}

/// External client `k`'s address on the LAN: `198.18.0.(100+k)`.
pub fn client_ip_v4(client: u16) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, lan_host(100 + client))
}

/// External client `k`'s address on the LAN: `2001:db8::(100+k)`.
pub fn client_ip_v6(client: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, decimal_as_hex(100 + client))
}

/// The pod /24 node `n` owns: `198.18.(128+n).0/24`.
pub fn pod_cidr_v4(node: u16) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(198, 18, lan_host(128 + node), 0), 24)
}

/// The pod /64 node `n` owns: `2001:db8:1:n::/64`.
pub fn pod_cidr_v6(node: u16) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(0x2001, 0xdb8, 1, decimal_as_hex(node), 0, 0, 0, 0), 64)
}

/// Pod `k` on node `n`: `198.18.(128+n).k`.
pub fn pod_ip_v4(node: u16, pod: u16) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, lan_host(128 + node), lan_host(pod))
}

/// Pod `k` on node `n`: `2001:db8:1:n::k`.
pub fn pod_ip_v6(node: u16, pod: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 1, decimal_as_hex(node), 0, 0, 0, decimal_as_hex(pod))
}

/// Whether `net` lies inside one of the plan's ranges.
pub fn is_lab_network(net: &IpNet) -> bool {
    LAB_RANGES.iter().any(|range| range.contains(net))
}

/// Whether `ip` lies inside one of the plan's ranges.
pub fn is_lab_address(ip: IpAddr) -> bool {
    LAB_RANGES.iter().any(|range| range.contains(&ip))
}

fn lan_host(n: u16) -> u8 {
    u8::try_from(n).expect("address plan numbers are validated by the builder")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_one_and_its_first_pod_read_the_same_in_both_families() {
        assert_eq!(node_ip_v4(1).to_string(), "198.18.0.11");
        assert_eq!(node_ip_v6(1).to_string(), "2001:db8::11");
        assert_eq!(pod_ip_v4(1, 1).to_string(), "198.18.129.1");
        assert_eq!(pod_ip_v6(1, 1).to_string(), "2001:db8:1:1::1");
        assert_eq!(pod_cidr_v4(2).to_string(), "198.18.130.0/24");
        assert_eq!(pod_cidr_v6(12).to_string(), "2001:db8:1:12::/64");
        assert_eq!(client_ip_v4(1).to_string(), "198.18.0.101");
        assert_eq!(client_ip_v6(1).to_string(), "2001:db8::101");
    }

    #[test]
    fn the_highest_numbers_stay_inside_their_ranges() {
        assert!(LAN_V4.contains(&node_ip_v4(MAX_NODES)));
        assert!(node_ip_v4(MAX_NODES) < client_ip_v4(1));
        assert!(LAN_V4.contains(&client_ip_v4(MAX_CLIENTS)));
        assert_eq!(client_ip_v4(MAX_CLIENTS).octets()[3], 219);
        assert!(client_ip_v4(MAX_CLIENTS) < LAN_LOAD_BALANCER_V4.network());
        assert!(LAN_V4.contains(&LAN_LOAD_BALANCER_V4.broadcast()) && LAN_V6.contains(&LAN_LOAD_BALANCER_V6.network()));
        assert!(!LAN_LOAD_BALANCER_V6.contains(&client_ip_v6(MAX_CLIENTS)));
        assert!(POD_V4.contains(&pod_cidr_v4(MAX_NODES)));
        assert!(POD_V6.contains(&pod_cidr_v6(MAX_NODES)));
        assert!(pod_cidr_v4(3).contains(&pod_ip_v4(3, MAX_PODS_PER_NODE)));
    }

    #[test]
    fn addresses_outside_the_plan_are_not_lab_addresses() {
        assert!(is_lab_address("198.19.4.5".parse().unwrap()));
        assert!(is_lab_address("2001:db8:f::a".parse().unwrap()));
        assert!(!is_lab_address("10.0.0.1".parse().unwrap()));
        assert!(!is_lab_address("2001:db8:2::1".parse().unwrap()));
        assert!(!is_lab_network(&"0.0.0.0/0".parse().unwrap()));
        assert!(!is_lab_network(&"198.18.0.0/15".parse().unwrap()));
        assert!(is_lab_network(&"198.18.100.0/24".parse().unwrap()));
    }
}
