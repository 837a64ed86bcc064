//! The EndpointSlice controller against a real API server.
//!
//! It watches Services, Pods, Nodes and the EndpointSlices it owns (label
//! `endpointslice.kubernetes.io/managed-by=<managed_by>`), and after its initial lists keeps
//! every Service's slices equal to what `svcplane-controller`'s planner derives from the
//! Pods: owner reference to the Service, labels `kubernetes.io/service-name` and
//! `endpointslice.kubernetes.io/managed-by` (plus the Service's own labels), at most
//! `max_endpoints_per_slice` endpoints per slice, a placeholder for a Service with a selector
//! and no endpoints. As upstream, Pods on Nodes that do not exist are left out.
//!
//! Writes are the fewest the placement in [`writes`] allows; each one updates the
//! controller's own view at once (a later, older watch event of that slice is ignored), so
//! a Service reconciled again before its watch events arrive gets no duplicate slices. A
//! failed write retries the Service with a capped backoff. Slices of deleted Services are
//! deleted by the controller itself, not left to the garbage collector.

pub mod metrics;
mod writes;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use svcplane_controller::{LABEL_HEADLESS, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, ObjectKey, plan_slices};
use tracing::{debug, info, warn};

pub use metrics::ControllerMetrics;
pub use writes::{Write, has_selector, plan_writes};

use crate::error::KubeError;
use crate::source::WatchBackoff;

/// Writes in flight at once.
const CONCURRENT_WRITES: usize = 8;
const TICK: Duration = Duration::from_millis(100);
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// How the controller labels and sizes what it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerOptions {
    /// The value of `endpointslice.kubernetes.io/managed-by` on the slices it owns.
    pub managed_by: String,
    /// Endpoints per slice at most.
    pub max_endpoints_per_slice: usize,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            managed_by: svcplane_controller::MANAGED_BY.to_owned(),
            max_endpoints_per_slice: svcplane_controller::MAX_ENDPOINTS_PER_SLICE,
        }
    }
}

/// Runs the controller until `stop` is set. Fails only when it cannot start; API errors
/// are retried.
pub async fn run_controller(
    client: Client,
    options: ControllerOptions,
    stop: Arc<AtomicBool>,
) -> Result<(), KubeError> {
    run_controller_with_metrics(client, options, stop, Arc::new(ControllerMetrics::new())).await
}

/// [`run_controller`], counting its work in `metrics`.
pub async fn run_controller_with_metrics(
    client: Client,
    options: ControllerOptions,
    stop: Arc<AtomicBool>,
    metrics: Arc<ControllerMetrics>,
) -> Result<(), KubeError> {
    let mut streams: SelectAll<BoxStream<'static, Incoming>> = SelectAll::new();
    streams.push(stream_of(Api::<Service>::all(client.clone()), watcher::Config::default(), Incoming::Service));
    streams.push(stream_of(Api::<Pod>::all(client.clone()), watcher::Config::default(), Incoming::Pod));
    streams.push(stream_of(Api::<Node>::all(client.clone()), watcher::Config::default(), Incoming::Node));
    let owned = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={}", options.managed_by));
    streams.push(stream_of(Api::<EndpointSlice>::all(client.clone()), owned, Incoming::Slice));
    let mut state = ControllerState::new(options);
    state.metrics = metrics;
    let mut streams = pin!(streams);
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Acquire) {
        tokio::select! {
            incoming = streams.next() => {
                let Some(incoming) = incoming else { break };
                state.handle(incoming);
                while let Some(Some(incoming)) = streams.next().now_or_never() {
                    state.handle(incoming);
                }
            }
            _ = ticker.tick() => {}
        }
        if state.is_synced() {
            state.reconcile_dirty(&client).await;
        }
    }
    Ok(())
}

#[allow(clippy::large_enum_variant, reason = "short-lived, one per watch event; boxing would only add allocations")]
enum Incoming {
    Service(Result<Event<Service>, watcher::Error>),
    Pod(Result<Event<Pod>, watcher::Error>),
    Node(Result<Event<Node>, watcher::Error>),
    Slice(Result<Event<EndpointSlice>, watcher::Error>),
}

fn stream_of<K>(
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(Result<Event<K>, watcher::Error>) -> Incoming,
) -> BoxStream<'static, Incoming>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher::watcher(api, config).backoff(WatchBackoff::new()).map(wrap).boxed()
}

/// The objects of one kind, with relists applied whole.
#[derive(Debug)]
struct Objects<K> {
    kind: &'static str,
    objects: HashMap<ObjectKey, K>,
    relist: Option<HashMap<ObjectKey, K>>,
    synced: bool,
}

impl<K: Resource + Clone> Objects<K> {
    fn new(kind: &'static str) -> Self {
        Self { kind, objects: HashMap::new(), relist: None, synced: false }
    }

    /// Applies one event and returns `(old, new)` for each object it changed.
    fn handle(&mut self, incoming: Result<Event<K>, watcher::Error>) -> Vec<(Option<K>, Option<K>)> {
        let event = match incoming {
            Ok(event) => event,
            Err(error) => {
                debug!(kind = self.kind, "watch failed, retrying: {error}");
                return Vec::new();
            }
        };
        match event {
            Event::Apply(object) => {
                let key = ObjectKey::of(object.meta());
                let old = self.objects.insert(key, object.clone());
                vec![(old, Some(object))]
            }
            Event::Delete(object) => {
                let key = ObjectKey::of(object.meta());
                self.objects.remove(&key).map(|old| vec![(Some(old), None)]).unwrap_or_default()
            }
            Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(object) => {
                self.relist.get_or_insert_with(HashMap::new).insert(ObjectKey::of(object.meta()), object);
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let mut old = std::mem::replace(&mut self.objects, listed);
                let mut changes: Vec<(Option<K>, Option<K>)> = Vec::new();
                for (key, new) in &self.objects {
                    let before = old.remove(key);
                    let unchanged = before
                        .as_ref()
                        .is_some_and(|before| before.meta().resource_version == new.meta().resource_version);
                    if !unchanged {
                        changes.push((before, Some(new.clone())));
                    }
                }
                changes.extend(old.into_values().map(|gone| (Some(gone), None)));
                if self.synced {
                    info!(kind = self.kind, objects = self.objects.len(), "relisted");
                }
                self.synced = true;
                changes
            }
        }
    }
}

/// The Service's address types (`spec.ipFamilies`, else the family of its cluster IP, else
/// IPv4).
fn address_types(service: &Service) -> Vec<String> {
    let spec = service.spec.as_ref();
    let mut types: Vec<String> = spec
        .and_then(|s| s.ip_families.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|family| family == "IPv4" || family == "IPv6")
        .collect();
    if types.is_empty() {
        let v6 = spec.and_then(|s| s.cluster_ip.as_deref()).is_some_and(|ip| ip.contains(':'));
        types.push(if v6 { "IPv6" } else { "IPv4" }.to_owned());
    }
    types
}

/// How a Node (cluster-scoped) is keyed among the objects.
fn node_key(name: &str) -> ObjectKey {
    ObjectKey::of(&ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() })
}

fn resource_version(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

/// The slices this controller owns, by Service, kept newest-first: an event older than what
/// the controller itself wrote (or deleted) is ignored.
#[derive(Debug, Default)]
struct OwnedSlices {
    by_key: HashMap<ObjectKey, EndpointSlice>,
    by_service: HashMap<ObjectKey, BTreeSet<String>>,
    /// resourceVersion at which the controller deleted a slice.
    deleted: HashMap<ObjectKey, u64>,
    relist: Option<Vec<EndpointSlice>>,
    synced: bool,
}

fn service_of(slice: &EndpointSlice) -> Option<ObjectKey> {
    let name = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    Some(ObjectKey::new(slice.metadata.namespace.clone().unwrap_or_default(), name.clone()))
}

impl OwnedSlices {
    /// Applies a watch event; returns the Services whose slices changed.
    fn handle(&mut self, incoming: Result<Event<EndpointSlice>, watcher::Error>) -> Vec<ObjectKey> {
        let Ok(event) = incoming else { return Vec::new() };
        match event {
            Event::Apply(slice) => self.observe(slice).into_iter().collect(),
            Event::Delete(slice) => {
                let key = ObjectKey::of(&slice.metadata);
                self.deleted.remove(&key);
                self.remove(&key).into_iter().collect()
            }
            Event::Init => {
                self.relist = Some(Vec::new());
                Vec::new()
            }
            Event::InitApply(slice) => {
                self.relist.get_or_insert_with(Vec::new).push(slice);
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let mut touched: BTreeSet<ObjectKey> = self.by_key.values().filter_map(service_of).collect();
                self.by_key.clear();
                self.by_service.clear();
                self.deleted.clear();
                for slice in listed {
                    touched.extend(self.observe(slice));
                }
                self.synced = true;
                touched.into_iter().collect()
            }
        }
    }

    /// Takes a slice as seen (from the watch or a write), unless an equal or newer version
    /// is known or the controller deleted it at a later version.
    fn observe(&mut self, slice: EndpointSlice) -> Option<ObjectKey> {
        let key = ObjectKey::of(&slice.metadata);
        let version = resource_version(&slice.metadata);
        if let (Some(version), Some(deleted)) = (version, self.deleted.get(&key))
            && version <= *deleted
        {
            return None;
        }
        if let Some(known) = self.by_key.get(&key)
            && let (Some(known), Some(version)) = (resource_version(&known.metadata), version)
            && version <= known
        {
            return None;
        }
        let service = service_of(&slice);
        if let Some(previous) = self.by_key.get(&key).and_then(service_of)
            && Some(&previous) != service.as_ref()
            && let Some(names) = self.by_service.get_mut(&previous)
        {
            names.remove(&key.name);
        }
        if let Some(service) = &service {
            self.by_service.entry(service.clone()).or_default().insert(key.name.clone());
        }
        self.by_key.insert(key, slice);
        service
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<ObjectKey> {
        let slice = self.by_key.remove(key)?;
        let service = service_of(&slice)?;
        if let Some(names) = self.by_service.get_mut(&service) {
            names.remove(&key.name);
            if names.is_empty() {
                self.by_service.remove(&service);
            }
        }
        Some(service)
    }

    fn of_service(&self, service: &ObjectKey) -> Vec<EndpointSlice> {
        self.by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|name| self.by_key.get(&ObjectKey::new(service.namespace.clone(), name.clone())).cloned())
            .collect()
    }
}

#[derive(Debug)]
struct ControllerState {
    options: ControllerOptions,
    services: Objects<Service>,
    pods: Objects<Pod>,
    nodes: Objects<Node>,
    slices: OwnedSlices,
    dirty: BTreeSet<ObjectKey>,
    retries: HashMap<ObjectKey, (Instant, u32)>,
    started: Instant,
    reconciled_once: bool,
    metrics: Arc<ControllerMetrics>,
    /// Endpoints each Service's slices should hold, as last planned.
    desired: HashMap<ObjectKey, usize>,
}

impl ControllerState {
    fn new(options: ControllerOptions) -> Self {
        Self {
            options,
            services: Objects::new("Service"),
            pods: Objects::new("Pod"),
            nodes: Objects::new("Node"),
            slices: OwnedSlices::default(),
            dirty: BTreeSet::new(),
            retries: HashMap::new(),
            started: Instant::now(),
            reconciled_once: false,
            metrics: Arc::new(ControllerMetrics::new()),
            desired: HashMap::new(),
        }
    }

    fn is_synced(&self) -> bool {
        self.services.synced && self.pods.synced && self.nodes.synced && self.slices.synced
    }

    fn handle(&mut self, incoming: Incoming) {
        match incoming {
            Incoming::Service(event) => {
                for (old, new) in self.services.handle(event) {
                    if let Some(service) = new.as_ref().or(old.as_ref()) {
                        self.dirty.insert(ObjectKey::of(&service.metadata));
                    }
                }
            }
            Incoming::Pod(event) => {
                for (old, new) in self.pods.handle(event) {
                    for pod in old.iter().chain(new.iter()) {
                        self.mark_services_selecting(pod);
                    }
                }
            }
            Incoming::Node(event) => {
                let zone = |node: &Node| {
                    node.metadata.labels.as_ref().and_then(|l| l.get("topology.kubernetes.io/zone")).cloned()
                };
                let relevant = self.nodes.handle(event).iter().any(|(old, new)| match (old, new) {
                    (Some(old), Some(new)) => zone(old) != zone(new),
                    _ => true,
                });
                if relevant {
                    let all: Vec<ObjectKey> = self.services.objects.keys().cloned().collect();
                    self.dirty.extend(all);
                }
            }
            Incoming::Slice(event) => {
                let touched = self.slices.handle(event);
                self.dirty.extend(touched);
            }
        }
    }

    fn mark_services_selecting(&mut self, pod: &Pod) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let labels = pod.metadata.labels.as_ref();
        for (key, service) in &self.services.objects {
            if key.namespace != namespace {
                continue;
            }
            let Some(selector) = service.spec.as_ref().and_then(|s| s.selector.as_ref()).filter(|s| !s.is_empty())
            else {
                continue;
            };
            if selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) {
                self.dirty.insert(key.clone());
            }
        }
    }

    /// The metadata every slice of `service` carries.
    fn template(&self, service: &Service) -> ObjectMeta {
        let key = ObjectKey::of(&service.metadata);
        let mut labels = service.metadata.labels.clone().unwrap_or_default();
        labels.remove(LABEL_HEADLESS);
        labels.insert(LABEL_SERVICE_NAME.to_owned(), key.name.clone());
        labels.insert(LABEL_MANAGED_BY.to_owned(), self.options.managed_by.clone());
        if service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
            labels.insert(LABEL_HEADLESS.to_owned(), String::new());
        }
        ObjectMeta {
            namespace: Some(key.namespace),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Service".to_owned(),
                name: key.name,
                uid: service.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        }
    }

    /// The writes that bring one Service's slices up to date, and how many endpoints its
    /// slices should hold.
    fn writes_for(&self, key: &ObjectKey) -> (Vec<Write>, usize) {
        let existing = self.slices.of_service(key);
        let max = self.options.max_endpoints_per_slice;
        let service = self.services.objects.get(key).filter(|service| has_selector(service));
        let Some(service) = service else {
            return (plan_writes(&key.name, None, &[], Vec::new(), &existing, max), 0);
        };
        let selector = service.spec.as_ref().and_then(|s| s.selector.as_ref()).cloned().unwrap_or_default();
        let publish_not_ready = service.spec.as_ref().and_then(|s| s.publish_not_ready_addresses) == Some(true);
        let pods: Vec<Pod> = self
            .pods
            .objects
            .iter()
            .filter(|(pod_key, pod)| {
                pod_key.namespace == key.namespace
                    && selector.iter().all(|(k, v)| pod.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
                    // As upstream: a Pod on a Node that does not exist is left out, unless
                    // the Service publishes not-ready addresses.
                    && (publish_not_ready || pod
                        .spec
                        .as_ref()
                        .and_then(|spec| spec.node_name.as_ref())
                        .is_some_and(|node| self.nodes.objects.contains_key(&node_key(node))))
            })
            .map(|(_, pod)| pod.clone())
            .collect();
        let nodes: Vec<Node> = self.nodes.objects.values().cloned().collect();
        let template = self.template(service);
        let desired: Vec<EndpointSlice> = match plan_slices(service, &pods, Some(&nodes)) {
            Ok(slices) => slices
                .into_iter()
                .map(|mut slice| {
                    // As upstream: topology hints only on ready endpoints.
                    for endpoint in &mut slice.endpoints {
                        if endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(true) {
                            endpoint.hints = None;
                        }
                    }
                    EndpointSlice { metadata: template.clone(), ..slice }
                })
                .collect(),
            Err(error) => {
                warn!(service = %key, "planning slices: {error}");
                return (Vec::new(), 0);
            }
        };
        let endpoints = desired.iter().map(|slice| slice.endpoints.len()).sum();
        (plan_writes(&key.name, Some(&template), &address_types(service), desired, &existing, max), endpoints)
    }

    async fn reconcile_dirty(&mut self, client: &Client) {
        let now = Instant::now();
        let due: Vec<ObjectKey> =
            self.retries.iter().filter(|(_, (at, _))| *at <= now).map(|(k, _)| k.clone()).collect();
        self.dirty.extend(due);
        if self.dirty.is_empty() {
            return;
        }
        let started = Instant::now();
        let keys: Vec<ObjectKey> = std::mem::take(&mut self.dirty).into_iter().collect();
        let mut jobs: Vec<(ObjectKey, Vec<Write>)> = Vec::new();
        for key in keys {
            let (writes, endpoints) = self.writes_for(&key);
            if endpoints == 0 && !self.services.objects.contains_key(&key) {
                self.desired.remove(&key);
            } else {
                self.desired.insert(key.clone(), endpoints);
            }
            if writes.is_empty() {
                self.retries.remove(&key);
                self.metrics.synced(true);
            } else {
                jobs.push((key, writes));
            }
        }
        let services = jobs.len();
        let results: Vec<(ObjectKey, Vec<Written>, Option<kube::Error>)> = futures::stream::iter(jobs)
            .map(|(key, writes)| {
                let api = Api::<EndpointSlice>::namespaced(client.clone(), &key.namespace);
                async move {
                    let (written, error) = execute(&api, writes).await;
                    (key, written, error)
                }
            })
            .buffer_unordered(CONCURRENT_WRITES)
            .collect()
            .await;
        let mut counts = [0usize; 3];
        for (key, written, error) in results {
            for write in written {
                match write {
                    Written::Created(slice) => {
                        counts[0] += 1;
                        self.slices.observe(slice);
                    }
                    Written::Updated(slice) => {
                        counts[1] += 1;
                        self.slices.observe(slice);
                    }
                    Written::Deleted(name, version) => {
                        counts[2] += 1;
                        let slice_key = ObjectKey::new(key.namespace.clone(), name);
                        self.slices.remove(&slice_key);
                        if let Some(version) = version {
                            self.slices.deleted.insert(slice_key, version);
                        }
                    }
                }
            }
            self.metrics.synced(error.is_none());
            match error {
                None => {
                    self.retries.remove(&key);
                }
                Some(error) => {
                    if matches!(&error, kube::Error::Api(status) if status.code == 409) {
                        self.metrics.conflict();
                    }
                    let attempts = self.retries.get(&key).map_or(0, |(_, n)| *n) + 1;
                    let delay = RETRY_FIRST.saturating_mul(1 << attempts.min(6)).min(RETRY_MAX);
                    warn!(service = %key, attempts, "writing EndpointSlices failed, retrying in {delay:?}: {error}");
                    self.retries.insert(key, (Instant::now() + delay, attempts));
                }
            }
        }
        let elapsed = started.elapsed();
        self.metrics.changed("create", counts[0]);
        self.metrics.changed("update", counts[1]);
        self.metrics.changed("delete", counts[2]);
        self.metrics.desired(self.desired.values().sum(), self.slices.by_key.len());
        if !self.reconciled_once {
            self.reconciled_once = true;
            info!(
                services = self.services.objects.len(),
                pods = self.pods.objects.len(),
                since_start_ms = self.started.elapsed().as_millis(),
                "initial sync done"
            );
        }
        info!(
            services,
            created = counts[0],
            updated = counts[1],
            deleted = counts[2],
            elapsed_ms = elapsed.as_millis(),
            "EndpointSlices written"
        );
    }
}

/// A write that went through, with what the API answered.
#[derive(Debug)]
enum Written {
    Created(EndpointSlice),
    Updated(EndpointSlice),
    /// The slice's name and, when the answer had it, its resourceVersion at deletion.
    Deleted(String, Option<u64>),
}

/// Runs one Service's writes in order, stopping at the first failure.
async fn execute(api: &Api<EndpointSlice>, writes: Vec<Write>) -> (Vec<Written>, Option<kube::Error>) {
    let mut written = Vec::with_capacity(writes.len());
    for write in writes {
        let result = match write {
            Write::Create(slice) => api.create(&PostParams::default(), &slice).await.map(Written::Created),
            Write::Update(slice) => {
                let name = slice.metadata.name.clone().unwrap_or_default();
                api.replace(&name, &PostParams::default(), &slice).await.map(Written::Updated)
            }
            Write::Delete(name) => match api.delete(&name, &DeleteParams::default()).await {
                Ok(answer) => {
                    let version = answer.left().and_then(|slice| resource_version(&slice.metadata));
                    Ok(Written::Deleted(name, version))
                }
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Written::Deleted(name, None)),
                Err(error) => Err(error),
            },
        };
        match result {
            Ok(done) => written.push(done),
            Err(error) => return (written, Some(error)),
        }
    }
    (written, None)
}

/// Helps tests and tools compare slices up to what differs between two controllers:
/// names, generated fields, and the managed-by label.
pub fn normalized(slice: &EndpointSlice) -> BTreeMap<String, serde_json::Value> {
    let mut labels = slice.metadata.labels.clone().unwrap_or_default();
    labels.remove(LABEL_MANAGED_BY);
    // Port order carries no meaning (upstream's differs between slices of one Service).
    let mut ports = slice.ports.clone().unwrap_or_default();
    ports.sort_by(|a, b| (&a.name, a.port, &a.protocol).cmp(&(&b.name, b.port, &b.protocol)));
    let mut endpoints = slice.endpoints.clone();
    endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    let owners: Vec<(String, String, String)> = slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
        .collect();
    BTreeMap::from([
        ("namespace".to_owned(), serde_json::json!(slice.metadata.namespace)),
        ("labels".to_owned(), serde_json::json!(labels)),
        ("owners".to_owned(), serde_json::json!(owners)),
        ("addressType".to_owned(), serde_json::json!(slice.address_type)),
        ("ports".to_owned(), serde_json::json!(ports)),
        ("endpoints".to_owned(), serde_json::json!(endpoints)),
    ])
}
