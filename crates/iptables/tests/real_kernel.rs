//! The real iptables programs (legacy and nft variants, IPv4 and IPv6) against the fake,
//! each test in a network namespace of its own (needs root: without it these tests fail
//! rather than skip, because CI runs as root and a skip would hide a broken setup). Nothing
//! here runs iptables outside those namespaces.
//!
//! The point: what the fake accepts, refuses and prints is what the kernel does, so the
//! backend's fake-kernel tests and the tracer stand for the real thing.

use std::net::IpAddr;
use std::process::{Command as Process, Stdio};

use ipnet::IpNet;
use svcplane_iptables::{
    Arg, Command, CtState, FakeIptables, Family, Iptables, IptablesCli, LocalTest, MarkOp, Match, Probability,
    Protocol, Recent, RecentAction, RejectWith, RestoreTable, Rule, Table, Target, Variant, canonical, detect_variant,
    listed_rules, parse_save,
};

/// A network namespace that exists for one test and is removed when it ends, even by panic.
struct NetNs {
    name: String,
}

impl NetNs {
    fn new(test: &str) -> NetNs {
        let name = format!("svcp-ipt-{test}-{}", std::process::id());
        // A namespace of this name can only be left over from a crashed run of this test.
        let _ = Process::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        let output = Process::new("ip").args(["netns", "add", &name]).output().expect("run ip netns add");
        assert!(
            output.status.success(),
            "cannot create network namespace {name} (these tests need root): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        NetNs { name }
    }

    fn iptables(&self, variant: Variant) -> IptablesCli {
        IptablesCli::in_network_namespace(variant, &self.name)
    }

    fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name].map(str::to_owned).to_vec()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Process::new("ip").args(["netns", "del", &self.name]).status();
    }
}

const VARIANTS: [Variant; 2] = [Variant::Legacy, Variant::Nft];
const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

fn addresses(family: Family) -> (IpAddr, IpNet, std::net::SocketAddr) {
    match family {
        Family::V4 => {
            ("198.19.0.10".parse().unwrap(), "198.18.128.0/17".parse().unwrap(), "198.18.129.1:8080".parse().unwrap())
        }
        Family::V6 => (
            "2001:db8:f::10".parse().unwrap(),
            "2001:db8:1::/48".parse().unwrap(),
            "[2001:db8:1::1]:8080".parse().unwrap(),
        ),
    }
}

/// A nat input with every match and target svcplane writes, in kube-proxy's order.
fn nat_input(family: Family) -> RestoreTable {
    let (service_ip, cluster_cidr, endpoint) = addresses(family);
    let mut input = RestoreTable::new(Table::Nat);
    for chain in ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING", "KUBE-SVC-X", "KUBE-SEP-X"] {
        input.declare(chain);
    }
    input.append("KUBE-MARK-MASQ", Rule::new().target(Target::Mark(MarkOp::Or(0x4000))));
    input.append(
        "KUBE-POSTROUTING",
        Rule::new().matching(Match::Mark { negate: true, value: 0x4000, mask: 0x4000 }).target(Target::Return),
    );
    input.append("KUBE-POSTROUTING", Rule::new().target(Target::Mark(MarkOp::Xor(0x4000))));
    input.append(
        "KUBE-POSTROUTING",
        Rule::new()
            .comment("kubernetes service traffic requiring SNAT")
            .target(Target::Masquerade { random_fully: true }),
    );
    input.append(
        "KUBE-SERVICES",
        Rule::new()
            .comment("ns/svc:p cluster IP")
            .protocol(Protocol::Tcp)
            .destination(service_ip)
            .destination_port(80)
            .jump("KUBE-SVC-X"),
    );
    input.append(
        "KUBE-SERVICES",
        Rule::new()
            .comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
            .destination_is_local()
            .not_destination(family.loopback())
            .jump("KUBE-MARK-MASQ"),
    );
    input.append(
        "KUBE-SVC-X",
        Rule::new()
            .comment("ns/svc:p cluster IP")
            .protocol(Protocol::Tcp)
            .destination(service_ip)
            .destination_port(80)
            .not_source(cluster_cidr)
            .jump("KUBE-MARK-MASQ"),
    );
    input.append(
        "KUBE-SVC-X",
        Rule::new()
            .comment(format!("ns/svc:p -> {endpoint}"))
            .matching(Match::Recent(Recent {
                name: "KUBE-SEP-X".into(),
                action: RecentAction::Check { seconds: Some(10800), reap: true },
                mask: None,
            }))
            .jump("KUBE-SEP-X"),
    );
    for n in [3, 2, 7] {
        input.append(
            "KUBE-SVC-X",
            Rule::new()
                .comment(format!("ns/svc:p -> {endpoint}"))
                .matching(Match::Statistic(Probability::one_in(n)))
                .jump("KUBE-SEP-X"),
        );
    }
    input.append(
        "KUBE-SVC-X",
        Rule::new()
            .comment("route LOCAL traffic for ns/svc:p external destinations")
            .source_is_local()
            .jump("KUBE-SEP-X"),
    );
    input.append("KUBE-SEP-X", Rule::new().comment("ns/svc:p").source(endpoint.ip()).jump("KUBE-MARK-MASQ"));
    input.append(
        "KUBE-SEP-X",
        Rule::new()
            .comment("ns/svc:p")
            .matching(Match::Recent(Recent { name: "KUBE-SEP-X".into(), action: RecentAction::Set, mask: None }))
            .protocol(Protocol::Tcp)
            .target(Target::Dnat(endpoint)),
    );
    input.append("PREROUTING", Rule::new().comment("kubernetes service portals").jump("KUBE-SERVICES"));
    input.insert("OUTPUT", 1, Rule::new().comment("kubernetes service portals").jump("KUBE-SERVICES"));
    input.append("POSTROUTING", Rule::new().comment("kubernetes postrouting rules").jump("KUBE-POSTROUTING"));
    input
}

/// A filter input with the reject and drop rules svcplane writes.
fn filter_input(family: Family) -> RestoreTable {
    let (service_ip, _, _) = addresses(family);
    let mut input = RestoreTable::new(Table::Filter);
    for chain in ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"] {
        input.declare(chain);
    }
    for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
        input.append(
            "KUBE-SERVICES",
            Rule::new()
                .comment("ns/svc:p has no endpoints")
                .protocol(protocol)
                .destination(service_ip)
                .destination_port(80)
                .target(Target::Reject(None)),
        );
    }
    input.append(
        "KUBE-SERVICES",
        Rule::new()
            .protocol(Protocol::Tcp)
            .destination(service_ip)
            .destination_port(81)
            .target(Target::Reject(Some(RejectWith::TcpReset))),
    );
    let mut node_port = Rule::new().comment("ns/svc:p has no local endpoints");
    node_port.args.push(Arg::Match(Match::AddrType { source: None, destination: Some(LocalTest { negate: false }) }));
    input.append(
        "KUBE-EXTERNAL-SERVICES",
        node_port
            .not_destination(family.loopback())
            .protocol(Protocol::Udp)
            .destination_port(30090)
            .target(Target::Drop),
    );
    input.append(
        "INPUT",
        Rule::new()
            .matching(Match::Conntrack { negate: false, states: vec![CtState::Established, CtState::New] })
            .comment("kubernetes externally-visible service portals")
            .jump("KUBE-EXTERNAL-SERVICES"),
    );
    input.append("FORWARD", Rule::new().new_connections().comment("kubernetes service portals").jump("KUBE-SERVICES"));
    input
}

fn save_both(iptables: &impl Iptables, family: Family) -> String {
    [Table::Filter, Table::Nat].map(|table| canonical(&iptables.save(family, table).unwrap()).unwrap()).concat()
}

#[test]
fn iptables_save_prints_exactly_what_the_fake_prints_for_every_rule_svcplane_writes() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "iptables_save_prints_exactly_what_the_fake_prints_for_every_rule_svcplane_writes",
    ) {
        return;
    }
    for variant in VARIANTS {
        let ns = NetNs::new(&format!("save-{}", variant.name()));
        for family in FAMILIES {
            let mut real = ns.iptables(variant);
            let mut fake = FakeIptables::new();
            for input in [filter_input(family), nat_input(family)] {
                real.restore(family, &input)
                    .unwrap_or_else(|e| panic!("{variant:?} {family:?}: {e}\n{}", input.render()));
                fake.restore(family, &input).unwrap();
            }
            assert_eq!(save_both(&real, family), save_both(&fake, family), "{variant:?} {family:?}");
        }
    }
}

#[test]
fn what_iptables_save_prints_reads_back_as_the_same_rules() {
    if !svcplane_testbed::can_run_real_kernel_tests("what_iptables_save_prints_reads_back_as_the_same_rules") {
        return;
    }
    let ns = NetNs::new("readback");
    let mut real = ns.iptables(Variant::Nft);
    for family in FAMILIES {
        let input = nat_input(family);
        real.restore(family, &input).unwrap();
        let saved = parse_save(&real.save(family, Table::Nat).unwrap()).unwrap();
        let svc = saved.table(Table::Nat).unwrap().chain("KUBE-SVC-X").unwrap();
        let written: Vec<&Rule> = input
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::Append { chain, rule } if chain == "KUBE-SVC-X" => Some(rule),
                _ => None,
            })
            .collect();
        assert_eq!(svc.rules.len(), written.len());
        for (read, written) in svc.rules.iter().zip(written) {
            assert!(
                read.parse().unwrap().same_as(written, family),
                "{family:?}: {} vs {}",
                read.text,
                written.restore_args()
            );
        }
    }
}

/// Inputs both the kernel and the fake must refuse, each after a valid base.
fn refused_inputs(family: Family) -> Vec<(&'static str, RestoreTable)> {
    let (_, _, endpoint) = addresses(family);
    let mut cases = Vec::new();
    let mut input = RestoreTable::new(Table::Nat);
    input.declare("KUBE-SVC-Y");
    input.append("KUBE-SVC-Y", Rule::new().jump("KUBE-SEP-NOPE"));
    cases.push(("a jump to a chain that does not exist", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.delete("KUBE-SERVICES", Rule::new().comment("not there").jump("KUBE-SVC-X"));
    cases.push(("-D of a rule that is not there", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.delete_chain("KUBE-SVC-X");
    cases.push(("-X of a chain that is jumped to and not empty", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.declare("KUBE-SEP-X");
    input.delete_chain("KUBE-SEP-X");
    cases.push(("-X of an empty chain that is still jumped to", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.declare("KUBE-SVC-ABCDEFGHIJKLMNOPQRSTU");
    cases.push(("a chain name of 29 characters", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.append("POSTROUTING", Rule::new().jump("KUBE-SEP-X"));
    cases.push(("DNAT reachable from POSTROUTING", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.append("PREROUTING", Rule::new().target(Target::Dnat(endpoint)));
    cases.push(("DNAT to a port without a protocol", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.append("KUBE-SERVICES", Rule::new().target(Target::Reject(None)));
    cases.push(("REJECT in the nat table", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.insert("KUBE-SERVICES", 9, Rule::new().target(Target::Return));
    cases.push(("-I past the end of the chain", input));
    let mut input = RestoreTable::new(Table::Nat);
    input.append("KUBE-SVC-X", Rule::new().jump("KUBE-SVC-X"));
    cases.push(("a loop", input));
    let mut input = RestoreTable::new(Table::Filter);
    input.declare("KUBE-SERVICES");
    input.append(
        "KUBE-SERVICES",
        Rule::new().protocol(Protocol::Udp).target(Target::Reject(Some(RejectWith::TcpReset))),
    );
    cases.push(("a TCP reset for UDP", input));
    cases
}

#[test]
fn the_kernel_and_the_fake_refuse_the_same_inputs_and_apply_none_of_them() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "the_kernel_and_the_fake_refuse_the_same_inputs_and_apply_none_of_them",
    ) {
        return;
    }
    for variant in VARIANTS {
        let ns = NetNs::new(&format!("refuse-{}", variant.name()));
        for family in FAMILIES {
            let mut real = ns.iptables(variant);
            let mut fake = FakeIptables::new();
            real.restore(family, &nat_input(family)).unwrap();
            fake.restore(family, &nat_input(family)).unwrap();
            for (what, input) in refused_inputs(family) {
                let real_error = real.restore(family, &input).expect_err(&format!("{variant:?} {family:?}: {what}"));
                let fake_error = fake.restore(family, &input).expect_err(&format!("fake {family:?}: {what}"));
                assert!(real_error.line().is_some(), "{variant:?}: {what}: the error names a line: {real_error}");
                assert!(fake_error.line().is_some(), "fake: {what}");
                assert_eq!(save_both(&real, family), save_both(&fake, family), "{variant:?} {family:?}: {what}");
            }
        }
    }
}

#[test]
fn a_partial_input_edits_only_the_chains_it_names() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_partial_input_edits_only_the_chains_it_names") {
        return;
    }
    for variant in VARIANTS {
        let ns = NetNs::new(&format!("partial-{}", variant.name()));
        let family = Family::V4;
        let mut real = ns.iptables(variant);
        let mut fake = FakeIptables::new();
        let mut foreign = RestoreTable::new(Table::Nat);
        foreign.declare("DOCKER");
        foreign
            .append("DOCKER", Rule::new().arg(Arg::Other(vec!["-i".into(), "docker0".into()])).target(Target::Return));
        foreign.append("PREROUTING", Rule::new().destination_is_local().jump("DOCKER"));
        for iptables in [&mut real as &mut dyn Iptables, &mut fake] {
            iptables.restore(family, &foreign).unwrap();
            iptables.restore(family, &nat_input(family)).unwrap();
            let mut edit = RestoreTable::new(Table::Nat);
            edit.declare("KUBE-SEP-Z");
            edit.append("KUBE-SEP-Z", Rule::new().target(Target::Return));
            edit.delete(
                "KUBE-SERVICES",
                Rule::new()
                    .comment("ns/svc:p cluster IP")
                    .protocol(Protocol::Tcp)
                    .destination(addresses(family).0)
                    .destination_port(80)
                    .jump("KUBE-SVC-X"),
            );
            edit.insert(
                "KUBE-SERVICES",
                1,
                Rule::new().comment("new").protocol(Protocol::Udp).destination_port(53).jump("KUBE-SEP-Z"),
            );
            edit.declare("KUBE-SVC-X");
            edit.delete_chain("KUBE-SVC-X");
            iptables.restore(family, &edit).unwrap();
        }
        let real_text = save_both(&real, family);
        assert_eq!(real_text, save_both(&fake, family), "{variant:?}");
        assert!(real_text.contains("-A DOCKER -i docker0 -j RETURN"), "{real_text}");
        assert!(real_text.contains("-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER"), "{real_text}");
    }
}

#[test]
fn listing_a_chain_tells_a_missing_chain_from_an_empty_one() {
    if !svcplane_testbed::can_run_real_kernel_tests("listing_a_chain_tells_a_missing_chain_from_an_empty_one") {
        return;
    }
    for variant in VARIANTS {
        let ns = NetNs::new(&format!("list-{}", variant.name()));
        let mut real = ns.iptables(variant);
        let mut fake = FakeIptables::new();
        for family in FAMILIES {
            let mut input = RestoreTable::new(Table::Mangle);
            input.declare("KUBE-PROXY-CANARY");
            input.append("KUBE-PROXY-CANARY", Rule::new().comment("canary").target(Target::Return));
            real.restore(family, &input).unwrap();
            fake.restore(family, &input).unwrap();
            for iptables in [&real as &dyn Iptables, &fake] {
                let listed =
                    iptables.list_chain(family, Table::Mangle, "KUBE-PROXY-CANARY").unwrap().expect("it exists");
                let rules = listed_rules(&listed);
                assert_eq!(rules.len(), 1, "{listed}");
                assert!(
                    rules[0].parse().unwrap().same_as(&Rule::new().comment("canary").target(Target::Return), family)
                );
                assert_eq!(iptables.list_chain(family, Table::Mangle, "KUBE-NOPE").unwrap(), None, "{variant:?}");
            }
        }
    }
}

#[test]
fn auto_picks_the_variant_that_holds_rules_and_nft_on_an_empty_node() {
    if !svcplane_testbed::can_run_real_kernel_tests("auto_picks_the_variant_that_holds_rules_and_nft_on_an_empty_node")
    {
        return;
    }
    let ns = NetNs::new("detect");
    assert_eq!(detect_variant(&ns.prefix()).variant, Variant::Nft, "an empty node");
    let mut legacy = ns.iptables(Variant::Legacy);
    legacy.restore(Family::V4, &filter_input(Family::V4)).unwrap();
    let detection = detect_variant(&ns.prefix());
    assert_eq!(detection.variant, Variant::Legacy, "{}", detection.reason);

    let ns = NetNs::new("detect-hint");
    let mut nft = ns.iptables(Variant::Nft);
    let mut hint = RestoreTable::new(Table::Mangle);
    hint.declare("KUBE-IPTABLES-HINT");
    nft.restore(Family::V4, &hint).unwrap();
    legacy = ns.iptables(Variant::Legacy);
    legacy.restore(Family::V4, &filter_input(Family::V4)).unwrap();
    let detection = detect_variant(&ns.prefix());
    assert_eq!(detection.variant, Variant::Nft, "kubelet's hint wins over rule counts: {}", detection.reason);
}
