//! Side by side with upstream: the shared scenario table against upstream kube-proxy
//! (nftables mode) and against `svcplane proxy`, both reading the same Services, Pods and
//! EndpointSlices from a real API server.
//!
//! Two identical two-node labs are built. Each gets its own control plane on its LAN, the
//! scenario fixture (Nodes, Services with their fixed addresses and ports, Pods with their
//! status, explicit EndpointSlices) written through the API, and kube-controller-manager's
//! EndpointSlice controller; then one lab runs upstream kube-proxy on both nodes, the other
//! `svcplane proxy --kubeconfig` on both nodes, both with `--nodeport-addresses primary`.
//! Every row of the table (each family) is probed in both labs and what was seen (which
//! pods answered and which source address they saw, a refusal, silence, the health check's
//! answer) must be the same. A difference fails the test unless [`deliberate`] names it
//! as a deliberate improvement, with the reason.
//!
//! Not compared here: rows that change endpoints while they run (the table's
//! `ENDPOINT_CHANGES`, which drive the manifests directory), and the NodePort address
//! defaults (kube-proxy's nftables mode defaults to the primary addresses, svcplane to all
//! of them, as kube-proxy's iptables mode: both run with `primary` here).
//!
//! Skipped when the upstream binaries are not built or the test is not root, unless
//! `SVCPLANE_REQUIRE_K8S=1` (CI) makes that a failure.

mod kube_support;
mod scenarios;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_support::{CLUSTER_CIDRS, KubeLab, eventually};
use scenarios::manifests::{self, CLIENT_INSIDE_RANGES, CLIENTS, LAB_PODS, OTHER_NODE, THIS_NODE};
use scenarios::net::{self, Failure};
use scenarios::real::{Resolved, resolve};
use scenarios::{Family, Outcome, Protocol, Scenario};
use svcplane_control_plane::{UpstreamBinaries, binaries_for_test};
use svcplane_testbed::Lab;

/// Where svcplane deliberately behaves differently from upstream kube-proxy: the reason, or
/// `None` when the difference is a failure.
fn deliberate(row: &Scenario, theirs: &Seen, mine: &Seen) -> Option<&'static str> {
    let refused_at_once = row.expect == Outcome::Rejected && row.protocol == Protocol::Tcp && row.family == Family::V6;
    (refused_at_once && *theirs == Seen::Silent && *mine == Seen::Refused).then_some(
        "kube-proxy's `reject-chain` answers IPv6 TCP with an ICMPv6 port unreachable, which the client here never \
         sees as a refusal (it times out); svcplane resets TCP in both families, so the client fails at once as \
         the row requires",
    )
}

const PROGRAMMED_WITHIN: Duration = Duration::from_secs(60);
/// What [`Side::nudge_zone`] appends to a Node's zone for a moment.
const NUDGED_SUFFIX: &str = "-nudged";
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
const SILENCE_TIMEOUT: Duration = Duration::from_millis(800);
const MAX_PROBES: usize = 60;
const PARALLEL_ROWS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Implementation {
    KubeProxy,
    Svcplane,
}

impl Implementation {
    fn name(self) -> &'static str {
        match self {
            Implementation::KubeProxy => "kube-proxy",
            Implementation::Svcplane => "svcplane",
        }
    }
}

/// One lab with its control plane and proxies.
struct Side {
    implementation: Implementation,
    kube: KubeLab,
    logs: Vec<std::path::PathBuf>,
}

fn build_lab() -> Lab {
    let lab = Lab::builder()
        .nodes(2)
        .pods_per_node(2)
        .pod(THIS_NODE, manifests::POD_ON_THIS_NODE)
        .pod(OTHER_NODE, manifests::POD_ON_OTHER_NODE)
        .clients(CLIENTS)
        .build()
        .expect("a lab (needs root)");
    for pod in LAB_PODS {
        let lab_pod = lab.pod(pod.name);
        assert_eq!(lab_pod.node(), pod.node);
        assert_eq!(lab_pod.ips(), [manifests::pod_ip(pod.name, Family::V4), manifests::pod_ip(pod.name, Family::V6)]);
    }
    lab.start_echo_in_all_pods(manifests::ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane"))).expect("echo servers");
    for client in 1..=CLIENTS {
        lab.route_cluster_ranges_via(client, THIS_NODE).expect("routing the clients via node1");
    }
    // As the scenario fixture: secondary node addresses, no ICMP rate limit, the affinity
    // clients' extra addresses.
    for node in lab.nodes() {
        let namespace = node.namespace_name();
        let v4 = manifests::node_secondary_ip(node.index(), Family::V4);
        let v6 = manifests::node_secondary_ip(node.index(), Family::V6);
        let (v4, v6) = (format!("{v4}/32"), format!("{v6}/128"));
        let commands: [&[&str]; 4] = [
            &["ip", "address", "add", &v4, "dev", node.lan_interface()],
            &["ip", "address", "add", &v6, "dev", node.lan_interface(), "nodad", "preferred_lft", "0"],
            &["sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"],
            &["sysctl", "-qw", "net.ipv6.icmp.ratelimit=0"],
        ];
        for command in commands {
            lab.exec_ok(namespace, command).expect("preparing a node");
        }
    }
    let client = lab.client(CLIENT_INSIDE_RANGES).namespace_name().to_owned();
    for family in [Family::V4, Family::V6] {
        for ip in manifests::affinity_client_ips(family) {
            let command: Vec<String> = if ip.is_ipv4() {
                ["ip", "address", "add", &format!("{ip}/24"), "dev", "eth0"].map(String::from).to_vec()
            } else {
                ["ip", "address", "add", &format!("{ip}/64"), "dev", "eth0", "nodad", "preferred_lft", "0"]
                    .map(String::from)
                    .to_vec()
            };
            lab.exec_ok(&client, &command).expect("affinity client addresses");
        }
    }
    lab
}

/// Writes the scenario fixture through the API: Nodes, Services (with their load-balancer
/// status), Pods (then their status, as a kubelet would; Pods the fixture shows as being
/// deleted are deleted with a long grace period), explicit EndpointSlices.
fn load_fixture(kube: &KubeLab) -> BTreeSet<String> {
    let dir = tempfile::tempdir().expect("a directory for the fixture");
    for (file, text) in manifests::initial_files() {
        std::fs::write(dir.path().join(file), text).expect("writing the fixture");
    }
    let loaded = svcplane_source::load_directory(dir.path());
    assert!(loaded.errors.is_empty(), "the fixture parses: {:?}", loaded.errors);
    let objects = loaded.objects;
    for node in &objects.nodes {
        kube.client.create_node(node).expect("a Node");
    }
    for service in &objects.services {
        let mut spec_only = service.clone();
        spec_only.status = None;
        spec_only.metadata.namespace.get_or_insert_with(|| "default".into());
        let name = service.metadata.name.clone().unwrap_or_default();
        kube.client.create(&spec_only).unwrap_or_else(|e| panic!("Service {name}: {e}"));
        if let Some(status) = &service.status {
            kube.client
                .merge_patch::<Service>("default", &name, serde_json::json!({ "status": status }), true)
                .unwrap_or_else(|e| panic!("status of Service {name}: {e}"));
        }
    }
    for pod in &objects.pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut spec_only = pod.clone();
        spec_only.status = None;
        // The manifests feed keeps of a Pod only what Services read (not its images), and
        // the API server requires a container with an image: give it a placeholder.
        let spec = spec_only.spec.get_or_insert_with(Default::default);
        if spec.containers.is_empty() {
            spec.containers.push(Container { name: "app".into(), ..Container::default() });
        }
        for container in &mut spec.containers {
            container.image.get_or_insert_with(|| "registry.invalid/app".into());
        }
        spec_only.metadata.deletion_timestamp = None;
        spec_only.metadata.namespace.get_or_insert_with(|| "default".into());
        kube.client.create(&spec_only).unwrap_or_else(|e| panic!("Pod {name}: {e}"));
        kube.client
            .merge_patch::<Pod>("default", &name, serde_json::json!({ "status": pod.status }), true)
            .unwrap_or_else(|e| panic!("status of Pod {name}: {e}"));
        if pod.metadata.deletion_timestamp.is_some() {
            kube.client.delete::<Pod>("default", &name, Some(3600)).expect("deleting a Pod");
        }
    }
    for slice in &objects.slices {
        kube.client.create(slice).unwrap_or_else(|e| panic!("EndpointSlice {:?}: {e}", slice.metadata.name));
    }
    objects
        .services
        .iter()
        .filter(|s| s.spec.as_ref().and_then(|spec| spec.selector.as_ref()).is_some_and(|sel| !sel.is_empty()))
        .filter_map(|s| s.metadata.name.clone())
        .collect()
}

/// Waits until kube-controller-manager has written slices for every Service with a
/// selector. Every Pod exists before it starts, so its first slices are complete, and the
/// proxies started after this see the whole fixture in their initial lists.
fn wait_for_upstream_slices(kube: &KubeLab, services: &BTreeSet<String>) {
    let done = eventually(PROGRAMMED_WITHIN, || {
        let slices: Vec<EndpointSlice> = kube
            .client
            .list(Some("default"), Some("endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"))
            .ok()?;
        let covered: BTreeSet<String> = slices
            .iter()
            .filter_map(|s| s.metadata.labels.as_ref()?.get("kubernetes.io/service-name").cloned())
            .collect();
        services.is_subset(&covered).then_some(())
    });
    assert!(done.is_some(), "kube-controller-manager did not write the slices of {services:?} in time");
}

/// What kubeadm's kube-proxy ConfigMap would hold for this lab (`config.conf`).
fn kube_proxy_configuration(kubeconfig: &str) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         clientConnection:\n  kubeconfig: {kubeconfig}\nmode: nftables\nclusterCIDR: {}\n\
         nodePortAddresses: [primary]\nmetricsBindAddress: 127.0.0.1:10249\nhealthzBindAddress: 0.0.0.0:10256\n\
         conntrack:\n  maxPerCore: 0\n  tcpEstablishedTimeout: 0s\n  tcpCloseWaitTimeout: 0s\n",
        CLUSTER_CIDRS.join(",")
    )
}

fn start_side(binaries: &UpstreamBinaries, implementation: Implementation) -> Side {
    let kube = KubeLab::start_without_nodes(binaries, build_lab());
    let selecting = load_fixture(&kube);
    kube.plane.start_controller_manager("endpointslice-controller").expect("kube-controller-manager");
    wait_for_upstream_slices(&kube, &selecting);
    let kubeconfig = kube.plane.kubeconfig().display().to_string();
    // One KubeProxyConfiguration file and kubeadm's DaemonSet arguments, the same for both:
    // svcplane runs what a kube-proxy DaemonSet runs, unchanged.
    let config = kube.plane.dir().join(format!("kube-proxy-config-{}.yaml", implementation.name()));
    std::fs::write(&config, kube_proxy_configuration(&kubeconfig)).expect("writing the configuration file");
    let mut logs = Vec::new();
    for node in [THIS_NODE, OTHER_NODE] {
        let lab_node = kube.lab.node(node);
        let mut args: Vec<String> = match implementation {
            Implementation::KubeProxy => Vec::new(),
            Implementation::Svcplane => vec!["proxy".into()],
        };
        args.extend([
            format!("--config={}", config.display()),
            format!("--hostname-override={}", lab_node.name()),
            // 4: kube-proxy logs when it takes the Node's topology labels in only from 4 on.
            "--v=4".into(),
        ]);
        let program = match implementation {
            Implementation::KubeProxy => "kube-proxy",
            Implementation::Svcplane => env!("CARGO_BIN_EXE_svcplane"),
        };
        let what = format!("{}-{}", implementation.name(), lab_node.name());
        let (_, log) = kube.plane.spawn(&what, lab_node.namespace_name(), program, &args).expect("starting a proxy");
        logs.push(log);
    }
    let side = Side { implementation, kube, logs };
    side.wait_until_programmed();
    if implementation == Implementation::KubeProxy {
        side.wait_for_node_zones();
    }
    side
}

impl Side {
    fn lab(&self) -> &Lab {
        &self.kube.lab
    }

    fn log_tails(&self) -> String {
        self.logs.iter().map(|log| format!("--- {}\n{}\n", log.display(), kube_support::log_tail(log))).collect()
    }

    /// kube-proxy takes its Node's labels in from a Node informer of its own, which may
    /// not have delivered them by the time Services answer: until it has, it ignores
    /// topology hints, and the topology rows would compare a proxy that has not seen its
    /// zone yet. Waits for its log line saying it took the zone label in, on both nodes.
    ///
    /// kube-proxy v1.36 can also miss the zone for good: its topology handler joins a Node
    /// informer that has already synced, the informer replays the Node to it at once, and
    /// when that replay runs before the proxier is registered as the handler's listener the
    /// zone is recorded with no one told, and no later event differs (seen once in CI: no
    /// such line in 60 s). A Node whose proxy has not logged it within a few seconds is
    /// nudged: its zone label is changed and set back, two real changes the registered
    /// proxier hears.
    fn wait_for_node_zones(&self) {
        const NUDGE_AFTER: Duration = Duration::from_secs(10);
        let took_zone = |log: &std::path::PathBuf| {
            let lines = std::fs::read_to_string(log).unwrap_or_default();
            let last = lines.lines().rfind(|line| line.contains("Updated proxier node topology labels"));
            last.is_some_and(|line| line.contains("topology.kubernetes.io/zone") && !line.contains(NUDGED_SUFFIX))
        };
        if eventually(NUDGE_AFTER, || self.logs.iter().all(took_zone).then_some(())).is_none() {
            for (log, node) in self.logs.iter().zip([THIS_NODE, OTHER_NODE]) {
                if !took_zone(log) {
                    self.nudge_zone(self.lab().node(node).name());
                }
            }
        }
        let done = eventually(PROGRAMMED_WITHIN, || self.logs.iter().all(took_zone).then_some(()));
        assert!(
            done.is_some(),
            "{} did not take its Node's zone in within {PROGRAMMED_WITHIN:?}\n{}",
            self.implementation.name(),
            self.log_tails()
        );
    }

    /// Changes Node `name`'s zone label and sets it back.
    fn nudge_zone(&self, name: &str) {
        use kube::api::{Api, Patch, PatchParams};
        const ZONE: &str = "topology.kubernetes.io/zone";
        let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(self.kube.client.client());
        let name = name.to_owned();
        self.kube.client.run(async move {
            let node = nodes.get(&name).await.unwrap_or_else(|e| panic!("reading Node {name}: {e}"));
            let zone = node.metadata.labels.and_then(|labels| labels.get(ZONE).cloned());
            let zone = zone.unwrap_or_else(|| panic!("Node {name} has no {ZONE} label"));
            for value in [format!("{zone}{NUDGED_SUFFIX}"), zone] {
                let patch = serde_json::json!({ "metadata": { "labels": { ZONE: value } } });
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap_or_else(|e| panic!("patching Node {name}'s zone to {value}: {e}"));
            }
        });
    }

    /// The echo Service answers from both nodes in both families.
    fn wait_until_programmed(&self) {
        let echo = manifests::SERVICES.iter().find(|s| s.name == manifests::ECHO_SERVICE).expect("echo");
        let mut pending: Vec<(u16, SocketAddr)> = Vec::new();
        for node in [THIS_NODE, OTHER_NODE] {
            for v6 in [false, true] {
                pending.push((node, echo.cluster_ip_address(v6).expect("echo is dual-stack")));
            }
        }
        let done = eventually(PROGRAMMED_WITHIN, || {
            pending.retain(|(node, target)| {
                let namespace = self.lab().node(*node).namespace_name();
                self.lab().tcp_request(namespace, *target, Duration::from_millis(300)).is_err()
            });
            pending.is_empty().then_some(())
        });
        assert!(
            done.is_some(),
            "{} did not program the echo Service within {PROGRAMMED_WITHIN:?}\n{}",
            self.implementation.name(),
            self.log_tails()
        );
    }
}

/// What node1's proxy answers on its healthz and metrics servers, as probes and scrapers
/// see it: status codes and JSON keys, `/proxyMode`, and each `kubeproxy_` metric family
/// with its type and label names.
#[derive(Debug)]
struct Operational {
    healthz: (u16, BTreeSet<String>),
    livez: (u16, BTreeSet<String>),
    proxy_mode: String,
    families: BTreeMap<String, (String, BTreeSet<String>)>,
}

fn json_keys(body: &str) -> BTreeSet<String> {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let mut keys = BTreeSet::new();
    for (key, inner) in value.as_object().into_iter().flatten() {
        keys.insert(key.clone());
        for (family, fields) in inner.as_object().into_iter().flatten() {
            for field in fields.as_object().into_iter().flatten().map(|(k, _)| k) {
                keys.insert(format!("{key}.{family}.{field}"));
            }
        }
    }
    keys
}

fn operational(side: &Side) -> Operational {
    let node = side.lab().node(THIS_NODE);
    let namespace = node.namespace_name().to_owned();
    let healthz = SocketAddr::new(node.ip_v4().into(), 10256);
    let metrics: SocketAddr = "127.0.0.1:10249".parse().expect("an address");
    let get = |address: SocketAddr, path: &str| {
        let path = path.to_owned();
        let (status, _, body) =
            svcplane_testbed::run_in_namespace(&namespace, move || svcplane_ops::http::get(address, &path))
                .expect("entering node1")
                .unwrap_or_else(|error| panic!("{}: GET {address}: {error}", side.implementation.name()));
        (status, body)
    };
    let (healthz_status, healthz_body) = get(healthz, "/healthz");
    let (livez_status, livez_body) = get(healthz, "/livez");
    let mut families: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for line in get(metrics, "/metrics").1.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                families.entry(name.to_owned()).or_default().0 = kind.to_owned();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|f| families.contains_key(*f)))
                .unwrap_or(name);
            let labels = line.split_once('{').and_then(|(_, rest)| rest.split_once('}')).map(|(l, _)| l).unwrap_or("");
            let entry = families.entry(family.to_owned()).or_default();
            for label in labels.split(',').filter_map(|pair| pair.split_once('=')).map(|(k, _)| k) {
                if label != "le" {
                    entry.1.insert(label.to_owned());
                }
            }
        }
    }
    families.retain(|name, _| name.starts_with("kubeproxy_"));
    Operational {
        healthz: (healthz_status, json_keys(&healthz_body)),
        livez: (livez_status, json_keys(&livez_body)),
        proxy_mode: get(metrics, "/proxyMode").1.trim().to_owned(),
        families,
    }
}

/// Probes and scrapers must read svcplane as they read kube-proxy: same codes, same JSON
/// keys, and every `kubeproxy_` family kube-proxy serves is served alike (type and label
/// names) or named in docs/operations.md as not covered.
fn compare_operational_endpoints(theirs: &Operational, mine: &Operational) -> Vec<String> {
    let mut failures = Vec::new();
    for (what, a, b) in [("/healthz", &theirs.healthz, &mine.healthz), ("/livez", &theirs.livez, &mine.livez)] {
        if a != b {
            failures.push(format!("{what}\n    kube-proxy: {a:?}\n    svcplane:   {b:?}"));
        }
    }
    if theirs.proxy_mode != mine.proxy_mode {
        failures.push(format!("/proxyMode: kube-proxy {:?}, svcplane {:?}", theirs.proxy_mode, mine.proxy_mode));
    }
    let docs = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operations.md"))
        .expect("docs/operations.md");
    let (mut alike, mut documented) = (0, 0);
    for (name, (kind, labels)) in &theirs.families {
        match mine.families.get(name) {
            // A family svcplane has not fed yet shows no labels; its type must still agree.
            Some((my_kind, my_labels)) if my_kind == kind && (my_labels == labels || my_labels.is_empty()) => {
                alike += 1;
            }
            Some(other) => failures.push(format!(
                "metric {name}\n    kube-proxy: {kind} {labels:?}\n    svcplane:   {} {:?}",
                other.0, other.1
            )),
            None if docs.contains(&format!("`{name}`")) => documented += 1,
            None => failures.push(format!(
                "kube-proxy serves {name} ({kind} {labels:?}); svcplane neither does nor lists it in docs/operations.md"
            )),
        }
    }
    eprintln!(
        "operational endpoints: /healthz, /livez, /proxyMode compared; of kube-proxy's {} kubeproxy_ families, \
         {alike} served alike and {documented} listed as not covered",
        theirs.families.len()
    );
    failures
}

/// What one row's probes saw in one lab.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Which pods answered and what each saw as the client (`client`, `node`, or the address).
    Answered(BTreeMap<String, BTreeSet<String>>),
    /// Sticky rows: how many different pods one client reached in a row of requests.
    Sticky(usize),
    Refused,
    Silent,
    Health {
        status: u16,
        local_endpoints: Option<u64>,
    },
    /// The row has no address of that family to send to.
    NoTarget,
    Failed(String),
}

fn source_kind(resolved: &Resolved, reply: &svcplane_testbed::EchoReply) -> String {
    let seen = reply.client_addr.ip();
    if seen == resolved.client_ip {
        "client".into()
    } else if manifests::node_addresses(resolved.entry_node).contains(&seen) {
        "node".into()
    } else {
        seen.to_string()
    }
}

fn namespace_of(lab: &Lab, resolved: &Resolved) -> String {
    match (resolved.sender_pod, resolved.client) {
        (Some(pod), _) => lab.pod(pod).namespace_name().to_owned(),
        (None, Some(client)) => lab.client(client).namespace_name().to_owned(),
        (None, None) => lab.node(resolved.entry_node).namespace_name().to_owned(),
    }
}

fn observe(side: &Side, row: &Scenario) -> Seen {
    let Some(service) = manifests::SERVICES.iter().find(|s| s.name == row.service) else {
        return Seen::Failed(format!("no Service {}", row.service));
    };
    let resolved = match resolve(row, service) {
        Ok(resolved) => resolved,
        Err(error) => return Seen::Failed(error),
    };
    let Some(target) = resolved.target else { return Seen::NoTarget };
    let lab = side.lab();
    let namespace = namespace_of(lab, &resolved);
    if let Outcome::HealthCheck { .. } = row.expect {
        return match net::http_get(lab, &namespace, target, ANSWER_TIMEOUT) {
            Ok((status, body)) => {
                let local_endpoints = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|json| json.get("localEndpoints").and_then(serde_json::Value::as_u64));
                Seen::Health { status, local_endpoints }
            }
            Err(error) => Seen::Failed(format!("{error}")),
        };
    }
    let expected: BTreeSet<&str> = match row.expect {
        Outcome::Answered { by } => by.iter().copied().collect(),
        _ => BTreeSet::new(),
    };
    let sticky = matches!(row.expect, Outcome::StickyThenFreshAfterIdle { .. } | Outcome::StickyWhileTalking { .. });
    let timeout = if expected.is_empty() && !sticky { SILENCE_TIMEOUT } else { ANSWER_TIMEOUT };
    let mut answers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for sent in 0..MAX_PROBES {
        let enough =
            if sticky { sent >= 6 } else { sent >= 2 && expected.iter().all(|pod| answers.contains_key(*pod)) };
        if enough {
            break;
        }
        match net::request(lab, &namespace, row.protocol, target, None, timeout) {
            Ok(reply) => {
                let kind = source_kind(&resolved, &reply);
                answers.entry(reply.server_name).or_default().insert(kind);
            }
            Err(failure) if answers.is_empty() => {
                return match failure {
                    Failure::Refused => Seen::Refused,
                    Failure::TimedOut => Seen::Silent,
                    Failure::DroppedLocally => Seen::Refused,
                    Failure::Other(error) if error.contains("Operation not permitted") => Seen::Refused,
                    Failure::Other(error) => Seen::Failed(error),
                };
            }
            Err(failure) => return Seen::Failed(format!("after answers {answers:?}: {failure}")),
        }
    }
    if sticky { Seen::Sticky(answers.len()) } else { Seen::Answered(answers) }
}

/// The rows compared: the whole table but the rows that change endpoints and the NodePort
/// address sets whose flags differ from `primary`.
fn rows() -> Vec<Scenario> {
    let mut tables: Vec<&[Scenario]> = vec![
        scenarios::REACHABILITY,
        scenarios::NO_ENDPOINTS,
        scenarios::TRAFFIC_POLICY,
        scenarios::LOAD_BALANCER,
        scenarios::EXTERNAL_IPS,
        scenarios::HEALTH_CHECKS,
        scenarios::TERMINATING,
        scenarios::TOPOLOGY,
        scenarios::IGNORED,
        scenarios::NODEPORT_ADDRESSES_PRIMARY,
        scenarios::AFFINITY,
    ];
    if net::sctp_supported().is_ok() {
        tables.push(scenarios::SCTP);
    }
    tables.into_iter().flatten().filter(|row| !row.expect.mutates()).flat_map(Scenario::each_family).collect()
}

#[test]
fn upstream_kube_proxy_and_svcplane_answer_every_scenario_row_alike_from_the_same_api_server() {
    let Some(binaries) = binaries_for_test("kube_differential") else { return };
    let (upstream, ours) = std::thread::scope(|scope| {
        let upstream = scope.spawn(|| start_side(&binaries, Implementation::KubeProxy));
        let ours = scope.spawn(|| start_side(&binaries, Implementation::Svcplane));
        (upstream.join().expect("the kube-proxy lab"), ours.join().expect("the svcplane lab"))
    });
    let rows = rows();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(Scenario, Seen, Seen)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_ROWS {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(row) = rows.get(index) else { break };
                    let theirs = observe(&upstream, row);
                    let mine = observe(&ours, row);
                    results.lock().expect("results").push((*row, theirs, mine));
                }
            });
        }
    });
    let mut results = results.into_inner().expect("results");
    results.sort_by_key(|result| result.0.label());
    let mut failures = Vec::new();
    let mut same = 0;
    for (row, theirs, mine) in &results {
        let label = row.label();
        if theirs == mine {
            same += 1;
            continue;
        }
        match deliberate(row, theirs, mine) {
            Some(reason) => {
                eprintln!("deliberate difference: {label}: kube-proxy {theirs:?}, svcplane {mine:?}: {reason}");
            }
            None => failures.push(format!("{label}\n    kube-proxy: {theirs:?}\n    svcplane:   {mine:?}")),
        }
    }
    eprintln!("{same} of {} rows alike", results.len());
    failures.extend(compare_operational_endpoints(&operational(&upstream), &operational(&ours)));
    if !failures.is_empty() {
        panic!(
            "{} differences between upstream kube-proxy and svcplane ({} rows compared, then the healthz and metrics servers):\n{}\n\nkube-proxy logs:\n{}\nsvcplane logs:\n{}",
            failures.len(),
            results.len(),
            failures.join("\n"),
            upstream.log_tails(),
            ours.log_tails()
        );
    }
}
