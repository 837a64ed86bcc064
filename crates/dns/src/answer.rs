//! Answering: a pure function from a zone snapshot and one request to what to send back.
//!
//! No I/O and no clock: [`respond`] looks at the request header (opcode, question count, EDNS
//! version), the question's class and type, and then at where the name lies:
//!
//! - in the cluster zone: the records of the Kubernetes DNS specification (schema 1.1.0),
//!   with NXDOMAIN and NODATA told apart and the zone SOA in every negative answer, or
//!   SERVFAIL while the zone has not seen its first complete snapshot;
//! - under `in-addr.arpa` / `ip6.arpa` for an address the zone knows: its PTR records;
//! - anywhere else: [`Outcome::Forward`] when upstreams are configured, REFUSED otherwise.
//!
//! Owner names in answers echo the question's spelling (names compare case-insensitively).

use std::borrow::Cow;
use std::net::IpAddr;

use hickory_proto::op::{MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::model::protocol_from_srv_label;
use crate::names::{is_reverse_name, parse_dashed_ip, parse_reverse_name};
use crate::zone::{DNS_SCHEMA_VERSION, DNS_VERSION_TTL, Entry, PodRecords, ServiceEntry, Zone, name_under};

/// How many CNAMEs inside the zone are followed for one answer.
const MAX_CNAME_CHAIN: usize = 8;

/// What a request asks, as far as answering needs it.
#[derive(Debug, Clone, Copy)]
pub struct Inquiry<'a> {
    pub metadata: &'a Metadata,
    /// How many questions the request carried.
    pub question_count: usize,
    /// The first question, as spelled in the request.
    pub question: Option<&'a Query>,
    /// The EDNS version, when the request had an OPT record.
    pub edns_version: Option<u8>,
}

/// A response, less what the transport adds (header id and flags copied from the request,
/// the question section, EDNS, truncation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub response_code: ResponseCode,
    /// Set on every answer from the cluster zone (and its reverse names).
    pub authoritative: bool,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
}

impl Reply {
    /// An error with no records and no AA flag.
    pub fn error(response_code: ResponseCode) -> Self {
        Self {
            response_code,
            authoritative: false,
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: Vec::new(),
        }
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Send this.
    Reply(Reply),
    /// The name is outside the cluster's zones: ask the upstream resolvers and relay their answer.
    Forward,
    /// `reply` ends in a CNAME to `target`, outside the zone: the server may resolve
    /// `target`/`query_type` upstream and append those answers; `reply` is right without them.
    Chase { reply: Reply, target: Name, query_type: RecordType },
    /// Send nothing (the message was a response, not a query).
    Drop,
}

impl Outcome {
    /// The reply that is sent when nothing more can be learned upstream.
    pub fn into_reply(self) -> Option<Reply> {
        match self {
            Outcome::Reply(reply) | Outcome::Chase { reply, .. } => Some(reply),
            Outcome::Forward | Outcome::Drop => None,
        }
    }
}

/// Decides the answer to one request over one zone snapshot.
pub fn respond(zone: &Zone, inquiry: &Inquiry<'_>) -> Outcome {
    if inquiry.metadata.message_type == MessageType::Response {
        return Outcome::Drop;
    }
    if inquiry.metadata.op_code != OpCode::Query {
        return Outcome::Reply(Reply::error(ResponseCode::NotImp));
    }
    if inquiry.edns_version.is_some_and(|version| version > 0) {
        return Outcome::Reply(Reply::error(ResponseCode::BADVERS));
    }
    match (inquiry.question_count, inquiry.question) {
        (1, Some(query)) => answer(zone, query),
        _ => Outcome::Reply(Reply::error(ResponseCode::FormErr)),
    }
}

/// Answers one question (header checks are [`respond`]'s).
pub fn answer(zone: &Zone, query: &Query) -> Outcome {
    let query_type = query.query_type();
    match query.query_class() {
        DNSClass::IN | DNSClass::ANY => {}
        _ => return Outcome::Reply(Reply::error(ResponseCode::Refused)),
    }
    match query_type {
        RecordType::OPT => return Outcome::Reply(Reply::error(ResponseCode::FormErr)),
        // Zone transfers are not offered.
        RecordType::AXFR | RecordType::IXFR => return Outcome::Reply(Reply::error(ResponseCode::Refused)),
        RecordType::Unknown(253 | 254) => return Outcome::Reply(Reply::error(ResponseCode::NotImp)),
        _ => {}
    }

    let asked = query.name();
    let lower = asked.to_lowercase();
    let labels: Vec<Cow<'_, str>> = lower.iter().map(String::from_utf8_lossy).collect();
    let labels: Vec<&str> = labels.iter().map(AsRef::as_ref).collect();
    let config = zone.config();
    let origin = config.origin();

    if origin.zone_of(&lower) {
        if !zone.is_complete() {
            return Outcome::Reply(Reply::error(ResponseCode::ServFail));
        }
        let relative = &labels[..labels.len() - usize::from(origin.num_labels())];
        let mut chain = Chain::new(zone, query_type);
        chain.resolve(asked, relative);
        return chain.finish();
    }

    if is_reverse_name(&labels) {
        if !zone.is_complete() {
            return Outcome::Reply(Reply::error(ResponseCode::ServFail));
        }
        if let Some(ip) = parse_reverse_name(&labels)
            && let Some(names) = zone.reverse(&ip)
        {
            return Outcome::Reply(reverse_reply(zone, asked, query_type, ip, names));
        }
    }

    if config.is_forwarding() { Outcome::Forward } else { Outcome::Reply(Reply::error(ResponseCode::Refused)) }
}

fn wants(query_type: RecordType, record_type: RecordType) -> bool {
    query_type == record_type || query_type == RecordType::ANY
}

fn reverse_reply(zone: &Zone, asked: &Name, query_type: RecordType, ip: IpAddr, names: &[Name]) -> Reply {
    let ttl = zone.config().ttl();
    let mut reply = Reply { authoritative: true, ..Reply::error(ResponseCode::NoError) };
    if wants(query_type, RecordType::PTR) {
        reply.answers =
            names.iter().map(|name| Record::from_rdata(asked.clone(), ttl, RData::PTR(PTR(name.clone())))).collect();
    } else {
        // NODATA, with the SOA of the reverse tree the address lies in.
        let apex = match ip {
            IpAddr::V4(_) => "in-addr.arpa.",
            IpAddr::V6(_) => "ip6.arpa.",
        };
        let RData::SOA(zone_soa) = &zone.soa().data else {
            return reply;
        };
        let Ok(owner) = Name::from_ascii(apex) else {
            return reply;
        };
        let soa = SOA::new(
            zone_soa.mname.clone(),
            zone_soa.rname.clone(),
            zone_soa.serial,
            zone_soa.refresh,
            zone_soa.retry,
            zone_soa.expire,
            zone_soa.minimum,
        );
        reply.authorities.push(Record::from_rdata(owner, ttl, RData::SOA(soa)));
    }
    reply
}

/// What one name in the zone holds for the question.
enum Found {
    /// The name exists; `answers` may be empty (NODATA).
    Records {
        answers: Vec<Record>,
        additionals: Vec<Record>,
    },
    /// A CNAME (already in `answers`) to `target`, to be followed.
    Alias {
        answers: Vec<Record>,
        target: Name,
    },
    NxDomain,
}

impl Found {
    fn no_data() -> Self {
        Found::Records { answers: Vec::new(), additionals: Vec::new() }
    }

    fn answers(answers: Vec<Record>) -> Self {
        Found::Records { answers, additionals: Vec::new() }
    }
}

/// Resolution of one question inside the zone, following in-zone CNAMEs.
struct Chain<'z> {
    zone: &'z Zone,
    query_type: RecordType,
    ttl: u32,
    reply: Reply,
    /// A CNAME target outside the zone, left for the server to chase.
    outside: Option<Name>,
}

impl<'z> Chain<'z> {
    fn new(zone: &'z Zone, query_type: RecordType) -> Self {
        let reply = Reply { authoritative: true, ..Reply::error(ResponseCode::NoError) };
        Self { zone, query_type, ttl: zone.config().ttl(), reply, outside: None }
    }

    fn resolve(&mut self, asked: &Name, relative: &[&str]) {
        let mut found = self.lookup(asked, relative);
        for _ in 0..MAX_CNAME_CHAIN {
            match found {
                Found::Records { answers, additionals } => {
                    let is_empty = answers.is_empty();
                    self.reply.answers.extend(answers);
                    self.reply.additionals.extend(additionals);
                    if is_empty {
                        self.reply.authorities.push(self.zone.soa().clone());
                    }
                    return;
                }
                Found::NxDomain => {
                    self.reply.response_code = ResponseCode::NXDomain;
                    self.reply.authorities.push(self.zone.soa().clone());
                    return;
                }
                Found::Alias { answers, target } => {
                    self.reply.answers.extend(answers);
                    let origin = self.zone.config().origin();
                    if !origin.zone_of(&target) {
                        self.outside = Some(target);
                        return;
                    }
                    let labels: Vec<Cow<'_, str>> = target.iter().map(String::from_utf8_lossy).collect();
                    let labels: Vec<&str> = labels.iter().map(AsRef::as_ref).collect();
                    let relative = &labels[..labels.len() - usize::from(origin.num_labels())];
                    found = self.lookup(&target, relative);
                }
            }
        }
        // A CNAME loop inside the zone: what was collected is the answer.
    }

    fn finish(self) -> Outcome {
        match self.outside {
            Some(target) if self.zone.config().is_forwarding() && self.query_type != RecordType::CNAME => {
                Outcome::Chase { reply: self.reply, target, query_type: self.query_type }
            }
            _ => Outcome::Reply(self.reply),
        }
    }

    fn record(&self, owner: &Name, data: RData) -> Record {
        Record::from_rdata(owner.clone(), self.ttl, data)
    }

    fn address_records(&self, owner: &Name, ips: impl IntoIterator<Item = IpAddr>) -> Vec<Record> {
        let mut records = Vec::new();
        for ip in ips {
            match ip {
                IpAddr::V4(v4) if wants(self.query_type, RecordType::A) => {
                    records.push(self.record(owner, RData::A(A(v4))));
                }
                IpAddr::V6(v6) if wants(self.query_type, RecordType::AAAA) => {
                    records.push(self.record(owner, RData::AAAA(AAAA(v6))));
                }
                _ => {}
            }
        }
        records
    }

    /// A and AAAA records of `owner` whatever the question, for the additional section.
    fn glue(&self, owner: &Name, ips: impl IntoIterator<Item = IpAddr>) -> Vec<Record> {
        ips.into_iter()
            .map(|ip| match ip {
                IpAddr::V4(v4) => self.record(owner, RData::A(A(v4))),
                IpAddr::V6(v6) => self.record(owner, RData::AAAA(AAAA(v6))),
            })
            .collect()
    }

    /// The records of one name, given by its labels relative to the zone apex.
    fn lookup(&self, asked: &Name, relative: &[&str]) -> Found {
        let zone = self.zone;
        match relative {
            [] => self.apex(asked),
            ["dns-version"] => {
                if wants(self.query_type, RecordType::TXT) {
                    let txt = TXT::new(vec![DNS_SCHEMA_VERSION.to_owned()]);
                    Found::answers(vec![Record::from_rdata(asked.clone(), DNS_VERSION_TTL, RData::TXT(txt))])
                } else {
                    Found::no_data()
                }
            }
            // Empty non-terminals.
            ["svc" | "pod" | "dns"] => Found::no_data(),
            ["ns", "dns"] => Found::answers(self.address_records(asked, zone.name_server_ips().iter().copied())),
            [namespace, "svc"] => {
                if zone.has_namespace(namespace) {
                    Found::no_data()
                } else {
                    Found::NxDomain
                }
            }
            [namespace, "pod"] => {
                if zone.config().pod_records() == PodRecords::Insecure && zone.has_namespace(namespace) {
                    Found::no_data()
                } else {
                    Found::NxDomain
                }
            }
            [address, namespace, "pod"] => self.pod(asked, address, namespace),
            [name, namespace, "svc"] => match zone.service(namespace, name) {
                Some(service) => self.service(asked, service),
                None => Found::NxDomain,
            },
            [label, name, namespace, "svc"] => match zone.service(namespace, name) {
                Some(service) => self.below_service(asked, service, label),
                None => Found::NxDomain,
            },
            [port, protocol, name, namespace, "svc"] => match zone.service(namespace, name) {
                Some(service) => self.port(asked, service, port, protocol),
                None => Found::NxDomain,
            },
            _ => Found::NxDomain,
        }
    }

    fn apex(&self, asked: &Name) -> Found {
        let zone = self.zone;
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        if wants(self.query_type, RecordType::SOA) {
            let mut soa = zone.soa().clone();
            soa.name = asked.clone();
            answers.push(soa);
        }
        if wants(self.query_type, RecordType::NS) {
            answers.push(self.record(asked, RData::NS(NS(zone.name_server().clone()))));
            additionals = self.glue(zone.name_server(), zone.name_server_ips().iter().copied());
        }
        Found::Records { answers, additionals }
    }

    fn pod(&self, asked: &Name, address: &str, namespace: &str) -> Found {
        let zone = self.zone;
        if zone.config().pod_records() != PodRecords::Insecure || !zone.has_namespace(namespace) {
            return Found::NxDomain;
        }
        match parse_dashed_ip(address) {
            Some(ip) => Found::answers(self.address_records(asked, [ip])),
            None => Found::NxDomain,
        }
    }

    fn service(&self, asked: &Name, service: &ServiceEntry) -> Found {
        match &service.entry {
            Entry::ClusterIp { ips } => {
                if self.query_type == RecordType::SRV {
                    let mut answers = Vec::new();
                    for port in &service.ports {
                        let srv = SRV::new(0, 100, port.port, service.fqdn.clone());
                        answers.push(self.record(asked, RData::SRV(srv)));
                    }
                    let additionals =
                        if answers.is_empty() { Vec::new() } else { self.glue(&service.fqdn, ips.iter().copied()) };
                    return Found::Records { answers, additionals };
                }
                Found::answers(self.address_records(asked, ips.iter().copied()))
            }
            Entry::Headless { endpoints, port_sets, .. } => {
                if endpoints.is_empty() {
                    return Found::NxDomain;
                }
                if self.query_type == RecordType::SRV {
                    let mut records = Vec::new();
                    for endpoint in endpoints {
                        for port in port_sets.get(endpoint.port_set).into_iter().flatten() {
                            records.push((port.port, endpoint));
                        }
                    }
                    return self.endpoint_srv(asked, &records);
                }
                let mut seen: Vec<IpAddr> = Vec::with_capacity(endpoints.len());
                for endpoint in endpoints {
                    if !seen.contains(&endpoint.ip) {
                        seen.push(endpoint.ip);
                    }
                }
                Found::answers(self.address_records(asked, seen))
            }
            Entry::ExternalName { target } => {
                if matches!(self.query_type, RecordType::A | RecordType::AAAA) {
                    let cname = self.record(asked, RData::CNAME(CNAME(target.clone())));
                    Found::Alias { answers: vec![cname], target: target.clone() }
                } else if wants(self.query_type, RecordType::CNAME) {
                    Found::answers(vec![self.record(asked, RData::CNAME(CNAME(target.clone())))])
                } else {
                    Found::no_data()
                }
            }
        }
    }

    /// SRV records to endpoints, weight `100 / N` (at least 1) as CoreDNS gives them, with the
    /// endpoints' addresses in the additional section.
    fn endpoint_srv(&self, asked: &Name, records: &[(u16, &crate::zone::ReadyEndpoint)]) -> Found {
        let count = u16::try_from(records.len()).unwrap_or(u16::MAX).max(1);
        let weight = (100 / count).max(1);
        let mut answers = Vec::with_capacity(records.len());
        let mut additionals: Vec<Record> = Vec::with_capacity(records.len());
        let mut glued: Vec<(&Name, IpAddr)> = Vec::with_capacity(records.len());
        for (port, endpoint) in records {
            answers.push(self.record(asked, RData::SRV(SRV::new(0, weight, *port, endpoint.fqdn.clone()))));
            if !glued.contains(&(&endpoint.fqdn, endpoint.ip)) {
                glued.push((&endpoint.fqdn, endpoint.ip));
                additionals.extend(self.glue(&endpoint.fqdn, [endpoint.ip]));
            }
        }
        Found::Records { answers, additionals }
    }

    /// `<label>.<svc>.<ns>.svc.<zone>`: an endpoint of a headless Service, or `_<proto>`.
    fn below_service(&self, asked: &Name, service: &ServiceEntry, label: &str) -> Found {
        if let Some(protocol) = label.strip_prefix('_') {
            return match protocol_from_srv_label(protocol) {
                Some(protocol) if service.has_protocol(protocol) && has_endpoints_or_ip(service) => Found::no_data(),
                _ => Found::NxDomain,
            };
        }
        let Entry::Headless { endpoints, by_label, .. } = &service.entry else {
            return Found::NxDomain;
        };
        match by_label.get(label) {
            Some(indexes) => Found::answers(self.address_records(asked, indexes.iter().map(|&i| endpoints[i].ip))),
            None => Found::NxDomain,
        }
    }

    /// `_<port>._<proto>.<svc>.<ns>.svc.<zone>`: SRV records of a named port.
    fn port(&self, asked: &Name, service: &ServiceEntry, port: &str, protocol: &str) -> Found {
        let (Some(port_name), Some(protocol)) = (port.strip_prefix('_'), protocol.strip_prefix('_')) else {
            return Found::NxDomain;
        };
        let Some(protocol) = protocol_from_srv_label(protocol) else {
            return Found::NxDomain;
        };
        match &service.entry {
            Entry::ClusterIp { ips } => {
                let Some(port) = service.ports.iter().find(|p| p.matches(port_name, protocol)) else {
                    return Found::NxDomain;
                };
                if !wants(self.query_type, RecordType::SRV) {
                    return Found::no_data();
                }
                let srv = SRV::new(0, 100, port.port, service.fqdn.clone());
                Found::Records {
                    answers: vec![self.record(asked, RData::SRV(srv))],
                    additionals: self.glue(&service.fqdn, ips.iter().copied()),
                }
            }
            Entry::Headless { endpoints, port_sets, .. } => {
                let mut records = Vec::new();
                for endpoint in endpoints {
                    let ports = port_sets.get(endpoint.port_set).map(Vec::as_slice).unwrap_or_default();
                    if let Some(port) = ports.iter().find(|p| p.matches(port_name, protocol)) {
                        records.push((port.port, endpoint));
                    }
                }
                if records.is_empty() {
                    Found::NxDomain
                } else if !wants(self.query_type, RecordType::SRV) {
                    Found::no_data()
                } else {
                    self.endpoint_srv(asked, &records)
                }
            }
            Entry::ExternalName { .. } => Found::NxDomain,
        }
    }
}

/// A headless Service without ready endpoints has no names at all.
fn has_endpoints_or_ip(service: &ServiceEntry) -> bool {
    match &service.entry {
        Entry::Headless { endpoints, .. } => !endpoints.is_empty(),
        Entry::ClusterIp { .. } => true,
        Entry::ExternalName { .. } => false,
    }
}

/// `<svc>.<ns>.svc.<zone>.` for tests and tools, `None` if the labels are not valid.
pub fn service_name(zone: &Zone, namespace: &str, name: &str) -> Option<Name> {
    name_under(&[name, namespace, "svc"], zone.config().origin())
}

#[cfg(test)]
mod tests;
