//! The nftables backend: renders the core's per-node plan into svcplane's own nftables
//! tables (`ip svcplane`, `ip6 svcplane`) and keeps them in sync, fully or partially.
//!
//! It decides no Service rule: which endpoints, which sources are masqueraded, what is
//! rejected or dropped all come from the plan. It does not talk to the kernel itself
//! either: it hands transactions to a [`svcplane_nft::Nftables`] mechanism (the `nft`
//! command, or the in-memory fake in tests).

pub mod counters;
pub mod digest;
pub mod names;
pub mod render;
pub mod sync;

pub use render::{MASQUERADE_MARK, TABLE, render_port, render_port_counting, table_name};
pub use sync::{NftablesBackend, SyncError, SyncReport, render_full};
