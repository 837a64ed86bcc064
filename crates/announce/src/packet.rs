//! ARP and NDP frames as bytes: what the responder reads and what it sends. Pure: no
//! sockets, so every frame is checked by unit tests.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A MAC address.
pub type Mac = [u8; 6];

pub const BROADCAST: Mac = [0xff; 6];
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
const ETH_HEADER: usize = 14;
const IPV6_HEADER: usize = 40;
const ICMPV6: u8 = 58;
const NEIGHBOR_SOLICITATION: u8 = 135;
const NEIGHBOR_ADVERTISEMENT: u8 = 136;
/// NA flags (first byte): Solicited, Override.
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// An ARP request someone sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRequest {
    pub sender_mac: Mac,
    pub sender_ip: Ipv4Addr,
    pub target_ip: Ipv4Addr,
}

/// Reads an Ethernet frame as an ARP request for IPv4 over Ethernet, or `None`.
pub fn parse_arp_request(frame: &[u8]) -> Option<ArpRequest> {
    if frame.len() < ETH_HEADER + 28 || u16::from_be_bytes([frame[12], frame[13]]) != ETH_P_ARP {
        return None;
    }
    let arp = &frame[ETH_HEADER..];
    let header_ok = arp[0..2] == [0, 1] && arp[2..4] == [0x08, 0x00] && arp[4] == 6 && arp[5] == 4;
    if !header_ok || arp[6..8] != [0, 1] {
        return None;
    }
    Some(ArpRequest {
        sender_mac: arp[8..14].try_into().ok()?,
        sender_ip: Ipv4Addr::new(arp[14], arp[15], arp[16], arp[17]),
        target_ip: Ipv4Addr::new(arp[24], arp[25], arp[26], arp[27]),
    })
}

fn arp_frame(eth_dst: Mac, op: u16, sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let mut frame = Vec::with_capacity(60);
    frame.extend_from_slice(&eth_dst);
    frame.extend_from_slice(&sha);
    frame.extend_from_slice(&ETH_P_ARP.to_be_bytes());
    frame.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
    frame.extend_from_slice(&op.to_be_bytes());
    frame.extend_from_slice(&sha);
    frame.extend_from_slice(&spa.octets());
    frame.extend_from_slice(&tha);
    frame.extend_from_slice(&tpa.octets());
    // Ethernet minimum frame (without FCS): 60 bytes.
    frame.resize(60, 0);
    frame
}

/// The reply to `request` saying `ours` holds its target address.
pub fn arp_reply(ours: Mac, request: &ArpRequest) -> Vec<u8> {
    arp_frame(request.sender_mac, 2, ours, request.target_ip, request.sender_mac, request.sender_ip)
}

/// A gratuitous ARP (a broadcast request for `ip` from `ip`): neighbours that have an entry
/// for `ip` move it to `ours`.
pub fn gratuitous_arp(ours: Mac, ip: Ipv4Addr) -> Vec<u8> {
    arp_frame(BROADCAST, 1, ours, ip, [0; 6], ip)
}

/// A Neighbor Solicitation someone sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborSolicitation {
    pub sender_mac: Mac,
    /// `::` for duplicate address detection.
    pub sender_ip: Ipv6Addr,
    pub target: Ipv6Addr,
}

/// Reads an Ethernet frame as an ICMPv6 Neighbor Solicitation (hop limit 255, code 0, no
/// extension headers, valid checksum), or `None`.
pub fn parse_neighbor_solicitation(frame: &[u8]) -> Option<NeighborSolicitation> {
    if frame.len() < ETH_HEADER + IPV6_HEADER + 24 || u16::from_be_bytes([frame[12], frame[13]]) != ETH_P_IPV6 {
        return None;
    }
    let ip = &frame[ETH_HEADER..];
    let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    if ip[0] >> 4 != 6 || ip[6] != ICMPV6 || ip[7] != 255 || payload < 24 || ip.len() < IPV6_HEADER + payload {
        return None;
    }
    let icmp = &ip[IPV6_HEADER..IPV6_HEADER + payload];
    if icmp[0] != NEIGHBOR_SOLICITATION || icmp[1] != 0 {
        return None;
    }
    let source = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).ok()?);
    let destination = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).ok()?);
    if icmpv6_checksum(source, destination, icmp) != 0 {
        return None;
    }
    Some(NeighborSolicitation {
        sender_mac: frame[6..12].try_into().ok()?,
        sender_ip: source,
        target: Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).ok()?),
    })
}

/// The one's complement sum over the IPv6 pseudo-header and `icmp` (0 when `icmp` carries a
/// valid checksum; the checksum to write when its checksum field is zero).
fn icmpv6_checksum(source: Ipv6Addr, destination: Ipv6Addr, icmp: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for chunk in bytes.chunks(2) {
            let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
            sum += u32::from(word);
        }
    };
    add(&source.octets());
    add(&destination.octets());
    add(&u32::try_from(icmp.len()).unwrap_or(u32::MAX).to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(icmp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(u16::try_from(sum).unwrap_or(0xffff))
}

/// The Ethernet address of an IPv6 multicast address (33:33 and its low 32 bits).
fn multicast_mac(ip: Ipv6Addr) -> Mac {
    let o = ip.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// A Neighbor Advertisement for `target` held by `ours`, from `source`, to `to` (or to all
/// nodes when `to` is `None`, then unsolicited).
fn advertisement(ours: Mac, source: Ipv6Addr, target: Ipv6Addr, to: Option<(Mac, Ipv6Addr)>) -> Vec<u8> {
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let (eth_dst, ip_dst, flags) = match to {
        Some((mac, ip)) => (mac, ip, FLAG_SOLICITED | FLAG_OVERRIDE),
        None => (multicast_mac(all_nodes), all_nodes, FLAG_OVERRIDE),
    };
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[NEIGHBOR_ADVERTISEMENT, 0, 0, 0, flags, 0, 0, 0]);
    icmp.extend_from_slice(&target.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&ours);
    let checksum = icmpv6_checksum(source, ip_dst, &icmp);
    icmp[2..4].copy_from_slice(&checksum.to_be_bytes());
    let mut frame = Vec::with_capacity(ETH_HEADER + IPV6_HEADER + icmp.len());
    frame.extend_from_slice(&eth_dst);
    frame.extend_from_slice(&ours);
    frame.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    frame.extend_from_slice(&[0x60, 0, 0, 0]);
    frame.extend_from_slice(&u16::try_from(icmp.len()).unwrap_or(0).to_be_bytes());
    frame.extend_from_slice(&[ICMPV6, 255]);
    frame.extend_from_slice(&source.octets());
    frame.extend_from_slice(&ip_dst.octets());
    frame.extend_from_slice(&icmp);
    frame
}

/// The answer to `solicitation` saying `ours` holds its target, sent from `source` (the
/// interface's link-local address, or the target itself). A DAD probe (from `::`) is
/// answered to all nodes, as RFC 4861 asks.
pub fn neighbor_advertisement(ours: Mac, source: Ipv6Addr, solicitation: &NeighborSolicitation) -> Vec<u8> {
    let to = (!solicitation.sender_ip.is_unspecified()).then_some((solicitation.sender_mac, solicitation.sender_ip));
    advertisement(ours, source, solicitation.target, to)
}

/// An unsolicited Neighbor Advertisement (override flag set) to all nodes: neighbours that
/// have an entry for `target` move it to `ours`.
pub fn unsolicited_advertisement(ours: Mac, source: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    advertisement(ours, source, target, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: Mac = [0x02, 0, 0, 0, 0, 0x11];
    const THEIRS: Mac = [0x02, 0, 0, 0, 0, 0x99];

    #[test]
    fn an_arp_request_is_read_and_answered_to_its_sender_from_the_target_address() {
        let request_frame =
            arp_frame(BROADCAST, 1, THEIRS, "198.18.0.100".parse().unwrap(), [0; 6], "198.18.0.240".parse().unwrap());
        let request = parse_arp_request(&request_frame).expect("a request");
        assert_eq!(request.target_ip, "198.18.0.240".parse::<Ipv4Addr>().unwrap());
        let reply = arp_reply(OURS, &request);
        assert_eq!(&reply[0..6], &THEIRS);
        assert_eq!(&reply[20..22], &[0, 2], "a reply");
        assert_eq!(&reply[22..28], &OURS);
        assert_eq!(&reply[28..32], &[198, 18, 0, 240]);
        assert_eq!(&reply[38..42], &[198, 18, 0, 100]);
        assert!(parse_arp_request(&reply).is_none(), "a reply is not a request");
    }

    #[test]
    fn a_gratuitous_arp_is_a_broadcast_request_for_the_address_from_itself() {
        let frame = gratuitous_arp(OURS, "198.18.0.240".parse().unwrap());
        let request = parse_arp_request(&frame).unwrap();
        assert_eq!(&frame[0..6], &BROADCAST);
        assert_eq!(
            (request.sender_ip, request.target_ip, request.sender_mac),
            (request.target_ip, request.target_ip, OURS)
        );
    }

    fn solicitation(source: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
        let mut frame = advertisement(THEIRS, source, target, Some((OURS, "ff02::1:ff00:f0".parse().unwrap())));
        // Turn the advertisement into a solicitation and fix the checksum.
        let icmp_at = ETH_HEADER + IPV6_HEADER;
        frame[icmp_at] = NEIGHBOR_SOLICITATION;
        frame[icmp_at + 4] = 0;
        frame[icmp_at + 2..icmp_at + 4].copy_from_slice(&[0, 0]);
        let checksum = icmpv6_checksum(source, "ff02::1:ff00:f0".parse().unwrap(), &frame[icmp_at..]);
        frame[icmp_at + 2..icmp_at + 4].copy_from_slice(&checksum.to_be_bytes());
        frame
    }

    #[test]
    fn a_neighbor_solicitation_is_answered_solicited_and_override_with_a_valid_checksum() {
        let source: Ipv6Addr = "2001:db8::100".parse().unwrap();
        let target: Ipv6Addr = "2001:db8::f0".parse().unwrap();
        let ns = parse_neighbor_solicitation(&solicitation(source, target)).expect("a solicitation");
        assert_eq!((ns.sender_ip, ns.target, ns.sender_mac), (source, target, THEIRS));
        let link_local: Ipv6Addr = "fe80::11".parse().unwrap();
        let na = neighbor_advertisement(OURS, link_local, &ns);
        assert_eq!(&na[0..6], &THEIRS);
        let icmp = &na[ETH_HEADER + IPV6_HEADER..];
        assert_eq!((icmp[0], icmp[4]), (NEIGHBOR_ADVERTISEMENT, FLAG_SOLICITED | FLAG_OVERRIDE));
        assert_eq!(icmpv6_checksum(link_local, source, icmp), 0, "the checksum verifies");
        assert_eq!(&icmp[26..32], &OURS, "target link-layer address option");
    }

    #[test]
    fn a_corrupted_solicitation_or_one_with_a_low_hop_limit_is_ignored() {
        let frame = solicitation("2001:db8::100".parse().unwrap(), "2001:db8::f0".parse().unwrap());
        let mut corrupted = frame.clone();
        corrupted[ETH_HEADER + IPV6_HEADER + 10] ^= 1;
        assert!(parse_neighbor_solicitation(&corrupted).is_none());
        let mut forwarded = frame;
        forwarded[ETH_HEADER + 7] = 254;
        assert!(parse_neighbor_solicitation(&forwarded).is_none());
    }

    #[test]
    fn an_unsolicited_advertisement_goes_to_all_nodes_without_the_solicited_flag() {
        let source: Ipv6Addr = "fe80::11".parse().unwrap();
        let na = unsolicited_advertisement(OURS, source, "2001:db8::f0".parse().unwrap());
        assert_eq!(&na[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
        let icmp = &na[ETH_HEADER + IPV6_HEADER..];
        assert_eq!(icmp[4], FLAG_OVERRIDE);
        assert_eq!(icmpv6_checksum(source, "ff02::1".parse().unwrap(), icmp), 0);
    }
}
