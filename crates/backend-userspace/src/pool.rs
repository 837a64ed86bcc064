//! One service port's endpoints as the relay sees them: which to try, in which order
//! (round robin, ClientIP affinity with its timeout, endpoints that just failed last),
//! which are still serving (connections to the others are closed), and the limits.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use svcplane_core::{EndpointSetKind, Endpoints, ServicePortPlan};
use tokio::sync::watch;

use crate::stats::Stats;

/// How long an endpoint whose connect just failed goes to the back of the line.
pub const FAILED_FOR: Duration = Duration::from_secs(5);

/// The endpoints every new connection chooses from, replaced at each sync.
#[derive(Debug, Default)]
struct Choice {
    cluster: Endpoints,
    local: Endpoints,
    affinity: Option<Duration>,
    /// Round-robin positions, per endpoint set.
    next: [usize; 2],
    /// ClientIP affinity: the client's endpoint and when it last opened a connection.
    sticky: HashMap<IpAddr, (SocketAddr, Instant)>,
    /// Endpoints whose last connect failed, until when they are tried last.
    failed: HashMap<SocketAddr, Instant>,
    /// New connections (TCP) or sessions (UDP) relayed to each endpoint.
    connections: HashMap<SocketAddr, u64>,
}

/// A service port's shared relay state.
#[derive(Debug)]
pub struct Pool {
    /// `namespace/name:port` for logs and counters.
    pub name: String,
    choice: Mutex<Choice>,
    /// Endpoints that may keep their connections (the plan's serving endpoints).
    serving: watch::Sender<Arc<HashSet<SocketAddr>>>,
    /// Open connections or sessions.
    active: AtomicUsize,
    pub max_active: usize,
    pub stats: Arc<Stats>,
    /// Refusals for a full table, logged at most once per second.
    last_full_warning: AtomicU64,
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The service port holds `max_connections` already.
    Full,
    /// The relay holds all the descriptors it may.
    NoDescriptors,
}

fn index(set: EndpointSetKind) -> usize {
    match set {
        EndpointSetKind::Cluster => 0,
        EndpointSetKind::Local => 1,
    }
}

/// A slot in a pool's table of open connections with the descriptors it may use, given
/// back on drop.
#[derive(Debug)]
pub struct Slot {
    pool: Arc<Pool>,
    descriptors: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.active.fetch_sub(1, Ordering::Relaxed);
        self.pool.stats.active.fetch_sub(1, Ordering::Relaxed);
        self.pool.stats.fds_held.fetch_sub(self.descriptors, Ordering::Relaxed);
    }
}

impl Pool {
    pub fn new(name: String, max_active: usize, stats: Arc<Stats>) -> Self {
        Self {
            name,
            choice: Mutex::new(Choice::default()),
            serving: watch::Sender::new(Arc::new(HashSet::new())),
            active: AtomicUsize::new(0),
            max_active,
            stats,
            last_full_warning: AtomicU64::new(0),
        }
    }

    fn choice(&self) -> MutexGuard<'_, Choice> {
        self.choice.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes in a new plan of the port: new connections only go to its endpoints;
    /// connections to endpoints no longer serving are told to close.
    pub fn update(&self, plan: &ServicePortPlan) {
        {
            let mut choice = self.choice();
            choice.cluster = plan.cluster_endpoints.clone();
            choice.local = plan.local_endpoints.clone();
            choice.affinity = plan.affinity.map(|a| a.timeout);
            let known: HashSet<SocketAddr> = plan.serving_endpoints.iter().copied().collect();
            choice.connections.retain(|endpoint, _| known.contains(endpoint));
            choice.failed.retain(|endpoint, _| known.contains(endpoint));
            if choice.affinity.is_none() {
                choice.sticky.clear();
            }
        }
        let serving: HashSet<SocketAddr> = plan.serving_endpoints.iter().copied().collect();
        self.serving.send_if_modified(|current| {
            if **current == serving {
                return false;
            }
            *current = Arc::new(serving);
            true
        });
    }

    /// The port is gone: every connection starts its grace period.
    pub fn retire(&self) {
        self.serving.send_replace(Arc::new(HashSet::new()));
    }

    pub fn watch_serving(&self) -> watch::Receiver<Arc<HashSet<SocketAddr>>> {
        self.serving.subscribe()
    }

    /// A slot for one more connection that holds `descriptors` file descriptors, or why
    /// not: the port's table is full, or the relay's descriptors are all in use. Either is
    /// counted and logged (at most once a second), and the caller refuses the client at once.
    pub fn admit(self: &Arc<Self>, descriptors: u64) -> Result<Slot, Refused> {
        let budget = self.stats.fd_budget.load(Ordering::Relaxed);
        let held = self.stats.fds_held.fetch_add(descriptors, Ordering::Relaxed);
        if held + descriptors > budget {
            self.stats.fds_held.fetch_sub(descriptors, Ordering::Relaxed);
            self.stats.refused_no_fds.fetch_add(1, Ordering::Relaxed);
            self.warn_once_a_second(&format!(
                "the relay holds {held} file descriptors, all it may (RLIMIT_NOFILE less a reserve): \
                 a new connection to {} is refused",
                self.name
            ));
            return Err(Refused::NoDescriptors);
        }
        let admitted = self
            .active
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < self.max_active).then_some(n + 1))
            .is_ok();
        if !admitted {
            self.stats.fds_held.fetch_sub(descriptors, Ordering::Relaxed);
            self.stats.refused_full.fetch_add(1, Ordering::Relaxed);
            self.warn_once_a_second(&format!(
                "the relay's connection table of {} is full ({} open, --userspace-max-connections): new \
                 connections are refused until some end",
                self.name, self.max_active
            ));
            return Err(Refused::Full);
        }
        self.stats.active.fetch_add(1, Ordering::Relaxed);
        Ok(Slot { pool: self.clone(), descriptors })
    }

    fn warn_once_a_second(&self, message: &str) {
        let now = self.stats.uptime_secs() + 1;
        if self.last_full_warning.swap(now, Ordering::Relaxed) != now {
            tracing::warn!(service_port = %self.name, "{message}");
        }
    }

    pub fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// The endpoints to try for a new connection of `client` through `set`, in order: the
    /// client's affinity endpoint if it still is eligible, else the next in turn (a random
    /// one for affinity Services, so a returning client is not handed back by rote), then
    /// every other eligible endpoint; those whose connect failed lately go last.
    pub fn candidates(&self, set: EndpointSetKind, client: IpAddr) -> Vec<SocketAddr> {
        let now = Instant::now();
        let mut choice = self.choice();
        let choice = &mut *choice;
        let endpoints = match set {
            EndpointSetKind::Cluster => &choice.cluster,
            EndpointSetKind::Local => &choice.local,
        };
        if endpoints.is_empty() {
            return Vec::new();
        }
        let count = endpoints.len();
        let start = match choice.affinity {
            Some(timeout) => match choice.sticky.get(&client) {
                Some((endpoint, last)) if now.duration_since(*last) < timeout => {
                    endpoints.iter().position(|e| e == endpoint).unwrap_or_else(|| fastrand::usize(..count))
                }
                _ => fastrand::usize(..count),
            },
            None => {
                let next = &mut choice.next[index(set)];
                let start = *next % count;
                *next = (start + 1) % count;
                start
            }
        };
        choice.failed.retain(|_, until| *until > now);
        let mut ordered: Vec<SocketAddr> = (0..count).map(|i| endpoints[(start + i) % count]).collect();
        // Stable: the healthy keep their turn order, the failed keep theirs after them.
        ordered.sort_by_key(|endpoint| choice.failed.contains_key(endpoint));
        ordered
    }

    /// A connection (or session) of `client` went to `endpoint`.
    pub fn connected(&self, client: IpAddr, endpoint: SocketAddr) {
        let mut choice = self.choice();
        if choice.affinity.is_some() {
            choice.sticky.insert(client, (endpoint, Instant::now()));
            if choice.sticky.len() > 65_536 {
                let now = Instant::now();
                let timeout = choice.affinity.unwrap_or_default();
                choice.sticky.retain(|_, (_, last)| now.duration_since(*last) < timeout);
            }
        }
        choice.failed.remove(&endpoint);
        *choice.connections.entry(endpoint).or_insert(0) += 1;
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A connect to `endpoint` failed (refused, timed out, unreachable).
    pub fn failed(&self, endpoint: SocketAddr) {
        self.choice().failed.insert(endpoint, Instant::now() + FAILED_FOR);
        self.stats.connect_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// New connections per endpoint since the endpoint appeared.
    pub fn connection_counts(&self) -> Vec<(SocketAddr, u64)> {
        let mut counts: Vec<(SocketAddr, u64)> = self.choice().connections.iter().map(|(e, n)| (*e, *n)).collect();
        counts.sort();
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcplane_core::{IpFamily, NamespacedName, Protocol, Refusal, ServicePortName};

    fn plan(endpoints: &[&str]) -> ServicePortPlan {
        let endpoints: Vec<SocketAddr> = endpoints.iter().map(|e| e.parse().unwrap()).collect();
        ServicePortPlan {
            name: ServicePortName {
                service: NamespacedName::new("default", "web"),
                port_name: "http".into(),
                protocol: Protocol::Tcp,
            },
            family: IpFamily::V4,
            protocol: Protocol::Tcp,
            frontends: Vec::new(),
            cluster_endpoints: endpoints.clone().into(),
            local_endpoints: endpoints[..1].into(),
            serving_endpoints: endpoints.into(),
            affinity: None,
            refusal: Refusal::TcpReset,
            masquerade_hairpin: true,
        }
    }

    fn pool() -> Arc<Pool> {
        Arc::new(Pool::new("default/web:http".into(), 2, Arc::new(Stats::default())))
    }

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 129, 9));

    #[test]
    fn new_connections_take_the_endpoints_in_turn_and_list_the_others_after() {
        let pool = pool();
        pool.update(&plan(&["198.18.129.2:80", "198.18.129.3:80", "198.18.130.2:80"]));
        let firsts: Vec<SocketAddr> = (0..6).map(|_| pool.candidates(EndpointSetKind::Cluster, CLIENT)[0]).collect();
        assert_eq!(firsts[..3], firsts[3..]);
        let mut distinct = firsts[..3].to_vec();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        assert_eq!(pool.candidates(EndpointSetKind::Cluster, CLIENT).len(), 3);
    }

    #[test]
    fn an_endpoint_whose_connect_failed_is_tried_last() {
        let pool = pool();
        pool.update(&plan(&["198.18.129.2:80", "198.18.129.3:80"]));
        pool.failed("198.18.129.2:80".parse().unwrap());
        for _ in 0..4 {
            let order = pool.candidates(EndpointSetKind::Cluster, CLIENT);
            assert_eq!(order, ["198.18.129.3:80".parse().unwrap(), "198.18.129.2:80".parse().unwrap()]);
        }
    }

    #[test]
    fn a_client_with_affinity_keeps_its_endpoint_while_it_is_eligible() {
        let pool = pool();
        let mut with_affinity = plan(&["198.18.129.2:80", "198.18.129.3:80", "198.18.130.2:80"]);
        with_affinity.affinity = Some(svcplane_core::ClientIpAffinity { timeout: Duration::from_secs(60) });
        pool.update(&with_affinity);
        let first = pool.candidates(EndpointSetKind::Cluster, CLIENT)[0];
        pool.connected(CLIENT, first);
        for _ in 0..10 {
            assert_eq!(pool.candidates(EndpointSetKind::Cluster, CLIENT)[0], first);
        }
        with_affinity.cluster_endpoints =
            with_affinity.cluster_endpoints.iter().copied().filter(|e| *e != first).collect();
        pool.update(&with_affinity);
        assert_ne!(pool.candidates(EndpointSetKind::Cluster, CLIENT)[0], first);
    }

    #[test]
    fn a_full_table_refuses_and_counts_until_a_slot_is_given_back() {
        let pool = pool();
        let a = pool.admit(2).expect("first");
        let _b = pool.admit(2).expect("second");
        assert_eq!(pool.admit(2).unwrap_err(), Refused::Full);
        assert_eq!(pool.stats.refused_full.load(Ordering::Relaxed), 1);
        assert_eq!(pool.stats.fds_held.load(Ordering::Relaxed), 4);
        drop(a);
        assert!(pool.admit(2).is_ok());
    }

    #[test]
    fn a_connection_that_would_exceed_the_descriptor_budget_is_refused_and_counted() {
        let pool = Arc::new(Pool::new("default/web:http".into(), 100, Arc::new(Stats::default())));
        pool.stats.fd_budget.store(5, Ordering::Relaxed);
        let _a = pool.admit(2).expect("2 of 5");
        let _b = pool.admit(2).expect("4 of 5");
        assert_eq!(pool.admit(2).unwrap_err(), Refused::NoDescriptors);
        assert_eq!(pool.stats.refused_no_fds.load(Ordering::Relaxed), 1);
        assert_eq!(pool.active(), 2);
        let _c = pool.admit(1).expect("a UDP session still fits");
    }

    #[test]
    fn the_local_set_offers_only_local_endpoints() {
        let pool = pool();
        pool.update(&plan(&["198.18.129.2:80", "198.18.130.2:80"]));
        assert_eq!(pool.candidates(EndpointSetKind::Local, CLIENT), ["198.18.129.2:80".parse().unwrap()]);
    }
}
