//! `svcplane announce`: per node, the L2 announcement agent. The Lease decisions are
//! `svcplane-kube`'s (`announce`), the ARP / NDP responder is `svcplane-announce`'s; this
//! only wires them until SIGTERM / SIGINT (which stops announcing and releases the Leases,
//! so another node takes over at once).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use svcplane_announce::Announcer;
use svcplane_kube::ClusterAccess;
use svcplane_kube::announce::{AnnounceOptions, run_announce_agent};
use tracing::info;

use crate::cli::AnnounceArgs;

pub fn run(args: &AnnounceArgs) -> anyhow::Result<()> {
    let access = ClusterAccess::from_flag(args.kubeconfig.clone())
        .ok_or_else(|| anyhow::anyhow!("--kubeconfig PATH is required (outside a Pod)"))?;
    let node_name = match &args.node_name {
        Some(name) if !name.trim().is_empty() => name.trim().to_lowercase(),
        Some(_) => anyhow::bail!("--node-name: an empty node name is invalid"),
        None => {
            crate::config::machine_hostname().context("--node-name is not set and the machine's hostname is unknown")?
        }
    };
    let options = AnnounceOptions {
        lease_namespace: args.lease_namespace.clone(),
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
        ..AnnounceOptions::new(node_name.clone())
    };
    options
        .lease(&svcplane_controller::ObjectKey::new("default", "check"))
        .validate()
        .map_err(|e| anyhow::anyhow!(e.replace("--leader-elect-", "--")))?;
    let announcer = Arc::new(Announcer::start(&args.interfaces).context("--interface")?);
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("announce")
        .build()
        .context("starting the async runtime")?;
    let sink = Arc::clone(&announcer);
    let set_addresses = Arc::new(move |addresses: BTreeSet<IpAddr>| {
        sink.set(addresses);
    });
    runtime.block_on(async move {
        let client = access.client().await?;
        info!(%access, node = %node_name, interfaces = ?args.interfaces, "announcing LoadBalancer addresses this node holds");
        run_announce_agent(client, options, set_addresses, stop).await?;
        info!("stopped");
        anyhow::Ok(())
    })
}
