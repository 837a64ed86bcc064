//! AF_PACKET sockets bound to one interface: the only raw system calls of this crate.
// Packet sockets, their link-layer address and classic BPF filters have no safe wrapper in
// nix 0.31; these few calls are made here, and only here.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A raw packet socket for one Ethernet protocol on one interface.
#[derive(Debug)]
pub(crate) struct PacketSocket {
    fd: OwnedFd,
}

/// Accepts ICMPv6 Neighbor Solicitations without extension headers, drops everything else
/// (so the IPv6 socket does not copy the Service traffic itself to user space).
const NS_FILTER: [libc::sock_filter; 8] = [
    libc::sock_filter { code: 0x28, jt: 0, jf: 0, k: 12 }, // ldh [12] (ethertype)
    libc::sock_filter { code: 0x15, jt: 0, jf: 5, k: 0x86dd }, // jeq IPv6
    libc::sock_filter { code: 0x30, jt: 0, jf: 0, k: 20 }, // ldb [20] (next header)
    libc::sock_filter { code: 0x15, jt: 0, jf: 3, k: 58 }, // jeq ICMPv6
    libc::sock_filter { code: 0x30, jt: 0, jf: 0, k: 54 }, // ldb [54] (ICMPv6 type)
    libc::sock_filter { code: 0x15, jt: 0, jf: 1, k: 135 }, // jeq Neighbor Solicitation
    libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0xffff }, // accept
    libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0 },  // drop
];

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn setsockopt<T>(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<T>()).unwrap_or(0);
    // SAFETY: `value` points at a live T of `len` bytes for the duration of the call.
    check(unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, std::ptr::from_ref(value).cast(), len) })
}

impl PacketSocket {
    /// Opens a socket for `protocol` (an ethertype) bound to interface `ifindex`; reads time
    /// out after `timeout`. `ns_only` attaches the Neighbor Solicitation filter and joins
    /// every multicast group of the interface (solicited-node addresses included).
    pub(crate) fn open(ifindex: u32, protocol: u16, timeout: Duration, ns_only: bool) -> io::Result<Self> {
        // SAFETY: plain socket(2); the returned descriptor is owned below.
        let raw = unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::c_int::from(protocol.to_be()))
        };
        check(raw)?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let index = libc::c_int::try_from(ifindex).map_err(|_| io::Error::other("interface index out of range"))?;
        if ns_only {
            let program = libc::sock_fprog { len: 8, filter: NS_FILTER.as_ptr().cast_mut() };
            setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &program)?;
            let membership = libc::packet_mreq {
                mr_ifindex: index,
                mr_type: u16::try_from(libc::PACKET_MR_ALLMULTI).unwrap_or(2),
                mr_alen: 0,
                mr_address: [0; 8],
            };
            setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &membership)?;
        }
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(17);
        address.sll_protocol = protocol.to_be();
        address.sll_ifindex = index;
        let len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or(0);
        // SAFETY: `address` is a live sockaddr_ll of `len` bytes.
        check(unsafe { libc::bind(fd.as_raw_fd(), std::ptr::from_ref(&address).cast(), len) })?;
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(1),
            tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
        };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        Ok(Self { fd })
    }

    /// One frame into `buffer`; `Ok(None)` when the read timed out.
    pub(crate) fn receive(&self, buffer: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buffer` is writable for its whole length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            return match error.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(error),
            };
        }
        Ok(Some(usize::try_from(n).unwrap_or(0)))
    }

    /// Sends one whole Ethernet frame out of the bound interface.
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is readable for its whole length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }
}
