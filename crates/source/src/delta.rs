//! The controller step of the proxy's manifests feed, in proportion to what changed.
//!
//! [`DeltaState`] takes the objects whose definition changed (from the store) and works out
//! which Services they touch: a changed Service itself; every Service whose selector matches
//! a changed Pod's labels, before or after the change (Pods and Service selectors are both
//! indexed by namespace and label, so finding them costs the Pod's labels, not the cluster);
//! every Service when a Node changes (zones). Only those are allocated again
//! ([`Allocator::allocate_changed`]: everyone else keeps what they hold; handed over in the
//! order of a complete read, path then document, since two Services asking for one ClusterIP
//! are settled by that order), planned
//! ([`plan_slice_shapes_from`]) and converted; the result is a [`PartialSnapshot`] for the differ.
//! LoadBalancer pools are the exception: with any pool present, a Service or pool change
//! assigns load balancer addresses over all Services, as [`svcplane_controller::reconcile`]
//! does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use svcplane_controller::load_balancer::LoadBalancerIPPool;
use svcplane_controller::{
    Allocator, ControllerError, ObjectKey, PlannedSlice, ServiceSlices, assign_load_balancers, is_managed_by_us,
    plan_slice_shapes_from,
};
use svcplane_core::model::NamespacedName;

use crate::FastMap;
use crate::convert::{
    FieldError, new_slice_address_errors, node_to_core, planned_slice_to_core, service_to_core, slice_to_core,
};
use crate::diff::PartialSnapshot;
use crate::held::{HeldPod, NamedPod, ServiceRecord};
use crate::manifests::{AnyObject, ObjectKind, ObjectRef};
use crate::named_table::name_hash;
use crate::postings::Postings;
use crate::store::{DefinitionOrder, Held, Key, ManifestStore, ObjectChange};

/// `(namespace, label key, label value)` hashed: a posting-list key. A collision only adds
/// candidates, which the full selector check then drops.
fn label_key(namespace: &str, key: &str, value: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0).hash_one((namespace, key, value))
}

/// What the incremental controller remembers between edits.
#[derive(Debug, Default)]
pub(crate) struct DeltaState {
    services: BTreeMap<Key, Arc<ServiceRecord>>,
    // No map of the Pods: the store holds them (a second map of 100k names was 2.2 MB).
    nodes: BTreeMap<Key, Arc<AnyObject>>,
    /// The Nodes as the slice planner wants them (zones), rebuilt when one changes.
    node_list: Vec<Node>,
    pools: BTreeMap<Key, Arc<AnyObject>>,
    /// EndpointSlices written by hand (not ours).
    slices: BTreeMap<Key, Arc<AnyObject>>,
    /// Pods by `(namespace, key, value)` of each label.
    pods_by_label: Postings<u64>,
    /// Services with a selector by `(namespace, key, value)` of their selector's first label.
    services_by_selector: Postings<Key>,
    /// Services as allocated: what the allocator wrote into each (see [`Allocated`]).
    allocated: FastMap<Key, Allocated>,
    /// With LoadBalancerIPPools: every allocated Service after load balancer assignment.
    with_load_balancers: FastMap<Key, Box<Service>>,
    /// Services refused by the allocator or the planner, with why.
    refused: BTreeMap<Key, Vec<ControllerError>>,
    load_balancer_problems: Vec<String>,
    /// The core names of the slices generated for each Service (sized to them: a `Vec`
    /// grown by pushes held room for four, 128 bytes a Service where one name takes 32).
    generated: FastMap<Key, Box<[NamespacedName]>>,
    /// Whether the allocator has had its first, full pass.
    allocated_once: bool,
    /// Conversion problems, by the Service (with its generated slices) or hand-written slice.
    convert_errors: BTreeMap<Key, Vec<FieldError>>,
}

/// A Service as allocated, kept as what the allocator wrote into the Service as read (its
/// ClusterIPs, families, family policy, node ports, namespace) rather than as a second
/// whole `k8s-openapi` Service: at 10k Services the second copies (with their selector
/// maps) were ~20 MB. The fields are kept as their JSON text, one allocation of ~150 bytes
/// a Service: as a struct of strings and lists they were nine allocations (~420 bytes of
/// malloc chunks), 90k of them at 10k Services. Kept whole when the fields do not give
/// back exactly the allocated Service (the allocator writing something else).
#[derive(Debug)]
enum Allocated {
    /// `serde_json` of the [`AllocatedFields`]; decodes to them (checked when made).
    Fields(Box<[u8]>),
    Whole(Box<Service>),
}

/// Field names are one or two letters and absent fields are left out: the text is only
/// ever read back by this struct, and 10k of them are held (~100 bytes each, against
/// ~190 with the full names and every `null`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct AllocatedFields {
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    /// `None`: the allocated Service has no `spec` (the fields below are then unused).
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    spec: Option<SpecFields>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct SpecFields {
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    cluster_ip: Option<String>,
    #[serde(rename = "cs", default, skip_serializing_if = "Option::is_none")]
    cluster_ips: Option<Vec<String>>,
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    ip_families: Option<Vec<String>>,
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    ip_family_policy: Option<String>,
    #[serde(rename = "np", default, skip_serializing_if = "Vec::is_empty")]
    node_ports: Vec<Option<i32>>,
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    health_check_node_port: Option<i32>,
}

impl AllocatedFields {
    fn of(filled: &Service) -> Self {
        Self {
            namespace: filled.metadata.namespace.clone(),
            spec: filled.spec.as_ref().map(|spec| SpecFields {
                cluster_ip: spec.cluster_ip.clone(),
                cluster_ips: spec.cluster_ips.clone(),
                ip_families: spec.ip_families.clone(),
                ip_family_policy: spec.ip_family_policy.clone(),
                node_ports: spec.ports.iter().flatten().map(|port| port.node_port).collect(),
                health_check_node_port: spec.health_check_node_port,
            }),
        }
    }

    fn apply(&self, original: Service) -> Service {
        let mut service = original;
        service.metadata.namespace.clone_from(&self.namespace);
        if let Some(fields) = &self.spec {
            let spec = service.spec.get_or_insert_with(Default::default);
            spec.cluster_ip.clone_from(&fields.cluster_ip);
            spec.cluster_ips.clone_from(&fields.cluster_ips);
            spec.ip_families.clone_from(&fields.ip_families);
            spec.ip_family_policy.clone_from(&fields.ip_family_policy);
            for (port, node_port) in spec.ports.iter_mut().flatten().zip(&fields.node_ports) {
                port.node_port = *node_port;
            }
            spec.health_check_node_port = fields.health_check_node_port;
        }
        service
    }
}

impl Allocated {
    #[cfg(test)]
    fn new(filled: Service, original: Option<&Service>) -> Self {
        let fields = AllocatedFields::of(&filled);
        match original {
            Some(original) => Self::with_fields(fields, filled, original.clone()),
            None => Allocated::Whole(Box::new(filled)),
        }
    }

    /// `filled` (allocated from `original`) as `fields` (made from it), or whole when the
    /// fields do not give it back exactly.
    fn with_fields(fields: AllocatedFields, filled: Service, original: Service) -> Self {
        match serde_json::to_vec(&fields) {
            Ok(text)
                if serde_json::from_slice::<AllocatedFields>(&text).is_ok_and(|decoded| decoded == fields)
                    && fields.apply(original) == filled =>
            {
                Allocated::Fields(text.into_boxed_slice())
            }
            _ => Allocated::Whole(Box::new(filled)),
        }
    }

    /// The allocated Service, given the Service as read it was allocated from.
    fn service(&self, original: Option<Service>) -> Option<Service> {
        match self {
            Allocated::Fields(text) => {
                let fields: AllocatedFields = serde_json::from_slice(text)
                    .expect("an allocated Service's fields decode (checked when they were kept)");
                original.map(|original| fields.apply(original))
            }
            Allocated::Whole(service) => Some(Service::clone(service)),
        }
    }
}

/// From how many affected Services a step plans them on two threads (a first read at 10k
/// Services planned 10k in ~0.3 s on one).
const PARALLEL_PUBLISH_THRESHOLD: usize = 1_000;

/// One Service as planned and converted, before it is handed over: its core form (`None`
/// when it is not published: refused, or nothing to program), its generated slices that
/// converted cleanly, and what was wrong.
#[derive(Debug, Default)]
struct PlannedService {
    service: Option<svcplane_core::model::Service>,
    slices: Vec<svcplane_core::model::EndpointSlice>,
    errors: Vec<FieldError>,
    refused: Option<ControllerError>,
}

impl PlannedService {
    /// Converts one of the Service's planned slices: as planned, or written as the object
    /// first where the conversion has something to say about it (see
    /// [`planned_slice_to_core`]).
    fn add_slice(&mut self, slices: &ServiceSlices<'_>, shape: &PlannedSlice<'_>) {
        if let Some(core) = planned_slice_to_core(slices, shape) {
            self.slices.push(core);
            return;
        }
        let slice = slices.endpoint_slice(shape);
        let strict = new_slice_address_errors(&slice);
        match slice_to_core(&slice) {
            Ok(Some(core)) if strict.is_empty() => self.slices.push(core),
            Ok(_) => self.errors.extend(strict),
            Err(found) => {
                self.errors.extend(found);
                self.errors.extend(strict);
            }
        }
    }
}

/// What one step produced.
#[derive(Debug, Default)]
pub(crate) struct DeltaOutput {
    pub(crate) partial: PartialSnapshot,
    pub(crate) allocations_changed: bool,
    /// How many Services were allocated, planned and converted again.
    pub(crate) services_touched: usize,
}

impl DeltaState {
    /// Takes the changed objects into account and returns what the core must learn.
    /// `store` is the store the changes came from, after them (for the order of definitions).
    pub(crate) fn apply(
        &mut self,
        changes: Vec<ObjectChange>,
        store: &ManifestStore,
        allocator: &mut Allocator,
    ) -> DeltaOutput {
        let mut output = DeltaOutput::default();
        let mut affected: BTreeSet<Key> = BTreeSet::new();
        let mut services_changed: BTreeSet<Key> = BTreeSet::new();
        let mut slices_changed: Vec<Key> = Vec::new();
        let mut nodes_changed: Vec<Key> = Vec::new();
        let mut pools_changed = false;
        let mut pods_changed: Vec<ObjectChange> = Vec::new();
        for (name, old, new) in changes {
            if name.kind == ObjectKind::Pod {
                // Pods are filed by the hash of their name: the store keeps the name.
                let hash = name_hash(&name);
                if let Some(pod) = old.as_ref().and_then(Held::as_pod) {
                    for (key, value) in pod.labels() {
                        self.pods_by_label.remove(label_key(&name.namespace, key, value), &hash);
                    }
                }
                if let Some(pod) = new.as_ref().and_then(Held::as_pod) {
                    for (key, value) in pod.labels() {
                        self.pods_by_label.insert(label_key(&name.namespace, key, value), hash);
                    }
                }
                pods_changed.push((name, old, new));
                continue;
            }
            let reference: Key = Arc::new(name);
            match reference.kind {
                ObjectKind::Service => {
                    let old = match new.as_ref().and_then(Held::shared_service) {
                        Some(service) => self.services.insert(reference.clone(), service),
                        None => self.services.remove(&reference),
                    };
                    if let Some(old) = old {
                        self.unindex_service(&reference, &old);
                    }
                    if let Some(service) = new.as_ref().and_then(Held::as_service) {
                        self.index_service(&reference, service);
                    }
                    services_changed.insert(reference);
                }
                ObjectKind::Pod => unreachable!("Pods are handled above"),
                ObjectKind::Node => {
                    match new.and_then(Held::into_other) {
                        Some(object) => self.nodes.insert(reference.clone(), object),
                        None => self.nodes.remove(&reference),
                    };
                    nodes_changed.push(reference);
                }
                ObjectKind::EndpointSlice => {
                    match new.and_then(Held::into_other) {
                        Some(object) => self.slices.insert(reference.clone(), object),
                        None => self.slices.remove(&reference),
                    };
                    slices_changed.push(reference);
                }
                ObjectKind::LoadBalancerIPPool => {
                    match new.and_then(Held::into_other) {
                        Some(object) => self.pools.insert(reference, object),
                        None => self.pools.remove(&reference),
                    };
                    pools_changed = true;
                }
            }
        }

        // The Services selecting a changed Pod, before or after, are planned again. Looked up
        // once the Services of this step are indexed: a Service whose selector changed is
        // planned anyway, and the others select as they did. When every Service changed (a
        // first read), all are planned and the lookup is skipped.
        let unchanged_services = self.services.keys().any(|key| !services_changed.contains(key));
        if unchanged_services {
            for (reference, old, new) in &pods_changed {
                for pod in [old.as_ref(), new.as_ref()].into_iter().flatten().filter_map(Held::as_pod) {
                    self.services_selecting(&reference.namespace, pod, &mut affected);
                }
            }
        }
        drop(pods_changed);

        if !nodes_changed.is_empty() {
            self.node_list = self.nodes.values().filter_map(|o| o.as_node()).cloned().collect();
            for reference in &nodes_changed {
                match self.nodes.get(reference).and_then(|o| o.as_node()) {
                    Some(node) => output.partial.nodes.push(node_to_core(node)),
                    None => output.partial.deleted_nodes.push(reference.name.to_string()),
                }
            }
            // Zones feed every Service's endpoint hints.
            affected.extend(self.services.keys().cloned());
        }

        // Allocation: the changed Services, and the refused ones again (they may fit now).
        let retried: Vec<Key> = self.refused.keys().filter(|r| !services_changed.contains(*r)).cloned().collect();
        if !services_changed.is_empty() || !retried.is_empty() {
            // Each Service decoded from its record once here: the allocator reads it, and the
            // allocated Service is then kept as what the allocator wrote into it.
            let mut settle: Vec<(Option<DefinitionOrder<'_>>, Key, Service)> = Vec::new();
            let mut removed: Vec<ObjectKey> = Vec::new();
            for reference in services_changed.iter().chain(&retried) {
                match self.services.get(reference).map(Arc::as_ref) {
                    Some(service) => settle.push((store.order_of(reference), Arc::clone(reference), service.service())),
                    None => {
                        removed.push(ObjectKey::new(&*reference.namespace, &*reference.name));
                        self.allocated.remove(reference);
                        self.with_load_balancers.remove(reference);
                        self.refused.remove(reference);
                    }
                }
            }
            // In the order of a complete read (path, document, object), not by name: the
            // allocator gives a ClusterIP asked for by two Services to the first one it
            // sees, and a complete read shows them in that order.
            settle.sort_by(|a, b| a.0.cmp(&b.0));
            let (keys, settle): (Vec<Key>, Vec<Service>) =
                settle.into_iter().map(|(_, key, service)| (key, service)).unzip();
            // The first time, every Service is here: a full pass also releases what a restored
            // record holds for Services that are gone.
            let outcome = if std::mem::replace(&mut self.allocated_once, true) {
                allocator.allocate_changed(&settle, &removed)
            } else {
                allocator.allocate(&settle)
            };
            output.allocations_changed = outcome.changed;
            for ((reference, original), result) in keys.into_iter().zip(settle).zip(outcome.services) {
                match result {
                    Ok(filled) => {
                        self.refused.remove(&reference);
                        let fields = AllocatedFields::of(&filled);
                        self.allocated.insert(reference, Allocated::with_fields(fields, filled, original));
                    }
                    Err(errors) => {
                        self.allocated.remove(&reference);
                        self.with_load_balancers.remove(&reference);
                        self.refused.insert(reference, errors);
                    }
                }
            }
            affected.extend(services_changed.iter().cloned());
            affected.extend(retried);
        }

        if pools_changed || (!self.pools.is_empty() && !services_changed.is_empty()) {
            let pools: Vec<LoadBalancerIPPool> = self.pools.values().filter_map(|o| o.as_pool()).cloned().collect();
            let mut references: Vec<Key> = self.allocated.keys().cloned().collect();
            references.sort_unstable();
            let mut services: Vec<Service> = references.iter().filter_map(|r| self.allocated_service(r)).collect();
            self.load_balancer_problems =
                if pools.is_empty() { Vec::new() } else { assign_load_balancers(&pools, &mut services, allocator) };
            let mut with_load_balancers = FastMap::default();
            for (reference, service) in references.into_iter().zip(services) {
                let before = match self.with_load_balancers.get(&reference) {
                    Some(assigned) => Some(Service::clone(assigned)),
                    None => self.allocated_service(&reference),
                };
                if before.as_ref() != Some(&service) {
                    affected.insert(reference.clone());
                }
                if !pools.is_empty() {
                    with_load_balancers.insert(reference, Box::new(service));
                }
            }
            self.with_load_balancers = with_load_balancers;
        }

        output.services_touched = affected.len();
        self.publish_services(&affected, store, &mut output.partial);
        for reference in slices_changed {
            self.publish_slice(&reference, &mut output.partial);
        }
        output
    }

    /// Plans and converts the `affected` Services (on two threads when there are many: the
    /// first read plans every Service) and hands them over in key order.
    fn publish_services(&mut self, affected: &BTreeSet<Key>, store: &ManifestStore, partial: &mut PartialSnapshot) {
        let references: Vec<&Key> = affected.iter().collect();
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).min(2);
        let planned: Vec<PlannedService> = if threads > 1 && references.len() >= PARALLEL_PUBLISH_THRESHOLD {
            let (first, second) = references.split_at(references.len() / 2);
            let this = &*self;
            std::thread::scope(|scope| {
                let other = scope.spawn(move || second.iter().map(|r| this.plan_service(r, store)).collect::<Vec<_>>());
                let mut planned: Vec<PlannedService> = first.iter().map(|r| this.plan_service(r, store)).collect();
                match other.join() {
                    Ok(rest) => planned.extend(rest),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
                planned
            })
        } else {
            references.iter().map(|r| self.plan_service(r, store)).collect()
        };
        for (reference, planned) in references.into_iter().zip(planned) {
            self.record_service(reference, planned, partial);
        }
    }

    /// Plans and converts one Service and its generated slices, reading the state only.
    fn plan_service(&self, reference: &Key, store: &ManifestStore) -> PlannedService {
        let mut planned = PlannedService::default();
        let service = match self.with_load_balancers.get(reference) {
            Some(assigned) => Some(Service::clone(assigned)),
            None => self.allocated_service(reference),
        };
        let Some(service) = &service else { return planned };
        let candidates = self.candidates(reference, service, store);
        match plan_slice_shapes_from(service, &candidates, &self.node_list) {
            Err(error) => planned.refused = Some(error),
            Ok(slices) => {
                match service_to_core(service) {
                    Ok(core) => planned.service = core,
                    Err(found) => planned.errors.extend(found),
                }
                if let Some(slices) = &slices {
                    for shape in slices.slices() {
                        planned.add_slice(slices, shape);
                    }
                }
            }
        }
        planned
    }

    /// Hands over one planned Service and its generated slices (or their removal) and
    /// remembers what was generated and what was wrong.
    fn record_service(&mut self, reference: &Key, planned: PlannedService, partial: &mut PartialSnapshot) {
        let PlannedService { service, slices, errors, refused } = planned;
        self.convert_errors.remove(reference);
        if let Some(error) = refused {
            self.refused.insert(reference.clone(), vec![error]);
        }
        let old_slices = self.generated.remove(reference).unwrap_or_default();
        match service {
            Some(core) => partial.services.push(core),
            None => partial.deleted_services.push(NamespacedName::new(&*reference.namespace, &*reference.name)),
        }
        let new_slices: Vec<NamespacedName> = slices.iter().map(|slice| slice.name.clone()).collect();
        partial.slices.extend(slices);
        partial.deleted_slices.extend(old_slices.into_iter().filter(|old| !new_slices.contains(old)));
        if !new_slices.is_empty() {
            self.generated.insert(reference.clone(), new_slices.into_boxed_slice());
        }
        if !errors.is_empty() {
            self.convert_errors.insert(reference.clone(), errors);
        }
    }

    /// Converts and hands over one hand-written slice (or its removal).
    fn publish_slice(&mut self, reference: &Key, partial: &mut PartialSnapshot) {
        self.convert_errors.remove(reference);
        let slice = self.slices.get(reference).and_then(|o| o.as_slice()).filter(|slice| !is_managed_by_us(slice));
        let mut published = false;
        if let Some(slice) = slice {
            let strict = new_slice_address_errors(slice);
            let mut errors = Vec::new();
            match slice_to_core(slice) {
                Ok(Some(core)) if strict.is_empty() => {
                    partial.slices.push(core);
                    published = true;
                }
                Ok(_) => errors = strict,
                Err(mut found) => {
                    found.extend(strict);
                    errors = found;
                }
            }
            if !errors.is_empty() {
                self.convert_errors.insert(reference.clone(), errors);
            }
        }
        if !published {
            partial.deleted_slices.push(NamespacedName::new(&*reference.namespace, &*reference.name));
        }
    }

    /// The Service `reference` as the allocator filled it in, if it was allocated.
    fn allocated_service(&self, reference: &Key) -> Option<Service> {
        let allocated = self.allocated.get(reference)?;
        allocated.service(self.services.get(reference).map(Arc::as_ref).map(ServiceRecord::service))
    }

    /// The Pods that may be selected by `service` (those with its selector's first label),
    /// as the planner reads them: the store's records under their names.
    fn candidates<'a>(
        &'a self,
        reference: &ObjectRef,
        service: &Service,
        store: &'a ManifestStore,
    ) -> Vec<NamedPod<'a>> {
        let Some((key, value)) = service.spec.as_ref().and_then(|spec| spec.selector.as_ref()?.iter().next()) else {
            return Vec::new();
        };
        // A name hash can stand for more than one Pod (names that collide), here or in
        // another namespace: the namespace is checked here, the selector by the planner.
        self.pods_by_label
            .distinct(label_key(&reference.namespace, key, value))
            .into_iter()
            .flat_map(|&hash| store.pods_with_hash(hash))
            .filter(|(name, _)| name.namespace == reference.namespace)
            .map(|(name, pod)| NamedPod { namespace: &name.namespace, name: &name.name, pod })
            .collect()
    }

    fn index_service(&mut self, reference: &Key, service: &ServiceRecord) {
        if let Some((key, value)) = service.first_selector_label() {
            self.services_by_selector.insert(label_key(&reference.namespace, key, value), Key::clone(reference));
        }
    }

    fn unindex_service(&mut self, reference: &Key, service: &ServiceRecord) {
        if let Some((key, value)) = service.first_selector_label() {
            self.services_by_selector.remove(label_key(&reference.namespace, key, value), reference);
        }
    }

    /// Adds the Services of `namespace` whose selector matches the labels of `pod`.
    fn services_selecting(&self, namespace: &str, pod: &HeldPod, found: &mut BTreeSet<Key>) {
        for (key, value) in pod.labels() {
            for reference in self.services_by_selector.distinct(label_key(namespace, key, value)) {
                let selector = self.services.get(reference).map(Arc::as_ref).and_then(ServiceRecord::selector);
                if selector.is_some_and(|selector| selector.iter().all(|(k, v)| pod.label(k) == Some(&**v))) {
                    found.insert(reference.clone());
                }
            }
        }
    }

    /// The controller's and the converter's problems, one line each, naming the file.
    pub(crate) fn problems(&self, store: &ManifestStore) -> Vec<String> {
        let mut problems = Vec::new();
        for errors in self.refused.values() {
            for error in errors {
                let object = ObjectRef::new(ObjectKind::Service, &error.service().namespace, &error.service().name);
                match store.position_of(&object) {
                    Some(position) => problems.push(format!("{}: {error}", position.file.display())),
                    None => problems.push(error.to_string()),
                }
            }
        }
        problems.extend(self.load_balancer_problems.iter().cloned());
        for errors in self.convert_errors.values() {
            let origin = errors.first().and_then(|e| store.position_of(&e.object));
            for error in errors {
                let mut error = error.clone();
                error.origin.clone_from(&origin);
                problems.push(error.to_string());
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    use std::fs;
    use std::time::Duration;

    use svcplane_controller::{AllocatorConfig, NodePortRange};
    use svcplane_core::Change;

    use crate::feed::{ManifestsFeed, ManifestsSettings};
    use crate::manifests::tests::TempDir;

    fn feed(dir: &TempDir) -> ManifestsFeed {
        ManifestsFeed::new(ManifestsSettings {
            dir: dir.0.clone(),
            allocator: AllocatorConfig {
                service_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
                node_port_range: NodePortRange::DEFAULT,
            },
            allocations_file: None,
            saves_allocations: false,
        })
        .unwrap()
    }

    #[test]
    fn an_allocated_service_is_kept_as_the_fields_the_allocator_wrote_and_rebuilt_exactly() {
        let original: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}
        }))
        .unwrap();
        let mut allocator = svcplane_controller::Allocator::new(AllocatorConfig {
            service_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
            node_port_range: NodePortRange::DEFAULT,
        })
        .unwrap();
        let filled = allocator.allocate(std::slice::from_ref(&original)).services.remove(0).unwrap();
        let spec = filled.spec.as_ref().unwrap();
        assert!(spec.cluster_ip.is_some() && spec.health_check_node_port.is_some(), "{spec:?}");
        assert!(spec.ports.iter().flatten().all(|port| port.node_port.is_some()), "{spec:?}");
        let kept = super::Allocated::new(filled.clone(), Some(&original));
        let super::Allocated::Fields(text) = &kept else { panic!("kept as fields, not whole") };
        assert!(text.len() <= 120, "short field names, no nulls: {}", String::from_utf8_lossy(text));
        assert_eq!(kept.service(Some(original)), Some(filled.clone()));
        let without_original = super::Allocated::new(filled.clone(), None);
        assert!(matches!(without_original, super::Allocated::Whole(_)));
        assert_eq!(without_original.service(None), Some(filled));
    }

    /// Services `first..first + count`, each with two Pods; Pod 0 of `moved` gets `address`.
    fn part(first: usize, count: usize, moved: Option<(usize, &str)>) -> String {
        let mut text = String::new();
        for s in first..first + count {
            let cluster_ip = if s % 3 == 0 { String::new() } else { format!("\n  clusterIP: 198.19.1.{s}") };
            writeln!(
                text,
                "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: lab}}\nspec:{cluster_ip}\n  selector: {{app: svc-{s}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n---"
            )
            .unwrap();
            for e in 0..2 {
                let ip = match moved {
                    Some((service, address)) if service == s && e == 0 => address.to_owned(),
                    _ => format!("198.18.{s}.{}", e + 1),
                };
                writeln!(
                    text,
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: svc-{s}-{e}, namespace: lab, labels: {{app: svc-{s}}}}}\nspec: {{nodeName: node-1, containers: [{{name: app, image: app}}]}}\nstatus:\n  podIP: {ip}\n  conditions: [{{type: Ready, status: 'True'}}]\n---"
                )
                .unwrap();
            }
        }
        text
    }

    /// Writes after a pause, so that the edit shows in the file's times.
    fn write(dir: &TempDir, name: &str, text: &str) {
        std::thread::sleep(Duration::from_millis(20));
        dir.write(name, text);
    }

    /// The model the changes build, by kind and name.
    #[derive(Debug, Default, PartialEq)]
    struct Model {
        services: BTreeMap<String, String>,
        slices: BTreeMap<String, String>,
        nodes: BTreeMap<String, String>,
    }

    impl Model {
        fn apply(&mut self, changes: Vec<Change>) {
            for change in changes {
                match change {
                    Change::ServiceUpserted(s) => self.services.insert(s.name.to_string(), format!("{s:?}")),
                    Change::ServiceDeleted(name) => self.services.remove(&name.to_string()),
                    Change::SliceUpserted(s) => self.slices.insert(s.name.to_string(), format!("{s:?}")),
                    Change::SliceDeleted(name) => self.slices.remove(&name.to_string()),
                    Change::NodeUpserted(n) => self.nodes.insert(n.name.clone(), format!("{n:?}")),
                    Change::NodeDeleted(name) => self.nodes.remove(&name),
                };
            }
        }

        /// What a complete read of the directory with a fresh feed gives.
        fn complete(dir: &TempDir) -> Self {
            let mut model = Self::default();
            model.apply(feed(dir).read_changes().unwrap());
            model
        }
    }

    /// A hand-written EndpointSlice (IPv4) of the selector-less Service `service`.
    fn hand_slice(service: &str, suffix: &str, port: u16, addresses: &[&str]) -> String {
        let mut text = format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{suffix}\n  namespace: lab\n  labels:\n    kubernetes.io/service-name: {service}\naddressType: IPv4\nports:\n  - name: tcp\n    protocol: TCP\n    port: {port}\nendpoints:\n"
        );
        for address in addresses {
            writeln!(text, "  - addresses: [\"{address}\"]\n    conditions:\n      ready: true").unwrap();
        }
        text
    }

    fn selectorless(service: &str, cluster_ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {service}, namespace: lab}}\nspec:\n  clusterIP: {cluster_ip}\n  ports: [{{name: tcp, port: 80, targetPort: 8080}}]\n"
        )
    }

    #[test]
    fn a_selectorless_service_with_two_slices_keeps_each_slice_with_its_own_port_and_endpoints() {
        let dir = TempDir::new("delta-selectorless");
        let live = hand_slice("retry", "live", 8080, &["198.18.0.2"]);
        let dead = hand_slice("retry", "dead", 8099, &["198.18.0.3", "198.18.0.4"]);
        dir.write("retry.yaml", &format!("{}{live}{dead}", selectorless("retry", "198.19.0.80")));
        let mut feed = feed(&dir);
        let mut model = Model::default();
        model.apply(feed.poll_changes().expect("the first look gives the state"));
        assert_eq!(model.slices.len(), 2, "{model:?}");
        assert_eq!(model, Model::complete(&dir), "the first look");

        // The dead slice's endpoints change, then the live one moves to another address,
        // then the dead slice goes, then it comes back in a file of its own.
        let dead_again = hand_slice("retry", "dead", 8099, &["198.18.0.5"]);
        write(&dir, "retry.yaml", &format!("{}{live}{dead_again}", selectorless("retry", "198.19.0.80")));
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after the dead slice's edit");

        let moved = hand_slice("retry", "live", 8080, &["198.18.0.6"]);
        write(&dir, "retry.yaml", &format!("{}{moved}{dead_again}", selectorless("retry", "198.19.0.80")));
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after the live slice's edit");

        write(&dir, "retry.yaml", &format!("{}{moved}", selectorless("retry", "198.19.0.80")));
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after the dead slice's removal");
        assert_eq!(model.slices.len(), 1, "{model:?}");

        write(&dir, "z-dead.yaml", &dead);
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after the dead slice came back in a file of its own");
        fs::remove_file(dir.0.join("z-dead.yaml")).unwrap();
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after that file's removal");
    }

    #[test]
    fn a_cluster_ip_asked_for_by_two_services_goes_to_the_first_in_path_order_as_in_a_complete_read() {
        // `retry` (selector-less, two slices of different ports) in a.yaml and `lb` (a
        // selector) in b.yaml both ask for 198.19.0.80. A complete read sees retry first and
        // gives it the address; `lb`, whose name sorts first, is refused.
        let dir = TempDir::new("delta-conflict");
        let live = hand_slice("retry", "live", 8080, &["198.18.0.2"]);
        let dead = hand_slice("retry", "dead", 8099, &["198.18.0.3"]);
        dir.write("a.yaml", &format!("{}{live}{dead}", selectorless("retry", "198.19.0.80")));
        let lb = "apiVersion: v1\nkind: Service\nmetadata: {name: lb, namespace: lab}\nspec:\n  clusterIP: 198.19.0.80\n  selector: {app: svc-1}\n  ports: [{name: tcp, port: 80, targetPort: 8080}]\n---\n";
        dir.write("b.yaml", &format!("{lb}{}", part(1, 1, None)));
        let mut feed = feed(&dir);
        let mut model = Model::default();
        model.apply(feed.poll_changes().expect("the first look gives the state"));
        assert_eq!(model, Model::complete(&dir), "the first look");
        assert!(model.services.contains_key("lab/retry"), "{:?}", model.services.keys());
        assert!(!model.services.contains_key("lab/lb"), "{:?}", model.services.keys());

        // Both edited at once: retry keeps the address.
        write(&dir, "a.yaml", &format!("{}{live}", selectorless("retry", "198.19.0.80")));
        write(&dir, "b.yaml", &format!("{}{}", lb.replace("port: 80,", "port: 81,"), part(1, 1, None)));
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after both edits");

        // The holder goes: the other one gets the address.
        fs::remove_file(dir.0.join("a.yaml")).unwrap();
        model.apply(feed.poll_changes().unwrap_or_default());
        assert_eq!(model, Model::complete(&dir), "after the holder's removal");
        assert!(model.services.contains_key("lab/lb"), "{:?}", model.services.keys());
    }

    /// A small deterministic generator (xorshift64*), so that a failing sequence repeats.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
    }

    /// One random definition of object `id` (Services 0..6, Pods 6..14, hand-written slices
    /// 14..18, the Node 18): few values each, so that selectors match, ClusterIPs are asked
    /// for twice, and slices of one selector-less Service differ in port and address.
    fn random_object(id: usize, rng: &mut Rng) -> String {
        match id {
            0..6 => {
                let ip = match rng.below(3) {
                    0 => String::new(),
                    n => format!("\n  clusterIP: 198.19.0.{}", 9 + n),
                };
                let selector = match rng.below(4) {
                    3 => String::new(),
                    app => format!("\n  selector: {{app: a{app}}}"),
                };
                let port = 80 + rng.below(2);
                format!(
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{id}, namespace: lab}}\nspec:{ip}{selector}\n  ports: [{{name: tcp, port: {port}, targetPort: 8080}}]\n"
                )
            }
            6..14 => {
                let ready = if rng.below(4) == 0 { "False" } else { "True" };
                format!(
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: pod-{id}, namespace: lab, labels: {{app: a{}}}}}\nspec: {{nodeName: node-1, containers: [{{name: app, image: app}}]}}\nstatus:\n  podIP: 198.18.{}.{id}\n  conditions: [{{type: Ready, status: '{ready}'}}]\n",
                    rng.below(3),
                    rng.below(2)
                )
            }
            14..18 => {
                let service = format!("svc-{}", rng.below(3));
                let address = format!("198.18.9.{}", rng.below(4) + 1);
                hand_slice(&service, &format!("h{id}"), 8080 + rng.below(2) as u16, &[&address])
                    .trim_start_matches("---\n")
                    .to_owned()
            }
            _ => {
                let zone =
                    ["", ", labels: {topology.kubernetes.io/zone: z1}", ", labels: {topology.kubernetes.io/zone: z2}"]
                        [rng.below(3)];
                format!("apiVersion: v1\nkind: Node\nmetadata: {{name: node-1{zone}}}\n")
            }
        }
    }

    #[test]
    fn random_edit_sequences_leave_the_same_model_as_complete_reads_with_the_same_history() {
        const OBJECTS: usize = 19;
        const FILES: usize = 4;
        const STEPS: usize = 30;
        for seed in [0x9e37_79b9_7f4a_7c15_u64, 0x0123_4567_89ab_cdef, 0xdead_beef_cafe_f00d] {
            let mut rng = Rng(seed);
            let dir = TempDir::new("delta-random");
            // Definitions by object: (file, text); more than one is a duplicate.
            let mut defined: Vec<Vec<(usize, String)>> =
                (0..OBJECTS).map(|id| vec![(rng.below(FILES), random_object(id, &mut rng))]).collect();
            let render = |defined: &Vec<Vec<(usize, String)>>, file: usize| -> String {
                let documents: Vec<&str> =
                    defined.iter().flatten().filter(|(f, _)| *f == file).map(|(_, text)| text.as_str()).collect();
                documents.join("---\n")
            };
            let mut written: Vec<Option<String>> = vec![None; FILES];
            let sync_files = |defined: &Vec<Vec<(usize, String)>>, written: &mut Vec<Option<String>>| {
                std::thread::sleep(Duration::from_millis(20));
                for (file, old) in written.iter_mut().enumerate() {
                    let text = render(defined, file);
                    let new = (!text.is_empty()).then_some(text);
                    if *old != new {
                        let name = format!("f{file}.yaml");
                        match &new {
                            Some(text) => dir.write(&name, text),
                            None => {
                                let _ = fs::remove_file(dir.0.join(name));
                                dir.0.clone()
                            }
                        };
                        *old = new;
                    }
                }
            };
            sync_files(&defined, &mut written);
            let mut incremental = feed(&dir);
            let mut complete = feed(&dir);
            let mut model = Model::default();
            let mut expected = Model::default();
            model.apply(incremental.poll_changes().unwrap_or_default());
            expected.apply(complete.read_changes().unwrap());
            assert_eq!(model, expected, "seed {seed:#x}: the first look");
            for step in 0..STEPS {
                let id = rng.below(OBJECTS);
                let what = match rng.below(6) {
                    0 | 1 => {
                        let text = random_object(id, &mut rng);
                        match defined[id].first_mut() {
                            Some(first) => first.1 = text,
                            None => defined[id].push((rng.below(FILES), text)),
                        }
                        "edited"
                    }
                    2 => {
                        let file = rng.below(FILES);
                        if let Some(first) = defined[id].first_mut() {
                            first.0 = file;
                        }
                        "moved"
                    }
                    3 => {
                        defined[id].clear();
                        "removed"
                    }
                    4 => {
                        let definition = (rng.below(FILES), random_object(id, &mut rng));
                        defined[id].push(definition);
                        "defined again"
                    }
                    _ => {
                        defined[id].truncate(1);
                        "left with its first definition"
                    }
                };
                sync_files(&defined, &mut written);
                model.apply(incremental.poll_changes().unwrap_or_default());
                expected.apply(complete.read_changes().unwrap());
                assert_eq!(model, expected, "seed {seed:#x}, step {step}: object {id} {what}");
            }
        }
    }

    #[test]
    fn one_pod_edit_re_reads_one_file_parses_one_document_and_replans_one_service() {
        let dir = TempDir::new("delta-pod");
        for f in 0..3 {
            dir.write(&format!("part-{f}.yaml"), &part(f * 4 + 1, 4, None));
        }
        let mut feed = feed(&dir);
        let first = feed.poll_changes().expect("the first look gives the state");
        assert_eq!(first.len(), 24, "12 Services and their 12 slices: {first:?}");
        let before = feed.counters();
        assert_eq!((before.files_read, before.documents_parsed), (3, 36));
        assert!(feed.poll_changes().is_none(), "nothing changed");

        write(&dir, "part-1.yaml", &part(5, 4, Some((6, "198.18.99.9"))));
        let changes = feed.poll_changes().expect("the edit is seen");
        let after = feed.counters();
        assert_eq!(after.files_read - before.files_read, 1, "one file read");
        assert_eq!(after.documents_parsed - before.documents_parsed, 1, "one document parsed");
        assert_eq!(feed.services_touched(), 1);
        assert_eq!(changes.len(), 1, "{changes:?}");
        let Change::SliceUpserted(slice) = &changes[0] else { panic!("expected a slice change: {changes:?}") };
        assert_eq!(slice.name.namespace, "lab");
        assert!(slice.name.name.starts_with("svc-6-"), "{}", slice.name);
        let addresses: Vec<String> = slice.endpoints.iter().map(|e| e.address.to_string()).collect();
        assert!(addresses.contains(&"198.18.99.9".to_owned()), "{addresses:?}");
    }

    #[test]
    fn a_deleted_file_removes_its_objects_and_an_object_moved_between_files_is_kept() {
        let dir = TempDir::new("delta-files");
        dir.write("a.yaml", &part(1, 2, None));
        dir.write("b.yaml", &part(3, 2, None));
        let mut feed = feed(&dir);
        let mut model = Model::default();
        model.apply(feed.poll_changes().unwrap());
        assert_eq!(model.services.len(), 4);

        // Service 3 and its Pods move from b.yaml to c.yaml: nothing changes.
        std::thread::sleep(Duration::from_millis(20));
        dir.write("c.yaml", &part(3, 1, None));
        dir.write("b.yaml", &part(4, 1, None));
        let changes = feed.poll_changes().expect("the files changed");
        assert_eq!(changes, Vec::new(), "moving objects between files changes nothing");

        fs::remove_file(dir.0.join("a.yaml")).unwrap();
        let changes = feed.poll_changes().expect("a deleted file is a change");
        let deleted: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::ServiceDeleted(name) => format!("service {name}"),
                Change::SliceDeleted(name) => {
                    format!("slice {}", name.name.split('-').take(2).collect::<Vec<_>>().join("-"))
                }
                other => panic!("only deletes expected: {other:?}"),
            })
            .collect();
        assert_eq!(deleted, ["slice svc-1", "slice svc-2", "service lab/svc-1", "service lab/svc-2"]);
        model.apply(changes);
        assert_eq!(model, Model::complete(&dir));
    }

    #[test]
    fn a_duplicate_keeps_the_first_definition_until_it_goes() {
        let dir = TempDir::new("delta-duplicate");
        let web =
            |ip: &str| format!("apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec: {{clusterIP: {ip}}}\n");
        dir.write("a.yaml", &web("198.19.0.1"));
        dir.write("b.yaml", &web("198.19.0.2"));
        let mut feed = feed(&dir);
        let changes = feed.poll_changes().unwrap();
        let Change::ServiceUpserted(service) = &changes[0] else { panic!("{changes:?}") };
        assert_eq!(service.cluster_ips[0].to_string(), "198.19.0.1");
        let store = feed.store_errors();
        assert_eq!(store.len(), 1, "{store:?}");
        assert!(store[0].contains("defined again"), "{store:?}");

        fs::remove_file(dir.0.join("a.yaml")).unwrap();
        let changes = feed.poll_changes().unwrap();
        let [Change::ServiceUpserted(service)] = &changes[..] else { panic!("{changes:?}") };
        assert_eq!(service.cluster_ips[0].to_string(), "198.19.0.2");
        assert!(feed.store_errors().is_empty());
    }

    #[test]
    fn a_broken_document_is_reported_and_the_rest_of_its_file_still_counts() {
        let dir = TempDir::new("delta-broken");
        dir.write("a.yaml", &part(1, 2, None));
        let mut feed = feed(&dir);
        let mut model = Model::default();
        model.apply(feed.poll_changes().unwrap());
        write(
            &dir,
            "a.yaml",
            &format!(
                "{}apiVersion: v1\nkind: Service\nmetadata: {{name: bad}}\nspec: {{ports: 7}}\n",
                part(1, 2, Some((2, "198.18.2.77")))
            ),
        );
        model.apply(feed.poll_changes().unwrap());
        assert_eq!(feed.store_errors().len(), 1, "{:?}", feed.store_errors());
        assert_eq!(model, Model::complete(&dir));
        assert!(model.slices.values().any(|s| s.contains("198.18.2.77")));
    }

    #[test]
    fn a_first_read_planned_on_two_threads_leaves_the_same_model_as_a_complete_read() {
        let dir = TempDir::new("delta-parallel-publish");
        dir.write("nodes.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n");
        let services = super::PARALLEL_PUBLISH_THRESHOLD + 200;
        for file in 0..4 {
            let mut text = String::new();
            for s in (file * services / 4)..((file + 1) * services / 4) {
                // Every 97th Service asks for an address outside the Service CIDR: refused.
                let cluster_ip = if s % 97 == 0 {
                    format!("10.1.{}.{}", s / 250, s % 250 + 1)
                } else {
                    format!("198.19.{}.{}", s / 250, s % 250 + 1)
                };
                writeln!(
                    text,
                    "apiVersion: v1\nkind: Service\nmetadata: {{name: svc-{s}, namespace: lab}}\nspec:\n  clusterIP: {cluster_ip}\n  selector: {{app: svc-{s}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n---"
                )
                .unwrap();
                writeln!(
                    text,
                    "apiVersion: v1\nkind: Pod\nmetadata: {{name: svc-{s}-0, namespace: lab, labels: {{app: svc-{s}}}}}\nspec: {{nodeName: node-1, containers: [{{name: app, image: app}}]}}\nstatus:\n  podIP: 198.18.{}.{}\n  conditions: [{{type: Ready, status: 'True'}}]\n---",
                    s / 250 + 1,
                    s % 250 + 1
                )
                .unwrap();
            }
            dir.write(&format!("part-{file}.yaml"), &text);
        }
        let mut feed = feed(&dir);
        let mut model = Model::default();
        model.apply(feed.poll_changes().unwrap());
        assert_eq!(feed.services_touched(), services, "the first read plans every Service");
        assert_eq!(model.services.len(), services - services.div_ceil(97), "the refused Services are not published");
        assert_eq!(model, Model::complete(&dir));
    }

    #[test]
    fn every_edit_leaves_the_same_model_as_a_complete_read() {
        let dir = TempDir::new("delta-differential");
        dir.write("nodes.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\n");
        dir.write("a.yaml", &part(1, 3, None));
        dir.write("b.yaml", &part(4, 3, None));
        let mut feed = feed(&dir);
        let mut model = Model::default();
        model.apply(feed.poll_changes().unwrap());
        assert_eq!(model, Model::complete(&dir));

        type Step = Box<dyn Fn(&TempDir)>;
        let steps: Vec<Step> = vec![
            Box::new(|d| write(d, "a.yaml", &part(1, 3, Some((2, "198.18.50.1"))))),
            Box::new(|d| write(d, "c.yaml", &part(7, 2, None))),
            // A Pod relabelled away from its Service, and a Service whose selector changes.
            Box::new(|d| write(d, "b.yaml", &part(4, 3, None).replace("labels: {app: svc-5}", "labels: {app: other}"))),
            Box::new(|d| {
                write(d, "b.yaml", &part(4, 3, None).replace("selector: {app: svc-6}", "selector: {app: svc-4}"));
            }),
            Box::new(|d| fs::remove_file(d.0.join("c.yaml")).unwrap()),
            Box::new(|d| {
                write(
                    d,
                    "nodes.yaml",
                    "apiVersion: v1\nkind: Node\nmetadata: {name: node-1, labels: {topology.kubernetes.io/zone: z1}}\n",
                );
            }),
            Box::new(|d| write(d, "a.yaml", "")),
        ];
        for (index, step) in steps.iter().enumerate() {
            step(&dir);
            model.apply(feed.poll_changes().unwrap_or_default());
            assert_eq!(model, Model::complete(&dir), "after step {index}");
        }
    }
}
