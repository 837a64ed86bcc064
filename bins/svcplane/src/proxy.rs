//! `svcplane proxy`, `render` and `cleanup`: flags -> feed, plan settings and dataplane,
//! handed to the one sync loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use anyhow::{Context, bail};
use svcplane_core::{ClusterState, NodeConfig, NodePlan, NodePortAddresses};
use svcplane_sync::{HealthServers, LoopSettings, StaleUdpCleanup, SyncLoop};
use tracing::info;

use crate::cli::{CleanupArgs, ProxyArgs};
use crate::config::EffectiveConfig;
use crate::{feeds, modes, ops};

/// The plan settings of the effective configuration.
pub fn node_config(effective: &EffectiveConfig, args: &ProxyArgs) -> anyhow::Result<NodeConfig> {
    node_config_of(&effective.node_name, &args.node_ips, &effective.cluster_cidrs, &effective.nodeport_addresses)
}

/// What `proxy` and `render` share before they differ: the effective configuration (one
/// warning per field or flag not applied), `--write-config-to`, and the arguments the
/// modes and feeds read, resolved. `None`: nothing more to do.
fn prepare(args: &ProxyArgs) -> anyhow::Result<Option<(EffectiveConfig, ProxyArgs)>> {
    let effective = EffectiveConfig::resolve(args)?;
    if let Some(path) = &args.write_config_to {
        effective.write_config(path)?;
        info!(file = %path.display(), "wrote the configuration");
        return Ok(None);
    }
    let resolved = effective.apply_to(args);
    Ok(Some((effective, resolved)))
}

/// The plan settings from the node flags every planning command shares.
pub fn node_config_of(
    node_name: &str,
    node_ips: &[std::net::IpAddr],
    cluster_cidrs: &[ipnet::IpNet],
    nodeport_addresses: &[String],
) -> anyhow::Result<NodeConfig> {
    let node_port_addresses = if nodeport_addresses.is_empty() {
        NodePortAddresses::AllLocal
    } else if nodeport_addresses.iter().any(|a| a == "primary") {
        if nodeport_addresses.len() > 1 {
            bail!("--nodeport-addresses: `primary` cannot be combined with CIDRs");
        }
        NodePortAddresses::Primary
    } else {
        let cidrs = nodeport_addresses
            .iter()
            .map(|value| value.parse().with_context(|| format!("--nodeport-addresses: {value:?} is not a CIDR")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        NodePortAddresses::Cidrs(cidrs)
    };
    Ok(NodeConfig {
        node_name: node_name.to_owned(),
        node_ips: node_ips.to_vec(),
        cluster_cidrs: cluster_cidrs.to_vec(),
        node_port_addresses,
    })
}

/// Programs the node and keeps it in sync until SIGTERM or SIGINT. The rules stay in place
/// on exit, so traffic keeps flowing across a restart; `svcplane cleanup` removes them.
pub fn run(args: &ProxyArgs) -> anyhow::Result<()> {
    let Some((effective, args)) = prepare(args)? else { return Ok(()) };
    let args = &args;
    // Before the first thread: arenas are handed out as threads first allocate.
    crate::memory::limit_arenas(crate::memory::proxy_arenas(&args.source, args.mode));
    if crate::memory::proxy_fixes_thresholds(&args.source, args.mode) {
        crate::memory::fix_thresholds();
    }
    if args.kube_proxy.cleanup == Some(true) {
        return cleanup(&CleanupArgs { ebpf: args.ebpf.clone() });
    }
    if args.kube_proxy.init_only == Some(true) {
        info!("--init-only: svcplane needs no initialisation before it runs; exiting");
        return Ok(());
    }
    effective.apply_oom_score_adj();
    effective.apply_conntrack();
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let config = node_config(&effective, args)?;
    let (dataplane, in_process) = modes::dataplane(args)?;
    let counters = counter_reader(args, &in_process);
    let relay = in_process.relay.clone();
    let mode_metrics = in_process.relay.map(|relay| Arc::new(move || relay.prometheus()) as svcplane_ops::ExtraMetrics);
    let ops =
        ops::start(&ops_settings(&effective, args), &effective.node_name, dataplane.mode(), counters, mode_metrics)?;
    let settings = LoopSettings { min_sync_interval: effective.min_sync_period, ..LoopSettings::default() };
    let mut sync = SyncLoop::new(config, dataplane, settings)
        .with_hook(Box::new(HealthServers::default()))
        .with_hook(Box::new(ops.feed))
        .with_hook(Box::new(ops.status))
        .with_hook(Box::new(crate::memory::ReturnFreedMemory));
    if modes::uses_kernel_conntrack(args.mode) {
        let mut cleanup = StaleUdpCleanup::default();
        if let Some(relay) = relay {
            cleanup = cleanup.keeping_replies_from(Box::new(move || relay.listener_addresses()));
        }
        sync = sync.with_hook(Box::new(cleanup));
    }
    let (sender, feed) = mpsc::channel();
    let feeding = feeds::spawn_changes(&args.source, &effective.node_name, sender, Arc::clone(&stop))?;
    sync.run(&feed, &stop);
    stop.store(true, Ordering::Relaxed);
    drop(feed);
    let _ = feeding.join();
    drop(ops.servers);
    info!("stopped; the rules stay in place (`svcplane cleanup` removes them)");
    Ok(())
}

/// The healthz and metrics servers' settings from the effective configuration: as
/// kube-proxy's `/healthz`, a change waiting longer than twice the sync period is stale.
fn ops_settings(effective: &EffectiveConfig, args: &ProxyArgs) -> ops::OpsSettings {
    ops::OpsSettings {
        healthz: effective.healthz_bind_address,
        metrics: effective.metrics_bind_address,
        hard_fail: effective.bind_address_hard_fail,
        health_timeout: 2 * effective.sync_period,
        configz_json: effective.to_configz_json().to_string(),
        metrics_max_endpoint_series: args.metrics_max_endpoint_series,
        status_max_series: args.status_max_series,
    }
}

/// Reads the kernel's counters apart from the sync loop's dataplane, so a page view or a
/// scrape never waits for a sync (nor a sync for them).
fn counter_reader(args: &ProxyArgs, in_process: &modes::InProcess) -> Option<svcplane_ops::status::CounterReader> {
    if args.mode == crate::cli::Mode::Nftables && !args.nft_counters {
        return None;
    }
    if let Some(relay) = in_process.relay.clone() {
        return Some(Box::new(move || Ok(relay.counters())));
    }
    let mut reader = modes::for_counters(args.mode, args.iptables_backend, &args.ebpf.bpf_root);
    Some(Box::new(move || reader.counters().map_err(|error| error.to_string())))
}

/// Prints what `proxy` would program from scratch, touching nothing.
pub fn render(args: &ProxyArgs) -> anyhow::Result<()> {
    let Some((effective, args)) = prepare(args)? else { return Ok(()) };
    let args = &args;
    let mut state = ClusterState::new();
    for change in feeds::read_changes(&args.source, &effective.node_name)? {
        state.apply(change);
    }
    let plan = NodePlan::build(&state, node_config(&effective, args)?);
    let text = modes::for_render(args).render(&plan).map_err(anyhow::Error::from_boxed)?;
    print!("{text}");
    // Served by the proxy itself, not by the kernel; shown so the output is the whole story.
    for (service, check) in &plan.health_checks {
        println!(
            "# health-check node port {}: {service}, {} local endpoint(s), answers {}",
            check.port,
            check.local_endpoints,
            if check.local_endpoints > 0 { 200 } else { 503 }
        );
    }
    Ok(())
}

/// Removes whatever every mode may have left on this node.
pub fn cleanup(args: &CleanupArgs) -> anyhow::Result<()> {
    let mut removed = false;
    for mut dataplane in modes::every_mode(args) {
        let mode = dataplane.mode();
        removed |= dataplane
            .cleanup()
            .map_err(anyhow::Error::from_boxed)
            .with_context(|| format!("removing what {mode} mode programmed"))?;
    }
    info!(removed, "cleanup done");
    Ok(())
}
