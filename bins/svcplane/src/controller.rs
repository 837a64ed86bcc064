//! `svcplane controller`: against the API, the EndpointSlice controller (and with
//! `--load-balancer-ipam` LoadBalancer address assignment beside it) until SIGTERM /
//! SIGINT, by default only while it holds the leader election Lease (losing it exits 1, as
//! kube-controller-manager does, so the replica restarts cleanly; SIGTERM releases it);
//! over a manifests directory, the allocated Services (LoadBalancer addresses from the
//! directory's pools included) and derived EndpointSlices printed as a YAML stream.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use svcplane_controller::Allocator;
use svcplane_kube::ClusterAccess;
use svcplane_kube::controller::{ControllerMetrics, ControllerOptions};
use svcplane_kube::lease::{LeaderElector, LeaseConfig, default_identity, run_while_leading};
use svcplane_kube::load_balancer::run_controllers;
use svcplane_source::load_directory;
use tracing::{info, warn};

use crate::cli::{ControllerArgs, SourceKind};
use crate::feeds;

pub fn run(args: &ControllerArgs) -> anyhow::Result<()> {
    match args.source.kind()? {
        SourceKind::Api(access) => run_against_api(args, access),
        SourceKind::Manifests(dir) => print_for_manifests(args, dir),
    }
}

fn run_against_api(args: &ControllerArgs, access: ClusterAccess) -> anyhow::Result<()> {
    let lease = args.leader_elect.then(|| LeaseConfig {
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
        ..LeaseConfig::new(
            args.leader_elect_resource_namespace.clone(),
            args.leader_elect_resource_name.clone(),
            default_identity(),
        )
    });
    if let Some(lease) = &lease {
        lease.validate().map_err(anyhow::Error::msg)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let options = ControllerOptions { managed_by: args.managed_by.clone(), ..ControllerOptions::default() };
    let lb_ipam = args.load_balancer_ipam;
    let metrics = Arc::new(ControllerMetrics::new());
    let _metrics_server = if let Some(address) = args.metrics_bind_address.0 {
        let metrics = Arc::clone(&metrics);
        Some(serve_metrics(address, Arc::new(move || metrics.render()))?)
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("controller")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let client = access.client().await?;
        let Some(lease) = lease else {
            info!(%access, managed_by = %options.managed_by, "running the EndpointSlice controller (no leader election)");
            run_controllers(client, options, stop, metrics, lb_ipam).await?;
            info!("stopped");
            return anyhow::Ok(());
        };
        let lease_name = lease.name.clone();
        let mut elector = LeaderElector::new(client.clone(), lease);
        metrics.track_leadership(&lease_name, elector.leading());
        let controller_stop = Arc::clone(&stop);
        let led = run_while_leading(&mut elector, Arc::clone(&stop), move || {
            info!(%access, managed_by = %options.managed_by, "leading: running the EndpointSlice controller");
            run_controllers(client, options, controller_stop, metrics, lb_ipam)
        })
        .await?;
        if let Some(result) = led {
            result?;
        }
        info!("stopped");
        anyhow::Ok(())
    })
}

fn print_for_manifests(args: &ControllerArgs, dir: std::path::PathBuf) -> anyhow::Result<()> {
    if !dir.is_dir() {
        anyhow::bail!("--manifests: {} is not a directory", dir.display());
    }
    let settings = feeds::manifests_settings(&args.source, dir.clone(), false)?;
    let mut allocator = Allocator::new(settings.allocator).context("--service-cidr / --node-port-range")?;
    let loaded = load_directory(&dir);
    for error in &loaded.errors {
        warn!("{error}");
    }
    let reconciled = svcplane_controller::reconcile(&loaded.objects, &mut allocator);
    for error in &reconciled.errors {
        warn!("{error}");
    }
    for problem in &reconciled.load_balancer_problems {
        warn!("{problem}");
    }
    let mut documents = Vec::new();
    for service in &reconciled.services {
        documents.push(with_kind(serde_json::to_value(service)?, "v1", "Service"));
    }
    for slice in &reconciled.slices {
        documents.push(with_kind(serde_json::to_value(slice)?, "discovery.k8s.io/v1", "EndpointSlice"));
    }
    for document in documents {
        println!("---\n{}", serde_saphyr::to_string(&document).context("writing YAML")?);
    }
    Ok(())
}

fn with_kind(mut value: serde_json::Value, api_version: &str, kind: &str) -> serde_json::Value {
    if let Some(object) = value.as_object_mut() {
        object.insert("apiVersion".into(), api_version.into());
        object.insert("kind".into(), kind.into());
    }
    value
}

/// What `/metrics` answers: the current text exposition.
pub(crate) type RenderMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` (Prometheus text, version 0.0.4) and `/healthz` on `address` with
/// the ops crate's small HTTP server; prints `metrics on ADDR:PORT` (port 0 picks one).
/// Serving stops when the returned server is dropped.
pub(crate) fn serve_metrics(
    address: std::net::SocketAddr,
    render: RenderMetrics,
) -> anyhow::Result<svcplane_ops::http::Server> {
    use svcplane_ops::http::{Response, Routes, Server};
    let routes = Routes::new()
        .route("/metrics", move |_| Response::new(200, "text/plain; version=0.0.4; charset=utf-8", render()))
        .route("/healthz", |_| Response::text(200, "ok"));
    let server =
        Server::start("metrics", address, routes).with_context(|| format!("--metrics-bind-address {address}"))?;
    let local = server.address();
    println!("metrics on {local}");
    info!(%local, "serving /metrics");
    Ok(server)
}
