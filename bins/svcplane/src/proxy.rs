//! `svcplane proxy`, `render` and `cleanup`: the sync loop around the core and the
//! nftables backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use svcplane_conntrack::ConntrackCli;
use svcplane_core::conntrack::{StaleUdpFlows, stale_udp_flows};
use svcplane_core::{NodeConfig, NodePlan, NodePortAddresses};
use tracing::{info, warn};

use crate::cli::ProxyArgs;
use crate::dataplane::Dataplane;
use crate::health::HealthServers;
use crate::pipeline::Pipeline;

/// After a failed kernel transaction, wait this long before the (full) retry.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often the loop wakes up to check for a stop signal or a due retry.
const TICK: Duration = Duration::from_millis(100);

pub fn node_config(args: &ProxyArgs) -> anyhow::Result<NodeConfig> {
    let node_port_addresses = if args.nodeport_addresses.is_empty() {
        NodePortAddresses::AllLocal
    } else if args.nodeport_addresses.iter().any(|a| a == "primary") {
        if args.nodeport_addresses.len() > 1 {
            bail!("--nodeport-addresses: `primary` cannot be combined with CIDRs");
        }
        NodePortAddresses::Primary
    } else {
        let cidrs = args
            .nodeport_addresses
            .iter()
            .map(|value| value.parse().with_context(|| format!("--nodeport-addresses: {value:?} is not a CIDR")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        NodePortAddresses::Cidrs(cidrs)
    };
    Ok(NodeConfig {
        node_name: args.node_name.clone(),
        node_ips: args.node_ips.clone(),
        cluster_cidrs: args.cluster_cidrs.clone(),
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
    let mut pipeline = Pipeline::for_node(&args.source, &args.node_name)?;
    let (loads, loaded) = mpsc::channel();
    let watcher = pipeline.spawn_source(loads, Arc::clone(&stop))?;
    let mut plan = NodePlan::new(node_config(args)?);
    let mut backend = Dataplane::new(args)?;
    let conntrack = ConntrackCli::new();
    let mut health = HealthServers::default();
    let mut has_snapshot = false;
    let mut retry_at: Option<Instant> = None;
    // Stale UDP flows are removed only once the rules that replace them are in.
    let mut pending_cleanups: Vec<StaleUdpFlows> = Vec::new();

    while !stop.load(Ordering::Relaxed) {
        match loaded.recv_timeout(TICK) {
            Ok(snapshot) => {
                // Several updates may be queued (of manifest reads only the newest matters).
                pipeline.ingest_updates(snapshot, loaded.try_iter());
                has_snapshot = true;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        // Never program a partial view: wait for the first complete read of the source.
        if !has_snapshot {
            continue;
        }
        let retry_due = retry_at.is_some_and(|at| Instant::now() >= at);
        let rules_changed = backend.rules_changed_behind_our_back();
        if !pipeline.has_changes() && !retry_due && !rules_changed {
            continue;
        }
        let started = Instant::now();
        let changes = pipeline.state.take_changes();
        let changed = plan.update(&pipeline.state, &changes);
        pending_cleanups.extend(stale_udp_flows(&plan, &changed));
        health.update(&plan.health_checks);
        match backend.sync(&plan, &changed) {
            Ok(report) => {
                retry_at = None;
                for cleanup in pending_cleanups.drain(..) {
                    let filter = svcplane_conntrack::UdpFlowFilter {
                        family: cleanup.family,
                        destination: match cleanup.destination {
                            svcplane_core::conntrack::FlowDestination::Address(address) => Some(address),
                            svcplane_core::conntrack::FlowDestination::NodePort => None,
                        },
                        port: cleanup.port,
                        keep_replies_from: cleanup.keep_replies_from.clone(),
                    };
                    match conntrack.delete_udp_flows(&filter) {
                        Ok(0) => {}
                        Ok(deleted) => info!(deleted, port = cleanup.port, "removed stale UDP flows"),
                        Err(error) => warn!("removing stale UDP flows: {error}"),
                    }
                }
                info!(
                    full = report.full,
                    service_ports = report.service_ports,
                    operations = report.operations,
                    elapsed = ?started.elapsed(),
                    "synced"
                );
            }
            Err(error) => {
                warn!("sync failed, the previous rules stay in place; retrying in {RETRY_AFTER:?}: {error:#}");
                retry_at = Some(Instant::now() + RETRY_AFTER);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    info!("stopped; the rules stay in place (`svcplane cleanup` removes them)");
    Ok(())
}

/// Prints the nft script `proxy` would apply from scratch.
pub fn render(args: &ProxyArgs) -> anyhow::Result<()> {
    let mut pipeline = Pipeline::for_node(&args.source, &args.node_name)?;
    pipeline.load_initial()?;
    let plan = NodePlan::build(&pipeline.state, node_config(args)?);
    print!("{}", Dataplane::render(args.mode, &plan)?);
    // Served by the proxy itself, not by nftables; shown so the output is the whole story.
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

/// Removes every table svcplane owns on this node.
pub fn cleanup() -> anyhow::Result<()> {
    let removed = Dataplane::cleanup_all()?;
    info!(removed, "cleanup done");
    Ok(())
}
