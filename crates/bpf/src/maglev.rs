//! Maglev consistent hashing (Eisenbud et al., NSDI 2016): a lookup table of prime size in
//! which every endpoint owns about the same number of entries, and which changes little
//! when an endpoint comes or goes, so flows hashed into it mostly stay where they were.
//! Pure: the tc program reads the table, `TcNat` (the tc module) writes it.

use std::net::SocketAddr;

/// The default table size: a prime, room for ~160 endpoints at under 1 % imbalance.
pub const DEFAULT_TABLE_SIZE: u32 = 16_381;

/// Whether `n` is prime (table sizes must be, so every skip visits every entry).
pub fn is_prime(n: u32) -> bool {
    n >= 2 && (2..).take_while(|d: &u32| u64::from(*d) * u64::from(*d) <= u64::from(n)).all(|d| !n.is_multiple_of(d))
}

/// FNV-1a with a seed: stable across processes and nodes (every node must build the same
/// table from the same endpoints).
fn hash(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for byte in bytes {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The table for `endpoints` (in slot order): entry `i` holds the slot of the endpoint that
/// owns it. Empty when there is no endpoint. `size` must be prime.
pub fn table(endpoints: &[SocketAddr], size: u32) -> Vec<u32> {
    assert!(is_prime(size), "a Maglev table size must be prime ({size} is not)");
    if endpoints.is_empty() {
        return Vec::new();
    }
    let m = u64::from(size);
    let preferences: Vec<(u64, u64)> = endpoints
        .iter()
        .map(|endpoint| {
            let name = endpoint.to_string();
            let offset = hash(name.as_bytes(), 0x5eed_0001) % m;
            let skip = hash(name.as_bytes(), 0x5eed_0002) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; endpoints.len()];
    let mut entries = vec![u32::MAX; size as usize];
    let mut filled = 0u64;
    'fill: loop {
        for (slot, (offset, skip)) in preferences.iter().enumerate() {
            let mut candidate = (offset + next[slot] * skip) % m;
            while entries[candidate as usize] != u32::MAX {
                next[slot] += 1;
                candidate = (offset + next[slot] * skip) % m;
            }
            entries[candidate as usize] = slot as u32;
            next[slot] += 1;
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(n: usize) -> Vec<SocketAddr> {
        (0..n).map(|i| SocketAddr::new([198, 18, 129, (i % 250) as u8 + 1].into(), 8080 + (i / 250) as u16)).collect()
    }

    #[test]
    fn every_endpoint_owns_about_the_same_share_of_the_table() {
        let t = table(&endpoints(10), DEFAULT_TABLE_SIZE);
        let mut counts = [0usize; 10];
        for slot in &t {
            counts[*slot as usize] += 1;
        }
        let ideal = DEFAULT_TABLE_SIZE as usize / 10;
        for count in counts {
            assert!(count.abs_diff(ideal) <= ideal / 100 + 1, "{counts:?}");
        }
    }

    #[test]
    fn removing_one_endpoint_of_ten_moves_few_entries_that_it_did_not_own() {
        let before = endpoints(10);
        let mut after = before.clone();
        after.remove(3);
        let (old, new) = (table(&before, DEFAULT_TABLE_SIZE), table(&after, DEFAULT_TABLE_SIZE));
        let moved =
            old.iter().zip(&new).filter(|(o, n)| **o != 3 && before[**o as usize] != after[**n as usize]).count();
        // Maglev's bound: a small share of the entries others owned move.
        assert!(moved < DEFAULT_TABLE_SIZE as usize / 20, "{moved} entries moved");
    }

    #[test]
    fn the_same_endpoints_give_the_same_table_and_sizes_must_be_prime() {
        assert_eq!(table(&endpoints(5), 251), table(&endpoints(5), 251));
        assert!(table(&[], 251).is_empty());
        assert!(is_prime(16_381) && is_prime(65_537) && !is_prime(16_383) && !is_prime(1));
    }
}
