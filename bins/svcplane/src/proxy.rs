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
use crate::{feeds, modes, ops};

pub fn node_config(args: &ProxyArgs) -> anyhow::Result<NodeConfig> {
    node_config_of(&args.node_name, &args.node_ips, &args.cluster_cidrs, &args.nodeport_addresses)
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
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let config = node_config(args)?;
    let dataplane = modes::dataplane(args)?;
    let ops = ops::start(&ops_settings(args)?, &args.node_name, dataplane.mode())?;
    let mut sync = SyncLoop::new(config, dataplane, LoopSettings::default())
        .with_hook(Box::new(HealthServers::default()))
        .with_hook(Box::new(ops.feed));
    if modes::uses_kernel_conntrack(args.mode) {
        sync = sync.with_hook(Box::new(StaleUdpCleanup::default()));
    }
    let (sender, feed) = mpsc::channel();
    let feeding = feeds::spawn_changes(&args.source, &args.node_name, sender, Arc::clone(&stop))?;
    sync.run(&feed, &stop);
    stop.store(true, Ordering::Relaxed);
    drop(feed);
    let _ = feeding.join();
    drop(ops.servers);
    info!("stopped; the rules stay in place (`svcplane cleanup` removes them)");
    Ok(())
}

/// kube-proxy's default sync period: the healthz timeout is twice it.
const SYNC_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

fn ops_settings(args: &ProxyArgs) -> anyhow::Result<ops::OpsSettings> {
    Ok(ops::OpsSettings {
        healthz: ops::bind_address("--healthz-bind-address", &args.healthz_bind_address)?,
        metrics: ops::bind_address("--metrics-bind-address", &args.metrics_bind_address)?,
        hard_fail: args.bind_address_hard_fail,
        health_timeout: 2 * SYNC_PERIOD,
        configz_json: "{}".to_owned(),
    })
}

/// Prints what `proxy` would program from scratch, touching nothing.
pub fn render(args: &ProxyArgs) -> anyhow::Result<()> {
    let mut state = ClusterState::new();
    for change in feeds::read_changes(&args.source, &args.node_name)? {
        state.apply(change);
    }
    let plan = NodePlan::build(&state, node_config(args)?);
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
