//! Traffic counters as every mode reports them: per endpoint of a service port, the new
//! connections the kernel sent there (the packets its DNAT rule saw: a NAT rule sees the
//! first packet of each connection only), and the per-Service totals, ordering and series
//! cap the views (`svcplane top`, a metrics endpoint) share. Pure: modes read the kernel.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::model::Protocol;

/// How many endpoint series a view shows or exports unless told otherwise (`--max-series`):
/// bounded so a cluster of 10k Services cannot flood a terminal or a metrics scrape.
pub const DEFAULT_MAX_SERIES: usize = 100;

/// One endpoint of one service port, as the kernel counted it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointCounter {
    /// `namespace/name:port` (`:port` omitted for an unnamed port), as the mode's rules name it.
    pub service_port: String,
    pub protocol: Protocol,
    pub endpoint: SocketAddr,
    /// New connections DNATed to the endpoint since its rule was written.
    pub connections: u64,
}

/// The total of one service port over its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCounter {
    pub service_port: String,
    pub protocol: Protocol,
    pub connections: u64,
    pub endpoints: usize,
}

/// Sums counters of the same endpoint (several rules may DNAT to it: the cluster and local
/// sets, affinity) and orders them by traffic, busiest first, then by name.
pub fn merge(counters: impl IntoIterator<Item = EndpointCounter>) -> Vec<EndpointCounter> {
    let mut sums: BTreeMap<(String, Protocol, SocketAddr), u64> = BTreeMap::new();
    for counter in counters {
        *sums.entry((counter.service_port, counter.protocol, counter.endpoint)).or_default() += counter.connections;
    }
    let mut merged: Vec<EndpointCounter> = sums
        .into_iter()
        .map(|((service_port, protocol, endpoint), connections)| EndpointCounter {
            service_port,
            protocol,
            endpoint,
            connections,
        })
        .collect();
    merged.sort_by(|a, b| b.connections.cmp(&a.connections).then_with(|| a.cmp(b)));
    merged
}

/// Per service port, busiest first.
pub fn by_service(counters: &[EndpointCounter]) -> Vec<ServiceCounter> {
    let mut totals: BTreeMap<(&str, Protocol), (u64, usize)> = BTreeMap::new();
    for counter in counters {
        let total = totals.entry((&counter.service_port, counter.protocol)).or_default();
        total.0 += counter.connections;
        total.1 += 1;
    }
    let mut services: Vec<ServiceCounter> = totals
        .into_iter()
        .map(|((service_port, protocol), (connections, endpoints))| ServiceCounter {
            service_port: service_port.to_owned(),
            protocol,
            connections,
            endpoints,
        })
        .collect();
    services.sort_by(|a, b| {
        b.connections
            .cmp(&a.connections)
            .then_with(|| (&a.service_port, a.protocol).cmp(&(&b.service_port, b.protocol)))
    });
    services
}

/// At most `max_series` endpoint series, busiest first; the rest summed into `other`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounded {
    pub series: Vec<EndpointCounter>,
    /// Series left out, and their connections together.
    pub omitted: usize,
    pub omitted_connections: u64,
}

/// Keeps the `max_series` busiest of `merged` (as [`merge`] orders them).
pub fn bounded(mut merged: Vec<EndpointCounter>, max_series: usize) -> Bounded {
    let rest = if merged.len() > max_series { merged.split_off(max_series) } else { Vec::new() };
    Bounded { omitted: rest.len(), omitted_connections: rest.iter().map(|c| c.connections).sum(), series: merged }
}

/// `namespace/name:port` from the parts a mode's object names carry.
pub fn service_port_label(namespace: &str, name: &str, port_name: &str) -> String {
    if port_name.is_empty() { format!("{namespace}/{name}") } else { format!("{namespace}/{name}:{port_name}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(service: &str, endpoint: &str, connections: u64) -> EndpointCounter {
        EndpointCounter {
            service_port: service.into(),
            protocol: Protocol::Tcp,
            endpoint: endpoint.parse().unwrap(),
            connections,
        }
    }

    #[test]
    fn counters_of_the_same_endpoint_are_summed_and_the_busiest_comes_first() {
        let merged = merge([
            counter("default/a:http", "198.18.129.1:80", 2),
            counter("default/a:http", "198.18.129.2:80", 1),
            counter("default/a:http", "198.18.129.1:80", 3),
        ]);
        assert_eq!(
            merged,
            [counter("default/a:http", "198.18.129.1:80", 5), counter("default/a:http", "198.18.129.2:80", 1)]
        );
    }

    #[test]
    fn service_totals_add_their_endpoints_and_sort_by_traffic() {
        let merged = merge([
            counter("default/a:http", "198.18.129.1:80", 2),
            counter("default/b:http", "198.18.129.2:80", 7),
            counter("default/a:http", "198.18.129.3:80", 1),
        ]);
        let services = by_service(&merged);
        assert_eq!(services[0].service_port, "default/b:http");
        assert_eq!((services[1].connections, services[1].endpoints), (3, 2));
    }

    #[test]
    fn a_series_cap_keeps_the_busiest_and_sums_the_rest() {
        let merged = merge((1..=5).map(|i| counter("default/a:http", &format!("198.18.129.{i}:80"), i)));
        let kept = bounded(merged, 2);
        assert_eq!(kept.series.len(), 2);
        assert_eq!(kept.series[0].connections, 5);
        assert_eq!((kept.omitted, kept.omitted_connections), (3, 6));
    }

    #[test]
    fn an_unnamed_port_is_labelled_by_its_service_alone() {
        assert_eq!(service_port_label("ns", "svc", ""), "ns/svc");
        assert_eq!(service_port_label("ns", "svc", "http"), "ns/svc:http");
    }
}
