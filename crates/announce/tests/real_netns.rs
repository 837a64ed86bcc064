//! The announcer in a real network namespace lab (one node, one external client on the LAN
//! bridge): the client resolves an announced address to the node's MAC by ARP and NDP,
//! a takeover announcement moves a stale neighbour entry at once, and a withdrawn address
//! is no longer answered. Skipped without root (a failure under CI's SVCPLANE_REQUIRE_ROOT).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use svcplane_announce::Announcer;
use svcplane_testbed::address_plan::{LAN_LOAD_BALANCER_V4, LAN_LOAD_BALANCER_V6};
use svcplane_testbed::{Lab, can_run_real_kernel_tests, run_in_namespace};

fn mac_of(lab: &Lab, namespace: &str, interface: &str) -> String {
    lab.exec_ok(namespace, &["cat", &format!("/sys/class/net/{interface}/address")]).unwrap().trim().to_owned()
}

/// The client's neighbour entry for `ip` (lladdr, state) after it sent one UDP datagram
/// there (which makes its kernel ask): `None` when nobody answered within a second.
fn resolve(lab: &Lab, client: &str, ip: IpAddr) -> Option<(String, String)> {
    let family = if ip.is_ipv6() { "-6" } else { "-4" };
    let _ = lab.exec(client, &["ip", family, "neigh", "flush", "to", &ip.to_string()]);
    run_in_namespace(client, || {
        let bind: IpAddr = if ip.is_ipv6() { "::".parse().unwrap() } else { "0.0.0.0".parse().unwrap() };
        let socket = std::net::UdpSocket::bind((bind, 0)).unwrap();
        let _ = socket.send_to(b"who has it?", (ip, 9));
    })
    .unwrap();
    let started = Instant::now();
    loop {
        let entry = neighbour(lab, client, ip);
        if entry.is_some() || started.elapsed() > Duration::from_secs(1) {
            return entry;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn neighbour(lab: &Lab, client: &str, ip: IpAddr) -> Option<(String, String)> {
    let family = if ip.is_ipv6() { "-6" } else { "-4" };
    let shown = lab.exec_ok(client, &["ip", family, "neigh", "show", "to", &ip.to_string(), "dev", "eth0"]).unwrap();
    let words: Vec<&str> = shown.split_whitespace().collect();
    let lladdr = words.iter().position(|w| *w == "lladdr").and_then(|i| words.get(i + 1))?;
    Some(((*lladdr).to_owned(), (*words.last()?).to_owned()))
}

#[test]
fn a_lan_client_resolves_announced_addresses_to_the_announcing_node_and_a_takeover_moves_its_cache() {
    if !can_run_real_kernel_tests("a_lan_client_resolves_announced_addresses_to_the_announcing_node") {
        return;
    }
    let lab = Lab::builder().nodes(1).pods_per_node(0).clients(1).build().expect("a lab");
    let node = lab.node(1).namespace_name().to_owned();
    let client = lab.client(1).namespace_name().to_owned();
    let node_mac = mac_of(&lab, &node, "eth0");
    let v4 = IpAddr::V4(LAN_LOAD_BALANCER_V4.network());
    let v6 = IpAddr::V6(LAN_LOAD_BALANCER_V6.network());
    let spare = IpAddr::V4(LAN_LOAD_BALANCER_V4.broadcast());

    let announcer = run_in_namespace(&node, || Announcer::start(&["eth0".to_owned()])).unwrap().expect("an announcer");
    // Before: nobody answers.
    assert_eq!(resolve(&lab, &client, v4).map(|n| n.0), None);

    announcer.set(BTreeSet::from([v4, v6]));
    for ip in [v4, v6] {
        let entry = resolve(&lab, &client, ip).unwrap_or_else(|| panic!("{ip} is not resolved"));
        assert_eq!(entry.0, node_mac, "{ip}: {entry:?}");
    }
    assert!(announcer.counters().arp_replies.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    assert!(announcer.counters().neighbor_advertisements.load(std::sync::atomic::Ordering::Relaxed) >= 1);

    // Takeover: the client holds a stale entry pointing elsewhere; the announcement fixes it
    // without the client asking.
    let elsewhere = "02:00:00:00:00:99";
    for ip in [spare, IpAddr::V6(LAN_LOAD_BALANCER_V6.broadcast())] {
        let family = if ip.is_ipv6() { "-6" } else { "-4" };
        lab.exec_ok(
            &client,
            &["ip", family, "neigh", "replace", &ip.to_string(), "lladdr", elsewhere, "dev", "eth0", "nud", "stale"],
        )
        .unwrap();
    }
    // Linux ignores a new lladdr within locktime (1 s) of the last update.
    std::thread::sleep(Duration::from_millis(1100));
    announcer.set(BTreeSet::from([v4, v6, spare, IpAddr::V6(LAN_LOAD_BALANCER_V6.broadcast())]));
    for ip in [spare, IpAddr::V6(LAN_LOAD_BALANCER_V6.broadcast())] {
        let started = Instant::now();
        loop {
            let entry = neighbour(&lab, &client, ip);
            if entry.as_ref().is_some_and(|e| e.0 == node_mac) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(3), "{ip}: the takeover did not move the entry: {entry:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // Withdrawn: no answer any more.
    announcer.set(BTreeSet::from([v6]));
    assert_eq!(resolve(&lab, &client, v4).map(|n| n.0), None, "a withdrawn address is still answered");
    assert_eq!(resolve(&lab, &client, v6).map(|n| n.0), Some(node_mac));
}
