//! The real nft 1.0.6 and kernel, each test in a network namespace of its own (needs root:
//! without it they say so and skip; `.ci/run` sets `SVCPLANE_REQUIRE_ROOT=1`, which turns a
//! skip into a failure so a broken setup never passes). Nothing here runs nft outside those namespaces.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use ipnet::IpNet;
use svcplane_nft::validation::RESERVED_WORDS;
use svcplane_nft::{
    BaseChain, Chain, ChainType, CmpOp, DataType, Element, ElementValue, ErrorKind, Expr, FakeNftables, Family,
    FibAddress, Hook, Match, NftCli, NftError, Nftables, Operation, RejectKind, Rule, Set, Statement, TableName,
    Transaction, Value, Verdict,
};

/// A network namespace that exists for one test and is removed when it ends, even by panic.
struct NetNs {
    name: String,
}

impl NetNs {
    fn new(test: &str) -> NetNs {
        let name = format!("svcp-nft-{test}-{}", std::process::id());
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

    fn nft(&self) -> NftCli {
        NftCli::in_network_namespace(&self.name)
    }

    /// Feeds a script to nft in this namespace directly, bypassing this crate's checks.
    fn accepts_script(&self, script: &str) -> bool {
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

fn ip_table() -> TableName {
    TableName::new(Family::Ip, "svcplane")
}

fn chain(name: &str) -> Operation {
    Operation::AddChain(Chain { name: name.into(), base: None, comment: None })
}

fn base_chain(name: &str, chain_type: ChainType, hook: Hook, priority: i32) -> Operation {
    Operation::AddChain(Chain {
        name: name.into(),
        base: Some(BaseChain { chain_type, hook, priority }),
        comment: None,
    })
}

fn rule(chain: &str, statements: Vec<Statement>) -> Operation {
    Operation::AddRule(Rule { chain: chain.into(), statements, comment: None })
}

fn compare(left: Expr, op: CmpOp, right: Value) -> Statement {
    Statement::Match(Match::Compare { left, op, right })
}

fn tcp() -> Statement {
    compare(Expr::L4Proto, CmpOp::Eq, Value::Protocol(6))
}

fn jump(target: &str) -> Statement {
    Statement::Verdict(Verdict::Jump(target.into()))
}

fn goto(target: &str) -> Statement {
    Statement::Verdict(Verdict::Goto(target.into()))
}

fn address(text: &str) -> Value {
    Value::Address(text.parse().unwrap())
}

fn prefix(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn set(name: &str, key: Vec<DataType>, value: Option<Vec<DataType>>) -> Set {
    Set { name: name.into(), key, value, interval: false, dynamic_timeout: None, comment: None }
}

fn element(set: &str, key: Vec<Value>, value: Option<ElementValue>) -> Operation {
    Operation::AddElement(Element { set: set.into(), key, value, comment: None })
}

fn service_key(ip: &str, protocol: u8, port: u16) -> Vec<Value> {
    vec![address(ip), Value::Protocol(protocol), Value::Port(port)]
}

fn service_keys() -> Vec<Expr> {
    vec![Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort]
}

/// An IPv4 table using every operation that adds, every statement, every match and every
/// data type that fits an IPv4 table, shaped like svcplane's own (so the kernel's checks of
/// which statement may run in which hook pass too).
fn every_addition_ipv4() -> Transaction {
    let table = ip_table();
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
    let dnat_map = set("dnat-targets", vec![ipv4, DataType::InetService], Some(vec![ipv4, DataType::InetService]));
    let service = "svc-ABC-default/web/tcp/http";
    let operations = vec![
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
        Operation::AddSet(dnat_map),
        element(
            "service-ips",
            service_key("198.19.0.10", 6, 80),
            Some(ElementValue::Verdict(Verdict::Goto(service.into()))),
        ),
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
        element(
            "dnat-targets",
            vec![address("198.19.0.30"), Value::Port(80)],
            Some(ElementValue::Data(vec![address("10.1.0.9"), Value::Port(8080)])),
        ),
        rule("nat-prerouting", vec![jump("services")]),
        rule("nat-output", vec![jump("services")]),
        rule("services", vec![Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() }]),
        rule(
            "services",
            vec![
                Statement::Match(Match::FibLocal { address: FibAddress::Destination, negate: false }),
                Statement::Match(Match::InSet {
                    keys: vec![Expr::DestinationAddress],
                    negate: false,
                    set: "node-ips".into(),
                }),
                Statement::Counter,
                Statement::Verdict(Verdict::Return),
            ],
        ),
        rule(
            service,
            vec![
                Statement::Match(Match::InPrefixes {
                    left: Expr::SourceAddress,
                    negate: true,
                    prefixes: vec![prefix("198.18.128.0/17")],
                }),
                jump("mark-for-masquerade"),
            ],
        ),
        rule(
            service,
            vec![
                Statement::Match(Match::InSet {
                    keys: vec![Expr::SourceAddress],
                    negate: false,
                    set: "affinity-svc-ABC-default/web/tcp/http".into(),
                }),
                goto("endpoint-1"),
            ],
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
        Operation::AddRule(Rule {
            chain: "endpoint-1".into(),
            statements: vec![tcp(), Statement::Dnat { address: "10.1.0.5".parse().unwrap(), port: Some(8080) }],
            comment: Some("default/web-1234:http".into()),
        }),
        rule("endpoint-2", vec![Statement::Dnat { address: "10.1.0.6".parse().unwrap(), port: None }]),
        rule("mark-for-masquerade", vec![Statement::SetMarkBits(0x4000)]),
        rule("nat-postrouting", vec![jump("masquerading")]),
        rule(
            "masquerading",
            vec![
                Statement::Match(Match::MarkMasked { mask: 0x4000, op: CmpOp::Eq, value: 0 }),
                Statement::Verdict(Verdict::Return),
            ],
        ),
        rule("masquerading", vec![Statement::ToggleMarkBits(0x4000)]),
        rule("masquerading", vec![Statement::Masquerade { fully_random: true }]),
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
                Statement::Match(Match::InSet {
                    keys: service_keys(),
                    negate: false,
                    set: "no-endpoint-services".into(),
                }),
                jump("reject-chain"),
            ],
        ),
        rule(
            "filter-forward",
            vec![
                Statement::Match(Match::InPrefixes {
                    left: Expr::SourceAddress,
                    negate: true,
                    prefixes: vec![prefix("10.0.0.0/8"), prefix("192.168.0.0/16")],
                }),
                Statement::Match(Match::InSet {
                    keys: vec![Expr::DestinationAddress],
                    negate: true,
                    set: "node-ips".into(),
                }),
                Statement::Counter,
                Statement::Verdict(Verdict::Accept),
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
            "filter-prerouting",
            vec![Statement::Match(Match::FibLocal { address: FibAddress::Source, negate: true }), Statement::Counter],
        ),
        rule("reject-chain", vec![tcp(), Statement::Reject(RejectKind::TcpReset)]),
        rule("reject-chain", vec![Statement::Reject(RejectKind::PortUnreachable)]),
    ];
    Transaction { table, operations }
}

/// The IPv6 counterpart, for what renders differently in an ip6 table.
fn every_addition_ipv6() -> Transaction {
    let ipv6 = DataType::Ipv6Addr;
    let operations = vec![
        Operation::AddTable { comment: None },
        base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        base_chain("filter-input", ChainType::Filter, Hook::Input, 0),
        chain("services"),
        chain("endpoint-1"),
        Operation::AddSet(set(
            "service-ips",
            vec![ipv6, DataType::InetProto, DataType::InetService],
            Some(vec![DataType::Verdict]),
        )),
        Operation::AddSet(Set { interval: true, ..set("node-ips", vec![ipv6], None) }),
        element(
            "service-ips",
            service_key("2001:db8::10", 6, 80),
            Some(ElementValue::Verdict(Verdict::Goto("endpoint-1".into()))),
        ),
        element("service-ips", service_key("::ffff:198.19.0.1", 17, 53), Some(ElementValue::Verdict(Verdict::Drop))),
        element("node-ips", vec![Value::Prefix(prefix("2001:db8:1::/48"))], None),
        element("node-ips", vec![address("fd00::7")], None),
        rule("nat-prerouting", vec![jump("services")]),
        rule(
            "services",
            vec![
                Statement::Match(Match::InPrefixes {
                    left: Expr::SourceAddress,
                    negate: true,
                    prefixes: vec![prefix("2001:db8::/32"), prefix("fd00::/8")],
                }),
                Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() },
            ],
        ),
        rule("endpoint-1", vec![tcp(), Statement::Dnat { address: "2001:db8::1".parse().unwrap(), port: Some(8080) }]),
        rule("endpoint-1", vec![Statement::Dnat { address: "2001:db8::2".parse().unwrap(), port: None }]),
        rule(
            "filter-input",
            vec![
                compare(Expr::DestinationAddress, CmpOp::Eq, address("2001:db8::10")),
                Statement::Reject(RejectKind::PortUnreachable),
            ],
        ),
    ];
    Transaction { table: TableName::new(Family::Ip6, "svcplane"), operations }
}

/// The removals, applied after [`every_addition_ipv4`].
fn every_removal_ipv4() -> Transaction {
    let operations = vec![
        Operation::FlushChain("svc-ABC-default/web/tcp/http".into()),
        // A map, flushed as `flush map`: the CLI knows it is one from the transaction before.
        Operation::FlushSet("service-ips".into()),
        Operation::DeleteElement(Element {
            set: "no-endpoint-services".into(),
            key: service_key("198.19.0.20", 6, 80),
            value: None,
            comment: None,
        }),
        Operation::FlushSet("node-ips".into()),
        Operation::DeleteSet("dnat-targets".into()),
        Operation::FlushChain("endpoint-1".into()),
        Operation::DeleteChain("endpoint-2".into()),
        Operation::DeleteChain("endpoint-1".into()),
        Operation::DeleteSet("affinity-svc-ABC-default/web/tcp/http".into()),
    ];
    Transaction { table: ip_table(), operations }
}

/// A table listing as comparable content: each chain's lines in order, each set's lines and
/// elements sorted (the kernel lists objects in creation order and hash-set elements in hash
/// order, neither of which is part of the state).
fn canonical_listing(listing: &str) -> BTreeMap<String, Vec<String>> {
    let mut blocks = BTreeMap::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in listing.lines() {
        let trimmed = line.trim();
        if line.starts_with("\tchain ") || line.starts_with("\tset ") || line.starts_with("\tmap ") {
            current = Some((trimmed.to_owned(), Vec::new()));
        } else if line == "\t}" {
            if let Some((header, mut lines)) = current.take() {
                if !header.starts_with("chain ") {
                    lines = lines.join(" ").split([',', '{', '}']).map(|part| part.trim().to_owned()).collect();
                    lines.sort();
                }
                blocks.insert(header, lines);
            }
        } else if let Some((_, lines)) = &mut current {
            lines.push(trimmed.to_owned());
        } else if !trimmed.is_empty() {
            blocks.entry("table".to_owned()).or_insert_with(Vec::new).push(trimmed.to_owned());
        }
    }
    blocks
}

#[test]
fn every_operation_statement_and_match_is_accepted_by_the_real_nft() {
    if !svcplane_testbed::can_run_real_kernel_tests("every_operation_statement_and_match_is_accepted_by_the_real_nft") {
        return;
    }
    let netns = NetNs::new("all");
    let mut nft = netns.nft();
    let ipv4 = every_addition_ipv4();
    let ipv6 = every_addition_ipv6();
    nft.apply(&ipv4).unwrap();
    nft.apply(&ipv6).unwrap();

    let listing = nft.list_table(&ip_table()).unwrap();
    for expected in [
        "comment \"rules for Kubernetes Services\"",
        "chain svc-ABC-default/web/tcp/http {",
        "type nat hook prerouting priority dstnat; policy accept;",
        "type filter hook output priority filter - 5; policy accept;",
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "198.19.0.10 . tcp . 80 : goto svc-ABC-default/web/tcp/http",
        "198.19.0.10 . udp . 53 : jump svc-ABC-default/web/tcp/http",
        "198.19.0.11 . sctp . 9 : drop",
        "198.19.0.20 . tcp . 80 comment \"default/empty:http\"",
        "198.19.0.30 . 80 : 10.1.0.9 . 8080",
        "192.0.2.0/24",
        "flags dynamic,timeout",
        "timeout 3h",
        "fib daddr type local ip daddr @node-ips counter packets 0 bytes 0 return",
        "ip saddr != 198.18.128.0/17 jump mark-for-masquerade",
        "ip saddr @affinity-svc-ABC-default/web/tcp/http goto endpoint-1",
        "numgen random mod 2 0 goto endpoint-1",
        "numgen random mod 3 != 2 goto endpoint-2",
        "update @affinity-svc-ABC-default/web/tcp/http { ip saddr }",
        "meta l4proto tcp dnat to 10.1.0.5:8080 comment \"default/web-1234:http\"",
        "dnat to 10.1.0.6",
        "meta mark set meta mark | 0x00004000",
        "meta mark & 0x00004000 == 0x00000000 return",
        "meta mark set meta mark ^ 0x00004000",
        "masquerade fully-random",
        "meta mark & 0x00004000 != 0x00000000 masquerade",
        "ct state new ip daddr . meta l4proto . th dport @no-endpoint-services jump reject-chain",
        "ip saddr != { 10.0.0.0/8, 192.168.0.0/16 } ip daddr != @node-ips counter packets 0 bytes 0 accept",
        "udp sport 53 udp dport != 5353 meta mark != 0x00000010 ip daddr 10.0.0.0/8 ip saddr != 10.1.2.3 meta l4proto != icmp",
        "fib saddr type != local counter",
        "reject with tcp reset",
        "\t\treject\n",
    ] {
        assert!(listing.contains(expected), "{expected:?} is missing from:\n{listing}");
    }
    let listing6 = nft.list_table(&ipv6.table).unwrap();
    for expected in [
        "ip6 daddr . meta l4proto . th dport vmap @service-ips",
        "2001:db8::10 . tcp . 80 : goto endpoint-1",
        "::ffff:198.19.0.1 . udp . 53 : drop",
        "ip6 saddr != { 2001:db8::/32, fd00::/8 }",
        "meta l4proto tcp dnat to [2001:db8::1]:8080",
        "dnat to 2001:db8::2",
        "2001:db8:1::/48",
    ] {
        assert!(listing6.contains(expected), "{expected:?} is missing from:\n{listing6}");
    }

    let removal = every_removal_ipv4();
    nft.apply(&removal).unwrap();
    let listing = nft.list_table(&ip_table()).unwrap();
    for gone in ["chain endpoint-1", "chain endpoint-2", "dnat-targets", "198.19.0.10 .", "198.19.0.20", "192.0.2.0/24"]
    {
        assert!(!listing.contains(gone), "{gone:?} is still in:\n{listing}");
    }

    // The fake accepts the same transactions, and what it holds afterwards, loaded into a
    // fresh kernel, lists exactly like what the transactions built.
    let mut fake = FakeNftables::new();
    for transaction in [&ipv4, &ipv6, &removal] {
        fake.apply(transaction).unwrap();
    }
    let fresh = NetNs::new("all-dump");
    assert!(fresh.accepts_script(&fake.dump()), "nft refused the fake's dump:\n{}", fake.dump());
    for table in [ip_table(), ipv6.table.clone()] {
        let original = canonical_listing(&nft.list_table(&table).unwrap());
        let rebuilt = canonical_listing(&fresh.nft().list_table(&table).unwrap());
        assert_eq!(rebuilt, original, "table {table}");
    }

    nft.apply(&Transaction { table: ip_table(), operations: vec![Operation::DeleteTable] }).unwrap();
    assert!(nft.list_table(&ip_table()).unwrap_err().is_not_found());
}

#[test]
fn a_transaction_with_one_bad_operation_leaves_the_previous_ruleset_intact() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_transaction_with_one_bad_operation_leaves_the_previous_ruleset_intact",
    ) {
        return;
    }
    let netns = NetNs::new("atomic");
    let mut nft = netns.nft();
    nft.apply(&every_addition_ipv4()).unwrap();
    let before = nft.list_table(&ip_table()).unwrap();

    let mut operations = every_removal_ipv4().operations;
    operations.push(chain("svc-new"));
    operations.push(rule("svc-new", vec![Statement::Counter]));
    operations.push(Operation::DeleteChain("no-such-chain".into()));
    let error = nft.apply(&Transaction { table: ip_table(), operations }).unwrap_err();

    assert!(matches!(&error, NftError::NotFound { name, .. } if name == "no-such-chain"), "{error}");
    assert_eq!(nft.list_table(&ip_table()).unwrap(), before);
}

#[test]
fn deleting_a_table_reports_whether_it_was_there() {
    if !svcplane_testbed::can_run_real_kernel_tests("deleting_a_table_reports_whether_it_was_there") {
        return;
    }
    let netns = NetNs::new("delete");
    let mut nft = netns.nft();
    assert!(!nft.delete_table(&ip_table()).unwrap());
    nft.apply(&Transaction { table: ip_table(), operations: vec![Operation::AddTable { comment: None }] }).unwrap();
    assert!(nft.delete_table(&ip_table()).unwrap());
    assert!(!nft.delete_table(&ip_table()).unwrap());
}

#[test]
fn a_missing_nft_program_is_a_spawn_error() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_missing_nft_program_is_a_spawn_error") {
        return;
    }
    let mut nft = NftCli::new().with_program("/nonexistent/nft");
    let transaction = Transaction { table: ip_table(), operations: vec![Operation::AddTable { comment: None }] };
    assert!(matches!(nft.apply(&transaction), Err(NftError::Spawn { .. })));
}

#[test]
fn every_reserved_word_is_refused_by_nft_as_a_chain_name_and_others_are_not() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "every_reserved_word_is_refused_by_nft_as_a_chain_name_and_others_are_not",
    ) {
        return;
    }
    let netns = NetNs::new("words");
    assert!(netns.accepts_script("add table ip words\n"));
    for word in RESERVED_WORDS {
        assert!(!netns.accepts_script(&format!("add chain ip words {word}\n")), "nft accepts {word:?}");
    }
    for word in ["filter", "nat", "input", "services", "saddr", "to", "svc-ABC-ns/name/tcp/p80", "_x", ".x", "a.b"] {
        assert!(netns.accepts_script(&format!("add chain ip words {word}\n")), "nft refuses {word:?}");
    }
}

/// The state every row of the agreement table starts from: a base chain jumping to
/// `services`, which maps `service-ips` to `svc-a`; `svc-b` unreferenced; a plain set used
/// by a rule, an interval set and a dynamic set.
fn agreement_base() -> Vec<Operation> {
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
        rule(
            "svc-b",
            vec![Statement::Match(Match::InSet {
                keys: vec![Expr::SourceAddress],
                negate: false,
                set: "allowed".into(),
            })],
        ),
    ]
}

fn goto_value(target: &str) -> ElementValue {
    ElementValue::Verdict(Verdict::Goto(target.into()))
}

#[test]
fn the_fake_and_the_kernel_agree_on_good_and_bad_transactions() {
    if !svcplane_testbed::can_run_real_kernel_tests("the_fake_and_the_kernel_agree_on_good_and_bad_transactions") {
        return;
    }
    let service_element =
        |ip: &str, target: &str| element("service-ips", service_key(ip, 6, 80), Some(goto_value(target)));
    let delete_service_element = || {
        Operation::DeleteElement(Element {
            set: "service-ips".into(),
            key: service_key("198.19.0.10", 6, 80),
            value: None,
            comment: None,
        })
    };
    let rows: Vec<(&str, Vec<Operation>, Option<ErrorKind>)> = vec![
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
            vec![rule(
                "svc-b",
                vec![Statement::Match(Match::InSet {
                    keys: vec![Expr::SourceAddress],
                    negate: false,
                    set: "nope".into(),
                })],
            )],
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
            vec![Operation::DeleteElement(Element {
                set: "allowed".into(),
                key: vec![address("10.9.9.9")],
                value: None,
                comment: None,
            })],
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
            vec![rule(
                "svc-b",
                vec![Statement::Match(Match::InSet {
                    keys: vec![Expr::SourceAddress, Expr::DestinationPort],
                    negate: false,
                    set: "allowed".into(),
                })],
            )],
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
    ];

    let nested = |count: usize| {
        let names: Vec<String> = (1..=count).map(|level| format!("nested-{level}")).collect();
        let mut operations: Vec<Operation> = names.iter().map(|name| chain(name)).collect();
        operations.extend(names.windows(2).map(|pair| rule(&pair[0], vec![jump(&pair[1])])));
        operations.push(rule("services", vec![jump(&names[0])]));
        operations
    };
    let hook_rows: Vec<(&str, Vec<Operation>, Option<ErrorKind>)> = vec![
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
    ];
    let rows = rows.into_iter().chain(hook_rows);

    let netns = NetNs::new("agree");
    let base = Transaction { table: ip_table(), operations: agreement_base() };
    let mut mismatches = Vec::new();
    for (sentence, operations, expected) in rows {
        // A fresh CLI each time, so that flushing a map has to ask nft what the set is.
        let mut nft = netns.nft();
        nft.delete_table(&ip_table()).unwrap();
        nft.apply(&base).unwrap();
        let mut fake = FakeNftables::new();
        fake.apply(&base).unwrap();
        let kernel_before = nft.list_table(&ip_table()).unwrap();
        let fake_before = fake.dump();

        let transaction = Transaction { table: ip_table(), operations };
        let kernel = nft.apply(&transaction);
        let faked = fake.apply(&transaction);
        let kind = |result: &Result<(), NftError>| result.as_ref().err().map(NftError::kind);
        if kind(&kernel) != expected || kind(&faked) != expected {
            mismatches.push(format!("{sentence}: expected {expected:?}, kernel {kernel:?}, fake {faked:?}"));
        } else if let (Err(kernel), Err(faked)) = (&kernel, &faked)
            && std::mem::discriminant(kernel) != std::mem::discriminant(faked)
        {
            mismatches.push(format!("{sentence}: kernel says {kernel:?}, fake says {faked:?}"));
        }
        if expected.is_some() {
            assert_eq!(nft.list_table(&ip_table()).unwrap(), kernel_before, "{sentence}: the kernel changed");
            assert_eq!(fake.dump(), fake_before, "{sentence}: the fake changed");
        }
    }
    assert!(mismatches.is_empty(), "the fake and the kernel disagree:\n{}", mismatches.join("\n"));
}

#[test]
fn a_cluster_sized_transaction_goes_through_the_pipe_in_one_go() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_cluster_sized_transaction_goes_through_the_pipe_in_one_go") {
        return;
    }
    // Far more than a pipe buffer holds: nft must be fed while it runs.
    let services: u32 = 2_000;
    let mut operations = vec![
        Operation::AddTable { comment: None },
        base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        Operation::AddSet(set(
            "service-ips",
            vec![DataType::Ipv4Addr, DataType::InetProto, DataType::InetService],
            Some(vec![DataType::Verdict]),
        )),
        rule("nat-prerouting", vec![Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() }]),
    ];
    for service in 0..services {
        let name = format!("svc-{service:05}-default/web-{service}/tcp/http");
        operations.push(chain(&name));
        for endpoint in 0..10u32 {
            let address = std::net::IpAddr::from((0x0a00_0000 + service * 16 + endpoint).to_be_bytes());
            operations.push(rule(
                &name,
                vec![
                    compare(Expr::RandomModulo(10 - endpoint), CmpOp::Eq, Value::Integer(0)),
                    tcp(),
                    Statement::Dnat { address, port: Some(8080) },
                ],
            ));
        }
        let address = std::net::IpAddr::from((0xc613_0000 + service).to_be_bytes());
        operations.push(element(
            "service-ips",
            vec![Value::Address(address), Value::Protocol(6), Value::Port(80)],
            Some(goto_value(&name)),
        ));
    }
    let transaction = Transaction { table: ip_table(), operations };
    let netns = NetNs::new("large");
    let mut nft = netns.nft();
    nft.apply(&transaction).unwrap();
    let mut fake = FakeNftables::new();
    fake.apply(&transaction).unwrap();
    let listing = nft.list_table(&ip_table()).unwrap();
    assert_eq!(listing.matches("\tchain svc-").count(), services as usize);
    assert_eq!(listing.matches("dnat to").count(), services as usize * 10);
}
