//! IPVS mode's set writer against the real kernel's `ip_set` (the host kernel has it; the
//! IPVS parts of the mode run in the guest kernel, `guest_kernel.rs`). Each test runs in a
//! network namespace it creates and deletes, on a thread inside it.

use std::collections::BTreeMap;

use svcplane_backend_ipvs::ipset::{self, IpSet, IpsetCli, SetType};
use svcplane_core::{IpFamily, Protocol};
use svcplane_testbed::ScratchNamespace as Namespace;

fn hairpin(last: u8) -> String {
    let address = format!("198.18.1.{last}").parse().unwrap();
    ipset::ip_port_ip(address, Protocol::Tcp, 8080, address)
}

fn wanted(cluster: &[&str], hairpins: &[u8]) -> BTreeMap<String, IpSet> {
    let mut cluster_set = IpSet::new(SetType::HashIpPort, IpFamily::V4);
    cluster_set.members.extend(cluster.iter().map(ToString::to_string));
    let mut loop_back = IpSet::new(SetType::HashIpPortIp, IpFamily::V4);
    loop_back.members.extend(hairpins.iter().map(|last| hairpin(*last)));
    BTreeMap::from([("KUBE-CLUSTER-IP".to_owned(), cluster_set), ("KUBE-LOOP-BACK".to_owned(), loop_back)])
}

/// Syncs the namespace's sets to `wanted` as a sync does: read, diff, apply. Returns whether
/// the difference was members only (netlink) and the sets read back afterwards.
fn sync(namespace: &Namespace, writer: &mut IpsetCli, wanted: &BTreeMap<String, IpSet>) -> Result<bool, String> {
    namespace.run(|| {
        let current = writer.save()?;
        let changes = ipset::changes(&current, wanted, |name| name.starts_with("KUBE-"));
        let members_only = !changes.script.is_empty() && changes.members.len() == changes.script.len();
        writer.apply(&changes).map(|()| members_only)
    })
}

fn members(namespace: &Namespace, writer: &IpsetCli, set: &str) -> Vec<String> {
    let sets = namespace.run(|| writer.save()).expect("ipset save");
    sets.get(set).map(|set| set.members.iter().cloned().collect()).unwrap_or_default()
}

#[test]
fn an_endpoint_change_reaches_existing_sets_over_netlink_and_a_failed_one_puts_the_sets_back() {
    let test = "an_endpoint_change_reaches_existing_sets_over_netlink_and_a_failed_one_puts_the_sets_back";
    if !svcplane_testbed::can_run_real_kernel_tests(test) {
        return;
    }
    let namespace = Namespace::create("ipsets-sync");
    let mut writer = IpsetCli::default();

    let first = wanted(&["198.19.0.10,tcp:80"], &[2, 3]);
    assert!(!sync(&namespace, &mut writer, &first).expect("creating the sets"), "new sets go to ipset restore");

    let moved = wanted(&["198.19.0.10,tcp:80"], &[2, 4]);
    assert!(sync(&namespace, &mut writer, &moved).expect("moving an endpoint"), "members only: netlink");
    assert_eq!(members(&namespace, &writer, "KUBE-LOOP-BACK"), vec![hairpin(2), hairpin(4)]);

    // A set deleted behind the writer's back: the netlink change is refused, the error names
    // the member and the set, and the sets the change touched are as they were before it.
    namespace.output("ipset", &["destroy", "KUBE-CLUSTER-IP"]);
    let stale_view = namespace.run(|| {
        let mut current = writer.save().expect("ipset save");
        current.insert("KUBE-CLUSTER-IP".to_owned(), first["KUBE-CLUSTER-IP"].as_saved());
        current
    });
    let next = wanted(&["198.19.0.10,tcp:80", "198.19.0.11,tcp:80"], &[2, 5]);
    let changes = ipset::changes(&stale_view, &next, |name| name.starts_with("KUBE-"));
    assert_eq!(changes.members.len(), changes.script.len());
    let error = namespace.run(|| writer.apply(&changes)).expect_err("the cluster set is gone");
    assert!(error.contains("to ipset KUBE-CLUSTER-IP"), "{error}");
    assert!(error.contains("what the kernel took of this change was taken back"), "{error}");
    assert_eq!(
        members(&namespace, &writer, "KUBE-LOOP-BACK"),
        vec![hairpin(2), hairpin(4)],
        "the loop-back set's part of the failed change was undone"
    );

    // The next sync (which reads the kernel again) mends everything.
    assert!(!sync(&namespace, &mut writer, &next).expect("a sync after the failure"));
    assert_eq!(members(&namespace, &writer, "KUBE-CLUSTER-IP"), vec!["198.19.0.10,tcp:80", "198.19.0.11,tcp:80"]);
    assert_eq!(members(&namespace, &writer, "KUBE-LOOP-BACK"), vec![hairpin(2), hairpin(5)]);
}
