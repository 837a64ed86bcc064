//! Members added to and deleted from existing ipsets over nfnetlink (the `ip_set`
//! subsystem), with no `ipset` process: what an endpoint change needs once the sets exist.
//!
//! It creates, swaps and destroys no set and reads none back: the caller keeps doing that
//! with the `ipset` program, which a sync needs only when sets appear or go. Like
//! `ipset restore -exist`, adding a member that is there or deleting one that is not is no
//! error. Requests go [`crate::BATCH`] to a `sendmsg`, each acknowledged on its own, so an
//! error names the member and set the kernel refused; [`undo`] gives the changes that take
//! back the ones the kernel made.

use std::fmt;
use std::io;
use std::net::IpAddr;

use svcplane_net::Protocol;

use crate::IpvsError;
use crate::channel::Channel;
use crate::wire::{NETLINK_NETFILTER, NLA_F_NET_BYTEORDER, NLM_F_ACK, NLM_F_REQUEST, Request, protocol_number};

// linux/netfilter/nfnetlink.h and linux/netfilter/ipset/ip_set.h
const NFNL_SUBSYS_IPSET: u8 = 6;
/// The oldest protocol version kernels still take for these commands (`IPSET_PROTOCOL_MIN`).
const IPSET_PROTOCOL: u8 = 6;
const IPSET_CMD_ADD: u8 = 9;
const IPSET_CMD_DEL: u8 = 10;
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_DATA: u16 = 7;
const IPSET_ATTR_IP: u16 = 1;
const IPSET_ATTR_CIDR: u16 = 3;
const IPSET_ATTR_PORT: u16 = 4;
const IPSET_ATTR_PROTO: u16 = 7;
const IPSET_ATTR_IP2: u16 = 20;
const IPSET_ATTR_CIDR2: u16 = 21;
const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
const IPSET_ATTR_IPADDR_IPV6: u16 = 2;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// The longest set name the kernel takes, its terminator included (`IPSET_MAXNAMELEN`).
const IPSET_MAXNAMELEN: usize = 32;

/// One member as the kernel's set types take it: the parts a set's type does not have are
/// `None` (`hash:ip,port` has an address, a protocol and a port; `hash:net` an address and a
/// prefix length; `bitmap:port` a port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    pub address: Option<IpAddr>,
    /// The prefix length of `address` when the set holds nets.
    pub prefix: Option<u8>,
    pub protocol: Option<Protocol>,
    pub port: Option<u16>,
    /// The second address (`hash:ip,port,ip`) or net (`hash:ip,port,net`).
    pub address2: Option<IpAddr>,
    pub prefix2: Option<u8>,
}

impl fmt::Display for Entry {
    /// As `ipset` spells members: `198.19.0.10,tcp:80,198.18.1.2`, `198.18.0.0/16`, `30080`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(address) = self.address {
            parts.push(self.prefix.map_or(address.to_string(), |prefix| format!("{address}/{prefix}")));
        }
        match (self.protocol, self.port) {
            (Some(protocol), Some(port)) => parts.push(format!("{}:{port}", protocol.as_str())),
            (None, Some(port)) => parts.push(port.to_string()),
            _ => {}
        }
        if let Some(address) = self.address2 {
            parts.push(self.prefix2.map_or(address.to_string(), |prefix| format!("{address}/{prefix}")));
        }
        f.write_str(&parts.join(","))
    }
}

/// Whether a member goes in or out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Add,
    Delete,
}

/// One member to add to or delete from the existing set `set`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberChange {
    pub set: String,
    pub operation: Operation,
    pub entry: Entry,
}

impl MemberChange {
    fn describe(&self) -> (&'static str, String) {
        match self.operation {
            Operation::Add => ("adding", format!("{} to ipset {}", self.entry, self.set)),
            Operation::Delete => ("deleting", format!("{} from ipset {}", self.entry, self.set)),
        }
    }
}

/// The request for `change` with sequence number `seq`, asking for an ack. Without
/// `NLM_F_EXCL` the kernel takes a member that is already there (or, deleting, one that is
/// not) as done, as `ipset -exist` asks.
fn encode(change: &MemberChange, seq: u32) -> Vec<u8> {
    let command = match change.operation {
        Operation::Add => IPSET_CMD_ADD,
        Operation::Delete => IPSET_CMD_DEL,
    };
    let entry = &change.entry;
    let family = match entry.address {
        Some(IpAddr::V6(_)) => AF_INET6,
        _ => AF_INET,
    };
    let mut request = Request::netfilter(NFNL_SUBSYS_IPSET, command, NLM_F_REQUEST | NLM_F_ACK, seq, family);
    request.u8(IPSET_ATTR_PROTOCOL, IPSET_PROTOCOL).string(IPSET_ATTR_SETNAME, &change.set);
    request.begin_nest(IPSET_ATTR_DATA);
    if let Some(address) = entry.address {
        address_attr(&mut request, IPSET_ATTR_IP, address);
    }
    if let Some(prefix) = entry.prefix {
        request.u8(IPSET_ATTR_CIDR, prefix);
    }
    if let Some(port) = entry.port {
        request.attr(IPSET_ATTR_PORT | NLA_F_NET_BYTEORDER, &port.to_be_bytes());
    }
    if let Some(protocol) = entry.protocol {
        request.u8(IPSET_ATTR_PROTO, protocol_number(protocol) as u8);
    }
    if let Some(address) = entry.address2 {
        address_attr(&mut request, IPSET_ATTR_IP2, address);
    }
    if let Some(prefix) = entry.prefix2 {
        request.u8(IPSET_ATTR_CIDR2, prefix);
    }
    request.end_nest();
    request.finish()
}

/// An address nest: the address in network order, flagged as such (the kernel refuses an
/// address attribute without the flag).
fn address_attr(request: &mut Request, kind: u16, address: IpAddr) {
    request.begin_nest(kind);
    match address {
        IpAddr::V4(v4) => request.attr(IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &v4.octets()),
        IpAddr::V6(v6) => request.attr(IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &v6.octets()),
    };
    request.end_nest();
}

/// The kernel's answer as an error: ipset's own codes (from 4096) have no text in libc.
fn ipset_error(errno: i32) -> io::Error {
    let text = match errno {
        4097 => "the kernel's ipset refused the request's protocol or attributes",
        4102 => "the member does not fit the set's type",
        4103 => "the member is already in the set, or not in it",
        4104 => "invalid prefix length",
        4106 => "the member's family is not the set's",
        4109 => "an IPv4 address was expected",
        4110 => "an IPv6 address was expected",
        4352 => "the set is full (or the member is out of a bitmap set's range)",
        4354 => "invalid protocol",
        4355 => "the member has no protocol",
        libc::ENOENT => return io::Error::new(io::ErrorKind::NotFound, "the set does not exist"),
        errno if errno > 4096 => return io::Error::other(format!("ipset error {errno}")),
        errno => return io::Error::from_raw_os_error(errno),
    };
    io::Error::other(text)
}

/// The ipsets of the network namespace the socket was opened in.
#[derive(Debug)]
pub struct IpSets {
    channel: Channel,
}

impl IpSets {
    /// Opens a netfilter netlink socket in the calling thread's network namespace. Needs
    /// CAP_NET_ADMIN; the `ip_set` module is loaded by whoever created the sets.
    pub fn new() -> Result<Self, IpvsError> {
        Ok(IpSets { channel: Channel::open(NETLINK_NETFILTER).map_err(IpvsError::Socket)? })
    }

    /// Adds and deletes members in order, [`crate::BATCH`] requests per `sendmsg`, every
    /// one tried; the ones the kernel refused, as (index in `changes`, error naming the
    /// member and set). An `Err` is the socket's: which changes were made is then unknown.
    pub fn try_each(&mut self, changes: &[MemberChange]) -> Result<Vec<(usize, IpvsError)>, IpvsError> {
        let mut refused = Vec::new();
        for (number, change) in changes.iter().enumerate() {
            if change.set.len() >= IPSET_MAXNAMELEN {
                let (operation, object) = change.describe();
                let source = io::Error::other(format!("set names have at most {} bytes", IPSET_MAXNAMELEN - 1));
                refused.push((number, IpvsError::Request { operation, object, source }));
            }
        }
        let sendable: Vec<(usize, &MemberChange)> =
            changes.iter().enumerate().filter(|(_, change)| change.set.len() < IPSET_MAXNAMELEN).collect();
        for chunk in sendable.chunks(crate::BATCH) {
            let first = self.channel.peek_seq();
            let mut buf = Vec::with_capacity(chunk.len() * 96);
            for (_, change) in chunk {
                let seq = self.channel.next_seq();
                buf.extend_from_slice(&encode(change, seq));
            }
            let acks = self.channel.acknowledged_batch(&buf, first, chunk.len()).map_err(|source| {
                let (operation, object) = chunk[0].1.describe();
                let object = if chunk.len() > 1 { format!("{object} and {} more", chunk.len() - 1) } else { object };
                IpvsError::Request { operation, object, source }
            })?;
            for (index, errno) in acks.refused() {
                let (number, change) = chunk[index];
                let (operation, object) = change.describe();
                refused.push((number, IpvsError::Request { operation, object, source: ipset_error(errno) }));
            }
        }
        refused.sort_by_key(|(number, _)| *number);
        Ok(refused)
    }

    /// Adds and deletes members in order; the first member the kernel refused is the error
    /// (every change was tried).
    pub fn apply(&mut self, changes: &[MemberChange]) -> Result<(), IpvsError> {
        match self.try_each(changes)?.into_iter().next() {
            Some((_, error)) => Err(error),
            None => Ok(()),
        }
    }
}

/// The changes that undo `changes` (the ones at `refused` were not made): each added member
/// deleted and each deleted one added, last first.
pub fn undo(changes: &[MemberChange], refused: &[usize]) -> Vec<MemberChange> {
    changes
        .iter()
        .enumerate()
        .rev()
        .filter(|(number, _)| !refused.contains(number))
        .map(|(_, change)| MemberChange {
            operation: match change.operation {
                Operation::Add => Operation::Delete,
                Operation::Delete => Operation::Add,
            },
            ..change.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{attributes, messages};

    fn hairpin() -> Entry {
        Entry {
            address: Some("198.18.1.2".parse().unwrap()),
            protocol: Some(Protocol::Tcp),
            port: Some(8080),
            address2: Some("198.18.1.2".parse().unwrap()),
            ..Entry::default()
        }
    }

    #[test]
    fn members_are_spelled_as_ipset_spells_them() {
        assert_eq!(hairpin().to_string(), "198.18.1.2,tcp:8080,198.18.1.2");
        let net = Entry { address: Some("198.18.0.0".parse().unwrap()), prefix: Some(16), ..Entry::default() };
        assert_eq!(net.to_string(), "198.18.0.0/16");
        assert_eq!(Entry { port: Some(30080), ..Entry::default() }.to_string(), "30080");
    }

    #[test]
    fn an_add_request_carries_the_set_name_and_the_members_parts_in_network_order() {
        let change = MemberChange { set: "KUBE-LOOP-BACK".to_owned(), operation: Operation::Add, entry: hairpin() };
        let buf = encode(&change, 42);
        let parsed = messages(&buf);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].msg_type, u16::from(NFNL_SUBSYS_IPSET) << 8 | u16::from(IPSET_CMD_ADD));
        assert_eq!(parsed[0].seq, 42);
        assert_eq!(parsed[0].payload[..2], [AF_INET, 0], "nfgenmsg: family, NFNETLINK_V0");
        let top = attributes(&parsed[0].payload[4..]);
        assert_eq!(top[0], (IPSET_ATTR_PROTOCOL, &[IPSET_PROTOCOL][..]));
        assert_eq!(top[1], (IPSET_ATTR_SETNAME, &b"KUBE-LOOP-BACK\0"[..]));
        assert_eq!(top[2].0, IPSET_ATTR_DATA);
        let data = attributes(top[2].1);
        let kinds: Vec<u16> = data.iter().map(|(kind, _)| *kind).collect();
        assert_eq!(kinds, vec![IPSET_ATTR_IP, IPSET_ATTR_PORT, IPSET_ATTR_PROTO, IPSET_ATTR_IP2]);
        assert_eq!(attributes(data[0].1), vec![(IPSET_ATTR_IPADDR_IPV4, &[198, 18, 1, 2][..])]);
        assert_eq!(data[1].1, &8080u16.to_be_bytes()[..]);
        assert_eq!(data[2].1, &[6][..]);
    }

    #[test]
    fn undoing_takes_back_only_what_was_made_last_first() {
        let add = MemberChange { set: "KUBE-LOOP-BACK".to_owned(), operation: Operation::Add, entry: hairpin() };
        let port = Entry { port: Some(30080), ..Entry::default() };
        let delete = MemberChange { set: "KUBE-NODE-PORT-TCP".to_owned(), operation: Operation::Delete, entry: port };
        let refused = MemberChange { set: "KUBE-GONE".to_owned(), ..add.clone() };
        let undone = undo(&[add.clone(), refused, delete.clone()], &[1]);
        assert_eq!(
            undone,
            vec![
                MemberChange { operation: Operation::Add, ..delete },
                MemberChange { operation: Operation::Delete, ..add }
            ]
        );
    }

    #[test]
    fn ipsets_own_error_codes_read_as_words() {
        assert_eq!(ipset_error(4102).to_string(), "the member does not fit the set's type");
        assert_eq!(ipset_error(libc::ENOENT).kind(), io::ErrorKind::NotFound);
    }
}
