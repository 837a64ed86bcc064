//! The real programs: `iptables-restore --noflush`, `iptables-save` and `iptables -S`, in
//! either variant (`iptables-legacy-*` on the x_tables kernel API, `iptables-nft-*` on
//! nf_tables), optionally inside a network namespace (through a command prefix such as
//! `ip netns exec NS`).

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use crate::Iptables;
use crate::error::IptablesError;
use crate::model::{Family, Table};
use crate::restore::RestoreTable;
use crate::save::parse_save;

/// How long a program waits for the xtables lock another program holds (legacy only; the
/// nft variant needs no lock).
const WAIT_SECONDS: &str = "--wait=10";

/// Which iptables implementation writes the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `iptables-legacy`: the x_tables kernel interface; every change replaces a table.
    Legacy,
    /// `iptables-nft`: iptables syntax over nf_tables.
    Nft,
}

/// The three programs of a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Iptables,
    Restore,
    Save,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Legacy => "legacy",
            Variant::Nft => "nft",
        }
    }

    /// The program name, e.g. `ip6tables-nft-restore`.
    pub fn program(self, family: Family, tool: Tool) -> String {
        let suffix = match tool {
            Tool::Iptables => "",
            Tool::Restore => "-restore",
            Tool::Save => "-save",
        };
        format!("{}-{}{suffix}", family.program_stem(), self.name())
    }
}

/// A fault put in a restore's way on purpose, for tests of what happens when the kernel
/// path fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreFault {
    /// The restore input gets one more line appending to a chain that does not exist, so
    /// `iptables-restore` refuses the whole table: nothing of it is applied.
    Refused,
}

/// Hands out the fault for each restore (`None`: no fault this time).
pub trait RestoreFaultSource: Send + std::fmt::Debug {
    fn next_fault(&mut self) -> std::io::Result<Option<RestoreFault>>;
}

/// The chain an injected [`RestoreFault::Refused`] appends to: it never exists.
const FAULT_CHAIN: &str = "SVCPLANE-FAULT-INJECTED";

/// The iptables programs of one variant as a mechanism.
#[derive(Debug, Clone)]
pub struct IptablesCli {
    variant: Variant,
    prefix: Vec<String>,
    faults: Option<Arc<Mutex<Box<dyn RestoreFaultSource>>>>,
}

impl IptablesCli {
    /// Runs the programs of `variant` from `PATH` in the caller's network namespace.
    pub fn new(variant: Variant) -> Self {
        Self { variant, prefix: Vec::new(), faults: None }
    }

    /// Injects the faults `source` hands out, one per restore (tests only).
    pub fn with_faults(mut self, source: Box<dyn RestoreFaultSource>) -> Self {
        self.faults = Some(Arc::new(Mutex::new(source)));
        self
    }

    fn next_fault(&self) -> Result<Option<RestoreFault>, IptablesError> {
        let Some(faults) = &self.faults else { return Ok(None) };
        let mut source = faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        source.next_fault().map_err(|source| IptablesError::Spawn { program: "the fault source".to_owned(), source })
    }

    /// Runs every program through a command prefix, e.g. `["ip", "netns", "exec", "ns"]`.
    pub fn with_prefix<S: Into<String>>(mut self, prefix: impl IntoIterator<Item = S>) -> Self {
        self.prefix = prefix.into_iter().map(Into::into).collect();
        self
    }

    /// Runs every program inside the named network namespace.
    pub fn in_network_namespace(variant: Variant, namespace: &str) -> Self {
        Self::new(variant).with_prefix(["ip", "netns", "exec", namespace])
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, IptablesError> {
        run_program(&self.prefix, program, args, stdin)
    }

    /// Runs a save program with the stack limit raised: `iptables-nft-save` 1.8.9 recurses
    /// once per chain and overflows the default 8 MiB stack at about 100k chains (10k
    /// Services), dying with SIGSEGV.
    fn run_save(&self, program: &str, args: &[&str]) -> Result<Output, IptablesError> {
        let mut wrapped =
            vec!["-c", "ulimit -s unlimited 2>/dev/null || ulimit -s 1048576 2>/dev/null; exec \"$0\" \"$@\"", program];
        wrapped.extend(args);
        let output = run_program(&self.prefix, "sh", &wrapped, None)?;
        Ok(output)
    }
}

fn run_program(prefix: &[String], program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, IptablesError> {
    let mut command = match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    };
    command
        .env("LC_ALL", "C")
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawned_program = prefix.first().cloned().unwrap_or_else(|| program.to_owned());
    let spawn_error = |source| IptablesError::Spawn { program: spawned_program.clone(), source };
    let mut child = command.spawn().map_err(spawn_error)?;
    let Some(input) = stdin else {
        return child.wait_with_output().map_err(spawn_error);
    };
    let mut pipe = child.stdin.take().expect("stdin is piped");
    // Feed the input from another thread: a large input does not fit in a pipe buffer, and
    // the program may answer on stderr before it has read everything.
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let _ = pipe.write_all(input.as_bytes());
        });
        child.wait_with_output().map_err(spawn_error)
    })
}

/// The input line an `iptables-restore` error names: `Error occurred at line: N`,
/// `line N failed` or `line N: ...`.
pub fn error_line(stderr: &str) -> Option<usize> {
    for marker in ["at line: ", "line "] {
        for (at, _) in stderr.match_indices(marker) {
            let digits: String = stderr[at + marker.len()..].chars().take_while(char::is_ascii_digit).collect();
            if let Ok(line) = digits.parse() {
                return Some(line);
            }
        }
    }
    None
}

/// Whether `iptables -S CHAIN` failed because the chain does not exist.
fn is_missing_chain(stderr: &str) -> bool {
    ["No chain/target/match by that name", "does not exist", "is incompatible"].iter().any(|m| stderr.contains(m))
}

fn stderr_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .filter(|line| !line.starts_with("# Warning:"))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

/// What a failed program said, or how it died when it said nothing.
fn failure_text(output: &Output) -> String {
    let text = stderr_text(output);
    if !text.is_empty() {
        return text;
    }
    use std::os::unix::process::ExitStatusExt;
    match output.status.signal() {
        Some(signal) => format!("killed by signal {signal}"),
        None => format!("exit status {}", output.status),
    }
}

impl Iptables for IptablesCli {
    fn restore(&mut self, family: Family, input: &RestoreTable) -> Result<(), IptablesError> {
        let program = self.variant.program(family, Tool::Restore);
        let mut text = input.render();
        if self.next_fault()? == Some(RestoreFault::Refused) {
            // Before the final COMMIT: the program refuses the table whole.
            if let Some(at) = text.rfind("COMMIT") {
                text.insert_str(at, &format!("-A {FAULT_CHAIN} -j ACCEPT\n"));
            }
        }
        let output = self.run(&program, &["--noflush", WAIT_SECONDS], Some(&text))?;
        if output.status.success() {
            return Ok(());
        }
        let message = stderr_text(&output);
        Err(IptablesError::Restore { line: error_line(&message), program, family, table: input.table, message })
    }

    fn save(&self, family: Family, table: Table) -> Result<String, IptablesError> {
        let program = self.variant.program(family, Tool::Save);
        let output = self.run_save(&program, &["-t", table.name()])?;
        if !output.status.success() {
            return Err(IptablesError::Read { program, family, table, message: failure_text(&output) });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn save_with_counters(&self, family: Family, table: Table) -> Result<String, IptablesError> {
        let program = self.variant.program(family, Tool::Save);
        let output = self.run_save(&program, &["-c", "-t", table.name()])?;
        if !output.status.success() {
            return Err(IptablesError::Read { program, family, table, message: failure_text(&output) });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn save_all(&self, family: Family) -> Result<String, IptablesError> {
        let program = self.variant.program(family, Tool::Save);
        let output = self.run_save(&program, &[])?;
        if !output.status.success() {
            return Err(IptablesError::Read { program, family, table: Table::Filter, message: failure_text(&output) });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn list_chain(&self, family: Family, table: Table, chain: &str) -> Result<Option<String>, IptablesError> {
        let program = self.variant.program(family, Tool::Iptables);
        let output = self.run(&program, &[WAIT_SECONDS, "-t", table.name(), "-S", chain], None)?;
        if output.status.success() {
            return Ok(Some(String::from_utf8_lossy(&output.stdout).into_owned()));
        }
        let message = stderr_text(&output);
        if is_missing_chain(&message) {
            return Ok(None);
        }
        Err(IptablesError::Read { program, family, table, message })
    }
}

/// What `auto` found on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    pub variant: Variant,
    pub reason: String,
}

/// The chains kubelet creates in the variant it uses (`KUBE-IPTABLES-HINT` is its explicit
/// hint; `KUBE-KUBELET-CANARY` its canary).
const HINT_CHAINS: &[&str] = &["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// What one variant holds on the node: whether kubelet's hint chains are there, and how
/// many rules in all.
fn census(prefix: &[String], variant: Variant) -> (bool, usize) {
    let mut hinted = false;
    let mut rules = 0;
    for family in [Family::V4, Family::V6] {
        let program = variant.program(family, Tool::Save);
        let Ok(output) = run_program(prefix, &program, &[], None) else { continue };
        if !output.status.success() {
            continue;
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let Ok(ruleset) = parse_save(&text) else { continue };
        if let Some(mangle) = ruleset.table(Table::Mangle) {
            hinted |= HINT_CHAINS.iter().any(|chain| mangle.has_chain(chain));
        }
        rules += ruleset.tables.iter().flat_map(|t| &t.chains).map(|c| c.rules.len()).sum::<usize>();
    }
    (hinted, rules)
}

/// Picks the variant the node already uses, as the iptables wrappers of Kubernetes
/// distributions do: kubelet's hint chains first, else whichever variant holds more rules,
/// else nft (the default of current distributions).
pub fn detect_variant(prefix: &[String]) -> Detection {
    let (legacy_hint, legacy_rules) = census(prefix, Variant::Legacy);
    let (nft_hint, nft_rules) = census(prefix, Variant::Nft);
    let (variant, reason) = match (legacy_hint, nft_hint) {
        (true, false) => (Variant::Legacy, "kubelet's hint chains are in the legacy tables".to_owned()),
        (false, true) => (Variant::Nft, "kubelet's hint chains are in the nft tables".to_owned()),
        _ if legacy_rules > nft_rules => {
            (Variant::Legacy, format!("the legacy tables hold {legacy_rules} rules, the nft ones {nft_rules}"))
        }
        _ if nft_rules > 0 => {
            (Variant::Nft, format!("the nft tables hold {nft_rules} rules, the legacy ones {legacy_rules}"))
        }
        _ => (Variant::Nft, "no rules in either variant; nft is the default".to_owned()),
    };
    Detection { variant, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_follow_family_and_variant() {
        assert_eq!(Variant::Legacy.program(Family::V4, Tool::Restore), "iptables-legacy-restore");
        assert_eq!(Variant::Nft.program(Family::V6, Tool::Save), "ip6tables-nft-save");
        assert_eq!(Variant::Nft.program(Family::V4, Tool::Iptables), "iptables-nft");
    }

    #[test]
    fn the_failing_line_is_read_from_either_variants_message() {
        assert_eq!(
            error_line("iptables-restore v1.8.9 (legacy): Couldn't load target `X'\n\nError occurred at line: 3"),
            Some(3)
        );
        assert_eq!(error_line("iptables-nft-restore: line 7 failed: Bad rule"), Some(7));
        assert_eq!(error_line("iptables-restore: line 4 failed"), Some(4));
        assert_eq!(error_line("line 12: RULE_APPEND failed (Invalid argument): rule in chain A"), Some(12));
        assert_eq!(error_line("something else"), None);
    }
}
