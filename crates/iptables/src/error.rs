//! One error type for every mechanism, named after the operation that failed. The fake
//! returns the same variants as the real programs for the same mistakes.

use crate::model::{Family, Table};

#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// `iptables-restore` refused the input; nothing of it was applied.
    #[error("{program} into table {table} refused the input{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Restore {
        program: String,
        family: Family,
        table: Table,
        /// The input line it named (1-based, `*table` is line 1).
        line: Option<usize>,
        message: String,
    },
    /// Reading the ruleset back (`iptables-save`, `iptables -S`) failed.
    #[error("{program} -t {table} failed: {message}")]
    Read { program: String, family: Family, table: Table, message: String },
    /// The program could not be started at all.
    #[error("starting {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// Text that should be `iptables-save` output was not.
    #[error("reading iptables-save output, line {line}: {message}")]
    Parse { line: usize, message: String },
}

impl IptablesError {
    /// Whether the program itself is missing (no iptables on this node).
    pub fn is_program_missing(&self) -> bool {
        matches!(self, IptablesError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// The restore input line the error names, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            IptablesError::Restore { line, .. } => *line,
            IptablesError::Parse { line, .. } => Some(*line),
            _ => None,
        }
    }
}
