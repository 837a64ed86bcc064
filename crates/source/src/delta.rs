//! The controller step of the proxy's manifests feed, in proportion to what changed.
//!
//! [`DeltaState`] takes the objects whose definition changed (from the store) and works out
//! which Services they touch: a changed Service itself; every Service whose selector matches
//! a changed Pod's labels, before or after the change (Pods and Service selectors are both
//! indexed by namespace and label, so finding them costs the Pod's labels, not the cluster);
//! every Service when a Node changes (zones). Only those are allocated again
//! ([`Allocator::allocate_changed`]: everyone else keeps what they hold), planned
//! ([`plan_slices_from`]) and converted; the result is a [`PartialSnapshot`] for the differ.
//! LoadBalancer pools are the exception: with any pool present, a Service or pool change
//! assigns load balancer addresses over all Services, as [`svcplane_controller::reconcile`]
//! does.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use svcplane_controller::load_balancer::LoadBalancerIPPool;
use svcplane_controller::{
    Allocator, ControllerError, ObjectKey, assign_load_balancers, is_managed_by_us, plan_slices_from,
};
use svcplane_core::model::NamespacedName;

use crate::convert::{FieldError, new_slice_address_errors, node_to_core, service_to_core, slice_to_core};
use crate::diff::PartialSnapshot;
use crate::held::{Held, PodRecord};
use crate::manifests::{ObjectKind, ObjectRef};
use crate::store::{ManifestStore, ObjectChange};

/// `(namespace, label key, label value)` hashed: a posting-list key. A collision only adds
/// candidates, which the full selector check then drops.
fn label_key(namespace: &str, key: &str, value: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (namespace, key, value).hash(&mut hasher);
    hasher.finish()
}

/// What the incremental controller remembers between edits.
#[derive(Debug, Default)]
pub(crate) struct DeltaState {
    services: BTreeMap<ObjectRef, Arc<Held>>,
    pods: HashMap<ObjectRef, Arc<Held>>,
    nodes: BTreeMap<ObjectRef, Arc<Held>>,
    /// The Nodes as the slice planner wants them (zones), rebuilt when one changes.
    node_list: Vec<Node>,
    pools: BTreeMap<ObjectRef, Arc<Held>>,
    /// EndpointSlices written by hand (not ours).
    slices: BTreeMap<ObjectRef, Arc<Held>>,
    /// Pods by `(namespace, key, value)` of each label.
    pods_by_label: HashMap<u64, HashSet<ObjectRef>>,
    /// Services with a selector by `(namespace, key, value)` of their selector's first label.
    services_by_selector: HashMap<u64, BTreeSet<ObjectRef>>,
    /// Services as allocated.
    allocated: HashMap<ObjectRef, Service>,
    /// With LoadBalancerIPPools: every allocated Service after load balancer assignment.
    with_load_balancers: HashMap<ObjectRef, Service>,
    /// Services refused by the allocator or the planner, with why.
    refused: BTreeMap<ObjectRef, Vec<ControllerError>>,
    load_balancer_problems: Vec<String>,
    /// The core names of the slices generated for each Service.
    generated: HashMap<ObjectRef, Vec<NamespacedName>>,
    /// Whether the allocator has had its first, full pass.
    allocated_once: bool,
    /// Conversion problems, by the Service (with its generated slices) or hand-written slice.
    convert_errors: BTreeMap<ObjectRef, Vec<FieldError>>,
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
    pub(crate) fn apply(&mut self, changes: Vec<ObjectChange>, allocator: &mut Allocator) -> DeltaOutput {
        let mut output = DeltaOutput::default();
        let mut affected: BTreeSet<ObjectRef> = BTreeSet::new();
        let mut services_changed: BTreeSet<ObjectRef> = BTreeSet::new();
        let mut slices_changed: Vec<ObjectRef> = Vec::new();
        let mut nodes_changed: Vec<ObjectRef> = Vec::new();
        let mut pools_changed = false;
        for (reference, new) in changes {
            match reference.kind {
                ObjectKind::Service => {
                    let old = match &new {
                        Some(object) => self.services.insert(reference.clone(), Arc::clone(object)),
                        None => self.services.remove(&reference),
                    };
                    if let Some(old) = old.as_deref().and_then(Held::as_service) {
                        self.unindex_service(&reference, old);
                    }
                    if let Some(service) = new.as_deref().and_then(Held::as_service) {
                        self.index_service(&reference, service);
                    }
                    services_changed.insert(reference);
                }
                ObjectKind::Pod => {
                    let old = match &new {
                        Some(object) => self.pods.insert(reference.clone(), Arc::clone(object)),
                        None => self.pods.remove(&reference),
                    };
                    for pod in [old.as_deref(), new.as_deref()].into_iter().flatten().filter_map(Held::as_pod) {
                        self.services_selecting(&reference.namespace, pod, &mut affected);
                    }
                    if let Some(pod) = old.as_deref().and_then(Held::as_pod) {
                        for (key, value) in pod.labels() {
                            let posting = label_key(&reference.namespace, key, value);
                            if let Some(pods) = self.pods_by_label.get_mut(&posting) {
                                pods.remove(&reference);
                                if pods.is_empty() {
                                    self.pods_by_label.remove(&posting);
                                }
                            }
                        }
                    }
                    if let Some(pod) = new.as_deref().and_then(Held::as_pod) {
                        for (key, value) in pod.labels() {
                            let posting = label_key(&reference.namespace, key, value);
                            self.pods_by_label.entry(posting).or_default().insert(reference.clone());
                        }
                    }
                }
                ObjectKind::Node => {
                    match new {
                        Some(object) => self.nodes.insert(reference.clone(), object),
                        None => self.nodes.remove(&reference),
                    };
                    nodes_changed.push(reference);
                }
                ObjectKind::EndpointSlice => {
                    match new {
                        Some(object) => self.slices.insert(reference.clone(), object),
                        None => self.slices.remove(&reference),
                    };
                    slices_changed.push(reference);
                }
                ObjectKind::LoadBalancerIPPool => {
                    match new {
                        Some(object) => self.pools.insert(reference, object),
                        None => self.pools.remove(&reference),
                    };
                    pools_changed = true;
                }
            }
        }

        if !nodes_changed.is_empty() {
            self.node_list = self.nodes.values().filter_map(|o| o.as_node()).cloned().collect();
            for reference in &nodes_changed {
                match self.nodes.get(reference).and_then(|o| o.as_node()) {
                    Some(node) => output.partial.nodes.push(node_to_core(node)),
                    None => output.partial.deleted_nodes.push(reference.name.clone()),
                }
            }
            // Zones feed every Service's endpoint hints.
            affected.extend(self.services.keys().cloned());
        }

        // Allocation: the changed Services, and the refused ones again (they may fit now).
        let retried: Vec<ObjectRef> = self.refused.keys().filter(|r| !services_changed.contains(r)).cloned().collect();
        if !services_changed.is_empty() || !retried.is_empty() {
            let mut settle: Vec<Service> = Vec::new();
            let mut removed: Vec<ObjectKey> = Vec::new();
            for reference in services_changed.iter().chain(&retried) {
                match self.services.get(reference).and_then(|o| o.as_service()) {
                    Some(service) => settle.push(service.clone()),
                    None => {
                        removed.push(ObjectKey::new(reference.namespace.clone(), reference.name.clone()));
                        self.allocated.remove(reference);
                        self.with_load_balancers.remove(reference);
                        self.refused.remove(reference);
                    }
                }
            }
            // The first time, every Service is here: a full pass also releases what a restored
            // record holds for Services that are gone.
            let outcome = if std::mem::replace(&mut self.allocated_once, true) {
                allocator.allocate_changed(&settle, &removed)
            } else {
                allocator.allocate(&settle)
            };
            output.allocations_changed = outcome.changed;
            for (service, result) in settle.iter().zip(outcome.services) {
                let reference = ObjectRef::from_meta(ObjectKind::Service, &service.metadata);
                match result {
                    Ok(filled) => {
                        self.refused.remove(&reference);
                        self.allocated.insert(reference, filled);
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
            let mut references: Vec<ObjectRef> = self.allocated.keys().cloned().collect();
            references.sort_unstable();
            let mut services: Vec<Service> = references.iter().map(|r| self.allocated[r].clone()).collect();
            self.load_balancer_problems =
                if pools.is_empty() { Vec::new() } else { assign_load_balancers(&pools, &mut services, allocator) };
            let mut with_load_balancers = HashMap::new();
            for (reference, service) in references.into_iter().zip(services) {
                if self.with_load_balancers.get(&reference).unwrap_or(&self.allocated[&reference]) != &service {
                    affected.insert(reference.clone());
                }
                if !pools.is_empty() {
                    with_load_balancers.insert(reference, service);
                }
            }
            self.with_load_balancers = with_load_balancers;
        }

        output.services_touched = affected.len();
        for reference in &affected {
            self.publish_service(reference, &mut output.partial);
        }
        for reference in slices_changed {
            self.publish_slice(&reference, &mut output.partial);
        }
        output
    }

    /// Plans, converts and hands over one Service and its generated slices (or their removal).
    fn publish_service(&mut self, reference: &ObjectRef, partial: &mut PartialSnapshot) {
        let name = NamespacedName::new(reference.namespace.clone(), reference.name.clone());
        self.convert_errors.remove(reference);
        let old_slices = self.generated.remove(reference).unwrap_or_default();
        let mut new_slices: Vec<NamespacedName> = Vec::new();
        let mut errors: Vec<FieldError> = Vec::new();
        let mut published = false;
        let service = self.with_load_balancers.get(reference).or_else(|| self.allocated.get(reference));
        if let Some(service) = service {
            let candidates = self.candidates(reference, service);
            let candidates: Vec<&Pod> = candidates.iter().collect();
            match plan_slices_from(service, &candidates, &self.node_list) {
                Err(error) => {
                    self.refused.insert(reference.clone(), vec![error]);
                }
                Ok(slices) => {
                    match service_to_core(service) {
                        Ok(Some(core)) => {
                            partial.services.push(core);
                            published = true;
                        }
                        Ok(None) => {}
                        Err(found) => errors.extend(found),
                    }
                    for slice in &slices {
                        let strict = new_slice_address_errors(slice);
                        match slice_to_core(slice) {
                            Ok(Some(core)) if strict.is_empty() => {
                                new_slices.push(core.name.clone());
                                partial.slices.push(core);
                            }
                            Ok(_) => errors.extend(strict),
                            Err(found) => {
                                errors.extend(found);
                                errors.extend(strict);
                            }
                        }
                    }
                }
            }
        }
        if !published {
            partial.deleted_services.push(name);
        }
        partial.deleted_slices.extend(old_slices.into_iter().filter(|old| !new_slices.contains(old)));
        if !new_slices.is_empty() {
            self.generated.insert(reference.clone(), new_slices);
        }
        if !errors.is_empty() {
            self.convert_errors.insert(reference.clone(), errors);
        }
    }

    /// Converts and hands over one hand-written slice (or its removal).
    fn publish_slice(&mut self, reference: &ObjectRef, partial: &mut PartialSnapshot) {
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
            partial.deleted_slices.push(NamespacedName::new(reference.namespace.clone(), reference.name.clone()));
        }
    }

    /// The Pods that may be selected by `service` (those with its selector's first label),
    /// rebuilt from their records for the planner.
    fn candidates(&self, reference: &ObjectRef, service: &Service) -> Vec<Pod> {
        let Some((key, value)) = service.spec.as_ref().and_then(|spec| spec.selector.as_ref()?.iter().next()) else {
            return Vec::new();
        };
        let Some(pods) = self.pods_by_label.get(&label_key(&reference.namespace, key, value)) else {
            return Vec::new();
        };
        pods.iter().filter_map(|pod| self.pods.get(pod).and_then(|o| o.as_pod())).map(PodRecord::to_pod).collect()
    }

    fn index_service(&mut self, reference: &ObjectRef, service: &Service) {
        if let Some((key, value)) = service.spec.as_ref().and_then(|spec| spec.selector.as_ref()?.iter().next()) {
            let posting = label_key(&reference.namespace, key, value);
            self.services_by_selector.entry(posting).or_default().insert(reference.clone());
        }
    }

    fn unindex_service(&mut self, reference: &ObjectRef, service: &Service) {
        if let Some((key, value)) = service.spec.as_ref().and_then(|spec| spec.selector.as_ref()?.iter().next()) {
            let posting = label_key(&reference.namespace, key, value);
            if let Some(services) = self.services_by_selector.get_mut(&posting) {
                services.remove(reference);
                if services.is_empty() {
                    self.services_by_selector.remove(&posting);
                }
            }
        }
    }

    /// Adds the Services of `namespace` whose selector matches the labels of `pod`.
    fn services_selecting(&self, namespace: &str, pod: &PodRecord, found: &mut BTreeSet<ObjectRef>) {
        for (key, value) in pod.labels() {
            let Some(services) = self.services_by_selector.get(&label_key(namespace, key, value)) else { continue };
            for reference in services {
                let selector = self
                    .services
                    .get(reference)
                    .and_then(|o| o.as_service())
                    .and_then(|s| s.spec.as_ref())
                    .and_then(|spec| spec.selector.as_ref());
                if selector.is_some_and(|selector| selector.iter().all(|(k, v)| pod.label(k) == Some(v.as_str()))) {
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
            let origin = errors.first().and_then(|e| store.position_of(&e.object)).cloned();
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
