//! Per-endpoint connection counters: the `-j DNAT` rule of each `KUBE-SEP-…` chain, whose
//! packet counter the nat table bumps for the first packet of each new connection only.
//! iptables counts every rule anyway; this reads `iptables-save -c -t nat` and keeps those.

use std::net::SocketAddr;

use svcplane_core::counters::EndpointCounter;
use svcplane_core::{IpFamily, Protocol};
use svcplane_iptables::{Iptables, IptablesError, Table};

use crate::render::family;

/// The counters of both families.
pub fn read<I: Iptables>(iptables: &I, families: &[IpFamily]) -> Result<Vec<EndpointCounter>, IptablesError> {
    let mut counters = Vec::new();
    for &ip_family in families {
        counters.extend(parse(&iptables.save_with_counters(family(ip_family), Table::Nat)?));
    }
    Ok(counters)
}

/// The endpoint counters in `iptables-save -c -t nat` output:
/// `[P:B] -A KUBE-SEP-… -p tcp -m comment --comment "ns/name:port" … -j DNAT --to-destination A:P`.
pub fn parse(save: &str) -> Vec<EndpointCounter> {
    save.lines().filter_map(endpoint_counter).collect()
}

fn endpoint_counter(line: &str) -> Option<EndpointCounter> {
    let (counts, rule) = line.strip_prefix('[')?.split_once(']')?;
    let rule = rule.trim_start();
    if !rule.starts_with("-A KUBE-SEP-") || !rule.contains("-j DNAT") {
        return None;
    }
    let connections = counts.split_once(':')?.0.parse().ok()?;
    let tokens: Vec<&str> = rule.split_whitespace().collect();
    let after = |flag: &str| tokens.iter().position(|t| *t == flag).and_then(|i| tokens.get(i + 1)).copied();
    let protocol = Protocol::from_kubernetes(&after("-p")?.to_ascii_uppercase())?;
    let endpoint: SocketAddr = after("--to-destination")?.parse().ok()?;
    let comment = rule.split_once("--comment ")?.1;
    let service_port = match comment.strip_prefix('"') {
        Some(quoted) => quoted.split_once('"')?.0,
        None => comment.split_whitespace().next()?,
    };
    Some(EndpointCounter { service_port: service_port.to_owned(), protocol, endpoint, connections })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sep_dnat_rules_give_per_endpoint_connections_and_other_rules_are_ignored() {
        let save = r#"*nat
:KUBE-SEP-AAAA - [0:0]
[7:420] -A KUBE-SERVICES -d 198.19.0.10/32 -p tcp -m comment --comment "default/echo:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-X
[0:0] -A KUBE-SEP-AAAA -s 198.18.129.1/32 -m comment --comment "default/echo:http" -j KUBE-MARK-MASQ
[3:180] -A KUBE-SEP-AAAA -p tcp -m comment --comment "default/echo:http" -m tcp -j DNAT --to-destination 198.18.129.1:8080
[2:88] -A KUBE-SEP-BBBB -p udp -m comment --comment default/echo -m udp -j DNAT --to-destination [2001:db8:1::2]:8080
COMMIT"#;
        let seen: Vec<(String, Protocol, String, u64)> = parse(save)
            .into_iter()
            .map(|c| (c.service_port, c.protocol, c.endpoint.to_string(), c.connections))
            .collect();
        assert_eq!(
            seen,
            [
                ("default/echo:http".to_owned(), Protocol::Tcp, "198.18.129.1:8080".to_owned(), 3),
                ("default/echo".to_owned(), Protocol::Udp, "[2001:db8:1::2]:8080".to_owned(), 2),
            ]
        );
    }
}
