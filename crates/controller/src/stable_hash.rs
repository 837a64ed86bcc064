//! The one hash function behind preferred allocation slots and slice names.
//!
//! It is part of the on-disk contract: without an [`AllocationRecord`](crate::AllocationRecord)
//! a restart re-derives every allocation from this function, and slice names are compared
//! across runs. Changing it moves allocations and renames slices, so don't.
//!
//! FNV-1a (64 bit) over the UTF-8 bytes, then the splitmix64 finaliser so that the low bits,
//! which `hash % range` mostly uses, depend on every input byte.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Stable 64-bit hash of `text`; the same on every platform and in every release.
pub(crate) fn stable_hash(text: &str) -> u64 {
    mix(fnv1a(text))
}

fn fnv1a(text: &str) -> u64 {
    let mut hash = FNV_OFFSET;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` characters of lower-case base32 (`0-9a-v`) taken from the hash of `text`; at most 12.
pub(crate) fn stable_suffix(text: &str, len: usize) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789abcdefghijklmnopqrstuv";
    let mut hash = stable_hash(text);
    (0..len.min(12))
        .map(|_| {
            let c = ALPHABET[(hash & 31) as usize] as char;
            hash >>= 5;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_then_splitmix64() {
        // Published test vectors of both halves.
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn the_hash_is_pinned_to_known_values() {
        // If this fails, every allocation of a cluster without a record would move.
        assert_eq!(stable_hash("default/web"), 2_348_150_740_500_140_582);
        assert_ne!(stable_hash("default/web"), stable_hash("default/web2"));
    }

    #[test]
    fn a_suffix_is_lower_case_alphanumeric_of_the_asked_length() {
        let suffix = stable_suffix("default/web/IPv4/0", 10);
        assert_eq!(suffix.len(), 10);
        assert!(suffix.chars().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()));
        assert_eq!(suffix, stable_suffix("default/web/IPv4/0", 10));
        assert_ne!(suffix, stable_suffix("default/web/IPv4/1", 10));
    }
}
