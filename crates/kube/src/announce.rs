//! Which node announces a LoadBalancer address: one `coordination.k8s.io/v1` Lease per
//! Service, so that two nodes never announce the same address.
//!
//! Every node's agent (`svcplane announce`) watches Services and EndpointSlices. For each
//! Service of ours (see `svcplane_controller::load_balancer::is_ours`) with addresses in
//! `status.loadBalancer.ingress`, a node is a *candidate* ([`candidacy`]) when the Service's
//! `externalTrafficPolicy` is `Cluster`, or when it is `Local` and the node has a ready local
//! endpoint (a node without one would drop the traffic). A candidate campaigns for the
//! Service's Lease `svcplane-l2.<namespace>.<name>` with the election semantics of
//! [`crate::lease`] (identity: the node name); while it holds it, the caller announces the
//! Service's addresses. A holder that stops being a candidate (last local endpoint gone,
//! Service gone or no longer a LoadBalancer) stops announcing and releases the Lease at
//! once, so another candidate takes over at its next try; a holder that dies is replaced
//! when its lease runs out.
//!
//! A holder announces only while its last successful renewal is younger than the renew
//! deadline, which is shorter than the lease duration a follower waits out (counted from
//! when the follower saw the holder's last renewal): the two intervals never overlap.
//!
//! What it does not do: no ARP or NDP (the caller's `set_addresses` does that, with
//! `svcplane-announce`), no choice of interfaces, no balancing of Services over nodes
//! beyond whoever wins each Lease first.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use svcplane_controller::ObjectKey;
use svcplane_controller::load_balancer::{ingress_ips, is_ours};
use tracing::{debug, info};

use crate::error::KubeError;
use crate::lease::{Decision, LeaderElector, LeaseConfig};
use crate::source::WatchBackoff;

/// How often local deadlines are checked (a holder past its renew deadline stops at once).
const TICK: Duration = Duration::from_millis(50);

/// The agent's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnounceOptions {
    /// This node's name: the Lease holder identity and the `nodeName` of local endpoints.
    pub node_name: String,
    /// Where the per-Service Leases live.
    pub lease_namespace: String,
    /// How long followers wait after a Lease last changed before taking it over.
    pub lease_duration: Duration,
    /// How long a holder keeps announcing without a successful renewal.
    pub renew_deadline: Duration,
    /// How often holders renew and candidates try.
    pub retry_period: Duration,
}

impl AnnounceOptions {
    /// The defaults: 2 s lease, 1.5 s renew deadline, 0.5 s retry (failover in 2-3 s).
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            lease_namespace: "kube-system".into(),
            lease_duration: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(500),
        }
    }

    /// The Lease settings of `service` (checked like the controller's election).
    pub fn lease(&self, service: &ObjectKey) -> LeaseConfig {
        LeaseConfig {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            ..LeaseConfig::new(self.lease_namespace.clone(), lease_name(service), self.node_name.clone())
        }
    }
}

/// `svcplane-l2.<namespace>.<name>`: namespace and Service names are DNS labels (no dots),
/// so the name is unambiguous and a valid Lease name.
pub fn lease_name(service: &ObjectKey) -> String {
    format!("svcplane-l2.{}.{}", service.namespace, service.name)
}

/// The addresses this node should campaign to announce for `service`, or `None` when it is
/// not a candidate. `slices` are the Service's EndpointSlices.
pub fn candidacy(service: &Service, slices: &[&EndpointSlice], node: &str) -> Option<Vec<IpAddr>> {
    if !is_ours(service) {
        return None;
    }
    let ips = ingress_ips(service);
    if ips.is_empty() {
        return None;
    }
    let local = service.spec.as_ref().and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    if !local {
        return Some(ips);
    }
    let has_local_endpoint = slices.iter().flat_map(|s| s.endpoints.iter()).any(|endpoint| {
        endpoint.node_name.as_deref() == Some(node)
            && endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
    });
    has_local_endpoint.then_some(ips)
}

#[allow(clippy::large_enum_variant, reason = "short-lived, one per watch event")]
enum Incoming {
    Service(Result<Event<Service>, watcher::Error>),
    Slice(Result<Event<EndpointSlice>, watcher::Error>),
}

/// Objects of one kind keyed by `namespace/name`, relists applied whole.
#[derive(Debug)]
struct Store<K> {
    objects: BTreeMap<ObjectKey, K>,
    relist: Option<BTreeMap<ObjectKey, K>>,
    synced: bool,
}

impl<K: kube::Resource> Store<K> {
    fn new() -> Self {
        Self { objects: BTreeMap::new(), relist: None, synced: false }
    }

    fn handle(&mut self, incoming: Result<Event<K>, watcher::Error>) {
        let Ok(event) = incoming else { return };
        match event {
            Event::Apply(object) => {
                self.objects.insert(ObjectKey::of(object.meta()), object);
            }
            Event::Delete(object) => {
                self.objects.remove(&ObjectKey::of(object.meta()));
            }
            Event::Init => self.relist = Some(BTreeMap::new()),
            Event::InitApply(object) => {
                self.relist.get_or_insert_with(BTreeMap::new).insert(ObjectKey::of(object.meta()), object);
            }
            Event::InitDone => {
                self.objects = self.relist.take().unwrap_or_default();
                self.synced = true;
            }
        }
    }
}

/// One Service's campaign on this node.
#[derive(Debug)]
struct Campaign {
    elector: LeaderElector,
    ips: Vec<IpAddr>,
    /// When the last successful write as holder started.
    held_since_try: Option<Instant>,
    next_try: Instant,
}

impl Campaign {
    fn holding(&self, now: Instant, renew_deadline: Duration) -> bool {
        self.held_since_try.is_some_and(|at| now.saturating_duration_since(at) < renew_deadline)
    }
}

/// What the caller announces: the whole set of addresses this node holds, each time it
/// changes.
pub type SetAddresses = Arc<dyn Fn(BTreeSet<IpAddr>) + Send + Sync>;

/// Runs the agent until `stop` is set; then stops announcing and releases every Lease it
/// holds.
pub async fn run_announce_agent(
    client: Client,
    options: AnnounceOptions,
    set_addresses: SetAddresses,
    stop: Arc<AtomicBool>,
) -> Result<(), KubeError> {
    options.lease(&ObjectKey::new("a", "b")).validate().map_err(KubeError::Config)?;
    let mut streams: SelectAll<BoxStream<'static, Incoming>> = SelectAll::new();
    streams.push(
        watcher::watcher(Api::<Service>::all(client.clone()), watcher::Config::default())
            .backoff(WatchBackoff::new())
            .map(Incoming::Service)
            .boxed(),
    );
    streams.push(
        watcher::watcher(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default())
            .backoff(WatchBackoff::new())
            .map(Incoming::Slice)
            .boxed(),
    );
    let mut streams = pin!(streams);
    let mut services: Store<Service> = Store::new();
    let mut slices: Store<EndpointSlice> = Store::new();
    let mut campaigns: BTreeMap<ObjectKey, Campaign> = BTreeMap::new();
    let mut announced: BTreeSet<IpAddr> = BTreeSet::new();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    info!(node = %options.node_name, "L2 announcement: waiting for Services and EndpointSlices");
    while !stop.load(Ordering::Acquire) {
        tokio::select! {
            incoming = streams.next() => {
                let Some(incoming) = incoming else { break };
                let mut handle = |incoming| match incoming {
                    Incoming::Service(event) => services.handle(event),
                    Incoming::Slice(event) => slices.handle(event),
                };
                handle(incoming);
                while let Some(Some(incoming)) = streams.next().now_or_never() {
                    handle(incoming);
                }
            }
            _ = ticker.tick() => {}
        }
        if !(services.synced && slices.synced) {
            continue;
        }
        // Who this node campaigns for now.
        let mut by_service: BTreeMap<ObjectKey, Vec<&EndpointSlice>> = BTreeMap::new();
        for slice in slices.objects.values() {
            let Some(service) = slice.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")) else {
                continue;
            };
            let namespace = slice.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            by_service.entry(ObjectKey::new(namespace, service.clone())).or_default().push(slice);
        }
        let mut candidates: BTreeMap<ObjectKey, Vec<IpAddr>> = BTreeMap::new();
        for (key, service) in &services.objects {
            let own = by_service.get(key).map(Vec::as_slice).unwrap_or_default();
            if let Some(ips) = candidacy(service, own, &options.node_name) {
                candidates.insert(key.clone(), ips);
            }
        }
        // Give up what this node is no longer a candidate for.
        let gone: Vec<ObjectKey> = campaigns.keys().filter(|k| !candidates.contains_key(*k)).cloned().collect();
        for key in gone {
            if let Some(mut campaign) = campaigns.remove(&key) {
                if campaign.holding(Instant::now(), options.renew_deadline) {
                    info!(service = %key, "no longer a candidate: handing the address over");
                    campaign.held_since_try = None;
                    announce(&campaigns, &mut announced, &set_addresses, &options);
                }
                // Best effort: a release that does not arrive only makes the next holder
                // wait out the lease.
                let _ = tokio::time::timeout(options.renew_deadline, campaign.elector.release()).await;
            }
        }
        let now = Instant::now();
        for (key, ips) in &candidates {
            let campaign = campaigns.entry(key.clone()).or_insert_with(|| {
                debug!(service = %key, "campaigning for its Lease");
                Campaign {
                    elector: LeaderElector::new(client.clone(), options.lease(key)),
                    ips: ips.clone(),
                    held_since_try: None,
                    next_try: now,
                }
            });
            campaign.ips.clone_from(ips);
        }
        // Tries that are due, all at once.
        let due: Vec<(&ObjectKey, &mut Campaign)> = campaigns.iter_mut().filter(|(_, c)| c.next_try <= now).collect();
        // Each try is cut short so that the holding check below runs at least this often:
        // a holder past its renew deadline then stops well before a follower may take over.
        let limit = try_limit(&options);
        let tries = due.into_iter().map(|(key, campaign)| async move {
            let started = Instant::now();
            let decision = tokio::time::timeout(limit, campaign.elector.try_acquire_or_renew())
                .await
                .unwrap_or_else(|_| Decision::Wait { holder: String::new() });
            (key, campaign, started, decision)
        });
        let mut lost = Vec::new();
        for (key, campaign, started, decision) in futures::future::join_all(tries).await {
            campaign.next_try = started + options.retry_period;
            match decision {
                Decision::Create | Decision::Acquire | Decision::Renew => {
                    if campaign.held_since_try.is_none() {
                        info!(service = %key, addresses = ?campaign.ips, "holding the Lease: announcing");
                    }
                    campaign.held_since_try = Some(started);
                }
                Decision::Lost { reason } => {
                    info!(service = %key, %reason, "lost the Lease: no longer announcing");
                    lost.push(key.clone());
                }
                Decision::Wait { .. } => {}
            }
        }
        for key in lost {
            if let Some(campaign) = campaigns.get_mut(&key) {
                campaign.held_since_try = None;
                campaign.elector = LeaderElector::new(client.clone(), options.lease(&key));
            }
        }
        announce(&campaigns, &mut announced, &set_addresses, &options);
    }
    // Stop announcing first, then hand every Lease over.
    set_addresses(BTreeSet::new());
    for (key, mut campaign) in campaigns {
        if campaign.held_since_try.is_some() {
            debug!(service = %key, "releasing its Lease");
        }
        let _ = tokio::time::timeout(options.renew_deadline, campaign.elector.release()).await;
    }
    Ok(())
}

/// How long one Lease try may take: half a retry period, and at most half the margin
/// between the renew deadline and the lease duration (the time a holder has to notice it
/// must stop before a follower may take over).
fn try_limit(options: &AnnounceOptions) -> Duration {
    let margin = options.lease_duration.saturating_sub(options.renew_deadline);
    (options.retry_period / 2).min(margin / 2).max(Duration::from_millis(10))
}

fn announce(
    campaigns: &BTreeMap<ObjectKey, Campaign>,
    announced: &mut BTreeSet<IpAddr>,
    set_addresses: &SetAddresses,
    options: &AnnounceOptions,
) {
    let now = Instant::now();
    let held: BTreeSet<IpAddr> = campaigns
        .values()
        .filter(|c| c.holding(now, options.renew_deadline))
        .flat_map(|c| c.ips.iter().copied())
        .collect();
    if held != *announced {
        set_addresses(held.clone());
        *announced = held;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn service(policy: &str, ingress: &[&str]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                external_traffic_policy: Some(policy.into()),
                ..ServiceSpec::default()
            }),
            status: Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        ingress
                            .iter()
                            .map(|ip| LoadBalancerIngress { ip: Some((*ip).into()), ..Default::default() })
                            .collect(),
                    ),
                }),
                ..ServiceStatus::default()
            }),
        }
    }

    fn slice(endpoints: &[(&str, Option<bool>)]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: endpoints
                .iter()
                .map(|(node, ready)| Endpoint {
                    addresses: vec!["198.18.129.1".into()],
                    node_name: Some((*node).into()),
                    conditions: Some(EndpointConditions { ready: *ready, ..EndpointConditions::default() }),
                    ..Endpoint::default()
                })
                .collect(),
            ..EndpointSlice::default()
        }
    }

    #[test]
    fn under_cluster_policy_every_node_is_a_candidate_for_an_assigned_address() {
        let s = service("Cluster", &["198.18.0.224"]);
        assert_eq!(candidacy(&s, &[], "node1"), Some(vec!["198.18.0.224".parse().unwrap()]));
        assert_eq!(candidacy(&service("Cluster", &[]), &[], "node1"), None, "nothing assigned yet");
    }

    #[test]
    fn under_local_policy_only_a_node_with_a_ready_local_endpoint_is_a_candidate() {
        let s = service("Local", &["198.18.0.224"]);
        let slices = slice(&[("node1", Some(true)), ("node2", Some(false))]);
        assert!(candidacy(&s, &[&slices], "node1").is_some());
        assert_eq!(candidacy(&s, &[&slices], "node2"), None, "its endpoint is not ready");
        assert_eq!(candidacy(&s, &[&slices], "node3"), None, "no endpoint there");
        assert!(candidacy(&s, &[&slice(&[("node3", None)])], "node3").is_some(), "unset ready counts as ready");
    }

    #[test]
    fn a_service_of_another_class_is_never_announced() {
        let mut s = service("Cluster", &["198.18.0.224"]);
        s.spec.as_mut().unwrap().load_balancer_class = Some("example.com/cloud".into());
        assert_eq!(candidacy(&s, &[], "node1"), None);
    }

    #[test]
    fn a_try_ends_before_a_late_holding_check_could_overlap_a_takeover() {
        let defaults = AnnounceOptions::new("node1");
        assert_eq!(try_limit(&defaults), Duration::from_millis(250));
        // The worst case: the last success started at 0, the next try hangs to its limit.
        let stops_by = defaults.renew_deadline + try_limit(&defaults) + TICK;
        assert!(stops_by < defaults.lease_duration, "{stops_by:?}");
        let tight = AnnounceOptions { renew_deadline: Duration::from_millis(1900), ..defaults };
        assert_eq!(try_limit(&tight), Duration::from_millis(50));
    }

    #[test]
    fn lease_names_are_unambiguous_and_the_default_timings_are_a_valid_election() {
        assert_eq!(lease_name(&ObjectKey::new("a-b", "c")), "svcplane-l2.a-b.c");
        assert_ne!(lease_name(&ObjectKey::new("a-b", "c")), lease_name(&ObjectKey::new("a", "b-c")));
        assert_eq!(AnnounceOptions::new("node1").lease(&ObjectKey::new("default", "web")).validate(), Ok(()));
    }
}
