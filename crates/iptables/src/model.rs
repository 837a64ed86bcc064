//! iptables rules as typed values, and their two spellings.
//!
//! A [`Rule`] keeps its arguments in the order they were written. Rendered for
//! `iptables-restore` ([`Rule::restore_args`]) it comes out exactly in that order, so a
//! rule built the way kube-proxy writes its arguments reads like kube-proxy's restore
//! input. The kernel keeps no argument order of its own: `iptables-save` prints
//! `-s`, `-d`, `-p` first, then the matches in the order they were loaded, then the target,
//! with addresses and defaults spelled out. [`Rule::canonical`] is that form and
//! [`Rule::save_args`] prints it; two rules are the same rule to the kernel exactly when
//! their canonical forms are equal.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// Which program family a ruleset belongs to: `iptables` (IPv4) or `ip6tables` (IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(address: &IpAddr) -> Family {
        match address {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// `iptables` or `ip6tables`: the stem of every program name of the family.
    pub fn program_stem(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }

    /// The all-ones address, as `-m recent --mask` defaults to.
    pub fn full_mask(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::BROADCAST),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(u128::MAX)),
        }
    }

    /// The loopback network of the family.
    pub fn loopback(self) -> IpNet {
        match self {
            Family::V4 => "127.0.0.0/8".parse().expect("valid prefix"),
            Family::V6 => "::1/128".parse().expect("valid prefix"),
        }
    }

    /// What a plain `-j REJECT` answers with.
    pub fn default_reject(self) -> RejectWith {
        match self {
            Family::V4 => RejectWith::IcmpPortUnreachable,
            Family::V6 => RejectWith::Icmp6PortUnreachable,
        }
    }
}

/// The tables svcplane reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Filter,
    Mangle,
    Nat,
    Raw,
}

impl Table {
    pub const ALL: [Table; 4] = [Table::Filter, Table::Mangle, Table::Nat, Table::Raw];

    pub fn name(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Mangle => "mangle",
            Table::Nat => "nat",
            Table::Raw => "raw",
        }
    }

    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The built-in chains, in the order `iptables-save` lists them.
    pub fn builtin_chains(self) -> &'static [&'static str] {
        match self {
            Table::Filter => &["INPUT", "FORWARD", "OUTPUT"],
            Table::Mangle => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
            Table::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
            Table::Raw => &["PREROUTING", "OUTPUT"],
        }
    }

    pub fn is_builtin(self, chain: &str) -> bool {
        self.builtin_chains().contains(&chain)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Transport protocols with a port match: the shared vocabulary's.
pub use svcplane_net::Protocol;

/// `[!] -s NET` or `[!] -d NET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressMatch {
    pub negate: bool,
    pub net: IpNet,
}

impl AddressMatch {
    pub fn is(net: impl Into<IpNet>) -> Self {
        Self { negate: false, net: net.into() }
    }

    pub fn is_not(net: impl Into<IpNet>) -> Self {
        Self { negate: true, net: net.into() }
    }

    pub fn matches(&self, address: IpAddr) -> bool {
        self.net.contains(&address) != self.negate
    }
}

/// `[!] --dport N` of a `tcp`, `udp` or `sctp` match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortTest {
    pub negate: bool,
    pub port: u16,
}

/// `[!] --src-type LOCAL` / `[!] --dst-type LOCAL` of the `addrtype` match: the address is
/// (or is not) one of this host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalTest {
    pub negate: bool,
}

/// A probability as `-m statistic --mode random` holds it: the kernel keeps
/// `round(p * 2^31)`, so two spellings are the same rule when those agree.
#[derive(Debug, Clone, Copy)]
pub struct Probability(pub f64);

impl Probability {
    const SCALE: f64 = 2_147_483_648.0;

    /// `1/n`, the share of the first of `n` remaining endpoints.
    pub fn one_in(n: usize) -> Self {
        Probability(1.0 / n as f64)
    }

    /// The kernel's value: `lround(p * 0x80000000)`.
    pub fn kernel(self) -> u32 {
        (self.0 * Self::SCALE).round().clamp(0.0, Self::SCALE) as u32
    }

    /// `%0.10f`, as kube-proxy writes it.
    pub fn restore_text(self) -> String {
        format!("{:.10}", self.0)
    }

    /// `%.11f` of the kernel's value, as `iptables-save` prints it.
    pub fn save_text(self) -> String {
        format!("{:.11}", f64::from(self.kernel()) / Self::SCALE)
    }

    /// Whether a random draw can pass, and whether it can fail.
    pub fn outcomes(self) -> (bool, bool) {
        let kernel = u64::from(self.kernel());
        (kernel > 0, kernel < (1u64 << 31))
    }
}

impl PartialEq for Probability {
    fn eq(&self, other: &Self) -> bool {
        self.kernel() == other.kernel()
    }
}

impl Eq for Probability {}

impl std::hash::Hash for Probability {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kernel().hash(state);
    }
}

/// What a `-m recent` match does with its list of source addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RecentAction {
    /// `--set`: records the source and matches.
    Set,
    /// `--rcheck [--seconds S] [--reap]`: matches if the source was recorded (recently).
    Check { seconds: Option<u32>, reap: bool },
}

/// `-m recent` over source addresses (`--rsource`, the default).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Recent {
    pub name: String,
    pub action: RecentAction,
    /// `--mask`; `None` is the default, all ones.
    pub mask: Option<IpAddr>,
}

/// Connection-tracking states of `-m conntrack --ctstate`, in the order `iptables-save`
/// prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CtState {
    Invalid,
    New,
    Related,
    Established,
    Untracked,
    Snat,
    Dnat,
}

impl CtState {
    pub fn name(self) -> &'static str {
        match self {
            CtState::Invalid => "INVALID",
            CtState::New => "NEW",
            CtState::Related => "RELATED",
            CtState::Established => "ESTABLISHED",
            CtState::Untracked => "UNTRACKED",
            CtState::Snat => "SNAT",
            CtState::Dnat => "DNAT",
        }
    }

    pub fn from_name(name: &str) -> Option<CtState> {
        [
            CtState::Invalid,
            CtState::New,
            CtState::Related,
            CtState::Established,
            CtState::Untracked,
            CtState::Snat,
            CtState::Dnat,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// One `-m MODULE [options]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `-m comment --comment TEXT`.
    Comment(String),
    /// `-m tcp|udp|sctp [[!] --dport N]`.
    Port {
        protocol: Protocol,
        destination_port: Option<PortTest>,
    },
    /// `-m addrtype [[!] --src-type LOCAL] [[!] --dst-type LOCAL]`.
    AddrType {
        source: Option<LocalTest>,
        destination: Option<LocalTest>,
    },
    /// `-m statistic --mode random --probability P`.
    Statistic(Probability),
    Recent(Recent),
    /// `-m mark [!] --mark VALUE[/MASK]`.
    Mark {
        negate: bool,
        value: u32,
        mask: u32,
    },
    /// `-m conntrack [!] --ctstate STATES`.
    Conntrack {
        negate: bool,
        states: Vec<CtState>,
    },
    /// Any module this crate does not model (other software's rules), kept verbatim.
    Other {
        module: String,
        options: Vec<String>,
    },
}

/// One argument of a rule, in the order it was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Arg {
    /// `[!] -s NET`.
    Source(AddressMatch),
    /// `[!] -d NET`.
    Destination(AddressMatch),
    /// `-p PROTO`.
    Protocol(Protocol),
    /// `-m MODULE ...`.
    Match(Match),
    /// `[!] --dport N` written apart from its `-m tcp|udp|sctp` (kube-proxy's order:
    /// `-m tcp -p tcp -d IP --dport N`). It belongs to the last port match before it.
    DestinationPort(PortTest),
    /// Anything else at the rule level (`-i eth0`, `-f`, ...), verbatim.
    Other(Vec<String>),
}

/// `--reject-with` of `-j REJECT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RejectWith {
    IcmpPortUnreachable,
    Icmp6PortUnreachable,
    TcpReset,
    Other(String),
}

impl RejectWith {
    pub fn name(&self) -> &str {
        match self {
            RejectWith::IcmpPortUnreachable => "icmp-port-unreachable",
            RejectWith::Icmp6PortUnreachable => "icmp6-port-unreachable",
            RejectWith::TcpReset => "tcp-reset",
            RejectWith::Other(name) => name,
        }
    }

    fn from_name(name: &str) -> RejectWith {
        match name {
            "icmp-port-unreachable" => RejectWith::IcmpPortUnreachable,
            "icmp6-port-unreachable" => RejectWith::Icmp6PortUnreachable,
            "tcp-reset" => RejectWith::TcpReset,
            other => RejectWith::Other(other.to_owned()),
        }
    }
}

/// How `-j MARK` changes the packet mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkOp {
    /// `--or-mark V`.
    Or(u32),
    /// `--xor-mark V`.
    Xor(u32),
    /// `--set-xmark V/M`: `mark = (mark & !M) ^ V`, what the kernel keeps for every form.
    SetXmark { value: u32, mask: u32 },
}

impl MarkOp {
    /// The `--set-xmark` the kernel stores for this operation.
    pub fn as_xmark(self) -> (u32, u32) {
        match self {
            MarkOp::Or(value) => (value, value),
            MarkOp::Xor(value) => (value, 0),
            MarkOp::SetXmark { value, mask } => (value, mask),
        }
    }

    pub fn apply(self, mark: u32) -> u32 {
        let (value, mask) = self.as_xmark();
        (mark & !mask) ^ value
    }
}

/// Where a rule sends a packet it matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Accept,
    Drop,
    Return,
    /// `-j CHAIN`: a user-defined chain.
    Jump(String),
    /// `-g CHAIN`.
    Goto(String),
    /// `-j REJECT [--reject-with W]`; `None` is the family's ICMP port unreachable.
    Reject(Option<RejectWith>),
    /// `-j DNAT --to-destination ADDR:PORT`.
    Dnat(SocketAddr),
    /// `-j MASQUERADE [--random-fully]`.
    Masquerade {
        random_fully: bool,
    },
    /// `-j MARK ...`.
    Mark(MarkOp),
    /// A target extension this crate does not model, verbatim.
    Other {
        name: String,
        options: Vec<String>,
    },
}

/// Target extensions that are never chain names, so `-j NAME` without options is read as
/// a target and not as a jump.
const TARGET_EXTENSIONS: &[&str] = &[
    "ACCEPT",
    "DROP",
    "RETURN",
    "QUEUE",
    "REJECT",
    "DNAT",
    "SNAT",
    "MASQUERADE",
    "REDIRECT",
    "MARK",
    "CONNMARK",
    "LOG",
    "NFLOG",
    "NFQUEUE",
    "NOTRACK",
    "CT",
    "TRACE",
    "TPROXY",
    "TCPMSS",
    "CHECKSUM",
    "CLASSIFY",
    "AUDIT",
    "SET",
    "TEE",
    "ULOG",
];

/// Whether `name` is a target extension rather than a possible chain name.
pub fn is_target_extension(name: &str) -> bool {
    TARGET_EXTENSIONS.contains(&name)
}

/// One rule: arguments in written order, then at most one target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    pub args: Vec<Arg>,
    pub target: Option<Target>,
}

/// Building rules argument by argument, in the order they should be written.
impl Rule {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn arg(mut self, arg: Arg) -> Self {
        self.args.push(arg);
        self
    }

    pub fn matching(self, m: Match) -> Self {
        self.arg(Arg::Match(m))
    }

    /// `-m comment --comment TEXT`.
    pub fn comment(self, text: impl Into<String>) -> Self {
        self.matching(Match::Comment(text.into()))
    }

    /// `-m PROTO -p PROTO`, kube-proxy's way of naming the protocol.
    pub fn protocol(self, protocol: Protocol) -> Self {
        self.matching(Match::Port { protocol, destination_port: None }).arg(Arg::Protocol(protocol))
    }

    /// `-s NET` (a bare address is a host network).
    pub fn source(self, net: impl Into<IpNet>) -> Self {
        self.arg(Arg::Source(AddressMatch::is(net)))
    }

    /// `! -s NET`.
    pub fn not_source(self, net: impl Into<IpNet>) -> Self {
        self.arg(Arg::Source(AddressMatch::is_not(net)))
    }

    /// `-d NET`.
    pub fn destination(self, net: impl Into<IpNet>) -> Self {
        self.arg(Arg::Destination(AddressMatch::is(net)))
    }

    /// `! -d NET`.
    pub fn not_destination(self, net: impl Into<IpNet>) -> Self {
        self.arg(Arg::Destination(AddressMatch::is_not(net)))
    }

    /// `--dport N` (after an earlier `-m tcp|udp|sctp`).
    pub fn destination_port(self, port: u16) -> Self {
        self.arg(Arg::DestinationPort(PortTest { negate: false, port }))
    }

    /// `-m addrtype --src-type LOCAL`.
    pub fn source_is_local(self) -> Self {
        self.matching(Match::AddrType { source: Some(LocalTest { negate: false }), destination: None })
    }

    /// `-m addrtype --dst-type LOCAL`.
    pub fn destination_is_local(self) -> Self {
        self.matching(Match::AddrType { source: None, destination: Some(LocalTest { negate: false }) })
    }

    /// `-m conntrack --ctstate NEW`.
    pub fn new_connections(self) -> Self {
        self.matching(Match::Conntrack { negate: false, states: vec![CtState::New] })
    }

    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }

    /// `-j CHAIN`.
    pub fn jump(self, chain: impl Into<String>) -> Self {
        self.target(Target::Jump(chain.into()))
    }

    /// The user chains this rule sends packets to.
    pub fn jump_target(&self) -> Option<&str> {
        match &self.target {
            Some(Target::Jump(chain) | Target::Goto(chain)) => Some(chain),
            _ => None,
        }
    }

    /// The protocol the rule is restricted to (`-p`), if any.
    pub fn protocol_restriction(&self) -> Option<Protocol> {
        self.args.iter().find_map(|arg| match arg {
            Arg::Protocol(protocol) => Some(*protocol),
            _ => None,
        })
    }

    pub fn comments(&self) -> impl Iterator<Item = &str> {
        self.args.iter().filter_map(|arg| match arg {
            Arg::Match(Match::Comment(text)) => Some(text.as_str()),
            _ => None,
        })
    }
}

/// Rendering and normalisation.
impl Rule {
    /// The rule as the kernel keeps it and `iptables-save` prints it: addresses as networks,
    /// `-s -d -p` first, `--dport` inside its port match, defaults spelled out.
    pub fn canonical(&self, family: Family) -> Rule {
        let mut source = None;
        let mut destination = None;
        let mut protocol = None;
        let mut others: Vec<Arg> = Vec::new();
        let mut matches: Vec<Match> = Vec::new();
        let mut leftovers: Vec<Arg> = Vec::new();
        for arg in &self.args {
            match arg {
                Arg::Source(m) => source = Some(AddressMatch { negate: m.negate, net: m.net.trunc() }),
                Arg::Destination(m) => destination = Some(AddressMatch { negate: m.negate, net: m.net.trunc() }),
                Arg::Protocol(p) => protocol = Some(*p),
                Arg::Other(tokens) => others.push(Arg::Other(tokens.clone())),
                Arg::Match(m) => matches.push(canonical_match(m, family)),
                Arg::DestinationPort(test) => {
                    let owner = matches.iter_mut().rev().find_map(|m| match m {
                        Match::Port { destination_port, .. } => Some(destination_port),
                        _ => None,
                    });
                    match owner {
                        Some(slot @ None) => *slot = Some(*test),
                        _ => leftovers.push(Arg::DestinationPort(*test)),
                    }
                }
            }
        }
        let mut args = Vec::with_capacity(self.args.len());
        args.extend(source.map(Arg::Source));
        args.extend(destination.map(Arg::Destination));
        args.extend(others);
        args.extend(protocol.map(Arg::Protocol));
        args.extend(matches.into_iter().map(Arg::Match));
        args.extend(leftovers);
        let target = self.target.as_ref().map(|target| match target {
            Target::Reject(None) => Target::Reject(Some(family.default_reject())),
            Target::Mark(op) => {
                let (value, mask) = op.as_xmark();
                Target::Mark(MarkOp::SetXmark { value, mask })
            }
            other => other.clone(),
        });
        Rule { args, target }
    }

    /// The arguments as written to `iptables-restore`, in written order.
    pub fn restore_args(&self) -> String {
        let mut out = String::new();
        for arg in &self.args {
            match arg {
                Arg::Source(m) => push_address(&mut out, "-s", m, false),
                Arg::Destination(m) => push_address(&mut out, "-d", m, false),
                Arg::Protocol(p) => push(&mut out, &["-p", p.as_str()]),
                Arg::Match(m) => push_match(&mut out, m, Spelling::Restore),
                Arg::DestinationPort(test) => push_port(&mut out, test),
                Arg::Other(tokens) => tokens.iter().for_each(|t| push(&mut out, &[t])),
            }
        }
        if let Some(target) = &self.target {
            push_target(&mut out, target, Spelling::Restore);
        }
        out
    }

    /// The arguments as `iptables-save` prints this rule.
    pub fn save_args(&self, family: Family) -> String {
        let canonical = self.canonical(family);
        let mut out = String::new();
        for arg in &canonical.args {
            match arg {
                Arg::Source(m) => push_address(&mut out, "-s", m, true),
                Arg::Destination(m) => push_address(&mut out, "-d", m, true),
                Arg::Protocol(p) => push(&mut out, &["-p", p.as_str()]),
                Arg::Match(m) => push_match(&mut out, m, Spelling::Save(family)),
                Arg::DestinationPort(test) => push_port(&mut out, test),
                Arg::Other(tokens) => tokens.iter().for_each(|t| push(&mut out, &[t])),
            }
        }
        if let Some(target) = &canonical.target {
            push_target(&mut out, target, Spelling::Save(family));
        }
        out
    }

    /// Whether the kernel would hold the two as the same rule.
    pub fn same_as(&self, other: &Rule, family: Family) -> bool {
        self.canonical(family) == other.canonical(family)
    }
}

fn canonical_match(m: &Match, family: Family) -> Match {
    match m {
        Match::Recent(recent) => {
            let mut recent = recent.clone();
            recent.mask = Some(recent.mask.unwrap_or_else(|| family.full_mask()));
            Match::Recent(recent)
        }
        Match::Conntrack { negate, states } => {
            let mut states = states.clone();
            states.sort();
            states.dedup();
            Match::Conntrack { negate: *negate, states }
        }
        other => other.clone(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    Restore,
    Save(Family),
}

fn push(out: &mut String, words: &[&str]) {
    for word in words {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
}

fn push_address(out: &mut String, flag: &str, m: &AddressMatch, with_prefix: bool) {
    if m.negate {
        push(out, &["!"]);
    }
    let host = m.net.prefix_len() == m.net.max_prefix_len();
    let text = if host && !with_prefix { m.net.addr().to_string() } else { m.net.to_string() };
    push(out, &[flag, &text]);
}

fn push_port(out: &mut String, test: &PortTest) {
    if test.negate {
        push(out, &["!"]);
    }
    push(out, &["--dport", &test.port.to_string()]);
}

fn push_local_test(out: &mut String, flag: &str, test: &LocalTest) {
    if test.negate {
        push(out, &["!"]);
    }
    push(out, &[flag, "LOCAL"]);
}

fn hex(value: u32) -> String {
    format!("{value:#x}")
}

fn push_match(out: &mut String, m: &Match, spelling: Spelling) {
    match m {
        Match::Comment(text) => {
            let quoted = match spelling {
                Spelling::Restore => quote_for_restore(text),
                Spelling::Save(_) => quote_for_save(text),
            };
            push(out, &["-m", "comment", "--comment", &quoted]);
        }
        Match::Port { protocol, destination_port } => {
            push(out, &["-m", protocol.as_str()]);
            if let Some(test) = destination_port {
                push_port(out, test);
            }
        }
        Match::AddrType { source, destination } => {
            push(out, &["-m", "addrtype"]);
            if let Some(test) = source {
                push_local_test(out, "--src-type", test);
            }
            if let Some(test) = destination {
                push_local_test(out, "--dst-type", test);
            }
        }
        Match::Statistic(p) => {
            let text = match spelling {
                Spelling::Restore => p.restore_text(),
                Spelling::Save(_) => p.save_text(),
            };
            push(out, &["-m", "statistic", "--mode", "random", "--probability", &text]);
        }
        Match::Recent(recent) => push_recent(out, recent, spelling),
        Match::Mark { negate, value, mask } => {
            push(out, &["-m", "mark"]);
            if *negate {
                push(out, &["!"]);
            }
            let text = if *mask == u32::MAX { hex(*value) } else { format!("{}/{}", hex(*value), hex(*mask)) };
            push(out, &["--mark", &text]);
        }
        Match::Conntrack { negate, states } => {
            push(out, &["-m", "conntrack"]);
            if *negate {
                push(out, &["!"]);
            }
            let list: Vec<&str> = states.iter().map(|s| s.name()).collect();
            push(out, &["--ctstate", &list.join(",")]);
        }
        Match::Other { module, options } => {
            push(out, &["-m", module]);
            options.iter().for_each(|o| push(out, &[o]));
        }
    }
}

fn push_recent(out: &mut String, recent: &Recent, spelling: Spelling) {
    push(out, &["-m", "recent"]);
    match spelling {
        // kube-proxy: `-m recent --name N --set` / `--name N --rcheck --seconds S --reap`.
        Spelling::Restore => {
            push(out, &["--name", &recent.name]);
            push_recent_action(out, &recent.action);
            if let Some(mask) = recent.mask {
                push(out, &["--mask", &mask.to_string()]);
            }
        }
        // iptables-save: the action first, then name, mask and side.
        Spelling::Save(family) => {
            push_recent_action(out, &recent.action);
            let mask = recent.mask.unwrap_or_else(|| family.full_mask());
            push(out, &["--name", &recent.name, "--mask", &mask.to_string(), "--rsource"]);
        }
    }
}

fn push_recent_action(out: &mut String, action: &RecentAction) {
    match action {
        RecentAction::Set => push(out, &["--set"]),
        RecentAction::Check { seconds, reap } => {
            push(out, &["--rcheck"]);
            if let Some(seconds) = seconds {
                push(out, &["--seconds", &seconds.to_string()]);
            }
            if *reap {
                push(out, &["--reap"]);
            }
        }
    }
}

fn socket_text(address: &SocketAddr) -> String {
    // `1.2.3.4:80` and `[2001:db8::1]:80`, as both iptables and Go's JoinHostPort write them.
    address.to_string()
}

fn push_target(out: &mut String, target: &Target, spelling: Spelling) {
    match target {
        Target::Accept => push(out, &["-j", "ACCEPT"]),
        Target::Drop => push(out, &["-j", "DROP"]),
        Target::Return => push(out, &["-j", "RETURN"]),
        Target::Jump(chain) => push(out, &["-j", chain]),
        Target::Goto(chain) => push(out, &["-g", chain]),
        Target::Reject(with) => {
            push(out, &["-j", "REJECT"]);
            let with = match (with, spelling) {
                (Some(with), _) => Some(with.clone()),
                (None, Spelling::Save(family)) => Some(family.default_reject()),
                (None, Spelling::Restore) => None,
            };
            if let Some(with) = with {
                push(out, &["--reject-with", with.name()]);
            }
        }
        Target::Dnat(address) => push(out, &["-j", "DNAT", "--to-destination", &socket_text(address)]),
        Target::Masquerade { random_fully } => {
            push(out, &["-j", "MASQUERADE"]);
            if *random_fully {
                push(out, &["--random-fully"]);
            }
        }
        Target::Mark(op) => {
            push(out, &["-j", "MARK"]);
            match (op, spelling) {
                (MarkOp::Or(value), Spelling::Restore) => push(out, &["--or-mark", &hex(*value)]),
                (MarkOp::Xor(value), Spelling::Restore) => push(out, &["--xor-mark", &hex(*value)]),
                _ => {
                    let (value, mask) = op.as_xmark();
                    push(out, &["--set-xmark", &format!("{}/{}", hex(value), hex(mask))]);
                }
            }
        }
        Target::Other { name, options } => {
            push(out, &["-j", name]);
            options.iter().for_each(|o| push(out, &[o]));
        }
    }
}

/// Characters `iptables-save` prints without quotes (`xtables_save_string`).
fn is_plain_save_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// A value as `iptables-save` prints it: bare if it only holds `[A-Za-z0-9_-]`, else in
/// double quotes with `"`, `\` and `'` escaped.
pub fn quote_for_save(value: &str) -> String {
    if !value.is_empty() && value.chars().all(is_plain_save_char) {
        return value.to_owned();
    }
    quoted(value)
}

/// A value for `iptables-restore`: bare unless it holds blanks or quote characters (so
/// `ns/svc:port` stays bare and `"ns/svc:port cluster IP"` is quoted, as kube-proxy writes).
pub fn quote_for_restore(value: &str) -> String {
    let needs_quotes =
        value.is_empty() || value.chars().any(|c| c.is_whitespace() || matches!(c, '"' | '\\' | '\'' | '#'));
    if needs_quotes { quoted(value) } else { value.to_owned() }
}

fn quoted(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Parses the typed forms of the modules this crate models; anything else is `Other`.
pub(crate) fn parse_match(module: &str, options: &[String]) -> Match {
    let other = || Match::Other { module: module.to_owned(), options: options.to_vec() };
    let opts: Vec<&str> = options.iter().map(String::as_str).collect();
    match module {
        "comment" => match opts.as_slice() {
            ["--comment", text] => Match::Comment((*text).to_owned()),
            _ => other(),
        },
        "tcp" | "udp" | "sctp" => {
            let protocol = Protocol::from_name(module).expect("a port module");
            let test = match opts.as_slice() {
                [] => None,
                ["--dport" | "--destination-port", port] => match port.parse() {
                    Ok(port) => Some(PortTest { negate: false, port }),
                    Err(_) => return other(),
                },
                ["!", "--dport" | "--destination-port", port] => match port.parse() {
                    Ok(port) => Some(PortTest { negate: true, port }),
                    Err(_) => return other(),
                },
                _ => return other(),
            };
            Match::Port { protocol, destination_port: test }
        }
        "addrtype" => {
            let mut source = None;
            let mut destination = None;
            let mut rest = opts.as_slice();
            while !rest.is_empty() {
                let (negate, tail) = match rest {
                    ["!", tail @ ..] => (true, tail),
                    tail => (false, tail),
                };
                match tail {
                    ["--src-type", "LOCAL", more @ ..] if source.is_none() => {
                        source = Some(LocalTest { negate });
                        rest = more;
                    }
                    ["--dst-type", "LOCAL", more @ ..] if destination.is_none() => {
                        destination = Some(LocalTest { negate });
                        rest = more;
                    }
                    _ => return other(),
                }
            }
            if source.is_none() && destination.is_none() {
                return other();
            }
            Match::AddrType { source, destination }
        }
        "statistic" => match opts.as_slice() {
            ["--mode", "random", "--probability", p] => match p.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Match::Statistic(Probability(p)),
                _ => other(),
            },
            _ => other(),
        },
        "recent" => parse_recent(&opts).map(Match::Recent).unwrap_or_else(other),
        "mark" => {
            let (negate, rest) = match opts.as_slice() {
                ["!", rest @ ..] => (true, rest),
                rest => (false, rest),
            };
            match rest {
                ["--mark", value] => match parse_value_mask(value) {
                    Some((value, mask)) => Match::Mark { negate, value, mask },
                    None => other(),
                },
                _ => other(),
            }
        }
        "conntrack" => {
            let (negate, rest) = match opts.as_slice() {
                ["!", rest @ ..] => (true, rest),
                rest => (false, rest),
            };
            match rest {
                ["--ctstate", list] => {
                    let states: Option<Vec<CtState>> = list.split(',').map(CtState::from_name).collect();
                    match states {
                        Some(states) if !states.is_empty() => Match::Conntrack { negate, states },
                        _ => other(),
                    }
                }
                _ => other(),
            }
        }
        _ => other(),
    }
}

fn parse_recent(opts: &[&str]) -> Option<Recent> {
    let mut name = None;
    let mut set = false;
    let mut check = false;
    let mut seconds = None;
    let mut reap = false;
    let mut mask = None;
    let mut rest = opts;
    while let Some((first, tail)) = rest.split_first() {
        rest = tail;
        match *first {
            "--name" => {
                let (value, tail) = rest.split_first()?;
                name = Some((*value).to_owned());
                rest = tail;
            }
            "--set" => set = true,
            "--rcheck" => check = true,
            "--reap" => reap = true,
            "--rsource" => {}
            "--seconds" => {
                let (value, tail) = rest.split_first()?;
                seconds = Some(value.parse().ok()?);
                rest = tail;
            }
            "--mask" => {
                let (value, tail) = rest.split_first()?;
                mask = Some(value.parse::<IpAddr>().ok()?);
                rest = tail;
            }
            _ => return None,
        }
    }
    let action = match (set, check) {
        (true, false) if seconds.is_none() && !reap => RecentAction::Set,
        (false, true) => RecentAction::Check { seconds, reap },
        _ => return None,
    };
    Some(Recent { name: name?, action, mask })
}

fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn parse_value_mask(text: &str) -> Option<(u32, u32)> {
    match text.split_once('/') {
        Some((value, mask)) => Some((parse_u32(value)?, parse_u32(mask)?)),
        None => Some((parse_u32(text)?, u32::MAX)),
    }
}

/// Parses a target and its options; unknown ones are `Other`, a bare name that is no
/// target extension is a jump to a chain.
pub(crate) fn parse_target(name: &str, options: &[String]) -> Target {
    let other = || Target::Other { name: name.to_owned(), options: options.to_vec() };
    let opts: Vec<&str> = options.iter().map(String::as_str).collect();
    match (name, opts.as_slice()) {
        ("ACCEPT", []) => Target::Accept,
        ("DROP", []) => Target::Drop,
        ("RETURN", []) => Target::Return,
        ("REJECT", []) => Target::Reject(None),
        ("REJECT", ["--reject-with", with]) => Target::Reject(Some(RejectWith::from_name(with))),
        ("DNAT", ["--to-destination", to]) => to.parse().map(Target::Dnat).unwrap_or_else(|_| other()),
        ("MASQUERADE", []) => Target::Masquerade { random_fully: false },
        ("MASQUERADE", ["--random-fully"]) => Target::Masquerade { random_fully: true },
        ("MARK", ["--or-mark", value]) => parse_u32(value).map(|v| Target::Mark(MarkOp::Or(v))).unwrap_or_else(other),
        ("MARK", ["--xor-mark", value]) => parse_u32(value).map(|v| Target::Mark(MarkOp::Xor(v))).unwrap_or_else(other),
        ("MARK", ["--set-xmark", value]) => parse_value_mask(value)
            .map(|(value, mask)| Target::Mark(MarkOp::SetXmark { value, mask }))
            .unwrap_or_else(other),
        (chain, []) if !is_target_extension(chain) => Target::Jump(chain.to_owned()),
        _ => other(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster_ip_rule() -> Rule {
        Rule::new()
            .comment("ns1/svc1:p80 cluster IP")
            .protocol(Protocol::Tcp)
            .destination("172.30.0.41".parse::<IpAddr>().unwrap())
            .destination_port(80)
            .jump("KUBE-SVC-XPGD46QRK7WJZT7O")
    }

    #[test]
    fn a_rule_is_written_for_restore_in_the_order_it_was_built() {
        assert_eq!(
            cluster_ip_rule().restore_args(),
            "-m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O"
        );
    }

    #[test]
    fn iptables_save_prints_addresses_and_protocol_first_and_the_port_inside_its_match() {
        assert_eq!(
            cluster_ip_rule().save_args(Family::V4),
            "-d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O"
        );
    }

    #[test]
    fn the_kernel_keeps_a_third_as_0_33333333349() {
        let p = Probability::one_in(3);
        assert_eq!(p.restore_text(), "0.3333333333");
        assert_eq!(p.save_text(), "0.33333333349");
        assert_eq!(Probability::one_in(2).save_text(), "0.50000000000");
        assert_eq!(Probability(0.33333333349), p);
    }

    #[test]
    fn mark_targets_are_kept_as_set_xmark() {
        let or = Rule::new().target(Target::Mark(MarkOp::Or(0x4000)));
        assert_eq!(or.restore_args(), "-j MARK --or-mark 0x4000");
        assert_eq!(or.save_args(Family::V4), "-j MARK --set-xmark 0x4000/0x4000");
        let xor = Rule::new().target(Target::Mark(MarkOp::Xor(0x4000)));
        assert_eq!(xor.save_args(Family::V6), "-j MARK --set-xmark 0x4000/0x0");
        assert_eq!(MarkOp::Xor(0x4000).apply(0x4001), 1);
        assert_eq!(MarkOp::Or(0x4000).apply(1), 0x4001);
    }

    #[test]
    fn a_plain_reject_answers_with_the_family_port_unreachable() {
        let rule = Rule::new().target(Target::Reject(None));
        assert_eq!(rule.restore_args(), "-j REJECT");
        assert_eq!(rule.save_args(Family::V4), "-j REJECT --reject-with icmp-port-unreachable");
        assert_eq!(rule.save_args(Family::V6), "-j REJECT --reject-with icmp6-port-unreachable");
    }

    #[test]
    fn save_quotes_only_values_with_characters_outside_letters_digits_dash_and_underscore() {
        assert_eq!(quote_for_save("x"), "x");
        assert_eq!(quote_for_save("ns/svc"), "\"ns/svc\"");
        assert_eq!(quote_for_save("a \"b\""), "\"a \\\"b\\\"\"");
        assert_eq!(quote_for_restore("ns/svc:p"), "ns/svc:p");
        assert_eq!(quote_for_restore("ns/svc:p cluster IP"), "\"ns/svc:p cluster IP\"");
    }

    #[test]
    fn recent_is_written_as_kube_proxy_does_and_saved_with_its_defaults() {
        let rule = Rule::new()
            .matching(Match::Recent(Recent {
                name: "KUBE-SEP-X".into(),
                action: RecentAction::Check { seconds: Some(10800), reap: true },
                mask: None,
            }))
            .jump("KUBE-SEP-X");
        assert_eq!(rule.restore_args(), "-m recent --name KUBE-SEP-X --rcheck --seconds 10800 --reap -j KUBE-SEP-X");
        assert_eq!(
            rule.save_args(Family::V6),
            "-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-X --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -j KUBE-SEP-X"
        );
    }

    #[test]
    fn a_bare_name_that_is_no_target_extension_is_a_jump() {
        assert_eq!(parse_target("KUBE-SERVICES", &[]), Target::Jump("KUBE-SERVICES".into()));
        assert!(matches!(parse_target("LOG", &[]), Target::Other { .. }));
        assert_eq!(
            parse_target("DNAT", &["--to-destination".into(), "[fd00::1]:80".into()]),
            Target::Dnat("[fd00::1]:80".parse().unwrap())
        );
    }
}
