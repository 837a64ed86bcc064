//! The manifests pipeline: allocate, then plan slices, over the whole parsed directory.

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::allocation::Allocator;
use crate::error::ControllerError;
use crate::load_balancer::{LoadBalancerIPPool, assign_in_place};
use crate::slices::{LABEL_MANAGED_BY, MANAGED_BY, SlicePlanner};

/// Everything parsed from the manifests directory.
#[derive(Debug, Clone, Default)]
pub struct ClusterObjects {
    pub services: Vec<Service>,
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    /// EndpointSlices written by hand (for Services without a selector, or extra endpoints).
    pub slices: Vec<EndpointSlice>,
    /// LoadBalancer address pools (`LoadBalancerIPPool`, `svcplane.io/v1alpha1`).
    pub pools: Vec<LoadBalancerIPPool>,
}

/// What the dataplane should see.
#[derive(Debug, Clone, Default)]
pub struct Reconciled {
    /// The input Services in input order with their allocated fields filled in, less those
    /// with an error.
    pub services: Vec<Service>,
    /// The generated slices (Service by Service, in input order), then the explicit ones.
    pub slices: Vec<EndpointSlice>,
    /// One entry per refused field; each Service named here is missing from `services`.
    pub errors: Vec<ControllerError>,
    /// The allocator's state changed: save [`Allocator::record`] now.
    pub allocations_changed: bool,
    /// Unusable pools and LoadBalancer Services without the address they want, one message
    /// each (the Services are kept, without that address).
    pub load_balancer_problems: Vec<String>,
}

/// Allocates cluster IPs and node ports for `input.services`, plans the EndpointSlices of
/// those with a selector, and passes the explicit slices through.
///
/// Explicit slices labelled as managed by us ([`MANAGED_BY`]) are dropped: they can only be
/// output of an earlier run written back into the directory, and would duplicate the fresh
/// ones. Slices managed by anyone else are kept as they are, even for Services with a
/// selector, as the upstream controller leaves foreign slices alone.
pub fn reconcile(input: &ClusterObjects, allocator: &mut Allocator) -> Reconciled {
    let outcome = allocator.allocate(&input.services);
    let planner = SlicePlanner::new(&input.pods, Some(&input.nodes));
    let mut reconciled = Reconciled { allocations_changed: outcome.changed, ..Reconciled::default() };
    for result in outcome.services {
        match result.and_then(|service| planner.plan(&service).map(|slices| (service, slices)).map_err(|e| vec![e])) {
            Ok((service, slices)) => {
                reconciled.services.push(service);
                reconciled.slices.extend(slices);
            }
            Err(errors) => reconciled.errors.extend(errors),
        }
    }
    reconciled.slices.extend(input.slices.iter().filter(|slice| !is_managed_by_us(slice)).cloned());
    if !input.pools.is_empty() {
        reconciled.load_balancer_problems =
            assign_in_place(&input.pools, &mut reconciled.services, &mut allocator.load_balancer);
    }
    for error in &reconciled.errors {
        tracing::warn!(%error, "leaving the Service out");
    }
    reconciled
}

/// The LoadBalancer step of [`reconcile`] alone, for a caller that allocates Services
/// itself (the incremental manifests feed): addresses from `pools` into each served
/// Service's `status.loadBalancer.ingress`, kept stable by `allocator`; one message per
/// problem.
pub fn assign_load_balancers(
    pools: &[LoadBalancerIPPool],
    services: &mut [Service],
    allocator: &mut Allocator,
) -> Vec<String> {
    assign_in_place(pools, services, &mut allocator.load_balancer)
}

/// Whether an EndpointSlice carries our [`MANAGED_BY`] label (output of an earlier run
/// written back into the directory: [`reconcile`] drops those).
pub fn is_managed_by_us(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_MANAGED_BY))
        .is_some_and(|value| value == MANAGED_BY)
}

#[cfg(test)]
mod tests;
