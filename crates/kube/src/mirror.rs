//! The current objects, rebuilt from [`Batch`]es: whatever the watch's [`crate::Keep`]
//! kept of each (cluster DNS keeps its own compact conversion, never API objects).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcplane_controller::{ClusterObjects, ObjectKey};

use crate::source::{Batch, ObjectChange};

/// Every object the batches so far left in place, by name.
#[derive(Debug, Clone)]
pub struct ObjectMirror<S = Box<Service>, E = Box<EndpointSlice>, N = Box<Node>> {
    services: BTreeMap<ObjectKey, S>,
    slices: BTreeMap<ObjectKey, E>,
    nodes: BTreeMap<String, N>,
}

impl<S, E, N> Default for ObjectMirror<S, E, N> {
    fn default() -> Self {
        Self { services: BTreeMap::new(), slices: BTreeMap::new(), nodes: BTreeMap::new() }
    }
}

impl<S, E, N> ObjectMirror<S, E, N> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn apply(&mut self, batch: Batch<S, E, N>) {
        for change in batch.changes {
            match change {
                ObjectChange::Service(key, Some(service)) => {
                    self.services.insert(key, service);
                }
                ObjectChange::Service(key, None) => {
                    self.services.remove(&key);
                }
                ObjectChange::Slice(key, Some(slice)) => {
                    self.slices.insert(key, slice);
                }
                ObjectChange::Slice(key, None) => {
                    self.slices.remove(&key);
                }
                ObjectChange::Node(name, Some(node)) => {
                    self.nodes.insert(name, node);
                }
                ObjectChange::Node(name, None) => {
                    self.nodes.remove(&name);
                }
            }
        }
    }

    /// The Services, in name order.
    pub fn services(&self) -> impl Iterator<Item = &S> {
        self.services.values()
    }

    /// The EndpointSlices, in name order.
    pub fn slices(&self) -> impl Iterator<Item = &E> {
        self.slices.values()
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}

impl ObjectMirror {
    /// A copy of everything, in name order (no Pods: the API source does not watch them).
    pub fn objects(&self) -> ClusterObjects {
        ClusterObjects {
            services: self.services.values().map(|service| (**service).clone()).collect(),
            pods: Vec::new(),
            nodes: self.nodes.values().map(|node| (**node).clone()).collect(),
            slices: self.slices.values().map(|slice| (**slice).clone()).collect(),
            pools: Vec::new(),
        }
    }
}
