//! The generic netlink wire format as the IPVS family speaks it: numbers from the kernel's
//! UAPI headers (`linux/netlink.h`, `linux/genetlink.h`, `linux/ip_vs.h`), a writer for one
//! request, and a reader for the kernel's answers.
//!
//! Netlink and attribute headers are in host order; ports are big endian, as are IPv4 and
//! IPv6 addresses (`union nf_inet_addr`, 16 bytes). Other integers are host order.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use svcplane_net::Protocol;

use crate::{Destination, Service, ServiceKey};

// linux/netlink.h
pub(crate) const NETLINK_GENERIC: isize = 16;
pub(crate) const NETLINK_NETFILTER: isize = 12;
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
const NLA_F_NESTED: u16 = 0x8000;
pub(crate) const NLA_F_NET_BYTEORDER: u16 = 0x4000;
const NLA_TYPE_MASK: u16 = 0x3fff;

// linux/genetlink.h
pub(crate) const GENL_ID_CTRL: u16 = 0x10;
pub(crate) const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub(crate) const CTRL_ATTR_FAMILY_NAME: u16 = 2;

// linux/ip_vs.h
pub(crate) const IPVS_GENL_NAME: &str = "IPVS";
pub(crate) const IPVS_GENL_VERSION: u8 = 1;
pub(crate) const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub(crate) const IPVS_CMD_SET_SERVICE: u8 = 2;
pub(crate) const IPVS_CMD_DEL_SERVICE: u8 = 3;
pub(crate) const IPVS_CMD_GET_SERVICE: u8 = 4;
pub(crate) const IPVS_CMD_NEW_DEST: u8 = 5;
pub(crate) const IPVS_CMD_SET_DEST: u8 = 6;
pub(crate) const IPVS_CMD_DEL_DEST: u8 = 7;
pub(crate) const IPVS_CMD_GET_DEST: u8 = 8;
pub(crate) const IPVS_CMD_SET_CONFIG: u8 = 12;
pub(crate) const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub(crate) const IPVS_CMD_ATTR_DEST: u16 = 2;
pub(crate) const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
pub(crate) const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
pub(crate) const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;
const IPVS_SVC_ATTR_AF: u16 = 1;
const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
const IPVS_SVC_ATTR_ADDR: u16 = 3;
const IPVS_SVC_ATTR_PORT: u16 = 4;
const IPVS_SVC_ATTR_FWMARK: u16 = 5;
const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
const IPVS_SVC_ATTR_FLAGS: u16 = 7;
const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
const IPVS_SVC_ATTR_NETMASK: u16 = 9;
const IPVS_DEST_ATTR_ADDR: u16 = 1;
const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
/// `IP_VS_SVC_F_PERSISTENT`: session affinity for the service's timeout.
const IP_VS_SVC_F_PERSISTENT: u32 = 0x1;
/// `IP_VS_CONN_F_MASQ`: NAT, the only forwarding method kube-proxy uses.
const IP_VS_CONN_F_MASQ: u32 = 0;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const IPPROTO_TCP: u16 = 6;
const IPPROTO_UDP: u16 = 17;
const IPPROTO_SCTP: u16 = 132;

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// One netlink request being written: header, generic netlink header, attributes.
pub(crate) struct Request {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Request {
    pub(crate) fn new(family: u16, flags: u16, seq: u32, cmd: u8, version: u8) -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        buf.extend_from_slice(&family.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
        buf.extend_from_slice(&[cmd, version, 0, 0]);
        Request { buf, nests: Vec::new() }
    }

    /// A netfilter (nfnetlink) request: the message type is the subsystem and its command,
    /// and the four bytes after the netlink header are `struct nfgenmsg` (family, version
    /// `NFNETLINK_V0`, resource id 0), laid out as a generic netlink header is.
    pub(crate) fn netfilter(subsystem: u8, command: u8, flags: u16, seq: u32, family: u8) -> Self {
        Request::new(u16::from(subsystem) << 8 | u16::from(command), flags, seq, family, 0)
    }

    pub(crate) fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        let len = 4 + value.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    pub(crate) fn u8(&mut self, kind: u16, value: u8) -> &mut Self {
        self.attr(kind, &[value])
    }

    pub(crate) fn u16(&mut self, kind: u16, value: u16) -> &mut Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    pub(crate) fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.attr(kind, &value.to_ne_bytes())
    }

    pub(crate) fn string(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.attr(kind, &bytes)
    }

    pub(crate) fn begin_nest(&mut self, kind: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    pub(crate) fn end_nest(&mut self) -> &mut Self {
        let start = self.nests.pop().expect("a nest to end");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    /// The service's identity: family, protocol, address, port; or family and mark.
    pub(crate) fn service_key(&mut self, key: &ServiceKey) -> &mut Self {
        if key.fwmark != 0 {
            return self.u16(IPVS_SVC_ATTR_AF, family_of(key.address)).u32(IPVS_SVC_ATTR_FWMARK, key.fwmark);
        }
        self.u16(IPVS_SVC_ATTR_AF, family_of(key.address))
            .u16(IPVS_SVC_ATTR_PROTOCOL, protocol_number(key.protocol))
            .attr(IPVS_SVC_ATTR_ADDR, &address_bytes(key.address))
            .attr(IPVS_SVC_ATTR_PORT, &key.port.to_be_bytes())
    }

    /// A whole service, as `IPVS_CMD_NEW_SERVICE` and `IPVS_CMD_SET_SERVICE` need it.
    pub(crate) fn service(&mut self, service: &Service) -> &mut Self {
        let flags = if service.persistence_seconds > 0 { IP_VS_SVC_F_PERSISTENT } else { 0 };
        let mut flags_and_mask = flags.to_ne_bytes().to_vec();
        flags_and_mask.extend_from_slice(&u32::MAX.to_ne_bytes());
        // The kernel reads the netmask as a raw 32-bit value: all ones for IPv4, a prefix
        // length for IPv6 (what ipvsadm sends).
        let netmask = if service.key.address.is_ipv4() { u32::MAX } else { 128 };
        self.service_key(&service.key)
            .string(IPVS_SVC_ATTR_SCHED_NAME, &service.scheduler)
            .attr(IPVS_SVC_ATTR_FLAGS, &flags_and_mask)
            .u32(IPVS_SVC_ATTR_TIMEOUT, service.persistence_seconds)
            .u32(IPVS_SVC_ATTR_NETMASK, netmask)
    }

    /// A destination's identity: address and port (and family).
    pub(crate) fn destination_key(&mut self, destination: &Destination) -> &mut Self {
        self.attr(IPVS_DEST_ATTR_ADDR, &address_bytes(destination.address))
            .attr(IPVS_DEST_ATTR_PORT, &destination.port.to_be_bytes())
            .u16(IPVS_DEST_ATTR_ADDR_FAMILY, family_of(destination.address))
    }

    /// A whole destination, masqueraded (NAT).
    pub(crate) fn destination(&mut self, destination: &Destination) -> &mut Self {
        self.destination_key(destination)
            .u32(IPVS_DEST_ATTR_FWD_METHOD, IP_VS_CONN_F_MASQ)
            .u32(IPVS_DEST_ATTR_WEIGHT, destination.weight)
            .u32(IPVS_DEST_ATTR_U_THRESH, 0)
            .u32(IPVS_DEST_ATTR_L_THRESH, 0)
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

fn family_of(address: IpAddr) -> u16 {
    if address.is_ipv4() { AF_INET } else { AF_INET6 }
}

pub(crate) fn protocol_number(protocol: Protocol) -> u16 {
    match protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
        Protocol::Sctp => IPPROTO_SCTP,
    }
}

fn address_bytes(address: IpAddr) -> [u8; 16] {
    let mut bytes = [0; 16];
    match address {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes = v6.octets(),
    }
    bytes
}

/// One message the kernel sent: type, flags, sequence number, payload after the header.
pub(crate) struct Message<'a> {
    pub(crate) msg_type: u16,
    pub(crate) seq: u32,
    pub(crate) payload: &'a [u8],
}

/// The messages in one received buffer.
pub(crate) fn messages(mut buf: &[u8]) -> Vec<Message<'_>> {
    let mut found = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("four bytes")) as usize;
        if len < 16 || len > buf.len() {
            break;
        }
        found.push(Message {
            msg_type: u16::from_ne_bytes(buf[4..6].try_into().expect("two bytes")),
            seq: u32::from_ne_bytes(buf[8..12].try_into().expect("four bytes")),
            payload: &buf[16..len],
        });
        buf = &buf[align(len).min(buf.len())..];
    }
    found
}

/// The attributes in `buf`, as (type without flags, value).
pub(crate) fn attributes(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut found = Vec::new();
    while buf.len() >= 4 {
        let len = u16::from_ne_bytes(buf[0..2].try_into().expect("two bytes")) as usize;
        let kind = u16::from_ne_bytes(buf[2..4].try_into().expect("two bytes")) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            break;
        }
        found.push((kind, &buf[4..len]));
        buf = &buf[align(len).min(buf.len())..];
    }
    found
}

fn find(attributes: &[(u16, &[u8])], kind: u16) -> Option<Vec<u8>> {
    attributes.iter().find(|(found, _)| *found == kind).map(|(_, value)| value.to_vec())
}

fn u16_of(value: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(value.get(..2)?.try_into().ok()?))
}

fn u32_of(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.get(..4)?.try_into().ok()?))
}

fn address_of(family: u16, value: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(value.get(..4)?).ok()?))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(value.get(..16)?).ok()?))),
        _ => None,
    }
}

/// The family id in the controller's answer to `CTRL_CMD_GETFAMILY`.
pub(crate) fn family_id(payload: &[u8]) -> Option<u16> {
    find(&attributes(payload.get(4..)?), CTRL_ATTR_FAMILY_ID).and_then(|value| u16_of(&value))
}

/// A service in a `IPVS_CMD_GET_SERVICE` dump answer; `None` for protocols we do not
/// program.
pub(crate) fn parse_service(payload: &[u8]) -> Option<Service> {
    let outer = attributes(payload.get(4..)?);
    let nested = find(&outer, IPVS_CMD_ATTR_SERVICE)?;
    let inner = attributes(&nested);
    let family = u16_of(&find(&inner, IPVS_SVC_ATTR_AF)?)?;
    let scheduler = find(&inner, IPVS_SVC_ATTR_SCHED_NAME)
        .map(|value| String::from_utf8_lossy(value.split(|byte| *byte == 0).next().unwrap_or_default()).into_owned())
        .unwrap_or_default();
    let flags = find(&inner, IPVS_SVC_ATTR_FLAGS).and_then(|value| u32_of(&value)).unwrap_or(0);
    let timeout = find(&inner, IPVS_SVC_ATTR_TIMEOUT).and_then(|value| u32_of(&value)).unwrap_or(0);
    let persistence_seconds = if flags & IP_VS_SVC_F_PERSISTENT != 0 { timeout } else { 0 };
    let fwmark = find(&inner, IPVS_SVC_ATTR_FWMARK).and_then(|value| u32_of(&value)).unwrap_or(0);
    if fwmark != 0 {
        let family = match family {
            AF_INET => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            AF_INET6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        return Some(Service { key: ServiceKey::for_fwmark(family, fwmark), scheduler, persistence_seconds });
    }
    let protocol = match u16_of(&find(&inner, IPVS_SVC_ATTR_PROTOCOL)?)? {
        IPPROTO_TCP => Protocol::Tcp,
        IPPROTO_UDP => Protocol::Udp,
        IPPROTO_SCTP => Protocol::Sctp,
        _ => return None,
    };
    let address = address_of(family, &find(&inner, IPVS_SVC_ATTR_ADDR)?)?;
    let port = u16::from_be_bytes(find(&inner, IPVS_SVC_ATTR_PORT)?.get(..2)?.try_into().ok()?);
    Some(Service { key: ServiceKey::new(address, protocol, port), scheduler, persistence_seconds })
}

/// A destination in a `IPVS_CMD_GET_DEST` dump answer, with its active and inactive
/// connection counts.
pub(crate) fn parse_destination(payload: &[u8], service_family: IpAddr) -> Option<(Destination, u32, u32)> {
    let outer = attributes(payload.get(4..)?);
    let nested = find(&outer, IPVS_CMD_ATTR_DEST)?;
    let inner = attributes(&nested);
    let family = find(&inner, IPVS_DEST_ATTR_ADDR_FAMILY)
        .and_then(|value| u16_of(&value))
        .unwrap_or_else(|| family_of(service_family));
    let address = address_of(family, &find(&inner, IPVS_DEST_ATTR_ADDR)?)?;
    let port = u16::from_be_bytes(find(&inner, IPVS_DEST_ATTR_PORT)?.get(..2)?.try_into().ok()?);
    let weight = u32_of(&find(&inner, IPVS_DEST_ATTR_WEIGHT)?)?;
    let active = find(&inner, IPVS_DEST_ATTR_ACTIVE_CONNS).and_then(|value| u32_of(&value)).unwrap_or(0);
    let inactive = find(&inner, IPVS_DEST_ATTR_INACT_CONNS).and_then(|value| u32_of(&value)).unwrap_or(0);
    Some((Destination { address, port, weight }, active, inactive))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> Service {
        Service {
            key: ServiceKey::new("198.19.0.10".parse().unwrap(), Protocol::Sctp, 80),
            scheduler: "rr".to_owned(),
            persistence_seconds: 10800,
        }
    }

    /// Wraps attributes as the kernel's dump answers do: genl header, then attributes.
    fn answer(kind: u16, build: impl FnOnce(&mut Request)) -> Vec<u8> {
        let mut request = Request::new(99, 0, 1, IPVS_CMD_NEW_SERVICE, 1);
        request.begin_nest(kind);
        build(&mut request);
        request.end_nest();
        let buf = request.finish();
        buf[16..].to_vec()
    }

    #[test]
    fn a_service_written_for_the_kernel_reads_back_the_same() {
        let payload = answer(IPVS_CMD_ATTR_SERVICE, |request| {
            request.service(&service());
        });
        assert_eq!(parse_service(&payload), Some(service()));
    }

    #[test]
    fn a_service_without_persistence_reads_back_with_a_zero_timeout() {
        let mut plain = service();
        plain.persistence_seconds = 0;
        plain.key.address = "2001:db8::10".parse().unwrap();
        let payload = answer(IPVS_CMD_ATTR_SERVICE, |request| {
            request.service(&plain);
        });
        assert_eq!(parse_service(&payload), Some(plain));
    }

    #[test]
    fn a_firewall_mark_service_reads_back_with_its_mark_and_family() {
        for family in ["0.0.0.0", "::"] {
            let marked = Service {
                key: ServiceKey::for_fwmark(family.parse().unwrap(), 0x0001_4000),
                scheduler: "rr".to_owned(),
                persistence_seconds: 0,
            };
            let payload = answer(IPVS_CMD_ATTR_SERVICE, |request| {
                request.service(&marked);
            });
            let inner = attributes(&payload[4..]);
            let nested = find(&inner, IPVS_CMD_ATTR_SERVICE).unwrap();
            let kinds: Vec<u16> = attributes(&nested).iter().map(|(kind, _)| *kind).collect();
            assert!(!kinds.contains(&IPVS_SVC_ATTR_ADDR) && !kinds.contains(&IPVS_SVC_ATTR_PORT), "{kinds:?}");
            assert_eq!(parse_service(&payload), Some(marked));
        }
    }

    #[test]
    fn a_destination_written_for_the_kernel_reads_back_the_same() {
        let destination = Destination { address: "198.18.2.2".parse().unwrap(), port: 8080, weight: 1 };
        let payload = answer(IPVS_CMD_ATTR_DEST, |request| {
            request.destination(&destination);
        });
        assert_eq!(parse_destination(&payload, destination.address), Some((destination, 0, 0)));
    }

    #[test]
    fn a_request_has_its_length_in_its_header_and_aligned_attributes() {
        let mut request = Request::new(GENL_ID_CTRL, NLM_F_REQUEST, 7, CTRL_CMD_GETFAMILY, 1);
        request.string(CTRL_ATTR_FAMILY_NAME, IPVS_GENL_NAME);
        let buf = request.finish();
        assert_eq!(u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize, buf.len());
        assert_eq!(buf.len(), 16 + 4 + 12, "header, genl header, attribute header and \"IPVS\\0\" padded to 12");
        let parsed = messages(&buf);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].seq, 7);
        assert_eq!(attributes(&parsed[0].payload[4..]), vec![(CTRL_ATTR_FAMILY_NAME, &b"IPVS\0"[..])]);
    }
}
