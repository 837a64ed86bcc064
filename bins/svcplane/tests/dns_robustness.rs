//! Bad input to `svcplane dns`: malformed packets, oversized names, unknown classes, types
//! and opcodes get the right response code (FORMERR, NOTIMP, REFUSED, BADVERS), garbage gets
//! nothing, and none of it stops the server. Broken manifests are reported naming the file,
//! the object and the field, and never stop the other Services from being served.

mod dns_support;

use std::time::Duration;

use dns_support::{DnsServer, TempDir, service, tcp_exchange, udp_exchange};
use svcplane_dns::hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use svcplane_dns::hickory_proto::rr::{DNSClass, Name, RecordType};

const WAIT: Duration = Duration::from_secs(2);

fn started() -> (TempDir, DnsServer) {
    let dir = TempDir::new("dns-robust");
    dir.write("web.yaml", &service("default", "web", "clusterIP: 10.96.0.10\nports: [{name: http, port: 80}]"));
    let server = DnsServer::start(dir.path(), &[]);
    server.wait_ready();
    (dir, server)
}

fn query_message(name: &str, query_type: RecordType) -> Message {
    let mut message = Message::query();
    message.metadata.id = 0xbeef;
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), query_type));
    message
}

fn rcode_over_udp(server: &DnsServer, packet: &[u8]) -> ResponseCode {
    let reply = udp_exchange(server.addr, packet, WAIT).expect("an answer over UDP");
    let message = Message::from_vec(&reply).expect("a parsable answer");
    assert_eq!(message.metadata.message_type, MessageType::Response);
    message.metadata.response_code
}

fn rcode_over_tcp(server: &DnsServer, packet: &[u8]) -> ResponseCode {
    let reply = tcp_exchange(server.addr, packet, WAIT).expect("an answer over TCP");
    Message::from_vec(&reply).expect("a parsable answer").metadata.response_code
}

/// The server still runs and still answers a good question.
fn assert_still_serving(server: &mut DnsServer) {
    assert!(server.is_running(), "the server exited:\n{}", server.log());
    let dig = server.dig(&["web.default.svc.cluster.local", "A"]);
    assert_eq!(dig.answers(), ["A 10.96.0.10"], "{}", dig.raw);
}

#[test]
fn a_malformed_packet_gets_formerr_over_udp_and_tcp() {
    let (_dir, mut server) = started();
    let mut packet = query_message("web.default.svc.cluster.local.", RecordType::A).to_vec().unwrap();
    // Cut the question in the middle of its name.
    packet.truncate(20);
    assert_eq!(rcode_over_udp(&server, &packet), ResponseCode::FormErr);
    assert_eq!(rcode_over_tcp(&server, &packet), ResponseCode::FormErr);
    assert_still_serving(&mut server);
}

#[test]
fn an_oversized_name_gets_formerr() {
    let (_dir, mut server) = started();
    let mut packet = query_message("web.default.svc.cluster.local.", RecordType::A).to_vec().unwrap();
    packet.truncate(12);
    // Five labels of 63 bytes: 320 bytes of name, over the 255-byte limit.
    for _ in 0..5 {
        packet.push(63);
        packet.extend(std::iter::repeat_n(b'a', 63));
    }
    packet.extend([0, 0, 1, 0, 1]);
    assert_eq!(rcode_over_udp(&server, &packet), ResponseCode::FormErr);
    // A label longer than 63 bytes is no label at all.
    let mut long_label = packet[..12].to_vec();
    long_label.push(64);
    long_label.extend(std::iter::repeat_n(b'a', 64));
    long_label.extend([0, 0, 1, 0, 1]);
    assert_eq!(rcode_over_udp(&server, &long_label), ResponseCode::FormErr);
    assert_still_serving(&mut server);
}

#[test]
fn unknown_and_other_classes_are_refused() {
    let (_dir, mut server) = started();
    for class in [DNSClass::CH, DNSClass::HS, DNSClass::NONE, DNSClass::Unknown(4242)] {
        let mut message = query_message("web.default.svc.cluster.local.", RecordType::A);
        message.queries[0].set_query_class(class);
        assert_eq!(rcode_over_udp(&server, &message.to_vec().unwrap()), ResponseCode::Refused, "{class:?}");
    }
    assert_still_serving(&mut server);
}

#[test]
fn unknown_types_are_nodata_meta_types_notimp_and_transfers_refused() {
    let (_dir, mut server) = started();
    let unknown = query_message("web.default.svc.cluster.local.", RecordType::from(65_280)).to_vec().unwrap();
    assert_eq!(rcode_over_udp(&server, &unknown), ResponseCode::NoError);
    let maila = query_message("web.default.svc.cluster.local.", RecordType::from(253)).to_vec().unwrap();
    assert_eq!(rcode_over_udp(&server, &maila), ResponseCode::NotImp);
    for transfer in [RecordType::AXFR, RecordType::IXFR] {
        let packet = query_message("cluster.local.", transfer).to_vec().unwrap();
        assert_eq!(rcode_over_udp(&server, &packet), ResponseCode::Refused, "{transfer} over UDP");
        assert_eq!(rcode_over_tcp(&server, &packet), ResponseCode::Refused, "{transfer} over TCP");
    }
    assert_still_serving(&mut server);
}

#[test]
fn opcodes_other_than_query_get_notimp() {
    let (_dir, mut server) = started();
    for op_code in [OpCode::Status, OpCode::Notify] {
        let mut message = query_message("cluster.local.", RecordType::SOA);
        message.metadata.op_code = op_code;
        assert_eq!(rcode_over_udp(&server, &message.to_vec().unwrap()), ResponseCode::NotImp, "{op_code:?}");
    }
    assert_still_serving(&mut server);
}

#[test]
fn zero_or_two_questions_get_formerr() {
    let (_dir, mut server) = started();
    let mut none = Message::query();
    none.metadata.id = 7;
    assert_eq!(rcode_over_udp(&server, &none.to_vec().unwrap()), ResponseCode::FormErr);
    let mut two = query_message("web.default.svc.cluster.local.", RecordType::A);
    two.add_query(Query::query(Name::from_ascii("cluster.local.").unwrap(), RecordType::SOA));
    assert_eq!(rcode_over_udp(&server, &two.to_vec().unwrap()), ResponseCode::FormErr);
    assert_still_serving(&mut server);
}

#[test]
fn an_edns_version_above_zero_gets_badvers() {
    let (_dir, mut server) = started();
    let mut message = query_message("web.default.svc.cluster.local.", RecordType::A);
    let mut edns = Edns::new();
    edns.set_version(1);
    message.set_edns(edns);
    // BADVERS and BADSIG share code 16; hickory reads it back as BADSIG.
    assert_eq!(u16::from(rcode_over_udp(&server, &message.to_vec().unwrap())), u16::from(ResponseCode::BADVERS));
    let dig = server.dig(&["+edns=1", "+noednsneg", "web.default.svc.cluster.local", "A"]);
    assert_eq!(dig.status, "BADVERS", "{}", dig.raw);
    assert_still_serving(&mut server);
}

#[test]
fn short_packets_and_responses_get_no_answer() {
    let (_dir, mut server) = started();
    assert_eq!(udp_exchange(server.addr, &[0x12, 0x34, 0x01], Duration::from_millis(300)), None);
    let mut response = query_message("web.default.svc.cluster.local.", RecordType::A);
    response.metadata.message_type = MessageType::Response;
    assert_eq!(udp_exchange(server.addr, &response.to_vec().unwrap(), Duration::from_millis(300)), None);
    assert_still_serving(&mut server);
}

#[test]
fn a_flood_of_random_packets_never_stops_the_server() {
    let (_dir, mut server) = started();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let valid = query_message("web.default.svc.cluster.local.", RecordType::A).to_vec().unwrap();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..3_000u64 {
        let mut packet = if i % 2 == 0 {
            let length = (next() % 300) as usize;
            (0..length).map(|_| next() as u8).collect::<Vec<u8>>()
        } else {
            // A valid query with a few bytes flipped.
            let mut packet = valid.clone();
            for _ in 0..3 {
                let at = (next() as usize) % packet.len();
                packet[at] = next() as u8;
            }
            packet
        };
        // Never a response bit to reflect.
        if packet.len() > 2 {
            packet[2] &= 0x7f;
        }
        let _ = socket.send_to(&packet, server.addr);
    }
    let mut garbage = [0u8; 40];
    for byte in &mut garbage {
        *byte = next() as u8;
    }
    let _ = tcp_exchange(server.addr, &garbage, Duration::from_millis(500));
    assert_still_serving(&mut server);
}

#[test]
fn a_broken_service_is_reported_by_file_object_and_field_and_the_others_are_served() {
    let dir = TempDir::new("dns-broken");
    dir.write("a-good.yaml", &service("default", "web", "clusterIP: 10.96.0.10\nports: [{name: http, port: 80}]"));
    dir.write("b-bad.yaml", &service("default", "ext", "type: ExternalName\nexternalName: \"not a name\""));
    dir.write("c-ports.yaml", &service("default", "api", "clusterIP: 10.96.0.11\nports: [{name: Bad_Name, port: 80}]"));
    dir.write("d-syntax.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [\n");
    let mut server = DnsServer::start(dir.path(), &[]);
    server.wait_ready();
    assert_still_serving(&mut server);
    // The Service with a bad port name keeps its address, without the SRV record.
    assert_eq!(server.dig(&["api.default.svc.cluster.local", "A"]).answers(), ["A 10.96.0.11"]);
    assert_eq!(server.dig(&["ext.default.svc.cluster.local", "CNAME"]).status, "NXDOMAIN");
    let log = server.log();
    let b_bad = dir.path().join("b-bad.yaml");
    let expected =
        format!(r#"{}:1: Service default/ext: spec.externalName: "not a name" is not a domain name"#, b_bad.display());
    assert!(log.contains(&expected), "expected {expected:?} in:\n{log}");
    assert!(log.contains(r#"Service default/api: spec.ports[0].name: "Bad_Name" is not a DNS label"#), "{log}");
    assert!(log.contains("d-syntax.yaml"), "{log}");
}

#[test]
fn a_question_asked_again_over_udp_gets_the_same_answer_under_its_own_id_and_a_change_shows_at_once() {
    let (dir, mut server) = started();
    let asked = |id: u16| {
        let mut message = query_message("web.default.svc.cluster.local.", RecordType::A);
        message.metadata.id = id;
        let reply = udp_exchange(server.addr, &message.to_vec().unwrap(), WAIT).expect("an answer over UDP");
        Message::from_vec(&reply).expect("a parsable answer")
    };
    let first = asked(0x1111);
    let second = asked(0x2222);
    assert_eq!((first.metadata.id, second.metadata.id), (0x1111, 0x2222));
    assert_eq!(first.answers, second.answers);
    assert_eq!(first.answers.len(), 1, "{first:?}");
    // The second answer came from the worker's cache or not: either way a new zone must not
    // answer with the old address.
    dir.write("web.yaml", &service("default", "web", "clusterIP: 10.96.0.11\nports: [{name: http, port: 80}]"));
    let (dig, _) = server.dig_until(&["web.default.svc.cluster.local", "A"], Duration::from_secs(10), |dig| {
        dig.answers() == ["A 10.96.0.11"]
    });
    assert_eq!(dig.answers(), ["A 10.96.0.11"], "{}", dig.raw);
    let third = asked(0x3333);
    assert_eq!(third.metadata.id, 0x3333);
    let addresses: Vec<String> = third.answers.iter().map(|record| record.data.to_string()).collect();
    assert_eq!(addresses, ["10.96.0.11"]);
    assert!(server.is_running(), "the server exited:\n{}", server.log());
}
