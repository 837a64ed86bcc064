//! The nftables mechanism of svcplane: typed nftables objects, transactions that the
//! kernel applies atomically, and the ways to apply them.
//!
//! - [`objects`]: tables, chains, rules, sets, maps and elements as Rust values, and the
//!   [`Transaction`] that groups operations on one table.
//! - [`text`]: renders a transaction as an `nft -f` script (nft 1.0.6 syntax).
//! - [`NftCli`]: applies transactions through the `nft` program, optionally inside a network
//!   namespace.
//! - [`FakeNftables`]: an in-memory, transactional model of the kernel for tests, faithful
//!   enough to walk packets through and strict in the same ways as the kernel.
//!
//! Both mechanisms implement [`Nftables`] and fail with the same [`NftError`] kinds for the
//! same mistakes.
//!
//! What this crate does not do: Service policy. It knows nothing of Kubernetes, Services or
//! endpoints; the backend decides which chains and rules to write and hands them here. It
//! never reads the ruleset back on the apply path, either: listing a large table costs
//! seconds, so callers keep their own record of what they wrote.

pub mod cli;
pub mod client;
pub mod error;
pub mod fake;
pub mod netlink;
pub mod objects;
pub mod text;
pub mod trace;
pub mod validation;

pub use cli::NftCli;
pub use client::NftClient;
pub use error::{ErrorKind, NftError, ObjectKind};
pub use fake::{FakeNftables, FakeTable};
pub use netlink::{Fault, FaultSource, KernelReply, NftNetlink, decode_kernel_replies};
pub use objects::*;
pub use text::{render, render_with};

/// A way to put transactions into nftables: the kernel through some client, or a fake.
pub trait Nftables {
    /// Applies every operation atomically: all or nothing.
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError>;

    /// Removes the table if it exists; Ok(false) if it did not.
    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError>;

    /// How many rules `chain` of `table` holds now; 0 when the table or the chain is gone.
    /// Cheap (one chain, not the table): what drift checks ask.
    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError>;

    /// The names of the tables of `family` that exist now (the names only, never their
    /// contents: cheap whatever the tables hold).
    fn list_tables(&mut self, family: Family) -> Result<Vec<String>, NftError>;

    /// Whether `set` (as declared in `table`) holds an element with `element`'s key now.
    /// `Ok(Some(false))` when the table or the set is missing; `Ok(None)` when this client
    /// cannot read elements back (the caller then assumes nothing). Reads every element of
    /// the set: meant for small sets.
    fn holds_element(&mut self, table: &TableName, set: &Set, element: &Element) -> Result<Option<bool>, NftError> {
        let _ = (table, set, element);
        Ok(None)
    }
}
