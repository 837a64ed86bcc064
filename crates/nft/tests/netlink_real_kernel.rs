//! [`NftNetlink`] against the real kernel, and against [`NftCli`]: the same transactions,
//! applied through netlink in one network namespace and through `nft -f` in another, must
//! leave tables that `nft list table` (and `nft --debug=netlink list table`, which shows
//! every expression and element byte) lists identically, and must fail alike.
//!
//! Each test runs in network namespaces of its own, `svcp-netlink_real_kernel-<test>-<pid>`, removed when it
//! ends; the netlink socket is opened inside them. Needs root: without it they say so and
//! skip, and `.ci/run` (`SVCPLANE_REQUIRE_ROOT=1`) turns a skip into a failure. Nothing here touches the
//! machine's own namespace.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use svcplane_nft::{
    ChainType, CmpOp, DataType, ErrorKind, Expr, Fault, FaultSource, FibAddress, Hook, Match, NftCli, NftError,
    NftNetlink, Nftables, Operation, Set, Statement, TableName, Transaction, Value,
};

mod support;
use support::*;

/// A listing with the elements of each set sorted: the kernel lists a hash set's elements
/// in the order of a hash seeded at random per set, which is not part of the state.
fn sorted_elements(listing: &str) -> String {
    let mut out = String::new();
    let mut lines = listing.lines();
    while let Some(line) = lines.next() {
        let Some((head, rest)) = line.split_once("elements = { ") else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let mut items = rest.to_owned();
        while !items.trim_end().ends_with('}') {
            let Some(next) = lines.next() else { break };
            items.push(' ');
            items.push_str(next.trim());
        }
        let items = items.trim_end().trim_end_matches('}');
        let mut items: Vec<&str> = items.split(',').map(str::trim).filter(|item| !item.is_empty()).collect();
        items.sort_unstable();
        out.push_str(&format!("{head}elements = {{ {} }}\n", items.join(", ")));
    }
    out
}

/// A `--debug=netlink` listing without rule handles (which count every object the table
/// ever had), with each set's element lines sorted.
fn canonical_raw(listing: &str) -> String {
    let mut blocks: Vec<Vec<String>> = Vec::new();
    for line in listing.lines() {
        if line.starts_with('\t') && line.trim_start().starts_with("element ") {
            blocks.last_mut().expect("an element belongs to a set").push(line.to_owned());
            continue;
        }
        let words: Vec<&str> = line.split(' ').collect();
        // `ip svcplane chain 12 11`: family, table, chain, handle, position.
        let header = if words.len() >= 4 && !line.starts_with(' ') && words[3].parse::<u64>().is_ok() {
            words[..3].join(" ")
        } else {
            line.to_owned()
        };
        blocks.push(vec![header]);
    }
    let mut out = String::new();
    for mut block in blocks {
        block[1..].sort_unstable();
        for line in block {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// Asserts that the table lists the same in both namespaces, as nft shows it and byte for byte.
fn assert_same_table(netlink: &NetNs, cli: &NetNs, table: &TableName, context: &str) {
    let ours = netlink.list(table);
    let theirs = cli.list(table);
    assert_eq!(
        sorted_elements(&ours),
        sorted_elements(&theirs),
        "{context}: table {table} lists differently\n--- netlink:\n{ours}\n--- nft -f:\n{theirs}"
    );
    let ours = canonical_raw(&netlink.list_raw(table));
    let theirs = canonical_raw(&cli.list_raw(table));
    if ours != theirs {
        let diff: Vec<String> = ours
            .lines()
            .zip(theirs.lines())
            .filter(|(a, b)| a != b)
            .take(20)
            .map(|(a, b)| format!("netlink: {a}\nnft -f:  {b}"))
            .collect();
        panic!(
            "{context}: table {table} holds different bytes\n{}\n--- netlink:\n{ours}\n--- nft -f:\n{theirs}",
            diff.join("\n")
        );
    }
}

/// Applies each transaction through netlink in one namespace and through the CLI in
/// another, and checks after each that both tables list the same.
fn apply_both(netlink: &mut NftNetlink, cli: &mut NftCli, ours: &NetNs, theirs: &NetNs, transactions: &[Transaction]) {
    for (index, transaction) in transactions.iter().enumerate() {
        netlink.apply(transaction).unwrap_or_else(|error| panic!("netlink, transaction {index}: {error}"));
        cli.apply(transaction).unwrap_or_else(|error| panic!("nft -f, transaction {index}: {error}"));
        assert_same_table(ours, theirs, &transaction.table, &format!("after transaction {index}"));
    }
}

/// What a later sync does to sets that already exist: add elements to a non-empty interval
/// set, to a flushed one and to a map, and add back what was deleted.
fn later_changes_ipv4() -> Transaction {
    let operations = vec![
        element("node-ips", vec![Value::Prefix(prefix("198.51.100.0/24"))], None),
        element("high", vec![Value::Prefix(prefix("11.0.0.0/8"))], None),
        element("ports", vec![Value::Port(54)], None),
        chain("endpoint-3"),
        rule("endpoint-3", vec![tcp(), Statement::Dnat { address: "10.1.0.7".parse().unwrap(), port: Some(80) }]),
        element("service-ips", service_key("198.19.0.10", 6, 80), Some(goto_value("endpoint-3"))),
        rule("services", vec![Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() }]),
    ];
    Transaction { table: ip_table(), operations }
}

#[test]
fn every_statement_match_and_set_kind_lists_exactly_as_through_nft() {
    if !svcplane_testbed::can_run_real_kernel_tests("every_statement_match_and_set_kind_lists_exactly_as_through_nft") {
        return;
    }
    let ours = NetNs::new("equal");
    let theirs = NetNs::new("equal-cli");
    let mut netlink = ours.netlink();
    let mut cli = theirs.cli();
    apply_both(
        &mut netlink,
        &mut cli,
        &ours,
        &theirs,
        &[every_addition_ipv4(), every_addition_ipv6(), every_removal_ipv4(), later_changes_ipv4()],
    );
    // A mechanism that has never seen the table asks the kernel what its sets are.
    let mut fresh = ours.netlink();
    let mut fresh_cli = theirs.cli();
    let again = Transaction {
        table: ip_table(),
        operations: vec![
            element("node-ips", vec![Value::Prefix(prefix("192.0.2.0/24"))], None),
            element("high", vec![address("12.0.0.1")], None),
            // A set starting at zero has no interval end there, and one is not added later.
            element("from-zero", vec![Value::Prefix(prefix("10.0.0.0/8"))], None),
            // An existing, empty interval set gets one, as from nft.
            element("empty", vec![Value::Prefix(prefix("10.0.0.0/8"))], None),
            Operation::FlushSet("node-ips".into()),
            element("node-ips", vec![Value::Prefix(prefix("10.0.0.0/8"))], None),
            element("ranges", vec![Value::Prefix(prefix("192.168.0.0/16")), Value::Port(22)], None),
            element("service-ips", service_key("198.19.0.11", 17, 53), Some(goto_value("endpoint-3"))),
        ],
    };
    apply_both(&mut fresh, &mut fresh_cli, &ours, &theirs, &[again]);

    let delete = Transaction { table: ip_table(), operations: vec![Operation::DeleteTable] };
    apply_both(&mut netlink, &mut cli, &ours, &theirs, &[delete]);
    assert_eq!(ours.list(&ip_table()), "(no table)");
}

#[test]
fn an_interval_element_can_be_deleted() {
    if !svcplane_testbed::can_run_real_kernel_tests("an_interval_element_can_be_deleted") {
        return;
    }
    // nft 1.0.6 itself cannot delete a prefix from an interval set ("element does not
    // exist"), so this one is checked against the listing alone.
    let netns = NetNs::new("interval");
    let mut netlink = netns.netlink();
    let operations = vec![
        Operation::AddTable { comment: None },
        Operation::AddSet(Set { interval: true, ..set("node-ips", vec![DataType::Ipv4Addr], None) }),
        element("node-ips", vec![Value::Prefix(prefix("10.0.0.0/8"))], None),
        element("node-ips", vec![Value::Prefix(prefix("192.168.0.0/16"))], None),
        element("node-ips", vec![address("172.16.0.1")], None),
    ];
    netlink.apply(&Transaction { table: ip_table(), operations }).unwrap();
    let delete = vec![
        delete_element("node-ips", vec![Value::Prefix(prefix("10.0.0.0/8"))]),
        delete_element("node-ips", vec![address("172.16.0.1")]),
    ];
    netlink.apply(&Transaction { table: ip_table(), operations: delete.clone() }).unwrap();
    let listing = netns.list(&ip_table());
    assert!(listing.contains("elements = { 192.168.0.0/16 }"), "{listing}");
    let error = netlink.apply(&Transaction { table: ip_table(), operations: delete }).unwrap_err();
    assert!(matches!(error, NftError::NotFound { kind: svcplane_nft::ObjectKind::Element, .. }), "{error:?}");
}

#[test]
fn a_transaction_with_one_bad_operation_leaves_the_previous_ruleset_intact() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_transaction_with_one_bad_operation_leaves_the_previous_ruleset_intact",
    ) {
        return;
    }
    let netns = NetNs::new("atomic");
    let mut netlink = netns.netlink();
    netlink.apply(&every_addition_ipv4()).unwrap();
    let before = netns.list_raw(&ip_table());

    let mut operations = every_removal_ipv4().operations;
    operations.push(chain("svc-new"));
    operations.push(rule("svc-new", vec![Statement::Counter]));
    operations.push(Operation::DeleteChain("no-such-chain".into()));
    let error = netlink.apply(&Transaction { table: ip_table(), operations }).unwrap_err();

    assert!(matches!(&error, NftError::NotFound { name, .. } if name == "no-such-chain"), "{error}");
    assert_eq!(netns.list_raw(&ip_table()), before);
    // And the mechanism goes on from what it knew before the failure.
    netlink.apply(&every_removal_ipv4()).unwrap();
    netlink.apply(&later_changes_ipv4()).unwrap();
}

#[test]
fn a_failing_batch_of_forty_thousand_messages_reports_its_first_error() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_failing_batch_of_forty_thousand_messages_reports_its_first_error",
    ) {
        return;
    }
    // Without its table every message fails, and the errors overflow the receive buffer;
    // the first one still tells what went wrong.
    let netns = NetNs::new("overflow");
    let mut netlink = netns.netlink();
    let operations = cluster_sized(2_000, 10).operations.split_off(3);
    let error = netlink.apply(&Transaction { table: ip_table(), operations }).unwrap_err();
    assert!(matches!(&error, NftError::NotFound { kind: svcplane_nft::ObjectKind::Table, .. }), "{error:?}");
    assert_eq!(netns.list(&ip_table()), "(no table)");
    // The socket is still good for the next transaction.
    netlink.apply(&cluster_sized(10, 2)).unwrap();
}

#[test]
fn deleting_a_table_reports_whether_it_was_there() {
    if !svcplane_testbed::can_run_real_kernel_tests("deleting_a_table_reports_whether_it_was_there") {
        return;
    }
    let netns = NetNs::new("delete");
    let mut netlink = netns.netlink();
    assert!(!netlink.delete_table(&ip_table()).unwrap());
    netlink.apply(&Transaction { table: ip_table(), operations: vec![Operation::AddTable { comment: None }] }).unwrap();
    assert!(netlink.delete_table(&ip_table()).unwrap());
    assert!(!netlink.delete_table(&ip_table()).unwrap());
    assert_eq!(netns.list(&ip_table()), "(no table)");
}

#[test]
fn holds_element_finds_exactly_the_keys_the_kernel_holds_in_a_set() {
    if !svcplane_testbed::can_run_real_kernel_tests("holds_element_finds_exactly_the_keys_the_kernel_holds_in_a_set") {
        return;
    }
    let netns = NetNs::new("holds");
    let mut netlink = netns.netlink();
    let digests = set("digests", vec![DataType::Ipv6Addr], None);
    let ports = set("ports", vec![DataType::Ipv4Addr, DataType::InetProto, DataType::InetService], None);
    let element =
        |set: &str, key: Vec<Value>| svcplane_nft::Element { set: set.to_owned(), key, value: None, comment: None };
    let held = element("digests", vec![address("2001:db8::1")]);
    let other = element("digests", vec![address("2001:db8::2")]);
    let port = element("ports", vec![address("198.19.0.1"), Value::Protocol(6), Value::Port(80)]);
    assert_eq!(netlink.holds_element(&ip_table(), &digests, &held).unwrap(), Some(false), "no table yet");
    let operations = vec![
        Operation::AddTable { comment: None },
        Operation::AddSet(digests.clone()),
        Operation::AddSet(ports.clone()),
        Operation::AddElement(held.clone()),
        Operation::AddElement(port.clone()),
    ];
    netlink.apply(&Transaction { table: ip_table(), operations }).unwrap();
    assert_eq!(netlink.holds_element(&ip_table(), &digests, &held).unwrap(), Some(true));
    assert_eq!(netlink.holds_element(&ip_table(), &digests, &other).unwrap(), Some(false));
    assert_eq!(netlink.holds_element(&ip_table(), &ports, &port).unwrap(), Some(true));
    let absent = set("absent", vec![DataType::Ipv6Addr], None);
    assert_eq!(netlink.holds_element(&ip_table(), &absent, &held).unwrap(), Some(false), "no such set");
    // What another process wrote is read the same way by a socket that never wrote it.
    let mut fresh = netns.netlink();
    assert_eq!(fresh.holds_element(&ip_table(), &digests, &held).unwrap(), Some(true));
}

#[test]
fn a_missing_network_namespace_is_an_io_error() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_missing_network_namespace_is_an_io_error") {
        return;
    }
    let error = NftNetlink::in_network_namespace("svcp-nl-no-such-namespace").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
}

#[test]
fn netlink_and_nft_agree_on_good_and_bad_transactions() {
    if !svcplane_testbed::can_run_real_kernel_tests("netlink_and_nft_agree_on_good_and_bad_transactions") {
        return;
    }
    let ours = NetNs::new("agree");
    let theirs = NetNs::new("agree-cli");
    let base = Transaction { table: ip_table(), operations: agreement_base() };
    let mut mismatches = Vec::new();
    for (index, (sentence, operations, expected)) in agreement_rows().into_iter().enumerate() {
        // Every other row with a mechanism that built the base itself; the others meet it
        // fresh and must ask the kernel what the sets are.
        let mut netlink = ours.netlink();
        let mut cli = theirs.cli();
        netlink.delete_table(&ip_table()).unwrap();
        cli.delete_table(&ip_table()).unwrap();
        netlink.apply(&base).unwrap();
        cli.apply(&base).unwrap();
        if index % 2 == 1 {
            netlink = ours.netlink();
        }
        let before = ours.list_raw(&ip_table());

        let transaction = Transaction { table: ip_table(), operations };
        let by_netlink = netlink.apply(&transaction);
        let by_cli = cli.apply(&transaction);
        let kind = |result: &Result<(), NftError>| result.as_ref().err().map(NftError::kind);
        if kind(&by_netlink) != expected || kind(&by_cli) != expected {
            mismatches.push(format!("{sentence}: expected {expected:?}, netlink {by_netlink:?}, nft -f {by_cli:?}"));
        } else if let (Err(ours), Err(theirs)) = (&by_netlink, &by_cli)
            && std::mem::discriminant(ours) != std::mem::discriminant(theirs)
        {
            mismatches.push(format!("{sentence}: netlink says {ours:?}, nft -f says {theirs:?}"));
        } else if let (Err(ours), Err(theirs)) = (&by_netlink, &by_cli)
            && format!("{ours}").split('"').nth(1) != format!("{theirs}").split('"').nth(1)
        {
            mismatches.push(format!("{sentence}: netlink names {ours}, nft -f names {theirs}"));
        }
        if expected.is_some() {
            assert_eq!(ours.list_raw(&ip_table()), before, "{sentence}: the kernel changed");
        }
        assert_same_table(&ours, &theirs, &ip_table(), sentence);
    }
    assert!(mismatches.is_empty(), "netlink and nft -f disagree:\n{}", mismatches.join("\n"));
}

/// A table shaped like the nftables backend's for `services` services of `endpoints`
/// endpoints each: base maps and hook chains, one chain per service with a cascade of
/// `numgen random mod k == 0` DNAT rules, its `service-ips` element, and a hairpin element
/// per endpoint (as `render_full` writes them).
fn cluster_sized(services: u32, endpoints: u32) -> Transaction {
    let ipv4 = DataType::Ipv4Addr;
    let service_key_type = vec![ipv4, DataType::InetProto, DataType::InetService];
    let map = |name: &str, key: Vec<DataType>| Operation::AddSet(set(name, key, Some(vec![DataType::Verdict])));
    let mut operations = vec![
        Operation::AddTable { comment: None },
        Operation::DeleteTable,
        Operation::AddTable { comment: Some("rules for svcplane".into()) },
        map("service-ips", service_key_type.clone()),
        map("service-nodeports", vec![DataType::InetProto, DataType::InetService]),
        map("no-endpoint-services", service_key_type.clone()),
        map("firewall-ips", service_key_type),
        Operation::AddSet(set("hairpin-endpoints", vec![ipv4, ipv4], None)),
        Operation::AddSet(Set { interval: true, ..set("nodeport-addresses", vec![ipv4], None) }),
        element("nodeport-addresses", vec![Value::Prefix(prefix("192.168.0.0/16"))], None),
        chain("services"),
        chain("masquerading"),
        base_chain("nat-prerouting", ChainType::Nat, Hook::Prerouting, -100),
        base_chain("nat-output", ChainType::Nat, Hook::Output, -100),
        base_chain("nat-postrouting", ChainType::Nat, Hook::Postrouting, 100),
        rule("nat-prerouting", vec![jump("services")]),
        rule("nat-output", vec![jump("services")]),
        rule("nat-postrouting", vec![jump("masquerading")]),
        rule("services", vec![Statement::VerdictMap { keys: service_keys(), map: "service-ips".into() }]),
        rule(
            "services",
            vec![
                Statement::Match(Match::FibLocal { address: FibAddress::Destination, negate: false }),
                in_prefixes(Expr::DestinationAddress, true, &["127.0.0.0/8"]),
                in_set(vec![Expr::DestinationAddress], false, "nodeport-addresses"),
                Statement::VerdictMap {
                    keys: vec![Expr::L4Proto, Expr::DestinationPort],
                    map: "service-nodeports".into(),
                },
            ],
        ),
    ];
    operations.extend(masquerading_rules("hairpin-endpoints"));
    for service in 0..services {
        let name = service_chain(service);
        operations.push(chain(&name));
        operations.extend(endpoint_rules(&name, service, endpoints, 8080));
        let address = IpAddr::from((0xc613_0000 + service).to_be_bytes());
        operations.push(element(
            "service-ips",
            vec![Value::Address(address), Value::Protocol(6), Value::Port(80)],
            Some(goto_value(&name)),
        ));
        for endpoint in 0..endpoints {
            let address = Value::Address(endpoint_address(service, endpoint));
            operations.push(element("hairpin-endpoints", vec![address, address], None));
        }
    }
    Transaction { table: ip_table(), operations }
}

fn service_chain(service: u32) -> String {
    format!("service-{service:05}-default/web-{service}/tcp/http")
}

fn endpoint_address(service: u32, endpoint: u32) -> IpAddr {
    IpAddr::from((0x0a00_0000 + service * 16 + endpoint).to_be_bytes())
}

fn endpoint_rules(chain: &str, service: u32, endpoints: u32, port: u16) -> Vec<Operation> {
    (0..endpoints)
        .map(|endpoint| {
            let mut statements = Vec::new();
            if endpoints - endpoint > 1 {
                statements.push(compare(Expr::RandomModulo(endpoints - endpoint), CmpOp::Eq, Value::Integer(0)));
            }
            statements.push(tcp());
            statements.push(Statement::Dnat { address: endpoint_address(service, endpoint), port: Some(port) });
            rule(chain, statements)
        })
        .collect()
}

/// One endpoint of one service replaced: its chain rewritten, its hairpin element swapped.
fn one_service_change(service: u32, endpoints: u32) -> Transaction {
    let name = service_chain(service);
    let mut operations = vec![Operation::FlushChain(name.clone())];
    operations.extend(endpoint_rules(&name, service, endpoints, 8081));
    let old = Value::Address(endpoint_address(service, 0));
    let new = Value::Address(IpAddr::from((0x0aff_0000 + service).to_be_bytes()));
    operations.push(delete_element("hairpin-endpoints", vec![old, old]));
    operations.push(element("hairpin-endpoints", vec![new, new], None));
    Transaction { table: ip_table(), operations }
}

#[test]
fn a_cluster_sized_table_lists_as_through_nft() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_cluster_sized_table_lists_as_through_nft") {
        return;
    }
    let ours = NetNs::new("cluster");
    let theirs = NetNs::new("cluster-cli");
    let mut netlink = ours.netlink();
    let mut cli = theirs.cli();
    apply_both(&mut netlink, &mut cli, &ours, &theirs, &[cluster_sized(300, 10), one_service_change(7, 10)]);
}

/// Prints (does not assert) what a cold load of 10,000 services of 10 endpoints and a
/// one-service change cost through netlink and through `nft -f`.
#[test]
fn timings_at_ten_thousand_services() {
    if !svcplane_testbed::can_run_real_kernel_tests("timings_at_ten_thousand_services") {
        return;
    }
    let services = 10_000;
    let endpoints = 10;
    let full = cluster_sized(services, endpoints);
    let ours = NetNs::new("time");
    let mut netlink = ours.netlink();

    let start = Instant::now();
    netlink.apply(&full).unwrap();
    let cold = start.elapsed();
    let mut changes = Vec::new();
    for round in 0..5 {
        let start = Instant::now();
        netlink.apply(&one_service_change(services / 2 + round, endpoints)).unwrap();
        changes.push(start.elapsed());
    }
    let start = Instant::now();
    netlink.apply(&full).unwrap();
    let warm = start.elapsed();

    let theirs = NetNs::new("time-cli");
    let mut cli = theirs.cli();
    let start = Instant::now();
    cli.apply(&full).unwrap();
    let cli_cold = start.elapsed();
    let start = Instant::now();
    cli.apply(&one_service_change(services / 2, endpoints)).unwrap();
    let cli_change = start.elapsed();

    eprintln!(
        "{services} services x {endpoints} endpoints, {} operations, {} profile:\n\
         netlink: cold load {cold:?}, full reload over it {warm:?}, one-service change {changes:?}\n\
         nft -f:  cold load {cli_cold:?}, one-service change {cli_change:?}",
        full.operations.len(),
        if cfg!(debug_assertions) { "debug" } else { "release" },
    );
    let counts: BTreeMap<&str, usize> = [("chains", ours.list(&ip_table()).matches("\tchain ").count())].into();
    assert_eq!(counts["chains"], services as usize + 5);
}

/// Faults queued by the test, one taken per transaction.
#[derive(Debug, Clone, Default)]
struct FaultQueue(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Fault>>>);

impl FaultQueue {
    fn push(&self, fault: Fault) {
        self.0.lock().unwrap().push_back(fault);
    }
}

impl FaultSource for FaultQueue {
    fn next_fault(&mut self) -> std::io::Result<Option<Fault>> {
        Ok(self.0.lock().unwrap().pop_front())
    }
}

#[test]
fn injected_faults_leave_each_transaction_whole_and_the_mechanism_recovers_on_a_fresh_socket() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "injected_faults_leave_each_transaction_whole_and_the_mechanism_recovers_on_a_fresh_socket",
    ) {
        return;
    }
    // The faulted namespace must always hold what a twin holds that got only the
    // transactions the kernel was told to apply, with no fault in the way.
    let faulted = NetNs::new("faults");
    let twin = NetNs::new("faults-twin");
    let queue = FaultQueue::default();
    let mut netlink = faulted.netlink().with_faults(Box::new(queue.clone()));
    let mut reference = twin.netlink();
    let table = ip_table();
    let apply_both = |netlink: &mut NftNetlink, reference: &mut NftNetlink, transaction: &Transaction| {
        netlink.apply(transaction).expect("a transaction with no fault queued applies");
        reference.apply(transaction).expect("the twin applies");
    };
    apply_both(&mut netlink, &mut reference, &every_addition_ipv4());
    assert_same_table(&faulted, &twin, &table, "before any fault");

    // Refused: the kernel aborts the batch at the injected message; nothing of it applied.
    queue.push(Fault::Refused);
    let error = netlink.apply(&every_removal_ipv4()).expect_err("the kernel refuses the batch");
    assert!(error.to_string().contains("svcplane-fault-injected"), "the error names the refused message: {error}");
    assert_same_table(&faulted, &twin, &table, "a refused transaction leaves the previous ruleset whole");

    // Socket closed: nothing is sent; the next transaction opens a fresh socket in the same
    // namespace and applies.
    queue.push(Fault::SocketClosed);
    let error = netlink.apply(&every_removal_ipv4()).expect_err("a closed socket sends nothing");
    assert_eq!(error.kind(), ErrorKind::Io, "{error}");
    assert_same_table(&faulted, &twin, &table, "nothing was sent on the closed socket");
    apply_both(&mut netlink, &mut reference, &every_removal_ipv4());
    assert_same_table(&faulted, &twin, &table, "the transaction after a closed socket");

    // Answers lost: the kernel applied the batch whole though the sender cannot know it;
    // the next transaction still works (a fresh socket: no stale answer taken for its own).
    queue.push(Fault::AnswersLost);
    let error = netlink.apply(&every_addition_ipv4()).expect_err("lost answers are an error");
    assert!(error.to_string().contains("ENOBUFS"), "{error}");
    reference.apply(&every_addition_ipv4()).expect("the twin applies");
    assert_same_table(&faulted, &twin, &table, "the batch whose answers were lost applied whole");
    apply_both(&mut netlink, &mut reference, &every_removal_ipv4());
    assert_same_table(&faulted, &twin, &table, "the transaction after lost answers");
    assert!(queue.0.lock().unwrap().is_empty(), "every queued fault was taken");
}
