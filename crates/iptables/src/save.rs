//! Reading `iptables-save` output: tables, chains with their policies, and each chain's
//! rules. Rule text is kept verbatim (and parsed on demand), so a comparison of what the
//! kernel printed with what svcplane rendered compares the very characters.
//!
//! [`canonical`] orders a dump the way kube-proxy's tests compare rulesets: tables by name,
//! built-in chains in hook order then user chains by name, each chain's rules in their own
//! order; comment lines and counters dropped.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::IptablesError;
use crate::model::{Rule, Table};
use crate::text::{parse_rule_args, tokenize};

/// One rule line of a dump, without its `-A CHAIN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedRule {
    pub text: String,
}

impl SavedRule {
    pub fn parse(&self) -> Result<Rule, String> {
        parse_rule_args(&tokenize(&self.text)?)
    }

    /// The chain this rule jumps or goes to, if its target is not a target extension.
    pub fn jump_target(&self) -> Option<String> {
        let tokens = tokenize(&self.text).ok()?;
        let at =
            tokens.iter().position(|t| !t.quoted && matches!(t.text.as_str(), "-j" | "--jump" | "-g" | "--goto"))?;
        let name = &tokens.get(at + 1)?.text;
        (!crate::model::is_target_extension(name)).then(|| name.clone())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedChain {
    pub name: String,
    /// `ACCEPT` / `DROP` for built-in chains, `None` (`-`) for user chains.
    pub policy: Option<String>,
    pub rules: Vec<SavedRule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedTable {
    pub name: String,
    pub chains: Vec<SavedChain>,
}

impl SavedTable {
    pub fn table(&self) -> Option<Table> {
        Table::from_name(&self.name)
    }

    pub fn chain(&self, name: &str) -> Option<&SavedChain> {
        self.chains.iter().find(|c| c.name == name)
    }

    pub fn has_chain(&self, name: &str) -> bool {
        self.chain(name).is_some()
    }
}

/// A whole dump: the tables `iptables-save` printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedRuleset {
    pub tables: Vec<SavedTable>,
}

impl SavedRuleset {
    pub fn table(&self, table: Table) -> Option<&SavedTable> {
        self.tables.iter().find(|t| t.name == table.name())
    }
}

fn parse_error(line: usize, message: impl Into<String>) -> IptablesError {
    IptablesError::Parse { line, message: message.into() }
}

/// Reads `iptables-save` (or `iptables -S`-free restore-style) text.
pub fn parse_save(text: &str) -> Result<SavedRuleset, IptablesError> {
    let mut ruleset = SavedRuleset::default();
    let mut current: Option<SavedTable> = None;
    // Chain name -> position in the current table: dumps hold 100k chains at 10k Services.
    let mut positions: HashMap<String, usize> = HashMap::new();
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            if current.is_some() {
                return Err(parse_error(number, "a table starts before the previous one's COMMIT"));
            }
            current = Some(SavedTable { name: name.trim().to_owned(), chains: Vec::new() });
            positions.clear();
            continue;
        }
        let Some(table) = current.as_mut() else {
            return Err(parse_error(number, format!("{line:?} outside a table")));
        };
        if line == "COMMIT" {
            ruleset.tables.push(current.take().expect("inside a table"));
            continue;
        }
        if let Some(rest) = line.strip_prefix(':') {
            let mut words = rest.split_whitespace();
            let name = words.next().ok_or_else(|| parse_error(number, "a chain line without a name"))?;
            let policy = words.next().filter(|p| *p != "-").map(str::to_owned);
            if !positions.contains_key(name) {
                positions.insert(name.to_owned(), table.chains.len());
                table.chains.push(SavedChain { name: name.to_owned(), policy, rules: Vec::new() });
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("-A ") {
            let rest = rest.trim_start();
            let (chain, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            let Some(&position) = positions.get(chain) else {
                return Err(parse_error(number, format!("a rule for chain {chain} that was not declared")));
            };
            table.chains[position].rules.push(SavedRule { text: args.trim().to_owned() });
            continue;
        }
        return Err(parse_error(number, format!("unexpected line {line:?}")));
    }
    if current.is_some() {
        return Err(parse_error(text.lines().count(), "the last table has no COMMIT"));
    }
    Ok(ruleset)
}

/// `text` in canonical order (see the module documentation), with counters as `[0:0]`.
pub fn canonical(text: &str) -> Result<String, IptablesError> {
    let ruleset = parse_save(text)?;
    Ok(render_canonical(&ruleset))
}

/// Chains in the order `iptables-save` lists them: built-ins in hook order, then the rest
/// by name.
pub fn chain_order(table: &str, chain: &str) -> (usize, String) {
    let builtin = Table::from_name(table).and_then(|t| t.builtin_chains().iter().position(|c| *c == chain));
    (builtin.unwrap_or(usize::MAX), chain.to_owned())
}

pub fn render_canonical(ruleset: &SavedRuleset) -> String {
    let mut tables: Vec<&SavedTable> = ruleset.tables.iter().collect();
    tables.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for table in tables {
        let mut chains: Vec<&SavedChain> = table.chains.iter().collect();
        chains.sort_by_key(|c| chain_order(&table.name, &c.name));
        let _ = writeln!(out, "*{}", table.name);
        for chain in &chains {
            let _ = writeln!(out, ":{} {} [0:0]", chain.name, chain.policy.as_deref().unwrap_or("-"));
        }
        for chain in &chains {
            for rule in &chain.rules {
                let args = rule.text.split_whitespace().collect::<Vec<_>>().join(" ");
                if args.is_empty() {
                    let _ = writeln!(out, "-A {}", chain.name);
                } else {
                    let _ = writeln!(out, "-A {} {args}", chain.name);
                }
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "# Generated by iptables-save v1.8.9\n*nat\n:PREROUTING ACCEPT [12:720]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SVC-B - [0:0]\n:KUBE-SVC-A - [0:0]\n-A KUBE-SVC-B -m comment --comment \"x -j y\" -j KUBE-SEP-1\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-SVC-A -j RETURN\nCOMMIT\n# Completed\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";

    #[test]
    fn a_dump_reads_as_tables_chains_and_rules() {
        let ruleset = parse_save(DUMP).unwrap();
        let nat = ruleset.table(Table::Nat).unwrap();
        assert_eq!(nat.chain("PREROUTING").unwrap().policy.as_deref(), Some("ACCEPT"));
        assert_eq!(nat.chain("KUBE-SVC-B").unwrap().rules[0].jump_target().as_deref(), Some("KUBE-SEP-1"));
        assert_eq!(nat.chain("KUBE-SVC-A").unwrap().rules[0].jump_target(), None);
        assert!(ruleset.table(Table::Filter).is_some());
    }

    #[test]
    fn canonical_order_sorts_tables_and_user_chains_and_keeps_rule_order() {
        let text = canonical(DUMP).unwrap();
        assert_eq!(
            text,
            "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SVC-B - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-SVC-A -j RETURN\n-A KUBE-SVC-B -m comment --comment \"x -j y\" -j KUBE-SEP-1\nCOMMIT\n"
        );
    }

    #[test]
    fn a_rule_for_an_undeclared_chain_is_an_error_with_its_line() {
        let error = parse_save("*nat\n-A NOPE -j RETURN\nCOMMIT\n").unwrap_err();
        assert!(matches!(error, IptablesError::Parse { line: 2, .. }), "{error}");
    }
}
