//! Real-kernel tests of the lab itself. They need root and fail (not skip) without it.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use svcplane_testbed::address_plan::{POD_V4, POD_V6};
use svcplane_testbed::{EchoServer, Lab, LabError, ProbeErrorKind, wildcard_addrs};

const ECHO: &str = env!("CARGO_BIN_EXE_svcplane-testbed-echo");
const PORT: u16 = 8080;
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Two nodes, two pods on each, one external client, echo servers on port 8080.
fn standard_lab() -> Lab {
    let lab =
        Lab::builder().nodes(2).pods_per_node(2).clients(1).build().expect("building the lab (these tests need root)");
    lab.start_echo_in_all_pods(PORT, Path::new(ECHO)).expect("starting echo servers");
    lab
}

fn netns_list() -> String {
    let output = Command::new("ip").args(["netns", "list"]).output().expect("running ip netns list");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn has_namespace_with_prefix(prefix: &str) -> bool {
    netns_list().lines().any(|line| line.starts_with(&format!("{prefix}-")))
}

#[test]
fn a_pod_reaches_a_pod_on_another_node_over_ipv4_and_ipv6_and_is_seen_with_its_own_address() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_pod_reaches_a_pod_on_another_node_over_ipv4_and_ipv6_and_is_seen_with_its_own_address",
    ) {
        return;
    }
    let lab = standard_lab();
    let client = lab.pod("node1-pod1");
    let server = lab.pod("node2-pod2");
    for (client_ip, server_ip) in client.ips().into_iter().zip(server.ips()) {
        let reply = lab
            .tcp_request(client.namespace_name(), SocketAddr::new(server_ip, PORT), PROBE_TIMEOUT)
            .unwrap_or_else(|error| panic!("{} -> {server_ip}: {error}", client.name()));
        assert_eq!(reply.server_name, "node2-pod2");
        assert_eq!(reply.client_addr.ip(), client_ip);
    }
}

#[test]
fn pods_on_the_same_node_reach_each_other_and_themselves() {
    if !svcplane_testbed::can_run_real_kernel_tests("pods_on_the_same_node_reach_each_other_and_themselves") {
        return;
    }
    let lab = standard_lab();
    let a = lab.pod("node1-pod1");
    let b = lab.pod("node1-pod2");
    for (from, to) in [(a, b), (b, a), (a, a)] {
        for ip in to.ips() {
            let reply = lab
                .tcp_request(from.namespace_name(), SocketAddr::new(ip, PORT), PROBE_TIMEOUT)
                .unwrap_or_else(|error| panic!("{} -> {ip}: {error}", from.name()));
            assert_eq!(reply.server_name, to.name());
        }
    }
}

#[test]
fn an_external_client_reaches_a_pod_on_another_node_through_a_route_via_a_node() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "an_external_client_reaches_a_pod_on_another_node_through_a_route_via_a_node",
    ) {
        return;
    }
    let lab = standard_lab();
    lab.route_via(1, POD_V4.into(), 1).unwrap();
    lab.route_via(1, POD_V6.into(), 1).unwrap();
    let client = lab.client(1);
    let server = lab.pod("node2-pod1");
    for (client_ip, server_ip) in client.ips().into_iter().zip(server.ips()) {
        let reply = lab
            .tcp_request(client.namespace_name(), SocketAddr::new(server_ip, PORT), PROBE_TIMEOUT)
            .unwrap_or_else(|error| panic!("client1 -> {server_ip}: {error}"));
        assert_eq!(reply.server_name, "node2-pod1");
        assert_eq!(reply.client_addr.ip(), client_ip);
    }
    // The path goes through node 1, though the pod lives on node 2.
    let route = lab.exec_ok(client.namespace_name(), &["ip", "route", "get", &server.ip_v4().to_string()]).unwrap();
    assert!(route.contains(&format!("via {}", lab.node(1).ip_v4())), "{route}");
}

#[test]
fn curl_from_an_external_client_gets_the_reply_line_as_the_http_body() {
    if !svcplane_testbed::can_run_real_kernel_tests("curl_from_an_external_client_gets_the_reply_line_as_the_http_body")
    {
        return;
    }
    let lab = standard_lab();
    lab.route_cluster_ranges_via(1, 2).unwrap();
    let client = lab.client(1);
    let pod = lab.pod("node1-pod2");
    for (ip, client_ip) in pod.ips().into_iter().zip(client.ips()) {
        let url = format!("http://{}/", SocketAddr::new(ip, PORT));
        let body = lab.exec_ok(client.namespace_name(), &["curl", "-sS", "-g", "--max-time", "3", &url]).unwrap();
        let (name, seen) = body.trim_end().split_once(' ').unwrap();
        assert_eq!(name, "node1-pod2", "{body}");
        assert_eq!(seen.parse::<SocketAddr>().unwrap().ip(), client_ip, "{body}");
    }
}

#[test]
fn a_udp_probe_gets_a_reply_that_shows_its_source_port() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_udp_probe_gets_a_reply_that_shows_its_source_port") {
        return;
    }
    let lab = standard_lab();
    let client = lab.pod("node2-pod1");
    let server = lab.pod("node1-pod1");
    for (source_port, (client_ip, server_ip)) in
        [40001, 40002].into_iter().zip(client.ips().into_iter().zip(server.ips()))
    {
        let reply = lab
            .udp_request(client.namespace_name(), SocketAddr::new(server_ip, PORT), PROBE_TIMEOUT, Some(source_port))
            .unwrap_or_else(|error| panic!("udp -> {server_ip}: {error}"));
        assert_eq!(reply.server_name, "node1-pod1");
        assert_eq!(reply.client_addr, SocketAddr::new(client_ip, source_port));
    }
}

#[test]
fn a_probe_to_a_port_nobody_listens_on_is_refused_in_under_a_second() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_probe_to_a_port_nobody_listens_on_is_refused_in_under_a_second")
    {
        return;
    }
    let lab = standard_lab();
    let client = lab.pod("node1-pod1");
    let server = lab.pod("node2-pod1");
    for ip in server.ips() {
        let addr = SocketAddr::new(ip, 9);
        let started = Instant::now();
        let tcp = lab.tcp_request(client.namespace_name(), addr, Duration::from_secs(3)).unwrap_err();
        assert_eq!(tcp.kind(), ProbeErrorKind::Refused, "tcp {addr}: {tcp}");
        let udp = lab.udp_request(client.namespace_name(), addr, Duration::from_secs(3), None).unwrap_err();
        assert_eq!(udp.kind(), ProbeErrorKind::Refused, "udp {addr}: {udp}");
        assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    }
}

#[test]
fn a_probe_whose_packets_are_dropped_times_out_instead_of_being_refused() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_probe_whose_packets_are_dropped_times_out_instead_of_being_refused",
    ) {
        return;
    }
    let lab = standard_lab();
    let server = lab.pod("node2-pod2");
    lab.exec_ok(
        server.namespace_name(),
        &[
            "nft",
            "add table inet t; \
             add chain inet t input { type filter hook input priority 0; policy drop; }",
        ],
    )
    .unwrap();
    let client = lab.pod("node1-pod2");
    for ip in server.ips() {
        let addr = SocketAddr::new(ip, PORT);
        let timeout = Duration::from_millis(300);
        let tcp = lab.tcp_request(client.namespace_name(), addr, timeout).unwrap_err();
        assert!(tcp.is_timed_out(), "tcp {addr}: {tcp}");
        let udp = lab.udp_request(client.namespace_name(), addr, timeout, None).unwrap_err();
        assert!(udp.is_timed_out(), "udp {addr}: {udp}");
    }
}

#[test]
fn an_echo_server_bound_inside_a_pod_serves_raw_text_and_http_from_the_test_process() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "an_echo_server_bound_inside_a_pod_serves_raw_text_and_http_from_the_test_process",
    ) {
        return;
    }
    let lab = Lab::builder().nodes(1).pod(1, "inproc").build().unwrap();
    let pod = lab.pod("inproc");
    let server =
        lab.run_in(pod.namespace_name(), || EchoServer::bind("in-process", &wildcard_addrs(7000))).unwrap().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let serving = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || server.serve_until(Some(Duration::from_secs(20)), &stop))
    };
    for ip in pod.ips() {
        let reply = lab.tcp_request(pod.namespace_name(), SocketAddr::new(ip, 7000), PROBE_TIMEOUT).unwrap();
        assert_eq!(reply.server_name, "in-process");
        assert_eq!(reply.client_addr.ip(), ip);
    }
    let raw = lab
        .run_in(pod.namespace_name(), || {
            use std::io::{Read, Write};
            let mut stream = std::net::TcpStream::connect((pod.ip_v4(), 7000)).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            stream.write_all(b"hello\n").unwrap();
            let mut text = String::new();
            stream.read_to_string(&mut text).unwrap();
            text
        })
        .unwrap();
    assert!(raw.starts_with(&format!("in-process {}:", pod.ip_v4())), "{raw:?}");
    let http = lab
        .exec_ok(pod.namespace_name(), &["curl", "-sS", "-i", "--max-time", "3", "http://127.0.0.1:7000/x"])
        .unwrap();
    assert!(http.starts_with("HTTP/1.0 200 OK"), "{http}");
    assert!(http.contains("Connection: close"), "{http}");
    assert!(http.contains("\r\n\r\nin-process 127.0.0.1:"), "{http}");
    stop.store(true, Ordering::Relaxed);
    serving.join().unwrap().unwrap();
}

#[test]
fn an_external_client_has_no_default_route_and_no_route_outside_the_plan_can_be_added() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "an_external_client_has_no_default_route_and_no_route_outside_the_plan_can_be_added",
    ) {
        return;
    }
    let lab = Lab::builder().nodes(1).clients(1).build().unwrap();
    let client = lab.client(1);
    for family in ["-4", "-6"] {
        let routes = lab.exec_ok(client.namespace_name(), &["ip", family, "route", "show"]).unwrap();
        assert!(!routes.contains("default"), "{routes}");
    }
    let outside = lab.route_via(1, "0.0.0.0/0".parse().unwrap(), 1);
    assert!(matches!(outside, Err(LabError::OutsideAddressPlan { .. })), "{outside:?}");
    let probe = lab.tcp_request(client.namespace_name(), "192.0.2.1:80".parse().unwrap(), PROBE_TIMEOUT);
    assert!(probe.is_err());
    let not_ours = lab.exec("not-a-lab-namespace", &["true"]);
    assert!(matches!(not_ours, Err(LabError::UnknownNamespace { .. })), "{not_ours:?}");
}

#[test]
fn no_namespace_of_a_dropped_lab_remains() {
    if !svcplane_testbed::can_run_real_kernel_tests("no_namespace_of_a_dropped_lab_remains") {
        return;
    }
    let lab = standard_lab();
    let prefix = lab.prefix().to_owned();
    assert!(has_namespace_with_prefix(&prefix));
    // Also a process the caller started and forgot about.
    let mut sleeper = lab.spawn(lab.node(1).namespace_name(), &["sleep", "600"]).unwrap();
    drop(lab);
    assert!(!has_namespace_with_prefix(&prefix), "{}", netns_list());
    let status = sleeper.wait().unwrap();
    assert!(!status.success(), "the sleeper was killed: {status}");
}

#[test]
fn a_panicking_test_still_removes_its_lab() {
    if !svcplane_testbed::can_run_real_kernel_tests("a_panicking_test_still_removes_its_lab") {
        return;
    }
    let prefix = std::sync::Mutex::new(String::new());
    let outcome = std::panic::catch_unwind(|| {
        let lab = Lab::builder().nodes(1).pods_per_node(1).build().unwrap();
        *prefix.lock().unwrap() = lab.prefix().to_owned();
        panic!("the test fails while the lab exists");
    });
    assert!(outcome.is_err());
    let prefix = prefix.into_inner().unwrap();
    assert!(!prefix.is_empty());
    assert!(!has_namespace_with_prefix(&prefix), "{}", netns_list());
}

#[test]
fn two_labs_exist_at_once_without_sharing_anything() {
    if !svcplane_testbed::can_run_real_kernel_tests("two_labs_exist_at_once_without_sharing_anything") {
        return;
    }
    let first = Lab::builder().nodes(1).pods_per_node(1).build().unwrap();
    let second = Lab::builder().nodes(1).pods_per_node(1).build().unwrap();
    assert_ne!(first.prefix(), second.prefix());
    // Same addresses in both labs, and each lab only sees its own pod.
    first.start_echo("node1-pod1", PORT, Path::new(ECHO)).unwrap();
    let pod = second.pod("node1-pod1");
    let addr = SocketAddr::new(IpAddr::V4(pod.ip_v4()), PORT);
    let error = second.tcp_request(pod.namespace_name(), addr, PROBE_TIMEOUT).unwrap_err();
    assert!(error.is_refused(), "{error}");
    let prefix = first.prefix().to_owned();
    first.teardown().unwrap();
    assert!(!has_namespace_with_prefix(&prefix));
    assert!(has_namespace_with_prefix(second.prefix()));
}

#[test]
fn a_lab_layout_outside_the_address_plan_is_refused_before_anything_is_created() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_lab_layout_outside_the_address_plan_is_refused_before_anything_is_created",
    ) {
        return;
    }
    for builder in [
        Lab::builder().nodes(0),
        Lab::builder().nodes(90),
        Lab::builder().nodes(1).pod(2, "nowhere"),
        Lab::builder().nodes(1).pod(1, "Upper"),
        Lab::builder().nodes(1).pods_per_node(1).pod(1, "node1-pod1"),
        Lab::builder().clients(120),
    ] {
        let result = builder.clone().build();
        assert!(matches!(result, Err(LabError::InvalidLayout { .. })), "{builder:?}: {result:?}");
    }
}
