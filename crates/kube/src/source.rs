//! Watching Services, EndpointSlices and (optionally) one Node, and handing the changes on
//! in batches.
//!
//! Each kind has its own kube-runtime watcher (list, then watch; relist when the watch
//! expires or the API server was gone; retries with a short backoff), its first list
//! streamed where the API server can ([`crate::initial_list`]). Per kind the source
//! remembers the `resourceVersion` of every object it has passed on:
//!
//! - an `Apply` whose resourceVersion was already passed on is dropped (no duplicates);
//! - a relist (`Init` .. `InitDone`) is buffered and, when complete, compared with what was
//!   passed on: objects that vanished meanwhile become deletions, new or changed ones
//!   upserts, unchanged ones nothing (no lost and no duplicate updates across restarts);
//! - several changes to one object before a batch leaves collapse into the last one.
//!
//! Nothing is sent until every kind has completed its first list: the first [`Batch`]
//! (`initial: true`) is the complete state, so a consumer never programs a partial view.
//! After that a batch leaves as soon as no further event is immediately ready.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use svcplane_controller::ObjectKey;
use svcplane_core::model::NamespacedName;
use tracing::{debug, info, warn};

use crate::access::ClusterAccess;
use crate::error::KubeError;
use crate::initial_list::watcher_streaming_first;

/// A Service or EndpointSlice with this label belongs to another proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// EndpointSlices of headless Services carry this label.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// How long to wait for the client to be built before giving up at startup.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the watch loop checks for a stop request.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// Watch errors with the same text are logged at most this often.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// What to watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Also watch this Node (the proxy's own, for its addresses and zone).
    pub node_name: Option<String>,
    /// Leave out, on the server side, what kube-proxy never handles: Services and slices
    /// labelled `service.kubernetes.io/service-proxy-name` and headless slices. DNS wants
    /// them, the proxy does not.
    pub proxy_filters: bool,
}

impl WatchOptions {
    /// What `svcplane proxy` on `node` needs.
    pub fn for_proxy(node: impl Into<String>) -> Self {
        Self { node_name: Some(node.into()), proxy_filters: true }
    }

    /// What cluster DNS needs: every Service and slice, no Node.
    pub fn for_dns() -> Self {
        Self { node_name: None, proxy_filters: false }
    }
}

/// One object's new state: what the watch kept of it, or `None` once deleted. By default
/// (see [`Keep::objects`]) that is the object itself without its `managedFields`.
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectChange<S = Box<Service>, E = Box<EndpointSlice>, N = Box<Node>> {
    Service(ObjectKey, Option<S>),
    Slice(ObjectKey, Option<E>),
    Node(String, Option<N>),
}

/// Changes that left together. Nodes come first, then Services, then slices.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch<S = Box<Service>, E = Box<EndpointSlice>, N = Box<Node>> {
    /// The first batch: the complete state after every initial list.
    pub initial: bool,
    pub changes: Vec<ObjectChange<S, E, N>>,
}

impl<S, E, N> Default for Batch<S, E, N> {
    fn default() -> Self {
        Self { initial: false, changes: Vec::new() }
    }
}

/// What the watch keeps of each object, decided the moment the object arrives: the API
/// object itself is dropped right after, so a consumer that needs only a compact form of
/// it (the proxy: the core's model) never holds a whole list of API objects, not even
/// while the initial lists are still being collected.
#[derive(Debug, Clone, Copy)]
pub struct Keep<S, E, N> {
    pub service: fn(Service) -> S,
    pub slice: fn(EndpointSlice) -> E,
    pub node: fn(Node) -> N,
}

impl Keep<Box<Service>, Box<EndpointSlice>, Box<Node>> {
    /// The objects themselves, less `metadata.managedFields` (often the largest part of
    /// an object, and nothing svcplane reads).
    pub fn objects() -> Self {
        Self {
            service: |mut object| {
                object.metadata.managed_fields = None;
                Box::new(object)
            },
            slice: |mut object| {
                object.metadata.managed_fields = None;
                Box::new(object)
            },
            node: |mut object| {
                object.metadata.managed_fields = None;
                Box::new(object)
            },
        }
    }
}

/// Starts watching on a thread of its own (with its own single-threaded runtime), sending
/// every batch to `sender` until `stop` is set or the receiver is gone. Fails when the
/// client cannot be built (unreadable kubeconfig, not in a Pod); an unreachable API server
/// is no failure: the watches retry until it answers.
pub fn spawn_watch<S, E, N>(
    access: &ClusterAccess,
    options: WatchOptions,
    keep: Keep<S, E, N>,
    sender: Sender<Batch<S, E, N>>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, KubeError>
where
    S: Send + 'static,
    E: Send + 'static,
    N: Send + 'static,
{
    let (ready, started) = mpsc::channel::<Result<(), KubeError>>();
    let access = access.clone();
    let handle = thread::Builder::new()
        .name("api-watch".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(source) => {
                    let _ = ready.send(Err(KubeError::StartRuntime { source }));
                    return;
                }
            };
            runtime.block_on(async move {
                let client = match access.client().await {
                    Ok(client) => client,
                    Err(error) => {
                        let _ = ready.send(Err(error));
                        return;
                    }
                };
                let _ = ready.send(Ok(()));
                info!(%access, "watching the Kubernetes API");
                watch(client, &options, keep, &sender, &stop).await;
            });
        })
        .map_err(|source| KubeError::StartRuntime { source })?;
    match started.recv_timeout(CONNECT_TIMEOUT) {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(error)) => {
            let _ = handle.join();
            Err(error)
        }
        Err(_) => Err(KubeError::StartRuntime {
            source: std::io::Error::new(std::io::ErrorKind::TimedOut, "the client was not built in time"),
        }),
    }
}

/// A short, capped exponential backoff, so a restarted API server is seen again within a
/// few seconds (kube-runtime's default waits up to 30 s).
#[derive(Debug, Clone)]
pub(crate) struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(4);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let current = self.next;
        self.next = (current * 2).min(Self::MAX);
        Some(current)
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[allow(clippy::large_enum_variant, reason = "short-lived, one per watch event; boxing would only add allocations")]
enum Incoming {
    Service(Result<Event<Service>, watcher::Error>),
    Slice(Result<Event<EndpointSlice>, watcher::Error>),
    Node(Result<Event<Node>, watcher::Error>),
}

fn stream_of<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    wrap: fn(Result<Event<K>, watcher::Error>) -> Incoming,
) -> BoxStream<'static, Incoming>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher_streaming_first(api, config, kind).backoff(WatchBackoff::new()).map(wrap).boxed()
}

async fn watch<S, E, N>(
    client: Client,
    options: &WatchOptions,
    keep: Keep<S, E, N>,
    sender: &Sender<Batch<S, E, N>>,
    stop: &AtomicBool,
) {
    let mut streams: SelectAll<BoxStream<'static, Incoming>> = SelectAll::new();
    let mut proxy_labels = watcher::Config::default();
    if options.proxy_filters {
        proxy_labels = proxy_labels.labels(&format!("!{SERVICE_PROXY_NAME_LABEL}"));
    }
    streams.push(stream_of(Api::<Service>::all(client.clone()), proxy_labels, "Service", Incoming::Service));
    let mut slice_labels = watcher::Config::default();
    if options.proxy_filters {
        slice_labels = slice_labels.labels(&format!("!{SERVICE_PROXY_NAME_LABEL},!{HEADLESS_LABEL}"));
    }
    streams.push(stream_of(Api::<EndpointSlice>::all(client.clone()), slice_labels, "EndpointSlice", Incoming::Slice));
    let mut state = WatchState::new(options.node_name.is_some(), keep);
    if let Some(node) = &options.node_name {
        let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
        streams.push(stream_of(Api::<Node>::all(client), config, "Node", Incoming::Node));
    }

    let mut ticker = tokio::time::interval(STOP_CHECK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut streams = pin!(streams);
    loop {
        tokio::select! {
            incoming = streams.next() => {
                let Some(incoming) = incoming else { return };
                state.handle(incoming);
                // Take everything that is already there before handing a batch on.
                while let Some(Some(incoming)) = streams.next().now_or_never() {
                    state.handle(incoming);
                }
                if let Some(batch) = state.take_batch()
                    && sender.send(batch).is_err()
                {
                    debug!("nobody listens for API changes any more; stopping");
                    return;
                }
            }
            _ = ticker.tick() => {}
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
    }
}

/// What one kind of object has passed on, and a relist in progress. `V` is what the
/// watch keeps of an object of kind `K` ([`Keep`]).
struct Tracker<K, V> {
    kind: &'static str,
    keep: fn(K) -> V,
    /// resourceVersion of every object passed on (or about to be, in `pending`), by name:
    /// the interned name the converted model holds too ([`NamespacedName::new`]), so that
    /// at 10k Services this bookkeeping is map entries, not 60k small allocations.
    known: HashMap<NamespacedName, Version>,
    /// A relist in progress: every object listed so far, and what was kept of those that
    /// are new or changed (with their resourceVersion).
    relist: Option<Relist<V>>,
    /// Changes not yet sent; `None` = deleted.
    pending: BTreeMap<ObjectKey, Option<V>>,
    lists: u32,
    last_error: Option<(String, Instant)>,
}

struct Relist<V> {
    listed: HashSet<NamespacedName>,
    changed: Vec<(ObjectKey, Version, V)>,
}

impl<V> Default for Relist<V> {
    fn default() -> Self {
        Self { listed: HashSet::new(), changed: Vec::new() }
    }
}

impl<K: Resource, V> Tracker<K, V> {
    fn new(kind: &'static str, keep: fn(K) -> V) -> Self {
        Self { kind, keep, known: HashMap::new(), relist: None, pending: BTreeMap::new(), lists: 0, last_error: None }
    }

    fn is_synced(&self) -> bool {
        self.lists > 0
    }

    /// Whether this resourceVersion of the object was already passed on.
    fn is_known(&self, key: &ObjectKey, version: &Version) -> bool {
        *version != Version::NONE && self.known.get(&name_of(key)).is_some_and(|known| known == version)
    }

    fn handle(&mut self, incoming: Result<Event<K>, watcher::Error>) {
        let event = match incoming {
            Ok(event) => event,
            Err(error) => {
                let text = error.to_string();
                let repeated = self
                    .last_error
                    .as_ref()
                    .is_some_and(|(last, at)| *last == text && at.elapsed() < ERROR_LOG_INTERVAL);
                if !repeated {
                    warn!(kind = self.kind, "watching the API failed, retrying: {text}");
                    self.last_error = Some((text, Instant::now()));
                }
                return;
            }
        };
        match event {
            Event::Apply(object) => {
                let (key, version) = identity(&object);
                if !self.is_known(&key, &version) {
                    let kept = (self.keep)(object);
                    self.apply(key, version, kept);
                }
            }
            Event::Delete(object) => {
                let key = ObjectKey::of(object.meta());
                if self.known.remove(&name_of(&key)).is_some() {
                    self.pending.insert(key, None);
                }
            }
            Event::Init => self.relist = Some(Relist::default()),
            Event::InitApply(object) => {
                let (key, version) = identity(&object);
                let known = self.is_known(&key, &version);
                let relist = self.relist.get_or_insert_with(Relist::default);
                relist.listed.insert(name_of(&key));
                if !known {
                    relist.changed.push((key, version, (self.keep)(object)));
                }
            }
            Event::InitDone => {
                let Relist { listed, changed } = self.relist.take().unwrap_or_default();
                let gone: Vec<NamespacedName> =
                    self.known.keys().filter(|key| !listed.contains(*key)).cloned().collect();
                let count = listed.len();
                drop(listed);
                for name in gone {
                    self.known.remove(&name);
                    self.pending.insert(ObjectKey::new(name.namespace.as_str(), name.name.as_str()), None);
                }
                for (key, version, kept) in changed {
                    self.apply(key, version, kept);
                }
                self.lists += 1;
                if self.lists > 1 {
                    info!(kind = self.kind, objects = count, "relisted");
                } else {
                    debug!(kind = self.kind, objects = count, "listed");
                }
                self.last_error = None;
            }
        }
    }

    fn apply(&mut self, key: ObjectKey, version: Version, kept: V) {
        self.known.insert(name_of(&key), version);
        self.pending.insert(key, Some(kept));
    }
}

/// The watch's name for an object: the interned [`NamespacedName`] (one allocation per
/// distinct text, shared with the model).
fn name_of(key: &ObjectKey) -> NamespacedName {
    NamespacedName::new(&key.namespace, &key.name)
}

/// A resourceVersion as the watch remembers it. The API server says it is opaque, but
/// etcd's are decimal numbers: those are kept as the number (no allocation), any other
/// text as it is. Only compared for equality.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Version {
    Number(u64),
    Text(Box<str>),
}

impl Version {
    /// An object without a resourceVersion: never counts as already passed on.
    const NONE: Self = Self::Number(u64::MAX);

    fn of(text: &str) -> Self {
        // Only the canonical spelling as a number, so that two texts are equal exactly
        // when their versions are ("07" and "7" stay different).
        let canonical = !text.is_empty()
            && text.bytes().all(|byte| byte.is_ascii_digit())
            && (text == "0" || !text.starts_with('0'));
        match text.parse::<u64>() {
            Ok(number) if canonical && number != u64::MAX => Self::Number(number),
            _ if text.is_empty() => Self::NONE,
            _ => Self::Text(text.into()),
        }
    }
}

fn identity<K: Resource>(object: &K) -> (ObjectKey, Version) {
    let meta = object.meta();
    (ObjectKey::of(meta), Version::of(meta.resource_version.as_deref().unwrap_or_default()))
}

struct WatchState<S, E, N> {
    services: Tracker<Service, S>,
    slices: Tracker<EndpointSlice, E>,
    nodes: Option<Tracker<Node, N>>,
    sent_initial: bool,
    started: Instant,
}

impl<S, E, N> WatchState<S, E, N> {
    fn new(watch_node: bool, keep: Keep<S, E, N>) -> Self {
        Self {
            services: Tracker::new("Service", keep.service),
            slices: Tracker::new("EndpointSlice", keep.slice),
            nodes: watch_node.then(|| Tracker::new("Node", keep.node)),
            sent_initial: false,
            started: Instant::now(),
        }
    }

    fn handle(&mut self, incoming: Incoming) {
        match incoming {
            Incoming::Service(event) => self.services.handle(event),
            Incoming::Slice(event) => self.slices.handle(event),
            Incoming::Node(event) => {
                if let Some(nodes) = &mut self.nodes {
                    nodes.handle(event);
                }
            }
        }
    }

    fn is_synced(&self) -> bool {
        self.services.is_synced() && self.slices.is_synced() && self.nodes.as_ref().is_none_or(Tracker::is_synced)
    }

    /// The pending changes as a batch, once every kind has listed; `None` when there is
    /// nothing to send (yet).
    fn take_batch(&mut self) -> Option<Batch<S, E, N>> {
        if !self.is_synced() {
            return None;
        }
        let initial = !self.sent_initial;
        let mut changes = Vec::new();
        if let Some(nodes) = &mut self.nodes {
            changes.extend(
                std::mem::take(&mut nodes.pending).into_iter().map(|(key, node)| ObjectChange::Node(key.name, node)),
            );
        }
        changes.extend(
            std::mem::take(&mut self.services.pending)
                .into_iter()
                .map(|(key, service)| ObjectChange::Service(key, service)),
        );
        changes.extend(
            std::mem::take(&mut self.slices.pending).into_iter().map(|(key, slice)| ObjectChange::Slice(key, slice)),
        );
        if changes.is_empty() && !initial {
            return None;
        }
        if initial {
            info!(
                services = self.services.known.len(),
                slices = self.slices.known.len(),
                elapsed_ms = self.started.elapsed().as_millis(),
                "initial lists complete"
            );
        }
        self.sent_initial = true;
        Some(Batch { initial, changes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn service(name: &str, version: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }
    }

    fn slice(name: &str, version: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..EndpointSlice::default()
        }
    }

    fn list<K>(objects: Vec<K>) -> Vec<Result<Event<K>, watcher::Error>> {
        let mut events = vec![Ok(Event::Init)];
        events.extend(objects.into_iter().map(|o| Ok(Event::InitApply(o))));
        events.push(Ok(Event::InitDone));
        events
    }

    fn names(batch: &Batch) -> Vec<String> {
        batch
            .changes
            .iter()
            .map(|change| match change {
                ObjectChange::Service(key, object) => format!("svc {} {}", key.name, object.is_some()),
                ObjectChange::Slice(key, object) => format!("slice {} {}", key.name, object.is_some()),
                ObjectChange::Node(name, object) => format!("node {name} {}", object.is_some()),
            })
            .collect()
    }

    #[test]
    fn nothing_is_sent_before_every_kind_has_listed_and_then_everything_at_once() {
        let mut state = WatchState::new(false, Keep::objects());
        for event in list(vec![service("web", "1"), service("api", "2")]) {
            state.handle(Incoming::Service(event));
        }
        assert_eq!(state.take_batch(), None, "slices have not listed yet");
        for event in list(vec![slice("web-1", "3")]) {
            state.handle(Incoming::Slice(event));
        }
        let batch = state.take_batch().expect("the initial batch");
        assert!(batch.initial);
        assert_eq!(names(&batch), ["svc api true", "svc web true", "slice web-1 true"]);
        assert_eq!(state.take_batch(), None);
    }

    #[test]
    fn an_empty_cluster_still_sends_an_initial_batch() {
        let mut state = WatchState::new(false, Keep::objects());
        for event in list(Vec::new()) {
            state.handle(Incoming::Service(event));
        }
        for event in list(Vec::new()) {
            state.handle(Incoming::Slice(event));
        }
        assert_eq!(state.take_batch(), Some(Batch { initial: true, changes: Vec::new() }));
    }

    #[test]
    fn a_relist_after_a_restart_reports_only_what_changed_meanwhile() {
        let mut state = WatchState::new(false, Keep::objects());
        for event in list(vec![service("kept", "1"), service("changed", "2"), service("deleted", "3")]) {
            state.handle(Incoming::Service(event));
        }
        for event in list(Vec::new()) {
            state.handle(Incoming::Slice(event));
        }
        state.take_batch();
        // The watch broke; the relist shows one object changed, one gone, one new.
        for event in list(vec![service("kept", "1"), service("changed", "7"), service("new", "8")]) {
            state.handle(Incoming::Service(event));
        }
        let batch = state.take_batch().expect("the relist's changes");
        assert!(!batch.initial);
        assert_eq!(names(&batch), ["svc changed true", "svc deleted false", "svc new true"]);
    }

    #[test]
    fn an_event_seen_twice_is_passed_on_once_and_changes_to_one_object_collapse() {
        let mut state = WatchState::new(false, Keep::objects());
        for event in list(Vec::new()) {
            state.handle(Incoming::Service(event));
        }
        for event in list(Vec::new()) {
            state.handle(Incoming::Slice(event));
        }
        state.take_batch();
        state.handle(Incoming::Service(Ok(Event::Apply(service("web", "5")))));
        state.handle(Incoming::Service(Ok(Event::Apply(service("web", "6")))));
        assert_eq!(names(&state.take_batch().unwrap()), ["svc web true"]);
        state.handle(Incoming::Service(Ok(Event::Apply(service("web", "6")))));
        assert_eq!(state.take_batch(), None, "the same resourceVersion again is no change");
        state.handle(Incoming::Service(Ok(Event::Delete(service("web", "6")))));
        state.handle(Incoming::Service(Ok(Event::Delete(service("web", "6")))));
        assert_eq!(names(&state.take_batch().unwrap()), ["svc web false"]);
        state.handle(Incoming::Service(Ok(Event::Delete(service("never-seen", "9")))));
        assert_eq!(state.take_batch(), None, "deleting what was never passed on is no change");
    }

    #[test]
    fn what_is_kept_of_an_object_leaves_its_managed_fields_behind() {
        let mut object = service("web", "1");
        object.metadata.managed_fields = Some(vec![Default::default()]);
        let kept = (Keep::objects().service)(object);
        assert_eq!(kept.metadata.managed_fields, None);
        assert_eq!(kept.metadata.name.as_deref(), Some("web"));
    }

    static KEPT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    #[test]
    fn each_object_is_kept_as_it_arrives_and_a_relist_keeps_only_what_changed() {
        let counting = Keep {
            service: |object: Service| {
                KEPT.fetch_add(1, Ordering::SeqCst);
                object.metadata.name.unwrap_or_default()
            },
            slice: |_: EndpointSlice| (),
            node: |_: Node| (),
        };
        let mut state = WatchState::new(false, counting);
        state.handle(Incoming::Service(Ok(Event::Init)));
        state.handle(Incoming::Service(Ok(Event::InitApply(service("web", "1")))));
        assert_eq!(KEPT.load(Ordering::SeqCst), 1, "kept while the list is still coming");
        state.handle(Incoming::Service(Ok(Event::InitApply(service("api", "2")))));
        state.handle(Incoming::Service(Ok(Event::InitDone)));
        for event in list(Vec::new()) {
            state.handle(Incoming::Slice(event));
        }
        let batch = state.take_batch().expect("the initial batch");
        let kept: Vec<_> = batch
            .changes
            .iter()
            .filter_map(|change| match change {
                ObjectChange::Service(_, kept) => kept.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(kept, ["api", "web"]);
        // A relist with one object unchanged converts only the changed one.
        for event in list(vec![service("web", "1"), service("api", "3")]) {
            state.handle(Incoming::Service(event));
        }
        assert_eq!(KEPT.load(Ordering::SeqCst), 3);
        let batch = state.take_batch().expect("the relist's change");
        assert_eq!(
            batch.changes,
            [ObjectChange::Service(
                ObjectKey { namespace: "default".into(), name: "api".into() },
                Some("api".to_owned())
            )]
        );
    }

    #[test]
    fn resource_versions_are_equal_exactly_when_their_texts_are() {
        for (one, other) in [("7", "07"), ("0", "00"), ("123", "124"), ("18446744073709551615", "")] {
            assert_ne!(Version::of(one), Version::of(other), "{one:?} vs {other:?}");
        }
        for text in ["0", "42", "07", "abc-1", "18446744073709551615", "99999999999999999999999"] {
            let copy = String::from(text);
            assert_eq!(Version::of(text), Version::of(&copy), "a version does not depend on where its text lives");
        }
        assert_eq!(Version::of("42"), Version::Number(42));
        assert_eq!(Version::of(""), Version::NONE);
    }

    #[test]
    fn the_watch_remembers_an_object_by_the_name_the_model_holds() {
        let key = ObjectKey { namespace: "default".into(), name: "watch-name-sharing".into() };
        let model = NamespacedName::new("default", "watch-name-sharing");
        let remembered = name_of(&key);
        assert_eq!(remembered, model);
        assert!(std::ptr::eq(remembered.name.as_str(), model.name.as_str()), "one allocation for both");
    }

    #[test]
    fn the_proxy_waits_for_its_node_too() {
        let mut state = WatchState::new(true, Keep::objects());
        for event in list(Vec::new()) {
            state.handle(Incoming::Service(event));
        }
        for event in list(Vec::new()) {
            state.handle(Incoming::Slice(event));
        }
        assert_eq!(state.take_batch(), None);
        let node = Node {
            metadata: ObjectMeta {
                name: Some("node1".into()),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        for event in list(vec![node]) {
            state.handle(Incoming::Node(event));
        }
        assert_eq!(names(&state.take_batch().unwrap()), ["node node1 true"]);
    }
}
