//! Applying plans: a full sync writes each table whole, one transaction per table; a
//! partial sync sends only the difference for the service ports that changed, one
//! transaction per table they live in. The difference is computed between the port as the
//! plan has it now and the port as it was when last written, which the sync loop hands
//! over with the change ([`PlanDiff::previous`]: the plan's value before the changes since
//! the last successful sync) and which is rendered again: the kernel is never read back on
//! the sync path, and the backend keeps no copy of the rules, chain names or elements it
//! wrote (at 10k Services that record was the largest part of the backend's memory).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use svcplane_core::{Dataplane, DataplaneError, IpFamily, NodePlan, PlanDiff, PlanKey, SyncReport as CoreSyncReport};
use svcplane_nft::{Element, NftError, Nftables, Operation, Rule, TableName, Transaction};
use tracing::{debug, info, warn};

use crate::digest::{self, PortDigest, TableDigest};
use crate::render::{
    MAX_TABLES, PortObjects, base_operations, hairpin_element, render_port_counting, table_index, tables_for,
    tables_table_name,
};

/// Why a sync failed. The previous ruleset stays in place (transactions are atomic) and
/// the next sync is a full one.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("applying the {family:?} nftables transaction to table {table} ({operations} operations): {source}")]
    Apply {
        family: IpFamily,
        table: String,
        operations: usize,
        #[source]
        source: NftError,
    },
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub full: bool,
    pub service_ports: usize,
    pub operations: usize,
    /// Tables were replaced (added, deleted and written anew in one transaction), which
    /// unhooks and rehooks their nat chains: see [`svcplane_core::SyncReport::rules_replaced`].
    pub rules_replaced: bool,
}

/// The nftables backend: owns the `svcplane` tables and keeps them equal to the plan.
#[derive(Debug)]
pub struct NftablesBackend<N> {
    nft: N,
    families: Vec<IpFamily>,
    /// The digest each table holds (see [`crate::digest`]), as of the last sync.
    table_digests: HashMap<TableKey, TableDigest>,
    /// How many service ports of each table use an endpoint address for hairpin.
    hairpin_refs: HairpinRefs,
    /// How many tables each family's service ports are spread over (see
    /// [`crate::render::tables_for`]); decided by each full sync, raised when the plan outgrows it.
    tables: usize,
    /// A fixed number of tables instead of one that follows the plan's size.
    fixed_tables: Option<usize>,
    /// The node-port CIDRs the base objects were written with; a change rewrites all.
    written_node_port_cidrs: Option<BTreeMap<IpFamily, Vec<IpNet>>>,
    needs_full_sync: bool,
    /// The next full sync deletes the table and writes it anew: the last in-place full sync
    /// was refused over what the table holds (a set or chain exists with a definition the
    /// kernel will not change in place, e.g. after an upgrade), or two failed in a row.
    replace_table: bool,
    /// The last full sync, in place, failed for a reason replacing the table does not cure
    /// (the socket, a missing object); a second such failure replaces the table anyway.
    in_place_failed: bool,
    drift_check_interval: Duration,
    last_drift_check: Option<Instant>,
    /// Per-endpoint `counter` statements in the DNAT rules (on by default).
    counting: bool,
}

/// The objects a service port was last written with: rendered again from the port as the
/// plan had it then ([`PlanDiff::previous`]); none for a port that is new.
fn previously_written(changed: &PlanDiff, key: &PlanKey, counting: bool) -> Option<PortObjects> {
    changed.previous(key).map(|port| render_port_counting(port, counting))
}

/// One table: a family and an index among its tables.
type TableKey = (IpFamily, usize);

/// How many service ports of each table use an endpoint address for hairpin: one entry
/// per endpoint address, so at 10k Services x 10 endpoints 100k of them, kept small. The
/// family is the address's own, so each family has a map keyed by the table's index and
/// the address alone (12 bytes an IPv4 entry; `(TableKey, IpAddr)` keys with `usize`
/// counts took 48).
#[derive(Debug, Default)]
struct HairpinRefs {
    v4: HashMap<(u32, Ipv4Addr), u32>,
    v6: HashMap<(u32, Ipv6Addr), u32>,
}

impl HairpinRefs {
    fn index(table: TableKey) -> u32 {
        u32::try_from(table.1).expect("a table index is below MAX_TABLES")
    }

    fn get(&self, table: TableKey, address: IpAddr) -> usize {
        let count = match address {
            IpAddr::V4(address) => self.v4.get(&(Self::index(table), address)),
            IpAddr::V6(address) => self.v6.get(&(Self::index(table), address)),
        };
        count.map_or(0, |&count| count as usize)
    }

    fn add_one(&mut self, table: TableKey, address: IpAddr) {
        let count = match address {
            IpAddr::V4(address) => self.v4.entry((Self::index(table), address)).or_insert(0),
            IpAddr::V6(address) => self.v6.entry((Self::index(table), address)).or_insert(0),
        };
        *count += 1;
    }

    /// Sets the count; 0 forgets the address.
    fn set(&mut self, table: TableKey, address: IpAddr, count: usize) {
        let index = Self::index(table);
        let count = u32::try_from(count).expect("fewer than 2^32 service ports per address");
        match (address, count) {
            (IpAddr::V4(address), 0) => drop(self.v4.remove(&(index, address))),
            (IpAddr::V6(address), 0) => drop(self.v6.remove(&(index, address))),
            (IpAddr::V4(address), _) => drop(self.v4.insert((index, address), count)),
            (IpAddr::V6(address), _) => drop(self.v6.insert((index, address), count)),
        }
    }

    fn clear(&mut self) {
        // Replaced, not cleared: a cleared map keeps its capacity.
        *self = Self::default();
    }
}

/// How often [`NftablesBackend::find_drift`] asks the kernel: the loop may call it every
/// tick, a deleted or flushed table is found within this (plus a sync).
pub const DEFAULT_DRIFT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Chains every svcplane table holds rules in; none of them ever empty after a sync. A table
/// deleted (`nft delete table`, `nft flush ruleset`) or flushed (`nft flush table`) shows
/// here as a chain with no rules.
const CANARY_CHAINS: [&str; 2] = ["services", "nat-prerouting"];

/// Every table operation for `plan` from scratch, one transaction per family.
///
/// The table is kept, not deleted and re-added: every set and chain is added (a no-op where
/// it exists), the static maps and every chain are flushed, and the rules and elements are
/// written again, all in one transaction. The base chains therefore stay registered with
/// their hooks across a full sync (deleting the table re-registered them, and a new
/// connection arriving during that commit could miss the DNAT), and the affinity sets keep
/// the clients they remember. Chains and sets of Services that are gone stay behind empty
/// and unreferenced until the table is deleted (`svcplane cleanup`).
///
/// The plan's size decides how many tables each family uses ([`crate::render::tables_for`]).
pub fn render_full(plan: &NodePlan, families: &[IpFamily]) -> Vec<Transaction> {
    render_tables(plan, families, true, tables_for(largest_family(plan, families)))
        .into_iter()
        .map(|table| table.transaction)
        .collect()
}

/// How many service ports the family with the most has.
fn largest_family(plan: &NodePlan, families: &[IpFamily]) -> usize {
    families
        .iter()
        .map(|&family| plan.service_ports.keys().filter(|key| key.family == family).count())
        .max()
        .unwrap_or(0)
}

/// One table of a full sync: which it is and its transaction (whose last element records
/// the table's digest).
struct RenderedTable {
    family: IpFamily,
    index: usize,
    transaction: Transaction,
}

/// [`render_full`] over `tables` tables per family (the rules move into the transactions;
/// the record of what was written is made after they are applied).
fn render_tables(plan: &NodePlan, families: &[IpFamily], counting: bool, tables: usize) -> Vec<RenderedTable> {
    let mut out = Vec::with_capacity(families.len() * tables);
    for &family in families {
        // Per table: its operations, the hairpin addresses already added and its digest.
        let base = base_operations(family, plan);
        let base_digest = TableDigest::of_base(&base);
        let mut per_table: Vec<(Vec<Operation>, HashSet<IpAddr>, TableDigest)> =
            (0..tables).map(|_| (base.clone(), HashSet::new(), base_digest)).collect();
        drop(base);
        for (key, port_plan) in plan.service_ports.iter().filter(|(key, _)| key.family == family) {
            let (operations, hairpin, digest) = &mut per_table[table_index(&key.name, tables)];
            let objects = render_port_counting(port_plan, counting);
            *digest = digest.with(PortDigest::of(&objects));
            let PortObjects { chains, elements, endpoint_addresses, sets } = objects;
            operations.extend(sets.into_iter().map(Operation::AddSet));
            add_chains(operations, chains);
            operations.extend(elements.into_iter().map(Operation::AddElement));
            for address in endpoint_addresses {
                if hairpin.insert(address) {
                    operations.push(Operation::AddElement(hairpin_element(address)));
                }
            }
        }
        for (index, (mut operations, _, digest)) in per_table.into_iter().enumerate() {
            let table = tables_table_name(family, index);
            operations.push(Operation::AddElement(digest.element()));
            out.push(RenderedTable {
                family,
                index,
                transaction: Transaction { table, operations: replacing_in_place(operations) },
            });
        }
    }
    out
}

/// Whether a refused full sync in place may succeed as a replacement of the table: the kernel
/// objected to a definition, a reference or a use of what the table holds. A missing object
/// (every set and chain is added before use) or a failed socket is not about the table.
fn replacing_may_cure(error: &NftError) -> bool {
    use svcplane_nft::ErrorKind;
    match error.kind() {
        ErrorKind::Invalid | ErrorKind::Exists | ErrorKind::InUse | ErrorKind::Refused => true,
        ErrorKind::NotFound | ErrorKind::Io => false,
    }
}

/// Orders a from-scratch list of operations so that it also replaces whatever the table
/// holds: the table, then every set and chain (added if missing), then flushes of the sets
/// with static content and of every chain, then the rules and elements.
///
/// The rules and elements (most of the list) stay where they are: the few declarations and
/// flushes are moved in front of them in place, so a full sync never holds the whole list
/// twice.
fn replacing_in_place(mut operations: Vec<Operation>) -> Vec<Operation> {
    let mut table = Vec::new();
    let mut sets = Vec::new();
    let mut chains = Vec::new();
    let mut flushes = Vec::new();
    let declarations = operations.extract_if(.., |operation| {
        matches!(operation, Operation::AddTable { .. } | Operation::AddSet(_) | Operation::AddChain(_))
    });
    for operation in declarations {
        match operation {
            Operation::AddTable { .. } => table.push(operation),
            Operation::AddSet(ref set) => {
                // Dynamic sets (affinity) hold what packets put there: kept.
                if set.dynamic_timeout.is_none() {
                    flushes.push(Operation::FlushSet(set.name.clone()));
                }
                sets.push(operation);
            }
            Operation::AddChain(ref chain) => {
                flushes.push(Operation::FlushChain(chain.name.clone()));
                chains.push(operation);
            }
            _ => unreachable!("extract_if takes only declarations"),
        }
    }
    operations.splice(0..0, table.into_iter().chain(sets).chain(chains).chain(flushes));
    operations
}

fn add_chains(operations: &mut Vec<Operation>, chains: Vec<(String, Vec<Rule>)>) {
    // All chains first: rules may jump to chains created later in the list.
    for (name, _) in &chains {
        operations.push(Operation::AddChain(svcplane_nft::Chain { name: name.clone(), base: None, comment: None }));
    }
    for (_, rules) in chains {
        operations.extend(rules.into_iter().map(Operation::AddRule));
    }
}

/// The operations that turn `old` into `new` for one service port, sorted into phases so
/// that nothing is referenced before it exists or deleted while still referenced.
#[derive(Debug, Default)]
struct Phases {
    add_chains: Vec<Operation>,
    rules: Vec<Operation>,
    delete_elements: Vec<Operation>,
    add_elements: Vec<Operation>,
    /// Stale chains are all flushed before any is deleted: they may jump to each other.
    flush_chains: Vec<Operation>,
    delete_chains: Vec<Operation>,
    /// Sets go last: only the deleted chains' rules used them.
    delete_sets: Vec<Operation>,
}

impl Phases {
    fn diff(&mut self, old: &PortObjects, new: &PortObjects) {
        // Adding a set that exists with other settings (a new affinity timeout) updates it.
        for set in &new.sets {
            if !old.sets.contains(set) {
                self.add_chains.push(Operation::AddSet(set.clone()));
            }
        }
        for set in &old.sets {
            if !new.sets.iter().any(|known| known.name == set.name) {
                self.delete_sets.push(Operation::DeleteSet(set.name.clone()));
            }
        }
        let old_chains: HashMap<&str, &Vec<Rule>> = old.chains.iter().map(|(n, rules)| (n.as_str(), rules)).collect();
        let new_chain_names: HashSet<&str> = new.chains.iter().map(|(n, _)| n.as_str()).collect();
        for (name, rules) in &new.chains {
            match old_chains.get(name.as_str()) {
                None => {
                    self.add_chains.push(Operation::AddChain(svcplane_nft::Chain {
                        name: name.clone(),
                        base: None,
                        comment: None,
                    }));
                    self.rules.extend(rules.iter().cloned().map(Operation::AddRule));
                }
                Some(old_rules) if *old_rules != rules => {
                    self.rules.push(Operation::FlushChain(name.clone()));
                    self.rules.extend(rules.iter().cloned().map(Operation::AddRule));
                }
                Some(_) => {}
            }
        }
        for (name, _) in &old.chains {
            if !new_chain_names.contains(name.as_str()) {
                self.flush_chains.push(Operation::FlushChain(name.clone()));
                self.delete_chains.push(Operation::DeleteChain(name.clone()));
            }
        }
        let element_id = |e: &Element| (e.set.clone(), e.key.clone());
        let old_elements: HashMap<_, &Element> = old.elements.iter().map(|e| (element_id(e), e)).collect();
        let new_elements: HashMap<_, &Element> = new.elements.iter().map(|e| (element_id(e), e)).collect();
        for element in &new.elements {
            match old_elements.get(&element_id(element)) {
                Some(old_element) if *old_element == element => {}
                Some(old_element) => {
                    self.delete_elements.push(Operation::DeleteElement((*old_element).clone()));
                    self.add_elements.push(Operation::AddElement(element.clone()));
                }
                None => self.add_elements.push(Operation::AddElement(element.clone())),
            }
        }
        for element in &old.elements {
            if !new_elements.contains_key(&element_id(element)) {
                self.delete_elements.push(Operation::DeleteElement(element.clone()));
            }
        }
    }

    fn into_operations(self) -> Vec<Operation> {
        let mut operations = self.add_chains;
        operations.extend(self.rules);
        operations.extend(self.delete_elements);
        operations.extend(self.add_elements);
        operations.extend(self.flush_chains);
        operations.extend(self.delete_chains);
        operations.extend(self.delete_sets);
        operations
    }
}

impl<N: Nftables> NftablesBackend<N> {
    /// A backend that programs both IP families through `nft`.
    pub fn new(nft: N) -> Self {
        Self::with_families(nft, vec![IpFamily::V4, IpFamily::V6])
    }

    pub fn with_families(nft: N, families: Vec<IpFamily>) -> Self {
        Self {
            nft,
            families,
            table_digests: HashMap::new(),
            hairpin_refs: HairpinRefs::default(),
            tables: 0,
            fixed_tables: None,
            written_node_port_cidrs: None,
            needs_full_sync: true,
            replace_table: false,
            in_place_failed: false,
            drift_check_interval: DEFAULT_DRIFT_CHECK_INTERVAL,
            last_drift_check: None,
            counting: true,
        }
    }

    /// With `false`, endpoint rules carry no `counter`: `counters()` then reads nothing.
    pub fn with_counting(mut self, counting: bool) -> Self {
        self.counting = counting;
        self
    }

    /// Spreads each family over exactly `tables` tables (1 to [`MAX_TABLES`]) whatever the
    /// plan's size, instead of the number [`crate::render::tables_for`] picks.
    pub fn with_tables(mut self, tables: usize) -> Self {
        self.fixed_tables = Some(tables.clamp(1, MAX_TABLES));
        self
    }

    /// How many tables each family is spread over now.
    pub fn tables(&self) -> usize {
        self.tables
    }

    /// How often drift checks actually ask the kernel.
    pub fn with_drift_check_interval(mut self, interval: Duration) -> Self {
        self.drift_check_interval = interval;
        self
    }

    /// Looks (at most every check interval, and only once something was written) whether
    /// svcplane's tables are still there and hold their rules; if not, asks for a full sync
    /// and says what was found. Errors asking are logged, not fatal.
    pub fn find_drift(&mut self) -> Option<String> {
        if self.needs_full_sync || self.last_drift_check.is_some_and(|at| at.elapsed() < self.drift_check_interval) {
            return None;
        }
        self.last_drift_check = Some(Instant::now());
        let tables: Vec<_> = self
            .families
            .iter()
            .flat_map(|&family| (0..self.tables).map(move |index| tables_table_name(family, index)))
            .collect();
        for table in tables {
            for chain in CANARY_CHAINS {
                match self.nft.count_rules(&table, chain) {
                    Ok(0) => {
                        self.needs_full_sync = true;
                        return Some(format!(
                            "chain {chain} of table {} {} holds no rules: the table was deleted or flushed",
                            table.family.keyword(),
                            table.name
                        ));
                    }
                    Ok(_) => {}
                    Err(error) => {
                        warn!("checking svcplane's nftables table for drift: {error}");
                        return None;
                    }
                }
            }
        }
        None
    }

    pub fn nftables(&self) -> &N {
        &self.nft
    }

    pub fn nftables_mut(&mut self) -> &mut N {
        &mut self.nft
    }

    /// Makes the next sync a full one (startup, after a failure, or when the operator asks).
    pub fn request_full_sync(&mut self) {
        self.needs_full_sync = true;
    }

    /// Brings the kernel in line with `plan`. `changed` names the service ports that differ
    /// from the plan of the last successful sync, with what they were in it (the sync loop
    /// keeps a failed sync's diff for the next); a full sync uses it only to find what the
    /// ports that move to another table left in their old one.
    pub fn sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> Result<SyncReport, SyncError> {
        if self.needs_full_sync
            || self.written_node_port_cidrs.as_ref() != Some(&plan.node_port_cidrs)
            || self.outgrown(plan)
        {
            return self.full_sync(plan, changed);
        }
        self.partial_sync(plan, changed)
    }

    /// The tables the plan wants, fixed or by its size.
    fn wanted_tables(&self, plan: &NodePlan) -> usize {
        self.fixed_tables.unwrap_or_else(|| tables_for(largest_family(plan, &self.families)))
    }

    /// The plan has outgrown the tables it was spread over (a power of two, so this takes
    /// between one and two times the ports they were sized for): the next sync is a full
    /// one over more tables. Never fewer while running: a shrinking cluster keeps its
    /// tables, so a size near a boundary cannot flap.
    fn outgrown(&self, plan: &NodePlan) -> bool {
        // The count by family walks every port: only when the total says it could be so.
        self.fixed_tables.is_none()
            && plan.service_ports.len() > self.tables * crate::render::SERVICE_PORTS_PER_TABLE
            && self.wanted_tables(plan) > self.tables
    }

    fn full_sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> Result<SyncReport, SyncError> {
        // While running, never fewer tables than before (see `outgrown`); a new process
        // sizes them from its first plan.
        let tables = self.fixed_tables.unwrap_or_else(|| self.wanted_tables(plan).max(self.tables));
        // Only a new process can find more tables than it wants (its count never shrinks
        // while running); it looks before writing, since the `nft` CLI lists every table's
        // contents to name them, and its own would make that costly.
        let unused = if self.tables == 0 { self.tables_beyond(tables) } else { Vec::new() };
        let started = Instant::now();
        // Tables that already hold exactly what this sync would write (a restart, a resync
        // with nothing changed) are left alone; growing the table count moves ports, and a
        // table being replaced is rewritten whatever it holds. When there is a table of ours
        // to compare with, the record of what the plan writes (with each table's digest) is
        // made first, and only the tables whose digest differs are rendered.
        let may_keep = !self.replace_table && (self.tables == 0 || tables == self.tables);
        let mut kept = HashSet::new();
        let recorded = may_keep && self.some_table_holds_rules(tables);
        if recorded {
            self.record(plan, tables);
            let digests: Vec<(TableKey, TableDigest)> = self.table_digests.iter().map(|(k, d)| (*k, *d)).collect();
            for ((family, index), digest) in digests {
                if self.holds_as_written(&tables_table_name(family, index), digest) {
                    kept.insert((family, index));
                }
            }
        }
        let total_tables = self.families.len() * tables;
        let mut rendered = if kept.len() < total_tables {
            render_tables(plan, &self.families, self.counting, tables)
        } else {
            Vec::new()
        };
        rendered.retain(|table| !kept.contains(&(table.family, table.index)));
        let render_time = started.elapsed();
        if self.tables != 0 && tables != self.tables {
            self.remove_moved_objects(&mut rendered, tables, plan, changed);
        }
        let rules_replaced = self.replace_table && !rendered.is_empty();
        if self.replace_table {
            warn!(
                tables = rendered.len(),
                "full sync: replacing svcplane's tables, since the last in-place sync was refused"
            );
            for RenderedTable { transaction, .. } in &mut rendered {
                transaction.operations.splice(0..0, [Operation::AddTable { comment: None }, Operation::DeleteTable]);
            }
        }
        // The highest-numbered tables first: when the count grows, the ports that move go
        // to a new, higher-numbered table, so they are served there before their old table
        // drops them, and no new connection finds them in neither.
        rendered.sort_by_key(|table| (table.family, std::cmp::Reverse(table.index)));
        let mut operations = 0;
        for RenderedTable { family, transaction, .. } in &rendered {
            operations += transaction.operations.len();
            if let Err(source) = self.nft.apply(transaction) {
                // Replacing the table unhooks and rehooks its nat chains in the commit, and a
                // new flow meeting neither keeps no DNAT for its life (docs/reliability.md):
                // so only when the refusal may be about what the table holds, or when an
                // in-place retry failed too.
                self.replace_table = self.replace_table || self.in_place_failed || replacing_may_cure(&source);
                self.in_place_failed = !self.replace_table;
                return Err(SyncError::Apply {
                    family: *family,
                    table: transaction.table.name.clone(),
                    operations: transaction.operations.len(),
                    source,
                });
            }
        }
        if !kept.is_empty() {
            info!(
                kept = kept.len(),
                tables = total_tables,
                "full sync: tables already holding what this plan writes were left as they are"
            );
        }
        for table in unused {
            if let Err(error) = self.nft.delete_table(&table) {
                warn!("deleting svcplane's unused nftables table {} {}: {error}", table.family.keyword(), table.name);
            }
        }
        self.tables = tables;
        self.replace_table = false;
        self.in_place_failed = false;
        debug!(?render_time, apply_time = ?(started.elapsed() - render_time), operations, tables, "full sync");
        if !recorded {
            // The rules are in the kernel: the transactions go before the record is made, so
            // the record's small allocations are not spread among the transactions' (which
            // would keep most of that memory in the process after it is freed).
            drop(rendered);
            self.record(plan, tables);
        }
        self.written_node_port_cidrs = Some(plan.node_port_cidrs.clone());
        self.needs_full_sync = false;
        Ok(SyncReport { full: true, service_ports: plan.service_ports.len(), operations, rules_replaced })
    }

    /// Makes the record of what `plan` writes over `tables` tables per family: the hairpin
    /// references and each table's digest (each port rendered once more, one at a time,
    /// and dropped).
    fn record(&mut self, plan: &NodePlan, tables: usize) {
        self.hairpin_refs.clear();
        self.table_digests.clear();
        for &family in &self.families {
            let base = TableDigest::of_base(&base_operations(family, plan));
            self.table_digests.extend((0..tables).map(|index| ((family, index), base)));
        }
        for (key, port_plan) in plan.service_ports.iter().filter(|(key, _)| self.families.contains(&key.family)) {
            let objects = render_port_counting(port_plan, self.counting);
            let table = (key.family, table_index(&key.name, tables));
            for address in &objects.endpoint_addresses {
                self.hairpin_refs.add_one(table, *address);
            }
            if let Some(digest) = self.table_digests.get_mut(&table) {
                *digest = digest.with(PortDigest::of(&objects));
            }
        }
    }

    /// Whether any of the tables a full sync over `tables` per family writes exists with
    /// rules in it (a cold start finds none, and then compares no digests). A failed read
    /// counts as no.
    fn some_table_holds_rules(&mut self, tables: usize) -> bool {
        let names: Vec<TableName> = self
            .families
            .iter()
            .flat_map(|&family| (0..tables).map(move |index| tables_table_name(family, index)))
            .collect();
        names.iter().any(|table| self.nft.count_rules(table, CANARY_CHAINS[0]).is_ok_and(|rules| rules > 0))
    }

    fn partial_sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> Result<SyncReport, SyncError> {
        let empty = PortObjects::default();
        let mut report = SyncReport::default();
        // One transaction per table the changed ports live in, in a fixed order.
        let mut by_table: BTreeMap<TableKey, Vec<&PlanKey>> = BTreeMap::new();
        for key in changed.keys().filter(|key| self.families.contains(&key.family)) {
            by_table.entry((key.family, table_index(&key.name, self.tables))).or_default().push(key);
        }
        for (table, keys) in by_table {
            let mut phases = Phases::default();
            let mut ports = 0;
            let mut hairpin_delta: HashMap<IpAddr, isize> = HashMap::new();
            let old_digest = self.table_digests.get(&table).copied();
            let mut new_digest = old_digest;
            for key in keys {
                let new = plan.service_ports.get(key).map(|port| render_port_counting(port, self.counting));
                let old = previously_written(changed, key, self.counting);
                phases.diff(old.as_ref().unwrap_or(&empty), new.as_ref().unwrap_or(&empty));
                new_digest = new_digest.map(|digest| {
                    let digest = old.as_ref().map_or(digest, |old| digest.without(PortDigest::of(old)));
                    new.as_ref().map_or(digest, |new| digest.with(PortDigest::of(new)))
                });
                for address in old.iter().flat_map(|old| &old.endpoint_addresses) {
                    *hairpin_delta.entry(*address).or_insert(0) -= 1;
                }
                for address in new.iter().flat_map(|n| &n.endpoint_addresses) {
                    *hairpin_delta.entry(*address).or_insert(0) += 1;
                }
                ports += 1;
            }
            let mut new_refs: Vec<(IpAddr, usize)> = Vec::new();
            for (address, delta) in hairpin_delta {
                if delta == 0 {
                    continue;
                }
                let before = self.hairpin_refs.get(table, address);
                let after = before.checked_add_signed(delta).expect("hairpin references never go negative");
                if before == 0 && after > 0 {
                    phases.add_elements.push(Operation::AddElement(hairpin_element(address)));
                } else if before > 0 && after == 0 {
                    phases.delete_elements.push(Operation::DeleteElement(hairpin_element(address)));
                }
                new_refs.push((address, after));
            }
            let mut operations = phases.into_operations();
            if operations.is_empty() {
                continue;
            }
            // The table's digest changes with its content, in the same transaction.
            if let Some(digest) = new_digest.filter(|new| Some(*new) != old_digest) {
                operations.push(Operation::FlushSet(digest::WRITTEN_DIGEST_SET.to_owned()));
                operations.push(Operation::AddElement(digest.element()));
            }
            let (family, index) = table;
            let transaction = Transaction { table: tables_table_name(family, index), operations };
            if let Err(source) = self.nft.apply(&transaction) {
                self.needs_full_sync = true;
                return Err(SyncError::Apply {
                    family,
                    table: transaction.table.name.clone(),
                    operations: transaction.operations.len(),
                    source,
                });
            }
            report.operations += transaction.operations.len();
            report.service_ports += ports;
            if let Some(digest) = new_digest {
                self.table_digests.insert(table, digest);
            }
            for (address, count) in new_refs {
                self.hairpin_refs.set(table, address, count);
            }
        }
        Ok(report)
    }

    /// When the number of tables grows, the service ports whose hash now picks another
    /// table leave their old one in the same full sync: their chains flushed then deleted
    /// and their sets deleted, after the maps that pointed at them were refilled without them.
    ///
    /// What a port was last written with is its value in the plan of the last successful
    /// sync: `changed`'s previous value for the ports that changed since, the plan's own for
    /// the others.
    fn remove_moved_objects(&self, rendered: &mut [RenderedTable], tables: usize, plan: &NodePlan, changed: &PlanDiff) {
        let mut flushes: BTreeMap<TableKey, Vec<Operation>> = BTreeMap::new();
        let mut deletions: BTreeMap<TableKey, Vec<Operation>> = BTreeMap::new();
        let unchanged = plan.service_ports.iter().filter(|(key, _)| !changed.contains(key));
        let previous = changed.keys().filter_map(|key| Some((key, changed.previous(key)?)));
        for (key, port) in unchanged.chain(previous).filter(|(key, _)| self.families.contains(&key.family)) {
            let (old, new) = (table_index(&key.name, self.tables), table_index(&key.name, tables));
            if old == new || old >= tables {
                continue;
            }
            let objects = render_port_counting(port, self.counting);
            let table = (key.family, old);
            for (chain, _) in &objects.chains {
                flushes.entry(table).or_default().push(Operation::FlushChain(chain.clone()));
                deletions.entry(table).or_default().push(Operation::DeleteChain(chain.clone()));
            }
            deletions
                .entry(table)
                .or_default()
                .extend(objects.sets.iter().map(|set| Operation::DeleteSet(set.name.clone())));
        }
        for table in rendered.iter_mut() {
            let key = (table.family, table.index);
            // Stale chains are all flushed before any is deleted: they may jump to each other.
            table.transaction.operations.extend(flushes.remove(&key).unwrap_or_default());
            table.transaction.operations.extend(deletions.remove(&key).unwrap_or_default());
        }
    }

    /// Whether `table` holds what a full sync with this digest would write: its digest
    /// element says so, and its canary chains hold rules (a flushed table keeps its sets).
    /// Anything unreadable counts as no.
    fn holds_as_written(&mut self, table: &TableName, digest: TableDigest) -> bool {
        for chain in CANARY_CHAINS {
            match self.nft.count_rules(table, chain) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(error) => {
                    warn!("reading svcplane's nftables table {} before a full sync: {error}", table.name);
                    return false;
                }
            }
        }
        match self.nft.holds_element(table, &digest::set(), &digest.element()) {
            Ok(holds) => holds == Some(true),
            Err(error) => {
                warn!("reading the digest of svcplane's nftables table {}: {error}", table.name);
                false
            }
        }
    }

    /// The tables numbered `tables` and up that exist (an earlier run used more), to delete
    /// once the new ones are written. Failures are logged: an unused table left behind
    /// holds only Services that other tables serve too.
    fn tables_beyond(&mut self, tables: usize) -> Vec<TableName> {
        let mut unused = Vec::new();
        for &family in &self.families.clone() {
            let existing = match self.nft.list_tables(crate::render::nft_family(family)) {
                Ok(names) => names,
                Err(error) => {
                    warn!("listing nftables tables to remove svcplane's unused ones: {error}");
                    continue;
                }
            };
            unused.extend(
                (tables..MAX_TABLES)
                    .rev()
                    .map(|index| tables_table_name(family, index))
                    .filter(|table| existing.contains(&table.name)),
            );
        }
        unused
    }

    /// Removes every table svcplane owns. Returns whether anything was there.
    pub fn cleanup(&mut self) -> Result<bool, NftError> {
        let mut removed = false;
        for &family in &self.families {
            // Every table number, not only this process's: an earlier run may have used more.
            let existing = self.nft.list_tables(crate::render::nft_family(family))?;
            for index in (0..MAX_TABLES).rev() {
                let table = tables_table_name(family, index);
                if existing.contains(&table.name) {
                    removed |= self.nft.delete_table(&table)?;
                }
            }
        }
        self.table_digests.clear();
        self.hairpin_refs.clear();
        self.needs_full_sync = true;
        Ok(removed)
    }
}

impl<N: Nftables + Send + std::fmt::Debug> Dataplane for NftablesBackend<N> {
    fn mode(&self) -> &'static str {
        "nftables"
    }

    fn sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<CoreSyncReport, DataplaneError> {
        let report = NftablesBackend::sync(self, plan, diff)?;
        Ok(CoreSyncReport {
            full: report.full,
            service_ports: report.service_ports,
            operations: report.operations,
            rules_replaced: report.rules_replaced,
        })
    }

    fn request_full_resync(&mut self) {
        self.request_full_sync();
    }

    fn detect_drift(&mut self) -> Option<String> {
        self.find_drift()
    }

    fn render(&self, plan: &NodePlan) -> Result<String, DataplaneError> {
        let mut text = String::new();
        let tables = self.fixed_tables.unwrap_or_else(|| self.wanted_tables(plan).max(self.tables));
        for RenderedTable { transaction, .. } in render_tables(plan, &self.families, self.counting, tables) {
            text.push_str(&svcplane_nft::render(&transaction)?);
        }
        Ok(text)
    }

    fn cleanup(&mut self) -> Result<bool, DataplaneError> {
        Ok(NftablesBackend::cleanup(self)?)
    }

    /// Read with the `nft` command whatever mechanism writes: a listing, never a sync.
    fn counters(&mut self) -> Result<Vec<svcplane_core::counters::EndpointCounter>, DataplaneError> {
        Ok(crate::counters::read(&mut svcplane_nft::NftCli::new(), &self.families)?)
    }
}
