//! The current objects, rebuilt from [`Batch`]es.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcplane_controller::{ClusterObjects, ObjectKey};

use crate::source::{Batch, ObjectChange};

/// Every object the batches so far left in place, by name.
#[derive(Debug, Clone, Default)]
pub struct ObjectMirror {
    services: BTreeMap<ObjectKey, Service>,
    slices: BTreeMap<ObjectKey, EndpointSlice>,
    nodes: BTreeMap<String, Node>,
}

impl ObjectMirror {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn apply(&mut self, batch: Batch) {
        for change in batch.changes {
            match change {
                ObjectChange::Service(key, Some(service)) => {
                    self.services.insert(key, *service);
                }
                ObjectChange::Service(key, None) => {
                    self.services.remove(&key);
                }
                ObjectChange::Slice(key, Some(slice)) => {
                    self.slices.insert(key, *slice);
                }
                ObjectChange::Slice(key, None) => {
                    self.slices.remove(&key);
                }
                ObjectChange::Node(name, Some(node)) => {
                    self.nodes.insert(name, *node);
                }
                ObjectChange::Node(name, None) => {
                    self.nodes.remove(&name);
                }
            }
        }
    }

    /// A copy of everything, in name order (no Pods: the API source does not watch them).
    pub fn objects(&self) -> ClusterObjects {
        ClusterObjects {
            services: self.services.values().cloned().collect(),
            pods: Vec::new(),
            nodes: self.nodes.values().cloned().collect(),
            slices: self.slices.values().cloned().collect(),
            pools: Vec::new(),
        }
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }
}
