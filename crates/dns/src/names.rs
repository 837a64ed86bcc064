//! Spelling addresses and names the way cluster DNS does: DNS-label checks, dashed
//! addresses (`10-0-0-5`, `2001-db8--1`) and reverse names (`in-addr.arpa`, `ip6.arpa`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use svcplane_core::discovery::{MAX_LABEL_LEN, MAX_NAME_LEN, is_dns_label, is_domain_name};

/// The label an endpoint without a hostname is known by: `10-0-0-5`, or for IPv6 the
/// compressed text with `-` for `:` (`2001-db8--1`).
pub fn dashed_ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// Reads a dashed address label back (`1-2-3-4`, `2001-db8--1`), case-insensitively.
pub fn parse_dashed_ip(label: &str) -> Option<IpAddr> {
    if label.is_empty() || label.len() > MAX_LABEL_LEN {
        return None;
    }
    let parts: Vec<&str> = label.split('-').collect();
    if parts.len() == 4 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
        let mut octets = [0u8; 4];
        for (octet, part) in octets.iter_mut().zip(&parts) {
            *octet = parse_decimal_octet(part)?;
        }
        return Some(IpAddr::V4(Ipv4Addr::from(octets)));
    }
    if !label.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return None;
    }
    label.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// `0` to `255`, without leading zeros or signs.
fn parse_decimal_octet(text: &str) -> Option<u8> {
    if text.is_empty() || text.len() > 3 || (text.len() > 1 && text.starts_with('0')) {
        return None;
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The address a full reverse name stands for. `labels` are the name's labels, leftmost
/// first, lower case, including the `in-addr.arpa` / `ip6.arpa` suffix. Partial names
/// (`10.in-addr.arpa`) are not addresses.
pub fn parse_reverse_name(labels: &[&str]) -> Option<IpAddr> {
    match labels {
        [d, c, b, a, "in-addr", "arpa"] => {
            let octets = [a, b, c, d].map(|part| parse_decimal_octet(part));
            let [Some(a), Some(b), Some(c), Some(d)] = octets else {
                return None;
            };
            Some(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
        }
        [nibbles @ .., "ip6", "arpa"] if nibbles.len() == 32 => {
            let mut value: u128 = 0;
            for nibble in nibbles.iter().rev() {
                let [digit] = nibble.as_bytes() else {
                    return None;
                };
                let digit = char::from(*digit).to_digit(16)?;
                value = (value << 4) | u128::from(digit);
            }
            Some(IpAddr::V6(Ipv6Addr::from(value)))
        }
        _ => None,
    }
}

/// Whether `labels` (lower case, leftmost first) lie under a reverse-lookup tree.
pub fn is_reverse_name(labels: &[&str]) -> bool {
    matches!(labels, [.., "in-addr" | "ip6", "arpa"])
}

/// The reverse name of `ip`, without trailing dot: `4.3.2.1.in-addr.arpa`.
pub fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("{d}.{c}.{b}.{a}.in-addr.arpa")
        }
        IpAddr::V6(v6) => {
            let mut text = String::with_capacity(72);
            for byte in v6.octets().iter().rev() {
                for nibble in [byte & 0x0f, byte >> 4] {
                    text.push(char::from_digit(u32::from(nibble), 16).unwrap_or('0'));
                    text.push('.');
                }
            }
            text.push_str("ip6.arpa");
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_are_letters_digits_and_inner_hyphens_up_to_63_bytes() {
        assert!(is_dns_label("web"));
        assert!(is_dns_label("1kubernetes"));
        assert!(is_dns_label(&"a".repeat(63)));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("-web"));
        assert!(!is_dns_label("web-"));
        assert!(!is_dns_label("web.default"));
        assert!(!is_dns_label("we_b"));
    }

    #[test]
    fn domain_names_allow_underscores_and_one_trailing_dot() {
        assert!(is_domain_name("foo.example.com"));
        assert!(is_domain_name("foo.example.com."));
        assert!(is_domain_name("_sip._tcp.example.com"));
        assert!(!is_domain_name("foo..example.com"));
        assert!(!is_domain_name(""));
        assert!(!is_domain_name("."));
        assert!(!is_domain_name("foo example"));
        assert!(!is_domain_name(&format!("{}.com", "a".repeat(64))));
    }

    #[test]
    fn dashed_addresses_round_trip_for_both_families() {
        for text in ["10.0.0.5", "2001:db8::1", "::1", "fd00:10:96::a"] {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(parse_dashed_ip(&dashed_ip(ip)), Some(ip), "{text}");
        }
        assert_eq!(dashed_ip("10.0.0.5".parse().unwrap()), "10-0-0-5");
        assert_eq!(dashed_ip("2001:db8::1".parse().unwrap()), "2001-db8--1");
    }

    #[test]
    fn malformed_dashed_addresses_are_not_addresses() {
        for label in ["1-2-3", "1-2-3-256", "01-2-3-4", "1-2-3-4-5", "web", "", "1-2-3-+4", "g--1"] {
            assert_eq!(parse_dashed_ip(label), None, "{label:?}");
        }
    }

    #[test]
    fn reverse_names_parse_only_when_complete() {
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let v6: IpAddr = "fd00::a".parse().unwrap();
        for ip in [v4, v6] {
            let name = reverse_name(ip);
            let labels: Vec<&str> = name.split('.').collect();
            assert_eq!(parse_reverse_name(&labels), Some(ip), "{name}");
            assert!(is_reverse_name(&labels));
        }
        assert_eq!(parse_reverse_name(&["96", "10", "in-addr", "arpa"]), None);
        assert_eq!(parse_reverse_name(&["10", "0", "96", "010", "in-addr", "arpa"]), None);
        assert_eq!(parse_reverse_name(&["x", "0", "96", "10", "in-addr", "arpa"]), None);
        assert!(!is_reverse_name(&["web", "default", "svc", "cluster", "local"]));
    }
}
