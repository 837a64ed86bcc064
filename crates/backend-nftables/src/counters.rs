//! Per-endpoint connection counters: every DNAT rule of an endpoint chain
//! (`service-…`, `local-…`) carries a `counter`, which the NAT hook runs for the first packet
//! of each new connection only. Read with `nft list table` (the kernel's own listing; slow
//! on very large tables, so only when asked, never during a sync).

use std::net::SocketAddr;

use svcplane_core::counters::{EndpointCounter, service_port_label};
use svcplane_core::{IpFamily, Protocol};
use svcplane_nft::{NftCli, NftError, Nftables, TableName};

use crate::render::{is_svcplane_table, nft_family};

/// The counters of every svcplane table of `families` there is now (however many tables
/// the proxy spread its Services over); no table counts nothing.
pub fn read(cli: &mut NftCli, families: &[IpFamily]) -> Result<Vec<EndpointCounter>, NftError> {
    let mut counters = Vec::new();
    for &family in families {
        let family = nft_family(family);
        for name in cli.list_tables(family)?.into_iter().filter(|name| is_svcplane_table(name)) {
            match cli.list_table(&TableName::new(family, name)) {
                Ok(text) => counters.extend(parse(&text)),
                Err(NftError::NotFound { .. }) => {}
                Err(error) => return Err(error),
            }
        }
    }
    Ok(counters)
}

/// The endpoint counters in an `nft list table` listing of a svcplane table.
pub fn parse(listing: &str) -> Vec<EndpointCounter> {
    let mut counters = Vec::new();
    let mut service: Option<(String, Protocol)> = None;
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("chain ") {
            let name = rest.trim_end_matches('{').trim().trim_matches('"');
            service = endpoint_chain_service(name);
            continue;
        }
        let Some((label, protocol)) = &service else { continue };
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let after = |word: &str| tokens.iter().position(|t| *t == word).and_then(|i| tokens.get(i + 1));
        let packets = tokens.windows(2).find(|pair| pair[0] == "packets").and_then(|pair| pair[1].parse::<u64>().ok());
        let destination = tokens
            .iter()
            .position(|t| *t == "dnat")
            .and_then(|_| after("to"))
            .and_then(|target| target.parse::<SocketAddr>().ok());
        if let (Some(connections), Some(endpoint)) = (packets, destination) {
            counters.push(EndpointCounter { service_port: label.clone(), protocol: *protocol, endpoint, connections });
        }
    }
    counters
}

/// `service-<hash>-<ns>/<name>/<proto>/<port>` (or `local-…`) -> label and protocol.
fn endpoint_chain_service(chain: &str) -> Option<(String, Protocol)> {
    let rest = chain.strip_prefix("service-").or_else(|| chain.strip_prefix("local-"))?;
    let (_hash, base) = rest.split_once('-')?;
    let mut parts = base.splitn(4, '/');
    let (namespace, name, protocol, port) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let protocol = Protocol::from_kubernetes(&protocol.to_ascii_uppercase())?;
    Some((service_port_label(namespace, name, port), protocol))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = r#"table ip svcplane {
	chain services {
		ip daddr 198.19.0.10 tcp dport 80 counter packets 9 bytes 540 goto service-AAAA-default/echo/tcp/http
	}
	chain "service-AAAA-default/echo/tcp/http" {
		numgen random mod 2 == 0 meta l4proto tcp counter packets 3 bytes 180 dnat to 198.18.129.1:8080
		meta l4proto tcp counter packets 4 bytes 240 dnat to 198.18.129.2:8080
	}
	chain local-BBBB-default/echo/udp/ {
		meta l4proto udp counter packets 2 bytes 80 dnat to 198.18.129.2:8080
	}
}
table ip6 svcplane {
	chain service-CCCC-default/echo/tcp/http {
		meta l4proto tcp counter packets 5 bytes 400 dnat to [2001:db8:1::2]:8080
	}
}"#;

    #[test]
    fn endpoint_chains_dnat_rules_give_per_endpoint_connections_and_nothing_else_counts() {
        let counters = parse(LISTING);
        let seen: Vec<(String, Protocol, String, u64)> =
            counters.into_iter().map(|c| (c.service_port, c.protocol, c.endpoint.to_string(), c.connections)).collect();
        assert_eq!(
            seen,
            [
                ("default/echo:http".to_owned(), Protocol::Tcp, "198.18.129.1:8080".to_owned(), 3),
                ("default/echo:http".to_owned(), Protocol::Tcp, "198.18.129.2:8080".to_owned(), 4),
                ("default/echo".to_owned(), Protocol::Udp, "198.18.129.2:8080".to_owned(), 2),
                ("default/echo:http".to_owned(), Protocol::Tcp, "[2001:db8:1::2]:8080".to_owned(), 5),
            ]
        );
    }
}
