//! svcplane's kernel modes side by side on one input: IPVS (`--mode ipvs`), nftables
//! (`--mode nftables`, netlink) and iptables (`--mode iptables --iptables-backend nft`).
//!
//! For each mode, a fresh one-node lab (a node namespace with a server pod and a client
//! pod): the plan of S synthetic ClusterIP Services x E endpoints plus one Service whose
//! endpoint is the server pod; a cold full sync into the node's fresh namespace; one
//! endpoint change at a time (`plan.update` and a sync), different Services each; both
//! read back from the kernel (outside the timings); then TCP connects from the client pod
//! through the ClusterIP and straight to the server. The lab is deleted afterwards, so
//! each mode starts from an empty kernel.
//!
//! Used by `benches/ipvs.rs` (the real sizes, in the guest kernel) and by the guest batch
//! (`tests/guest_kernel.rs`), which runs it on a few Services as a smoke test.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use svcplane_backend_iptables::IptablesBackend;
use svcplane_backend_ipvs::{IpvsBackend, IpvsConfig};
use svcplane_backend_nftables::NftablesBackend;
use svcplane_backend_nftables::names::service_object;
use svcplane_backend_nftables::render::is_svcplane_table;
use svcplane_core::{Dataplane, Destination, IpFamily, NodePlan, PlanDiff};
use svcplane_iptables::{IptablesCli, Variant};
use svcplane_nft::{Family, NftNetlink, Nftables, TableName};
use svcplane_testbed::Lab;

use super::{
    ConnectLatency, LAB_SERVICE_IP, TARGET_PORT, add_lab_service, connect_latency, endpoint_change, median,
    moved_address, node_config, percentile, serve, service_ip, synthetic, time,
};

/// The kernel modules IPVS mode needs loaded: the kernel does not autoload `ip_vs` for
/// generic netlink.
pub const IPVS_MODULES: &[&str] = &["ip_vs", "ip_vs_rr"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ipvs,
    Nftables,
    Iptables,
    /// iptables mode through iptables-legacy: at 10k Services iptables-nft-restore's
    /// user-space cost (rules x chains) makes a cold program take hours under emulation.
    IptablesLegacy,
}

impl Mode {
    /// What a run measures unless `--modes` says otherwise.
    pub const DEFAULT: [Mode; 3] = [Mode::Ipvs, Mode::Nftables, Mode::Iptables];
    pub const ALL: [Mode; 4] = [Mode::Ipvs, Mode::Nftables, Mode::Iptables, Mode::IptablesLegacy];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Ipvs => "ipvs",
            Mode::Nftables => "nftables",
            Mode::Iptables => "iptables",
            Mode::IptablesLegacy => "iptables-legacy",
        }
    }

    /// How the mode is spelled on svcplane's command line.
    pub fn flags(self) -> &'static str {
        match self {
            Mode::Ipvs => "`--mode ipvs --iptables-backend nft`",
            Mode::Nftables => "`--mode nftables` (netlink)",
            Mode::Iptables => "`--mode iptables --iptables-backend nft`",
            Mode::IptablesLegacy => "`--mode iptables --iptables-backend legacy`",
        }
    }

    pub fn parse(name: &str) -> anyhow::Result<Mode> {
        Mode::ALL
            .into_iter()
            .find(|mode| mode.name() == name)
            .with_context(|| format!("unknown mode {name:?} (ipvs, nftables, iptables, iptables-legacy)"))
    }
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub services: usize,
    pub endpoints: usize,
    /// Endpoint changes, one at a time, each to another Service.
    pub changes: usize,
    /// Connects through the ClusterIP and as many straight to the pod; 0 skips them.
    pub connects: usize,
}

/// One mode's measurements.
#[derive(Debug, Clone)]
pub struct Measured {
    pub mode: Mode,
    pub services: usize,
    pub cold: Duration,
    pub change_median: Duration,
    pub change_max: Duration,
    pub changes: usize,
    /// What the kernel held after the changes, read back.
    pub read_back: String,
    pub connect: Option<ConnectLatency>,
    /// How long each phase of the cold sync took, where the mode says (IPVS mode).
    pub cold_phases: Vec<(&'static str, Duration)>,
}

/// What [`program`] measured.
struct Programmed {
    cold: Duration,
    changes: Vec<Duration>,
    read_back: String,
    cold_phases: Vec<(&'static str, Duration)>,
}

/// The cold sync, then the endpoint changes, both read back; on the calling thread's
/// namespace. `phases` reads the backend's phases of the cold sync.
fn program<B: Dataplane>(
    backend: &mut B,
    mode: Mode,
    state: &mut svcplane_core::ClusterState,
    plan: &mut NodePlan,
    options: Options,
    phases: impl FnOnce(&B) -> Vec<(&'static str, Duration)>,
) -> anyhow::Result<Programmed> {
    let (cold, synced) = time(|| backend.sync(plan, &PlanDiff::default()));
    synced.map_err(|error| anyhow::anyhow!("{} cold sync: {error}", mode.name()))?;
    // Progress on stderr: under emulation a step at 10k can take minutes.
    eprintln!("    {} mode: cold sync took {cold:?}", mode.name());
    let cold_phases = phases(backend);
    let (checked, check) = time(|| check_programmed(mode, plan, options.services, &[]));
    check.context("after the cold sync")?;
    eprintln!("    {} mode: reading the kernel back took {checked:?}", mode.name());

    let mut changes = Vec::new();
    let mut moved = Vec::new();
    for k in 0..options.changes {
        let s = k * options.services / options.changes;
        let (took, synced) = time(|| {
            endpoint_change(state, s, options.endpoints, k);
            let changed = state.take_changes();
            let diff = plan.update(state, &changed);
            backend.sync(plan, &diff)
        });
        synced.map_err(|error| anyhow::anyhow!("{} sync of change {k}: {error}", mode.name()))?;
        eprintln!("    {} mode: change {k} took {took:?}", mode.name());
        changes.push(took);
        moved.push((s, moved_address(IpFamily::of(&service_ip(s)), k)));
    }
    let read_back = check_programmed(mode, plan, options.services, &moved).context("after the endpoint changes")?;
    Ok(Programmed { cold, changes, read_back, cold_phases })
}

/// Measures `mode` in a lab of its own (see the module's header).
pub fn measure(mode: Mode, options: Options) -> anyhow::Result<Measured> {
    ensure!(options.services > 0 && options.endpoints > 0, "at least one Service and one endpoint");
    ensure!((1..=250).contains(&options.changes), "1..=250 changes");
    let lab = Lab::builder().nodes(1).pod(1, "server").pod(1, "client").build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let result = measure_in(&lab, mode, options, Arc::clone(&stop));
    stop.store(true, Ordering::Relaxed);
    let torn_down = lab.teardown();
    let measured = result?;
    torn_down?;
    Ok(measured)
}

fn measure_in(lab: &Lab, mode: Mode, options: Options, stop: Arc<AtomicBool>) -> anyhow::Result<Measured> {
    let (server, _server_thread) = serve(lab, "server", stop)?;
    let mut state = synthetic(options.services, options.endpoints);
    add_lab_service(&mut state, server);
    let mut plan = NodePlan::build(&state, node_config(lab.node(1).ips().to_vec()));
    state.take_changes();
    ensure!(plan.service_ports.len() == options.services + 1, "expected {} service ports", options.services + 1);
    let node = lab.node(1).namespace_name().to_owned();

    // Everything that touches the kernel runs on one thread inside the node's namespace:
    // IPVS mode works on the calling thread's namespace, and the iptables programs it and
    // the iptables mode start inherit it.
    let programmed = lab.run_in(&node, || -> anyhow::Result<Programmed> {
        match mode {
            Mode::Ipvs => {
                let mut backend = IpvsBackend::new(IpvsConfig::default(), IptablesCli::new(Variant::Nft));
                program(&mut backend, mode, &mut state, &mut plan, options, |backend| {
                    backend.last_sync_phases().to_vec()
                })
            }
            Mode::Nftables => {
                let mut backend = NftablesBackend::new(NftNetlink::in_network_namespace(&node)?);
                program(&mut backend, mode, &mut state, &mut plan, options, |_| Vec::new())
            }
            Mode::Iptables | Mode::IptablesLegacy => {
                let variant = if mode == Mode::Iptables { Variant::Nft } else { Variant::Legacy };
                let mut backend = IptablesBackend::new(IptablesCli::new(variant));
                program(&mut backend, mode, &mut state, &mut plan, options, |_| Vec::new())
            }
        }
    })??;
    let Programmed { cold, mut changes, read_back, cold_phases } = programmed;

    let connect = if options.connects > 0 {
        let client = lab.pod("client").namespace_name().to_owned();
        let service = SocketAddr::new(IpAddr::V4(LAB_SERVICE_IP), 80);
        let (took, latency) = time(|| connect_latency(lab, &client, service, server, options.connects, 4));
        eprintln!("    {} mode: the connects took {took:?}", mode.name());
        Some(latency?)
    } else {
        None
    };
    Ok(Measured {
        mode,
        services: options.services,
        cold,
        change_median: median(changes.clone()),
        change_max: percentile(&mut changes, 1.0),
        changes: options.changes,
        read_back,
        connect,
        cold_phases,
    })
}

/// Reads the kernel's state back (on the calling thread's namespace): every Service is
/// there (the last synthetic one and the lab's), and each `(service, address)` of `moved`
/// has `address` as an endpoint. Returns a one-line description of what is there.
fn check_programmed(mode: Mode, plan: &NodePlan, services: usize, moved: &[(usize, IpAddr)]) -> anyhow::Result<String> {
    let last = service_ip(services - 1);
    match mode {
        Mode::Ipvs => {
            let table = svcplane_ipvs::Ipvs::new()?.table()?;
            let virtual_services = table.len();
            let real_servers: usize = table.iter().map(|entry| entry.destinations.len()).sum();
            ensure!(
                virtual_services == services + 1,
                "{virtual_services} virtual services in the kernel, expected {}",
                services + 1
            );
            for address in [last, IpAddr::V4(LAB_SERVICE_IP)] {
                ensure!(
                    table.iter().any(|entry| entry.service.key.address == address),
                    "no virtual service for {address}"
                );
            }
            for (s, address) in moved {
                let entry = table
                    .iter()
                    .find(|entry| entry.service.key.address == service_ip(*s))
                    .with_context(|| format!("no virtual service for {}", service_ip(*s)))?;
                ensure!(
                    entry.destinations.values().any(|destination| destination.address == *address),
                    "{address} is not a real server of {}",
                    service_ip(*s)
                );
            }
            Ok(format!("{virtual_services} virtual services, {real_servers} real servers"))
        }
        Mode::Nftables => check_nftables(plan, services, moved),
        Mode::Iptables | Mode::IptablesLegacy => {
            let (program, args): (&str, &[&str]) = match mode {
                Mode::IptablesLegacy => ("iptables-legacy-save", &["-t", "nat"]),
                _ => ("iptables-nft-save", &["-t", "nat"]),
            };
            let output = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
            ensure!(output.status.success(), "{program}: {}", String::from_utf8_lossy(&output.stderr));
            let text = String::from_utf8(output.stdout)?;
            for address in [last, IpAddr::V4(LAB_SERVICE_IP)] {
                ensure!(text.contains(&address.to_string()), "{address} is not in the kernel's rules");
            }
            for (s, address) in moved {
                let target = format!("{address}:{TARGET_PORT}");
                ensure!(text.contains(&target), "{target} (Service {}) is not in the kernel's rules", service_ip(*s));
            }
            Ok(format!("{} lines of iptables-save -t nat", text.lines().count()))
        }
    }
}

/// nftables mode's read back, one chain at a time: `nft list ruleset` costs nft 1.0.6
/// seconds of its own work per 10k Services on the host (18 minutes in the emulated guest),
/// so the tables are listed and each Service's endpoint chain found over netlink, and only
/// the chains checked are listed by `nft`. Each checked chain must hold one DNAT rule per
/// endpoint the plan gives it, and a moved endpoint must be a DNAT target of its chain.
fn check_nftables(plan: &NodePlan, services: usize, moved: &[(usize, IpAddr)]) -> anyhow::Result<String> {
    let mut netlink = NftNetlink::new()?;
    let mut tables = Vec::new();
    for family in [Family::Ip, Family::Ip6] {
        let names = netlink.list_tables(family)?.into_iter().filter(|name| is_svcplane_table(name));
        tables.extend(names.map(|name| TableName::new(family, name)));
    }
    ensure!(!tables.is_empty(), "no svcplane table in the kernel");
    let mut wanted: Vec<(IpAddr, Option<IpAddr>)> =
        vec![(service_ip(services - 1), None), (IpAddr::V4(LAB_SERVICE_IP), None)];
    wanted.extend(moved.iter().map(|(s, address)| (service_ip(*s), Some(*address))));
    for (service, endpoint) in wanted {
        let port = plan
            .service_ports
            .values()
            .find(|port| port.frontends.iter().any(|frontend| frontend.destination == Destination::Address(service)))
            .with_context(|| format!("the plan has no port for {service}"))?;
        let chain = service_object("service", &port.name);
        let expected = port.cluster_endpoints.len();
        let mut found = None;
        for table in &tables {
            let rules = netlink.count_rules(table, &chain)?;
            if rules > 0 {
                found = Some((table, rules));
                break;
            }
        }
        let (table, rules) = found.with_context(|| format!("no table holds {chain} (Service {service})"))?;
        ensure!(rules == expected, "{chain} has {rules} rules, the plan {expected} endpoints");
        if let Some(address) = endpoint {
            let output = Command::new("nft")
                .args(["list", "chain", table.family.keyword(), &table.name, &chain])
                .output()
                .context("running nft list chain")?;
            ensure!(output.status.success(), "nft list chain: {}", String::from_utf8_lossy(&output.stderr));
            let target = format!("dnat to {address}:{TARGET_PORT}");
            ensure!(
                String::from_utf8_lossy(&output.stdout).contains(&target),
                "{chain} (Service {service}) has no rule `{target}`"
            );
        }
    }
    Ok(format!("{} tables; each checked Service's endpoint chain read over netlink", tables.len()))
}

/// Loads the IPVS modules, then programs, changes and reads back every mode once on two
/// Services, untimed: the kernel modules each mode's rules need get loaded here (one
/// `modprobe` at a time when autoloaded, slow under emulation) rather than inside the
/// first measurement.
pub fn warm_up(modes: &[Mode]) -> anyhow::Result<()> {
    if modes.contains(&Mode::Ipvs) {
        svcplane_testbed::guest::load_modules(IPVS_MODULES)
            .map_err(|error| anyhow::anyhow!("loading the IPVS modules: {error}"))?;
    }
    for &mode in modes {
        measure(mode, Options { services: 2, endpoints: 2, changes: 1, connects: 4 })
            .with_context(|| format!("warming up {} mode", mode.name()))?;
    }
    Ok(())
}
