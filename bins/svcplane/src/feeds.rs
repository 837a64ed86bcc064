//! Choosing the feed the flags name: the manifests directory or the Kubernetes API.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::Duration;

use svcplane_controller::{AllocatorConfig, NodePortRange};
use svcplane_core::Change;
use svcplane_core::discovery::ClusterView;
use svcplane_source::{ManifestsFeed, ManifestsSettings};

use crate::cli::{SourceArgs, SourceKind};

/// How long `render` waits for the API's initial lists.
const INITIAL_LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// The manifests feed's settings from the flags; `saves_allocations` for the one process
/// that owns the allocations record (the proxy).
pub fn manifests_settings(
    args: &SourceArgs,
    dir: std::path::PathBuf,
    saves_allocations: bool,
) -> anyhow::Result<ManifestsSettings> {
    let node_port_range: NodePortRange =
        args.node_port_range.parse().map_err(|error| anyhow::Error::new(error).context("--node-port-range"))?;
    Ok(ManifestsSettings {
        dir,
        allocator: AllocatorConfig { service_cidrs: args.service_cidrs.clone(), node_port_range },
        allocations_file: args.allocations_file.clone(),
        saves_allocations,
    })
}

/// Starts the feed of changes for the proxy on `node`.
pub fn spawn_changes(
    args: &SourceArgs,
    node: &str,
    sender: Sender<Vec<Change>>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
    Ok(match args.kind()? {
        SourceKind::Manifests(dir) => {
            ManifestsFeed::for_existing_directory(manifests_settings(args, dir, true)?)?.spawn_changes(sender, stop)?
        }
        SourceKind::Api(access) => svcplane_kube::spawn_change_feed(&access, node, sender, stop)?,
    })
}

/// The complete state for the proxy on `node`, read once (for `render`).
pub fn read_changes(args: &SourceArgs, node: &str) -> anyhow::Result<Vec<Change>> {
    Ok(match args.kind()? {
        SourceKind::Manifests(dir) => {
            let mut feed = ManifestsFeed::for_existing_directory(manifests_settings(args, dir.clone(), false)?)?;
            feed.read_changes().ok_or_else(|| anyhow::anyhow!("--manifests: {} could not be listed", dir.display()))?
        }
        SourceKind::Api(access) => svcplane_kube::initial_changes(&access, node, INITIAL_LIST_TIMEOUT)?,
    })
}

/// Starts the feed of discovery views for cluster DNS. The manifests feed only reads the
/// allocations record, so DNS and the proxy agree on ClusterIPs.
pub fn spawn_discovery(
    args: &SourceArgs,
    sender: Sender<ClusterView>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
    Ok(match args.kind()? {
        SourceKind::Manifests(dir) => {
            ManifestsFeed::new(manifests_settings(args, dir, false)?)?.spawn_discovery(sender, stop)?
        }
        SourceKind::Api(access) => svcplane_kube::spawn_discovery_feed(&access, sender, stop)?,
    })
}
