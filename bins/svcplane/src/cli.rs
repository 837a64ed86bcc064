//! The command line: names and meanings are a contract with operators' scripts
//! (see the project's CLI design); add flags freely, rename none.

use std::net::IpAddr;
use std::path::PathBuf;

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
    /// Print the EndpointSlices and allocations the standalone controller derives.
    Controller(ControllerArgs),
    /// Serve the cluster zone (Kubernetes DNS specification 1.1.0) over UDP and TCP.
    Dns(crate::dns::DnsArgs),
    /// Remove everything svcplane programmed on this node.
    Cleanup,
    /// A sandbox of network namespaces showing real traffic through Services (needs root).
    Lab(LabArgs),
    /// An echo server for labs and tests: answers with its name and the client's address.
    #[command(hide = true)]
    Echo(EchoArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Nftables,
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
    #[arg(long, value_name = "DIR")]
    pub manifests: PathBuf,
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

#[derive(Debug, Clone, Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// This node, as in Pod.spec.nodeName.
    #[arg(long, value_name = "NAME")]
    pub node_name: String,
    /// This node's addresses (repeatable; default: from the Node object).
    #[arg(long = "node-ip", value_name = "IP")]
    pub node_ips: Vec<IpAddr>,
    /// The pod network, for the masquerade decision (repeatable: one per family).
    #[arg(long = "cluster-cidr", value_name = "CIDR")]
    pub cluster_cidrs: Vec<IpNet>,
    /// Where NodePorts answer: CIDRs, or `primary` for the node's primary addresses
    /// (repeatable; default: every node address except loopback).
    #[arg(long = "nodeport-addresses", value_name = "CIDR|primary")]
    pub nodeport_addresses: Vec<String>,
    #[arg(long, value_enum, default_value = "nftables")]
    pub mode: Mode,
    /// How nftables mode reaches the kernel.
    #[arg(long, value_enum, default_value = "netlink")]
    pub nft_mechanism: NftMechanism,
    /// The `nft` program to run with `--nft-mechanism cli`.
    #[arg(long, default_value = "nft", hide = true)]
    pub nft_program: String,
}

#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    /// Requests to send through each frontend.
    #[arg(long, default_value_t = 30)]
    pub requests: u32,
    /// Keep the sandbox until Ctrl-C instead of removing it after the run.
    #[arg(long)]
    pub keep: bool,
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
