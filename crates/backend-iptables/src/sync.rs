//! Applying plans with `iptables-restore --noflush`, one call per table (filter, then nat;
//! mangle only holds the canary).
//!
//! - Full sync (startup, after a failure, when the rules were changed behind svcplane's
//!   back, node-port addresses changed): every chain svcplane owns is named in the input,
//!   so it is rewritten whole; hooks missing from the built-in chains are inserted at the
//!   top; per-service chains left from before (`KUBE-SVC-…` and friends that are no longer
//!   planned) are flushed and deleted. The tables are read once (`iptables-save -t`) for
//!   that.
//! - Partial sync: only the service ports the core reports changed are rendered again and
//!   compared with the in-memory record of what was written. Their own chains are rewritten
//!   (or created, or deleted) and their rules in the shared chains are removed with `-D` and
//!   inserted with `-I` at the position a full sync would give them, so the tables always
//!   read as a fresh full sync of the same plan. Nothing else is sent or read.
//!
//! Chains svcplane does not own are never named, so other software's rules stay as they
//! are. A mangle, filter and nat `KUBE-PROXY-CANARY` chain (holding one rule) tells when
//! someone flushed or deleted chains: [`IptablesBackend::rules_changed_behind_our_back`]
//! looks at them and asks for a full sync.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use svcplane_core::{Dataplane, DataplaneError, IpFamily, NodePlan, PlanDiff, PlanKey, SyncReport as CoreSyncReport};
use svcplane_iptables::{
    FakeIptables, Iptables, IptablesError, RestoreTable, Rule, SavedChain, SavedTable, Table, listed_rules, parse_save,
};
use tracing::{debug, warn};

use crate::names::is_service_chain;
use crate::render::{
    KUBE_PROXY_CANARY, KUBE_SERVICES, NodePortAddressing, PortRules, SharedChain, TABLES, base_chains, base_rules,
    canary_rule, family, hooks, node_ports_jumps, render_port,
};

/// How often [`IptablesBackend::rules_changed_behind_our_back`] looks at the canaries.
/// With [`NAT_CHECK_EVERY`], a flush of any table is found within 4 s, so it is repaired
/// within 5 s at the sizes a full sync takes well under a second.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Every this many checks the nat canary is looked at too; the mangle and filter ones every
/// time. Listing any chain of the legacy nat table fetches the whole table (0.1 s at 10k
/// Services: 2.5 % of one core at one look every 4 s), the other two tables are small.
pub const NAT_CHECK_EVERY: u32 = 2;

/// Why a sync failed. The restore that failed applied nothing; the next sync is a full one.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("applying the {family:?} {table} rules ({lines} lines): {source}")]
    Restore {
        family: IpFamily,
        table: Table,
        lines: usize,
        #[source]
        source: IptablesError,
    },
    #[error("reading the {family:?} {table} table: {source}")]
    Read {
        family: IpFamily,
        table: Table,
        #[source]
        source: IptablesError,
    },
}

impl SyncError {
    /// Whether the iptables programs are not installed at all.
    pub fn is_program_missing(&self) -> bool {
        match self {
            SyncError::Restore { source, .. } | SyncError::Read { source, .. } => source.is_program_missing(),
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub full: bool,
    pub service_ports: usize,
    /// Chain lines and commands sent.
    pub operations: usize,
    /// `iptables-restore` calls made.
    pub restores: usize,
}

/// The iptables backend: owns its chains in the filter, nat and mangle tables of each
/// family and keeps them equal to the plan.
#[derive(Debug)]
pub struct IptablesBackend<I> {
    iptables: I,
    families: Vec<IpFamily>,
    written: HashMap<PlanKey, PortRules>,
    /// Per family and shared chain, how many rules each service port has there, in the
    /// order a full sync writes them.
    layout: HashMap<(IpFamily, SharedChain), BTreeMap<PlanKey, usize>>,
    written_node_port_cidrs: Option<BTreeMap<IpFamily, Vec<IpNet>>>,
    needs_full_sync: bool,
    check_interval: Duration,
    last_check: Option<Instant>,
    checks: u32,
}

fn node_port_cidrs(plan: &NodePlan, family: IpFamily) -> NodePortAddressing {
    NodePortAddressing::of(plan, family)
}

/// Every service port of `family` in `plan`, rendered, in key order.
fn render_family(plan: &NodePlan, family: IpFamily) -> Vec<(PlanKey, PortRules)> {
    let cidrs = node_port_cidrs(plan, family);
    plan.service_ports
        .iter()
        .filter(|(key, _)| key.family == family)
        .map(|(key, port)| (key.clone(), render_port(port, &cidrs)))
        .collect()
}

fn has_rule(table: &SavedTable, chain: &str, rule: &Rule, family: svcplane_iptables::Family) -> bool {
    table
        .chain(chain)
        .is_some_and(|c| c.rules.iter().any(|saved| saved.parse().is_ok_and(|parsed| parsed.same_as(rule, family))))
}

/// Chains of `owned` that must stay because a chain outside `rewritten` (which keeps its
/// rules) jumps to them, directly or through another such chain. `ignored` rules (our own
/// hooks, about to be removed) do not count.
fn pinned_chains(
    table: &SavedTable,
    owned: &BTreeSet<String>,
    rewritten: &BTreeSet<String>,
    ignored: &[(&str, Rule)],
    family: svcplane_iptables::Family,
) -> BTreeSet<String> {
    let mut pinned: BTreeSet<String> = BTreeSet::new();
    let mut keeping: Vec<&str> =
        table.chains.iter().map(|c| c.name.as_str()).filter(|c| !rewritten.contains(*c)).collect();
    while let Some(chain) = keeping.pop() {
        let Some(saved) = table.chain(chain) else { continue };
        for rule in &saved.rules {
            let Some(target) = rule.jump_target() else { continue };
            let is_ignored = ignored.iter().any(|(hook_chain, hook_rule)| {
                *hook_chain == chain && rule.parse().is_ok_and(|parsed| parsed.same_as(hook_rule, family))
            });
            if !is_ignored && owned.contains(&target) && pinned.insert(target.clone()) {
                keeping.push(table.chain(&target).map(|c| c.name.as_str()).unwrap_or_default());
            }
        }
    }
    pinned
}

/// The restore input of a full sync of `table`: every owned chain named and written,
/// missing hooks inserted, stale per-service chains deleted. `existing` is the table as
/// `iptables-save` showed it (`None`: assume nothing is there).
pub fn full_restore(
    table: Table,
    ip_family: IpFamily,
    ports: &[(PlanKey, PortRules)],
    node_port_cidrs: &NodePortAddressing,
    existing: Option<&SavedTable>,
) -> RestoreTable {
    let fam = family(ip_family);
    let mut input = RestoreTable::new(table);
    let mut declared: BTreeSet<String> = BTreeSet::new();
    for chain in base_chains(table) {
        input.declare(*chain);
        declared.insert((*chain).to_owned());
    }
    if table == Table::Nat {
        for (_, port) in ports {
            for (chain, _) in &port.chains {
                input.declare(chain.clone());
                declared.insert(chain.clone());
            }
        }
    }
    for (chain, rule) in base_rules(table) {
        input.append(chain, rule);
    }
    for shared in SharedChain::ALL.into_iter().filter(|s| s.table() == table) {
        for (_, port) in ports {
            for rule in port.shared_rules(shared) {
                input.append(shared.name(), rule.clone());
            }
        }
        if shared == SharedChain::NatServices {
            for rule in node_ports_jumps(node_port_cidrs) {
                input.append(KUBE_SERVICES, rule);
            }
        }
    }
    if table == Table::Nat {
        for (_, port) in ports {
            for (chain, rules) in &port.chains {
                for rule in rules {
                    input.append(chain.clone(), rule.clone());
                }
            }
        }
    }
    for hook in hooks(table) {
        if !existing.is_some_and(|saved| has_rule(saved, hook.chain, &hook.rule, fam)) {
            input.insert(hook.chain, 1, hook.rule);
        }
    }
    if let Some(saved) = existing {
        let stale: BTreeSet<String> = saved
            .chains
            .iter()
            .map(|c| c.name.clone())
            .filter(|name| is_service_chain(name) && !declared.contains(name))
            .collect();
        let mut rewritten = declared.clone();
        rewritten.extend(stale.iter().cloned());
        let pinned = pinned_chains(saved, &stale, &rewritten, &[], fam);
        for chain in stale.difference(&pinned) {
            input.declare(chain.clone());
            input.delete_chain(chain.clone());
        }
        if !pinned.is_empty() {
            warn!(?pinned, "stale service chains stay: other rules still jump to them");
        }
    }
    input
}

/// The restore input that removes everything svcplane owns from `table` (hooks and
/// chains), except chains other rules still jump to.
pub fn cleanup_restore(table: Table, ip_family: IpFamily, saved: &SavedTable) -> RestoreTable {
    let fam = family(ip_family);
    let mut input = RestoreTable::new(table);
    let our_hooks: Vec<(&str, Rule)> = hooks(table).into_iter().map(|h| (h.chain, h.rule)).collect();
    for (chain, rule) in &our_hooks {
        let Some(saved_chain) = saved.chain(chain) else { continue };
        let copies = saved_chain.rules.iter().filter(|r| r.parse().is_ok_and(|p| p.same_as(rule, fam))).count();
        for _ in 0..copies {
            input.delete(*chain, rule.clone());
        }
    }
    let owned: BTreeSet<String> = saved
        .chains
        .iter()
        .map(|c| c.name.clone())
        .filter(|name| base_chains(table).contains(&name.as_str()) || is_service_chain(name))
        .collect();
    let pinned = pinned_chains(saved, &owned, &owned, &our_hooks, fam);
    for chain in owned.difference(&pinned) {
        input.declare(chain.clone());
    }
    for chain in owned.difference(&pinned) {
        input.delete_chain(chain.clone());
    }
    input
}

/// What `iptables-save` shows after a full sync of `plan` on a node with no other rules:
/// for each family a `# IPv4` / `# IPv6` line, then the tables (filter, mangle, nat).
pub fn render_dump(plan: &NodePlan, families: &[IpFamily]) -> String {
    let mut backend = IptablesBackend::with_families(FakeIptables::new(), families.to_vec());
    backend.sync(plan, &PlanDiff::default()).expect("the fake accepts every full sync the renderer produces");
    let mut out = String::new();
    for &ip_family in families {
        let (label, program) = match ip_family {
            IpFamily::V4 => ("IPv4", "iptables-save"),
            IpFamily::V6 => ("IPv6", "ip6tables-save"),
        };
        out.push_str(&format!("# {label}: what `{program}` shows after svcplane's full sync\n"));
        out.push_str(&backend.iptables().dump(family(ip_family)));
    }
    out
}

impl<I: Iptables> IptablesBackend<I> {
    /// A backend that programs both families.
    pub fn new(iptables: I) -> Self {
        Self::with_families(iptables, vec![IpFamily::V4, IpFamily::V6])
    }

    pub fn with_families(iptables: I, families: Vec<IpFamily>) -> Self {
        Self {
            iptables,
            families,
            written: HashMap::new(),
            layout: HashMap::new(),
            written_node_port_cidrs: None,
            needs_full_sync: true,
            check_interval: DEFAULT_CHECK_INTERVAL,
            last_check: None,
            checks: 0,
        }
    }

    /// How often [`Self::rules_changed_behind_our_back`] actually looks.
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    pub fn iptables(&self) -> &I {
        &self.iptables
    }

    pub fn iptables_mut(&mut self) -> &mut I {
        &mut self.iptables
    }

    /// Makes the next sync a full one.
    pub fn request_full_sync(&mut self) {
        self.needs_full_sync = true;
    }

    /// Brings the tables in line with `plan`. `changed` names the service ports that
    /// differ from the previous plan; it is ignored when a full sync is due.
    pub fn sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> Result<SyncReport, SyncError> {
        let result = if self.needs_full_sync || self.written_node_port_cidrs.as_ref() != Some(&plan.node_port_cidrs) {
            self.full_sync(plan)
        } else {
            self.partial_sync(plan, changed)
        };
        if result.is_err() {
            self.needs_full_sync = true;
        }
        result
    }

    fn restore(&mut self, ip_family: IpFamily, input: &RestoreTable, report: &mut SyncReport) -> Result<(), SyncError> {
        let lines = input.chains.len() + input.commands.len();
        debug!(family = ?ip_family, table = %input.table, lines, "iptables-restore");
        self.iptables.restore(family(ip_family), input).map_err(|source| SyncError::Restore {
            family: ip_family,
            table: input.table,
            lines,
            source,
        })?;
        report.operations += lines;
        report.restores += 1;
        Ok(())
    }

    fn read(&self, ip_family: IpFamily, table: Table) -> Result<Option<SavedTable>, SyncError> {
        let read_error = |source| SyncError::Read { family: ip_family, table, source };
        let text = self.iptables.save(family(ip_family), table).map_err(read_error)?;
        let ruleset = parse_save(&text).map_err(read_error)?;
        Ok(ruleset.table(table).cloned())
    }

    /// The table as a full sync needs it. If it cannot be read whole, the built-in chains
    /// alone (to know which hooks exist): stale service chains then stay until a later full
    /// sync can read the table, as kube-proxy leaves them when `iptables-save` fails.
    fn read_for_full_sync(&self, ip_family: IpFamily, table: Table) -> Result<Option<SavedTable>, SyncError> {
        let error = match self.read(ip_family, table) {
            Ok(saved) => return Ok(saved),
            Err(error) => error,
        };
        warn!("{error}; stale service chains stay until the table can be read");
        let read_error = |source| SyncError::Read { family: ip_family, table, source };
        let mut saved = SavedTable { name: table.name().to_owned(), chains: Vec::new() };
        for chain in table.builtin_chains() {
            let listing = self.iptables.list_chain(family(ip_family), table, chain).map_err(read_error)?;
            if let Some(text) = listing {
                saved.chains.push(SavedChain { name: (*chain).to_owned(), policy: None, rules: listed_rules(&text) });
            }
        }
        Ok(Some(saved))
    }

    fn full_sync(&mut self, plan: &NodePlan) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport { full: true, ..SyncReport::default() };
        self.written.clear();
        self.layout.clear();
        for ip_family in self.families.clone() {
            let ports = render_family(plan, ip_family);
            let cidrs = node_port_cidrs(plan, ip_family);
            for table in TABLES {
                let existing = self.read_for_full_sync(ip_family, table)?;
                let input = full_restore(table, ip_family, &ports, &cidrs, existing.as_ref());
                self.restore(ip_family, &input, &mut report)?;
            }
            report.service_ports += ports.len();
            for (key, port) in ports {
                for shared in SharedChain::ALL {
                    let count = port.shared_rules(shared).len();
                    if count > 0 {
                        self.layout.entry((ip_family, shared)).or_default().insert(key.clone(), count);
                    }
                }
                self.written.insert(key, port);
            }
        }
        self.written_node_port_cidrs = Some(plan.node_port_cidrs.clone());
        self.needs_full_sync = false;
        self.last_check = Some(Instant::now());
        Ok(report)
    }

    fn partial_sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport::default();
        let empty = PortRules::default();
        for ip_family in self.families.clone() {
            let cidrs = node_port_cidrs(plan, ip_family);
            let rendered: Vec<(PlanKey, Option<PortRules>)> = changed
                .keys()
                .filter(|key| key.family == ip_family)
                .map(|key| (key.clone(), plan.service_ports.get(key).map(|p| render_port(p, &cidrs))))
                .collect();
            if rendered.is_empty() {
                continue;
            }
            let mut filter = Phases::new(Table::Filter);
            let mut nat = Phases::new(Table::Nat);
            let mut layouts: Vec<(SharedChain, BTreeMap<PlanKey, usize>)> = Vec::new();
            for shared in SharedChain::ALL {
                let phases = if shared.table() == Table::Nat { &mut nat } else { &mut filter };
                let mut layout = self.layout.get(&(ip_family, shared)).cloned().unwrap_or_default();
                let mut moved: BTreeMap<&PlanKey, &[Rule]> = BTreeMap::new();
                for (key, new) in &rendered {
                    let old = self.written.get(key).unwrap_or(&empty).shared_rules(shared);
                    let new = new.as_ref().unwrap_or(&empty).shared_rules(shared);
                    if old == new {
                        continue;
                    }
                    for rule in old {
                        phases.deletes.push((shared.name(), rule.clone()));
                    }
                    if new.is_empty() {
                        layout.remove(key);
                    } else {
                        layout.insert(key.clone(), new.len());
                    }
                    moved.insert(key, new);
                }
                if moved.is_empty() {
                    continue;
                }
                // Insert where a full sync would have put them: after every rule of the
                // service ports that sort before.
                let mut position = 1;
                for (key, count) in &layout {
                    if let Some(rules) = moved.get(key) {
                        for (offset, rule) in rules.iter().enumerate() {
                            phases.inserts.push((shared.name(), position + offset, rule.clone()));
                        }
                    }
                    position += count;
                }
                layouts.push((shared, layout));
            }
            for (key, new) in &rendered {
                let old = self.written.get(key).unwrap_or(&empty);
                let new = new.as_ref().unwrap_or(&empty);
                let old_chains: HashMap<&str, &Vec<Rule>> = old.chains.iter().map(|(n, r)| (n.as_str(), r)).collect();
                let new_names: BTreeSet<&str> = new.chains.iter().map(|(n, _)| n.as_str()).collect();
                for (name, rules) in &new.chains {
                    if old_chains.get(name.as_str()) != Some(&rules) {
                        nat.input.declare(name.clone());
                        nat.appends.extend(rules.iter().map(|r| (name.clone(), r.clone())));
                    }
                }
                for (name, _) in &old.chains {
                    if !new_names.contains(name.as_str()) {
                        nat.input.declare(name.clone());
                        nat.chain_deletes.push(name.clone());
                    }
                }
            }
            for phases in [filter, nat] {
                let input = phases.into_input();
                if !input.is_empty() {
                    self.restore(ip_family, &input, &mut report)?;
                }
            }
            for (shared, layout) in layouts {
                self.layout.insert((ip_family, shared), layout);
            }
            report.service_ports += rendered.len();
            for (key, rules) in rendered {
                match rules {
                    Some(rules) => self.written.insert(key, rules),
                    None => self.written.remove(&key),
                };
            }
        }
        Ok(report)
    }

    /// Looks (at most every check interval) whether the canaries are still there, and if
    /// not asks for a full sync and says so. Errors reading them are logged, not fatal.
    pub fn rules_changed_behind_our_back(&mut self) -> bool {
        if self.needs_full_sync || self.last_check.is_some_and(|at| at.elapsed() < self.check_interval) {
            return false;
        }
        self.last_check = Some(Instant::now());
        self.checks = self.checks.wrapping_add(1);
        match self.canaries_intact(self.checks.is_multiple_of(NAT_CHECK_EVERY)) {
            Ok(true) => false,
            Ok(false) => {
                warn!("svcplane's iptables rules were changed behind its back (a canary is gone); resyncing in full");
                self.needs_full_sync = true;
                true
            }
            Err(error) => {
                warn!("checking svcplane's iptables canaries: {error}");
                false
            }
        }
    }

    /// Whether every family's mangle and filter canaries (and with `with_nat` the nat one)
    /// still hold their rule.
    pub fn canaries_intact(&self, with_nat: bool) -> Result<bool, IptablesError> {
        let tables: &[Table] =
            if with_nat { &[Table::Mangle, Table::Filter, Table::Nat] } else { &[Table::Mangle, Table::Filter] };
        for &ip_family in &self.families {
            let fam = family(ip_family);
            for &table in tables {
                let Some(listing) = self.iptables.list_chain(fam, table, KUBE_PROXY_CANARY)? else {
                    return Ok(false);
                };
                let intact =
                    listed_rules(&listing).iter().any(|r| r.parse().is_ok_and(|p| p.same_as(&canary_rule(), fam)));
                if !intact {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Removes every hook and chain svcplane owns (chains other rules still jump to stay).
    /// Returns whether anything was there.
    pub fn cleanup(&mut self) -> Result<bool, SyncError> {
        let mut removed = false;
        let mut report = SyncReport::default();
        for ip_family in self.families.clone() {
            // Only the tables that exist: reading one by name would create it (legacy).
            let read_error = |source| SyncError::Read { family: ip_family, table: Table::Filter, source };
            let text = self.iptables.save_all(family(ip_family)).map_err(read_error)?;
            let ruleset = parse_save(&text).map_err(read_error)?;
            for table in TABLES {
                let Some(saved) = ruleset.table(table) else { continue };
                let input = cleanup_restore(table, ip_family, saved);
                if !input.is_empty() {
                    self.restore(ip_family, &input, &mut report)?;
                    removed = true;
                }
            }
        }
        self.written.clear();
        self.layout.clear();
        self.needs_full_sync = true;
        Ok(removed)
    }
}

/// A partial sync's commands for one table, in the order that keeps every reference valid:
/// `-D` of old shared rules (dropping references to chains about to go), rules of
/// (re)written chains, `-I` of new shared rules, then `-X` of chains no longer planned.
#[derive(Debug)]
struct Phases {
    input: RestoreTable,
    deletes: Vec<(&'static str, Rule)>,
    appends: Vec<(String, Rule)>,
    inserts: Vec<(&'static str, usize, Rule)>,
    chain_deletes: Vec<String>,
}

impl Phases {
    fn new(table: Table) -> Self {
        Self {
            input: RestoreTable::new(table),
            deletes: Vec::new(),
            appends: Vec::new(),
            inserts: Vec::new(),
            chain_deletes: Vec::new(),
        }
    }

    fn into_input(self) -> RestoreTable {
        let mut input = self.input;
        for (chain, rule) in self.deletes {
            input.delete(chain, rule);
        }
        for (chain, rule) in self.appends {
            input.append(chain, rule);
        }
        for (chain, position, rule) in self.inserts {
            input.insert(chain, position, rule);
        }
        for chain in self.chain_deletes {
            input.delete_chain(chain);
        }
        input
    }
}

impl<I: Iptables + Send + std::fmt::Debug> Dataplane for IptablesBackend<I> {
    fn mode(&self) -> &'static str {
        "iptables"
    }

    /// The Services' rules per family and table, from the record of what was written (the
    /// few fixed rules of the base chains are not counted).
    fn rule_counts(&self) -> Vec<svcplane_core::RuleCount> {
        let mut counts: BTreeMap<(IpFamily, &'static str), usize> = BTreeMap::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            counts.insert((family, "nat"), 0);
            counts.insert((family, "filter"), 0);
        }
        for (key, port) in &self.written {
            for (chain, rules) in &port.shared {
                let table = if chain.table() == Table::Nat { "nat" } else { "filter" };
                *counts.entry((key.family, table)).or_default() += rules.len();
            }
            *counts.entry((key.family, "nat")).or_default() += port.chains.iter().map(|(_, r)| r.len()).sum::<usize>();
        }
        counts.into_iter().map(|((family, table), rules)| svcplane_core::RuleCount { family, table, rules }).collect()
    }

    fn sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<CoreSyncReport, DataplaneError> {
        let report = IptablesBackend::sync(self, plan, diff)?;
        Ok(CoreSyncReport {
            full: report.full,
            service_ports: report.service_ports,
            operations: report.operations,
            rules_replaced: false,
        })
    }

    fn request_full_resync(&mut self) {
        self.request_full_sync();
    }

    fn detect_drift(&mut self) -> Option<String> {
        self.rules_changed_behind_our_back().then(|| "a canary chain of svcplane's iptables rules is gone".to_owned())
    }

    fn render(&self, plan: &NodePlan) -> Result<String, DataplaneError> {
        Ok(render_dump(plan, &self.families))
    }

    fn cleanup(&mut self) -> Result<bool, DataplaneError> {
        match IptablesBackend::cleanup(self) {
            Ok(found) => Ok(found),
            // A node without this iptables variant has nothing of it to remove.
            Err(error) if error.is_program_missing() => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    fn counters(&mut self) -> Result<Vec<svcplane_core::counters::EndpointCounter>, DataplaneError> {
        Ok(crate::counters::read(&self.iptables, &self.families)?)
    }
}
