//! The iptables mechanism of svcplane: typed rules, the input of `iptables-restore
//! --noflush`, the programs that apply and read it (legacy or nft variant, IPv4 or IPv6),
//! a reader for `iptables-save` output, and a faithful in-memory fake with a packet tracer.
//!
//! - [`model`]: rules as typed matches and targets. A rule keeps the order its arguments
//!   were written in (kube-proxy's order, when the backend builds it so) and also knows the
//!   form the kernel keeps and `iptables-save` prints.
//! - [`restore`]: one table's restore input: chain lines, then `-A`/`-I`/`-D`/`-X`.
//! - [`IptablesCli`]: `iptables-restore --noflush --wait`, `iptables-save -t`, `iptables -S`
//!   of one [`Variant`] (`iptables-legacy-*` or `iptables-nft-*`, `ip6tables-*` for IPv6),
//!   optionally inside a network namespace; [`detect_variant`] picks the one a node uses.
//! - [`save`]: reading `iptables-save` output back, and its canonical order.
//! - [`FakeIptables`]: the kernel's tables in memory, strict in the same ways, and
//!   [`trace`], which walks packets through it.
//!
//! Both mechanisms implement [`Iptables`] and fail with the same [`IptablesError`] kinds.
//!
//! What this crate does not do: Service policy. It knows nothing of Kubernetes, Services or
//! endpoints, nor which chains are whose; the backend decides what to write. It never
//! flushes a table or touches a chain the caller did not name.

pub mod cli;
pub mod error;
pub mod fake;
pub mod model;
pub mod restore;
pub mod save;
pub mod text;
pub mod trace;

pub use cli::{Detection, IptablesCli, RestoreFault, RestoreFaultSource, Tool, Variant, detect_variant};
pub use error::IptablesError;
pub use fake::{FakeChain, FakeIptables, FakeTable};
pub use model::*;
pub use restore::{Command, RestoreTable};
pub use save::{SavedChain, SavedRule, SavedRuleset, SavedTable, canonical, parse_save};
pub use text::parse_rule;

/// A way to program iptables: the real programs, or the fake.
pub trait Iptables {
    /// `iptables-restore --noflush` of one table: all of it or nothing. Chains and rules
    /// the input does not name stay as they are.
    fn restore(&mut self, family: Family, input: &RestoreTable) -> Result<(), IptablesError>;

    /// `iptables-save -t TABLE`: the whole table as text.
    fn save(&self, family: Family, table: Table) -> Result<String, IptablesError>;

    /// `iptables-save`: every table that exists, as text. Unlike [`Self::save`] it creates
    /// no table (the legacy variant creates the table `-t` names).
    fn save_all(&self, family: Family) -> Result<String, IptablesError>;

    /// `iptables -t TABLE -S CHAIN`: the chain's definition and rules as text, or `None`
    /// if the chain does not exist.
    fn list_chain(&self, family: Family, table: Table, chain: &str) -> Result<Option<String>, IptablesError>;

    /// `iptables-save -c -t TABLE`: the table with each rule's `[packets:bytes]` counters.
    /// A mechanism without counters lists the table without them.
    fn save_with_counters(&self, family: Family, table: Table) -> Result<String, IptablesError> {
        self.save(family, table)
    }
}

/// The `-A CHAIN ...` rule lines of `iptables -S CHAIN` output.
pub fn listed_rules(text: &str) -> Vec<SavedRule> {
    text.lines()
        .filter_map(|line| line.strip_prefix("-A "))
        .map(|rest| {
            let rest = rest.trim_start();
            let args = rest.split_once(char::is_whitespace).map(|(_, args)| args).unwrap_or("");
            SavedRule { text: args.trim().to_owned() }
        })
        .collect()
}
