//! Applies transactions by talking nf_tables netlink directly: one persistent
//! `NETLINK_NETFILTER` socket, one batch (`NFNL_MSG_BATCH_BEGIN` ... `NFNL_MSG_BATCH_END`) per
//! transaction, which the kernel commits atomically or not at all.
//!
//! This is the fast mechanism: no process to start, no text to parse, no cache to fetch.
//! Encoding costs microseconds for a small change and tens of milliseconds for a table of
//! 10,000 services; the rest is the kernel's own work. (Note for table design: the kernel
//! re-validates every chain a base chain reaches whenever a transaction adds a jump, goto,
//! DNAT, masquerade, reject or fib rule or a verdict map element, which at 10,000 services
//! costs it tens of milliseconds; transactions that only add or delete other elements, or
//! flush chains, stay well under a millisecond.)
//!
//! The messages are those nft 1.0.6 sends for the script [`text`] renders
//! for the same transaction (same expressions, registers, set flags, interval elements and
//! the user data nft keeps for listing), so a table built here lists exactly as one built by
//! [`NftCli`](crate::NftCli), down to the bytes `nft --debug=netlink list table` shows; the
//! real-kernel tests check that they do.
//!
//! The kernel handles a batch while `sendmsg` runs, so its answers are all queued when the
//! send returns. Only the batch end asks for an ack (kernel 6.10 on sends it once the batch
//! is committed); errors come whether asked for or not. An ack for every message would
//! queue one per message, 220,000 for a cold load at 10,000 services, more than any
//! receive buffer holds.
//!
//! Errors: each error names the sequence number of the message at fault, which leads back
//! to the operation, and (with extended acks) the attribute at fault, which tells a missing
//! table from a missing chain, set or jump target. What nft itself would refuse before
//! sending anything (names, comments, mistyped rules and elements) is refused here the same
//! way, before sending anything. Either way the error has the [`ErrorKind`](crate::ErrorKind),
//! and the variant, the CLI gives for the same mistake.
//!
//! To encode elements and check lookups, the mechanism needs the type of each set it meets.
//! It remembers the sets of the transactions it applied, and asks the kernel for one
//! (`NFT_MSG_GETSET`, one set without its elements) the first time it meets a set it did not
//! create; and, as nft does, whether an interval set it has not filled itself holds
//! elements (nft starts filling an empty interval set with an interval end at zero). It
//! never lists a table. It assumes it is the only writer of its tables: a set deleted and
//! made again with another type behind its back is met with the type it remembers (the
//! kernel then refuses elements of the wrong length).

mod encode;
mod faults;
mod socket;
mod wire;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::time::Duration;

use crate::Nftables;
use crate::error::{NftError, ObjectKind};
use crate::objects::{
    DataType, Element, ElementValue, Family, Operation, Set, Statement, TableName, Transaction, Verdict,
};
use crate::{text, validation};

use encode::{Batch, Catalog, KnownSet};
pub use faults::{Fault, FaultSource};
use socket::NetlinkSocket;
use wire::*;

/// nf_tables over a netlink socket, as a mechanism.
#[derive(Debug)]
pub struct NftNetlink {
    socket: NetlinkSocket,
    /// The network namespace the socket talks to, for opening it again.
    namespace: Option<File>,
    /// The socket failed (an error of its own, not the kernel refusing a batch): nothing it
    /// holds can be trusted (answers of an unknown batch may still be queued), so the next
    /// request opens a fresh one first.
    socket_failed: bool,
    seq: u32,
    /// Per table, the sets this mechanism created or asked the kernel about.
    sets: HashMap<TableName, HashMap<String, KnownSet>>,
    /// Faults to inject, for tests (see [`NftNetlink::with_faults`]).
    faults: Option<Box<dyn FaultSource>>,
}

impl NftNetlink {
    /// Opens a socket in the calling thread's network namespace. Needs CAP_NET_ADMIN there.
    pub fn new() -> Result<Self, NftError> {
        let socket = NetlinkSocket::open().map_err(socket_error)?;
        // Where this thread is now is where a socket opened again must talk to, whichever
        // thread opens it. Without /proc, a new socket opens wherever its opener is.
        let namespace = File::open("/proc/thread-self/ns/net").ok();
        Ok(Self::with_socket(socket, namespace))
    }

    /// Opens a socket in the network namespace `ip netns` knows as `namespace` (under
    /// `/run/netns`). The socket keeps talking to that namespace, whichever thread uses it.
    pub fn in_network_namespace(namespace: &str) -> Result<Self, NftError> {
        let (socket, namespace) = NetlinkSocket::open_in_namespace(namespace).map_err(socket_error)?;
        Ok(Self::with_socket(socket, Some(namespace)))
    }

    /// Injects the faults `source` hands out, one per transaction, for tests of what
    /// happens when the kernel path fails.
    pub fn with_faults(mut self, source: Box<dyn FaultSource>) -> Self {
        self.faults = Some(source);
        self
    }

    fn with_socket(socket: NetlinkSocket, namespace: Option<File>) -> Self {
        // Any start will do; the kernel only echoes it. The time makes two processes' numbers
        // differ, which helps anyone reading a netlink trace.
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |since| since.as_secs() as u32);
        NftNetlink { socket, namespace, socket_failed: false, seq, sets: HashMap::new(), faults: None }
    }

    /// Opens a fresh socket if the last one failed, forgetting the sets it learned (a batch
    /// whose outcome is unknown may have changed them).
    fn ready_socket(&mut self) -> Result<(), NftError> {
        if !self.socket_failed {
            return Ok(());
        }
        let fresh = match &self.namespace {
            Some(namespace) => NetlinkSocket::open_in(namespace),
            None => NetlinkSocket::open(),
        };
        self.socket =
            fresh.map_err(|error| socket_error(io::Error::new(error.kind(), format!("opening it again: {error}"))))?;
        self.sets.clear();
        self.socket_failed = false;
        Ok(())
    }

    /// Notes a failure of the socket itself, so the next request starts on a fresh one.
    fn note<T>(&mut self, result: Result<T, NftError>) -> Result<T, NftError> {
        if let Err(NftError::Spawn { .. }) = &result {
            self.socket_failed = true;
        }
        result
    }

    fn next_seqs(&mut self, count: usize) -> u32 {
        let first = self.seq;
        self.seq = self.seq.wrapping_add(count as u32);
        first
    }

    /// Sends a batch and waits for its outcome: the first error the kernel reports, if any.
    fn run(&mut self, batch: &Batch) -> Result<Option<Ack>, NftError> {
        self.socket.send(&batch.writer.buf).map_err(socket_error)?;
        let mut first_error: Option<Ack> = None;
        let overflowed = self
            .socket
            .drain((batch.first_seq, batch.last_seq()), &mut |ack| {
                // Errors arrive in the order of the messages; the first one caused the rest.
                if ack.errno != 0 && first_error.is_none() {
                    first_error = Some(ack);
                }
            })
            .map_err(socket_error)?;
        if overflowed && first_error.is_none() {
            // Only errors can fill the buffer, and then the first of them is in it; seeing
            // none means answers went missing, so nobody can tell what happened.
            return Err(socket_error(io::Error::other(
                "the kernel's answers to a batch were lost (receive buffer full)",
            )));
        }
        Ok(first_error)
    }
}

/// The kernel, asked about one table's sets while a transaction is encoded.
struct Queries<'a> {
    socket: &'a mut NetlinkSocket,
    seq: &'a mut u32,
    table: &'a TableName,
}

impl Queries<'_> {
    fn request(&mut self, request: impl FnOnce(u32) -> Vec<u8>) -> Result<(Vec<Vec<u8>>, Ack), NftError> {
        let seq = *self.seq;
        *self.seq = seq.wrapping_add(1);
        self.socket.request(&request(seq), seq).map_err(socket_error)
    }

    fn refused(&self, ack: &Ack) -> NftError {
        NftError::Apply { table: self.table.clone(), message: describe(ack.errno, &ack.message) }
    }
}

impl encode::Kernel for Queries<'_> {
    fn set(&mut self, name: &str) -> Result<Option<Set>, NftError> {
        let table = self.table;
        let (replies, ack) = self.request(|seq| encode::get_set_request(table, name, seq))?;
        match ack.errno {
            // A set of types this crate does not know passes as unknown: its elements go as
            // they are, and the kernel judges their lengths.
            0 => Ok(replies.iter().find_map(|reply| parse_set(reply, name))),
            libc::ENOENT => Ok(None),
            _ => Err(self.refused(&ack)),
        }
    }

    fn has_elements(&mut self, name: &str) -> Result<bool, NftError> {
        let table = self.table;
        let (replies, ack) = self.request(|seq| encode::get_elements_request(table, name, seq))?;
        match ack.errno {
            0 => Ok(replies.iter().any(|reply| encode::holds_element(reply))),
            libc::ENOENT => Ok(false),
            _ => Err(self.refused(&ack)),
        }
    }
}

impl Nftables for NftNetlink {
    fn apply(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        validation::check_transaction(transaction)?;
        if transaction.operations.is_empty() {
            return Ok(());
        }
        self.ready_socket()?;
        let fault = match &mut self.faults {
            Some(faults) => faults.next_fault().map_err(socket_error)?,
            None => None,
        };
        let result = match fault {
            None => self.apply_now(transaction),
            Some(Fault::Refused) => {
                // The kernel aborts the whole batch at the message it cannot apply.
                let mut doomed = transaction.clone();
                doomed.operations.push(Operation::DeleteChain(FAULT_CHAIN.to_owned()));
                self.apply_now(&doomed)
            }
            Some(Fault::AnswersLost) => self.apply_now(transaction).and_then(|()| {
                Err(socket_error(io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    "the kernel's answers to a batch were lost (ENOBUFS, injected fault)",
                )))
            }),
            Some(Fault::SocketClosed) => {
                self.socket.close();
                self.apply_now(transaction)
            }
        };
        self.note(result)
    }

    fn delete_table(&mut self, table: &TableName) -> Result<bool, NftError> {
        self.ready_socket()?;
        let result = self.delete_table_now(table);
        self.note(result)
    }

    fn count_rules(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        validation::check_name(ObjectKind::Table, &table.name)?;
        validation::check_name(ObjectKind::Chain, chain)?;
        self.ready_socket()?;
        let result = self.count_rules_of(table, chain);
        self.note(result)
    }

    fn holds_element(&mut self, table: &TableName, set: &Set, element: &Element) -> Result<Option<bool>, NftError> {
        validation::check_name(ObjectKind::Table, &table.name)?;
        validation::check_name(ObjectKind::Set, &set.name)?;
        self.ready_socket()?;
        let wanted = encode::element_key(set, &element.key);
        let seq = self.next_seqs(1);
        let request = encode::get_elements_request(table, &set.name, seq);
        let result = match self.socket.request(&request, seq).map_err(socket_error) {
            Ok((replies, ack)) => match ack.errno {
                0 => Ok(Some(replies.iter().any(|reply| encode::holds_key(reply, &wanted)))),
                libc::ENOENT => Ok(Some(false)),
                errno => Err(NftError::Apply { table: table.clone(), message: describe(errno, &ack.message) }),
            },
            Err(error) => Err(error),
        };
        self.note(result)
    }

    fn list_tables(&mut self, family: Family) -> Result<Vec<String>, NftError> {
        self.ready_socket()?;
        let seq = self.next_seqs(1);
        let request = encode::get_tables_request(family, seq);
        let result = match self.socket.request(&request, seq).map_err(socket_error) {
            Ok((replies, ack)) if ack.errno == 0 => {
                Ok(replies.iter().filter_map(|reply| encode::table_name_of(reply)).collect())
            }
            Ok((_, ack)) => {
                Err(NftError::Apply { table: TableName::new(family, "*"), message: describe(ack.errno, &ack.message) })
            }
            Err(error) => Err(error),
        };
        self.note(result)
    }
}

/// The chain an injected `refused` fault deletes: it never exists, so the kernel refuses.
const FAULT_CHAIN: &str = "svcplane-fault-injected";

impl NftNetlink {
    fn apply_now(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        let table = &transaction.table;
        let no_sets = HashMap::new();
        // Sequence numbers: the batch's, then as many more as set queries need.
        let first_seq = self.next_seqs(encode::message_count(&transaction.operations));
        let mut queries = Queries { socket: &mut self.socket, seq: &mut self.seq, table };
        let mut catalog = Catalog {
            known: self.sets.get(table).unwrap_or(&no_sets),
            changes: HashMap::new(),
            table_gone: false,
            kernel: &mut queries,
        };
        let batch = encode::encode(table, &transaction.operations, first_seq, &mut catalog)?;
        let Catalog { changes, table_gone, .. } = catalog;
        if let Some(ack) = self.run(&batch)? {
            return Err(classify(transaction, &batch, &ack));
        }
        let cache = self.sets.entry(table.clone()).or_default();
        if table_gone {
            cache.clear();
        }
        for (name, set) in changes {
            match set {
                Some(set) => cache.insert(name, set),
                None => cache.remove(&name),
            };
        }
        Ok(())
    }

    fn delete_table_now(&mut self, table: &TableName) -> Result<bool, NftError> {
        validation::check_name(ObjectKind::Table, &table.name)?;
        self.sets.remove(table);
        let first_seq = self.next_seqs(3);
        let batch = encode::encode_delete_table(table, first_seq);
        match self.run(&batch)? {
            None => Ok(true),
            Some(ack) if ack.errno == libc::ENOENT => Ok(false),
            Some(ack) => Err(NftError::Apply { table: table.clone(), message: describe(ack.errno, &ack.message) }),
        }
    }

    fn count_rules_of(&mut self, table: &TableName, chain: &str) -> Result<usize, NftError> {
        let seq = self.next_seqs(1);
        let request = encode::get_rules_request(table, chain, seq);
        let (replies, ack) = self.socket.request(&request, seq).map_err(socket_error)?;
        match ack.errno {
            0 => Ok(replies.len()),
            libc::ENOENT => Ok(0),
            errno => Err(NftError::Apply { table: table.clone(), message: describe(errno, &ack.message) }),
        }
    }
}

/// One message of a buffer received from the kernel, as the receive paths read it.
#[derive(Debug, Clone)]
pub enum KernelReply {
    /// An `NLMSG_ERROR`: an ack (`errno` 0) or an error for the message numbered `seq`, with
    /// the extended ack's attribute offset and text when given.
    Ack { errno: i32, seq: u32, bad_attr_offset: Option<u32>, message: Option<String> },
    /// An `NLMSG_ERROR` too short to say which message it answers.
    TruncatedAck,
    /// An `NLMSG_DONE`, ending a dump.
    Done { errno: i32 },
    /// Any other message: what the set query and the element query make of it (the set's
    /// definition, if its types are ones this crate knows; whether it holds an element
    /// other than an interval end).
    Object { msg_type: u16, seq: u32, set: Option<Set>, holds_element: bool },
}

/// Decodes a buffer of back-to-back netlink messages the way [`NftNetlink`] reads the
/// kernel's answers, with the same decoders, down to the error text it would report. Bytes
/// the kernel would never send are cut short or ignored, never a panic: the fuzz target
/// `netlink_replies` checks that on arbitrary input.
pub fn decode_kernel_replies(buf: &[u8]) -> Vec<KernelReply> {
    messages(buf)
        .map(|message| match message.msg_type {
            NLMSG_ERROR => match parse_ack(&message) {
                Some(ack) => {
                    // The text an error becomes, as `classify` and `refused` build it.
                    let _ = describe(ack.errno, &ack.message);
                    KernelReply::Ack {
                        errno: ack.errno,
                        seq: ack.seq,
                        bad_attr_offset: ack.bad_attr_offset,
                        message: ack.message,
                    }
                }
                None => KernelReply::TruncatedAck,
            },
            NLMSG_DONE => KernelReply::Done { errno: parse_done(&message).errno },
            msg_type => KernelReply::Object {
                msg_type,
                seq: message.seq,
                set: parse_set(message.payload, "set"),
                holds_element: encode::holds_element(message.payload),
            },
        })
        .collect()
}

fn socket_error(source: io::Error) -> NftError {
    NftError::Spawn { program: "the nf_tables netlink socket".to_owned(), source }
}

/// `strerror`, and what the kernel said in words if it did.
fn describe(errno: i32, message: &Option<String>) -> String {
    let error = io::Error::from_raw_os_error(errno);
    match message {
        Some(message) => format!("{error}: {message}"),
        None => error.to_string(),
    }
}

/// A set's definition from the kernel's `NFT_MSG_NEWSET` answer, if its types are ones this
/// crate knows.
fn parse_set(payload: &[u8], name: &str) -> Option<Set> {
    let (mut flags, mut key_type, mut data_type, mut timeout) = (0, None, None, None);
    for attr in message_attrs(payload) {
        match attr.attr_type {
            NFTA_SET_FLAGS => flags = attr.be_u32()?,
            NFTA_SET_KEY_TYPE => key_type = attr.be_u32(),
            NFTA_SET_DATA_TYPE => data_type = attr.be_u32(),
            NFTA_SET_TIMEOUT => timeout = attr.be_u64(),
            _ => {}
        }
    }
    let value = match (flags & NFT_SET_MAP != 0, data_type) {
        (false, _) => None,
        (true, Some(NFT_DATA_VERDICT)) => Some(vec![DataType::Verdict]),
        (true, Some(data_type)) => Some(encode::types_of(data_type)?),
        (true, None) => return None,
    };
    Some(Set {
        name: name.to_owned(),
        key: encode::types_of(key_type?)?,
        value,
        interval: flags & NFT_SET_INTERVAL != 0,
        dynamic_timeout: (flags & NFT_SET_TIMEOUT != 0).then(|| Duration::from_millis(timeout.unwrap_or(0))),
        comment: None,
    })
}

/// Which part of a message an extended ack points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Table,
    /// The chain or set the message names (for a rule: its chain; for elements: their set).
    Object,
    /// The n-th expression of a rule.
    Expression(usize),
    /// The elements of an element list.
    Elements,
    Unknown,
}

fn locate(message: &[u8], offset: u32) -> Part {
    let msg_type = u16::from_ne_bytes([message[4], message[5]]) & 0xff;
    let offset = offset as usize;
    let Some(attr) = message_attrs(&message[16..]).find(|attr| (attr.offset..attr.offset + attr.len).contains(&offset))
    else {
        return Part::Unknown;
    };
    match (msg_type, attr.attr_type) {
        (NFT_MSG_NEWTABLE | NFT_MSG_DELTABLE, NFTA_TABLE_NAME) => Part::Table,
        (NFT_MSG_NEWRULE | NFT_MSG_DELRULE, NFTA_RULE_TABLE) => Part::Table,
        (NFT_MSG_NEWRULE | NFT_MSG_DELRULE, NFTA_RULE_CHAIN) => Part::Object,
        (NFT_MSG_NEWRULE, NFTA_RULE_EXPRESSIONS) => attrs(attr.data, attr.offset + 4)
            .position(|expression| (expression.offset..expression.offset + expression.len).contains(&offset))
            .map_or(Part::Unknown, Part::Expression),
        (NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN, NFTA_CHAIN_TABLE) => Part::Table,
        (NFT_MSG_NEWCHAIN | NFT_MSG_DELCHAIN, NFTA_CHAIN_NAME) => Part::Object,
        (NFT_MSG_NEWSET | NFT_MSG_DELSET, NFTA_SET_TABLE) => Part::Table,
        (NFT_MSG_NEWSET | NFT_MSG_DELSET, NFTA_SET_NAME) => Part::Object,
        (NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM, NFTA_SET_ELEM_LIST_TABLE) => Part::Table,
        (NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM, NFTA_SET_ELEM_LIST_SET | NFTA_SET_ELEM_LIST_SET_ID) => Part::Object,
        (NFT_MSG_NEWSETELEM | NFT_MSG_DELSETELEM, NFTA_SET_ELEM_LIST_ELEMENTS) => Part::Elements,
        _ => Part::Unknown,
    }
}

/// Turns the kernel's first error for a batch into the error the CLI and the fake give for
/// the same mistake.
fn classify(transaction: &Transaction, batch: &Batch, ack: &Ack) -> NftError {
    let table = &transaction.table;
    let errno = ack.errno;
    let refused = || NftError::Apply { table: table.clone(), message: describe(errno, &ack.message) };
    let reason = || describe(errno, &ack.message);
    let Some((Some(index), message)) = batch.message(ack.seq) else {
        // The batch itself: its commit failed.
        return refused();
    };
    let Some(operation) = transaction.operations.get(index) else { return refused() };
    let msg_type = u16::from_ne_bytes([message[4], message[5]]) & 0xff;
    let part = ack.bad_attr_offset.map_or(Part::Unknown, |offset| locate(message, offset));
    let owned = |name: &str| name.to_owned();
    let table_missing = || NftError::NotFound { kind: ObjectKind::Table, name: table.to_string() };
    const ENOENT: i32 = libc::ENOENT;
    const EEXIST: i32 = libc::EEXIST;
    const EBUSY: i32 = libc::EBUSY;
    // What the kernel says when a base chain would reach a statement its hook cannot run,
    // a jump loop, or jumps nested too deep.
    let unsuitable = matches!(errno, libc::EOPNOTSUPP | libc::EMLINK | libc::ELOOP);
    let invalid = matches!(errno, libc::EINVAL | libc::ERANGE | libc::EOVERFLOW | libc::E2BIG);
    if errno == ENOENT && part == Part::Table {
        return table_missing();
    }
    match operation {
        Operation::AddTable { .. } | Operation::DeleteTable if errno == ENOENT => table_missing(),
        Operation::AddChain(chain) => match errno {
            ENOENT => table_missing(),
            _ if errno == EEXIST || errno == EBUSY || errno == libc::EOPNOTSUPP => {
                NftError::Exists { kind: ObjectKind::Chain, name: owned(&chain.name) }
            }
            _ if invalid => NftError::InvalidChain { chain: owned(&chain.name), reason: reason() },
            _ => refused(),
        },
        Operation::FlushChain(name) | Operation::DeleteChain(name) if errno == ENOENT => {
            NftError::NotFound { kind: ObjectKind::Chain, name: owned(name) }
        }
        Operation::DeleteChain(name) if errno == EBUSY => {
            NftError::InUse { kind: ObjectKind::Chain, name: owned(name) }
        }
        Operation::AddRule(rule) if errno == ENOENT => {
            // The anonymous sets of a rule come before it; they only refer to the table.
            if msg_type != NFT_MSG_NEWRULE {
                return table_missing();
            }
            let statement = match part {
                Part::Expression(expression) => {
                    let counts = encode::expression_counts(table.family, rule);
                    let mut seen = 0;
                    counts.iter().position(|count| {
                        seen += count;
                        expression < seen
                    })
                }
                _ => None,
            };
            match statement.map(|index| &rule.statements[index]) {
                Some(Statement::Verdict(Verdict::Jump(target) | Verdict::Goto(target))) => {
                    NftError::InvalidReference { from: owned(&rule.chain), target: owned(target) }
                }
                Some(
                    Statement::Match(crate::Match::InSet { set, .. })
                    | Statement::VerdictMap { map: set, .. }
                    | Statement::UpdateSet { set, .. },
                ) => NftError::NotFound { kind: ObjectKind::Set, name: owned(set) },
                Some(_) => refused(),
                None => NftError::NotFound { kind: ObjectKind::Chain, name: owned(&rule.chain) },
            }
        }
        Operation::AddRule(rule) if unsuitable || invalid => {
            NftError::InvalidRule { chain: owned(&rule.chain), reason: reason() }
        }
        Operation::AddSet(set) => match errno {
            ENOENT => table_missing(),
            EEXIST | EBUSY => NftError::Exists { kind: ObjectKind::Set, name: owned(&set.name) },
            _ if invalid || errno == libc::EOPNOTSUPP => {
                NftError::InvalidSet { set: owned(&set.name), reason: reason() }
            }
            _ => refused(),
        },
        Operation::FlushSet(name) | Operation::DeleteSet(name) if errno == ENOENT => {
            NftError::NotFound { kind: ObjectKind::Set, name: owned(name) }
        }
        Operation::DeleteSet(name) if errno == EBUSY => NftError::InUse { kind: ObjectKind::Set, name: owned(name) },
        Operation::AddElement(element) => {
            let target = element.value.as_ref().and_then(ElementValue::target);
            match errno {
                ENOENT if part == Part::Elements => match target {
                    Some(target) => NftError::InvalidReference { from: owned(&element.set), target: owned(target) },
                    None => refused(),
                },
                ENOENT => NftError::NotFound { kind: ObjectKind::Set, name: owned(&element.set) },
                EEXIST | EBUSY => NftError::Exists { kind: ObjectKind::Element, name: text::key_text(&element.key) },
                _ if unsuitable && target.is_some() => {
                    NftError::InvalidRule { chain: owned(target.unwrap_or_default()), reason: reason() }
                }
                _ if invalid => NftError::InvalidElement { set: owned(&element.set), reason: reason() },
                _ => refused(),
            }
        }
        Operation::DeleteElement(element) => match errno {
            ENOENT if part == Part::Elements || part == Part::Unknown => {
                NftError::NotFound { kind: ObjectKind::Element, name: text::key_text(&element.key) }
            }
            ENOENT => NftError::NotFound { kind: ObjectKind::Set, name: owned(&element.set) },
            _ if invalid => NftError::InvalidElement { set: owned(&element.set), reason: reason() },
            _ => refused(),
        },
        _ => refused(),
    }
}
