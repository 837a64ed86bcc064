//! What nft 1.0.6 refuses in a transaction whatever the kernel holds: names it cannot
//! parse, comments it cannot carry, mistyped rules, impossible set definitions. The text
//! renderer runs these checks before writing a single line (so a bad name can never change
//! the meaning of a script) and the fake runs the same ones, so both fail alike.
//!
//! Every rule here was measured against the real `nft` 1.0.6 (see the real-kernel tests).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::error::{NftError, ObjectKind};
use crate::objects::{
    BaseChain, Chain, ChainType, CmpOp, DataType, Element, ElementValue, Expr, Family, Hook, Match, Operation,
    RejectKind, Rule, Set, Statement, Transaction, Value, Verdict,
};

/// Longest table, chain or set name the kernel stores (256 bytes with the terminating NUL).
const MAX_NAME_LEN: usize = 255;

/// Longest comment nft accepts, in bytes.
const MAX_COMMENT_LEN: usize = 128;

/// Words that nft 1.0.6's scanner turns into keywords wherever a table, chain or set name is
/// expected, so they cannot be names (1.0.6 does not accept quoted names either). Measured by
/// trying every token of its grammar as a chain, set and table name; sorted for binary search.
pub const RESERVED_WORDS: &[&str] = &[
    "accept",
    "add",
    "ah",
    "all",
    "arp",
    "auto-merge",
    "bridge",
    "cgroup",
    "chain",
    "comment",
    "comp",
    "constant",
    "continue",
    "counter",
    "cpu",
    "create",
    "ct",
    "day",
    "dccp",
    "define",
    "delete",
    "describe",
    "device",
    "devices",
    "dnat",
    "drop",
    "dst",
    "dup",
    "dynamic",
    "ecn",
    "element",
    "elements",
    "esp",
    "ether",
    "exists",
    "expires",
    "export",
    "exthdr",
    "fib",
    "flags",
    "flow",
    "flowtable",
    "flush",
    "frag",
    "fwd",
    "gc-interval",
    "get",
    "goto",
    "handle",
    "hbh",
    "hook",
    "hour",
    "ibriport",
    "ibrname",
    "icmp",
    "icmpv6",
    "igmp",
    "iif",
    "iifgroup",
    "iifname",
    "iiftype",
    "import",
    "include",
    "index",
    "inet",
    "insert",
    "interval",
    "ip",
    "ip6",
    "ipsec",
    "jhash",
    "jump",
    "limit",
    "list",
    "log",
    "map",
    "mark",
    "masquerade",
    "meta",
    "meter",
    "mh",
    "missing",
    "monitor",
    "netdev",
    "nftrace",
    "notrack",
    "numgen",
    "obriport",
    "obrname",
    "offload",
    "oif",
    "oifgroup",
    "oifname",
    "oiftype",
    "osf",
    "pkttype",
    "policy",
    "position",
    "priority",
    "queue",
    "quota",
    "random",
    "redefine",
    "redirect",
    "reject",
    "rename",
    "replace",
    "reset",
    "return",
    "rt",
    "rt0",
    "rt2",
    "rtclassid",
    "rule",
    "ruleset",
    "sctp",
    "secmark",
    "set",
    "size",
    "skgid",
    "skuid",
    "snat",
    "socket",
    "srh",
    "symhash",
    "synproxy",
    "table",
    "tcp",
    "th",
    "time",
    "timeout",
    "tproxy",
    "type",
    "typeof",
    "udp",
    "udplite",
    "undefine",
    "update",
    "vlan",
    "vmap",
    "xt",
];

/// Whether nft 1.0.6 accepts `name` as a table, chain or set name. Backends can call this
/// when they make names up, long before a transaction is applied.
pub fn check_name(kind: ObjectKind, name: &str) -> Result<(), NftError> {
    let invalid = |reason| Err(NftError::InvalidName { kind, name: name.to_owned(), reason });
    let Some(first) = name.bytes().next() else {
        return invalid("it is empty");
    };
    if name.len() > MAX_NAME_LEN {
        return invalid("it is longer than 255 bytes");
    }
    // nft 1.0.6 reads an unquoted identifier as a letter, `_` or `.` followed by letters,
    // digits and `/ - _ .`; anything else ends the word or starts a comment (`#`).
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'.') {
        return invalid("it must start with a letter, '_' or '.'");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.')) {
        return invalid("it may only hold letters, digits and '/', '-', '_', '.'");
    }
    if RESERVED_WORDS.binary_search(&name).is_ok() {
        return invalid("nft reads it as a keyword");
    }
    Ok(())
}

/// Whether nft 1.0.6 accepts `comment` on a table, chain, set, rule or element.
pub fn check_comment(comment: Option<&str>) -> Result<(), NftError> {
    let Some(comment) = comment else { return Ok(()) };
    let invalid = |reason| Err(NftError::InvalidComment { comment: comment.to_owned(), reason });
    if comment.len() > MAX_COMMENT_LEN {
        return invalid("it is longer than 128 bytes");
    }
    // A quote would end the string early; a newline would end the command.
    if comment.contains('"') {
        return invalid("it contains a double quote");
    }
    if comment.chars().any(char::is_control) {
        return invalid("it contains a control character");
    }
    Ok(())
}

/// Every check that needs no kernel state, for each operation in order.
pub(crate) fn check_transaction(transaction: &Transaction) -> Result<(), NftError> {
    check_name(ObjectKind::Table, &transaction.table.name)?;
    let family = transaction.table.family;
    transaction.operations.iter().try_for_each(|operation| check_operation(family, operation))
}

pub(crate) fn check_operation(family: Family, operation: &Operation) -> Result<(), NftError> {
    match operation {
        Operation::AddTable { comment } => check_comment(comment.as_deref()),
        Operation::DeleteTable => Ok(()),
        Operation::AddChain(chain) => check_chain(chain),
        Operation::FlushChain(name) | Operation::DeleteChain(name) => check_name(ObjectKind::Chain, name),
        Operation::AddRule(rule) => check_rule(family, rule),
        Operation::AddSet(set) => check_set(set),
        Operation::FlushSet(name) | Operation::DeleteSet(name) => check_name(ObjectKind::Set, name),
        Operation::AddElement(element) | Operation::DeleteElement(element) => check_element(element),
    }
}

fn check_chain(chain: &Chain) -> Result<(), NftError> {
    check_name(ObjectKind::Chain, &chain.name)?;
    check_comment(chain.comment.as_deref())?;
    if let Some(BaseChain { chain_type: ChainType::Nat, hook: Hook::Forward, .. }) = chain.base {
        // The kernel's nat chain type has no forward hook (EOPNOTSUPP).
        return Err(NftError::InvalidChain {
            chain: chain.name.clone(),
            reason: "nat chains cannot hook forward".to_owned(),
        });
    }
    Ok(())
}

fn check_set(set: &Set) -> Result<(), NftError> {
    check_name(ObjectKind::Set, &set.name)?;
    check_comment(set.comment.as_deref())?;
    let invalid = |reason: &str| Err(NftError::InvalidSet { set: set.name.clone(), reason: reason.to_owned() });
    if set.key.is_empty() {
        return invalid("the key has no type");
    }
    if set.key.contains(&DataType::Verdict) {
        return invalid("a verdict cannot be part of a key");
    }
    if let Some(value) = &set.value {
        if value.is_empty() {
            return invalid("the map value has no type");
        }
        if value.len() > 1 && value.contains(&DataType::Verdict) {
            return invalid("a verdict cannot be concatenated with other data");
        }
    }
    if set.interval && set.dynamic_timeout.is_some() {
        // The kernel has no set backend that is both (EOPNOTSUPP).
        return invalid("an interval set cannot be dynamic");
    }
    Ok(())
}

fn check_element(element: &Element) -> Result<(), NftError> {
    check_name(ObjectKind::Set, &element.set)?;
    check_comment(element.comment.as_deref())?;
    if element.key.is_empty() {
        return Err(NftError::InvalidElement { set: element.set.clone(), reason: "the key is empty".to_owned() });
    }
    if let Some(target) = element.value.as_ref().and_then(ElementValue::target) {
        check_name(ObjectKind::Chain, target)?;
    }
    Ok(())
}

/// Statements after which nft refuses anything else in the same rule.
fn is_terminal(statement: &Statement) -> bool {
    matches!(
        statement,
        Statement::Verdict(_) | Statement::Reject(_) | Statement::Dnat { .. } | Statement::Masquerade { .. }
    )
}

fn check_rule(family: Family, rule: &Rule) -> Result<(), NftError> {
    check_name(ObjectKind::Chain, &rule.chain)?;
    check_comment(rule.comment.as_deref())?;
    let invalid = |reason: String| Err(NftError::InvalidRule { chain: rule.chain.clone(), reason });
    if rule.statements.is_empty() {
        return invalid("a rule needs at least one statement".to_owned());
    }
    // The protocol a preceding `meta l4proto X` match pins, which port mappings need.
    let mut l4proto = None;
    let mut terminal = false;
    for statement in &rule.statements {
        if terminal {
            return invalid("nothing may follow a verdict, reject, dnat or masquerade".to_owned());
        }
        terminal = is_terminal(statement);
        match statement {
            Statement::Match(Match::Compare { left, op, right }) => {
                check_compare(family, *left, *right).or_else(invalid)?;
                if let (Expr::L4Proto, CmpOp::Eq, Value::Protocol(protocol)) = (left, op, right) {
                    l4proto = Some(*protocol);
                }
            }
            Statement::Match(Match::InPrefixes { left, prefixes, .. }) => {
                if !matches!(left, Expr::SourceAddress | Expr::DestinationAddress) {
                    return invalid(format!("{left:?} cannot be compared with prefixes"));
                }
                if prefixes.is_empty() {
                    return invalid("an empty prefix list matches nothing and nft cannot parse it".to_owned());
                }
                if let Some(prefix) = prefixes.iter().find(|prefix| !family.contains(prefix.addr())) {
                    return invalid(format!("prefix {prefix} is not of family {family}"));
                }
            }
            Statement::Match(Match::InSet { keys, set, .. })
            | Statement::VerdictMap { keys, map: set }
            | Statement::UpdateSet { keys, set } => {
                check_name(ObjectKind::Set, set)?;
                if keys.is_empty() {
                    return invalid(format!("the lookup in @{set} has no key"));
                }
            }
            Statement::Dnat { address, port } => {
                if !family.contains(*address) {
                    return invalid(format!("dnat to {address} in a table of family {family}"));
                }
                if port.is_some() && l4proto.is_none() {
                    return invalid("dnat to a port needs a `meta l4proto` match before it".to_owned());
                }
            }
            Statement::Reject(RejectKind::TcpReset) => {
                if l4proto.is_some_and(|protocol| protocol != 6) {
                    return invalid("a tcp reset cannot answer another protocol".to_owned());
                }
            }
            Statement::Verdict(Verdict::Jump(target) | Verdict::Goto(target)) => {
                check_name(ObjectKind::Chain, target)?;
            }
            Statement::Match(Match::MarkMasked { .. } | Match::FibLocal { .. } | Match::CtStateNew)
            | Statement::Counter
            | Statement::SetMarkBits(_)
            | Statement::ToggleMarkBits(_)
            | Statement::Masquerade { .. }
            | Statement::Reject(RejectKind::PortUnreachable)
            | Statement::Verdict(Verdict::Accept | Verdict::Drop | Verdict::Return) => {}
        }
    }
    Ok(())
}

fn check_compare(family: Family, left: Expr, right: Value) -> Result<(), String> {
    let fits = match (left, right) {
        (Expr::SourceAddress | Expr::DestinationAddress, Value::Address(address)) => family.contains(address),
        (Expr::SourceAddress | Expr::DestinationAddress, Value::Prefix(prefix)) => family.contains(prefix.addr()),
        (Expr::L4Proto, Value::Protocol(_)) => true,
        (Expr::DestinationPort | Expr::SourcePort, Value::Port(_)) => true,
        (Expr::Mark, Value::Integer(_)) => true,
        (Expr::RandomModulo(modulus), Value::Integer(value)) => {
            if modulus == 0 {
                return Err("numgen random mod 0 has no possible value".to_owned());
            }
            if value >= modulus {
                return Err(format!("numgen random mod {modulus} never equals {value}"));
            }
            true
        }
        _ => false,
    };
    if fits { Ok(()) } else { Err(format!("{left:?} cannot be compared with {right:?}")) }
}

/// The type an expression has as (part of) a set key in a table of `family`.
pub(crate) fn expr_type(family: Family, expr: Expr) -> Option<DataType> {
    match expr {
        Expr::SourceAddress | Expr::DestinationAddress => Some(family.address_type()),
        Expr::L4Proto => Some(DataType::InetProto),
        Expr::DestinationPort | Expr::SourcePort => Some(DataType::InetService),
        Expr::Mark | Expr::RandomModulo(_) => None,
    }
}

/// The value nft stores when `value` is one component of a key (or map value) of type
/// `data_type`, or why it cannot be. Text loses the difference between a port, a protocol
/// and an integer, so nft takes any number that fits the type (even as an IPv4 address); the
/// fake does the same and stores it as the set's type says.
pub(crate) fn coerce_value(value: Value, data_type: DataType, interval: bool) -> Result<Value, String> {
    let address_type = |address: IpAddr| if address.is_ipv4() { DataType::Ipv4Addr } else { DataType::Ipv6Addr };
    let number = match value {
        Value::Address(address) if address_type(address) == data_type => return Ok(normalize(value)),
        // Even a /32 is refused without the flag: nft checks the syntax, not the length.
        Value::Prefix(prefix) if address_type(prefix.addr()) == data_type => {
            return if interval {
                Ok(normalize(value))
            } else {
                Err(format!("prefix {prefix} needs a set with the interval flag"))
            };
        }
        Value::Protocol(protocol) => Some(u32::from(protocol)),
        Value::Port(port) => Some(u32::from(port)),
        Value::Integer(integer) => Some(integer),
        Value::Address(_) | Value::Prefix(_) => None,
    };
    let coerced = match (number, data_type) {
        // As `inet_aton` reads "80": 0.0.0.80.
        (Some(number), DataType::Ipv4Addr) => Some(Value::Address(IpAddr::from(number.to_be_bytes()))),
        (Some(number), DataType::InetProto) => u8::try_from(number).ok().map(Value::Protocol),
        (Some(number), DataType::InetService) => u16::try_from(number).ok().map(Value::Port),
        _ => None,
    };
    coerced.ok_or_else(|| format!("{value:?} is not of type {data_type:?}"))
}

fn is_host_prefix(prefix: IpNet) -> bool {
    prefix.prefix_len() == prefix.max_prefix_len()
}

/// The value nft stores for `value`: prefixes lose their host bits, and a full-length prefix
/// is a plain address. The fake keys elements by this so that `10.0.0.1/8` and `10.0.0.0/8`
/// are one element, as in the kernel.
pub(crate) fn normalize(value: Value) -> Value {
    match value {
        Value::Prefix(prefix) if is_host_prefix(prefix) => Value::Address(prefix.addr()),
        Value::Prefix(prefix) => Value::Prefix(prefix.trunc()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_words_are_sorted_for_binary_search() {
        assert!(RESERVED_WORDS.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn kube_proxy_style_chain_names_are_accepted() {
        for name in ["services", "nat-prerouting", "service-ULMVA6XW-ns1/svc1/tcp/p80", "svc-ABC-default/web/tcp/http"]
        {
            check_name(ObjectKind::Chain, name).unwrap();
        }
    }

    #[test]
    fn names_nft_cannot_parse_are_refused() {
        for name in ["", "1abc", "a b", "a#b", "a;b", "\"q\"", "counter", "ip", "a:b", &"x".repeat(256)] {
            assert!(check_name(ObjectKind::Chain, name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn comments_with_quotes_newlines_or_too_many_bytes_are_refused() {
        for comment in ["say \"hi\"", "two\nlines", &"é".repeat(65)] {
            assert!(check_comment(Some(comment)).is_err(), "{comment:?}");
        }
        check_comment(Some(&"é".repeat(64))).unwrap();
    }

    #[test]
    fn a_statement_after_a_verdict_is_refused() {
        let rule = Rule {
            chain: "c".into(),
            statements: vec![Statement::Verdict(Verdict::Accept), Statement::Counter],
            comment: None,
        };
        assert!(matches!(check_rule(Family::Ip, &rule), Err(NftError::InvalidRule { .. })));
    }

    #[test]
    fn dnat_to_a_port_needs_a_protocol_match_first() {
        let dnat = Statement::Dnat { address: "10.0.0.1".parse().unwrap(), port: Some(80) };
        let mut rule = Rule { chain: "c".into(), statements: vec![dnat.clone()], comment: None };
        assert!(check_rule(Family::Ip, &rule).is_err());
        rule.statements = vec![
            Statement::Match(Match::Compare { left: Expr::L4Proto, op: CmpOp::Eq, right: Value::Protocol(6) }),
            dnat,
        ];
        check_rule(Family::Ip, &rule).unwrap();
    }

    #[test]
    fn prefixes_lose_their_host_bits_and_full_prefixes_become_addresses() {
        let prefix = |text: &str| Value::Prefix(text.parse().unwrap());
        assert_eq!(normalize(prefix("10.0.0.1/8")), prefix("10.0.0.0/8"));
        assert_eq!(normalize(prefix("10.0.0.1/32")), Value::Address("10.0.0.1".parse().unwrap()));
    }
}
