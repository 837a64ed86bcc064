//! The iptables backend: renders the core's per-node plan into kube-proxy's iptables chain
//! layout (`KUBE-SERVICES`, `KUBE-SVC-…`, `KUBE-SEP-…`, `KUBE-EXT-…`, `KUBE-FW-…`,
//! `KUBE-SVL-…`, `KUBE-NODEPORTS`, `KUBE-MARK-MASQ`, `KUBE-POSTROUTING` in nat; the
//! reject/drop chains in filter), named and worded as kube-proxy names them, and keeps it in
//! sync with `iptables-restore --noflush`, fully or partially.
//!
//! It decides no Service rule: which endpoints, which sources are masqueraded, what is
//! rejected or dropped, source ranges and affinity all come from the plan. It does not talk
//! to the kernel itself either: it hands restore inputs to a [`svcplane_iptables::Iptables`]
//! mechanism (the legacy or nft programs, or the in-memory fake in tests). It never touches
//! a chain it does not own, so it shares the tables with other software.

pub mod counters;
pub mod names;
pub mod render;
pub mod sync;

pub use render::{MASQUERADE_MARK, PortRules, SharedChain, render_port};
pub use sync::{IptablesBackend, SyncError, SyncReport, cleanup_restore, full_restore, render_dump};
