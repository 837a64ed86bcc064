//! Typed nftables objects: what a backend asks for, independent of how it reaches the
//! kernel (text through `nft -f`, netlink, or the in-memory fake).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

/// Table family. svcplane keeps one table per IP family, as kube-proxy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    /// The keyword `nft` uses for this family (`ip`, `ip6`).
    pub fn keyword(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }

    /// Whether an address belongs to this family.
    pub fn contains(self, address: IpAddr) -> bool {
        matches!((self, address), (Family::Ip, IpAddr::V4(_)) | (Family::Ip6, IpAddr::V6(_)))
    }

    /// The set key type of this family's addresses.
    pub fn address_type(self) -> DataType {
        match self {
            Family::Ip => DataType::Ipv4Addr,
            Family::Ip6 => DataType::Ipv6Addr,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.keyword())
    }
}

/// A table, by family and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableName {
    pub family: Family,
    pub name: String,
}

impl TableName {
    pub fn new(family: Family, name: impl Into<String>) -> Self {
        TableName { family, name: name.into() }
    }
}

/// `ip svcplane`, as `nft` writes it.
impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    Filter,
    Nat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

/// What makes a chain a base chain: attached to a netfilter hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub chain_type: ChainType,
    pub hook: Hook,
    /// Numeric priority (dstnat = -100, filter = 0, srcnat = 100).
    pub priority: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub comment: Option<String>,
}

/// Types of set keys and map values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Verdict,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    pub name: String,
    /// More than one type makes a concatenated key.
    pub key: Vec<DataType>,
    /// `Some` makes this a map (`Verdict` for a verdict map).
    pub value: Option<Vec<DataType>>,
    /// Elements are prefixes / ranges.
    pub interval: bool,
    /// Elements may be added from the packet path (`update @set`) and expire.
    pub dynamic_timeout: Option<Duration>,
    pub comment: Option<String>,
}

impl Set {
    /// Maps have a value for each key; `nft` spells some commands differently for them.
    pub fn is_map(&self) -> bool {
        self.value.is_some()
    }

    /// A verdict map: each key leads to a verdict (`vmap`).
    pub fn is_verdict_map(&self) -> bool {
        self.value.as_deref() == Some(&[DataType::Verdict])
    }
}

/// One component of an element key or data value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Address(IpAddr),
    Prefix(IpNet),
    /// An IP protocol number (6 = tcp, 17 = udp, 132 = sctp).
    Protocol(u8),
    Port(u16),
    Integer(u32),
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl Verdict {
    /// The chain a `jump` or `goto` leads to.
    pub fn target(&self) -> Option<&str> {
        match self {
            Verdict::Jump(chain) | Verdict::Goto(chain) => Some(chain),
            Verdict::Accept | Verdict::Drop | Verdict::Return => None,
        }
    }
}

/// The value side of a map element.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ElementValue {
    Verdict(Verdict),
    Data(Vec<Value>),
}

impl ElementValue {
    /// The chain this value jumps or goes to, if any.
    pub fn target(&self) -> Option<&str> {
        match self {
            ElementValue::Verdict(verdict) => verdict.target(),
            ElementValue::Data(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub set: String,
    pub key: Vec<Value>,
    pub value: Option<ElementValue>,
    pub comment: Option<String>,
}

/// A packet field or computed value a rule can test, or a set key is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Expr {
    /// `ip saddr` / `ip6 saddr`, by table family.
    SourceAddress,
    DestinationAddress,
    /// `meta l4proto`.
    L4Proto,
    /// `th dport`: transport-header destination port, for TCP, UDP and SCTP alike.
    DestinationPort,
    SourcePort,
    /// `meta mark`.
    Mark,
    /// `numgen random mod N`: a fresh random number in 0..N for each evaluation.
    RandomModulo(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
}

/// `fib saddr type local` / `fib daddr type local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FibAddress {
    Source,
    Destination,
}

/// A condition; a rule's statements run only while its matches hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `left == value` or `left != value`.
    Compare { left: Expr, op: CmpOp, right: Value },
    /// Address in (or, negated, outside) any of these prefixes. One prefix renders inline;
    /// several render as an anonymous set, so keep this for short lists.
    InPrefixes { left: Expr, negate: bool, prefixes: Vec<IpNet> },
    /// The concatenation of `keys` is (or is not) an element of a named set.
    InSet { keys: Vec<Expr>, negate: bool, set: String },
    /// `meta mark & mask == value` / `!= value`.
    MarkMasked { mask: u32, op: CmpOp, value: u32 },
    /// The address is (or is not) local to this host.
    FibLocal { address: FibAddress, negate: bool },
    /// `ct state new`.
    CtStateNew,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectKind {
    /// ICMP port unreachable (ICMPv6 for ip6), the kernel's default.
    PortUnreachable,
    TcpReset,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Statement {
    Match(Match),
    Counter,
    /// `meta mark set meta mark | bits`.
    SetMarkBits(u32),
    /// `meta mark set meta mark ^ bits`.
    ToggleMarkBits(u32),
    /// `dnat to addr:port`; the rule must also match `meta l4proto` when a port is given.
    Dnat {
        address: IpAddr,
        port: Option<u16>,
    },
    Masquerade {
        fully_random: bool,
    },
    Reject(RejectKind),
    /// `<keys> vmap @map`.
    VerdictMap {
        keys: Vec<Expr>,
        map: String,
    },
    /// `update @set { <keys> }`: adds or refreshes the packet's key in a dynamic set.
    UpdateSet {
        keys: Vec<Expr>,
        set: String,
    },
    Verdict(Verdict),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub chain: String,
    pub statements: Vec<Statement>,
    pub comment: Option<String>,
}

impl Rule {
    /// The chains this rule jumps or goes to.
    pub fn targets(&self) -> impl Iterator<Item = &str> {
        self.statements.iter().filter_map(|statement| match statement {
            Statement::Verdict(verdict) => verdict.target(),
            _ => None,
        })
    }

    /// The named sets and maps this rule reads or updates.
    pub fn set_references(&self) -> impl Iterator<Item = &str> {
        self.statements.iter().filter_map(|statement| match statement {
            Statement::Match(Match::InSet { set, .. })
            | Statement::VerdictMap { map: set, .. }
            | Statement::UpdateSet { set, .. } => Some(set.as_str()),
            _ => None,
        })
    }
}

/// One step of a transaction, with `nft`'s meaning: `Add*` of an object that exists is a
/// no-op (rules always append), `Delete*` of a missing object fails the transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Operation {
    AddTable { comment: Option<String> },
    DeleteTable,
    AddChain(Chain),
    FlushChain(String),
    DeleteChain(String),
    AddRule(Rule),
    AddSet(Set),
    FlushSet(String),
    DeleteSet(String),
    AddElement(Element),
    DeleteElement(Element),
}

impl Operation {
    /// A map from `key` to verdicts (no interval, no timeout, no comment).
    pub fn add_verdict_map(name: &str, key: Vec<DataType>) -> Operation {
        Operation::AddSet(Set {
            name: name.to_owned(),
            key,
            value: Some(vec![DataType::Verdict]),
            interval: false,
            dynamic_timeout: None,
            comment: None,
        })
    }

    /// A chain, a base chain when `base` says its type, hook and priority.
    pub fn add_chain(name: &str, base: Option<(ChainType, Hook, i32)>) -> Operation {
        Operation::AddChain(Chain {
            name: name.to_owned(),
            base: base.map(|(chain_type, hook, priority)| BaseChain { chain_type, hook, priority }),
            comment: None,
        })
    }

    /// A rule without a comment, appended to `chain`.
    pub fn add_rule(chain: &str, statements: Vec<Statement>) -> Operation {
        Operation::AddRule(Rule { chain: chain.to_owned(), statements, comment: None })
    }
}

impl Statement {
    /// `jump TARGET`.
    pub fn jump(target: &str) -> Statement {
        Statement::Verdict(Verdict::Jump(target.to_owned()))
    }
}

/// Operations on one table that the kernel applies all together or not at all.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Transaction {
    pub table: TableName,
    pub operations: Vec<Operation>,
}
