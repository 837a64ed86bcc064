//! The fixture every scenario runs in: a two-node lab (two echo pods and one client pod per
//! node, one external client routed via node1), a manifests directory describing it, and
//! the real `svcplane proxy` running in each node's namespace with the backend under test.
//!
//! Dropping a [`Cluster`] kills the proxies, deletes the lab's namespaces and the temporary
//! directory, also when a test panics.

use std::fmt::Write as _;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use svcplane_testbed::{Lab, Pod};

use crate::scenarios::{Protocol, eventually};

/// The node whose proxy serves external traffic and the pods on it.
pub const THIS_NODE: u16 = 1;
/// The other node; its own proxy serves its pods.
pub const OTHER_NODE: u16 = 2;
/// Pods that back no Service, the senders of pod rows.
pub const POD_ON_THIS_NODE: &str = "node1-client";
pub const POD_ON_OTHER_NODE: &str = "node2-client";
/// An endpoint of every `app: echo` Service, the sender of hairpin rows.
pub const ENDPOINT_POD_ON_THIS_NODE: &str = "node1-pod1";

/// Where every echo server listens (all pods run one).
pub const ECHO_PORT: u16 = 8080;
/// The port of every Service (TCP and UDP).
pub const SERVICE_PORT: u16 = 80;
/// How long the proxies get to program the node after they start.
pub const PROGRAMMED_WITHIN: Duration = Duration::from_secs(10);

pub const SERVICE_CIDR_V4: &str = "198.19.0.0/16";
pub const SERVICE_CIDR_V6: &str = "2001:db8:f::/108";
pub const CLUSTER_CIDR_V4: &str = "198.18.128.0/17";
pub const CLUSTER_CIDR_V6: &str = "2001:db8:1::/48";

pub const ECHO_SERVICE: &str = "echo";
pub const EMPTY_SERVICE: &str = "empty";
pub const EXTERNAL_LOCAL_SERVICE: &str = "external-local";
pub const OTHER_NODE_EXTERNAL_LOCAL_SERVICE: &str = "node2-external-local";
pub const OTHER_NODE_INTERNAL_LOCAL_SERVICE: &str = "node2-internal-local";

/// How a backend is selected on the proxy's command line, and what to print about the node
/// when a scenario fails.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    pub name: &'static str,
    /// Appended to `svcplane proxy`, e.g. `--mode nftables`.
    pub proxy_args: &'static [&'static str],
    /// Commands run in node1's namespace for a failure report (e.g. `nft list ruleset`).
    pub diagnostics: &'static [&'static [&'static str]],
}

/// One port of a Service: TCP and UDP Services ports are both [`SERVICE_PORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    pub port: u16,
    pub node_port: Option<u16>,
}

/// A Service of the fixture: one TCP and one UDP port to the echo servers, explicit
/// addresses so tests know them without asking the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSpec {
    pub name: &'static str,
    pub cluster_ip_v4: Ipv4Addr,
    /// With one, the Service is `PreferDualStack` with both families.
    pub cluster_ip_v6: Option<Ipv6Addr>,
    /// Pods whose labels hold all of these.
    pub selector: &'static [(&'static str, &'static str)],
    /// `(tcp, udp)` nodePorts; with them, the Service is `type: NodePort`.
    pub node_ports: Option<(u16, u16)>,
    pub internal_traffic_local: bool,
    pub external_traffic_local: bool,
}

impl ServiceSpec {
    /// A single-stack ClusterIP Service in front of every echo pod.
    pub const fn cluster_ip(name: &'static str, ip: Ipv4Addr) -> Self {
        Self {
            name,
            cluster_ip_v4: ip,
            cluster_ip_v6: None,
            selector: &[("app", "echo")],
            node_ports: None,
            internal_traffic_local: false,
            external_traffic_local: false,
        }
    }

    pub fn port_for(&self, protocol: Protocol) -> PortSpec {
        let node_port = self.node_ports.map(|(tcp, udp)| match protocol {
            Protocol::Tcp => tcp,
            Protocol::Udp => udp,
        });
        PortSpec { port: SERVICE_PORT, node_port }
    }

    /// The ClusterIP address and Service port of a family.
    pub fn cluster_ip_address(&self, v6: bool) -> Option<SocketAddr> {
        let ip = if v6 { self.cluster_ip_v6.map(IpAddr::V6) } else { Some(IpAddr::V4(self.cluster_ip_v4)) };
        ip.map(|ip| SocketAddr::new(ip, SERVICE_PORT))
    }

    /// The Service as a manifest.
    pub fn manifest(&self) -> String {
        let mut text =
            format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {}\n  namespace: default\nspec:\n", self.name);
        let service_type = if self.node_ports.is_some() { "NodePort" } else { "ClusterIP" };
        let _ = writeln!(text, "  type: {service_type}");
        match self.cluster_ip_v6 {
            Some(v6) => {
                let _ = writeln!(
                    text,
                    "  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv4, IPv6]\n  clusterIP: \"{v4}\"\n  clusterIPs: [\"{v4}\", \"{v6}\"]",
                    v4 = self.cluster_ip_v4
                );
            }
            None => {
                let _ = writeln!(
                    text,
                    "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv4]\n  clusterIP: \"{v4}\"\n  clusterIPs: [\"{v4}\"]",
                    v4 = self.cluster_ip_v4
                );
            }
        }
        text.push_str("  selector:\n");
        for (key, value) in self.selector {
            let _ = writeln!(text, "    {key}: {value}");
        }
        let policy = |local: bool| if local { "Local" } else { "Cluster" };
        let _ = writeln!(text, "  internalTrafficPolicy: {}", policy(self.internal_traffic_local));
        if self.node_ports.is_some() {
            let _ = writeln!(text, "  externalTrafficPolicy: {}", policy(self.external_traffic_local));
        }
        text.push_str("  ports:\n");
        for (name, protocol) in [("tcp", Protocol::Tcp), ("udp", Protocol::Udp)] {
            let port = self.port_for(protocol);
            let _ = writeln!(
                text,
                "    - name: {name}\n      protocol: {}\n      port: {}\n      targetPort: {ECHO_PORT}",
                protocol.to_string().to_uppercase(),
                port.port
            );
            if let Some(node_port) = port.node_port {
                let _ = writeln!(text, "      nodePort: {node_port}");
            }
        }
        text
    }
}

/// The Services every cluster starts with.
pub const SERVICES: &[ServiceSpec] = &[
    // Dual-stack NodePort in front of all four echo pods.
    ServiceSpec {
        name: ECHO_SERVICE,
        cluster_ip_v4: Ipv4Addr::new(198, 19, 0, 10),
        cluster_ip_v6: Some(Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, 0x10)),
        selector: &[("app", "echo")],
        node_ports: Some((30080, 30081)),
        internal_traffic_local: false,
        external_traffic_local: false,
    },
    // A selector that matches no pod.
    ServiceSpec {
        name: EMPTY_SERVICE,
        cluster_ip_v4: Ipv4Addr::new(198, 19, 0, 20),
        cluster_ip_v6: Some(Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, 0x20)),
        selector: &[("app", "nobody")],
        node_ports: Some((30090, 30091)),
        internal_traffic_local: false,
        external_traffic_local: false,
    },
    ServiceSpec {
        name: EXTERNAL_LOCAL_SERVICE,
        cluster_ip_v4: Ipv4Addr::new(198, 19, 0, 30),
        cluster_ip_v6: None,
        selector: &[("app", "echo")],
        node_ports: Some((30100, 30101)),
        internal_traffic_local: false,
        external_traffic_local: true,
    },
    // Endpoints only on node2, external traffic kept local: node1 has none for outsiders.
    ServiceSpec {
        name: OTHER_NODE_EXTERNAL_LOCAL_SERVICE,
        cluster_ip_v4: Ipv4Addr::new(198, 19, 0, 40),
        cluster_ip_v6: None,
        selector: &[("app", "echo"), ("node", "node2")],
        node_ports: Some((30110, 30111)),
        internal_traffic_local: false,
        external_traffic_local: true,
    },
    // Endpoints only on node2, internal traffic kept local: node1's pods have none.
    ServiceSpec {
        name: OTHER_NODE_INTERNAL_LOCAL_SERVICE,
        cluster_ip_v4: Ipv4Addr::new(198, 19, 0, 50),
        cluster_ip_v6: None,
        selector: &[("app", "echo"), ("node", "node2")],
        node_ports: None,
        internal_traffic_local: true,
        external_traffic_local: false,
    },
];

/// A `svcplane proxy` in one node namespace, its stderr going to a file.
#[derive(Debug)]
pub struct Proxy {
    pub node: u16,
    pub log: PathBuf,
    child: Child,
}

impl Proxy {
    /// Whether the process still runs (`Some(status)` once it exited).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds a [`Cluster`].
#[derive(Debug)]
#[must_use]
pub struct ClusterBuilder {
    backend: Backend,
    extra_files: Vec<(String, String)>,
}

impl ClusterBuilder {
    /// One more manifest file, written before the proxies start.
    pub fn manifest(mut self, file: &str, text: &str) -> Self {
        self.extra_files.push((file.to_owned(), text.to_owned()));
        self
    }

    /// Builds the lab, writes the manifests, starts a proxy per node and waits until both
    /// answer for the echo Service in both families. Panics with the proxies' logs if not.
    pub fn start(self) -> Cluster {
        let lab = Lab::builder()
            .nodes(2)
            .pods_per_node(2)
            .pod(THIS_NODE, POD_ON_THIS_NODE)
            .pod(OTHER_NODE, POD_ON_OTHER_NODE)
            .clients(1)
            .build()
            .expect("building the lab (needs root)");
        let dir = TempDir::new(lab.prefix());
        let mut cluster = Cluster {
            backend: self.backend,
            services: SERVICES.to_vec(),
            proxies: Vec::new(),
            lab: Some(lab),
            manifests: dir.path().join("manifests"),
            dir,
        };
        let lab = cluster.lab();
        lab.start_echo_in_all_pods(ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane"))).expect("echo servers");
        lab.route_cluster_ranges_via(1, THIS_NODE).expect("routing the client via node1");

        std::fs::create_dir_all(&cluster.manifests).expect("manifests directory");
        cluster.write_file("nodes.yaml", &nodes_manifest(lab));
        let services: String = SERVICES.iter().map(|s| format!("---\n{}", s.manifest())).collect();
        cluster.write_file("services.yaml", &services);
        for pod in lab.pods() {
            cluster.write_file(&pod_file(pod.name()), &pod_manifest(pod, true));
        }
        for (file, text) in &self.extra_files {
            cluster.write_file(file, text);
        }
        for node in [THIS_NODE, OTHER_NODE] {
            let proxy = cluster.spawn_proxy(node);
            cluster.proxies.push(proxy);
        }
        cluster.wait_until_programmed();
        cluster
    }
}

/// The running fixture. See the module documentation.
#[derive(Debug)]
pub struct Cluster {
    backend: Backend,
    services: Vec<ServiceSpec>,
    proxies: Vec<Proxy>,
    /// Always `Some` until [`Cluster::teardown`] takes it.
    lab: Option<Lab>,
    manifests: PathBuf,
    dir: TempDir,
}

impl Cluster {
    pub fn builder(backend: Backend) -> ClusterBuilder {
        ClusterBuilder { backend, extra_files: Vec::new() }
    }

    /// The standard cluster.
    pub fn start(backend: Backend) -> Cluster {
        Self::builder(backend).start()
    }

    pub fn lab(&self) -> &Lab {
        self.lab.as_ref().expect("the lab runs until teardown")
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn service(&self, name: &str) -> Option<&ServiceSpec> {
        self.services.iter().find(|service| service.name == name)
    }

    pub fn manifests_dir(&self) -> &Path {
        &self.manifests
    }

    pub fn proxy(&mut self, node: u16) -> &mut Proxy {
        self.proxies.iter_mut().find(|proxy| proxy.node == node).expect("a proxy runs on every node")
    }

    /// What the proxy of `node` wrote to stderr so far.
    pub fn proxy_log(&self, node: u16) -> String {
        let proxy = self.proxies.iter().find(|proxy| proxy.node == node).expect("a proxy runs on every node");
        std::fs::read_to_string(&proxy.log).unwrap_or_default()
    }

    /// Stops the proxy of `node` (its rules stay, as after a real stop).
    pub fn stop_proxy(&mut self, node: u16) {
        self.proxy(node).stop();
    }

    /// Writes a manifest atomically (a hidden temporary file renamed into place), so the
    /// proxy never reads half a file.
    pub fn write_file(&self, file: &str, text: &str) {
        let temporary = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&temporary, text).expect("writing a manifest");
        std::fs::rename(&temporary, self.manifests.join(file)).expect("renaming a manifest into place");
    }

    /// Adds a Service in a file of its own.
    pub fn add_service(&mut self, service: ServiceSpec) {
        self.write_file(&format!("service-{}.yaml", service.name), &service.manifest());
        self.services.push(service);
    }

    /// Rewrites a pod's manifest with its Ready condition set to `ready`.
    pub fn set_pod_ready(&self, pod: &str, ready: bool) {
        let pod = self.lab().pod(pod);
        self.write_file(&pod_file(pod.name()), &pod_manifest(pod, ready));
    }

    /// The proxies' logs and the backend's diagnostics, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut text = String::new();
        for proxy in &self.proxies {
            let log = std::fs::read_to_string(&proxy.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let _ = writeln!(text, "--- proxy of node{} (last lines of its stderr):", proxy.node);
            for line in tail.into_iter().rev() {
                let _ = writeln!(text, "{line}");
            }
        }
        let node = self.lab().node(THIS_NODE).namespace_name().to_owned();
        for command in self.backend.diagnostics {
            let _ = writeln!(text, "--- `{}` in node1:", command.join(" "));
            match self.lab().exec(&node, command) {
                Ok(output) => {
                    text.push_str(&String::from_utf8_lossy(&output.stdout));
                    text.push_str(&String::from_utf8_lossy(&output.stderr));
                }
                Err(error) => {
                    let _ = writeln!(text, "{error}");
                }
            }
        }
        text
    }

    /// Kills the proxies and removes the lab, failing if a namespace is left behind.
    pub fn teardown(mut self) {
        for proxy in &mut self.proxies {
            proxy.stop();
        }
        let lab = self.lab.take().expect("the lab runs until teardown");
        let prefix = lab.prefix().to_owned();
        lab.teardown().expect("removing the lab");
        let left: Vec<String> = svcplane_testbed::namespace::list_namespaces()
            .into_iter()
            .filter(|name| name.starts_with(&format!("{prefix}-")))
            .collect();
        assert!(left.is_empty(), "namespaces left behind: {left:?}");
    }

    fn spawn_proxy(&self, node: u16) -> Proxy {
        let lab = self.lab();
        let node_ref = lab.node(node);
        let log = self.dir.path().join(format!("proxy-node{node}.log"));
        let [ip_v4, ip_v6] = node_ref.ips().map(|ip| ip.to_string());
        let manifests = self.manifests.to_string_lossy().into_owned();
        let mut args: Vec<&str> = vec![
            env!("CARGO_BIN_EXE_svcplane"),
            "proxy",
            "--manifests",
            &manifests,
            "--node-name",
            node_ref.name(),
            "--node-ip",
            &ip_v4,
            "--node-ip",
            &ip_v6,
            "--cluster-cidr",
            CLUSTER_CIDR_V4,
            "--cluster-cidr",
            CLUSTER_CIDR_V6,
            "--service-cidr",
            SERVICE_CIDR_V4,
            "--service-cidr",
            SERVICE_CIDR_V6,
        ];
        args.extend(self.backend.proxy_args);
        let mut command = lab.command(node_ref.namespace_name(), &args).expect("a node namespace of the lab");
        let stderr = File::create(&log).expect("creating the proxy log");
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
        let child = command.spawn().expect("starting svcplane proxy");
        Proxy { node, log, child }
    }

    /// Probes the echo Service's ClusterIP in both families from both nodes until all four
    /// answer: both proxies have read the manifests and programmed everything in them.
    fn wait_until_programmed(&mut self) {
        let echo = *self.service(ECHO_SERVICE).expect("the echo Service");
        let mut pending: Vec<(u16, SocketAddr)> = Vec::new();
        for node in [THIS_NODE, OTHER_NODE] {
            for v6 in [false, true] {
                pending.push((node, echo.cluster_ip_address(v6).expect("echo is dual-stack")));
            }
        }
        let mut last_error = String::new();
        let done = eventually(PROGRAMMED_WITHIN, || {
            for proxy in &mut self.proxies {
                if let Some(status) = proxy.exit_status() {
                    last_error = format!("the proxy of node{} exited: {status}", proxy.node);
                    return Some(false);
                }
            }
            let lab = self.lab();
            pending.retain(|(node, target)| {
                let namespace = lab.node(*node).namespace_name();
                match lab.tcp_request(namespace, *target, Duration::from_millis(300)) {
                    Ok(_) => false,
                    Err(error) => {
                        last_error = format!("from node{node}: {error}");
                        true
                    }
                }
            });
            pending.is_empty().then_some(true)
        });
        if !matches!(done, Some((true, _))) {
            panic!(
                "the {} proxies did not program the echo Service within {PROGRAMMED_WITHIN:?}: {last_error}\n{}",
                self.backend.name,
                self.diagnostics()
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Proxies first, so none rewrites rules while the lab goes away; the lab's own drop
        // would kill them too.
        for proxy in &mut self.proxies {
            proxy.stop();
        }
        self.lab.take();
    }
}

fn pod_file(pod: &str) -> String {
    format!("pod-{pod}.yaml")
}

/// A Pod as the kubelet would report it: scheduled, running, both lab addresses. Echo pods
/// are `app: echo`; client pods back no Service.
fn pod_manifest(pod: &Pod, ready: bool) -> String {
    let app = if pod.name().contains("-client") { "client" } else { "echo" };
    let (name, node, v4, v6) = (pod.name(), pod.node(), pod.ip_v4(), pod.ip_v6());
    let ready = if ready { "True" } else { "False" };
    [
        "apiVersion: v1".to_owned(),
        "kind: Pod".to_owned(),
        "metadata:".to_owned(),
        format!("  name: {name}"),
        "  namespace: default".to_owned(),
        "  labels:".to_owned(),
        format!("    app: {app}"),
        format!("    node: node{node}"),
        "spec:".to_owned(),
        format!("  nodeName: node{node}"),
        "  containers:".to_owned(),
        "    - name: echo".to_owned(),
        "      image: svcplane/echo".to_owned(),
        "status:".to_owned(),
        "  phase: Running".to_owned(),
        format!("  podIP: \"{v4}\""),
        "  podIPs:".to_owned(),
        format!("    - ip: \"{v4}\""),
        format!("    - ip: \"{v6}\""),
        "  conditions:".to_owned(),
        "    - type: Ready".to_owned(),
        format!("      status: \"{ready}\""),
        String::new(),
    ]
    .join("\n")
}

fn nodes_manifest(lab: &Lab) -> String {
    let mut text = String::new();
    for node in lab.nodes() {
        let _ = write!(
            text,
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\nstatus:\n  addresses:\n    - type: InternalIP\n      address: \"{v4}\"\n    - type: InternalIP\n      address: \"{v6}\"\n",
            name = node.name(),
            v4 = node.ip_v4(),
            v6 = node.ip_v6(),
        );
    }
    text
}

/// A directory of its own per cluster (the lab prefix is unique among live labs), removed
/// on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(lab_prefix: &str) -> Self {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let unique = format!(
            "svcplane-scenarios-{lab_prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(unique);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("creating the test's temporary directory");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
