//! LoadBalancer address assignment against the API: watches Services and
//! `LoadBalancerIPPool`s (the CRD in `deploy/loadbalancer-pools.yaml`), settles every
//! address with `svcplane-controller`'s [`LbAllocator`] and writes what it decided:
//!
//! - each Service of ours: `status.loadBalancer.ingress` (one entry per address) and the
//!   condition [`SERVICE_CONDITION`] (`True`, reason `Assigned`, or `False` with the reason
//!   naming the cause: `PoolExhausted`, `NoPoolSelects`, `RequestedAddressOutsidePools`,
//!   `RequestedAddressInUse`, `InvalidRequest`), plus a Warning Event when a problem is new;
//! - a Service that stops being ours (type or class changed) and still carries the
//!   condition: ingress and condition removed, so its address is free;
//! - each pool: `status.conditions` (`Ready`, or `False` with `Conflict` / `InvalidSpec`),
//!   `status.size` and `status.used`.
//!
//! Nothing is written before both initial lists are complete. Assignments survive a
//! restart because the allocator starts from the ingress addresses in each Service's
//! status. What it does not do: announce the addresses (that is `svcplane announce`).

use std::collections::{BTreeMap, HashMap};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use svcplane_controller::ObjectKey;
use svcplane_controller::load_balancer::{
    LbAllocator, LbAssignment, POOL_GROUP, POOL_KIND, POOL_PLURAL, POOL_VERSION, Pool, PoolUse, SERVICE_CONDITION,
    ingress_ips, is_ours,
};
use tracing::{debug, info, warn};

use crate::controller::{ControllerMetrics, ControllerOptions, run_controller_with_metrics};
use crate::error::KubeError;
use crate::source::WatchBackoff;

/// The component name on Events.
pub const EVENT_COMPONENT: &str = "svcplane-lb-ipam";
const TICK: Duration = Duration::from_millis(100);

/// The pool CRD as a dynamic API resource.
pub fn pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(POOL_GROUP, POOL_VERSION, POOL_KIND), POOL_PLURAL)
}

#[allow(clippy::large_enum_variant, reason = "short-lived, one per watch event")]
enum Incoming {
    Service(Result<Event<Service>, watcher::Error>),
    Pool(Result<Event<DynamicObject>, watcher::Error>),
}

/// The objects of one kind, relists applied whole.
struct Store<K> {
    objects: BTreeMap<ObjectKey, K>,
    relist: Option<BTreeMap<ObjectKey, K>>,
    synced: bool,
}

impl<K: Resource + Clone> Store<K> {
    fn new() -> Self {
        Self { objects: BTreeMap::new(), relist: None, synced: false }
    }

    /// Applies one event; true when something may have changed.
    fn handle(&mut self, incoming: Result<Event<K>, watcher::Error>, kind: &str) -> bool {
        let event = match incoming {
            Ok(event) => event,
            Err(error) => {
                debug!(kind, "watch failed, retrying: {error}");
                return false;
            }
        };
        match event {
            Event::Apply(object) => {
                self.objects.insert(ObjectKey::of(object.meta()), object);
                true
            }
            Event::Delete(object) => self.objects.remove(&ObjectKey::of(object.meta())).is_some(),
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(object) => {
                self.relist.get_or_insert_with(BTreeMap::new).insert(ObjectKey::of(object.meta()), object);
                false
            }
            Event::InitDone => {
                self.objects = self.relist.take().unwrap_or_default();
                self.synced = true;
                true
            }
        }
    }
}

/// What was last written for a Service: (ingress, condition reason, message), so an
/// unchanged decision is not written again while the watch catches up.
type Written = (Vec<String>, String, String);

/// Runs address assignment until `stop` is set. API errors are logged and retried on the
/// next change (or within a few seconds).
pub async fn run_lb_ipam(client: Client, stop: Arc<AtomicBool>) -> Result<(), KubeError> {
    let resource = pool_resource();
    let mut streams: SelectAll<BoxStream<'static, Incoming>> = SelectAll::new();
    streams.push(
        watcher::watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
            .backoff(WatchBackoff::new())
            .map(Incoming::Service)
            .boxed(),
    );
    streams.push(
        watcher::watcher(Api::<DynamicObject>::all_with(client.clone(), &resource), watcher::Config::default())
            .backoff(WatchBackoff::new())
            .map(Incoming::Pool)
            .boxed(),
    );
    let mut streams = pin!(streams);
    let mut services: Store<Service> = Store::new();
    let mut pools: Store<DynamicObject> = Store::new();
    let mut allocator = LbAllocator::new();
    let mut written: HashMap<ObjectKey, Written> = HashMap::new();
    let mut pools_written: HashMap<String, Value> = HashMap::new();
    let mut dirty = false;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!("LoadBalancer address assignment: waiting for Services and {POOL_KIND}s");
    while !stop.load(Ordering::Acquire) {
        tokio::select! {
            incoming = streams.next() => {
                let Some(incoming) = incoming else { break };
                let mut handle = |incoming| match incoming {
                    Incoming::Service(event) => services.handle(event, "Service"),
                    Incoming::Pool(event) => pools.handle(event, POOL_KIND),
                };
                dirty |= handle(incoming);
                while let Some(Some(incoming)) = streams.next().now_or_never() {
                    dirty |= handle(incoming);
                }
            }
            _ = ticker.tick() => {}
        }
        if retry_at.is_some_and(|at| tokio::time::Instant::now() >= at) {
            retry_at = None;
            dirty = true;
        }
        if !(dirty && services.synced && pools.synced) {
            continue;
        }
        dirty = false;
        let failed =
            reconcile(&client, &resource, &services, &pools, &mut allocator, &mut written, &mut pools_written).await;
        if failed {
            retry_at = Some(tokio::time::Instant::now() + Duration::from_secs(2));
        }
    }
    Ok(())
}

/// The EndpointSlice controller and, with `--load-balancer-ipam`, address assignment beside it.
pub async fn run_controllers(
    client: Client,
    options: ControllerOptions,
    stop: Arc<AtomicBool>,
    metrics: Arc<ControllerMetrics>,
    lb_ipam: bool,
) -> Result<(), KubeError> {
    if !lb_ipam {
        return run_controller_with_metrics(client, options, stop, metrics).await;
    }
    info!("assigning LoadBalancer addresses from LoadBalancerIPPools");
    let slices = run_controller_with_metrics(client.clone(), options, Arc::clone(&stop), metrics);
    let addresses = run_lb_ipam(client, stop);
    let (slices, addresses) = tokio::join!(slices, addresses);
    slices.and(addresses)
}

/// One full pass; true when a write failed.
async fn reconcile(
    client: &Client,
    resource: &ApiResource,
    services: &Store<Service>,
    pools: &Store<DynamicObject>,
    allocator: &mut LbAllocator,
    written: &mut HashMap<ObjectKey, Written>,
    pools_written: &mut HashMap<String, Value>,
) -> bool {
    let mut valid = Vec::new();
    let mut invalid: BTreeMap<String, String> = BTreeMap::new();
    for object in pools.objects.values() {
        let name = object.name_any();
        let spec = object.data.get("spec").cloned().unwrap_or(Value::Null);
        match Pool::parse(&name, &spec) {
            Ok(pool) => valid.push(pool),
            Err(error) => {
                warn!("{error}");
                invalid.insert(name, format!("{}: {}", error.field, error.message));
            }
        }
    }
    let list: Vec<Service> = services.objects.values().cloned().collect();
    let outcome = allocator.allocate(&valid, &list);
    let mut failed = false;
    for (key, service) in &services.objects {
        let result = match outcome.services.get(key) {
            Some(assignment) => write_service(client, service, assignment, written.get(key)).await,
            None => release_service(client, service).await.map(|()| None),
        };
        match result {
            Ok(Some(now)) => {
                written.insert(key.clone(), now);
            }
            Ok(None) => {}
            Err(error) => {
                warn!(service = %key, "writing the LoadBalancer status failed: {error}");
                written.remove(key);
                failed = true;
            }
        }
    }
    written.retain(|key, _| services.objects.contains_key(key));
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    for object in pools.objects.values() {
        let name = object.name_any();
        let status = pool_status(outcome.pools.get(&name), invalid.get(&name), object.data.get("status"));
        if object.data.get("status") == Some(&status) || pools_written.get(&name) == Some(&status) {
            continue;
        }
        let patch = json!({ "status": status });
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                pools_written.insert(name, status);
            }
            Err(error) => {
                warn!(pool = %name, "writing the {POOL_KIND} status failed: {error}");
                failed = true;
            }
        }
    }
    let names: std::collections::BTreeSet<String> = pools.objects.values().map(ResourceExt::name_any).collect();
    pools_written.retain(|name, _| names.contains(name));
    failed
}

/// The pool's status: `Ready` True, or False with `Conflict` / `InvalidSpec`.
fn pool_status(use_: Option<&PoolUse>, invalid: Option<&String>, old: Option<&Value>) -> Value {
    let (status, reason, message, size, used) = match (use_, invalid) {
        (_, Some(message)) => ("False", "InvalidSpec", message.clone(), 0, 0),
        (Some(PoolUse { conflict: Some(conflict), size, .. }), _) => ("False", "Conflict", conflict.clone(), *size, 0),
        (Some(use_), _) => {
            ("True", "Ready", format!("{} of {} addresses assigned", use_.used, use_.size), use_.size, use_.used)
        }
        (None, None) => ("Unknown", "Pending", String::new(), 0, 0),
    };
    let old_condition = old.and_then(|s| s.get("conditions")).and_then(|c| c.get(0));
    let since = match old_condition {
        Some(c) if c.get("status").and_then(Value::as_str) == Some(status) => c.get("lastTransitionTime").cloned(),
        _ => None,
    }
    .unwrap_or_else(|| json!(now_seconds()));
    json!({
        "conditions": [{
            "type": "Ready", "status": status, "reason": reason, "message": message, "lastTransitionTime": since,
        }],
        "size": json_safe(size),
        "used": json_safe(used),
    })
}

/// Counts above 2^53 - 1 saturate there: a merge patch carries numbers as JSON doubles, and
/// the API server refuses a larger one for the schema's int64 (an IPv6 /64 has 2^64).
pub const MAX_STATUS_COUNT: u64 = (1 << 53) - 1;

fn json_safe(count: u128) -> u64 {
    u64::try_from(count).unwrap_or(u64::MAX).min(MAX_STATUS_COUNT)
}

fn now_seconds() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Writes a Service's ingress and condition when they differ; returns what it wrote.
async fn write_service(
    client: &Client,
    service: &Service,
    assignment: &LbAssignment,
    last: Option<&Written>,
) -> Result<Option<Written>, kube::Error> {
    let ingress: Vec<String> = assignment.ips().iter().map(ToString::to_string).collect();
    let (status, reason, message) = match assignment.problems.first() {
        None => ("True", "Assigned".to_owned(), assigned_message(assignment)),
        Some(problem) => {
            let messages: Vec<&str> = assignment.problems.iter().map(|p| p.message.as_str()).collect();
            ("False", problem.reason.as_str().to_owned(), messages.join("; "))
        }
    };
    let wanted: Written = (ingress.clone(), reason.clone(), message.clone());
    let current_ingress: Vec<String> = ingress_ips(service).iter().map(ToString::to_string).collect();
    let conditions = service.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let current = conditions.iter().find(|c| c.type_ == SERVICE_CONDITION);
    let in_object = current_ingress == ingress
        && current.is_some_and(|c| c.status == status && c.reason == reason && c.message == message);
    if in_object || last == Some(&wanted) {
        return Ok(None);
    }
    let key = ObjectKey::of(&service.metadata);
    let since = match current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(Timestamp::now()),
    };
    let mut new_conditions: Vec<Value> = conditions
        .iter()
        .filter(|c| c.type_ != SERVICE_CONDITION)
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .collect();
    new_conditions.push(json!({
        "type": SERVICE_CONDITION, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since, "observedGeneration": service.metadata.generation,
    }));
    let patch = json!({ "status": {
        "loadBalancer": { "ingress": ingress.iter().map(|ip| json!({"ip": ip, "ipMode": "VIP"})).collect::<Vec<_>>() },
        "conditions": new_conditions,
    }});
    let api = Api::<Service>::namespaced(client.clone(), &key.namespace);
    api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    if status == "True" {
        info!(service = %key, addresses = %ingress.join(","), "assigned LoadBalancer addresses");
    } else {
        warn!(service = %key, %reason, "{message}");
        let problem_is_new = current.is_none_or(|c| c.reason != reason || c.message != message);
        if problem_is_new && let Err(error) = emit_event(client, service, &reason, &message).await {
            warn!(service = %key, "writing an Event failed: {error}");
        }
    }
    Ok(Some(wanted))
}

fn assigned_message(assignment: &LbAssignment) -> String {
    let parts: Vec<String> = assignment.addresses.iter().map(|(ip, pool)| format!("{ip} from pool {pool}")).collect();
    parts.join(", ")
}

/// A Service that is no longer ours but carries our condition: clear ingress and condition.
async fn release_service(client: &Client, service: &Service) -> Result<(), kube::Error> {
    let conditions = service.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    if !conditions.iter().any(|c| c.type_ == SERVICE_CONDITION) || is_ours(service) {
        return Ok(());
    }
    let key = ObjectKey::of(&service.metadata);
    let rest: Vec<Value> = conditions
        .iter()
        .filter(|c| c.type_ != SERVICE_CONDITION)
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .collect();
    let patch = json!({ "status": { "loadBalancer": { "ingress": null }, "conditions": rest } });
    let api = Api::<Service>::namespaced(client.clone(), &key.namespace);
    api.patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    info!(service = %key, "released its LoadBalancer addresses (no longer a LoadBalancer of ours)");
    Ok(())
}

async fn emit_event(client: &Client, service: &Service, reason: &str, message: &str) -> Result<(), kube::Error> {
    let key = ObjectKey::of(&service.metadata);
    let now = Timestamp::now();
    let event = CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", key.name)),
            namespace: Some(key.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            uid: service.metadata.uid.clone(),
            resource_version: service.metadata.resource_version.clone(),
            ..ObjectReference::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some("Warning".into()),
        source: Some(EventSource { component: Some(EVENT_COMPONENT.into()), host: None }),
        reporting_component: Some(EVENT_COMPONENT.into()),
        reporting_instance: Some(EVENT_COMPONENT.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..CoreEvent::default()
    };
    Api::<CoreEvent>::namespaced(client.clone(), &key.namespace).create(&PostParams::default(), &event).await?;
    Ok(())
}
