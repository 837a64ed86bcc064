//! Faults put in the netlink mechanism's way on purpose, so tests can watch what a proxy
//! does when its kernel path fails: the kernel refusing a transaction, the kernel's answers
//! lost (as when a receive buffer overflows with `ENOBUFS`), the socket gone. Where the
//! faults come from (a file a test writes) is the caller's business: a [`FaultSource`]
//! hands out one per transaction. Without one (the normal case) nothing here runs.

use std::io;

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
    /// The socket is closed before the batch is sent (the send fails with `EBADF`).
    SocketClosed,
}

impl Fault {
    /// The words [`Fault::parse`] knows.
    pub const NAMES: &'static str = "refused, answers-lost, socket-closed";

    pub fn parse(word: &str) -> Option<Fault> {
        match word {
            "refused" => Some(Fault::Refused),
            "answers-lost" => Some(Fault::AnswersLost),
            "socket-closed" => Some(Fault::SocketClosed),
            _ => None,
        }
    }
}

/// Hands out the fault for each transaction (`None`: no fault this time).
pub trait FaultSource: Send + std::fmt::Debug {
    fn next_fault(&mut self) -> io::Result<Option<Fault>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_has_a_word_and_other_words_are_none() {
        assert_eq!(Fault::parse("refused"), Some(Fault::Refused));
        assert_eq!(Fault::parse("answers-lost"), Some(Fault::AnswersLost));
        assert_eq!(Fault::parse("socket-closed"), Some(Fault::SocketClosed));
        assert_eq!(Fault::parse("explode"), None);
    }
}
