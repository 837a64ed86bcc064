//! Why a packet goes where it goes: reads a [`NodePlan`] (the very value every mode renders)
//! and answers, for one new connection's first packet, which frontend takes it, which route,
//! which endpoints it may reach and how likely each is, whether it is masqueraded and why,
//! session affinity, or why it is rejected, dropped or not touched at all.
//!
//! The walk follows the order the modes spell: a Service address (ClusterIP, external IP,
//! load-balancer IP) first, then NodePorts on the node's addresses, then the health-check
//! node ports the proxy serves itself; on a frontend, `loadBalancerSourceRanges`, then the
//! routes in order, then what the plan says for traffic no route takes. Pure: no I/O.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::model::{ClientIpAffinity, IpFamily, NamespacedName, Protocol, ServicePortName};
use crate::plan::{
    Destination, EndpointSetKind, Frontend, FrontendKind, NodePlan, Refusal, Route, ServicePortPlan, SourceMatch,
    Unrouted,
};
use crate::state::ClusterState;

/// The packet to explain: a new connection's first packet arriving at (or sent on) the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Query {
    pub source: IpAddr,
    pub destination: SocketAddr,
    pub protocol: Protocol,
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}/{}", self.source, self.destination, self.protocol)
    }
}

/// One endpoint a forwarded packet may reach.
#[derive(Debug, Clone, PartialEq)]
pub struct EligibleEndpoint {
    pub address: SocketAddr,
    /// Chance a new connection (without affinity memory) picks it: 1/n, as the modes spell
    /// an endpoint set as a uniform random choice.
    pub probability: f64,
    /// The node the endpoint runs on, when its EndpointSlice says.
    pub node: Option<String>,
    /// Whether it runs on this node.
    pub local: bool,
    /// Ready, or terminating and still serving (used only when no endpoint is ready).
    pub ready: bool,
    pub terminating: bool,
    /// The sender is this endpoint (a pod reaching itself through its Service).
    pub hairpin: bool,
}

/// The frontend a packet matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchedFrontend {
    pub service_port: ServicePortName,
    pub family: IpFamily,
    pub kind: FrontendKind,
    /// The address and port it matched on (a NodePort: the node address the packet was sent to).
    pub address: SocketAddr,
}

impl fmt::Display for MatchedFrontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} of {} ({})", kind_name(self.kind), self.address, self.service_port, self.family)
    }
}

/// The route a forwarded packet takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenRoute {
    /// 1-based, of `of`.
    pub number: usize,
    pub of: usize,
    pub route: Route,
}

/// A packet a frontend forwards.
#[derive(Debug, Clone, PartialEq)]
pub struct Forwarding {
    pub frontend: MatchedFrontend,
    pub route: TakenRoute,
    pub endpoint_set: EndpointSetKind,
    pub endpoints: Vec<EligibleEndpoint>,
    /// Whether the source is rewritten to a node address on the way to the endpoints.
    pub masquerade: bool,
    pub masquerade_reason: String,
    /// When the route keeps the source: whether the pick of the sender itself is
    /// masqueraded anyway (hairpin).
    pub hairpin_masquerade: bool,
    pub affinity: Option<ClientIpAffinity>,
}

/// How the packet ends on this node.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// DNAT to one of the eligible endpoints.
    Forwarded(Box<Forwarding>),
    /// Refused at once: the Service has no usable endpoint.
    Rejected { frontend: MatchedFrontend, refusal: Refusal, reason: String },
    /// Dropped silently.
    Dropped { frontend: MatchedFrontend, reason: String },
    /// Answered by the proxy's health-check server itself.
    HealthCheck { service: NamespacedName, port: u16, local_endpoints: usize },
    /// No frontend of svcplane's takes it: the node's own stack handles it untouched.
    NotServed { reason: String },
}

impl Verdict {
    /// `forwarded`, `rejected`, `dropped`, `health-check`, `not-served`.
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Forwarded(_) => "forwarded",
            Verdict::Rejected { .. } => "rejected",
            Verdict::Dropped { .. } => "dropped",
            Verdict::HealthCheck { .. } => "health-check",
            Verdict::NotServed { .. } => "not-served",
        }
    }

    pub fn frontend(&self) -> Option<&MatchedFrontend> {
        match self {
            Verdict::Forwarded(forwarding) => Some(&forwarding.frontend),
            Verdict::Rejected { frontend, .. } | Verdict::Dropped { frontend, .. } => Some(frontend),
            Verdict::HealthCheck { .. } | Verdict::NotServed { .. } => None,
        }
    }
}

/// The answer for one packet on one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub node: String,
    pub query: Query,
    /// Whether the source is an address of this node (the node itself sent it).
    pub from_this_node: bool,
    pub verdict: Verdict,
}

/// What the plan does with `query` on its node. `state` is what the plan was built from
/// (it only adds facts about endpoints: their node, ready or terminating); `local_addresses`
/// are the node's own addresses (where NodePorts and health checks answer, and what "this
/// node" sends from); loopback always counts as local.
pub fn explain(plan: &NodePlan, state: &ClusterState, local_addresses: &[IpAddr], query: &Query) -> Explanation {
    let is_local = |address: IpAddr| address.is_loopback() || local_addresses.contains(&address);
    let from_this_node = is_local(query.source);
    let facts = Facts { plan, state, is_local: &is_local, from_this_node };
    let verdict = verdict(&facts, query);
    Explanation { node: plan.config.node_name.clone(), query: *query, from_this_node, verdict }
}

/// What the walk reads besides the packet.
struct Facts<'a> {
    plan: &'a NodePlan,
    state: &'a ClusterState,
    is_local: &'a dyn Fn(IpAddr) -> bool,
    from_this_node: bool,
}

fn verdict(facts: &Facts<'_>, query: &Query) -> Verdict {
    let (plan, is_local) = (facts.plan, facts.is_local);
    let family = IpFamily::of(&query.destination.ip());
    if IpFamily::of(&query.source) != family {
        return Verdict::NotServed {
            reason: format!("the source {} and the destination are of different IP families", query.source),
        };
    }
    let ports = || plan.service_ports.values().filter(|p| p.family == family && p.protocol == query.protocol);
    // Service addresses first, as the modes' service maps come before node ports.
    for port_plan in ports() {
        for frontend in &port_plan.frontends {
            if frontend.destination == Destination::Address(query.destination.ip())
                && frontend.port == query.destination.port()
            {
                return through(facts, port_plan, frontend, query);
            }
        }
    }
    let node_port = ports().find_map(|p| {
        p.frontends
            .iter()
            .find(|f| f.destination == Destination::NodePortAddresses && f.port == query.destination.port())
            .map(|f| (p, f))
    });
    if let Some((port_plan, frontend)) = node_port {
        let address = query.destination.ip();
        let excluded = plan.node_port_exclusions.get(&family).into_iter().flatten().find(|c| c.contains(&address));
        if let Some(excluded) = excluded {
            return Verdict::NotServed {
                reason: format!(
                    "{address} is in {excluded}, where NodePorts never answer (so a NodePort never opens {} to every local process)",
                    port_plan.name
                ),
            };
        }
        if !is_local(address) {
            return Verdict::NotServed {
                reason: format!(
                    "port {} is the NodePort of {}, but {address} is not an address of {}",
                    frontend.port, port_plan.name, plan.config.node_name
                ),
            };
        }
        let cidrs = plan.node_port_cidrs.get(&family).map(Vec::as_slice).unwrap_or_default();
        if !cidrs.iter().any(|c| c.contains(&address)) {
            return Verdict::NotServed {
                reason: format!(
                    "port {} is the NodePort of {}, but NodePorts answer only on node addresses inside {} (--nodeport-addresses) and {address} is not",
                    frontend.port,
                    port_plan.name,
                    list(cidrs)
                ),
            };
        }
        return through(facts, port_plan, frontend, query);
    }
    if query.protocol == Protocol::Tcp && is_local(query.destination.ip()) {
        for (service, check) in &plan.health_checks {
            if check.port == query.destination.port() {
                return Verdict::HealthCheck {
                    service: service.clone(),
                    port: check.port,
                    local_endpoints: check.local_endpoints,
                };
            }
        }
    }
    Verdict::NotServed {
        reason: format!(
            "no Service frontend on {} is {}/{}: svcplane leaves the packet alone (a headless, ExternalName or \
             other proxy's Service, an ipMode Proxy load-balancer IP, or no Service at all)",
            plan.config.node_name, query.destination, query.protocol
        ),
    }
}

/// The packet matched `frontend` of `port_plan`: source ranges, routes, then the rest.
fn through(facts: &Facts<'_>, port_plan: &ServicePortPlan, frontend: &Frontend, query: &Query) -> Verdict {
    let (plan, from_this_node) = (facts.plan, facts.from_this_node);
    let matched = MatchedFrontend {
        service_port: port_plan.name.clone(),
        family: port_plan.family,
        kind: frontend.kind,
        address: query.destination,
    };
    if !frontend.allowed_sources.is_empty() && !frontend.allowed_sources.iter().any(|c| c.contains(&query.source)) {
        return Verdict::Dropped {
            reason: format!(
                "the source {} is outside loadBalancerSourceRanges {} of {}",
                query.source,
                list(&frontend.allowed_sources),
                port_plan.name.service
            ),
            frontend: matched,
        };
    }
    let taken = frontend.routes.iter().position(|route| source_matches(&route.sources, query.source, from_this_node));
    let Some(index) = taken else {
        return unrouted(plan, port_plan, frontend, matched);
    };
    let route = &frontend.routes[index];
    let set = port_plan.endpoints(route.endpoints);
    let known = facts.state.endpoints_for(&port_plan.name);
    let endpoints: Vec<EligibleEndpoint> = set
        .iter()
        .map(|address| {
            let fact = known.iter().find(|e| e.address == *address).map(|e| &e.endpoint);
            let node = fact.and_then(|e| e.node_name.as_deref().map(str::to_owned));
            EligibleEndpoint {
                address: *address,
                probability: 1.0 / set.len() as f64,
                local: port_plan.local_endpoints.contains(address)
                    || node.as_deref() == Some(plan.config.node_name.as_str()),
                node,
                ready: fact.is_none_or(|e| e.ready),
                terminating: fact.is_some_and(|e| e.terminating),
                hairpin: address.ip() == query.source,
            }
        })
        .collect();
    let hairpin_masquerade =
        !route.masquerade && port_plan.masquerade_hairpin && endpoints.iter().any(|endpoint| endpoint.hairpin);
    let masquerade_reason =
        masquerade_reason(frontend.kind, &frontend.routes[..index], route, from_this_node, query.source);
    Verdict::Forwarded(Box::new(Forwarding {
        frontend: matched,
        route: TakenRoute { number: index + 1, of: frontend.routes.len(), route: route.clone() },
        endpoint_set: route.endpoints,
        endpoints,
        masquerade: route.masquerade,
        masquerade_reason,
        hairpin_masquerade,
        affinity: port_plan.affinity,
    }))
}

fn source_matches(sources: &SourceMatch, source: IpAddr, from_this_node: bool) -> bool {
    match sources {
        SourceMatch::Any => true,
        SourceMatch::Inside(cidrs) => cidrs.iter().any(|c| c.contains(&source)),
        SourceMatch::Outside(cidrs) => !cidrs.iter().any(|c| c.contains(&source)),
        SourceMatch::ThisNode => from_this_node,
    }
}

/// Which traffic policy governs a frontend kind.
fn policy_name(kind: FrontendKind) -> &'static str {
    match kind {
        FrontendKind::ClusterIp => "internalTrafficPolicy",
        FrontendKind::NodePort | FrontendKind::ExternalIp | FrontendKind::LoadBalancer => "externalTrafficPolicy",
    }
}

fn unrouted(plan: &NodePlan, port_plan: &ServicePortPlan, frontend: &Frontend, matched: MatchedFrontend) -> Verdict {
    let node = &plan.config.node_name;
    let service = &port_plan.name;
    match frontend.unrouted {
        Unrouted::Reject => Verdict::Rejected {
            reason: format!(
                "{service} has no usable {} endpoint (none ready, none terminating and still serving)",
                port_plan.family
            ),
            refusal: port_plan.refusal,
            frontend: matched,
        },
        Unrouted::Drop => Verdict::Dropped {
            reason: format!(
                "{} Local and no local endpoint on {node}: endpoints of {service} exist, but not on this node",
                policy_name(frontend.kind)
            ),
            frontend: matched,
        },
        // The plan says every source has a route; a source none took means the plan and
        // this walk disagree, said so rather than guessed.
        Unrouted::Unreachable => Verdict::Dropped {
            reason: format!("no route of {service} takes this source although the plan says every source has one"),
            frontend: matched,
        },
    }
}

fn masquerade_reason(
    kind: FrontendKind,
    earlier: &[Route],
    route: &Route,
    from_this_node: bool,
    source: IpAddr,
) -> String {
    let inside = earlier.iter().find_map(|r| match &r.sources {
        SourceMatch::Outside(cidrs) => Some(cidrs),
        _ => None,
    });
    match (&route.sources, route.masquerade) {
        (SourceMatch::Outside(cidrs), true) => format!(
            "the source {source} is outside the cluster CIDR {}: off-cluster traffic is masqueraded so replies come back through this node",
            list(cidrs)
        ),
        (SourceMatch::Inside(cidrs), false) => format!(
            "the source {source} is inside the cluster CIDR {}: a pod is not external traffic and keeps its own address",
            list(cidrs)
        ),
        (SourceMatch::ThisNode, true) => {
            "sent by this node itself: masqueraded so the endpoint (maybe on another node) answers the node".to_owned()
        }
        (SourceMatch::Any, true) => format!(
            "{} Cluster: the endpoint may be on another node, so the source becomes this node's address",
            policy_name(kind)
        ),
        (SourceMatch::Any, false) if route.endpoints == EndpointSetKind::Local && kind != FrontendKind::ClusterIp => {
            "externalTrafficPolicy Local: only endpoints on this node are used, so the client's address is kept"
                .to_owned()
        }
        (SourceMatch::Any, false) if inside.is_some() && !from_this_node => format!(
            "the source {source} is inside the cluster CIDR {}: a pod keeps its own address",
            list(inside.map(Vec::as_slice).unwrap_or_default())
        ),
        (SourceMatch::Any, false) if from_this_node => {
            "not masqueraded: the node sends from its own address already".to_owned()
        }
        (SourceMatch::Any, false) => {
            "no cluster CIDR is configured (--cluster-cidr), so traffic to a ClusterIP keeps its source address"
                .to_owned()
        }
        (sources, masquerade) => format!("the route for sources {sources:?} says masquerade {masquerade}"),
    }
}

fn kind_name(kind: FrontendKind) -> &'static str {
    match kind {
        FrontendKind::ClusterIp => "ClusterIP",
        FrontendKind::NodePort => "NodePort",
        FrontendKind::ExternalIp => "external IP",
        FrontendKind::LoadBalancer => "load-balancer IP",
    }
}

/// `ClusterIP`, `NodePort`, `external IP`, `load-balancer IP`.
pub fn frontend_kind_name(kind: FrontendKind) -> &'static str {
    kind_name(kind)
}

/// How a route's sources read in a sentence.
pub fn describe_sources(sources: &SourceMatch) -> String {
    match sources {
        SourceMatch::Any => "any source".to_owned(),
        SourceMatch::Inside(cidrs) => format!("sources inside {}", list(cidrs)),
        SourceMatch::Outside(cidrs) => format!("sources outside {}", list(cidrs)),
        SourceMatch::ThisNode => "this node's own addresses".to_owned(),
    }
}

fn list(cidrs: &[IpNet]) -> String {
    if cidrs.is_empty() {
        return "(none)".to_owned();
    }
    cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn set_name(set: EndpointSetKind) -> &'static str {
    match set {
        EndpointSetKind::Cluster => "cluster",
        EndpointSetKind::Local => "local",
    }
}

/// `cluster` or `local`.
pub fn endpoint_set_name(set: EndpointSetKind) -> &'static str {
    set_name(set)
}

impl fmt::Display for Explanation {
    /// The operator's reading: one fact per line, the reason after the fact.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = if self.from_this_node { " (this node)" } else { "" };
        writeln!(f, "packet:     {}{from} on {}", self.query, self.node)?;
        match &self.verdict {
            Verdict::Forwarded(forwarding) => {
                let forwarding = forwarding.as_ref();
                writeln!(f, "frontend:   {}", forwarding.frontend)?;
                let route = &forwarding.route;
                writeln!(
                    f,
                    "route:      {} of {}: {} -> {} endpoints{}",
                    route.number,
                    route.of,
                    describe_sources(&route.route.sources),
                    set_name(route.route.endpoints),
                    if route.route.masquerade { ", masqueraded" } else { "" }
                )?;
                writeln!(
                    f,
                    "verdict:    forwarded (DNAT) to one of {} {} endpoint(s):",
                    forwarding.endpoints.len(),
                    set_name(forwarding.endpoint_set)
                )?;
                for endpoint in &forwarding.endpoints {
                    let mut notes = Vec::new();
                    match (&endpoint.node, endpoint.local) {
                        (_, true) => notes.push("on this node".to_owned()),
                        (Some(node), false) => notes.push(format!("on {node}")),
                        (None, false) => {}
                    }
                    if endpoint.terminating {
                        notes.push("terminating, still serving".to_owned());
                    }
                    if endpoint.hairpin {
                        notes.push("the sender itself: hairpin".to_owned());
                    }
                    let notes = if notes.is_empty() { String::new() } else { format!("  ({})", notes.join(", ")) };
                    writeln!(f, "            {:<28} {:>5.1}%{notes}", endpoint.address, endpoint.probability * 100.0)?;
                }
                let masquerade = if forwarding.masquerade { "yes" } else { "no" };
                writeln!(f, "masquerade: {masquerade}: {}", forwarding.masquerade_reason)?;
                if forwarding.hairpin_masquerade {
                    writeln!(
                        f,
                        "hairpin:    if the sender draws itself it is masqueraded anyway, or its reply would bypass this node's conntrack"
                    )?;
                }
                match forwarding.affinity {
                    Some(affinity) => writeln!(
                        f,
                        "affinity:   ClientIP, {}s: a client returns to the endpoint it had while it keeps connecting within the timeout",
                        affinity.timeout.as_secs()
                    ),
                    None => writeln!(f, "affinity:   none: every new connection draws afresh"),
                }
            }
            Verdict::Rejected { frontend, refusal, reason } => {
                writeln!(f, "frontend:   {frontend}")?;
                let how = match refusal {
                    Refusal::TcpReset => "a TCP reset",
                    Refusal::IcmpPortUnreachable => "ICMP port unreachable",
                };
                writeln!(f, "verdict:    rejected with {how}")?;
                writeln!(f, "why:        {reason}")
            }
            Verdict::Dropped { frontend, reason } => {
                writeln!(f, "frontend:   {frontend}")?;
                writeln!(f, "verdict:    dropped silently")?;
                writeln!(f, "why:        {reason}")
            }
            Verdict::HealthCheck { service, port, local_endpoints } => {
                let status = if *local_endpoints > 0 { 200 } else { 503 };
                writeln!(f, "frontend:   health-check node port {port} of {service}")?;
                writeln!(
                    f,
                    "verdict:    answered by the proxy itself: HTTP {status}, {local_endpoints} local endpoint(s)"
                )
            }
            Verdict::NotServed { reason } => {
                writeln!(f, "verdict:    not served by svcplane")?;
                writeln!(f, "why:        {reason}")
            }
        }
    }
}

#[cfg(test)]
mod tests;
