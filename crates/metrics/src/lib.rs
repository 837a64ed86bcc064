//! svcplane-metrics: kube-proxy's metrics, kept in memory and written in the Prometheus
//! text exposition format (version 0.0.4).
//!
//! It holds counters, gauges and histograms under kube-proxy's names, types, labels and
//! bucket layouts (`kubeproxy_` namespace, upstream `pkg/proxy/metrics`; per-family series carry
//! `ip_family` = `IPv4`/`IPv6` as upstream's dual-stack proxies do), and renders them.
//! It does not serve HTTP, does not time syncs itself and knows nothing of modes: the sync
//! loop and the binary feed it and serve its text.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: name (with namespace), type, help, label names, histogram buckets.
#[derive(Debug, Clone)]
pub struct Desc {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [&'static str],
    pub buckets: Vec<f64>,
}

/// `count` buckets starting at `start`, each `factor` times the previous (Prometheus'
/// ExponentialBuckets).
pub fn exponential_buckets(start: f64, factor: f64, count: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(count);
    let mut b = start;
    for _ in 0..count {
        out.push(b);
        b *= factor;
    }
    out
}

/// `count` buckets starting at `start`, `width` apart (Prometheus' LinearBuckets).
pub fn linear_buckets(start: f64, width: f64, count: usize) -> Vec<f64> {
    (0..count).map(|i| start + width * i as f64).collect()
}

/// kube-proxy's sync-duration buckets: 1 ms doubling 15 times.
fn sync_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 15)
}

/// kube-proxy's network-programming buckets: 0.25 s to 1 min, then to 5 min.
fn programming_buckets() -> Vec<f64> {
    let mut b = linear_buckets(0.25, 0.25, 2);
    b.extend(linear_buckets(1.0, 1.0, 59));
    b.extend(linear_buckets(60.0, 5.0, 12));
    b.extend(linear_buckets(120.0, 30.0, 7));
    b
}

pub const SYNC_PROXY_RULES_DURATION: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
pub const SYNC_FULL_PROXY_RULES_DURATION: &str = "kubeproxy_sync_full_proxy_rules_duration_seconds";
pub const SYNC_PARTIAL_PROXY_RULES_DURATION: &str = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
pub const SYNC_PROXY_RULES_LAST_TIMESTAMP: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";
pub const SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP: &str = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds";
pub const NETWORK_PROGRAMMING_DURATION: &str = "kubeproxy_network_programming_duration_seconds";
pub const ENDPOINT_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_pending";
pub const ENDPOINT_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_endpoint_changes_total";
pub const SERVICE_CHANGES_PENDING: &str = "kubeproxy_sync_proxy_rules_service_changes_pending";
pub const SERVICE_CHANGES_TOTAL: &str = "kubeproxy_sync_proxy_rules_service_changes_total";
pub const NO_LOCAL_ENDPOINTS_TOTAL: &str = "kubeproxy_sync_proxy_rules_no_local_endpoints_total";
pub const IPTABLES_RESTORE_FAILURES_TOTAL: &str = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total";
pub const IPTABLES_PARTIAL_RESTORE_FAILURES_TOTAL: &str =
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total";
pub const IPTABLES_LAST: &str = "kubeproxy_sync_proxy_rules_iptables_last";
pub const IPTABLES_TOTAL: &str = "kubeproxy_sync_proxy_rules_iptables_total";
pub const NFTABLES_SYNC_FAILURES_TOTAL: &str = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total";
pub const NFTABLES_CLEANUP_FAILURES_TOTAL: &str = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total";
pub const PROXY_HEALTHZ_TOTAL: &str = "kubeproxy_proxy_healthz_total";
pub const PROXY_LIVEZ_TOTAL: &str = "kubeproxy_proxy_livez_total";

/// Every family svcplane exposes, with kube-proxy's type, help and labels.
pub fn kube_proxy_descs() -> Vec<Desc> {
    use Kind::{Counter, Gauge, Histogram};
    let d = |name, kind, help, labels: &'static [&'static str], buckets: Vec<f64>| Desc {
        name,
        kind,
        help,
        labels,
        buckets,
    };
    vec![
        d(SYNC_PROXY_RULES_DURATION, Histogram, "SyncProxyRules latency in seconds", &["ip_family"], sync_buckets()),
        d(
            SYNC_FULL_PROXY_RULES_DURATION,
            Histogram,
            "SyncProxyRules latency in seconds for full resyncs",
            &["ip_family"],
            sync_buckets(),
        ),
        d(
            SYNC_PARTIAL_PROXY_RULES_DURATION,
            Histogram,
            "SyncProxyRules latency in seconds for partial resyncs",
            &["ip_family"],
            sync_buckets(),
        ),
        d(
            SYNC_PROXY_RULES_LAST_TIMESTAMP,
            Gauge,
            "The last time proxy rules were successfully synced",
            &["ip_family"],
            vec![],
        ),
        d(
            SYNC_PROXY_RULES_LAST_QUEUED_TIMESTAMP,
            Gauge,
            "The last time a sync of proxy rules was queued",
            &["ip_family"],
            vec![],
        ),
        d(
            NETWORK_PROGRAMMING_DURATION,
            Histogram,
            "In Cluster Network Programming Latency in seconds",
            &["ip_family"],
            programming_buckets(),
        ),
        d(ENDPOINT_CHANGES_PENDING, Gauge, "Pending proxy rules Endpoint changes", &[], vec![]),
        d(ENDPOINT_CHANGES_TOTAL, Counter, "Cumulative proxy rules Endpoint changes", &[], vec![]),
        d(SERVICE_CHANGES_PENDING, Gauge, "Pending proxy rules Service changes", &[], vec![]),
        d(SERVICE_CHANGES_TOTAL, Counter, "Cumulative proxy rules Service changes", &[], vec![]),
        d(
            NO_LOCAL_ENDPOINTS_TOTAL,
            Gauge,
            "Number of services with a Local traffic policy and no endpoints",
            &["ip_family", "traffic_policy"],
            vec![],
        ),
        d(
            IPTABLES_RESTORE_FAILURES_TOTAL,
            Counter,
            "Cumulative proxy iptables restore failures",
            &["ip_family"],
            vec![],
        ),
        d(
            IPTABLES_PARTIAL_RESTORE_FAILURES_TOTAL,
            Counter,
            "Cumulative proxy iptables partial restore failures",
            &["ip_family"],
            vec![],
        ),
        d(
            IPTABLES_LAST,
            Gauge,
            "Number of iptables rules written by kube-proxy in last sync",
            &["ip_family", "table"],
            vec![],
        ),
        d(IPTABLES_TOTAL, Gauge, "Total number of iptables rules owned by kube-proxy", &["ip_family", "table"], vec![]),
        d(NFTABLES_SYNC_FAILURES_TOTAL, Counter, "Cumulative proxy nftables sync failures", &["ip_family"], vec![]),
        d(
            NFTABLES_CLEANUP_FAILURES_TOTAL,
            Counter,
            "Cumulative proxy nftables cleanup failures",
            &["ip_family"],
            vec![],
        ),
        d(PROXY_HEALTHZ_TOTAL, Counter, "Cumulative proxy healthz HTTP status", &["code"], vec![]),
        d(PROXY_LIVEZ_TOTAL, Counter, "Cumulative proxy livez HTTP status", &["code"], vec![]),
    ]
}

#[derive(Debug, Default, Clone)]
struct Series {
    value: f64,
    bucket_counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// A registry of metric families and their labelled series.
#[derive(Debug)]
pub struct Registry {
    descs: Vec<Desc>,
    series: Mutex<BTreeMap<(&'static str, Vec<String>), Series>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::kube_proxy()
    }
}

impl Registry {
    /// A registry with kube-proxy's families; unlabelled series start at zero (labelled
    /// ones appear when first fed, as with upstream's vectors).
    pub fn kube_proxy() -> Self {
        Self::with(kube_proxy_descs())
    }

    pub fn with(descs: Vec<Desc>) -> Self {
        let mut series = BTreeMap::new();
        for d in &descs {
            if d.labels.is_empty() {
                series
                    .insert((d.name, vec![]), Series { bucket_counts: vec![0; d.buckets.len()], ..Series::default() });
            }
        }
        Self { descs, series: Mutex::new(series) }
    }

    fn desc(&self, name: &str) -> &Desc {
        self.descs.iter().find(|d| d.name == name).unwrap_or_else(|| panic!("metric {name} is not registered"))
    }

    fn with_series(&self, name: &str, labels: &[&str], f: impl FnOnce(&Desc, &mut Series)) {
        let desc = self.desc(name);
        assert_eq!(desc.labels.len(), labels.len(), "metric {name} takes labels {:?}", desc.labels);
        let key = (desc.name, labels.iter().map(|l| (*l).to_owned()).collect());
        let mut all = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let s = all
            .entry(key)
            .or_insert_with(|| Series { bucket_counts: vec![0; desc.buckets.len()], ..Series::default() });
        f(desc, s);
    }

    /// Adds `by` to a counter (or gauge).
    pub fn add(&self, name: &str, labels: &[&str], by: f64) {
        self.with_series(name, labels, |_, s| s.value += by);
    }

    /// Sets a gauge.
    pub fn set(&self, name: &str, labels: &[&str], value: f64) {
        self.with_series(name, labels, |_, s| s.value = value);
    }

    /// Records one observation in a histogram.
    pub fn observe(&self, name: &str, labels: &[&str], value: f64) {
        self.with_series(name, labels, |d, s| {
            for (i, b) in d.buckets.iter().enumerate() {
                if value <= *b {
                    s.bucket_counts[i] += 1;
                }
            }
            s.sum += value;
            s.count += 1;
        });
    }

    /// The current value of a counter or gauge series (0 if never touched).
    pub fn value(&self, name: &str, labels: &[&str]) -> f64 {
        let key = (self.desc(name).name, labels.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>());
        self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).map_or(0.0, |s| s.value)
    }

    /// The number of observations in a histogram series.
    pub fn count(&self, name: &str, labels: &[&str]) -> u64 {
        let key = (self.desc(name).name, labels.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>());
        self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).map_or(0, |s| s.count)
    }

    /// The names of the registered families.
    pub fn names(&self) -> Vec<&'static str> {
        self.descs.iter().map(|d| d.name).collect()
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let all = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = String::new();
        for d in &self.descs {
            let _ = writeln!(out, "# HELP {} {}", d.name, escape_help(d.help));
            let _ = writeln!(out, "# TYPE {} {}", d.name, d.kind.as_str());
            for ((name, values), s) in all.range((d.name, vec![])..) {
                if *name != d.name {
                    break;
                }
                let pairs: Vec<String> =
                    d.labels.iter().zip(values).map(|(k, v)| format!("{k}=\"{}\"", escape_label(v))).collect();
                match d.kind {
                    Kind::Counter | Kind::Gauge => {
                        let _ = writeln!(out, "{}{} {}", d.name, braces(&pairs), number(s.value));
                    }
                    Kind::Histogram => {
                        for (b, c) in d.buckets.iter().zip(&s.bucket_counts) {
                            let mut p = pairs.clone();
                            p.push(format!("le=\"{}\"", number(*b)));
                            let _ = writeln!(out, "{}_bucket{} {c}", d.name, braces(&p));
                        }
                        let mut p = pairs.clone();
                        p.push("le=\"+Inf\"".to_owned());
                        let _ = writeln!(out, "{}_bucket{} {}", d.name, braces(&p), s.count);
                        let _ = writeln!(out, "{}_sum{} {}", d.name, braces(&pairs), number(s.sum));
                        let _ = writeln!(out, "{}_count{} {}", d.name, braces(&pairs), s.count);
                    }
                }
            }
        }
        out
    }
}

fn braces(pairs: &[String]) -> String {
    if pairs.is_empty() { String::new() } else { format!("{{{}}}", pairs.join(",")) }
}

fn number(v: f64) -> String {
    if v.is_infinite() { if v > 0.0 { "+Inf".into() } else { "-Inf".into() } } else { format!("{v}") }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"")
}

#[cfg(test)]
mod tests;
