//! The address and port pools allocation draws from: offsets into a range, probed from a
//! name's hash so the same Service tends to get the same value, with a static part kept for
//! values set explicitly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::NodePortRange;
use crate::error::{ConfigError, Reason};
use crate::ip_family::IpFamily;

/// Offsets `start..end` of a range, of which the first `static_len` are kept for explicit
/// values as long as the rest has room.
#[derive(Debug, Clone, Copy)]
pub(super) struct Band {
    pub(super) start: u128,
    pub(super) end: u128,
    pub(super) static_len: u128,
}

impl Band {
    pub(super) fn new(start: u128, end: u128) -> Self {
        let len = end - start;
        let static_len = if len < 64 { 0 } else { (len / 16).clamp(16, 256) };
        Self { start, end, static_len }
    }

    /// The first free offset probing forward (with wrap-around) from the hash's slot in
    /// the dynamic part, then likewise in the static part.
    pub(super) fn find_free(&self, hash: u64, mut is_free: impl FnMut(u128) -> bool) -> Option<u128> {
        let split = self.start + self.static_len;
        for (low, high) in [(split, self.end), (self.start, split)] {
            let len = high - low;
            if len == 0 {
                continue;
            }
            let first = u128::from(hash) % len;
            for step in 0..len {
                let index = if step < len - first { first + step } else { step - (len - first) };
                if is_free(low + index) {
                    return Some(low + index);
                }
            }
        }
        None
    }
}

/// A service CIDR, addressed by offset from its network address.
#[derive(Debug, Clone)]
pub(super) struct IpPool {
    pub(super) cidr: IpNet,
    pub(super) family: IpFamily,
    pub(super) base: u128,
    /// Offset of the IPv4 broadcast address; `None` for IPv6.
    pub(super) broadcast: Option<u128>,
    /// Offsets 2.. (0 is the network address, 1 is reserved for `kubernetes`).
    pub(super) band: Band,
}

impl IpPool {
    pub(super) fn new(cidr: IpNet) -> Result<Self, ConfigError> {
        if cidr.trunc() != cidr {
            return Err(ConfigError::HostBitsSet { cidr, network: cidr.trunc() });
        }
        let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
        let size = if host_bits >= 128 { u128::MAX } else { 1u128 << host_bits };
        let (family, base, broadcast) = match cidr.network() {
            IpAddr::V4(network) => (IpFamily::V4, u128::from(u32::from(network)), Some(size - 1)),
            IpAddr::V6(network) => (IpFamily::V6, u128::from(network), None),
        };
        let end = broadcast.unwrap_or(size);
        if end <= 2 {
            return Err(ConfigError::CidrTooSmall { cidr });
        }
        Ok(Self { cidr, family, base, broadcast, band: Band::new(2, end) })
    }

    pub(super) fn offset(&self, ip: IpAddr) -> u128 {
        let value = match ip {
            IpAddr::V4(ip) => u128::from(u32::from(ip)),
            IpAddr::V6(ip) => u128::from(ip),
        };
        value - self.base
    }

    pub(super) fn address(&self, offset: u128) -> IpAddr {
        let value = self.base + offset;
        match self.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(value).expect("offset inside an IPv4 CIDR"))),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(value)),
        }
    }

    /// Refuses the network and broadcast address of an `ip` inside the CIDR.
    pub(super) fn check_explicit(&self, ip: IpAddr) -> Result<(), Reason> {
        let offset = self.offset(ip);
        if offset == 0 {
            return Err(Reason::UnusableAddress { ip, cidr: self.cidr, what: "network address" });
        }
        if Some(offset) == self.broadcast {
            return Err(Reason::UnusableAddress { ip, cidr: self.cidr, what: "broadcast address" });
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub(super) struct PortPool {
    pub(super) band: Band,
}

impl PortPool {
    pub(super) fn new(range: NodePortRange) -> Self {
        Self { band: Band::new(u128::from(range.first), u128::from(range.last) + 1) }
    }

    pub(super) fn port(&self, offset: u128) -> u16 {
        u16::try_from(offset).expect("offsets of a port band are ports")
    }
}
