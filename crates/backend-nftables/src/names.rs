//! Kernel object names: readable in a dump (`svc-<hash>-<ns>/<name>/<proto>/<port>`),
//! stable across restarts, unique per service port.

use sha2::{Digest, Sha256};
use svcplane_core::ServicePortName;

/// The `<ns>/<name>/<proto>/<port-name>` base every per-service object name is built on.
pub fn service_port_base(name: &ServicePortName) -> String {
    format!("{}/{}/{}/{}", name.service.namespace, name.service.name, name.protocol, name.port_name)
}

/// First 8 characters of base32(sha256(base)): keeps names unique even if a dump tool
/// truncates them, and matches the shape operators know from kube-proxy.
fn short_hash(base: &str) -> String {
    let digest = Sha256::digest(base.as_bytes());
    let mut encoded = data_encoding::BASE32.encode(&digest);
    encoded.truncate(8);
    encoded
}

/// `<prefix>-<hash>-<base>`.
pub fn service_object(prefix: &str, name: &ServicePortName) -> String {
    let base = service_port_base(name);
    format!("{prefix}-{}-{base}", short_hash(&base))
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcplane_core::{NamespacedName, Protocol};

    #[test]
    fn a_service_chain_name_reads_as_namespace_name_protocol_and_port() {
        let name = ServicePortName {
            service: NamespacedName::new("ns1", "svc1"),
            port_name: "p80".into(),
            protocol: Protocol::Tcp,
        };
        // The hash is sha256/base32 of "ns1/svc1/tcp/p80", as kube-proxy's nftables mode names it.
        assert_eq!(service_object("service", &name), "service-ULMVA6XW-ns1/svc1/tcp/p80");
    }
}
