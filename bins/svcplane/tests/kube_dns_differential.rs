//! Cluster DNS side by side with upstream: CoreDNS (its `kubernetes` plugin) and
//! `svcplane dns --kubeconfig` read the same real API server, in a namespace of the test's
//! own, and must give the same answer (status and records, TTLs aside) to every question of
//! the Kubernetes DNS specification asked about the same Services and EndpointSlices, except
//! where [`deliberate`] explains why not.
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

mod kube_support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_support::{echo_service, eventually, log_tail};
use svcplane_control_plane::{BareNamespace, ControlPlane, ControlPlaneConfig, NetnsClient, binaries_for_test};

const COREDNS_PORT: &str = "1054";
const SVCPLANE_PORT: &str = "1053";

/// One answer: the status and the records (name, type, data), sorted, TTLs dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: String,
    records: Vec<String>,
}

fn ask(namespace: &str, port: &str, name: &str, query_type: &str) -> Answer {
    let output = Command::new("ip")
        .args(["netns", "exec", namespace, "dig", "+time=1", "+tries=1", "+nocmd", "+noall", "+answer", "+comments"])
        .args(["-p", port, "@127.0.0.1", name, query_type])
        .output()
        .expect("running dig");
    let text = String::from_utf8_lossy(&output.stdout);
    let status = text
        .lines()
        .find_map(|line| line.split("status: ").nth(1))
        .map(|rest| rest.split(',').next().unwrap_or_default().to_owned())
        .unwrap_or_else(|| "no answer".to_owned());
    let mut records: Vec<String> = text
        .lines()
        .filter(|line| !line.starts_with(';') && !line.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // name ttl class type data...
            let mut kept = vec![fields[0].to_lowercase()];
            kept.extend(fields.iter().skip(3).map(|f| (*f).to_owned()));
            kept.join(" ")
        })
        .collect();
    records.sort();
    Answer { status, records }
}

/// A difference that is svcplane's choice, with the reason; `None` when it is a failure.
///
/// The SRV record of a dual-stack ClusterIP Service: CoreDNS makes one record per cluster IP
/// (weight 100/2 each), then merges the two identical targets into one, which keeps the
/// weight 50. svcplane gives the one target the whole weight, 100, as CoreDNS itself does
/// for a single-stack Service. Clients pick among records by weight relative to each
/// other, so a lone record's weight changes nothing.
fn deliberate(upstream: &Answer, ours: &Answer) -> Option<&'static str> {
    let reweighted: Vec<String> = upstream.records.iter().map(|r| r.replacen(" SRV 0 50 ", " SRV 0 100 ", 1)).collect();
    (upstream.records.len() == 1 && upstream.status == ours.status && reweighted == ours.records)
        .then_some("a lone SRV record of a dual-stack Service: CoreDNS keeps weight 50 after merging, svcplane 100")
}

fn headless_slice(endpoints: &[(&str, Option<&str>, bool)]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some("db-1".into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_owned(), "db".to_owned()),
                ("service.kubernetes.io/headless".to_owned(), String::new()),
            ])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints: endpoints
            .iter()
            .map(|(ip, hostname, ready)| Endpoint {
                addresses: vec![(*ip).to_owned()],
                hostname: hostname.map(str::to_owned),
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    serving: Some(*ready),
                    terminating: Some(false),
                }),
                ..Endpoint::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

#[test]
fn svcplane_dns_answers_like_coredns_from_the_same_api_server() {
    let Some(binaries) = binaries_for_test("kube_dns_differential") else { return };
    let Ok(coredns) = binaries.require("coredns") else {
        assert!(std::env::var_os("SVCPLANE_REQUIRE_K8S").is_none(), "coredns is not built");
        return;
    };
    let namespace = BareNamespace::create().expect("a namespace");
    let address: IpAddr = "198.18.0.2".parse().unwrap();
    namespace.add_loopback_address(address).unwrap();
    let mut config = ControlPlaneConfig::new(namespace.name(), address);
    config.service_cidrs = vec!["198.19.0.0/16".into(), "2001:db8:f::/108".into()];
    let plane = ControlPlane::start(&binaries, config).unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    let client = NetnsClient::connect(namespace.name(), plane.kubeconfig()).unwrap();

    // web: dual-stack ClusterIP with a named TCP and a named UDP port.
    let mut web = echo_service("web", false, &[]);
    if let Some(ports) = web.spec.as_mut().and_then(|spec| spec.ports.as_mut()) {
        ports.push(ServicePort {
            name: Some("dns".into()),
            port: 53,
            protocol: Some("UDP".into()),
            ..ServicePort::default()
        });
    }
    let web: Service = client.create(&web).unwrap();
    let web_ips: Vec<String> = web.spec.as_ref().and_then(|s| s.cluster_ips.clone()).unwrap_or_default();
    // db: headless, two ready endpoints (one with a hostname), one not ready.
    let mut db = echo_service("db", false, &[]);
    if let Some(spec) = db.spec.as_mut() {
        spec.cluster_ip = Some("None".into());
        spec.ip_family_policy = None;
    }
    client.create(&db).unwrap();
    client
        .create(&headless_slice(&[
            ("198.18.129.7", Some("db-0"), true),
            ("198.18.129.8", None, true),
            ("198.18.129.9", Some("db-2"), false),
        ]))
        .unwrap();
    // ext: ExternalName.
    let mut ext = echo_service("ext", false, &[]);
    if let Some(spec) = ext.spec.as_mut() {
        spec.type_ = Some("ExternalName".into());
        spec.external_name = Some("www.example.invalid".into());
        spec.ports = None;
        spec.ip_family_policy = None;
    }
    client.create(&ext).unwrap();

    let corefile = plane.dir().join("Corefile");
    std::fs::write(
        &corefile,
        format!(
            ".:{COREDNS_PORT} {{\n    bind 127.0.0.1\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {}\n        \
             pods insecure\n        ttl 30\n    }}\n}}\n",
            plane.kubeconfig().display()
        ),
    )
    .unwrap();
    let coredns_args = vec!["-conf".to_owned(), corefile.display().to_string()];
    let (_, coredns_log) =
        plane.spawn("coredns", namespace.name(), &coredns.display().to_string(), &coredns_args).unwrap();
    let kubeconfig = plane.kubeconfig().display().to_string();
    let args: Vec<String> =
        ["dns", "--kubeconfig", &kubeconfig, "--listen", &format!("127.0.0.1:{SVCPLANE_PORT}"), "--ttl", "30"]
            .map(String::from)
            .to_vec();
    let (_, svcplane_log) =
        plane.spawn("svcplane-dns", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
    for (port, log) in [(COREDNS_PORT, &coredns_log), (SVCPLANE_PORT, &svcplane_log)] {
        let ready = eventually(Duration::from_secs(30), || {
            let answer = ask(namespace.name(), port, "db.default.svc.cluster.local", "A");
            (answer.records.len() == 2).then_some(())
        });
        assert!(ready.is_some(), "the server on port {port} did not serve the zone:\n{}", log_tail(log));
    }

    let reverse_v4 = {
        let ip: std::net::Ipv4Addr = web_ips[0].parse().unwrap();
        let [a, b, c, d] = ip.octets();
        format!("{d}.{c}.{b}.{a}.in-addr.arpa")
    };
    let questions: Vec<(String, &str)> = vec![
        ("web.default.svc.cluster.local".into(), "A"),
        ("web.default.svc.cluster.local".into(), "AAAA"),
        ("_http._tcp.web.default.svc.cluster.local".into(), "SRV"),
        ("_dns._udp.web.default.svc.cluster.local".into(), "SRV"),
        ("_http._udp.web.default.svc.cluster.local".into(), "SRV"),
        ("db.default.svc.cluster.local".into(), "A"),
        ("db.default.svc.cluster.local".into(), "AAAA"),
        ("db-0.db.default.svc.cluster.local".into(), "A"),
        ("db-2.db.default.svc.cluster.local".into(), "A"),
        ("_http._tcp.db.default.svc.cluster.local".into(), "SRV"),
        ("ext.default.svc.cluster.local".into(), "CNAME"),
        ("missing.default.svc.cluster.local".into(), "A"),
        ("web.nowhere.svc.cluster.local".into(), "A"),
        ("198-18-129-20.default.pod.cluster.local".into(), "A"),
        (reverse_v4, "PTR"),
        ("7.129.18.198.in-addr.arpa".into(), "PTR"),
        ("dns-version.cluster.local".into(), "TXT"),
        ("WEB.Default.SVC.cluster.local".into(), "A"),
    ];
    let mut differences = Vec::new();
    for (name, query_type) in &questions {
        let upstream = ask(namespace.name(), COREDNS_PORT, name, query_type);
        let ours = ask(namespace.name(), SVCPLANE_PORT, name, query_type);
        eprintln!("{name} {query_type}: coredns {upstream:?}, svcplane {ours:?}");
        if upstream != ours {
            if let Some(reason) = deliberate(&upstream, &ours) {
                eprintln!("deliberate difference: {name} {query_type}: {reason}");
                continue;
            }
            differences.push(format!("{name} {query_type}\n    coredns:  {upstream:?}\n    svcplane: {ours:?}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} questions answered differently:\n{}",
        differences.len(),
        questions.len(),
        differences.join("\n")
    );
    plane.check_running("coredns").expect("coredns still runs");
    plane.check_running("svcplane-dns").expect("svcplane dns still runs");
}
