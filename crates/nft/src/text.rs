//! Renders a [`Transaction`] as an `nft -f` script in the syntax nft 1.0.6 accepts.
//!
//! One operation per line, in order, and nothing else: line `n` of the script is operation
//! `n - 1`, which is how [`NftCli`](crate::NftCli) maps nft's error locations back to
//! operations. Rendering writes into one `String` and allocates little else, because a full
//! sync of a large cluster is a few hundred thousand lines.

use std::collections::HashMap;
use std::fmt::{self, Write};
use std::net::IpAddr;
use std::time::Duration;

use crate::error::NftError;
use crate::objects::{
    BaseChain, Chain, ChainType, CmpOp, DataType, Element, ElementValue, Expr, Family, FibAddress, Hook, Match,
    Operation, RejectKind, Rule, Set, Statement, TableName, Transaction, Value, Verdict,
};
use crate::validation;

/// Renders `transaction` as a script. A `FlushSet` of a set the transaction does not define
/// itself is written `flush set`; use [`render_with`] when such a name may be a map.
pub fn render(transaction: &Transaction) -> Result<String, NftError> {
    render_with(transaction, |_| false)
}

/// Renders `transaction`, asking `is_map` whether a set the transaction flushes without
/// defining it is a map: nft 1.0.6 only flushes a map as `flush map` and a set as `flush set`.
pub fn render_with(transaction: &Transaction, is_map: impl Fn(&str) -> bool) -> Result<String, NftError> {
    validation::check_transaction(transaction)?;
    let mut out = String::with_capacity(transaction.operations.len() * 96);
    let mut writer = ScriptWriter::new(&mut out, &transaction.table);
    // Sets defined or deleted by this transaction, so a flush later in it is spelled right.
    let mut defined_here: HashMap<&str, bool> = HashMap::new();
    for operation in &transaction.operations {
        match operation {
            Operation::AddSet(set) => {
                defined_here.insert(&set.name, set.is_map());
            }
            Operation::DeleteTable => defined_here.clear(),
            _ => {}
        }
        let flushes_map = match operation {
            Operation::FlushSet(name) => defined_here.get(name.as_str()).copied().unwrap_or_else(|| is_map(name)),
            _ => false,
        };
        writer.operation(operation, flushes_map).expect("writing to a String cannot fail");
    }
    Ok(out)
}

/// Writes commands for one table into a script. Shared by [`render_with`] and the fake's
/// dump, so that both speak exactly the same syntax.
pub(crate) struct ScriptWriter<'a> {
    out: &'a mut String,
    table: &'a TableName,
}

impl<'a> ScriptWriter<'a> {
    pub(crate) fn new(out: &'a mut String, table: &'a TableName) -> Self {
        ScriptWriter { out, table }
    }

    fn command(&mut self, verb: &str, object: &str) -> fmt::Result {
        write!(self.out, "{verb} {object} {} {}", self.table.family, self.table.name)
    }

    pub(crate) fn operation(&mut self, operation: &Operation, flushes_map: bool) -> fmt::Result {
        match operation {
            Operation::AddTable { comment } => self.add_table(comment.as_deref()),
            Operation::DeleteTable => {
                self.command("delete", "table")?;
                self.out.write_char('\n')
            }
            Operation::AddChain(chain) => self.add_chain(chain),
            Operation::FlushChain(name) => self.named("flush", "chain", name),
            Operation::DeleteChain(name) => self.named("delete", "chain", name),
            Operation::AddRule(rule) => self.add_rule(rule),
            Operation::AddSet(set) => self.add_set(set),
            Operation::FlushSet(name) => self.named("flush", if flushes_map { "map" } else { "set" }, name),
            // `delete set` removes maps too.
            Operation::DeleteSet(name) => self.named("delete", "set", name),
            Operation::AddElement(element) => self.element("add", element, true),
            Operation::DeleteElement(element) => self.element("delete", element, false),
        }
    }

    fn named(&mut self, verb: &str, object: &str, name: &str) -> fmt::Result {
        self.command(verb, object)?;
        writeln!(self.out, " {name}")
    }

    pub(crate) fn add_table(&mut self, comment: Option<&str>) -> fmt::Result {
        self.command("add", "table")?;
        if let Some(comment) = comment {
            write!(self.out, " {{ comment \"{comment}\" ; }}")?;
        }
        self.out.write_char('\n')
    }

    pub(crate) fn add_chain(&mut self, chain: &Chain) -> fmt::Result {
        self.command("add", "chain")?;
        write!(self.out, " {}", chain.name)?;
        if chain.base.is_some() || chain.comment.is_some() {
            self.out.write_str(" {")?;
            if let Some(BaseChain { chain_type, hook, priority }) = chain.base {
                let chain_type = match chain_type {
                    ChainType::Filter => "filter",
                    ChainType::Nat => "nat",
                };
                let hook = match hook {
                    Hook::Prerouting => "prerouting",
                    Hook::Input => "input",
                    Hook::Forward => "forward",
                    Hook::Output => "output",
                    Hook::Postrouting => "postrouting",
                };
                write!(self.out, " type {chain_type} hook {hook} priority {priority} ;")?;
            }
            if let Some(comment) = &chain.comment {
                write!(self.out, " comment \"{comment}\" ;")?;
            }
            self.out.write_str(" }")?;
        }
        self.out.write_char('\n')
    }

    pub(crate) fn add_set(&mut self, set: &Set) -> fmt::Result {
        self.command("add", if set.is_map() { "map" } else { "set" })?;
        write!(self.out, " {} {{ type ", set.name)?;
        write_types(self.out, &set.key)?;
        if let Some(value) = &set.value {
            self.out.write_str(" : ")?;
            write_types(self.out, value)?;
        }
        self.out.write_str(" ;")?;
        if set.interval {
            self.out.write_str(" flags interval ;")?;
        }
        if let Some(timeout) = set.dynamic_timeout {
            self.out.write_str(" flags dynamic,timeout ; timeout ")?;
            write_duration(self.out, timeout)?;
            self.out.write_str(" ;")?;
        }
        if let Some(comment) = &set.comment {
            write!(self.out, " comment \"{comment}\" ;")?;
        }
        self.out.write_str(" }\n")
    }

    pub(crate) fn add_element(&mut self, element: &Element) -> fmt::Result {
        self.element("add", element, true)
    }

    fn element(&mut self, verb: &str, element: &Element, with_value: bool) -> fmt::Result {
        self.command(verb, "element")?;
        write!(self.out, " {} {{ ", element.set)?;
        write_values(self.out, &element.key)?;
        if with_value {
            if let Some(comment) = &element.comment {
                write!(self.out, " comment \"{comment}\"")?;
            }
            match &element.value {
                Some(ElementValue::Verdict(verdict)) => {
                    self.out.write_str(" : ")?;
                    write_verdict(self.out, verdict)?;
                }
                Some(ElementValue::Data(values)) => {
                    self.out.write_str(" : ")?;
                    write_values(self.out, values)?;
                }
                None => {}
            }
        }
        self.out.write_str(" }\n")
    }

    pub(crate) fn add_rule(&mut self, rule: &Rule) -> fmt::Result {
        self.command("add", "rule")?;
        write!(self.out, " {}", rule.chain)?;
        for statement in &rule.statements {
            self.out.write_char(' ')?;
            write_statement(self.out, self.table.family, statement)?;
        }
        if let Some(comment) = &rule.comment {
            write!(self.out, " comment \"{comment}\"")?;
        }
        self.out.write_char('\n')
    }
}

fn write_types(out: &mut String, types: &[DataType]) -> fmt::Result {
    for (index, data_type) in types.iter().enumerate() {
        if index > 0 {
            out.write_str(" . ")?;
        }
        out.write_str(match data_type {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService => "inet_service",
            DataType::Verdict => "verdict",
        })?;
    }
    Ok(())
}

fn write_duration(out: &mut String, duration: Duration) -> fmt::Result {
    if duration.subsec_nanos() == 0 {
        write!(out, "{}s", duration.as_secs())
    } else {
        write!(out, "{}ms", duration.as_millis())
    }
}

/// An element key as nft writes it (`198.19.0.10 . tcp . 80`), to name elements in errors.
pub(crate) fn key_text(values: &[Value]) -> String {
    let mut out = String::new();
    write_values(&mut out, values).expect("writing to a String cannot fail");
    out
}

fn write_values(out: &mut String, values: &[Value]) -> fmt::Result {
    for (index, value) in values.iter().enumerate() {
        if index > 0 {
            out.write_str(" . ")?;
        }
        write_value(out, *value)?;
    }
    Ok(())
}

fn write_value(out: &mut String, value: Value) -> fmt::Result {
    match value {
        Value::Address(address) => write!(out, "{address}"),
        Value::Prefix(prefix) => write!(out, "{prefix}"),
        // nft expects inet_proto values by name where it has one.
        Value::Protocol(6) => out.write_str("tcp"),
        Value::Protocol(17) => out.write_str("udp"),
        Value::Protocol(132) => out.write_str("sctp"),
        Value::Protocol(number) => write!(out, "{number}"),
        Value::Port(port) => write!(out, "{port}"),
        Value::Integer(integer) => write!(out, "{integer}"),
    }
}

fn write_expr(out: &mut String, family: Family, expr: Expr) -> fmt::Result {
    match expr {
        Expr::SourceAddress => write!(out, "{family} saddr"),
        Expr::DestinationAddress => write!(out, "{family} daddr"),
        Expr::L4Proto => out.write_str("meta l4proto"),
        Expr::DestinationPort => out.write_str("th dport"),
        Expr::SourcePort => out.write_str("th sport"),
        Expr::Mark => out.write_str("meta mark"),
        Expr::RandomModulo(modulus) => write!(out, "numgen random mod {modulus}"),
    }
}

fn write_keys(out: &mut String, family: Family, keys: &[Expr]) -> fmt::Result {
    for (index, key) in keys.iter().enumerate() {
        if index > 0 {
            out.write_str(" . ")?;
        }
        write_expr(out, family, *key)?;
    }
    Ok(())
}

fn write_verdict(out: &mut String, verdict: &Verdict) -> fmt::Result {
    match verdict {
        Verdict::Accept => out.write_str("accept"),
        Verdict::Drop => out.write_str("drop"),
        Verdict::Return => out.write_str("return"),
        Verdict::Jump(chain) => write!(out, "jump {chain}"),
        Verdict::Goto(chain) => write!(out, "goto {chain}"),
    }
}

/// `!= ` for a negated match, nothing for equality (nft's implicit operator).
fn negation(negate: bool) -> &'static str {
    if negate { "!= " } else { "" }
}

fn write_statement(out: &mut String, family: Family, statement: &Statement) -> fmt::Result {
    match statement {
        Statement::Match(matched) => write_match(out, family, matched),
        Statement::Counter => out.write_str("counter"),
        Statement::SetMarkBits(bits) => write!(out, "meta mark set meta mark | {bits:#010x}"),
        Statement::ToggleMarkBits(bits) => write!(out, "meta mark set meta mark ^ {bits:#010x}"),
        Statement::Dnat { address, port } => {
            write!(out, "dnat {family} to ")?;
            match (address, port) {
                (IpAddr::V4(address), Some(port)) => write!(out, "{address}:{port}"),
                (IpAddr::V6(address), Some(port)) => write!(out, "[{address}]:{port}"),
                (address, None) => write!(out, "{address}"),
            }
        }
        Statement::Masquerade { fully_random } => {
            out.write_str(if *fully_random { "masquerade fully-random" } else { "masquerade" })
        }
        Statement::Reject(RejectKind::PortUnreachable) => out.write_str("reject"),
        Statement::Reject(RejectKind::TcpReset) => out.write_str("reject with tcp reset"),
        Statement::VerdictMap { keys, map } => {
            write_keys(out, family, keys)?;
            write!(out, " vmap @{map}")
        }
        Statement::UpdateSet { keys, set } => {
            write!(out, "update @{set} {{ ")?;
            write_keys(out, family, keys)?;
            out.write_str(" }")
        }
        Statement::Verdict(verdict) => write_verdict(out, verdict),
    }
}

fn write_match(out: &mut String, family: Family, matched: &Match) -> fmt::Result {
    match matched {
        Match::Compare { left, op, right } => {
            write_expr(out, family, *left)?;
            out.write_char(' ')?;
            out.write_str(negation(*op == CmpOp::Ne))?;
            match (left, right) {
                (Expr::Mark, Value::Integer(mark)) => write!(out, "{mark:#010x}"),
                _ => write_value(out, *right),
            }
        }
        Match::InPrefixes { left, negate, prefixes } => {
            write_expr(out, family, *left)?;
            out.write_char(' ')?;
            out.write_str(negation(*negate))?;
            if let [prefix] = prefixes.as_slice() {
                write!(out, "{prefix}")
            } else {
                out.write_str("{ ")?;
                for (index, prefix) in prefixes.iter().enumerate() {
                    if index > 0 {
                        out.write_str(", ")?;
                    }
                    write!(out, "{prefix}")?;
                }
                out.write_str(" }")
            }
        }
        Match::InSet { keys, negate, set } => {
            write_keys(out, family, keys)?;
            write!(out, " {}@{set}", negation(*negate))
        }
        Match::MarkMasked { mask, op, value } => {
            let op = if *op == CmpOp::Eq { "==" } else { "!=" };
            write!(out, "meta mark & {mask:#010x} {op} {value:#010x}")
        }
        Match::FibLocal { address, negate } => {
            let address = match address {
                FibAddress::Source => "saddr",
                FibAddress::Destination => "daddr",
            };
            write!(out, "fib {address} type {}local", negation(*negate))
        }
        Match::CtStateNew => out.write_str("ct state new"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TableName {
        TableName::new(Family::Ip, "svcplane")
    }

    fn rendered(operations: Vec<Operation>) -> String {
        render(&Transaction { table: table(), operations }).unwrap()
    }

    fn rule(statements: Vec<Statement>) -> Operation {
        Operation::AddRule(Rule { chain: "services".into(), statements, comment: None })
    }

    fn compare(left: Expr, op: CmpOp, right: Value) -> Statement {
        Statement::Match(Match::Compare { left, op, right })
    }

    #[test]
    fn a_table_with_a_comment_renders_its_comment_in_braces() {
        let script = rendered(vec![Operation::AddTable { comment: Some("svcplane rules".into()) }]);
        assert_eq!(script, "add table ip svcplane { comment \"svcplane rules\" ; }\n");
    }

    #[test]
    fn a_base_chain_renders_type_hook_and_numeric_priority() {
        let chain = Chain {
            name: "nat-prerouting".into(),
            base: Some(BaseChain { chain_type: ChainType::Nat, hook: Hook::Prerouting, priority: -100 }),
            comment: None,
        };
        let script = rendered(vec![Operation::AddChain(chain)]);
        assert_eq!(script, "add chain ip svcplane nat-prerouting { type nat hook prerouting priority -100 ; }\n");
    }

    #[test]
    fn a_regular_chain_without_comment_has_no_braces() {
        let chain = Chain { name: "svc-ABC-default/web/tcp/http".into(), base: None, comment: None };
        assert_eq!(rendered(vec![Operation::AddChain(chain)]), "add chain ip svcplane svc-ABC-default/web/tcp/http\n");
    }

    #[test]
    fn a_verdict_map_and_its_elements_render_with_protocol_names() {
        let map = Set {
            name: "service-ips".into(),
            key: vec![DataType::Ipv4Addr, DataType::InetProto, DataType::InetService],
            value: Some(vec![DataType::Verdict]),
            interval: false,
            dynamic_timeout: None,
            comment: None,
        };
        let element = Element {
            set: "service-ips".into(),
            key: vec![Value::Address("198.19.0.10".parse().unwrap()), Value::Protocol(6), Value::Port(80)],
            value: Some(ElementValue::Verdict(Verdict::Goto("svc-x".into()))),
            comment: None,
        };
        let lookup = Statement::VerdictMap {
            keys: vec![Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort],
            map: "service-ips".into(),
        };
        let script = rendered(vec![
            Operation::AddSet(map),
            Operation::AddElement(element.clone()),
            rule(vec![lookup]),
            Operation::DeleteElement(element),
        ]);
        assert_eq!(
            script,
            "add map ip svcplane service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
             add element ip svcplane service-ips { 198.19.0.10 . tcp . 80 : goto svc-x }\n\
             add rule ip svcplane services ip daddr . meta l4proto . th dport vmap @service-ips\n\
             delete element ip svcplane service-ips { 198.19.0.10 . tcp . 80 }\n"
        );
    }

    #[test]
    fn a_dynamic_set_renders_its_flags_and_timeout_in_seconds() {
        let set = Set {
            name: "affinity".into(),
            key: vec![DataType::Ipv4Addr],
            value: None,
            interval: false,
            dynamic_timeout: Some(Duration::from_secs(10800)),
            comment: None,
        };
        assert_eq!(
            rendered(vec![Operation::AddSet(set)]),
            "add set ip svcplane affinity { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n"
        );
    }

    #[test]
    fn every_match_and_statement_renders_in_nft_syntax() {
        let prefix = |text: &str| text.parse::<ipnet::IpNet>().unwrap();
        let cases: Vec<(Statement, &str)> = vec![
            (
                Statement::Match(Match::InPrefixes {
                    left: Expr::SourceAddress,
                    negate: true,
                    prefixes: vec![prefix("198.18.128.0/17")],
                }),
                "ip saddr != 198.18.128.0/17",
            ),
            (
                Statement::Match(Match::InPrefixes {
                    left: Expr::SourceAddress,
                    negate: true,
                    prefixes: vec![prefix("10.0.0.0/8"), prefix("192.168.0.0/16")],
                }),
                "ip saddr != { 10.0.0.0/8, 192.168.0.0/16 }",
            ),
            (compare(Expr::L4Proto, CmpOp::Eq, Value::Protocol(6)), "meta l4proto tcp"),
            (compare(Expr::L4Proto, CmpOp::Ne, Value::Protocol(1)), "meta l4proto != 1"),
            (compare(Expr::DestinationPort, CmpOp::Eq, Value::Port(80)), "th dport 80"),
            (compare(Expr::RandomModulo(3), CmpOp::Eq, Value::Integer(0)), "numgen random mod 3 0"),
            (compare(Expr::Mark, CmpOp::Ne, Value::Integer(0x4000)), "meta mark != 0x00004000"),
            (
                Statement::Match(Match::MarkMasked { mask: 0x4000, op: CmpOp::Ne, value: 0 }),
                "meta mark & 0x00004000 != 0x00000000",
            ),
            (Statement::SetMarkBits(0x4000), "meta mark set meta mark | 0x00004000"),
            (Statement::ToggleMarkBits(0x4000), "meta mark set meta mark ^ 0x00004000"),
            (
                Statement::Match(Match::FibLocal { address: FibAddress::Destination, negate: false }),
                "fib daddr type local",
            ),
            (
                Statement::Match(Match::FibLocal { address: FibAddress::Source, negate: true }),
                "fib saddr type != local",
            ),
            (Statement::Match(Match::CtStateNew), "ct state new"),
            (
                Statement::Match(Match::InSet {
                    keys: vec![Expr::SourceAddress, Expr::DestinationPort],
                    negate: true,
                    set: "allowed".into(),
                }),
                "ip saddr . th dport != @allowed",
            ),
            (Statement::Dnat { address: "1.2.3.4".parse().unwrap(), port: None }, "dnat ip to 1.2.3.4"),
            (Statement::Masquerade { fully_random: true }, "masquerade fully-random"),
            (Statement::Reject(RejectKind::PortUnreachable), "reject"),
            (Statement::Reject(RejectKind::TcpReset), "reject with tcp reset"),
            (
                Statement::UpdateSet { keys: vec![Expr::SourceAddress], set: "affinity".into() },
                "update @affinity { ip saddr }",
            ),
            (Statement::Counter, "counter"),
            (Statement::Verdict(Verdict::Jump("svc-x".into())), "jump svc-x"),
            (Statement::Verdict(Verdict::Return), "return"),
        ];
        for (statement, expected) in cases {
            assert_eq!(rendered(vec![rule(vec![statement])]), format!("add rule ip svcplane services {expected}\n"));
        }
    }

    #[test]
    fn dnat_to_a_port_renders_brackets_for_ipv6() {
        let tcp = compare(Expr::L4Proto, CmpOp::Eq, Value::Protocol(6));
        let dnat = Statement::Dnat { address: "2001:db8::1".parse().unwrap(), port: Some(80) };
        let transaction =
            Transaction { table: TableName::new(Family::Ip6, "svcplane"), operations: vec![rule(vec![tcp, dnat])] };
        assert_eq!(
            render(&transaction).unwrap(),
            "add rule ip6 svcplane services meta l4proto tcp dnat ip6 to [2001:db8::1]:80\n"
        );
    }

    #[test]
    fn a_flush_of_a_map_is_spelled_flush_map() {
        let map = Set {
            name: "m".into(),
            key: vec![DataType::Ipv4Addr],
            value: Some(vec![DataType::Verdict]),
            interval: false,
            dynamic_timeout: None,
            comment: None,
        };
        let defined_here =
            Transaction { table: table(), operations: vec![Operation::AddSet(map), Operation::FlushSet("m".into())] };
        assert!(render(&defined_here).unwrap().ends_with("flush map ip svcplane m\n"));
        let defined_before = Transaction { table: table(), operations: vec![Operation::FlushSet("m".into())] };
        assert_eq!(render_with(&defined_before, |name| name == "m").unwrap(), "flush map ip svcplane m\n");
        assert_eq!(render(&defined_before).unwrap(), "flush set ip svcplane m\n");
    }

    #[test]
    fn a_name_that_would_change_the_script_is_refused_before_rendering() {
        let chain = Chain { name: "x; flush ruleset".into(), base: None, comment: None };
        let transaction = Transaction { table: table(), operations: vec![Operation::AddChain(chain)] };
        assert!(matches!(render(&transaction), Err(NftError::InvalidName { .. })));
    }

    #[test]
    fn each_operation_is_exactly_one_line() {
        let operations = vec![
            Operation::AddTable { comment: None },
            Operation::AddChain(Chain { name: "c".into(), base: None, comment: Some("a chain".into()) }),
            Operation::FlushChain("c".into()),
            Operation::DeleteChain("c".into()),
            Operation::FlushSet("s".into()),
            Operation::DeleteSet("s".into()),
            Operation::DeleteTable,
        ];
        let count = operations.len();
        let script = rendered(operations);
        assert_eq!(script.lines().count(), count);
        assert_eq!(
            script,
            "add table ip svcplane\n\
             add chain ip svcplane c { comment \"a chain\" ; }\n\
             flush chain ip svcplane c\n\
             delete chain ip svcplane c\n\
             flush set ip svcplane s\n\
             delete set ip svcplane s\n\
             delete table ip svcplane\n"
        );
    }
}
