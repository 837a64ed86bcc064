//! The one interface every mode implements: nftables, iptables, eBPF, IPVS and userspace
//! are each a [`Dataplane`] that spells a [`NodePlan`] for its kernel API. The sync loop
//! drives any of them the same way and never knows which one it has.

use crate::plan::{NodePlan, PlanDiff};

/// A dataplane's error, with its causes kept (a mode's own error type, boxed).
pub type DataplaneError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What one sync did, in any mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// The whole ruleset was written, not just the difference.
    pub full: bool,
    /// Service ports written.
    pub service_ports: usize,
    /// Kernel operations sent (rules, map entries, elements ...).
    pub operations: usize,
    /// The mode's rules were replaced wholesale rather than changed in place: for an
    /// instant inside the kernel's commit a new flow could meet none of them, and its
    /// conntrack entry then keeps it past the DNAT for as long as the flow lasts.
    pub rules_replaced: bool,
}

/// The rules a mode owns in one table of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleCount {
    pub family: crate::IpFamily,
    pub table: &'static str,
    pub rules: usize,
}

/// How full one of a mode's fixed-size kernel tables is (eBPF maps): the entries what it
/// wrote uses against the table's capacity, and whether the last sync failed for want of
/// room in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableUsage {
    pub table: &'static str,
    pub entries: usize,
    pub capacity: usize,
    pub full: bool,
}

/// One mode of programming the node.
///
/// Contract: a sync either brings the kernel in line with the plan or fails leaving the
/// previous state whole (no half-applied ruleset). The loop keeps the diff of a failed
/// sync and hands it again, absorbed into the next one, until a sync succeeds.
pub trait Dataplane: Send + std::fmt::Debug {
    /// The mode's name, as `--mode` spells it.
    fn mode(&self) -> &'static str;

    /// Brings the kernel in line with `plan`. `diff` holds every service port that changed
    /// since the last successful sync; a mode may always write more (a full sync).
    fn sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<SyncReport, DataplaneError>;

    /// Makes the next sync rewrite everything (drift found, operator asked, periodic check).
    fn request_full_resync(&mut self);

    /// Whether the kernel state was changed behind svcplane's back, with what was found.
    /// Called often: a mode rate-limits its own checks and returns `None` when it has none.
    fn detect_drift(&mut self) -> Option<String>;

    /// What a full sync of `plan` would write, in the mode's own words; touches nothing.
    fn render(&self, plan: &NodePlan) -> Result<String, DataplaneError>;

    /// Removes everything this mode programmed. Returns whether anything was there.
    fn cleanup(&mut self) -> Result<bool, DataplaneError>;

    /// How many rules this mode owns per family and table, for modes whose kernel objects
    /// are rules in tables (iptables: kube-proxy's `kubeproxy_sync_proxy_rules_iptables_total`).
    /// Read from the mode's own record of what it wrote, never from the kernel.
    fn rule_counts(&self) -> Vec<RuleCount> {
        Vec::new()
    }

    /// The mode's fixed-size tables and how full they are, after each sync (success or
    /// failure). Modes whose tables grow as needed have none.
    fn table_usage(&self) -> Vec<TableUsage> {
        Vec::new()
    }

    /// The kernel's per-endpoint connection counters of what this mode programmed (see
    /// [`crate::counters`]). A mode that keeps none says so.
    fn counters(&mut self) -> Result<Vec<crate::counters::EndpointCounter>, DataplaneError> {
        Err(format!("{} mode keeps no traffic counters", self.mode()).into())
    }
}
