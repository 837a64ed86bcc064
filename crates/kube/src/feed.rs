//! The Kubernetes API as a feed: watch batches converted, object by object, with the same
//! conversion the manifests feed uses, into changes of the core's model (for the proxy) or
//! into discovery views (for cluster DNS). The binary never converts objects itself.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use svcplane_core::discovery::ClusterView;
use svcplane_core::model::NamespacedName;
use svcplane_core::state::Change;
use svcplane_source::{FieldError, Origins, dns_view, node_to_core, service_to_core, slice_to_core};
use tracing::warn;

use crate::ClusterAccess;
use crate::error::KubeError;
use crate::mirror::ObjectMirror;
use crate::source::{Batch, ObjectChange, WatchOptions, spawn_watch};

/// Converts watch batches into changes of the model. An object that stops converting (now
/// invalid, or now labelled for another proxy) is removed from the model, and its problems
/// are reported once, not on every update.
#[derive(Debug, Default)]
pub struct ApiConversion {
    services: HashSet<NamespacedName>,
    slices: HashSet<NamespacedName>,
    reported: HashMap<String, Vec<String>>,
}

impl ApiConversion {
    pub fn convert(&mut self, batch: Batch) -> Vec<Change> {
        let mut out = Vec::with_capacity(batch.changes.len());
        for change in batch.changes {
            match change {
                ObjectChange::Node(_, Some(node)) => out.push(Change::NodeUpserted(node_to_core(&node))),
                ObjectChange::Node(name, None) => out.push(Change::NodeDeleted(name)),
                ObjectChange::Service(key, object) => {
                    let name = NamespacedName::new(key.namespace, key.name);
                    let converted = object.map(|service| service_to_core(&service));
                    let label = format!("Service {name}");
                    match converted {
                        Some(Ok(Some(service))) => {
                            self.clear(&label);
                            self.services.insert(name);
                            out.push(Change::ServiceUpserted(service));
                        }
                        other => {
                            match other {
                                Some(Err(errors)) => self.report(label, &errors),
                                _ => self.clear(&label),
                            }
                            if self.services.remove(&name) {
                                out.push(Change::ServiceDeleted(name));
                            }
                        }
                    }
                }
                ObjectChange::Slice(key, object) => {
                    let name = NamespacedName::new(key.namespace, key.name);
                    let converted = object.map(|slice| slice_to_core(&slice));
                    let label = format!("EndpointSlice {name}");
                    match converted {
                        Some(Ok(Some(slice))) => {
                            self.clear(&label);
                            self.slices.insert(name);
                            out.push(Change::SliceUpserted(slice));
                        }
                        other => {
                            match other {
                                Some(Err(errors)) => self.report(label, &errors),
                                _ => self.clear(&label),
                            }
                            if self.slices.remove(&name) {
                                out.push(Change::SliceDeleted(name));
                            }
                        }
                    }
                }
            }
        }
        out
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

/// Watches what the proxy on `node` needs; every batch's changes go to `sender` (the first
/// only once every initial list is complete) until `stop` is set or the receiver is gone.
pub fn spawn_change_feed(
    access: &ClusterAccess,
    node: &str,
    sender: Sender<Vec<Change>>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KubeError> {
    let (batches, received) = mpsc::channel::<Batch>();
    let watch = spawn_watch(access, WatchOptions::for_proxy(node), batches, Arc::clone(&stop))?;
    thread::Builder::new()
        .name("api-feed".to_owned())
        .spawn(move || {
            let mut conversion = ApiConversion::default();
            for batch in received {
                if sender.send(conversion.convert(batch)).is_err() {
                    stop.store(true, Ordering::Release);
                    break;
                }
            }
            let _ = watch.join();
        })
        .map_err(|source| KubeError::StartRuntime { source })
}

/// The complete initial state for the proxy on `node` (for `render`), then stops watching.
pub fn initial_changes(access: &ClusterAccess, node: &str, timeout: Duration) -> Result<Vec<Change>, KubeError> {
    let stop = Arc::new(AtomicBool::new(false));
    let (sender, receiver) = mpsc::channel::<Batch>();
    let watch = spawn_watch(access, WatchOptions::for_proxy(node), sender, Arc::clone(&stop))?;
    let batch = receiver.recv_timeout(timeout);
    stop.store(true, Ordering::Release);
    drop(receiver);
    let _ = watch.join();
    let batch = batch.map_err(|_| KubeError::InitialListTimeout { timeout })?;
    Ok(ApiConversion::default().convert(batch))
}

/// Watches everything cluster DNS needs (Services of every kind, all EndpointSlices); after
/// the initial lists and after every later batch, the whole discovery view goes to `sender`.
pub fn spawn_discovery_feed(
    access: &ClusterAccess,
    sender: Sender<ClusterView>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KubeError> {
    let (batches, received) = mpsc::channel::<Batch>();
    let watch = spawn_watch(access, WatchOptions::for_dns(), batches, Arc::clone(&stop))?;
    thread::Builder::new()
        .name("api-discovery".to_owned())
        .spawn(move || {
            let mut mirror = ObjectMirror::new();
            let mut reported: Vec<String> = Vec::new();
            while let Ok(first) = received.recv() {
                mirror.apply(first);
                for more in received.try_iter() {
                    mirror.apply(more);
                }
                let view = dns_view(&mirror.objects(), &Origins::default());
                let problems: Vec<String> = view.errors.iter().map(ToString::to_string).collect();
                if problems != reported {
                    for problem in &problems {
                        warn!("{problem}");
                    }
                    reported = problems;
                }
                if sender.send(view.view).is_err() {
                    stop.store(true, Ordering::Release);
                    break;
                }
            }
            let _ = watch.join();
        })
        .map_err(|source| KubeError::StartRuntime { source })
}
