//! CoreDNS's request metrics for `svcplane dns`, counted without locks on the hot path and
//! written in the Prometheus text format.
//!
//! Names, labels and buckets are CoreDNS's (`prometheus` plugin), so dashboards and alerts
//! made for CoreDNS keep working:
//!
//! - `coredns_dns_requests_total{server,zone,view,proto,family,type}`
//! - `coredns_dns_responses_total{server,zone,view,rcode,plugin}`
//! - `coredns_dns_request_duration_seconds{server,zone,view,type}`: 0.25 ms doubling 16 times
//! - `coredns_dns_request_size_bytes{server,zone,view,proto}`: CoreDNS's size buckets
//!
//! `server` is the listening address as CoreDNS writes it (`dns://:53` for all addresses),
//! `zone` is `.` (svcplane serves one server block, as kubeadm's Corefile `.:53`), `view` is
//! empty, `family` is `1` (IPv4) or `2` (IPv6), `type` is one of CoreDNS's tracked query
//! types or `other`, `plugin` is `kubernetes` for answers from the cluster zone, `forward`
//! for answers relayed from upstream and empty for the server's own refusals.
//!
//! Every series is a slot in a fixed array of atomics chosen by index (type, rcode, proto,
//! family, plugin), so counting is a few relaxed atomic additions: no lock, no allocation,
//! no map lookup. Series appear in the text once they are non-zero, as CoreDNS's vectors
//! do. Not counted: messages hickory-server answers or drops before the handler (FORMERR
//! for unparseable requests); not provided: response sizes, `coredns_dns_do_requests_total`,
//! panics and build info.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The query types CoreDNS counts by name; everything else is `other`.
pub const TRACKED_TYPES: [(&str, u16); 18] = [
    ("A", 1),
    ("NS", 2),
    ("CNAME", 5),
    ("SOA", 6),
    ("PTR", 12),
    ("MX", 15),
    ("TXT", 16),
    ("AAAA", 28),
    ("SRV", 33),
    ("DS", 43),
    ("RRSIG", 46),
    ("NSEC", 47),
    ("DNSKEY", 48),
    ("NSEC3", 50),
    ("HTTPS", 65),
    ("IXFR", 251),
    ("AXFR", 252),
    ("ANY", 255),
];
const TYPES: usize = TRACKED_TYPES.len() + 1;

/// Response codes 0..=23 by name (IANA's registry); anything above in one more slot.
const RCODE_NAMES: [&str; 24] = [
    "NOERROR",
    "FORMERR",
    "SERVFAIL",
    "NXDOMAIN",
    "NOTIMP",
    "REFUSED",
    "YXDOMAIN",
    "YXRRSET",
    "NXRRSET",
    "NOTAUTH",
    "NOTZONE",
    "11",
    "12",
    "13",
    "14",
    "15",
    "BADSIG",
    "BADKEY",
    "BADTIME",
    "BADMODE",
    "BADNAME",
    "BADALG",
    "BADTRUNC",
    "BADCOOKIE",
];
const RCODES: usize = RCODE_NAMES.len() + 1;

/// Which part of the server wrote a response (CoreDNS's `plugin` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The server itself (no plugin handled the name: REFUSED without upstreams).
    Server = 0,
    /// The cluster zone (CoreDNS's `kubernetes` plugin).
    Kubernetes = 1,
    /// Relayed from an upstream (CoreDNS's `forward` plugin).
    Forward = 2,
}
const SOURCES: [&str; 3] = ["", "kubernetes", "forward"];

/// Transport of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Udp = 0,
    Tcp = 1,
}
const PROTOS: [&str; 2] = ["udp", "tcp"];

/// CoreDNS's `TimeBuckets`: 0.25 ms doubling, 16 buckets (to 8.192 s).
const DURATION_BUCKETS: usize = 16;
const FIRST_BUCKET_NANOS: u64 = 250_000;
/// CoreDNS's size buckets, in bytes.
const SIZE_BUCKETS: [u64; 14] = [0, 100, 200, 300, 400, 511, 1023, 2047, 4095, 8291, 16_000, 32_000, 48_000, 64_000];

pub const REQUESTS_TOTAL: &str = "coredns_dns_requests_total";
pub const RESPONSES_TOTAL: &str = "coredns_dns_responses_total";
pub const REQUEST_DURATION_SECONDS: &str = "coredns_dns_request_duration_seconds";
pub const REQUEST_SIZE_BYTES: &str = "coredns_dns_request_size_bytes";

/// A histogram of fixed buckets: per-bucket (not cumulative) counts plus one overflow slot,
/// and the sum in the unit's integer (nanoseconds or bytes).
#[derive(Debug)]
struct Histogram<const N: usize> {
    slots: [AtomicU64; N],
    overflow: AtomicU64,
    sum: AtomicU64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Self { slots: std::array::from_fn(|_| AtomicU64::new(0)), overflow: AtomicU64::new(0), sum: AtomicU64::new(0) }
    }
}

impl<const N: usize> Histogram<N> {
    fn record(&self, slot: usize, value: u64) {
        match self.slots.get(slot) {
            Some(counter) => counter.fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// Cumulative bucket counts, the total count, the sum.
    fn snapshot(&self) -> ([u64; N], u64, u64) {
        let mut cumulative = [0u64; N];
        let mut running = 0;
        for (out, slot) in cumulative.iter_mut().zip(&self.slots) {
            running += slot.load(Ordering::Relaxed);
            *out = running;
        }
        (cumulative, running + self.overflow.load(Ordering::Relaxed), self.sum.load(Ordering::Relaxed))
    }
}

/// The counters of one DNS server.
#[derive(Debug)]
pub struct DnsMetrics {
    /// Read when rendering only; set again once the port is bound (port 0).
    server: std::sync::Mutex<String>,
    /// [proto][family][type]
    requests: [[[AtomicU64; TYPES]; 2]; 2],
    /// [rcode][source]
    responses: [[AtomicU64; 3]; RCODES],
    /// [type]
    duration: [Histogram<DURATION_BUCKETS>; TYPES],
    /// [proto]
    request_size: [Histogram<{ SIZE_BUCKETS.len() }>; 2],
}

fn zeros<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

impl DnsMetrics {
    /// Counters for a server listening on `listen` (its `server` label).
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            server: std::sync::Mutex::new(server_label(listen)),
            requests: std::array::from_fn(|_| std::array::from_fn(|_| zeros())),
            responses: std::array::from_fn(|_| zeros()),
            duration: std::array::from_fn(|_| Histogram::default()),
            request_size: std::array::from_fn(|_| Histogram::default()),
        }
    }

    /// The address the server bound, when it differs from the one asked for (port 0).
    pub fn set_listen(&self, listen: SocketAddr) {
        *self.server.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = server_label(listen);
    }

    /// Counts one request: `query_type` of its first question (`None`: no question).
    pub fn request(&self, proto: Proto, ipv6: bool, query_type: Option<u16>, size: usize) {
        let kind = type_slot(query_type);
        self.requests[proto as usize][usize::from(ipv6)][kind].fetch_add(1, Ordering::Relaxed);
        let size = size as u64;
        let slot = SIZE_BUCKETS.iter().position(|bound| size <= *bound).unwrap_or(SIZE_BUCKETS.len());
        self.request_size[proto as usize].record(slot, size);
    }

    /// Counts one response and how long its request took.
    pub fn response(&self, query_type: Option<u16>, rcode: u16, source: Source, took: Duration) {
        let rcode = usize::from(rcode).min(RCODES - 1);
        self.responses[rcode][source as usize].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.duration[type_slot(query_type)].record(duration_slot(nanos), nanos);
    }

    /// Total responses counted with `rcode` (by name, e.g. `NXDOMAIN`), over all sources.
    pub fn responses_with(&self, rcode: &str) -> u64 {
        RCODE_NAMES
            .iter()
            .position(|name| *name == rcode)
            .map_or(0, |i| self.responses[i].iter().map(|c| c.load(Ordering::Relaxed)).sum())
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let server = self.server.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let base = format!("server=\"{server}\",zone=\".\",view=\"\"");
        header(&mut out, REQUESTS_TOTAL, "counter", "DNS requests by zone, transport, address family and query type.");
        for (p, by_family) in self.requests.iter().enumerate() {
            for (f, by_type) in by_family.iter().enumerate() {
                for (t, counter) in by_type.iter().enumerate() {
                    let n = counter.load(Ordering::Relaxed);
                    if n > 0 {
                        let _ = writeln!(
                            out,
                            "{REQUESTS_TOTAL}{{{base},proto=\"{}\",family=\"{}\",type=\"{}\"}} {n}",
                            PROTOS[p],
                            f + 1,
                            type_name(t)
                        );
                    }
                }
            }
        }
        header(
            &mut out,
            RESPONSES_TOTAL,
            "counter",
            "DNS responses by zone, response code and the part that answered.",
        );
        for (r, by_source) in self.responses.iter().enumerate() {
            for (s, counter) in by_source.iter().enumerate() {
                let n = counter.load(Ordering::Relaxed);
                if n > 0 {
                    let rcode = RCODE_NAMES.get(r).copied().unwrap_or("other");
                    let _ =
                        writeln!(out, "{RESPONSES_TOTAL}{{{base},rcode=\"{rcode}\",plugin=\"{}\"}} {n}", SOURCES[s]);
                }
            }
        }
        header(
            &mut out,
            REQUEST_DURATION_SECONDS,
            "histogram",
            "Seconds from receiving a request to handing its response to the transport.",
        );
        for (t, histogram) in self.duration.iter().enumerate() {
            let (buckets, count, sum) = histogram.snapshot();
            if count == 0 {
                continue;
            }
            let labels = format!("{base},type=\"{}\"", type_name(t));
            for (i, cumulative) in buckets.iter().enumerate() {
                let bound = (FIRST_BUCKET_NANOS << i) as f64 / 1e9;
                let _ = writeln!(out, "{REQUEST_DURATION_SECONDS}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{REQUEST_DURATION_SECONDS}_bucket{{{labels},le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{REQUEST_DURATION_SECONDS}_sum{{{labels}}} {}", sum as f64 / 1e9);
            let _ = writeln!(out, "{REQUEST_DURATION_SECONDS}_count{{{labels}}} {count}");
        }
        header(&mut out, REQUEST_SIZE_BYTES, "histogram", "Size of DNS requests in bytes, by transport.");
        for (p, histogram) in self.request_size.iter().enumerate() {
            let (buckets, count, sum) = histogram.snapshot();
            if count == 0 {
                continue;
            }
            let labels = format!("{base},proto=\"{}\"", PROTOS[p]);
            for (bound, cumulative) in SIZE_BUCKETS.iter().zip(&buckets) {
                let _ = writeln!(out, "{REQUEST_SIZE_BYTES}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{REQUEST_SIZE_BYTES}_bucket{{{labels},le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{REQUEST_SIZE_BYTES}_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "{REQUEST_SIZE_BYTES}_count{{{labels}}} {count}");
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// CoreDNS's `server` label: `dns://:PORT` for the unspecified address, else `dns://ADDR:PORT`.
fn server_label(listen: SocketAddr) -> String {
    if listen.ip().is_unspecified() { format!("dns://:{}", listen.port()) } else { format!("dns://{listen}") }
}

fn type_slot(query_type: Option<u16>) -> usize {
    query_type.and_then(|t| TRACKED_TYPES.iter().position(|(_, code)| *code == t)).unwrap_or(TYPES - 1)
}

fn type_name(slot: usize) -> &'static str {
    TRACKED_TYPES.get(slot).map_or("other", |(name, _)| name)
}

/// The bucket of a duration: the first `i` with `nanos <= 0.25 ms * 2^i`.
fn duration_slot(nanos: u64) -> usize {
    let quarters = nanos.div_ceil(FIRST_BUCKET_NANOS);
    if quarters <= 1 { 0 } else { (u64::BITS - (quarters - 1).leading_zeros()) as usize }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_fall_in_coredns_buckets_by_their_upper_bound() {
        assert_eq!(duration_slot(0), 0);
        assert_eq!(duration_slot(250_000), 0);
        assert_eq!(duration_slot(250_001), 1);
        assert_eq!(duration_slot(500_000), 1);
        assert_eq!(duration_slot(1_000_000), 2);
        assert_eq!(duration_slot(1_000_001), 3);
        assert_eq!(duration_slot(8_192_000_000), 15);
        assert_eq!(duration_slot(8_192_000_001), 16);
    }

    #[test]
    fn counted_requests_and_responses_render_under_corednss_names_and_labels() {
        let metrics = DnsMetrics::new("0.0.0.0:53".parse().unwrap());
        metrics.request(Proto::Udp, false, Some(1), 40);
        metrics.request(Proto::Tcp, true, Some(99), 600);
        metrics.response(Some(1), 0, Source::Kubernetes, Duration::from_micros(300));
        metrics.response(Some(99), 3, Source::Kubernetes, Duration::from_secs(10));
        let text = metrics.render();
        assert!(
            text.contains(
                r#"coredns_dns_requests_total{server="dns://:53",zone=".",view="",proto="udp",family="1",type="A"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"proto="tcp",family="2",type="other"} 1"#), "{text}");
        assert!(text.contains(r#"coredns_dns_responses_total{server="dns://:53",zone=".",view="",rcode="NXDOMAIN",plugin="kubernetes"} 1"#), "{text}");
        assert!(text.contains(r#"coredns_dns_request_duration_seconds_bucket{server="dns://:53",zone=".",view="",type="A",le="0.00025"} 0"#), "{text}");
        assert!(text.contains(r#"type="A",le="0.0005"} 1"#), "{text}");
        assert!(text.contains(r#"type="other",le="8.192"} 0"#), "{text}");
        assert!(text.contains(r#"type="other",le="+Inf"} 1"#), "{text}");
        assert!(
            text.contains(
                r#"coredns_dns_request_size_bytes_bucket{server="dns://:53",zone=".",view="",proto="udp",le="100"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"coredns_dns_request_size_bytes_sum{server="dns://:53",zone=".",view="",proto="tcp"} 600"#),
            "{text}"
        );
        assert_eq!(metrics.responses_with("NXDOMAIN"), 1);
        assert_eq!(metrics.responses_with("NOERROR"), 1);
    }
}
