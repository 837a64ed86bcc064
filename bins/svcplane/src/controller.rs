//! `svcplane controller`: against the API, the EndpointSlice controller until SIGTERM /
//! SIGINT; over a manifests directory, the allocated Services and derived EndpointSlices
//! printed as a YAML stream.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use svcplane_controller::Allocator;
use svcplane_kube::ClusterAccess;
use svcplane_kube::controller::{ControllerOptions, run_controller};
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
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let options = ControllerOptions { managed_by: args.managed_by.clone(), ..ControllerOptions::default() };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("controller")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let client = access.client().await?;
        info!(%access, managed_by = %options.managed_by, "running the EndpointSlice controller");
        run_controller(client, options, stop).await?;
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
