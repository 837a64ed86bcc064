//! The answering function on the wire: request bytes in, response bytes out. Pure, like
//! [`crate::respond`] which it wraps; the fuzz target and the property tests drive this, and
//! the server's handler goes through the same [`crate::respond`].

use hickory_proto::op::{Edns, Header, Message, Metadata, ResponseCode};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder};

use crate::answer::{Inquiry, Outcome, Reply, respond};
use crate::zone::Zone;

/// Largest UDP payload we answer with, whatever the client offers (RFC 9715's advice keeps
/// responses below fragmentation; dig offers 1232).
pub const MAX_UDP_PAYLOAD: u16 = 4096;

/// How a message arrived, which bounds the size of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// At most 512 bytes, or the EDNS payload size the request offers (up to
    /// [`MAX_UDP_PAYLOAD`]); larger answers are truncated and have TC set.
    Udp,
    Tcp,
}

/// What to do with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireOutcome {
    Send(Vec<u8>),
    /// The question is for upstream resolvers (see [`Outcome::Forward`]).
    Forward,
    /// Too short to answer, a response, or unencodable: say nothing.
    Drop,
}

/// The EDNS record of a response to a request that had `request` (none if it had none).
pub fn response_edns(request: Option<&Edns>) -> Option<Edns> {
    request.map(|request| {
        let mut edns = Edns::new();
        edns.set_max_payload(request.max_payload().clamp(512, MAX_UDP_PAYLOAD));
        edns.set_version(0);
        edns
    })
}

/// The response header for `request` carrying `reply`'s code and AA flag.
pub fn response_metadata(request: &Metadata, reply: &Reply) -> Metadata {
    let mut metadata = Metadata::response_from_request(request);
    metadata.response_code = reply.response_code;
    metadata.authoritative = reply.authoritative;
    metadata
}

/// Answers one request packet. Malformed requests whose header can be read get FORMERR;
/// anything shorter than a header gets nothing.
pub fn respond_to_wire(zone: &Zone, packet: &[u8], transport: Transport) -> WireOutcome {
    let mut decoder = BinDecoder::new(packet);
    let Ok(header) = Header::read(&mut decoder) else {
        return WireOutcome::Drop;
    };
    let request = match Message::from_vec(packet) {
        Ok(request) => request,
        Err(_) => {
            if header.metadata.message_type == hickory_proto::op::MessageType::Response {
                return WireOutcome::Drop;
            }
            let mut metadata = Metadata::response_from_request(&header.metadata);
            metadata.response_code = ResponseCode::FormErr;
            let mut response = Message::response(header.metadata.id, header.metadata.op_code);
            response.metadata = metadata;
            return encode(&response, 512).map_or(WireOutcome::Drop, WireOutcome::Send);
        }
    };
    let inquiry = Inquiry {
        metadata: &request.metadata,
        question_count: request.queries.len(),
        question: request.queries.first(),
        edns_version: request.edns.as_ref().map(Edns::version),
    };
    let reply = match respond(zone, &inquiry) {
        Outcome::Drop => return WireOutcome::Drop,
        Outcome::Forward => return WireOutcome::Forward,
        Outcome::Reply(reply) | Outcome::Chase { reply, .. } => reply,
    };
    let edns = response_edns(request.edns.as_ref());
    let max_size = match transport {
        Transport::Udp => edns.as_ref().map_or(512, Edns::max_payload),
        Transport::Tcp => u16::MAX,
    };
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata = response_metadata(&request.metadata, &reply);
    response.queries = request.queries;
    response.answers = reply.answers;
    response.authorities = reply.authorities;
    response.additionals = reply.additionals;
    response.edns = edns;
    encode(&response, max_size).map_or(WireOutcome::Drop, WireOutcome::Send)
}

/// `message` on the wire, at most `max_size` bytes (records that do not fit are left out
/// and TC is set); `None` when it cannot be encoded at all.
pub(crate) fn encode(message: &Message, max_size: u16) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut bytes);
    encoder.set_max_size(max_size);
    message.emit(&mut encoder).ok()?;
    Some(bytes)
}
