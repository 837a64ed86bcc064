//! Conformance of `svcplane dns` with the Kubernetes DNS-Based Service Discovery
//! specification (schema 1.1.0), section by section, and with the CoreDNS behaviours
//! clients rely on (resolv.conf search paths, SRV shapes, negative answers with the SOA). Every test starts the
//! real binary on 127.0.0.1 (a free port) over a manifests directory it writes, and asks the
//! real `dig`, over UDP and over TCP, checking answers, response codes, the AA flag, TTLs and
//! the SOA of negative answers.

mod dns_support;

use std::time::Duration;

use dns_support::{CHANGE_TIMEOUT, Dig, DnsServer, TempDir, pod, service};

/// Both transports, as dig spells them.
const TRANSPORTS: [&str; 2] = ["+notcp", "+tcp"];

const SERVICE_CIDRS: [&str; 4] = ["--service-cidr", "10.96.0.0/16", "--service-cidr", "fd00:96::/112"];

/// A small cluster with one of each kind of Service.
fn manifests() -> String {
    let mut text = String::new();
    text += &service(
        "default",
        "web",
        "clusterIP: 10.96.0.10\nselector: {app: web}\nports:\n- {name: http, port: 80}\n- {name: dns, port: 53, protocol: UDP}",
    );
    text += &service(
        "default",
        "dual",
        "ipFamilyPolicy: RequireDualStack\nipFamilies: [IPv4, IPv6]\nclusterIPs: [10.96.0.11, \"fd00:96::11\"]\nports: [{name: http, port: 80}]",
    );
    text += &service("default", "six", "ipFamilies: [IPv6]\nclusterIPs: [\"fd00:96::12\"]\nports: [{port: 80}]");
    text += &service("default", "unnamed", "clusterIP: 10.96.0.13\nports: [{port: 80}]");
    text += &service(
        "default",
        "db",
        "clusterIP: None\nipFamilyPolicy: RequireDualStack\nselector: {app: db}\nports: [{name: mysql, port: 3306}]",
    );
    text += &pod("default", "db-0", "db", &["10.244.0.5", "fd00:244::5"], true, "hostname: db-0\nsubdomain: db");
    text += &pod("default", "db-1", "db", &["10.244.0.6"], true, "");
    text += &pod("default", "db-2", "db", &["10.244.0.7"], false, "hostname: db-2\nsubdomain: db");
    text += &service("default", "idle", "clusterIP: None\nselector: {app: idle}\nports: [{name: mysql, port: 3306}]");
    text += &pod("default", "idle-0", "idle", &["10.244.1.1"], false, "hostname: idle-0\nsubdomain: idle");
    text += &service(
        "default",
        "eager",
        "clusterIP: None\npublishNotReadyAddresses: true\nselector: {app: eager}\nports: [{name: mysql, port: 3306}]",
    );
    text += &pod("default", "eager-0", "eager", &["10.244.2.1"], false, "hostname: eager-0\nsubdomain: eager");
    text += &service("default", "ext", "type: ExternalName\nexternalName: foo.example.com");
    text += &service("kube-system", "kube-dns", "clusterIP: 10.96.0.53\nports: [{name: dns, port: 53, protocol: UDP}]");
    text
}

/// Sixty ready endpoints: more A records than fit in 512 bytes.
fn big_headless() -> String {
    let mut text = service("default", "big", "clusterIP: None\nselector: {app: big}\nports: [{name: http, port: 80}]");
    for i in 1..=60 {
        text += &pod("default", &format!("big-{i}"), "big", &[&format!("10.244.3.{i}")], true, "");
    }
    text
}

/// A manifests directory and a server over it, ready to answer.
struct Cluster {
    dir: TempDir,
    server: DnsServer,
}

impl Cluster {
    fn start(extra: &[&str]) -> Self {
        let dir = TempDir::new("dns-manifests");
        dir.write("cluster.yaml", &manifests());
        dir.write("big.yaml", &big_headless());
        let mut args: Vec<&str> = SERVICE_CIDRS.to_vec();
        args.extend_from_slice(extra);
        let server = DnsServer::start(dir.path(), &args);
        server.wait_ready();
        Self { dir, server }
    }

    /// `dig <name> <type>` over `transport`.
    fn ask(&self, transport: &str, name: &str, query_type: &str) -> Dig {
        self.server.dig(&[transport, name, query_type])
    }
}

fn assert_positive(dig: &Dig) {
    assert_eq!(dig.status, "NOERROR", "{}", dig.raw);
    assert!(dig.has_flag("aa"), "AA must be set:\n{}", dig.raw);
    assert!(!dig.answer.is_empty(), "expected an answer:\n{}", dig.raw);
}

mod spec_2_2_schema_version {
    use super::*;

    #[test]
    fn spec_2_2_dns_version_answers_txt_1_1_0_with_ttl_28800() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "dns-version.cluster.local", "TXT");
            assert_positive(&dig);
            assert_eq!(dig.answers(), [r#"TXT "1.1.0""#], "{transport}");
            assert_eq!(dig.answer[0].ttl, 28_800);
        }
    }
}

mod spec_2_3_cluster_ip {
    use super::*;

    #[test]
    fn spec_2_3_1_a_record_for_cluster_ip_service() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "web.default.svc.cluster.local", "A");
            assert_positive(&dig);
            assert_eq!(dig.answers(), ["A 10.96.0.10"], "{transport}");
            assert_eq!(dig.answer[0].ttl, 5);
            assert_eq!(dig.answer[0].name, "web.default.svc.cluster.local.");
        }
    }

    #[test]
    fn spec_2_3_1_the_missing_family_is_nodata_with_the_soa_not_nxdomain() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            cluster.ask(transport, "web.default.svc.cluster.local", "AAAA").assert_negative("NOERROR", 5);
            cluster.ask(transport, "six.default.svc.cluster.local", "A").assert_negative("NOERROR", 5);
            cluster.ask(transport, "web.default.svc.cluster.local", "TXT").assert_negative("NOERROR", 5);
        }
    }

    #[test]
    fn spec_2_3_1_aaaa_records_for_ipv6_and_dual_stack_services() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            assert_eq!(cluster.ask(transport, "six.default.svc.cluster.local", "AAAA").answers(), ["AAAA fd00:96::12"]);
            assert_eq!(cluster.ask(transport, "dual.default.svc.cluster.local", "A").answers(), ["A 10.96.0.11"]);
            assert_eq!(
                cluster.ask(transport, "dual.default.svc.cluster.local", "AAAA").answers(),
                ["AAAA fd00:96::11"]
            );
        }
    }

    #[test]
    fn spec_2_3_2_srv_record_for_each_named_port() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "_http._tcp.web.default.svc.cluster.local", "SRV");
            assert_positive(&dig);
            assert_eq!(dig.answers(), ["SRV 0 100 80 web.default.svc.cluster.local."]);
            let glue: Vec<String> = dig.additional.iter().map(|rr| format!("{} {}", rr.name, rr.data)).collect();
            assert_eq!(glue, ["web.default.svc.cluster.local. 10.96.0.10"]);
            let udp = cluster.ask(transport, "_dns._udp.web.default.svc.cluster.local", "SRV");
            assert_eq!(udp.answers(), ["SRV 0 100 53 web.default.svc.cluster.local."]);
        }
    }

    #[test]
    fn spec_2_3_2_unnamed_ports_and_unknown_port_names_have_no_srv() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            cluster.ask(transport, "_http._udp.web.default.svc.cluster.local", "SRV").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "_x._tcp.web.default.svc.cluster.local", "SRV").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "unnamed.default.svc.cluster.local", "SRV").assert_negative("NOERROR", 5);
        }
    }

    #[test]
    fn spec_2_3_3_ptr_records_for_ipv4_and_ipv6_cluster_ips() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let v4 = cluster.server.dig(&[transport, "-x", "10.96.0.10"]);
            assert_positive(&v4);
            assert_eq!(v4.answers(), ["PTR web.default.svc.cluster.local."]);
            assert_eq!(v4.answer[0].name, "10.0.96.10.in-addr.arpa.");
            let v6 = cluster.server.dig(&[transport, "-x", "fd00:96::11"]);
            assert_positive(&v6);
            assert_eq!(v6.answers(), ["PTR dual.default.svc.cluster.local."]);
            assert!(v6.answer[0].name.ends_with(".ip6.arpa."));
        }
    }
}

mod spec_2_4_headless {
    use super::*;

    #[test]
    fn spec_2_4_1_headless_a_and_aaaa_list_the_ready_endpoints_only() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let a = cluster.ask(transport, "db.default.svc.cluster.local", "A");
            assert_positive(&a);
            assert_eq!(a.sorted_answers(), ["A 10.244.0.5", "A 10.244.0.6"], "db-2 is not ready");
            let aaaa = cluster.ask(transport, "db.default.svc.cluster.local", "AAAA");
            assert_eq!(aaaa.answers(), ["AAAA fd00:244::5"]);
        }
    }

    #[test]
    fn spec_2_4_1_headless_without_ready_endpoints_is_nxdomain() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            for query_type in ["A", "AAAA", "SRV"] {
                cluster.ask(transport, "idle.default.svc.cluster.local", query_type).assert_negative("NXDOMAIN", 5);
            }
            cluster.ask(transport, "_mysql._tcp.idle.default.svc.cluster.local", "SRV").assert_negative("NXDOMAIN", 5);
        }
    }

    #[test]
    fn spec_2_4_1_publish_not_ready_addresses_publishes_unready_endpoints() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            assert_eq!(cluster.ask(transport, "eager.default.svc.cluster.local", "A").answers(), ["A 10.244.2.1"]);
            let host = cluster.ask(transport, "eager-0.eager.default.svc.cluster.local", "A");
            assert_eq!(host.answers(), ["A 10.244.2.1"]);
        }
    }

    #[test]
    fn spec_2_4_1_hostname_records_for_pods_with_hostname_and_subdomain() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let a = cluster.ask(transport, "db-0.db.default.svc.cluster.local", "A");
            assert_positive(&a);
            assert_eq!(a.answers(), ["A 10.244.0.5"]);
            assert_eq!(
                cluster.ask(transport, "db-0.db.default.svc.cluster.local", "AAAA").answers(),
                ["AAAA fd00:244::5"]
            );
            // Without a hostname, the endpoint is named by its dashed address.
            assert_eq!(
                cluster.ask(transport, "10-244-0-6.db.default.svc.cluster.local", "A").answers(),
                ["A 10.244.0.6"]
            );
            cluster.ask(transport, "db-2.db.default.svc.cluster.local", "A").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "db-9.db.default.svc.cluster.local", "A").assert_negative("NXDOMAIN", 5);
        }
    }

    #[test]
    fn spec_2_4_2_headless_srv_has_a_record_per_ready_endpoint_naming_its_hostname() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "_mysql._tcp.db.default.svc.cluster.local", "SRV");
            assert_positive(&dig);
            assert_eq!(
                dig.sorted_answers(),
                [
                    "SRV 0 33 3306 10-244-0-6.db.default.svc.cluster.local.",
                    "SRV 0 33 3306 db-0.db.default.svc.cluster.local.",
                    "SRV 0 33 3306 db-0.db.default.svc.cluster.local.",
                ]
            );
            let mut glue: Vec<String> = dig.additional.iter().map(|rr| format!("{} {}", rr.name, rr.data)).collect();
            glue.sort();
            assert_eq!(
                glue,
                [
                    "10-244-0-6.db.default.svc.cluster.local. 10.244.0.6",
                    "db-0.db.default.svc.cluster.local. 10.244.0.5",
                    "db-0.db.default.svc.cluster.local. fd00:244::5",
                ]
            );
        }
    }

    #[test]
    fn spec_2_4_3_ptr_of_an_endpoint_address_names_its_hostname() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let v4 = cluster.server.dig(&[transport, "-x", "10.244.0.5"]);
            assert_positive(&v4);
            assert_eq!(v4.answers(), ["PTR db-0.db.default.svc.cluster.local."]);
            let v6 = cluster.server.dig(&[transport, "-x", "fd00:244::5"]);
            assert_eq!(v6.answers(), ["PTR db-0.db.default.svc.cluster.local."]);
            let dashed = cluster.server.dig(&[transport, "-x", "10.244.0.6"]);
            assert_eq!(dashed.answers(), ["PTR 10-244-0-6.db.default.svc.cluster.local."]);
        }
    }
}

mod spec_2_5_external_name {
    use super::*;

    #[test]
    fn spec_2_5_external_name_is_a_cname_for_cname_a_and_aaaa_questions() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let cname = cluster.ask(transport, "ext.default.svc.cluster.local", "CNAME");
            assert_positive(&cname);
            assert_eq!(cname.answers(), ["CNAME foo.example.com."]);
            assert_eq!(
                cluster.ask(transport, "ext.default.svc.cluster.local", "A").answers(),
                ["CNAME foo.example.com."]
            );
            cluster.ask(transport, "ext.default.svc.cluster.local", "SRV").assert_negative("NOERROR", 5);
            cluster.ask(transport, "x.ext.default.svc.cluster.local", "A").assert_negative("NXDOMAIN", 5);
        }
    }

    #[test]
    fn spec_2_5_an_updated_external_name_and_a_switch_to_cluster_ip_show_within_a_second() {
        let cluster = Cluster::start(&[]);
        cluster.dir.write("ext.yaml", &service("default", "ext3", "type: ExternalName\nexternalName: foo.example.com"));
        cluster.server.dig_until(&["ext3.default.svc.cluster.local", "CNAME", "+short"], CHANGE_TIMEOUT, |d| {
            d.raw.trim() == "foo.example.com."
        });
        cluster.dir.write("ext.yaml", &service("default", "ext3", "type: ExternalName\nexternalName: bar.example.com"));
        let (_, took) =
            cluster.server.dig_until(&["ext3.default.svc.cluster.local", "CNAME", "+short"], CHANGE_TIMEOUT, |d| {
                d.raw.trim() == "bar.example.com."
            });
        eprintln!("the updated externalName answered after {took:?}");
        cluster
            .dir
            .write("ext.yaml", &service("default", "ext3", "clusterIP: 10.96.0.33\nports: [{name: http, port: 80}]"));
        cluster.server.dig_until(&["ext3.default.svc.cluster.local", "A", "+short"], CHANGE_TIMEOUT, |d| {
            d.raw.trim() == "10.96.0.33"
        });
    }
}

mod coredns_behaviours {
    use super::*;

    #[test]
    fn names_are_case_insensitive_and_the_answer_echoes_the_question() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "WEB.Default.SVC.Cluster.Local", "A");
            assert_positive(&dig);
            assert_eq!(dig.answers(), ["A 10.96.0.10"]);
            assert_eq!(dig.answer[0].name, "WEB.Default.SVC.Cluster.Local.");
        }
    }

    #[test]
    fn missing_services_and_namespaces_are_nxdomain_and_existing_empty_names_nodata() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            cluster.ask(transport, "nope.default.svc.cluster.local", "A").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "web.nope.svc.cluster.local", "A").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "google.com.default.svc.cluster.local", "A").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "foo.cluster.local", "A").assert_negative("NXDOMAIN", 5);
            cluster.ask(transport, "default.svc.cluster.local", "A").assert_negative("NOERROR", 5);
            cluster.ask(transport, "svc.cluster.local", "A").assert_negative("NOERROR", 5);
            cluster.ask(transport, "cluster.local", "A").assert_negative("NOERROR", 5);
        }
    }

    #[test]
    fn a_search_list_walk_ends_at_the_right_expansion() {
        let cluster = Cluster::start(&[]);
        // ndots:5 in namespace default: the walk for `web.default` tries these in order.
        let walk =
            [("web.default.default.svc.cluster.local", "NXDOMAIN"), ("web.default.svc.cluster.local", "NOERROR")];
        for (name, status) in walk {
            let dig = cluster.ask("+notcp", name, "A");
            assert_eq!(dig.status, status, "{name}:\n{}", dig.raw);
        }
        let searched = cluster.server.dig(&["+search", "+ndots=5", "+domain=default.svc.cluster.local", "web", "A"]);
        assert_eq!(searched.answers(), ["A 10.96.0.10"], "{}", searched.raw);
    }

    #[test]
    fn the_apex_answers_soa_and_ns_and_the_ttl_flag_sets_the_negative_ttl() {
        let cluster = Cluster::start(&["--ttl", "30"]);
        for transport in TRANSPORTS {
            let soa = cluster.ask(transport, "cluster.local", "SOA");
            assert_positive(&soa);
            let fields: Vec<&str> = soa.answer[0].data.split(' ').collect();
            assert_eq!(fields[..2], ["ns.dns.cluster.local.", "hostmaster.cluster.local."]);
            assert_eq!(fields[3..], ["7200", "1800", "86400", "30"]);
            let ns = cluster.ask(transport, "cluster.local", "NS");
            assert_eq!(ns.answers(), ["NS ns.dns.cluster.local."]);
            assert_eq!(ns.additional.iter().map(|rr| rr.data.as_str()).collect::<Vec<_>>(), ["10.96.0.53"]);
            assert_eq!(cluster.ask(transport, "web.default.svc.cluster.local", "A").answer[0].ttl, 30);
            cluster.ask(transport, "nope.default.svc.cluster.local", "A").assert_negative("NXDOMAIN", 30);
        }
    }

    #[test]
    fn pods_insecure_answers_dashed_addresses_in_namespaces_that_exist() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "10-244-9-9.default.pod.cluster.local", "A");
            assert_positive(&dig);
            assert_eq!(dig.answers(), ["A 10.244.9.9"]);
            cluster.ask(transport, "10-244-9-9.nope.pod.cluster.local", "A").assert_negative("NXDOMAIN", 5);
        }
        let disabled = Cluster::start(&["--pods", "disabled"]);
        disabled.ask("+notcp", "10-244-9-9.default.pod.cluster.local", "A").assert_negative("NXDOMAIN", 5);
    }

    #[test]
    fn large_answers_are_truncated_over_udp_and_complete_over_tcp() {
        let cluster = Cluster::start(&[]);
        let udp = cluster.server.dig(&["+notcp", "+noedns", "+ignore", "big.default.svc.cluster.local", "A"]);
        assert!(udp.has_flag("tc"), "TC over UDP without EDNS:\n{}", udp.raw);
        assert!(udp.answer.len() < 60);
        let tcp = cluster.ask("+tcp", "big.default.svc.cluster.local", "A");
        assert!(!tcp.has_flag("tc"));
        assert_eq!(tcp.answer.len(), 60);
        // dig itself retries over TCP on TC.
        let retried = cluster.server.dig(&["+notcp", "+noedns", "big.default.svc.cluster.local", "A"]);
        assert_eq!(retried.answer.len(), 60, "{}", retried.raw);
    }

    #[test]
    fn zone_transfers_are_refused() {
        let cluster = Cluster::start(&[]);
        let dig = cluster.server.dig(&["cluster.local", "AXFR"]);
        assert!(dig.raw.contains("Transfer failed"), "{}", dig.raw);
        // IXFR, and both over UDP, are refused too: see dns_robustness.rs, which sends the
        // packets dig will not.
    }

    #[test]
    fn names_outside_the_zone_are_refused_without_upstreams() {
        let cluster = Cluster::start(&[]);
        for transport in TRANSPORTS {
            let dig = cluster.ask(transport, "example.com", "A");
            assert_eq!(dig.status, "REFUSED", "{}", dig.raw);
            assert!(!dig.has_flag("aa"));
        }
    }

    #[test]
    fn names_outside_the_zone_go_to_the_upstream_and_external_names_are_chased_there() {
        // The upstream: another svcplane dns on loopback, serving its own zone.
        let upstream_dir = TempDir::new("dns-upstream");
        upstream_dir.write("www.yaml", &service("default", "www", "clusterIP: 10.96.0.80\nports: [{port: 80}]"));
        let upstream = DnsServer::start(upstream_dir.path(), &["--zone", "upstream.test"]);
        upstream.dig_until(&["www.default.svc.upstream.test", "A"], Duration::from_secs(5), |d| d.status == "NOERROR");

        let upstream_arg = upstream.addr.to_string();
        let cluster = Cluster::start(&["--upstream", &upstream_arg]);
        cluster.dir.write(
            "chase.yaml",
            &service("default", "chase", "type: ExternalName\nexternalName: www.default.svc.upstream.test"),
        );
        for transport in TRANSPORTS {
            let forwarded = cluster.ask(transport, "www.default.svc.upstream.test", "A");
            assert_eq!(forwarded.status, "NOERROR", "{}", forwarded.raw);
            assert_eq!(forwarded.answers(), ["A 10.96.0.80"]);
            assert!(forwarded.has_flag("ra"), "a forwarded answer offers recursion:\n{}", forwarded.raw);
            assert!(!forwarded.has_flag("aa"), "a forwarded answer is not ours:\n{}", forwarded.raw);
            let missing = cluster.ask(transport, "nope.default.svc.upstream.test", "A");
            assert_eq!(missing.status, "NXDOMAIN", "the upstream's NXDOMAIN is relayed:\n{}", missing.raw);
            let (chased, _) =
                cluster.server.dig_until(&[transport, "chase.default.svc.cluster.local", "A"], CHANGE_TIMEOUT, |d| {
                    d.answer.len() == 2
                });
            assert_eq!(chased.answers(), ["CNAME www.default.svc.upstream.test.", "A 10.96.0.80"]);
            // The cluster zone is still answered locally and authoritatively.
            assert_positive(&cluster.ask(transport, "web.default.svc.cluster.local", "A"));
        }
        // Reverse names of addresses the cluster does not know go upstream too.
        let reverse = cluster.server.dig(&["-x", "10.96.0.80"]);
        assert_eq!(reverse.answers(), ["PTR www.default.svc.upstream.test."], "{}", reverse.raw);
    }

    #[test]
    fn an_upstream_that_does_not_answer_gives_servfail_and_the_zone_keeps_answering() {
        // A UDP port nobody answers on: bound here and never read.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let silent_arg = silent.local_addr().unwrap().to_string();
        let cluster = Cluster::start(&["--upstream", &silent_arg, "--forward-timeout-ms", "300"]);
        let dig = cluster.server.dig(&["+notcp", "example.com", "A"]);
        assert_eq!(dig.status, "SERVFAIL", "{}", dig.raw);
        assert_positive(&cluster.ask("+notcp", "web.default.svc.cluster.local", "A"));
    }

    #[test]
    fn names_in_the_zone_answer_servfail_until_the_manifests_are_read() {
        let parent = TempDir::new("dns-late");
        let dir = parent.path().join("manifests");
        let server = DnsServer::start(&dir, &[]);
        for transport in TRANSPORTS {
            let dig = server.dig(&[transport, "web.default.svc.cluster.local", "A"]);
            assert_eq!(dig.status, "SERVFAIL", "{}", dig.raw);
            assert!(!dig.has_flag("aa"));
        }
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("web.yaml"), service("default", "web", "clusterIP: 10.96.0.10\nports: [{port: 80}]"))
            .unwrap();
        server.dig_until(&["web.default.svc.cluster.local", "A"], Duration::from_secs(3), |d| {
            d.answers() == ["A 10.96.0.10"]
        });
    }

    #[test]
    fn record_sets_follow_added_removed_and_readiness_flipped_objects_within_a_second() {
        let cluster = Cluster::start(&[]);
        let name = "late.default.svc.cluster.local";
        cluster.ask("+notcp", name, "A").assert_negative("NXDOMAIN", 5);
        cluster.dir.write("late.yaml", &service("default", "late", "clusterIP: 10.96.0.77\nports: [{port: 80}]"));
        let (_, took) = cluster.server.dig_until(&[name, "A"], CHANGE_TIMEOUT, |d| d.answers() == ["A 10.96.0.77"]);
        eprintln!("a new Service answered after {took:?}");
        cluster.dir.remove("late.yaml");
        cluster.server.dig_until(&[name, "A"], CHANGE_TIMEOUT, |d| d.status == "NXDOMAIN");

        // db-2 becomes ready: it joins the headless answer and gets its hostname record.
        let flipped = manifests().replace(
            "name: db-2\n  namespace: default\n  labels: {app: db}\nspec:\n  nodeName: node-1\n  containers: [{name: c, image: x}]\n  hostname: db-2\n  subdomain: db\nstatus:\n  phase: Running\n  podIP: \"10.244.0.7\"\n  podIPs: [{ip: \"10.244.0.7\"}]\n  conditions: [{type: Ready, status: \"False\"}]",
            "name: db-2\n  namespace: default\n  labels: {app: db}\nspec:\n  nodeName: node-1\n  containers: [{name: c, image: x}]\n  hostname: db-2\n  subdomain: db\nstatus:\n  phase: Running\n  podIP: \"10.244.0.7\"\n  podIPs: [{ip: \"10.244.0.7\"}]\n  conditions: [{type: Ready, status: \"True\"}]",
        );
        assert_ne!(flipped, manifests(), "the readiness flip must change the manifests");
        cluster.dir.write("cluster.yaml", &flipped);
        cluster.server.dig_until(&["db-2.db.default.svc.cluster.local", "A"], CHANGE_TIMEOUT, |d| {
            d.answers() == ["A 10.244.0.7"]
        });
        let all = cluster.ask("+tcp", "db.default.svc.cluster.local", "A");
        assert_eq!(all.sorted_answers(), ["A 10.244.0.5", "A 10.244.0.6", "A 10.244.0.7"]);
    }
}

mod metrics {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};

    use super::*;

    /// `GET /metrics` from the server's metrics address.
    fn scrape(address: SocketAddr) -> String {
        let mut stream = TcpStream::connect(address).expect("connecting to /metrics");
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        body.to_owned()
    }

    /// The sum of the series of `family` whose labels contain every one of `labels`.
    fn sum(text: &str, family: &str, labels: &[&str]) -> u64 {
        text.lines()
            .filter(|line| line.starts_with(&format!("{family}{{")))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    #[test]
    fn each_answered_query_counts_once_by_rcode_type_and_transport_in_corednss_metrics() {
        const N: u64 = 24;
        let cluster = Cluster::start(&[]);
        let address = cluster.server.metrics_addr.expect("the server printed its metrics address");
        let before = scrape(address);
        for i in 0..N {
            let transport = TRANSPORTS[(i % 2) as usize];
            assert_eq!(cluster.ask(transport, "web.default.svc.cluster.local", "A").status, "NOERROR");
            assert_eq!(cluster.ask(transport, "missing.default.svc.cluster.local", "AAAA").status, "NXDOMAIN");
        }
        let after = scrape(address);
        let grew = |family: &str, labels: &[&str]| sum(&after, family, labels) - sum(&before, family, labels);
        let server = format!("server=\"dns://{}\"", cluster.server.addr);
        assert_eq!(
            grew("coredns_dns_responses_total", &[&server, r#"rcode="NOERROR""#, r#"plugin="kubernetes""#]),
            N,
            "{after}"
        );
        assert_eq!(grew("coredns_dns_responses_total", &[r#"rcode="NXDOMAIN""#]), N, "{after}");
        assert_eq!(grew("coredns_dns_requests_total", &[r#"zone=".""#, r#"type="A""#, r#"family="1""#]), N);
        assert_eq!(grew("coredns_dns_requests_total", &[r#"type="AAAA""#]), N);
        assert_eq!(grew("coredns_dns_requests_total", &[r#"proto="tcp""#]), N, "{after}");
        assert_eq!(grew("coredns_dns_requests_total", &[r#"proto="udp""#]), N, "{after}");
        assert_eq!(grew("coredns_dns_request_duration_seconds_count", &[]), 2 * N, "{after}");
        assert_eq!(grew("coredns_dns_request_duration_seconds_bucket", &[r#"type="A""#, r#"le="+Inf""#]), N);
        assert_eq!(grew("coredns_dns_request_size_bytes_count", &[]), 2 * N, "{after}");
        assert!(after.contains("# TYPE coredns_dns_request_duration_seconds histogram"), "{after}");
    }
}
