//! The IPVS mechanism against a real kernel's IPVS table. The host kernel has no `ip_vs`, so
//! the real test runs inside the guest kernel (`scripts/in-guest`, `docs/guest-kernel.md`):
//! a host-side test boots the guest once and re-runs this binary's ignored guest-side test
//! there. Inside the guest, everything happens in a network namespace the test creates and
//! deletes; addresses come from 198.18.0.0/15 and 2001:db8::/32.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use svcplane_ipvs::{Change, Destination, Ipvs, Service, ServiceEntry, ServiceKey, Timeouts, diff};
use svcplane_net::Protocol;
use svcplane_testbed::guest;

const HOST_TEST: &str = "the_ipvs_table_is_programmed_read_back_and_diffed_in_the_guest_kernel";
const GUEST_TESTS: &[&str] = &["ipvs_services_and_real_servers_round_trip_through_generic_netlink"];

/// Every scheduler `--ipvs-scheduler` accepts.
const SCHEDULERS: &[&str] = &["rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"];

#[test]
fn the_ipvs_table_is_programmed_read_back_and_diffed_in_the_guest_kernel() {
    if !guest::can_boot_guest(HOST_TEST) {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's own path");
    let run = guest::run_tests_in_guest(&exe, GUEST_TESTS, Duration::from_secs(300)).expect("running the guest batch");
    if let Err(failure) = run.check_tests_passed(GUEST_TESTS) {
        panic!("guest-kernel tests failed:\n{failure}");
    }
}

/// A network namespace made for the test and deleted on drop.
struct Namespace(String);

impl Namespace {
    fn create(name: &str) -> Self {
        let status = Command::new("ip").args(["netns", "add", name]).status().expect("running ip netns add");
        assert!(status.success(), "ip netns add {name}: {status}");
        let namespace = Namespace(name.to_owned());
        // The kernel refuses (EINVAL) an IPv4 real server whose address type it cannot
        // tell, which is every address while the namespace has no local routing table:
        // bringing up loopback makes one.
        let status =
            Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]).status().expect("running ip link");
        assert!(status.success(), "ip -n {name} link set lo up: {status}");
        namespace
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn entry(
    address: &str,
    protocol: Protocol,
    port: u16,
    scheduler: &str,
    persistence: u32,
    reals: &[(&str, u32)],
) -> ServiceEntry {
    let address: IpAddr = address.parse().expect("a test address");
    ServiceEntry {
        service: Service {
            key: ServiceKey::new(address, protocol, port),
            scheduler: scheduler.to_owned(),
            persistence_seconds: persistence,
        },
        destinations: reals
            .iter()
            .map(|(real, weight)| {
                let address: IpAddr = real.parse().expect("a test address");
                ((address, 8080), Destination { address, port: 8080, weight: *weight })
            })
            .collect::<BTreeMap<_, _>>(),
    }
}

fn sorted(mut table: Vec<ServiceEntry>) -> Vec<ServiceEntry> {
    table.sort_by_key(|entry| entry.service.key);
    table
}

#[test]
#[ignore = "needs the guest kernel (scripts/in-guest)"]
fn ipvs_services_and_real_servers_round_trip_through_generic_netlink() {
    let test = GUEST_TESTS[0];
    if !guest::guest_only(test, HOST_TEST) {
        return;
    }
    let mut modules = vec!["ip_vs".to_owned(), "sctp".to_owned()];
    modules.extend(SCHEDULERS.iter().map(|scheduler| format!("ip_vs_{scheduler}")));
    let modules: Vec<&str> = modules.iter().map(String::as_str).collect();
    guest::load_modules(&modules).expect("loading ip_vs, its schedulers and sctp");

    let namespace = Namespace::create("svcplane-ipvs-test");
    svcplane_testbed::namespace::run_in_namespace(&namespace.0, || {
        let mut ipvs = Ipvs::new().expect("the IPVS family in the test namespace");
        assert_eq!(
            ipvs.table().expect("listing a fresh namespace's table"),
            vec![],
            "a new namespace's table is empty"
        );

        let mut wanted = vec![
            entry("198.19.0.10", Protocol::Tcp, 80, "rr", 0, &[("198.18.2.2", 1), ("198.18.2.3", 1)]),
            entry("198.19.0.10", Protocol::Udp, 53, "rr", 0, &[("198.18.2.2", 1)]),
            entry("198.19.0.11", Protocol::Sctp, 80, "rr", 10800, &[("198.18.2.3", 1)]),
            entry("2001:db8:19::10", Protocol::Tcp, 80, "rr", 0, &[("2001:db8:18::2", 1)]),
        ];
        // Firewall-mark services of each family, one with the masquerade bit in its mark.
        for (family, mark, real) in [
            ("0.0.0.0", 0x0001_0000, "198.18.2.2"),
            ("0.0.0.0", 0x0001_4000, "198.18.2.3"),
            ("::", 0x0001_0000, "2001:db8:18::2"),
        ] {
            let mut marked = entry(real, Protocol::Tcp, 80, "rr", 0, &[(real, 1)]);
            marked.service.key = ServiceKey::for_fwmark(family.parse().unwrap(), mark);
            wanted.push(marked);
        }
        for (index, scheduler) in SCHEDULERS.iter().enumerate() {
            let port = 9000 + index as u16;
            wanted.push(entry("198.19.0.12", Protocol::Tcp, port, scheduler, 0, &[("198.18.2.2", 1)]));
        }
        let wanted = sorted(wanted);
        let changes = diff(&[], &wanted);
        ipvs.apply(&changes).expect("programming the table");
        let read = sorted(ipvs.table().expect("reading the table back"));
        assert_eq!(read, wanted, "the table reads back as programmed, schedulers, persistence and marks included");
        assert_eq!(read.iter().filter(|entry| entry.service.key.fwmark != 0).count(), 3, "{read:?}");
        assert_eq!(diff(&read, &wanted), vec![], "a sync of an unchanged table sends nothing");

        // One endpoint gone, one draining at weight 0, one service's scheduler changed.
        let mut next = wanted.clone();
        let web = next
            .iter_mut()
            .find(|e| {
                e.service.key.port == 80 && e.service.key.protocol == Protocol::Tcp && e.service.key.address.is_ipv4()
            })
            .unwrap();
        let gone: IpAddr = "198.18.2.3".parse().unwrap();
        web.destinations.remove(&(gone, 8080));
        let draining: IpAddr = "198.18.2.2".parse().unwrap();
        web.destinations.get_mut(&(draining, 8080)).unwrap().weight = 0;
        web.service.scheduler = "lc".to_owned();
        next.retain(|e| e.service.key.protocol != Protocol::Udp && e.service.key.fwmark != 0x0001_4000);
        let changes = diff(&read, &next);
        assert_eq!(
            changes.len(),
            5,
            "delete the UDP service and a firewall-mark one, update the scheduler, delete one real server, drain \
             another: {changes:?}"
        );
        assert!(matches!(changes[0], Change::DeleteService(_)));
        ipvs.apply(&changes).expect("applying the difference");
        assert_eq!(sorted(ipvs.table().expect("reading the table again")), next);

        ipvs.set_timeouts(Timeouts { tcp: 900, tcp_fin: 120, udp: 300 }).expect("setting the timeouts");

        // An error names the object: a second add of an existing service.
        let error = ipvs.apply(&[Change::AddService(next[0].service.clone())]).unwrap_err().to_string();
        assert!(error.contains("adding IPVS service") && error.contains("File exists"), "{error}");

        ipvs.apply(&diff(&next, &[])).expect("deleting everything");
        assert_eq!(ipvs.table().expect("reading the emptied table"), vec![]);

        // Several batches: 3 services x 100 real servers is 303 requests, more than
        // svcplane_ipvs::BATCH a send, and reads back whole.
        let reals: Vec<String> = (0..100).map(|k| format!("198.18.3.{}", k + 1)).collect();
        let reals: Vec<(&str, u32)> = reals.iter().map(|real| (real.as_str(), 1)).collect();
        let big = sorted((0..3).map(|k| entry("198.19.0.20", Protocol::Tcp, 80 + k, "rr", 0, &reals)).collect());
        let changes = diff(&[], &big);
        assert!(changes.len() > 2 * svcplane_ipvs::BATCH, "{} changes", changes.len());
        ipvs.apply(&changes).expect("programming 303 changes in batches");
        assert_eq!(sorted(ipvs.table().expect("reading the batched table back")), big);

        // A refusal inside a batch names that change, not the batch's first; the kernel
        // went on with the rest of the batch.
        let missing = entry("198.19.0.21", Protocol::Tcp, 80, "rr", 0, &[]);
        let fresh = entry("198.19.0.22", Protocol::Tcp, 80, "rr", 0, &[]);
        let stray = Destination { address: "198.18.3.200".parse().unwrap(), port: 8080, weight: 1 };
        let error = ipvs
            .apply(&[
                Change::AddDestination(big[0].service.key, stray),
                Change::AddDestination(missing.service.key, stray),
                Change::AddService(fresh.service.clone()),
            ])
            .unwrap_err()
            .to_string();
        assert!(
            error
                .starts_with("adding real server 198.18.3.200 port 8080 (weight 1) of IPVS service tcp 198.19.0.21:80"),
            "{error}"
        );
        let after = ipvs.table().expect("reading the table after the refusal");
        assert!(after.iter().any(|e| e.service.key == fresh.service.key), "the request after the refused one ran");
        let first = after.iter().find(|e| e.service.key == big[0].service.key).expect("the first batched service");
        assert!(first.destinations.contains_key(&(stray.address, 8080)), "the one before it ran");
        ipvs.apply(&diff(&after, &[])).expect("deleting everything again");
        assert_eq!(ipvs.table().expect("reading the emptied table"), vec![]);
    })
    .expect("entering the test namespace");
}
