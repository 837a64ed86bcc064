//! From successive full snapshots to minimal changes.
//!
//! The manifests directory is reloaded whole, but the core's change tracking should see
//! only what really changed, so that syncs stay partial. [`SnapshotDiffer`] remembers the
//! previous snapshot by name and reports additions, changes and removals. The cost is
//! linear in the number of objects. It keeps a 128-bit digest of each object, not the
//! object: the consumer (the core's `ClusterState`) holds the objects themselves, and a
//! second copy here cost as much memory again (~30 MB at 10k Services x 10 endpoints).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use svcplane_core::model::{EndpointSlice, NamespacedName, Node, Service};
use svcplane_core::state::Change;

/// A 128-bit digest of a converted object (two keyed SipHash runs over its `Hash`): two
/// objects with the same digest are taken as equal (a collision, at 2^-128, would hide one
/// change).
type Digest = (u64, u64);

fn digest<V: Hash>(value: &V) -> Digest {
    let mut first = DefaultHasher::new();
    0u8.hash(&mut first);
    value.hash(&mut first);
    let mut second = DefaultHasher::new();
    1u8.hash(&mut second);
    value.hash(&mut second);
    (first.finish(), second.finish())
}

/// Remembers the last snapshot of converted objects (by name, a digest each) and diffs the
/// next one against it.
#[derive(Debug, Default)]
pub struct SnapshotDiffer {
    services: HashMap<NamespacedName, Digest>,
    slices: HashMap<NamespacedName, Digest>,
    nodes: HashMap<String, Digest>,
}

impl SnapshotDiffer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the complete new set of objects and returns what changed since the previous
    /// call: upserts for new and changed objects, deletes for those that are gone.
    ///
    /// Order: Node changes first (they affect every Service), then Service upserts, slice
    /// upserts, slice deletes and Service deletes. Upserts keep the input order, deletes
    /// are sorted by name. When a name appears twice in the input, the first one counts.
    pub fn diff(&mut self, services: Vec<Service>, slices: Vec<EndpointSlice>, nodes: Vec<Node>) -> Vec<Change> {
        let mut changes = Vec::new();
        let mut node_deletes = Vec::new();
        diff_kind(
            &mut self.nodes,
            nodes,
            |n| &n.name,
            Change::NodeUpserted,
            Change::NodeDeleted,
            &mut changes,
            &mut node_deletes,
        );
        changes.append(&mut node_deletes);
        let mut service_deletes = Vec::new();
        diff_kind(
            &mut self.services,
            services,
            |s| &s.name,
            Change::ServiceUpserted,
            Change::ServiceDeleted,
            &mut changes,
            &mut service_deletes,
        );
        let mut slice_deletes = Vec::new();
        diff_kind(
            &mut self.slices,
            slices,
            |s| &s.name,
            Change::SliceUpserted,
            Change::SliceDeleted,
            &mut changes,
            &mut slice_deletes,
        );
        changes.append(&mut slice_deletes);
        changes.append(&mut service_deletes);
        changes
    }

    /// Takes a part of the next snapshot (what an incremental reader knows changed) and
    /// returns the changes it makes: upserts of objects that differ from what is known,
    /// deletes of known objects. Objects not named keep their state. The order is that of
    /// [`Self::diff`]; a name both upserted and deleted is upserted.
    pub fn apply(&mut self, partial: PartialSnapshot) -> Vec<Change> {
        let PartialSnapshot { services, deleted_services, slices, deleted_slices, nodes, deleted_nodes } = partial;
        let mut changes = Vec::new();
        let upserted_nodes = upsert_kind(&mut self.nodes, nodes, |n| &n.name, Change::NodeUpserted, &mut changes);
        delete_kind(&mut self.nodes, deleted_nodes, &upserted_nodes, Change::NodeDeleted, &mut changes);
        let upserted_services =
            upsert_kind(&mut self.services, services, |s| &s.name, Change::ServiceUpserted, &mut changes);
        let upserted_slices = upsert_kind(&mut self.slices, slices, |s| &s.name, Change::SliceUpserted, &mut changes);
        delete_kind(&mut self.slices, deleted_slices, &upserted_slices, Change::SliceDeleted, &mut changes);
        delete_kind(&mut self.services, deleted_services, &upserted_services, Change::ServiceDeleted, &mut changes);
        changes
    }

    /// Forgets the previous snapshot: the next [`Self::diff`] reports everything as upserted
    /// (for a consumer that starts from scratch).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// How many objects the last snapshot had.
    pub fn len(&self) -> usize {
        self.services.len() + self.slices.len() + self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Part of a snapshot for [`SnapshotDiffer::apply`]: objects to upsert and names to delete.
#[derive(Debug, Clone, Default)]
pub struct PartialSnapshot {
    pub services: Vec<Service>,
    pub deleted_services: Vec<NamespacedName>,
    pub slices: Vec<EndpointSlice>,
    pub deleted_slices: Vec<NamespacedName>,
    pub nodes: Vec<Node>,
    pub deleted_nodes: Vec<String>,
}

impl PartialSnapshot {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.deleted_services.is_empty()
            && self.slices.is_empty()
            && self.deleted_slices.is_empty()
            && self.nodes.is_empty()
            && self.deleted_nodes.is_empty()
    }
}

/// Upserts the objects that differ from the known ones; returns every name seen.
fn upsert_kind<K, V>(
    known: &mut HashMap<K, Digest>,
    incoming: Vec<V>,
    key: fn(&V) -> &K,
    upserted: impl Fn(V) -> Change,
    changes: &mut Vec<Change>,
) -> HashSet<K>
where
    K: Hash + Eq + Clone,
    V: Hash,
{
    let mut seen = HashSet::with_capacity(incoming.len());
    for object in incoming {
        if !seen.insert(key(&object).clone()) {
            continue;
        }
        let new = digest(&object);
        if known.get(key(&object)) != Some(&new) {
            known.insert(key(&object).clone(), new);
            changes.push(upserted(object));
        }
    }
    seen
}

/// Deletes the known names among `names` (sorted) that were not just upserted.
fn delete_kind<K>(
    known: &mut HashMap<K, Digest>,
    mut names: Vec<K>,
    upserted: &HashSet<K>,
    deleted: impl Fn(K) -> Change,
    changes: &mut Vec<Change>,
) where
    K: Hash + Eq + Ord,
{
    names.sort_unstable();
    names.dedup();
    for name in names {
        if !upserted.contains(&name) && known.remove(&name).is_some() {
            changes.push(deleted(name));
        }
    }
}

fn diff_kind<K, V>(
    known: &mut HashMap<K, Digest>,
    incoming: Vec<V>,
    key: fn(&V) -> &K,
    upserted: impl Fn(V) -> Change,
    deleted: impl Fn(K) -> Change,
    upserts: &mut Vec<Change>,
    deletes: &mut Vec<Change>,
) where
    K: Hash + Eq + Ord + Clone,
    V: Hash,
{
    let mut previous = std::mem::take(known);
    known.reserve(incoming.len());
    for object in incoming {
        let name = key(&object);
        if known.contains_key(name) {
            continue;
        }
        let new = digest(&object);
        let unchanged = previous.remove(name) == Some(new);
        known.insert(name.clone(), new);
        if !unchanged {
            upserts.push(upserted(object));
        }
    }
    let mut gone: Vec<K> = previous.into_keys().collect();
    gone.sort_unstable();
    deletes.extend(gone.into_iter().map(deleted));
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcplane_core::model::{Endpoint, EndpointPort, IpFamily, Protocol, ServicePort};

    fn service(name: &str, port: u16) -> Service {
        Service::cluster_ip(
            NamespacedName::new("default", name),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: String::new(), protocol: Protocol::Tcp, port, node_port: None }],
        )
    }

    fn slice(name: &str, service: &str, address: &str) -> EndpointSlice {
        EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", name),
            service: NamespacedName::new("default", service),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: String::new(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: vec![Endpoint::ready(address.parse().unwrap(), None)],
        }
    }

    fn node(name: &str) -> Node {
        Node { name: name.into(), ..Node::default() }
    }

    #[test]
    fn the_first_snapshot_is_all_upserts() {
        let mut differ = SnapshotDiffer::new();
        let changes =
            differ.diff(vec![service("web", 80)], vec![slice("web-1", "web", "198.18.0.2")], vec![node("n1")]);
        assert_eq!(
            changes,
            [
                Change::NodeUpserted(node("n1")),
                Change::ServiceUpserted(service("web", 80)),
                Change::SliceUpserted(slice("web-1", "web", "198.18.0.2")),
            ]
        );
        assert_eq!(differ.len(), 3);
    }

    #[test]
    fn the_differ_emits_an_upsert_only_for_a_changed_object_and_a_delete_for_a_removed_one() {
        let mut differ = SnapshotDiffer::new();
        differ.diff(
            vec![service("web", 80), service("api", 443), service("old", 1)],
            vec![slice("web-1", "web", "198.18.0.2"), slice("api-1", "api", "198.18.0.3")],
            vec![node("n1")],
        );
        let changes = differ.diff(
            vec![service("web", 80), service("api", 8443)],
            vec![slice("web-1", "web", "198.18.0.2"), slice("api-1", "api", "198.18.0.4")],
            vec![node("n1")],
        );
        assert_eq!(
            changes,
            [
                Change::ServiceUpserted(service("api", 8443)),
                Change::SliceUpserted(slice("api-1", "api", "198.18.0.4")),
                Change::ServiceDeleted(NamespacedName::new("default", "old")),
            ]
        );
        let unchanged = differ.diff(
            vec![service("api", 8443), service("web", 80)],
            vec![slice("api-1", "api", "198.18.0.4"), slice("web-1", "web", "198.18.0.2")],
            vec![node("n1")],
        );
        assert_eq!(unchanged, []);
    }

    #[test]
    fn removed_objects_are_deleted_in_name_order_and_a_reset_replays_everything() {
        let mut differ = SnapshotDiffer::new();
        differ.diff(
            vec![service("b", 1), service("a", 1)],
            vec![slice("b-1", "b", "198.18.0.2")],
            vec![node("n2"), node("n1")],
        );
        let changes = differ.diff(Vec::new(), Vec::new(), Vec::new());
        assert_eq!(
            changes,
            [
                Change::NodeDeleted("n1".into()),
                Change::NodeDeleted("n2".into()),
                Change::SliceDeleted(NamespacedName::new("default", "b-1")),
                Change::ServiceDeleted(NamespacedName::new("default", "a")),
                Change::ServiceDeleted(NamespacedName::new("default", "b")),
            ]
        );
        assert!(differ.is_empty());
        differ.diff(vec![service("a", 1)], Vec::new(), Vec::new());
        differ.reset();
        assert_eq!(
            differ.diff(vec![service("a", 1)], Vec::new(), Vec::new()),
            [Change::ServiceUpserted(service("a", 1))]
        );
    }

    #[test]
    fn a_name_given_twice_counts_once() {
        let mut differ = SnapshotDiffer::new();
        let changes = differ.diff(vec![service("web", 80), service("web", 81)], Vec::new(), Vec::new());
        assert_eq!(changes, [Change::ServiceUpserted(service("web", 80))]);
    }
}
