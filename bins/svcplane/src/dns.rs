//! `svcplane dns`: cluster DNS from the feed the flags name (manifests directory or API).
//!
//! Three threads of work: the feed (discovery views of the cluster), the zone builder that
//! turns each view into a zone snapshot, and the tokio runtime that answers over UDP and
//! TCP from whatever snapshot is current. CoreDNS's request metrics are served on
//! `--metrics-bind-address` (`/metrics`). Until the first view, names in the zone answer
//! SERVFAIL; a directory that disappears keeps the last zone served.
//!
//! Allocations: with `--allocations-file` the record `proxy` saves is read (never written),
//! so both agree on cluster IPs; without it both derive them from names alone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, bail};
use svcplane_dns::{DnsMetrics, DnsServer, Forwarder, Handler, PodRecords, SharedZone, Zone, ZoneConfig, follow_views};
use tracing::{info, warn};

use crate::cli::{DnsArgs, PodsMode, SourceKind};
use crate::feeds;

/// Serves the zone until SIGTERM or SIGINT.
pub fn run(args: &DnsArgs) -> anyhow::Result<()> {
    let pods = match args.pods {
        PodsMode::Insecure => PodRecords::Insecure,
        PodsMode::Disabled => PodRecords::Disabled,
    };
    let config = ZoneConfig::new(&args.zone)
        .and_then(|config| config.with_ttl(args.ttl))
        .context("--zone / --ttl")?
        .with_pod_records(pods)
        .with_forwarding(!args.upstreams.is_empty());
    let config = Arc::new(config);
    if let SourceKind::Manifests(dir) = args.source.kind()? {
        if dir.exists() && !dir.is_dir() {
            bail!("--manifests: {} is not a directory", dir.display());
        }
        if !dir.exists() {
            warn!(dir = %dir.display(), "the manifests directory does not exist (yet); answering SERVFAIL until it does");
        }
    }
    // Until the feed's first view, names in the zone answer SERVFAIL.
    let zone = SharedZone::new(Zone::pending(Arc::clone(&config)));
    let stop = Arc::new(AtomicBool::new(false));
    let (sender, views) = mpsc::channel();
    let feeding = feeds::spawn_discovery(&args.source, sender, Arc::clone(&stop))?;
    // Each new zone frees the previous one and the view it came from: give those pages back.
    let following =
        follow_views(views, config, zone.clone(), crate::memory::trim).context("starting the zone builder")?;
    let forwarder = (!args.upstreams.is_empty())
        .then(|| Forwarder::new(args.upstreams.clone(), Duration::from_millis(args.forward_timeout_ms)));
    let metrics = Arc::new(DnsMetrics::new(args.listen));
    let _metrics_server = match args.metrics_bind_address.0 {
        Some(address) => {
            let metrics = Arc::clone(&metrics);
            Some(crate::controller::serve_metrics(address, Arc::new(move || metrics.render()))?)
        }
        None => None,
    };
    let served = serve(args.listen, Handler::new(zone, forwarder).with_metrics(Arc::clone(&metrics)), &metrics);
    stop.store(true, Ordering::Release);
    join(feeding, "feed");
    join(following, "zone builder");
    served
}

fn join(handle: JoinHandle<()>, what: &str) {
    if handle.join().is_err() {
        warn!("the {what} thread panicked");
    }
}

fn serve(listen: SocketAddr, handler: Handler, metrics: &DnsMetrics) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("dns")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let server = DnsServer::bind(listen, handler).await.with_context(|| format!("--listen {listen}"))?;
        let local = server.local_addr();
        metrics.set_listen(local);
        // Scripts and tests read the address from here (port 0 picks one).
        println!("listening on {local}");
        info!(%local, "serving cluster DNS over UDP and TCP");
        server.run_until(shutdown_signal()).await.context("serving DNS")?;
        info!("stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut terminate) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
