//! The real nft 1.0.6 and kernel, each test in a network namespace of its own (needs root:
//! without it they say so and skip; `.ci/run` sets `SVCPLANE_REQUIRE_ROOT=1`, which turns a
//! skip into a failure so a broken setup never passes). Nothing here runs nft outside those namespaces.

use std::collections::BTreeMap;
use std::time::Duration;

use svcplane_nft::validation::RESERVED_WORDS;
use svcplane_nft::{
    ChainType, CmpOp, DataType, Element, ErrorKind, Expr, FakeNftables, Hook, Match, NftCli, NftError, Nftables,
    Operation, RejectKind, Set, Statement, Transaction, Value, Verdict,
};

mod support;
use support::*;

/// A table listing as comparable content: each chain's lines in order, each set's lines and
/// elements sorted (the kernel lists objects in creation order and hash-set elements in hash
/// order, neither of which is part of the state).
fn canonical_listing(listing: &str) -> BTreeMap<String, Vec<String>> {
    let mut blocks = BTreeMap::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in listing.lines() {
        // nft gives a dynamic set its default size when a rule of the same batch updates
        // it, and lists that size; a set made alone (as from the fake's dump) has none.
        let trimmed = line.trim();
        if trimmed == "size 65535" {
            continue;
        }
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
    let mut nft = netns.cli();
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
        let rebuilt = canonical_listing(&fresh.cli().list_table(&table).unwrap());
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
    let mut nft = netns.cli();
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
    let mut nft = netns.cli();
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
        let mut nft = netns.cli();
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
    let mut nft = netns.cli();
    nft.apply(&transaction).unwrap();
    let mut fake = FakeNftables::new();
    fake.apply(&transaction).unwrap();
    let listing = nft.list_table(&ip_table()).unwrap();
    assert_eq!(listing.matches("\tchain svc-").count(), services as usize);
    assert_eq!(listing.matches("dnat to").count(), services as usize * 10);
}
