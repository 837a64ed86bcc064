//! An in-memory model of the kernel's iptables tables, strict where the real programs are:
//! a restore input is applied whole or not at all, and it is refused (naming the input line,
//! as `iptables-restore` does) for the same mistakes: a rule in or a jump to a chain that
//! does not exist, `-D` of a rule that is not there, `-X` of a chain that is not empty or
//! still jumped to, a chain name over 28 characters, a target in a table or hook that
//! cannot have it (DNAT outside nat PREROUTING/OUTPUT, MASQUERADE outside nat POSTROUTING,
//! REJECT outside filter INPUT/FORWARD/OUTPUT), a port without its protocol, a loop.
//!
//! Rules are stored as the kernel keeps them ([`Rule::canonical`]), so [`FakeIptables::save`]
//! prints what `iptables-save` would.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

use crate::Iptables;
use crate::error::IptablesError;
use crate::model::{Arg, Family, Match, Rule, Table, Target};
use crate::restore::{Command, RestoreTable};
use crate::save::{chain_order, parse_save};

/// iptables refuses chain names of 29 characters or more.
pub const MAX_CHAIN_NAME: usize = 28;
/// `-m comment` holds at most 255 characters.
pub const MAX_COMMENT: usize = 255;
/// Nesting of jumps the tracer and the loop check follow.
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeChain {
    /// `ACCEPT` / `DROP` for built-in chains; `None` for user chains.
    pub policy: Option<String>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeTable {
    table: Table,
    chains: BTreeMap<String, FakeChain>,
}

impl FakeTable {
    fn new(table: Table) -> Self {
        let chains = table
            .builtin_chains()
            .iter()
            .map(|name| ((*name).to_owned(), FakeChain { policy: Some("ACCEPT".into()), rules: Vec::new() }))
            .collect();
        Self { table, chains }
    }

    pub fn table(&self) -> Table {
        self.table
    }

    pub fn chain(&self, name: &str) -> Option<&FakeChain> {
        self.chains.get(name)
    }

    pub fn rules(&self, name: &str) -> Option<&[Rule]> {
        self.chains.get(name).map(|c| c.rules.as_slice())
    }

    pub fn has_chain(&self, name: &str) -> bool {
        self.chains.contains_key(name)
    }

    /// Chain names in `iptables-save` order.
    pub fn chain_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.chains.keys().map(String::as_str).collect();
        names.sort_by_key(|name| chain_order(self.table.name(), name));
        names
    }

    /// The table as `iptables-save -t TABLE` prints it (without the comment lines).
    pub fn save_text(&self, family: Family) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "*{}", self.table);
        let names = self.chain_names();
        for name in &names {
            let chain = &self.chains[*name];
            let _ = writeln!(out, ":{name} {} [0:0]", chain.policy.as_deref().unwrap_or("-"));
        }
        for name in &names {
            for rule in &self.chains[*name].rules {
                let args = rule.save_args(family);
                if args.is_empty() {
                    let _ = writeln!(out, "-A {name}");
                } else {
                    let _ = writeln!(out, "-A {name} {args}");
                }
            }
        }
        out.push_str("COMMIT\n");
        out
    }

    fn references(&self, chain: &str) -> usize {
        self.chains.values().flat_map(|c| &c.rules).filter(|r| r.jump_target() == Some(chain)).count()
    }
}

/// The fake kernel: both families, every table, and a record of the restores it applied.
#[derive(Debug, Clone, Default)]
pub struct FakeIptables {
    tables: BTreeMap<(Family, Table), FakeTable>,
    restores: Vec<(Family, RestoreTable)>,
}

impl FakeIptables {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn table(&self, family: Family, table: Table) -> Option<&FakeTable> {
        self.tables.get(&(family, table))
    }

    pub fn rules(&self, family: Family, table: Table, chain: &str) -> Option<&[Rule]> {
        self.table(family, table).and_then(|t| t.rules(chain))
    }

    /// Every table of the family, as `iptables-save` prints them, tables by name.
    pub fn dump(&self, family: Family) -> String {
        self.tables.iter().filter(|((f, _), _)| *f == family).map(|(_, table)| table.save_text(family)).collect()
    }

    /// The restores applied so far, oldest first.
    pub fn restores(&self) -> &[(Family, RestoreTable)] {
        &self.restores
    }

    /// Replaces the tables in `text` (an `iptables-save` dump) with its content: rules other
    /// software wrote, for coexistence tests.
    pub fn load(&mut self, family: Family, text: &str) -> Result<(), IptablesError> {
        let ruleset = parse_save(text)?;
        for saved in &ruleset.tables {
            let Some(table) = saved.table() else { continue };
            let mut fake = FakeTable::new(table);
            for chain in &saved.chains {
                let entry = fake
                    .chains
                    .entry(chain.name.clone())
                    .or_insert(FakeChain { policy: chain.policy.clone(), rules: Vec::new() });
                entry.policy = chain.policy.clone();
            }
            for chain in &saved.chains {
                for rule in &chain.rules {
                    let parsed = rule.parse().map_err(|message| IptablesError::Parse { line: 0, message })?;
                    let canonical = parsed.canonical(family);
                    fake.chains.get_mut(&chain.name).expect("declared above").rules.push(canonical);
                }
            }
            self.tables.insert((family, table), fake);
        }
        Ok(())
    }

    /// What `iptables -F; iptables -X` in every table does: only built-in chains remain,
    /// empty.
    pub fn flush_everything(&mut self, family: Family) {
        for ((f, table), fake) in &mut self.tables {
            if *f == family {
                *fake = FakeTable::new(*table);
            }
        }
    }

    fn refuse(family: Family, table: Table, line: usize, message: impl Into<String>) -> IptablesError {
        IptablesError::Restore {
            program: format!("{}-restore (fake)", family.program_stem()),
            family,
            table,
            line: Some(line),
            message: message.into(),
        }
    }

    fn apply(&self, family: Family, input: &RestoreTable) -> Result<FakeTable, IptablesError> {
        let table = input.table;
        let mut fake = self.table(family, table).cloned().unwrap_or_else(|| FakeTable::new(table));
        for (index, name) in input.chain_lines().into_iter().enumerate() {
            let line = 2 + index;
            check_chain_name(name).map_err(|m| Self::refuse(family, table, line, m))?;
            if table.is_builtin(name) {
                return Err(Self::refuse(family, table, line, format!("{name} is a built-in chain")));
            }
            fake.chains.entry(name.to_owned()).or_insert(FakeChain { policy: None, rules: Vec::new() }).rules.clear();
        }
        for (index, command) in input.commands.iter().enumerate() {
            let line = input.command_line(index);
            apply_command(&mut fake, family, command).map_err(|m| Self::refuse(family, table, line, m))?;
        }
        validate_hooks(&fake).map_err(|m| Self::refuse(family, table, input.commit_line(), m))?;
        Ok(fake)
    }
}

fn check_chain_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_CHAIN_NAME {
        return Err(format!("chain name `{name}' too long (must be under {} chars)", MAX_CHAIN_NAME + 1));
    }
    if name.starts_with('-') || name.starts_with('!') || name.chars().any(char::is_whitespace) {
        return Err(format!("Invalid chain name `{name}'"));
    }
    if crate::model::is_target_extension(name) {
        return Err(format!("chain name `{name}' is the name of a target"));
    }
    Ok(())
}

/// What the parser of `iptables` itself refuses in a rule.
fn check_rule(table: &FakeTable, family: Family, rule: &Rule) -> Result<(), String> {
    let protocol = rule.protocol_restriction();
    let mut port_module = None;
    for arg in &rule.args {
        match arg {
            Arg::Source(m) | Arg::Destination(m) if Family::of(&m.net.addr()) != family => {
                return Err(format!("host/network `{}' not found", m.net));
            }
            Arg::Match(Match::Comment(text)) if text.len() > MAX_COMMENT => {
                return Err(format!("COMMENT must be shorter than {} characters", MAX_COMMENT + 1));
            }
            Arg::Match(Match::Port { protocol: module, destination_port }) => {
                if protocol != Some(*module) {
                    return Err(format!("{} match: only valid for protocol {}", module.as_str(), module.number()));
                }
                port_module = Some(destination_port.is_some());
            }
            Arg::DestinationPort(_) => match port_module {
                Some(false) => port_module = Some(true),
                Some(true) => return Err("multiple --dport flags not allowed".into()),
                None => return Err("unknown option \"--dport\"".into()),
            },
            Arg::Match(Match::Recent(recent)) if recent.name.is_empty() || recent.name.len() > 200 => {
                return Err("recent: name too long or empty".into());
            }
            _ => {}
        }
    }
    match &rule.target {
        Some(Target::Jump(chain) | Target::Goto(chain)) if table.table.is_builtin(chain) || !table.has_chain(chain) => {
            return Err(format!("Couldn't load target `{chain}':No such file or directory"));
        }
        Some(Target::Dnat(address)) => {
            if table.table != Table::Nat {
                return Err("DNAT: only valid in table nat".into());
            }
            if Family::of(&address.ip()) != family {
                return Err(format!("Bad IP address \"{}\"", address.ip()));
            }
            if protocol.is_none() {
                return Err("Need TCP, UDP, SCTP or DCCP with port specification".into());
            }
        }
        Some(Target::Masquerade { .. }) if table.table != Table::Nat => {
            return Err("MASQUERADE: only valid in table nat".into());
        }
        Some(Target::Reject(_)) if table.table != Table::Filter => {
            return Err("RULE_APPEND failed (Invalid argument): REJECT is only valid in table filter".into());
        }
        Some(Target::Reject(Some(crate::model::RejectWith::TcpReset))) if protocol != Some(crate::Protocol::Tcp) => {
            return Err("TCP_RESET invalid for non-tcp".into());
        }
        _ => {}
    }
    Ok(())
}

fn apply_command(fake: &mut FakeTable, family: Family, command: &Command) -> Result<(), String> {
    let chain_name = command.chain().to_owned();
    if !fake.has_chain(&chain_name) {
        return Err(format!("Chain '{chain_name}' does not exist"));
    }
    match command {
        Command::Append { rule, .. } => {
            check_rule(fake, family, rule)?;
            let canonical = rule.canonical(family);
            fake.chains.get_mut(&chain_name).expect("checked").rules.push(canonical);
        }
        Command::Insert { position, rule, .. } => {
            check_rule(fake, family, rule)?;
            let canonical = rule.canonical(family);
            let rules = &mut fake.chains.get_mut(&chain_name).expect("checked").rules;
            if *position == 0 || *position > rules.len() + 1 {
                return Err("Index of insertion too big.".into());
            }
            rules.insert(position - 1, canonical);
        }
        Command::Delete { rule, .. } => {
            let canonical = rule.canonical(family);
            let rules = &mut fake.chains.get_mut(&chain_name).expect("checked").rules;
            let Some(at) = rules.iter().position(|r| *r == canonical) else {
                return Err("Bad rule (does a matching rule exist in that chain?).".into());
            };
            rules.remove(at);
        }
        Command::DeleteChain(_) => {
            if fake.table.is_builtin(&chain_name) {
                return Err(format!("Can't delete built-in chain {chain_name}"));
            }
            if !fake.chains[&chain_name].rules.is_empty() {
                return Err("Directory not empty".into());
            }
            if fake.references(&chain_name) > 0 {
                return Err("Too many links".into());
            }
            fake.chains.remove(&chain_name);
        }
    }
    Ok(())
}

/// The hooks each restricted target may be reached from.
fn allowed_hooks(target: &Target) -> Option<(&'static str, &'static [&'static str])> {
    match target {
        Target::Dnat(_) => Some(("DNAT", &["PREROUTING", "OUTPUT"])),
        Target::Masquerade { .. } => Some(("MASQUERADE", &["POSTROUTING"])),
        Target::Reject(_) => Some(("REJECT", &["INPUT", "FORWARD", "OUTPUT"])),
        _ => None,
    }
}

/// What the kernel checks when a table is replaced: no loops, and restricted targets only
/// reachable from the hooks that allow them.
fn validate_hooks(fake: &FakeTable) -> Result<(), String> {
    for hook in fake.table.builtin_chains() {
        let mut done: BTreeSet<&str> = BTreeSet::new();
        let mut on_path: Vec<&str> = Vec::new();
        walk(fake, hook, hook, &mut done, &mut on_path)?;
    }
    Ok(())
}

fn walk<'a>(
    fake: &'a FakeTable,
    hook: &str,
    chain: &'a str,
    done: &mut BTreeSet<&'a str>,
    on_path: &mut Vec<&'a str>,
) -> Result<(), String> {
    if on_path.contains(&chain) {
        return Err(format!("Too many levels of symbolic links: chain {chain} jumps back to itself"));
    }
    if done.contains(chain) {
        return Ok(());
    }
    if on_path.len() > MAX_DEPTH {
        return Err(format!("chain {chain}: jumps nest too deep"));
    }
    on_path.push(chain);
    for rule in fake.rules(chain).unwrap_or_default() {
        if let Some(target) = &rule.target
            && let Some((name, hooks)) = allowed_hooks(target)
            && !hooks.contains(&hook)
        {
            return Err(format!("{name} target: used from hook {hook}, but only usable from {}", hooks.join("/")));
        }
        if let Some(next) = rule.jump_target()
            && let Some((next, _)) = fake.chains.get_key_value(next)
        {
            walk(fake, hook, next, done, on_path)?;
        }
    }
    on_path.pop();
    done.insert(chain);
    Ok(())
}

impl Iptables for FakeIptables {
    fn restore(&mut self, family: Family, input: &RestoreTable) -> Result<(), IptablesError> {
        let table = self.apply(family, input)?;
        self.tables.insert((family, input.table), table);
        self.restores.push((family, input.clone()));
        Ok(())
    }

    fn save(&self, family: Family, table: Table) -> Result<String, IptablesError> {
        Ok(match self.table(family, table) {
            Some(fake) => fake.save_text(family),
            None => FakeTable::new(table).save_text(family),
        })
    }

    fn save_all(&self, family: Family) -> Result<String, IptablesError> {
        Ok(self.dump(family))
    }

    fn list_chain(&self, family: Family, table: Table, chain: &str) -> Result<Option<String>, IptablesError> {
        let empty;
        let fake = match self.table(family, table) {
            Some(fake) => fake,
            None => {
                empty = FakeTable::new(table);
                &empty
            }
        };
        let Some(found) = fake.chain(chain) else { return Ok(None) };
        let mut out = match &found.policy {
            Some(policy) => format!("-P {chain} {policy}\n"),
            None => format!("-N {chain}\n"),
        };
        for rule in &found.rules {
            let _ = writeln!(out, "-A {chain} {}", rule.save_args(family));
        }
        Ok(Some(out))
    }
}

/// Jump counts per chain, for tests that want to know what refers to what.
pub fn references(table: &FakeTable) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for chain in table.chains.values() {
        for rule in &chain.rules {
            if let Some(target) = rule.jump_target() {
                *counts.entry(target.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::model::{MarkOp, Protocol};

    fn nat(chains: &[&str], commands: Vec<Command>) -> RestoreTable {
        RestoreTable { table: Table::Nat, chains: chains.iter().map(|c| (*c).to_owned()).collect(), commands }
    }

    fn append(chain: &str, rule: Rule) -> Command {
        Command::Append { chain: chain.into(), rule }
    }

    fn error_line(result: Result<(), IptablesError>) -> usize {
        result.unwrap_err().line().expect("the error names a line")
    }

    #[test]
    fn a_jump_to_a_missing_chain_is_refused_at_its_line_and_nothing_is_applied() {
        let mut fake = FakeIptables::new();
        let input = nat(&["A"], vec![append("A", Rule::new().jump("B"))]);
        assert_eq!(error_line(fake.restore(Family::V4, &input)), 3);
        assert!(fake.table(Family::V4, Table::Nat).is_none(), "nothing applied");
    }

    #[test]
    fn a_chain_line_flushes_an_existing_chain() {
        let mut fake = FakeIptables::new();
        let rule = Rule::new().target(Target::Return);
        fake.restore(Family::V4, &nat(&["A"], vec![append("A", rule.clone()), append("A", rule)])).unwrap();
        fake.restore(Family::V4, &nat(&["A"], vec![])).unwrap();
        assert_eq!(fake.rules(Family::V4, Table::Nat, "A").unwrap().len(), 0);
    }

    #[test]
    fn deleting_a_chain_that_is_jumped_to_or_not_empty_is_refused() {
        let mut fake = FakeIptables::new();
        let input =
            nat(&["A", "B"], vec![append("A", Rule::new().jump("B")), append("B", Rule::new().target(Target::Return))]);
        fake.restore(Family::V4, &input).unwrap();
        let referenced = nat(&[], vec![Command::DeleteChain("B".into())]);
        assert!(fake.restore(Family::V4, &referenced).unwrap_err().to_string().contains("Directory not empty"));
        let flushed = nat(&["B"], vec![Command::DeleteChain("B".into())]);
        assert!(fake.restore(Family::V4, &flushed).unwrap_err().to_string().contains("Too many links"));
    }

    #[test]
    fn a_rule_is_deleted_by_its_spelling_in_either_order() {
        let mut fake = FakeIptables::new();
        let rule = Rule::new()
            .comment("ns/svc:p cluster IP")
            .protocol(Protocol::Tcp)
            .destination("10.96.0.1".parse::<IpAddr>().unwrap())
            .destination_port(443)
            .jump("A");
        fake.restore(Family::V4, &nat(&["A"], vec![append("PREROUTING", rule.clone())])).unwrap();
        let read_back = crate::text::parse_rule(&rule.save_args(Family::V4)).unwrap();
        fake.restore(Family::V4, &nat(&[], vec![Command::Delete { chain: "PREROUTING".into(), rule: read_back }]))
            .unwrap();
        assert!(fake.rules(Family::V4, Table::Nat, "PREROUTING").unwrap().is_empty());
        let again = nat(&[], vec![Command::Delete { chain: "PREROUTING".into(), rule }]);
        assert!(fake.restore(Family::V4, &again).unwrap_err().to_string().contains("Bad rule"));
    }

    #[test]
    fn dnat_reachable_from_postrouting_is_refused_at_commit() {
        let mut fake = FakeIptables::new();
        let dnat = Rule::new().protocol(Protocol::Tcp).target(Target::Dnat("10.0.0.1:80".parse().unwrap()));
        let input = nat(&["A"], vec![append("A", dnat), append("POSTROUTING", Rule::new().jump("A"))]);
        let error = fake.restore(Family::V4, &input).unwrap_err();
        assert_eq!(error.line(), Some(input.commit_line()));
        assert!(error.to_string().contains("only usable from PREROUTING/OUTPUT"), "{error}");
    }

    #[test]
    fn a_loop_of_jumps_is_refused() {
        let mut fake = FakeIptables::new();
        let input = nat(
            &["A", "B"],
            vec![
                append("A", Rule::new().jump("B")),
                append("B", Rule::new().jump("A")),
                append("OUTPUT", Rule::new().jump("A")),
            ],
        );
        assert!(fake.restore(Family::V4, &input).unwrap_err().to_string().contains("symbolic links"));
    }

    #[test]
    fn chain_names_longer_than_28_characters_are_refused() {
        let mut fake = FakeIptables::new();
        assert!(fake.restore(Family::V4, &nat(&["KUBE-SVC-ABCDEFGHIJKLMNOPQRSTU"], vec![])).is_err());
        fake.restore(Family::V4, &nat(&["KUBE-SVC-ABCDEFGHIJKLMNOPQRS"], vec![])).unwrap();
    }

    #[test]
    fn a_port_without_its_protocol_is_refused() {
        let mut fake = FakeIptables::new();
        let rule =
            Rule::new().matching(Match::Port { protocol: Protocol::Tcp, destination_port: None }).destination_port(80);
        let error = fake.restore(Family::V4, &nat(&[], vec![append("PREROUTING", rule)])).unwrap_err();
        assert!(error.to_string().contains("only valid for protocol 6"), "{error}");
    }

    #[test]
    fn save_prints_what_iptables_save_prints() {
        let mut fake = FakeIptables::new();
        let input = nat(
            &["KUBE-MARK-MASQ"],
            vec![append("KUBE-MARK-MASQ", Rule::new().target(Target::Mark(MarkOp::Or(0x4000))))],
        );
        fake.restore(Family::V4, &input).unwrap();
        assert_eq!(
            fake.save(Family::V4, Table::Nat).unwrap(),
            "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n"
        );
        assert_eq!(fake.list_chain(Family::V4, Table::Nat, "NOPE").unwrap(), None);
    }
}
