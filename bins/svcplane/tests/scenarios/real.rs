//! Runs scenario rows with real packets in a [`Cluster`]: each row (once per family)
//! becomes probes from the sender's namespace, checked against the row's outcome. Rows run
//! concurrently (bounded), rows that change endpoints run grouped by Service around the
//! change, and every loop is bounded in count and time.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use svcplane_testbed::EchoReply;

use super::agreement::{self, Prediction, Seen};
use super::cluster::Cluster;
use super::manifests::{self, CLIENT_INSIDE_RANGES, CLIENT_OUTSIDE_RANGES, ServiceSpec, THIS_NODE};
use super::net::{self, Conversation, Failure};
use super::{Frontend, Outcome, Protocol, Scenario, Sender, SourceSeen};

/// A Rejected row's probes must fail within this.
pub const REJECT_WITHIN: Duration = Duration::from_secs(1);
/// After an endpoint change, flows must have followed it within this.
pub const CHANGE_WITHIN: Duration = Duration::from_secs(5);
/// Time limit of one probe that should be answered or refused: long enough that a refusal
/// arriving in time is told apart from a timeout.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Time limit of one probe of a Dropped or NotServed row (the row waits this long per probe).
const DROP_TIMEOUT: Duration = Duration::from_millis(800);
/// Probes of an Answered row: at least this many, then until every expected pod answered,
/// at most the maximum. With 4 uniform endpoints, missing one in 100 probes has odds of
/// about 1e-12, so the bound cannot flake.
const MIN_ANSWER_PROBES: usize = 6;
const MAX_ANSWER_PROBES: usize = 100;
/// The nodes send refusals without a rate limit (the fixture turns it off), so two probes a
/// row show a refusal is not a one-off.
const REJECT_PROBES: usize = 2;
const DROP_PROBES: usize = 2;
/// No row may take longer than this, whatever the probes do.
const ROW_DEADLINE: Duration = Duration::from_secs(20);
/// Rows running at once in one cluster.
const PARALLEL_ROWS: usize = 8;

/// A row resolved against the fixture, independent of how it is run: who sends what where.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// "pod node1-client", "node node1", "external client1", for messages.
    pub sender: String,
    pub sender_pod: Option<&'static str>,
    /// The external client's number, when the sender is one.
    pub client: Option<u16>,
    /// The sender's own address of the row's family.
    pub client_ip: IpAddr,
    /// The node whose proxy handles the traffic first: the sender's node for pods and the
    /// node itself, this node for external clients.
    pub entry_node: u16,
    /// Where the probe goes; `None` when the Service has no address of that kind and family
    /// (headless, ExternalName): only rule checks apply then.
    pub target: Option<SocketAddr>,
    /// The port the pods listen on behind the Service.
    pub target_port: u16,
}

/// Resolves `row` (of one family) against the fixture's `service`.
pub fn resolve(row: &Scenario, service: &ServiceSpec) -> Result<Resolved, String> {
    let family = row.family;
    let pod_sender = |name: &'static str| {
        let pod = manifests::lab_pod(name);
        (format!("pod {name}"), Some(name), None, manifests::pod_ip(name, family), pod.node)
    };
    let client_sender = |client: u16| {
        (format!("external client{client}"), None, Some(client), manifests::client_ip(client, family), THIS_NODE)
    };
    let (sender, sender_pod, client, client_ip, entry_node) = match row.from {
        Sender::PodOnThisNode => pod_sender(manifests::POD_ON_THIS_NODE),
        Sender::EndpointPodOnThisNode => pod_sender(manifests::ENDPOINT_POD_ON_THIS_NODE),
        Sender::PodOnOtherNode => pod_sender(manifests::POD_ON_OTHER_NODE),
        Sender::ThisNode => {
            (format!("node node{THIS_NODE}"), None, None, manifests::node_ip(THIS_NODE, family), THIS_NODE)
        }
        Sender::ExternalClient | Sender::ExternalClientInsideRange => client_sender(CLIENT_INSIDE_RANGES),
        Sender::ExternalClientOutsideRange => client_sender(CLIENT_OUTSIDE_RANGES),
    };
    let node_port = || {
        service
            .node_port(row.protocol)
            .ok_or_else(|| format!("Service {} has no {} nodePort", service.name, row.protocol))
    };
    let first = |ips: Vec<IpAddr>, what: &str| {
        ips.first().copied().ok_or_else(|| format!("Service {} has no {what} of the family", service.name))
    };
    let port = manifests::SERVICE_PORT;
    let target = match row.to {
        Frontend::ClusterIp => service.address(family).map(|ip| SocketAddr::new(ip, port)),
        Frontend::NodePort => Some(SocketAddr::new(manifests::node_ip(THIS_NODE, family), node_port()?)),
        Frontend::NodePortOnSecondaryAddress => {
            Some(SocketAddr::new(manifests::node_secondary_ip(THIS_NODE, family), node_port()?))
        }
        Frontend::NodePortOnLoopback => {
            let loopback =
                if family.is_v6() { IpAddr::V6(Ipv6Addr::LOCALHOST) } else { IpAddr::V4(Ipv4Addr::LOCALHOST) };
            Some(SocketAddr::new(loopback, node_port()?))
        }
        Frontend::LoadBalancerIp => {
            Some(SocketAddr::new(first(service.load_balancer_ips(family, false), "load-balancer IP")?, port))
        }
        Frontend::ProxyModeLoadBalancerIp => {
            Some(SocketAddr::new(first(service.load_balancer_ips(family, true), "ipMode Proxy ingress")?, port))
        }
        Frontend::ExternalIp => Some(SocketAddr::new(first(service.external_ips(family), "external IP")?, port)),
        Frontend::HealthCheck => {
            let health = service
                .health_check_node_port
                .ok_or_else(|| format!("Service {} has no healthCheckNodePort", service.name))?;
            Some(SocketAddr::new(manifests::node_ip(THIS_NODE, family), health))
        }
    };
    if target.is_none() && row.expect != Outcome::Ignored {
        return Err(format!("Service {} has no {} address to send to", service.name, family));
    }
    Ok(Resolved { sender, sender_pod, client, client_ip, entry_node, target, target_port: service.target_port })
}

impl Resolved {
    /// Checks the source a pod saw. A pod that drew itself (hairpin) must always see a
    /// node address, whatever the row expects for the others. `entry_node_ips` are the
    /// addresses of the node the traffic entered the Service through.
    pub fn check_source(&self, expected: SourceSeen, reply: &EchoReply) -> Result<(), String> {
        let seen = reply.client_addr.ip();
        let hairpin = self.sender_pod == Some(reply.server_name.as_str());
        let expected = if hairpin { SourceSeen::NodeAddress } else { expected };
        let node_ips = manifests::node_addresses(self.entry_node);
        let ok = match expected {
            SourceSeen::ClientAddress => seen == self.client_ip,
            SourceSeen::NodeAddress => node_ips.contains(&seen),
            SourceSeen::Any => true,
        };
        if ok {
            return Ok(());
        }
        let wanted = match expected {
            SourceSeen::ClientAddress => format!("the sender's own address {}", self.client_ip),
            _ => format!("a node address {node_ips:?}"),
        };
        let hairpin = if hairpin { " (hairpin: it answered its own request)" } else { "" };
        Err(format!("{} saw the client as {seen}, expected {wanted}{hairpin}", reply.server_name))
    }
}

/// A resolved row with where to send from in the lab.
#[derive(Debug, Clone)]
struct Probe {
    row: Scenario,
    resolved: Resolved,
    namespace: String,
    /// The backend relays from the node ([`super::cluster::Backend::relays_from_the_node`]).
    relayed: bool,
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = self.resolved.target.map_or_else(|| "(no address)".to_owned(), |t| t.to_string());
        write!(f, "{} from {} [{}] to {target}", self.row.protocol, self.resolved.sender, self.resolved.client_ip)
    }
}

impl Probe {
    fn of(cluster: &Cluster, row: &Scenario) -> Result<Probe, String> {
        let service =
            cluster.service(row.service).ok_or_else(|| format!("no Service {:?} in the fixture", row.service))?;
        let resolved = resolve(row, service)?;
        let lab = cluster.lab();
        let namespace = match (resolved.sender_pod, resolved.client) {
            (Some(pod), _) => lab.pod(pod).namespace_name().to_owned(),
            (None, Some(client)) => lab.client(client).namespace_name().to_owned(),
            (None, None) => lab.node(resolved.entry_node).namespace_name().to_owned(),
        };
        Ok(Probe { row: *row, resolved, namespace, relayed: cluster.backend().relays_from_the_node })
    }

    fn target(&self) -> SocketAddr {
        self.resolved.target.expect("rows that send have a target")
    }

    /// One request, fresh source port each time (so every probe is a new connection for
    /// conntrack and draws its endpoint anew), unless `source` fixes it.
    fn send(&self, cluster: &Cluster, source: Option<SocketAddr>, timeout: Duration) -> Result<EchoReply, Failure> {
        net::request(cluster.lab(), &self.namespace, self.row.protocol, self.target(), source, timeout)
    }

    /// One request from a fixed source port.
    fn send_from_port(&self, cluster: &Cluster, port: u16, timeout: Duration) -> Result<EchoReply, Failure> {
        self.send(cluster, Some(net::unspecified(self.target(), port)), timeout)
    }
}

/// What a probe that should not be answered saw.
enum Unanswered {
    Refused,
    /// Nothing came back; `local_eperm`: the sending host's own output hook dropped it.
    Silent,
    Other(String),
}

/// One probe that is expected not to be answered, telling a refusal from silence. UDP
/// needs care when the sender's own output hook rejects: `send` then fails with EPERM
/// (Linux reports every locally refused packet so, a drop too) and only the ICMP error that
/// follows a reject tells the two apart.
fn probe_unanswered(cluster: &Cluster, probe: &Probe, timeout: Duration) -> Result<Unanswered, EchoReply> {
    if probe.row.protocol != Protocol::Udp {
        return match probe.send(cluster, None, timeout) {
            Ok(reply) => Err(reply),
            Err(Failure::Refused) => Ok(Unanswered::Refused),
            // A drop the sender's own node reports at once (EPERM) is still a drop.
            Err(Failure::TimedOut | Failure::DroppedLocally) => Ok(Unanswered::Silent),
            Err(Failure::Other(error)) => Ok(Unanswered::Other(error)),
        };
    }
    use std::io::ErrorKind;
    let target = probe.target();
    if !svcplane_testbed::address_plan::is_lab_address(target.ip()) && !target.ip().is_loopback() {
        return Ok(Unanswered::Other(format!("{target} is outside the lab's address plan")));
    }
    let outcome = cluster.lab().run_in(&probe.namespace, move || -> Result<Unanswered, EchoReply> {
        let io = |step: &str, error: std::io::Error| Unanswered::Other(format!("udp {target}: {step}: {error}"));
        let socket = match std::net::UdpSocket::bind(net::unspecified(target, 0)) {
            Ok(socket) => socket,
            Err(error) => return Ok(io("bind", error)),
        };
        // A socket-level balancer answers at connect(): refused, or dropped (EPERM).
        match socket.connect(target) {
            Ok(()) => {}
            Err(error) if error.raw_os_error() == Some(EPERM) => return Ok(Unanswered::Silent),
            Err(error) if error.kind() == ErrorKind::ConnectionRefused => return Ok(Unanswered::Refused),
            Err(error) => return Ok(io("connect", error)),
        }
        match socket.send(b"svcplane-probe\n") {
            Ok(_) => {}
            Err(error) if error.raw_os_error() == Some(EPERM) => {}
            Err(error) if error.kind() == ErrorKind::ConnectionRefused => return Ok(Unanswered::Refused),
            Err(error) => return Ok(io("send", error)),
        }
        if let Err(error) = socket.set_read_timeout(Some(timeout)) {
            return Ok(io("set timeout", error));
        }
        let mut buffer = [0u8; 4096];
        match socket.recv(&mut buffer) {
            Ok(n) => match EchoReply::parse(&String::from_utf8_lossy(&buffer[..n])) {
                Some(reply) => Err(reply),
                None => Ok(Unanswered::Other(format!("udp {target}: not an echo reply"))),
            },
            Err(error) if error.kind() == ErrorKind::ConnectionRefused => Ok(Unanswered::Refused),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(Unanswered::Silent),
            Err(error) => Ok(io("receive", error)),
        }
    });
    outcome.unwrap_or_else(|error| Ok(Unanswered::Other(format!("entering {}: {error}", probe.namespace))))
}

/// Linux's `EPERM` (no libc dependency for one constant).
const EPERM: i32 = 1;

/// What an Answered row saw: pod name -> replies.
type Answers = BTreeMap<String, usize>;

fn expect_answered(
    cluster: &Cluster,
    probe: &Probe,
    by: &[&str],
    source: SourceSeen,
) -> Result<(String, Seen), String> {
    let allowed: BTreeSet<&str> = by.iter().copied().collect();
    let mut answers = Answers::new();
    let (mut masqueraded, mut hairpin_masqueraded) = (BTreeSet::new(), BTreeSet::new());
    let seen = |answers: &Answers, masqueraded: &BTreeSet<bool>, hairpin_masqueraded: &BTreeSet<bool>| Seen::Answered {
        pods: answers.keys().cloned().collect(),
        masqueraded: masqueraded.clone(),
        hairpin_masqueraded: hairpin_masqueraded.clone(),
        all: true,
    };
    let started = Instant::now();
    for sent in 0..MAX_ANSWER_PROBES {
        let all_answered = allowed.iter().all(|pod| answers.contains_key(*pod));
        if sent >= MIN_ANSWER_PROBES && all_answered {
            return Ok((format!("answers {answers:?}"), seen(&answers, &masqueraded, &hairpin_masqueraded)));
        }
        if started.elapsed() > ROW_DEADLINE {
            break;
        }
        let reply = probe
            .send(cluster, None, ANSWER_TIMEOUT)
            .map_err(|error| format!("probe {} failed: {error}; answers so far {answers:?}", sent + 1))?;
        if !allowed.contains(reply.server_name.as_str()) {
            return Err(format!("answered by {}, which is not one of {by:?}", reply.server_name));
        }
        probe.resolved.check_source(source, &reply)?;
        let masquerade = agreement::saw_node_address(probe.resolved.client_ip, reply.client_addr.ip());
        if probe.resolved.sender_pod == Some(reply.server_name.as_str()) {
            hairpin_masqueraded.insert(masquerade);
        } else {
            masqueraded.insert(masquerade);
        }
        *answers.entry(reply.server_name).or_default() += 1;
    }
    let missing: Vec<&str> = allowed.iter().copied().filter(|pod| !answers.contains_key(*pod)).collect();
    if missing.is_empty() {
        return Ok((format!("answers {answers:?}"), seen(&answers, &masqueraded, &hairpin_masqueraded)));
    }
    Err(format!("{missing:?} never answered in {} probes; answers {answers:?}", answers.values().sum::<usize>()))
}

fn expect_rejected(cluster: &Cluster, probe: &Probe) -> Result<(String, Seen), String> {
    for _ in 0..REJECT_PROBES {
        let started = Instant::now();
        let result = probe_unanswered(cluster, probe, ANSWER_TIMEOUT);
        let took = started.elapsed();
        match result {
            Err(reply) => {
                return Err(format!(
                    "answered by {} (seeing {}), expected a refusal",
                    reply.server_name, reply.client_addr
                ));
            }
            Ok(Unanswered::Refused) if took < REJECT_WITHIN => {}
            Ok(Unanswered::Refused) => {
                return Err(format!("refused, but only after {took:?}; expected within {REJECT_WITHIN:?}"));
            }
            Ok(Unanswered::Silent) => return Err(format!("no answer and no refusal within {ANSWER_TIMEOUT:?}")),
            Ok(Unanswered::Other(error)) => {
                return Err(format!("expected a refusal within {REJECT_WITHIN:?}, got `{error}` after {took:?}"));
            }
        }
    }
    Ok(("refused".to_owned(), Seen::Refused))
}

fn expect_dropped(cluster: &Cluster, probe: &Probe) -> Result<(String, Seen), String> {
    for _ in 0..DROP_PROBES {
        match probe_unanswered(cluster, probe, DROP_TIMEOUT) {
            Err(reply) => {
                return Err(format!(
                    "answered by {} (seeing {}), expected no answer at all",
                    reply.server_name, reply.client_addr
                ));
            }
            Ok(Unanswered::Silent) => {}
            Ok(Unanswered::Refused) => return Err("refused, expected silence (dropped)".to_owned()),
            Ok(Unanswered::Other(error)) => return Err(format!("expected silence (dropped), got `{error}`")),
        }
    }
    Ok(("dropped".to_owned(), Seen::Silent))
}

/// Whether `text` names `address` (as a whole token, so `198.18.100.1` does not match
/// inside `198.18.100.10`).
pub fn mentions_address(text: &str, address: IpAddr) -> bool {
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':' || c == '/'))
        .filter_map(|token| token.split('/').next())
        .filter_map(|token| token.parse::<IpAddr>().ok())
        .any(|found| found == address)
}

/// Whether the ruleset names the Service: svcplane's nftables chain and set names carry
/// `<namespace>/<name>/`, kube-proxy's iptables comments `default/NAME:PORT`, `default/NAME`
/// (an unnamed port) and `default/NAME cluster IP` and the like.
pub fn mentions_service(text: &str, service: &str) -> bool {
    let name = format!("default/{service}");
    text.match_indices(&name).any(|(at, _)| {
        let next = text[at + name.len()..].chars().next();
        matches!(next, Some('/' | ':' | ' ' | '"') | None)
    })
}

fn ruleset_checks(cluster: &Cluster, probe: &Probe, whole_service: bool) -> Result<(), String> {
    let address_frontend = matches!(
        probe.row.to,
        Frontend::ClusterIp | Frontend::LoadBalancerIp | Frontend::ProxyModeLoadBalancerIp | Frontend::ExternalIp
    );
    let nodes: &[u16] = if whole_service { &[1, 2] } else { &[probe.resolved.entry_node] };
    for &node in nodes {
        let ruleset = cluster.ruleset(node)?;
        if whole_service && mentions_service(&ruleset, probe.row.service) {
            return Err(format!("node{node}'s ruleset names the Service default/{}", probe.row.service));
        }
        if let Some(target) = probe.resolved.target.filter(|_| address_frontend)
            && mentions_address(&ruleset, target.ip())
        {
            return Err(format!("node{node}'s ruleset names {}", target.ip()));
        }
    }
    Ok(())
}

fn expect_not_served(cluster: &Cluster, probe: &Probe, whole_service: bool) -> Result<(String, Seen), String> {
    ruleset_checks(cluster, probe, whole_service)?;
    if probe.resolved.target.is_none() {
        return Ok(("not in the ruleset".to_owned(), Seen::NotServed));
    }
    let mut seen = Vec::new();
    for _ in 0..DROP_PROBES {
        match probe_unanswered(cluster, probe, DROP_TIMEOUT) {
            Err(reply) => {
                return Err(format!(
                    "answered by {} (seeing {}), expected no pod to answer",
                    reply.server_name, reply.client_addr
                ));
            }
            Ok(Unanswered::Refused) => seen.push("refused".to_owned()),
            Ok(Unanswered::Silent) => seen.push("silence".to_owned()),
            Ok(Unanswered::Other(error)) => seen.push(error),
        }
    }
    Ok((format!("not served: {}", seen.join(", ")), Seen::NotServed))
}

fn expect_health(cluster: &Cluster, probe: &Probe, local_endpoints: usize) -> Result<(String, Seen), String> {
    let (status, body) = net::http_get(cluster.lab(), &probe.namespace, probe.target(), ANSWER_TIMEOUT)
        .map_err(|error| format!("health check request: {error}"))?;
    let expected_status = if local_endpoints > 0 { 200 } else { 503 };
    let expected_body = format!(
        "{{\"service\":{{\"namespace\":\"default\",\"name\":\"{}\"}},\"localEndpoints\":{local_endpoints},\"serviceProxyHealthy\":true}}",
        probe.row.service
    );
    if status != expected_status || body.trim() != expected_body {
        return Err(format!("got {status} {body:?}, expected {expected_status} {expected_body:?}"));
    }
    // What the server said, not what the row wanted: explain is compared with the answer.
    let answered = serde_json::from_str::<serde_json::Value>(body.trim())
        .ok()
        .and_then(|json| json["localEndpoints"].as_u64())
        .and_then(|count| usize::try_from(count).ok())
        .ok_or_else(|| format!("the health check's body has no localEndpoints: {body:?}"))?;
    Ok((format!("{status} {body}"), Seen::Health { local_endpoints: answered }))
}

/// A source port no earlier affinity request of this process used: with a kernel-chosen
/// port a client now and then re-used the port of a request made before the timeout,
/// whose flow (a conntrack entry, the relay's UDP session) still led to the old endpoint,
/// and the row saw a client "move" after the timeout that had in fact not picked afresh.
fn affinity_source_port() -> u16 {
    // Between the mutating rows' fixed ports (from 20000) and the ephemeral range (32768).
    const FIRST: u16 = 21000;
    const LAST: u16 = 32000;
    static NEXT: AtomicU16 = AtomicU16::new(FIRST);
    let port = NEXT.fetch_add(1, Ordering::Relaxed);
    if port >= LAST {
        NEXT.store(FIRST, Ordering::Relaxed);
    }
    port.clamp(FIRST, LAST)
}

/// One round of affinity requests: the answering pod of each client, and when each answer came.
struct Round {
    names: Vec<String>,
    answered_at: Vec<Instant>,
}

impl Round {
    /// The longest any client went between its answer at `earlier` and its answer here:
    /// above the affinity timeout, a client may lawfully pick afresh.
    fn longest_gap_since(&self, earlier: &[Instant]) -> Duration {
        self.answered_at.iter().zip(earlier).map(|(now, then)| now.duration_since(*then)).max().unwrap_or_default()
    }
}

/// One request from each of `sources` (client 1's affinity addresses), all inside one
/// visit of the namespace, each from a port of its own.
fn round_from(probe: &Probe, cluster: &Cluster, sources: &[IpAddr]) -> Result<Round, String> {
    let target = probe.target();
    let protocol = probe.row.protocol;
    let sources: Vec<SocketAddr> =
        sources.iter().map(|source| SocketAddr::new(*source, affinity_source_port())).collect();
    let answers = cluster
        .lab()
        .run_in(&probe.namespace, move || {
            sources
                .iter()
                .map(|source| {
                    net::request_here(protocol, target, Some(*source), ANSWER_TIMEOUT)
                        .map(|reply| (reply.server_name, Instant::now()))
                        .map_err(|error| format!("request from {source}: {error}"))
                })
                .collect::<Result<Vec<(String, Instant)>, String>>()
        })
        .map_err(|error| error.to_string())??;
    let (names, answered_at) = answers.into_iter().unzip();
    Ok(Round { names, answered_at })
}

fn affinity_timeout() -> Duration {
    Duration::from_secs(u64::from(manifests::AFFINITY_TIMEOUT_SECONDS))
}

/// A client's requests closer together than this keep its affinity beyond doubt; a slower
/// round (a loaded machine) makes the attempt inconclusive, and it is made again.
fn conclusive_gap() -> Duration {
    affinity_timeout() * 3 / 4
}

/// How an affinity row's attempt ended: a verdict, or too slow to tell.
enum Attempt {
    Verdict(Result<(String, Seen), String>),
    Inconclusive(String),
}

/// Runs an affinity check until it reaches a verdict, at most three times: only a
/// machine too loaded to keep a client's requests within the timeout makes it retry.
fn until_conclusive(mut attempt: impl FnMut() -> Result<Attempt, String>) -> Result<(String, Seen), String> {
    let mut why = Vec::new();
    for _ in 0..3 {
        match attempt()? {
            Attempt::Verdict(verdict) => return verdict,
            Attempt::Inconclusive(reason) => why.push(reason),
        }
    }
    Err(format!("three attempts were inconclusive: {}", why.join("; ")))
}

fn check_by(by: &[&str], names: &[String]) -> Result<(), String> {
    match names.iter().find(|name| !by.contains(&name.as_str())) {
        Some(name) => Err(format!("answered by {name}, which is not one of {by:?}")),
        None => Ok(()),
    }
}

fn expect_sticky_then_fresh(cluster: &Cluster, probe: &Probe, by: &[&str]) -> Result<(String, Seen), String> {
    until_conclusive(|| sticky_then_fresh(cluster, probe, by))
}

fn sticky_then_fresh(cluster: &Cluster, probe: &Probe, by: &[&str]) -> Result<Attempt, String> {
    let sources = manifests::affinity_client_ips(probe.row.family);
    let started = Instant::now();
    let sticky = round_from(probe, cluster, &sources)?;
    check_by(by, &sticky.names)?;
    let mut previous = sticky.answered_at.clone();
    for _ in 0..3 {
        let again = round_from(probe, cluster, &sources)?;
        let gap = again.longest_gap_since(&previous);
        if gap >= conclusive_gap() {
            return Ok(Attempt::Inconclusive(format!(
                "a client waited {gap:?} between two requests of the sticky phase"
            )));
        }
        for ((source, first), now) in sources.iter().zip(&sticky.names).zip(&again.names) {
            if first != now {
                return Ok(Attempt::Verdict(Err(format!(
                    "client {source} moved from {first} to {now} {:?} after its first pick, its requests at most {gap:?} apart, within the {}s timeout",
                    started.elapsed(),
                    manifests::AFFINITY_TIMEOUT_SECONDS
                ))));
            }
        }
        previous = again.answered_at;
    }
    std::thread::sleep(affinity_timeout() + Duration::from_millis(1500));
    let fresh = round_from(probe, cluster, &sources)?;
    check_by(by, &fresh.names)?;
    let mut previous = fresh.answered_at.clone();
    for _ in 0..2 {
        let again = round_from(probe, cluster, &sources)?;
        let gap = again.longest_gap_since(&previous);
        if gap >= conclusive_gap() {
            return Ok(Attempt::Inconclusive(format!(
                "a client waited {gap:?} between two requests after the timeout"
            )));
        }
        for ((source, first), now) in sources.iter().zip(&fresh.names).zip(&again.names) {
            if first != now {
                return Ok(Attempt::Verdict(Err(format!(
                    "after the timeout, client {source} picked {first} but then moved to {now}"
                ))));
            }
        }
        previous = again.answered_at;
    }
    let moved = sticky.names.iter().zip(&fresh.names).filter(|(a, b)| a != b).count();
    if moved == 0 {
        return Ok(Attempt::Verdict(Err(format!(
            "after {:?} of silence all {} clients were still on their endpoints {:?}: the affinity did not expire",
            affinity_timeout() + Duration::from_millis(1500),
            sources.len(),
            sticky.names
        ))));
    }
    let pods = sticky.names.iter().chain(&fresh.names).cloned().collect();
    Ok(Attempt::Verdict(Ok((
        format!("{} clients sticky within the timeout, {moved} moved after it", sources.len()),
        Seen::Sticky { pods },
    ))))
}

fn expect_sticky_while_talking(cluster: &Cluster, probe: &Probe, by: &[&str]) -> Result<(String, Seen), String> {
    until_conclusive(|| sticky_while_talking(cluster, probe, by))
}

fn sticky_while_talking(cluster: &Cluster, probe: &Probe, by: &[&str]) -> Result<Attempt, String> {
    let sources = manifests::affinity_client_ips(probe.row.family);
    let started = Instant::now();
    let first = round_from(probe, cluster, &sources)?;
    check_by(by, &first.names)?;
    let talk_for = affinity_timeout() * 2 + Duration::from_millis(500);
    let mut rounds = 1;
    let mut previous = first.answered_at.clone();
    while started.elapsed() < talk_for {
        std::thread::sleep(Duration::from_millis(500));
        let now = round_from(probe, cluster, &sources)?;
        rounds += 1;
        let gap = now.longest_gap_since(&previous);
        if gap >= conclusive_gap() {
            return Ok(Attempt::Inconclusive(format!("a client waited {gap:?} between two requests")));
        }
        let moved: Vec<String> = sources
            .iter()
            .zip(&first.names)
            .zip(&now.names)
            .filter(|((_, a), b)| a != b)
            .map(|((source, a), b)| format!("{source}: {a} -> {b}"))
            .collect();
        if !moved.is_empty() {
            return Ok(Attempt::Verdict(Err(format!(
                "{} of {} clients moved {:?} after their first pick although each made a request at most {gap:?} \
                 after its last (timeout {}s): the affinity is not renewed by use: {moved:?}",
                moved.len(),
                sources.len(),
                started.elapsed(),
                manifests::AFFINITY_TIMEOUT_SECONDS
            ))));
        }
        previous = now.answered_at;
    }
    let pods = first.names.iter().cloned().collect();
    Ok(Attempt::Verdict(Ok((
        format!("{} clients kept their endpoints for {rounds} rounds over {:?}", sources.len(), started.elapsed()),
        Seen::Sticky { pods },
    ))))
}

/// Source ports for rows that re-use one: unique across every row of the test process.
fn fixed_source_port() -> u16 {
    // Below the kernel's ephemeral range (32768-60999): no earlier request with a random
    // source port can have left a flow (a conntrack entry, a BPF flow) on these ports.
    static NEXT: AtomicU16 = AtomicU16::new(20000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A mutating row between its first step and the endpoint change.
enum Open {
    /// A UDP client's fixed source port.
    UdpPort(u16),
    Connection(Conversation),
}

/// Before the change: the flow the row then watches.
/// One reply of a flow the row watches, as explain compares it: a sample of the endpoints.
fn seen_reply(probe: &Probe, reply: &EchoReply) -> Seen {
    let masquerade = agreement::saw_node_address(probe.resolved.client_ip, reply.client_addr.ip());
    let hairpin = probe.resolved.sender_pod == Some(reply.server_name.as_str());
    Seen::Answered {
        pods: BTreeSet::from([reply.server_name.clone()]),
        masqueraded: if hairpin { BTreeSet::new() } else { BTreeSet::from([masquerade]) },
        hairpin_masqueraded: if hairpin { BTreeSet::from([masquerade]) } else { BTreeSet::new() },
        all: false,
    }
}

fn before_change(cluster: &Cluster, probe: &Probe) -> Result<(Open, Seen), String> {
    match probe.row.expect {
        Outcome::FollowsEndpointChange { before, .. } => {
            let port = fixed_source_port();
            let timeout = if before.is_empty() { DROP_TIMEOUT } else { ANSWER_TIMEOUT };
            let result = probe.send_from_port(cluster, port, timeout);
            let seen = match (result, before.is_empty()) {
                (Ok(reply), false) if before.contains(&reply.server_name.as_str()) => {
                    probe.resolved.check_source(probe.row.source, &reply)?;
                    seen_reply(probe, &reply)
                }
                (Ok(reply), _) => {
                    return Err(format!("before the change answered by {}, expected {before:?}", reply.server_name));
                }
                // Nothing serves it yet: refused (no endpoints) or lost (no Service).
                (Err(error), true) => Seen::Unanswered { refused: matches!(error, Failure::Refused) },
                (Err(error), false) => return Err(format!("before the change: {error}")),
            };
            Ok((Open::UdpPort(port), seen))
        }
        Outcome::KeepsFlowAcrossEndpointChange { pod, .. } => {
            let open = if probe.row.protocol == Protocol::Udp {
                let port = fixed_source_port();
                let reply = probe
                    .send_from_port(cluster, port, ANSWER_TIMEOUT)
                    .map_err(|e| format!("before the change: {e}"))?;
                if reply.server_name != pod {
                    return Err(format!("before the change answered by {}, expected {pod}", reply.server_name));
                }
                (Open::UdpPort(port), seen_reply(probe, &reply))
            } else {
                let mut conversation = Conversation::open(
                    cluster.lab(),
                    &probe.namespace,
                    probe.row.protocol,
                    probe.target(),
                    ANSWER_TIMEOUT,
                )
                .map_err(|e| format!("opening a connection: {e}"))?;
                let reply = conversation.ask(ANSWER_TIMEOUT).map_err(|e| format!("before the change: {e}"))?;
                if reply.server_name != pod {
                    return Err(format!("before the change answered by {}, expected {pod}", reply.server_name));
                }
                (Open::Connection(conversation), seen_reply(probe, &reply))
            };
            Ok(open)
        }
        _ => unreachable!("only mutating rows"),
    }
}

/// After the change: the watched flow must behave.
fn after_change(cluster: &Cluster, probe: &Probe, open: Open) -> Result<(String, Seen), String> {
    let changed_at = Instant::now();
    match (probe.row.expect, open) {
        (Outcome::FollowsEndpointChange { before, after }, Open::UdpPort(port)) => {
            let mut last = String::from("nothing yet");
            while changed_at.elapsed() < CHANGE_WITHIN {
                match probe.send_from_port(cluster, port, Duration::from_millis(300)) {
                    Ok(reply) if after.contains(&reply.server_name.as_str()) => {
                        probe.resolved.check_source(probe.row.source, &reply)?;
                        let detail = format!(
                            "source port {port} answered by {} {:?} after the change",
                            reply.server_name,
                            changed_at.elapsed()
                        );
                        return Ok((detail, seen_reply(probe, &reply)));
                    }
                    Ok(reply) => last = format!("answered by {}", reply.server_name),
                    Err(error) => last = format!("getting `{error}`"),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let stuck =
                if last.starts_with("answered by") && !before.is_empty() { " through its old flow" } else { "" };
            Err(format!(
                "the client re-using source port {port} was still {last}{stuck} {CHANGE_WITHIN:?} after the endpoints changed to {after:?}"
            ))
        }
        (Outcome::KeepsFlowAcrossEndpointChange { pod, new_flows }, open) => {
            // The change is in effect once a new flow lands on the new endpoint.
            let mut last = String::from("nothing yet");
            let mut in_effect = None;
            while changed_at.elapsed() < CHANGE_WITHIN {
                match probe.send(cluster, None, Duration::from_millis(500)) {
                    Ok(reply) if new_flows.contains(&reply.server_name.as_str()) => {
                        in_effect = Some((changed_at.elapsed(), seen_reply(probe, &reply)));
                        break;
                    }
                    Ok(reply) => last = format!("answered by {}", reply.server_name),
                    Err(error) => last = error.to_string(),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let Some((in_effect, seen)) = in_effect else {
                return Err(format!("new flows did not reach {new_flows:?} within {CHANGE_WITHIN:?}: {last}"));
            };
            // Let the proxy finish what it does after a sync (stale-flow cleanup).
            std::thread::sleep(Duration::from_millis(700));
            let mut open = open;
            for attempt in 1..=3 {
                let reply = match &mut open {
                    Open::UdpPort(port) => probe.send_from_port(cluster, *port, ANSWER_TIMEOUT),
                    Open::Connection(conversation) => conversation.ask(ANSWER_TIMEOUT),
                }
                .map_err(|error| format!("the open flow failed after the change (attempt {attempt}): {error}"))?;
                if reply.server_name != pod {
                    return Err(format!(
                        "the open flow to terminating {pod} moved to {} after the change (attempt {attempt}): it was cut",
                        reply.server_name
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok((format!("new flows on {new_flows:?} after {in_effect:?}; the open flow still on {pod}"), seen))
        }
        _ => unreachable!("only mutating rows"),
    }
}

/// Asks explain about the probe's packet (before anything is sent).
fn predict(cluster: &Cluster, probe: &Probe) -> Result<Option<Prediction>, String> {
    agreement::predict(cluster, &probe.row, &probe.resolved)
}

/// Checks what the kernel did against explain's prediction.
fn check_agreement(probe: &Probe, prediction: Option<&Prediction>, seen: &Seen) -> Result<String, String> {
    match prediction {
        Some(prediction) => agreement::agree(&probe.row, prediction, seen, probe.relayed)
            .map(|()| format!("{} (agrees)", prediction.summary()))
            .map_err(|error| format!("explain disagrees with the kernel: {error}")),
        None => Ok("no address to ask explain about".to_owned()),
    }
}

/// Runs one non-mutating row: explain's prediction, the probes, then both compared.
fn run_one(cluster: &Cluster, row: &Scenario) -> Result<String, String> {
    let probe = Probe::of(cluster, row)?;
    let prediction = predict(cluster, &probe).map_err(|detail| format!("({probe}): {detail}"))?;
    let result = match row.expect {
        Outcome::Answered { by } => expect_answered(cluster, &probe, by, row.source),
        Outcome::Rejected => expect_rejected(cluster, &probe),
        Outcome::Dropped => expect_dropped(cluster, &probe),
        Outcome::NotServed => expect_not_served(cluster, &probe, false),
        Outcome::Ignored => expect_not_served(cluster, &probe, true),
        Outcome::HealthCheck { local_endpoints } => expect_health(cluster, &probe, local_endpoints),
        Outcome::StickyThenFreshAfterIdle { by } => expect_sticky_then_fresh(cluster, &probe, by),
        Outcome::StickyWhileTalking { by } => expect_sticky_while_talking(cluster, &probe, by),
        Outcome::FollowsEndpointChange { .. } | Outcome::KeepsFlowAcrossEndpointChange { .. } => {
            unreachable!("mutating rows run in groups")
        }
    };
    let explained = prediction.as_ref().map_or_else(String::new, |p| format!("; {}", p.summary()));
    let (detail, seen) = result.map_err(|detail| format!("({probe}): {detail}{explained}"))?;
    let agreement = check_agreement(&probe, prediction.as_ref(), &seen).map_err(|d| format!("({probe}): {d}"))?;
    Ok(format!("{detail}; {agreement}"))
}

/// Runs the mutating rows of one Service around its endpoint change.
fn run_group(cluster: &Cluster, service: &str, rows: &[Scenario]) -> Vec<Result<String, String>> {
    let Some(mutation) = manifests::mutation(service) else {
        return rows.iter().map(|_| Err(format!("no endpoint change for Service {service} in the fixture"))).collect();
    };
    let probes: Vec<Result<Probe, String>> = rows.iter().map(|row| Probe::of(cluster, row)).collect();
    // Explain is asked before the change and again after it, each time about the
    // manifests the proxies then read, and compared with the flow the row watches.
    let opened: Vec<Result<(Probe, Open), String>> = probes
        .into_iter()
        .map(|probe| {
            let probe = probe?;
            let prediction = predict(cluster, &probe).map_err(|detail| format!("({probe}): {detail}"))?;
            let (open, seen) = before_change(cluster, &probe).map_err(|detail| format!("({probe}): {detail}"))?;
            check_agreement(&probe, prediction.as_ref(), &seen)
                .map_err(|detail| format!("({probe}): before the change: {detail}"))?;
            Ok((probe, open))
        })
        .collect();
    let (file, text) = mutation.change();
    cluster.write_file(&file, &text);
    opened
        .into_iter()
        .map(|opened| {
            let (probe, open) = opened?;
            let prediction = predict(cluster, &probe).map_err(|detail| format!("({probe}): {detail}"))?;
            let (detail, seen) =
                after_change(cluster, &probe, open).map_err(|detail| format!("({probe}): {detail}"))?;
            let agreement = check_agreement(&probe, prediction.as_ref(), &seen)
                .map_err(|detail| format!("({probe}): after the change: {detail}"))?;
            Ok(format!("{detail}; after the change {agreement}"))
        })
        .collect()
}

/// Runs every row (once per family), then fails once listing every failed row (with the
/// proxies' logs and the backend's diagnostics), so one broken row does not hide the others.
pub fn check_rows(cluster: &Cluster, rows: &[Scenario]) {
    let mut runs: Vec<Scenario> = rows.iter().flat_map(Scenario::each_family).collect();
    if cluster.backend().relays_from_the_node {
        // The relay connects from the node: what the others keep, it cannot.
        for run in &mut runs {
            if run.source == SourceSeen::ClientAddress {
                run.source = SourceSeen::NodeAddress;
            }
        }
    }
    runs.retain(|run| match (cluster.backend().not_applicable)(run) {
        Some(reason) => {
            eprintln!("not applicable to {}: {} — {reason}", cluster.backend().name, run.label());
            false
        }
        None => true,
    });
    // Work items: single rows, and mutating rows grouped by Service.
    let mut items: Vec<Vec<Scenario>> = Vec::new();
    let mut groups: BTreeMap<&str, Vec<Scenario>> = BTreeMap::new();
    for run in runs {
        if run.expect.mutates() {
            groups.entry(run.service).or_default().push(run);
        } else {
            items.push(vec![run]);
        }
    }
    items.extend(groups.into_values());
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(String, Result<String, String>)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_ROWS.min(items.len()) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(index) else { break };
                    let outcomes = if item[0].expect.mutates() {
                        run_group(cluster, item[0].service, item)
                    } else {
                        vec![run_one(cluster, &item[0])]
                    };
                    for (row, outcome) in item.iter().zip(outcomes) {
                        match &outcome {
                            Ok(detail) => eprintln!("ok: {} — {detail}", row.label()),
                            Err(failure) => eprintln!("FAILED: {} {failure}", row.label()),
                        }
                        results.lock().expect("results lock").push((row.label(), outcome));
                    }
                }
            });
        }
    });
    let results = results.into_inner().expect("results lock");
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(label, outcome)| outcome.as_ref().err().map(|failure| format!("row `{label}` {failure}")))
        .collect();
    if !failures.is_empty() {
        panic!(
            "{} of {} scenario runs failed on the {} backend (real kernel):\n- {}\n\n{}",
            failures.len(),
            results.len(),
            cluster.backend().name,
            failures.join("\n- "),
            cluster.diagnostics()
        );
    }
}

/// Polls `attempt` until it returns `Some`, at most until `limit`; a short pause between
/// attempts keeps the loop from spinning. Returns the value and the time it took.
pub fn eventually<T>(limit: Duration, mut attempt: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let started = Instant::now();
    loop {
        if let Some(value) = attempt() {
            return Some((value, started.elapsed()));
        }
        if started.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connections of each protocol the counters test sends to the echo Service's ClusterIP.
const COUNTED_CONNECTIONS: usize = 12;

/// `svcplane top --count 1 --output json` in node1: the echo Service's per-endpoint
/// connection counters, per protocol.
fn echo_counters(cluster: &Cluster) -> Result<BTreeMap<(String, SocketAddr), u64>, String> {
    let lab = cluster.lab();
    let mut args: Vec<&str> = vec![env!("CARGO_BIN_EXE_svcplane"), "top", "--count", "1", "--output", "json"];
    args.extend(["--max-series", "100000"]);
    // The flags `top` shares with the proxy: which mode's rules, which iptables.
    for pair in cluster.backend().proxy_args.chunks(2) {
        if let [flag @ ("--mode" | "--iptables-backend"), value] = pair {
            args.extend([*flag, *value]);
        }
    }
    let bpf_root = cluster.bpf_root(THIS_NODE).to_string_lossy().into_owned();
    if cluster.backend().node_cgroups {
        args.extend(["--bpf-root", &bpf_root]);
    }
    let text =
        lab.exec_ok(lab.node(THIS_NODE).namespace_name(), &args).map_err(|error| format!("svcplane top: {error}"))?;
    let json: serde_json::Value =
        serde_json::from_str(text.trim()).map_err(|error| format!("svcplane top printed no JSON ({error}): {text}"))?;
    let echo = format!("default/{}", manifests::ECHO_SERVICE);
    let mut counters = BTreeMap::new();
    for series in json["endpoints"].as_array().into_iter().flatten() {
        let service = series["servicePort"].as_str().unwrap_or_default();
        if service != echo && !service.starts_with(&format!("{echo}:")) {
            continue;
        }
        let protocol = series["protocol"].as_str().unwrap_or_default().to_owned();
        let endpoint: SocketAddr = series["endpoint"]
            .as_str()
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| format!("a series without an endpoint: {series}"))?;
        let connections = series["connections"].as_u64().ok_or_else(|| format!("no connections in {series}"))?;
        *counters.entry((protocol, endpoint)).or_default() += connections;
    }
    Ok(counters)
}

/// Sends [`COUNTED_CONNECTIONS`] TCP connections and as many UDP flows (a source port
/// never used before each) from a pod on node1 to the echo Service's IPv4 ClusterIP and checks that node1's
/// kernel counters grew by exactly the connections each endpoint answered, per protocol.
pub fn check_connection_counters(cluster: &Cluster) {
    let echo = cluster.service(manifests::ECHO_SERVICE).expect("the echo Service");
    let target = echo.cluster_ip_address(false).expect("an IPv4 ClusterIP");
    let lab = cluster.lab();
    let namespace = lab.pod(manifests::POD_ON_THIS_NODE).namespace_name().to_owned();
    let before = echo_counters(cluster).unwrap_or_else(|error| panic!("reading the counters before: {error}"));
    let mut answered: BTreeMap<(String, SocketAddr), u64> = BTreeMap::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for sent in 0..COUNTED_CONNECTIONS {
            // A UDP flow is its ports: a new socket that happened to reuse the source port of
            // a flow still alive would continue that flow (in every mode), so each gets a port
            // never used before.
            let source = (protocol == Protocol::Udp).then(|| net::unspecified(target, fixed_source_port()));
            let reply = net::request(lab, &namespace, protocol, target, source, ANSWER_TIMEOUT)
                .unwrap_or_else(|error| panic!("{protocol} connection {} to {target}: {error}", sent + 1));
            let endpoint = SocketAddr::new(manifests::pod_ip(&reply.server_name, super::Family::V4), echo.target_port);
            *answered.entry((protocol.to_string(), endpoint)).or_default() += 1;
        }
    }
    let after = echo_counters(cluster).unwrap_or_else(|error| panic!("reading the counters after: {error}"));
    let grown: BTreeMap<(String, SocketAddr), u64> = after
        .iter()
        .map(|(key, now)| (key.clone(), now.saturating_sub(before.get(key).copied().unwrap_or(0))))
        .filter(|(_, grew)| *grew > 0)
        .collect();
    assert_eq!(
        grown,
        answered,
        "on the {} backend, node1's counters grew by {grown:?} while the endpoints answered {answered:?} \
         (counters before {before:?}, after {after:?})",
        cluster.backend().name
    );
    eprintln!(
        "ok: on the {} backend node1's counters grew by exactly what was answered: {grown:?}",
        cluster.backend().name
    );
}
