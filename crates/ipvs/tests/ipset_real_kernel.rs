//! ipset members written over nfnetlink against the real kernel's `ip_set` (the host kernel
//! has it, unlike `ip_vs`). Each test runs in a network namespace it creates and deletes; the
//! sets are created and read back with the `ipset` program inside it.

use svcplane_ipvs::ipset::{Entry, IpSets, MemberChange, Operation};
use svcplane_net::Protocol;
use svcplane_testbed::ScratchNamespace;

/// The test's namespace, with the `ipset` program and the set writer inside it.
struct Namespace(ScratchNamespace);

impl Namespace {
    fn create(test: &str) -> Self {
        Namespace(ScratchNamespace::create(&format!("ipset-{test}")))
    }

    fn ipset(&self, args: &[&str]) -> String {
        self.0.output("ipset", args)
    }

    /// The members of `set`, as `ipset save` lists them, sorted.
    fn members(&self, set: &str) -> Vec<String> {
        let mut members: Vec<String> = self
            .ipset(&["save", set])
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("add {set} ")).map(str::to_owned))
            .collect();
        members.sort();
        members
    }

    fn apply(&self, changes: &[MemberChange]) -> Result<(), svcplane_ipvs::IpvsError> {
        self.0.run(|| IpSets::new()?.apply(changes))
    }
}

fn change(set: &str, operation: Operation, entry: Entry) -> MemberChange {
    MemberChange { set: set.to_owned(), operation, entry }
}

fn ip_port(address: &str, protocol: Protocol, port: u16) -> Entry {
    Entry { address: Some(address.parse().unwrap()), protocol: Some(protocol), port: Some(port), ..Entry::default() }
}

fn ip_port_ip(address: &str, protocol: Protocol, port: u16, source: &str) -> Entry {
    Entry { address2: Some(source.parse().unwrap()), ..ip_port(address, protocol, port) }
}

fn ip_port_net(address: &str, protocol: Protocol, port: u16, net: &str, prefix: u8) -> Entry {
    Entry { address2: Some(net.parse().unwrap()), prefix2: Some(prefix), ..ip_port(address, protocol, port) }
}

fn net(address: &str, prefix: u8) -> Entry {
    Entry { address: Some(address.parse().unwrap()), prefix: Some(prefix), ..Entry::default() }
}

/// The set types IPVS mode uses, IPv4 and IPv6, as `ipset create` makes them.
const SETS: &[(&str, &[&str])] = &[
    ("KUBE-CLUSTER-IP", &["hash:ip,port", "family", "inet"]),
    ("KUBE-6-CLUSTER-IP", &["hash:ip,port", "family", "inet6"]),
    ("KUBE-LOOP-BACK", &["hash:ip,port,ip", "family", "inet"]),
    ("KUBE-6-LOOP-BACK", &["hash:ip,port,ip", "family", "inet6"]),
    ("KUBE-LB-SRC", &["hash:ip,port,net", "family", "inet"]),
    ("KUBE-LB-CIDR", &["hash:net", "family", "inet"]),
    ("KUBE-NODE-PORT-TCP", &["bitmap:port", "range", "0-65535"]),
];

fn create_sets(namespace: &Namespace) {
    for (name, options) in SETS {
        let mut args = vec!["create", name];
        args.extend_from_slice(options);
        namespace.ipset(&args);
    }
}

#[test]
fn members_of_every_set_type_ipvs_mode_uses_are_added_and_deleted_over_netlink() {
    let test = "members_of_every_set_type_ipvs_mode_uses_are_added_and_deleted_over_netlink";
    if !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    let namespace = Namespace::create("types");
    create_sets(&namespace);
    let added = [
        change("KUBE-CLUSTER-IP", Operation::Add, ip_port("198.19.0.10", Protocol::Tcp, 80)),
        change("KUBE-CLUSTER-IP", Operation::Add, ip_port("198.19.0.11", Protocol::Udp, 53)),
        change("KUBE-6-CLUSTER-IP", Operation::Add, ip_port("2001:db8:f::a", Protocol::Tcp, 80)),
        change("KUBE-LOOP-BACK", Operation::Add, ip_port_ip("198.18.1.2", Protocol::Tcp, 8080, "198.18.1.2")),
        change("KUBE-6-LOOP-BACK", Operation::Add, ip_port_ip("2001:db8:1::2", Protocol::Tcp, 8080, "2001:db8:1::2")),
        change("KUBE-LB-SRC", Operation::Add, ip_port_net("198.18.200.1", Protocol::Tcp, 80, "198.18.64.0", 18)),
        change("KUBE-LB-CIDR", Operation::Add, net("198.18.64.0", 18)),
        change("KUBE-NODE-PORT-TCP", Operation::Add, Entry { port: Some(30080), ..Entry::default() }),
    ];
    namespace.apply(&added).expect("adding a member to each set");
    assert_eq!(namespace.members("KUBE-CLUSTER-IP"), ["198.19.0.10,tcp:80", "198.19.0.11,udp:53"]);
    assert_eq!(namespace.members("KUBE-6-CLUSTER-IP"), ["2001:db8:f::a,tcp:80"]);
    assert_eq!(namespace.members("KUBE-LOOP-BACK"), ["198.18.1.2,tcp:8080,198.18.1.2"]);
    assert_eq!(namespace.members("KUBE-6-LOOP-BACK"), ["2001:db8:1::2,tcp:8080,2001:db8:1::2"]);
    assert_eq!(namespace.members("KUBE-LB-SRC"), ["198.18.200.1,tcp:80,198.18.64.0/18"]);
    assert_eq!(namespace.members("KUBE-LB-CIDR"), ["198.18.64.0/18"]);
    assert_eq!(namespace.members("KUBE-NODE-PORT-TCP"), ["30080"]);

    // Added again: no error (as `ipset -exist`), nothing doubled.
    namespace.apply(&added[..2]).expect("adding members that are there");
    assert_eq!(namespace.members("KUBE-CLUSTER-IP").len(), 2);

    let deleted: Vec<MemberChange> =
        added.iter().map(|added| MemberChange { operation: Operation::Delete, ..added.clone() }).collect();
    namespace.apply(&deleted).expect("deleting every member");
    for (set, _) in SETS {
        assert_eq!(namespace.members(set), Vec::<String>::new(), "{set} is empty again");
    }
    namespace.apply(&deleted[..1]).expect("deleting a member that is not there");
}

#[test]
fn a_batch_longer_than_one_send_reaches_the_kernel_whole() {
    let test = "a_batch_longer_than_one_send_reaches_the_kernel_whole";
    if !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    let namespace = Namespace::create("batch");
    create_sets(&namespace);
    let changes: Vec<MemberChange> = (0..300u16)
        .map(|k| {
            let address = format!("198.18.{}.{}", 1 + k / 200, 1 + k % 200);
            change("KUBE-LOOP-BACK", Operation::Add, ip_port_ip(&address, Protocol::Tcp, 8080, &address))
        })
        .collect();
    namespace.apply(&changes).expect("adding 300 members");
    assert_eq!(namespace.members("KUBE-LOOP-BACK").len(), 300);
}

#[test]
fn a_refused_member_is_named_with_its_set_and_the_members_before_it_stay() {
    let test = "a_refused_member_is_named_with_its_set_and_the_members_before_it_stay";
    if !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    let namespace = Namespace::create("refused");
    create_sets(&namespace);
    let error = namespace
        .apply(&[
            change("KUBE-CLUSTER-IP", Operation::Add, ip_port("198.19.0.10", Protocol::Tcp, 80)),
            change("KUBE-NO-SUCH-SET", Operation::Add, ip_port("198.19.0.11", Protocol::Tcp, 80)),
        ])
        .expect_err("a set that does not exist");
    let text = error.to_string();
    assert!(text.contains("adding 198.19.0.11,tcp:80 to ipset KUBE-NO-SUCH-SET: the set does not exist"), "{text}");
    assert_eq!(namespace.members("KUBE-CLUSTER-IP"), ["198.19.0.10,tcp:80"]);

    // An IPv6 member for an IPv4 set: the kernel refuses it, and the error says so.
    let error = namespace
        .apply(&[change("KUBE-CLUSTER-IP", Operation::Add, ip_port("2001:db8:f::a", Protocol::Tcp, 80))])
        .expect_err("a member of the other family");
    assert!(error.to_string().contains("to ipset KUBE-CLUSTER-IP"), "{error}");
}
