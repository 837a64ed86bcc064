//! Turns a [`Transaction`](crate::Transaction) into one nf_tables netlink batch, expression for expression what
//! nft 1.0.6 sends for the same script (checked against `nft --debug=netlink` and the raw
//! messages nft writes), so that the kernel ends up holding exactly what the CLI would
//! have put there and `nft list` shows the same.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::wire::*;
use crate::error::NftError;
use crate::objects::{
    ChainType, CmpOp, DataType, Element, ElementValue, Expr, Family, FibAddress, Hook, Match, Operation, RejectKind,
    Rule, Set, Statement, TableName, Value, Verdict,
};
use crate::validation;

/// What the encoder knows of a set that exists (or will, at this point of the transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KnownSet {
    pub(super) set: Set,
    pub(super) fill: Fill,
}

/// Whether an interval set holds elements, as far as this process knows. nft adds an
/// "interval end at zero" element when it fills an empty interval set; the encoder does the
/// same so that the kernel holds what nft would have given it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fill {
    Empty,
    NonEmpty,
    Unknown,
}

/// What the encoder may ask the kernel about the table's sets.
pub(super) trait Kernel {
    /// The definition of a set, `None` if it (or the table) does not exist.
    fn set(&mut self, name: &str) -> Result<Option<Set>, NftError>;
    /// Whether an existing set holds an element (interval ends aside).
    fn has_elements(&mut self, name: &str) -> Result<bool, NftError>;
}

/// The sets of one table as a transaction goes along: what was known before it, the changes
/// its operations made so far, and what the kernel says of sets never seen.
pub(super) struct Catalog<'a> {
    /// What was known before the transaction (only read: a small change to a large table
    /// copies nothing but the sets it touches).
    pub(super) known: &'a HashMap<String, KnownSet>,
    /// Sets the transaction touched, `None` for those that do not exist (any more).
    pub(super) changes: HashMap<String, Option<KnownSet>>,
    /// The table was deleted earlier in this transaction: sets not defined since do not exist.
    pub(super) table_gone: bool,
    pub(super) kernel: &'a mut dyn Kernel,
}

impl Catalog<'_> {
    fn get(&mut self, name: &str) -> Result<Option<&mut KnownSet>, NftError> {
        if !self.changes.contains_key(name) {
            let known = if self.table_gone {
                None
            } else if let Some(known) = self.known.get(name) {
                Some(known.clone())
            } else {
                self.kernel.set(name)?.map(|set| KnownSet { set, fill: Fill::Unknown })
            };
            self.changes.insert(name.to_owned(), known);
        }
        Ok(self.changes.get_mut(name).and_then(Option::as_mut))
    }

    /// Whether the set exists, as far as known without asking the kernel.
    fn exists(&self, name: &str) -> Option<bool> {
        match self.changes.get(name) {
            Some(known) => Some(known.is_some()),
            None if self.table_gone => Some(false),
            None => self.known.contains_key(name).then_some(true),
        }
    }
}

/// The batch being built, and which operation each of its messages came from.
pub(super) struct Batch {
    pub(super) writer: Writer,
    /// Sequence number of the first message (the batch begin).
    pub(super) first_seq: u32,
    /// For each message, by `seq - first_seq`: its offset in the buffer and the index of the
    /// operation it came from (`u32::MAX` for the batch delimiters).
    pub(super) origins: Vec<(u32, u32)>,
}

impl Batch {
    /// The operation and the bytes of the message with this sequence number.
    pub(super) fn message(&self, seq: u32) -> Option<(Option<usize>, &[u8])> {
        let index = seq.wrapping_sub(self.first_seq) as usize;
        let (offset, operation) = *self.origins.get(index)?;
        let end = self.origins.get(index + 1).map_or(self.writer.buf.len(), |(next, _)| *next as usize);
        let operation = (operation != u32::MAX).then_some(operation as usize);
        Some((operation, &self.writer.buf[offset as usize..end]))
    }

    pub(super) fn last_seq(&self) -> u32 {
        self.first_seq.wrapping_add(self.origins.len() as u32).wrapping_sub(1)
    }
}

/// Encodes `operations` on `table` into one batch whose first sequence number is `first_seq`.
/// Fails (before anything reaches the kernel) on what nft would refuse while evaluating a
/// script: elements or lookups that do not fit their set's type.
pub(super) fn encode(
    table: &TableName,
    operations: &[Operation],
    first_seq: u32,
    catalog: &mut Catalog<'_>,
) -> Result<Batch, NftError> {
    let mut encoder = Encoder {
        family: table.family,
        nfproto: nfproto(table.family),
        table: &table.name,
        batch: Batch { writer: Writer::with_capacity(operations.len() * 160 + 64), first_seq, origins: Vec::new() },
        set_ids: HashMap::new(),
        next_set_id: 1,
        operation: u32::MAX,
    };
    encoder.delimiter(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST);
    for (index, operation) in operations.iter().enumerate() {
        encoder.operation = index as u32;
        encoder.encode(operation, catalog)?;
    }
    encoder.operation = u32::MAX;
    // The kernel (6.10 on) acknowledges the end of a batch once it is committed.
    encoder.delimiter(NFNL_MSG_BATCH_END, NLM_F_REQUEST | NLM_F_ACK);
    Ok(encoder.batch)
}

/// How many messages the batch for `operations` holds, at most.
pub(super) fn message_count(operations: &[Operation]) -> usize {
    let anonymous_sets = |rule: &Rule| {
        rule.statements
            .iter()
            .filter(|statement| {
                matches!(statement, Statement::Match(Match::InPrefixes { prefixes, .. }) if prefixes.len() > 1)
            })
            .count()
    };
    let messages: usize = operations
        .iter()
        .map(|operation| match operation {
            Operation::AddRule(rule) => 1 + 2 * anonymous_sets(rule),
            _ => 1,
        })
        .sum();
    messages + 2
}

/// The messages of a `delete table` batch.
pub(super) fn encode_delete_table(table: &TableName, first_seq: u32) -> Batch {
    struct Nothing;
    impl Kernel for Nothing {
        fn set(&mut self, _: &str) -> Result<Option<Set>, NftError> {
            Ok(None)
        }
        fn has_elements(&mut self, _: &str) -> Result<bool, NftError> {
            Ok(false)
        }
    }
    let known = HashMap::new();
    let mut catalog = Catalog { known: &known, changes: HashMap::new(), table_gone: true, kernel: &mut Nothing };
    encode(table, &[Operation::DeleteTable], first_seq, &mut catalog).expect("deleting a table always encodes")
}

/// A dump request for the elements of one set.
pub(super) fn get_elements_request(table: &TableName, set: &str, seq: u32) -> Vec<u8> {
    let mut writer = Writer::default();
    let start =
        writer.begin_message(msg_type(NFT_MSG_GETSETELEM), NLM_F_REQUEST | NLM_F_DUMP, seq, nfproto(table.family), 0);
    writer.string(NFTA_SET_ELEM_LIST_TABLE, &table.name);
    writer.string(NFTA_SET_ELEM_LIST_SET, set);
    writer.end_message(start);
    writer.buf
}

/// Whether a `NFT_MSG_NEWSETELEM` message of a dump holds an element that is not an interval end.
pub(super) fn holds_element(payload: &[u8]) -> bool {
    message_attrs(payload).filter(|attr| attr.attr_type == NFTA_SET_ELEM_LIST_ELEMENTS).any(|list| {
        attrs(list.data, 0).any(|element| {
            let flags = attrs(element.data, 0).find(|attr| attr.attr_type == NFTA_SET_ELEM_FLAGS);
            flags.and_then(|flags| flags.be_u32()).unwrap_or(0) & NFT_SET_ELEM_INTERVAL_END == 0
        })
    })
}

/// The key of an element of `set` (a set without intervals) as the kernel stores it.
pub(super) fn element_key(set: &Set, key: &[Value]) -> Vec<u8> {
    concat_bytes(key.iter().zip(&set.key).map(|(value, data_type)| value_bytes(*value, *data_type)))
}

/// Whether a `NFT_MSG_NEWSETELEM` message of a dump holds an element whose key is `wanted`.
pub(super) fn holds_key(payload: &[u8], wanted: &[u8]) -> bool {
    message_attrs(payload).filter(|attr| attr.attr_type == NFTA_SET_ELEM_LIST_ELEMENTS).any(|list| {
        attrs(list.data, 0).any(|element| {
            attrs(element.data, 0)
                .filter(|attr| attr.attr_type == NFTA_SET_ELEM_KEY)
                .flat_map(|key| attrs(key.data, 0))
                .any(|value| value.attr_type == NFTA_DATA_VALUE && value.data == wanted)
        })
    })
}

/// A `GETRULE` dump of one chain's rules.
pub(super) fn get_rules_request(table: &TableName, chain: &str, seq: u32) -> Vec<u8> {
    let mut writer = Writer::default();
    let start =
        writer.begin_message(msg_type(NFT_MSG_GETRULE), NLM_F_REQUEST | NLM_F_DUMP, seq, nfproto(table.family), 0);
    writer.string(NFTA_RULE_TABLE, &table.name);
    writer.string(NFTA_RULE_CHAIN, chain);
    writer.end_message(start);
    writer.buf
}

/// A `GETTABLE` dump of one family's tables.
pub(super) fn get_tables_request(family: Family, seq: u32) -> Vec<u8> {
    let mut writer = Writer::default();
    let start = writer.begin_message(msg_type(NFT_MSG_GETTABLE), NLM_F_REQUEST | NLM_F_DUMP, seq, nfproto(family), 0);
    writer.end_message(start);
    writer.buf
}

/// The table a `NFT_MSG_NEWTABLE` message of a dump names.
pub(super) fn table_name_of(payload: &[u8]) -> Option<String> {
    message_attrs(payload).find(|attr| attr.attr_type == NFTA_TABLE_NAME).map(|attr| attr.string())
}

/// A `GETSET` request for one set.
pub(super) fn get_set_request(table: &TableName, set: &str, seq: u32) -> Vec<u8> {
    let mut writer = Writer::default();
    let start =
        writer.begin_message(msg_type(NFT_MSG_GETSET), NLM_F_REQUEST | NLM_F_ACK, seq, nfproto(table.family), 0);
    writer.string(NFTA_SET_TABLE, &table.name);
    writer.string(NFTA_SET_NAME, set);
    writer.end_message(start);
    writer.buf
}

pub(super) fn nfproto(family: Family) -> u8 {
    match family {
        Family::Ip => NFPROTO_IPV4,
        Family::Ip6 => NFPROTO_IPV6,
    }
}

fn msg_type(message: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | message
}

struct Encoder<'a> {
    family: Family,
    nfproto: u8,
    table: &'a str,
    batch: Batch,
    /// Sets added by this batch, with the id its messages give them.
    set_ids: HashMap<String, u32>,
    next_set_id: u32,
    /// Index of the operation being encoded.
    operation: u32,
}

impl Encoder<'_> {
    fn w(&mut self) -> &mut Writer {
        &mut self.batch.writer
    }

    fn begin(&mut self, message: u16, flags: u16) -> usize {
        let seq = self.batch.first_seq.wrapping_add(self.batch.origins.len() as u32);
        let offset = self.batch.writer.buf.len();
        self.batch.origins.push((offset as u32, self.operation));
        let nfproto = self.nfproto;
        self.w().begin_message(msg_type(message), flags, seq, nfproto, 0)
    }

    fn end(&mut self, start: usize) {
        self.w().end_message(start);
    }

    fn delimiter(&mut self, msg: u16, flags: u16) {
        let seq = self.batch.first_seq.wrapping_add(self.batch.origins.len() as u32);
        let offset = self.batch.writer.buf.len();
        self.batch.origins.push((offset as u32, self.operation));
        let start = self.w().begin_message(msg, flags, seq, 0, NFNL_SUBSYS_NFTABLES);
        self.w().end_message(start);
    }

    fn new_set_id(&mut self) -> u32 {
        let id = self.next_set_id;
        self.next_set_id += 1;
        id
    }

    fn encode(&mut self, operation: &Operation, catalog: &mut Catalog<'_>) -> Result<(), NftError> {
        let table = self.table;
        match operation {
            Operation::AddTable { comment } => {
                let start = self.begin(NFT_MSG_NEWTABLE, NLM_F_REQUEST);
                self.w().string(NFTA_TABLE_NAME, table);
                self.w().u32(NFTA_TABLE_FLAGS, 0);
                if let Some(comment) = comment {
                    // NFTNL_UDATA_TABLE_COMMENT
                    let mut data = UserData::default();
                    data.string(0, comment);
                    self.w().bytes(NFTA_TABLE_USERDATA, &data.buf);
                }
                self.end(start);
            }
            Operation::DeleteTable => {
                let start = self.begin(NFT_MSG_DELTABLE, NLM_F_REQUEST);
                self.w().string(NFTA_TABLE_NAME, table);
                self.end(start);
                catalog.changes.clear();
                catalog.table_gone = true;
                self.set_ids.clear();
            }
            Operation::AddChain(chain) => {
                let start = self.begin(NFT_MSG_NEWCHAIN, NLM_F_REQUEST | NLM_F_CREATE);
                self.w().string(NFTA_CHAIN_TABLE, table);
                self.w().string(NFTA_CHAIN_NAME, &chain.name);
                if let Some(base) = chain.base {
                    let chain_type = match base.chain_type {
                        ChainType::Filter => "filter",
                        ChainType::Nat => "nat",
                    };
                    self.w().string(NFTA_CHAIN_TYPE, chain_type);
                    let hook = self.w().begin_nest(NFTA_CHAIN_HOOK);
                    self.w().u32(NFTA_HOOK_HOOKNUM, hook_number(base.hook));
                    self.w().u32(NFTA_HOOK_PRIORITY, base.priority as u32);
                    self.w().end_nest(hook);
                }
                if let Some(comment) = &chain.comment {
                    // NFTNL_UDATA_CHAIN_COMMENT
                    let mut data = UserData::default();
                    data.string(0, comment);
                    self.w().bytes(NFTA_CHAIN_USERDATA, &data.buf);
                }
                self.end(start);
            }
            Operation::FlushChain(name) => {
                let start = self.begin(NFT_MSG_DELRULE, NLM_F_REQUEST);
                self.w().string(NFTA_RULE_TABLE, table);
                self.w().string(NFTA_RULE_CHAIN, name);
                self.end(start);
            }
            Operation::DeleteChain(name) => {
                let start = self.begin(NFT_MSG_DELCHAIN, NLM_F_REQUEST);
                self.w().string(NFTA_CHAIN_TABLE, table);
                self.w().string(NFTA_CHAIN_NAME, name);
                self.end(start);
            }
            Operation::AddRule(rule) => self.add_rule(rule, catalog)?,
            Operation::AddSet(set) => {
                self.add_set(set);
                // Adding a set that exists changes nothing (or fails, if it differs); one that
                // is not known may exist, holding elements or not.
                let fill = match catalog.exists(&set.name) {
                    Some(true) => None,
                    Some(false) => Some(Fill::Empty),
                    None => Some(Fill::Unknown),
                };
                if let Some(fill) = fill {
                    catalog.changes.insert(set.name.clone(), Some(KnownSet { set: set.clone(), fill }));
                }
            }
            Operation::FlushSet(name) => {
                let start = self.begin(NFT_MSG_DELSETELEM, NLM_F_REQUEST);
                self.w().string(NFTA_SET_ELEM_LIST_TABLE, table);
                self.w().string(NFTA_SET_ELEM_LIST_SET, name);
                self.end(start);
                if let Some(known) = catalog.get(name)? {
                    known.fill = Fill::Empty;
                }
            }
            Operation::DeleteSet(name) => {
                let start = self.begin(NFT_MSG_DELSET, NLM_F_REQUEST);
                self.w().string(NFTA_SET_TABLE, table);
                self.w().string(NFTA_SET_NAME, name);
                self.end(start);
                catalog.changes.insert(name.clone(), None);
                self.set_ids.remove(name);
            }
            Operation::AddElement(element) => self.element(element, true, catalog)?,
            Operation::DeleteElement(element) => self.element(element, false, catalog)?,
        }
        Ok(())
    }

    fn add_set(&mut self, set: &Set) {
        let id = self.new_set_id();
        self.set_ids.insert(set.name.clone(), id);
        let mut flags = 0;
        if set.interval {
            flags |= NFT_SET_INTERVAL;
            if set.key.len() > 1 {
                flags |= NFT_SET_CONCAT;
            }
        }
        if set.is_map() {
            flags |= NFT_SET_MAP;
        }
        if set.dynamic_timeout.is_some() {
            flags |= NFT_SET_TIMEOUT | NFT_SET_EVAL;
        }
        let table = self.table;
        let start = self.begin(NFT_MSG_NEWSET, NLM_F_REQUEST | NLM_F_CREATE);
        let w = self.w();
        w.string(NFTA_SET_TABLE, table);
        w.string(NFTA_SET_NAME, &set.name);
        w.u32(NFTA_SET_FLAGS, flags);
        w.u32(NFTA_SET_KEY_TYPE, type_id(&set.key));
        w.u32(NFTA_SET_KEY_LEN, types_len(&set.key) as u32);
        if let Some(value) = &set.value {
            if set.is_verdict_map() {
                w.u32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
                w.u32(NFTA_SET_DATA_LEN, 0);
            } else {
                w.u32(NFTA_SET_DATA_TYPE, type_id(value));
                w.u32(NFTA_SET_DATA_LEN, types_len(value) as u32);
            }
        }
        w.u32(NFTA_SET_ID, id);
        if let Some(timeout) = set.dynamic_timeout {
            w.u64(NFTA_SET_TIMEOUT, timeout.as_millis() as u64);
        }
        if set.interval && set.key.len() > 1 {
            // The field lengths let the kernel pick its set type for ranges of concatenations.
            let desc = w.begin_nest(NFTA_SET_DESC);
            let concat = w.begin_nest(NFTA_SET_DESC_CONCAT);
            for data_type in &set.key {
                let field = w.begin_nest(NFTA_LIST_ELEM);
                w.u32(NFTA_SET_FIELD_LEN, type_len(*data_type) as u32);
                w.end_nest(field);
            }
            w.end_nest(concat);
            w.end_nest(desc);
        }
        // What nft records for itself (libnftnl's NFTNL_UDATA_SET_*), to list the set.
        let mut data = UserData::default();
        data.u32(0, byte_order(&set.key));
        if let Some(value) = &set.value {
            data.u32(1, byte_order(value));
        }
        if set.key.len() > 1 {
            data.nest(3, &concat_typeof());
        }
        if let Some(value) = &set.value
            && value.len() > 1
        {
            data.nest(4, &concat_typeof());
        }
        if set.is_map() {
            data.u32(6, 0);
        }
        if let Some(comment) = &set.comment {
            data.string(7, comment);
        }
        w.bytes(NFTA_SET_USERDATA, &data.buf);
        self.end(start);
    }

    fn element(&mut self, element: &Element, add: bool, catalog: &mut Catalog<'_>) -> Result<(), NftError> {
        let invalid = |reason: String| NftError::InvalidElement { set: element.set.clone(), reason };
        let family = self.family;
        // nft starts filling an empty interval set with an interval end at zero.
        let zero_end = match catalog.get(&element.set)? {
            Some(known) if add && known.set.interval && known.set.key.len() == 1 => match known.fill {
                Fill::Empty => true,
                Fill::NonEmpty => false,
                Fill::Unknown => !catalog.kernel.has_elements(&element.set)?,
            },
            _ => false,
        };
        let encoded = match catalog.get(&element.set)? {
            Some(known) => {
                let set = &known.set;
                let key = checked_key(set, element).map_err(invalid)?;
                let value = if add { checked_value(set, element).map_err(invalid)? } else { None };
                let comment = element.comment.as_deref().filter(|_| add);
                let encoded = encode_element(set, &key, value.as_ref(), comment, zero_end);
                known.fill = if add { Fill::NonEmpty } else { Fill::Unknown };
                encoded
            }
            // A set nobody knows does not exist: the kernel will say so for this message.
            None => {
                let set = Set {
                    name: element.set.clone(),
                    key: element.key.iter().map(|value| natural_type(family, *value)).collect(),
                    value: None,
                    interval: false,
                    dynamic_timeout: None,
                    comment: None,
                };
                encode_element(&set, &element.key, element.value.as_ref(), None, false)
            }
        };

        let table = self.table;
        let set_id = self.set_ids.get(&element.set).copied();
        let (message, flags) =
            if add { (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE) } else { (NFT_MSG_DELSETELEM, NLM_F_REQUEST) };
        let start = self.begin(message, flags);
        let w = self.w();
        w.string(NFTA_SET_ELEM_LIST_TABLE, table);
        w.string(NFTA_SET_ELEM_LIST_SET, &element.set);
        if let Some(id) = set_id {
            w.u32(NFTA_SET_ELEM_LIST_SET_ID, id);
        }
        let list = w.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        for item in &encoded {
            item.write(w);
        }
        w.end_nest(list);
        self.end(start);
        Ok(())
    }

    fn add_rule(&mut self, rule: &Rule, catalog: &mut Catalog<'_>) -> Result<(), NftError> {
        let family = self.family;
        let invalid = |reason: String| NftError::InvalidRule { chain: rule.chain.clone(), reason };
        // What nft checks of lookups against the set: keys of its type, a verdict map for `vmap`.
        for statement in &rule.statements {
            let (keys, name) = match statement {
                Statement::Match(Match::InSet { keys, set, .. }) => (keys, set),
                Statement::VerdictMap { keys, map } => (keys, map),
                Statement::UpdateSet { keys, set } => (keys, set),
                _ => continue,
            };
            let Some(known) = catalog.get(name)? else { continue };
            let set = &known.set;
            match statement {
                Statement::VerdictMap { .. } if !set.is_verdict_map() => {
                    return Err(invalid(format!("@{name} is not a verdict map")));
                }
                Statement::UpdateSet { .. } if set.is_map() => {
                    return Err(invalid(format!("@{name} is a map; updating it needs a value")));
                }
                _ => {}
            }
            let key_types = keys.iter().map(|key| validation::expr_type(family, *key));
            if !key_types.eq(set.key.iter().copied().map(Some)) {
                return Err(invalid(format!("keys {keys:?} do not match the type {:?} of @{name}", set.key)));
            }
        }

        // Several prefixes become an anonymous interval set, created just before the rule.
        let mut anonymous = Vec::new();
        for statement in &rule.statements {
            if let Statement::Match(Match::InPrefixes { left, prefixes, .. }) = statement
                && prefixes.len() > 1
            {
                anonymous.push(self.anonymous_set(*left, prefixes));
            }
        }

        let table = self.table;
        let start = self.begin(NFT_MSG_NEWRULE, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND);
        let set_ids = &self.set_ids;
        let w = &mut self.batch.writer;
        w.string(NFTA_RULE_TABLE, table);
        w.string(NFTA_RULE_CHAIN, &rule.chain);
        let expressions = w.begin_nest(NFTA_RULE_EXPRESSIONS);
        let context = StatementContext { family, set_ids };
        context.statements(w, &rule.statements, &mut anonymous.into_iter());
        w.end_nest(expressions);
        if let Some(comment) = &rule.comment {
            // NFTNL_UDATA_RULE_COMMENT
            let mut data = UserData::default();
            data.string(0, comment);
            w.bytes(NFTA_RULE_USERDATA, &data.buf);
        }
        self.end(start);
        Ok(())
    }

    /// Creates the anonymous set nft makes for `left { prefix, ... }`; returns its id.
    fn anonymous_set(&mut self, left: Expr, prefixes: &[IpNet]) -> u32 {
        let id = self.new_set_id();
        let address_type = self.family.address_type();
        let ranges = merged_ranges(prefixes);
        let elements = interval_elements(address_type, &ranges, true);
        let table = self.table;
        let family = self.family;

        let start = self.begin(NFT_MSG_NEWSET, NLM_F_REQUEST | NLM_F_CREATE);
        let w = self.w();
        w.string(NFTA_SET_TABLE, table);
        w.string(NFTA_SET_NAME, "__set%d");
        w.u32(NFTA_SET_FLAGS, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_INTERVAL);
        w.u32(NFTA_SET_KEY_TYPE, type_id(&[address_type]));
        w.u32(NFTA_SET_KEY_LEN, type_len(address_type) as u32);
        w.u32(NFTA_SET_ID, id);
        let desc = w.begin_nest(NFTA_SET_DESC);
        w.u32(NFTA_SET_DESC_SIZE, elements.len() as u32);
        w.end_nest(desc);
        // The key's "typeof": a payload expression, by protocol and field (nft's own ids).
        let (protocol, field) = match (family, left) {
            (Family::Ip, Expr::SourceAddress) => (12, 11),
            (Family::Ip, _) => (12, 12),
            (Family::Ip6, Expr::SourceAddress) => (13, 8),
            (Family::Ip6, _) => (13, 9),
        };
        let mut payload = UserData::default();
        payload.u32(0, protocol).u32(1, field);
        let mut typeof_key = UserData::default();
        typeof_key.u32(0, 7).nest(1, &payload);
        let mut data = UserData::default();
        data.u32(0, 2).u32(2, 1).nest(3, &typeof_key);
        w.bytes(NFTA_SET_USERDATA, &data.buf);
        self.end(start);

        let start = self.begin(NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE);
        let w = self.w();
        w.string(NFTA_SET_ELEM_LIST_TABLE, table);
        w.string(NFTA_SET_ELEM_LIST_SET, "__set%d");
        w.u32(NFTA_SET_ELEM_LIST_SET_ID, id);
        let list = w.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        for element in &elements {
            element.write(w);
        }
        w.end_nest(list);
        self.end(start);
        id
    }
}

/// The references a rule's expressions make to sets by id.
pub(super) struct StatementContext<'a> {
    pub(super) family: Family,
    pub(super) set_ids: &'a HashMap<String, u32>,
}

impl StatementContext<'_> {
    /// Writes the expressions of a rule's statements; returns where each statement's end.
    /// `anonymous` yields the ids of the anonymous sets made for the rule's prefix lists.
    pub(super) fn statements(
        &self,
        w: &mut Writer,
        statements: &[Statement],
        anonymous: &mut dyn Iterator<Item = u32>,
    ) -> Vec<usize> {
        // nft makes sure a tcp reset only answers tcp: without a match of its own before the
        // reject, it puts one at the head of the rule.
        let is_tcp = |statement: &Statement| {
            matches!(
                statement,
                Statement::Match(Match::Compare { left: Expr::L4Proto, op: CmpOp::Eq, right: Value::Protocol(6) })
            )
        };
        let reset =
            statements.iter().position(|statement| matches!(statement, Statement::Reject(RejectKind::TcpReset)));
        if let Some(reset) = reset
            && !statements[..reset].iter().any(is_tcp)
        {
            load(w, self.family, Expr::L4Proto, NFT_REG_1);
            cmp(w, NFT_CMP_EQ, &[6]);
        }
        let mut ends = Vec::with_capacity(statements.len());
        for statement in statements {
            self.statement(w, statement, anonymous);
            ends.push(w.buf.len());
        }
        ends
    }

    fn statement(&self, w: &mut Writer, statement: &Statement, anonymous: &mut dyn Iterator<Item = u32>) {
        let family = self.family;
        match statement {
            Statement::Match(matched) => self.matched(w, matched, anonymous),
            Statement::Counter => expression(w, "counter", |_| {}),
            Statement::SetMarkBits(bits) => {
                load(w, family, Expr::Mark, NFT_REG_1);
                bitwise(w, 4, &(!bits).to_ne_bytes(), &bits.to_ne_bytes(), true);
                set_mark(w);
            }
            Statement::ToggleMarkBits(bits) => {
                load(w, family, Expr::Mark, NFT_REG_1);
                bitwise(w, 4, &u32::MAX.to_ne_bytes(), &bits.to_ne_bytes(), true);
                set_mark(w);
            }
            Statement::Dnat { address, port } => {
                immediate_value(w, NFT_REG_1, &address_bytes(*address));
                if let Some(port) = port {
                    immediate_value(w, NFT_REG_2, &port.to_be_bytes());
                }
                expression(w, "nat", |w| {
                    w.u32(NFTA_NAT_TYPE, NFT_NAT_DNAT);
                    w.u32(NFTA_NAT_FAMILY, u32::from(nfproto(family)));
                    w.u32(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1);
                    if port.is_some() {
                        w.u32(NFTA_NAT_REG_PROTO_MIN, NFT_REG_2);
                        w.u32(NFTA_NAT_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
                    }
                });
            }
            Statement::Masquerade { fully_random } => expression(w, "masq", |w| {
                if *fully_random {
                    w.u32(NFTA_MASQ_FLAGS, NF_NAT_RANGE_PROTO_RANDOM_FULLY);
                }
            }),
            Statement::Reject(kind) => expression(w, "reject", |w| match kind {
                RejectKind::PortUnreachable => {
                    w.u32(NFTA_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH);
                    w.u8(
                        NFTA_REJECT_ICMP_CODE,
                        match family {
                            Family::Ip => ICMP_PORT_UNREACH,
                            Family::Ip6 => ICMPV6_PORT_UNREACH,
                        },
                    );
                }
                RejectKind::TcpReset => {
                    w.u32(NFTA_REJECT_TYPE, NFT_REJECT_TCP_RST);
                    w.u8(NFTA_REJECT_ICMP_CODE, 0);
                }
            }),
            Statement::VerdictMap { keys, map } => {
                load_keys(w, family, keys);
                self.lookup(w, map, None, Some(NFT_REG_VERDICT), false);
            }
            Statement::UpdateSet { keys, set } => {
                load_keys(w, family, keys);
                let id = self.set_ids.get(set).copied();
                expression(w, "dynset", |w| {
                    w.u32(NFTA_DYNSET_SREG_KEY, NFT_REG_1);
                    w.u32(NFTA_DYNSET_OP, NFT_DYNSET_OP_UPDATE);
                    w.string(NFTA_DYNSET_SET_NAME, set);
                    if let Some(id) = id {
                        w.u32(NFTA_DYNSET_SET_ID, id);
                    }
                });
            }
            Statement::Verdict(verdict) => expression(w, "immediate", |w| {
                w.u32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
                let data = w.begin_nest(NFTA_IMMEDIATE_DATA);
                write_verdict(w, verdict);
                w.end_nest(data);
            }),
        }
    }

    fn matched(&self, w: &mut Writer, matched: &Match, anonymous: &mut dyn Iterator<Item = u32>) {
        let family = self.family;
        match matched {
            Match::Compare { left, op, right } => {
                let cmp_op = cmp_op(*op);
                match (left, right) {
                    (_, Value::Prefix(prefix)) => compare_prefix(w, family, *left, cmp_op, *prefix),
                    _ => {
                        load(w, family, *left, NFT_REG_1);
                        cmp(w, cmp_op, &compared_bytes(*left, *right));
                    }
                }
            }
            Match::InPrefixes { left, negate, prefixes } => {
                let op = if *negate { NFT_CMP_NEQ } else { NFT_CMP_EQ };
                if let [prefix] = prefixes.as_slice() {
                    compare_prefix(w, family, *left, op, *prefix);
                } else {
                    load(w, family, *left, NFT_REG_1);
                    let id = anonymous.next().expect("an anonymous set was made for each prefix list");
                    self.lookup(w, "__set%d", Some(id), None, *negate);
                }
            }
            Match::InSet { keys, negate, set } => {
                load_keys(w, family, keys);
                self.lookup(w, set, None, None, *negate);
            }
            Match::MarkMasked { mask, op, value } => {
                load(w, family, Expr::Mark, NFT_REG_1);
                bitwise(w, 4, &mask.to_ne_bytes(), &0u32.to_ne_bytes(), true);
                cmp(w, cmp_op(*op), &value.to_ne_bytes());
            }
            Match::FibLocal { address, negate } => {
                expression(w, "fib", |w| {
                    w.u32(
                        NFTA_FIB_FLAGS,
                        match address {
                            FibAddress::Source => NFTA_FIB_F_SADDR,
                            FibAddress::Destination => NFTA_FIB_F_DADDR,
                        },
                    );
                    w.u32(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
                    w.u32(NFTA_FIB_DREG, NFT_REG_1);
                });
                cmp(w, if *negate { NFT_CMP_NEQ } else { NFT_CMP_EQ }, &RTN_LOCAL.to_ne_bytes());
            }
            Match::CtStateNew => {
                expression(w, "ct", |w| {
                    w.u32(NFTA_CT_KEY, NFT_CT_STATE);
                    w.u32(NFTA_CT_DREG, NFT_REG_1);
                });
                bitwise(w, 4, &NF_CT_STATE_NEW_BIT.to_ne_bytes(), &0u32.to_ne_bytes(), false);
                cmp(w, NFT_CMP_NEQ, &0u32.to_ne_bytes());
            }
        }
    }

    /// A lookup of the key in register 1, by set name (and id when this batch made the set).
    fn lookup(&self, w: &mut Writer, set: &str, id: Option<u32>, dreg: Option<u32>, negate: bool) {
        let id = id.or_else(|| self.set_ids.get(set).copied());
        expression(w, "lookup", |w| {
            w.u32(NFTA_LOOKUP_SREG, NFT_REG_1);
            if let Some(dreg) = dreg {
                w.u32(NFTA_LOOKUP_DREG, dreg);
            }
            w.string(NFTA_LOOKUP_SET, set);
            if let Some(id) = id {
                w.u32(NFTA_LOOKUP_SET_ID, id);
            }
            if negate {
                w.u32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
            }
        });
    }
}

/// `NFTA_LIST_ELEM { NFTA_EXPR_NAME: name, NFTA_EXPR_DATA { body } }`.
fn expression(w: &mut Writer, name: &str, body: impl FnOnce(&mut Writer)) {
    let element = w.begin_nest(NFTA_LIST_ELEM);
    w.string(NFTA_EXPR_NAME, name);
    let data = w.begin_nest(NFTA_EXPR_DATA);
    body(w);
    w.end_nest(data);
    w.end_nest(element);
}

fn payload(w: &mut Writer, dreg: u32, base: u32, offset: u32, len: u32) {
    expression(w, "payload", |w| {
        w.u32(NFTA_PAYLOAD_DREG, dreg);
        w.u32(NFTA_PAYLOAD_BASE, base);
        w.u32(NFTA_PAYLOAD_OFFSET, offset);
        w.u32(NFTA_PAYLOAD_LEN, len);
    });
}

fn meta(w: &mut Writer, key: u32, dreg: u32) {
    expression(w, "meta", |w| {
        w.u32(NFTA_META_KEY, key);
        w.u32(NFTA_META_DREG, dreg);
    });
}

fn set_mark(w: &mut Writer) {
    expression(w, "meta", |w| {
        w.u32(NFTA_META_KEY, NFT_META_MARK);
        w.u32(NFTA_META_SREG, NFT_REG_1);
    });
}

fn cmp(w: &mut Writer, op: u32, data: &[u8]) {
    expression(w, "cmp", |w| {
        w.u32(NFTA_CMP_SREG, NFT_REG_1);
        w.u32(NFTA_CMP_OP, op);
        w.data_value(NFTA_CMP_DATA, data);
    });
}

/// `reg1 = (reg1 & mask) ^ xor`; nft names the operation only for `meta mark` arithmetic.
fn bitwise(w: &mut Writer, len: u32, mask: &[u8], xor: &[u8], with_op: bool) {
    expression(w, "bitwise", |w| {
        w.u32(NFTA_BITWISE_SREG, NFT_REG_1);
        w.u32(NFTA_BITWISE_DREG, NFT_REG_1);
        if with_op {
            w.u32(NFTA_BITWISE_OP, NFT_BITWISE_MASK_XOR);
        }
        w.u32(NFTA_BITWISE_LEN, len);
        w.data_value(NFTA_BITWISE_MASK, mask);
        w.data_value(NFTA_BITWISE_XOR, xor);
    });
}

fn immediate_value(w: &mut Writer, dreg: u32, data: &[u8]) {
    expression(w, "immediate", |w| {
        w.u32(NFTA_IMMEDIATE_DREG, dreg);
        w.data_value(NFTA_IMMEDIATE_DATA, data);
    });
}

/// `NFTA_DATA_VERDICT { code, chain }`, inside whatever data attribute the caller opened.
fn write_verdict(w: &mut Writer, verdict: &Verdict) {
    let nest = w.begin_nest(NFTA_DATA_VERDICT);
    let (code, chain) = match verdict {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(chain) => (NFT_JUMP, Some(chain)),
        Verdict::Goto(chain) => (NFT_GOTO, Some(chain)),
    };
    w.u32(NFTA_VERDICT_CODE, code);
    if let Some(chain) = chain {
        w.string(NFTA_VERDICT_CHAIN, chain);
    }
    w.end_nest(nest);
}

fn cmp_op(op: CmpOp) -> u32 {
    match op {
        CmpOp::Eq => NFT_CMP_EQ,
        CmpOp::Ne => NFT_CMP_NEQ,
    }
}

/// Where an address lives in the network header, and how long it is.
fn address_field(family: Family, expr: Expr) -> (u32, u32) {
    match (family, expr) {
        (Family::Ip, Expr::SourceAddress) => (12, 4),
        (Family::Ip, _) => (16, 4),
        (Family::Ip6, Expr::SourceAddress) => (8, 16),
        (Family::Ip6, _) => (24, 16),
    }
}

/// Loads an expression's value into `reg`; returns how many bytes it is.
fn load(w: &mut Writer, family: Family, expr: Expr, reg: u32) -> usize {
    match expr {
        Expr::SourceAddress | Expr::DestinationAddress => {
            let (offset, len) = address_field(family, expr);
            payload(w, reg, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
            len as usize
        }
        Expr::L4Proto => {
            meta(w, NFT_META_L4PROTO, reg);
            1
        }
        Expr::DestinationPort => {
            payload(w, reg, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
            2
        }
        Expr::SourcePort => {
            payload(w, reg, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2);
            2
        }
        Expr::Mark => {
            meta(w, NFT_META_MARK, reg);
            4
        }
        Expr::RandomModulo(modulus) => {
            expression(w, "numgen", |w| {
                w.u32(NFTA_NG_DREG, reg);
                w.u32(NFTA_NG_MODULUS, modulus);
                w.u32(NFTA_NG_TYPE, NFT_NG_RANDOM);
                w.u32(NFTA_NG_OFFSET, 0);
            });
            4
        }
    }
}

/// Loads a (possibly concatenated) key from register 1 on, each part in the 4-byte registers
/// after the previous one, numbered as nft numbers them (16-byte registers where aligned).
fn load_keys(w: &mut Writer, family: Family, keys: &[Expr]) {
    let mut word = 0u32;
    for key in keys {
        let reg = if word.is_multiple_of(4) { NFT_REG_1 + word / 4 } else { NFT_REG32_00 + word };
        let len = load(w, family, *key, reg);
        word += len.div_ceil(4) as u32;
    }
}

/// `left == prefix` as nft writes it: a byte-aligned prefix compares fewer bytes; any other
/// masks the address first.
fn compare_prefix(w: &mut Writer, family: Family, left: Expr, op: u32, prefix: IpNet) {
    let (offset, len) = address_field(family, left);
    let bits = u32::from(prefix.prefix_len());
    let network = address_bytes(prefix.trunc().addr());
    if bits > 0 && bits % 8 == 0 {
        let bytes = bits / 8;
        payload(w, NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, bytes);
        cmp(w, op, &network[..bytes as usize]);
    } else {
        payload(w, NFT_REG_1, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
        bitwise(w, len, &address_bytes(prefix.netmask()), &vec![0; len as usize], false);
        cmp(w, op, &network);
    }
}

/// The bytes a `cmp` holds for `right` compared with `left`. Packet fields are in network
/// order; the mark and numgen's result are in host order.
fn compared_bytes(left: Expr, right: Value) -> Vec<u8> {
    match (left, right) {
        (_, Value::Address(address)) => address_bytes(address),
        (_, Value::Prefix(prefix)) => address_bytes(prefix.addr()),
        (_, Value::Protocol(protocol)) => vec![protocol],
        (_, Value::Port(port)) => port.to_be_bytes().to_vec(),
        (Expr::Mark | Expr::RandomModulo(_), Value::Integer(integer)) => integer.to_ne_bytes().to_vec(),
        (_, Value::Integer(integer)) => integer.to_be_bytes().to_vec(),
    }
}

fn address_bytes(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(address) => address.octets().to_vec(),
        IpAddr::V6(address) => address.octets().to_vec(),
    }
}

fn hook_number(hook: Hook) -> u32 {
    match hook {
        Hook::Prerouting => NF_INET_PRE_ROUTING,
        Hook::Input => NF_INET_LOCAL_IN,
        Hook::Forward => NF_INET_FORWARD,
        Hook::Output => NF_INET_LOCAL_OUT,
        Hook::Postrouting => NF_INET_POST_ROUTING,
    }
}

/// nft's id of a data type (its `enum datatypes`), which the kernel stores for it.
fn type_number(data_type: DataType) -> u32 {
    match data_type {
        DataType::Verdict => 1,
        DataType::Ipv4Addr => 7,
        DataType::Ipv6Addr => 8,
        DataType::InetProto => 12,
        DataType::InetService => 13,
    }
}

/// A concatenation's type id: the parts' ids, 6 bits each, first part highest.
fn type_id(types: &[DataType]) -> u32 {
    types.iter().fold(0, |id, data_type| (id << 6) | type_number(*data_type))
}

/// The types a (possibly concatenated) type id stands for, if all are known.
pub(super) fn types_of(mut id: u32) -> Option<Vec<DataType>> {
    let mut types = Vec::new();
    while id != 0 {
        types.push(match id & 0x3f {
            1 => DataType::Verdict,
            7 => DataType::Ipv4Addr,
            8 => DataType::Ipv6Addr,
            12 => DataType::InetProto,
            13 => DataType::InetService,
            _ => return None,
        });
        id >>= 6;
    }
    types.reverse();
    (!types.is_empty()).then_some(types)
}

fn type_len(data_type: DataType) -> usize {
    match data_type {
        DataType::Ipv4Addr => 4,
        DataType::Ipv6Addr => 16,
        DataType::InetProto => 1,
        DataType::InetService => 2,
        DataType::Verdict => 0,
    }
}

/// The length of a key or value: a lone part as it is, concatenated parts padded to 4 bytes.
fn types_len(types: &[DataType]) -> usize {
    match types {
        [single] => type_len(*single),
        _ => types.iter().map(|data_type| type_len(*data_type).div_ceil(4) * 4).sum(),
    }
}

/// nft's byte order of a key or value (its `enum byteorder`: 0 none, 2 big endian).
fn byte_order(types: &[DataType]) -> u32 {
    match types {
        [DataType::Ipv4Addr | DataType::Ipv6Addr | DataType::InetService] => 2,
        _ => 0,
    }
}

/// What nft records as the "typeof" of a concatenation declared by type: a concatenation
/// expression (its id 13) without parts.
fn concat_typeof() -> UserData {
    let mut data = UserData::default();
    data.u32(0, 13).bytes(1, &[]);
    data
}

/// The type a value has on its own, for a set nobody knows.
fn natural_type(family: Family, value: Value) -> DataType {
    match value {
        Value::Address(IpAddr::V4(_)) => DataType::Ipv4Addr,
        Value::Address(IpAddr::V6(_)) => DataType::Ipv6Addr,
        Value::Prefix(_) => family.address_type(),
        Value::Protocol(_) => DataType::InetProto,
        Value::Port(_) => DataType::InetService,
        Value::Integer(_) => DataType::Ipv4Addr,
    }
}

/// One value as the bytes of a part of `data_type`.
fn value_bytes(value: Value, data_type: DataType) -> Vec<u8> {
    let number = match value {
        Value::Address(address) => return address_bytes(address),
        Value::Prefix(prefix) => return address_bytes(prefix.addr()),
        Value::Protocol(protocol) => u32::from(protocol),
        Value::Port(port) => u32::from(port),
        Value::Integer(integer) => integer,
    };
    match data_type {
        DataType::InetProto => vec![number as u8],
        DataType::InetService => (number as u16).to_be_bytes().to_vec(),
        _ => number.to_be_bytes().to_vec(),
    }
}

/// A key or value of several parts, each padded to 4 bytes; a lone part is not padded.
fn concat_bytes(parts: impl ExactSizeIterator<Item = Vec<u8>>) -> Vec<u8> {
    let pad = parts.len() > 1;
    let mut out = Vec::new();
    for part in parts {
        let len = part.len();
        out.extend(part);
        if pad {
            out.resize(out.len() + len.div_ceil(4) * 4 - len, 0);
        }
    }
    out
}

/// The element's key in the set's types, as nft would read it (see
/// [`validation::coerce_value`]).
fn checked_key(set: &Set, element: &Element) -> Result<Vec<Value>, String> {
    if element.key.len() != set.key.len() {
        return Err(format!("key {:?} does not have the {} parts of {:?}", element.key, set.key.len(), set.key));
    }
    element
        .key
        .iter()
        .zip(&set.key)
        .map(|(value, data_type)| validation::coerce_value(*value, *data_type, set.interval))
        .collect()
}

fn checked_value(set: &Set, element: &Element) -> Result<Option<ElementValue>, String> {
    match (&set.value, &element.value) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err("an element of a set has no value".to_owned()),
        (Some(_), None) => Err("an element of a map needs a value".to_owned()),
        (Some(_), Some(value @ ElementValue::Verdict(_))) if set.is_verdict_map() => Ok(Some(value.clone())),
        (Some(types), Some(ElementValue::Data(values))) if !set.is_verdict_map() && types.len() == values.len() => {
            let values = values
                .iter()
                .zip(types)
                .map(|(value, data_type)| validation::coerce_value(*value, *data_type, false))
                .collect::<Result<_, _>>()?;
            Ok(Some(ElementValue::Data(values)))
        }
        (Some(types), Some(value)) => Err(format!("value {value:?} is not of type {types:?}")),
    }
}

/// One `NFTA_LIST_ELEM` of an element list.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EncodedElement {
    key: Vec<u8>,
    key_end: Option<Vec<u8>>,
    interval_end: bool,
    data: Option<EncodedData>,
    user_data: Option<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum EncodedData {
    Value(Vec<u8>),
    Verdict(Verdict),
}

impl EncodedElement {
    fn key(key: Vec<u8>) -> Self {
        EncodedElement { key, key_end: None, interval_end: false, data: None, user_data: None }
    }

    fn write(&self, w: &mut Writer) {
        let element = w.begin_nest(NFTA_LIST_ELEM);
        if self.interval_end {
            w.u32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
        }
        w.data_value(NFTA_SET_ELEM_KEY, &self.key);
        if let Some(key_end) = &self.key_end {
            w.data_value(NFTA_SET_ELEM_KEY_END, key_end);
        }
        match &self.data {
            Some(EncodedData::Value(value)) => w.data_value(NFTA_SET_ELEM_DATA, value),
            Some(EncodedData::Verdict(verdict)) => {
                let data = w.begin_nest(NFTA_SET_ELEM_DATA);
                write_verdict(w, verdict);
                w.end_nest(data);
            }
            None => {}
        }
        if let Some(user_data) = &self.user_data {
            w.bytes(NFTA_SET_ELEM_USERDATA, user_data);
        }
        w.end_nest(element);
    }
}

/// The list elements for one element of `set`: one for a plain set; for an interval set,
/// the range's start and (unless it runs to the last address) its end, preceded by an end
/// at zero when `zero_end` asks for it and the range does not start there; for a range of
/// concatenations, one element with a key and a key end.
fn encode_element(
    set: &Set,
    key: &[Value],
    value: Option<&ElementValue>,
    comment: Option<&str>,
    zero_end: bool,
) -> Vec<EncodedElement> {
    let data = value.map(|value| match value {
        ElementValue::Verdict(verdict) => EncodedData::Verdict(verdict.clone()),
        ElementValue::Data(values) => EncodedData::Value(concat_bytes(
            values
                .iter()
                .zip(set.value.as_deref().unwrap_or_default())
                .map(|(value, data_type)| value_bytes(*value, *data_type)),
        )),
    });
    let mut user_data = UserData::default();
    if let Some(comment) = comment {
        // NFTNL_UDATA_SET_ELEM_COMMENT
        user_data.string(0, comment);
    }
    if !set.interval {
        let key = concat_bytes(key.iter().zip(&set.key).map(|(value, data_type)| value_bytes(*value, *data_type)));
        let user_data = (!user_data.buf.is_empty()).then_some(user_data.buf);
        return vec![EncodedElement { data, user_data, ..EncodedElement::key(key) }];
    }
    if set.key.len() > 1 {
        let ranges: Vec<_> =
            key.iter().zip(&set.key).map(|(value, data_type)| part_range(*value, *data_type)).collect();
        let start = concat_bytes(ranges.iter().map(|(start, _)| start.clone()));
        let end = concat_bytes(ranges.iter().map(|(_, end)| end.clone()));
        let user_data = (!user_data.buf.is_empty()).then_some(user_data.buf);
        return vec![EncodedElement { key_end: Some(end), data, user_data, ..EncodedElement::key(start) }];
    }
    let data_type = set.key[0];
    let range = match key[0] {
        Value::Address(address) => (address_number(address), address_number(address)),
        Value::Prefix(prefix) => (address_number(prefix.network()), address_number(prefix.broadcast())),
        value => {
            // A number in an interval set of ports or protocols: a range of one.
            let bytes = value_bytes(value, data_type);
            let number = bytes.iter().fold(0u128, |number, byte| (number << 8) | u128::from(*byte));
            (number, number)
        }
    };
    let mut elements = interval_elements(data_type, &[range], zero_end);
    if let Some(start) = elements.iter_mut().find(|element| !element.interval_end) {
        start.data = data;
        if !user_data.buf.is_empty() {
            // A comment goes before the open-interval flag nft may have put there.
            let mut merged = user_data.buf;
            merged.extend(start.user_data.take().unwrap_or_default());
            start.user_data = Some(merged);
        }
    }
    elements
}

/// The first and last value of one part of a range of concatenations.
fn part_range(value: Value, data_type: DataType) -> (Vec<u8>, Vec<u8>) {
    match value {
        Value::Prefix(prefix) => (address_bytes(prefix.network()), address_bytes(prefix.broadcast())),
        value => (value_bytes(value, data_type), value_bytes(value, data_type)),
    }
}

fn address_number(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(address) => u128::from(u32::from(address)),
        IpAddr::V6(address) => u128::from(address),
    }
}

/// Sorted, disjoint ranges covering `prefixes`, touching ones merged, as nft merges the
/// elements of an anonymous set.
fn merged_ranges(prefixes: &[IpNet]) -> Vec<(u128, u128)> {
    let mut ranges: Vec<(u128, u128)> =
        prefixes.iter().map(|prefix| (address_number(prefix.network()), address_number(prefix.broadcast()))).collect();
    ranges.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some((_, last_end)) if start <= last_end.saturating_add(1) => *last_end = (*last_end).max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The elements nft sends for inclusive `ranges` of an interval set: each start, then the
/// value after the range flagged as an interval end, or nothing and an "open" flag in the
/// start's user data when the range runs to the type's last value.
fn interval_elements(data_type: DataType, ranges: &[(u128, u128)], zero_end: bool) -> Vec<EncodedElement> {
    let len = type_len(data_type);
    let max = if len >= 16 { u128::MAX } else { (1u128 << (8 * len)) - 1 };
    let bytes = |number: u128| number.to_be_bytes()[16 - len..].to_vec();
    let mut elements = Vec::with_capacity(ranges.len() * 2 + 1);
    if zero_end && ranges.first().is_some_and(|(start, _)| *start != 0) {
        elements.push(EncodedElement { interval_end: true, ..EncodedElement::key(bytes(0)) });
    }
    for (start, end) in ranges {
        if *end == max {
            // NFTNL_UDATA_SET_ELEM_FLAGS: NFTNL_SET_ELEM_F_INTERVAL_OPEN
            let mut open = UserData::default();
            open.u32(1, 1);
            elements.push(EncodedElement { user_data: Some(open.buf), ..EncodedElement::key(bytes(*start)) });
        } else {
            elements.push(EncodedElement::key(bytes(*start)));
            elements.push(EncodedElement { interval_end: true, ..EncodedElement::key(bytes(end + 1)) });
        }
    }
    elements
}

/// How many expressions each statement of `rule` becomes, to find the statement that an
/// error about the n-th expression is about.
pub(super) fn expression_counts(family: Family, rule: &Rule) -> Vec<usize> {
    let set_ids = HashMap::new();
    let context = StatementContext { family, set_ids: &set_ids };
    let mut w = Writer::default();
    let ends = context.statements(&mut w, &rule.statements, &mut std::iter::repeat(0));
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let count = attrs(&w.buf[start..end], 0).count();
            start = end;
            count
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn concatenated_types_fold_six_bits_per_part() {
        let key = [DataType::Ipv4Addr, DataType::InetProto, DataType::InetService];
        assert_eq!(type_id(&key), 0x730d);
        assert_eq!(types_of(0x730d).unwrap(), key);
        assert_eq!(types_len(&key), 12);
        assert_eq!(types_len(&[DataType::InetService]), 2);
        assert_eq!(types_len(&[DataType::Ipv6Addr, DataType::InetProto, DataType::InetService]), 24);
    }

    #[test]
    fn touching_and_overlapping_prefixes_merge() {
        let ranges = merged_ranges(&[prefix("10.128.0.0/9"), prefix("10.0.0.0/9"), prefix("10.0.0.0/16")]);
        assert_eq!(ranges, vec![(0x0a00_0000, 0x0aff_ffff)]);
    }

    #[test]
    fn interval_elements_end_after_the_range_or_stay_open() {
        let elements =
            interval_elements(DataType::Ipv4Addr, &[(0x0a00_0000, 0x0aff_ffff), (0xff00_0000, 0xffff_ffff)], true);
        let keys: Vec<_> = elements.iter().map(|element| (element.key.clone(), element.interval_end)).collect();
        assert_eq!(
            keys,
            vec![
                (vec![0, 0, 0, 0], true),
                (vec![10, 0, 0, 0], false),
                (vec![11, 0, 0, 0], true),
                (vec![255, 0, 0, 0], false),
            ]
        );
        assert!(elements[3].user_data.is_some());
    }

    #[test]
    fn concatenated_keys_take_registers_as_nft_numbers_them() {
        let mut w = Writer::default();
        load_keys(&mut w, Family::Ip6, &[Expr::DestinationAddress, Expr::L4Proto, Expr::DestinationPort]);
        // The destination register is attribute 1 of payload and meta alike.
        let registers: Vec<u32> = attrs(&w.buf, 0)
            .map(|element| {
                let data = attrs(element.data, 0).find(|attr| attr.attr_type == NFTA_EXPR_DATA).unwrap();
                attrs(data.data, 0).find(|attr| attr.attr_type == 1).and_then(|attr| attr.be_u32()).unwrap()
            })
            .collect();
        assert_eq!(registers, vec![NFT_REG_1, NFT_REG_2, NFT_REG32_00 + 5]);
    }
}
