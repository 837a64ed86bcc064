//! The Kubernetes API as a feed: watch batches converted, object by object, with the same
//! conversion the manifests feed uses, into changes of the core's model (for the proxy) or
//! into discovery views (for cluster DNS). The binary never converts objects itself.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use svcplane_core::discovery::ClusterView;
use svcplane_core::model::{EndpointSlice, NamespacedName, Node, Service};
use svcplane_core::state::Change;
use svcplane_source::{
    DnsServicePart, DnsSlicePart, FieldError, assemble_view, node_to_core, service_to_core, slice_to_core,
};
use tracing::warn;

use crate::ClusterAccess;
use crate::error::KubeError;
use crate::mirror::ObjectMirror;
use crate::source::{Batch, Keep, ObjectChange, WatchOptions, spawn_watch};

/// What the proxy keeps of an object: its conversion to the core's model (`Ok(None)`:
/// nothing the proxy handles), done as the object arrives.
type Converted<T> = Result<Option<T>, Vec<FieldError>>;

/// The batches the proxy's watch hands on: converted objects, never API objects.
pub type ProxyBatch = Batch<Converted<Service>, Converted<EndpointSlice>, Node>;

/// Converts each object the moment the watch receives it; the API object is dropped then.
fn proxy_keep() -> Keep<Converted<Service>, Converted<EndpointSlice>, Node> {
    Keep {
        service: |object| service_to_core(&object),
        slice: |object| slice_to_core(&object),
        node: |object| node_to_core(&object),
    }
}

/// The kinds of objects whose conversion can fail.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Service,
    Slice,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::Slice => "EndpointSlice",
        }
    }
}

/// Converts watch batches into changes of the model. An object that stops converting (now
/// invalid, or now labelled for another proxy) is removed from the model, and its problems
/// are reported once, not on every update.
#[derive(Debug, Default)]
pub struct ApiConversion {
    /// The Services and slices in the model, by [`NameDigest`] (a name is already held by
    /// the watch and by the model; a third copy of 20k names at 10k Services was megabytes).
    services: HashSet<NameDigest>,
    slices: HashSet<NameDigest>,
    reported: HashMap<String, Vec<String>>,
}

/// A 128-bit digest of a namespaced name (two SipHash digests with fixed keys and
/// different prefixes): two names sharing one is as unlikely as a collision of a 128-bit
/// hash, which this set of at most a few hundred thousand names never meets in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct NameDigest(u64, u64);

impl NameDigest {
    fn of(name: &NamespacedName) -> Self {
        let digest = |prefix: u8| {
            let mut hasher = DefaultHasher::new();
            prefix.hash(&mut hasher);
            name.hash(&mut hasher);
            hasher.finish()
        };
        Self(digest(0), digest(1))
    }
}

impl ApiConversion {
    pub fn convert(&mut self, batch: ProxyBatch) -> Vec<Change> {
        let mut out = Vec::with_capacity(batch.changes.len());
        for change in batch.changes {
            match change {
                ObjectChange::Node(_, Some(node)) => out.push(Change::NodeUpserted(node)),
                ObjectChange::Node(name, None) => out.push(Change::NodeDeleted(name)),
                ObjectChange::Service(key, converted) => {
                    let name = NamespacedName::new(key.namespace, key.name);
                    let change =
                        self.track(Kind::Service, name, converted, Change::ServiceUpserted, Change::ServiceDeleted);
                    out.extend(change);
                }
                ObjectChange::Slice(key, converted) => {
                    let name = NamespacedName::new(key.namespace, key.name);
                    let change = self.track(Kind::Slice, name, converted, Change::SliceUpserted, Change::SliceDeleted);
                    out.extend(change);
                }
            }
        }
        out
    }

    /// The change one Service or EndpointSlice update makes: converted, it is upserted; no
    /// longer there, ignored or invalid, it is removed if the model holds it.
    fn track<T>(
        &mut self,
        kind: Kind,
        name: NamespacedName,
        converted: Option<Result<Option<T>, Vec<FieldError>>>,
        upserted: fn(T) -> Change,
        deleted: fn(NamespacedName) -> Change,
    ) -> Option<Change> {
        let label = format!("{} {name}", kind.as_str());
        let known = match kind {
            Kind::Service => &mut self.services,
            Kind::Slice => &mut self.slices,
        };
        match converted {
            Some(Ok(Some(object))) => {
                known.insert(NameDigest::of(&name));
                self.clear(&label);
                Some(upserted(object))
            }
            other => {
                let was_known = known.remove(&NameDigest::of(&name));
                match other {
                    Some(Err(errors)) => self.report(label, &errors),
                    _ => self.clear(&label),
                }
                was_known.then(|| deleted(name))
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

/// Watches what the proxy on `node` needs; every batch's changes go to `sender` (the first
/// only once every initial list is complete) until `stop` is set or the receiver is gone.
pub fn spawn_change_feed(
    access: &ClusterAccess,
    node: &str,
    sender: Sender<Vec<Change>>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KubeError> {
    let (batches, received) = mpsc::channel::<ProxyBatch>();
    let watch = spawn_watch(access, WatchOptions::for_proxy(node), proxy_keep(), batches, Arc::clone(&stop))?;
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
    let (sender, receiver) = mpsc::channel::<ProxyBatch>();
    let watch = spawn_watch(access, WatchOptions::for_proxy(node), proxy_keep(), sender, Arc::clone(&stop))?;
    let batch = receiver.recv_timeout(timeout);
    stop.store(true, Ordering::Release);
    drop(receiver);
    let _ = watch.join();
    let batch = batch.map_err(|_| KubeError::InitialListTimeout { timeout })?;
    Ok(ApiConversion::default().convert(batch))
}

/// What cluster DNS keeps of each object: its conversion for DNS, done as it arrives (the
/// API object is dropped then; DNS never watches Nodes).
fn dns_keep() -> Keep<DnsServicePart, DnsSlicePart, ()> {
    Keep { service: |object| DnsServicePart::of(&object), slice: |object| DnsSlicePart::of(&object), node: |_| () }
}

/// Watches everything cluster DNS needs (Services of every kind, all EndpointSlices); after
/// the initial lists and after every later batch, the whole discovery view goes to `sender`.
pub fn spawn_discovery_feed(
    access: &ClusterAccess,
    sender: Sender<ClusterView>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KubeError> {
    let (batches, received) = mpsc::channel::<Batch<DnsServicePart, DnsSlicePart, ()>>();
    let watch = spawn_watch(access, WatchOptions::for_dns(), dns_keep(), batches, Arc::clone(&stop))?;
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
                let slices: Vec<&DnsSlicePart> = mirror.slices().collect();
                let view = assemble_view(mirror.services(), &slices, std::iter::empty());
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

#[cfg(test)]
mod tests {
    use svcplane_controller::ObjectKey;

    use super::*;

    fn service(cluster_ip: &str) -> Converted<Service> {
        let object: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "ports": [{"port": 80}]},
        }))
        .unwrap();
        (proxy_keep().service)(object)
    }

    fn batch(change: ObjectChange<Converted<Service>, Converted<EndpointSlice>, Node>) -> ProxyBatch {
        Batch { initial: false, changes: vec![change] }
    }

    fn key() -> ObjectKey {
        ObjectKey { namespace: "shop".into(), name: "web".into() }
    }

    #[test]
    fn a_service_that_stops_converting_is_removed_from_the_model_and_one_never_known_is_not() {
        let mut conversion = ApiConversion::default();
        let changes = conversion.convert(batch(ObjectChange::Service(key(), Some(service("10.96.0.10")))));
        assert!(matches!(changes.as_slice(), [Change::ServiceUpserted(_)]));
        let changes = conversion.convert(batch(ObjectChange::Service(key(), Some(service("not-an-ip")))));
        assert_eq!(changes, [Change::ServiceDeleted(NamespacedName::new("shop", "web"))]);
        let changes = conversion.convert(batch(ObjectChange::Service(key(), None)));
        assert!(changes.is_empty(), "already gone from the model");
    }
}
