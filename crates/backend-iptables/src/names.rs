//! Chain names and comments exactly as kube-proxy's iptables mode spells them, so the
//! chains operators have read about (`KUBE-SVC-TCOU7JCQXEZGVUNU` is kube-dns's) carry the
//! same names here.
//!
//! `KUBE-SVC/SVL/EXT/FW-` + the first 16 characters of base32(sha256(service port name +
//! protocol)); `KUBE-SEP-` + the same over service port name + protocol + `IP:port`. The
//! service port name is `namespace/name:port` (`namespace/name` for an unnamed port) and
//! the protocol is lower case, with nothing between the parts.

use std::net::SocketAddr;

use sha2::{Digest, Sha256};
use svcplane_core::ServicePortName;

/// Endpoint-set chain of `Cluster` policy: load-balances over every usable endpoint.
pub const SERVICE_PREFIX: &str = "KUBE-SVC-";
/// Endpoint-set chain of `Local` policy: this node's endpoints only.
pub const LOCAL_PREFIX: &str = "KUBE-SVL-";
/// Routes of NodePorts, external IPs and load-balancer IPs.
pub const EXTERNAL_PREFIX: &str = "KUBE-EXT-";
/// `loadBalancerSourceRanges` in front of the external routes.
pub const FIREWALL_PREFIX: &str = "KUBE-FW-";
/// One endpoint: hairpin masquerade and the DNAT.
pub const ENDPOINT_PREFIX: &str = "KUBE-SEP-";
/// ClusterIP routes that do not fit kube-proxy's shape (masquerade rules at the top of
/// the endpoint-set chain); the core never plans such routes today.
pub const INTERNAL_PREFIX: &str = "KUBE-INT-";
/// One route whose sources lie outside several CIDRs (`! -s` takes one): `-s C -j RETURN`
/// for each, then the route's actions.
pub const SOURCE_PREFIX: &str = "KUBE-SRC-";

/// Every prefix of a per-service chain svcplane writes.
pub const SERVICE_CHAIN_PREFIXES: &[&str] =
    &[SERVICE_PREFIX, LOCAL_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX, ENDPOINT_PREFIX, INTERNAL_PREFIX, SOURCE_PREFIX];

/// Whether `chain` is a per-service chain of svcplane (or of kube-proxy before it).
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|prefix| chain.starts_with(prefix))
}

/// `namespace/name:port`, or `namespace/name` for an unnamed port: kube-proxy's
/// `ServicePortName.String()`.
pub fn service_port_name(name: &ServicePortName) -> String {
    if name.port_name.is_empty() {
        format!("{}/{}", name.service.namespace, name.service.name)
    } else {
        format!("{}/{}:{}", name.service.namespace, name.service.name, name.port_name)
    }
}

/// First 16 characters of base32(sha256(input)).
fn hash16(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
    let mut encoded = data_encoding::BASE32.encode(&digest);
    encoded.truncate(16);
    encoded
}

/// kube-proxy's `portProtoHash`.
pub fn port_proto_hash(name: &ServicePortName) -> String {
    hash16(&format!("{}{}", service_port_name(name), name.protocol.as_str()))
}

/// `PREFIX` + the port's hash: `KUBE-SVC-…`, `KUBE-SVL-…`, `KUBE-EXT-…`, `KUBE-FW-…`.
pub fn service_chain(prefix: &str, name: &ServicePortName) -> String {
    format!("{prefix}{}", port_proto_hash(name))
}

/// A further chain of the same kind for the same port (the `n`-th distinct one, `n >= 1`),
/// only needed for plans kube-proxy's shape has no room for.
pub fn numbered_service_chain(prefix: &str, name: &ServicePortName, n: usize) -> String {
    format!("{prefix}{}", hash16(&format!("{}{}#{n}", service_port_name(name), name.protocol.as_str())))
}

/// `KUBE-SEP-…` of one endpoint of the port.
pub fn endpoint_chain(name: &ServicePortName, endpoint: &SocketAddr) -> String {
    format!("{ENDPOINT_PREFIX}{}", hash16(&format!("{}{}{endpoint}", service_port_name(name), name.protocol.as_str())))
}

#[cfg(test)]
mod tests {
    use svcplane_core::{NamespacedName, Protocol};

    use super::*;

    fn port(namespace: &str, service: &str, port: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName { service: NamespacedName::new(namespace, service), port_name: port.into(), protocol }
    }

    #[test]
    fn chain_names_are_the_ones_kube_proxy_gives_the_same_service_ports() {
        assert_eq!(
            service_chain(SERVICE_PREFIX, &port("ns1", "svc1", "p80", Protocol::Tcp)),
            "KUBE-SVC-XPGD46QRK7WJZT7O"
        );
        assert_eq!(
            service_chain(SERVICE_PREFIX, &port("default", "kubernetes", "https", Protocol::Tcp)),
            "KUBE-SVC-NPX46M4PTMTKRN6Y"
        );
        assert_eq!(
            service_chain(SERVICE_PREFIX, &port("kube-system", "kube-dns", "dns", Protocol::Udp)),
            "KUBE-SVC-TCOU7JCQXEZGVUNU"
        );
        assert_eq!(
            service_chain(SERVICE_PREFIX, &port("kube-system", "kube-dns", "dns-tcp", Protocol::Tcp)),
            "KUBE-SVC-ERIFXISQEP7F7OF4"
        );
    }

    #[test]
    fn an_endpoint_chain_hashes_the_endpoint_address_too() {
        let name = port("ns1", "svc1", "p80", Protocol::Tcp);
        assert_eq!(endpoint_chain(&name, &"10.180.0.1:80".parse().unwrap()), "KUBE-SEP-SXIVWICOYRO3J4NJ");
    }

    #[test]
    fn an_unnamed_port_is_named_by_its_service_alone() {
        assert_eq!(service_port_name(&port("default", "nginx", "", Protocol::Tcp)), "default/nginx");
        // The seed's `default/nginx-service` NodePort: KUBE-EXT-V2OKYYMBY3REGZOG.
        assert_eq!(
            service_chain(EXTERNAL_PREFIX, &port("default", "nginx-service", "", Protocol::Tcp)),
            "KUBE-EXT-V2OKYYMBY3REGZOG"
        );
    }

    #[test]
    fn every_chain_name_fits_the_28_character_limit() {
        let name = port("a-very-long-namespace-name", "a-very-long-service-name", "a-long-port", Protocol::Sctp);
        for prefix in SERVICE_CHAIN_PREFIXES {
            assert!(service_chain(prefix, &name).len() <= 28);
        }
        assert!(endpoint_chain(&name, &"[2001:db8::1]:65535".parse().unwrap()).len() <= 28);
    }
}
