//! The rows of the scenario table, one file per topic.

mod affinity;
mod endpoint_changes;
mod external_ips;
mod health_checks;
mod ignored;
mod load_balancer;
mod no_endpoints;
mod node_port_addresses;
mod reachability;
mod sctp;
mod terminating;
mod topology;
mod traffic_policy;

pub use affinity::AFFINITY;
pub use endpoint_changes::ENDPOINT_CHANGES;
pub use external_ips::EXTERNAL_IPS;
pub use health_checks::HEALTH_CHECKS;
pub use ignored::IGNORED;
pub use load_balancer::LOAD_BALANCER;
pub use no_endpoints::NO_ENDPOINTS;
pub use node_port_addresses::{NODEPORT_ADDRESSES_CIDRS, NODEPORT_ADDRESSES_DEFAULT, NODEPORT_ADDRESSES_PRIMARY};
pub use reachability::REACHABILITY;
pub use sctp::SCTP;
pub use terminating::TERMINATING;
pub use topology::TOPOLOGY;
pub use traffic_policy::TRAFFIC_POLICY;
