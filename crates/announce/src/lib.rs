//! svcplane-announce: makes addresses that no interface holds reachable on a LAN, by
//! answering ARP (IPv4) and Neighbor Solicitations (IPv6) for them with this host's MAC on
//! chosen interfaces, as MetalLB's and Cilium's L2 modes do.
//!
//! - [`Announcer::start`] opens two AF_PACKET sockets per interface (ARP; ICMPv6 Neighbor
//!   Solicitations through a classic BPF filter, with all-multicast reception so
//!   solicited-node groups arrive) and runs one responder thread per socket.
//! - [`Announcer::set`] replaces the announced set; each address that is new is announced
//!   at once on every interface (gratuitous ARP / unsolicited Neighbor Advertisement with
//!   the override flag), so neighbours that cached the previous holder move at once
//!   instead of waiting for their entry to expire; it is repeated once a second later in
//!   case the first was lost.
//! - [`packet`] builds and reads the frames (pure, unit-tested).
//!
//! What it does not do: it never adds the address to an interface (the kernel would then
//! answer ARP on every interface and accept traffic the dataplane should handle), decides
//! nothing about which host announces (that is the caller's: one Lease per Service in
//! `svcplane announce`), and knows nothing of Services. A mechanism: imports no svcplane
//! crate.

pub mod packet;
mod socket;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use packet::Mac;
use socket::PacketSocket;
use tracing::{debug, info, warn};

/// How long a responder waits in one read before checking whether it should stop.
const READ_TIMEOUT: Duration = Duration::from_millis(200);
/// When a takeover announcement is repeated.
const REPEAT_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    #[error("interface {interface}: {message}")]
    Interface { interface: String, message: String },
    #[error("interface {interface}: opening a packet socket: {source}")]
    Socket { interface: String, source: std::io::Error },
}

/// One interface the announcer answers on.
#[derive(Debug)]
struct Interface {
    name: String,
    mac: Mac,
    /// The source of our Neighbor Advertisements: its link-local address when it has one.
    link_local: Option<Ipv6Addr>,
    arp: PacketSocket,
    ndp: PacketSocket,
}

/// Counts of what the responders did.
#[derive(Debug, Default)]
pub struct Counters {
    pub arp_replies: AtomicU64,
    pub neighbor_advertisements: AtomicU64,
    pub announcements: AtomicU64,
    pub send_errors: AtomicU64,
}

/// Answers ARP / NDP for a set of addresses until dropped.
#[derive(Debug)]
pub struct Announcer {
    interfaces: Arc<Vec<Interface>>,
    addresses: Arc<RwLock<BTreeSet<IpAddr>>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

fn link_info(name: &str) -> Result<(u32, Mac, Option<Ipv6Addr>), AnnounceError> {
    let error = |message: String| AnnounceError::Interface { interface: name.to_owned(), message };
    let index = nix::net::if_::if_nametoindex(name).map_err(|e| error(format!("no such interface ({e})")))?;
    let mut mac = None;
    let mut link_local = None;
    for entry in nix::ifaddrs::getifaddrs().map_err(|e| error(format!("listing addresses: {e}")))? {
        if entry.interface_name != name {
            continue;
        }
        let Some(address) = entry.address else { continue };
        if let Some(link) = address.as_link_addr()
            && let Some(bytes) = link.addr()
        {
            mac = Some(bytes);
        }
        if let Some(v6) = address.as_sockaddr_in6() {
            let ip = v6.ip();
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                link_local = Some(ip);
            }
        }
    }
    let mac = mac.filter(|m| *m != [0; 6]).ok_or_else(|| error("has no Ethernet address".into()))?;
    Ok((index, mac, link_local))
}

impl Announcer {
    /// Opens the sockets on `interfaces` (in the caller's network namespace) and starts
    /// answering for no address yet.
    pub fn start(interfaces: &[String]) -> Result<Announcer, AnnounceError> {
        let mut opened = Vec::new();
        for name in interfaces {
            let (index, mac, link_local) = link_info(name)?;
            let socket = |protocol, ns_only| {
                PacketSocket::open(index, protocol, READ_TIMEOUT, ns_only)
                    .map_err(|source| AnnounceError::Socket { interface: name.clone(), source })
            };
            let arp = socket(packet::ETH_P_ARP, false)?;
            let ndp = socket(packet::ETH_P_IPV6, true)?;
            info!(interface = %name, mac = %format_mac(mac), "answering ARP and NDP");
            opened.push(Interface { name: name.clone(), mac, link_local, arp, ndp });
        }
        let mut announcer = Announcer {
            interfaces: Arc::new(opened),
            addresses: Arc::new(RwLock::new(BTreeSet::new())),
            counters: Arc::new(Counters::default()),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        for i in 0..announcer.interfaces.len() {
            for ipv6 in [false, true] {
                let interfaces = Arc::clone(&announcer.interfaces);
                let addresses = Arc::clone(&announcer.addresses);
                let counters = Arc::clone(&announcer.counters);
                let stop = Arc::clone(&announcer.stop);
                let thread = std::thread::Builder::new()
                    .name(format!("announce-{}", if ipv6 { "ndp" } else { "arp" }))
                    .spawn(move || respond(&interfaces[i], ipv6, &addresses, &counters, &stop))
                    .map_err(|e| AnnounceError::Interface {
                        interface: announcer.interfaces[i].name.clone(),
                        message: format!("starting a thread: {e}"),
                    })?;
                announcer.threads.push(thread);
            }
        }
        Ok(announcer)
    }

    /// Replaces the announced addresses; announces each new one at once (and again a
    /// second later). Returns the new ones.
    pub fn set(&self, addresses: BTreeSet<IpAddr>) -> Vec<IpAddr> {
        let added: Vec<IpAddr> = {
            let mut current = self.addresses.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            let added = addresses.difference(&current).copied().collect();
            let removed: Vec<&IpAddr> = current.difference(&addresses).collect();
            if !removed.is_empty() {
                info!(addresses = ?removed, "no longer announcing");
            }
            *current = addresses;
            added
        };
        if !added.is_empty() {
            info!(addresses = ?added, "announcing");
            self.announce(&added);
            let interfaces = Arc::clone(&self.interfaces);
            let counters = Arc::clone(&self.counters);
            let addresses = Arc::clone(&self.addresses);
            let again = added.clone();
            std::thread::spawn(move || {
                std::thread::sleep(REPEAT_AFTER);
                let still: Vec<IpAddr> = {
                    let current = addresses.read().unwrap_or_else(std::sync::PoisonError::into_inner);
                    again.into_iter().filter(|ip| current.contains(ip)).collect()
                };
                announce_on(&interfaces, &counters, &still);
            });
        }
        added
    }

    /// Sends a gratuitous ARP / unsolicited NA for each of `addresses` on every interface.
    pub fn announce(&self, addresses: &[IpAddr]) {
        announce_on(&self.interfaces, &self.counters, addresses);
    }

    /// The addresses answered for now.
    pub fn addresses(&self) -> BTreeSet<IpAddr> {
        self.addresses.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn announce_on(interfaces: &[Interface], counters: &Counters, addresses: &[IpAddr]) {
    for interface in interfaces {
        for ip in addresses {
            let (socket, frame) = match ip {
                IpAddr::V4(v4) => (&interface.arp, packet::gratuitous_arp(interface.mac, *v4)),
                IpAddr::V6(v6) => (
                    &interface.ndp,
                    packet::unsolicited_advertisement(interface.mac, interface.link_local.unwrap_or(*v6), *v6),
                ),
            };
            match socket.send(&frame) {
                Ok(()) => {
                    counters.announcements.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => {
                    counters.send_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(interface = %interface.name, %ip, "announcing failed: {error}");
                }
            }
        }
    }
}

fn respond(
    interface: &Interface,
    ipv6: bool,
    addresses: &RwLock<BTreeSet<IpAddr>>,
    counters: &Counters,
    stop: &AtomicBool,
) {
    let socket = if ipv6 { &interface.ndp } else { &interface.arp };
    let mut buffer = vec![0u8; 2048];
    while !stop.load(Ordering::Acquire) {
        let n = match socket.receive(&mut buffer) {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(error) => {
                warn!(interface = %interface.name, "reading a packet socket failed: {error}");
                std::thread::sleep(READ_TIMEOUT);
                continue;
            }
        };
        let frame = &buffer[..n];
        let holds = |ip: IpAddr| addresses.read().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&ip);
        let reply = if ipv6 {
            packet::parse_neighbor_solicitation(frame).filter(|ns| holds(IpAddr::V6(ns.target))).map(|ns| {
                counters.neighbor_advertisements.fetch_add(1, Ordering::Relaxed);
                packet::neighbor_advertisement(interface.mac, interface.link_local.unwrap_or(ns.target), &ns)
            })
        } else {
            packet::parse_arp_request(frame)
                .filter(|r| {
                    r.sender_mac != interface.mac && r.sender_ip != r.target_ip && holds(IpAddr::V4(r.target_ip))
                })
                .map(|request| {
                    counters.arp_replies.fetch_add(1, Ordering::Relaxed);
                    packet::arp_reply(interface.mac, &request)
                })
        };
        if let Some(reply) = reply {
            debug!(interface = %interface.name, "answering a neighbour request");
            if let Err(error) = socket.send(&reply) {
                counters.send_errors.fetch_add(1, Ordering::Relaxed);
                warn!(interface = %interface.name, "answering failed: {error}");
            }
        }
    }
}

fn format_mac(mac: Mac) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
