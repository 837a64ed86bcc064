//! The UDP loop: requests answered straight from the socket, with a cache of encoded answers
//! per zone snapshot.
//!
//! A UDP request costs hickory-server's pipeline (a task per request, the request parsed
//! into its types, the answer built and encoded) even when the same question was answered a
//! moment ago from the same snapshot. Answers that come from the zone alone depend only on
//! the request's bytes after its ID and on the snapshot, so each worker keeps the bytes it
//! sent, keyed by those request bytes, until the snapshot changes: a repeated question is
//! one hash lookup and a copy with the new ID. Nothing goes stale: a new snapshot empties
//! the cache, and a cached answer is exactly what the zone would answer again.
//!
//! Answers that need the upstream resolvers (forwarded names, CNAMEs chased out of the zone)
//! are never cached and are finished on a task of their own, so a slow upstream never holds
//! up the loop. TCP stays on hickory's loop (in the `server` module).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, Metadata, ResponseCode};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};
use tokio::net::UdpSocket;
use tracing::debug;

use crate::answer::{Inquiry, Reply};
use crate::handler::{Decided, Handler};
use crate::metrics::{Proto, Source};
use crate::wire::{encode, response_edns};
use crate::zone::Zone;

/// The size of a DNS header; anything shorter is no request.
const HEADER_LEN: usize = 12;
/// Answers a worker keeps per snapshot before it starts over (CoreDNS's `cache` plugin
/// keeps about 10k per kind by default).
const CACHE_CAPACITY: usize = 16_384;
/// The largest request read: a UDP datagram's payload can be no larger.
const MAX_REQUEST: usize = 65_535;

/// One worker's answers for one snapshot.
#[derive(Debug, Default)]
struct AnswerCache {
    /// The snapshot the entries were answered from.
    snapshot: Option<u64>,
    /// Request bytes after the ID -> the encoded answer (its ID is overwritten per use).
    entries: HashMap<Box<[u8]>, Cached>,
}

#[derive(Debug)]
struct Cached {
    response: Box<[u8]>,
    response_code: u16,
    source: Source,
}

impl AnswerCache {
    /// Empties the cache when `zone` is another snapshot than its entries came from.
    fn follow(&mut self, zone: &Zone) {
        if self.snapshot != Some(zone.snapshot_id()) {
            self.entries.clear();
            self.snapshot = Some(zone.snapshot_id());
        }
    }

    fn get(&self, request: &[u8]) -> Option<&Cached> {
        self.entries.get(&request[2..])
    }

    fn insert(&mut self, request: &[u8], cached: Cached) {
        if self.entries.len() >= CACHE_CAPACITY {
            self.entries.clear();
        }
        self.entries.insert(request[2..].into(), cached);
    }
}

/// The first question's type, read straight from the bytes (for the metrics), if the request
/// has a question and it is well formed enough to find.
pub fn question_type(packet: &[u8]) -> Option<u16> {
    let questions = u16::from_be_bytes([*packet.get(4)?, *packet.get(5)?]);
    if questions == 0 {
        return None;
    }
    let mut at = HEADER_LEN;
    loop {
        let length = *packet.get(at)?;
        match length {
            0 => {
                at += 1;
                break;
            }
            // A compression pointer ends the name.
            l if l & 0xC0 == 0xC0 => {
                at += 2;
                break;
            }
            l if l & 0xC0 == 0 => at += 1 + usize::from(l),
            _ => return None,
        }
    }
    Some(u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]))
}

/// What one request gets, as far as the worker can tell without waiting.
enum Answered {
    Nothing,
    /// Encoded; `cacheable` when it came from the zone alone.
    Bytes {
        response: Vec<u8>,
        response_code: u16,
        source: Source,
        cacheable: bool,
    },
    /// Needs the upstreams: finished on a task of its own.
    Upstream {
        request: Box<Message>,
        decided: Decided,
    },
}

/// The largest answer a UDP request may get: 512 bytes, or what its EDNS record offers.
fn udp_limit(edns: Option<&Edns>) -> u16 {
    edns.map_or(512, Edns::max_payload)
}

/// The whole response message for `request`: its header `metadata`, the question section
/// echoed, `reply`'s records and EDNS when the request had it.
fn response_to(request: &Message, metadata: Metadata, reply: Reply) -> Message {
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata = metadata;
    response.queries = request.queries.clone();
    response.answers = reply.answers;
    response.authorities = reply.authorities;
    response.additionals = reply.additionals;
    response.edns = response_edns(request.edns.as_ref());
    response
}

/// Answers one request from `zone`, as hickory's loop would: nothing for what is shorter
/// than a header or is a response, FORMERR for what cannot be parsed.
fn answer_locally(handler: &Handler, zone: &Zone, packet: &[u8]) -> Answered {
    let request = match Message::from_vec(packet) {
        Ok(request) => request,
        Err(_) => {
            let mut decoder = BinDecoder::new(packet);
            let Ok(header) = hickory_proto::op::Header::read(&mut decoder) else {
                return Answered::Nothing;
            };
            if header.metadata.message_type == MessageType::Response {
                return Answered::Nothing;
            }
            let mut metadata = Metadata::response_from_request(&header.metadata);
            metadata.response_code = ResponseCode::FormErr;
            let mut response = Message::response(header.metadata.id, header.metadata.op_code);
            response.metadata = metadata;
            return match encode(&response, 512) {
                Some(response) => Answered::Bytes {
                    response,
                    response_code: u16::from(ResponseCode::FormErr),
                    source: Source::Server,
                    cacheable: false,
                },
                None => Answered::Nothing,
            };
        }
    };
    let inquiry = Inquiry {
        metadata: &request.metadata,
        question_count: request.queries.len(),
        question: request.queries.first(),
        edns_version: request.edns.as_ref().map(Edns::version),
    };
    match handler.decide(zone, &inquiry) {
        Decided::Nothing => Answered::Nothing,
        Decided::Send { metadata, reply, source } => {
            let response_code = u16::from(reply.response_code);
            let limit = udp_limit(request.edns.as_ref());
            match encode(&response_to(&request, metadata, reply), limit) {
                Some(response) => Answered::Bytes { response, response_code, source, cacheable: true },
                None => Answered::Nothing,
            }
        }
        decided @ Decided::Upstream(_) => Answered::Upstream { request: Box::new(request), decided },
    }
}

/// Serves UDP requests from `socket` until `stop` completes. Several workers may share one
/// socket; each keeps its own cache.
pub(crate) async fn serve(socket: Arc<UdpSocket>, handler: Handler, stop: impl Future<Output = ()>) {
    let mut buffer = vec![0u8; MAX_REQUEST];
    let mut cache = AnswerCache::default();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (length, client) = tokio::select! {
            () = &mut stop => return,
            received = socket.recv_from(&mut buffer) => match received {
                Ok(received) => received,
                Err(error) => {
                    debug!(%error, "could not receive a UDP request");
                    continue;
                }
            },
        };
        let packet = &buffer[..length];
        // What hickory's loop ignores: shorter than a header, or a response.
        if length < HEADER_LEN || packet[2] & 0x80 != 0 {
            continue;
        }
        let started = Instant::now();
        let query_type = question_type(packet);
        if let Some(metrics) = handler.metrics() {
            metrics.request(Proto::Udp, client.is_ipv6(), query_type, length);
        }
        let zone = handler.zone().current();
        cache.follow(&zone);
        if let Some(cached) = cache.get(packet) {
            let mut response = cached.response.to_vec();
            response[..2].copy_from_slice(&packet[..2]);
            send(&socket, &response, client).await;
            if let Some(metrics) = handler.metrics() {
                metrics.response(query_type, cached.response_code, cached.source, started.elapsed());
            }
            continue;
        }
        match answer_locally(&handler, &zone, packet) {
            Answered::Nothing => {}
            Answered::Bytes { response, response_code, source, cacheable } => {
                send(&socket, &response, client).await;
                if let Some(metrics) = handler.metrics() {
                    metrics.response(query_type, response_code, source, started.elapsed());
                }
                if cacheable {
                    cache.insert(packet, Cached { response: response.into(), response_code, source });
                }
            }
            Answered::Upstream { request, decided: Decided::Upstream(outcome) } => {
                let (socket, handler, packet) = (Arc::clone(&socket), handler.clone(), packet.to_vec());
                tokio::spawn(async move {
                    let question = request.queries.first();
                    let (metadata, reply, source) =
                        handler.ask_upstream(outcome, &request.metadata, question, &packet).await;
                    let response_code = u16::from(reply.response_code);
                    if let Some(response) =
                        encode(&response_to(&request, metadata, reply), udp_limit(request.edns.as_ref()))
                    {
                        send(&socket, &response, client).await;
                        if let Some(metrics) = handler.metrics() {
                            metrics.response(query_type, response_code, source, started.elapsed());
                        }
                    }
                });
            }
            Answered::Upstream { .. } => unreachable!("only Decided::Upstream is passed on"),
        }
    }
}

async fn send(socket: &UdpSocket, response: &[u8], client: SocketAddr) {
    if let Err(error) = socket.send_to(response, client).await {
        debug!(%error, %client, "could not send the response");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, query_type: u16) -> Vec<u8> {
        let mut packet = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.').filter(|label| !label.is_empty()) {
            packet.push(u8::try_from(label.len()).unwrap());
            packet.extend_from_slice(label.as_bytes());
        }
        packet.push(0);
        packet.extend_from_slice(&query_type.to_be_bytes());
        packet.extend_from_slice(&1u16.to_be_bytes());
        packet
    }

    #[test]
    fn the_question_type_is_read_from_the_bytes() {
        assert_eq!(question_type(&query("web.shop.svc.cluster.local", 33)), Some(33));
        assert_eq!(question_type(&query("", 1)), Some(1), "the root name");
    }

    #[test]
    fn a_request_without_a_question_or_cut_short_has_no_question_type() {
        let mut none = query("a.b", 1);
        none[5] = 0;
        assert_eq!(question_type(&none), None);
        let whole = query("web.shop.svc.cluster.local", 28);
        assert_eq!(question_type(&whole[..whole.len() - 3]), None);
        assert_eq!(question_type(&whole[..5]), None);
    }

    #[test]
    fn the_cache_keys_on_everything_but_the_id_and_empties_for_a_new_snapshot() {
        let config = Arc::new(crate::ZoneConfig::new("cluster.local").unwrap());
        let (first, second) = (Zone::pending(Arc::clone(&config)), Zone::pending(config));
        let mut cache = AnswerCache::default();
        cache.follow(&first);
        let asked = query("web.shop.svc.cluster.local", 1);
        cache
            .insert(&asked, Cached { response: vec![0, 0, 0x81].into(), response_code: 0, source: Source::Kubernetes });
        let mut again = asked.clone();
        again[..2].copy_from_slice(&[0xAB, 0xCD]);
        assert!(cache.get(&again).is_some(), "another ID, the same question");
        let mut other = asked.clone();
        *other.last_mut().unwrap() = 3;
        assert!(cache.get(&other).is_none(), "another class");
        cache.follow(&first);
        assert!(cache.get(&again).is_some(), "the same snapshot keeps its answers");
        cache.follow(&second);
        assert!(cache.get(&again).is_none(), "another snapshot starts empty");
    }
}
