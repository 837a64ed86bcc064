//! The tc program on crafted frames (`BPF_PROG_TEST_RUN`, needs root to load BPF): no lab,
//! no interface; maps written by hand in a bpf root of the test's own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use svcplane_bpf::maps::{PROTO_TCP, PROTO_UDP};
use svcplane_bpf::tc::TcNat;
use svcplane_bpf::{BackendValue, MapSizes, Scope, ServiceFlags, ServiceKey, ServiceValue};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;
const NODE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
const POD: Ipv4Addr = Ipv4Addr::new(198, 18, 129, 1);
const CLUSTER_CIDR: &str = "198.18.128.0/17";
/// Where the fixture puts its one endpoint in the backends array (set 7, slot 0).
const SLOT: u32 = 7;

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let required = std::env::var_os("SVCPLANE_REQUIRE_ROOT").is_some_and(|value| value == "1");
    assert!(!required, "loading BPF programs needs root, and SVCPLANE_REQUIRE_ROOT=1");
    eprintln!("SKIPPED: loading BPF programs needs root");
    false
}

/// A tc program in a bpf root of its own with one frontend `frontend` -> `POD:8080`.
struct Fixture {
    tc: TcNat,
    root: tempfile::TempDir,
}

impl Fixture {
    fn new(frontend: SocketAddr, proto: u8, flags: u32, allowed: &[&str]) -> Self {
        Self::build(frontend, proto, flags, allowed, false, |_| ())
    }

    /// With direct server return on; the endpoint runs on another node.
    fn with_direct_server_return(frontend: SocketAddr, proto: u8, flags: u32) -> Self {
        Self::build(frontend, proto, flags, &[], true, |_| ())
    }

    /// `before_open` runs on the fresh bpf root before the tc object is opened there.
    fn build(
        frontend: SocketAddr,
        proto: u8,
        flags: u32,
        allowed: &[&str],
        dsr: bool,
        before_open: impl FnOnce(&std::path::Path),
    ) -> Self {
        let root = tempfile::tempdir().expect("a temporary directory");
        let bpf_root = root.path().join("bpf");
        svcplane_bpf::sys::ensure_bpffs(&bpf_root).expect("a bpffs");
        before_open(&bpf_root);
        let mut tc = TcNat::open(&bpf_root, MapSizes::default(), svcplane_bpf::maglev::DEFAULT_TABLE_SIZE)
            .expect("loading the tc program")
            .with_direct_server_return(dsr);
        tc.configure(&[IpAddr::V4(NODE)], &[CLUSTER_CIDR.parse().unwrap()]).expect("configuring");
        let (mut services, mut backends) =
            svcplane_bpf::sock_lb::open_pinned_services(&bpf_root).expect("the pinned maps");
        let backend = BackendValue::new(SocketAddr::new(IpAddr::V4(POD), 8080));
        backends.set(SLOT, backend, 0).expect("a backend");
        let key = ServiceKey::new(frontend, proto, Scope::External);
        let value = ServiceValue { backend_set: 7, count: 1, flags, affinity_timeout: 0, port_id: 0, first: SLOT };
        services.insert(key, value, 0).expect("a frontend");
        for range in allowed {
            tc.allow_source(&key, &range.parse().unwrap()).expect("a source range");
        }
        Self { tc, root }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = svcplane_bpf::cleanup(&self.root.path().join("bpf"));
    }
}

fn checksum(bytes: &[u8], initial: u32) -> u16 {
    let mut sum = initial;
    for chunk in bytes.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet + IPv4 + TCP SYN (or UDP datagram with 4 bytes of payload) frame, checksummed.
fn frame(src: SocketAddr, dst: SocketAddr, proto: u8) -> Vec<u8> {
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else { panic!("IPv4 frames only") };
    let l4_len: usize = if proto == PROTO_TCP { 20 } else { 12 };
    let mut f = vec![0u8; 14 + 20 + l4_len];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&s.octets());
    ip[16..20].copy_from_slice(&d.octets());
    let ip_sum = checksum(&f[14..34], 0);
    f[24..26].copy_from_slice(&ip_sum.to_be_bytes());
    let l4 = &mut f[34..];
    l4[0..2].copy_from_slice(&src.port().to_be_bytes());
    l4[2..4].copy_from_slice(&dst.port().to_be_bytes());
    if proto == PROTO_TCP {
        l4[4..8].copy_from_slice(&1000u32.to_be_bytes());
        l4[12] = 5 << 4;
        l4[13] = 0x02; // SYN
        l4[14..16].copy_from_slice(&65535u16.to_be_bytes());
    } else {
        l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        l4[8..12].copy_from_slice(b"ping");
    }
    let sum = l4_checksum(&f);
    let at = if proto == PROTO_TCP { 34 + 16 } else { 34 + 6 };
    f[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The TCP/UDP checksum a frame should carry (computed with the checksum field zeroed).
fn l4_checksum(f: &[u8]) -> u16 {
    let proto = f[23];
    let mut l4 = f[34..].to_vec();
    let at = if proto == PROTO_TCP { 16 } else { 6 };
    l4[at] = 0;
    l4[at + 1] = 0;
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&f[26..34]);
    pseudo.extend_from_slice(&[0, proto]);
    pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(&l4);
    checksum(&pseudo, 0)
}

fn addresses(f: &[u8]) -> (SocketAddr, SocketAddr) {
    let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]));
    let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    (SocketAddr::new(ip(26), port(34)), SocketAddr::new(ip(30), port(36)))
}

fn assert_checksums_valid(f: &[u8]) {
    assert_eq!(checksum(&f[14..34], 0), 0, "the IPv4 header checksum is valid");
    let at = if f[23] == PROTO_TCP { 34 + 16 } else { 34 + 6 };
    assert_eq!(u16::from_be_bytes([f[at], f[at + 1]]), l4_checksum(f), "the L4 checksum is valid");
}

fn socket(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(ip), port)
}

#[test]
fn a_new_flow_to_a_node_port_is_translated_to_the_endpoint_and_the_node_and_its_reply_back() {
    if !is_root() {
        return;
    }
    for proto in [PROTO_TCP, PROTO_UDP] {
        let node_port = socket(NODE, 30080);
        let mut fixture = Fixture::new(node_port, proto, ServiceFlags::MASQUERADE, &[]);
        let client = socket(CLIENT, 40000);
        let (_, out) = fixture.tc.test_run(&frame(client, node_port, proto)).expect("a test run");
        let (src, dst) = addresses(&out);
        assert_eq!(dst, socket(POD, 8080), "DNAT to the endpoint (proto {proto})");
        assert_eq!(src.ip(), IpAddr::V4(NODE), "SNAT to the node (proto {proto})");
        assert_checksums_valid(&out);

        let (_, back) = fixture.tc.test_run(&frame(dst, src, proto)).expect("a test run");
        let (reply_src, reply_dst) = addresses(&back);
        assert_eq!((reply_src, reply_dst), (node_port, client), "the reply comes from the NodePort (proto {proto})");
        assert_checksums_valid(&back);
    }
}

#[test]
fn a_flow_table_made_ahead_of_the_tc_object_is_the_one_it_tracks_masqueraded_flows_in() {
    if !is_root() {
        return;
    }
    let ct_id = |bpf_root: &std::path::Path| {
        svcplane_bpf::upgrade::pinned_map_id(&bpf_root.join(svcplane_bpf::tc::CT_MAP)).expect("the pinned flow table")
    };
    let mut made_ahead = None;
    let node_port = socket(NODE, 30080);
    let mut fixture = Fixture::build(node_port, PROTO_TCP, ServiceFlags::MASQUERADE, &[], false, |bpf_root| {
        let made = TcNat::create_flow_table_ahead(bpf_root, MapSizes::default()).expect("making the flow table");
        assert!(made, "a fresh root gets its flow table ahead");
        assert!(!TcNat::create_flow_table_ahead(bpf_root, MapSizes::default()).unwrap(), "made once");
        made_ahead = Some(ct_id(bpf_root));
    });
    let bpf_root = fixture.root.path().join("bpf");
    assert_eq!(Some(ct_id(&bpf_root)), made_ahead, "the tc object adopted the table made ahead");

    let client = socket(CLIENT, 40000);
    let (_, out) = fixture.tc.test_run(&frame(client, node_port, PROTO_TCP)).expect("a test run");
    let (src, dst) = addresses(&out);
    assert_eq!((src.ip(), dst), (IpAddr::V4(NODE), socket(POD, 8080)), "DNAT and SNAT");
    // The reply is translated back only through the entry the first packet left in the table.
    let (_, back) = fixture.tc.test_run(&frame(dst, src, PROTO_TCP)).expect("a test run");
    assert_eq!(addresses(&back), (node_port, client), "the reply comes from the NodePort");
}

#[test]
fn without_masquerade_the_client_keeps_its_address() {
    if !is_root() {
        return;
    }
    let lb = socket(Ipv4Addr::new(198, 18, 100, 1), 80);
    let mut fixture = Fixture::new(lb, PROTO_TCP, 0, &[]);
    let client = socket(CLIENT, 40001);
    let (_, out) = fixture.tc.test_run(&frame(client, lb, PROTO_TCP)).expect("a test run");
    assert_eq!(addresses(&out), (client, socket(POD, 8080)));
    assert_checksums_valid(&out);
}

#[test]
fn a_source_outside_the_load_balancer_source_ranges_is_dropped_and_one_inside_is_served() {
    if !is_root() {
        return;
    }
    let lb = socket(Ipv4Addr::new(198, 18, 100, 2), 80);
    let mut fixture = Fixture::new(lb, PROTO_TCP, ServiceFlags::SOURCE_RANGES, &["198.18.0.100/31"]);
    let (verdict, _) = fixture.tc.test_run(&frame(socket(CLIENT, 40002), lb, PROTO_TCP)).expect("a test run");
    assert_ne!(verdict, TC_ACT_SHOT, "198.18.0.101 is inside 198.18.0.100/31");
    let outside = socket(Ipv4Addr::new(198, 18, 0, 102), 40003);
    let (verdict, _) = fixture.tc.test_run(&frame(outside, lb, PROTO_TCP)).expect("a test run");
    assert_eq!(verdict, TC_ACT_SHOT, "198.18.0.102 is outside the ranges");
}

#[test]
fn a_packet_to_no_frontend_passes_untouched() {
    if !is_root() {
        return;
    }
    let mut fixture = Fixture::new(socket(NODE, 30080), PROTO_TCP, 0, &[]);
    let packet = frame(socket(CLIENT, 40004), socket(NODE, 22), PROTO_TCP);
    let (verdict, out) = fixture.tc.test_run(&packet).expect("a test run");
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(out, packet);
}

#[test]
fn a_service_without_endpoints_answers_a_syn_with_a_reset_and_a_datagram_with_port_unreachable() {
    if !is_root() {
        return;
    }
    const TC_ACT_REDIRECT: u32 = 7;
    let cluster_ip = socket(Ipv4Addr::new(198, 19, 0, 20), 80);
    let client = socket(CLIENT, 40005);
    let mut fixture = Fixture::new(cluster_ip, PROTO_TCP, ServiceFlags::REJECT, &[]);
    let (verdict, out) = fixture.tc.test_run(&frame(client, cluster_ip, PROTO_TCP)).expect("a test run");
    assert_eq!(verdict, TC_ACT_REDIRECT, "sent back out");
    assert_eq!(out.len(), 14 + 20 + 20, "a bare reset");
    assert_eq!(addresses(&out), (cluster_ip, client), "from the Service address to the client");
    assert_eq!(out[34 + 13] & 0x04, 0x04, "RST set");
    assert_eq!(u32::from_be_bytes(out[34 + 8..34 + 12].try_into().unwrap()), 1001, "acknowledges the SYN");
    assert_checksums_valid(&out);

    let mut fixture = Fixture::new(cluster_ip, PROTO_UDP, ServiceFlags::REJECT, &[]);
    let (verdict, out) = fixture.tc.test_run(&frame(client, cluster_ip, PROTO_UDP)).expect("a test run");
    assert_eq!(verdict, TC_ACT_REDIRECT, "sent back out");
    assert_eq!(out[23], 1, "an ICMP message");
    assert_eq!((out[34], out[35]), (3, 3), "destination unreachable, port unreachable");
    assert_eq!(&out[26..30], &[198, 19, 0, 20], "from the Service address");
    assert_eq!(checksum(&out[14..34], 0), 0, "the IPv4 header checksum is valid");
    assert_eq!(checksum(&out[34..], 0), 0, "the ICMP checksum is valid");
    assert_eq!(&out[42 + 16..42 + 20], &[198, 19, 0, 20], "it quotes the datagram it refuses");
}

/// The addresses and ports of an IPv4 frame whose header may carry options.
fn addresses_with_options(f: &[u8]) -> (SocketAddr, SocketAddr) {
    let l4 = 14 + usize::from(f[14] & 0x0f) * 4;
    let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(f[at], f[at + 1], f[at + 2], f[at + 3]));
    let port = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    (SocketAddr::new(ip(26), port(l4)), SocketAddr::new(ip(30), port(l4 + 2)))
}

#[test]
fn direct_server_return_sends_the_first_packet_with_the_service_address_and_the_endpoints_node_answers_from_it() {
    if !is_root() {
        return;
    }
    for proto in [PROTO_TCP, PROTO_UDP] {
        let node_port = socket(NODE, 30080);
        // The entry node: DNAT only, the client's address kept, the Service address in an
        // IPv4 option.
        let mut entry = Fixture::with_direct_server_return(node_port, proto, ServiceFlags::MASQUERADE);
        let client = socket(CLIENT, 40010);
        let original = frame(client, node_port, proto);
        let (verdict, out) = entry.tc.test_run(&original).expect("a test run");
        // Sent on by its route where one exists (the test run's namespace has none): never dropped.
        assert_ne!(verdict, TC_ACT_SHOT, "sent on (proto {proto})");
        assert_eq!(out[14] & 0x0f, 7, "the header grew by one 8-byte option (proto {proto})");
        assert_eq!(out.len(), original.len() + 8);
        assert_eq!(u16::from_be_bytes([out[16], out[17]]) as usize, out.len() - 14, "total length counts the option");
        assert_eq!(checksum(&out[14..42], 0), 0, "the IPv4 header checksum covers the option");
        assert_eq!(&out[34..38], &[0x9e, 8, 0x75, 0x80], "option type, length and the NodePort 30080");
        assert_eq!(&out[38..42], &NODE.octets(), "the Service address: the node's, for a NodePort");
        assert_eq!(addresses_with_options(&out), (client, socket(POD, 8080)), "DNAT only (proto {proto})");
        let mut stripped_view = out[..34].to_vec();
        stripped_view.extend_from_slice(&out[42..]);
        stripped_view[14] = 0x45;
        assert_eq!(
            l4_checksum(&stripped_view),
            {
                let at = if proto == PROTO_TCP { 34 + 16 } else { 34 + 6 };
                u16::from_be_bytes([stripped_view[at], stripped_view[at + 1]])
            },
            "the L4 checksum is valid for the translated addresses (proto {proto})"
        );

        // The endpoint's node: the option is taken off and the reply is remembered.
        let mut endpoint_node = Fixture::new(socket(Ipv4Addr::new(198, 19, 0, 99), 1), proto, 0, &[]);
        let (verdict, arrived) = endpoint_node.tc.test_run(&out).expect("a test run");
        assert_eq!(verdict, TC_ACT_OK, "delivered to the pod by the stack (proto {proto})");
        assert_eq!(arrived[14], 0x45, "no option left");
        assert_eq!(addresses(&arrived), (client, socket(POD, 8080)));
        assert_checksums_valid(&arrived);
        let (verdict, reply) = endpoint_node.tc.test_run(&frame(socket(POD, 8080), client, proto)).expect("a test run");
        assert_ne!(verdict, TC_ACT_SHOT, "the reply goes on (proto {proto})");
        assert_eq!(addresses(&reply), (node_port, client), "the reply comes from the NodePort (proto {proto})");
        assert_checksums_valid(&reply);
    }
}

#[test]
fn direct_server_return_leaves_flows_to_local_endpoints_untouched_but_for_the_dnat() {
    if !is_root() {
        return;
    }
    let node_port = socket(NODE, 30081);
    let mut fixture = Fixture::with_direct_server_return(node_port, PROTO_TCP, ServiceFlags::MASQUERADE);
    let local = BackendValue::with_locality(SocketAddr::new(IpAddr::V4(POD), 8080), true);
    let (_, mut backends) = svcplane_bpf::sock_lb::open_pinned_services(&fixture.root.path().join("bpf")).unwrap();
    backends.set(SLOT, local, 0).expect("the endpoint, local");
    let client = socket(CLIENT, 40011);
    let (_, out) = fixture.tc.test_run(&frame(client, node_port, PROTO_TCP)).expect("a test run");
    assert_eq!(out[14], 0x45, "no option for an endpoint on this node");
    assert_eq!(addresses(&out), (client, socket(POD, 8080)), "the client's address kept");
    assert_checksums_valid(&out);
}
