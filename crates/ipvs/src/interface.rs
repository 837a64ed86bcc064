//! The dummy interface that holds every virtual service address (kube-proxy's
//! `kube-ipvs0`), so the node accepts packets for them and IPVS sees them at its
//! `LOCAL_IN` hook. Managed with the `ip` program: one `ip -batch` per change.

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
        let output = Command::new("ip")
            .args(["-o", "addr", "show", "dev", &self.name])
            .stderr(Stdio::null())
            .output()
            .map_err(|source| self.failed("listing the addresses of", source))?;
        if !output.status.success() {
            return Ok(BTreeSet::new());
        }
        Ok(parse_addresses(&String::from_utf8_lossy(&output.stdout)))
    }

    /// Makes the interface exist (down, as kube-proxy leaves it: a dummy interface needs
    /// no link for its addresses to be local) and hold exactly `wanted`.
    pub fn sync(&self, wanted: &BTreeSet<IpAddr>) -> Result<usize, IpvsError> {
        let exists = Command::new("ip")
            .args(["link", "show", "dev", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|source| self.failed("looking for", source))?
            .success();
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
    let output = Command::new("ip").args(["-o", "addr", "show"]).output().map_err(|source| IpvsError::Request {
        operation: "listing",
        object: "the node's addresses".to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&output.stdout);
    let lines = text.lines().filter(|line| line.split_whitespace().nth(1) != Some(except));
    Ok(parse_addresses(&lines.collect::<Vec<_>>().join("\n"))
        .into_iter()
        .filter(|address| match address {
            IpAddr::V4(v4) => !v4.is_link_local(),
            IpAddr::V6(v6) => !v6.is_unicast_link_local(),
        })
        .collect())
}

fn host_prefix(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// The addresses in `ip -o addr show` output (`2: kube-ipvs0    inet 198.19.0.10/32 ...`).
fn parse_addresses(text: &str) -> BTreeSet<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|word| *word == "inet" || *word == "inet6")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_ip_one_line_output() {
        let text = "5: kube-ipvs0    inet 198.19.0.10/32 scope global kube-ipvs0\\       valid_lft forever\n\
                    5: kube-ipvs0    inet6 2001:db8:19::10/128 scope global \\       valid_lft forever\n";
        let found: Vec<IpAddr> = parse_addresses(text).into_iter().collect();
        assert_eq!(found, vec!["198.19.0.10".parse::<IpAddr>().unwrap(), "2001:db8:19::10".parse().unwrap()]);
    }
}
