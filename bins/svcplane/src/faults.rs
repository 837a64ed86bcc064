//! `--inject-faults-from FILE` (tests only): the file faults are queued in, one per line,
//! each kernel transaction of the mode taking the first line and the file rewritten
//! without it; nftables mode (netlink) knows `refused`, `answers-lost` and `socket-closed`,
//! iptables mode `refused`. A missing or empty file injects nothing.

use std::io;
use std::path::{Path, PathBuf};

use svcplane_iptables::{RestoreFault, RestoreFaultSource};
use svcplane_nft::{Fault, FaultSource};

#[derive(Debug, Clone)]
pub struct FaultFile {
    path: PathBuf,
}

impl FaultFile {
    pub fn new(path: &Path) -> Self {
        FaultFile { path: path.to_owned() }
    }

    /// Takes the first queued line, if any.
    fn take_line(&self) -> io::Result<Option<String>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(io::Error::new(error.kind(), format!("reading {}: {error}", self.path.display())));
            }
        };
        let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
        let Some(first) = lines.next() else { return Ok(None) };
        let rest: Vec<&str> = lines.collect();
        let remaining = if rest.is_empty() { String::new() } else { rest.join("\n") + "\n" };
        std::fs::write(&self.path, remaining)
            .map_err(|error| io::Error::new(error.kind(), format!("rewriting {}: {error}", self.path.display())))?;
        Ok(Some(first.to_owned()))
    }

    fn unknown(&self, word: &str, choices: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {word:?} is not a fault this mode knows (one of: {choices})", self.path.display()),
        )
    }
}

impl FaultSource for FaultFile {
    fn next_fault(&mut self) -> io::Result<Option<Fault>> {
        match self.take_line()? {
            None => Ok(None),
            Some(word) => Fault::parse(&word).map(Some).ok_or_else(|| self.unknown(&word, Fault::NAMES)),
        }
    }
}

impl RestoreFaultSource for FaultFile {
    fn next_fault(&mut self) -> io::Result<Option<RestoreFault>> {
        match self.take_line()?.as_deref() {
            None => Ok(None),
            Some("refused") => Ok(Some(RestoreFault::Refused)),
            Some(word) => Err(self.unknown(word, "refused")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_transaction_takes_the_first_queued_fault_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        let mut file = FaultFile::new(&path);
        assert_eq!(FaultSource::next_fault(&mut file).unwrap(), None, "no file, no fault");
        std::fs::write(&path, "refused\n\nanswers-lost\nsocket-closed\nrefused\n").unwrap();
        assert_eq!(FaultSource::next_fault(&mut file).unwrap(), Some(Fault::Refused));
        assert_eq!(FaultSource::next_fault(&mut file).unwrap(), Some(Fault::AnswersLost));
        assert_eq!(FaultSource::next_fault(&mut file).unwrap(), Some(Fault::SocketClosed));
        assert_eq!(RestoreFaultSource::next_fault(&mut file).unwrap(), Some(RestoreFault::Refused));
        assert_eq!(FaultSource::next_fault(&mut file).unwrap(), None);
    }

    #[test]
    fn a_line_that_names_no_fault_of_the_mode_is_an_error_naming_the_file_and_the_choices() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        std::fs::write(&path, "answers-lost\n").unwrap();
        let error = RestoreFaultSource::next_fault(&mut FaultFile::new(&path)).unwrap_err().to_string();
        assert!(error.contains("faults") && error.contains("\"answers-lost\"") && error.contains("refused"), "{error}");
    }
}
