//! Real-kernel scenarios for `svcplane proxy --mode userspace`: real packets DNATed by real
//! nftables rules to the relay in the proxy process, which connects to the endpoints
//! (needs root; see `docs/lab.md`).
//!
//! Each test builds its own two-node lab with its own proxies, so tests run in parallel.
//! The shared scenario table lives in `scenarios/`; rows that need the client's source
//! address at the endpoint (or SCTP) are listed as not applicable with the reason.

mod scenarios;

use std::net::Ipv4Addr;
use std::time::Duration;

use scenarios::cluster::{Backend, Cluster, ECHO_SERVICE, POD_ON_THIS_NODE, ServiceSpec, THIS_NODE};
use scenarios::manifests::{CONVERSATION_PORT, ECHO_PORT, pod_ip};
use scenarios::net::Conversation;
use scenarios::{ALL_ECHO_PODS, Family, Protocol, eventually};

const USERSPACE: Backend = scenarios::backends::USERSPACE;

scenario_table_tests!(USERSPACE);
nftables_table_tests!(USERSPACE, "userspace");

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn sctp_rows_are_listed_as_not_applicable_with_the_reason() {
    // No lab needed: the relay speaks TCP and UDP only, so every SCTP row must say why it
    // does not run (an SCTP Service port is refused in the kernel instead).
    for row in scenarios::SCTP.iter().flat_map(scenarios::Scenario::each_family) {
        let reason = (USERSPACE.not_applicable)(&row);
        let Some(reason) = reason else { panic!("the SCTP row {} claims to apply to the relay", row.label()) };
        eprintln!("NOT APPLICABLE ({reason}): {}", row.label());
    }
}

/// The EndpointSlice (IPv4) of the selector-less `retry` Service: every endpoint at `port`.
fn retry_slice(suffix: &str, port: u16, pods: &[&str]) -> String {
    slice_of("retry", suffix, port, pods)
}

/// An EndpointSlice (IPv4) of the selector-less `service`: every endpoint at TCP `port`.
fn slice_of(service: &str, suffix: &str, port: u16, pods: &[&str]) -> String {
    protocol_slice_of(service, suffix, "TCP", port, pods)
}

/// An EndpointSlice (IPv4) of the selector-less `service`: every endpoint at `port` of
/// `protocol` (`TCP` or `UDP`; the port is named after it).
fn protocol_slice_of(service: &str, suffix: &str, protocol: &str, port: u16, pods: &[&str]) -> String {
    let port_name = protocol.to_lowercase();
    let mut text = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{suffix}\n  \
         namespace: default\n  labels:\n    kubernetes.io/service-name: {service}\naddressType: IPv4\nports:\n  \
         - name: {port_name}\n    protocol: {protocol}\n    port: {port}\nendpoints:\n"
    );
    for pod in pods {
        let node = if pod.starts_with("node1") { "node1" } else { "node2" };
        text.push_str(&format!(
            "  - addresses: [\"{}\"]\n    conditions:\n      ready: true\n    nodeName: {node}\n",
            pod_ip(pod, Family::V4)
        ));
    }
    text
}

#[test]
fn a_connect_to_a_dead_endpoint_is_retried_on_a_live_one_and_the_client_sees_no_error() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_connect_to_a_dead_endpoint_is_retried_on_a_live_one_and_the_client_sees_no_error",
    ) {
        return;
    }
    // One live endpoint (the echo server of node1-pod1) and two dead ones on port 8099:
    // node1-pod2 refuses (nothing listens: a reset), node2-pod2 drops the SYN (a rule in
    // its namespace: the connect times out).
    const DEAD_PORT: u16 = 8099;
    let retry = ServiceSpec {
        name: "retry",
        selector: &[],
        protocols: &[Protocol::Tcp],
        ..ServiceSpec::cluster_ip("retry", Ipv4Addr::new(198, 19, 0, 80))
    };
    let text = format!(
        "{}{}{}",
        retry.manifest(),
        retry_slice("live", ECHO_PORT, &["node1-pod1"]),
        retry_slice("dead", DEAD_PORT, &["node1-pod2", "node2-pod2"]),
    );
    let cluster = Cluster::builder(USERSPACE).manifest("retry.yaml", &text).start();
    let lab = cluster.lab();
    let blackhole = "add table ip blackhole; \
                     add chain ip blackhole input { type filter hook input priority 0; }; \
                     add rule ip blackhole input tcp dport 8099 drop";
    lab.exec_ok(lab.pod("node2-pod2").namespace_name(), &["nft", blackhole]).expect("the blackhole rule");
    let target = retry.cluster_ip_address(false).unwrap();
    let client = lab.pod(POD_ON_THIS_NODE).namespace_name();
    // Round robin starts each endpoint's turn within three connections; nine leave room.
    for sent in 1..=9 {
        let reply = lab
            .tcp_request(client, target, Duration::from_secs(3))
            .unwrap_or_else(|error| panic!("request {sent} to {target} failed: {error}\n{}", cluster.diagnostics()));
        assert_eq!(reply.server_name, "node1-pod1", "request {sent}: only the live endpoint can answer");
    }
    let failures = cluster.proxy_metric(THIS_NODE, "svcplane_userspace_connect_failures_total");
    assert!(
        failures >= Some(2.0),
        "both dead endpoints were tried (and failed) before the live one answered: {failures:?} connect failures"
    );
    let exhausted =
        cluster.proxy_metric(THIS_NODE, "svcplane_userspace_refused_total{reason=\"all_endpoints_failed\"}");
    assert_eq!(exhausted, Some(0.0), "no client was failed");
    cluster.teardown();
}

/// The relay's listeners on `node`'s primary IPv4 address, from `ss` (the health-check
/// servers listen on the wildcard address, so they are not among them).
fn relay_listener_ports(cluster: &Cluster, node: u16) -> Vec<u16> {
    let lab = cluster.lab();
    let listening = lab.exec_ok(lab.node(node).namespace_name(), &["ss", "-ltnH"]).expect("ss -ltn");
    let prefix = format!("{}:", lab.node(node).ips()[0]);
    let mut ports: Vec<u16> = listening
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3)?.strip_prefix(prefix.as_str())?.parse().ok())
        .collect();
    ports.sort_unstable();
    ports
}

#[test]
fn a_client_cannot_reach_a_relay_listener_except_through_a_service_address() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_client_cannot_reach_a_relay_listener_except_through_a_service_address",
    ) {
        return;
    }
    let cluster = Cluster::start(USERSPACE);
    let lab = cluster.lab();
    let ports = relay_listener_ports(&cluster, THIS_NODE);
    assert!(ports.len() >= 5, "the relay listens for the fixture's Services: {ports:?}");
    let node_ip = lab.node(THIS_NODE).ips()[0];
    let outside = lab.client(scenarios::manifests::CLIENT_OUTSIDE_RANGES).namespace_name().to_owned();
    // Through the Service the relay answers (so the listeners are live) ...
    let echo = cluster.service(ECHO_SERVICE).unwrap().cluster_ip_address(false).unwrap();
    lab.tcp_request(&outside, echo, PROBE_TIMEOUT).expect("the echo ClusterIP from outside, through the relay");
    // ... but straight at a listener, from outside, from a pod or from the node, nobody does.
    let senders = [outside, lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned()];
    for port in ports.iter().take(5) {
        for sender in &senders {
            let direct = std::net::SocketAddr::new(node_ip, *port);
            let probe = lab.tcp_request(sender, direct, Duration::from_millis(300));
            assert!(probe.is_err(), "{sender} reached the relay's listener {direct} directly: {probe:?}");
        }
    }
    cluster.teardown();
}

const USERSPACE_THREE_CONNECTIONS: Backend =
    Backend { proxy_args: &["--mode", "userspace", "--userspace-max-connections", "3"], ..USERSPACE };

/// A ClusterIP Service in front of the line servers (which keep a connection open until
/// the client closes it) of every echo pod.
const CONVERSATIONS: ServiceSpec = ServiceSpec {
    name: "conversations",
    protocols: &[Protocol::Tcp],
    target_port: CONVERSATION_PORT,
    ..ServiceSpec::cluster_ip("conversations", Ipv4Addr::new(198, 19, 0, 81))
};

/// A conversation through `target` from the pod on this node, proven by one answer.
fn converse(cluster: &Cluster, target: std::net::SocketAddr) -> Result<(Conversation, String), String> {
    let lab = cluster.lab();
    let namespace = lab.pod(POD_ON_THIS_NODE).namespace_name();
    let mut conversation =
        Conversation::open(lab, namespace, Protocol::Tcp, target, PROBE_TIMEOUT).map_err(|e| format!("{e:?}"))?;
    let reply = conversation.ask(PROBE_TIMEOUT).map_err(|e| format!("{e:?}"))?;
    Ok((conversation, reply.server_name))
}

#[test]
fn a_full_connection_table_refuses_a_new_client_at_once_and_counts_it() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_full_connection_table_refuses_a_new_client_at_once_and_counts_it",
    ) {
        return;
    }
    let cluster = Cluster::builder(USERSPACE_THREE_CONNECTIONS)
        .manifest("conversations.yaml", &CONVERSATIONS.manifest())
        .line_servers(Protocol::Tcp, CONVERSATION_PORT, ALL_ECHO_PODS)
        .start();
    let lab = cluster.lab();
    let target = CONVERSATIONS.cluster_ip_address(false).unwrap();
    let client = lab.pod(POD_ON_THIS_NODE).namespace_name();
    // Three conversations held open: the table of the port is full.
    let mut held: Vec<Conversation> = (0..3)
        .map(|n| {
            let opened = converse(&cluster, target);
            opened.unwrap_or_else(|error| panic!("conversation {n}: {error}\n{}", cluster.diagnostics())).0
        })
        .collect();

    // The fourth is refused at once: a reset, not a wait (the kernel completes the
    // handshake, so the reset may come before connect() returns, or at the first read).
    let started = std::time::Instant::now();
    let read = lab
        .run_in(client, || std::net::TcpStream::connect_timeout(&target, PROBE_TIMEOUT))
        .expect("the client's namespace")
        .and_then(|mut fourth| {
            fourth.set_read_timeout(Some(Duration::from_secs(5)))?;
            std::io::Write::write_all(&mut fourth, b"hello\n")?;
            std::io::Read::read(&mut fourth, &mut [0u8; 64])
        });
    let took = started.elapsed();
    assert!(
        matches!(&read, Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset),
        "the fourth client sees a reset: {read:?}"
    );
    assert!(took < Duration::from_secs(1), "refused at once, not after {took:?}");
    let refused = cluster.proxy_metric(THIS_NODE, "svcplane_userspace_refused_total{reason=\"max_connections\"}");
    assert!(refused >= Some(1.0), "the refusal is counted: {refused:?}");
    let log = cluster.proxy_log(THIS_NODE);
    assert!(log.contains("connection table of default/conversations") && log.contains("is full"), "and logged:\n{log}");
    // The held ones still talk.
    for conversation in &mut held {
        conversation.ask(PROBE_TIMEOUT).expect("a held conversation goes on");
    }

    // One held connection ends: a new client is served again.
    drop(held.pop());
    let served = eventually(Duration::from_secs(5), || converse(&cluster, target).ok());
    assert!(served.is_some(), "a slot came back when a connection ended\n{}", cluster.diagnostics());
    drop(held);
    cluster.teardown();
}

const USERSPACE_SHORT_GRACE: Backend =
    Backend { proxy_args: &["--mode", "userspace", "--userspace-removed-grace", "2"], ..USERSPACE };

/// The selector-less `moving` Service's EndpointSlice: `pod`'s line server.
fn moving_slice(pod: &str) -> String {
    let node = if pod.starts_with("node1") { "node1" } else { "node2" };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: moving\n  namespace: default\nspec:\n  \
         clusterIP: \"198.19.0.82\"\n  ports:\n    - name: tcp\n      protocol: TCP\n      port: 80\n      \
         targetPort: {CONVERSATION_PORT}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  \
         name: moving-v4\n  namespace: default\n  labels:\n    kubernetes.io/service-name: moving\n\
         addressType: IPv4\nports:\n  - name: tcp\n    protocol: TCP\n    port: {CONVERSATION_PORT}\nendpoints:\n  \
         - addresses: [\"{}\"]\n    conditions:\n      ready: true\n    nodeName: {node}\n",
        pod_ip(pod, Family::V4)
    )
}

#[test]
fn connections_to_a_removed_endpoint_go_on_for_the_grace_period_then_are_closed() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "connections_to_a_removed_endpoint_go_on_for_the_grace_period_then_are_closed",
    ) {
        return;
    }
    const GRACE: Duration = Duration::from_secs(2);
    let cluster = Cluster::builder(USERSPACE_SHORT_GRACE)
        .manifest("moving.yaml", &moving_slice("node1-pod1"))
        .line_servers(Protocol::Tcp, CONVERSATION_PORT, &["node1-pod1", "node2-pod2"])
        .start();
    let target = std::net::SocketAddr::new(Ipv4Addr::new(198, 19, 0, 82).into(), 80);
    let opened = eventually(Duration::from_secs(5), || converse(&cluster, target).ok());
    let Some(((mut old, first), _)) = opened else {
        panic!("the moving Service did not answer\n{}", cluster.diagnostics());
    };
    assert_eq!(first, "node1-pod1");

    // The endpoint is replaced (removed, not terminating).
    let changed = std::time::Instant::now();
    cluster.write_file("moving.yaml", &moving_slice("node2-pod2"));
    let moved =
        eventually(Duration::from_secs(5), || converse(&cluster, target).ok().filter(|(_, pod)| pod == "node2-pod2"));
    assert!(moved.is_some(), "new connections did not go to the new endpoint\n{}", cluster.diagnostics());
    // The removal reached the relay less than `changed.elapsed()` ago: if that is well
    // within the grace period, the old connection must still talk to the old endpoint.
    if changed.elapsed() < GRACE / 2 {
        let reply = old.ask(PROBE_TIMEOUT).expect("the old connection within the grace period");
        assert_eq!(reply.server_name, "node1-pod1");
    } else {
        eprintln!("the change took {:?} to reach the relay: the within-grace check is skipped", changed.elapsed());
    }
    // After it, the relay closes it.
    let closed = eventually(GRACE * 3, || old.ask(Duration::from_millis(300)).is_err().then_some(()));
    assert!(closed.is_some(), "the connection to the removed endpoint was still open {:?} after", GRACE * 3);
    let counted = cluster.proxy_metric(THIS_NODE, "svcplane_userspace_closed_removed_total");
    assert!(counted >= Some(1.0), "the close is counted: {counted:?}");
    cluster.teardown();
}

#[test]
fn a_client_that_ends_its_sending_still_gets_the_whole_answer_through_the_relay() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_client_that_ends_its_sending_still_gets_the_whole_answer_through_the_relay",
    ) {
        return;
    }
    // A server that answers only after the client's EOF: the byte count it read. Through
    // the relay that needs the half-close passed on (client EOF -> endpoint EOF) while the
    // other direction stays open for the answer and its own EOF.
    const PORT: u16 = 7070;
    const SENT: usize = 3 << 20;
    let counter = ServiceSpec {
        name: "counter",
        selector: &[],
        protocols: &[Protocol::Tcp],
        target_port: PORT,
        ..ServiceSpec::cluster_ip("counter", Ipv4Addr::new(198, 19, 0, 83))
    };
    let text = format!("{}{}", counter.manifest(), slice_of("counter", "v4", PORT, &["node1-pod1"]));
    let cluster = Cluster::builder(USERSPACE).manifest("counter.yaml", &text).start();
    let lab = cluster.lab();
    let listener = lab
        .run_in(lab.pod("node1-pod1").namespace_name(), || std::net::TcpListener::bind(("0.0.0.0", PORT)))
        .expect("the pod's namespace")
        .expect("binding the counting server");
    let server = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut stream, _) = listener.accept()?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut received = Vec::new();
        std::io::Read::read_to_end(&mut stream, &mut received)?;
        std::io::Write::write_all(&mut stream, format!("{}\n", received.len()).as_bytes())?;
        Ok(received.len())
    });
    let target = counter.cluster_ip_address(false).unwrap();
    let answer = lab
        .run_in(lab.pod(POD_ON_THIS_NODE).namespace_name(), || -> std::io::Result<String> {
            let mut stream = std::net::TcpStream::connect_timeout(&target, PROBE_TIMEOUT)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            std::io::Write::write_all(&mut stream, &vec![b'x'; SENT])?;
            stream.shutdown(std::net::Shutdown::Write)?;
            let mut answer = String::new();
            std::io::Read::read_to_string(&mut stream, &mut answer)?;
            Ok(answer)
        })
        .expect("the client's namespace");
    let served = server.join().expect("the counting server");
    assert_eq!(served.as_ref().ok(), Some(&SENT), "the endpoint read everything, then EOF: {served:?}");
    let answer = answer.unwrap_or_else(|error| panic!("the client's exchange: {error}\n{}", cluster.diagnostics()));
    assert_eq!(answer, format!("{SENT}\n"), "the answer sent after the client's EOF, then the endpoint's EOF");
    cluster.teardown();
}

/// The selector-less UDP `relayed-udp` Service and its EndpointSlice: the echo servers of `pods`.
fn relayed_udp(pods: &[&str]) -> String {
    let service = ServiceSpec {
        name: "relayed-udp",
        selector: &[],
        protocols: &[Protocol::Udp],
        target_port: ECHO_PORT,
        ..ServiceSpec::cluster_ip("relayed-udp", Ipv4Addr::new(198, 19, 0, 84))
    };
    format!("{}{}", service.manifest(), protocol_slice_of("relayed-udp", "v4", "UDP", ECHO_PORT, pods))
}

#[test]
fn a_relayed_udp_flow_keeps_its_conntrack_entry_when_another_endpoint_of_its_service_goes() {
    if !svcplane_testbed::can_run_real_kernel_tests(
        "a_relayed_udp_flow_keeps_its_conntrack_entry_when_another_endpoint_of_its_service_goes",
    ) {
        return;
    }
    // The kernel DNATs a UDP flow to the relay's listener, and the relay's answers get the
    // Service's address back from that conntrack entry. The stale-flow cleanup that follows
    // an endpoint's removal must leave it alone: the relay ends the session itself if its
    // endpoint went, and without the entry an answer already on its way reaches the client
    // from the listener's address, which the client's connected socket drops.
    const SOURCE_PORT: u16 = 20_411;
    let cluster =
        Cluster::builder(USERSPACE).manifest("relayed-udp.yaml", &relayed_udp(&["node1-pod1", "node2-pod2"])).start();
    let lab = cluster.lab();
    let client = lab.pod(POD_ON_THIS_NODE).namespace_name().to_owned();
    let target = std::net::SocketAddr::new(Ipv4Addr::new(198, 19, 0, 84).into(), 80);
    let source = Some(scenarios::net::unspecified(target, SOURCE_PORT));
    let ask = || scenarios::net::request(lab, &client, Protocol::Udp, target, source, PROBE_TIMEOUT);
    let first = eventually(Duration::from_secs(5), || ask().ok());
    let Some((first, _)) = first else { panic!("the relayed UDP Service did not answer\n{}", cluster.diagnostics()) };
    let entries = || {
        let output = lab
            .exec(lab.node(THIS_NODE).namespace_name(), &["conntrack", "-L", "-p", "udp", "--orig-port-src", "20411"])
            .expect("conntrack -L in the node");
        String::from_utf8_lossy(&output.stdout).lines().filter(|line| line.contains("dport=80")).count()
    };
    assert_eq!(entries(), 1, "the flow's entry, DNATed to the relay");

    // The other endpoint goes: the Service lost one, so the cleanup runs for its address.
    let other = if first.server_name == "node1-pod1" { "node2-pod2" } else { "node1-pod1" };
    let kept: Vec<&str> = ["node1-pod1", "node2-pod2"].into_iter().filter(|pod| *pod != other).collect();
    let syncs = || cluster.proxy_log(THIS_NODE).matches(" synced ").count();
    let before = syncs();
    cluster.write_file("relayed-udp.yaml", &relayed_udp(&kept));
    let synced = eventually(Duration::from_secs(5), || (syncs() > before).then_some(()));
    assert!(synced.is_some(), "the removal was synced\n{}", cluster.diagnostics());
    // The cleanup runs on its own thread right after the sync: give it time to act.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(entries(), 1, "the relayed flow's entry survived the cleanup\n{}", cluster.proxy_log(THIS_NODE));
    let again =
        ask().unwrap_or_else(|error| panic!("the open flow after the change: {error:?}\n{}", cluster.diagnostics()));
    assert_eq!(again.server_name, first.server_name, "the open flow stays with its serving endpoint");
    cluster.teardown();
}
