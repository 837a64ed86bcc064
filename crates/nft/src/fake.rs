//! An in-memory nftables that behaves like the kernel for everything svcplane writes: the
//! same transactions succeed, the same ones fail with the same [`ErrorKind`](crate::ErrorKind),
//! and a failed transaction changes nothing.
//!
//! It keeps the typed objects (not text) so tests can inspect them and a packet tracer can
//! walk them. It follows the kernel where the kernel is stricter than one might expect: a
//! `jump` or `goto` must name a chain that exists when the operation is met (a chain added
//! later in the same transaction is too late); a chain or set is in use, so cannot be
//! deleted, while any rule or element refers to it, even from within itself; and whatever a
//! base chain reaches must suit its hook (no `masquerade` on prerouting, no `dnat` from a
//! filter chain, no jump loops, at most 15 nested jumps).
//!
//! Cost is linear: operations are applied in place with hash-map lookups, reference counts
//! are maintained incrementally, an undo log (not a copy of the table) restores the previous
//! state when an operation fails, and the hook check is one walk of what the base chains
//! reach, each chain once per base-chain kind.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::Nftables;
use crate::error::{NftError, ObjectKind};
use crate::objects::{
    Chain, ChainType, DataType, Element, ElementValue, Family, Hook, Match, Operation, Rule, Set, Statement, TableName,
    Transaction, Value, Verdict,
};
use crate::text::{self, ScriptWriter};
use crate::validation;

/// The fake kernel: tables by name.
#[derive(Debug, Clone, Default)]
pub struct FakeNftables {
    tables: HashMap<TableName, FakeTable>,
}

/// One table's chains and sets as the fake holds them.
#[derive(Debug, Clone)]
pub struct FakeTable {
    comment: Option<String>,
    chains: HashMap<String, FakeChain>,
    sets: HashMap<String, FakeSet>,
}

#[derive(Debug, Clone)]
struct FakeChain {
    chain: Chain,
    rules: Vec<Rule>,
    /// Rules and elements that jump or go here.
    uses: usize,
}

#[derive(Debug, Clone)]
struct FakeSet {
    set: Set,
    /// By normalized key.
    elements: HashMap<Vec<Value>, Element>,
    /// For interval sets with a single address key: start -> end of each element's range,
    /// so that an overlapping element is found in O(log n), as nft refuses it.
    intervals: BTreeMap<u128, u128>,
    /// Rules that look up, map through or update this set.
    uses: usize,
}

/// How to take back one applied step of a transaction. Undone in reverse order, each entry
/// meets the table exactly as its step left it.
#[derive(Debug)]
enum Undo {
    RemoveTable,
    RestoreTable(Box<FakeTable>),
    RemoveChain(String),
    RestoreChain(String, FakeChain),
    RestoreRules(String, Vec<Rule>),
    PopRule(String),
    RemoveSet(String),
    RestoreSet(String, FakeSet),
    RestoreElements(String, HashMap<Vec<Value>, Element>, BTreeMap<u128, u128>),
    RestoreTimeout(String, Option<Duration>),
    RemoveElement(String, Vec<Value>),
    RestoreElement(Element),
}

impl Nftables for FakeNftables {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        validation::check_transaction(transaction)?;
        let mut undo = Vec::new();
        let result = transaction
            .operations
            .iter()
            .try_for_each(|operation| self.apply_operation(&transaction.table, operation, &mut undo))
            .and_then(|()| match self.tables.get(&transaction.table) {
                Some(table) => table.check_hooks(),
                None => Ok(()),
            });
        if result.is_err() {
            while let Some(step) = undo.pop() {
                self.undo(&transaction.table, step);
            }
        }
        result
    }

    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError> {
        Ok(self.tables.remove(table).is_some())
    }

    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        Ok(self.tables.get(table).and_then(|t| t.rules(chain)).map_or(0, <[Rule]>::len))
    }

    fn holds_element(&mut self, table: &TableName, set: &Set, element: &Element) -> Result<Option<bool>, NftError> {
        Ok(Some(self.tables.get(table).and_then(|t| t.element(&set.name, &element.key)).is_some()))
    }

    fn list_tables(&mut self, family: Family) -> Result<Vec<String>, NftError> {
        Ok(self
            .table_names()
            .into_iter()
            .filter(|table| table.family == family)
            .map(|table| table.name.clone())
            .collect())
    }
}

impl FakeNftables {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn table(&self, name: &TableName) -> Option<&FakeTable> {
        self.tables.get(name)
    }

    /// Every table, sorted.
    pub fn table_names(&self) -> Vec<&TableName> {
        let mut names: Vec<_> = self.tables.keys().collect();
        names.sort();
        names
    }

    /// An `nft -f` script that builds every table from nothing, in a canonical order (tables,
    /// then in each: chains and sets by name, elements by key, rules in chain order). Two
    /// fakes hold the same state exactly when their dumps are equal.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for name in self.table_names() {
            self.tables[name].write_dump(&mut out, name);
        }
        out
    }

    fn table_mut(&mut self, name: &TableName) -> Result<&mut FakeTable, NftError> {
        self.tables.get_mut(name).ok_or_else(|| table_not_found(name))
    }

    fn apply_operation(
        &mut self,
        table_name: &TableName,
        operation: &Operation,
        undo: &mut Vec<Undo>,
    ) -> Result<(), NftError> {
        match operation {
            Operation::AddTable { comment } => {
                // Adding a table that exists changes nothing, not even its comment.
                if !self.tables.contains_key(table_name) {
                    let table = FakeTable { comment: comment.clone(), chains: HashMap::new(), sets: HashMap::new() };
                    self.tables.insert(table_name.clone(), table);
                    undo.push(Undo::RemoveTable);
                }
                Ok(())
            }
            Operation::DeleteTable => {
                let table = self.tables.remove(table_name).ok_or_else(|| table_not_found(table_name))?;
                undo.push(Undo::RestoreTable(Box::new(table)));
                Ok(())
            }
            Operation::AddChain(chain) => self.table_mut(table_name)?.add_chain(chain, undo),
            Operation::FlushChain(name) => self.table_mut(table_name)?.flush_chain(name, undo),
            Operation::DeleteChain(name) => self.table_mut(table_name)?.delete_chain(name, undo),
            Operation::AddRule(rule) => self.table_mut(table_name)?.add_rule(table_name.family, rule, undo),
            Operation::AddSet(set) => self.table_mut(table_name)?.add_set(set, undo),
            Operation::FlushSet(name) => self.table_mut(table_name)?.flush_set(name, undo),
            Operation::DeleteSet(name) => self.table_mut(table_name)?.delete_set(name, undo),
            Operation::AddElement(element) => self.table_mut(table_name)?.add_element(element, undo),
            Operation::DeleteElement(element) => self.table_mut(table_name)?.delete_element(element, undo),
        }
    }

    fn undo(&mut self, table_name: &TableName, step: Undo) {
        let table = match step {
            Undo::RemoveTable => {
                self.tables.remove(table_name);
                return;
            }
            Undo::RestoreTable(table) => {
                self.tables.insert(table_name.clone(), *table);
                return;
            }
            _ => self.tables.get_mut(table_name).expect("an undo step meets the table its step left"),
        };
        match step {
            Undo::RemoveTable | Undo::RestoreTable(_) => unreachable!("handled above"),
            Undo::RemoveChain(name) => {
                table.chains.remove(&name);
            }
            Undo::RestoreChain(name, chain) => {
                chain.rules.iter().for_each(|rule| table.hold_rule(rule));
                table.chains.insert(name, chain);
            }
            Undo::RestoreRules(name, rules) => {
                rules.iter().for_each(|rule| table.hold_rule(rule));
                table.chains.get_mut(&name).expect("a flushed chain is still there").rules = rules;
            }
            Undo::PopRule(name) => {
                let rule = table.chains.get_mut(&name).and_then(|chain| chain.rules.pop());
                table.release_rule(&rule.expect("an appended rule is still last"));
            }
            Undo::RemoveSet(name) => {
                table.sets.remove(&name);
            }
            Undo::RestoreSet(name, set) => {
                set.elements.values().for_each(|element| table.hold_element(element));
                table.sets.insert(name, set);
            }
            Undo::RestoreElements(name, elements, intervals) => {
                elements.values().for_each(|element| table.hold_element(element));
                let set = table.sets.get_mut(&name).expect("a flushed set is still there");
                set.elements = elements;
                set.intervals = intervals;
            }
            Undo::RestoreTimeout(name, timeout) => {
                table.sets.get_mut(&name).expect("an updated set is still there").set.dynamic_timeout = timeout;
            }
            Undo::RemoveElement(name, key) => {
                let set = table.sets.get_mut(&name).expect("an element's set is still there");
                set.remove_interval(&key);
                let element = set.elements.remove(&key).expect("an added element is still there");
                table.release_element(&element);
            }
            Undo::RestoreElement(element) => {
                table.hold_element(&element);
                let set = table.sets.get_mut(&element.set).expect("an element's set is still there");
                set.insert_interval(&element.key);
                set.elements.insert(element.key.clone(), element);
            }
        }
    }
}

fn table_not_found(name: &TableName) -> NftError {
    NftError::NotFound { kind: ObjectKind::Table, name: name.to_string() }
}

fn not_found(kind: ObjectKind, name: &str) -> NftError {
    NftError::NotFound { kind, name: name.to_owned() }
}

impl FakeTable {
    pub fn comment(&self) -> Option<&str> {
        self.comment.as_deref()
    }

    /// Every chain, by name.
    pub fn chains(&self) -> Vec<&Chain> {
        let mut chains: Vec<_> = self.chains.values().map(|chain| &chain.chain).collect();
        chains.sort_by(|a, b| a.name.cmp(&b.name));
        chains
    }

    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.get(name).map(|chain| &chain.chain)
    }

    /// The rules of a chain, in order; `None` if there is no such chain.
    pub fn rules(&self, chain: &str) -> Option<&[Rule]> {
        self.chains.get(chain).map(|chain| chain.rules.as_slice())
    }

    /// How many rules and map elements jump or go to a chain.
    pub fn chain_references(&self, chain: &str) -> Option<usize> {
        self.chains.get(chain).map(|chain| chain.uses)
    }

    /// Every set and map, by name.
    pub fn sets(&self) -> Vec<&Set> {
        let mut sets: Vec<_> = self.sets.values().map(|set| &set.set).collect();
        sets.sort_by(|a, b| a.name.cmp(&b.name));
        sets
    }

    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.get(name).map(|set| &set.set)
    }

    /// The elements of a set or map, by key; `None` if there is no such set.
    pub fn elements(&self, set: &str) -> Option<Vec<&Element>> {
        let set = self.sets.get(set)?;
        let mut elements: Vec<_> = set.elements.values().collect();
        elements.sort_by(|a, b| a.key.cmp(&b.key));
        Some(elements)
    }

    /// The element with exactly this key (prefixes compared as nft stores them).
    pub fn element(&self, set: &str, key: &[Value]) -> Option<&Element> {
        let key: Vec<Value> = key.iter().copied().map(validation::normalize).collect();
        self.sets.get(set)?.elements.get(&key)
    }

    /// The commands that build this table from nothing; see [`FakeNftables::dump`].
    pub fn dump(&self, name: &TableName) -> String {
        let mut out = String::new();
        self.write_dump(&mut out, name);
        out
    }

    fn write_dump(&self, out: &mut String, name: &TableName) {
        let mut writer = ScriptWriter::new(out, name);
        let chains = self.chains();
        let sets = self.sets();
        let written = (|| {
            writer.add_table(self.comment.as_deref())?;
            // Chains and sets before anything that refers to them.
            chains.iter().try_for_each(|chain| writer.add_chain(chain))?;
            sets.iter().try_for_each(|set| writer.add_set(set))?;
            for set in &sets {
                for element in self.elements(&set.name).unwrap_or_default() {
                    writer.add_element(element)?;
                }
            }
            for chain in &chains {
                self.chains[&chain.name].rules.iter().try_for_each(|rule| writer.add_rule(rule))?;
            }
            Ok::<(), std::fmt::Error>(())
        })();
        written.expect("writing to a String cannot fail");
    }

    /// What the kernel checks of every chain a base chain reaches through jumps, gotos and
    /// verdict maps: each statement suits the hook and chain type, there is no loop, and no
    /// path takes more than 15 jumps. One walk per base-chain context, each chain visited once
    /// per context.
    fn check_hooks(&self) -> Result<(), NftError> {
        let mut walk = HookWalk { table: self, marks: HashMap::new() };
        let mut bases: Vec<_> =
            self.chains.values().filter_map(|chain| Some((chain.chain.name.as_str(), chain.chain.base?))).collect();
        bases.sort_by_key(|(name, _)| *name);
        for (name, base) in bases {
            walk.visit(name, (base.chain_type, base.hook), 0)?;
        }
        Ok(())
    }

    fn add_chain(&mut self, chain: &Chain, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        if let Some(existing) = self.chains.get(&chain.name) {
            // The kernel ignores what an add leaves out (or a comment), but refuses to turn a
            // chain into another kind of base chain.
            return match chain.base {
                Some(base) if existing.chain.base != Some(base) => {
                    Err(NftError::Exists { kind: ObjectKind::Chain, name: chain.name.clone() })
                }
                _ => Ok(()),
            };
        }
        self.chains.insert(chain.name.clone(), FakeChain { chain: chain.clone(), rules: Vec::new(), uses: 0 });
        undo.push(Undo::RemoveChain(chain.name.clone()));
        Ok(())
    }

    fn flush_chain(&mut self, name: &str, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        let chain = self.chains.get_mut(name).ok_or_else(|| not_found(ObjectKind::Chain, name))?;
        let rules = std::mem::take(&mut chain.rules);
        rules.iter().for_each(|rule| self.release_rule(rule));
        undo.push(Undo::RestoreRules(name.to_owned(), rules));
        Ok(())
    }

    fn delete_chain(&mut self, name: &str, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        let chain = self.chains.get(name).ok_or_else(|| not_found(ObjectKind::Chain, name))?;
        if chain.uses > 0 {
            return Err(NftError::InUse { kind: ObjectKind::Chain, name: name.to_owned() });
        }
        let chain = self.chains.remove(name).expect("looked up above");
        chain.rules.iter().for_each(|rule| self.release_rule(rule));
        undo.push(Undo::RestoreChain(name.to_owned(), chain));
        Ok(())
    }

    fn add_rule(&mut self, family: Family, rule: &Rule, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        if !self.chains.contains_key(&rule.chain) {
            return Err(not_found(ObjectKind::Chain, &rule.chain));
        }
        for statement in &rule.statements {
            self.check_statement(family, &rule.chain, statement)?;
        }
        self.hold_rule(rule);
        self.chains.get_mut(&rule.chain).expect("checked above").rules.push(rule.clone());
        undo.push(Undo::PopRule(rule.chain.clone()));
        Ok(())
    }

    /// What nft checks of a statement against the table: targets exist, and set lookups use
    /// keys of the set's type.
    fn check_statement(&self, family: Family, chain: &str, statement: &Statement) -> Result<(), NftError> {
        let invalid = |reason: String| NftError::InvalidRule { chain: chain.to_owned(), reason };
        let (keys, set_name) = match statement {
            Statement::Verdict(Verdict::Jump(target) | Verdict::Goto(target)) => {
                if !self.chains.contains_key(target) {
                    return Err(NftError::InvalidReference { from: chain.to_owned(), target: target.clone() });
                }
                return Ok(());
            }
            Statement::Match(Match::InSet { keys, set, .. }) => (keys, set),
            Statement::VerdictMap { keys, map } => (keys, map),
            Statement::UpdateSet { keys, set } => (keys, set),
            _ => return Ok(()),
        };
        let set = &self.sets.get(set_name).ok_or_else(|| not_found(ObjectKind::Set, set_name))?.set;
        match statement {
            Statement::VerdictMap { .. } if !set.is_verdict_map() => {
                return Err(invalid(format!("@{set_name} is not a verdict map")));
            }
            Statement::UpdateSet { .. } if set.is_map() => {
                return Err(invalid(format!("@{set_name} is a map; updating it needs a value")));
            }
            _ => {}
        }
        let key_types = keys.iter().map(|key| validation::expr_type(family, *key));
        if !key_types.eq(set.key.iter().copied().map(Some)) {
            return Err(invalid(format!("keys {keys:?} do not match the type {:?} of @{set_name}", set.key)));
        }
        Ok(())
    }

    /// Counts the references a rule makes, once it is in.
    fn hold_rule(&mut self, rule: &Rule) {
        for target in rule.targets() {
            self.chains.get_mut(target).expect("a rule's target exists").uses += 1;
        }
        for set in rule.set_references() {
            self.sets.get_mut(set).expect("a rule's set exists").uses += 1;
        }
    }

    fn release_rule(&mut self, rule: &Rule) {
        for target in rule.targets() {
            self.chains.get_mut(target).expect("a rule's target exists").uses -= 1;
        }
        for set in rule.set_references() {
            self.sets.get_mut(set).expect("a rule's set exists").uses -= 1;
        }
    }

    fn hold_element(&mut self, element: &Element) {
        if let Some(target) = element.value.as_ref().and_then(ElementValue::target) {
            self.chains.get_mut(target).expect("an element's target exists").uses += 1;
        }
    }

    fn release_element(&mut self, element: &Element) {
        if let Some(target) = element.value.as_ref().and_then(ElementValue::target) {
            self.chains.get_mut(target).expect("an element's target exists").uses -= 1;
        }
    }

    fn add_set(&mut self, set: &Set, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        if let Some(existing) = self.sets.get_mut(&set.name) {
            let same_shape = existing.set.key == set.key
                && existing.set.value == set.value
                && existing.set.interval == set.interval
                && existing.set.dynamic_timeout.is_some() == set.dynamic_timeout.is_some();
            if !same_shape {
                return Err(NftError::Exists { kind: ObjectKind::Set, name: set.name.clone() });
            }
            // The kernel (6.x) takes a new timeout for an existing set; the comment it ignores.
            if existing.set.dynamic_timeout != set.dynamic_timeout {
                let previous = std::mem::replace(&mut existing.set.dynamic_timeout, set.dynamic_timeout);
                undo.push(Undo::RestoreTimeout(set.name.clone(), previous));
            }
            return Ok(());
        }
        let fake = FakeSet { set: set.clone(), elements: HashMap::new(), intervals: BTreeMap::new(), uses: 0 };
        self.sets.insert(set.name.clone(), fake);
        undo.push(Undo::RemoveSet(set.name.clone()));
        Ok(())
    }

    fn flush_set(&mut self, name: &str, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        let set = self.sets.get_mut(name).ok_or_else(|| not_found(ObjectKind::Set, name))?;
        let elements = std::mem::take(&mut set.elements);
        let intervals = std::mem::take(&mut set.intervals);
        elements.values().for_each(|element| self.release_element(element));
        undo.push(Undo::RestoreElements(name.to_owned(), elements, intervals));
        Ok(())
    }

    fn delete_set(&mut self, name: &str, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        let set = self.sets.get(name).ok_or_else(|| not_found(ObjectKind::Set, name))?;
        if set.uses > 0 {
            return Err(NftError::InUse { kind: ObjectKind::Set, name: name.to_owned() });
        }
        let set = self.sets.remove(name).expect("looked up above");
        set.elements.values().for_each(|element| self.release_element(element));
        undo.push(Undo::RestoreSet(name.to_owned(), set));
        Ok(())
    }

    fn add_element(&mut self, element: &Element, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        let set = self.sets.get(&element.set).ok_or_else(|| not_found(ObjectKind::Set, &element.set))?;
        let key = checked_key(&set.set, element)?;
        let value = checked_value(&set.set, element)?;
        if let Some(existing) = set.elements.get(&key) {
            // Adding what is there changes nothing; another value for the key is a conflict.
            return if existing.value == value {
                Ok(())
            } else {
                Err(NftError::Exists { kind: ObjectKind::Element, name: text::key_text(&key) })
            };
        }
        if set.overlaps(&key) {
            return Err(NftError::Exists { kind: ObjectKind::Element, name: text::key_text(&key) });
        }
        if let Some(target) = value.as_ref().and_then(ElementValue::target)
            && !self.chains.contains_key(target)
        {
            return Err(NftError::InvalidReference { from: element.set.clone(), target: target.to_owned() });
        }
        let stored = Element { set: element.set.clone(), key: key.clone(), value, comment: element.comment.clone() };
        self.hold_element(&stored);
        let set = self.sets.get_mut(&element.set).expect("looked up above");
        set.insert_interval(&key);
        set.elements.insert(key.clone(), stored);
        undo.push(Undo::RemoveElement(element.set.clone(), key));
        Ok(())
    }

    fn delete_element(&mut self, element: &Element, undo: &mut Vec<Undo>) -> Result<(), NftError> {
        let set = self.sets.get_mut(&element.set).ok_or_else(|| not_found(ObjectKind::Set, &element.set))?;
        let key = checked_key(&set.set, element)?;
        let removed = set
            .elements
            .remove(&key)
            .ok_or_else(|| NftError::NotFound { kind: ObjectKind::Element, name: text::key_text(&key) })?;
        set.remove_interval(&key);
        self.release_element(&removed);
        undo.push(Undo::RestoreElement(removed));
        Ok(())
    }
}

/// The kernel's limit on nested jumps (`NFT_JUMP_STACK_SIZE`): 15 jumps deep is the most.
const MAX_JUMP_DEPTH: usize = 16;

/// A base chain's kind, which decides what its rules (and those it reaches) may do.
type HookContext = (ChainType, Hook);

#[derive(Debug, Clone, Copy)]
enum Mark {
    OnPath,
    /// Visited; the most jumps any path below takes.
    Done(usize),
}

/// A depth-first walk from base chains, remembering each chain's result per context so that
/// a chain reached from ten thousand others is checked once.
struct HookWalk<'a> {
    table: &'a FakeTable,
    marks: HashMap<(&'a str, HookContext), Mark>,
}

impl<'a> HookWalk<'a> {
    /// Checks `name` reached at `depth` jumps; returns the most jumps below it.
    fn visit(&mut self, name: &'a str, context: HookContext, depth: usize) -> Result<usize, NftError> {
        let too_deep = || NftError::InvalidRule {
            chain: name.to_owned(),
            reason: format!("a jump loop, or more than {} nested jumps", MAX_JUMP_DEPTH - 1),
        };
        match self.marks.get(&(name, context)) {
            Some(Mark::OnPath) => return Err(too_deep()),
            Some(Mark::Done(height)) if depth + height >= MAX_JUMP_DEPTH => return Err(too_deep()),
            Some(Mark::Done(height)) => return Ok(*height),
            None if depth >= MAX_JUMP_DEPTH => return Err(too_deep()),
            None => {}
        }
        self.marks.insert((name, context), Mark::OnPath);
        let table = self.table;
        let chain = &table.chains[name];
        let mut height = 0;
        for rule in &chain.rules {
            for statement in &rule.statements {
                check_hook(name, context, statement)?;
                let targets: Box<dyn Iterator<Item = &'a str>> = match statement {
                    Statement::Verdict(verdict) => Box::new(verdict.target().into_iter()),
                    Statement::VerdictMap { map, .. } => Box::new(
                        table.sets[map].elements.values().filter_map(|element| element.value.as_ref()?.target()),
                    ),
                    _ => continue,
                };
                for target in targets {
                    height = height.max(1 + self.visit(target, context, depth + 1)?);
                }
            }
        }
        self.marks.insert((name, context), Mark::Done(height));
        Ok(height)
    }
}

/// Statements the kernel allows only on some hooks or chain types (measured on 6.18).
fn check_hook(chain: &str, (chain_type, hook): HookContext, statement: &Statement) -> Result<(), NftError> {
    let allowed = match statement {
        Statement::Dnat { .. } => chain_type == ChainType::Nat && matches!(hook, Hook::Prerouting | Hook::Output),
        Statement::Masquerade { .. } => chain_type == ChainType::Nat && hook == Hook::Postrouting,
        Statement::Reject(_) => hook != Hook::Postrouting,
        _ => true,
    };
    if allowed {
        Ok(())
    } else {
        Err(NftError::InvalidRule {
            chain: chain.to_owned(),
            reason: format!("{statement:?} cannot run in a {chain_type:?} chain on the {hook:?} hook"),
        })
    }
}

/// The element's key as the set stores it, if it has the set's type.
fn checked_key(set: &Set, element: &Element) -> Result<Vec<Value>, NftError> {
    let invalid = |reason: String| NftError::InvalidElement { set: set.name.clone(), reason };
    if element.key.len() != set.key.len() {
        return Err(invalid(format!(
            "key {:?} does not have the {} parts of {:?}",
            element.key,
            set.key.len(),
            set.key
        )));
    }
    let coerce = |(value, data_type): (&Value, &DataType)| validation::coerce_value(*value, *data_type, set.interval);
    element.key.iter().zip(&set.key).map(coerce).collect::<Result<_, _>>().map_err(invalid)
}

/// The element's value as the map stores it, if it has the map's type.
fn checked_value(set: &Set, element: &Element) -> Result<Option<ElementValue>, NftError> {
    let invalid = |reason: String| NftError::InvalidElement { set: set.name.clone(), reason };
    match (&set.value, &element.value) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(invalid("an element of a set has no value".to_owned())),
        (Some(_), None) => Err(invalid("an element of a map needs a value".to_owned())),
        (Some(_), Some(value @ ElementValue::Verdict(_))) if set.is_verdict_map() => Ok(Some(value.clone())),
        (Some(types), Some(ElementValue::Data(values))) if !set.is_verdict_map() && types.len() == values.len() => {
            // Map data are single values, never ranges.
            let coerce = |(value, data_type): (&Value, &DataType)| validation::coerce_value(*value, *data_type, false);
            let values = values.iter().zip(types).map(coerce).collect::<Result<_, _>>().map_err(invalid)?;
            Ok(Some(ElementValue::Data(values)))
        }
        (Some(types), Some(value)) => Err(invalid(format!("value {value:?} is not of type {types:?}"))),
    }
}

impl FakeSet {
    fn tracks_intervals(&self) -> bool {
        self.set.interval && self.set.key.len() == 1
    }

    fn range(key: &[Value]) -> Option<(u128, u128)> {
        let as_number = |address: IpAddr| match address {
            IpAddr::V4(address) => u128::from(u32::from(address)),
            IpAddr::V6(address) => u128::from(address),
        };
        match key {
            [Value::Address(address)] => Some((as_number(*address), as_number(*address))),
            [Value::Prefix(prefix)] => {
                let prefix: IpNet = *prefix;
                Some((as_number(prefix.network()), as_number(prefix.broadcast())))
            }
            _ => None,
        }
    }

    /// Whether a new key's range meets an element already there. Ranges in the set never
    /// overlap, so the one starting last at or before the new end is the only candidate.
    fn overlaps(&self, key: &[Value]) -> bool {
        if !self.tracks_intervals() {
            return false;
        }
        let Some((start, end)) = Self::range(key) else { return false };
        self.intervals.range(..=end).next_back().is_some_and(|(_, existing_end)| *existing_end >= start)
    }

    fn insert_interval(&mut self, key: &[Value]) {
        if self.tracks_intervals()
            && let Some((start, end)) = Self::range(key)
        {
            self.intervals.insert(start, end);
        }
    }

    fn remove_interval(&mut self, key: &[Value]) {
        if self.tracks_intervals()
            && let Some((start, _)) = Self::range(key)
        {
            self.intervals.remove(&start);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ErrorKind;
    use crate::objects::{BaseChain, CmpOp, DataType, Expr};

    fn table() -> TableName {
        TableName::new(Family::Ip, "svcplane")
    }

    fn transaction(operations: Vec<Operation>) -> Transaction {
        Transaction { table: table(), operations }
    }

    fn chain(name: &str) -> Operation {
        Operation::AddChain(Chain { name: name.into(), base: None, comment: None })
    }

    fn rule(chain: &str, statements: Vec<Statement>) -> Operation {
        Operation::AddRule(Rule { chain: chain.into(), statements, comment: None })
    }

    fn jump(target: &str) -> Statement {
        Statement::Verdict(Verdict::Jump(target.into()))
    }

    fn service_ips() -> Set {
        Set {
            name: "service-ips".into(),
            key: vec![DataType::Ipv4Addr, DataType::InetProto, DataType::InetService],
            value: Some(vec![DataType::Verdict]),
            interval: false,
            dynamic_timeout: None,
            comment: None,
        }
    }

    fn service_element(address: &str, target: &str) -> Element {
        Element {
            set: "service-ips".into(),
            key: vec![Value::Address(address.parse().unwrap()), Value::Protocol(6), Value::Port(80)],
            value: Some(ElementValue::Verdict(Verdict::Goto(target.into()))),
            comment: None,
        }
    }

    /// A table with a base chain jumping to `services`, which maps through `service-ips` to
    /// `svc-a`.
    fn loaded() -> FakeNftables {
        let mut fake = FakeNftables::new();
        let base = Chain {
            name: "nat-prerouting".into(),
            base: Some(BaseChain { chain_type: ChainType::Nat, hook: Hook::Prerouting, priority: -100 }),
            comment: None,
        };
        fake.apply(&transaction(vec![
            Operation::AddTable { comment: Some("test".into()) },
            Operation::AddChain(base),
            chain("services"),
            chain("svc-a"),
            chain("svc-b"),
            rule("nat-prerouting", vec![jump("services")]),
            Operation::AddSet(service_ips()),
            rule(
                "services",
                vec![Statement::VerdictMap {
                    keys: vec![Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort],
                    map: "service-ips".into(),
                }],
            ),
            Operation::AddElement(service_element("198.19.0.10", "svc-a")),
        ]))
        .unwrap();
        fake
    }

    fn kind_of(fake: &mut FakeNftables, operations: Vec<Operation>) -> ErrorKind {
        fake.apply(&transaction(operations)).unwrap_err().kind()
    }

    #[test]
    fn a_failed_transaction_leaves_the_previous_state_untouched() {
        let mut fake = loaded();
        let before = fake.dump();
        let error = fake
            .apply(&transaction(vec![
                Operation::FlushChain("services".into()),
                Operation::FlushSet("service-ips".into()),
                Operation::DeleteChain("svc-a".into()),
                chain("svc-c"),
                rule("svc-b", vec![Statement::Counter]),
                Operation::AddElement(service_element("198.19.0.11", "svc-c")),
                Operation::DeleteElement(service_element("198.19.0.99", "svc-a")),
            ]))
            .unwrap_err();
        assert!(matches!(error, NftError::NotFound { kind: ObjectKind::Element, .. }), "{error}");
        assert_eq!(fake.dump(), before);
        let table = fake.table(&table()).unwrap();
        assert_eq!(table.chain_references("svc-a"), Some(1));
        assert_eq!(table.chain_references("services"), Some(1));
    }

    #[test]
    fn a_failed_transaction_that_deleted_the_table_gets_it_back() {
        let mut fake = loaded();
        let before = fake.dump();
        let kind = kind_of(
            &mut fake,
            vec![
                Operation::DeleteTable,
                Operation::AddTable { comment: None },
                chain("x"),
                Operation::DeleteChain("missing-chain".into()),
            ],
        );
        assert_eq!(kind, ErrorKind::NotFound);
        assert_eq!(fake.dump(), before);
    }

    #[test]
    fn a_rule_jumping_to_a_missing_chain_fails_the_whole_transaction() {
        let mut fake = loaded();
        let before = fake.dump();
        let error =
            fake.apply(&transaction(vec![chain("svc-c"), rule("svc-c", vec![jump("svc-missing")])])).unwrap_err();
        assert!(
            matches!(&error, NftError::InvalidReference { from, target } if from == "svc-c" && target == "svc-missing")
        );
        assert_eq!(fake.dump(), before);
    }

    #[test]
    fn a_jump_to_a_chain_added_later_in_the_same_transaction_fails_as_in_the_kernel() {
        let mut fake = loaded();
        let kind = kind_of(&mut fake, vec![rule("services", vec![jump("svc-later")]), chain("svc-later")]);
        assert_eq!(kind, ErrorKind::NotFound);
    }

    #[test]
    fn a_map_element_going_to_a_missing_chain_is_an_invalid_reference() {
        let mut fake = loaded();
        let error = fake
            .apply(&transaction(vec![Operation::AddElement(service_element("198.19.0.11", "svc-missing"))]))
            .unwrap_err();
        assert!(matches!(error, NftError::InvalidReference { .. }), "{error}");
    }

    #[test]
    fn deleting_a_chain_that_an_element_goes_to_fails_until_the_element_is_gone() {
        let mut fake = loaded();
        let delete = Operation::DeleteChain("svc-a".into());
        assert_eq!(kind_of(&mut fake, vec![delete.clone()]), ErrorKind::InUse);
        fake.apply(&transaction(vec![Operation::DeleteElement(service_element("198.19.0.10", "svc-a")), delete]))
            .unwrap();
        assert!(fake.table(&table()).unwrap().chain("svc-a").is_none());
    }

    #[test]
    fn deleting_a_chain_that_a_rule_jumps_to_fails_until_the_rule_is_flushed() {
        let mut fake = loaded();
        let delete = Operation::DeleteChain("services".into());
        assert_eq!(kind_of(&mut fake, vec![delete.clone()]), ErrorKind::InUse);
        fake.apply(&transaction(vec![Operation::FlushChain("nat-prerouting".into()), delete])).unwrap();
    }

    #[test]
    fn a_chain_jumping_to_itself_cannot_be_deleted_without_a_flush() {
        let mut fake = loaded();
        fake.apply(&transaction(vec![rule("svc-b", vec![jump("svc-b")])])).unwrap();
        assert_eq!(kind_of(&mut fake, vec![Operation::DeleteChain("svc-b".into())]), ErrorKind::InUse);
        fake.apply(&transaction(vec![Operation::FlushChain("svc-b".into()), Operation::DeleteChain("svc-b".into())]))
            .unwrap();
    }

    #[test]
    fn deleting_a_chain_with_rules_releases_what_its_rules_referred_to() {
        let mut fake = loaded();
        fake.apply(&transaction(vec![rule("svc-b", vec![jump("svc-a")])])).unwrap();
        assert_eq!(fake.table(&table()).unwrap().chain_references("svc-a"), Some(2));
        fake.apply(&transaction(vec![Operation::DeleteChain("svc-b".into())])).unwrap();
        assert_eq!(fake.table(&table()).unwrap().chain_references("svc-a"), Some(1));
    }

    #[test]
    fn deleting_a_set_that_a_rule_uses_fails() {
        let mut fake = loaded();
        assert_eq!(kind_of(&mut fake, vec![Operation::DeleteSet("service-ips".into())]), ErrorKind::InUse);
    }

    #[test]
    fn deleting_missing_objects_fails_with_not_found() {
        for operation in [
            Operation::DeleteChain("nope".into()),
            Operation::FlushChain("nope".into()),
            Operation::DeleteSet("nope".into()),
            Operation::FlushSet("nope".into()),
            Operation::DeleteElement(service_element("203.0.113.1", "svc-a")),
        ] {
            let mut fake = loaded();
            let error = fake.apply(&transaction(vec![operation.clone()])).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::NotFound, "{operation:?}: {error}");
        }
        let mut empty = FakeNftables::new();
        assert_eq!(kind_of(&mut empty, vec![Operation::DeleteTable]), ErrorKind::NotFound);
        assert_eq!(kind_of(&mut empty, vec![chain("c")]), ErrorKind::NotFound);
    }

    #[test]
    fn a_rule_referring_to_a_missing_set_fails() {
        let mut fake = loaded();
        let lookup =
            Statement::Match(Match::InSet { keys: vec![Expr::SourceAddress], negate: false, set: "nope".into() });
        let error = fake.apply(&transaction(vec![rule("svc-a", vec![lookup])])).unwrap_err();
        assert!(matches!(error, NftError::NotFound { kind: ObjectKind::Set, .. }), "{error}");
    }

    #[test]
    fn a_lookup_whose_keys_do_not_match_the_set_type_is_an_invalid_rule() {
        let mut fake = loaded();
        let lookup = Statement::VerdictMap { keys: vec![Expr::DestinationAddress], map: "service-ips".into() };
        let error = fake.apply(&transaction(vec![rule("svc-a", vec![lookup])])).unwrap_err();
        assert!(matches!(error, NftError::InvalidRule { .. }), "{error}");
    }

    #[test]
    fn elements_whose_key_does_not_match_the_set_are_refused() {
        let mut short = service_element("198.19.0.11", "svc-a");
        short.key.pop();
        let mut mistyped = service_element("198.19.0.11", "svc-a");
        mistyped.key[2] = Value::Address("198.19.0.12".parse().unwrap());
        let mut ipv6 = service_element("198.19.0.11", "svc-a");
        ipv6.key[0] = Value::Address("2001:db8::1".parse().unwrap());
        let mut prefix = service_element("198.19.0.11", "svc-a");
        prefix.key[0] = Value::Prefix("198.19.0.0/24".parse().unwrap());
        let mut without_value = service_element("198.19.0.11", "svc-a");
        without_value.value = None;
        for element in [short, mistyped, ipv6, prefix, without_value] {
            let mut fake = loaded();
            let error = fake.apply(&transaction(vec![Operation::AddElement(element.clone())])).unwrap_err();
            assert!(matches!(error, NftError::InvalidElement { .. }), "{element:?}: {error}");
        }
    }

    #[test]
    fn adding_tables_chains_and_sets_that_exist_changes_nothing() {
        let mut fake = loaded();
        let before = fake.dump();
        fake.apply(&transaction(vec![
            Operation::AddTable { comment: Some("another comment".into()) },
            chain("services"),
            Operation::AddChain(Chain { name: "nat-prerouting".into(), base: None, comment: None }),
            Operation::AddSet(service_ips()),
            Operation::AddElement(service_element("198.19.0.10", "svc-a")),
        ]))
        .unwrap();
        assert_eq!(fake.dump(), before);
    }

    #[test]
    fn adding_rules_appends_them_in_order() {
        let mut fake = loaded();
        let counter = rule("svc-a", vec![Statement::Counter]);
        let accept = rule("svc-a", vec![Statement::Verdict(Verdict::Accept)]);
        fake.apply(&transaction(vec![counter.clone(), accept.clone(), counter])).unwrap();
        let statements: Vec<_> =
            fake.table(&table()).unwrap().rules("svc-a").unwrap().iter().map(|rule| rule.statements.clone()).collect();
        assert_eq!(
            statements,
            vec![vec![Statement::Counter], vec![Statement::Verdict(Verdict::Accept)], vec![Statement::Counter]]
        );
    }

    #[test]
    fn redefining_a_chain_or_set_differently_is_refused() {
        let mut fake = loaded();
        let filter = Chain {
            name: "services".into(),
            base: Some(BaseChain { chain_type: ChainType::Filter, hook: Hook::Input, priority: 0 }),
            comment: None,
        };
        assert_eq!(kind_of(&mut fake, vec![Operation::AddChain(filter)]), ErrorKind::Exists);
        let mut set = service_ips();
        set.value = None;
        assert_eq!(kind_of(&mut fake, vec![Operation::AddSet(set)]), ErrorKind::Exists);
        let element = service_element("198.19.0.10", "svc-b");
        assert_eq!(kind_of(&mut fake, vec![Operation::AddElement(element)]), ErrorKind::Exists);
    }

    #[test]
    fn a_new_timeout_for_a_dynamic_set_is_taken_and_rolled_back_with_its_transaction() {
        let mut fake = loaded();
        let mut affinity = Set {
            name: "affinity".into(),
            key: vec![DataType::Ipv4Addr],
            value: None,
            interval: false,
            dynamic_timeout: Some(Duration::from_secs(10800)),
            comment: None,
        };
        fake.apply(&transaction(vec![Operation::AddSet(affinity.clone())])).unwrap();
        affinity.dynamic_timeout = Some(Duration::from_secs(60));
        let change = Operation::AddSet(affinity);
        kind_of(&mut fake, vec![change.clone(), Operation::DeleteChain("nope".into())]);
        let timeout = |fake: &FakeNftables| fake.table(&table()).unwrap().set("affinity").unwrap().dynamic_timeout;
        assert_eq!(timeout(&fake), Some(Duration::from_secs(10800)));
        fake.apply(&transaction(vec![change])).unwrap();
        assert_eq!(timeout(&fake), Some(Duration::from_secs(60)));
    }

    #[test]
    fn overlapping_intervals_are_refused_and_equal_ones_are_no_ops() {
        let mut fake = loaded();
        let set = Set {
            name: "node-ips".into(),
            key: vec![DataType::Ipv4Addr],
            value: None,
            interval: true,
            dynamic_timeout: None,
            comment: None,
        };
        let element = |text: &str| {
            Operation::AddElement(Element {
                set: "node-ips".into(),
                key: vec![Value::Prefix(text.parse().unwrap())],
                value: None,
                comment: None,
            })
        };
        fake.apply(&transaction(vec![Operation::AddSet(set), element("10.0.0.0/8"), element("11.0.0.0/8")])).unwrap();
        fake.apply(&transaction(vec![element("10.0.0.1/8")])).unwrap();
        assert_eq!(kind_of(&mut fake, vec![element("10.1.0.0/16")]), ErrorKind::Exists);
        assert_eq!(kind_of(&mut fake, vec![element("0.0.0.0/4")]), ErrorKind::Exists);
        assert_eq!(fake.table(&table()).unwrap().elements("node-ips").unwrap().len(), 2);
    }

    #[test]
    fn the_dump_is_a_script_in_canonical_order() {
        let mut fake = loaded();
        fake.apply(&transaction(vec![
            Operation::AddElement(service_element("198.19.0.9", "svc-b")),
            rule(
                "svc-a",
                vec![Statement::Match(Match::Compare {
                    left: Expr::L4Proto,
                    op: CmpOp::Eq,
                    right: Value::Protocol(6),
                })],
            ),
        ]))
        .unwrap();
        assert_eq!(
            fake.dump(),
            "add table ip svcplane { comment \"test\" ; }\n\
             add chain ip svcplane nat-prerouting { type nat hook prerouting priority -100 ; }\n\
             add chain ip svcplane services\n\
             add chain ip svcplane svc-a\n\
             add chain ip svcplane svc-b\n\
             add map ip svcplane service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n\
             add element ip svcplane service-ips { 198.19.0.9 . tcp . 80 : goto svc-b }\n\
             add element ip svcplane service-ips { 198.19.0.10 . tcp . 80 : goto svc-a }\n\
             add rule ip svcplane nat-prerouting jump services\n\
             add rule ip svcplane services ip daddr . meta l4proto . th dport vmap @service-ips\n\
             add rule ip svcplane svc-a meta l4proto tcp\n"
        );
    }

    #[test]
    fn loading_a_dump_into_a_fresh_fake_gives_the_same_dump() {
        let fake = loaded();
        let mut copy = FakeNftables::new();
        let dump = fake.dump();
        // The dump is text; rebuild it from the typed state instead and compare the texts.
        let table = fake.table(&table()).unwrap();
        let mut operations = vec![Operation::AddTable { comment: table.comment().map(str::to_owned) }];
        operations.extend(table.chains().into_iter().cloned().map(Operation::AddChain));
        operations.extend(table.sets().into_iter().cloned().map(Operation::AddSet));
        for set in table.sets() {
            operations.extend(table.elements(&set.name).unwrap().into_iter().cloned().map(Operation::AddElement));
        }
        for chain in table.chains() {
            operations.extend(table.rules(&chain.name).unwrap().iter().cloned().map(Operation::AddRule));
        }
        copy.apply(&transaction(operations)).unwrap();
        assert_eq!(copy.dump(), dump);
    }

    #[test]
    fn masquerade_reached_from_a_prerouting_chain_is_refused() {
        let mut fake = loaded();
        let before = fake.dump();
        let masquerade = rule("svc-a", vec![Statement::Masquerade { fully_random: false }]);
        let error = fake.apply(&transaction(vec![masquerade])).unwrap_err();
        assert!(matches!(&error, NftError::InvalidRule { chain, .. } if chain == "svc-a"), "{error}");
        assert_eq!(fake.dump(), before);
        // Where no base chain reaches it, the kernel does not mind.
        fake.apply(&transaction(vec![rule("svc-b", vec![Statement::Masquerade { fully_random: false }])])).unwrap();
    }

    #[test]
    fn a_jump_loop_is_refused_only_once_a_base_chain_reaches_it() {
        let mut fake = loaded();
        fake.apply(&transaction(vec![
            chain("loop-1"),
            chain("loop-2"),
            rule("loop-1", vec![jump("loop-2")]),
            rule("loop-2", vec![jump("loop-1")]),
        ]))
        .unwrap();
        let error = fake.apply(&transaction(vec![rule("svc-a", vec![jump("loop-1")])])).unwrap_err();
        assert!(matches!(error, NftError::InvalidRule { .. }), "{error}");
    }

    #[test]
    fn delete_table_reports_whether_the_table_was_there() {
        let mut fake = loaded();
        assert!(fake.delete_table(&table()).unwrap());
        assert!(!fake.delete_table(&table()).unwrap());
        assert!(fake.table(&table()).is_none());
    }

    #[test]
    fn a_large_transaction_applies_in_linear_time() {
        // 20k services x 10 endpoints is ~400k operations; quadratic work would take minutes.
        let services: u32 = 20_000;
        let mut operations = vec![Operation::AddTable { comment: None }, Operation::AddSet(service_ips())];
        for service in 0..services {
            let name = format!("svc-{service}");
            operations.push(chain(&name));
            for endpoint in 0..10u32 {
                operations.push(rule(
                    &name,
                    vec![
                        Statement::Match(Match::Compare {
                            left: Expr::RandomModulo(10 - endpoint),
                            op: CmpOp::Eq,
                            right: Value::Integer(0),
                        }),
                        Statement::Dnat {
                            address: IpAddr::from([10, 0, (endpoint >> 8) as u8, endpoint as u8]),
                            port: None,
                        },
                    ],
                ));
            }
            let address = IpAddr::from((0xc613_0000 + service).to_be_bytes());
            operations.push(Operation::AddElement(service_element(&address.to_string(), &name)));
        }
        let transaction = transaction(operations);
        let started = std::time::Instant::now();
        let mut fake = FakeNftables::new();
        fake.apply(&transaction).unwrap();
        let script = crate::render(&transaction).unwrap();
        assert!(script.lines().count() == transaction.operations.len());
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    }
}
