//! Manifests mode: directory -> controller (allocation, EndpointSlices) -> core values ->
//! minimal changes into the cluster state. Every problem is logged with its file, object
//! and field, and the rest carries on.
//!
//! API mode (`--kubeconfig`, see `api.rs`): watch batches -> the same conversion, object by
//! object, into the same cluster state.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

use anyhow::Context;
use svcplane_controller::{AllocationRecord, Allocator, AllocatorConfig, NodePortRange};
use svcplane_core::ClusterState;
use svcplane_source::{
    DEFAULT_POLL_INTERVAL, DirectoryWatcher, Loaded, ObjectKind, ObjectRef, SnapshotDiffer, convert_objects,
    load_directory,
};
use tracing::{debug, warn};

use crate::api::ApiIngest;
use crate::cli::{SourceArgs, SourceKind};

/// One message of a source: a complete read of the manifests directory, or a batch of
/// changes from the API.
#[derive(Debug)]
pub enum Update {
    Manifests(Loaded),
    Api(svcplane_kube::Batch),
}

impl From<svcplane_kube::Batch> for Update {
    fn from(batch: svcplane_kube::Batch) -> Self {
        Update::Api(batch)
    }
}

/// API mode: where to watch, for which node, and the conversion's memory.
#[derive(Debug)]
struct ApiSource {
    access: svcplane_kube::ClusterAccess,
    node: String,
    ingest: ApiIngest,
}

/// Cluster state fed from a manifests directory.
#[derive(Debug)]
pub struct Pipeline {
    dir: PathBuf,
    allocator: Allocator,
    allocations_file: Option<PathBuf>,
    differ: SnapshotDiffer,
    pub state: ClusterState,
    /// The last problems reported, so an unchanged broken file is not reported on every reload.
    last_problems: Vec<String>,
    /// Set in API mode, where `dir`, the allocator and the differ go unused.
    api: Option<ApiSource>,
}

impl Pipeline {
    pub fn new(args: &SourceArgs) -> anyhow::Result<Self> {
        let allocator = allocator_from(args)?;
        let dir = match args.kind()? {
            SourceKind::Manifests(dir) => dir,
            SourceKind::Api(_) => anyhow::bail!("--kubeconfig: only `proxy` and `render` read the API here"),
        };
        if !dir.is_dir() {
            anyhow::bail!("--manifests: {} is not a directory", dir.display());
        }
        Ok(Self {
            dir,
            allocator,
            allocations_file: args.allocations_file.clone(),
            differ: SnapshotDiffer::new(),
            state: ClusterState::new(),
            last_problems: Vec::new(),
            api: None,
        })
    }

    /// The pipeline of `proxy` / `render` on `node`: from the manifests directory or the API.
    pub fn for_node(args: &SourceArgs, node: &str) -> anyhow::Result<Self> {
        match args.kind()? {
            SourceKind::Manifests(_) => Self::new(args),
            SourceKind::Api(access) => Ok(Self {
                dir: std::path::PathBuf::new(),
                allocator: Allocator::new(AllocatorConfig::default()).map_err(|e| anyhow::anyhow!("{e}"))?,
                allocations_file: None,
                differ: SnapshotDiffer::new(),
                state: ClusterState::new(),
                last_problems: Vec::new(),
                api: Some(ApiSource { access, node: node.to_owned(), ingest: ApiIngest::default() }),
            }),
        }
    }

    /// Reads the source's complete state once (for `render`): the directory, or the API's
    /// initial lists.
    pub fn load_initial(&mut self) -> anyhow::Result<()> {
        let Some(api) = &mut self.api else {
            self.load_once();
            return Ok(());
        };
        let batch = crate::api::initial_batch(&api.access, &api.node)?;
        api.ingest.ingest(batch, &mut self.state);
        Ok(())
    }

    /// Starts the source's watch: every update goes to `sender` until `stop` is set.
    pub fn spawn_source(&self, sender: Sender<Update>, stop: Arc<AtomicBool>) -> anyhow::Result<JoinHandle<()>> {
        if let Some(api) = &self.api {
            return crate::api::spawn_proxy_watch(&api.access, &api.node, sender, stop);
        }
        let (loads, loaded) = std::sync::mpsc::channel();
        let watcher = self.spawn_watcher(loads, stop)?;
        std::thread::Builder::new()
            .name("manifests-updates".to_owned())
            .spawn(move || {
                for snapshot in loaded {
                    if sender.send(Update::Manifests(snapshot)).is_err() {
                        break;
                    }
                }
                let _ = watcher.join();
            })
            .context("starting the manifests update thread")
    }

    /// Takes queued updates in: of manifest reads only the newest matters, API batches are
    /// changes and all count, in order.
    pub fn ingest_updates(&mut self, first: Update, rest: impl Iterator<Item = Update>) {
        let mut newest = None;
        for update in std::iter::once(first).chain(rest) {
            match update {
                Update::Manifests(loaded) => newest = Some(loaded),
                Update::Api(batch) => match &mut self.api {
                    Some(api) => api.ingest.ingest(batch, &mut self.state),
                    None => warn!("an API batch reached a manifests pipeline; ignored"),
                },
            }
        }
        if let Some(loaded) = newest {
            self.ingest(loaded);
        }
    }

    /// Reads the directory once and feeds it in.
    pub fn load_once(&mut self) {
        let loaded = load_directory(&self.dir);
        self.ingest(loaded);
    }

    /// Watches the directory on a thread of its own, sending every new complete read.
    pub fn spawn_watcher(&self, sender: Sender<Loaded>, stop: Arc<AtomicBool>) -> anyhow::Result<JoinHandle<()>> {
        DirectoryWatcher::new(self.dir.clone())
            .spawn(DEFAULT_POLL_INTERVAL, sender, stop)
            .context("starting the manifests watcher")
    }

    pub fn has_changes(&self) -> bool {
        self.state.has_pending_changes()
    }

    /// Takes one complete read of the directory into the cluster state.
    pub fn ingest(&mut self, loaded: Loaded) {
        let Loaded { objects, origins, errors } = loaded;
        let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let reconciled = svcplane_controller::reconcile(&objects, &mut self.allocator);
        for error in &reconciled.errors {
            let object = ObjectRef::new(ObjectKind::Service, &error.service().namespace, &error.service().name);
            match origins.file_of(&object) {
                Some(file) => problems.push(format!("{}: {error}", file.display())),
                None => problems.push(error.to_string()),
            }
        }
        if reconciled.allocations_changed {
            self.save_allocations();
        }
        let converted = convert_objects(
            &svcplane_source::ClusterObjects {
                services: reconciled.services,
                pods: Vec::new(),
                nodes: objects.nodes,
                slices: reconciled.slices,
            },
            &origins,
        );
        problems.extend(converted.errors.iter().map(ToString::to_string));
        if problems != self.last_problems {
            for problem in &problems {
                warn!("{problem}");
            }
            self.last_problems = problems;
        }
        let changes = self.differ.diff(converted.services, converted.slices, converted.nodes);
        debug!(changes = changes.len(), "manifests reloaded");
        for change in changes {
            self.state.apply(change);
        }
    }

    fn save_allocations(&self) {
        let Some(file) = &self.allocations_file else {
            return;
        };
        // Write then rename, so a crash never leaves half a record.
        let temporary = file.with_extension("tmp");
        let result = std::fs::write(&temporary, self.allocator.record().to_json())
            .and_then(|()| std::fs::rename(&temporary, file));
        if let Err(error) = result {
            warn!("saving allocations to {}: {error}", file.display());
        }
    }
}

/// The allocator the flags describe, with the remembered allocations restored.
pub fn allocator_from(args: &SourceArgs) -> anyhow::Result<Allocator> {
    let node_port_range: NodePortRange =
        args.node_port_range.parse().map_err(|e| anyhow::anyhow!("--node-port-range: {e}"))?;
    let config = AllocatorConfig { service_cidrs: args.service_cidrs.clone(), node_port_range };
    let mut allocator = Allocator::new(config).map_err(|e| anyhow::anyhow!("--service-cidr: {e}"))?;
    if let Some(file) = &args.allocations_file
        && file.exists()
    {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let record = AllocationRecord::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        allocator.restore(&record);
    }
    Ok(allocator)
}

/// `svcplane controller --manifests DIR`: prints the allocated Services and the
/// EndpointSlices the controller derives, as a YAML stream.
pub fn print_controller_output(args: &SourceArgs) -> anyhow::Result<()> {
    let mut pipeline = Pipeline::new(args)?;
    let loaded = load_directory(&pipeline.dir);
    for error in &loaded.errors {
        warn!("{error}");
    }
    let reconciled = svcplane_controller::reconcile(&loaded.objects, &mut pipeline.allocator);
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
