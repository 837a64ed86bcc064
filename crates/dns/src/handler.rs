//! Answering one request from the current zone snapshot, for both transports: the shared
//! snapshot, the decision the zone alone can make ([`Handler::decide`]), the part that asks
//! the upstream resolvers, and hickory's request handler (TCP) built on them. The UDP loop (the
//! `udp` module) uses the same decisions on raw bytes.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use hickory_proto::op::{Edns, Header, HeaderCounts, LowerQuery, Metadata, Query, ResponseCode};
use hickory_proto::rr::Record;
use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tracing::debug;

use crate::answer::{Inquiry, Outcome, Reply, respond};
use crate::forward::Forwarder;
use crate::metrics::{DnsMetrics, Proto, Source};
use crate::wire::{response_edns, response_metadata};
use crate::zone::Zone;

/// The current zone snapshot, shared between the server and whoever builds snapshots.
#[derive(Debug, Clone)]
pub struct SharedZone(Arc<ArcSwap<Zone>>);

impl SharedZone {
    pub fn new(zone: Zone) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(zone)))
    }

    /// Replaces the snapshot; questions already being answered finish on the old one.
    pub fn publish(&self, zone: Zone) {
        self.0.store(Arc::new(zone));
    }

    pub fn current(&self) -> Arc<Zone> {
        self.0.load_full()
    }
}

/// Answers requests from the current snapshot, forwarding what lies outside the zone.
#[derive(Debug, Clone)]
pub struct Handler {
    zone: SharedZone,
    forwarder: Option<Forwarder>,
    metrics: Option<Arc<DnsMetrics>>,
}

impl Handler {
    /// `forwarder` should be given exactly when the zone's config has forwarding on.
    pub fn new(zone: SharedZone, forwarder: Option<Forwarder>) -> Self {
        Self { zone, forwarder, metrics: None }
    }

    /// Counts every request and response in `metrics` (CoreDNS's request metrics).
    pub fn with_metrics(mut self, metrics: Arc<DnsMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    async fn send<R: ResponseHandler>(
        request: &Request,
        metadata: Metadata,
        reply: &Reply,
        mut handle: R,
    ) -> ResponseInfo {
        let edns: Option<Edns> = response_edns(request.edns.as_ref());
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(edns) = &edns {
            builder.edns(edns);
        }
        let message = builder.build(
            metadata,
            reply.answers.iter(),
            reply.authorities.iter(),
            std::iter::empty::<&Record>(),
            reply.additionals.iter(),
        );
        match handle.send_response(message).await {
            Ok(info) => info,
            Err(error) => {
                debug!(%error, client = %request.src(), "could not send the response");
                unsent(metadata)
            }
        }
    }

    /// Relays `forwarded`, an upstream's answer, as the answer to `request`.
    fn relay(request: &Metadata, forwarded: hickory_proto::op::Message) -> (Metadata, Reply) {
        let mut metadata = Metadata::response_from_request(request);
        metadata.response_code = forwarded.metadata.response_code;
        metadata.recursion_available = true;
        let reply = Reply {
            response_code: forwarded.metadata.response_code,
            authoritative: false,
            answers: forwarded.answers,
            authorities: forwarded.authorities,
            additionals: forwarded.additionals,
        };
        (metadata, reply)
    }
}

fn unsent(metadata: Metadata) -> ResponseInfo {
    ResponseInfo::from(Header { metadata, counts: HeaderCounts::default() })
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(&self, request: &Request, handle: R) -> ResponseInfo {
        let Some(metrics) = &self.metrics else {
            return self.answer(request, handle).await.0;
        };
        let started = Instant::now();
        let query_type = request.queries.queries().first().map(|q| u16::from(q.query_type()));
        let proto = if request.protocol() == Protocol::Udp { Proto::Udp } else { Proto::Tcp };
        metrics.request(proto, request.src().is_ipv6(), query_type, request.as_slice().len());
        let (info, source) = self.answer(request, handle).await;
        if let Some(source) = source {
            metrics.response(query_type, u16::from(info.response_code), source, started.elapsed());
        }
        info
    }
}

/// What the zone alone decides for one request.
pub(crate) enum Decided {
    /// Say nothing (the message was a response).
    Nothing,
    /// Send this header and these records; `source` is the part that answered. Such an answer
    /// depends only on the request and the zone snapshot.
    Send { metadata: Metadata, reply: Reply, source: Source },
    /// The upstream resolvers must be asked first ([`Outcome::Forward`] or
    /// [`Outcome::Chase`], only ever with a forwarder).
    Upstream(Outcome),
}

impl Handler {
    pub(crate) fn zone(&self) -> &SharedZone {
        &self.zone
    }

    pub(crate) fn metrics(&self) -> Option<&DnsMetrics> {
        self.metrics.as_deref()
    }

    /// Decides what the zone alone can: everything but what needs the upstreams.
    pub(crate) fn decide(&self, zone: &Zone, inquiry: &Inquiry<'_>) -> Decided {
        match respond(zone, inquiry) {
            Outcome::Drop => Decided::Nothing,
            Outcome::Reply(reply) => {
                let metadata = response_metadata(inquiry.metadata, &reply);
                Decided::Send { metadata, reply, source: Source::Kubernetes }
            }
            Outcome::Chase { reply, .. } if self.forwarder.is_none() => {
                let metadata = response_metadata(inquiry.metadata, &reply);
                Decided::Send { metadata, reply, source: Source::Kubernetes }
            }
            Outcome::Forward if self.forwarder.is_none() => {
                let reply = Reply::error(ResponseCode::Refused);
                Decided::Send { metadata: response_metadata(inquiry.metadata, &reply), reply, source: Source::Server }
            }
            outcome @ (Outcome::Chase { .. } | Outcome::Forward) => Decided::Upstream(outcome),
        }
    }

    /// Completes an answer that needs the upstreams: follows a CNAME out of the zone, or
    /// relays the upstreams' answer to `packet` (whose header is `request` and whose first
    /// question is `question`).
    pub(crate) async fn ask_upstream(
        &self,
        outcome: Outcome,
        request: &Metadata,
        question: Option<&Query>,
        packet: &[u8],
    ) -> (Metadata, Reply, Source) {
        let forwarder = self.forwarder.as_ref();
        match outcome {
            Outcome::Chase { mut reply, target, query_type } => {
                if let Some(forwarder) = forwarder {
                    match forwarder.resolve(&target, query_type).await {
                        Ok(found) if found.metadata.response_code == ResponseCode::NoError => {
                            reply.answers.extend(found.answers);
                            reply.authorities.clear();
                        }
                        Ok(_) => {}
                        Err(error) => debug!(%error, %target, "could not follow the CNAME upstream"),
                    }
                }
                let mut metadata = response_metadata(request, &reply);
                metadata.recursion_available = forwarder.is_some();
                (metadata, reply, Source::Kubernetes)
            }
            _ => match (forwarder, question) {
                (Some(forwarder), Some(question)) => match forwarder.forward(packet, question).await {
                    Ok(forwarded) => {
                        let (metadata, reply) = Self::relay(request, forwarded);
                        (metadata, reply, Source::Forward)
                    }
                    Err(error) => {
                        // Per query, so debug: a dead upstream would otherwise flood the log.
                        debug!(%error, name = %question.name(), "forwarding failed; answering SERVFAIL");
                        let reply = Reply::error(ResponseCode::ServFail);
                        (response_metadata(request, &reply), reply, Source::Forward)
                    }
                },
                _ => {
                    let reply = Reply::error(ResponseCode::Refused);
                    (response_metadata(request, &reply), reply, Source::Server)
                }
            },
        }
    }

    /// Answers `request` (TCP, through hickory's loop); also says which part answered
    /// (`None`: nothing was sent).
    async fn answer<R: ResponseHandler>(&self, request: &Request, handle: R) -> (ResponseInfo, Option<Source>) {
        let zone = self.zone.current();
        let queries = request.queries.queries();
        let question = queries.first().map(LowerQuery::original);
        let inquiry = Inquiry {
            metadata: &request.metadata,
            question_count: queries.len(),
            question,
            edns_version: request.edns.as_ref().map(Edns::version),
        };
        let (metadata, reply, source) = match self.decide(&zone, &inquiry) {
            Decided::Nothing => return (unsent(Metadata::response_from_request(&request.metadata)), None),
            Decided::Send { metadata, reply, source } => (metadata, reply, source),
            Decided::Upstream(outcome) => {
                drop(zone);
                self.ask_upstream(outcome, &request.metadata, question, request.as_slice()).await
            }
        };
        (Self::send(request, metadata, &reply, handle).await, Some(source))
    }
}
