//! The real nft 1.0.6 and kernel, each test in a network namespace of its own (needs root:
//! without it they say so and skip; `.ci/run` sets `SVCPLANE_REQUIRE_ROOT=1`, which turns a
//! skip into a failure so a broken setup never passes). Nothing here runs nft outside those namespaces.

use std::collections::BTreeMap;

use svcplane_nft::validation::RESERVED_WORDS;
use svcplane_nft::{
    ChainType, CmpOp, DataType, Expr, FakeNftables, Hook, NftCli, NftError, Nftables, Operation, Statement,
    Transaction, Value,
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
    let rows = agreement_rows();

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
