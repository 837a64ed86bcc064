//! The one place modes are chosen: `--mode` names a crate that implements
//! [`svcplane_core::Dataplane`], and this is where it is built.

use anyhow::Context;
use svcplane_backend_ebpf::{EbpfBackend, EbpfOptions, ExternalMode};
use svcplane_backend_iptables::IptablesBackend;
use svcplane_backend_ipvs::{IpvsBackend, IpvsConfig};
use svcplane_backend_nftables::NftablesBackend;
use svcplane_backend_userspace::UserspaceBackend;
use svcplane_core::Dataplane;
use svcplane_iptables::{IptablesCli, Variant, detect_variant};
use svcplane_nft::{NftCli, NftClient, NftNetlink};

use crate::cli::{
    CleanupArgs, EbpfArgs, EbpfExternalMode, IptablesBackend as IptablesVariant, Mode, NftMechanism, ProxyArgs,
    UserspaceArgs,
};
use crate::faults::FaultFile;

/// What a mode that runs inside the proxy process (the userspace relay) lets the proxy's
/// servers read: its own metric families and its per-endpoint counters.
#[derive(Debug, Default)]
pub struct InProcess {
    pub relay: Option<svcplane_backend_userspace::RelayView>,
}

/// The dataplane `--mode` names, ready to sync. Nothing is written to the kernel until then;
/// eBPF mode starts opening its objects and loading its programs at once, so that work
/// overlaps the source's first list (`EbpfBackend::open_ahead`).
pub fn dataplane(args: &ProxyArgs) -> anyhow::Result<(Box<dyn Dataplane>, InProcess)> {
    if args.mode == Mode::Userspace {
        let backend = UserspaceBackend::new(
            NftClient::Netlink(NftNetlink::new().context("opening the nf_tables netlink socket")?),
            userspace_options(&args.userspace),
        );
        let relay = Some(backend.view());
        return Ok((Box::new(backend), InProcess { relay }));
    }
    let dataplane: Box<dyn Dataplane> = match args.mode {
        Mode::Nftables => {
            let client = match args.nft_mechanism {
                NftMechanism::Netlink => {
                    let netlink = NftNetlink::new().context("opening the nf_tables netlink socket")?;
                    NftClient::Netlink(match &args.inject_faults_from {
                        Some(path) => netlink.with_faults(Box::new(FaultFile::new(path))),
                        None => netlink,
                    })
                }
                NftMechanism::Cli => NftClient::Cli(NftCli::new().with_program(args.nft_program.clone())),
            };
            Box::new(nftables_backend(client, args))
        }
        Mode::Iptables => {
            let cli = IptablesCli::new(iptables_variant(args.iptables_backend));
            Box::new(IptablesBackend::new(match &args.inject_faults_from {
                Some(path) => cli.with_faults(Box::new(FaultFile::new(path))),
                None => cli,
            }))
        }
        Mode::Ebpf => {
            let mut backend = EbpfBackend::new(ebpf_options(&args.ebpf));
            if let Err(error) = backend.open_ahead() {
                // The first sync meets it again and reports it through the sync loop.
                tracing::debug!(%error, "opening the eBPF objects ahead of the first plan");
            }
            Box::new(backend)
        }
        Mode::Ipvs => {
            Box::new(IpvsBackend::new(ipvs_config(args), IptablesCli::new(iptables_variant(args.iptables_backend))))
        }
        Mode::Userspace => unreachable!("built above"),
    };
    Ok((dataplane, InProcess::default()))
}

fn userspace_options(args: &UserspaceArgs) -> svcplane_backend_userspace::Options {
    use std::time::Duration;
    svcplane_backend_userspace::Options {
        connect_timeout: Duration::from_millis(args.userspace_connect_timeout_ms),
        udp_idle_timeout: Duration::from_secs(args.userspace_udp_idle_timeout),
        removed_grace: Duration::from_secs(args.userspace_removed_grace),
        max_connections: args.userspace_max_connections,
        threads: args.userspace_threads,
        ..svcplane_backend_userspace::Options::default()
    }
}

fn ebpf_options(args: &EbpfArgs) -> EbpfOptions {
    EbpfOptions {
        bpf_root: args.bpf_root.clone(),
        cgroup: args.cgroup_path.clone(),
        sizes: svcplane_backend_ebpf::MapSizes {
            services: args.bpf_map_services,
            backends: args.bpf_map_backends,
            affinity: args.bpf_map_affinity,
            reverse: args.bpf_map_sockets,
        },
        maglev_size: args.maglev_table_size,
        external_mode: match args.ebpf_external_mode {
            EbpfExternalMode::Snat => ExternalMode::Snat,
            EbpfExternalMode::Dsr => ExternalMode::Dsr,
        },
        ..EbpfOptions::default()
    }
}

fn ipvs_config(args: &ProxyArgs) -> IpvsConfig {
    IpvsConfig {
        scheduler: args.ipvs_scheduler.clone(),
        timeouts: svcplane_ipvs::Timeouts {
            tcp: args.ipvs_tcp_timeout,
            tcp_fin: args.ipvs_tcpfin_timeout,
            udp: args.ipvs_udp_timeout,
        },
        exclude_cidrs: args.ipvs_exclude_cidrs.clone(),
        strict_arp: args.ipvs_strict_arp,
    }
}

/// Whether the mode's traffic goes through the kernel's conntrack (stale UDP flows then
/// need removing after endpoint changes).
pub fn uses_kernel_conntrack(mode: Mode) -> bool {
    match mode {
        Mode::Nftables | Mode::Iptables => true,
        // Socket-level balancing makes no conntrack entry for the Service hop.
        Mode::Ebpf => false,
        // IPVS schedules in its own connection table, but with `vs/conntrack=1` every
        // packet still gets a conntrack entry: a UDP flow that went elsewhere before its
        // Service existed keeps its entry, and the kernel keeps sending it there.
        Mode::Ipvs => true,
        // The redirect to the relay is a kernel DNAT: a UDP flow that went elsewhere
        // before its Service had a listener keeps doing so until its entry goes.
        Mode::Userspace => true,
    }
}

fn iptables_variant(choice: IptablesVariant) -> Variant {
    match choice {
        IptablesVariant::Legacy => Variant::Legacy,
        IptablesVariant::Nft => Variant::Nft,
        IptablesVariant::Auto => {
            let detection = detect_variant(&[]);
            tracing::info!(variant = detection.variant.name(), "iptables variant: {}", detection.reason);
            detection.variant
        }
    }
}

/// How `cleanup` reaches nf_tables: over netlink when the socket opens, so that finding
/// svcplane's tables reads table names only. The `nft` CLI (1.0.x) fetches the whole
/// ruleset to list the tables of either family; with a 10k-Service table in the kernel
/// that took longer than the callers gave the cleanup (measured: 6-11 s per family for a
/// synthetic 10k-chain table on a loaded 2-core machine). The CLI remains the fallback.
fn cleanup_nft_client() -> NftClient {
    match NftNetlink::new() {
        Ok(netlink) => NftClient::Netlink(netlink),
        Err(error) => {
            tracing::debug!("no nf_tables netlink socket ({error}); cleaning up through the nft command");
            NftClient::Cli(NftCli::new())
        }
    }
}

/// A dataplane of every mode and variant, for `cleanup` (nothing is opened that a node
/// without the mode's tools would fail on before its cleanup runs).
pub fn every_mode(args: &CleanupArgs) -> Vec<Box<dyn Dataplane>> {
    vec![
        Box::new(NftablesBackend::new(cleanup_nft_client())),
        Box::new(IptablesBackend::new(IptablesCli::new(Variant::Legacy))),
        Box::new(IptablesBackend::new(IptablesCli::new(Variant::Nft))),
        Box::new(EbpfBackend::new(ebpf_options(&args.ebpf))),
        // IPVS mode's rules may be in either iptables variant; its virtual services,
        // kube-ipvs0 and sets go with the first.
        Box::new(IpvsBackend::new(IpvsConfig::default(), IptablesCli::new(Variant::Nft))),
        Box::new(IpvsBackend::new(IpvsConfig::default(), IptablesCli::new(Variant::Legacy))),
    ]
}

/// The dataplane `render` prints with: the same renderer, over nothing that touches the
/// kernel.
pub fn for_render(args: &ProxyArgs) -> Box<dyn Dataplane> {
    match args.mode {
        Mode::Nftables => Box::new(nftables_backend(NftClient::Cli(NftCli::new()), args)),
        Mode::Iptables => Box::new(IptablesBackend::new(svcplane_iptables::FakeIptables::new())),
        Mode::Ebpf => Box::new(EbpfBackend::new(EbpfOptions::default())),
        // Renders without opening anything.
        Mode::Ipvs => Box::new(IpvsBackend::for_render(ipvs_config(args))),
        Mode::Userspace => {
            Box::new(UserspaceBackend::new(NftClient::Cli(NftCli::new()), userspace_options(&args.userspace)))
        }
    }
}

/// A dataplane of `mode` that only reads the kernel's counters (`svcplane top`): nothing is
/// written, nothing opened before the first read.
pub fn for_counters(mode: Mode, iptables_backend: IptablesVariant, bpf_root: &std::path::Path) -> Box<dyn Dataplane> {
    match mode {
        Mode::Nftables => Box::new(NftablesBackend::new(NftClient::Cli(NftCli::new()))),
        Mode::Iptables => Box::new(IptablesBackend::new(IptablesCli::new(iptables_variant(iptables_backend)))),
        Mode::Ebpf => {
            Box::new(EbpfBackend::new(EbpfOptions { bpf_root: bpf_root.to_owned(), ..EbpfOptions::default() }))
        }
        // IPVS mode keeps no counters yet: `top` says so.
        Mode::Ipvs => Box::new(IpvsBackend::for_render(IpvsConfig::default())),
        // The relay's counters live in the proxy process: `top` says so.
        Mode::Userspace => Box::new(UserspaceBackend::new(
            NftClient::Cli(NftCli::new()),
            svcplane_backend_userspace::Options::default(),
        )),
    }
}

/// Nftables mode over `client` with the proxy's nftables settings.
fn nftables_backend(client: NftClient, args: &ProxyArgs) -> NftablesBackend<NftClient> {
    let backend = NftablesBackend::new(client).with_counting(args.nft_counters);
    match args.nftables_tables {
        0 => backend,
        tables => backend.with_tables(usize::from(tables)),
    }
}
