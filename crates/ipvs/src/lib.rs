//! The IPVS mechanism: virtual services and their real servers in the kernel's IPVS table,
//! through the `IPVS` generic netlink family directly (no `ipvsadm` process).
//!
//! It reads the kernel's current table ([`Ipvs::services`], [`Ipvs::destinations`]), works
//! out the difference to a wanted table ([`diff`], pure), and applies it one request per
//! change ([`Ipvs::apply`]), so a sync that changes one endpoint sends one message; many
//! changes go [`BATCH`] requests to a `sendmsg`, each still acknowledged on its own, so an
//! error names the change the kernel refused. It also
//! sets the connection timeouts ([`Ipvs::set_timeouts`]). [`DummyInterface`] keeps the
//! virtual addresses on a dummy interface (kube-proxy's `kube-ipvs0`) with the `ip` program.
//!
//! It decides nothing and knows nothing of Services: which addresses, schedulers, weights
//! and persistence to program is the caller's business (svcplane's core decides, the IPVS
//! backend spells it). Besides services by (address, protocol, port) it programs firewall
//! mark services ([`ServiceKey::for_fwmark`]: IPVS takes a packet whose mark is the
//! service's before looking at its destination); it marks no packet itself. It does not
//! touch forwarding methods other than masquerading (NAT), ipsets or iptables rules.

mod channel;
mod interface;
pub mod ipset;
mod wire;

pub use interface::{DummyInterface, local_addresses};

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

use svcplane_net::Protocol;

use channel::Channel;
use wire::*;

/// What identifies a virtual service: address, protocol, port; or, for a firewall mark
/// service (`fwmark` not 0), the mark and the family (the address is the family's
/// unspecified address, the protocol TCP and the port 0, as the kernel keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub address: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
    /// 0 for a service by address; otherwise the packet mark the service takes.
    pub fwmark: u32,
}

impl ServiceKey {
    /// The service on `address`, `protocol`, `port`.
    pub fn new(address: IpAddr, protocol: Protocol, port: u16) -> Self {
        ServiceKey { address, protocol, port, fwmark: 0 }
    }

    /// The firewall mark service of `mark` (not 0) in the family of `family`: it takes
    /// packets of any protocol and destination whose mark is exactly `mark`.
    pub fn for_fwmark(family: IpAddr, mark: u32) -> Self {
        let address = if family.is_ipv4() {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        };
        ServiceKey { address, protocol: Protocol::Tcp, port: 0, fwmark: mark }
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.fwmark != 0 {
            let family = if self.address.is_ipv4() { "IPv4" } else { "IPv6" };
            return write!(f, "fwmark {:#x} {family}", self.fwmark);
        }
        match self.address {
            IpAddr::V4(address) => write!(f, "{} {address}:{}", self.protocol.as_str(), self.port),
            IpAddr::V6(address) => write!(f, "{} [{address}]:{}", self.protocol.as_str(), self.port),
        }
    }
}

/// A virtual service: scheduler (`rr`, `wrr`, `lc`, ...) and persistence (session
/// affinity) in seconds, 0 for none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub key: ServiceKey,
    pub scheduler: String,
    pub persistence_seconds: u32,
}

/// A real server of a virtual service, masqueraded (NAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Destination {
    pub address: IpAddr,
    pub port: u16,
    /// 0 takes no new connections (graceful termination) but keeps existing ones.
    pub weight: u32,
}

/// A virtual service with its real servers, keyed by (address, port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    pub service: Service,
    pub destinations: BTreeMap<(IpAddr, u16), Destination>,
}

/// A destination as the kernel reports it, with its connection counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestinationState {
    pub destination: Destination,
    pub active_connections: u32,
    pub inactive_connections: u32,
}

/// One change to the kernel's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    AddService(Service),
    /// Scheduler or persistence changed.
    UpdateService(Service),
    DeleteService(ServiceKey),
    AddDestination(ServiceKey, Destination),
    /// Weight changed.
    UpdateDestination(ServiceKey, Destination),
    DeleteDestination(ServiceKey, Destination),
}

/// The changes that turn `current` into `wanted`: services first (deleted services take
/// their destinations with them), then destinations. Services in `current` but not in
/// `wanted` are deleted: the caller passes only the services it owns.
pub fn diff(current: &[ServiceEntry], wanted: &[ServiceEntry]) -> Vec<Change> {
    let current: BTreeMap<ServiceKey, &ServiceEntry> = current.iter().map(|entry| (entry.service.key, entry)).collect();
    let wanted: BTreeMap<ServiceKey, &ServiceEntry> = wanted.iter().map(|entry| (entry.service.key, entry)).collect();
    let mut changes = Vec::new();
    for key in current.keys() {
        if !wanted.contains_key(key) {
            changes.push(Change::DeleteService(*key));
        }
    }
    for (key, entry) in &wanted {
        let empty = BTreeMap::new();
        let had = match current.get(key) {
            None => {
                changes.push(Change::AddService(entry.service.clone()));
                &empty
            }
            Some(existing) => {
                if existing.service != entry.service {
                    changes.push(Change::UpdateService(entry.service.clone()));
                }
                &existing.destinations
            }
        };
        for (id, destination) in had {
            if !entry.destinations.contains_key(id) {
                changes.push(Change::DeleteDestination(*key, *destination));
            }
        }
        for (id, destination) in &entry.destinations {
            match had.get(id) {
                None => changes.push(Change::AddDestination(*key, *destination)),
                Some(existing) if existing.weight != destination.weight => {
                    changes.push(Change::UpdateDestination(*key, *destination));
                }
                Some(_) => {}
            }
        }
    }
    changes
}

/// Connection timeouts in seconds; 0 leaves one as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum IpvsError {
    #[error("opening a generic netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("the kernel has no IPVS generic netlink family (is the ip_vs module loaded?): errno {errno}")]
    NoFamily { errno: i32 },
    #[error("{operation} {object}: {source}")]
    Request {
        operation: &'static str,
        object: String,
        #[source]
        source: io::Error,
    },
}

/// Requests per `sendmsg` in [`Ipvs::apply`]. Their acks wait in the socket's receive
/// buffer until read (the kernel drops an ack that does not fit, and the socket then
/// reports `ENOBUFS`): 64 acks, of at most a few hundred bytes each with their socket
/// buffer overhead, fit in the default buffer many times over.
pub const BATCH: usize = 64;

/// What `change` does, as an error names it: the operation and its object.
fn describe(change: &Change) -> (&'static str, String) {
    match change {
        Change::AddService(service) => {
            ("adding", format!("IPVS service {} (scheduler {})", service.key, service.scheduler))
        }
        Change::UpdateService(service) => {
            ("updating", format!("IPVS service {} (scheduler {})", service.key, service.scheduler))
        }
        Change::DeleteService(key) => ("deleting", format!("IPVS service {key}")),
        Change::AddDestination(key, destination)
        | Change::UpdateDestination(key, destination)
        | Change::DeleteDestination(key, destination) => {
            let operation = match change {
                Change::AddDestination(..) => "adding",
                Change::UpdateDestination(..) => "updating",
                _ => "deleting",
            };
            let object = format!(
                "real server {} port {} (weight {}) of IPVS service {key}",
                destination.address, destination.port, destination.weight
            );
            (operation, object)
        }
    }
}

/// The request for `change`, asking for an ack, with sequence number `seq`.
fn encode_change(family: u16, change: &Change, seq: u32) -> Vec<u8> {
    let flags = NLM_F_REQUEST | NLM_F_ACK;
    match change {
        Change::AddService(service) | Change::UpdateService(service) => {
            let cmd = if matches!(change, Change::AddService(_)) { IPVS_CMD_NEW_SERVICE } else { IPVS_CMD_SET_SERVICE };
            let mut request = Request::new(family, flags, seq, cmd, IPVS_GENL_VERSION);
            request.begin_nest(IPVS_CMD_ATTR_SERVICE).service(service).end_nest();
            request.finish()
        }
        Change::DeleteService(key) => {
            let mut request = Request::new(family, flags, seq, IPVS_CMD_DEL_SERVICE, IPVS_GENL_VERSION);
            request.begin_nest(IPVS_CMD_ATTR_SERVICE).service_key(key).end_nest();
            request.finish()
        }
        Change::AddDestination(key, destination)
        | Change::UpdateDestination(key, destination)
        | Change::DeleteDestination(key, destination) => {
            let cmd = match change {
                Change::AddDestination(..) => IPVS_CMD_NEW_DEST,
                Change::UpdateDestination(..) => IPVS_CMD_SET_DEST,
                _ => IPVS_CMD_DEL_DEST,
            };
            let mut request = Request::new(family, flags, seq, cmd, IPVS_GENL_VERSION);
            request.begin_nest(IPVS_CMD_ATTR_SERVICE).service_key(key).end_nest();
            request.begin_nest(IPVS_CMD_ATTR_DEST);
            if cmd == IPVS_CMD_DEL_DEST {
                request.destination_key(destination);
            } else {
                request.destination(destination);
            }
            request.end_nest();
            request.finish()
        }
    }
}

/// The kernel's IPVS table in the network namespace the socket was opened in.
#[derive(Debug)]
pub struct Ipvs {
    channel: Channel,
    family: u16,
}

impl Ipvs {
    /// Opens a generic netlink socket in the calling thread's network namespace and finds
    /// the IPVS family. Needs CAP_NET_ADMIN and the `ip_vs` module (the kernel does not
    /// autoload it for generic netlink).
    pub fn new() -> Result<Self, IpvsError> {
        let channel = Channel::open(NETLINK_GENERIC).map_err(IpvsError::Socket)?;
        let mut ipvs = Ipvs { channel, family: GENL_ID_CTRL };
        let seq = ipvs.next_seq();
        let mut request = Request::new(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK, seq, CTRL_CMD_GETFAMILY, 1);
        request.string(CTRL_ATTR_FAMILY_NAME, IPVS_GENL_NAME);
        let (replies, errno) = ipvs.channel.request(&request.finish(), seq).map_err(IpvsError::Socket)?;
        ipvs.family = replies.iter().find_map(|reply| family_id(reply)).ok_or(IpvsError::NoFamily { errno })?;
        Ok(ipvs)
    }

    fn next_seq(&mut self) -> u32 {
        self.channel.next_seq()
    }

    /// Every TCP, UDP and SCTP virtual service, and every firewall mark service.
    pub fn services(&mut self) -> Result<Vec<Service>, IpvsError> {
        let seq = self.next_seq();
        let request =
            Request::new(self.family, NLM_F_REQUEST | NLM_F_DUMP, seq, IPVS_CMD_GET_SERVICE, IPVS_GENL_VERSION);
        let failed = |source| IpvsError::Request { operation: "listing", object: "IPVS services".to_owned(), source };
        let (replies, errno) = self.channel.request(&request.finish(), seq).map_err(failed)?;
        if errno != 0 {
            return Err(failed(io::Error::from_raw_os_error(errno)));
        }
        Ok(replies.iter().filter_map(|reply| parse_service(reply)).collect())
    }

    /// The real servers of `service`.
    pub fn destinations(&mut self, service: &ServiceKey) -> Result<Vec<DestinationState>, IpvsError> {
        let seq = self.next_seq();
        let mut request =
            Request::new(self.family, NLM_F_REQUEST | NLM_F_DUMP, seq, IPVS_CMD_GET_DEST, IPVS_GENL_VERSION);
        request.begin_nest(IPVS_CMD_ATTR_SERVICE).service_key(service).end_nest();
        let failed = |source| IpvsError::Request {
            operation: "listing the real servers of",
            object: format!("IPVS service {service}"),
            source,
        };
        let (replies, errno) = self.channel.request(&request.finish(), seq).map_err(failed)?;
        if errno != 0 {
            return Err(failed(io::Error::from_raw_os_error(errno)));
        }
        Ok(replies
            .iter()
            .filter_map(|reply| parse_destination(reply, service.address))
            .map(|(destination, active_connections, inactive_connections)| DestinationState {
                destination,
                active_connections,
                inactive_connections,
            })
            .collect())
    }

    /// The whole table: every service with its real servers.
    pub fn table(&mut self) -> Result<Vec<ServiceEntry>, IpvsError> {
        let mut entries = Vec::new();
        for service in self.services()? {
            let destinations = self
                .destinations(&service.key)?
                .into_iter()
                .map(|state| ((state.destination.address, state.destination.port), state.destination))
                .collect();
            entries.push(ServiceEntry { service, destinations });
        }
        Ok(entries)
    }

    /// Applies `changes` in order, one acknowledged request each, [`BATCH`] requests per
    /// `sendmsg` (the kernel handles the messages of one send in order and acknowledges
    /// each). Stops after the first batch the kernel refused something of, naming the first
    /// change it refused; the later changes of that batch were tried too (a real server of
    /// a service that could not be added is refused as well), and the caller reads the
    /// table again before its next diff.
    pub fn apply(&mut self, changes: &[Change]) -> Result<(), IpvsError> {
        for chunk in changes.chunks(BATCH) {
            let first = self.channel.peek_seq();
            let mut buf = Vec::with_capacity(chunk.len() * 128);
            for change in chunk {
                let seq = self.next_seq();
                buf.extend_from_slice(&encode_change(self.family, change, seq));
            }
            let acks = self.channel.acknowledged_batch(&buf, first, chunk.len()).map_err(|source| {
                let (operation, object) = describe(&chunk[0]);
                let object = if chunk.len() > 1 { format!("{object} and {} more", chunk.len() - 1) } else { object };
                IpvsError::Request { operation, object, source }
            })?;
            if let Some((index, errno)) = acks.first_refused() {
                let (operation, object) = describe(&chunk[index]);
                return Err(IpvsError::Request { operation, object, source: io::Error::from_raw_os_error(errno) });
            }
        }
        Ok(())
    }

    /// Sets the TCP, TCP FIN and UDP connection timeouts (`ipvsadm --set`).
    pub fn set_timeouts(&mut self, timeouts: Timeouts) -> Result<(), IpvsError> {
        let seq = self.next_seq();
        let mut request =
            Request::new(self.family, NLM_F_REQUEST | NLM_F_ACK, seq, IPVS_CMD_SET_CONFIG, IPVS_GENL_VERSION);
        request
            .u32(IPVS_CMD_ATTR_TIMEOUT_TCP, timeouts.tcp)
            .u32(IPVS_CMD_ATTR_TIMEOUT_TCP_FIN, timeouts.tcp_fin)
            .u32(IPVS_CMD_ATTR_TIMEOUT_UDP, timeouts.udp);
        let object = format!("IPVS timeouts (tcp {}, tcpfin {}, udp {})", timeouts.tcp, timeouts.tcp_fin, timeouts.udp);
        self.acknowledged(&request.finish(), seq, "setting", object)
    }

    fn acknowledged(&mut self, buf: &[u8], seq: u32, operation: &'static str, object: String) -> Result<(), IpvsError> {
        match self.channel.request(buf, seq) {
            Ok((_, 0)) => Ok(()),
            Ok((_, errno)) => {
                Err(IpvsError::Request { operation, object, source: io::Error::from_raw_os_error(errno) })
            }
            Err(source) => Err(IpvsError::Request { operation, object, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::Acks;

    fn key(port: u16) -> ServiceKey {
        ServiceKey::new("198.19.0.10".parse().unwrap(), Protocol::Tcp, port)
    }

    fn destination(last: u8, weight: u32) -> Destination {
        Destination { address: IpAddr::from([198, 18, 2, last]), port: 8080, weight }
    }

    fn entry(port: u16, scheduler: &str, destinations: &[Destination]) -> ServiceEntry {
        ServiceEntry {
            service: Service { key: key(port), scheduler: scheduler.to_owned(), persistence_seconds: 0 },
            destinations: destinations.iter().map(|d| ((d.address, d.port), *d)).collect(),
        }
    }

    #[test]
    fn an_unchanged_table_needs_no_change() {
        let table = vec![entry(80, "rr", &[destination(2, 1), destination(3, 1)])];
        assert_eq!(diff(&table, &table), vec![]);
    }

    #[test]
    fn one_endpoint_more_is_one_added_real_server() {
        let current = vec![entry(80, "rr", &[destination(2, 1)])];
        let wanted = vec![entry(80, "rr", &[destination(2, 1), destination(3, 1)])];
        assert_eq!(diff(&current, &wanted), vec![Change::AddDestination(key(80), destination(3, 1))]);
    }

    #[test]
    fn a_weight_change_updates_and_a_gone_endpoint_is_deleted() {
        let current = vec![entry(80, "rr", &[destination(2, 1), destination(3, 1)])];
        let wanted = vec![entry(80, "rr", &[destination(2, 0)])];
        assert_eq!(
            diff(&current, &wanted),
            vec![
                Change::DeleteDestination(key(80), destination(3, 1)),
                Change::UpdateDestination(key(80), destination(2, 0)),
            ]
        );
    }

    #[test]
    fn a_new_scheduler_updates_the_service_and_a_gone_service_is_deleted_whole() {
        let current = vec![entry(80, "rr", &[destination(2, 1)]), entry(81, "rr", &[destination(2, 1)])];
        let wanted = vec![entry(80, "lc", &[destination(2, 1)])];
        let mut updated = wanted[0].service.clone();
        updated.scheduler = "lc".to_owned();
        assert_eq!(diff(&current, &wanted), vec![Change::DeleteService(key(81)), Change::UpdateService(updated)]);
    }

    /// An ack as the kernel writes it: header (type `NLMSG_ERROR`), then the negative errno
    /// (and, past what is read here, the request's header).
    fn ack(seq: u32, errno: i32) -> Vec<u8> {
        let mut buf = Vec::new();
        buf.extend_from_slice(&36u32.to_ne_bytes());
        buf.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        buf.extend_from_slice(&0u16.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&(-errno).to_ne_bytes());
        buf.extend_from_slice(&[0; 16]);
        buf
    }

    fn record_all(acks: &mut Acks, buf: &[u8]) {
        for message in messages(buf) {
            acks.record(&message);
        }
    }

    #[test]
    fn a_batch_is_its_requests_back_to_back_each_with_its_own_length_and_sequence_number() {
        let changes = [
            Change::AddService(entry(80, "rr", &[]).service),
            Change::AddDestination(key(80), destination(2, 1)),
            Change::UpdateDestination(key(80), destination(2, 0)),
            Change::DeleteDestination(key(80), destination(2, 0)),
            Change::DeleteService(key(80)),
        ];
        let mut buf = Vec::new();
        let mut lengths = Vec::new();
        for (k, change) in changes.iter().enumerate() {
            let one = encode_change(77, change, 100 + k as u32);
            assert_eq!(one.len() % 4, 0, "each request ends aligned, so the next starts on a boundary");
            lengths.push(one.len());
            buf.extend_from_slice(&one);
        }
        let parsed = messages(&buf);
        assert_eq!(parsed.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![100, 101, 102, 103, 104]);
        assert!(parsed.iter().all(|m| m.msg_type == 77), "every request is of the IPVS family");
        let commands: Vec<u8> = parsed.iter().map(|m| m.payload[0]).collect();
        assert_eq!(
            commands,
            vec![IPVS_CMD_NEW_SERVICE, IPVS_CMD_NEW_DEST, IPVS_CMD_SET_DEST, IPVS_CMD_DEL_DEST, IPVS_CMD_DEL_SERVICE]
        );
        assert_eq!(parsed.iter().map(|m| m.payload.len() + 16).collect::<Vec<_>>(), lengths);
    }

    #[test]
    fn a_batch_is_complete_once_every_request_has_its_ack_in_whatever_order_they_come() {
        let mut acks = Acks::new(10, 3);
        record_all(&mut acks, &ack(11, 0));
        assert!(!acks.complete());
        // An ack of an earlier request, a duplicate and a reply that is no ack are not counted.
        record_all(&mut acks, &[ack(9, 0), ack(11, 0), ack(13, 0)].concat());
        assert!(!acks.complete());
        record_all(&mut acks, &[ack(12, 0), ack(10, 0)].concat());
        assert!(acks.complete());
        assert_eq!(acks.first_refused(), None);
    }

    #[test]
    fn the_first_refused_request_of_a_batch_is_named_by_its_place_in_the_batch() {
        let mut acks = Acks::new(20, 4);
        // The kernel went on after the refusal: a later request was refused too.
        record_all(&mut acks, &[ack(20, 0), ack(21, libc::EEXIST), ack(22, libc::ESRCH), ack(23, 0)].concat());
        assert!(acks.complete());
        assert_eq!(acks.first_refused(), Some((1, libc::EEXIST)));
        let (operation, object) = describe(&Change::AddDestination(key(80), destination(3, 1)));
        assert_eq!(
            (operation, object.as_str()),
            ("adding", "real server 198.18.2.3 port 8080 (weight 1) of IPVS service tcp 198.19.0.10:80")
        );
    }

    #[test]
    fn sequence_numbers_that_wrap_within_a_batch_still_find_their_requests() {
        let mut acks = Acks::new(u32::MAX - 1, 3);
        record_all(&mut acks, &[ack(u32::MAX - 1, 0), ack(u32::MAX, 0), ack(0, libc::ENOENT)].concat());
        assert!(acks.complete());
        assert_eq!(acks.first_refused(), Some((2, libc::ENOENT)));
    }

    #[test]
    fn a_new_service_comes_before_its_real_servers() {
        let wanted = vec![entry(80, "rr", &[destination(2, 1)])];
        assert_eq!(
            diff(&[], &wanted),
            vec![Change::AddService(wanted[0].service.clone()), Change::AddDestination(key(80), destination(2, 1))]
        );
    }
}
