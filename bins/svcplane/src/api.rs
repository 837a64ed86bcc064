//! Kubernetes API mode (`--kubeconfig PATH`, or the in-cluster config in a Pod): the glue
//! between `svcplane-kube`'s watch batches and the same conversion manifests mode uses,
//! cluster DNS from the API, and `svcplane controller` against the API.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::Context;
use svcplane_core::ClusterState;
use svcplane_core::model::NamespacedName;
use svcplane_core::state::Change;
use svcplane_dns::{SharedZone, Zone, ZoneConfig};
use svcplane_kube::controller::{ControllerOptions, run_controller};
use svcplane_kube::{Batch, ClusterAccess, ObjectChange, ObjectMirror, WatchOptions, spawn_watch};
use svcplane_source::{FieldError, Origins, dns_view, node_to_core, service_to_core, slice_to_core};
use tracing::{info, warn};

use crate::cli::ControllerArgs;

/// How long `render` waits for the initial lists.
const INITIAL_LIST_TIMEOUT: Duration = Duration::from_secs(120);
const TICK: Duration = Duration::from_millis(100);

/// Converts watch batches into changes of the cluster state, object by object, with the
/// same functions manifests mode uses. An object that stops converting (now invalid, or
/// now labelled for another proxy) is removed from the state.
#[derive(Debug, Default)]
pub struct ApiIngest {
    services: HashSet<NamespacedName>,
    slices: HashSet<NamespacedName>,
    /// The problems last reported per object, so an unchanged broken object is reported once.
    reported: HashMap<String, Vec<String>>,
}

impl ApiIngest {
    pub fn ingest(&mut self, batch: Batch, state: &mut ClusterState) {
        for change in batch.changes {
            match change {
                ObjectChange::Node(_, Some(node)) => {
                    state.apply(Change::NodeUpserted(node_to_core(&node)));
                }
                ObjectChange::Node(name, None) => {
                    state.apply(Change::NodeDeleted(name));
                }
                ObjectChange::Service(key, object) => {
                    let name = NamespacedName::new(key.namespace, key.name);
                    let converted = object.map(|service| service_to_core(&service));
                    match converted {
                        Some(Ok(Some(service))) => {
                            self.clear(&format!("Service {name}"));
                            self.services.insert(name);
                            state.apply(Change::ServiceUpserted(service));
                        }
                        other => {
                            if let Some(Err(errors)) = other {
                                self.report(format!("Service {name}"), &errors);
                            } else {
                                self.clear(&format!("Service {name}"));
                            }
                            if self.services.remove(&name) {
                                state.apply(Change::ServiceDeleted(name));
                            }
                        }
                    }
                }
                ObjectChange::Slice(key, object) => {
                    let name = NamespacedName::new(key.namespace, key.name);
                    let converted = object.map(|slice| slice_to_core(&slice));
                    match converted {
                        Some(Ok(Some(slice))) => {
                            self.clear(&format!("EndpointSlice {name}"));
                            self.slices.insert(name);
                            state.apply(Change::SliceUpserted(slice));
                        }
                        other => {
                            if let Some(Err(errors)) = other {
                                self.report(format!("EndpointSlice {name}"), &errors);
                            } else {
                                self.clear(&format!("EndpointSlice {name}"));
                            }
                            if self.slices.remove(&name) {
                                state.apply(Change::SliceDeleted(name));
                            }
                        }
                    }
                }
            }
        }
    }

    fn report(&mut self, object: String, errors: &[FieldError]) {
        let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
        if self.reported.get(&object) != Some(&texts) {
            for text in &texts {
                warn!("{text}; leaving it out");
            }
            self.reported.insert(object, texts);
        }
    }

    fn clear(&mut self, object: &str) {
        if !self.reported.is_empty() {
            self.reported.remove(object);
        }
    }
}

/// Watches for the proxy on `node`: every batch goes to `sender`.
pub fn spawn_proxy_watch<T: From<Batch> + Send + 'static>(
    access: &ClusterAccess,
    node: &str,
    sender: mpsc::Sender<T>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<()>> {
    let (batches, received) = mpsc::channel::<Batch>();
    let watch = spawn_watch(access, WatchOptions::for_proxy(node), batches, Arc::clone(&stop))?;
    // Batches are handed on as they come, converted to the caller's message type.
    thread::Builder::new()
        .name("api-batches".to_owned())
        .spawn(move || {
            for batch in received {
                if sender.send(T::from(batch)).is_err() {
                    stop.store(true, Ordering::Release);
                    break;
                }
            }
            let _ = watch.join();
        })
        .context("starting the API batch thread")
}

/// Waits for the complete initial state (for `render`), then stops watching.
pub fn initial_batch(access: &ClusterAccess, node: &str) -> anyhow::Result<Batch> {
    let stop = Arc::new(AtomicBool::new(false));
    let (sender, receiver) = mpsc::channel::<Batch>();
    let watch = spawn_watch(access, WatchOptions::for_proxy(node), sender, Arc::clone(&stop))?;
    let batch = receiver.recv_timeout(INITIAL_LIST_TIMEOUT);
    stop.store(true, Ordering::Release);
    drop(receiver);
    let _ = watch.join();
    batch.with_context(|| format!("the initial lists from the API did not complete within {INITIAL_LIST_TIMEOUT:?}"))
}

/// Keeps `zone` built from the API (Services of every kind, all EndpointSlices) until
/// `stop` is set. Until the initial lists are complete the zone stays pending (SERVFAIL).
pub fn spawn_zone_builder(
    access: &ClusterAccess,
    config: Arc<ZoneConfig>,
    zone: SharedZone,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let (sender, batches) = mpsc::channel::<Batch>();
    let watch = spawn_watch(access, WatchOptions::for_dns(), sender, Arc::clone(&stop))?;
    let builder = thread::Builder::new()
        .name("dns-zone".to_owned())
        .spawn(move || {
            let mut mirror = ObjectMirror::new();
            let mut serial = 0u32;
            let mut reported: Vec<String> = Vec::new();
            while !stop.load(Ordering::Acquire) {
                match batches.recv_timeout(TICK) {
                    Ok(first) => {
                        mirror.apply(first);
                        for more in batches.try_iter() {
                            mirror.apply(more);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                let started = Instant::now();
                let view = dns_view(&mirror.objects(), &Origins::default());
                let problems: Vec<String> = view.errors.iter().map(ToString::to_string).collect();
                if problems != reported {
                    for problem in &problems {
                        warn!("{problem}");
                    }
                    reported = problems;
                }
                serial = crate::dns::next_serial(serial);
                let built = Zone::build(Arc::clone(&config), &view.view, serial);
                info!(
                    services = built.service_count(),
                    serial,
                    elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                    "zone updated"
                );
                zone.publish(built);
            }
        })
        .context("starting the zone builder")?;
    Ok(vec![watch, builder])
}

/// `svcplane controller --kubeconfig PATH`: the EndpointSlice controller against the API
/// until SIGTERM or SIGINT.
pub fn controller(args: &ControllerArgs, access: ClusterAccess) -> anyhow::Result<()> {
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
