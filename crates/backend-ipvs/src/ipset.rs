//! The ipsets IPVS mode's iptables rules match through, written with `ipset restore` in the
//! calling thread's network namespace.
//!
//! A sync reads the namespace's sets (`ipset save`), and sends only the difference: sets
//! that are missing are created, members that are gone are deleted and members that are new
//! added, sets of ours no longer wanted are destroyed (after the rules stopped naming them).
//! A difference that only adds and deletes members of sets that exist (an endpoint change,
//! once the sets are there) goes over netlink (`svcplane_ipvs::ipset`), with no process;
//! any other goes in one `ipset restore`. When either fails part-way, every set it touched
//! is put back as it was before the sync, each built whole in a temporary set and swapped
//! in (`ipset swap` is atomic), so a failed sync leaves the sets as they were.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use ipnet::IpNet;
use svcplane_core::{IpFamily, Protocol};
use svcplane_ipvs::ipset::{Entry, IpSets, MemberChange, Operation};

/// The longest name the kernel takes (`IPSET_MAXNAMELEN` less the terminator); longer
/// names are cut, as upstream cuts its IPv6 names.
pub const MAX_NAME: usize = 31;

/// The set types this mode uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType {
    /// `address,protocol:port`: a frontend.
    HashIpPort,
    /// `address,protocol:port,address`: an endpoint and its own address as source (hairpin).
    HashIpPortIp,
    /// `address,protocol:port,net`: a frontend and an allowed source range.
    HashIpPortNet,
    /// `net`: source ranges.
    HashNet,
    /// `port`: NodePorts of one protocol, on every local address.
    BitmapPort,
}

impl SetType {
    pub fn name(self) -> &'static str {
        match self {
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::HashNet => "hash:net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

/// One wanted set: its type, family and members, each spelled as `ipset save` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpSet {
    pub set_type: SetType,
    pub family: IpFamily,
    pub members: BTreeSet<String>,
}

impl IpSet {
    pub fn new(set_type: SetType, family: IpFamily) -> Self {
        IpSet { set_type, family, members: BTreeSet::new() }
    }

    /// The `create` line's options after the name.
    fn create_options(&self) -> String {
        match self.set_type {
            SetType::BitmapPort => format!("{} range 0-65535", self.set_type.name()),
            _ => format!("{} family {}", self.set_type.name(), family_word(self.family)),
        }
    }

    /// The set as `ipset save` would list it once written (for a sync that knows what it
    /// wrote last and need not ask the kernel).
    pub fn as_saved(&self) -> SavedSet {
        let options = self.create_options();
        let header = options.split_once(' ').map_or("", |(_, rest)| rest).to_owned();
        SavedSet { set_type: self.set_type.name().to_owned(), header, members: self.members.clone() }
    }

    /// Whether a set the kernel has (type and header from `ipset save`) is of this kind.
    fn same_kind(&self, saved: &SavedSet) -> bool {
        saved.set_type == self.set_type.name()
            && (self.set_type == SetType::BitmapPort
                || saved
                    .header
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|pair| pair[0] == "family" && pair[1] == family_word(self.family)))
    }
}

fn family_word(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "inet",
        IpFamily::V6 => "inet6",
    }
}

/// A set name for `family`: upstream's IPv4 name, `KUBE-6-...` for IPv6, cut to [`MAX_NAME`].
pub fn set_name(family: IpFamily, base: &str) -> String {
    let mut name = match family {
        IpFamily::V4 => format!("KUBE-{base}"),
        IpFamily::V6 => format!("KUBE-6-{base}"),
    };
    name.truncate(MAX_NAME);
    name
}

/// `address,protocol:port`.
pub fn ip_port(address: IpAddr, protocol: Protocol, port: u16) -> String {
    format!("{address},{protocol}:{port}")
}

/// `address,protocol:port,address`.
pub fn ip_port_ip(address: IpAddr, protocol: Protocol, port: u16, source: IpAddr) -> String {
    format!("{address},{protocol}:{port},{source}")
}

/// A net as `ipset save` prints it: the network address, without the length when it is
/// a single address.
pub fn net(net: IpNet) -> String {
    let net = net.trunc();
    if net.prefix_len() == net.max_prefix_len() { net.addr().to_string() } else { net.to_string() }
}

/// `address,protocol:port,net`.
pub fn ip_port_net(address: IpAddr, protocol: Protocol, port: u16, source: IpNet) -> String {
    format!("{address},{protocol}:{port},{}", net(source))
}

/// A set as `ipset save` lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedSet {
    pub set_type: String,
    /// The rest of the `create` line.
    pub header: String,
    pub members: BTreeSet<String>,
}

/// Parses `ipset save` output.
pub fn parse_save(text: &str) -> BTreeMap<String, SavedSet> {
    let mut sets: BTreeMap<String, SavedSet> = BTreeMap::new();
    for line in text.lines() {
        let mut words = line.splitn(3, ' ');
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), Some(rest)) => {
                let (set_type, header) = rest.split_once(' ').unwrap_or((rest, ""));
                sets.insert(
                    name.to_owned(),
                    SavedSet { set_type: set_type.to_owned(), header: header.to_owned(), members: BTreeSet::new() },
                );
            }
            (Some("add"), Some(name), Some(member)) => {
                if let Some(set) = sets.get_mut(name) {
                    set.members.insert(member.trim().to_owned());
                }
            }
            _ => {}
        }
    }
    sets
}

/// What one sync sends: the difference, and how to put back what it touched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// `ipset restore` lines: creations, then deletions and additions per set.
    pub script: Vec<String>,
    /// Per set the difference touched that existed before: how to rebuild it as it was.
    pub rollback: Vec<String>,
    /// Sets to destroy once no rule names them.
    pub stale: Vec<String>,
    /// Members added or removed, sets created.
    pub operations: usize,
    /// The deletions and additions of `script` in the kernel's terms, for netlink; when it
    /// holds fewer changes than `script` has lines, `script` goes to `ipset restore`.
    pub members: Vec<MemberChange>,
}

/// `member` of a set of `set_type` in the kernel's terms (`None` when it is not spelled as
/// this mode spells members of that type).
pub fn entry(set_type: SetType, member: &str) -> Option<Entry> {
    fn address_and_prefix(text: &str) -> Option<(IpAddr, Option<u8>)> {
        match text.split_once('/') {
            Some((address, prefix)) => Some((address.parse().ok()?, Some(prefix.parse().ok()?))),
            None => Some((text.parse().ok()?, None)),
        }
    }
    fn protocol_and_port(text: &str) -> Option<(Protocol, u16)> {
        let (protocol, port) = text.split_once(':')?;
        let protocol = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp].into_iter().find(|p| p.as_str() == protocol)?;
        Some((protocol, port.parse().ok()?))
    }
    let parts: Vec<&str> = member.split(',').collect();
    match (set_type, parts.as_slice()) {
        (SetType::BitmapPort, [port]) => Some(Entry { port: Some(port.parse().ok()?), ..Entry::default() }),
        (SetType::HashNet, [net]) => {
            let (address, prefix) = address_and_prefix(net)?;
            Some(Entry { address: Some(address), prefix, ..Entry::default() })
        }
        (SetType::HashIpPort | SetType::HashIpPortIp | SetType::HashIpPortNet, [address, protocol_port, rest @ ..]) => {
            let (protocol, port) = protocol_and_port(protocol_port)?;
            let mut entry = Entry {
                address: Some(address.parse().ok()?),
                protocol: Some(protocol),
                port: Some(port),
                ..Entry::default()
            };
            match (set_type, rest) {
                (SetType::HashIpPort, []) => {}
                (SetType::HashIpPortIp, [source]) => entry.address2 = Some(source.parse().ok()?),
                (SetType::HashIpPortNet, [net]) => {
                    let (address, prefix) = address_and_prefix(net)?;
                    entry.address2 = Some(address);
                    entry.prefix2 = prefix;
                }
                _ => return None,
            }
            Some(entry)
        }
        _ => None,
    }
}

/// The temporary set a rollback builds into (the name cut to fit).
fn temporary_name(name: &str) -> String {
    let mut temporary = format!("{name}-T");
    if temporary.len() > MAX_NAME {
        temporary = format!("{}-T", &name[..MAX_NAME - 2]);
    }
    temporary
}

/// The difference between the sets the kernel has and `wanted`. `ours` says which of the
/// kernel's sets this mode owns (a set of ours not wanted is stale).
pub fn changes(
    current: &BTreeMap<String, SavedSet>,
    wanted: &BTreeMap<String, IpSet>,
    ours: impl Fn(&str) -> bool,
) -> Changes {
    let mut out = Changes::default();
    for (name, set) in wanted {
        match current.get(name) {
            Some(saved) if set.same_kind(saved) => {
                let removed: Vec<&String> = saved.members.difference(&set.members).collect();
                let added: Vec<&String> = set.members.difference(&saved.members).collect();
                if removed.is_empty() && added.is_empty() {
                    continue;
                }
                out.operations += removed.len() + added.len();
                out.script.extend(removed.iter().map(|member| format!("del {name} {member}")));
                out.script.extend(added.iter().map(|member| format!("add {name} {member}")));
                let operations = removed.iter().map(|member| (Operation::Delete, member));
                out.members.extend(operations.chain(added.iter().map(|member| (Operation::Add, member))).filter_map(
                    |(operation, member)| {
                        let entry = entry(set.set_type, member)?;
                        Some(MemberChange { set: name.clone(), operation, entry })
                    },
                ));
                let temporary = temporary_name(name);
                out.rollback.push(format!("create {temporary} {} {}", saved.set_type, saved.header));
                out.rollback.extend(saved.members.iter().map(|member| format!("add {temporary} {member}")));
                out.rollback.push(format!("swap {temporary} {name}"));
                out.rollback.push(format!("destroy {temporary}"));
            }
            Some(_) => {
                // Another type or family under our name: built anew and swapped in (the
                // kernel swaps only sets of compatible types; otherwise the error says so).
                let temporary = temporary_name(name);
                out.operations += 1 + set.members.len();
                out.script.push(format!("create {temporary} {}", set.create_options()));
                out.script.extend(set.members.iter().map(|member| format!("add {temporary} {member}")));
                out.script.push(format!("swap {temporary} {name}"));
                out.script.push(format!("destroy {temporary}"));
            }
            None => {
                out.operations += 1 + set.members.len();
                out.script.push(format!("create {name} {}", set.create_options()));
                out.script.extend(set.members.iter().map(|member| format!("add {name} {member}")));
            }
        }
    }
    out.stale = current.keys().filter(|name| !wanted.contains_key(*name) && ours(name)).cloned().collect();
    out
}

/// The text `ipset restore` reads for `lines`, members' protocols spelled as numbers
/// (`198.19.0.10,6:80`): `ipset` looks a protocol name up in `/etc/protocols`, opening the
/// file once per member (10k members, 10k opens: minutes in the guest, whose `/etc` is
/// read over 9p). `ipset save` still lists the names, as the members are spelled here.
fn restore_text(lines: &[String]) -> String {
    let mut text = String::with_capacity(lines.iter().map(|line| line.len() + 1).sum());
    for line in lines {
        if line.starts_with("add ") || line.starts_with("del ") {
            let numbered = line.replace(",tcp:", ",6:").replace(",udp:", ",17:").replace(",sctp:", ",132:");
            text.push_str(&numbered);
        } else {
            text.push_str(line);
        }
        text.push('\n');
    }
    text
}

/// Writes the sets of the calling thread's network namespace: members of existing sets
/// over netlink, everything else with the `ipset` program.
#[derive(Debug, Default)]
pub struct IpsetCli {
    /// Opened at the first member change, in the namespace of the thread that syncs.
    netlink: Option<IpSets>,
}

impl IpsetCli {
    /// Every set of the namespace, with its members.
    pub fn save(&self) -> Result<BTreeMap<String, SavedSet>, String> {
        let output = Command::new("ipset")
            .arg("save")
            .output()
            .map_err(|error| format!("running ipset save (is the ipset package installed?): {error}"))?;
        if !output.status.success() {
            return Err(format!("ipset save failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
        }
        Ok(parse_save(&String::from_utf8_lossy(&output.stdout)))
    }

    /// Feeds `lines` to `ipset restore`.
    pub fn restore(&self, lines: &[String]) -> Result<(), String> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut child = Command::new("ipset")
            .args(["restore", "-exist"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| format!("running ipset restore (is the ipset package installed?): {error}"))?;
        let text = restore_text(lines);
        let written = child.stdin.take().expect("piped").write_all(text.as_bytes());
        let output = child.wait_with_output().map_err(|error| format!("waiting for ipset restore: {error}"))?;
        if !output.status.success() {
            return Err(format!("ipset restore failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
        }
        written.map_err(|error| format!("writing to ipset restore: {error}"))
    }

    /// Applies `changes` (but the stale sets): when the difference fails, the sets it
    /// touched are put back as they were, and the error says what failed.
    pub fn apply(&mut self, changes: &Changes) -> Result<(), String> {
        let members_only = !changes.script.is_empty() && changes.members.len() == changes.script.len();
        if members_only && let Some(written) = self.write_members(changes) {
            return written;
        }
        match self.restore(&changes.script) {
            Ok(()) => Ok(()),
            Err(error) => self.roll_back(changes, error),
        }
    }

    /// Rebuilds every set `changes` touched as it was (each in a temporary set, swapped in).
    fn roll_back(&self, changes: &Changes, error: String) -> Result<(), String> {
        if changes.rollback.is_empty() {
            return Err(format!("{error} (nothing to put back: the next sync reads the sets again)"));
        }
        match self.restore(&changes.rollback) {
            Ok(()) => Err(format!("{error} (the sets are as they were before this sync)")),
            Err(rollback) => Err(format!("{error}; putting the sets back failed too: {rollback}")),
        }
    }

    /// Adds and deletes the members of `changes` over netlink; `None` when no netlink
    /// socket can be opened (then `ipset restore` writes them: it opens its own socket and
    /// reports its own error if it cannot either). When the kernel refuses a member (a set
    /// deleted behind this mode's back), every change it made is taken back over netlink,
    /// so the sets that exist are as they were; the next sync reads the kernel again.
    fn write_members(&mut self, changes: &Changes) -> Option<Result<(), String>> {
        if self.netlink.is_none() {
            self.netlink = Some(IpSets::new().ok()?);
        }
        let socket = self.netlink.as_mut().expect("opened above");
        let refused = match socket.try_each(&changes.members) {
            Ok(refused) if refused.is_empty() => return Some(Ok(())),
            Ok(refused) => refused,
            Err(error) => {
                // What the kernel took is unknown: the next sync opens another socket.
                self.netlink = None;
                return Some(self.roll_back(changes, error.to_string()));
            }
        };
        let refused_at: Vec<usize> = refused.iter().map(|(number, _)| *number).collect();
        let first = refused.into_iter().next().map(|(_, error)| error.to_string()).expect("not empty");
        let undone = socket.try_each(&svcplane_ipvs::ipset::undo(&changes.members, &refused_at));
        Some(match undone {
            Ok(_) => Err(format!("{first} (what the kernel took of this change was taken back)")),
            Err(error) => {
                self.netlink = None;
                self.roll_back(changes, format!("{first}; taking the change back: {error}"))
            }
        })
    }

    /// Destroys `names` (sets no rule names any more).
    pub fn destroy(&self, names: &[String]) -> Result<(), String> {
        let lines: Vec<String> = names.iter().map(|name| format!("destroy {name}")).collect();
        self.restore(&lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `ipset restore` line of a member change.
    fn restore_line(change: &MemberChange) -> String {
        let verb = match change.operation {
            Operation::Add => "add",
            Operation::Delete => "del",
        };
        format!("{verb} {} {}", change.set, change.entry)
    }

    const SAVED: &str = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1\n\
add KUBE-CLUSTER-IP 198.19.0.10,tcp:80\n\
add KUBE-CLUSTER-IP 198.19.0.11,udp:53\n\
create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n\
create KUBE-OLD hash:ip,port family inet hashsize 1024 maxelem 65536\n\
create other hash:ip family inet hashsize 1024 maxelem 65536\n";

    #[test]
    fn members_reach_ipset_restore_with_protocol_numbers_and_other_lines_as_they_are() {
        let lines: Vec<String> = [
            "create KUBE-LOOP-BACK hash:ip,port,ip family inet",
            "add KUBE-LOOP-BACK 198.18.129.2,tcp:8080,198.18.129.2",
            "del KUBE-CLUSTER-IP 198.19.0.11,udp:53",
            "add KUBE-6-CLUSTER-IP 2001:db8:19::10,sctp:80",
            "add KUBE-NODE-PORT-TCP 30080",
            "swap KUBE-X-T KUBE-X",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            restore_text(&lines),
            "create KUBE-LOOP-BACK hash:ip,port,ip family inet\n\
             add KUBE-LOOP-BACK 198.18.129.2,6:8080,198.18.129.2\n\
             del KUBE-CLUSTER-IP 198.19.0.11,17:53\n\
             add KUBE-6-CLUSTER-IP 2001:db8:19::10,132:80\n\
             add KUBE-NODE-PORT-TCP 30080\n\
             swap KUBE-X-T KUBE-X\n"
        );
    }

    #[test]
    fn a_sync_sends_only_the_members_that_differ_and_can_put_the_set_back() {
        let current = parse_save(SAVED);
        let mut cluster = IpSet::new(SetType::HashIpPort, IpFamily::V4);
        cluster.members.insert(ip_port("198.19.0.10".parse().unwrap(), Protocol::Tcp, 80));
        cluster.members.insert(ip_port("198.19.0.12".parse().unwrap(), Protocol::Sctp, 80));
        let mut node_ports = IpSet::new(SetType::BitmapPort, IpFamily::V4);
        node_ports.members.insert("30080".into());
        let wanted = BTreeMap::from([
            ("KUBE-CLUSTER-IP".to_owned(), cluster),
            ("KUBE-NODE-PORT-TCP".to_owned(), node_ports),
            ("KUBE-6-CLUSTER-IP".to_owned(), IpSet::new(SetType::HashIpPort, IpFamily::V6)),
        ]);
        let changes = changes(&current, &wanted, |name| name.starts_with("KUBE-"));
        assert_eq!(
            changes.script,
            vec![
                "create KUBE-6-CLUSTER-IP hash:ip,port family inet6",
                "del KUBE-CLUSTER-IP 198.19.0.11,udp:53",
                "add KUBE-CLUSTER-IP 198.19.0.12,sctp:80",
                "add KUBE-NODE-PORT-TCP 30080",
            ]
        );
        assert_eq!(changes.operations, 4);
        assert_eq!(changes.stale, vec!["KUBE-OLD"], "other software's sets are left alone");
        assert!(changes.rollback.contains(&"add KUBE-CLUSTER-IP-T 198.19.0.11,udp:53".to_owned()));
        assert!(changes.rollback.contains(&"swap KUBE-CLUSTER-IP-T KUBE-CLUSTER-IP".to_owned()));
        assert!(changes.rollback.contains(&"swap KUBE-NODE-PORT-TCP-T KUBE-NODE-PORT-TCP".to_owned()));
    }

    #[test]
    fn a_set_as_last_written_is_of_its_own_kind_and_needs_no_change() {
        let mut set = IpSet::new(SetType::HashIpPort, IpFamily::V6);
        set.members.insert("2001:db8:f::10,tcp:80".to_owned());
        let wanted = BTreeMap::from([("KUBE-6-CLUSTER-IP".to_owned(), set.clone())]);
        let written = BTreeMap::from([("KUBE-6-CLUSTER-IP".to_owned(), set.as_saved())]);
        assert!(set.same_kind(&set.as_saved()));
        assert_eq!(changes(&written, &wanted, |_| true), Changes::default());
    }

    #[test]
    fn an_unchanged_set_sends_nothing() {
        let current = parse_save(SAVED);
        let mut cluster = IpSet::new(SetType::HashIpPort, IpFamily::V4);
        cluster.members = current["KUBE-CLUSTER-IP"].members.clone();
        let wanted = BTreeMap::from([("KUBE-CLUSTER-IP".to_owned(), cluster)]);
        let changes = changes(&current, &wanted, |name| name == "KUBE-CLUSTER-IP");
        assert!(changes.script.is_empty() && changes.rollback.is_empty() && changes.stale.is_empty());
    }

    #[test]
    fn a_difference_of_members_of_existing_sets_is_also_spelled_for_netlink_and_a_creation_is_not() {
        let current = parse_save(SAVED);
        let mut cluster = IpSet::new(SetType::HashIpPort, IpFamily::V4);
        cluster.members.insert(ip_port("198.19.0.10".parse().unwrap(), Protocol::Tcp, 80));
        cluster.members.insert(ip_port("198.19.0.12".parse().unwrap(), Protocol::Sctp, 80));
        let mut wanted = BTreeMap::from([("KUBE-CLUSTER-IP".to_owned(), cluster)]);
        let members_only = changes(&current, &wanted, |name| name == "KUBE-CLUSTER-IP");
        assert_eq!(members_only.members.len(), members_only.script.len());
        let lines: Vec<String> = members_only.members.iter().map(restore_line).collect();
        assert_eq!(lines, members_only.script, "each netlink change is the restore line it stands for");
        assert_eq!(members_only.members[0].operation, Operation::Delete);

        wanted.insert("KUBE-6-CLUSTER-IP".to_owned(), IpSet::new(SetType::HashIpPort, IpFamily::V6));
        let with_creation = changes(&current, &wanted, |name| name.starts_with("KUBE-"));
        assert!(with_creation.members.len() < with_creation.script.len(), "a new set goes to ipset restore");
    }

    #[test]
    fn every_member_this_mode_spells_reads_back_as_the_kernels_parts() {
        let spelled = [
            (SetType::HashIpPort, "198.19.0.10,tcp:80"),
            (SetType::HashIpPort, "2001:db8:f::a,udp:53"),
            (SetType::HashIpPortIp, "198.18.1.2,sctp:8080,198.18.1.2"),
            (SetType::HashIpPortNet, "198.18.200.1,tcp:80,198.18.64.0/18"),
            (SetType::HashIpPortNet, "198.18.200.1,tcp:80,198.18.64.7"),
            (SetType::HashNet, "2001:db8::/64"),
            (SetType::HashNet, "198.18.0.100"),
            (SetType::BitmapPort, "30080"),
        ];
        for (set_type, member) in spelled {
            let entry = entry(set_type, member).unwrap_or_else(|| panic!("{member} reads as a {set_type:?} member"));
            assert_eq!(entry.to_string(), member);
        }
        assert_eq!(entry(SetType::HashIpPort, "198.19.0.10,icmp:0"), None);
        assert_eq!(entry(SetType::HashIpPortIp, "198.19.0.10,tcp:80"), None, "no source address");
        assert_eq!(entry(SetType::BitmapPort, "198.19.0.10"), None);
    }

    #[test]
    fn names_and_members_are_spelled_as_ipset_prints_them() {
        assert_eq!(set_name(IpFamily::V6, "LOAD-BALANCER-SOURCE-CIDR"), "KUBE-6-LOAD-BALANCER-SOURCE-CID");
        assert_eq!(set_name(IpFamily::V4, "LOOP-BACK"), "KUBE-LOOP-BACK");
        assert_eq!(net("198.18.0.100/32".parse().unwrap()), "198.18.0.100");
        assert_eq!(net("2001:db8::ff/64".parse().unwrap()), "2001:db8::/64");
        assert_eq!(
            ip_port_ip("2001:db8::1".parse().unwrap(), Protocol::Tcp, 8080, "2001:db8::1".parse().unwrap()),
            "2001:db8::1,tcp:8080,2001:db8::1"
        );
    }
}
