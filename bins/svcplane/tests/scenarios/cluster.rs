//! The real-kernel fixture every scenario runs in: a two-node lab (two echo pods and one
//! client pod per node, two external clients routed via node1), the manifests directory of
//! [`super::manifests`], and the real `svcplane proxy` running in each node's namespace
//! with the backend under test.
//!
//! Dropping a [`Cluster`] kills the proxies, deletes the lab's namespaces and the temporary
//! directory, also when a test panics.

use std::fmt::Write as _;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use svcplane_testbed::Lab;

use super::manifests::{self, LAB_PODS};
pub use super::manifests::{
    CLIENT_INSIDE_RANGES, CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, ECHO_PORT, ECHO_SERVICE, OTHER_NODE, POD_ON_OTHER_NODE,
    POD_ON_THIS_NODE, SERVICE_CIDR_V4, SERVICE_CIDR_V6, ServiceSpec, THIS_NODE,
};
use super::net::LineServers;
use super::{Family, NodePortAddresses, Protocol, Scenario, eventually};

/// How long the proxies get to program the node after they start (on a real machine; see
/// [`ClusterBuilder::programmed_within`]).
pub const PROGRAMMED_WITHIN: Duration = Duration::from_secs(10);

/// How a backend is selected on the proxy's command line, and what to print about the node
/// when a scenario fails.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    pub name: &'static str,
    /// Appended to `svcplane proxy`, e.g. `--mode nftables`.
    pub proxy_args: &'static [&'static str],
    /// Commands run in node1's namespace for a failure report (e.g. `nft list ruleset`).
    pub diagnostics: &'static [&'static [&'static str]],
    /// The command that prints what the backend programmed on a node, for rows that check
    /// that something is *not* programmed.
    pub ruleset: &'static [&'static str],
    /// Why a row cannot apply to this backend (`None`: it applies); such rows are listed
    /// with the reason and not run.
    pub not_applicable: fn(&Scenario) -> Option<&'static str>,
    /// Whether the backend attaches to a cgroup per node (eBPF mode): the lab then gives
    /// each node a cgroup holding the probe threads of the node and its pods, the proxy is
    /// told it with `--cgroup-path` and gets a bpf root of its own (`--bpf-root`), which
    /// `svcplane cleanup` removes when the cluster goes.
    pub node_cgroups: bool,
    /// Whether the mode relays every connection from the node itself (userspace): endpoints
    /// then see an address of the node the traffic entered through for every sender, so
    /// rows expecting the sender's own address are checked for the node's, and explain's
    /// masquerade flag (which says what the kernel modes do) is not compared.
    pub relays_from_the_node: bool,
}

/// For backends that run every row.
pub fn every_row_applies(_: &Scenario) -> Option<&'static str> {
    None
}

/// The `--nodeport-addresses` flags of a configuration.
pub fn node_port_address_args(addresses: NodePortAddresses, node: u16) -> Vec<String> {
    match addresses {
        NodePortAddresses::Default => Vec::new(),
        NodePortAddresses::Primary => vec!["--nodeport-addresses".to_owned(), "primary".to_owned()],
        NodePortAddresses::SecondaryOnly => {
            let mut args = Vec::new();
            for family in [Family::V4, Family::V6] {
                let ip = manifests::node_secondary_ip(node, family);
                let length = if ip.is_ipv4() { 32 } else { 128 };
                args.push("--nodeport-addresses".to_owned());
                args.push(format!("{ip}/{length}"));
            }
            args
        }
    }
}

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

    /// Asks the proxy to stop (SIGTERM) and waits until it has exited.
    fn terminate(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("a pid fits i32"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Builds a [`Cluster`].
#[derive(Debug)]
#[must_use]
pub struct ClusterBuilder {
    backend: Backend,
    extra_files: Vec<(String, String)>,
    node_port_addresses: NodePortAddresses,
    line_servers: Vec<(Protocol, u16, &'static [&'static str])>,
    programmed_within: Duration,
    faults: bool,
    extra_proxy_args: Vec<String>,
}

impl ClusterBuilder {
    /// One more manifest file, written before the proxies start.
    pub fn manifest(mut self, file: &str, text: &str) -> Self {
        self.extra_files.push((file.to_owned(), text.to_owned()));
        self
    }

    /// Where the proxies answer NodePorts.
    pub fn node_port_addresses(mut self, addresses: NodePortAddresses) -> Self {
        self.node_port_addresses = addresses;
        self
    }

    /// Line servers (see [`LineServers`]) on `port` in `pods`, before the proxies start.
    pub fn line_servers(mut self, protocol: Protocol, port: u16, pods: &'static [&'static str]) -> Self {
        self.line_servers.push((protocol, port, pods));
        self
    }

    /// How long the proxies get to program the node (default [`PROGRAMMED_WITHIN`]): more
    /// under emulation, where a debug build's first full sync of the fixture takes 10-17 s.
    pub fn programmed_within(mut self, limit: Duration) -> Self {
        self.programmed_within = limit;
        self
    }

    /// More arguments for every proxy, after the backend's.
    pub fn proxy_args(mut self, args: &[String]) -> Self {
        self.extra_proxy_args.extend_from_slice(args);
        self
    }

    /// Proxies take injected kernel faults from a file per node ([`Cluster::queue_faults`]).
    pub fn faults(mut self) -> Self {
        self.faults = true;
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
            .clients(manifests::CLIENTS)
            .node_cgroups(self.backend.node_cgroups)
            .build()
            .expect("building the lab (needs root)");
        let dir = TempDir::new(lab.prefix());
        let mut cluster = Cluster {
            backend: self.backend,
            node_port_addresses: self.node_port_addresses,
            faults: self.faults,
            extra_proxy_args: self.extra_proxy_args,
            services: manifests::SERVICES.to_vec(),
            proxies: Vec::new(),
            line_servers: Vec::new(),
            lab: Some(lab),
            manifests: dir.path().join("manifests"),
            dir,
        };
        let lab = cluster.lab();
        for pod in LAB_PODS {
            let lab_pod = lab.pod(pod.name);
            assert_eq!(lab_pod.node(), pod.node, "the lab puts {} where the manifests say", pod.name);
            assert_eq!(
                lab_pod.ips(),
                [manifests::pod_ip(pod.name, Family::V4), manifests::pod_ip(pod.name, Family::V6)],
                "the lab gives {} the addresses the manifests say",
                pod.name
            );
        }
        lab.start_echo_in_all_pods(ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane"))).expect("echo servers");
        for client in 1..=manifests::CLIENTS {
            lab.route_cluster_ranges_via(client, THIS_NODE).expect("routing the clients via node1");
        }
        prepare_lab(lab);
        let servers: Vec<LineServers> = self
            .line_servers
            .iter()
            .map(|(protocol, port, pods)| {
                LineServers::start(lab, pods, *protocol, *port)
                    .unwrap_or_else(|error| panic!("starting {protocol} line servers: {error}"))
            })
            .collect();
        cluster.line_servers = servers;

        std::fs::create_dir_all(&cluster.manifests).expect("manifests directory");
        for (file, text) in manifests::initial_files() {
            cluster.write_file(&file, &text);
        }
        for (file, text) in &self.extra_files {
            cluster.write_file(file, text);
        }
        for node in [THIS_NODE, OTHER_NODE] {
            let proxy = cluster.spawn_proxy(node);
            cluster.proxies.push(proxy);
        }
        cluster.wait_until_programmed(self.programmed_within);
        cluster
    }
}

/// What the lab needs beyond the testbed's standard wiring:
/// - each node's secondary LAN address (a /32 and a deprecated /128, never picked as a
///   source), where NodePorts answer by default;
/// - client 1's extra addresses, one affinity client each;
/// - no per-destination ICMP rate limit on the nodes, so every refusal of every row comes
///   back at once however many rows run.
fn prepare_lab(lab: &Lab) {
    for node in lab.nodes() {
        let namespace = node.namespace_name();
        let v4 = manifests::node_secondary_ip(node.index(), Family::V4);
        let v6 = manifests::node_secondary_ip(node.index(), Family::V6);
        let commands: [Vec<String>; 4] = [
            ["ip", "address", "add", &format!("{v4}/32"), "dev", node.lan_interface()].map(String::from).to_vec(),
            ["ip", "address", "add", &format!("{v6}/128"), "dev", node.lan_interface(), "nodad", "preferred_lft", "0"]
                .map(String::from)
                .to_vec(),
            ["sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"].map(String::from).to_vec(),
            ["sysctl", "-qw", "net.ipv6.icmp.ratelimit=0"].map(String::from).to_vec(),
        ];
        for command in commands {
            lab.exec_ok(namespace, &command).unwrap_or_else(|error| panic!("preparing {}: {error}", node.name()));
        }
    }
    let client = lab.client(CLIENT_INSIDE_RANGES);
    for family in [Family::V4, Family::V6] {
        for ip in manifests::affinity_client_ips(family) {
            let (address, extra): (String, &[&str]) = match ip {
                std::net::IpAddr::V4(_) => (format!("{ip}/24"), &[]),
                // Deprecated, so the client's other rows keep sending from its main address.
                std::net::IpAddr::V6(_) => (format!("{ip}/64"), &["nodad", "preferred_lft", "0"]),
            };
            let mut command = vec!["ip", "address", "add", &address, "dev", svcplane_testbed::OUTSIDE_INTERFACE];
            command.extend(extra);
            lab.exec_ok(client.namespace_name(), &command).unwrap_or_else(|error| panic!("client addresses: {error}"));
        }
    }
}

/// The running fixture. See the module documentation.
#[derive(Debug)]
pub struct Cluster {
    backend: Backend,
    node_port_addresses: NodePortAddresses,
    services: Vec<ServiceSpec>,
    proxies: Vec<Proxy>,
    line_servers: Vec<LineServers>,
    faults: bool,
    extra_proxy_args: Vec<String>,
    /// Always `Some` until [`Cluster::teardown`] takes it.
    lab: Option<Lab>,
    manifests: PathBuf,
    dir: TempDir,
}

impl Cluster {
    pub fn builder(backend: Backend) -> ClusterBuilder {
        ClusterBuilder {
            backend,
            extra_files: Vec::new(),
            node_port_addresses: NodePortAddresses::Default,
            line_servers: Vec::new(),
            programmed_within: PROGRAMMED_WITHIN,
            faults: false,
            extra_proxy_args: Vec::new(),
        }
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

    pub fn node_port_addresses(&self) -> NodePortAddresses {
        self.node_port_addresses
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

    /// One series of `node`'s proxy's `/metrics` (the line starting with `series `), read
    /// from inside the node as Prometheus on the node would.
    pub fn proxy_metric(&self, node: u16, series: &str) -> Option<f64> {
        let namespace = self.lab().node(node).namespace_name().to_owned();
        let address: SocketAddr = "127.0.0.1:10249".parse().expect("an address");
        let (_, _, body) =
            svcplane_testbed::run_in_namespace(&namespace, || svcplane_ops::http::get(address, "/metrics"))
                .ok()?
                .ok()?;
        body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Stops the proxy of `node` (its rules stay, as after a real stop).
    pub fn stop_proxy(&mut self, node: u16) {
        self.proxy(node).stop();
    }

    /// Kills the proxy of `node` with SIGKILL (`graceful`: SIGTERM, waiting for its exit)
    /// and starts a new one with the same arguments; its log starts again.
    pub fn restart_proxy(&mut self, node: u16, graceful: bool) {
        let proxy = self.proxy(node);
        if graceful {
            proxy.terminate();
        } else {
            proxy.stop();
        }
        let fresh = self.spawn_proxy(node);
        let slot = self.proxies.iter_mut().find(|proxy| proxy.node == node).expect("a proxy runs on every node");
        *slot = fresh;
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
        self.write_file(&manifests::pod_file(pod), &manifests::lab_pod_manifest(pod, ready));
    }

    /// What the backend programmed on `node` (its ruleset command's output).
    pub fn ruleset(&self, node: u16) -> Result<String, String> {
        let namespace = self.lab().node(node).namespace_name().to_owned();
        self.lab().exec_ok(&namespace, self.backend.ruleset).map_err(|error| error.to_string())
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
        self.stop_proxies_and_clean_up();
        self.line_servers.clear();
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
        let mut args: Vec<String> = [
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
        ]
        .map(String::from)
        .to_vec();
        args.extend(node_port_address_args(self.node_port_addresses, node));
        args.extend(self.backend.proxy_args.iter().map(|arg| (*arg).to_owned()));
        args.extend(self.extra_proxy_args.iter().cloned());
        if self.faults {
            args.extend(["--inject-faults-from".to_owned(), self.fault_file(node).to_string_lossy().into_owned()]);
        }
        if self.backend.node_cgroups {
            let cgroup = lab.node_cgroup(node).expect("the lab made node cgroups");
            args.extend(["--cgroup-path".to_owned(), cgroup.to_string_lossy().into_owned()]);
            args.extend(["--bpf-root".to_owned(), self.bpf_root(node).to_string_lossy().into_owned()]);
        }
        let mut command = if self.backend.node_cgroups {
            // `ip netns exec` would give the proxy a mount namespace of its own with a fresh
            // /sys: the cgroup would not be found, and its bpffs (with the pins) would go
            // when it exits.
            lab.command_sharing_mounts(node_ref.namespace_name(), &args).expect("a node namespace of the lab")
        } else {
            lab.command(node_ref.namespace_name(), &args).expect("a node namespace of the lab")
        };
        let stderr = File::create(&log).expect("creating the proxy log");
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
        let child = command.spawn().expect("starting svcplane proxy");
        Proxy { node, log, child }
    }

    fn fault_file(&self, node: u16) -> PathBuf {
        self.dir.path().join(format!("faults-node{node}"))
    }

    /// Queues faults for the next kernel transactions of `node`'s proxy, one per
    /// transaction (nftables: `refused`, `answers-lost`, `socket-closed`; iptables:
    /// `refused`); needs
    /// [`ClusterBuilder::faults`].
    pub fn queue_faults(&self, node: u16, faults: &[&str]) {
        assert!(self.faults, "the cluster was built without ClusterBuilder::faults");
        let path = self.fault_file(node);
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, faults.iter().map(|fault| format!("{fault}\n")).collect::<String>())
            .expect("writing the fault file");
        std::fs::rename(&temporary, &path).expect("renaming the fault file into place");
    }

    /// Faults queued for `node`'s proxy and not taken yet.
    pub fn queued_faults(&self, node: u16) -> usize {
        std::fs::read_to_string(self.fault_file(node))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count()
    }

    /// Where the proxy of `node` pins its BPF objects (backends with node cgroups).
    pub fn bpf_root(&self, node: u16) -> PathBuf {
        self.dir.path().join(format!("bpf-node{node}"))
    }

    /// Stops every proxy and, for backends that pin BPF objects, removes them with
    /// `svcplane cleanup` (which also unmounts the bpffs mounted for them).
    fn stop_proxies_and_clean_up(&mut self) {
        for proxy in &mut self.proxies {
            proxy.stop();
        }
        if !self.backend.node_cgroups {
            return;
        }
        for node in [THIS_NODE, OTHER_NODE] {
            let root = self.bpf_root(node);
            if !root.exists() {
                continue;
            }
            let Some(lab) = self.lab.as_ref() else { continue };
            let args =
                [env!("CARGO_BIN_EXE_svcplane"), "cleanup", "--bpf-root", &root.to_string_lossy()].map(String::from);
            let output = lab
                .command_sharing_mounts(lab.node(node).namespace_name(), &args)
                .map_err(|error| error.to_string())
                .and_then(|mut command| command.output().map_err(|error| error.to_string()));
            match output {
                Ok(output) if output.status.success() => {}
                Ok(output) => eprintln!("svcplane cleanup of node{node}: {}", String::from_utf8_lossy(&output.stderr)),
                Err(error) => eprintln!("svcplane cleanup of node{node}: {error}"),
            }
        }
    }

    /// Probes the echo Service's ClusterIP in both families from both nodes until all four
    /// answer: both proxies have read the manifests and programmed everything in them.
    fn wait_until_programmed(&mut self, limit: Duration) {
        let echo = *self.service(ECHO_SERVICE).expect("the echo Service");
        let mut pending: Vec<(u16, SocketAddr)> = Vec::new();
        for node in [THIS_NODE, OTHER_NODE] {
            for v6 in [false, true] {
                pending.push((node, echo.cluster_ip_address(v6).expect("echo is dual-stack")));
            }
        }
        let mut last_error = String::new();
        let done = eventually(limit, || {
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
            // A mode that writes as it goes (eBPF maps) answers before its first sync is
            // over (health-check servers start after it): wait for the sync to end too.
            let synced = [THIS_NODE, OTHER_NODE].iter().all(|node| self.proxy_log(*node).contains("synced"));
            (pending.is_empty() && synced).then_some(true)
        });
        if !matches!(done, Some((true, _))) {
            panic!(
                "the {} proxies did not program the echo Service within {limit:?}: {last_error}\n{}",
                self.backend.name,
                self.diagnostics()
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Proxies first, so none rewrites rules while the lab goes away; the lab's own drop
        // would kill them too. The line servers' sockets live in pod namespaces: close them
        // before those go.
        self.stop_proxies_and_clean_up();
        self.line_servers.clear();
        self.lab.take();
    }
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
