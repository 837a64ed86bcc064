//! The scenario table against the in-memory iptables fake (no root, no lab), through the
//! one fake-kernel runner of `scenarios/fake.rs`: `IptablesBackend<FakeIptables>`, traced
//! through the filter and nat tables by the iptables tracer, which explores both ways of
//! every `-m statistic` (`-m recent` is not modelled: affinity over time is the real
//! kernel's part).

mod scenarios;

use std::collections::BTreeSet;

use scenarios::NodePortAddresses;
use scenarios::fake::{FakeMode, check_rows};
use svcplane_backend_iptables::IptablesBackend;
use svcplane_iptables::FakeIptables;
use svcplane_iptables::trace::{Host, Origin, Outcome, Packet, trace};

struct Mode;

impl FakeMode for Mode {
    type Backend = IptablesBackend<FakeIptables>;
    const KERNEL: &'static str = "the iptables fake";

    fn backend() -> Self::Backend {
        IptablesBackend::new(FakeIptables::new())
    }

    /// Both families' tables, as `iptables-save` and `ip6tables-save` would print them.
    fn dump(backend: &Self::Backend) -> String {
        let fake = backend.iptables();
        [svcplane_iptables::Family::V4, svcplane_iptables::Family::V6].map(|family| fake.dump(family)).concat()
    }

    fn trace(
        backend: &Self::Backend,
        host: &Host,
        origin: Origin,
        packet: Packet,
    ) -> Result<BTreeSet<Outcome>, String> {
        let family =
            if packet.destination.is_ipv4() { svcplane_iptables::Family::V4 } else { svcplane_iptables::Family::V6 };
        trace(backend.iptables(), family, host, origin, packet).map_err(|error| error.to_string())
    }
}

#[test]
fn pods_the_node_and_an_external_client_reach_a_service_through_its_cluster_ip_and_node_port() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::REACHABILITY);
}

#[test]
fn a_service_without_endpoints_is_refused_at_once_from_a_pod_the_node_and_outside_in_both_families() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::NO_ENDPOINTS);
}

#[test]
fn local_traffic_policies_keep_traffic_on_the_node_or_drop_it() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::TRAFFIC_POLICY);
}

#[test]
fn load_balancer_ips_are_served_like_node_ports_within_their_source_ranges_unless_proxied() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::LOAD_BALANCER);
}

#[test]
fn external_ips_are_served_like_load_balancer_ips() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::EXTERNAL_IPS);
}

#[test]
fn health_check_node_ports_answer_with_the_local_endpoint_count() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::HEALTH_CHECKS);
}

#[test]
fn terminating_endpoints_are_used_only_when_none_is_ready() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::TERMINATING);
}

#[test]
fn topology_keeps_traffic_close_with_upstreams_fallbacks() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::TOPOLOGY);
}

#[test]
fn headless_external_name_and_other_proxies_services_are_not_programmed() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::IGNORED);
}

#[test]
fn sctp_services_are_programmed_like_tcp_ones() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::SCTP);
}

#[test]
fn node_ports_answer_on_every_node_address_but_loopback_by_default() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::NODEPORT_ADDRESSES_DEFAULT);
}

#[test]
fn node_ports_answer_only_on_the_primary_address_with_nodeport_addresses_primary() {
    check_rows::<Mode>(NodePortAddresses::Primary, scenarios::NODEPORT_ADDRESSES_PRIMARY);
}

#[test]
fn node_ports_answer_only_inside_nodeport_addresses_cidrs() {
    check_rows::<Mode>(NodePortAddresses::SecondaryOnly, scenarios::NODEPORT_ADDRESSES_CIDRS);
}

#[test]
fn client_ip_affinity_sticks_until_the_timeout() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::AFFINITY);
}

#[test]
fn endpoint_changes_remove_stale_udp_flows_and_keep_flows_to_terminating_endpoints() {
    check_rows::<Mode>(NodePortAddresses::Default, scenarios::ENDPOINT_CHANGES);
}
