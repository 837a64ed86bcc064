//! The lab: namespaces for a LAN, nodes, pods and external clients, wired per `LAB.md`.
//!
//! ```text
//!   client1 (c1) ─┐
//!                 ├─ br0 in <prefix>-lan ─┬─ eth0 node1 (n1) ─ veth1 ══ eth0 pod n1p1
//!                 │                       │                    veth2 ══ eth0 pod n1p2
//!                 │                       └─ eth0 node2 (n2) ─ veth1 ══ eth0 pod n2p1 ...
//! ```
//!
//! Pods are routed Calico-style: a /32 and a /128 on the pod's `eth0`, default routes via
//! 169.254.1.1 (answered by the node's proxy ARP) and via `fe80::1` (an address of the node
//! side of the veth), and on the node a host route per pod address through the pod's veth.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::address_plan::{
    self, LOAD_BALANCER_V4, LOAD_BALANCER_V6, MAX_CLIENTS, MAX_NODES, MAX_PODS_PER_NODE, POD_GATEWAY_V4,
    POD_GATEWAY_V6, POD_V4, POD_V6, SERVICE_V4, SERVICE_V6,
};
use crate::cgroup::{CgroupError, NodeCgroups};
use crate::command::{RunFailure, describe, run_bounded, wait_bounded};
use crate::namespace::{NamespaceError, kill_processes_in, list_namespaces, run_in_namespace, run_in_namespace_within};
use crate::prefix::{PrefixLock, prefix_of};
use crate::probe::{self, EchoReply, ProbeError};

/// Time limit of [`Lab::exec`] and of each setup command.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`Lab::start_echo`] waits for a new echo server to answer: a debug build
/// starting in the emulated guest kernel on a busy 2-core machine has taken over 5 s.
pub const ECHO_START_TIMEOUT: Duration = Duration::from_secs(20);
/// The interface name every pod, node and client uses towards the outside.
pub const OUTSIDE_INTERFACE: &str = "eth0";

/// Setting up, using or tearing down a lab failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Labs need root (network namespaces, links, routes).
    #[error("building a lab needs root; running as uid {uid}")]
    NotRoot { uid: u32 },
    /// The node cgroups could not be made.
    #[error("making the lab's node cgroups: {source}")]
    Cgroup {
        #[source]
        source: CgroupError,
    },
    /// The requested topology does not fit the address plan.
    #[error("invalid lab layout: {reason}")]
    InvalidLayout { reason: String },
    /// No free name prefix could be claimed.
    #[error("claiming a lab name prefix: {source}")]
    ClaimPrefix {
        #[source]
        source: std::io::Error,
    },
    /// A command could not be started.
    #[error("starting `{command}` in {namespace}: {source}")]
    StartCommand {
        namespace: String,
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// A command did not finish in time (it was killed).
    #[error("`{command}` in {namespace} did not finish within {after:?}")]
    CommandTimedOut { namespace: String, command: String, after: Duration },
    /// A command exited unsuccessfully.
    #[error("`{command}` in {namespace} failed ({status}): {stderr}")]
    CommandFailed { namespace: String, command: String, status: ExitStatus, stderr: String },
    /// Writing a sysctl failed.
    #[error("setting {key} in {namespace}: {source}")]
    SetSysctl {
        namespace: String,
        key: String,
        #[source]
        source: std::io::Error,
    },
    /// Entering a namespace failed.
    #[error(transparent)]
    EnterNamespace(#[from] NamespaceError),
    /// The namespace does not belong to this lab.
    #[error("{namespace:?} is not a namespace of lab {prefix}")]
    UnknownNamespace { namespace: String, prefix: String },
    /// No pod has that name.
    #[error("no pod named {name:?} in this lab")]
    UnknownPod { name: String },
    /// No node has that number.
    #[error("no node {index} in this lab")]
    UnknownNode { index: u16 },
    /// No external client has that number.
    #[error("no client {index} in this lab")]
    UnknownClient { index: u16 },
    /// A route outside the address plan was requested.
    #[error("{network} is outside the lab's address plan")]
    OutsideAddressPlan { network: IpNet },
    /// An echo server exited before answering.
    #[error("echo server of pod {pod} exited before answering ({status})")]
    EchoExited { pod: String, status: ExitStatus },
    /// An echo server did not answer in time.
    #[error("echo server of pod {pod} did not answer on port {port} within {after:?}: {last_error}")]
    EchoNotReady { pod: String, port: u16, after: Duration, last_error: String },
    /// Teardown left namespaces behind.
    #[error("namespaces left after teardown: {namespaces:?}")]
    Teardown { namespaces: Vec<String> },
}

/// A node: a namespace owning a LAN address and routing its pods.
#[derive(Debug, Clone)]
pub struct Node {
    index: u16,
    name: String,
    namespace: String,
}

impl Node {
    /// The node number, from 1.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// `node<N>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace (`<prefix>-n<N>`).
    pub fn namespace_name(&self) -> &str {
        &self.namespace
    }

    /// The node IP on the LAN, `198.18.0.(10+N)`.
    pub fn ip_v4(&self) -> Ipv4Addr {
        address_plan::node_ip_v4(self.index)
    }

    /// The node IP on the LAN, `2001:db8::(10+N)`.
    pub fn ip_v6(&self) -> Ipv6Addr {
        address_plan::node_ip_v6(self.index)
    }

    /// Both node IPs, IPv4 first.
    pub fn ips(&self) -> [IpAddr; 2] {
        [self.ip_v4().into(), self.ip_v6().into()]
    }

    /// The pod /24 this node owns.
    pub fn pod_cidr_v4(&self) -> Ipv4Net {
        address_plan::pod_cidr_v4(self.index)
    }

    /// The pod /64 this node owns.
    pub fn pod_cidr_v6(&self) -> Ipv6Net {
        address_plan::pod_cidr_v6(self.index)
    }

    /// The node's LAN interface (`eth0`).
    pub fn lan_interface(&self) -> &str {
        OUTSIDE_INTERFACE
    }
}

/// A pod: a namespace with one veth to its node.
#[derive(Debug, Clone)]
pub struct Pod {
    name: String,
    node: u16,
    index: u16,
    namespace: String,
    host_interface: String,
}

impl Pod {
    /// The pod name (also the echo server's name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The number of the node the pod runs on.
    pub fn node(&self) -> u16 {
        self.node
    }

    /// The pod's number on its node, from 1.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The network namespace (`<prefix>-n<N>p<k>`).
    pub fn namespace_name(&self) -> &str {
        &self.namespace
    }

    /// `198.18.(128+N).k`.
    pub fn ip_v4(&self) -> Ipv4Addr {
        address_plan::pod_ip_v4(self.node, self.index)
    }

    /// `2001:db8:1:N::k`.
    pub fn ip_v6(&self) -> Ipv6Addr {
        address_plan::pod_ip_v6(self.node, self.index)
    }

    /// Both pod IPs, IPv4 first.
    pub fn ips(&self) -> [IpAddr; 2] {
        [self.ip_v4().into(), self.ip_v6().into()]
    }

    /// The pod's interface (`eth0`).
    pub fn interface(&self) -> &str {
        OUTSIDE_INTERFACE
    }

    /// The node side of the pod's veth (`veth<k>`, in the node's namespace).
    pub fn host_interface(&self) -> &str {
        &self.host_interface
    }
}

/// An external client: a namespace on the LAN, outside the cluster, with no default route.
#[derive(Debug, Clone)]
pub struct Client {
    index: u16,
    name: String,
    namespace: String,
}

impl Client {
    /// The client number, from 1.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// `client<k>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace (`<prefix>-c<k>`).
    pub fn namespace_name(&self) -> &str {
        &self.namespace
    }

    /// `198.18.0.(100+k)`.
    pub fn ip_v4(&self) -> Ipv4Addr {
        address_plan::client_ip_v4(self.index)
    }

    /// `2001:db8::(100+k)`.
    pub fn ip_v6(&self) -> Ipv6Addr {
        address_plan::client_ip_v6(self.index)
    }

    /// Both client IPs, IPv4 first.
    pub fn ips(&self) -> [IpAddr; 2] {
        [self.ip_v4().into(), self.ip_v6().into()]
    }
}

/// Describes a lab to build. Start from [`Lab::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct LabBuilder {
    nodes: u16,
    pods_per_node: u16,
    named_pods: Vec<(u16, String)>,
    clients: u16,
    node_cgroups: bool,
}

impl LabBuilder {
    /// The number of nodes (default 2).
    pub fn nodes(mut self, count: u16) -> Self {
        self.nodes = count;
        self
    }

    /// Pods on every node, named `node<N>-pod<k>` (default 0).
    pub fn pods_per_node(mut self, count: u16) -> Self {
        self.pods_per_node = count;
        self
    }

    /// One more pod with a name of its own on node `node` (numbered after the
    /// `pods_per_node` ones).
    pub fn pod(mut self, node: u16, name: impl Into<String>) -> Self {
        self.named_pods.push((node, name.into()));
        self
    }

    /// A cgroup per node (see [`crate::cgroup`]) holding the probe threads of the node and
    /// of its pods, for dataplanes that attach to a cgroup (default: none).
    pub fn node_cgroups(mut self, enabled: bool) -> Self {
        self.node_cgroups = enabled;
        self
    }

    /// The number of external clients (default 0).
    pub fn clients(mut self, count: u16) -> Self {
        self.clients = count;
        self
    }

    /// Creates the namespaces and wires them. Leftovers of crashed labs are removed first.
    /// On error everything created so far is removed again.
    pub fn build(self) -> Result<Lab, LabError> {
        self.validate()?;
        let uid = nix::unistd::Uid::effective();
        if !uid.is_root() {
            return Err(LabError::NotRoot { uid: uid.as_raw() });
        }
        let lock = PrefixLock::acquire().map_err(|source| LabError::ClaimPrefix { source })?;
        let prefix = lock.prefix().to_owned();
        remove_leftovers(&prefix);

        let nodes: Vec<Node> = (1..=self.nodes)
            .map(|index| Node { index, name: format!("node{index}"), namespace: format!("{prefix}-n{index}") })
            .collect();
        let mut pods = Vec::new();
        for node in 1..=self.nodes {
            let named = self.named_pods.iter().filter(|(n, _)| *n == node);
            let default_names = (1..=self.pods_per_node).map(|k| format!("node{node}-pod{k}"));
            let names = default_names.chain(named.map(|(_, name)| name.clone()));
            for (index, name) in (1..).zip(names) {
                pods.push(Pod {
                    name,
                    node,
                    index,
                    namespace: format!("{prefix}-n{node}p{index}"),
                    host_interface: format!("veth{index}"),
                });
            }
        }
        let clients: Vec<Client> = (1..=self.clients)
            .map(|index| Client { index, name: format!("client{index}"), namespace: format!("{prefix}-c{index}") })
            .collect();
        let lan_namespace = format!("{prefix}-lan");
        let namespaces: Vec<String> = std::iter::once(lan_namespace.clone())
            .chain(nodes.iter().map(|n| n.namespace.clone()))
            .chain(pods.iter().map(|p| p.namespace.clone()))
            .chain(clients.iter().map(|c| c.namespace.clone()))
            .collect();

        // From here on, dropping `lab` removes whatever exists.
        let lab = Lab {
            lock: Some(lock),
            prefix,
            lan_namespace,
            namespaces,
            nodes,
            pods,
            clients,
            children: Mutex::new(Vec::new()),
            torn_down: false,
            node_cgroups: None,
        };
        let mut lab = lab;
        if self.node_cgroups {
            let cgroups = NodeCgroups::create(&lab.prefix, lab.nodes.iter().map(|n| n.index))
                .map_err(|source| LabError::Cgroup { source })?;
            lab.node_cgroups = Some(cgroups);
        }
        lab.wire()?;
        lab.route_service_ranges_on_nodes()?;
        Ok(lab)
    }

    fn validate(&self) -> Result<(), LabError> {
        let invalid = |reason: String| Err(LabError::InvalidLayout { reason });
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return invalid(format!("{} nodes; 1 to {MAX_NODES} fit", self.nodes));
        }
        if self.clients > MAX_CLIENTS {
            return invalid(format!("{} clients; at most {MAX_CLIENTS} fit", self.clients));
        }
        let mut seen = std::collections::HashSet::new();
        for (node, name) in &self.named_pods {
            if !(1..=self.nodes).contains(node) {
                return invalid(format!("pod {name:?} on node {node}, which does not exist"));
            }
            let valid_name = !name.is_empty()
                && name.len() <= 63
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
            if !valid_name {
                return invalid(format!("pod name {name:?}: use 1 to 63 of a-z, 0-9, '-' and '.'"));
            }
            if !seen.insert(name.as_str()) {
                return invalid(format!("pod name {name:?} used twice"));
            }
        }
        for node in 1..=self.nodes {
            let named = self.named_pods.iter().filter(|(n, _)| *n == node).count();
            let total = usize::from(self.pods_per_node) + named;
            if total > usize::from(MAX_PODS_PER_NODE) {
                return invalid(format!("{total} pods on node {node}; at most {MAX_PODS_PER_NODE} fit"));
            }
            for k in 1..=self.pods_per_node {
                let default_name = format!("node{node}-pod{k}");
                if seen.contains(default_name.as_str()) {
                    return invalid(format!("pod name {default_name:?} used twice"));
                }
            }
        }
        Ok(())
    }
}

/// A process the lab started and stops on drop.
#[derive(Debug)]
struct TrackedChild {
    what: String,
    child: Child,
}

/// A throwaway multi-node lab of network namespaces. Dropping it kills every process inside
/// its namespaces and deletes them.
#[derive(Debug)]
pub struct Lab {
    lock: Option<PrefixLock>,
    prefix: String,
    lan_namespace: String,
    namespaces: Vec<String>,
    nodes: Vec<Node>,
    pods: Vec<Pod>,
    clients: Vec<Client>,
    children: Mutex<Vec<TrackedChild>>,
    torn_down: bool,
    node_cgroups: Option<NodeCgroups>,
}

impl Lab {
    /// A builder for two nodes, no pods and no clients.
    pub fn builder() -> LabBuilder {
        LabBuilder { nodes: 2, pods_per_node: 0, named_pods: Vec::new(), clients: 0, node_cgroups: false }
    }

    /// The name prefix of every namespace of this lab (`sp` + 4 hex digits).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The LAN namespace (holds the bridge `br0`).
    pub fn lan_namespace(&self) -> &str {
        &self.lan_namespace
    }

    /// Every namespace of the lab.
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// All nodes, in order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `index` (from 1). Panics if there is no such node.
    pub fn node(&self, index: u16) -> &Node {
        self.try_node(index).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Node `index` (from 1).
    pub fn try_node(&self, index: u16) -> Result<&Node, LabError> {
        self.nodes.iter().find(|node| node.index == index).ok_or(LabError::UnknownNode { index })
    }

    /// All pods, node by node.
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// The pods on node `node`.
    pub fn pods_on(&self, node: u16) -> impl Iterator<Item = &Pod> {
        self.pods.iter().filter(move |pod| pod.node == node)
    }

    /// The pod called `name`. Panics if there is no such pod.
    pub fn pod(&self, name: &str) -> &Pod {
        self.try_pod(name).unwrap_or_else(|error| panic!("{error}"))
    }

    /// The pod called `name`.
    pub fn try_pod(&self, name: &str) -> Result<&Pod, LabError> {
        self.pods.iter().find(|pod| pod.name == name).ok_or_else(|| LabError::UnknownPod { name: name.to_owned() })
    }

    /// All external clients, in order.
    pub fn clients(&self) -> &[Client] {
        &self.clients
    }

    /// Client `index` (from 1). Panics if there is no such client.
    pub fn client(&self, index: u16) -> &Client {
        self.try_client(index).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Client `index` (from 1).
    pub fn try_client(&self, index: u16) -> Result<&Client, LabError> {
        self.clients.iter().find(|client| client.index == index).ok_or(LabError::UnknownClient { index })
    }

    /// A command that runs `args` (program first) inside `namespace`, which must belong to
    /// this lab. The caller spawns it; whatever it leaves running inside the lab is killed
    /// when the lab is dropped.
    pub fn command<S: AsRef<OsStr>>(&self, namespace: &str, args: &[S]) -> Result<Command, LabError> {
        self.check_namespace(namespace)?;
        let mut command = Command::new("ip");
        command.args(["netns", "exec", namespace]).args(args);
        Ok(command)
    }

    /// [`Lab::command`] entering only the network namespace (`nsenter --net`): unlike
    /// `ip netns exec`, the program keeps the caller's mounts, so it sees the cgroup2 mount
    /// under /sys, and a bpffs it mounts outlives it.
    pub fn command_sharing_mounts<S: AsRef<OsStr>>(&self, namespace: &str, args: &[S]) -> Result<Command, LabError> {
        self.check_namespace(namespace)?;
        let mut command = Command::new("nsenter");
        command.arg(format!("--net={}", crate::namespace::namespace_path(namespace).display())).args(args);
        Ok(command)
    }

    /// Runs `args` inside `namespace` and returns its output, whatever its exit status.
    /// Killed after [`DEFAULT_COMMAND_TIMEOUT`].
    pub fn exec<S: AsRef<OsStr>>(&self, namespace: &str, args: &[S]) -> Result<Output, LabError> {
        self.exec_with_timeout(namespace, args, DEFAULT_COMMAND_TIMEOUT)
    }

    /// [`Lab::exec`] with a time limit of your choice.
    pub fn exec_with_timeout<S: AsRef<OsStr>>(
        &self,
        namespace: &str,
        args: &[S],
        timeout: Duration,
    ) -> Result<Output, LabError> {
        let command = self.command(namespace, args)?;
        let line = describe_os(args);
        run_bounded(command, None, timeout).map_err(|failure| command_error(namespace, &line, failure))
    }

    /// [`Lab::exec_with_timeout`] keeping the caller's mounts (see
    /// [`Lab::command_sharing_mounts`]): for commands that must see a bpffs this process
    /// mounted, or unmount one.
    pub fn exec_sharing_mounts_with_timeout<S: AsRef<OsStr>>(
        &self,
        namespace: &str,
        args: &[S],
        timeout: Duration,
    ) -> Result<Output, LabError> {
        let command = self.command_sharing_mounts(namespace, args)?;
        let line = describe_os(args);
        run_bounded(command, None, timeout).map_err(|failure| command_error(namespace, &line, failure))
    }

    /// Runs `args` inside `namespace`; fails unless it exits with status 0. Returns stdout.
    pub fn exec_ok<S: AsRef<OsStr>>(&self, namespace: &str, args: &[S]) -> Result<String, LabError> {
        let output = self.exec(namespace, args)?;
        if !output.status.success() {
            return Err(LabError::CommandFailed {
                namespace: namespace.to_owned(),
                command: describe_os(args),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Starts `args` inside `namespace` with stdin and stdout closed and stderr inherited.
    /// The caller owns the [`Child`]; the process is killed when the lab is dropped at the
    /// latest (every process inside a lab namespace is).
    pub fn spawn<S: AsRef<OsStr>>(&self, namespace: &str, args: &[S]) -> Result<Child, LabError> {
        let mut command = self.command(namespace, args)?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::inherit());
        command.spawn().map_err(|source| LabError::StartCommand {
            namespace: namespace.to_owned(),
            command: describe_os(args),
            source,
        })
    }

    /// Adds (or replaces) a route on client `client` to `network` via node `node`'s LAN
    /// address of the same family. `network` must lie inside the address plan (pods,
    /// services, load balancer IPs): clients never get a default route.
    pub fn route_via(&self, client: u16, network: IpNet, node: u16) -> Result<(), LabError> {
        let client = self.try_client(client)?;
        let node = self.try_node(node)?;
        if !address_plan::is_lab_network(&network) {
            return Err(LabError::OutsideAddressPlan { network });
        }
        let gateway = match network {
            IpNet::V4(_) => IpAddr::V4(node.ip_v4()),
            IpNet::V6(_) => IpAddr::V6(node.ip_v6()),
        };
        let network = network.trunc().to_string();
        let gateway = gateway.to_string();
        self.ip(&client.namespace, &["route", "replace", &network, "via", &gateway, "dev", OUTSIDE_INTERFACE])
    }

    /// Routes the pod, Service and load balancer ranges (both families) from client
    /// `client` via node `node`.
    pub fn route_cluster_ranges_via(&self, client: u16, node: u16) -> Result<(), LabError> {
        let ranges = [
            IpNet::V4(POD_V4),
            IpNet::V6(POD_V6),
            IpNet::V4(SERVICE_V4),
            IpNet::V6(SERVICE_V6),
            IpNet::V4(LOAD_BALANCER_V4),
            IpNet::V6(LOAD_BALANCER_V6),
        ];
        ranges.into_iter().try_for_each(|network| self.route_via(client, network, node))
    }

    /// Gives every node a route for the Service and load-balancer ranges out of its LAN
    /// interface, as a real node's default route would: the kernel looks up a route before
    /// the nat hooks run, so a node with no route cannot even try to reach a ClusterIP.
    /// The routes point at the lab's own LAN; nothing can leave the lab.
    pub fn route_service_ranges_on_nodes(&self) -> Result<(), LabError> {
        let ranges =
            [IpNet::V4(SERVICE_V4), IpNet::V6(SERVICE_V6), IpNet::V4(LOAD_BALANCER_V4), IpNet::V6(LOAD_BALANCER_V6)];
        for node in &self.nodes {
            for network in ranges {
                let network = network.to_string();
                self.ip(&node.namespace, &["route", "replace", &network, "dev", OUTSIDE_INTERFACE])?;
            }
        }
        Ok(())
    }

    /// Starts `<program> echo --name <pod> --port <port>` in the pod's namespace and waits
    /// (at most [`ECHO_START_TIMEOUT`]) until it answers over TCP on both pod addresses.
    /// The lab owns the process.
    pub fn start_echo(&self, pod: &str, port: u16, program: &Path) -> Result<(), LabError> {
        let pod = self.try_pod(pod)?;
        self.spawn_echo(pod, port, program)?;
        self.wait_for_echo(pod, port)
    }

    /// [`Lab::start_echo`] in every pod, all started before waiting for any.
    pub fn start_echo_in_all_pods(&self, port: u16, program: &Path) -> Result<(), LabError> {
        for pod in &self.pods {
            self.spawn_echo(pod, port, program)?;
        }
        self.pods.iter().try_for_each(|pod| self.wait_for_echo(pod, port))
    }

    /// A TCP probe from inside `namespace` (see [`probe::tcp_request`]).
    pub fn tcp_request(&self, namespace: &str, addr: SocketAddr, timeout: Duration) -> Result<EchoReply, ProbeError> {
        self.check_probe(namespace, addr)?;
        probe::tcp_request_within(namespace, self.cgroup_of(namespace), addr, timeout)
    }

    /// A UDP probe from inside `namespace` (see [`probe::udp_request`]).
    pub fn udp_request(
        &self,
        namespace: &str,
        addr: SocketAddr,
        timeout: Duration,
        source_port: Option<u16>,
    ) -> Result<EchoReply, ProbeError> {
        self.check_probe(namespace, addr)?;
        probe::udp_request_within(namespace, self.cgroup_of(namespace), addr, timeout, source_port)
    }

    /// Runs `work` on a thread inside `namespace` (see [`crate::run_in_namespace`]).
    pub fn run_in<T: Send, F: FnOnce() -> T + Send>(&self, namespace: &str, work: F) -> Result<T, LabError> {
        self.check_namespace(namespace)?;
        Ok(run_in_namespace_within(namespace, self.cgroup_of(namespace), work)?)
    }

    /// A bounded load from inside `namespace` (in its node's cgroup, if the lab has them).
    pub fn load(&self, namespace: &str, spec: crate::LoadSpec) -> crate::Load {
        crate::Load::start_within(namespace, self.cgroup_of(namespace).map(Path::to_path_buf), spec)
    }

    /// The cgroup of a node (with [`LabBuilder::node_cgroups`]).
    pub fn node_cgroup(&self, node: u16) -> Option<&Path> {
        self.node_cgroups.as_ref()?.path(node)
    }

    /// The cgroup threads working in `namespace` join: its node's, for the node and its
    /// pods; none for the LAN and external clients.
    fn cgroup_of(&self, namespace: &str) -> Option<&Path> {
        let cgroups = self.node_cgroups.as_ref()?;
        let node = self
            .nodes
            .iter()
            .find(|n| n.namespace == namespace)
            .map(|n| n.index)
            .or_else(|| self.pods.iter().find(|p| p.namespace == namespace).map(|p| p.node))?;
        cgroups.path(node)
    }

    /// Tears the lab down now and reports namespaces that could not be removed. Dropping
    /// the lab does the same, reporting problems on stderr only.
    pub fn teardown(mut self) -> Result<(), LabError> {
        self.teardown_now()
    }

    fn teardown_now(&mut self) -> Result<(), LabError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let mut children = match self.children.get_mut() {
            Ok(children) => std::mem::take(children),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        for tracked in &mut children {
            let _ = tracked.child.kill();
            if wait_bounded(&mut tracked.child, Duration::from_secs(5)).is_err() {
                eprintln!("svcplane-testbed: {} did not exit after SIGKILL", tracked.what);
            }
        }
        remove_namespaces(&self.namespaces);
        if let Some(mut cgroups) = self.node_cgroups.take()
            && let Err(error) = cgroups.remove()
        {
            eprintln!("svcplane-testbed: {error}");
        }
        let mut left: Vec<String> =
            list_namespaces().into_iter().filter(|name| prefix_of(name) == Some(self.prefix.as_str())).collect();
        if !left.is_empty() {
            // One more try: a process may have been starting inside just then.
            remove_namespaces(&left);
            left.retain(|name| list_namespaces().contains(name));
        }
        if left.is_empty() {
            // Only now may another lab take this prefix.
            self.lock = None;
            Ok(())
        } else {
            if let Some(lock) = self.lock.take() {
                lock.release_for_sweep();
            }
            Err(LabError::Teardown { namespaces: left })
        }
    }

    fn check_namespace(&self, namespace: &str) -> Result<(), LabError> {
        if self.namespaces.iter().any(|own| own == namespace) {
            Ok(())
        } else {
            Err(LabError::UnknownNamespace { namespace: namespace.to_owned(), prefix: self.prefix.clone() })
        }
    }

    fn check_probe(&self, namespace: &str, addr: SocketAddr) -> Result<(), ProbeError> {
        if !address_plan::is_lab_address(addr.ip()) {
            return Err(ProbeError::OutsideAddressPlan { addr });
        }
        self.check_namespace(namespace).map_err(|_| {
            ProbeError::EnterNamespace(NamespaceError::Open {
                namespace: namespace.to_owned(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("not a namespace of lab {}", self.prefix),
                ),
            })
        })
    }

    fn spawn_echo(&self, pod: &Pod, port: u16, program: &Path) -> Result<(), LabError> {
        let port_text = port.to_string();
        let args: [&OsStr; 6] = [
            program.as_os_str(),
            OsStr::new("echo"),
            OsStr::new("--name"),
            OsStr::new(&pod.name),
            OsStr::new("--port"),
            OsStr::new(&port_text),
        ];
        let child = self.spawn(&pod.namespace, &args)?;
        self.track(format!("echo server of pod {}", pod.name), child);
        Ok(())
    }

    fn track(&self, what: String, child: Child) {
        let mut children = match self.children.lock() {
            Ok(children) => children,
            Err(poisoned) => poisoned.into_inner(),
        };
        children.push(TrackedChild { what, child });
    }

    /// Polls the pod's echo server over TCP on both addresses until it answers with the
    /// pod's name, its process exits, or [`ECHO_START_TIMEOUT`] passes.
    fn wait_for_echo(&self, pod: &Pod, port: u16) -> Result<(), LabError> {
        let started = Instant::now();
        let what = format!("echo server of pod {}", pod.name);
        let mut last_error = String::from("no answer yet");
        let mut pending: Vec<SocketAddr> = pod.ips().into_iter().map(|ip| SocketAddr::new(ip, port)).collect();
        while started.elapsed() < ECHO_START_TIMEOUT {
            if let Some(status) = self.exit_status_of(&what) {
                return Err(LabError::EchoExited { pod: pod.name.clone(), status });
            }
            let mut still_pending = Vec::new();
            for addr in pending {
                match probe::tcp_request_in(&pod.namespace, addr, Duration::from_millis(500)) {
                    Ok(reply) if reply.server_name == pod.name => {}
                    Ok(reply) => {
                        last_error = format!("{addr} answered as {:?}", reply.server_name);
                        still_pending.push(addr);
                    }
                    Err(error) => {
                        last_error = error.to_string();
                        still_pending.push(addr);
                    }
                }
            }
            pending = still_pending;
            if pending.is_empty() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(LabError::EchoNotReady { pod: pod.name.clone(), port, after: ECHO_START_TIMEOUT, last_error })
    }

    fn exit_status_of(&self, what: &str) -> Option<ExitStatus> {
        let mut children = match self.children.lock() {
            Ok(children) => children,
            Err(poisoned) => poisoned.into_inner(),
        };
        children
            .iter_mut()
            .rev()
            .find(|tracked| tracked.what == what)
            .and_then(|tracked| tracked.child.try_wait().ok().flatten())
    }

    /// Runs one `ip` command inside `namespace`.
    fn ip(&self, namespace: &str, args: &[&str]) -> Result<(), LabError> {
        let mut command = Command::new("ip");
        command.args(["-n", namespace]).args(args);
        check(namespace, &describe("ip", args), run_bounded(command, None, DEFAULT_COMMAND_TIMEOUT))
    }

    /// Runs an `ip -batch` script inside `namespace` (or outside any lab namespace for
    /// `netns add`, with `namespace` None).
    fn ip_batch(&self, namespace: Option<&str>, script: &str) -> Result<(), LabError> {
        let mut command = Command::new("ip");
        if let Some(namespace) = namespace {
            command.args(["-n", namespace]);
        }
        command.args(["-batch", "-"]);
        let label = namespace.unwrap_or("the lab");
        let line = format!("ip -batch - <<\n{script}");
        check(label, &line, run_bounded(command, Some(script.as_bytes()), DEFAULT_COMMAND_TIMEOUT))
    }

    /// Creates and configures every namespace, link, address and route.
    fn wire(&self) -> Result<(), LabError> {
        // 1. The namespaces.
        let mut script = String::new();
        for namespace in &self.namespaces {
            let _ = writeln!(script, "netns add {namespace}");
        }
        self.ip_batch(None, &script)?;

        // 2. Sysctls that must hold before any interface exists (new interfaces copy the
        //    `default` values): no DAD delay, no reverse path filter, no redirects.
        for namespace in &self.namespaces {
            let mut settings: Vec<(&str, &str)> = vec![
                ("net.ipv6.conf.all.accept_dad", "0"),
                ("net.ipv6.conf.default.accept_dad", "0"),
                ("net.ipv6.conf.all.accept_ra", "0"),
                ("net.ipv6.conf.default.accept_ra", "0"),
                ("net.ipv4.conf.all.rp_filter", "0"),
                ("net.ipv4.conf.default.rp_filter", "0"),
            ];
            if *namespace == self.lan_namespace {
                // A plain switch: no addresses, so it never speaks on the LAN itself.
                settings.extend([
                    ("net.ipv4.ip_forward", "0"),
                    ("net.ipv6.conf.all.forwarding", "0"),
                    ("net.ipv6.conf.default.disable_ipv6", "1"),
                ]);
            } else if self.nodes.iter().any(|node| node.namespace == *namespace) {
                settings.extend([
                    ("net.ipv4.ip_forward", "1"),
                    ("net.ipv6.conf.all.forwarding", "1"),
                    ("net.ipv6.conf.default.forwarding", "1"),
                    // Nodes forward between clients and other nodes on the same LAN; an
                    // ICMP redirect would make clients bypass the node under test.
                    ("net.ipv4.conf.all.send_redirects", "0"),
                    ("net.ipv4.conf.default.send_redirects", "0"),
                ]);
            } else {
                settings.extend([
                    ("net.ipv4.ip_forward", "0"),
                    ("net.ipv6.conf.all.forwarding", "0"),
                    ("net.ipv4.conf.all.accept_redirects", "0"),
                    ("net.ipv4.conf.default.accept_redirects", "0"),
                    ("net.ipv6.conf.all.accept_redirects", "0"),
                    ("net.ipv6.conf.default.accept_redirects", "0"),
                ]);
            }
            set_sysctls(namespace, &settings)?;
        }

        // 3. The LAN: a bridge with a port per node and client. Each veth is created with
        //    its ends directly in the two lab namespaces, never in the caller's.
        let mut script = String::from(
            "link add br0 type bridge stp_state 0 forward_delay 0 mcast_snooping 0\n\
             link set br0 up\n",
        );
        let ports = self
            .nodes
            .iter()
            .map(|node| (&node.name, &node.namespace))
            .chain(self.clients.iter().map(|c| (&c.name, &c.namespace)));
        for (port, peer_namespace) in ports {
            let _ = writeln!(
                script,
                "link add {port} type veth peer name {OUTSIDE_INTERFACE} netns {peer_namespace}\n\
                 link set {port} master br0\n\
                 link set {port} up"
            );
        }
        self.ip_batch(Some(&self.lan_namespace), &script)?;

        // 4. Nodes: LAN address, one veth per pod, host routes to the pods, routes to the
        //    other nodes' pod ranges.
        for node in &self.nodes {
            let script = self.node_script(node);
            self.ip_batch(Some(&node.namespace), &script)?;
            let mut settings = Vec::new();
            for pod in self.pods_on(node.index) {
                let interface = &pod.host_interface;
                settings.push((format!("net.ipv4.conf.{interface}.proxy_arp"), "1"));
                // Answer at once, not after a random delay of up to 0.8 s.
                settings.push((format!("net.ipv4.neigh.{interface}.proxy_delay"), "0"));
            }
            let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            set_sysctls(&node.namespace, &settings)?;
        }

        // 5. Pods: /32 and /128, default routes via the link-local gateways.
        for pod in &self.pods {
            let script = format!(
                "link set lo up\n\
                 link set {eth} up\n\
                 address add {v4}/32 dev {eth}\n\
                 address add {v6}/128 dev {eth} nodad\n\
                 route add {gw4} dev {eth} scope link\n\
                 route add default via {gw4} dev {eth}\n\
                 route add default via {gw6} dev {eth}\n",
                eth = OUTSIDE_INTERFACE,
                v4 = pod.ip_v4(),
                v6 = pod.ip_v6(),
                gw4 = POD_GATEWAY_V4,
                gw6 = POD_GATEWAY_V6,
            );
            self.ip_batch(Some(&pod.namespace), &script)?;
        }

        // 6. External clients: LAN addresses only. Routes come from `route_via`.
        for client in &self.clients {
            let script = format!(
                "link set lo up\n\
                 link set {eth} up\n\
                 address add {v4}/{len4} dev {eth}\n\
                 address add {v6}/{len6} dev {eth} nodad\n",
                eth = OUTSIDE_INTERFACE,
                v4 = client.ip_v4(),
                v6 = client.ip_v6(),
                len4 = address_plan::LAN_V4.prefix_len(),
                len6 = address_plan::LAN_V6.prefix_len(),
            );
            self.ip_batch(Some(&client.namespace), &script)?;
        }
        Ok(())
    }

    fn node_script(&self, node: &Node) -> String {
        let eth = OUTSIDE_INTERFACE;
        let mut script = format!(
            "link set lo up\n\
             link set {eth} up\n\
             address add {v4}/{len4} dev {eth}\n\
             address add {v6}/{len6} dev {eth} nodad\n\
             route add {gw4}/32 dev {eth}\n",
            v4 = node.ip_v4(),
            v6 = node.ip_v6(),
            len4 = address_plan::LAN_V4.prefix_len(),
            len6 = address_plan::LAN_V6.prefix_len(),
            // Proxy ARP only answers for addresses the node has a route to through another
            // interface. Calico nodes have a default route for that; ours must not, so
            // they get a host route for the gateway address towards the LAN (nobody there
            // owns it: packets really sent to it are lost inside the lab).
            gw4 = POD_GATEWAY_V4,
        );
        for pod in self.pods_on(node.index) {
            let _ = writeln!(
                script,
                "link add {veth} type veth peer name {eth} netns {pod_namespace}\n\
                 link set {veth} up\n\
                 address add {gw6}/64 dev {veth} nodad\n\
                 route add {v4}/32 dev {veth}\n\
                 route add {v6}/128 dev {veth}",
                veth = pod.host_interface,
                pod_namespace = pod.namespace,
                gw6 = POD_GATEWAY_V6,
                v4 = pod.ip_v4(),
                v6 = pod.ip_v6(),
            );
        }
        for other in self.nodes.iter().filter(|other| other.index != node.index) {
            let _ = writeln!(
                script,
                "route add {cidr4} via {via4} dev {eth}\n\
                 route add {cidr6} via {via6} dev {eth}",
                cidr4 = other.pod_cidr_v4(),
                via4 = other.ip_v4(),
                cidr6 = other.pod_cidr_v6(),
                via6 = other.ip_v6(),
            );
        }
        script
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(error) = self.teardown_now() {
            eprintln!("svcplane-testbed: lab {}: {error}", self.prefix);
        }
    }
}

/// Removes namespaces left by labs that no longer run: those with our own prefix (a crashed
/// earlier holder), and those whose prefix has a lock file nobody holds.
fn remove_leftovers(own_prefix: &str) {
    let mut by_prefix: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for name in list_namespaces() {
        if let Some(prefix) = prefix_of(&name) {
            by_prefix.entry(prefix.to_owned()).or_default().push(name);
        }
    }
    for (prefix, names) in by_prefix {
        if prefix == own_prefix {
            remove_namespaces(&names);
        } else if let Ok(Some(stale)) = PrefixLock::try_claim(&prefix, false) {
            remove_namespaces(&names);
            drop(stale);
        }
    }
}

/// Kills every process inside `namespaces`, then deletes them (`ip netns del`).
fn remove_namespaces(namespaces: &[String]) {
    if namespaces.is_empty() {
        return;
    }
    // Killing twice catches a process forked while the first round ran.
    for _ in 0..2 {
        if kill_processes_in(namespaces).is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let mut script = String::new();
    for namespace in namespaces {
        let _ = writeln!(script, "netns del {namespace}");
    }
    let mut command = Command::new("ip");
    command.args(["-force", "-batch", "-"]);
    // Errors are expected for namespaces that were never created.
    let _ = run_bounded(command, Some(script.as_bytes()), DEFAULT_COMMAND_TIMEOUT);
}

/// Writes sysctls (`net.ipv4.ip_forward` style keys) from inside `namespace`.
fn set_sysctls(namespace: &str, settings: &[(&str, &str)]) -> Result<(), LabError> {
    run_in_namespace(namespace, || {
        for (key, value) in settings {
            let path = format!("/proc/sys/{}", key.replace('.', "/"));
            std::fs::write(&path, value).map_err(|source| LabError::SetSysctl {
                namespace: namespace.to_owned(),
                key: (*key).to_owned(),
                source,
            })?;
        }
        Ok(())
    })?
}

fn check(namespace: &str, command: &str, result: Result<Output, RunFailure>) -> Result<(), LabError> {
    let output = result.map_err(|failure| command_error(namespace, command, failure))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(LabError::CommandFailed {
            namespace: namespace.to_owned(),
            command: command.to_owned(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn command_error(namespace: &str, command: &str, failure: RunFailure) -> LabError {
    match failure {
        RunFailure::Spawn(source) | RunFailure::Wait(source) => {
            LabError::StartCommand { namespace: namespace.to_owned(), command: command.to_owned(), source }
        }
        RunFailure::TimedOut(after) => {
            LabError::CommandTimedOut { namespace: namespace.to_owned(), command: command.to_owned(), after }
        }
    }
}

fn describe_os<S: AsRef<OsStr>>(args: &[S]) -> String {
    args.iter().map(|arg| arg.as_ref().to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
}
