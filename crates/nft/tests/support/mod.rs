//! What the real-kernel tests of both mechanisms share: a throwaway network namespace, short
//! builders for operations, and the transactions that use every operation, statement, match
//! and data type (the CLI's test applies them through `nft -f`, the netlink test through
//! both mechanisms and compares the listings).

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use ipnet::IpNet;
use svcplane_nft::{
    BaseChain, Chain, ChainType, CmpOp, DataType, Element, ElementValue, ErrorKind, Expr, Family, FibAddress, Hook,
    Match, NftCli, NftNetlink, Operation, RejectKind, Rule, Set, Statement, TableName, Transaction, Value, Verdict,
};

/// A network namespace that exists for one test and is removed when it ends, even by panic:
/// `svcp-<test binary>-<test>-<pid>`.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new(test: &str) -> NetNs {
        let name = format!("svcp-{}-{test}-{}", env!("CARGO_CRATE_NAME"), std::process::id());
        // A namespace of this name can only be left over from a crashed run of this test.
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        let output = Command::new("ip").args(["netns", "add", &name]).output().expect("run ip netns add");
        assert!(
            output.status.success(),
            "cannot create network namespace {name} (these tests need root): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        NetNs { name }
    }

    pub fn cli(&self) -> NftCli {
        NftCli::in_network_namespace(&self.name)
    }

    pub fn netlink(&self) -> NftNetlink {
        NftNetlink::in_network_namespace(&self.name).expect("open a netlink socket in the test namespace")
    }

    /// `nft list table`, or a marker when there is no such table.
    pub fn list(&self, table: &TableName) -> String {
        match self.cli().list_table(table) {
            Ok(listing) => listing,
            Err(error) if error.is_not_found() => "(no table)".to_owned(),
            Err(error) => panic!("listing {table} in {}: {error}", self.name),
        }
    }

    /// `nft --debug=netlink list table`: every rule's expressions and every element's bytes,
    /// as the kernel holds them.
    pub fn list_raw(&self, table: &TableName) -> String {
        let output = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "--debug=netlink", "list", "table"])
            .arg(table.family.keyword())
            .arg(&table.name)
            .output()
            .expect("run nft");
        if !output.status.success() {
            return "(no table)".to_owned();
        }
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Feeds a script to nft in this namespace directly, bypassing this crate's checks.
    pub fn accepts_script(&self, script: &str) -> bool {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nft");
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        child.wait().unwrap().success()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

pub fn ip_table() -> TableName {
    TableName::new(Family::Ip, "svcplane")
}

pub fn ip6_table() -> TableName {
    TableName::new(Family::Ip6, "svcplane")
}

pub fn chain(name: &str) -> Operation {
    Operation::AddChain(Chain { name: name.into(), base: None, comment: None })
}

pub fn base_chain(name: &str, chain_type: ChainType, hook: Hook, priority: i32) -> Operation {
    Operation::AddChain(Chain {
        name: name.into(),
        base: Some(BaseChain { chain_type, hook, priority }),
        comment: None,
    })
}

pub fn rule(chain: &str, statements: Vec<Statement>) -> Operation {
    Operation::AddRule(Rule { chain: chain.into(), statements, comment: None })
}

pub fn compare(left: Expr, op: CmpOp, right: Value) -> Statement {
    Statement::Match(Match::Compare { left, op, right })
}

pub fn tcp() -> Statement {
    compare(Expr::L4Proto, CmpOp::Eq, Value::Protocol(6))
}

pub fn jump(target: &str) -> Statement {
    Statement::Verdict(Verdict::Jump(target.into()))
}

pub fn goto(target: &str) -> Statement {
    Statement::Verdict(Verdict::Goto(target.into()))
}

pub fn goto_value(target: &str) -> ElementValue {
    ElementValue::Verdict(Verdict::Goto(target.into()))
}

pub fn address(text: &str) -> Value {
    Value::Address(text.parse().unwrap())
}

pub fn prefix(text: &str) -> IpNet {
    text.parse().unwrap()
}

pub fn set(name: &str, key: Vec<DataType>, value: Option<Vec<DataType>>) -> Set {
    Set { name: name.into(), key, value, interval: false, dynamic_timeout: None, comment: None }
}

pub fn element(set: &str, key: Vec<Value>, value: Option<ElementValue>) -> Operation {
    Operation::AddElement(Element { set: set.into(), key, value, comment: None })
}

pub fn delete_element(set: &str, key: Vec<Value>) -> Operation {
    Operation::DeleteElement(Element { set: set.into(), key, value: None, comment: None })
}

pub fn service_key(ip: &str, protocol: u8, port: u16) -> Vec<Value> {
    vec![address(ip), Value::Protocol(protocol), Value::Port(port)]
}

pub fn service_keys() -> Vec<Expr> {
    vec![Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort]
}

pub fn in_prefixes(left: Expr, negate: bool, prefixes: &[&str]) -> Statement {
    Statement::Match(Match::InPrefixes { left, negate, prefixes: prefixes.iter().map(|text| prefix(text)).collect() })
}

pub fn in_set(keys: Vec<Expr>, negate: bool, set: &str) -> Statement {
    Statement::Match(Match::InSet { keys, negate, set: set.into() })
}

/// An IPv4 table with every operation that adds, every statement, every match and every
/// data type that fits an IPv4 table (those of the CLI's real-kernel test, and more).
pub fn every_addition_ipv4() -> Transaction {
    let ipv4 = DataType::Ipv4Addr;
    let service_ips =
        set("service-ips", vec![ipv4, DataType::InetProto, DataType::InetService], Some(vec![DataType::Verdict]));
    let no_endpoints = Set {
        comment: Some("services without endpoints".into()),
        ..set("no-endpoint-services", vec![ipv4, DataType::InetProto, DataType::InetService], None)
    };
    let node_ips = Set { interval: true, ..set("node-ips", vec![ipv4], None) };
    let affinity = Set {
        dynamic_timeout: Some(Duration::from_secs(10800)),
        ..set("affinity-svc-ABC-default/web/tcp/http", vec![ipv4], None)
    };
    let pair_affinity = Set {
        dynamic_timeout: Some(Duration::from_secs(60)),
        ..set("affinity-pairs", vec![ipv4, DataType::InetService], None)
    };
    let dnat_map = set("dnat-targets", vec![ipv4, DataType::InetService], Some(vec![ipv4, DataType::InetService]));
    let service = "svc-ABC-default/web/tcp/http";
    let mut operations = vec![
        Operation::AddTable { comment: Some("rules for Kubernetes Services".into()) },
        base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        base_chain("nat-output", ChainType::Nat, Hook::Output, -100),
        base_chain("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
        base_chain("filter-input", ChainType::Filter, Hook::Input, 0),
        base_chain("filter-forward", ChainType::Filter, Hook::Forward, 0),
        base_chain("filter-output", ChainType::Filter, Hook::Output, -5),
        base_chain("filter-prerouting", ChainType::Filter, Hook::Prerouting, -110),
        chain("services"),
        chain("masquerading"),
        chain("mark-for-masquerade"),
        chain("reject-chain"),
        Operation::AddChain(Chain { name: service.into(), base: None, comment: Some("default/web:http".into()) }),
        chain("endpoint-1"),
        chain("endpoint-2"),
        Operation::AddSet(service_ips),
        Operation::AddSet(no_endpoints),
        Operation::AddSet(node_ips),
        Operation::AddSet(affinity),
        Operation::AddSet(pair_affinity),
        Operation::AddSet(dnat_map),
        Operation::AddSet(Set { interval: true, ..set("everywhere", vec![ipv4], None) }),
        Operation::AddSet(Set { interval: true, ..set("high", vec![ipv4], None) }),
        Operation::AddSet(Set { interval: true, ..set("ranges", vec![ipv4, DataType::InetService], None) }),
        Operation::AddSet(set("ports", vec![DataType::InetService], None)),
        Operation::AddSet(set("protocols", vec![DataType::InetProto], Some(vec![DataType::Verdict]))),
        Operation::AddSet(set("pairs", vec![ipv4, ipv4], None)),
        Operation::AddSet(Set { interval: true, ..set("port-ranges", vec![DataType::InetService], None) }),
        Operation::AddSet(Set { interval: true, ..set("from-zero", vec![ipv4], None) }),
        Operation::AddSet(Set { interval: true, ..set("empty", vec![ipv4], None) }),
        Operation::AddSet(set("single-map", vec![ipv4], Some(vec![ipv4]))),
        Operation::AddSet(Set {
            interval: true,
            ..set("port-protocols", vec![DataType::InetService], Some(vec![DataType::InetProto]))
        }),
        Operation::AddSet(Set { interval: true, ..set("prefix-vmap", vec![ipv4], Some(vec![DataType::Verdict])) }),
        element("single-map", vec![address("1.2.3.4")], Some(ElementValue::Data(vec![address("5.6.7.8")]))),
        element("port-protocols", vec![Value::Port(80)], Some(ElementValue::Data(vec![Value::Protocol(6)]))),
        element("prefix-vmap", vec![Value::Prefix(prefix("10.0.0.0/8"))], Some(goto_value("endpoint-2"))),
        element("prefix-vmap", vec![Value::Prefix(prefix("11.0.0.0/8"))], Some(ElementValue::Verdict(Verdict::Accept))),
        element("from-zero", vec![Value::Prefix(prefix("0.0.0.0/8"))], None),
        element("from-zero", vec![Value::Prefix(prefix("20.0.0.0/8"))], None),
        element("service-ips", service_key("198.19.0.10", 6, 80), Some(goto_value(service))),
        element(
            "service-ips",
            service_key("198.19.0.10", 17, 53),
            Some(ElementValue::Verdict(Verdict::Jump(service.into()))),
        ),
        element("service-ips", service_key("198.19.0.11", 132, 9), Some(ElementValue::Verdict(Verdict::Drop))),
        element("service-ips", service_key("198.19.0.12", 6, 443), Some(ElementValue::Verdict(Verdict::Accept))),
        element("service-ips", service_key("198.19.0.13", 6, 8443), Some(ElementValue::Verdict(Verdict::Return))),
        Operation::AddElement(Element {
            set: "no-endpoint-services".into(),
            key: service_key("198.19.0.20", 6, 80),
            value: None,
            comment: Some("default/empty:http".into()),
        }),
        element("node-ips", vec![Value::Prefix(prefix("192.0.2.0/24"))], None),
        element("node-ips", vec![address("198.51.100.7")], None),
        Operation::AddElement(Element {
            set: "node-ips".into(),
            key: vec![Value::Prefix(prefix("203.0.113.0/25"))],
            value: None,
            comment: Some("a node".into()),
        }),
        element("everywhere", vec![Value::Prefix(prefix("0.0.0.0/0"))], None),
        element("high", vec![Value::Prefix(prefix("255.0.0.0/8"))], None),
        element("high", vec![Value::Prefix(prefix("10.0.0.0/9"))], None),
        element("ranges", vec![Value::Prefix(prefix("10.0.0.0/8")), Value::Port(80)], None),
        Operation::AddElement(Element {
            set: "ranges".into(),
            key: vec![address("1.2.3.4"), Value::Port(443)],
            value: None,
            comment: Some("x".into()),
        }),
        element("ports", vec![Value::Port(53)], None),
        element("protocols", vec![Value::Protocol(17)], Some(goto_value("endpoint-2"))),
        element("pairs", vec![address("10.1.0.5"), address("10.1.0.5")], None),
        element("port-ranges", vec![Value::Port(8080)], None),
        element(
            "dnat-targets",
            vec![address("198.19.0.30"), Value::Port(80)],
            Some(ElementValue::Data(vec![address("10.1.0.9"), Value::Port(8080)])),
        ),
        rule("nat-prerouting", vec![jump("services")]),
        rule("nat-output", vec![jump("services")]),
        rule("services", vec![Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() }]),
        rule("services", vec![Statement::VerdictMap { keys: vec![Expr::L4Proto], map: "protocols".into() }]),
        rule("services", vec![Statement::VerdictMap { keys: vec![Expr::SourceAddress], map: "prefix-vmap".into() }]),
        rule(
            "services",
            vec![
                Statement::Match(Match::FibLocal { address: FibAddress::Destination, negate: false }),
                in_set(vec![Expr::DestinationAddress], false, "node-ips"),
                Statement::Counter,
                Statement::Verdict(Verdict::Return),
            ],
        ),
        rule(service, vec![in_prefixes(Expr::SourceAddress, true, &["198.18.128.0/17"]), jump("mark-for-masquerade")]),
        rule(
            service,
            vec![in_set(vec![Expr::SourceAddress], false, "affinity-svc-ABC-default/web/tcp/http"), goto("endpoint-1")],
        ),
        rule(service, vec![compare(Expr::RandomModulo(2), CmpOp::Eq, Value::Integer(0)), goto("endpoint-1")]),
        rule(service, vec![compare(Expr::RandomModulo(3), CmpOp::Ne, Value::Integer(2)), goto("endpoint-2")]),
        rule(service, vec![Statement::Verdict(Verdict::Drop)]),
        rule(
            "endpoint-1",
            vec![compare(Expr::SourceAddress, CmpOp::Eq, address("10.1.0.5")), jump("mark-for-masquerade")],
        ),
        rule(
            "endpoint-1",
            vec![Statement::UpdateSet {
                keys: vec![Expr::SourceAddress],
                set: "affinity-svc-ABC-default/web/tcp/http".into(),
            }],
        ),
        rule(
            "endpoint-1",
            vec![Statement::UpdateSet {
                keys: vec![Expr::SourceAddress, Expr::DestinationPort],
                set: "affinity-pairs".into(),
            }],
        ),
        Operation::AddRule(Rule {
            chain: "endpoint-1".into(),
            statements: vec![tcp(), Statement::Dnat { address: "10.1.0.5".parse().unwrap(), port: Some(8080) }],
            comment: Some("default/web-1234:http".into()),
        }),
        rule("endpoint-2", vec![Statement::Dnat { address: "10.1.0.6".parse().unwrap(), port: None }]),
        rule("mark-for-masquerade", vec![Statement::SetMarkBits(0x4000)]),
        rule("nat-postrouting", vec![jump("masquerading")]),
    ];
    operations.extend(masquerading_rules("pairs"));
    operations.extend([
        rule(
            "masquerading",
            vec![
                Statement::Match(Match::MarkMasked { mask: 0x4000, op: CmpOp::Ne, value: 0 }),
                Statement::Masquerade { fully_random: false },
            ],
        ),
        rule(
            "filter-input",
            vec![
                Statement::Match(Match::CtStateNew),
                in_set(service_keys(), false, "no-endpoint-services"),
                jump("reject-chain"),
            ],
        ),
        rule(
            "filter-input",
            vec![
                in_set(vec![Expr::DestinationAddress, Expr::DestinationPort], true, "ranges"),
                in_set(vec![Expr::DestinationPort], false, "ports"),
                in_set(vec![Expr::DestinationPort], false, "port-ranges"),
                Statement::Counter,
            ],
        ),
        rule(
            "filter-forward",
            vec![
                in_prefixes(Expr::SourceAddress, true, &["10.0.0.0/8", "192.168.0.0/16"]),
                in_set(vec![Expr::DestinationAddress], true, "node-ips"),
                Statement::Counter,
                Statement::Verdict(Verdict::Accept),
            ],
        ),
        rule(
            "filter-forward",
            vec![
                // Touching and overlapping prefixes merge; the last runs to the end of the space.
                in_prefixes(
                    Expr::DestinationAddress,
                    false,
                    &["10.0.0.0/9", "10.128.0.0/9", "10.0.0.0/16", "255.255.255.255/32", "172.16.0.1/12"],
                ),
                in_prefixes(Expr::SourceAddress, false, &["0.0.0.0/1", "128.0.0.0/1"]),
                Statement::Verdict(Verdict::Drop),
            ],
        ),
        rule(
            "filter-output",
            vec![
                compare(Expr::L4Proto, CmpOp::Eq, Value::Protocol(17)),
                compare(Expr::SourcePort, CmpOp::Eq, Value::Port(53)),
                compare(Expr::DestinationPort, CmpOp::Ne, Value::Port(5353)),
                compare(Expr::Mark, CmpOp::Ne, Value::Integer(0x10)),
                compare(Expr::DestinationAddress, CmpOp::Eq, Value::Prefix(prefix("10.0.0.0/8"))),
                compare(Expr::SourceAddress, CmpOp::Ne, address("10.1.2.3")),
                compare(Expr::L4Proto, CmpOp::Ne, Value::Protocol(1)),
                Statement::Counter,
            ],
        ),
        rule(
            "filter-output",
            vec![
                compare(Expr::DestinationAddress, CmpOp::Ne, Value::Prefix(prefix("10.1.2.3/32"))),
                compare(Expr::SourceAddress, CmpOp::Eq, Value::Prefix(prefix("10.1.2.128/25"))),
                compare(Expr::SourceAddress, CmpOp::Ne, Value::Prefix(prefix("0.0.0.0/0"))),
                in_prefixes(Expr::DestinationAddress, false, &["172.16.0.0/12"]),
                compare(Expr::Mark, CmpOp::Eq, Value::Integer(0xdead_beef)),
                Statement::Counter,
            ],
        ),
        rule(
            "filter-prerouting",
            vec![Statement::Match(Match::FibLocal { address: FibAddress::Source, negate: true }), Statement::Counter],
        ),
        rule("filter-prerouting", vec![compare(Expr::DestinationPort, CmpOp::Eq, Value::Port(80)), Statement::Counter]),
        rule("reject-chain", vec![tcp(), Statement::Reject(RejectKind::TcpReset)]),
        // nft adds the tcp match itself.
        rule("reject-chain", vec![Statement::Counter, Statement::Reject(RejectKind::TcpReset)]),
        rule("reject-chain", vec![Statement::Reject(RejectKind::PortUnreachable)]),
        // Endpoint rules as the backend writes them with session affinity.
        rule(
            "endpoint-2",
            vec![
                in_set(vec![Expr::SourceAddress], false, "affinity-svc-ABC-default/web/tcp/http"),
                tcp(),
                Statement::Dnat { address: "10.1.0.5".parse().unwrap(), port: Some(8080) },
            ],
        ),
        rule(
            "endpoint-2",
            vec![
                compare(Expr::RandomModulo(2), CmpOp::Eq, Value::Integer(0)),
                tcp(),
                Statement::UpdateSet {
                    keys: vec![Expr::SourceAddress],
                    set: "affinity-svc-ABC-default/web/tcp/http".into(),
                },
                Statement::Dnat { address: "10.1.0.5".parse().unwrap(), port: Some(8080) },
            ],
        ),
    ]);
    Transaction { table: ip_table(), operations }
}

/// The IPv6 counterpart, for what encodes differently in an ip6 table.
pub fn every_addition_ipv6() -> Transaction {
    let ipv6 = DataType::Ipv6Addr;
    let operations = vec![
        Operation::AddTable { comment: None },
        base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        base_chain("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
        base_chain("filter-input", ChainType::Filter, Hook::Input, 0),
        chain("services"),
        chain("endpoint-1"),
        Operation::AddSet(set(
            "service-ips",
            vec![ipv6, DataType::InetProto, DataType::InetService],
            Some(vec![DataType::Verdict]),
        )),
        Operation::AddSet(Set { interval: true, ..set("node-ips", vec![ipv6], None) }),
        Operation::AddSet(set("hairpin", vec![ipv6, ipv6], None)),
        Operation::AddSet(Set {
            dynamic_timeout: Some(Duration::from_secs(10800)),
            ..set("affinity", vec![ipv6], None)
        }),
        Operation::AddSet(set(
            "dnat-targets",
            vec![ipv6, DataType::InetService],
            Some(vec![ipv6, DataType::InetService]),
        )),
        Operation::AddSet(Set { interval: true, ..set("ranges", vec![ipv6, DataType::InetService], None) }),
        element("service-ips", service_key("2001:db8::10", 6, 80), Some(goto_value("endpoint-1"))),
        element("service-ips", service_key("::ffff:198.19.0.1", 17, 53), Some(ElementValue::Verdict(Verdict::Drop))),
        element("node-ips", vec![Value::Prefix(prefix("2001:db8:1::/48"))], None),
        element("node-ips", vec![address("fd00::7")], None),
        element("node-ips", vec![Value::Prefix(prefix("ff00::/8"))], None),
        element("hairpin", vec![address("2001:db8::1"), address("2001:db8::1")], None),
        element(
            "dnat-targets",
            vec![address("2001:db8::10"), Value::Port(80)],
            Some(ElementValue::Data(vec![address("2001:db8::1"), Value::Port(8080)])),
        ),
        element("ranges", vec![Value::Prefix(prefix("2001:db8::/64")), Value::Port(443)], None),
        rule("nat-prerouting", vec![jump("services")]),
        rule(
            "services",
            vec![
                in_prefixes(Expr::SourceAddress, true, &["2001:db8::/32", "fd00::/8"]),
                Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() },
            ],
        ),
        rule(
            "services",
            vec![
                in_set(vec![Expr::SourceAddress, Expr::DestinationAddress], false, "hairpin"),
                in_set(vec![Expr::DestinationAddress, Expr::DestinationPort], false, "ranges"),
                Statement::Match(Match::FibLocal { address: FibAddress::Destination, negate: false }),
                in_set(vec![Expr::DestinationAddress], false, "node-ips"),
                Statement::SetMarkBits(0x4000),
            ],
        ),
        rule(
            "endpoint-1",
            vec![
                compare(Expr::RandomModulo(2), CmpOp::Eq, Value::Integer(0)),
                Statement::UpdateSet { keys: vec![Expr::SourceAddress], set: "affinity".into() },
                tcp(),
                Statement::Dnat { address: "2001:db8::1".parse().unwrap(), port: Some(8080) },
            ],
        ),
        rule("endpoint-1", vec![Statement::Dnat { address: "2001:db8::2".parse().unwrap(), port: None }]),
        rule(
            "nat-postrouting",
            vec![
                Statement::Match(Match::MarkMasked { mask: 0x4000, op: CmpOp::Ne, value: 0 }),
                Statement::ToggleMarkBits(0x4000),
                Statement::Masquerade { fully_random: true },
            ],
        ),
        rule(
            "filter-input",
            vec![
                compare(Expr::DestinationAddress, CmpOp::Eq, address("2001:db8::10")),
                compare(Expr::DestinationAddress, CmpOp::Eq, Value::Prefix(prefix("2001:db8::/64"))),
                compare(Expr::SourceAddress, CmpOp::Ne, Value::Prefix(prefix("2001:db8::/33"))),
                compare(Expr::SourceAddress, CmpOp::Eq, Value::Prefix(prefix("::/0"))),
                Statement::Match(Match::CtStateNew),
                Statement::Reject(RejectKind::PortUnreachable),
            ],
        ),
        rule("filter-input", vec![tcp(), Statement::Reject(RejectKind::TcpReset)]),
        rule("filter-input", vec![Statement::Reject(RejectKind::TcpReset)]),
    ];
    Transaction { table: ip6_table(), operations }
}

/// The removals, applied after [`every_addition_ipv4`].
pub fn every_removal_ipv4() -> Transaction {
    let operations = vec![
        Operation::FlushChain("svc-ABC-default/web/tcp/http".into()),
        Operation::FlushSet("service-ips".into()),
        Operation::DeleteElement(Element {
            set: "no-endpoint-services".into(),
            key: service_key("198.19.0.20", 6, 80),
            value: None,
            comment: None,
        }),
        delete_element("pairs", vec![address("10.1.0.5"), address("10.1.0.5")]),
        Operation::FlushSet("node-ips".into()),
        Operation::DeleteSet("dnat-targets".into()),
        Operation::FlushChain("endpoint-1".into()),
        Operation::FlushChain("services".into()),
        Operation::DeleteSet("protocols".into()),
        Operation::FlushSet("prefix-vmap".into()),
        Operation::DeleteChain("endpoint-2".into()),
        Operation::DeleteChain("endpoint-1".into()),
        Operation::DeleteSet("affinity-svc-ABC-default/web/tcp/http".into()),
    ];
    Transaction { table: ip_table(), operations }
}

/// The state every row of the agreement table starts from (as in the CLI's own test).
pub fn agreement_base() -> Vec<Operation> {
    vec![
        Operation::AddTable { comment: None },
        base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        chain("services"),
        chain("svc-a"),
        chain("svc-b"),
        Operation::AddSet(set(
            "service-ips",
            vec![DataType::Ipv4Addr, DataType::InetProto, DataType::InetService],
            Some(vec![DataType::Verdict]),
        )),
        Operation::AddSet(set("allowed", vec![DataType::Ipv4Addr], None)),
        Operation::AddSet(Set { interval: true, ..set("node-ips", vec![DataType::Ipv4Addr], None) }),
        Operation::AddSet(Set {
            dynamic_timeout: Some(Duration::from_secs(10800)),
            ..set("affinity", vec![DataType::Ipv4Addr], None)
        }),
        element("service-ips", service_key("198.19.0.10", 6, 80), Some(goto_value("svc-a"))),
        element("node-ips", vec![Value::Prefix(prefix("10.0.0.0/8"))], None),
        rule("nat-prerouting", vec![jump("services")]),
        rule("services", vec![Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() }]),
        rule("svc-b", vec![in_set(vec![Expr::SourceAddress], false, "allowed")]),
    ]
}

/// Good and bad transactions on [`agreement_base`]: whether each fails and how.
pub fn agreement_rows() -> Vec<(&'static str, Vec<Operation>, Option<ErrorKind>)> {
    let service_element =
        |ip: &str, target: &str| element("service-ips", service_key(ip, 6, 80), Some(goto_value(target)));
    let delete_service_element = || delete_element("service-ips", service_key("198.19.0.10", 6, 80));
    let nested = |count: usize| {
        let names: Vec<String> = (1..=count).map(|level| format!("nested-{level}")).collect();
        let mut operations: Vec<Operation> = names.iter().map(|name| chain(name)).collect();
        operations.extend(names.windows(2).map(|pair| rule(&pair[0], vec![jump(&pair[1])])));
        operations.push(rule("services", vec![jump(&names[0])]));
        operations
    };
    vec![
        (
            "adding a service chain, its rules and its map element",
            vec![chain("svc-c"), rule("svc-c", vec![jump("svc-a")]), service_element("198.19.0.11", "svc-c")],
            None,
        ),
        (
            "a rule jumping to a missing chain",
            vec![rule("svc-b", vec![jump("svc-missing")])],
            Some(ErrorKind::NotFound),
        ),
        (
            "a jump to a chain added later in the same transaction",
            vec![rule("svc-b", vec![jump("svc-c")]), chain("svc-c")],
            Some(ErrorKind::NotFound),
        ),
        (
            "a map element going to a missing chain",
            vec![service_element("198.19.0.11", "svc-missing")],
            Some(ErrorKind::NotFound),
        ),
        ("a rule in a missing chain", vec![rule("svc-missing", vec![Statement::Counter])], Some(ErrorKind::NotFound)),
        (
            "a lookup in a missing set",
            vec![rule("svc-b", vec![in_set(vec![Expr::SourceAddress], false, "nope")])],
            Some(ErrorKind::NotFound),
        ),
        (
            "an element of a missing set",
            vec![element("nope", vec![address("10.0.0.1")], None)],
            Some(ErrorKind::NotFound),
        ),
        ("deleting a missing chain", vec![Operation::DeleteChain("svc-missing".into())], Some(ErrorKind::NotFound)),
        ("flushing a missing chain", vec![Operation::FlushChain("svc-missing".into())], Some(ErrorKind::NotFound)),
        ("flushing a missing set", vec![Operation::FlushSet("nope".into())], Some(ErrorKind::NotFound)),
        ("deleting a missing set", vec![Operation::DeleteSet("nope".into())], Some(ErrorKind::NotFound)),
        (
            "deleting a missing element",
            vec![delete_element("allowed", vec![address("10.9.9.9")])],
            Some(ErrorKind::NotFound),
        ),
        ("deleting a chain a rule jumps to", vec![Operation::DeleteChain("services".into())], Some(ErrorKind::InUse)),
        (
            "deleting a chain a map element goes to",
            vec![Operation::DeleteChain("svc-a".into())],
            Some(ErrorKind::InUse),
        ),
        ("deleting a set a rule uses", vec![Operation::DeleteSet("allowed".into())], Some(ErrorKind::InUse)),
        (
            "deleting a chain after flushing the rule that jumped to it",
            vec![Operation::FlushChain("nat-prerouting".into()), Operation::DeleteChain("services".into())],
            None,
        ),
        (
            "deleting a map element, then the chain it went to",
            vec![delete_service_element(), Operation::DeleteChain("svc-a".into())],
            None,
        ),
        (
            "deleting a chain, then the map element that went to it",
            vec![Operation::DeleteChain("svc-a".into()), delete_service_element()],
            Some(ErrorKind::InUse),
        ),
        (
            "deleting a chain that still has rules but no references",
            vec![Operation::DeleteChain("svc-b".into()), Operation::DeleteSet("allowed".into())],
            None,
        ),
        (
            "deleting a chain that jumps to itself",
            vec![rule("svc-b", vec![jump("svc-b")]), Operation::DeleteChain("svc-b".into())],
            Some(ErrorKind::InUse),
        ),
        (
            "deleting and adding back a chain in one transaction",
            vec![Operation::DeleteChain("svc-b".into()), chain("svc-b"), rule("svc-b", vec![Statement::Counter])],
            None,
        ),
        ("adding again what exists", agreement_base(), None),
        ("adding an existing base chain as a regular chain", vec![chain("nat-prerouting")], None),
        (
            "redefining a regular chain as a base chain",
            vec![base_chain("svc-b", ChainType::Filter, Hook::Input, 0)],
            Some(ErrorKind::Exists),
        ),
        (
            "changing a base chain's priority",
            vec![base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -90)],
            Some(ErrorKind::Exists),
        ),
        (
            "changing a base chain's type",
            vec![base_chain("nat-prerouting", ChainType::Filter, Hook::Prerouting, -100)],
            Some(ErrorKind::Exists),
        ),
        (
            "redefining a set's key",
            vec![Operation::AddSet(set("allowed", vec![DataType::Ipv4Addr, DataType::InetService], None))],
            Some(ErrorKind::Exists),
        ),
        (
            "redefining a set as a map",
            vec![Operation::AddSet(set("allowed", vec![DataType::Ipv4Addr], Some(vec![DataType::Verdict])))],
            Some(ErrorKind::Exists),
        ),
        (
            "changing a dynamic set's timeout",
            vec![Operation::AddSet(Set {
                dynamic_timeout: Some(Duration::from_secs(60)),
                ..set("affinity", vec![DataType::Ipv4Addr], None)
            })],
            None,
        ),
        ("giving a map key another verdict", vec![service_element("198.19.0.10", "svc-b")], Some(ErrorKind::Exists)),
        (
            "an element whose key misses a part",
            vec![element("service-ips", vec![address("198.19.0.12"), Value::Protocol(6)], Some(goto_value("svc-a")))],
            Some(ErrorKind::Invalid),
        ),
        (
            "an element whose protocol is written as a port number",
            vec![element(
                "service-ips",
                vec![address("198.19.0.12"), Value::Port(6), Value::Port(80)],
                Some(goto_value("svc-a")),
            )],
            None,
        ),
        (
            "an element whose protocol number is out of range",
            vec![element(
                "service-ips",
                vec![address("198.19.0.12"), Value::Port(300), Value::Port(80)],
                Some(goto_value("svc-a")),
            )],
            Some(ErrorKind::Invalid),
        ),
        (
            "an element whose IPv4 address is written as a number",
            vec![element(
                "service-ips",
                vec![Value::Integer(0xc613_000c), Value::Protocol(6), Value::Port(80)],
                Some(goto_value("svc-a")),
            )],
            None,
        ),
        (
            "an element whose address is a protocol",
            vec![element(
                "service-ips",
                vec![Value::Protocol(6), Value::Protocol(6), Value::Port(80)],
                Some(goto_value("svc-a")),
            )],
            None,
        ),
        (
            "an element whose port is an address",
            vec![element(
                "service-ips",
                vec![address("198.19.0.12"), Value::Protocol(6), address("198.19.0.13")],
                Some(goto_value("svc-a")),
            )],
            Some(ErrorKind::Invalid),
        ),
        (
            "an IPv6 element in an IPv4 set",
            vec![element("allowed", vec![address("2001:db8::1")], None)],
            Some(ErrorKind::Invalid),
        ),
        (
            "a prefix in a set without the interval flag",
            vec![element("allowed", vec![Value::Prefix(prefix("10.0.0.0/8"))], None)],
            Some(ErrorKind::Invalid),
        ),
        (
            "an interval inside another",
            vec![element("node-ips", vec![Value::Prefix(prefix("10.1.0.0/16"))], None)],
            Some(ErrorKind::Exists),
        ),
        (
            "an interval equal to one there, written with host bits",
            vec![element("node-ips", vec![Value::Prefix(prefix("10.0.0.1/8"))], None)],
            None,
        ),
        (
            "an interval next to another",
            vec![element("node-ips", vec![Value::Prefix(prefix("11.0.0.0/8"))], None)],
            None,
        ),
        (
            "a verdict map lookup with keys of the wrong type",
            vec![rule(
                "svc-b",
                vec![Statement::VerdictMap { keys: vec![Expr::DestinationAddress], map: "service-ips".into() }],
            )],
            Some(ErrorKind::Invalid),
        ),
        (
            "a verdict map lookup through a plain set",
            vec![rule(
                "svc-b",
                vec![Statement::VerdictMap { keys: vec![Expr::DestinationAddress], map: "allowed".into() }],
            )],
            Some(ErrorKind::Invalid),
        ),
        (
            "a set lookup with too many keys",
            vec![rule("svc-b", vec![in_set(vec![Expr::SourceAddress, Expr::DestinationPort], false, "allowed")])],
            Some(ErrorKind::Invalid),
        ),
        (
            "updating a dynamic set from the packet path",
            vec![rule("svc-b", vec![Statement::UpdateSet { keys: vec![Expr::SourceAddress], set: "affinity".into() }])],
            None,
        ),
        (
            "flushing a map and a set that exist",
            vec![Operation::FlushSet("service-ips".into()), Operation::FlushSet("allowed".into())],
            None,
        ),
        ("deleting the table", vec![Operation::DeleteTable], None),
        ("deleting the table twice", vec![Operation::DeleteTable, Operation::DeleteTable], Some(ErrorKind::NotFound)),
        (
            "deleting the table and adding a chain to it",
            vec![Operation::DeleteTable, chain("svc-b")],
            Some(ErrorKind::NotFound),
        ),
        ("deleting the table and building it again", [vec![Operation::DeleteTable], agreement_base()].concat(), None),
        (
            "a statement after a verdict",
            vec![rule("svc-b", vec![Statement::Verdict(Verdict::Accept), Statement::Counter])],
            Some(ErrorKind::Invalid),
        ),
        ("a chain named like a keyword", vec![chain("counter")], Some(ErrorKind::Invalid)),
        (
            "dnat reached from the nat prerouting chain through a map element",
            vec![rule("svc-a", vec![Statement::Dnat { address: "10.1.0.1".parse().unwrap(), port: None }])],
            None,
        ),
        (
            "masquerade reached from the nat prerouting chain through a map element",
            vec![rule("svc-a", vec![Statement::Masquerade { fully_random: false }])],
            Some(ErrorKind::Invalid),
        ),
        (
            "a map element that makes prerouting reach a masquerade",
            vec![
                rule("svc-b", vec![Statement::Masquerade { fully_random: false }]),
                element("service-ips", service_key("198.19.0.11", 6, 80), Some(goto_value("svc-b"))),
            ],
            Some(ErrorKind::Invalid),
        ),
        (
            "dnat in a chain a filter chain jumps to",
            vec![
                base_chain("filter-input", ChainType::Filter, Hook::Input, 0),
                chain("svc-c"),
                rule("svc-c", vec![Statement::Dnat { address: "10.1.0.1".parse().unwrap(), port: None }]),
                rule("filter-input", vec![jump("svc-c")]),
            ],
            Some(ErrorKind::Invalid),
        ),
        (
            "reject on the postrouting hook",
            vec![
                base_chain("filter-postrouting", ChainType::Filter, Hook::Postrouting, 0),
                rule("filter-postrouting", vec![Statement::Reject(RejectKind::PortUnreachable)]),
            ],
            Some(ErrorKind::Invalid),
        ),
        (
            "a jump loop a base chain reaches",
            vec![rule("svc-a", vec![jump("svc-b")]), rule("svc-b", vec![jump("svc-a")])],
            Some(ErrorKind::Invalid),
        ),
        (
            "a jump loop no base chain reaches",
            vec![
                chain("loop-1"),
                chain("loop-2"),
                rule("loop-1", vec![jump("loop-2")]),
                rule("loop-2", vec![goto("loop-1")]),
            ],
            None,
        ),
        ("fifteen nested jumps", nested(14), None),
        ("sixteen nested jumps", nested(15), Some(ErrorKind::Invalid)),
    ]
}

/// The masquerading chain's rules as svcplane writes them: hairpin pairs in `hairpin_set`
/// get the mark, unmarked packets return, marked ones have the mark cleared and are
/// masqueraded.
pub fn masquerading_rules(hairpin_set: &str) -> Vec<Operation> {
    vec![
        rule(
            "masquerading",
            vec![
                in_set(vec![Expr::SourceAddress, Expr::DestinationAddress], false, hairpin_set),
                Statement::SetMarkBits(0x4000),
            ],
        ),
        rule(
            "masquerading",
            vec![
                Statement::Match(Match::MarkMasked { mask: 0x4000, op: CmpOp::Eq, value: 0 }),
                Statement::Verdict(Verdict::Return),
            ],
        ),
        rule("masquerading", vec![Statement::ToggleMarkBits(0x4000)]),
        rule("masquerading", vec![Statement::Masquerade { fully_random: true }]),
    ]
}
