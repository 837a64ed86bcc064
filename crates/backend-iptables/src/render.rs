//! Plan -> iptables rules, in kube-proxy's chain layout. Pure: the same plan always renders
//! the same rules, each built with its arguments in kube-proxy's order.
//!
//! nat: `PREROUTING`/`OUTPUT` -> `KUBE-SERVICES`: one rule per ClusterIP, external and
//! load-balancer IP (to `KUBE-SVC/SVL-…`, `KUBE-EXT-…` or `KUBE-FW-…`), last the jump to
//! `KUBE-NODEPORTS` for local destinations. `KUBE-EXT-…` holds the external routes (mark
//! for masquerade, short-circuits), `KUBE-SVC-…`/`KUBE-SVL-…` the `statistic` cascade over
//! the Cluster / Local endpoint set, each `KUBE-SEP-…` the hairpin mark and the DNAT.
//! `POSTROUTING` -> `KUBE-POSTROUTING` masquerades what carries the 0x4000 mark.
//! filter: `KUBE-SERVICES` (FORWARD, OUTPUT) and `KUBE-EXTERNAL-SERVICES` (INPUT, FORWARD)
//! reject or drop new connections to frontends without a route; `KUBE-PROXY-FIREWALL`
//! drops load-balancer traffic `KUBE-FW-…` did not let through.
//!
//! Nothing here decides Service policy: which sources take which route, masquerading,
//! Reject or Drop, source ranges, affinity and both endpoint sets all come from the plan.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use svcplane_core::{
    Destination, EndpointSetKind, Frontend, FrontendKind, IpFamily, Refusal, Route, ServicePortPlan, SourceMatch,
    Unrouted,
};
use svcplane_iptables::{
    Arg, Family, LocalTest, MarkOp, Match, Probability, Protocol, Recent, RecentAction, RejectWith, Rule, Table, Target,
};

use crate::names::{
    ENDPOINT_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX, INTERNAL_PREFIX, LOCAL_PREFIX, SERVICE_PREFIX, SOURCE_PREFIX,
    endpoint_chain, numbered_service_chain, service_chain, service_port_name,
};

/// The mark bit that asks `KUBE-POSTROUTING` to masquerade (kube-proxy's default, bit 14).
pub const MASQUERADE_MARK: u32 = 0x4000;

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// Watched for a flush behind svcplane's back; holds one rule so `-F` alone shows too.
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
pub const CANARY_COMMENT: &str = "svcplane canary: if this rule is gone, the table was flushed";

/// The tables svcplane writes, in the order a sync writes them.
pub const TABLES: [Table; 3] = [Table::Filter, Table::Nat, Table::Mangle];

pub fn family(family: IpFamily) -> Family {
    match family {
        IpFamily::V4 => Family::V4,
        IpFamily::V6 => Family::V6,
    }
}

/// The chains every service port adds rules to (and which the base rules own too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SharedChain {
    /// nat `KUBE-SERVICES`: dispatch on service address and port.
    NatServices,
    /// nat `KUBE-NODEPORTS`: dispatch on node port.
    NatNodePorts,
    /// filter `KUBE-SERVICES`: ClusterIPs without a route for new connections.
    FilterServices,
    /// filter `KUBE-EXTERNAL-SERVICES`: NodePorts, external and LB IPs without a route.
    FilterExternalServices,
    /// filter `KUBE-PROXY-FIREWALL`: LB traffic the source ranges did not let in.
    FilterFirewall,
}

impl SharedChain {
    pub const ALL: [SharedChain; 5] = [
        SharedChain::NatServices,
        SharedChain::NatNodePorts,
        SharedChain::FilterServices,
        SharedChain::FilterExternalServices,
        SharedChain::FilterFirewall,
    ];

    pub fn table(self) -> Table {
        match self {
            SharedChain::NatServices | SharedChain::NatNodePorts => Table::Nat,
            _ => Table::Filter,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SharedChain::NatServices | SharedChain::FilterServices => KUBE_SERVICES,
            SharedChain::NatNodePorts => KUBE_NODEPORTS,
            SharedChain::FilterExternalServices => KUBE_EXTERNAL_SERVICES,
            SharedChain::FilterFirewall => KUBE_PROXY_FIREWALL,
        }
    }
}

/// Everything one service port owns in its family's tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    /// Its rules in the shared chains, in order.
    pub shared: BTreeMap<SharedChain, Vec<Rule>>,
    /// The nat chains it owns whole, with their rules.
    pub chains: Vec<(String, Vec<Rule>)>,
}

impl PortRules {
    pub fn shared_rules(&self, chain: SharedChain) -> &[Rule] {
        self.shared.get(&chain).map(Vec::as_slice).unwrap_or_default()
    }

    pub fn rule_count(&self) -> usize {
        self.shared.values().map(Vec::len).sum::<usize>() + self.chains.iter().map(|(_, r)| r.len()).sum::<usize>()
    }
}

/// A jump from a built-in chain into svcplane's, inserted at the top like kube-proxy's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub chain: &'static str,
    pub rule: Rule,
}

fn hook(chain: &'static str, new_only: bool, comment: &str, target: &str) -> Hook {
    let mut rule = Rule::new();
    if new_only {
        rule = rule.new_connections();
    }
    Hook { chain, rule: rule.comment(comment).jump(target) }
}

/// The hooks of `table`, in the order they are prepended (so the last ends up first).
pub fn hooks(table: Table) -> Vec<Hook> {
    match table {
        Table::Nat => vec![
            hook("OUTPUT", false, "kubernetes service portals", KUBE_SERVICES),
            hook("PREROUTING", false, "kubernetes service portals", KUBE_SERVICES),
            hook("POSTROUTING", false, "kubernetes postrouting rules", KUBE_POSTROUTING),
        ],
        Table::Filter => vec![
            hook("INPUT", true, "kubernetes externally-visible service portals", KUBE_EXTERNAL_SERVICES),
            hook("FORWARD", true, "kubernetes externally-visible service portals", KUBE_EXTERNAL_SERVICES),
            hook("FORWARD", true, "kubernetes service portals", KUBE_SERVICES),
            hook("OUTPUT", true, "kubernetes service portals", KUBE_SERVICES),
            hook("INPUT", true, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
            hook("OUTPUT", true, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
            hook("FORWARD", true, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
        ],
        Table::Mangle | Table::Raw => Vec::new(),
    }
}

/// The chains svcplane owns whole in `table`, besides the per-service ones.
pub fn base_chains(table: Table) -> &'static [&'static str] {
    match table {
        Table::Nat => &[KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ, KUBE_PROXY_CANARY],
        Table::Filter => &[KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_PROXY_FIREWALL, KUBE_PROXY_CANARY],
        Table::Mangle => &[KUBE_PROXY_CANARY],
        Table::Raw => &[],
    }
}

pub fn canary_rule() -> Rule {
    Rule::new().comment(CANARY_COMMENT).target(Target::Return)
}

/// The fixed rules of `table`, chain by chain (the shared chains' rules of service ports
/// and the node-port jump come separately).
pub fn base_rules(table: Table) -> Vec<(&'static str, Rule)> {
    let mut rules = vec![(KUBE_PROXY_CANARY, canary_rule())];
    if table == Table::Nat {
        let mark = Match::Mark { negate: true, value: MASQUERADE_MARK, mask: MASQUERADE_MARK };
        rules.push((KUBE_POSTROUTING, Rule::new().matching(mark).target(Target::Return)));
        // Clear the bit, so a packet that passes postrouting again (tunnels) is not
        // masqueraded twice.
        rules.push((KUBE_POSTROUTING, Rule::new().target(Target::Mark(MarkOp::Xor(MASQUERADE_MARK)))));
        rules.push((
            KUBE_POSTROUTING,
            Rule::new()
                .comment("kubernetes service traffic requiring SNAT")
                .target(Target::Masquerade { random_fully: true }),
        ));
        rules.push((KUBE_MARK_MASQ, Rule::new().target(Target::Mark(MarkOp::Or(MASQUERADE_MARK)))));
    }
    rules
}

/// Where NodePorts answer in one family, as the plan says: local addresses inside
/// `cidrs`, never inside `exclusions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePortAddressing {
    pub cidrs: Vec<IpNet>,
    pub exclusions: Vec<IpNet>,
}

impl NodePortAddressing {
    pub fn of(plan: &svcplane_core::NodePlan, family: IpFamily) -> Self {
        Self {
            cidrs: plan.node_port_cidrs.get(&family).cloned().unwrap_or_default(),
            exclusions: plan.node_port_exclusions.get(&family).cloned().unwrap_or_default(),
        }
    }
}

/// How a frontend of kind NodePort names its destinations: local addresses inside each
/// node-port CIDR. One alternative per CIDR; a CIDR of every address excludes the plan's
/// exclusions (`! -d 127.0.0.0/8`, as kube-proxy spells it), a narrower one is itself
/// the test.
fn node_port_destinations(addressing: &NodePortAddressing) -> Vec<Vec<Arg>> {
    let local = Arg::Match(Match::AddrType { source: None, destination: Some(LocalTest { negate: false }) });
    addressing
        .cidrs
        .iter()
        .map(|cidr| {
            let mut args = vec![local.clone()];
            if cidr.prefix_len() == 0 {
                // One `-d` per rule: iptables cannot say more than one exclusion at once.
                args.extend(
                    addressing
                        .exclusions
                        .first()
                        .map(|excluded| Arg::Destination(svcplane_iptables::AddressMatch::is_not(*excluded))),
                );
            } else {
                args.push(Arg::Destination(svcplane_iptables::AddressMatch::is(*cidr)));
            }
            args
        })
        .collect()
}

/// The last rules of nat `KUBE-SERVICES`: everything to a node-port address goes on to
/// `KUBE-NODEPORTS`.
pub fn node_ports_jumps(addressing: &NodePortAddressing) -> Vec<Rule> {
    node_port_destinations(addressing)
        .into_iter()
        .map(|destination| {
            let mut rule =
                Rule::new().comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
            rule.args.extend(destination);
            rule.jump(KUBE_NODEPORTS)
        })
        .collect()
}

fn host(address: IpAddr) -> IpNet {
    IpNet::from(address)
}

/// A route's source test as alternatives (any of them may match), or the CIDRs of an
/// `Outside` test over several networks, which no single rule can express.
enum Sources {
    Alternatives(Vec<Vec<Arg>>),
    OutsideAll(Vec<IpNet>),
}

fn sources(test: &SourceMatch) -> Sources {
    match test {
        SourceMatch::Any => Sources::Alternatives(vec![Vec::new()]),
        SourceMatch::Inside(cidrs) => Sources::Alternatives(
            cidrs.iter().map(|c| vec![Arg::Source(svcplane_iptables::AddressMatch::is(*c))]).collect(),
        ),
        SourceMatch::Outside(cidrs) => match cidrs.as_slice() {
            [] => Sources::Alternatives(vec![Vec::new()]),
            [cidr] => Sources::Alternatives(vec![vec![Arg::Source(svcplane_iptables::AddressMatch::is_not(*cidr))]]),
            several => Sources::OutsideAll(several.to_vec()),
        },
        SourceMatch::ThisNode => Sources::Alternatives(vec![vec![Arg::Match(Match::AddrType {
            source: Some(LocalTest { negate: false }),
            destination: None,
        })]]),
    }
}

/// Renders one service port. `node_ports` is where NodePorts answer in the port's family.
pub fn render_port(plan: &ServicePortPlan, node_ports: &NodePortAddressing) -> PortRules {
    PortRenderer::new(plan, node_ports).render()
}

struct PortRenderer<'a> {
    plan: &'a ServicePortPlan,
    protocol: Protocol,
    /// `ns/name:port`.
    name: String,
    node_ports: &'a NodePortAddressing,
    out: PortRules,
    /// Rules at the top of an endpoint-set chain (ClusterIP masquerade, kube-proxy's shape).
    set_prefix: BTreeMap<EndpointSetKind, Vec<Rule>>,
    /// Route and firewall chains by content, so frontends with equal routes share one.
    route_chains: Vec<(String, Vec<Rule>)>,
    chain_keys: Vec<(&'static str, String, String)>,
}

impl<'a> PortRenderer<'a> {
    fn new(plan: &'a ServicePortPlan, node_ports: &'a NodePortAddressing) -> Self {
        Self {
            plan,
            protocol: plan.protocol,
            name: service_port_name(&plan.name),
            node_ports,
            out: PortRules::default(),
            set_prefix: BTreeMap::new(),
            route_chains: Vec::new(),
            chain_keys: Vec::new(),
        }
    }

    fn set_chain(&self, set: EndpointSetKind) -> String {
        match set {
            EndpointSetKind::Cluster => service_chain(SERVICE_PREFIX, &self.plan.name),
            EndpointSetKind::Local => service_chain(LOCAL_PREFIX, &self.plan.name),
        }
    }

    /// The chain of `prefix` whose content is identified by `key`: the first one gets
    /// kube-proxy's name, further distinct ones numbered names.
    fn chain_for(&mut self, prefix: &'static str, key: String) -> (String, bool) {
        if let Some((_, _, name)) = self.chain_keys.iter().find(|(p, k, _)| *p == prefix && *k == key) {
            return (name.clone(), false);
        }
        let n = self.chain_keys.iter().filter(|(p, _, _)| *p == prefix).count();
        let name = if n == 0 {
            service_chain(prefix, &self.plan.name)
        } else {
            numbered_service_chain(prefix, &self.plan.name, n)
        };
        self.chain_keys.push((prefix, key, name.clone()));
        (name, true)
    }

    fn frontend_label(kind: FrontendKind) -> &'static str {
        match kind {
            FrontendKind::ClusterIp => "cluster IP",
            FrontendKind::NodePort => "node port",
            FrontendKind::ExternalIp => "external IP",
            FrontendKind::LoadBalancer => "loadbalancer IP",
        }
    }

    /// `-m comment --comment C -m P -p P [-d IP] --dport N` for an address frontend, or
    /// `-m comment --comment C -m P -p P --dport N` for a node port.
    fn frontend_rule(&self, comment: String, frontend: &Frontend) -> Rule {
        let mut rule = Rule::new().comment(comment).protocol(self.protocol);
        if let Destination::Address(address) = frontend.destination {
            rule = rule.destination(host(address));
        }
        rule.destination_port(frontend.port)
    }

    /// Where a frontend's destination is, for filter rules: `-d IP`, or per node-port CIDR
    /// `-m addrtype --dst-type LOCAL ! -d LOOPBACK` / `-d CIDR`.
    fn filter_destinations(&self, frontend: &Frontend) -> Vec<Vec<Arg>> {
        match frontend.destination {
            Destination::Address(address) => {
                vec![vec![Arg::Destination(svcplane_iptables::AddressMatch::is(host(address)))]]
            }
            Destination::NodePortAddresses => node_port_destinations(self.node_ports),
        }
    }

    /// A filter rule as kube-proxy writes them: `-m comment --comment C -m P -p P -d IP
    /// --dport N` for an address, `-m comment --comment C -m addrtype --dst-type LOCAL ...
    /// -m P -p P --dport N` for a node port; `extra` (a source range) after the port.
    fn filter_rule(
        &self,
        comment: &str,
        destination: &[Arg],
        frontend: &Frontend,
        extra: &[Arg],
        target: Target,
    ) -> Rule {
        let node_port = frontend.destination == Destination::NodePortAddresses;
        let mut rule = Rule::new().comment(comment);
        if node_port {
            rule.args.extend(destination.iter().cloned());
        }
        rule = rule.protocol(self.protocol);
        if !node_port {
            rule.args.extend(destination.iter().cloned());
        }
        rule = rule.destination_port(frontend.port);
        rule.args.extend(extra.iter().cloned());
        rule.target(target)
    }

    fn render(mut self) -> PortRules {
        let plan = self.plan;
        for frontend in &plan.frontends {
            self.render_frontend(frontend);
        }
        // Endpoint-set chains: the ClusterIP masquerade rules, affinity, then the cascade.
        let mut used: Vec<EndpointSetKind> =
            plan.frontends.iter().flat_map(|f| f.routes.iter().map(|r| r.endpoints)).collect();
        used.sort();
        used.dedup();
        let mut chains = Vec::new();
        let mut endpoints: Vec<SocketAddr> = Vec::new();
        for set in &used {
            let mut rules = self.set_prefix.remove(set).unwrap_or_default();
            rules.extend(self.cascade(*set));
            chains.push((self.set_chain(*set), rules));
            for endpoint in plan.endpoints(*set) {
                if !endpoints.contains(endpoint) {
                    endpoints.push(*endpoint);
                }
            }
        }
        chains.append(&mut self.route_chains);
        for endpoint in &endpoints {
            chains.push((endpoint_chain(&plan.name, endpoint), self.endpoint_rules(endpoint)));
        }
        self.out.chains = chains;
        self.out
    }

    fn render_frontend(&mut self, frontend: &Frontend) {
        let target = if frontend.routes.is_empty() {
            None
        } else if frontend.kind == FrontendKind::ClusterIp
            && let Some(set) = self.cluster_ip_short_form(frontend)
        {
            Some(set)
        } else {
            let prefix = if frontend.kind == FrontendKind::ClusterIp { INTERNAL_PREFIX } else { EXTERNAL_PREFIX };
            Some(self.route_chain(prefix, frontend))
        };
        let firewall = match (&target, frontend.allowed_sources.is_empty()) {
            (Some(target), false) => Some(self.firewall_chain(frontend, target)),
            _ => None,
        };
        if let Some(dispatch) = firewall.clone().or_else(|| target.clone()) {
            let (chain, comment) = match frontend.destination {
                Destination::Address(_) => {
                    (SharedChain::NatServices, format!("{} {}", self.name, Self::frontend_label(frontend.kind)))
                }
                Destination::NodePortAddresses => (SharedChain::NatNodePorts, self.name.clone()),
            };
            let rule = self.frontend_rule(comment, frontend).jump(dispatch);
            self.out.shared.entry(chain).or_default().push(rule);
        }
        if let Some(firewall) = &firewall {
            let comment = format!("{} traffic not accepted by {firewall}", self.name);
            for destination in self.filter_destinations(frontend) {
                let rule = self.filter_rule(&comment, &destination, frontend, &[], Target::Drop);
                self.out.shared.entry(SharedChain::FilterFirewall).or_default().push(rule);
            }
        }
        self.render_unrouted(frontend, target.is_some());
    }

    /// kube-proxy's ClusterIP shape: `KUBE-SERVICES` jumps straight to the endpoint-set
    /// chain, which starts with the masquerade rules (`-d CLUSTER-IP --dport N SOURCES -j
    /// KUBE-MARK-MASQ`). It fits when every route goes to one set, the last takes every
    /// source, and the masquerading routes come first (so marking whoever matches any of
    /// them marks exactly those whose first matching route masquerades).
    fn cluster_ip_short_form(&mut self, frontend: &Frontend) -> Option<String> {
        let routes = &frontend.routes;
        let set = routes.first()?.endpoints;
        let last = routes.last()?;
        let masquerading_first = routes.windows(2).all(|w| w[0].masquerade || !w[1].masquerade);
        if last.sources != SourceMatch::Any || !masquerading_first || routes.iter().any(|r| r.endpoints != set) {
            return None;
        }
        let mut masquerade = Vec::new();
        for route in routes.iter().filter(|r| r.masquerade) {
            let Sources::Alternatives(alternatives) = sources(&route.sources) else { return None };
            for alternative in alternatives {
                let mut rule = self.frontend_rule(format!("{} cluster IP", self.name), frontend);
                rule.args.extend(alternative);
                masquerade.push(rule.jump(KUBE_MARK_MASQ));
            }
        }
        let prefix = self.set_prefix.entry(set).or_default();
        for rule in masquerade {
            if !prefix.contains(&rule) {
                prefix.push(rule);
            }
        }
        Some(self.set_chain(set))
    }

    fn route_comments(&self, sources: &SourceMatch, what: &str) -> (String, Option<String>) {
        let name = &self.name;
        match sources {
            SourceMatch::Any => (format!("masquerade traffic for {name} {what}"), None),
            SourceMatch::ThisNode => (
                format!("masquerade LOCAL traffic for {name} {what}"),
                Some(format!("route LOCAL traffic for {name} {what}")),
            ),
            SourceMatch::Inside(_) => {
                (format!("masquerade pod traffic for {name} {what}"), Some(format!("pod traffic for {name} {what}")))
            }
            SourceMatch::Outside(_) => (
                format!("masquerade off-cluster traffic for {name} {what}"),
                Some(format!("off-cluster traffic for {name} {what}")),
            ),
        }
    }

    /// A chain of route rules, tried in order: each route marks for masquerade if it
    /// should, then jumps to its endpoint set (which always DNATs, so the first route whose
    /// sources match decides).
    fn route_chain(&mut self, prefix: &'static str, frontend: &Frontend) -> String {
        let (name, new) = self.chain_for(prefix, format!("{:?}", frontend.routes));
        if !new {
            return name;
        }
        let what = if prefix == INTERNAL_PREFIX { "cluster IP" } else { "external destinations" };
        let mut rules = Vec::new();
        for (index, route) in frontend.routes.iter().enumerate() {
            let set_chain = self.set_chain(route.endpoints);
            let (masquerade_comment, jump_comment) = self.route_comments(&route.sources, what);
            match sources(&route.sources) {
                Sources::Alternatives(alternatives) => {
                    for alternative in alternatives {
                        if route.masquerade {
                            let mut rule = Rule::new().comment(masquerade_comment.clone());
                            rule.args.extend(alternative.iter().cloned());
                            rules.push(rule.jump(KUBE_MARK_MASQ));
                        }
                        let mut rule = Rule::new();
                        if let Some(comment) = &jump_comment {
                            rule = rule.comment(comment.clone());
                        }
                        rule.args.extend(alternative);
                        rules.push(rule.jump(set_chain.clone()));
                    }
                }
                Sources::OutsideAll(cidrs) => {
                    let helper = self.outside_helper(&name, index, route, &cidrs, &set_chain);
                    let comment = jump_comment.unwrap_or(masquerade_comment);
                    rules.push(Rule::new().comment(comment).jump(helper));
                }
            }
        }
        self.route_chains.push((name.clone(), rules));
        name
    }

    /// `KUBE-SRC-…`: returns for sources inside any of `cidrs`, else does the route.
    fn outside_helper(&mut self, owner: &str, index: usize, route: &Route, cidrs: &[IpNet], set_chain: &str) -> String {
        let (name, _) = self.chain_for(SOURCE_PREFIX, format!("{owner}/{index}"));
        let mut rules: Vec<Rule> = cidrs.iter().map(|c| Rule::new().source(*c).target(Target::Return)).collect();
        if route.masquerade {
            rules.push(Rule::new().jump(KUBE_MARK_MASQ));
        }
        rules.push(Rule::new().jump(set_chain));
        self.route_chains.push((name.clone(), rules));
        name
    }

    /// `KUBE-FW-…`: allowed sources go on to the routes; the rest falls through, is not
    /// DNATed, and `KUBE-PROXY-FIREWALL` drops it.
    fn firewall_chain(&mut self, frontend: &Frontend, target: &str) -> String {
        let (name, new) = self.chain_for(FIREWALL_PREFIX, format!("{:?}->{target}", frontend.allowed_sources));
        if !new {
            return name;
        }
        let comment = format!("{} loadbalancer IP", self.name);
        let mut rules: Vec<Rule> = frontend
            .allowed_sources
            .iter()
            .map(|c| Rule::new().comment(comment.clone()).source(*c).jump(target))
            .collect();
        rules.push(
            Rule::new().comment(format!("other traffic to {} will be dropped by {KUBE_PROXY_FIREWALL}", self.name)),
        );
        self.route_chains.push((name.clone(), rules));
        name
    }

    /// filter rules for traffic no route takes: REJECT (no endpoint anywhere) or DROP.
    fn render_unrouted(&mut self, frontend: &Frontend, has_routes: bool) {
        let reject = match self.plan.refusal {
            Refusal::TcpReset => Target::Reject(Some(RejectWith::TcpReset)),
            Refusal::IcmpPortUnreachable => Target::Reject(None),
        };
        let (verdict, comment) = match frontend.unrouted {
            Unrouted::Unreachable => return,
            Unrouted::Reject => (reject, format!("{} has no endpoints", self.name)),
            Unrouted::Drop => (Target::Drop, format!("{} has no local endpoints", self.name)),
        };
        let chain = if frontend.kind == FrontendKind::ClusterIp {
            SharedChain::FilterServices
        } else {
            SharedChain::FilterExternalServices
        };
        let mut rules = Vec::new();
        for destination in self.filter_destinations(frontend) {
            // Without routes there is no KUBE-FW chain: the source ranges are applied here,
            // allowed sources get the verdict and everyone else is dropped.
            if !frontend.allowed_sources.is_empty() && !has_routes {
                for cidr in &frontend.allowed_sources {
                    let source = [Arg::Source(svcplane_iptables::AddressMatch::is(*cidr))];
                    rules.push(self.filter_rule(&comment, &destination, frontend, &source, verdict.clone()));
                }
                if verdict != Target::Drop {
                    let other = format!("other traffic to {} is not accepted", self.name);
                    rules.push(self.filter_rule(&other, &destination, frontend, &[], Target::Drop));
                }
            } else {
                rules.push(self.filter_rule(&comment, &destination, frontend, &[], verdict.clone()));
            }
        }
        self.out.shared.entry(chain).or_default().extend(rules);
    }

    /// Affinity rules, then the `statistic` cascade: rule `i` of `n` matches with
    /// probability 1/(n-i), the last always.
    fn cascade(&self, set: EndpointSetKind) -> Vec<Rule> {
        let endpoints = self.plan.endpoints(set);
        let mut rules = Vec::with_capacity(endpoints.len() * if self.plan.affinity.is_some() { 2 } else { 1 });
        let comment = |endpoint: &SocketAddr| format!("{} -> {endpoint}", self.name);
        if let Some(affinity) = self.plan.affinity {
            let seconds = u32::try_from(affinity.timeout.as_secs()).unwrap_or(u32::MAX);
            for endpoint in endpoints {
                let chain = endpoint_chain(&self.plan.name, endpoint);
                let recent = Recent {
                    name: chain.clone(),
                    action: RecentAction::Check { seconds: Some(seconds), reap: true },
                    mask: None,
                };
                rules.push(Rule::new().comment(comment(endpoint)).matching(Match::Recent(recent)).jump(chain));
            }
        }
        let count = endpoints.len();
        for (index, endpoint) in endpoints.iter().enumerate() {
            let mut rule = Rule::new().comment(comment(endpoint));
            if index + 1 < count {
                rule = rule.matching(Match::Statistic(Probability::one_in(count - index)));
            }
            rules.push(rule.jump(endpoint_chain(&self.plan.name, endpoint)));
        }
        rules
    }

    /// `KUBE-SEP-…`: hairpin traffic (the endpoint reaching itself) masqueraded when the
    /// plan says so; then the DNAT (recording the client for affinity).
    fn endpoint_rules(&self, endpoint: &SocketAddr) -> Vec<Rule> {
        let chain = endpoint_chain(&self.plan.name, endpoint);
        debug_assert!(chain.starts_with(ENDPOINT_PREFIX));
        let mut rules = Vec::with_capacity(2);
        if self.plan.masquerade_hairpin {
            rules.push(Rule::new().comment(self.name.clone()).source(host(endpoint.ip())).jump(KUBE_MARK_MASQ));
        }
        let mut dnat = Rule::new().comment(self.name.clone());
        if self.plan.affinity.is_some() {
            dnat = dnat.matching(Match::Recent(Recent { name: chain, action: RecentAction::Set, mask: None }));
        }
        rules.push(dnat.protocol(self.protocol).target(Target::Dnat(*endpoint)));
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_postrouting_rules_read_as_kube_proxys() {
        let text: Vec<String> =
            base_rules(Table::Nat).iter().map(|(chain, rule)| format!("-A {chain} {}", rule.restore_args())).collect();
        assert_eq!(
            text[1..],
            [
                "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
                "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
                "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
                "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            ]
        );
    }

    #[test]
    fn the_node_ports_jump_excludes_the_plans_exclusions_when_every_address_answers() {
        let addressing = |cidr: &str, excluded: &str| NodePortAddressing {
            cidrs: vec![cidr.parse().unwrap()],
            exclusions: vec![excluded.parse().unwrap()],
        };
        let rules = node_ports_jumps(&addressing("0.0.0.0/0", "127.0.0.0/8"));
        assert_eq!(
            rules[0].restore_args(),
            "-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS"
        );
        let rules = node_ports_jumps(&addressing("2001:db8::/64", "::1/128"));
        assert!(rules[0].restore_args().ends_with("-m addrtype --dst-type LOCAL -d 2001:db8::/64 -j KUBE-NODEPORTS"));
    }
}
