//! The answering function against a fixed cluster, organised by the sections of the
//! Kubernetes DNS specification (schema 1.1.0), then the CoreDNS behaviours clients rely on.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::*;
use crate::model::{ClusterView, DnsEndpoint, DnsPort, DnsService, EndpointSet, Protocol, ServiceKind};
use crate::names::reverse_name;
use crate::wire::{Transport, WireOutcome, respond_to_wire};
use crate::zone::{PodRecords, Zone, ZoneConfig};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn port(name: &str, protocol: Protocol, number: u16) -> DnsPort {
    DnsPort { name: name.to_owned(), protocol, port: number }
}

fn endpoint(address: &str, hostname: Option<&str>, ready: bool) -> DnsEndpoint {
    DnsEndpoint { ip: ip(address), hostname: hostname.map(str::to_owned), ready, node_name: None }
}

fn cluster_ip(namespace: &str, name: &str, ips: &[&str], ports: Vec<DnsPort>) -> DnsService {
    DnsService {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        kind: ServiceKind::ClusterIp { ips: ips.iter().map(|a| ip(a)).collect() },
        ports,
    }
}

fn headless(name: &str, sets: Vec<EndpointSet>, publish: bool, ports: Vec<DnsPort>) -> DnsService {
    DnsService {
        namespace: "default".to_owned(),
        name: name.to_owned(),
        kind: ServiceKind::Headless { endpoints: sets, publish_not_ready_addresses: publish },
        ports,
    }
}

fn external(name: &str, target: &str) -> DnsService {
    DnsService {
        namespace: "default".to_owned(),
        name: name.to_owned(),
        kind: ServiceKind::ExternalName { target: target.to_owned() },
        ports: vec![],
    }
}

fn view() -> ClusterView {
    let mysql = || vec![port("mysql", Protocol::Tcp, 3306)];
    ClusterView {
        namespaces: vec!["default".into(), "kube-system".into(), "quiet".into()],
        services: vec![
            cluster_ip(
                "default",
                "web",
                &["10.96.0.10"],
                vec![port("http", Protocol::Tcp, 80), port("dns", Protocol::Udp, 53)],
            ),
            cluster_ip("default", "dual", &["10.96.0.11", "fd00::11"], vec![port("http", Protocol::Tcp, 80)]),
            cluster_ip("default", "six", &["fd00::12"], vec![]),
            cluster_ip("default", "unnamed", &["10.96.0.13"], vec![port("", Protocol::Tcp, 80)]),
            cluster_ip("kube-system", "kube-dns", &["10.96.0.53"], vec![port("dns", Protocol::Udp, 53)]),
            headless(
                "db",
                vec![
                    EndpointSet {
                        ports: vec![port("mysql", Protocol::Tcp, 13306)],
                        endpoints: vec![
                            endpoint("10.0.0.1", Some("db-0"), true),
                            endpoint("10.0.0.2", None, true),
                            endpoint("10.0.0.3", Some("db-2"), false),
                        ],
                    },
                    EndpointSet {
                        ports: vec![port("mysql", Protocol::Tcp, 13306)],
                        endpoints: vec![endpoint("fd00:1::1", Some("db-0"), true)],
                    },
                ],
                false,
                mysql(),
            ),
            headless(
                "idle",
                vec![EndpointSet { ports: mysql(), endpoints: vec![endpoint("10.0.1.1", Some("idle-0"), false)] }],
                false,
                mysql(),
            ),
            headless(
                "eager",
                vec![EndpointSet { ports: mysql(), endpoints: vec![endpoint("10.0.2.1", Some("eager-0"), false)] }],
                true,
                mysql(),
            ),
            headless("nobody", vec![], false, mysql()),
            external("ext", "foo.example.com."),
            external("alias", "web.default.svc.cluster.local"),
        ],
    }
}

fn config() -> ZoneConfig {
    ZoneConfig::new("cluster.local").unwrap()
}

fn zone() -> Zone {
    Zone::build(Arc::new(config()), &view(), 7)
}

fn forwarding_zone() -> Zone {
    Zone::build(Arc::new(config().with_forwarding(true)), &view(), 7)
}

fn query(name: &str, query_type: RecordType) -> Query {
    Query::query(Name::from_ascii(name).unwrap(), query_type)
}

fn ask_zone(zone: &Zone, name: &str, query_type: RecordType) -> Outcome {
    answer(zone, &query(name, query_type))
}

fn ask(name: &str, query_type: RecordType) -> Reply {
    match ask_zone(&zone(), name, query_type) {
        Outcome::Reply(reply) => reply,
        other => panic!("{name} {query_type}: expected a reply, got {other:?}"),
    }
}

/// The answer section as `type data` strings, in order.
fn answers(reply: &Reply) -> Vec<String> {
    reply.answers.iter().map(describe).collect()
}

fn describe(record: &Record) -> String {
    format!("{} {}", record.record_type(), record.data)
}

fn assert_positive(reply: &Reply) {
    assert_eq!(reply.response_code, ResponseCode::NoError, "{reply:?}");
    assert!(reply.authoritative, "AA must be set: {reply:?}");
    assert!(!reply.answers.is_empty(), "expected answers: {reply:?}");
    assert!(reply.authorities.is_empty(), "a positive answer carries no SOA: {reply:?}");
}

/// NOERROR, no answers, the zone SOA (minimum = TTL) in the authority section.
fn assert_nodata(reply: &Reply) {
    assert_eq!(reply.response_code, ResponseCode::NoError, "{reply:?}");
    assert!(reply.authoritative);
    assert!(reply.answers.is_empty(), "NODATA has no answers: {reply:?}");
    assert_soa_in_authority(reply);
}

fn assert_nxdomain(reply: &Reply) {
    assert_eq!(reply.response_code, ResponseCode::NXDomain, "{reply:?}");
    assert!(reply.authoritative);
    assert!(reply.answers.is_empty());
    assert_soa_in_authority(reply);
}

fn assert_soa_in_authority(reply: &Reply) {
    let [soa] = reply.authorities.as_slice() else { panic!("expected exactly the SOA in authority: {reply:?}") };
    let RData::SOA(data) = &soa.data else { panic!("not an SOA: {soa:?}") };
    assert_eq!(soa.name.to_ascii(), "cluster.local.");
    assert_eq!(data.minimum, 5);
    assert_eq!(soa.ttl, 5);
}

fn error_of(outcome: Outcome) -> ResponseCode {
    let reply = outcome.into_reply().expect("a reply");
    assert!(reply.answers.is_empty());
    reply.response_code
}

mod spec_2_2_schema_version {
    use super::*;

    #[test]
    fn spec_2_2_dns_version_is_a_txt_record_saying_1_1_0_with_ttl_28800() {
        let reply = ask("dns-version.cluster.local.", RecordType::TXT);
        assert_positive(&reply);
        assert_eq!(answers(&reply), ["TXT 1.1.0"]);
        assert_eq!(reply.answers[0].ttl, 28_800);
    }

    #[test]
    fn spec_2_2_dns_version_asked_for_another_type_is_nodata() {
        assert_nodata(&ask("dns-version.cluster.local.", RecordType::A));
    }
}

mod spec_2_3_cluster_ip_services {
    use super::*;

    #[test]
    fn spec_2_3_1_a_record_for_cluster_ip_service() {
        let reply = ask("web.default.svc.cluster.local.", RecordType::A);
        assert_positive(&reply);
        assert_eq!(answers(&reply), ["A 10.96.0.10"]);
        assert_eq!(reply.answers[0].ttl, 5);
        assert_eq!(reply.answers[0].name.to_ascii(), "web.default.svc.cluster.local.");
    }

    #[test]
    fn spec_2_3_1_aaaa_of_an_ipv4_only_service_is_nodata_with_the_soa() {
        assert_nodata(&ask("web.default.svc.cluster.local.", RecordType::AAAA));
        assert_nodata(&ask("web.default.svc.cluster.local.", RecordType::TXT));
    }

    #[test]
    fn spec_2_3_1_aaaa_record_for_an_ipv6_service_and_a_is_nodata() {
        assert_eq!(answers(&ask("six.default.svc.cluster.local.", RecordType::AAAA)), ["AAAA fd00::12"]);
        assert_nodata(&ask("six.default.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn spec_2_3_1_dual_stack_service_answers_each_family_with_its_own_address() {
        assert_eq!(answers(&ask("dual.default.svc.cluster.local.", RecordType::A)), ["A 10.96.0.11"]);
        assert_eq!(answers(&ask("dual.default.svc.cluster.local.", RecordType::AAAA)), ["AAAA fd00::11"]);
    }

    #[test]
    fn spec_2_3_2_srv_record_for_a_named_port_gives_the_service_port_and_name() {
        let reply = ask("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
        assert_positive(&reply);
        assert_eq!(answers(&reply), ["SRV 0 100 80 web.default.svc.cluster.local."]);
        assert_eq!(reply.additionals.iter().map(describe).collect::<Vec<_>>(), ["A 10.96.0.10"]);
        let udp = ask("_dns._udp.web.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(answers(&udp), ["SRV 0 100 53 web.default.svc.cluster.local."]);
    }

    #[test]
    fn spec_2_3_2_a_named_port_under_the_wrong_protocol_or_an_unknown_name_is_nxdomain() {
        assert_nxdomain(&ask("_http._udp.web.default.svc.cluster.local.", RecordType::SRV));
        assert_nxdomain(&ask("_nope._tcp.web.default.svc.cluster.local.", RecordType::SRV));
        assert_nxdomain(&ask("_http._quic.web.default.svc.cluster.local.", RecordType::SRV));
        assert_nxdomain(&ask("http.tcp.web.default.svc.cluster.local.", RecordType::SRV));
    }

    #[test]
    fn spec_2_3_2_an_unnamed_port_has_no_srv_record() {
        assert_nodata(&ask("unnamed.default.svc.cluster.local.", RecordType::SRV));
        assert_nxdomain(&ask("_tcp.unnamed.default.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn spec_2_3_2_the_srv_name_asked_for_another_type_is_nodata() {
        assert_nodata(&ask("_http._tcp.web.default.svc.cluster.local.", RecordType::A));
        assert_nodata(&ask("_tcp.web.default.svc.cluster.local.", RecordType::SRV));
    }

    #[test]
    fn spec_2_3_3_ptr_record_for_an_ipv4_cluster_ip() {
        let reply = ask(&reverse_name(ip("10.96.0.10")), RecordType::PTR);
        assert_positive(&reply);
        assert_eq!(answers(&reply), ["PTR web.default.svc.cluster.local."]);
    }

    #[test]
    fn spec_2_3_3_ptr_record_for_an_ipv6_cluster_ip_under_ip6_arpa() {
        let name = reverse_name(ip("fd00::11"));
        assert!(name.ends_with(".ip6.arpa") && name.split('.').count() == 34, "{name}");
        assert_eq!(answers(&ask(&name, RecordType::PTR)), ["PTR dual.default.svc.cluster.local."]);
    }

    #[test]
    fn spec_2_3_3_a_known_address_asked_for_another_type_is_nodata_under_the_reverse_tree() {
        let reply = ask(&reverse_name(ip("10.96.0.10")), RecordType::A);
        assert_eq!(reply.response_code, ResponseCode::NoError);
        assert!(reply.answers.is_empty());
        assert_eq!(reply.authorities[0].name.to_ascii(), "in-addr.arpa.");
    }
}

mod spec_2_4_headless_services {
    use super::*;

    #[test]
    fn spec_2_4_1_headless_a_and_aaaa_list_the_ready_endpoints() {
        let reply = ask("db.default.svc.cluster.local.", RecordType::A);
        assert_positive(&reply);
        assert_eq!(answers(&reply), ["A 10.0.0.1", "A 10.0.0.2"]);
        assert_eq!(answers(&ask("db.default.svc.cluster.local.", RecordType::AAAA)), ["AAAA fd00:1::1"]);
    }

    #[test]
    fn spec_2_4_1_headless_without_ready_endpoints_is_nxdomain_for_every_type() {
        for name in ["idle.default.svc.cluster.local.", "nobody.default.svc.cluster.local."] {
            for query_type in [RecordType::A, RecordType::AAAA, RecordType::SRV, RecordType::TXT] {
                assert_nxdomain(&ask(name, query_type));
            }
        }
        assert_nxdomain(&ask("_mysql._tcp.idle.default.svc.cluster.local.", RecordType::SRV));
        assert_nxdomain(&ask("idle-0.idle.default.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn spec_2_4_1_publish_not_ready_addresses_publishes_endpoints_that_are_not_ready() {
        assert_eq!(answers(&ask("eager.default.svc.cluster.local.", RecordType::A)), ["A 10.0.2.1"]);
        assert_eq!(answers(&ask("eager-0.eager.default.svc.cluster.local.", RecordType::A)), ["A 10.0.2.1"]);
    }

    #[test]
    fn spec_2_4_1_an_endpoint_hostname_resolves_to_its_addresses_in_each_family() {
        assert_eq!(answers(&ask("db-0.db.default.svc.cluster.local.", RecordType::A)), ["A 10.0.0.1"]);
        assert_eq!(answers(&ask("db-0.db.default.svc.cluster.local.", RecordType::AAAA)), ["AAAA fd00:1::1"]);
    }

    #[test]
    fn spec_2_4_1_an_endpoint_without_hostname_is_named_by_its_dashed_address() {
        assert_eq!(answers(&ask("10-0-0-2.db.default.svc.cluster.local.", RecordType::A)), ["A 10.0.0.2"]);
        assert_nodata(&ask("10-0-0-2.db.default.svc.cluster.local.", RecordType::AAAA));
    }

    #[test]
    fn spec_2_4_1_unknown_and_not_ready_endpoint_names_are_nxdomain() {
        assert_nxdomain(&ask("db-9.db.default.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("db-2.db.default.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("10-0-0-1.db.default.svc.cluster.local.", RecordType::A));
        // Endpoint names exist only for headless Services.
        assert_nxdomain(&ask("10-96-0-10.web.default.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn spec_2_4_2_headless_srv_has_one_record_per_ready_endpoint_with_its_port_and_name() {
        let reply = ask("_mysql._tcp.db.default.svc.cluster.local.", RecordType::SRV);
        assert_positive(&reply);
        assert_eq!(
            answers(&reply),
            [
                "SRV 0 33 13306 db-0.db.default.svc.cluster.local.",
                "SRV 0 33 13306 10-0-0-2.db.default.svc.cluster.local.",
                "SRV 0 33 13306 db-0.db.default.svc.cluster.local.",
            ]
        );
        let mut glue: Vec<String> =
            reply.additionals.iter().map(|r| format!("{} {}", r.name, r.data)).collect::<Vec<_>>();
        glue.sort();
        assert_eq!(
            glue,
            [
                "10-0-0-2.db.default.svc.cluster.local. 10.0.0.2",
                "db-0.db.default.svc.cluster.local. 10.0.0.1",
                "db-0.db.default.svc.cluster.local. fd00:1::1",
            ]
        );
    }

    #[test]
    fn spec_2_4_3_ptr_of_an_endpoint_address_names_the_endpoint() {
        assert_eq!(
            answers(&ask(&reverse_name(ip("10.0.0.1")), RecordType::PTR)),
            ["PTR db-0.db.default.svc.cluster.local."]
        );
        assert_eq!(
            answers(&ask(&reverse_name(ip("10.0.0.2")), RecordType::PTR)),
            ["PTR 10-0-0-2.db.default.svc.cluster.local."]
        );
        assert_eq!(
            answers(&ask(&reverse_name(ip("fd00:1::1")), RecordType::PTR)),
            ["PTR db-0.db.default.svc.cluster.local."]
        );
    }

    #[test]
    fn spec_2_4_3_not_ready_endpoints_have_no_ptr() {
        let outcome = ask_zone(&zone(), &reverse_name(ip("10.0.0.3")), RecordType::PTR);
        assert_eq!(error_of(outcome), ResponseCode::Refused, "not ours, and no upstream to ask");
    }
}

mod spec_2_5_external_name {
    use super::*;

    #[test]
    fn spec_2_5_external_name_is_a_cname_to_the_target() {
        let reply = ask("ext.default.svc.cluster.local.", RecordType::CNAME);
        assert_positive(&reply);
        assert_eq!(answers(&reply), ["CNAME foo.example.com."]);
        assert_eq!(answers(&ask("ext.default.svc.cluster.local.", RecordType::A)), ["CNAME foo.example.com."]);
    }

    #[test]
    fn spec_2_5_with_upstreams_an_external_target_is_left_to_chase() {
        let outcome = ask_zone(&forwarding_zone(), "ext.default.svc.cluster.local.", RecordType::AAAA);
        let Outcome::Chase { reply, target, query_type } = outcome else { panic!("expected a chase: {outcome:?}") };
        assert_eq!(target.to_ascii(), "foo.example.com.");
        assert_eq!(query_type, RecordType::AAAA);
        assert_eq!(answers(&reply), ["CNAME foo.example.com."]);
    }

    #[test]
    fn spec_2_5_a_target_inside_the_zone_is_followed_in_the_same_answer() {
        let reply = ask("alias.default.svc.cluster.local.", RecordType::A);
        assert_eq!(answers(&reply), ["CNAME web.default.svc.cluster.local.", "A 10.96.0.10"]);
        assert_eq!(reply.answers[1].name.to_ascii(), "web.default.svc.cluster.local.");
    }

    #[test]
    fn spec_2_5_a_cname_loop_inside_the_zone_ends_after_a_bounded_chain() {
        let mut view = view();
        view.services.push(external("ping", "pong.default.svc.cluster.local"));
        view.services.push(external("pong", "ping.default.svc.cluster.local"));
        let zone = Zone::build(Arc::new(config()), &view, 1);
        let reply = ask_zone(&zone, "ping.default.svc.cluster.local.", RecordType::A).into_reply().unwrap();
        assert_eq!(reply.response_code, ResponseCode::NoError);
        assert!(reply.answers.len() <= 9, "{reply:?}");
        assert!(reply.answers.iter().all(|r| r.record_type() == RecordType::CNAME));
    }

    #[test]
    fn spec_2_5_srv_and_names_below_an_external_name_are_nodata_and_nxdomain() {
        assert_nodata(&ask("ext.default.svc.cluster.local.", RecordType::SRV));
        assert_nxdomain(&ask("x.ext.default.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("_http._tcp.ext.default.svc.cluster.local.", RecordType::SRV));
    }
}

mod coredns_behaviours {
    use super::*;

    #[test]
    fn names_compare_case_insensitively_and_answers_echo_the_question() {
        let reply = ask("WEB.Default.SVC.Cluster.Local.", RecordType::A);
        assert_eq!(answers(&reply), ["A 10.96.0.10"]);
        assert_eq!(reply.answers[0].name.to_ascii(), "WEB.Default.SVC.Cluster.Local.");
        assert_eq!(answers(&ask("_HTTP._TCP.web.default.svc.cluster.local.", RecordType::SRV)).len(), 1);
        assert_eq!(answers(&ask("DB-0.db.default.svc.cluster.local.", RecordType::A)), ["A 10.0.0.1"]);
    }

    #[test]
    fn a_missing_service_or_namespace_is_nxdomain_with_the_soa() {
        assert_nxdomain(&ask("nope.default.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("web.nope.svc.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("nope.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn empty_non_terminals_are_nodata() {
        for name in ["cluster.local.", "svc.cluster.local.", "pod.cluster.local.", "default.svc.cluster.local."] {
            assert_nodata(&ask(name, RecordType::A));
        }
        assert_nodata(&ask("quiet.svc.cluster.local.", RecordType::A));
    }

    #[test]
    fn out_of_shape_names_and_search_list_fall_through_are_nxdomain() {
        for name in [
            "foo.cluster.local.",
            "google.com.default.svc.cluster.local.",
            "kubernetes.default.default.svc.cluster.local.",
            "a.b.c.d.web.default.svc.cluster.local.",
            "*.default.svc.cluster.local.",
        ] {
            assert_nxdomain(&ask(name, RecordType::A));
        }
    }

    #[test]
    fn the_apex_has_an_soa_and_an_ns_with_glue_from_kube_dns() {
        let soa = ask("cluster.local.", RecordType::SOA);
        assert_positive(&soa);
        assert_eq!(answers(&soa), ["SOA ns.dns.cluster.local. hostmaster.cluster.local. 7 7200 1800 86400 5"]);
        let ns = ask("cluster.local.", RecordType::NS);
        assert_eq!(answers(&ns), ["NS ns.dns.cluster.local."]);
        assert_eq!(ns.additionals.iter().map(describe).collect::<Vec<_>>(), ["A 10.96.0.53"]);
        assert_eq!(answers(&ask("ns.dns.cluster.local.", RecordType::A)), ["A 10.96.0.53"]);
    }

    #[test]
    fn the_soa_minimum_and_record_ttls_follow_the_configured_ttl() {
        let zone = Zone::build(Arc::new(config().with_ttl(30).unwrap()), &view(), 1);
        let reply = ask_zone(&zone, "nope.default.svc.cluster.local.", RecordType::A).into_reply().unwrap();
        let RData::SOA(soa) = &reply.authorities[0].data else { panic!() };
        assert_eq!((soa.minimum, reply.authorities[0].ttl), (30, 30));
        let positive = ask_zone(&zone, "web.default.svc.cluster.local.", RecordType::A).into_reply().unwrap();
        assert_eq!(positive.answers[0].ttl, 30);
    }

    #[test]
    fn pods_insecure_answers_dashed_addresses_in_existing_namespaces() {
        assert_eq!(answers(&ask("10-244-1-5.default.pod.cluster.local.", RecordType::A)), ["A 10.244.1.5"]);
        assert_eq!(answers(&ask("fd00-1--5.default.pod.cluster.local.", RecordType::AAAA)), ["AAAA fd00:1::5"]);
        assert_nodata(&ask("10-244-1-5.default.pod.cluster.local.", RecordType::AAAA));
        assert_nxdomain(&ask("10-244-1-5.nope.pod.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("10-244-1-999.default.pod.cluster.local.", RecordType::A));
        assert_nxdomain(&ask("web.default.pod.cluster.local.", RecordType::A));
    }

    #[test]
    fn pods_disabled_answers_nxdomain_under_pod() {
        let zone = Zone::build(Arc::new(config().with_pod_records(PodRecords::Disabled)), &view(), 1);
        let reply = ask_zone(&zone, "10-244-1-5.default.pod.cluster.local.", RecordType::A).into_reply().unwrap();
        assert_nxdomain(&reply);
    }

    #[test]
    fn names_in_the_zone_answer_servfail_until_the_first_snapshot() {
        let pending = Zone::pending(Arc::new(config().with_forwarding(true)));
        for name in ["web.default.svc.cluster.local.", "cluster.local.", "1.0.96.10.in-addr.arpa."] {
            let outcome = ask_zone(&pending, name, RecordType::A);
            let reply = outcome.into_reply().unwrap();
            assert_eq!(reply.response_code, ResponseCode::ServFail, "{name}");
            assert!(!reply.authoritative);
        }
        assert_eq!(ask_zone(&pending, "example.com.", RecordType::A), Outcome::Forward);
    }

    #[test]
    fn zone_transfers_are_refused() {
        assert_eq!(error_of(ask_zone(&zone(), "cluster.local.", RecordType::AXFR)), ResponseCode::Refused);
        assert_eq!(error_of(ask_zone(&zone(), "cluster.local.", RecordType::IXFR)), ResponseCode::Refused);
    }

    #[test]
    fn names_outside_the_zone_are_forwarded_only_when_upstreams_exist() {
        assert_eq!(error_of(ask_zone(&zone(), "example.com.", RecordType::A)), ResponseCode::Refused);
        assert_eq!(ask_zone(&forwarding_zone(), "example.com.", RecordType::A), Outcome::Forward);
        assert_eq!(ask_zone(&forwarding_zone(), "local.", RecordType::A), Outcome::Forward);
        // Reverse names of addresses the cluster does not know go upstream too.
        assert_eq!(ask_zone(&forwarding_zone(), "8.8.8.8.in-addr.arpa.", RecordType::PTR), Outcome::Forward);
    }

    #[test]
    fn other_classes_are_refused_and_class_any_is_answered() {
        let mut chaos = query("web.default.svc.cluster.local.", RecordType::A);
        chaos.set_query_class(DNSClass::CH);
        assert_eq!(error_of(answer(&zone(), &chaos)), ResponseCode::Refused);
        let mut unknown = query("web.default.svc.cluster.local.", RecordType::A);
        unknown.set_query_class(DNSClass::Unknown(42));
        assert_eq!(error_of(answer(&zone(), &unknown)), ResponseCode::Refused);
        let mut any = query("web.default.svc.cluster.local.", RecordType::A);
        any.set_query_class(DNSClass::ANY);
        assert_eq!(answers(&answer(&zone(), &any).into_reply().unwrap()), ["A 10.96.0.10"]);
    }

    #[test]
    fn meta_types_get_formerr_or_notimp_and_unknown_types_nodata() {
        assert_eq!(
            error_of(ask_zone(&zone(), "web.default.svc.cluster.local.", RecordType::OPT)),
            ResponseCode::FormErr
        );
        let maila = RecordType::from(253);
        assert_eq!(error_of(ask_zone(&zone(), "web.default.svc.cluster.local.", maila)), ResponseCode::NotImp);
        assert_nodata(&ask("web.default.svc.cluster.local.", RecordType::from(65_280)));
        assert_nxdomain(&ask("nope.default.svc.cluster.local.", RecordType::from(65_280)));
    }

    #[test]
    fn any_returns_every_address_of_the_name() {
        assert_eq!(
            answers(&ask("dual.default.svc.cluster.local.", RecordType::ANY)),
            ["A 10.96.0.11", "AAAA fd00::11"]
        );
    }

    #[test]
    fn header_problems_get_notimp_formerr_and_badvers() {
        let zone = zone();
        let question = query("web.default.svc.cluster.local.", RecordType::A);
        let metadata = Metadata::new(1, MessageType::Query, OpCode::Query);
        let inquiry = |metadata, count, version| Inquiry {
            metadata,
            question_count: count,
            question: (count > 0).then_some(&question),
            edns_version: version,
        };
        let notify = Metadata::new(1, MessageType::Query, OpCode::Notify);
        assert_eq!(error_of(respond(&zone, &inquiry(&notify, 1, None))), ResponseCode::NotImp);
        assert_eq!(error_of(respond(&zone, &inquiry(&metadata, 0, None))), ResponseCode::FormErr);
        assert_eq!(error_of(respond(&zone, &inquiry(&metadata, 2, None))), ResponseCode::FormErr);
        assert_eq!(error_of(respond(&zone, &inquiry(&metadata, 1, Some(1)))), ResponseCode::BADVERS);
        let response = Metadata::new(1, MessageType::Response, OpCode::Query);
        assert_eq!(respond(&zone, &inquiry(&response, 1, None)), Outcome::Drop);
        assert!(matches!(respond(&zone, &inquiry(&metadata, 1, Some(0))), Outcome::Reply(_)));
    }
}

mod wire {
    use super::*;
    use proptest::prelude::*;

    fn packet(name: &str, query_type: RecordType, edns: Option<u16>) -> Vec<u8> {
        packet_for(Name::from_ascii(name).unwrap(), query_type, edns)
    }

    fn packet_for(name: Name, query_type: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut message = Message::query();
        message.metadata.id = 0x1234;
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(name, query_type));
        if let Some(payload) = edns {
            let mut opt = Edns::new();
            opt.set_max_payload(payload);
            message.set_edns(opt);
        }
        message.to_vec().unwrap()
    }

    fn sent(outcome: WireOutcome) -> Message {
        let WireOutcome::Send(bytes) = outcome else { panic!("expected bytes, got {outcome:?}") };
        Message::from_vec(&bytes).unwrap()
    }

    fn big_zone() -> Zone {
        let endpoints = (0..100).map(|i| endpoint(&format!("10.1.{}.{}", i / 250, i % 250 + 1), None, true)).collect();
        let big = headless("big", vec![EndpointSet { ports: vec![], endpoints }], false, vec![]);
        Zone::build(Arc::new(config()), &ClusterView { namespaces: vec![], services: vec![big] }, 1)
    }

    #[test]
    fn an_answer_on_the_wire_keeps_the_id_the_question_and_sets_aa() {
        let response = sent(respond_to_wire(
            &zone(),
            &packet("web.default.svc.cluster.local.", RecordType::A, None),
            Transport::Udp,
        ));
        assert_eq!(response.metadata.id, 0x1234);
        assert!(response.metadata.authoritative);
        assert!(response.metadata.recursion_desired);
        assert_eq!(response.queries.len(), 1);
        assert_eq!(response.answers.len(), 1);
        assert!(response.edns.is_none(), "no OPT in the answer to a request without one");
    }

    #[test]
    fn large_answers_are_truncated_over_udp_and_complete_over_tcp() {
        let zone = big_zone();
        let request = packet("big.default.svc.cluster.local.", RecordType::A, None);
        let udp = sent(respond_to_wire(&zone, &request, Transport::Udp));
        assert!(udp.metadata.truncation);
        assert!(udp.answers.len() < 100);
        let tcp = sent(respond_to_wire(&zone, &request, Transport::Tcp));
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 100);
        let edns = sent(respond_to_wire(
            &zone,
            &packet("big.default.svc.cluster.local.", RecordType::A, Some(4096)),
            Transport::Udp,
        ));
        assert!(!edns.metadata.truncation, "100 A records fit in 4096 bytes");
        assert_eq!(edns.edns.map(|e| e.max_payload()), Some(4096));
    }

    #[test]
    fn a_malformed_packet_gets_formerr_and_a_short_one_nothing() {
        let mut broken = packet("web.default.svc.cluster.local.", RecordType::A, None);
        broken.truncate(20);
        let response = sent(respond_to_wire(&zone(), &broken, Transport::Udp));
        assert_eq!(response.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(response.metadata.id, 0x1234);
        assert_eq!(respond_to_wire(&zone(), &broken[..11], Transport::Udp), WireOutcome::Drop);
    }

    #[test]
    fn an_oversized_name_gets_formerr() {
        let mut bytes = packet("web.default.svc.cluster.local.", RecordType::A, None);
        bytes.truncate(12);
        // Five labels of 63 bytes: 320 bytes, over the 255-byte limit.
        for _ in 0..5 {
            bytes.push(63);
            bytes.extend(std::iter::repeat_n(b'a', 63));
        }
        bytes.extend([0, 0, 1, 0, 1]);
        let response = sent(respond_to_wire(&zone(), &bytes, Transport::Udp));
        assert_eq!(response.metadata.response_code, ResponseCode::FormErr);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        #[test]
        fn any_bytes_get_a_parsable_answer_with_their_id_or_nothing(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            match respond_to_wire(&zone(), &bytes, Transport::Udp) {
                WireOutcome::Send(reply) => {
                    prop_assert!(reply.len() <= 4096);
                    let message = Message::from_vec(&reply).expect("our answers parse");
                    prop_assert_eq!(message.metadata.id, u16::from_be_bytes([bytes[0], bytes[1]]));
                    prop_assert_eq!(message.metadata.message_type, MessageType::Response);
                }
                WireOutcome::Forward | WireOutcome::Drop => {}
            }
        }

        #[test]
        fn any_question_in_the_zone_is_answered_authoritatively(
            labels in proptest::collection::vec("[a-zA-Z0-9_-]{1,20}", 0..6),
            query_type in proptest::sample::select(vec![
                RecordType::A, RecordType::AAAA, RecordType::SRV, RecordType::PTR, RecordType::TXT,
                RecordType::CNAME, RecordType::ANY, RecordType::SOA, RecordType::NS, RecordType::MX,
            ]),
        ) {
            let suffix = ["svc", "cluster", "local"];
            let all = labels.iter().map(String::as_str).chain(suffix).map(str::as_bytes);
            let mut name = Name::from_labels(all).unwrap();
            name.set_fqdn(true);
            let reply = sent(respond_to_wire(&zone(), &packet_for(name, query_type, Some(1232)), Transport::Udp));
            prop_assert!(reply.metadata.authoritative);
            prop_assert!(matches!(reply.metadata.response_code, ResponseCode::NoError | ResponseCode::NXDomain));
            if reply.answers.is_empty() {
                prop_assert_eq!(reply.authorities.len(), 1, "negative answers carry the SOA");
            }
        }
    }
}
