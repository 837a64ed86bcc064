//! Closing the calling network namespace's connected UDP sockets that the socket programs
//! balanced to an endpoint that went away, through the kernel's socket-diagnostics netlink
//! family (`SOCK_DESTROY`, what `ss -K` uses).
//!
//! A pod's connected UDP socket is never rewritten at connect() (its datagrams are
//! translated per flow in tc, which moves the flow); the node's own sockets are, so one
//! connected to an endpoint keeps sending there after the endpoint is gone. Closing it
//! makes the application's next receive fail (`ECONNABORTED`) and its next send on it fail
//! too, so it opens a new socket, which connect() balances to a live endpoint: what
//! Cilium does for such sockets. Only sockets the balancer connected (their cookie is in
//! `svcplane_udp_sockets`, which the connect programs write for the node's own UDP sockets,
//! with that endpoint) are closed; a socket an application connected to the pod's address
//! itself is left alone.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netlink_sys::{Socket, SocketAddr as NetlinkAddr};

const NETLINK_SOCK_DIAG: isize = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HEADER: usize = 16;
/// `struct inet_diag_sockid`: ports, addresses, interface, cookie.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`.
const REQUEST_LEN: usize = 8 + SOCKID_LEN;
/// `struct inet_diag_msg` up to and including its `inode`.
const MESSAGE_LEN: usize = 4 + SOCKID_LEN + 20;

/// One socket as the kernel identifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpSocketId {
    pub family: u8,
    /// `struct inet_diag_sockid`, as the dump gave it (network byte order inside).
    raw: [u8; SOCKID_LEN],
}

impl UdpSocketId {
    pub fn cookie(&self) -> u64 {
        let low = u32::from_ne_bytes(self.raw[40..44].try_into().expect("4 bytes"));
        let high = u32::from_ne_bytes(self.raw[44..48].try_into().expect("4 bytes"));
        u64::from(high) << 32 | u64::from(low)
    }

    pub fn peer(&self) -> SocketAddr {
        let port = u16::from_be_bytes([self.raw[2], self.raw[3]]);
        let dst: [u8; 16] = self.raw[20..36].try_into().expect("16 bytes");
        let ip = if i32::from(self.family) == libc::AF_INET {
            IpAddr::V4(Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(dst))
        };
        SocketAddr::new(ip, port)
    }
}

fn request(message_type: u16, flags: u16, seq: u32, family: u8, id: Option<&[u8; SOCKID_LEN]>) -> Vec<u8> {
    let length = NLMSG_HEADER + REQUEST_LEN;
    let mut buf = Vec::with_capacity(length);
    buf.extend_from_slice(&(length as u32).to_ne_bytes());
    buf.extend_from_slice(&message_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(libc::IPPROTO_UDP as u8);
    buf.push(0); // no extensions
    buf.push(0);
    buf.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    match id {
        Some(id) => buf.extend_from_slice(id),
        None => {
            let mut any = [0u8; SOCKID_LEN];
            // INET_DIAG_NOCOOKIE: a dump matches any cookie.
            any[40..48].copy_from_slice(&[0xff; 8]);
            buf.extend_from_slice(&any);
        }
    }
    buf
}

fn open() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&NetlinkAddr::new(0, 0))?;
    Ok(socket)
}

/// Every UDP socket of `family` (`AF_INET` or `AF_INET6`) in the calling thread's network
/// namespace that has a peer (a connected socket).
pub fn connected_udp_sockets(family: u8) -> io::Result<Vec<UdpSocketId>> {
    let socket = open()?;
    socket.send(&request(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, family, None), 0)?;
    let mut found = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let len = socket.recv(&mut &mut buf[..], 0)?;
        let mut at = 0;
        while at + NLMSG_HEADER <= len {
            let length = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            let message_type = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if length < NLMSG_HEADER || at + length > len {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "a truncated sock_diag message"));
            }
            let body = &buf[at + NLMSG_HEADER..at + length];
            match message_type {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => {
                    let errno = body.get(..4).map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")));
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY if body.len() >= MESSAGE_LEN => {
                    let raw: [u8; SOCKID_LEN] = body[4..4 + SOCKID_LEN].try_into().expect("48 bytes");
                    let id = UdpSocketId { family: body[0], raw };
                    if id.peer().port() != 0 {
                        found.push(id);
                    }
                }
                _ => {}
            }
            at += length.next_multiple_of(4);
        }
    }
}

/// Closes one socket. A socket already gone is not an error.
pub fn destroy(id: &UdpSocketId) -> io::Result<()> {
    let socket = open()?;
    socket.send(&request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 1, id.family, Some(&id.raw)), 0)?;
    let mut buf = vec![0u8; 4096];
    let len = socket.recv(&mut &mut buf[..], 0)?;
    if len >= NLMSG_HEADER + 4 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        let errno = -i32::from_ne_bytes(buf[NLMSG_HEADER..NLMSG_HEADER + 4].try_into().expect("4 bytes"));
        if errno != 0 && errno != libc::ENOENT {
            return Err(io::Error::from_raw_os_error(errno));
        }
    }
    Ok(())
}

/// Closes the calling namespace's connected UDP sockets whose cookie is in `cookies` and
/// whose peer is in `endpoints`. Returns how many were closed.
pub fn destroy_udp_sockets(cookies: &BTreeSet<u64>, endpoints: &BTreeSet<SocketAddr>) -> io::Result<usize> {
    if cookies.is_empty() {
        return Ok(0);
    }
    let mut closed = 0;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        for id in connected_udp_sockets(family)? {
            let peer = canonical(id.peer());
            if cookies.contains(&id.cookie()) && endpoints.contains(&peer) {
                destroy(&id)?;
                closed += 1;
            }
        }
    }
    Ok(closed)
}

/// An IPv4-mapped IPv6 peer (a dual-stack socket talking IPv4) as the IPv4 address.
fn canonical(address: SocketAddr) -> SocketAddr {
    match address.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), address.port()),
            None => address,
        },
        IpAddr::V4(_) => address,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destroy_request_carries_the_dumped_socket_id_whole() {
        let mut raw = [0u8; SOCKID_LEN];
        raw[2..4].copy_from_slice(&53u16.to_be_bytes());
        raw[20..24].copy_from_slice(&[198, 18, 129, 1]);
        raw[40..48].copy_from_slice(&7u64.to_ne_bytes());
        let id = UdpSocketId { family: libc::AF_INET as u8, raw };
        assert_eq!(id.peer(), "198.18.129.1:53".parse().unwrap());
        let message = request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 9, id.family, Some(&id.raw));
        assert_eq!(message.len(), NLMSG_HEADER + REQUEST_LEN);
        assert_eq!(u16::from_ne_bytes([message[4], message[5]]), SOCK_DESTROY);
        assert_eq!(message[NLMSG_HEADER + 1], libc::IPPROTO_UDP as u8);
        assert_eq!(&message[NLMSG_HEADER + 8..], &raw);
    }
}
