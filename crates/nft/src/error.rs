//! The one error type of this crate, shared by every mechanism so that callers (and tests
//! comparing the fake with the kernel) can reason about what went wrong without knowing
//! which mechanism reported it.

use std::fmt;
use std::io;

use crate::objects::TableName;

/// The kind of kernel object an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    Table,
    Chain,
    Rule,
    /// A set or a map: `nft` keeps both in one namespace.
    Set,
    Element,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Table => "table",
            ObjectKind::Chain => "chain",
            ObjectKind::Rule => "rule",
            ObjectKind::Set => "set",
            ObjectKind::Element => "element",
        })
    }
}

/// Why a transaction (or a table deletion) failed. Whatever the mechanism, the same mistake
/// gives the same variant where practical; [`NftError::kind`] is the part that always agrees.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// A table, chain or set name that nft 1.0.6 cannot parse (or reads as a keyword).
    #[error("{kind} name {name:?} is not accepted by nft: {reason}")]
    InvalidName { kind: ObjectKind, name: String, reason: &'static str },

    /// A comment nft cannot carry.
    #[error("comment {comment:?} is not accepted by nft: {reason}")]
    InvalidComment { comment: String, reason: &'static str },

    /// A base chain whose type and hook do not go together.
    #[error("chain {chain:?} is invalid: {reason}")]
    InvalidChain { chain: String, reason: String },

    /// A rule nft would refuse: mistyped comparison, statement after a verdict, wrong family,
    /// lookup keys that do not match the set's type...
    #[error("rule in chain {chain:?} is invalid: {reason}")]
    InvalidRule { chain: String, reason: String },

    /// A set or map definition nft would refuse.
    #[error("set {set:?} is invalid: {reason}")]
    InvalidSet { set: String, reason: String },

    /// An element whose key or value does not fit its set's type.
    #[error("element of set {set:?} is invalid: {reason}")]
    InvalidElement { set: String, reason: String },

    /// The operation needs an object that does not exist.
    #[error("{kind} {name:?} does not exist")]
    NotFound { kind: ObjectKind, name: String },

    /// A rule, or a verdict map element, jumps or goes to a chain that does not exist (yet: the
    /// kernel resolves the target when it meets the operation, so the chain must come first).
    #[error("{from:?} refers to chain {target:?}, which does not exist")]
    InvalidReference {
        /// The chain holding the rule, or the map holding the element.
        from: String,
        target: String,
    },

    /// An add that conflicts with what exists: a chain or set redefined differently, a map key
    /// given another value, an interval overlapping another.
    #[error("{kind} {name:?} already exists with a different definition")]
    Exists { kind: ObjectKind, name: String },

    /// Deleting a chain or set that a rule or element still refers to.
    #[error("{kind} {name:?} is still in use")]
    InUse { kind: ObjectKind, name: String },

    /// nft refused the transaction for a reason not mapped to a variant above.
    #[error("nft refused the transaction on table {table}: {message}")]
    Apply { table: TableName, message: String },

    /// The nft program could not be run, fed or waited for.
    #[error("could not run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
}

/// The coarse classification of an [`NftError`]: what the fake and the kernel must agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The transaction is wrong whatever the current state is.
    Invalid,
    NotFound,
    Exists,
    InUse,
    /// Refused for a reason this crate does not classify.
    Refused,
    /// Running the mechanism itself failed.
    Io,
}

impl NftError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            NftError::InvalidName { .. }
            | NftError::InvalidComment { .. }
            | NftError::InvalidChain { .. }
            | NftError::InvalidRule { .. }
            | NftError::InvalidSet { .. }
            | NftError::InvalidElement { .. } => ErrorKind::Invalid,
            NftError::NotFound { .. } | NftError::InvalidReference { .. } => ErrorKind::NotFound,
            NftError::Exists { .. } => ErrorKind::Exists,
            NftError::InUse { .. } => ErrorKind::InUse,
            NftError::Apply { .. } => ErrorKind::Refused,
            NftError::Spawn { .. } => ErrorKind::Io,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.kind() == ErrorKind::NotFound
    }
}
