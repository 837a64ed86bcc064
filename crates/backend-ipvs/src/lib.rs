//! IPVS mode: spells a [`NodePlan`] as kube-proxy's IPVS proxier does, as IPVS virtual
//! services with masqueraded real servers (`svcplane-ipvs`, generic netlink) and the
//! Service addresses on the `kube-ipvs0` dummy interface.
//!
//! Every policy is the plan's: which endpoints a frontend sends to (cluster or local set,
//! as the plan's catch-all route says), where NodePorts answer, session affinity (IPVS
//! persistence with the Service's timeout). The mode adds only its own mechanism's choices:
//! the scheduler (`--ipvs-scheduler`, `rr` by default) and the connection timeouts. The
//! first sync (and one after a full resync) reads the kernel's IPVS table and sends the
//! difference; later syncs spell only the service ports the plan's diff names and diff
//! them against the record of what this process applied ([`applied`]), so one endpoint
//! change reads nothing from the kernel and sends the requests that change it.
//!
//! Beside IPVS, iptables rules in the nat table ([`rules`], upstream's chain and set names)
//! mark what the plan's routes say to masquerade and masquerade it after IPVS (with
//! `net.ipv4.vs.conntrack=1`); each route's sources are matched there, while IPVS sends
//! every source to the catch-all route's endpoint set. The rules match frontends through
//! ipsets ([`ipset`], synced as a difference), so they do not grow with the Services.
//!
//! In the filter table: rejection when a Service has no endpoints, drops the plan asks for,
//! `loadBalancerSourceRanges`. Endpoints that still serve but left a frontend's set drain at
//! weight 0. `--ipvs-exclude-cidrs` protects virtual services from removal; strict ARP sets
//! the node namespace's `arp_ignore` / `arp_announce`.
//!
//! A frontend whose routes send some sources to another endpoint set than the catch-all
//! route (`externalTrafficPolicy: Local`: pods and the node to every endpoint) also gets
//! firewall-mark virtual services with that set, the nat table marking those sources
//! ([`fwmark`]). A sync sends nothing through `ip`, `ipset` or `iptables` for what is as it
//! last wrote it (an endpoint change is IPVS requests and, for hairpin, one set update).
//!
//! Drift: [`Dataplane::detect_drift`] finds a virtual service deleted or edited behind its
//! back (one dump of the services every few seconds) and, in turn, a sample's real
//! servers; it does not look at `kube-ipvs0`'s addresses, the sets or the rules.

pub mod applied;
pub mod fwmark;
pub mod hairpin;
pub mod ipset;
pub mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use svcplane_core::{
    Dataplane, DataplaneError, Destination as PlanDestination, IpFamily, NodePlan, PlanDiff, ServicePortPlan,
    SourceMatch, SyncReport,
};
use svcplane_iptables::{Iptables, IptablesCli, RestoreTable, Table};
use svcplane_ipvs::{Destination, DummyInterface, Ipvs, IpvsError, Service, ServiceEntry, ServiceKey, Timeouts, diff};

/// How often the drift check asks the kernel by default: one dump of the virtual services
/// (not of their real servers) and [`DRIFT_SAMPLE`] small dumps.
pub const DEFAULT_DRIFT_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// How many virtual services' real servers one drift check compares, in turn.
pub const DRIFT_SAMPLE: usize = 8;

/// The interface holding every Service address, as upstream names it.
pub const INTERFACE: &str = "kube-ipvs0";

/// The schedulers `--ipvs-scheduler` accepts (the kernel's `ip_vs_*` scheduler modules).
pub const SCHEDULERS: &[&str] = &["rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"];

/// The mode's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsConfig {
    /// `--ipvs-scheduler`.
    pub scheduler: String,
    /// `--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`, `--ipvs-udp-timeout` (0: leave).
    pub timeouts: Timeouts,
    /// `--ipvs-exclude-cidrs`: virtual services whose address is in one of these are never
    /// removed, by a sync or by cleanup (a service the plan wants there is still written).
    pub exclude_cidrs: Vec<ipnet::IpNet>,
    /// `--ipvs-strict-arp`: `arp_ignore=1`, `arp_announce=2` in the node's namespace.
    pub strict_arp: bool,
}

impl Default for IpvsConfig {
    fn default() -> Self {
        IpvsConfig {
            scheduler: "rr".to_owned(),
            timeouts: Timeouts::default(),
            exclude_cidrs: Vec::new(),
            strict_arp: false,
        }
    }
}

impl IpvsConfig {
    /// Whether the virtual service `key` is protected by `--ipvs-exclude-cidrs` (a
    /// firewall-mark service has no address to be in one).
    fn excluded(&self, key: &ServiceKey) -> bool {
        key.fwmark == 0 && self.exclude_cidrs.iter().any(|cidr| cidr.contains(&key.address))
    }
}

/// Whether `key` is a virtual service of this mode: on one of `addresses` (kube-ipvs0's,
/// the node's), one of `programmed`, or a firewall-mark service of our marks.
fn is_ours(key: &ServiceKey, addresses: &BTreeSet<IpAddr>, programmed: &BTreeSet<ServiceKey>) -> bool {
    if key.fwmark != 0 {
        return fwmark::is_ours(key.fwmark, rules::MASQ_MARK) || programmed.contains(key);
    }
    addresses.contains(&key.address) || programmed.contains(key)
}

/// The sysctls strict ARP sets (in the namespace of the calling thread), as upstream: the
/// node answers ARP only for addresses of the interface asked on, and announces only its
/// best local address, so the Service addresses on `kube-ipvs0` stay off the wire.
pub const STRICT_ARP: &[(&str, &str)] =
    &[("/proc/sys/net/ipv4/conf/all/arp_ignore", "1"), ("/proc/sys/net/ipv4/conf/all/arp_announce", "2")];

/// The IPVS sysctls the mode sets in its namespace, as upstream's proxier does:
/// `conntrack` (IPVS connections are tracked, so MASQUERADE sees them),
/// `expire_nodest_conn` (a connection whose real server was removed is expired at its next
/// packet, so a UDP flow to an endpoint that went away is scheduled afresh instead of
/// black-holed) and `expire_quiescent_template` (a persistence template to a real server
/// at weight 0 is expired, so affinity does not hold clients on a draining endpoint).
pub const IPVS_SYSCTLS: &[(&str, &str)] = &[
    ("/proc/sys/net/ipv4/vs/conntrack", "1"),
    ("/proc/sys/net/ipv4/vs/expire_nodest_conn", "1"),
    ("/proc/sys/net/ipv4/vs/expire_quiescent_template", "1"),
];

/// What a plan is in IPVS terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spelling {
    pub services: Vec<ServiceEntry>,
    /// Addresses for `kube-ipvs0`: every ClusterIP, external IP and load-balancer IP.
    pub addresses: BTreeSet<IpAddr>,
}

/// Per family, the marks of the frontends that need one ([`fwmark::marks`]).
pub type Marks = BTreeMap<IpFamily, BTreeMap<fwmark::MarkedFrontend, fwmark::Mark>>;

/// The marks of `plan`'s frontends whose routes send some sources to another endpoint set
/// than the catch-all route, NodePorts on those of `node_addresses` the plan admits.
pub fn plan_marks(plan: &NodePlan, node_addresses: &[IpAddr]) -> Marks {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|family| (family, fwmark::marks(plan, family, &node_port_addresses(plan, family, node_addresses))))
        .collect()
}

/// The addresses `plan` puts on `kube-ipvs0`: every ClusterIP, external IP and
/// load-balancer IP (whether or not it has endpoints).
pub fn plan_addresses(plan: &NodePlan) -> BTreeSet<IpAddr> {
    plan.service_ports
        .values()
        .flat_map(|port| &port.frontends)
        .filter_map(|frontend| match frontend.destination {
            PlanDestination::Address(address) => Some(address),
            PlanDestination::NodePortAddresses => None,
        })
        .collect()
}

/// Spells `plan` with `scheduler` for every virtual service. NodePorts answer on those of
/// `node_addresses` (the node's local addresses, or `--node-ip`s) the plan admits. A
/// frontend whose routes send some sources to another endpoint set than the catch-all
/// route also gets firewall-mark services with that set ([`fwmark`]).
pub fn spell(plan: &NodePlan, scheduler: &str, node_addresses: &[IpAddr]) -> Spelling {
    let marks = plan_marks(plan, node_addresses);
    let mut services: BTreeMap<ServiceKey, ServiceEntry> = BTreeMap::new();
    for port in plan.service_ports.values() {
        // A key two service ports spell (which the plan does not make) is the later's.
        services.extend(spell_port(plan, port, scheduler, node_addresses, &marks));
    }
    Spelling { services: services.into_values().collect(), addresses: plan_addresses(plan) }
}

/// The virtual services of one service port of `plan` (see [`spell`]), with `marks` the
/// marks of the whole plan.
pub fn spell_port(
    plan: &NodePlan,
    port: &ServicePortPlan,
    scheduler: &str,
    node_addresses: &[IpAddr],
    marks: &Marks,
) -> BTreeMap<ServiceKey, ServiceEntry> {
    let mut services: BTreeMap<ServiceKey, ServiceEntry> = BTreeMap::new();
    let persistence_seconds = port
        .affinity
        .as_ref()
        .map_or(0, |affinity| u32::try_from(affinity.timeout.as_secs()).unwrap_or(u32::MAX).max(1));
    let entry = |key: ServiceKey, endpoints: &[std::net::SocketAddr]| {
        let service = Service { key, scheduler: scheduler.to_owned(), persistence_seconds };
        // Endpoints of the set take new connections (weight 1); endpoints that still
        // serve but left the set (terminating while others are ready, a pod that
        // turned not ready) stay at weight 0: IPVS schedules nothing new to them and
        // their established connections go on, until they stop serving.
        let draining = port.serving_endpoints.iter().filter(|endpoint| !endpoints.contains(endpoint));
        let destinations = endpoints
            .iter()
            .map(|endpoint| (endpoint, 1))
            .chain(draining.map(|endpoint| (endpoint, 0)))
            .map(|(endpoint, weight)| {
                let destination = Destination { address: endpoint.ip(), port: endpoint.port(), weight };
                ((endpoint.ip(), endpoint.port()), destination)
            })
            .collect();
        ServiceEntry { service, destinations }
    };
    for frontend in &port.frontends {
        let frontend_addresses = match frontend.destination {
            PlanDestination::Address(address) => vec![address],
            PlanDestination::NodePortAddresses => node_port_addresses(plan, port.family, node_addresses),
        };
        for address in &frontend_addresses {
            let marked = fwmark::MarkedFrontend { address: *address, protocol: port.protocol, port: frontend.port };
            if let Some(mark) = marks.get(&port.family).and_then(|marks| marks.get(&marked)) {
                // With and without the masquerade bit: IPVS compares the whole mark.
                for value in [mark.mark, mark.mark | rules::MASQ_MARK] {
                    let key = ServiceKey::for_fwmark(*address, value);
                    services.insert(key, entry(key, port.endpoints(mark.endpoints)));
                }
            }
        }
        let endpoints = catch_all_endpoints(port, &frontend.routes);
        if endpoints.is_empty() {
            // Nothing to balance to: no virtual service (IPVS would refuse on its own,
            // before the filter table), the filter table refuses or drops as the plan
            // says.
            continue;
        }
        for address in frontend_addresses {
            let key = ServiceKey::new(address, port.protocol, frontend.port);
            services.insert(key, entry(key, endpoints));
        }
    }
    services
}

/// The endpoints of the route that takes any source (the last route otherwise): the
/// set the plan gives traffic from anywhere.
fn catch_all_endpoints<'a>(port: &'a ServicePortPlan, routes: &[svcplane_core::Route]) -> &'a [std::net::SocketAddr] {
    let route = routes.iter().find(|route| route.sources == SourceMatch::Any).or_else(|| routes.last());
    route.map_or(&[], |route| port.endpoints(route.endpoints))
}

/// Those of `node_addresses` of `family` where NodePorts answer, as the plan says.
fn node_port_addresses(plan: &NodePlan, family: IpFamily, node_addresses: &[IpAddr]) -> Vec<IpAddr> {
    let cidrs = plan.node_port_cidrs.get(&family).map(Vec::as_slice).unwrap_or_default();
    let excluded = plan.node_port_exclusions.get(&family).map(Vec::as_slice).unwrap_or_default();
    node_addresses
        .iter()
        .copied()
        .filter(|address| IpFamily::of(address) == family)
        .filter(|address| cidrs.iter().any(|cidr| cidr.contains(address)))
        .filter(|address| !excluded.iter().any(|cidr| cidr.contains(address)))
        .collect()
}

/// IPVS mode over the kernel of the calling thread's network namespace.
#[derive(Debug)]
pub struct IpvsBackend {
    config: IpvsConfig,
    /// Writes the nat rules beside IPVS; `None` only renders.
    iptables: Option<IptablesCli>,
    ipset: ipset::IpsetCli,
    conntrack_enabled: bool,
    strict_arp_set: bool,
    ipvs: Option<Ipvs>,
    interface: DummyInterface,
    /// The virtual services this process last applied, per service port: a sync diffs the
    /// ports that changed against it and reads the kernel's table only when there is none
    /// (first sync, [`Dataplane::request_full_resync`], a failed IPVS update).
    applied: Option<applied::Applied>,
    /// Every key this process programmed (kept across a full resync): a sync deletes those
    /// no longer wanted.
    programmed: BTreeSet<ServiceKey>,
    drift_check_interval: Duration,
    last_drift_check: Option<Instant>,
    /// The last virtual service whose real servers a drift check compared.
    drift_cursor: Option<ServiceKey>,
    timeouts_set: bool,
    /// What the last successful sync wrote (cleared by a failure and by
    /// [`Dataplane::request_full_resync`]): a sync that wants the same sends nothing for
    /// it, so an endpoint change costs no `ip`, `ipset` or `iptables` process.
    written: Written,
    /// How long each phase of the last sync took ([`IpvsBackend::last_sync_phases`]).
    phases: Vec<(&'static str, Duration)>,
}

/// The parts of a sync that are written through other programs, as last written.
#[derive(Debug, Default)]
struct Written {
    addresses: Option<BTreeSet<IpAddr>>,
    sets: Option<BTreeMap<String, ipset::IpSet>>,
    /// Per family, the nat and filter tables as rendered for `iptables-restore`.
    rules: Option<Vec<String>>,
    /// The node addresses the sets and rules were written for (NodePorts answer there).
    node_addresses: Option<Vec<IpAddr>>,
    /// The hairpin members of the plan the sets were written for, counted: an endpoint
    /// change moves them without spelling the rest.
    hairpins: Option<hairpin::HairpinCounts>,
}

impl Written {
    /// Forgets everything but `kube-ipvs0`'s addresses: the next sync reads the kernel's
    /// sets again and spells every set and rule.
    fn forget_sets_and_rules(&mut self) {
        *self = Written { addresses: self.addresses.take(), ..Written::default() };
    }
}

impl IpvsBackend {
    /// IPVS mode writing its nat rules with `iptables`.
    pub fn new(config: IpvsConfig, iptables: IptablesCli) -> Self {
        IpvsBackend { iptables: Some(iptables), ..Self::for_render(config) }
    }

    /// IPVS mode that can only render (no iptables programs needed).
    pub fn for_render(config: IpvsConfig) -> Self {
        IpvsBackend {
            config,
            iptables: None,
            ipset: ipset::IpsetCli::default(),
            conntrack_enabled: false,
            strict_arp_set: false,
            ipvs: None,
            interface: DummyInterface::new(INTERFACE),
            applied: None,
            programmed: BTreeSet::new(),
            drift_check_interval: DEFAULT_DRIFT_CHECK_INTERVAL,
            last_drift_check: None,
            drift_cursor: None,
            timeouts_set: false,
            written: Written::default(),
            phases: Vec::new(),
        }
    }

    /// How long each phase of the last sync took, in the order they ran (a phase with
    /// nothing to do is still listed, with its short time).
    pub fn last_sync_phases(&self) -> &[(&'static str, Duration)] {
        &self.phases
    }

    fn phase(&mut self, name: &'static str, started: Instant) -> Instant {
        let now = Instant::now();
        self.phases.push((name, now - started));
        now
    }

    /// How often [`Dataplane::detect_drift`] actually asks the kernel.
    pub fn with_drift_check_interval(mut self, interval: Duration) -> Self {
        self.drift_check_interval = interval;
        self
    }

    /// One drift check (see [`Dataplane::detect_drift`]): every virtual service written is
    /// listed with its scheduler and persistence, and the real servers of
    /// [`DRIFT_SAMPLE`] of them, taken in turn, are as written.
    fn check_drift(&mut self) -> Result<Option<String>, IpvsError> {
        let Some(applied) = self.applied.take() else {
            return Ok(None);
        };
        let result = self.check_drift_of(&applied);
        self.applied = Some(applied);
        result
    }

    fn check_drift_of(&mut self, applied: &applied::Applied) -> Result<Option<String>, IpvsError> {
        let ipvs = self.ipvs()?;
        if let Some(found) = applied.missing_from(&ipvs.services()?) {
            return Ok(Some(found));
        }
        let sample = applied.sample(self.drift_cursor, DRIFT_SAMPLE);
        for key in &sample {
            let destinations: Vec<Destination> =
                self.ipvs()?.destinations(key)?.into_iter().map(|state| state.destination).collect();
            if let Some(found) = applied.destinations_differ(key, &destinations) {
                return Ok(Some(found));
            }
        }
        self.drift_cursor = sample.last().copied();
        Ok(None)
    }

    /// The virtual services of the kernel's table that are ours: on `kube-ipvs0`'s
    /// addresses (as last written, else as the kernel has them), the plan's `addresses`,
    /// the node's own (NodePorts: the services upstream would own too), what this process
    /// programmed, and our firewall marks. Those in `--ipvs-exclude-cidrs` only when
    /// `wanted` has them. One dump of the services and one per service of its real servers.
    fn ours_in_kernel(
        &mut self,
        wanted: &applied::Applied,
        addresses: &BTreeSet<IpAddr>,
        node_addresses: &[IpAddr],
    ) -> Result<Vec<ServiceEntry>, DataplaneError> {
        let mut ours: BTreeSet<IpAddr> = match &self.written.addresses {
            Some(addresses) => addresses.clone(),
            None => self.interface.addresses()?,
        };
        ours.extend(addresses.iter().copied());
        ours.extend(node_addresses.iter().copied());
        let programmed = self.programmed.clone();
        let config = self.config.clone();
        Ok(self
            .ipvs()?
            .table()?
            .into_iter()
            .filter(|entry| is_ours(&entry.service.key, &ours, &programmed))
            // An excluded address's services are left alone unless the plan wants them.
            .filter(|entry| !config.excluded(&entry.service.key) || wanted.services().contains_key(&entry.service.key))
            .collect())
    }

    fn ipvs(&mut self) -> Result<&mut Ipvs, IpvsError> {
        if self.ipvs.is_none() {
            self.ipvs = Some(Ipvs::new()?);
        }
        Ok(self.ipvs.as_mut().expect("opened above"))
    }

    /// Writes the sets and the rules of both families and hooks the rules in where
    /// missing: sets first (the rules name them), sets no longer wanted last.
    fn sync_rules(
        &mut self,
        plan: &NodePlan,
        diff: &PlanDiff,
        node_addresses: &[IpAddr],
    ) -> Result<usize, DataplaneError> {
        let Some(mut iptables) = self.iptables.take() else {
            return Ok(0);
        };
        let started = Instant::now();
        if let Some(operations) = self.move_hairpins(plan, diff, node_addresses) {
            self.iptables = Some(iptables);
            self.phase("hairpin set members (netlink)", started);
            return operations;
        }
        let result = self.write_rules(&mut iptables, plan, node_addresses);
        if result.is_ok() {
            self.written.node_addresses = Some(node_addresses.to_vec());
            self.written.hairpins = Some(hairpin::HairpinCounts::of_plan(plan));
        }
        self.iptables = Some(iptables);
        result
    }

    /// An endpoint change: when the sets and rules were written for the plan before `diff`
    /// and nothing but hairpin members changed, moves those members (over netlink) and
    /// nothing else; `None` when the whole plan has to be spelled.
    fn move_hairpins(
        &mut self,
        plan: &NodePlan,
        diff: &PlanDiff,
        node_addresses: &[IpAddr],
    ) -> Option<Result<usize, DataplaneError>> {
        if diff.is_empty()
            || self.written.rules.is_none()
            || self.written.node_addresses.as_deref() != Some(node_addresses)
        {
            return None;
        }
        let sets = self.written.sets.as_mut()?;
        let moves = self.written.hairpins.as_mut()?.step(plan, diff)?;
        if moves.is_empty() {
            return Some(Ok(0));
        }
        let mut changes = ipset::Changes::default();
        for (name, member, operation) in moves {
            // The hairpin sets are always written, and their members spelled as they are
            // read: were either not so, the record is forgotten and the next sync spells all.
            let Some((set, entry)) =
                sets.get_mut(&name).and_then(|set| ipset::entry(set.set_type, &member).map(|entry| (set, entry)))
            else {
                self.written.forget_sets_and_rules();
                return None;
            };
            match operation {
                svcplane_ipvs::ipset::Operation::Add => set.members.insert(member.clone()),
                svcplane_ipvs::ipset::Operation::Delete => set.members.remove(&member),
            };
            let verb = if operation == svcplane_ipvs::ipset::Operation::Add { "add" } else { "del" };
            changes.script.push(format!("{verb} {name} {member}"));
            changes.members.push(svcplane_ipvs::ipset::MemberChange { set: name, operation, entry });
        }
        changes.operations = changes.members.len();
        let operations = changes.operations;
        // No rollback script: a failure forgets what was written, so the next sync reads
        // the kernel's sets (`ipset save`) and writes the difference.
        Some(self.ipset.apply(&changes).map(|()| operations).map_err(|error| {
            self.written.forget_sets_and_rules();
            DataplaneError::from(error)
        }))
    }

    fn write_rules(
        &mut self,
        iptables: &mut IptablesCli,
        plan: &NodePlan,
        node_addresses: &[IpAddr],
    ) -> Result<usize, DataplaneError> {
        let mut started = Instant::now();
        if !self.conntrack_enabled {
            for (path, value) in IPVS_SYSCTLS {
                std::fs::write(path, value).map_err(|error| format!("writing {value} to {path}: {error}"))?;
            }
            self.conntrack_enabled = true;
        }
        let families: Vec<(IpFamily, rules::FamilyRules)> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|family| {
                (family, rules::family_rules(plan, family, &node_port_addresses(plan, family, node_addresses)))
            })
            .collect();
        let wanted: BTreeMap<String, ipset::IpSet> =
            families.iter().flat_map(|(_, rules)| rules.sets.clone()).collect();
        let rendered: Vec<String> =
            families.iter().map(|(_, rules)| format!("{}{}", rules.nat.render(), rules.filter.render())).collect();
        started = self.phase("sets and rules rendered", started);
        let sets_unchanged = self.written.sets.as_ref() == Some(&wanted);
        let rules_unchanged = self.written.rules.as_ref() == Some(&rendered);
        if sets_unchanged && rules_unchanged {
            return Ok(0);
        }
        // Written anew below: forgotten until it has been.
        let written_sets = self.written.sets.take();
        self.written.rules = None;
        let set_changes = if sets_unchanged {
            self.written.sets = written_sets;
            ipset::Changes::default()
        } else {
            // What this process wrote last, else what the kernel has.
            let current = match &written_sets {
                Some(sets) => sets.iter().map(|(name, set)| (name.clone(), set.as_saved())).collect(),
                None => self.ipset.save()?,
            };
            let set_changes = ipset::changes(&current, &wanted, rules::is_our_set);
            self.ipset.apply(&set_changes)?;
            set_changes
        };
        started = self.phase("ipsets (ipset save and restore, or netlink)", started);
        let mut operations = set_changes.operations;
        if rules_unchanged {
            self.written.rules = Some(rendered);
            self.written.sets = Some(wanted);
            return Ok(operations);
        }
        for (family, family_rules) in families {
            let fam = rules::family_of(family);
            // One listing of every table of the family (a program start each, slow under
            // emulation): the hooks there and the filter chains of earlier versions.
            let saved = iptables.save_all(fam)?;
            let nat_saved = saved_table(&saved, Table::Nat);
            let filter_saved = saved_table(&saved, Table::Filter);
            let mut table = family_rules.nat;
            for (builtin, chain) in rules::HOOKS {
                if !is_hooked(&nat_saved, builtin, chain) {
                    table.insert(*builtin, 1, rules::hook_rule(chain));
                }
            }
            operations += table.commands.len();
            iptables.restore(fam, &table)?;

            let mut filter = family_rules.filter;
            for (builtin, chain) in rules::FILTER_HOOKS {
                if !is_hooked(&filter_saved, builtin, chain) {
                    filter.insert(*builtin, 1, rules::hook_rule(chain));
                }
            }
            // Chains of earlier versions (per-frontend source ranges): flushed, then deleted.
            let existing = table_chains(&filter_saved);
            let wanted: BTreeSet<String> = filter.chain_lines().into_iter().map(str::to_owned).collect();
            let stale: Vec<String> =
                existing.into_iter().filter(|chain| rules::is_filter_chain(chain) && !wanted.contains(chain)).collect();
            for chain in &stale {
                filter.declare(chain.clone());
            }
            for chain in &stale {
                filter.delete_chain(chain.clone());
            }
            operations += filter.commands.len();
            iptables.restore(fam, &filter)?;
        }
        started = self.phase("iptables rules (listed, restored)", started);
        // No rule names them any more.
        self.ipset.destroy(&set_changes.stale)?;
        self.phase("stale ipsets destroyed", started);
        self.written.rules = Some(rendered);
        self.written.sets = Some(wanted);
        Ok(operations + set_changes.stale.len())
    }

    /// Removes the hooks and chains [`Self::sync_rules`] writes.
    fn cleanup_rules(&mut self) -> Result<bool, DataplaneError> {
        let Some(iptables) = self.iptables.as_mut() else {
            return Ok(false);
        };
        let mut removed = false;
        for family in [IpFamily::V4, IpFamily::V6] {
            let fam = rules::family_of(family);
            let mut filter = RestoreTable::new(Table::Filter);
            for (builtin, chain) in rules::FILTER_HOOKS {
                let listing = iptables.list_chain(fam, Table::Filter, builtin)?.unwrap_or_default();
                let hook = format!("-A {builtin} -j {chain}");
                for _ in listing.lines().filter(|line| line.trim() == hook) {
                    filter.delete(*builtin, rules::hook_rule(chain));
                }
            }
            let chains: Vec<String> =
                saved_chains(iptables, fam, Table::Filter)?.into_iter().filter(|c| rules::is_filter_chain(c)).collect();
            for chain in &chains {
                filter.declare(chain.clone());
            }
            for chain in &chains {
                filter.delete_chain(chain.clone());
            }
            if !filter.is_empty() {
                removed = true;
                iptables.restore(fam, &filter)?;
            }
            let mut table = RestoreTable::new(Table::Nat);
            for (builtin, chain) in rules::HOOKS {
                let listing = iptables.list_chain(fam, Table::Nat, builtin)?.unwrap_or_default();
                let hook = format!("-A {builtin} -j {chain}");
                for _ in listing.lines().filter(|line| line.trim() == hook) {
                    table.delete(*builtin, rules::hook_rule(chain));
                }
            }
            let mut chains = Vec::new();
            let ours = [rules::SERVICES, rules::MARK_MASQ, rules::POSTROUTING];
            let saved = iptables.save(fam, Table::Nat)?;
            for chain in ours {
                // A chain other rules still jump to (an operator's rule to KUBE-MARK-MASQ)
                // stays, as iptables mode leaves it.
                let referenced = saved.lines().any(|line| {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    let jumps = words.windows(2).any(|pair| pair[0] == "-j" && pair[1] == chain);
                    let from = words.get(1).copied().unwrap_or_default();
                    let hook = rules::HOOKS.iter().any(|(builtin, to)| *builtin == from && *to == chain);
                    words.first() == Some(&"-A") && jumps && !ours.contains(&from) && !hook
                });
                if iptables.list_chain(fam, Table::Nat, chain)?.is_some() && !referenced {
                    chains.push(chain);
                }
            }
            for chain in &chains {
                table.declare(*chain);
            }
            for chain in &chains {
                table.delete_chain(*chain);
            }
            if !table.is_empty() {
                removed = true;
                iptables.restore(fam, &table)?;
            }
        }
        // The rules naming them are gone: the sets go too. Where no set can be listed (no
        // ipset program, no ip_set in the kernel), this mode cannot have made any.
        let Ok(sets) = self.ipset.save() else {
            return Ok(removed);
        };
        for name in sets.into_keys().filter(|name| rules::is_our_set(name)) {
            // A set still named by rules of the other iptables variant stays for that
            // variant's cleanup (`svcplane cleanup` runs both).
            if self.ipset.destroy(std::slice::from_ref(&name)).is_ok() {
                removed = true;
            }
        }
        Ok(removed)
    }
}

/// The user-defined chains of one table, from `iptables-save`.
fn saved_chains(
    iptables: &IptablesCli,
    family: svcplane_iptables::Family,
    table: Table,
) -> Result<Vec<String>, DataplaneError> {
    Ok(table_chains(&iptables.save(family, table)?))
}

/// The chains declared in an `iptables-save` listing of one table.
fn table_chains(saved: &str) -> Vec<String> {
    saved
        .lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The lines of `table` in an `iptables-save` listing of every table (empty when the
/// family has no such table yet).
fn saved_table(saved: &str, table: Table) -> String {
    let header = format!("*{}", table.name());
    let mut lines = saved.lines().skip_while(|line| line.trim() != header).skip(1);
    lines.by_ref().take_while(|line| line.trim() != "COMMIT").fold(String::new(), |mut out, line| {
        out.push_str(line);
        out.push('\n');
        out
    })
}

/// Whether built-in chain `builtin` of a saved table jumps to `chain` with a plain rule.
fn is_hooked(saved: &str, builtin: &str, chain: &str) -> bool {
    let hook = format!("-A {builtin} -j {chain}");
    saved.lines().any(|line| line.trim() == hook)
}

impl Dataplane for IpvsBackend {
    fn mode(&self) -> &'static str {
        "ipvs"
    }

    fn sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<SyncReport, DataplaneError> {
        self.phases.clear();
        let mut started = Instant::now();
        // NodePorts answer on the node's addresses as the kernel has them now, as upstream
        // (every address but kube-ipvs0's), filtered by the plan.
        let mut node_addresses = svcplane_ipvs::local_addresses(INTERFACE)?;
        node_addresses.extend(plan.config.node_ips.iter().copied());
        let node_addresses: Vec<IpAddr> = node_addresses.into_iter().collect();
        if self.config.strict_arp && !self.strict_arp_set {
            for (path, value) in STRICT_ARP {
                std::fs::write(path, value)
                    .map_err(|error| format!("strict ARP: writing {value} to {path}: {error}"))?;
            }
            self.strict_arp_set = true;
        }
        let timeouts = self.config.timeouts;
        if !self.timeouts_set && timeouts != Timeouts::default() {
            self.ipvs()?.set_timeouts(timeouts)?;
            self.timeouts_set = true;
        }
        started = self.phase("node addresses (getifaddrs)", started);
        let addresses = plan_addresses(plan);
        let step = match &self.applied {
            // What changed, against what this process applied: no read of the kernel.
            Some(applied) => applied.step(plan, diff, &self.config.scheduler, &node_addresses),
            None => {
                let wanted = applied::Applied::of_plan(plan, &self.config.scheduler, &node_addresses);
                let current = self.ours_in_kernel(&wanted, &addresses, &node_addresses)?;
                applied::Applied::from_kernel(&current, wanted, plan.service_ports.len())
            }
        };
        started = self.phase("virtual services spelled and diffed", started);
        // Addresses first, so a new ClusterIP is local before its service exists; the
        // masquerade rules before the services that need them.
        let address_operations = if self.written.addresses.as_ref() == Some(&addresses) {
            0
        } else {
            let written = self.written.addresses.take();
            let operations = match written {
                Some(current) => self.interface.change(&current, &addresses)?,
                None => self.interface.sync(&addresses)?,
            };
            self.written.addresses = Some(addresses);
            operations
        };
        self.phase("kube-ipvs0 addresses", started);
        let rule_operations = self.sync_rules(plan, diff, &node_addresses)?;
        let started = Instant::now();
        let changes = step.changes.len();
        let (full, service_ports) = (step.full, step.service_ports);
        if let Err(error) = self.ipvs()?.apply(&step.changes) {
            // Part of it may be in: the next sync reads the table again.
            self.applied = None;
            return Err(error.into());
        }
        self.phase("IPVS requests", started);
        if !full {
            for change in &step.changes {
                match change {
                    svcplane_ipvs::Change::AddService(service) => {
                        self.programmed.insert(service.key);
                    }
                    svcplane_ipvs::Change::DeleteService(key) => {
                        self.programmed.remove(key);
                    }
                    _ => {}
                }
            }
        }
        let applied = match self.applied.take() {
            Some(mut applied) => {
                applied.commit(step);
                applied
            }
            None => applied::Applied::after(step),
        };
        if full {
            self.programmed = applied.services().keys().copied().collect();
        }
        self.applied = Some(applied);
        Ok(SyncReport {
            full,
            service_ports,
            operations: changes + address_operations + rule_operations,
            rules_replaced: false,
        })
    }

    fn request_full_resync(&mut self) {
        self.written = Written::default();
        self.applied = None;
    }

    /// At most every [`DEFAULT_DRIFT_CHECK_INTERVAL`] (or the interval set), once a sync
    /// has written something: a virtual service svcplane wrote that the kernel no longer
    /// lists or lists with another scheduler or persistence (one dump of the services, not
    /// of their real servers), and the real servers of [`DRIFT_SAMPLE`] services taken in
    /// turn (so a real server deleted or reweighted behind its back is found within
    /// services / sample checks). Not checked: `kube-ipvs0`'s addresses, the sets and the
    /// iptables rules (each would cost a process start under this check's rate). An error
    /// asking is no drift (the next sync reports it).
    fn detect_drift(&mut self) -> Option<String> {
        if self.applied.is_none() || self.last_drift_check.is_some_and(|at| at.elapsed() < self.drift_check_interval) {
            return None;
        }
        self.last_drift_check = Some(Instant::now());
        self.check_drift().ok().flatten()
    }

    fn render(&self, plan: &NodePlan) -> Result<String, DataplaneError> {
        // Touching nothing: NodePorts shown on the `--node-ip`s.
        let spelling = spell(plan, &self.config.scheduler, &plan.config.node_ips);
        let mut text = String::new();
        for address in &spelling.addresses {
            let _ = writeln!(text, "{INTERFACE} {address}");
        }
        for entry in &spelling.services {
            let service = &entry.service;
            let persistent = if service.persistence_seconds > 0 {
                format!(" persistent {}", service.persistence_seconds)
            } else {
                String::new()
            };
            let _ = writeln!(text, "{} {}{persistent}", service.key, service.scheduler);
            for destination in entry.destinations.values() {
                let _ = writeln!(
                    text,
                    "  -> {} Masq {}",
                    std::net::SocketAddr::new(destination.address, destination.port),
                    destination.weight
                );
            }
        }
        Ok(text)
    }

    fn cleanup(&mut self) -> Result<bool, DataplaneError> {
        // Ours, as a sync counts them: the services on kube-ipvs0's addresses, on the
        // node's own addresses (NodePorts; a cleanup process never synced, so it knows
        // them only this way), what this process programmed, and our firewall marks.
        let mut addresses = self.interface.addresses()?;
        addresses.extend(svcplane_ipvs::local_addresses(INTERFACE)?);
        let programmed = self.programmed.clone();
        let config = self.config.clone();
        let mut removed = false;
        match self.ipvs() {
            Ok(ipvs) => {
                let ours: Vec<ServiceEntry> = ipvs
                    .table()?
                    .into_iter()
                    .filter(|entry| is_ours(&entry.service.key, &addresses, &programmed))
                    .filter(|entry| !config.excluded(&entry.service.key))
                    .collect();
                removed |= !ours.is_empty();
                ipvs.apply(&diff(&ours, &[]))?;
            }
            // No IPVS in this kernel: nothing of ours can be there.
            Err(IpvsError::NoFamily { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        removed |= self.interface.delete()?;
        removed |= self.cleanup_rules()?;
        self.programmed.clear();
        self.applied = None;
        self.written = Written::default();
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use svcplane_core::{
        Change, ClientIpAffinity, ClusterState, Endpoint, EndpointPort, EndpointSlice, NamespacedName, NodeConfig,
        NodePortAddresses, Protocol, Service as KubeService, ServicePort, ServiceType,
    };

    use super::*;

    fn plan(service_type: ServiceType, affinity: bool) -> NodePlan {
        let mut service = KubeService::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Sctp, port: 80, node_port: Some(30080) }],
        );
        service.service_type = service_type;
        if affinity {
            service.session_affinity = Some(ClientIpAffinity { timeout: Duration::from_secs(600) });
        }
        let slice = EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", "web-abc"),
            service: NamespacedName::new("default", "web"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Sctp, port: 8080 }],
            endpoints: vec![
                Endpoint::ready("198.18.128.2".parse().unwrap(), Some("node1")),
                Endpoint::ready("198.18.129.2".parse().unwrap(), Some("node2")),
            ],
        };
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(slice));
        NodePlan::build(
            &state,
            NodeConfig {
                node_name: "node1".into(),
                node_ips: vec!["198.18.0.11".parse().unwrap()],
                cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
                node_port_addresses: NodePortAddresses::AllLocal,
            },
        )
    }

    #[test]
    fn one_listing_of_every_table_tells_the_hooks_of_each_table_and_its_chains() {
        let saved = "# Generated by iptables-save v1.8.9 (nf_tables)\n*filter\n:INPUT ACCEPT [0:0]\n\
                     :OUTPUT ACCEPT [0:0]\n:KUBE-FIREWALL-OLD - [0:0]\n-A INPUT -j KUBE-IPVS-FILTER\nCOMMIT\n\
                     # Completed\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                     -A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -m comment --comment x -j KUBE-SERVICES\nCOMMIT\n";
        let nat = saved_table(saved, Table::Nat);
        let filter = saved_table(saved, Table::Filter);
        assert!(is_hooked(&nat, "PREROUTING", "KUBE-SERVICES"));
        assert!(!is_hooked(&nat, "OUTPUT", "KUBE-SERVICES"), "a rule with more than the jump is not the hook");
        assert!(!is_hooked(&nat, "INPUT", "KUBE-IPVS-FILTER"), "the filter table's hook is not the nat table's");
        assert!(is_hooked(&filter, "INPUT", "KUBE-IPVS-FILTER"));
        assert_eq!(table_chains(&filter), vec!["INPUT", "OUTPUT", "KUBE-FIREWALL-OLD"]);
        assert_eq!(saved_table(saved, Table::Mangle), "", "a table the family does not have yet is empty");
    }

    #[test]
    fn a_cluster_ip_is_one_virtual_service_on_kube_ipvs0_with_every_endpoint() {
        let spelling = spell(&plan(ServiceType::ClusterIp, false), "rr", &[]);
        assert_eq!(spelling.addresses, BTreeSet::from(["198.19.0.10".parse().unwrap()]));
        assert_eq!(spelling.services.len(), 1);
        let entry = &spelling.services[0];
        assert_eq!(entry.service.key.to_string(), "sctp 198.19.0.10:80");
        assert_eq!(entry.service.scheduler, "rr");
        assert_eq!(entry.service.persistence_seconds, 0);
        let reals: Vec<String> =
            entry.destinations.values().map(|d| format!("{}:{} {}", d.address, d.port, d.weight)).collect();
        assert_eq!(reals, vec!["198.18.128.2:8080 1", "198.18.129.2:8080 1"]);
    }

    #[test]
    fn a_terminating_endpoint_that_still_serves_drains_at_weight_zero_while_others_are_ready() {
        let mut service = KubeService::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        );
        service.service_type = ServiceType::ClusterIp;
        let mut leaving = Endpoint::ready("198.18.129.2".parse().unwrap(), Some("node2"));
        leaving.ready = false;
        leaving.terminating = true;
        let mut gone = Endpoint::ready("198.18.129.3".parse().unwrap(), Some("node2"));
        gone.ready = false;
        gone.serving = false;
        gone.terminating = true;
        let slice = EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", "web-abc"),
            service: NamespacedName::new("default", "web"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: vec![Endpoint::ready("198.18.128.2".parse().unwrap(), Some("node1")), leaving, gone],
        };
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(slice));
        let plan = NodePlan::build(
            &state,
            NodeConfig {
                node_name: "node1".into(),
                node_ips: vec!["198.18.0.11".parse().unwrap()],
                cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
                node_port_addresses: NodePortAddresses::AllLocal,
            },
        );
        let spelling = spell(&plan, "rr", &[]);
        let reals: Vec<String> = spelling.services[0]
            .destinations
            .values()
            .map(|d| format!("{}:{} {}", d.address, d.port, d.weight))
            .collect();
        assert_eq!(reals, vec!["198.18.128.2:8080 1", "198.18.129.2:8080 0"], "the one no longer serving is removed");
    }

    #[test]
    fn a_node_port_is_a_virtual_service_on_each_node_address_not_on_kube_ipvs0() {
        let spelling = spell(&plan(ServiceType::NodePort, false), "lc", &["198.18.0.11".parse().unwrap()]);
        let keys: Vec<String> =
            spelling.services.iter().map(|e| format!("{} {}", e.service.key, e.service.scheduler)).collect();
        assert_eq!(keys, vec!["sctp 198.18.0.11:30080 lc", "sctp 198.19.0.10:80 lc"]);
        assert!(!spelling.addresses.contains(&"198.18.0.11".parse().unwrap()));
    }

    #[test]
    fn an_external_traffic_policy_local_address_keeps_the_local_endpoints_and_its_marks_get_every_endpoint() {
        let mut service = KubeService::cluster_ip(
            NamespacedName::new("default", "web"),
            vec!["198.19.0.10".parse().unwrap()],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(30080) }],
        );
        service.service_type = ServiceType::LoadBalancer;
        service.external_traffic_policy = svcplane_core::TrafficPolicy::Local;
        service.load_balancer_ingress =
            vec![svcplane_core::LoadBalancerIngress { ip: "198.18.100.1".parse().unwrap(), is_proxy_mode: false }];
        let mut state = ClusterState::new();
        state.apply(Change::ServiceUpserted(service));
        state.apply(Change::SliceUpserted(EndpointSlice {
            last_change_trigger: None,
            name: NamespacedName::new("default", "web-abc"),
            service: NamespacedName::new("default", "web"),
            family: IpFamily::V4,
            ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
            endpoints: vec![
                Endpoint::ready("198.18.128.2".parse().unwrap(), Some("node1")),
                Endpoint::ready("198.18.129.2".parse().unwrap(), Some("node2")),
            ],
        }));
        let config = NodeConfig {
            node_name: "node1".into(),
            node_ips: vec!["198.18.0.11".parse().unwrap()],
            cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
            node_port_addresses: NodePortAddresses::AllLocal,
        };
        let plan = NodePlan::build(&state, config);
        let spelling = spell(&plan, "rr", &[]);
        let reals = |key: &ServiceKey| -> Vec<String> {
            let entry = spelling.services.iter().find(|entry| entry.service.key == *key).expect("the service");
            entry.destinations.values().map(|d| format!("{}:{} {}", d.address, d.port, d.weight)).collect()
        };
        let lb = ServiceKey::new("198.18.100.1".parse().unwrap(), Protocol::Tcp, 80);
        assert_eq!(reals(&lb), vec!["198.18.128.2:8080 1", "198.18.129.2:8080 0"], "external sources: local only");
        let marks = fwmark::marks(&plan, IpFamily::V4, &[]);
        let mark = marks.values().next().expect("the load-balancer IP is marked").mark;
        for value in [mark, mark | rules::MASQ_MARK] {
            let key = ServiceKey::for_fwmark("0.0.0.0".parse().unwrap(), value);
            assert_eq!(reals(&key), vec!["198.18.128.2:8080 1", "198.18.129.2:8080 1"], "{key}");
        }
        let fwmark_services = spelling.services.iter().filter(|entry| entry.service.key.fwmark != 0).count();
        assert_eq!(fwmark_services, 2, "the ClusterIP needs no mark");
    }

    #[test]
    fn client_ip_affinity_is_persistence_with_the_services_timeout() {
        let spelling = spell(&plan(ServiceType::ClusterIp, true), "rr", &[]);
        assert_eq!(spelling.services[0].service.persistence_seconds, 600);
    }

    #[test]
    fn render_lists_addresses_services_and_real_servers() {
        let text = IpvsBackend::for_render(IpvsConfig::default()).render(&plan(ServiceType::ClusterIp, false)).unwrap();
        assert_eq!(
            text,
            "kube-ipvs0 198.19.0.10\nsctp 198.19.0.10:80 rr\n  -> 198.18.128.2:8080 Masq 1\n  -> 198.18.129.2:8080 Masq 1\n"
        );
    }
}
