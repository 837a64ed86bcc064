//! What a table was written with, in 128 bits, kept in the table itself: a set holding one
//! element whose key is the digest. A full sync (a restart, a resync) first compares the
//! digest of what it would write with the one the table holds, and leaves a table that
//! matches alone instead of writing the same rules again; a partial sync replaces the
//! element in the same transaction as its change, so the digest always stands for the
//! table's content.
//!
//! The digest is a sum of per-part digests (the table's fixed objects, then one per
//! service port), so a partial sync updates it from the parts it changes without reading
//! or hashing the rest. It stands for what svcplane wrote, not for what the kernel holds:
//! a rule someone edits or deletes by hand inside a service's chain is not seen by it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{IpAddr, Ipv6Addr};

use svcplane_nft::{DataType, Element, Operation, Set, Value};

/// The set each table keeps its digest in (one element).
pub const WRITTEN_DIGEST_SET: &str = "written-digest";

/// Bumped when the meaning of the digest changes, so no table written by another build is
/// taken for this one's.
const FORMAT: &str = "svcplane nftables table digest v1";

/// Two SipHash digests of `value` (fixed keys, different prefixes) as one number.
pub fn digest_of<T: Hash + ?Sized>(value: &T) -> u128 {
    let half = |prefix: u8| {
        let mut hasher = DefaultHasher::new();
        prefix.hash(&mut hasher);
        value.hash(&mut hasher);
        hasher.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// One service port's share of its table's digest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortDigest(u128);

impl PortDigest {
    /// The digest of the objects one service port owns (`render::PortObjects`).
    pub fn of(objects: &impl Hash) -> Self {
        Self(digest_of(objects))
    }
}

/// The digest of a whole table: its fixed objects plus every service port in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableDigest(u128);

impl TableDigest {
    /// A table holding only `base` (the objects every table of a family starts with).
    pub fn of_base(base: &[Operation]) -> Self {
        Self(digest_of(&(FORMAT, base)))
    }

    pub fn with(self, port: PortDigest) -> Self {
        Self(self.0.wrapping_add(port.0))
    }

    pub fn without(self, port: PortDigest) -> Self {
        Self(self.0.wrapping_sub(port.0))
    }

    /// The element that records this digest in [`WRITTEN_DIGEST_SET`].
    pub fn element(self) -> Element {
        Element {
            set: WRITTEN_DIGEST_SET.to_owned(),
            key: vec![Value::Address(IpAddr::V6(Ipv6Addr::from(self.0)))],
            value: None,
            comment: None,
        }
    }
}

/// The declaration of [`WRITTEN_DIGEST_SET`]: 16-byte keys, whatever the table's family.
pub fn set() -> Set {
    Set {
        name: WRITTEN_DIGEST_SET.to_owned(),
        key: vec![DataType::Ipv6Addr],
        value: None,
        interval: false,
        dynamic_timeout: None,
        comment: Some("digest of what svcplane wrote here".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_digest_does_not_depend_on_the_order_ports_were_added_or_removed_in() {
        let base = TableDigest::of_base(&[Operation::AddTable { comment: None }]);
        let (a, b, c) = (PortDigest(digest_of("a")), PortDigest(digest_of("b")), PortDigest(digest_of("c")));
        assert_eq!(base.with(a).with(b), base.with(b).with(a));
        assert_eq!(base.with(a).with(c).without(c).with(b), base.with(b).with(a));
        assert_ne!(base.with(a), base.with(b));
        assert_ne!(base.with(a), base);
    }
}
