//! The netlink wire format as nf_tables speaks it: numbers from the kernel's UAPI headers
//! (`linux/netlink.h`, `linux/netfilter/nfnetlink.h`, `linux/netfilter/nf_tables.h`), a
//! writer that builds messages and attributes into one growing buffer, and a reader for
//! what the kernel sends back.
//!
//! Integers in nf_tables attributes are big endian; the netlink and attribute headers are
//! in host order.

// The numbers below are ABI: only those this crate sends or reads are listed.

// linux/netlink.h
pub(super) const NLMSG_ERROR: u16 = 2;
pub(super) const NLMSG_DONE: u16 = 3;
pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_ACK: u16 = 0x4;
pub(super) const NLM_F_DUMP: u16 = 0x300;
pub(super) const NLM_F_CAPPED: u16 = 0x100;
pub(super) const NLM_F_ACK_TLVS: u16 = 0x200;
pub(super) const NLM_F_APPEND: u16 = 0x800;
pub(super) const NLM_F_CREATE: u16 = 0x400;
pub(super) const NLA_F_NESTED: u16 = 0x8000;
pub(super) const NLA_TYPE_MASK: u16 = 0x3fff;
pub(super) const NLMSGERR_ATTR_MSG: u16 = 1;
pub(super) const NLMSGERR_ATTR_OFFS: u16 = 2;
pub(super) const NETLINK_NETFILTER: isize = 12;

// linux/netfilter/nfnetlink.h
pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub(super) const NFNL_MSG_BATCH_END: u16 = 17;

// linux/netfilter.h: NFPROTO_*
pub(super) const NFPROTO_IPV4: u8 = 2;
pub(super) const NFPROTO_IPV6: u8 = 10;

// enum nf_tables_msg_types
pub(super) const NFT_MSG_NEWTABLE: u16 = 0;
pub(super) const NFT_MSG_GETTABLE: u16 = 1;
pub(super) const NFT_MSG_DELTABLE: u16 = 2;
pub(super) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(super) const NFT_MSG_DELCHAIN: u16 = 5;
pub(super) const NFT_MSG_NEWRULE: u16 = 6;
pub(super) const NFT_MSG_GETRULE: u16 = 7;
pub(super) const NFT_MSG_DELRULE: u16 = 8;
pub(super) const NFT_MSG_NEWSET: u16 = 9;
pub(super) const NFT_MSG_GETSET: u16 = 10;
pub(super) const NFT_MSG_DELSET: u16 = 11;
pub(super) const NFT_MSG_NEWSETELEM: u16 = 12;
pub(super) const NFT_MSG_GETSETELEM: u16 = 13;
pub(super) const NFT_MSG_DELSETELEM: u16 = 14;

// enum nft_list_attributes
pub(super) const NFTA_LIST_ELEM: u16 = 1;

// enum nft_table_attributes
pub(super) const NFTA_TABLE_NAME: u16 = 1;
pub(super) const NFTA_TABLE_FLAGS: u16 = 2;
pub(super) const NFTA_TABLE_USERDATA: u16 = 6;

// enum nft_chain_attributes, nft_hook_attributes
pub(super) const NFTA_CHAIN_TABLE: u16 = 1;
pub(super) const NFTA_CHAIN_NAME: u16 = 3;
pub(super) const NFTA_CHAIN_HOOK: u16 = 4;
pub(super) const NFTA_CHAIN_TYPE: u16 = 7;
pub(super) const NFTA_CHAIN_USERDATA: u16 = 12;
pub(super) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(super) const NFTA_HOOK_PRIORITY: u16 = 2;

// enum nft_rule_attributes
pub(super) const NFTA_RULE_TABLE: u16 = 1;
pub(super) const NFTA_RULE_CHAIN: u16 = 2;
pub(super) const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub(super) const NFTA_RULE_USERDATA: u16 = 7;

// enum nft_set_attributes, nft_set_desc_attributes, nft_set_field_attributes
pub(super) const NFTA_SET_TABLE: u16 = 1;
pub(super) const NFTA_SET_NAME: u16 = 2;
pub(super) const NFTA_SET_FLAGS: u16 = 3;
pub(super) const NFTA_SET_KEY_TYPE: u16 = 4;
pub(super) const NFTA_SET_KEY_LEN: u16 = 5;
pub(super) const NFTA_SET_DATA_TYPE: u16 = 6;
pub(super) const NFTA_SET_DATA_LEN: u16 = 7;
pub(super) const NFTA_SET_DESC: u16 = 9;
pub(super) const NFTA_SET_ID: u16 = 10;
pub(super) const NFTA_SET_TIMEOUT: u16 = 11;
pub(super) const NFTA_SET_USERDATA: u16 = 13;
pub(super) const NFTA_SET_DESC_SIZE: u16 = 1;
pub(super) const NFTA_SET_DESC_CONCAT: u16 = 2;
pub(super) const NFTA_SET_FIELD_LEN: u16 = 1;

// enum nft_set_flags
pub(super) const NFT_SET_ANONYMOUS: u32 = 0x1;
pub(super) const NFT_SET_CONSTANT: u32 = 0x2;
pub(super) const NFT_SET_INTERVAL: u32 = 0x4;
pub(super) const NFT_SET_MAP: u32 = 0x8;
pub(super) const NFT_SET_TIMEOUT: u32 = 0x10;
pub(super) const NFT_SET_EVAL: u32 = 0x20;
pub(super) const NFT_SET_CONCAT: u32 = 0x80;

// enum nft_set_elem_attributes, nft_set_elem_list_attributes, nft_set_elem_flags
pub(super) const NFTA_SET_ELEM_KEY: u16 = 1;
pub(super) const NFTA_SET_ELEM_DATA: u16 = 2;
pub(super) const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub(super) const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub(super) const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub(super) const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub(super) const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub(super) const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub(super) const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub(super) const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;

// enum nft_data_attributes, nft_verdict_attributes, nft_data_types
pub(super) const NFTA_DATA_VALUE: u16 = 1;
pub(super) const NFTA_DATA_VERDICT: u16 = 2;
pub(super) const NFTA_VERDICT_CODE: u16 = 1;
pub(super) const NFTA_VERDICT_CHAIN: u16 = 2;
pub(super) const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

// Verdict codes: linux/netfilter.h NF_DROP / NF_ACCEPT and enum nft_verdicts.
pub(super) const NF_DROP: u32 = 0;
pub(super) const NF_ACCEPT: u32 = 1;
pub(super) const NFT_JUMP: u32 = -3i32 as u32;
pub(super) const NFT_GOTO: u32 = -4i32 as u32;
pub(super) const NFT_RETURN: u32 = -5i32 as u32;

// enum nft_registers: the verdict register, the 16-byte registers and the 4-byte ones.
pub(super) const NFT_REG_VERDICT: u32 = 0;
pub(super) const NFT_REG_1: u32 = 1;
pub(super) const NFT_REG_2: u32 = 2;
pub(super) const NFT_REG32_00: u32 = 8;

// enum nft_expr_attributes
pub(super) const NFTA_EXPR_NAME: u16 = 1;
pub(super) const NFTA_EXPR_DATA: u16 = 2;

// Expression attributes, by expression.
pub(super) const NFTA_IMMEDIATE_DREG: u16 = 1;
pub(super) const NFTA_IMMEDIATE_DATA: u16 = 2;
pub(super) const NFTA_BITWISE_SREG: u16 = 1;
pub(super) const NFTA_BITWISE_DREG: u16 = 2;
pub(super) const NFTA_BITWISE_LEN: u16 = 3;
pub(super) const NFTA_BITWISE_MASK: u16 = 4;
pub(super) const NFTA_BITWISE_XOR: u16 = 5;
pub(super) const NFTA_BITWISE_OP: u16 = 6;
pub(super) const NFT_BITWISE_MASK_XOR: u32 = 0;
pub(super) const NFTA_CMP_SREG: u16 = 1;
pub(super) const NFTA_CMP_OP: u16 = 2;
pub(super) const NFTA_CMP_DATA: u16 = 3;
pub(super) const NFT_CMP_EQ: u32 = 0;
pub(super) const NFT_CMP_NEQ: u32 = 1;
pub(super) const NFTA_LOOKUP_SET: u16 = 1;
pub(super) const NFTA_LOOKUP_SREG: u16 = 2;
pub(super) const NFTA_LOOKUP_DREG: u16 = 3;
pub(super) const NFTA_LOOKUP_SET_ID: u16 = 4;
pub(super) const NFTA_LOOKUP_FLAGS: u16 = 5;
pub(super) const NFT_LOOKUP_F_INV: u32 = 1;
pub(super) const NFTA_DYNSET_SET_NAME: u16 = 1;
pub(super) const NFTA_DYNSET_SET_ID: u16 = 2;
pub(super) const NFTA_DYNSET_OP: u16 = 3;
pub(super) const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub(super) const NFT_DYNSET_OP_UPDATE: u32 = 1;
pub(super) const NFTA_PAYLOAD_DREG: u16 = 1;
pub(super) const NFTA_PAYLOAD_BASE: u16 = 2;
pub(super) const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub(super) const NFTA_PAYLOAD_LEN: u16 = 4;
pub(super) const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub(super) const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub(super) const NFTA_META_DREG: u16 = 1;
pub(super) const NFTA_META_KEY: u16 = 2;
pub(super) const NFTA_META_SREG: u16 = 3;
pub(super) const NFT_META_MARK: u32 = 3;
pub(super) const NFT_META_L4PROTO: u32 = 16;
pub(super) const NFTA_CT_DREG: u16 = 1;
pub(super) const NFTA_CT_KEY: u16 = 2;
pub(super) const NFT_CT_STATE: u32 = 0;
/// `NF_CT_STATE_BIT(IP_CT_NEW)` from linux/netfilter/nf_conntrack_common.h.
pub(super) const NF_CT_STATE_NEW_BIT: u32 = 1 << 3;
pub(super) const NFTA_NG_DREG: u16 = 1;
pub(super) const NFTA_NG_MODULUS: u16 = 2;
pub(super) const NFTA_NG_TYPE: u16 = 3;
pub(super) const NFTA_NG_OFFSET: u16 = 4;
pub(super) const NFT_NG_RANDOM: u32 = 1;
pub(super) const NFTA_NAT_TYPE: u16 = 1;
pub(super) const NFTA_NAT_FAMILY: u16 = 2;
pub(super) const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub(super) const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub(super) const NFTA_NAT_FLAGS: u16 = 7;
pub(super) const NFT_NAT_DNAT: u32 = 1;
/// linux/netfilter/nf_nat.h
pub(super) const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 1 << 1;
pub(super) const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 1 << 4;
pub(super) const NFTA_MASQ_FLAGS: u16 = 1;
pub(super) const NFTA_REJECT_TYPE: u16 = 1;
pub(super) const NFTA_REJECT_ICMP_CODE: u16 = 2;
pub(super) const NFT_REJECT_ICMP_UNREACH: u32 = 0;
pub(super) const NFT_REJECT_TCP_RST: u32 = 1;
/// ICMP_PORT_UNREACH (linux/icmp.h) and ICMPV6_PORT_UNREACH (linux/icmpv6.h).
pub(super) const ICMP_PORT_UNREACH: u8 = 3;
pub(super) const ICMPV6_PORT_UNREACH: u8 = 4;
pub(super) const NFTA_FIB_DREG: u16 = 1;
pub(super) const NFTA_FIB_RESULT: u16 = 2;
pub(super) const NFTA_FIB_FLAGS: u16 = 3;
pub(super) const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub(super) const NFTA_FIB_F_SADDR: u32 = 1 << 0;
pub(super) const NFTA_FIB_F_DADDR: u32 = 1 << 1;
/// RTN_LOCAL from linux/rtnetlink.h: what `fib ... type` yields for a local address.
pub(super) const RTN_LOCAL: u32 = 2;

/// Netfilter hook numbers (enum nf_inet_hooks).
pub(super) const NF_INET_PRE_ROUTING: u32 = 0;
pub(super) const NF_INET_LOCAL_IN: u32 = 1;
pub(super) const NF_INET_FORWARD: u32 = 2;
pub(super) const NF_INET_LOCAL_OUT: u32 = 3;
pub(super) const NF_INET_POST_ROUTING: u32 = 4;

const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

/// Rounds up to the 4-byte alignment of netlink messages and attributes.
pub(super) const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// Builds netlink messages back to back into one buffer; lengths are patched in when a
/// message or nested attribute ends, so nothing is built twice.
#[derive(Debug, Default)]
pub(super) struct Writer {
    pub(super) buf: Vec<u8>,
}

impl Writer {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Writer { buf: Vec::with_capacity(capacity) }
    }

    /// Starts a message with its nfgenmsg header; returns its offset for [`Writer::end_message`].
    pub(super) fn begin_message(&mut self, msg_type: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&msg_type.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    pub(super) fn end_message(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    pub(super) fn bytes(&mut self, attr_type: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&attr_type.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    pub(super) fn u32(&mut self, attr_type: u16, value: u32) {
        self.bytes(attr_type, &value.to_be_bytes());
    }

    pub(super) fn u64(&mut self, attr_type: u16, value: u64) {
        self.bytes(attr_type, &value.to_be_bytes());
    }

    pub(super) fn u8(&mut self, attr_type: u16, value: u8) {
        self.bytes(attr_type, &[value]);
    }

    /// A NUL-terminated string, as nf_tables expects names.
    pub(super) fn string(&mut self, attr_type: u16, value: &str) {
        let len = 4 + value.len() + 1;
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&attr_type.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    pub(super) fn begin_nest(&mut self, attr_type: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(attr_type | NLA_F_NESTED).to_ne_bytes());
        start
    }

    pub(super) fn end_nest(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// `attr_type { NFTA_DATA_VALUE: data }`.
    pub(super) fn data_value(&mut self, attr_type: u16, data: &[u8]) {
        let nest = self.begin_nest(attr_type);
        self.bytes(NFTA_DATA_VALUE, data);
        self.end_nest(nest);
    }

    fn pad(&mut self) {
        let padded = align(self.buf.len());
        self.buf.resize(padded, 0);
    }
}

/// User data in libnftnl's TLV layout (one byte type, one byte length), which nft stores in
/// tables, chains, rules, sets and elements, and reads back to list them.
#[derive(Debug, Default)]
pub(super) struct UserData {
    pub(super) buf: Vec<u8>,
}

impl UserData {
    pub(super) fn bytes(&mut self, tlv_type: u8, data: &[u8]) -> &mut Self {
        self.buf.push(tlv_type);
        self.buf.push(data.len() as u8);
        self.buf.extend_from_slice(data);
        self
    }

    /// A u32 in host order, as libnftnl's `nftnl_udata_put_u32` writes it.
    pub(super) fn u32(&mut self, tlv_type: u8, value: u32) -> &mut Self {
        self.bytes(tlv_type, &value.to_ne_bytes())
    }

    /// A NUL-terminated string.
    pub(super) fn string(&mut self, tlv_type: u8, value: &str) -> &mut Self {
        self.buf.push(tlv_type);
        self.buf.push((value.len() + 1) as u8);
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self
    }

    /// A nested TLV list.
    pub(super) fn nest(&mut self, tlv_type: u8, inner: &UserData) -> &mut Self {
        self.bytes(tlv_type, &inner.buf)
    }
}

/// One netlink message as received.
#[derive(Debug, Clone, Copy)]
pub(super) struct Message<'a> {
    pub(super) msg_type: u16,
    pub(super) flags: u16,
    pub(super) seq: u32,
    /// Everything after the netlink header.
    pub(super) payload: &'a [u8],
}

/// Splits a buffer of back-to-back netlink messages.
pub(super) fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let message = Message {
            msg_type: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes(buf[8..12].try_into().ok()?),
            payload: &buf[NLMSG_HDRLEN..len],
        };
        buf = &buf[align(len).min(buf.len())..];
        Some(message)
    })
}

/// One attribute: its type (flags stripped), where it starts in the buffer it was read
/// from, and its payload.
#[derive(Debug, Clone, Copy)]
pub(super) struct Attr<'a> {
    pub(super) attr_type: u16,
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) data: &'a [u8],
}

impl Attr<'_> {
    pub(super) fn be_u32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.data.get(..4)?.try_into().ok()?))
    }

    pub(super) fn be_u64(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.data.get(..8)?.try_into().ok()?))
    }

    pub(super) fn ne_u32(&self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.data.get(..4)?.try_into().ok()?))
    }

    pub(super) fn string(&self) -> String {
        let bytes = self.data.split(|byte| *byte == 0).next().unwrap_or_default();
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// The attributes in `buf`, which starts `base` bytes into the message it belongs to (so
/// that each attribute's offset is relative to that message).
pub(super) fn attrs(buf: &[u8], base: usize) -> impl Iterator<Item = Attr<'_>> {
    let mut position = 0;
    std::iter::from_fn(move || {
        let header = buf.get(position..position + 4)?;
        let len = u16::from_ne_bytes([header[0], header[1]]) as usize;
        let attr_type = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        if len < 4 || position + len > buf.len() {
            return None;
        }
        let attr = Attr { attr_type, offset: base + position, len, data: &buf[position + 4..position + len] };
        position += align(len);
        Some(attr)
    })
}

/// The attributes of an nfnetlink message's payload (after the nfgenmsg header); offsets
/// count from the start of the netlink header.
pub(super) fn message_attrs(payload: &[u8]) -> impl Iterator<Item = Attr<'_>> {
    attrs(payload.get(NFGENMSG_LEN..).unwrap_or_default(), NLMSG_HDRLEN + NFGENMSG_LEN)
}

/// What an `NLMSG_ERROR` message says: the error number (0 for an ack), the sequence number
/// of the message it answers, and the extended ack if the kernel gave one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ack {
    pub(super) errno: i32,
    pub(super) seq: u32,
    /// Offset of the offending attribute from the start of the message answered.
    pub(super) bad_attr_offset: Option<u32>,
    pub(super) message: Option<String>,
}

pub(super) fn parse_ack(message: &Message<'_>) -> Option<Ack> {
    let payload = message.payload;
    let error = i32::from_ne_bytes(payload.get(0..4)?.try_into().ok()?);
    let original = payload.get(4..4 + NLMSG_HDRLEN)?;
    let original_len = u32::from_ne_bytes(original[0..4].try_into().ok()?) as usize;
    let seq = u32::from_ne_bytes(original[8..12].try_into().ok()?);
    let mut ack = Ack { errno: errno_of(error), seq, bad_attr_offset: None, message: None };
    if message.flags & NLM_F_ACK_TLVS != 0 {
        // The answered message follows in full unless the kernel capped it to its header.
        let echoed = if message.flags & NLM_F_CAPPED != 0 { NLMSG_HDRLEN } else { align(original_len) };
        let tlvs = payload.get(4 + echoed..).unwrap_or_default();
        for attr in attrs(tlvs, 0) {
            match attr.attr_type {
                NLMSGERR_ATTR_OFFS => ack.bad_attr_offset = attr.ne_u32(),
                NLMSGERR_ATTR_MSG => ack.message = Some(attr.string()),
                _ => {}
            }
        }
    }
    Some(ack)
}

/// What an `NLMSG_DONE` message (the end of a dump) says: its error number, 0 when the
/// payload holds none.
pub(super) fn parse_done(message: &Message<'_>) -> Ack {
    let error = message.payload.get(..4).and_then(|bytes| bytes.try_into().ok()).map_or(0, i32::from_ne_bytes);
    Ack { errno: errno_of(error), seq: message.seq, bad_attr_offset: None, message: None }
}

/// The error number of a netlink error field (`-errno`, 0 for success). The kernel never
/// sends `i32::MIN`, which has no positive counterpart; it reads as the largest error number
/// (an unknown error, never success) rather than overflowing.
fn errno_of(error: i32) -> i32 {
    error.saturating_neg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_nests_carry_their_lengths() {
        let mut writer = Writer::default();
        let start = writer.begin_message(NFT_MSG_NEWTABLE, NLM_F_REQUEST, 7, NFPROTO_IPV4, 0);
        writer.string(NFTA_TABLE_NAME, "t");
        let nest = writer.begin_nest(NFTA_CHAIN_HOOK);
        writer.u32(NFTA_HOOK_HOOKNUM, 3);
        writer.end_nest(nest);
        writer.end_message(start);
        let buf = &writer.buf;
        assert_eq!(buf.len() % 4, 0);
        let parsed: Vec<_> = messages(buf).collect();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].seq, 7);
        let attrs: Vec<_> = message_attrs(parsed[0].payload).collect();
        assert_eq!(attrs[0].attr_type, NFTA_TABLE_NAME);
        assert_eq!(attrs[0].string(), "t");
        assert_eq!(attrs[0].offset, 20);
        assert_eq!(attrs[1].attr_type, NFTA_CHAIN_HOOK);
        let inner: Vec<_> = super::attrs(attrs[1].data, 0).collect();
        assert_eq!(inner[0].be_u32(), Some(3));
    }

    /// An `NLMSG_ERROR` message answering sequence number 7 with the error field `error`.
    fn error_message(msg_type: u16, error: i32) -> Vec<u8> {
        let mut buf = Vec::new();
        buf.extend_from_slice(&36u32.to_ne_bytes());
        buf.extend_from_slice(&msg_type.to_ne_bytes());
        buf.extend_from_slice(&0u16.to_ne_bytes());
        buf.extend_from_slice(&7u32.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&error.to_ne_bytes());
        // The answered message's header: length 16, sequence number 7.
        buf.extend_from_slice(&16u32.to_ne_bytes());
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&7u32.to_ne_bytes());
        buf.extend_from_slice(&[0; 4]);
        buf
    }

    // Found by the fuzz target `netlink_replies`: negating the error field overflowed.
    #[test]
    fn an_error_field_of_i32_min_reads_as_an_unknown_error_instead_of_overflowing() {
        let buf = error_message(NLMSG_ERROR, i32::MIN);
        let message = messages(&buf).next().unwrap();
        let ack = parse_ack(&message).unwrap();
        assert_eq!((ack.errno, ack.seq), (i32::MAX, 7));
        assert_eq!(parse_done(&message).errno, i32::MAX);
    }

    #[test]
    fn an_error_field_of_minus_enoent_reads_as_enoent_and_zero_as_an_ack() {
        let buf = error_message(NLMSG_ERROR, -libc::ENOENT);
        assert_eq!(parse_ack(&messages(&buf).next().unwrap()).unwrap().errno, libc::ENOENT);
        let buf = error_message(NLMSG_ERROR, 0);
        assert_eq!(parse_ack(&messages(&buf).next().unwrap()).unwrap().errno, 0);
    }

    #[test]
    fn user_data_is_type_length_value() {
        let mut data = UserData::default();
        data.u32(0, 2).string(7, "ab");
        let two = 2u32.to_ne_bytes();
        assert_eq!(data.buf, [0, 4, two[0], two[1], two[2], two[3], 7, 3, b'a', b'b', 0]);
    }
}
