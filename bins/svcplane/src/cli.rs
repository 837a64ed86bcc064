//! The command line: names and meanings are a contract with operators' scripts
//! (see the project's CLI design); add flags freely, rename none.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;

#[derive(Debug, Parser)]
#[command(
    name = "svcplane",
    version,
    about = "The Kubernetes Service dataplane: node proxy, EndpointSlice controller and cluster DNS"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Program this node and keep it in sync until SIGTERM / SIGINT.
    Proxy(ProxyArgs),
    /// Print what `proxy` would program, touching nothing (no root needed).
    Render(ProxyArgs),
    /// Say what happens to one packet on a node and why, from the plan every mode renders.
    Explain(ExplainArgs),
    /// Per-Service and per-endpoint connection counters from the kernel, busiest first,
    /// refreshing (needs the rights to read the mode's rules, usually root).
    Top(TopArgs),
    /// The EndpointSlice controller (and LoadBalancer addresses from pools): with
    /// `--kubeconfig`, against the API until SIGTERM / SIGINT; with `--manifests`, print the
    /// slices and allocations it derives.
    Controller(ControllerArgs),
    /// Serve the cluster zone (Kubernetes DNS specification 1.1.0) over UDP and TCP.
    Dns(DnsArgs),
    /// L2 announcement on this node: answer ARP / NDP for the LoadBalancer addresses whose
    /// per-Service Lease this node holds (one agent per node, against the API).
    Announce(AnnounceArgs),
    /// Remove everything svcplane programmed on this node.
    Cleanup(CleanupArgs),
    /// A sandbox of network namespaces showing real traffic through Services (needs root).
    Lab(LabArgs),
    /// An echo server for labs and tests: answers with its name and the client's address.
    #[command(hide = true)]
    Echo(EchoArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Nftables,
    /// kube-proxy's iptables chain layout, applied with `iptables-restore --noflush`.
    Iptables,
    /// BPF programs: Services balanced at connect() / sendmsg() for the node's cgroup tree.
    Ebpf,
    /// IPVS virtual services over generic netlink, Service addresses on `kube-ipvs0`
    /// (needs the `ip_vs` and `ip_set` modules and the ipset program; see docs/backend-ipvs.md).
    Ipvs,
    /// nftables DNATs each frontend to a relay in the proxy process, which picks an
    /// endpoint (retrying another on a failed connect) and relays the bytes; endpoints see
    /// the node's address (see docs/backend-userspace.md).
    Userspace,
}

/// Which iptables variant iptables mode writes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IptablesBackend {
    /// `iptables-legacy-*` (the x_tables kernel interface).
    Legacy,
    /// `iptables-nft-*` (iptables over nf_tables).
    Nft,
    /// Whichever the node already uses (kubelet's hint chains, else the variant holding
    /// rules), else nft.
    Auto,
}

/// How nftables mode talks to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NftMechanism {
    /// nf_tables netlink directly, one batch per sync.
    Netlink,
    /// The `nft` command (`--nft-program`), one process per sync.
    Cli,
}

#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// Directory of Kubernetes manifests (Service, Pod, Node, EndpointSlice).
    #[arg(long, value_name = "DIR", conflicts_with = "kubeconfig")]
    pub manifests: Option<PathBuf>,
    /// A kubeconfig: watch this kube-apiserver instead of a manifests directory. In a Pod,
    /// with neither flag, the in-cluster config is used.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// ClusterIP range for allocation (repeatable: one per family).
    #[arg(long = "service-cidr", value_name = "CIDR", default_value = "10.96.0.0/12")]
    pub service_cidrs: Vec<IpNet>,
    /// NodePort range for allocation.
    #[arg(long, value_name = "LOW-HIGH", default_value = "30000-32767")]
    pub node_port_range: String,
    /// Where allocations are remembered across restarts (default: none, allocations are
    /// then derived from names alone).
    #[arg(long, value_name = "FILE")]
    pub allocations_file: Option<PathBuf>,
}

/// Where the cluster state comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    Manifests(PathBuf),
    Api(svcplane_kube::ClusterAccess),
}

impl SourceArgs {
    /// `--manifests`, else `--kubeconfig`, else the in-cluster config in a Pod.
    pub fn kind(&self) -> anyhow::Result<SourceKind> {
        if let Some(dir) = &self.manifests {
            return Ok(SourceKind::Manifests(dir.clone()));
        }
        svcplane_kube::ClusterAccess::from_flag(self.kubeconfig.clone())
            .map(SourceKind::Api)
            .ok_or_else(|| anyhow::anyhow!("one of --manifests DIR or --kubeconfig PATH is required (outside a Pod)"))
    }
}

/// `proxy` and `render`. Flags that kube-proxy also has keep its names (or are aliases of
/// ours), so a kube-proxy DaemonSet's arguments work unchanged; how they combine with
/// `--config` is `EffectiveConfig::resolve`'s (kube-proxy's precedence:
/// the file wins, but for `--hostname-override` / `--node-name` and logging).
#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// A kube-proxy configuration file (`KubeProxyConfiguration`,
    /// `kubeproxy.config.k8s.io/v1alpha1`, YAML or JSON). When given, it wins over the
    /// flags kube-proxy also has, as in kube-proxy (see docs/configuration.md).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Write the effective configuration (defaults, flags or `--config`) to FILE as a
    /// `KubeProxyConfiguration` and exit.
    #[arg(long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,
    /// This node, as in Pod.spec.nodeName (default: the configuration file's
    /// `hostnameOverride`, else the machine's hostname, lower-cased).
    #[arg(long = "node-name", visible_alias = "hostname-override", value_name = "NAME")]
    pub node_name_flag: Option<String>,
    /// This node's addresses (repeatable; default: from the Node object).
    #[arg(long = "node-ip", value_name = "IP")]
    pub node_ips: Vec<IpAddr>,
    /// The pod network, for the masquerade decision (comma-separated or repeatable: one
    /// per family).
    #[arg(long = "cluster-cidr", value_name = "CIDR", value_delimiter = ',')]
    pub cluster_cidrs: Vec<IpNet>,
    /// Where NodePorts answer: CIDRs, or `primary` for the node's primary addresses
    /// (comma-separated or repeatable; default: every node address except loopback).
    #[arg(long = "nodeport-addresses", value_name = "CIDR|primary", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,
    /// The proxy mode: nftables (default), iptables, ipvs, ebpf or userspace. An empty value means
    /// iptables, as in kube-proxy.
    #[arg(long = "mode", visible_alias = "proxy-mode", value_name = "MODE")]
    pub mode_flag: Option<String>,
    /// The mode in effect (from `--mode` or `--config`), set by `EffectiveConfig::apply_to`.
    #[arg(skip = Mode::Nftables)]
    pub mode: Mode,
    /// How nftables mode reaches the kernel.
    #[arg(long, value_enum, default_value = "netlink")]
    pub nft_mechanism: NftMechanism,
    /// For fault tests only: each kernel transaction takes one fault from this file's
    /// first line and the file is rewritten without it (nftables mode over netlink:
    /// `refused`, `answers-lost`, `socket-closed`; iptables mode: `refused`). See
    /// docs/reliability.md.
    #[arg(long, value_name = "FILE", hide = true)]
    pub inject_faults_from: Option<PathBuf>,
    /// The `nft` program to run with `--nft-mechanism cli`.
    #[arg(long, default_value = "nft", hide = true)]
    pub nft_program: String,
    /// The iptables variant of `--mode iptables`.
    #[arg(long, value_enum, default_value = "auto")]
    pub iptables_backend: IptablesBackend,
    /// The IPVS scheduler of every virtual service in `--mode ipvs` (default rr).
    #[arg(long = "ipvs-scheduler", value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(svcplane_backend_ipvs::SCHEDULERS))]
    pub ipvs_scheduler_flag: Option<String>,
    /// The scheduler in effect, set by `EffectiveConfig::apply_to`.
    #[arg(skip = String::from("rr"))]
    pub ipvs_scheduler: String,
    /// IPVS idle timeout of TCP connections: seconds or a duration like `15m` (0: leave
    /// the kernel's).
    #[arg(long = "ipvs-tcp-timeout", value_name = "DURATION")]
    pub ipvs_tcp_timeout_flag: Option<String>,
    /// IPVS timeout of TCP connections after a FIN: seconds or a duration (0: leave the
    /// kernel's).
    #[arg(long = "ipvs-tcpfin-timeout", value_name = "DURATION")]
    pub ipvs_tcpfin_timeout_flag: Option<String>,
    /// IPVS timeout of UDP flows: seconds or a duration (0: leave the kernel's).
    #[arg(long = "ipvs-udp-timeout", value_name = "DURATION")]
    pub ipvs_udp_timeout_flag: Option<String>,
    /// CIDRs (comma-separated) whose IPVS virtual services a sync or `cleanup` never
    /// removes, as kube-proxy's: services other software made there stay.
    #[arg(long = "ipvs-exclude-cidrs", value_name = "CIDRS", value_delimiter = ',')]
    pub ipvs_exclude_cidrs_flag: Option<Vec<String>>,
    /// Sets `net.ipv4.conf.all.arp_ignore=1` and `arp_announce=2` in the node's network
    /// namespace, so the node does not answer ARP for the Service addresses on `kube-ipvs0`.
    #[arg(long = "ipvs-strict-arp", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub ipvs_strict_arp_flag: Option<bool>,
    /// The excluded CIDRs and strict ARP in effect, set by `EffectiveConfig::apply_to`.
    #[arg(skip)]
    pub ipvs_exclude_cidrs: Vec<IpNet>,
    #[arg(skip)]
    pub ipvs_strict_arp: bool,
    /// The IPVS timeouts in effect, in seconds, set by `EffectiveConfig::apply_to`.
    #[arg(skip)]
    pub ipvs_tcp_timeout: u32,
    #[arg(skip)]
    pub ipvs_tcpfin_timeout: u32,
    #[arg(skip)]
    pub ipvs_udp_timeout: u32,
    #[command(flatten)]
    pub kube_proxy: KubeProxyFlags,
    #[command(flatten)]
    pub ebpf: EbpfArgs,
    #[command(flatten)]
    pub userspace: UserspaceArgs,
    /// Count new connections per endpoint in nftables mode (`--nft-counters=false`: rules
    /// without `counter`, and `top`, `/status` and the endpoint metrics show nothing).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub nft_counters: bool,
    /// How many tables per family nftables mode spreads the Services over (1-64; 0: by
    /// the cluster's size, one per ~1000 service ports, a power of two). A change costs the
    /// kernel in proportion to the table it lands in.
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=64))]
    pub nftables_tables: u16,
    /// Endpoint connection counters exported on `/metrics` as
    /// `svcplane_endpoint_connections_total` (the busiest N; the rest summed in one series).
    /// 0 turns the export off: each scrape then reads no kernel counters.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub metrics_max_endpoint_series: usize,
    /// Endpoint counters shown on the `/status` page (the busiest N).
    #[arg(long, value_name = "N", default_value_t = svcplane_core::counters::DEFAULT_MAX_SERIES)]
    pub status_max_series: usize,
}

/// The relay of `--mode userspace`.
#[derive(Debug, Clone, Args)]
pub struct UserspaceArgs {
    /// How long one connect to an endpoint may take before the relay tries the next.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 1000)]
    pub userspace_connect_timeout_ms: u64,
    /// A UDP session with no datagram either way for this long ends.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub userspace_udp_idle_timeout: u64,
    /// How long connections to a removed endpoint keep going before they are closed
    /// (connections to a terminating endpoint go on until they end).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub userspace_removed_grace: u64,
    /// Open connections (or UDP sessions) per service port; beyond it new clients are
    /// refused at once, logged and counted (`svcplane_userspace_refused_total`).
    #[arg(long, value_name = "N", default_value_t = 50_000)]
    pub userspace_max_connections: usize,
    /// Threads of the relay.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub userspace_threads: usize,
}

/// kube-proxy's flags (v1.36) beyond the ones `ProxyArgs` shares with svcplane: the ones
/// svcplane applies, then (hidden) the ones it accepts and warns about, one warning each.
#[derive(Debug, Clone, Default, Args)]
pub struct KubeProxyFlags {
    /// Where `/healthz` and `/livez` answer: `IP:PORT` or `IP` (port 10256); empty: no
    /// healthz server (default 0.0.0.0:10256).
    #[arg(long, value_name = "IP:PORT")]
    pub healthz_bind_address: Option<String>,
    /// Where `/metrics`, `/proxyMode` and `/configz` answer: `IP:PORT` or `IP` (port
    /// 10249); empty: no metrics server (default 127.0.0.1:10249).
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_bind_address: Option<String>,
    /// Deprecated in kube-proxy: the health server's port (0 disables it).
    #[arg(long, value_name = "PORT", hide = true)]
    pub healthz_port: Option<u16>,
    /// Deprecated in kube-proxy: the metrics server's port (0 disables it).
    #[arg(long, value_name = "PORT", hide = true)]
    pub metrics_port: Option<u16>,
    /// Exit when a healthz or metrics server cannot bind (default: log it and run on).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub bind_address_hard_fail: Option<bool>,
    /// Longest time between full resyncs, a duration like `30s` or `1m0s` (default 30s).
    #[arg(long = "sync-period", value_name = "DURATION")]
    pub sync_period: Option<String>,
    /// Shortest time between two syncs, a duration like `1s` or `500ms` (default 1s; 0:
    /// every change syncs at once).
    #[arg(long = "min-sync-period", value_name = "DURATION")]
    pub min_sync_period: Option<String>,
    /// kube-proxy's `--sync-period` for every mode but ipvs (ignored in ipvs mode, as there).
    #[arg(long, value_name = "DURATION", hide = true)]
    pub iptables_sync_period: Option<String>,
    /// kube-proxy's `--min-sync-period` for every mode but ipvs.
    #[arg(long, value_name = "DURATION", hide = true)]
    pub iptables_min_sync_period: Option<String>,
    /// kube-proxy's `--sync-period` of ipvs mode (ignored in other modes, as there).
    #[arg(long, value_name = "DURATION", hide = true)]
    pub ipvs_sync_period: Option<String>,
    /// kube-proxy's `--min-sync-period` of ipvs mode.
    #[arg(long, value_name = "DURATION", hide = true)]
    pub ipvs_min_sync_period: Option<String>,
    /// The proxy process's oom_score_adj, -1000..=1000 (default -999).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,
    /// Log verbosity (accepted for kube-proxy's arguments; svcplane's level is SVCPLANE_LOG).
    #[arg(short = 'v', long = "v", value_name = "LEVEL", hide = true)]
    pub verbosity: Option<String>,
    /// As kube-proxy's `--cleanup`: remove what every mode programmed and exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub cleanup: Option<bool>,
    /// As kube-proxy's `--init-only`: nothing needs doing before the proxy runs; exits.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub init_only: Option<bool>,
    #[command(flatten)]
    pub ignored: IgnoredKubeProxyFlags,
}

/// The rest of kube-proxy's flags, hidden: accepted so a DaemonSet's arguments work. The
/// conntrack timeout flags are applied like the file's `conntrack` fields; every other one
/// means nothing to svcplane and is named in one warning.
#[derive(Debug, Clone, Default, Args)]
pub struct IgnoredKubeProxyFlags {
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub masquerade_all: Option<String>,
    #[arg(long, hide = true, allow_negative_numbers = true)]
    pub iptables_masquerade_bit: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub iptables_localhost_nodeports: Option<String>,
    #[arg(long, hide = true)]
    pub conntrack_max_per_core: Option<String>,
    #[arg(long, hide = true)]
    pub conntrack_min: Option<String>,
    #[arg(long, hide = true)]
    pub conntrack_tcp_timeout_established: Option<String>,
    #[arg(long, hide = true)]
    pub conntrack_tcp_timeout_close_wait: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub conntrack_tcp_be_liberal: Option<String>,
    #[arg(long, hide = true)]
    pub conntrack_udp_timeout: Option<String>,
    #[arg(long, hide = true)]
    pub conntrack_udp_timeout_stream: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub profiling: Option<String>,
    #[arg(long, hide = true)]
    pub feature_gates: Option<String>,
    #[arg(long, hide = true)]
    pub detect_local_mode: Option<String>,
    #[arg(long, hide = true)]
    pub pod_bridge_interface: Option<String>,
    #[arg(long, hide = true)]
    pub pod_interface_name_prefix: Option<String>,
    #[arg(long, hide = true)]
    pub bind_address: Option<String>,
    #[arg(long, hide = true)]
    pub config_sync_period: Option<String>,
    #[arg(long, hide = true)]
    pub kube_api_qps: Option<String>,
    #[arg(long, hide = true)]
    pub kube_api_burst: Option<String>,
    #[arg(long, hide = true)]
    pub kube_api_content_type: Option<String>,
    #[arg(long, hide = true)]
    pub master: Option<String>,
    #[arg(long, hide = true)]
    pub show_hidden_metrics_for_version: Option<String>,
    #[arg(long, hide = true)]
    pub vmodule: Option<String>,
    #[arg(long, hide = true)]
    pub logging_format: Option<String>,
    #[arg(long, hide = true)]
    pub log_flush_frequency: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub log_text_split_stream: Option<String>,
    #[arg(long, hide = true)]
    pub log_text_info_buffer_size: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub log_json_split_stream: Option<String>,
    #[arg(long, hide = true)]
    pub log_json_info_buffer_size: Option<String>,
    #[arg(long, hide = true)]
    pub boot_id_file: Option<String>,
}

impl IgnoredKubeProxyFlags {
    /// The flags given that svcplane does not apply, as `--name`, in kube-proxy's order
    /// (the conntrack timeout flags are applied: not listed).
    pub fn given(&self) -> Vec<&'static str> {
        let all: [(&'static str, bool); 25] = [
            ("--masquerade-all", self.masquerade_all.is_some()),
            ("--iptables-masquerade-bit", self.iptables_masquerade_bit.is_some()),
            ("--iptables-localhost-nodeports", self.iptables_localhost_nodeports.is_some()),
            ("--conntrack-max-per-core", self.conntrack_max_per_core.is_some()),
            ("--conntrack-min", self.conntrack_min.is_some()),
            ("--profiling", self.profiling.is_some()),
            ("--feature-gates", self.feature_gates.is_some()),
            ("--detect-local-mode", self.detect_local_mode.is_some()),
            ("--pod-bridge-interface", self.pod_bridge_interface.is_some()),
            ("--pod-interface-name-prefix", self.pod_interface_name_prefix.is_some()),
            ("--bind-address", self.bind_address.is_some()),
            ("--config-sync-period", self.config_sync_period.is_some()),
            ("--kube-api-qps", self.kube_api_qps.is_some()),
            ("--kube-api-burst", self.kube_api_burst.is_some()),
            ("--kube-api-content-type", self.kube_api_content_type.is_some()),
            ("--master", self.master.is_some()),
            ("--show-hidden-metrics-for-version", self.show_hidden_metrics_for_version.is_some()),
            ("--vmodule", self.vmodule.is_some()),
            ("--logging-format", self.logging_format.is_some()),
            ("--log-flush-frequency", self.log_flush_frequency.is_some()),
            ("--log-text-split-stream", self.log_text_split_stream.is_some()),
            ("--log-text-info-buffer-size", self.log_text_info_buffer_size.is_some()),
            ("--log-json-split-stream", self.log_json_split_stream.is_some()),
            ("--log-json-info-buffer-size", self.log_json_info_buffer_size.is_some()),
            ("--boot-id-file", self.boot_id_file.is_some()),
        ];
        all.into_iter().filter(|(_, given)| *given).map(|(name, _)| name).collect()
    }

    /// `--detect-local-mode`'s value, which is fine when it names what svcplane does.
    pub fn detect_local_mode(&self) -> Option<&str> {
        self.detect_local_mode.as_deref()
    }
}

/// Where `--mode ebpf` pins its BPF objects and which processes it balances.
#[derive(Debug, Clone, Args)]
pub struct EbpfArgs {
    /// A bpffs directory for the pinned maps and links (a bpffs is mounted there if none is).
    #[arg(long, value_name = "DIR", default_value = svcplane_backend_ebpf::DEFAULT_BPF_ROOT)]
    pub bpf_root: PathBuf,
    /// The cgroup v2 directory whose processes are balanced (default: the cgroup2 mount's
    /// root, i.e. every process of the node).
    #[arg(long, value_name = "DIR")]
    pub cgroup_path: Option<PathBuf>,
    /// Capacity of the frontend map (each frontend takes two entries: node and pods).
    #[arg(long, value_name = "N", default_value_t = 131_072)]
    pub bpf_map_services: u32,
    /// Capacity of the endpoint-slot map (and of the serving-endpoint map).
    #[arg(long, value_name = "N", default_value_t = 131_072)]
    pub bpf_map_backends: u32,
    /// Capacity of the ClientIP affinity map (LRU).
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    pub bpf_map_affinity: u32,
    /// Entries of each Maglev table the tc program picks endpoints of NodePorts,
    /// load-balancer and external IPs with (a prime; ~100x the endpoints for under 1 %
    /// disruption).
    #[arg(long, value_name = "PRIME", default_value_t = 16_381, value_parser = maglev_size)]
    pub maglev_table_size: u32,
    /// Capacity of the connection-state maps: UDP flows of the node's and its pods'
    /// sockets and the tc program's tracking of flows from outside (two entries per flow),
    /// LRU maps whose full one forgets its least recently used entries; and the open
    /// balanced TCP sockets' reverse translations (not preallocated; beyond it a socket's
    /// getpeername() shows the endpoint). UDP sockets' reverse translations live in each
    /// socket's own storage and need no capacity.
    #[arg(long, value_name = "N", default_value_t = 262_144)]
    pub bpf_map_sockets: u32,
    /// How external traffic to another node's endpoint returns: `snat` (through this
    /// node) or `dsr` (direct server return: the endpoint's node answers the client from
    /// the Service address, and the endpoint sees the client's address).
    #[arg(long, value_enum, default_value = "snat")]
    pub ebpf_external_mode: EbpfExternalMode,
}

/// `--ebpf-external-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EbpfExternalMode {
    Snat,
    Dsr,
}

#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub ebpf: EbpfArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The node whose rules the packet meets first, as in Pod.spec.nodeName.
    #[arg(long = "node", visible_alias = "node-name", value_name = "NAME")]
    pub node_name: String,
    /// The packet's source address.
    #[arg(long, value_name = "IP")]
    pub from: IpAddr,
    /// The packet's destination: `ADDRESS:PORT/PROTO` (`[2001:db8::1]:80/udp`; tcp, udp, sctp).
    #[arg(long, value_name = "DST:PORT/PROTO", value_parser = parse_destination)]
    pub to: (SocketAddr, svcplane_core::Protocol),
    /// The node's addresses, as `proxy --node-ip` (repeatable; default: from the Node object).
    #[arg(long = "node-ip", value_name = "IP")]
    pub node_ips: Vec<IpAddr>,
    /// Further addresses the node has (where NodePorts also answer by default), repeatable.
    #[arg(long = "local-address", value_name = "IP")]
    pub local_addresses: Vec<IpAddr>,
    /// As `proxy --cluster-cidr` (repeatable).
    #[arg(long = "cluster-cidr", value_name = "CIDR")]
    pub cluster_cidrs: Vec<IpNet>,
    /// As `proxy --nodeport-addresses` (repeatable).
    #[arg(long = "nodeport-addresses", value_name = "CIDR|primary")]
    pub nodeport_addresses: Vec<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// The mode whose rules to read, as the node's proxy runs.
    #[arg(long, value_enum, default_value = "nftables")]
    pub mode: Mode,
    /// The iptables variant of `--mode iptables`.
    #[arg(long, value_enum, default_value = "auto")]
    pub iptables_backend: IptablesBackend,
    /// Time between refreshes.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 1000)]
    pub interval_ms: u64,
    /// Stop after this many refreshes (default: until Ctrl-C).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// At most this many endpoint series are shown; the rest are summed into one line.
    #[arg(long, value_name = "N", default_value_t = svcplane_core::counters::DEFAULT_MAX_SERIES)]
    pub max_series: usize,
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
    /// Where eBPF mode's pins are (`--mode ebpf`).
    #[arg(long, value_name = "DIR", default_value = svcplane_backend_ebpf::DEFAULT_BPF_ROOT)]
    pub bpf_root: PathBuf,
}

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people.
    Text,
    /// One JSON object, for scripts and tests.
    Json,
}

/// `ADDRESS:PORT/PROTO`.
fn parse_destination(text: &str) -> Result<(SocketAddr, svcplane_core::Protocol), String> {
    let (address, protocol) = text
        .rsplit_once('/')
        .ok_or_else(|| format!("{text:?}: expected ADDRESS:PORT/PROTO, e.g. 198.19.0.10:80/tcp"))?;
    let address: SocketAddr =
        address.parse().map_err(|_| format!("{text:?}: {address:?} is not ADDRESS:PORT ([v6]:PORT for IPv6)"))?;
    let protocol = svcplane_core::Protocol::from_kubernetes(&protocol.to_ascii_uppercase())
        .ok_or_else(|| format!("{text:?}: protocol {protocol:?} is not tcp, udp or sctp"))?;
    Ok((address, protocol))
}

#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// With `--kubeconfig`: the `endpointslice.kubernetes.io/managed-by` value of the slices
    /// this controller owns (kube-controller-manager's is `endpointslice-controller.k8s.io`).
    #[arg(long, value_name = "VALUE", default_value = svcplane_controller::MANAGED_BY)]
    pub managed_by: String,
    /// With `--kubeconfig`: also assign `type: LoadBalancer` addresses from
    /// `LoadBalancerIPPool`s (the CRD in deploy/loadbalancer-pools.yaml) and write them to
    /// `status.loadBalancer.ingress`. Off by default: it needs the CRD installed.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub load_balancer_ipam: bool,
    /// With `--kubeconfig`: run only while holding the leader election Lease, so that of
    /// several replicas one writes (kube-controller-manager's flag). `--leader-elect=false`
    /// runs at once, alone.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long followers wait after the Lease last changed before taking it over.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up (and exits 1).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and followers try to take the Lease.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The namespace of the Lease.
    #[arg(long, value_name = "NAMESPACE", default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
    /// The name of the Lease.
    #[arg(long, value_name = "NAME", default_value = "svcplane-controller")]
    pub leader_elect_resource_name: String,
    /// With `--kubeconfig`: where to serve `/metrics` (plain HTTP). Port 0 picks a free port,
    /// printed on standard output as `metrics on ADDR:PORT`; an empty value serves none.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:10268", value_parser = parse_optional_address)]
    pub metrics_bind_address: MetricsAddress,
}

/// `announce`.
#[derive(Debug, Clone, Args)]
pub struct AnnounceArgs {
    /// A kubeconfig; in a Pod, without it, the in-cluster config is used.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (Lease holder identity; local endpoints under
    /// `externalTrafficPolicy: Local`). Default: the machine's hostname, lower-cased.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// An interface on the LAN the addresses are announced on (repeatable).
    #[arg(long = "interface", value_name = "NAME", required = true)]
    pub interfaces: Vec<String>,
    /// The namespace of the per-Service Leases.
    #[arg(long, value_name = "NAMESPACE", default_value = "kube-system")]
    pub lease_namespace: String,
    /// How long other nodes wait after a Lease last changed before taking it over: the
    /// failover time after a node dies is about this plus one retry period.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long a holder keeps announcing without a successful renewal (below the lease
    /// duration, so two nodes never announce at once).
    #[arg(long, value_name = "DURATION", default_value = "1500ms", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// How often holders renew and other candidates try.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = parse_duration)]
    pub retry_period: Duration,
}

/// `--metrics-bind-address`: an address, or none when given empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsAddress(pub Option<SocketAddr>);

/// A Go-style duration as kube-controller-manager's flags take: `15s`, `500ms`, `1m`, `1h`,
/// or combinations such as `1m30s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration such as 15s, 500ms or 1m30s");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (number, tail) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(bad()),
        };
        total += Duration::try_from_secs_f64(seconds).map_err(|_| bad())?;
        rest = tail;
    }
    Ok(total)
}

fn parse_optional_address(text: &str) -> Result<MetricsAddress, String> {
    if text.is_empty() {
        return Ok(MetricsAddress(None));
    }
    text.parse()
        .map(|a| MetricsAddress(Some(a)))
        .map_err(|_| format!("{text:?} is not ADDRESS:PORT ([v6]:PORT for IPv6), or empty for none"))
}

#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Requests to send through each frontend.
    #[arg(long, default_value_t = 30)]
    pub requests: u32,
    /// Keep the sandbox until Ctrl-C instead of removing it after the run.
    #[arg(long)]
    pub keep: bool,
    /// The proxy mode the lab's node runs (`ebpf` gives the node a cgroup of its own).
    #[arg(long, value_enum, default_value = "nftables")]
    pub mode: Mode,
}

#[derive(Debug, Clone, Args)]
pub struct EchoArgs {
    /// The name to answer with.
    #[arg(long)]
    pub name: String,
    /// TCP and UDP port to listen on (all addresses, both families).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PodsMode {
    /// `<a-b-c-d>.<ns>.pod.<zone>` answers the address written in the name (CoreDNS's
    /// `pods insecure`, the kubeadm default).
    Insecure,
    /// `*.pod.<zone>` answers NXDOMAIN.
    Disabled,
}

#[derive(Debug, Clone, Args)]
pub struct DnsArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Where to answer, over UDP and TCP. Port 0 picks a free port; the address is printed
    /// on standard output as `listening on ADDR:PORT`.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// The cluster domain.
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local", value_parser = parse_zone)]
    pub zone: String,
    /// TTL of every answer (but `dns-version`) and of negative answers (the SOA minimum).
    #[arg(long, value_name = "SECONDS", default_value_t = svcplane_dns::DEFAULT_TTL,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(svcplane_dns::MAX_TTL)))]
    pub ttl: u32,
    /// A resolver for names outside the zone (repeatable, tried in order; port 53 when
    /// omitted). Without any, such names are refused.
    #[arg(long = "upstream", value_name = "ADDR:PORT", value_parser = parse_upstream)]
    pub upstreams: Vec<SocketAddr>,
    /// Records for `<dashed-ip>.<ns>.pod.<zone>`.
    #[arg(long, value_enum, default_value = "insecure")]
    pub pods: PodsMode,
    /// How long one upstream gets to answer, in milliseconds.
    #[arg(long, value_name = "MILLISECONDS", default_value_t = 2000, hide = true)]
    pub forward_timeout_ms: u64,
    /// Where to serve `/metrics` (plain HTTP, CoreDNS's metric names; CoreDNS's prometheus
    /// plugin listens on :9153). Port 0 picks a free port, printed on standard output as
    /// `metrics on ADDR:PORT`; an empty value serves none.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:9153", value_parser = parse_optional_address)]
    pub metrics_bind_address: MetricsAddress,
}

fn parse_zone(text: &str) -> Result<String, String> {
    svcplane_dns::ZoneConfig::new(text).map(|_| text.to_owned()).map_err(|error| error.to_string())
}

fn parse_upstream(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        return Ok(address);
    }
    let bare = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(text);
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| format!("{text:?} is not an IP address with an optional port"))
}

fn maglev_size(text: &str) -> Result<u32, String> {
    let size: u32 = text.parse().map_err(|error| format!("--maglev-table-size {text:?}: {error}"))?;
    if !(251..=131_071).contains(&size) || !svcplane_backend_ebpf::is_prime(size) {
        return Err(format!("--maglev-table-size {size}: must be a prime between 251 and 131071"));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_take_an_address_with_or_without_a_port() {
        assert_eq!(parse_upstream("127.0.0.1:5353"), Ok("127.0.0.1:5353".parse().unwrap()));
        assert_eq!(parse_upstream("127.0.0.1"), Ok("127.0.0.1:53".parse().unwrap()));
        assert_eq!(parse_upstream("[::1]:5353"), Ok("[::1]:5353".parse().unwrap()));
        assert_eq!(parse_upstream("::1"), Ok("[::1]:53".parse().unwrap()));
        assert!(parse_upstream("dns.example").is_err());
    }

    #[test]
    fn leader_election_durations_are_written_as_kube_controller_manager_takes_them() {
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("15").unwrap_err().contains("not a duration"));
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn every_option_a_full_bpf_map_error_names_is_an_option_of_the_proxy() {
        use clap::Parser;
        let options: std::collections::BTreeSet<&str> = [
            svcplane_bpf::maps::SERVICES_MAP,
            svcplane_bpf::maps::BACKENDS_MAP,
            svcplane_bpf::maps::AFFINITY_MAP,
            svcplane_bpf::maps::CT_MAP,
        ]
        .into_iter()
        .map(|map| svcplane_bpf::upgrade::size_option(map).expect("a sized map"))
        .collect();
        assert_eq!(options.len(), 4, "one option per size");
        for option in options {
            let parsed = Cli::try_parse_from(["svcplane", "proxy", option, "1000"]);
            assert!(parsed.is_ok(), "{option}: {:?}", parsed.err());
        }
    }

    #[test]
    fn an_explain_destination_is_an_address_a_port_and_a_protocol() {
        use svcplane_core::Protocol;
        assert_eq!(parse_destination("198.19.0.10:80/tcp"), Ok(("198.19.0.10:80".parse().unwrap(), Protocol::Tcp)));
        assert_eq!(parse_destination("[2001:db8::1]:53/UDP"), Ok(("[2001:db8::1]:53".parse().unwrap(), Protocol::Udp)));
        assert!(parse_destination("198.19.0.10:80").unwrap_err().contains("ADDRESS:PORT/PROTO"));
        assert!(parse_destination("198.19.0.10:80/icmp").unwrap_err().contains("not tcp, udp or sctp"));
    }
}
