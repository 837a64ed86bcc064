//! Applies transactions by piping their script to `nft -f -`. One process sends one netlink
//! batch, which the kernel commits as one transaction: all or nothing.
//!
//! nft's complaints are mapped back to [`NftError`] variants from the location it reports:
//! the script has one operation per line, so the line names the operation and the
//! underlined text names the object.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::Nftables;
use crate::error::{NftError, ObjectKind};
use crate::objects::{ElementValue, Family, Operation, TableName, Transaction};
use crate::text::{self, ScriptWriter};
use crate::validation;

const NO_SUCH_OBJECT: &str = "No such file or directory";
const BUSY: &str = "Device or resource busy";
const EXISTS: &str = "File exists";
const NOT_SUPPORTED: &str = "Operation not supported";
const TOO_MANY_LINKS: &str = "Too many links";

/// The `nft` command-line tool as a mechanism.
#[derive(Debug, Clone)]
pub struct NftCli {
    program: String,
    prefix: Vec<String>,
    /// Per table, whether each set it has seen is a map: nft 1.0.6 flushes a map only as
    /// `flush map`. Learned from applied transactions, or asked of nft once per name.
    is_map: HashMap<TableName, HashMap<String, bool>>,
}

impl Default for NftCli {
    fn default() -> Self {
        Self::new()
    }
}

impl NftCli {
    /// Runs `nft` from `PATH` in the caller's network namespace.
    pub fn new() -> Self {
        NftCli { program: "nft".to_owned(), prefix: Vec::new(), is_map: HashMap::new() }
    }

    /// Runs this program instead of `nft`.
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = program.into();
        self
    }

    /// Runs nft through a command prefix, e.g. `["ip", "netns", "exec", "lab-node1"]`.
    pub fn with_prefix<S: Into<String>>(mut self, prefix: impl IntoIterator<Item = S>) -> Self {
        self.prefix = prefix.into_iter().map(Into::into).collect();
        self
    }

    /// Runs nft inside the named network namespace (through `ip netns exec`).
    pub fn in_network_namespace(namespace: &str) -> Self {
        Self::new().with_prefix(["ip", "netns", "exec", namespace])
    }

    /// `nft list table`: the kernel's own view, for tests and diagnostics. Slow on large tables
    /// (seconds at 10k services), so never part of a sync.
    pub fn list_table(&self, table: &TableName) -> Result<String, NftError> {
        validation::check_name(ObjectKind::Table, &table.name)?;
        let output = self.run(&["list", "table", table.family.keyword(), &table.name], None)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            if stderr.contains(NO_SUCH_OBJECT) {
                Err(NftError::NotFound { kind: ObjectKind::Table, name: table.to_string() })
            } else {
                Err(NftError::Apply { table: table.clone(), message: stderr.trim().to_owned() })
            }
        }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<Output, NftError> {
        let (program, prefix_args) = match self.prefix.split_first() {
            Some((first, rest)) => (first.as_str(), rest),
            None => (self.program.as_str(), &[][..]),
        };
        let mut command = Command::new(program);
        if !self.prefix.is_empty() {
            command.args(prefix_args).arg(&self.program);
        }
        // nft words its errors with strerror(), which follows the locale; they are matched below.
        command
            .env("LC_ALL", "C")
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawn_error = |source| NftError::Spawn { program: program.to_owned(), source };
        let mut child = command.spawn().map_err(spawn_error)?;
        let Some(input) = stdin else {
            return child.wait_with_output().map_err(spawn_error);
        };
        let mut pipe = child.stdin.take().expect("stdin is piped");
        // Feed the script from another thread: nft may answer on stderr before reading it all,
        // and a large script does not fit in a pipe buffer.
        std::thread::scope(|scope| {
            scope.spawn(move || {
                // nft stopping early closes the pipe; its stderr then says why.
                let _ = pipe.write_all(input.as_bytes());
            });
            child.wait_with_output().map_err(spawn_error)
        })
    }

    /// Asks nft whether an existing set is a map (`list map` fails for a plain set).
    fn query_is_map(&self, table: &TableName, name: &str) -> bool {
        self.run(&["-t", "list", "map", table.family.keyword(), &table.name, name], None)
            .is_ok_and(|output| output.status.success())
    }

    fn remember_sets(&mut self, transaction: &Transaction, learned: HashMap<String, bool>) {
        let known = self.is_map.entry(transaction.table.clone()).or_default();
        known.extend(learned);
        for operation in &transaction.operations {
            match operation {
                Operation::AddSet(set) => {
                    known.entry(set.name.clone()).or_insert(set.is_map());
                }
                Operation::DeleteSet(name) => {
                    known.remove(name);
                }
                Operation::DeleteTable => known.clear(),
                _ => {}
            }
        }
    }
}

impl Nftables for NftCli {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        if transaction.operations.is_empty() {
            return Ok(());
        }
        let learned = RefCell::new(HashMap::new());
        let script = {
            let known = self.is_map.get(&transaction.table);
            text::render_with(transaction, |name| {
                if let Some(is_map) = known.and_then(|known| known.get(name)) {
                    return *is_map;
                }
                let is_map = self.query_is_map(&transaction.table, name);
                learned.borrow_mut().insert(name.to_owned(), is_map);
                is_map
            })?
        };
        let output = self.run(&["-f", "-"], Some(&script))?;
        if !output.status.success() {
            return Err(classify(transaction, &script, &String::from_utf8_lossy(&output.stderr)));
        }
        self.remember_sets(transaction, learned.into_inner());
        Ok(())
    }

    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError> {
        validation::check_name(ObjectKind::Table, &table.name)?;
        let mut script = String::new();
        ScriptWriter::new(&mut script, table)
            .operation(&Operation::DeleteTable, false)
            .expect("writing to a String cannot fail");
        let output = self.run(&["-f", "-"], Some(&script))?;
        self.is_map.remove(table);
        if output.status.success() {
            return Ok(true);
        }
        let transaction = Transaction { table: table.clone(), operations: vec![Operation::DeleteTable] };
        match classify(&transaction, &script, &String::from_utf8_lossy(&output.stderr)) {
            NftError::NotFound { kind: ObjectKind::Table, .. } => Ok(false),
            error => Err(error),
        }
    }

    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        validation::check_name(ObjectKind::Table, &table.name)?;
        validation::check_name(ObjectKind::Chain, chain)?;
        let output = self.run(&["-a", "list", "chain", table.family.keyword(), &table.name, chain], None)?;
        if !output.status.success() {
            // A missing table or chain holds no rules.
            return Ok(0);
        }
        // With `-a`, every rule line ends in `# handle N`; the chain line itself does not.
        let listing = String::from_utf8_lossy(&output.stdout);
        let is_rule = |line: &&str| {
            let line = line.trim_start();
            line.contains("# handle") && !line.starts_with("chain ") && !line.starts_with("table ")
        };
        Ok(listing.lines().filter(is_rule).count())
    }

    fn list_tables(&mut self, family: Family) -> Result<Vec<String>, NftError> {
        let output = self.run(&["list", "tables", family.keyword()], None)?;
        if !output.status.success() {
            return Err(NftError::Apply {
                table: TableName::new(family, "*"),
                message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        let prefix = format!("table {} ", family.keyword());
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().strip_prefix(&prefix).map(|name| name.trim().to_owned()))
            .collect())
    }
}

/// Where nft says its first error is, and what it says.
#[derive(Debug, PartialEq, Eq)]
struct Complaint<'a> {
    /// 1-based script line.
    line: usize,
    /// 1-based, inclusive byte columns of the underlined text.
    columns: (usize, usize),
    message: &'a str,
}

/// Parses `/dev/stdin:3:19-25: Error: Could not process rule: No such file or directory`.
fn first_complaint(stderr: &str) -> Option<Complaint<'_>> {
    let (location, message) = stderr.lines().find_map(|line| line.split_once(": Error: "))?;
    let mut parts = location.rsplitn(3, ':');
    let columns = parts.next()?;
    let line = parts.next()?.parse().ok()?;
    let (first, last) = columns.split_once('-')?;
    Some(Complaint { line, columns: (first.parse().ok()?, last.parse().ok()?), message })
}

/// Turns nft's stderr for a failed `transaction` into the error the fake gives for the same
/// mistake.
fn classify(transaction: &Transaction, script: &str, stderr: &str) -> NftError {
    let refused = || NftError::Apply { table: transaction.table.clone(), message: stderr.trim().to_owned() };
    let Some(complaint) = first_complaint(stderr) else { return refused() };
    let Some(operation) = complaint.line.checked_sub(1).and_then(|index| transaction.operations.get(index)) else {
        return refused();
    };
    let line = script.lines().nth(complaint.line - 1).unwrap_or_default();
    let underlined = complaint.columns.0.checked_sub(1).and_then(|start| line.get(start..complaint.columns.1));
    let underlined = underlined.unwrap_or_default();
    // Every command is `verb object family table ...`: the table name is the fourth word.
    let table_column = line.match_indices(' ').nth(2).map(|(index, _)| index + 2);
    let message = complaint.message;
    let missing = message.contains(NO_SUCH_OBJECT);
    let owned = |name: &str| name.to_owned();

    if missing && table_column == Some(complaint.columns.0) {
        return NftError::NotFound { kind: ObjectKind::Table, name: transaction.table.to_string() };
    }
    let kernel = message.starts_with("Could not process rule: ");
    // A statement on the wrong hook, a jump loop, or jumps nested too deep.
    let unsuitable = kernel && (message.contains(NOT_SUPPORTED) || message.contains(TOO_MANY_LINKS));
    match operation {
        Operation::AddTable { .. } | Operation::DeleteTable if missing => {
            NftError::NotFound { kind: ObjectKind::Table, name: transaction.table.to_string() }
        }
        Operation::AddChain(chain) if message.contains(EXISTS) || message.contains(NOT_SUPPORTED) => {
            NftError::Exists { kind: ObjectKind::Chain, name: owned(&chain.name) }
        }
        Operation::AddChain(chain) if !kernel => {
            NftError::InvalidChain { chain: owned(&chain.name), reason: owned(message) }
        }
        Operation::FlushChain(name) | Operation::DeleteChain(name) if missing => {
            NftError::NotFound { kind: ObjectKind::Chain, name: owned(name) }
        }
        Operation::DeleteChain(name) if message.contains(BUSY) => {
            NftError::InUse { kind: ObjectKind::Chain, name: owned(name) }
        }
        Operation::AddRule(rule) if missing => {
            if let Some(set) = underlined.strip_prefix('@') {
                NftError::NotFound { kind: ObjectKind::Set, name: owned(set) }
            } else if underlined == rule.chain {
                NftError::NotFound { kind: ObjectKind::Chain, name: owned(&rule.chain) }
            } else if let Some(target) = rule.targets().find(|target| *target == underlined) {
                NftError::InvalidReference { from: owned(&rule.chain), target: owned(target) }
            } else {
                refused()
            }
        }
        // Evaluation errors, and the kernel's checks of what a base chain reaches.
        Operation::AddRule(rule) if !kernel || unsuitable => {
            NftError::InvalidRule { chain: owned(&rule.chain), reason: owned(message) }
        }
        Operation::AddSet(set) if message.contains(EXISTS) => {
            NftError::Exists { kind: ObjectKind::Set, name: owned(&set.name) }
        }
        Operation::AddSet(set) if !kernel => NftError::InvalidSet { set: owned(&set.name), reason: owned(message) },
        Operation::FlushSet(name) | Operation::DeleteSet(name) if missing => {
            NftError::NotFound { kind: ObjectKind::Set, name: owned(name) }
        }
        Operation::DeleteSet(name) if message.contains(BUSY) => {
            NftError::InUse { kind: ObjectKind::Set, name: owned(name) }
        }
        Operation::AddElement(element) | Operation::DeleteElement(element) if missing && underlined == element.set => {
            NftError::NotFound { kind: ObjectKind::Set, name: owned(&element.set) }
        }
        Operation::AddElement(element) => {
            let key = || text::key_text(&element.key);
            let target = element.value.as_ref().and_then(ElementValue::target);
            match target {
                Some(target) if missing => {
                    NftError::InvalidReference { from: owned(&element.set), target: owned(target) }
                }
                // nft's own words for an interval meeting another one.
                _ if message.contains(EXISTS)
                    || message.contains("interval overlaps")
                    || message.contains("conflicting intervals") =>
                {
                    NftError::Exists { kind: ObjectKind::Element, name: key() }
                }
                // The element made a base chain reach its target chain, which does not suit it.
                Some(target) if unsuitable => NftError::InvalidRule { chain: owned(target), reason: owned(message) },
                _ if !kernel => NftError::InvalidElement { set: owned(&element.set), reason: owned(message) },
                _ => refused(),
            }
        }
        Operation::DeleteElement(element) if missing || message.contains("element does not exist") => {
            NftError::NotFound { kind: ObjectKind::Element, name: text::key_text(&element.key) }
        }
        Operation::DeleteElement(element) if !kernel => {
            NftError::InvalidElement { set: owned(&element.set), reason: owned(message) }
        }
        _ => refused(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Chain, Element, Family, Rule, Statement, Value, Verdict};

    fn transaction(operations: Vec<Operation>) -> Transaction {
        Transaction { table: TableName::new(Family::Ip, "e"), operations }
    }

    fn classified(operations: Vec<Operation>, stderr: &str) -> NftError {
        let transaction = transaction(operations);
        let script = text::render(&transaction).unwrap();
        classify(&transaction, &script, stderr)
    }

    #[test]
    fn nft_error_locations_are_parsed() {
        let stderr = "/dev/stdin:2:19-25: Error: Could not process rule: No such file or directory\n\
                      delete chain ip e nochain\n                  ^^^^^^^\n";
        let complaint = first_complaint(stderr).unwrap();
        assert_eq!(
            complaint,
            Complaint { line: 2, columns: (19, 25), message: "Could not process rule: No such file or directory" }
        );
    }

    #[test]
    fn a_missing_jump_target_is_an_invalid_reference() {
        let rule = Rule {
            chain: "c".into(),
            statements: vec![Statement::Verdict(Verdict::Jump("nochain".into()))],
            comment: None,
        };
        let error = classified(
            vec![Operation::AddRule(rule)],
            "/dev/stdin:1:22-28: Error: No such file or directory; did you mean chain ‘base’ in table ip ‘e’?\n",
        );
        assert!(matches!(&error, NftError::InvalidReference { from, target } if from == "c" && target == "nochain"));
    }

    #[test]
    fn a_missing_table_is_told_apart_from_a_missing_chain() {
        let chain = Operation::AddChain(Chain { name: "c".into(), base: None, comment: None });
        let error = classified(vec![chain], "/dev/stdin:1:14-14: Error: No such file or directory\n");
        assert!(matches!(error, NftError::NotFound { kind: ObjectKind::Table, .. }), "{error}");
        let delete = Operation::DeleteChain("c".into());
        let error =
            classified(vec![delete], "/dev/stdin:1:19-19: Error: Could not process rule: No such file or directory\n");
        assert!(matches!(error, NftError::NotFound { kind: ObjectKind::Chain, .. }), "{error}");
    }

    #[test]
    fn a_busy_chain_is_in_use() {
        let error = classified(
            vec![Operation::DeleteChain("d".into())],
            "/dev/stdin:1:19-19: Error: Could not process rule: Device or resource busy\n",
        );
        assert!(matches!(error, NftError::InUse { kind: ObjectKind::Chain, .. }), "{error}");
    }

    #[test]
    fn a_missing_element_is_not_found() {
        let element = Element {
            set: "s".into(),
            key: vec![Value::Address("9.9.9.9".parse().unwrap())],
            value: None,
            comment: None,
        };
        let error = classified(
            vec![Operation::DeleteElement(element)],
            "/dev/stdin:1:25-31: Error: Could not process rule: No such file or directory\n",
        );
        assert!(matches!(error, NftError::NotFound { kind: ObjectKind::Element, .. }), "{error}");
    }

    #[test]
    fn an_unrecognised_complaint_keeps_nft_s_words() {
        let error =
            classified(vec![Operation::DeleteTable], "internal:0:0-0: Error: Could not process rule: File exists\n");
        assert!(matches!(&error, NftError::Apply { message, .. } if message.contains("File exists")), "{error}");
    }
}
