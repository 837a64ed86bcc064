//! Faults put in the netlink mechanism's way on purpose, so tests can watch what a proxy
//! does when its kernel path fails: the kernel refusing a transaction, the kernel's answers
//! lost (as when a receive buffer overflows with `ENOBUFS`), the socket gone.
//!
//! A fault file holds one fault per line; each transaction takes the first line and the
//! file is rewritten without it, so a test queues faults by writing the file and nothing
//! else is ever affected. Without a fault file (the normal case) nothing here runs.

use std::io;
use std::path::{Path, PathBuf};

/// What goes wrong with one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The batch reaches the kernel with one more message the kernel cannot apply (a chain
    /// deletion for a chain that does not exist), so the kernel itself aborts the whole
    /// transaction: nothing of it is applied.
    Refused,
    /// The batch is sent and applied, then its answers are thrown away unread, as a full
    /// receive buffer (`ENOBUFS`) would: the sender cannot know what happened.
    AnswersLost,
    /// The socket is replaced by a file that is no socket before the batch is sent (the
    /// send fails with `ENOTSOCK`), as if it had been closed under the mechanism.
    SocketClosed,
}

impl Fault {
    const NAMES: &'static str = "refused, answers-lost, socket-closed";

    fn parse(word: &str) -> Option<Fault> {
        match word {
            "refused" => Some(Fault::Refused),
            "answers-lost" => Some(Fault::AnswersLost),
            "socket-closed" => Some(Fault::SocketClosed),
            _ => None,
        }
    }
}

/// The file faults are queued in.
#[derive(Debug, Clone)]
pub(super) struct FaultFile {
    path: PathBuf,
}

impl FaultFile {
    pub(super) fn new(path: &Path) -> Self {
        FaultFile { path: path.to_owned() }
    }

    /// Takes the fault queued first, if any. A missing or empty file queues none; a line
    /// that names no fault is an error naming the file, the line and the faults there are.
    pub(super) fn take(&self) -> io::Result<Option<Fault>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(io::Error::new(error.kind(), format!("reading {}: {error}", self.path.display())));
            }
        };
        let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
        let Some(first) = lines.next() else { return Ok(None) };
        let fault = Fault::parse(first).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {first:?} is not a fault (one of: {})", self.path.display(), Fault::NAMES),
            )
        })?;
        let rest: Vec<&str> = lines.collect();
        let remaining = if rest.is_empty() { String::new() } else { rest.join("\n") + "\n" };
        std::fs::write(&self.path, remaining)
            .map_err(|error| io::Error::new(error.kind(), format!("rewriting {}: {error}", self.path.display())))?;
        Ok(Some(fault))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_transaction_takes_the_first_queued_fault_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        let file = FaultFile::new(&path);
        assert_eq!(file.take().unwrap(), None, "no file, no fault");
        std::fs::write(&path, "refused\n\nanswers-lost\nsocket-closed\n").unwrap();
        assert_eq!(file.take().unwrap(), Some(Fault::Refused));
        assert_eq!(file.take().unwrap(), Some(Fault::AnswersLost));
        assert_eq!(file.take().unwrap(), Some(Fault::SocketClosed));
        assert_eq!(file.take().unwrap(), None);
    }

    #[test]
    fn a_line_that_names_no_fault_is_an_error_naming_the_file_and_the_choices() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        std::fs::write(&path, "explode\n").unwrap();
        let error = FaultFile::new(&path).take().unwrap_err().to_string();
        assert!(error.contains("faults") && error.contains("\"explode\"") && error.contains("answers-lost"), "{error}");
    }
}
