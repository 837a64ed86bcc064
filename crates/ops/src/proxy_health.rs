//! The proxy's own health, answered on `/healthz` and `/livez` as kube-proxy v1.36 answers
//! them, so a DaemonSet's probes and load balancers read svcplane the same way.
//!
//! Per IP family: when the last sync succeeded, and since when a change has been waiting
//! for a sync. A family is unhealthy once a change has waited longer than the timeout
//! (kube-proxy uses twice the sync period); before the first sync nothing is reported and
//! the proxy counts as healthy. `/healthz` is also 503 while this node is leaving
//! (deleted, or tainted by the cluster autoscaler) or not known yet; `/livez` ignores the
//! node. Both answer a JSON body and count their answers by code.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use svcplane_core::IpFamily;
use svcplane_metrics::{PROXY_HEALTHZ_TOTAL, PROXY_LIVEZ_TOTAL, Registry};

use crate::http::{Response, Routes};

const NODE_UNKNOWN: u8 = 0;
const NODE_ELIGIBLE: u8 = 1;
const NODE_LEAVING: u8 = 2;

#[derive(Debug, Default)]
struct Families {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_pending: BTreeMap<IpFamily, SystemTime>,
}

/// Shared between the sync loop (which reports) and the healthz server (which answers).
#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    families: Mutex<Families>,
    node: AtomicU8,
    metrics: Arc<Registry>,
}

/// One answer, before it is written as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthAnswer {
    pub healthy: bool,
    pub last_updated: Option<SystemTime>,
    pub current_time: SystemTime,
    /// Per family: last successful sync and whether it is healthy.
    pub status: BTreeMap<IpFamily, (SystemTime, bool)>,
}

impl ProxyHealth {
    /// `timeout`: how long a change may wait for a sync before the proxy is unhealthy.
    pub fn new(timeout: Duration, metrics: Arc<Registry>) -> Self {
        Self { timeout, families: Mutex::default(), node: AtomicU8::new(NODE_UNKNOWN), metrics }
    }

    fn families(&self) -> std::sync::MutexGuard<'_, Families> {
        self.families.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A change for `family` arrived and waits for a sync (the oldest one counts).
    pub fn queued(&self, family: IpFamily, now: SystemTime) {
        self.families().oldest_pending.entry(family).or_insert(now);
    }

    /// A sync of `family` succeeded: nothing waits any more.
    pub fn updated(&self, family: IpFamily, now: SystemTime) {
        let mut families = self.families();
        families.oldest_pending.remove(&family);
        families.last_updated.insert(family, now);
    }

    /// This node's state: `Some(true)` while it is leaving, `None` while it is not known.
    pub fn set_node_leaving(&self, leaving: Option<bool>) {
        let value = match leaving {
            None => NODE_UNKNOWN,
            Some(false) => NODE_ELIGIBLE,
            Some(true) => NODE_LEAVING,
        };
        self.node.store(value, Ordering::Release);
    }

    pub fn node_eligible(&self) -> bool {
        self.node.load(Ordering::Acquire) == NODE_ELIGIBLE
    }

    /// The sync loop's health at `now`, ignoring the node.
    pub fn health(&self, now: SystemTime) -> HealthAnswer {
        let families = self.families();
        let mut answer = HealthAnswer {
            healthy: true,
            last_updated: families.last_updated.values().max().copied(),
            current_time: now,
            status: BTreeMap::new(),
        };
        for (family, updated) in &families.last_updated {
            let late = families
                .oldest_pending
                .get(family)
                .is_some_and(|queued| now.duration_since(*queued).unwrap_or_default() >= self.timeout);
            answer.healthy &= !late;
            answer.status.insert(*family, (*updated, !late));
        }
        answer
    }

    /// `/healthz`: the loop's health and this node's eligibility.
    pub fn healthz(&self, now: SystemTime) -> Response {
        let mut answer = self.health(now);
        let eligible = self.node_eligible();
        let healthy = answer.healthy && eligible;
        // As kube-proxy: a healthy answer reports "now" as the last update (older clients
        // read it as "the loop is alive"); the metrics tell the real sync times.
        if healthy {
            answer.last_updated = Some(now);
        }
        let code = if healthy { 200 } else { 503 };
        self.metrics.add(PROXY_HEALTHZ_TOTAL, &[&code.to_string()], 1.0);
        Response::json(code, answer.to_json(Some(eligible))).with_header("X-Content-Type-Options", "nosniff")
    }

    /// `/livez`: the loop's health alone.
    pub fn livez(&self, now: SystemTime) -> Response {
        let mut answer = self.health(now);
        if answer.healthy {
            answer.last_updated = Some(now);
        }
        let code = if answer.healthy { 200 } else { 503 };
        self.metrics.add(PROXY_LIVEZ_TOTAL, &[&code.to_string()], 1.0);
        Response::json(code, answer.to_json(None)).with_header("X-Content-Type-Options", "nosniff")
    }
}

impl HealthAnswer {
    /// kube-proxy's JSON: `lastUpdated`, `currentTime`, `nodeEligible` (healthz only),
    /// `healthy`, and `status` per family when any sync happened.
    pub fn to_json(&self, node_eligible: Option<bool>) -> String {
        let mut out = format!(
            "{{\"lastUpdated\":\"{}\",\"currentTime\":\"{}\"",
            go_time(self.last_updated),
            go_time(Some(self.current_time))
        );
        if let Some(eligible) = node_eligible {
            out.push_str(&format!(",\"nodeEligible\":{eligible}"));
        }
        out.push_str(&format!(",\"healthy\":{}", self.healthy));
        if !self.status.is_empty() {
            let entries: Vec<String> = self
                .status
                .iter()
                .map(|(family, (updated, healthy))| {
                    format!(
                        "\"{}\":{{\"lastUpdated\":\"{}\",\"healthy\":{healthy}}}",
                        family_label(*family),
                        go_time(Some(*updated))
                    )
                })
                .collect();
            out.push_str(&format!(",\"status\":{{{}}}", entries.join(",")));
        }
        out.push('}');
        out
    }
}

/// `IPv4` / `IPv6`, as Kubernetes names the families (metric labels, JSON keys).
pub fn family_label(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// A time as Go's JSON encoding writes it (RFC 3339 with nanoseconds, trailing zeros
/// trimmed); no time is Go's zero time.
pub fn go_time(time: Option<SystemTime>) -> String {
    match time.and_then(|t| jiff::Timestamp::try_from(t).ok()) {
        Some(at) => at.to_string(),
        None => "0001-01-01T00:00:00Z".to_owned(),
    }
}

/// `/healthz` and `/livez` on the healthz server.
pub fn healthz_routes(health: &Arc<ProxyHealth>) -> Routes {
    let for_healthz = Arc::clone(health);
    let for_livez = Arc::clone(health);
    Routes::new()
        .route("/healthz", move |_| for_healthz.healthz(SystemTime::now()))
        .route("/livez", move |_| for_livez.livez(SystemTime::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + seconds)
    }

    fn health() -> ProxyHealth {
        ProxyHealth::new(Duration::from_secs(60), Arc::new(Registry::kube_proxy()))
    }

    #[test]
    fn before_the_first_sync_the_proxy_is_live_and_reports_no_families() {
        let health = health();
        health.queued(IpFamily::V4, at(0));
        let answer = health.livez(at(600));
        assert_eq!(answer.status, 200);
        let body = String::from_utf8(answer.body).unwrap();
        assert!(body.starts_with("{\"lastUpdated\":\""), "{body}");
        assert!(!body.contains("status"), "{body}");
    }

    #[test]
    fn a_change_waiting_longer_than_the_timeout_makes_both_endpoints_503() {
        let health = health();
        health.set_node_leaving(Some(false));
        health.updated(IpFamily::V4, at(0));
        health.updated(IpFamily::V6, at(0));
        health.queued(IpFamily::V4, at(10));
        assert_eq!(health.healthz(at(69)).status, 200);
        let late = health.healthz(at(70));
        assert_eq!(late.status, 503);
        let body = String::from_utf8(late.body).unwrap();
        assert!(body.contains("\"IPv4\":{\"lastUpdated\":\"2027-01-15T08:00:00Z\",\"healthy\":false}"), "{body}");
        assert!(body.contains("\"IPv6\":{\"lastUpdated\":\"2027-01-15T08:00:00Z\",\"healthy\":true}"), "{body}");
        assert_eq!(health.livez(at(70)).status, 503);
        health.updated(IpFamily::V4, at(71));
        assert_eq!(health.healthz(at(72)).status, 200);
    }

    #[test]
    fn a_leaving_or_unknown_node_fails_healthz_but_not_livez() {
        let health = health();
        health.updated(IpFamily::V4, at(0));
        assert_eq!(health.healthz(at(1)).status, 503, "node not known yet");
        health.set_node_leaving(Some(true));
        let answer = health.healthz(at(1));
        assert_eq!(answer.status, 503);
        assert!(String::from_utf8(answer.body).unwrap().contains("\"nodeEligible\":false"));
        assert_eq!(health.livez(at(1)).status, 200);
        health.set_node_leaving(Some(false));
        assert_eq!(health.healthz(at(1)).status, 200);
    }

    #[test]
    fn answers_are_counted_by_code() {
        let registry = Arc::new(Registry::kube_proxy());
        let health = ProxyHealth::new(Duration::from_secs(60), Arc::clone(&registry));
        health.healthz(at(0));
        health.set_node_leaving(Some(false));
        health.healthz(at(0));
        health.livez(at(0));
        assert_eq!(registry.value(PROXY_HEALTHZ_TOTAL, &["503"]), 1.0);
        assert_eq!(registry.value(PROXY_HEALTHZ_TOTAL, &["200"]), 1.0);
        assert_eq!(registry.value(PROXY_LIVEZ_TOTAL, &["200"]), 1.0);
    }

    #[test]
    fn go_times_trim_trailing_zeros_and_the_zero_time_is_gos() {
        assert_eq!(go_time(None), "0001-01-01T00:00:00Z");
        assert_eq!(go_time(Some(at(0) + Duration::from_millis(250))), "2027-01-15T08:00:00.25Z");
    }
}
