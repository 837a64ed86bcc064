//! svcplane-dns: cluster DNS, the Kubernetes DNS-Based Service Discovery specification
//! (schema 1.1.0), answered from the same snapshot of the cluster as the proxy.
//!
//! - [`model`] is the zone's input ([`ClusterView`]: Services as ClusterIP, headless with
//!   their endpoints, or ExternalName, plus the namespaces that exist), in plain values.
//! - [`Zone`] indexes one view immutably, in one linear pass, for O(1) lookups by
//!   lower-cased labels.
//! - [`respond`] is the answering logic: a pure function from a zone and one request to an
//!   [`Outcome`] (records, NXDOMAIN vs NODATA with the zone SOA, SERVFAIL before the first
//!   snapshot, REFUSED / NOTIMP / FORMERR for what it does not serve, or "forward upstream").
//!   [`respond_to_wire`] is the same on bytes, for the fuzz target and property tests.
//! - With the `server` feature (default): [`server`] serves UDP with [`udp`]'s workers
//!   (answers cached, encoded, per zone snapshot) and TCP with hickory-server's loop, both
//!   deciding each answer through [`handler`] over a [`SharedZone`] swapped atomically on
//!   every change, and [`forward`] sends names outside the zone to the upstream resolvers it
//!   is given.
//! - [`metrics`]: CoreDNS's request metrics (`coredns_dns_*`), counted with atomics in fixed
//!   arrays on the hot path, written in the Prometheus text format. Serving them over HTTP is
//!   the binary's job.
//!
//! What it deliberately does not do: no Kubernetes types (sources convert Services and
//! EndpointSlices into the core's discovery model, [`ClusterView`]), no watching or reading of manifests, no
//! caching of upstream answers, no zone transfers, no DNSSEC, no wildcard names (removed from
//! CoreDNS in 1.9), no `pods verified` and no autopath.

pub mod answer;
pub mod metrics;
pub mod model;
pub mod names;
pub mod wire;
pub mod zone;

#[cfg(feature = "server")]
pub mod follow;
#[cfg(feature = "server")]
pub mod forward;
#[cfg(feature = "server")]
pub mod handler;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod udp;

pub use answer::{Inquiry, Outcome, Reply, answer, respond};
pub use metrics::DnsMetrics;
pub use model::{ClusterView, DnsEndpoint, DnsPort, DnsService, EndpointSet, Protocol, ServiceKind};
pub use wire::{Transport, WireOutcome, respond_to_wire};
pub use zone::{
    DEFAULT_TTL, DNS_SCHEMA_VERSION, DNS_VERSION_TTL, MAX_TTL, PodRecords, Zone, ZoneConfig, ZoneConfigError,
};

#[cfg(feature = "server")]
pub use follow::{follow_views, next_serial};
#[cfg(feature = "server")]
pub use forward::{DEFAULT_FORWARD_TIMEOUT, ForwardError, Forwarder};
#[cfg(feature = "server")]
pub use handler::{Handler, SharedZone};
#[cfg(feature = "server")]
pub use server::DnsServer;

/// Re-exported so users of [`Outcome`] and [`Reply`] name the same record types.
pub use hickory_proto;
