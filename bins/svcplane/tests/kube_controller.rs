//! `svcplane controller --kubeconfig` beside kube-controller-manager's EndpointSlice
//! controller on one real API server. They never fight: each owns only the slices with its
//! own `endpointslice.kubernetes.io/managed-by`. For the same Services and Pods their slices
//! must be equal up to names, generated fields and that label; one Pod changing must cost
//! svcplane one slice write (per family). And the two are interchangeable: svcplane with
//! kube-controller-manager's `--managed-by` value adopts its slices without rewriting them.
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use svcplane_control_plane::{
    BareNamespace, ControlPlane, ControlPlaneConfig, NetnsClient, UpstreamBinaries, binaries_for_test, objects,
};
use svcplane_kube::controller::normalized;

const UPSTREAM: &str = "endpointslice-controller.k8s.io";
const OURS: &str = "endpointslice-controller.svcplane.io";
const CONVERGE_WITHIN: Duration = Duration::from_secs(60);

/// A kube-apiserver (with etcd) in a namespace of its own, and a client for it; dropped in
/// reverse order (client, plane, namespace).
fn start_api(binaries: &UpstreamBinaries) -> (BareNamespace, ControlPlane, NetnsClient) {
    let namespace = BareNamespace::create().expect("a namespace");
    let address: IpAddr = "198.18.0.2".parse().unwrap();
    namespace.add_loopback_address(address).unwrap();
    let mut config = ControlPlaneConfig::new(namespace.name(), address);
    config.service_cidrs = vec!["198.19.0.0/16".into(), "2001:db8:f::/108".into()];
    let plane = ControlPlane::start(binaries, config).unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    let client = NetnsClient::connect(namespace.name(), plane.kubeconfig()).unwrap();
    (namespace, plane, client)
}

fn service(name: &str, selector: &str, target_port: IntOrString, tweak: impl FnOnce(&mut ServiceSpec)) -> Service {
    let mut spec = ServiceSpec {
        selector: Some(BTreeMap::from([("app".to_owned(), selector.to_owned())])),
        ip_family_policy: Some("PreferDualStack".into()),
        ports: Some(vec![
            ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(target_port),
                ..ServicePort::default()
            },
            ServicePort {
                name: Some("dns".into()),
                port: 53,
                protocol: Some("UDP".into()),
                target_port: Some(IntOrString::Int(5353)),
                ..ServicePort::default()
            },
        ]),
        ..ServiceSpec::default()
    };
    tweak(&mut spec);
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            labels: Some(BTreeMap::from([("team".to_owned(), "blue".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        ..Service::default()
    }
}

fn pod_ips(n: u32) -> Vec<IpAddr> {
    vec![
        format!("198.18.{}.{}", 129 + n / 200, n % 200 + 1).parse().unwrap(),
        format!("2001:db8:1:{:x}::{:x}", 1 + n / 200, n % 200 + 1).parse().unwrap(),
    ]
}

/// Every Service's slices by managed-by value: service name -> normalized slices.
type Views = BTreeMap<String, Vec<BTreeMap<String, serde_json::Value>>>;

fn slices_by_owner(client: &NetnsClient) -> (Views, Views, Vec<EndpointSlice>) {
    let all: Vec<EndpointSlice> = client.list(Some("default"), None).unwrap();
    let mut upstream = Views::new();
    let mut ours = Views::new();
    for slice in &all {
        let labels = slice.metadata.labels.clone().unwrap_or_default();
        let Some(service) = labels.get("kubernetes.io/service-name").cloned() else { continue };
        let view = match labels.get("endpointslice.kubernetes.io/managed-by").map(String::as_str) {
            Some(UPSTREAM) => &mut upstream,
            Some(OURS) => &mut ours,
            _ => continue,
        };
        view.entry(service).or_default().push(normalized(slice));
    }
    for view in [&mut upstream, &mut ours] {
        for slices in view.values_mut() {
            slices.sort_by_key(|slice| serde_json::to_string(slice).unwrap());
        }
    }
    let ours_raw = all
        .into_iter()
        .filter(|s| {
            s.metadata.labels.as_ref().and_then(|l| l.get("endpointslice.kubernetes.io/managed-by")).map(String::as_str)
                == Some(OURS)
        })
        .collect();
    (upstream, ours, ours_raw)
}

/// Services with more than 100 endpoints are compared by their endpoints and the number of
/// slices: how endpoints spread over slices depends on the order each controller sees Pods.
fn comparable(view: &Views, large: &BTreeSet<&str>) -> Views {
    view.iter()
        .map(|(service, slices)| {
            if !large.contains(service.as_str()) {
                return (service.clone(), slices.clone());
            }
            let mut merged: BTreeMap<String, serde_json::Value> = slices[0].clone();
            let mut endpoints: Vec<serde_json::Value> =
                slices.iter().flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default()).collect();
            endpoints.sort_by_key(|e| e["addresses"].to_string());
            merged.insert("endpoints".into(), serde_json::Value::Array(endpoints));
            merged.insert("slices".into(), serde_json::json!(slices.len()));
            (service.clone(), vec![merged])
        })
        .collect()
}

fn wait_until_equal(client: &NetnsClient, large: &BTreeSet<&str>, what: &str) -> Vec<EndpointSlice> {
    let started = Instant::now();
    loop {
        let (upstream, ours, ours_raw) = slices_by_owner(client);
        let (upstream, ours) = (comparable(&upstream, large), comparable(&ours, large));
        if upstream == ours && !ours.is_empty() {
            return ours_raw;
        }
        if started.elapsed() > CONVERGE_WITHIN {
            let mut report = String::new();
            for service in upstream.keys().chain(ours.keys()).collect::<BTreeSet<_>>() {
                if upstream.get(service) != ours.get(service) {
                    report.push_str(&format!(
                        "\n== {service}\nkube-controller-manager: {}\nsvcplane:                {}\n",
                        serde_json::to_string(&upstream.get(service)).unwrap(),
                        serde_json::to_string(&ours.get(service)).unwrap()
                    ));
                }
            }
            panic!("{what}: the slices differ after {CONVERGE_WITHIN:?}:{report}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn svcplanes_endpoint_slices_equal_kube_controller_managers_and_one_pod_change_costs_one_write() {
    let Some(binaries) = binaries_for_test("kube_controller") else { return };
    let (namespace, plane, client) = start_api(&binaries);

    for (node, zone) in [("node-a", "zone-a"), ("node-b", "zone-b")] {
        let ip: IpAddr = if node == "node-a" { "198.18.0.11" } else { "198.18.0.12" }.parse().unwrap();
        client.create_node(&objects::node(node, &[ip], Some(zone))).unwrap();
    }
    let services = [
        service("web", "web", IntOrString::Int(8080), |_| {}),
        service("named", "named", IntOrString::String("http".into()), |_| {}),
        service("empty", "nobody", IntOrString::Int(8080), |_| {}),
        service("headless", "web", IntOrString::Int(8080), |spec| spec.cluster_ip = Some("None".into())),
        service("close", "web", IntOrString::Int(8080), |spec| spec.traffic_distribution = Some("PreferClose".into())),
        service("unready", "web", IntOrString::Int(8080), |spec| spec.publish_not_ready_addresses = Some(true)),
        service("big", "big", IntOrString::Int(8080), |_| {}),
    ];
    for service in &services {
        client.create(service).unwrap();
    }
    let mut n = 0;
    let mut next_ips = || {
        n += 1;
        pod_ips(n)
    };
    // web: ready and not ready Pods on both nodes, one without an IP yet, one on a Node that
    // does not exist, one finished, one with a hostname in the headless Service's subdomain.
    for (name, node, ready) in [("web-1", "node-a", true), ("web-2", "node-b", true), ("web-3", "node-a", false)] {
        let pod =
            objects::pod("default", name, node, &[("app", "web")], &[("http", 8080, "TCP"), ("dns", 5353, "UDP")]);
        objects::create_running_pod(&client, &pod, &next_ips(), ready).unwrap();
    }
    client.create(&objects::pod("default", "web-pending", "node-a", &[("app", "web")], &[])).unwrap();
    let ghost = objects::pod("default", "web-ghost", "node-z", &[("app", "web")], &[]);
    objects::create_running_pod(&client, &ghost, &next_ips(), true).unwrap();
    let finished = objects::pod("default", "web-done", "node-b", &[("app", "web")], &[]);
    objects::create_running_pod(&client, &finished, &next_ips(), true).unwrap();
    client
        .merge_patch::<Pod>("default", "web-done", serde_json::json!({"status": {"phase": "Succeeded"}}), true)
        .unwrap();
    let mut named_host = objects::pod("default", "web-host", "node-b", &[("app", "web")], &[("http", 8080, "TCP")]);
    if let Some(spec) = named_host.spec.as_mut() {
        spec.hostname = Some("db-0".into());
        spec.subdomain = Some("headless".into());
    }
    objects::create_running_pod(&client, &named_host, &next_ips(), true).unwrap();
    // A terminating Pod: deleted with a grace period, no kubelet to finish it.
    let leaving = objects::pod("default", "web-leaving", "node-a", &[("app", "web")], &[("http", 8080, "TCP")]);
    objects::create_running_pod(&client, &leaving, &next_ips(), true).unwrap();
    client.delete::<Pod>("default", "web-leaving", Some(30)).unwrap();
    // named: the target port resolves per Pod; one Pod lacks the name.
    for (name, port) in [("named-1", 8080), ("named-2", 9090)] {
        let pod = objects::pod("default", name, "node-a", &[("app", "named")], &[("http", port, "TCP")]);
        objects::create_running_pod(&client, &pod, &next_ips(), true).unwrap();
    }
    let nameless = objects::pod("default", "named-3", "node-b", &[("app", "named")], &[("other", 7070, "TCP")]);
    objects::create_running_pod(&client, &nameless, &next_ips(), true).unwrap();
    // big: 230 Pods, three slices per family.
    for i in 0..230 {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        let pod = objects::pod("default", &format!("big-{i}"), node, &[("app", "big")], &[("http", 8080, "TCP")]);
        objects::create_running_pod(&client, &pod, &next_ips(), true).unwrap();
    }

    plane.start_controller_manager("endpointslice-controller").expect("kube-controller-manager");
    let kubeconfig = plane.kubeconfig().display().to_string();
    let args: Vec<String> = vec!["controller".into(), "--kubeconfig".into(), kubeconfig];
    plane.spawn("svcplane-controller", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();

    let large = BTreeSet::from(["big"]);
    let before = wait_until_equal(&client, &large, "the initial state");
    let big_before: BTreeMap<String, String> = before
        .iter()
        .filter(|s| {
            s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).map(String::as_str)
                == Some("big")
        })
        .map(|s| (s.metadata.name.clone().unwrap(), s.metadata.resource_version.clone().unwrap()))
        .collect();
    assert_eq!(big_before.len(), 6, "230 endpoints per family in slices of at most 100: {big_before:?}");

    // One Pod of the large Service becomes unready: one slice per family changes, no more.
    objects::set_ready(&client, "default", "big-117", false).unwrap();
    let unready_seen = |slices: &[EndpointSlice]| {
        slices.iter().flat_map(|s| &s.endpoints).any(|e| {
            e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some("big-117")
                && e.conditions.as_ref().and_then(|c| c.ready) == Some(false)
        })
    };
    let started = Instant::now();
    while !unready_seen(&slices_by_owner(&client).2) {
        assert!(started.elapsed() < CONVERGE_WITHIN, "svcplane did not see big-117 become unready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = wait_until_equal(&client, &large, "after one Pod became unready");
    let big_after: BTreeMap<String, String> = after
        .iter()
        .filter(|s| {
            s.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).map(String::as_str)
                == Some("big")
        })
        .map(|s| (s.metadata.name.clone().unwrap(), s.metadata.resource_version.clone().unwrap()))
        .collect();
    assert_eq!(big_after.keys().collect::<Vec<_>>(), big_before.keys().collect::<Vec<_>>(), "no slice replaced");
    let rewritten = big_after.iter().filter(|(name, version)| big_before[*name] != **version).count();
    assert_eq!(rewritten, 2, "one slice per family is rewritten: {big_before:?} -> {big_after:?}");

    // A Service goes away: svcplane removes its slices itself (no garbage collector runs).
    client.delete::<Service>("default", "named", None).unwrap();
    let gone = |client: &NetnsClient| {
        let (_, ours, _) = slices_by_owner(client);
        !ours.contains_key("named")
    };
    let started = Instant::now();
    while !gone(&client) {
        assert!(started.elapsed() < CONVERGE_WITHIN, "svcplane kept the slices of a deleted Service");
        std::thread::sleep(Duration::from_millis(250));
    }
    plane.check_running("svcplane-controller").expect("svcplane controller still runs");
    plane.check_running("kube-controller-manager").expect("kube-controller-manager still runs");
}

/// Names and resourceVersions of the slices managed by `manager`.
fn versions(client: &NetnsClient, manager: &str) -> BTreeMap<String, String> {
    let slices: Vec<EndpointSlice> =
        client.list(Some("default"), Some(&format!("endpointslice.kubernetes.io/managed-by={manager}"))).unwrap();
    slices
        .into_iter()
        .map(|s| (s.metadata.name.unwrap_or_default(), s.metadata.resource_version.unwrap_or_default()))
        .collect()
}

#[test]
fn svcplane_takes_over_kube_controller_managers_slices_without_rewriting_them() {
    let Some(binaries) = binaries_for_test("kube_controller") else { return };
    let (namespace, plane, client) = start_api(&binaries);
    client.create_node(&objects::node("node-a", &["198.18.0.11".parse().unwrap()], Some("zone-a"))).unwrap();
    client.create(&service("web", "web", IntOrString::Int(8080), |_| {})).unwrap();
    client.create(&service("empty", "nobody", IntOrString::Int(8080), |_| {})).unwrap();
    for i in 0..130 {
        let pod = objects::pod("default", &format!("web-{i}"), "node-a", &[("app", "web")], &[]);
        objects::create_running_pod(&client, &pod, &pod_ips(i), true).unwrap();
    }

    plane.start_controller_manager("endpointslice-controller").expect("kube-controller-manager");
    // 130 endpoints per family: two slices each, plus the placeholders of `empty`.
    let written = eventually_versions(&client, UPSTREAM, 6);
    plane.stop("kube-controller-manager");

    let kubeconfig = plane.kubeconfig().display().to_string();
    let args: Vec<String> =
        ["controller", "--kubeconfig", &kubeconfig, "--managed-by", UPSTREAM].map(String::from).to_vec();
    let (_, log) = plane.spawn("svcplane-controller", namespace.name(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
    let started = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("initial sync done") {
        assert!(
            started.elapsed() < CONVERGE_WITHIN,
            "svcplane controller did not sync:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(versions(&client, UPSTREAM), written, "taking over rewrote slices");

    // From now on svcplane maintains them: a Pod leaves, one slice per family changes.
    client.delete::<Pod>("default", "web-7", Some(0)).unwrap();
    let started = Instant::now();
    loop {
        let now = versions(&client, UPSTREAM);
        let changed = now.iter().filter(|(name, version)| written.get(*name) != Some(*version)).count();
        if changed > 0 {
            assert_eq!(now.len(), written.len(), "no slice added or removed: {written:?} -> {now:?}");
            let slices: Vec<EndpointSlice> =
                client.list(Some("default"), Some("kubernetes.io/service-name=web")).unwrap();
            let count: usize = slices.iter().map(|s| s.endpoints.len()).sum();
            if count == 2 * 129 {
                assert_eq!(changed, 2, "one slice per family: {written:?} -> {now:?}");
                break;
            }
        }
        assert!(started.elapsed() < CONVERGE_WITHIN, "svcplane did not remove the deleted Pod's endpoints");
        std::thread::sleep(Duration::from_millis(100));
    }
    plane.check_running("svcplane-controller").expect("svcplane controller still runs");
}

/// Waits until `manager` has written `count` slices, then returns their versions.
fn eventually_versions(client: &NetnsClient, manager: &str, count: usize) -> BTreeMap<String, String> {
    let started = Instant::now();
    loop {
        let now = versions(client, manager);
        if now.len() == count {
            // Let the controller finish writing the last one's contents.
            std::thread::sleep(Duration::from_secs(1));
            return versions(client, manager);
        }
        assert!(started.elapsed() < CONVERGE_WITHIN, "{manager} wrote {now:?}, expected {count} slices");
        std::thread::sleep(Duration::from_millis(100));
    }
}

const LEASE_NAMESPACE: &str = "kube-system";
const LEASE_NAME: &str = "svcplane-controller";
/// kube-controller-manager's defaults, which `svcplane controller` shares.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// One `svcplane controller` replica started by the test.
struct Replica {
    what: String,
    log: std::path::PathBuf,
    identity: String,
    metrics: std::net::SocketAddr,
}

impl Replica {
    fn start(plane: &ControlPlane, what: &str) -> Replica {
        let kubeconfig = plane.kubeconfig().display().to_string();
        let args: Vec<String> = ["controller", "--kubeconfig", &kubeconfig, "--metrics-bind-address", "127.0.0.1:0"]
            .map(String::from)
            .to_vec();
        let (_, log) = plane.spawn(what, plane.namespace(), env!("CARGO_BIN_EXE_svcplane"), &args).unwrap();
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let metrics = text.lines().find_map(|l| l.strip_prefix("metrics on ")).map(|a| a.trim().parse().unwrap());
            let identity = text
                .lines()
                .filter(|l| l.contains("waiting to lead"))
                .find_map(|l| l.split("identity=").nth(1))
                .map(|rest| rest.split_whitespace().next().unwrap_or_default().to_owned());
            if let (Some(metrics), Some(identity)) = (metrics, identity) {
                return Replica { what: what.to_owned(), log, identity, metrics };
            }
            assert!(started.elapsed() < CONVERGE_WITHIN, "{what} did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its `/metrics`, fetched inside the lab namespace.
    fn metrics(&self, plane: &ControlPlane) -> String {
        let output = std::process::Command::new("ip")
            .args(["netns", "exec", plane.namespace(), "curl", "-fsS", "--max-time", "5"])
            .arg(format!("http://{}/metrics", self.metrics))
            .output()
            .expect("running curl");
        assert!(output.status.success(), "scraping {}: {}", self.what, String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }

    /// The value of one series (a whole line's label part, `name{labels}`) in its metrics.
    fn value(&self, plane: &ControlPlane, series: &str) -> f64 {
        let text = self.metrics(plane);
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{series} missing from the metrics of {}:\n{text}", self.what))
            .parse()
            .unwrap()
    }

    /// Slice writes it made (creates, updates, deletes).
    fn writes(&self, plane: &ControlPlane) -> f64 {
        ["create", "update", "delete"]
            .iter()
            .map(|op| self.value(plane, &format!("endpoint_slice_controller_changes{{operation=\"{op}\"}}")))
            .sum()
    }
}

fn lease_holder(client: &NetnsClient) -> Option<String> {
    let lease: k8s_openapi::api::coordination::v1::Lease = client.get(LEASE_NAMESPACE, LEASE_NAME).ok()?;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Waits until the Lease names a holder among `replicas` and returns its index.
fn wait_for_holder(client: &NetnsClient, replicas: &[&Replica], limit: Duration) -> (usize, Duration) {
    let started = Instant::now();
    loop {
        if let Some(holder) = lease_holder(client)
            && let Some(i) = replicas.iter().position(|r| r.identity == holder)
        {
            return (i, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "no replica of {:?} took the Lease within {limit:?}",
            replicas.iter().map(|r| &r.what).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until Service `name`'s slices (ours) hold `endpoints` endpoints in all.
fn wait_for_endpoints(client: &NetnsClient, name: &str, endpoints: usize) -> Duration {
    let started = Instant::now();
    loop {
        let slices: Vec<EndpointSlice> = client
            .list(
                Some("default"),
                Some(&format!("kubernetes.io/service-name={name},endpointslice.kubernetes.io/managed-by={OURS}")),
            )
            .unwrap();
        if slices.iter().map(|s| s.endpoints.len()).sum::<usize>() == endpoints && !slices.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < CONVERGE_WITHIN,
            "the slices of {name} never held {endpoints} endpoints: {slices:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn create_app(client: &NetnsClient, name: &str, pods: u32, first_ip: u32) {
    client.create(&service(name, name, IntOrString::Int(8080), |_| {})).unwrap();
    for i in 0..pods {
        let pod = objects::pod("default", &format!("{name}-{i}"), "node-a", &[("app", name)], &[]);
        objects::create_running_pod(client, &pod, &pod_ips(first_ip + i), true).unwrap();
    }
}

#[test]
fn of_two_controller_replicas_only_the_lease_holder_writes_and_the_other_takes_over_when_it_dies_or_stops() {
    let Some(binaries) = binaries_for_test("kube_controller") else { return };
    let (_namespace, plane, client) = start_api(&binaries);
    client.create_node(&objects::node("node-a", &["198.18.0.11".parse().unwrap()], Some("zone-a"))).unwrap();
    create_app(&client, "first", 3, 0);

    let a = Replica::start(&plane, "replica-a");
    let b = Replica::start(&plane, "replica-b");
    let (leader, _) = wait_for_holder(&client, &[&a, &b], CONVERGE_WITHIN);
    let (leader, follower) = if leader == 0 { (&a, &b) } else { (&b, &a) };
    wait_for_endpoints(&client, "first", 6);

    // While the leader lives, the follower writes nothing, however the cluster changes.
    create_app(&client, "second", 2, 10);
    wait_for_endpoints(&client, "second", 4);
    std::thread::sleep(2 * RETRY_PERIOD);
    assert_eq!(lease_holder(&client).as_deref(), Some(leader.identity.as_str()), "the Lease changed hands");
    assert!(leader.writes(&plane) >= 2.0, "the leader wrote the slices:\n{}", leader.metrics(&plane));
    assert_eq!(follower.writes(&plane), 0.0, "the follower wrote slices:\n{}", follower.metrics(&plane));
    assert_eq!(follower.value(&plane, "endpoint_slice_controller_syncs{result=\"success\"}"), 0.0);
    let status = |r: &Replica| r.value(&plane, &format!("leader_election_master_status{{name=\"{LEASE_NAME}\"}}"));
    assert_eq!((status(leader), status(follower)), (1.0, 0.0));
    assert!(!follower.log().contains("EndpointSlices written"), "the follower wrote:\n{}", follower.log());

    // The leader dies without a word: the follower waits out the lease, then leads.
    plane.stop(&leader.what);
    let killed = Instant::now();
    create_app(&client, "third", 2, 20);
    let (_, _) = wait_for_holder(&client, &[follower], LEASE_DURATION + 3 * RETRY_PERIOD + Duration::from_secs(5));
    let failover = killed.elapsed();
    let slices_after = wait_for_endpoints(&client, "third", 4) + failover;
    eprintln!("SIGKILL failover: Lease taken after {failover:?}, new Service's slices after {slices_after:?}");
    // The follower counts the lease from when it saw the last renewal, at most one retry
    // period before the kill.
    assert!(failover >= LEASE_DURATION - RETRY_PERIOD - Duration::from_secs(1), "taken over too early: {failover:?}");
    assert_eq!(status(follower), 1.0);
    let new_leader = follower;

    // A graceful stop releases the Lease: a new follower takes it within about one retry.
    let c = Replica::start(&plane, "replica-c");
    std::thread::sleep(RETRY_PERIOD);
    assert_eq!(lease_holder(&client).as_deref(), Some(new_leader.identity.as_str()));
    plane.terminate(&new_leader.what);
    let terminated = Instant::now();
    let (_, _) = wait_for_holder(&client, &[&c], LEASE_DURATION);
    let handover = terminated.elapsed();
    eprintln!("SIGTERM handover: Lease taken after {handover:?}");
    assert!(handover < 3 * RETRY_PERIOD, "SIGTERM did not release the Lease: taken after {handover:?}");
    assert!(new_leader.log().contains("released the Lease"), "{}", new_leader.log());
    let exited = Instant::now();
    loop {
        match plane.check_running(&new_leader.what) {
            Err(svcplane_control_plane::ControlPlaneError::Exited { status, .. }) => {
                assert!(status.success(), "a stopped replica exits 0: {status}\n{}", new_leader.log());
                break;
            }
            other => assert!(exited.elapsed() < Duration::from_secs(10), "the stopped replica still runs: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    create_app(&client, "fourth", 1, 30);
    wait_for_endpoints(&client, "fourth", 2);
    assert_eq!(status(&c), 1.0);
}

#[test]
fn a_leader_that_cannot_renew_within_the_renew_deadline_gives_up_and_exits_1() {
    let Some(binaries) = binaries_for_test("kube_controller") else { return };
    let (_namespace, mut plane, client) = start_api(&binaries);
    client.create_node(&objects::node("node-a", &["198.18.0.11".parse().unwrap()], Some("zone-a"))).unwrap();
    create_app(&client, "first", 1, 0);
    let leader = Replica::start(&plane, "replica-a");
    wait_for_holder(&client, &[&leader], CONVERGE_WITHIN);
    wait_for_endpoints(&client, "first", 2);

    // The API server goes away: no renewal can succeed.
    plane.kill_apiserver();
    let cut = Instant::now();
    let renew_deadline = Duration::from_secs(10);
    let status = loop {
        match plane.check_running(&leader.what) {
            Err(svcplane_control_plane::ControlPlaneError::Exited { status, .. }) => break status,
            _ => assert!(
                cut.elapsed() < renew_deadline + 2 * RETRY_PERIOD + Duration::from_secs(5),
                "the leader still runs {:?} after the API server went away:\n{}",
                cut.elapsed(),
                leader.log()
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let gave_up = cut.elapsed();
    eprintln!("leader gave up {gave_up:?} after the API server went away");
    assert_eq!(status.code(), Some(1), "{}", leader.log());
    // Its last renewal was at most one retry period before the cut.
    assert!(gave_up >= renew_deadline - RETRY_PERIOD - Duration::from_secs(1), "gave up too early: {gave_up:?}");
    assert!(leader.log().contains("leader election lost"), "{}", leader.log());
}
