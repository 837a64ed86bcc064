//! The dummy interface that holds every virtual service address (kube-proxy's
//! `kube-ipvs0`), so the node accepts packets for them and IPVS sees them at its
//! `LOCAL_IN` hook. Read with `getifaddrs` (netlink, in the calling thread's namespace, no
//! program started), changed with the `ip` program: one `ip -batch` per change.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use crate::IpvsError;

/// A dummy interface and the addresses on it.
#[derive(Debug, Clone)]
pub struct DummyInterface {
    name: String,
}

impl DummyInterface {
    pub fn new(name: impl Into<String>) -> Self {
        DummyInterface { name: name.into() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The addresses on the interface; empty when it does not exist.
    pub fn addresses(&self) -> Result<BTreeSet<IpAddr>, IpvsError> {
        let all = interface_addresses().map_err(|source| self.failed("listing the addresses of", source))?;
        Ok(all.into_iter().filter(|(name, _)| is_of(name, &self.name)).map(|(_, address)| address).collect())
    }

    /// Whether the interface exists in the calling thread's namespace.
    fn exists(&self) -> bool {
        nix::net::if_::if_nametoindex(self.name.as_str()).is_ok()
    }

    /// Makes the interface exist (down, as kube-proxy leaves it: a dummy interface needs
    /// no link for its addresses to be local) and hold exactly `wanted`.
    pub fn sync(&self, wanted: &BTreeSet<IpAddr>) -> Result<usize, IpvsError> {
        let exists = self.exists();
        let current = if exists { self.addresses()? } else { BTreeSet::new() };
        let mut script = String::new();
        if !exists {
            script.push_str(&format!("link add {} type dummy\n", self.name));
        }
        for address in current.difference(wanted) {
            script.push_str(&format!("addr del {} dev {}\n", host_prefix(*address), self.name));
        }
        for address in wanted.difference(&current) {
            script.push_str(&format!("addr add {} dev {}\n", host_prefix(*address), self.name));
        }
        let operations = script.lines().count();
        if operations > 0 {
            self.batch(&script)?;
        }
        Ok(operations)
    }

    /// Turns the interface's addresses from `current` (what the caller wrote last, on an
    /// interface it made) into `wanted`, in one `ip -batch` (none when they are equal).
    pub fn change(&self, current: &BTreeSet<IpAddr>, wanted: &BTreeSet<IpAddr>) -> Result<usize, IpvsError> {
        let mut script = String::new();
        for address in current.difference(wanted) {
            script.push_str(&format!("addr del {} dev {}\n", host_prefix(*address), self.name));
        }
        for address in wanted.difference(current) {
            script.push_str(&format!("addr add {} dev {}\n", host_prefix(*address), self.name));
        }
        let operations = script.lines().count();
        if operations > 0 {
            self.batch(&script)?;
        }
        Ok(operations)
    }

    /// Deletes the interface (and its addresses). Returns whether it existed.
    pub fn delete(&self) -> Result<bool, IpvsError> {
        let status = Command::new("ip")
            .args(["link", "del", "dev", &self.name])
            .stderr(Stdio::null())
            .status()
            .map_err(|source| self.failed("deleting", source))?;
        Ok(status.success())
    }

    fn batch(&self, script: &str) -> Result<(), IpvsError> {
        let mut child = Command::new("ip")
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| self.failed("programming", source))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).map_err(|source| self.failed("programming", source))?;
        }
        let output = child.wait_with_output().map_err(|source| self.failed("programming", source))?;
        if output.status.success() {
            return Ok(());
        }
        Err(IpvsError::Request {
            operation: "programming",
            object: format!("dummy interface {}", self.name),
            source: std::io::Error::other(format!(
                "ip -batch: {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )),
        })
    }

    fn failed(&self, operation: &'static str, source: std::io::Error) -> IpvsError {
        IpvsError::Request { operation, object: format!("dummy interface {}", self.name), source }
    }
}

/// The node's own addresses: every address of every interface but `except` (the dummy
/// interface, whose addresses are Services'), without link-local ones.
pub fn local_addresses(except: &str) -> Result<BTreeSet<IpAddr>, IpvsError> {
    let all = interface_addresses().map_err(|source| IpvsError::Request {
        operation: "listing",
        object: "the node's addresses".to_owned(),
        source,
    })?;
    Ok(all
        .into_iter()
        .filter(|(name, _)| !is_of(name, except))
        .map(|(_, address)| address)
        .filter(|address| match address {
            IpAddr::V4(v4) => !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
        })
        .collect())
}

/// Every IPv4 and IPv6 address of the calling thread's namespace, with its interface's
/// name (for IPv4, the address's label, which is the interface's name or starts with it
/// and a colon).
fn interface_addresses() -> std::io::Result<Vec<(String, IpAddr)>> {
    let addresses = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    Ok(addresses
        .filter_map(|ifaddr| {
            let address = ifaddr.address?;
            let ip = match address.as_sockaddr_in() {
                Some(v4) => IpAddr::V4(v4.ip()),
                None => IpAddr::V6(address.as_sockaddr_in6()?.ip()),
            };
            Some((ifaddr.interface_name, ip))
        })
        .collect())
}

/// Whether `name` (an interface name or an IPv4 label) is interface `interface`'s.
fn is_of(name: &str, interface: &str) -> bool {
    name == interface || name.strip_prefix(interface).is_some_and(|rest| rest.starts_with(':'))
}

fn host_prefix(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_addresses_leave_out_the_interface_named_and_its_labels() {
        assert!(is_of("kube-ipvs0", "kube-ipvs0") && is_of("kube-ipvs0:1", "kube-ipvs0"));
        assert!(!is_of("kube-ipvs01", "kube-ipvs0") && !is_of("eth0", "kube-ipvs0"));
        // Read-only, in the namespace the test runs in: the loopback address is on `lo`.
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(local_addresses("kube-ipvs0").unwrap().contains(&loopback));
        assert!(!local_addresses("lo").unwrap().contains(&loopback));
        assert!(DummyInterface::new("lo").addresses().unwrap().contains(&loopback));
        assert_eq!(DummyInterface::new("svcp-none0").addresses().unwrap(), BTreeSet::new());
    }
}
