//! The cluster zone: an immutable index of a [`ClusterView`], built in one linear pass and
//! looked up by lower-cased labels in hash maps (O(1) per question, whatever the cluster size).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{Name, RData, Record};
use tracing::debug;

use crate::model::{ClusterView, DnsPort, DnsService, Protocol, ServiceKind};
use crate::names::{dashed_ip, is_dns_label};

/// The schema version of the Kubernetes DNS specification this zone implements.
pub const DNS_SCHEMA_VERSION: &str = "1.1.0";
/// TTL of the `dns-version` TXT record (the specification's example, and CoreDNS's value).
pub const DNS_VERSION_TTL: u32 = 28_800;
/// TTL of every other record unless configured: CoreDNS's default.
pub const DEFAULT_TTL: u32 = 5;
/// Longest TTL accepted (CoreDNS's limit).
pub const MAX_TTL: u32 = 3_600;

/// SOA timers (refresh, retry, expire), as CoreDNS sets them. Nobody transfers this zone;
/// they are only there to make the SOA well-formed.
const SOA_REFRESH: i32 = 7_200;
const SOA_RETRY: i32 = 1_800;
const SOA_EXPIRE: i32 = 86_400;

/// Whether `<dashed-ip>.<ns>.pod.<zone>` names are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodRecords {
    /// `*.pod.<zone>` answers NXDOMAIN.
    Disabled,
    /// CoreDNS's `pods insecure`: the address is read from the name, without checking that a
    /// Pod has it; only the namespace must exist. The kubeadm default.
    #[default]
    Insecure,
}

/// A zone configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneConfigError {
    #[error("zone {zone:?}: {reason}")]
    InvalidZone { zone: String, reason: String },
    #[error("ttl {ttl}: must be at most {MAX_TTL} seconds")]
    TtlOutOfRange { ttl: u32 },
}

/// What does not change between snapshots: the zone's name and answering policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneConfig {
    origin: Name,
    ttl: u32,
    pods: PodRecords,
    forwarding: bool,
}

impl ZoneConfig {
    /// `zone` is the cluster domain, e.g. `cluster.local` (a trailing dot is fine). TTL 5 s,
    /// `pods insecure`, no forwarding.
    pub fn new(zone: &str) -> Result<Self, ZoneConfigError> {
        let invalid = |reason: &str| ZoneConfigError::InvalidZone { zone: zone.to_owned(), reason: reason.to_owned() };
        let text = zone.strip_suffix('.').unwrap_or(zone);
        if text.is_empty() {
            return Err(invalid("must not be empty or the root"));
        }
        if !text.split('.').all(is_dns_label) {
            return Err(invalid("every label must be 1 to 63 letters, digits or inner hyphens"));
        }
        let mut origin = Name::from_ascii(text).map_err(|error| invalid(&error.to_string()))?.to_lowercase();
        origin.set_fqdn(true);
        if origin.len() > 200 {
            return Err(invalid("too long to leave room for service names"));
        }
        Ok(Self { origin, ttl: DEFAULT_TTL, pods: PodRecords::default(), forwarding: false })
    }

    pub fn with_ttl(mut self, ttl: u32) -> Result<Self, ZoneConfigError> {
        if ttl > MAX_TTL {
            return Err(ZoneConfigError::TtlOutOfRange { ttl });
        }
        self.ttl = ttl;
        Ok(self)
    }

    pub fn with_pod_records(mut self, pods: PodRecords) -> Self {
        self.pods = pods;
        self
    }

    /// Names outside the zone are handed to upstream resolvers ([`crate::Outcome::Forward`])
    /// instead of being refused.
    pub fn with_forwarding(mut self, forwarding: bool) -> Self {
        self.forwarding = forwarding;
        self
    }

    /// The zone's name, lower case, fully qualified.
    pub fn origin(&self) -> &Name {
        &self.origin
    }

    /// TTL of every record (but `dns-version`), and the SOA minimum: the negative-cache time.
    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    pub fn pod_records(&self) -> PodRecords {
        self.pods
    }

    pub fn is_forwarding(&self) -> bool {
        self.forwarding
    }
}

/// A named port as answered: lower-case name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortEntry {
    pub(crate) name: Box<str>,
    pub(crate) protocol: Protocol,
    pub(crate) port: u16,
}

impl PortEntry {
    fn named(ports: &[DnsPort]) -> Vec<PortEntry> {
        let mut named: Vec<PortEntry> = Vec::new();
        for port in ports.iter().filter(|p| !p.name.is_empty()) {
            let entry =
                PortEntry { name: port.name.to_ascii_lowercase().into(), protocol: port.protocol, port: port.port };
            if !named.iter().any(|p| p.name == entry.name && p.protocol == entry.protocol) {
                named.push(entry);
            }
        }
        named
    }

    pub(crate) fn matches(&self, name: &str, protocol: Protocol) -> bool {
        *self.name == *name && self.protocol == protocol
    }
}

/// A published endpoint of a headless Service.
#[derive(Debug, Clone)]
pub(crate) struct ReadyEndpoint {
    pub(crate) ip: IpAddr,
    /// `<label>.<svc>.<ns>.svc.<zone>.`
    pub(crate) fqdn: Name,
    /// Index into [`Entry::Headless::port_sets`].
    pub(crate) port_set: usize,
}

#[derive(Debug, Clone)]
pub(crate) enum Entry {
    ClusterIp {
        ips: Vec<IpAddr>,
    },
    Headless {
        /// Ready (or published-unready) endpoints, one per distinct (address, label).
        endpoints: Vec<ReadyEndpoint>,
        port_sets: Vec<Vec<PortEntry>>,
        /// Lower-case endpoint label -> indexes into `endpoints`.
        by_label: HashMap<Box<str>, Vec<usize>>,
    },
    ExternalName {
        target: Name,
    },
}

/// One Service in the zone.
#[derive(Debug, Clone)]
pub(crate) struct ServiceEntry {
    /// `<svc>.<ns>.svc.<zone>.`, lower case.
    pub(crate) fqdn: Name,
    pub(crate) entry: Entry,
    /// The Service's named ports.
    pub(crate) ports: Vec<PortEntry>,
}

impl ServiceEntry {
    /// Whether `_<protocol>.<svc>...` has names under it (an empty non-terminal).
    pub(crate) fn has_protocol(&self, protocol: Protocol) -> bool {
        let in_sets = match &self.entry {
            Entry::Headless { port_sets, .. } => port_sets.iter().flatten().any(|p| p.protocol == protocol),
            _ => false,
        };
        in_sets || self.ports.iter().any(|p| p.protocol == protocol)
    }
}

/// An immutable snapshot of the cluster zone. Build one per change with [`Zone::build`] and
/// swap it in; answering never locks or allocates on the zone.
#[derive(Debug, Clone)]
pub struct Zone {
    config: Arc<ZoneConfig>,
    /// Unique to this snapshot among all built by the process (answer caches key on it).
    snapshot_id: u64,
    complete: bool,
    serial: u32,
    soa: Record,
    name_server: Name,
    namespaces: HashSet<Box<str>>,
    /// Namespace -> Service name -> entry, all lower case.
    services: HashMap<Box<str>, HashMap<Box<str>, ServiceEntry>>,
    service_count: usize,
    /// Address -> the names it reverses to (Service names for cluster IPs, endpoint names for
    /// the addresses of headless Services' endpoints that are no cluster IP).
    reverse: HashMap<IpAddr, Vec<Name>>,
    /// The cluster IPs of `kube-system/kube-dns`, the zone's name server.
    name_server_ips: Vec<IpAddr>,
}

/// The next [`Zone::snapshot_id`].
static NEXT_SNAPSHOT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Zone {
    /// Tells snapshots apart: no two zones built by this process share it, even when built
    /// from the same view with the same serial.
    pub fn snapshot_id(&self) -> u64 {
        self.snapshot_id
    }

    /// The zone before the first complete snapshot: every name in it answers SERVFAIL.
    pub fn pending(config: Arc<ZoneConfig>) -> Self {
        let mut zone = Self::build(config, &ClusterView::default(), 0);
        zone.complete = false;
        zone
    }

    /// Indexes `view`. `serial` is the SOA serial (CoreDNS uses the Unix time of the last
    /// change). Services that cannot be represented (names that are not DNS labels, an
    /// ExternalName that is no domain name) are left out; `svcplane-source` reports those
    /// before they get here. Linear in the size of `view`.
    pub fn build(config: Arc<ZoneConfig>, view: &ClusterView, serial: u32) -> Self {
        let origin = config.origin().clone();
        let name_server = name_under(&["ns", "dns"], &origin).unwrap_or_else(|| origin.clone());
        let hostmaster = name_under(&["hostmaster"], &origin).unwrap_or_else(|| origin.clone());
        let soa = Record::from_rdata(
            origin.clone(),
            config.ttl(),
            RData::SOA(SOA::new(
                name_server.clone(),
                hostmaster,
                serial,
                SOA_REFRESH,
                SOA_RETRY,
                SOA_EXPIRE,
                config.ttl(),
            )),
        );

        let mut namespaces: HashSet<Box<str>> =
            view.namespaces.iter().map(|ns| ns.to_ascii_lowercase().into_boxed_str()).collect();
        let mut services: HashMap<Box<str>, HashMap<Box<str>, ServiceEntry>> = HashMap::new();
        let mut service_count = 0;
        for service in &view.services {
            let Some(entry) = service_entry(service, &origin) else {
                debug!(namespace = %service.namespace, name = %service.name, "left out of the zone: not representable");
                continue;
            };
            let namespace: Box<str> = service.namespace.to_ascii_lowercase().into();
            namespaces.insert(namespace.clone());
            let by_name = services.entry(namespace).or_default();
            let name: Box<str> = service.name.to_ascii_lowercase().into();
            if by_name.contains_key(&name) {
                debug!(namespace = %service.namespace, name = %service.name, "defined twice; the first is kept");
                continue;
            }
            by_name.insert(name, entry);
            service_count += 1;
        }

        let mut reverse: HashMap<IpAddr, Vec<Name>> = HashMap::new();
        for entry in services.values().flat_map(HashMap::values) {
            if let Entry::ClusterIp { ips } = &entry.entry {
                for ip in ips {
                    push_unique(reverse.entry(*ip).or_default(), &entry.fqdn);
                }
            }
        }
        let cluster_ips: HashSet<IpAddr> = reverse.keys().copied().collect();
        for entry in services.values().flat_map(HashMap::values) {
            if let Entry::Headless { endpoints, .. } = &entry.entry {
                // A cluster IP match takes precedence over an endpoint match.
                for endpoint in endpoints.iter().filter(|e| !cluster_ips.contains(&e.ip)) {
                    push_unique(reverse.entry(endpoint.ip).or_default(), &endpoint.fqdn);
                }
            }
        }
        // Sorted, so answers do not depend on hash order.
        for names in reverse.values_mut() {
            names.sort_by(Name::cmp_case);
        }

        let name_server_ips = services
            .get("kube-system")
            .and_then(|by_name| by_name.get("kube-dns"))
            .and_then(|entry| match &entry.entry {
                Entry::ClusterIp { ips } => Some(ips.clone()),
                _ => None,
            })
            .unwrap_or_default();

        Self {
            config,
            snapshot_id: NEXT_SNAPSHOT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            complete: true,
            serial,
            soa,
            name_server,
            namespaces,
            services,
            service_count,
            reverse,
            name_server_ips,
        }
    }

    pub fn config(&self) -> &ZoneConfig {
        &self.config
    }

    /// False until the first complete snapshot: names in the zone answer SERVFAIL.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// How many Services the zone answers for.
    pub fn service_count(&self) -> usize {
        self.service_count
    }

    /// The zone's SOA record, owned by the zone apex.
    pub fn soa(&self) -> &Record {
        &self.soa
    }

    pub(crate) fn name_server(&self) -> &Name {
        &self.name_server
    }

    pub(crate) fn name_server_ips(&self) -> &[IpAddr] {
        &self.name_server_ips
    }

    /// Lower-case `namespace`.
    pub(crate) fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
    }

    /// Lower-case `namespace` and `name`.
    pub(crate) fn service(&self, namespace: &str, name: &str) -> Option<&ServiceEntry> {
        self.services.get(namespace)?.get(name)
    }

    pub(crate) fn reverse(&self, ip: &IpAddr) -> Option<&[Name]> {
        self.reverse.get(ip).map(Vec::as_slice)
    }
}

fn push_unique(names: &mut Vec<Name>, name: &Name) {
    if !names.iter().any(|known| known.eq_case(name)) {
        names.push(name.clone());
    }
}

/// `labels` (leftmost first) prepended to `origin`; `None` if the result is no valid name.
pub(crate) fn name_under(labels: &[&str], origin: &Name) -> Option<Name> {
    if labels.is_empty() {
        return Some(origin.clone());
    }
    Name::from_labels(labels.iter().map(|label| label.as_bytes())).ok()?.append_domain(origin).ok()
}

fn service_entry(service: &DnsService, origin: &Name) -> Option<ServiceEntry> {
    let name = service.name.to_ascii_lowercase();
    let namespace = service.namespace.to_ascii_lowercase();
    if !is_dns_label(&name) || !is_dns_label(&namespace) {
        return None;
    }
    let fqdn = name_under(&[&name, &namespace, "svc"], origin)?;
    let ports = PortEntry::named(&service.ports);
    let entry = match &service.kind {
        ServiceKind::ClusterIp { ips } => {
            let mut unique: Vec<IpAddr> = Vec::with_capacity(ips.len());
            for ip in ips {
                if !unique.contains(ip) {
                    unique.push(*ip);
                }
            }
            Entry::ClusterIp { ips: unique }
        }
        ServiceKind::Headless { endpoints: sets, publish_not_ready_addresses } => {
            let mut endpoints: Vec<ReadyEndpoint> = Vec::new();
            let mut port_sets = Vec::with_capacity(sets.len());
            let mut by_label: HashMap<Box<str>, Vec<usize>> = HashMap::new();
            for set in sets {
                let port_set = port_sets.len();
                port_sets.push(PortEntry::named(&set.ports));
                for endpoint in set.endpoints.iter().filter(|e| e.ready || *publish_not_ready_addresses) {
                    let label = match &endpoint.hostname {
                        Some(hostname) if is_dns_label(hostname) => hostname.to_ascii_lowercase(),
                        _ => dashed_ip(endpoint.ip),
                    };
                    let indexes = by_label.entry(label.clone().into_boxed_str()).or_default();
                    if indexes.iter().any(|&i| endpoints[i].ip == endpoint.ip) {
                        continue;
                    }
                    let Some(endpoint_fqdn) = fqdn.prepend_label(label.as_bytes()).ok() else {
                        continue;
                    };
                    indexes.push(endpoints.len());
                    endpoints.push(ReadyEndpoint { ip: endpoint.ip, fqdn: endpoint_fqdn, port_set });
                }
            }
            by_label.retain(|_, indexes| !indexes.is_empty());
            Entry::Headless { endpoints, port_sets, by_label }
        }
        ServiceKind::ExternalName { target } => {
            let text = target.strip_suffix('.').unwrap_or(target);
            if !crate::names::is_domain_name(text) {
                return None;
            }
            let mut target = Name::from_ascii(text).ok()?.to_lowercase();
            target.set_fqdn(true);
            Entry::ExternalName { target }
        }
    };
    Some(ServiceEntry { fqdn, entry, ports })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DnsEndpoint, EndpointSet};

    fn config() -> Arc<ZoneConfig> {
        Arc::new(ZoneConfig::new("cluster.local").unwrap())
    }

    #[test]
    fn a_zone_name_must_be_dns_labels_and_the_ttl_at_most_an_hour() {
        assert!(ZoneConfig::new("cluster.local.").is_ok());
        assert_eq!(ZoneConfig::new("Cluster.Local").unwrap().origin().to_ascii(), "cluster.local.");
        assert!(ZoneConfig::new("").is_err());
        assert!(ZoneConfig::new(".").is_err());
        assert!(ZoneConfig::new("cluster..local").is_err());
        assert!(ZoneConfig::new("clu ster.local").is_err());
        assert!(ZoneConfig::new("cluster.local").unwrap().with_ttl(3600).is_ok());
        assert_eq!(
            ZoneConfig::new("cluster.local").unwrap().with_ttl(3601),
            Err(ZoneConfigError::TtlOutOfRange { ttl: 3601 })
        );
    }

    #[test]
    fn the_soa_minimum_is_the_ttl() {
        let config = Arc::new(ZoneConfig::new("cluster.local").unwrap().with_ttl(30).unwrap());
        let zone = Zone::build(config, &ClusterView::default(), 42);
        let RData::SOA(soa) = &zone.soa().data else { panic!("not an SOA") };
        assert_eq!(soa.minimum, 30);
        assert_eq!(soa.serial, 42);
        assert_eq!(zone.soa().ttl, 30);
        assert_eq!(soa.mname.to_ascii(), "ns.dns.cluster.local.");
    }

    #[test]
    fn services_with_names_that_are_not_labels_are_left_out_and_the_rest_kept() {
        let service = |name: &str| DnsService {
            namespace: "default".into(),
            name: name.into(),
            kind: ServiceKind::ClusterIp { ips: vec!["10.96.0.1".parse().unwrap()] },
            ports: Vec::new(),
        };
        let view = ClusterView { namespaces: vec![], services: vec![service("web.x"), service("Web"), service("api")] };
        let zone = Zone::build(config(), &view, 1);
        assert_eq!(zone.service_count(), 2);
        assert!(zone.service("default", "web").is_some());
        assert!(zone.has_namespace("default"));
    }

    #[test]
    fn endpoints_are_deduplicated_and_not_ready_ones_left_out_unless_published() {
        let endpoint =
            |ip: &str, ready: bool| DnsEndpoint { ip: ip.parse().unwrap(), hostname: None, ready, node_name: None };
        let set = EndpointSet {
            ports: vec![],
            endpoints: vec![endpoint("10.0.0.1", true), endpoint("10.0.0.1", true), endpoint("10.0.0.2", false)],
        };
        let headless = |publish| DnsService {
            namespace: "default".into(),
            name: "db".into(),
            kind: ServiceKind::Headless { endpoints: vec![set.clone()], publish_not_ready_addresses: publish },
            ports: vec![],
        };
        for (publish, expected) in [(false, 1), (true, 2)] {
            let zone = Zone::build(config(), &ClusterView { namespaces: vec![], services: vec![headless(publish)] }, 1);
            let Entry::Headless { endpoints, .. } = &zone.service("default", "db").unwrap().entry else {
                panic!("not headless")
            };
            assert_eq!(endpoints.len(), expected, "publishNotReadyAddresses: {publish}");
        }
    }
}
