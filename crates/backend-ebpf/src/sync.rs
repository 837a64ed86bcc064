//! Keeps the socket balancer's maps in line with the plan: a partial sync rewrites only the
//! service ports the diff names, against an in-memory record of what was written; a full
//! sync (first sync, drift, after a failure) adopts whatever the pinned maps hold, writes
//! everything and removes what the plan no longer has.
//!
//! Write order keeps every lookup whole: an endpoint set's slots are a range of the backends
//! array that is written before any frontend names it and never written again while one
//! does; a changed set goes to a new range, its frontends are moved there, and the old range
//! is given back (held a while before reuse, see `slots`). A full sync over maps that
//! already hold a set's endpoints in a range adopts that range instead of writing it again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use svcplane_bpf::aya_maps::IterableMap;
use svcplane_bpf::maps::PortName;
use svcplane_bpf::tc::TcNat;
use svcplane_bpf::{
    BackendValue, BatchMaps, BpfError, LiveKey, MapSizes, PortNamesMap, ServiceFlags, ServiceKey, ServiceValue, SockLb,
    SockLbOptions,
};
use svcplane_core::{Dataplane, DataplaneError, EndpointSetKind, NodePlan, PlanDiff, PlanKey, SyncReport, TableUsage};

use crate::render::{Decision, NodeAddresses, PortEntries, render_port, render_ports, render_text};
use crate::slots::Ranges;

/// How often drift checks may run.
/// How often the pins and the node's addresses are checked (cheap: a stat per pin): a
/// detached program is put back within about this long.
const DRIFT_INTERVAL: Duration = Duration::from_secs(1);
/// How often the services map's entries are counted (a syscall per entry).
const COUNT_INTERVAL: Duration = Duration::from_secs(10);

/// Where the eBPF mode pins and attaches, and how big its maps are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfOptions {
    /// A directory on a bpffs (mounted there if it is not one).
    pub bpf_root: PathBuf,
    /// The cgroup v2 directory to attach to; `None`: the cgroup2 mount's root, as on a node.
    pub cgroup: Option<PathBuf>,
    pub sizes: MapSizes,
    /// Entries of each Maglev table (a prime).
    pub maglev_size: u32,
    /// How the tc program returns external traffic it would SNAT (`--ebpf-external-mode`).
    pub external_mode: ExternalMode,
    /// A cold start on the calling thread alone, one phase after another (objects, program
    /// loads, then the sync) instead of loading the programs while the maps are filled:
    /// for measurements (the benchmark's before/after in one run). Off by default.
    pub cold_start_on_one_thread: bool,
}

/// How external traffic to another node's endpoint comes back, where the plan masquerades
/// it so the reply returns through this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExternalMode {
    /// SNAT to this node; the reply returns through it (what the plan spells out).
    #[default]
    Snat,
    /// Direct server return: no SNAT, the Service address travels with the flow's first
    /// packet and the endpoint's node answers the client from it. The reply still comes
    /// from the address the client used, which is what the plan's masquerade is for; the
    /// endpoint also sees the client's own address.
    Dsr,
}

impl Default for EbpfOptions {
    fn default() -> Self {
        Self {
            bpf_root: PathBuf::from(DEFAULT_BPF_ROOT),
            cgroup: None,
            sizes: MapSizes::default(),
            maglev_size: svcplane_bpf::maglev::DEFAULT_TABLE_SIZE,
            external_mode: ExternalMode::Snat,
            cold_start_on_one_thread: false,
        }
    }
}

/// Where pins live unless `--bpf-root` says otherwise.
pub const DEFAULT_BPF_ROOT: &str = "/sys/fs/bpf/svcplane";

/// What one service port has in the maps.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    entries: PortEntries,
    set_ids: PerSet,
    /// Where each set's slots start in the backends array (as many as the set has).
    firsts: PerSet,
    /// The id of the service port in `svcplane_live` (from the same counter as set ids).
    port_id: u32,
}

/// A value per endpoint set, inline: a port balances over one or two sets, and a map per
/// port was two allocations for every service port of a full sync (20k at 10k Services).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct PerSet([Option<u32>; 2]);

impl PerSet {
    const KINDS: [EndpointSetKind; 2] = [EndpointSetKind::Cluster, EndpointSetKind::Local];

    fn slot(kind: EndpointSetKind) -> usize {
        match kind {
            EndpointSetKind::Cluster => 0,
            EndpointSetKind::Local => 1,
        }
    }

    fn insert(&mut self, kind: EndpointSetKind, value: u32) {
        self.0[Self::slot(kind)] = Some(value);
    }

    fn get(&self, kind: &EndpointSetKind) -> Option<&u32> {
        self.0[Self::slot(*kind)].as_ref()
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut u32> {
        self.0.iter_mut().flatten()
    }

    fn iter(&self) -> impl Iterator<Item = (EndpointSetKind, u32)> + '_ {
        Self::KINDS.into_iter().zip(self.0).filter_map(|(kind, value)| Some((kind, value?)))
    }
}

impl std::ops::Index<&EndpointSetKind> for PerSet {
    type Output = u32;

    fn index(&self, kind: &EndpointSetKind) -> &u32 {
        self.get(kind).unwrap_or_else(|| panic!("no value for the {kind:?} set"))
    }
}

impl FromIterator<(EndpointSetKind, u32)> for PerSet {
    fn from_iter<I: IntoIterator<Item = (EndpointSetKind, u32)>>(values: I) -> Self {
        let mut set = Self::default();
        for (kind, value) in values {
            set.insert(kind, value);
        }
        set
    }
}

impl Written {
    fn live_keys(&self) -> impl Iterator<Item = LiveKey> + '_ {
        self.entries.serving.iter().map(|endpoint| LiveKey::new(self.port_id, *endpoint))
    }

    fn usage(&self) -> MapUsage {
        MapUsage::of(&self.entries)
    }

    /// Each set's range in the backends array: (first slot, length).
    fn ranges(&self) -> impl Iterator<Item = (EndpointSetKind, (u32, u32))> + '_ {
        self.entries.sets.iter().map(|(kind, endpoints)| (*kind, (self.firsts[kind], endpoints.len() as u32)))
    }

    /// The slots of set `kind`, as the backends array holds them.
    fn slots(&self, kind: EndpointSetKind) -> impl Iterator<Item = BackendValue> + '_ {
        self.entries.sets[&kind].iter().map(|endpoint| self.entries.backend_value(*endpoint))
    }
}

/// Entries in use per fixed-size map, kept as the record changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct MapUsage {
    services: usize,
    backends: usize,
    live: usize,
    names: usize,
}

impl MapUsage {
    /// Entries one service port takes in each fixed-size map.
    fn of(entries: &PortEntries) -> MapUsage {
        MapUsage {
            services: entries.frontends.len(),
            backends: entries.sets.values().map(|endpoints| endpoints.len()).sum(),
            live: entries.serving.len(),
            names: 1,
        }
    }

    fn add(&mut self, other: MapUsage) {
        self.services += other.services;
        self.backends += other.backends;
        self.live += other.live;
        self.names += other.names;
    }

    fn remove(&mut self, other: MapUsage) {
        self.services = self.services.saturating_sub(other.services);
        self.backends = self.backends.saturating_sub(other.backends);
        self.live = self.live.saturating_sub(other.live);
        self.names = self.names.saturating_sub(other.names);
    }
}

/// A full sync's ids and batches, before the maps are read.
#[derive(Debug)]
struct Built {
    record: BTreeMap<PlanKey, Written>,
    bulk: Bulk,
    /// The first id given.
    first_id: u32,
    /// The backends array's ranges as given, for an array nothing else uses.
    slots: Ranges,
}

/// What the first part of a full sync wrote and found, for the rest of it.
#[derive(Debug)]
struct Filled {
    record: BTreeMap<PlanKey, Written>,
    bulk: Bulk,
    old_services: BTreeSet<ServiceKey>,
    /// Ranges of the backends array old frontends named that no wanted set adopted: given
    /// back once the frontends have moved.
    stale_ranges: BTreeSet<(u32, u32)>,
    old_live: BTreeSet<LiveKey>,
    wanted: MapUsage,
    operations: usize,
    /// The source ranges and Maglev tables the plan wants (known once the tc maps are filled).
    wanted_ranges: BTreeSet<(ServiceKey, IpNet)>,
    wanted_maglev: BTreeSet<u32>,
}

/// svcplane's eBPF mode.
#[derive(Debug)]
pub struct EbpfBackend {
    options: EbpfOptions,
    lb: Option<SockLb>,
    /// The tc program, opened with `lb` (traffic from outside the node).
    tc: Option<TcNat>,
    /// The interfaces it is attached to.
    tc_interfaces: Vec<String>,
    record: BTreeMap<PlanKey, Written>,
    /// What `record` takes in each map.
    usage: MapUsage,
    /// The map the last sync found full, until a sync succeeds.
    full_map: Option<&'static str>,
    /// Which ranges of the backends array the record's sets hold.
    slots: Ranges,
    next_set: u32,
    full_pending: bool,
    node: NodeAddresses,
    last_drift_check: Option<Instant>,
    last_count_check: Option<Instant>,
    /// How long each phase of the last sync took ([`EbpfBackend::last_sync_phases`]).
    phases: Vec<(&'static str, Duration)>,
    /// What a cold sync filled, until its programs are linked and the stale entries go.
    cold_filled: Option<Filled>,
    /// Set while the objects are open but their programs not all linked yet
    /// ([`EbpfBackend::finish_opening`]): the socket programs replacing an earlier build's
    /// links, if any.
    opening: Option<Option<svcplane_bpf::StagedPrograms>>,
    /// The objects being opened and the programs loaded ahead of the first plan
    /// ([`EbpfBackend::open_ahead`]), taken by the first sync.
    ahead: Option<Opening>,
}

type Timings = Vec<(&'static str, Duration)>;

/// The two threads of a cold start that open the objects and load the programs, and what
/// they hand over: the socket maps, then the tc maps, as soon as each exists.
struct Opening {
    lb: std::sync::mpsc::Receiver<Result<SockLb, BpfError>>,
    tc: std::sync::mpsc::Receiver<Result<TcNat, BpfError>>,
    sock_thread: std::thread::JoinHandle<(Result<Option<svcplane_bpf::StagedPrograms>, BpfError>, Timings)>,
    tc_thread: std::thread::JoinHandle<(Result<Option<svcplane_bpf::tc::TcProgram>, BpfError>, Timings)>,
}

impl Opening {
    /// Waits for both threads, dropping what they opened (what they pinned stays pinned).
    fn wait(self) {
        let Self { lb, tc, sock_thread, tc_thread } = self;
        drop((lb, tc));
        let _ = sock_thread.join();
        let _ = tc_thread.join();
    }
}

impl Drop for EbpfBackend {
    /// A backend dropped while opening ahead waits for its threads, so nothing they pin
    /// appears after it is gone (a test's or a benchmark's sandbox is removed next).
    fn drop(&mut self) {
        if let Some(opening) = self.ahead.take() {
            opening.wait();
        }
    }
}

impl std::fmt::Debug for Opening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opening")
            .field("done", &(self.sock_thread.is_finished() && self.tc_thread.is_finished()))
            .finish()
    }
}

impl EbpfBackend {
    /// Nothing touches the kernel until the first sync.
    pub fn new(options: EbpfOptions) -> Self {
        Self {
            slots: Ranges::new(options.sizes.backends),
            options,
            lb: None,
            tc: None,
            tc_interfaces: Vec::new(),
            record: BTreeMap::new(),
            usage: MapUsage::default(),
            full_map: None,
            next_set: 1,
            full_pending: true,
            node: NodeAddresses::default(),
            last_drift_check: None,
            last_count_check: None,
            phases: Vec::new(),
            cold_filled: None,
            opening: None,
            ahead: None,
        }
    }

    /// How long each phase of the last sync took, in the order they ended. A sync that
    /// opens the programs loads them on two threads of their own while the calling thread
    /// fills the maps: those phases overlap, and "waiting for the program loads" is the
    /// time the filled maps waited for them.
    pub fn last_sync_phases(&self) -> &[(&'static str, Duration)] {
        &self.phases
    }

    fn phase(&mut self, name: &'static str, started: Instant) -> Instant {
        let now = Instant::now();
        self.phases.push((name, now - started));
        now
    }

    pub fn options(&self) -> &EbpfOptions {
        &self.options
    }

    /// Starts opening the objects and loading the programs now, on the threads the first
    /// sync would start them on, so that their work (most of a cold start: creating the
    /// maps, the verifier) overlaps whatever comes before the first plan, such as the
    /// source's first list. The first sync takes them over. Nothing is written to the maps
    /// and no pinned link moves before that sync; the socket programs of a fresh node are
    /// attached with empty maps, where every connect passes unchanged, as with no proxy.
    /// An error here is met again, and reported, by the first sync.
    pub fn open_ahead(&mut self) -> Result<(), BpfError> {
        if self.lb.is_none() && self.ahead.is_none() && !self.options.cold_start_on_one_thread {
            self.ahead = Some(self.start_opening()?);
        }
        Ok(())
    }

    /// The two opening threads of [`EbpfBackend::open_and_full_sync`], started.
    fn start_opening(&self) -> Result<Opening, BpfError> {
        let cgroup = match &self.options.cgroup {
            Some(path) => path.clone(),
            None => svcplane_bpf::sys::cgroup2_mount()?,
        };
        let options = SockLbOptions { bpf_root: self.options.bpf_root.clone(), cgroup, sizes: self.options.sizes };
        let cookie = svcplane_bpf::sys::current_netns_cookie()?;
        // Before the threads: the tc thread makes its flow table there at once.
        svcplane_bpf::sys::ensure_bpffs(&options.bpf_root)?;
        let (bpf_root, sizes, maglev_size) =
            (self.options.bpf_root.clone(), self.options.sizes, self.options.maglev_size);
        let (lb_sender, lb_receiver) = std::sync::mpsc::channel();
        // Whether the linked programs are an earlier build's, decided by the socket side
        // before it changes anything (it may create shared maps anew), and the loader it
        // opened its object with (one loader, one parse of the kernel's BTF).
        let (pinned_sender, pinned_receiver) = std::sync::mpsc::channel::<(bool, svcplane_bpf::ObjectLoader)>();
        let (tc_sender, tc_receiver) = std::sync::mpsc::channel();
        // Threads inherit the network namespace of the thread that starts them: the node's.
        let sock_thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut loader = svcplane_bpf::ObjectLoader::new(&options.bpf_root, options.sizes);
            let opened = SockLb::open_maps_with(&mut loader, &options, cookie);
            let mut timings: Timings = vec![("opening the socket object and its maps (own thread)", started.elapsed())];
            let programs = match opened {
                Ok((lb, programs)) => {
                    let _ = pinned_sender.send((lb.replacing, loader));
                    let _ = lb_sender.send(Ok(lb));
                    programs
                }
                Err(error) => {
                    let _ = lb_sender.send(Err(error));
                    return (Ok(None), timings);
                }
            };
            let started = Instant::now();
            // Links an earlier build pinned move onto the new programs only once the
            // maps are filled (`finish_opening`).
            let attached = programs.attach_staging_replacements().map(|(_, staged)| staged);
            timings.push(("loading and attaching the socket programs (own thread)", started.elapsed()));
            (attached, timings)
        });
        let tc_thread = std::thread::spawn(move || {
            let started = Instant::now();
            // Made while the socket object opens: on a fresh root, the flow table is the
            // largest map the tc object creates. A failure here is met again, and
            // reported, when the tc object creates it.
            let _ = TcNat::create_flow_table_ahead(&bpf_root, sizes);
            let mut timings: Timings = vec![("creating the flow table ahead (own thread)", started.elapsed())];
            // The tc object shares the socket object's maps through their pins.
            let Ok((replacing, mut loader)) = pinned_receiver.recv() else {
                return (Ok(None), timings);
            };
            let started = Instant::now();
            let opened = TcNat::open_maps_with(&mut loader, &bpf_root, sizes, maglev_size, replacing);
            timings.push(("opening the tc object and its maps (own thread)", started.elapsed()));
            let program = match opened {
                Ok((tc, program)) => {
                    let _ = tc_sender.send(Ok(tc));
                    program
                }
                Err(error) => {
                    let _ = tc_sender.send(Err(error));
                    return (Ok(None), timings);
                }
            };
            let started = Instant::now();
            let loaded = program.load().map(Some);
            timings.push(("loading the tc program (own thread)", started.elapsed()));
            (loaded, timings)
        });
        Ok(Opening { lb: lb_receiver, tc: tc_receiver, sock_thread, tc_thread })
    }

    /// Opens the objects, loads and attaches the programs and syncs in full, on three
    /// threads: one opens the socket object (its maps are created, or adopted by their
    /// pins) and then loads and attaches its programs; one waits for those maps to be
    /// pinned, opens the tc object (which shares them) and loads its program; this one
    /// renders the plan meanwhile, fills the socket maps as soon as they exist and the tc
    /// maps once those do. The programs need not be loaded for their maps to be filled, so
    /// the verifier's work (most of a cold start) overlaps the rendering and the writes.
    /// The tc program is attached to the node's interfaces from this thread (the node's
    /// network namespace) once it is loaded. Lookups before the sync ends see what was
    /// there (nothing on a fresh node, the old entries on a restart): the write order
    /// holds either way.
    fn open_and_full_sync(&mut self, plan: &NodePlan) -> Result<SyncReport, BpfError> {
        let opening = match self.ahead.take() {
            Some(opening) => opening,
            None => self.start_opening()?,
        };
        // Every map received is kept in `self` until both threads are joined: the programs
        // being loaded refer to them by file descriptor.
        let synced = self.cold_sync(plan, &opening.lb, &opening.tc);
        let (sock_thread, tc_thread) = (opening.sock_thread.join(), opening.tc_thread.join());
        let at = Instant::now();
        let (sock_attached, sock_timings) = sock_thread.map_err(|_| panicked("opening the socket programs"))?;
        let (tc_loaded, tc_timings) = tc_thread.map_err(|_| panicked("opening the tc program"))?;
        self.phases.extend(sock_timings);
        self.phases.extend(tc_timings);
        let opened = synced.and(tc_loaded).and_then(|program| {
            let staged = sock_attached?;
            let program = program.ok_or_else(|| panicked("the tc program was not loaded"))?;
            let tc = self.tc.take().ok_or_else(|| panicked("the tc maps were not opened"))?.with_program(program);
            self.tc = Some(tc);
            self.opening = Some(staged);
            self.finish_opening(at)?;
            let filled = self.cold_filled.take().expect("set by a cold sync that succeeded");
            self.remove_stale(plan, filled)
        });
        match opened {
            Ok(report) => Ok(report),
            Err(error) => {
                // Opened again, and synced in full, on the next try.
                self.lb = None;
                self.tc = None;
                self.opening = None;
                self.cold_filled = None;
                Err(error)
            }
        }
    }

    /// Links the programs of objects just opened, once their maps are filled: moves links
    /// an earlier build pinned onto this build's programs (socket programs, then the tc
    /// program: each link atomically, so every hook always runs one build or the other),
    /// attaches the tc program where it is not, and records this build's identity under
    /// the bpf root. Stale entries are removed only after this: until their links move, the
    /// old programs may still read them (or maps of the old layout, which they hold).
    fn finish_opening(&mut self, at: Instant) -> Result<(), BpfError> {
        let Some(staged) = self.opening.take() else { return Ok(()) };
        let linked = self.link_opened(staged, at);
        if linked.is_err() {
            // Opened again (and the links moved again) on the next try.
            self.lb = None;
            self.tc = None;
        }
        linked
    }

    fn link_opened(&mut self, staged: Option<svcplane_bpf::StagedPrograms>, at: Instant) -> Result<(), BpfError> {
        let replaced = match staged {
            Some(staged) => staged.swap()?,
            None => 0,
        };
        let tc = self.tc.as_mut().expect("opened with lb");
        let interfaces = svcplane_bpf::tc::node_interfaces()?;
        for interface in &interfaces {
            tc.attach(interface)?;
        }
        self.tc_interfaces = interfaces;
        svcplane_bpf::upgrade::record_identity(
            &self.options.bpf_root,
            svcplane_bpf::upgrade::identity(self.options.sizes),
        )?;
        self.phase(
            if replaced > 0 {
                "moving the pinned links onto the new programs, attaching the tc program"
            } else {
                "attaching the tc program to the interfaces"
            },
            at,
        );
        Ok(())
    }

    /// [`EbpfOptions::cold_start_on_one_thread`]: the objects opened, the programs loaded
    /// and attached one after another, before any map is filled.
    fn open_on_one_thread(&mut self) -> Result<(), BpfError> {
        let at = Instant::now();
        let cgroup = match &self.options.cgroup {
            Some(path) => path.clone(),
            None => svcplane_bpf::sys::cgroup2_mount()?,
        };
        let options = SockLbOptions { bpf_root: self.options.bpf_root.clone(), cgroup, sizes: self.options.sizes };
        let cookie = svcplane_bpf::sys::current_netns_cookie()?;
        let mut loader = svcplane_bpf::ObjectLoader::new(&options.bpf_root, options.sizes);
        let (lb, programs) = SockLb::open_maps_with(&mut loader, &options, cookie)?;
        let replacing = lb.replacing;
        // Keeps the maps the programs refer to until they are loaded.
        let lb = self.lb.insert(lb);
        let (adopted, staged) = programs.attach_staging_replacements()?;
        lb.adopted = adopted;
        let at = self.phase("opening, loading and attaching the socket programs", at);
        let (tc, program) = TcNat::open_maps_with(
            &mut loader,
            &self.options.bpf_root,
            self.options.sizes,
            self.options.maglev_size,
            replacing,
        )?;
        let tc =
            tc.with_program(program.load()?).with_direct_server_return(self.options.external_mode == ExternalMode::Dsr);
        self.phase("opening and loading the tc program", at);
        self.tc = Some(tc);
        // The tc program is attached (and pinned links moved) by the full sync that
        // follows, once the maps are filled.
        self.opening = Some(staged);
        Ok(())
    }

    /// This thread's part of [`EbpfBackend::open_and_full_sync`]: render, then fill the
    /// maps as the loading threads hand them over.
    fn cold_sync(
        &mut self,
        plan: &NodePlan,
        lb: &std::sync::mpsc::Receiver<Result<SockLb, BpfError>>,
        tc: &std::sync::mpsc::Receiver<Result<TcNat, BpfError>>,
    ) -> Result<(), BpfError> {
        let at = Instant::now();
        let rendered = self.render_plan(plan);
        let at = self.phase("rendering the plan", at);
        let built = rendered.and_then(|rendered| self.build_batches(plan, rendered));
        let at = self.phase("giving ids, building the batches", at);
        // Always received (so kept alive), even when rendering failed.
        let lb = lb.recv().unwrap_or_else(|_| Err(panicked("opening the socket maps")));
        self.phase("waiting for the socket maps", at);
        self.lb = Some(lb?);
        let filled = self.fill_socket_maps(built?);
        let at = Instant::now();
        let tc = tc.recv().unwrap_or_else(|_| Err(panicked("opening the tc maps")));
        self.phase("waiting for the tc maps", at);
        self.tc = Some(tc?.with_direct_server_return(self.options.external_mode == ExternalMode::Dsr));
        self.cold_filled = Some(self.fill_tc_maps(plan, filled?)?);
        Ok(())
    }

    fn full_sync(&mut self, plan: &NodePlan) -> Result<SyncReport, BpfError> {
        let at = Instant::now();
        let rendered = self.render_plan(plan)?;
        let at = self.phase("rendering the plan", at);
        let built = self.build_batches(plan, rendered)?;
        self.phase("giving ids, building the batches", at);
        let filled = self.fill_socket_maps(built)?;
        let filled = self.fill_tc_maps(plan, filled)?;
        self.finish_opening(Instant::now())?;
        self.remove_stale(plan, filled)
    }

    /// Every service port of the plan rendered, in the plan's order (no map is read).
    fn render_plan(&mut self, plan: &NodePlan) -> Result<Vec<PortEntries>, BpfError> {
        self.node = NodeAddresses { local: local_addresses()? };
        Ok(render_ports(plan, &self.node))
    }

    /// Ids (from the next unused one on), ranges of the backends array and the batches of
    /// a full sync, for the rendered ports: no map is read yet, so the ranges are laid out
    /// as in an empty array ([`EbpfBackend::fill_socket_maps`] moves the ids above any the
    /// maps hold, and lays the ranges out again around what the maps hold, if anything).
    fn build_batches(&mut self, plan: &NodePlan, rendered: Vec<PortEntries>) -> Result<Built, BpfError> {
        let first_id = self.next_set;
        let mut record = Vec::with_capacity(rendered.len());
        let mut slots = Ranges::new(self.options.sizes.backends);
        for (key, entries) in plan.service_ports.keys().zip(rendered) {
            let set_ids: PerSet = entries
                .sets
                .keys()
                .map(|kind| {
                    let id = self.next_set;
                    self.next_set += 1;
                    (*kind, id)
                })
                .collect();
            let port_id = self.next_set;
            self.next_set += 1;
            let firsts = take_ranges(&mut slots, &entries)?;
            record.push((key.clone(), Written { entries, set_ids, firsts, port_id }));
        }
        // In the plan's order, so collected in one pass (no insert per key).
        let record: BTreeMap<PlanKey, Written> = record.into_iter().collect();
        let bulk = Bulk::of(&record);
        Ok(Built { record, bulk, first_id, slots })
    }

    /// The first part of a full sync: adopts what the socket maps hold, gives the rendered
    /// ports fresh ids, refuses what would not fit, writes the endpoint slots, serving
    /// endpoints, frontends and port names in bulk.
    fn fill_socket_maps(&mut self, built: Built) -> Result<Filled, BpfError> {
        let at = Instant::now();
        let Built { mut record, mut bulk, first_id, slots } = built;
        let lb = self.lb.as_mut().expect("opened");
        // Adopt: whatever is in the maps now, from us or an earlier process.
        let old_frontends: Vec<(ServiceKey, ServiceValue)> = lb.services.iter().filter_map(Result::ok).collect();
        let old_services: BTreeSet<ServiceKey> = old_frontends.iter().map(|(key, _)| *key).collect();
        let old_live: BTreeSet<LiveKey> = lb.live.keys().filter_map(Result::ok).collect();
        // Read before the new names are written: on a fresh node, one lookup instead of one
        // per name written.
        let old_names: Vec<u32> = lb.names.keys().filter_map(Result::ok).collect();
        let highest = old_frontends
            .iter()
            .map(|(_, v)| v.backend_set.max(v.port_id))
            .chain(old_live.iter().map(|k| k.port_id))
            .max()
            .unwrap_or(0);
        // Fresh ids: an id in use by an old entry is never overwritten under it. The ids
        // were given before the maps were read: moved above the highest in use if need be
        // (a restart adopting maps an earlier process filled).
        if highest >= first_id {
            let offset = highest + 1 - first_id;
            for written in record.values_mut() {
                written.port_id += offset;
                for id in written.set_ids.values_mut() {
                    *id += offset;
                }
            }
            self.next_set += offset;
        }
        // Ranges old frontends name are adopted where they hold a wanted set's slots
        // already, and kept out of the way of new ones otherwise until the frontends move.
        let old_ranges: BTreeSet<(u32, u32)> =
            old_frontends.iter().filter(|(_, v)| v.count > 0).map(|(_, v)| (v.first, v.count)).collect();
        let mut stale_ranges = BTreeSet::new();
        // Ranges that hold their set's slots already (adopted from the maps): not written.
        let mut adopted = BTreeSet::new();
        // The ranges given while the maps were not read yet stand when nothing in the maps
        // is named and nothing this process gave back is still held.
        if old_ranges.is_empty() && self.slots.held().next().is_none() {
            self.slots = slots;
            if highest >= first_id {
                bulk = Bulk::of(&record);
            }
        } else {
            let held: Vec<(Instant, u32, u32)> = self.slots.held().collect();
            let capacity = self.options.sizes.backends;
            let (slots, adopted_ranges, stale) = lay_out_around(&lb.slots, capacity, held, &old_ranges, &mut record)?;
            self.slots = slots;
            stale_ranges = stale;
            adopted = adopted_ranges;
            bulk = Bulk::of(&record);
        }
        // Refused before anything is written if it cannot fit (ranges were refused above).
        let mut wanted = MapUsage::default();
        for written in record.values() {
            wanted.add(written.usage());
        }
        self.check_room(wanted)?;
        let at = self.phase("reading what the maps hold", at);
        let lb = self.lb.as_mut().expect("opened");
        let mut operations = write_new_slots(lb, &record, &adopted)?;
        let at = self.phase("batched writes: endpoint slots (array)", at);
        // The port names (read only by counter readers) go in on a thread of their own
        // beside the frontends: two batched writes the kernel does one entry at a time.
        let lb = self.lb.as_mut().expect("opened");
        let (sizes, names, batch) = (lb.sizes, &mut lb.names, &lb.batch);
        let (frontends, named) = std::thread::scope(|scope| {
            let named = scope.spawn(|| write_port_names(names, sizes, &record, old_names));
            (bulk.write_frontends(batch, sizes), named.join())
        });
        operations += frontends?;
        named.map_err(|_| panicked("writing the port names"))??;
        self.phase("batched writes: serving endpoints, frontends; port names (own thread)", at);
        Ok(Filled {
            record,
            bulk,
            old_services,
            stale_ranges,
            old_live,
            wanted,
            operations,
            wanted_ranges: BTreeSet::new(),
            wanted_maglev: BTreeSet::new(),
        })
    }

    /// The second part of a full sync: the tc maps.
    fn fill_tc_maps(&mut self, plan: &NodePlan, filled: Filled) -> Result<Filled, BpfError> {
        let at = Instant::now();
        let mut operations = filled.operations;
        let record = &filled.record;
        let tc = self.tc.as_mut().expect("opened with lb");
        tc.configure(&plan.config.node_ips, &plan.config.cluster_cidrs)?;
        let wanted_ranges: BTreeSet<(ServiceKey, IpNet)> = record
            .values()
            .flat_map(|w: &Written| {
                w.entries.source_ranges.iter().flat_map(|(key, ranges)| ranges.iter().map(move |r| (*key, *r)))
            })
            .collect();
        for (key, range) in &wanted_ranges {
            tc.allow_source(key, range)?;
            operations += 1;
        }
        let at = self.phase("node configuration and source ranges", at);
        let tc = self.tc.as_mut().expect("opened with lb");
        let tables: Vec<(u32, &[SocketAddr])> = record
            .values()
            .flat_map(|w| w.entries.maglev_sets.iter().map(|kind| (w.set_ids[kind], &*w.entries.sets[kind])))
            .collect();
        tc.set_maglev_many(&tables)?;
        operations += tables.len();
        let wanted_maglev: BTreeSet<u32> = tables.iter().map(|(set, _)| *set).collect();
        self.phase("Maglev tables", at);
        Ok(Filled { operations, wanted_ranges, wanted_maglev, ..filled })
    }

    /// The last part of a full sync: what the plan no longer has, once the programs that
    /// read the new entries are linked.
    fn remove_stale(&mut self, plan: &NodePlan, filled: Filled) -> Result<SyncReport, BpfError> {
        let at = Instant::now();
        let Filled {
            record,
            bulk,
            old_services,
            stale_ranges,
            old_live,
            wanted,
            mut operations,
            wanted_ranges,
            wanted_maglev,
        } = filled;
        let tc = self.tc.as_mut().expect("opened with lb");
        for set in tc.maglev_sets() {
            if !wanted_maglev.contains(&set) {
                tc.remove_maglev(set);
                operations += 1;
            }
        }
        for (key, range) in tc.allowed_sources() {
            if !wanted_ranges.contains(&(key, range)) {
                tc.disallow_source(&key, &range);
                operations += 1;
            }
        }
        let lb = self.lb.as_mut().expect("opened");
        // What the maps held before and the plan no longer has (nothing on a fresh node:
        // the sets of wanted keys are only built when there is something to compare).
        if !old_live.is_empty() {
            let wanted_live: BTreeSet<LiveKey> = record.values().flat_map(Written::live_keys).collect();
            for key in old_live.difference(&wanted_live) {
                remove_live(lb, key)?;
                operations += 1;
            }
        }
        if !old_services.is_empty() {
            let wanted_services: BTreeSet<ServiceKey> = bulk.service_keys.iter().copied().collect();
            for key in old_services.difference(&wanted_services) {
                remove_service(lb, key)?;
                operations += 1;
            }
        }
        // No frontend names these any more: their slots are left as they are (nothing reads
        // them) and handed out again after the hold.
        let now = Instant::now();
        for (first, length) in stale_ranges {
            self.slots.give_back(first, length, now);
        }
        self.phase("removing stale entries", at);
        self.usage = wanted;
        self.record = record;
        self.full_pending = false;
        Ok(SyncReport { full: true, service_ports: plan.service_ports.len(), operations, rules_replaced: false })
    }

    /// The capacity the loader gave `map`: one function decides it, for the loader, the
    /// upgrade check and these counts alike.
    fn capacity(&self, map: &'static str) -> u32 {
        svcplane_bpf::upgrade::sized(map, self.options.sizes).unwrap_or_else(|| panic!("{map} is a sized map"))
    }

    /// Fails, before anything is written, if `wanted` does not fit the maps.
    fn check_room(&self, wanted: MapUsage) -> Result<(), BpfError> {
        use svcplane_bpf::maps::{BACKENDS_MAP, LIVE_MAP, PORT_NAMES_MAP, SERVICES_MAP};
        for (map, entries) in [
            (SERVICES_MAP, wanted.services),
            (BACKENDS_MAP, wanted.backends),
            (LIVE_MAP, wanted.live),
            (PORT_NAMES_MAP, wanted.names),
        ] {
            let capacity = self.capacity(map);
            if entries > capacity as usize {
                return Err(BpfError::MapFull { map, capacity });
            }
        }
        Ok(())
    }

    fn partial_sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<SyncReport, BpfError> {
        // Every changed port rendered first: a change that would not fit is refused whole.
        let rendered: Vec<(&PlanKey, Option<PortEntries>)> = diff
            .keys()
            .map(|key| (key, plan.service_ports.get(key).map(|port| render_port(plan, port, &self.node))))
            .collect();
        let mut wanted = self.usage;
        for (key, entries) in &rendered {
            if let Some(old) = self.record.get(*key) {
                wanted.remove(old.usage());
            }
            if let Some(entries) = entries {
                wanted.add(MapUsage::of(entries));
            }
        }
        self.check_room(wanted)?;
        self.slots.release_held(Instant::now());
        // Ids, and a range for every set whose slots change, for every port before anything
        // is written: a set that does not fit refuses the whole change.
        let mut planned: Vec<(&PlanKey, Option<Written>, Option<Written>)> = Vec::with_capacity(rendered.len());
        for (key, entries) in rendered {
            let old = self.record.get(key).cloned();
            let written = entries.map(|entries| self.plan_written(entries, old.as_ref()));
            planned.push((key, old, written));
        }
        let mut taken: Vec<(u32, u32)> = Vec::new();
        let mut refused = None;
        'ports: for (_, old, written) in &mut planned {
            let Some(written) = written else { continue };
            for (kind, length) in
                written.entries.sets.iter().map(|(kind, e)| (*kind, e.len() as u32)).collect::<Vec<_>>()
            {
                if let Some(old) = old.as_ref().filter(|old| same_slots(old, written, kind)) {
                    written.firsts.insert(kind, old.firsts[&kind]);
                    continue;
                }
                match self.slots.take(length) {
                    Some(first) => {
                        taken.push((first, length));
                        written.firsts.insert(kind, first);
                    }
                    None => {
                        refused = Some(BpfError::MapFull {
                            map: svcplane_bpf::maps::BACKENDS_MAP,
                            capacity: self.slots.capacity(),
                        });
                        break 'ports;
                    }
                }
            }
        }
        if let Some(refused) = refused {
            for (first, length) in taken {
                self.slots.give_back_unused(first, length);
            }
            return Err(refused);
        }
        let lb = self.lb.as_mut().expect("opened");
        let mut operations = 0;
        let mut ports = 0;
        // (frontend, endpoint) pairs of UDP ports whose endpoint stopped serving.
        let mut stopped_serving: BTreeSet<(SocketAddr, SocketAddr)> = BTreeSet::new();
        for (key, old, written) in planned {
            ports += 1;
            let Some(written) = written else {
                if let Some(old) = old {
                    operations += remove_written(lb, &mut self.slots, &old, None)?;
                    let _ = lb.names.remove(&old.port_id);
                    for live in old.live_keys() {
                        remove_live(lb, &live)?;
                        operations += 1;
                    }
                    let tc = self.tc.as_mut().expect("opened with lb");
                    operations += update_ranges(tc, Some(&old.entries), None)?;
                    operations += update_maglev(tc, Some(&old), None)?;
                    self.usage.remove(old.usage());
                    self.record.remove(key);
                }
                continue;
            };
            let port_id = written.port_id;
            if old.is_none() {
                lb.names.insert(port_id, port_name(key), 0).map_err(|source| {
                    map_error(svcplane_bpf::maps::PORT_NAMES_MAP, lb.sizes.services, port_id, source)
                })?;
            }
            let old_live: BTreeSet<LiveKey> = old.iter().flat_map(Written::live_keys).collect();
            let new_live: BTreeSet<LiveKey> = written.live_keys().collect();
            for live in new_live.difference(&old_live) {
                insert_live(lb, *live)?;
                operations += 1;
            }
            operations += write_sets(lb, &written, old.as_ref())?;
            operations += write_frontends(lb, &written)?;
            if let Some(old) = &old {
                operations += remove_written(lb, &mut self.slots, old, Some(&written))?;
            }
            for live in old_live.difference(&new_live) {
                remove_live(lb, live)?;
                for frontend in
                    written.entries.frontends.keys().chain(old.iter().flat_map(|o| o.entries.frontends.keys()))
                {
                    stopped_serving.insert((frontend.address(), live.address()));
                }
                operations += 1;
            }
            let tc = self.tc.as_mut().expect("opened with lb");
            operations += update_ranges(tc, old.as_ref().map(|o| &o.entries), Some(&written.entries))?;
            operations += update_maglev(tc, old.as_ref(), Some(&written))?;
            if let Some(old) = &old {
                self.usage.remove(old.usage());
            }
            self.usage.add(written.usage());
            self.record.insert(key.clone(), written);
        }
        if !stopped_serving.is_empty() {
            self.close_sockets_to_gone_endpoints(stopped_serving);
        }
        Ok(SyncReport { full: false, service_ports: ports, operations, rules_replaced: false })
    }

    /// A changed port's ids (its old ones where it had them, fresh ones otherwise); its
    /// ranges are given by the caller.
    fn plan_written(&mut self, entries: PortEntries, old: Option<&Written>) -> Written {
        let mut set_ids = PerSet::default();
        for kind in entries.sets.keys() {
            let id = match old.and_then(|o| o.set_ids.get(kind)) {
                Some(id) => *id,
                None => {
                    let id = self.next_set;
                    self.next_set += 1;
                    id
                }
            };
            set_ids.insert(*kind, id);
        }
        let port_id = old.map_or_else(
            || {
                let id = self.next_set;
                self.next_set += 1;
                id
            },
            |o| o.port_id,
        );
        Written { entries, set_ids, firsts: PerSet::default(), port_id }
    }

    /// The node's own connected UDP sockets the balancer pointed, for a Service address,
    /// at an endpoint that no longer serves that Service's port are closed, so their
    /// applications reconnect to a live one (pods' sockets need not be: tc moves their
    /// flows). The rules are in either way, so a failure here is logged, not a failed sync.
    fn close_sockets_to_gone_endpoints(&mut self, stopped: BTreeSet<(SocketAddr, SocketAddr)>) {
        let lb = self.lb.as_ref().expect("opened");
        let cookies: BTreeSet<u64> = lb
            .udp_sockets
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, service)| stopped.contains(&(service.frontend(), key.backend())))
            .map(|(key, _)| key.cookie)
            .collect();
        let gone: BTreeSet<SocketAddr> = stopped.iter().map(|(_, endpoint)| *endpoint).collect();
        match svcplane_bpf::sockets::destroy_udp_sockets(&cookies, &gone) {
            Ok(0) => {}
            Ok(closed) => {
                tracing::info!(closed, endpoints = ?gone, "closed the node's UDP sockets connected to endpoints that are gone");
            }
            Err(error) => {
                tracing::warn!(endpoints = ?gone, "closing the node's UDP sockets connected to endpoints that are gone: {error}");
            }
        }
    }
}

/// The serving endpoints and frontends of a full sync, written in bulk once the endpoint
/// slots are in ([`write_new_slots`]): no frontend may name a slot not written yet.
#[derive(Debug, Default)]
struct Bulk {
    live_keys: Vec<LiveKey>,
    service_keys: Vec<ServiceKey>,
    service_values: Vec<ServiceValue>,
}

impl Bulk {
    /// Every serving endpoint and frontend of `record`.
    fn of(record: &BTreeMap<PlanKey, Written>) -> Self {
        let (live, frontends) = record.values().fold((0, 0), |(live, frontends), w| {
            (live + w.entries.serving.len(), frontends + w.entries.frontends.len())
        });
        let mut bulk = Bulk {
            live_keys: Vec::with_capacity(live),
            service_keys: Vec::with_capacity(frontends),
            service_values: Vec::with_capacity(frontends),
        };
        for written in record.values() {
            bulk.live_keys.extend(written.live_keys());
            for (key, decision) in &written.entries.frontends {
                bulk.service_keys.push(*key);
                bulk.service_values.push(service_value(written, key, *decision));
            }
        }
        bulk
    }

    /// The serving endpoints, then the frontends (after [`write_new_slots`]).
    fn write_frontends(&self, batch: &BatchMaps, sizes: MapSizes) -> Result<usize, BpfError> {
        use svcplane_bpf::maps::{LIVE_MAP, SERVICES_MAP};
        let ones = vec![1u32; self.live_keys.len()];
        svcplane_bpf::sys::update_batch(&batch.live, &self.live_keys, &ones)
            .map_err(|source| batch_error(LIVE_MAP, sizes.backends, source))?;
        svcplane_bpf::sys::update_batch(&batch.services, &self.service_keys, &self.service_values)
            .map_err(|source| batch_error(SERVICES_MAP, sizes.services, source))?;
        Ok(self.live_keys.len() + self.service_keys.len())
    }
}

/// The endpoint slots of every set of `record` but those in `adopted` ranges (which hold
/// them already), as memory of the mapped array. Returns how many were written.
fn write_new_slots(
    lb: &mut SockLb,
    record: &BTreeMap<PlanKey, Written>,
    adopted: &BTreeSet<(u32, u32)>,
) -> Result<usize, BpfError> {
    let mut written_slots = 0;
    for written in record.values() {
        for (kind, range) in written.ranges() {
            if adopted.contains(&range) {
                continue;
            }
            let values: Vec<BackendValue> = written.slots(kind).collect();
            lb.slots
                .write(range.0, &values)
                .map_err(|source| batch_error(svcplane_bpf::maps::BACKENDS_MAP, lb.sizes.backends, source))?;
            written_slots += values.len();
        }
    }
    Ok(written_slots)
}

/// The name of every port of `record` under its id, in one batch; then the names of ids
/// no longer in use (`old_names`: the ids the map held before) are removed.
fn write_port_names(
    names: &mut PortNamesMap,
    sizes: MapSizes,
    record: &BTreeMap<PlanKey, Written>,
    old_names: Vec<u32>,
) -> Result<(), BpfError> {
    let (name_ids, name_values): (Vec<u32>, Vec<PortName>) =
        record.iter().map(|(key, written)| (written.port_id, port_name(key))).unzip();
    svcplane_bpf::sys::update_batch(IterableMap::map(names), &name_ids, &name_values)
        .map_err(|source| batch_error(svcplane_bpf::maps::PORT_NAMES_MAP, sizes.services, source))?;
    if !old_names.is_empty() {
        let live_ids: BTreeSet<u32> = name_ids.into_iter().collect();
        for id in old_names.into_iter().filter(|id| !live_ids.contains(id)) {
            let _ = names.remove(&id);
        }
    }
    Ok(())
}

/// A loading thread that panicked (a bug), as an error of the sync.
fn panicked(what: &str) -> BpfError {
    BpfError::Io { what: what.to_owned(), source: std::io::Error::other("the thread panicked") }
}

/// A failed batched write: a full map (E2BIG / ENOSPC) is named as such.
fn batch_error(map: &'static str, capacity: u32, source: std::io::Error) -> BpfError {
    match source.raw_os_error() {
        Some(libc_e2big) if libc_e2big == 7 || libc_e2big == 28 => BpfError::MapFull { map, capacity },
        _ => BpfError::Io { what: format!("writing map {map} in bulk"), source },
    }
}

/// Writes the slots of `written`'s sets that are not in `old`'s ranges already (each a new
/// range no frontend names yet, written as memory of the mapped array).
fn write_sets(lb: &mut SockLb, written: &Written, old: Option<&Written>) -> Result<usize, BpfError> {
    let mut operations = 0;
    for (kind, (first, length)) in written.ranges() {
        if length == 0 || old.is_some_and(|old| keeps_range(old, written, kind)) {
            continue;
        }
        let values: Vec<BackendValue> = written.slots(kind).collect();
        lb.slots
            .write(first, &values)
            .map_err(|source| batch_error(svcplane_bpf::maps::BACKENDS_MAP, lb.sizes.backends, source))?;
        operations += values.len();
    }
    Ok(operations)
}

/// Whether set `kind` of `new` stays in `old`'s range: same range, same slots.
fn keeps_range(old: &Written, new: &Written, kind: EndpointSetKind) -> bool {
    old.firsts.get(&kind) == new.firsts.get(&kind) && same_slots(old, new, kind)
}

/// Whether `old` had set `kind` with exactly the slots `new` wants for it.
fn same_slots(old: &Written, new: &Written, kind: EndpointSetKind) -> bool {
    old.entries.sets.contains_key(&kind) && old.slots(kind).eq(new.slots(kind))
}

/// The range each set of `entries` gets in the backends array.
fn take_ranges(slots: &mut Ranges, entries: &PortEntries) -> Result<PerSet, BpfError> {
    let mut firsts = PerSet::default();
    for (kind, endpoints) in &entries.sets {
        let Some(first) = slots.take(endpoints.len() as u32) else {
            for (kind, first) in firsts.iter() {
                slots.give_back_unused(first, entries.sets[&kind].len() as u32);
            }
            return Err(BpfError::MapFull { map: svcplane_bpf::maps::BACKENDS_MAP, capacity: slots.capacity() });
        };
        firsts.insert(*kind, first);
    }
    Ok(firsts)
}

/// Lays the wanted sets of `record` out around the ranges old frontends name (`old_ranges`,
/// read back from the backends array): a wanted set whose slots an old range holds already
/// adopts that range (each range once); the others get ranges that no old frontend names
/// and no range still `held` covers. Returns the new allocator, the adopted ranges and the
/// old ranges nobody adopted (to give back once no frontend names them).
#[allow(clippy::type_complexity)]
fn lay_out_around(
    backends: &svcplane_bpf::sys::MappedArray,
    capacity: u32,
    held: Vec<(Instant, u32, u32)>,
    old_ranges: &BTreeSet<(u32, u32)>,
    record: &mut BTreeMap<PlanKey, Written>,
) -> Result<(Ranges, BTreeSet<(u32, u32)>, BTreeSet<(u32, u32)>), BpfError> {
    let end = old_ranges.iter().map(|(first, length)| first.saturating_add(*length)).max().unwrap_or(0).min(capacity);
    let stored: Vec<BackendValue> = backends.read(0, end);
    let mut slots = Ranges::new(capacity);
    let mut by_content: std::collections::HashMap<&[BackendValue], Vec<u32>> = std::collections::HashMap::new();
    for &(first, length) in old_ranges {
        // Ranges this build wrote never overlap; one that does (or runs past the array) is
        // not adopted.
        if !slots.take_at(first, length) {
            continue;
        }
        if let Some(content) = stored.get(first as usize..(first + length) as usize) {
            by_content.entry(content).or_default().push(first);
        }
    }
    for (at, first, length) in held {
        slots.hold_at(at, first, length);
    }
    let mut adopted = BTreeSet::new();
    for written in record.values_mut() {
        let kinds: Vec<EndpointSetKind> = written.entries.sets.keys().copied().collect();
        for kind in kinds {
            let wanted: Vec<BackendValue> = written.slots(kind).collect();
            let length = wanted.len() as u32;
            let first = match by_content.get_mut(wanted.as_slice()).and_then(Vec::pop) {
                Some(first) => {
                    adopted.insert((first, length));
                    first
                }
                None => {
                    slots.take(length).ok_or(BpfError::MapFull { map: svcplane_bpf::maps::BACKENDS_MAP, capacity })?
                }
            };
            written.firsts.insert(kind, first);
        }
    }
    let stale = old_ranges.difference(&adopted).copied().collect();
    Ok((slots, adopted, stale))
}

fn service_value(written: &Written, key: &ServiceKey, decision: Decision) -> ServiceValue {
    let mut flags = if written.entries.affinity_seconds > 0 { ServiceFlags::AFFINITY } else { 0 };
    if written.entries.masqueraded.contains(key) {
        flags |= ServiceFlags::MASQUERADE;
    }
    if written.entries.source_ranges.contains_key(key) {
        flags |= ServiceFlags::SOURCE_RANGES;
    }
    match decision {
        Decision::Balance(kind) => ServiceValue {
            backend_set: written.set_ids[&kind],
            count: written.entries.sets[&kind].len() as u32,
            flags,
            affinity_timeout: written.entries.affinity_seconds,
            port_id: written.port_id,
            first: written.firsts[&kind],
        },
        Decision::Reject => {
            ServiceValue { flags: ServiceFlags::REJECT, port_id: written.port_id, ..ServiceValue::default() }
        }
        Decision::Drop => {
            ServiceValue { flags: ServiceFlags::DROP, port_id: written.port_id, ..ServiceValue::default() }
        }
    }
}

fn write_frontends(lb: &mut SockLb, written: &Written) -> Result<usize, BpfError> {
    for (key, decision) in &written.entries.frontends {
        let value = service_value(written, key, *decision);
        lb.services
            .insert(*key, value, 0)
            .map_err(|source| map_error(svcplane_bpf::maps::SERVICES_MAP, lb.sizes.services, *key, source))?;
    }
    Ok(written.entries.frontends.len())
}

/// Removes what `old` wrote that `new` (if any) no longer has: frontends first, then the
/// ranges `new` does not keep are given back (their slots stay as they are: nothing names
/// them, and they are handed out again only after the hold).
fn remove_written(
    lb: &mut SockLb,
    slots: &mut Ranges,
    old: &Written,
    new: Option<&Written>,
) -> Result<usize, BpfError> {
    let mut operations = 0;
    for key in old.entries.frontends.keys() {
        if new.is_some_and(|n| n.entries.frontends.contains_key(key)) {
            continue;
        }
        remove_service(lb, key)?;
        operations += 1;
    }
    let now = Instant::now();
    for (kind, (first, length)) in old.ranges() {
        if new.is_some_and(|new| keeps_range(old, new, kind)) {
            continue;
        }
        slots.give_back(first, length, now);
    }
    Ok(operations)
}

/// Source-range entries of one service port: those `new` has that `old` had not are added,
/// then those only `old` had are removed.
fn update_ranges(tc: &mut TcNat, old: Option<&PortEntries>, new: Option<&PortEntries>) -> Result<usize, BpfError> {
    let pairs = |entries: Option<&PortEntries>| -> BTreeSet<(ServiceKey, IpNet)> {
        entries
            .map(|e| e.source_ranges.iter().flat_map(|(key, ranges)| ranges.iter().map(move |r| (*key, *r))).collect())
            .unwrap_or_default()
    };
    let (before, after) = (pairs(old), pairs(new));
    for (key, range) in after.difference(&before) {
        tc.allow_source(key, range)?;
    }
    for (key, range) in before.difference(&after) {
        tc.disallow_source(key, range);
    }
    Ok(after.symmetric_difference(&before).count())
}

/// Maglev tables of one service port: rebuilt for sets whose endpoints changed or that are
/// new, dropped for sets no longer balanced from outside.
fn update_maglev(tc: &mut TcNat, old: Option<&Written>, new: Option<&Written>) -> Result<usize, BpfError> {
    let tables = |written: Option<&Written>| -> BTreeMap<u32, Vec<SocketAddr>> {
        written
            .map(|w| {
                w.entries.maglev_sets.iter().map(|kind| (w.set_ids[kind], w.entries.sets[kind].to_vec())).collect()
            })
            .unwrap_or_default()
    };
    let (before, after) = (tables(old), tables(new));
    let mut operations = 0;
    for (set, endpoints) in &after {
        if before.get(set) != Some(endpoints) {
            tc.set_maglev(*set, endpoints)?;
            operations += 1;
        }
    }
    for set in before.keys().filter(|set| !after.contains_key(set)) {
        tc.remove_maglev(*set);
        operations += 1;
    }
    Ok(operations)
}

/// A service port's name as counter readers show it (`namespace/name:port`).
fn port_name(key: &PlanKey) -> PortName {
    let service = &key.name.service;
    let label = svcplane_core::counters::service_port_label(&service.namespace, &service.name, &key.name.port_name);
    PortName::new(&label, crate::render::protocol_number(key.name.protocol))
}

fn insert_live(lb: &mut SockLb, key: LiveKey) -> Result<(), BpfError> {
    lb.live.insert(key, 1, 0).map_err(|source| map_error(svcplane_bpf::maps::LIVE_MAP, lb.sizes.backends, key, source))
}

fn remove_live(lb: &mut SockLb, key: &LiveKey) -> Result<(), BpfError> {
    match lb.live.remove(key) {
        Ok(()) => Ok(()),
        Err(error) if is_not_found(&error) => Ok(()),
        Err(source) => Err(BpfError::Map {
            map: svcplane_bpf::maps::LIVE_MAP,
            what: format!("removing {key:?}"),
            source: Box::new(source),
        }),
    }
}

fn remove_service(lb: &mut SockLb, key: &ServiceKey) -> Result<(), BpfError> {
    match lb.services.remove(key) {
        Ok(()) => Ok(()),
        Err(error) if is_not_found(&error) => Ok(()),
        Err(source) => Err(BpfError::Map {
            map: svcplane_bpf::maps::SERVICES_MAP,
            what: format!("removing {key:?}"),
            source: Box::new(source),
        }),
    }
}

fn os_error(error: &svcplane_bpf::maps::MapError) -> Option<i32> {
    match error {
        svcplane_bpf::maps::MapError::SyscallError(e) => e.io_error.raw_os_error(),
        _ => None,
    }
}

fn is_not_found(error: &svcplane_bpf::maps::MapError) -> bool {
    matches!(error, svcplane_bpf::maps::MapError::KeyNotFound) || os_error(error) == Some(2)
}

/// A failed insert: a full map is named as such (E2BIG from a full hash map).
fn map_error(
    map: &'static str,
    capacity: u32,
    what: impl std::fmt::Debug,
    source: svcplane_bpf::maps::MapError,
) -> BpfError {
    if os_error(&source) == Some(7) {
        return BpfError::MapFull { map, capacity };
    }
    BpfError::Map { map, what: format!("writing {what:?}"), source: Box::new(source) }
}

/// Every address of the node's interfaces.
fn local_addresses() -> Result<Vec<IpAddr>, BpfError> {
    svcplane_bpf::sys::local_addresses()
}

impl Dataplane for EbpfBackend {
    fn mode(&self) -> &'static str {
        "ebpf"
    }

    fn sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<SyncReport, DataplaneError> {
        self.phases.clear();
        let result = if self.lb.is_none() && self.options.cold_start_on_one_thread {
            let opened = self.open_on_one_thread();
            if opened.is_err() {
                self.lb = None;
                self.tc = None;
                self.opening = None;
            }
            opened.and_then(|()| self.full_sync(plan))
        } else if self.lb.is_none() {
            self.open_and_full_sync(plan)
        } else if self.full_pending {
            self.full_sync(plan)
        } else {
            self.partial_sync(plan, diff)
        };
        self.full_map = match &result {
            Err(BpfError::MapFull { map, .. }) => Some(map),
            _ => None,
        };
        if result.is_err() {
            // The record may no longer say what the maps hold.
            self.full_pending = true;
        }
        Ok(result?)
    }

    fn table_usage(&self) -> Vec<TableUsage> {
        use svcplane_bpf::maps::{BACKENDS_MAP, LIVE_MAP, PORT_NAMES_MAP, SERVICES_MAP};
        [
            (SERVICES_MAP, self.usage.services),
            // Slots of the record's sets and of ranges held before reuse.
            (BACKENDS_MAP, self.slots.in_use() as usize),
            (LIVE_MAP, self.usage.live),
            (PORT_NAMES_MAP, self.usage.names),
        ]
        .into_iter()
        .map(|(table, entries)| TableUsage {
            table,
            entries,
            capacity: self.capacity(table) as usize,
            full: self.full_map == Some(table),
        })
        .collect()
    }

    fn counters(&mut self) -> Result<Vec<svcplane_core::counters::EndpointCounter>, DataplaneError> {
        let counters = svcplane_bpf::sock_lb::read_counters(&self.options.bpf_root)?;
        Ok(counters
            .into_iter()
            .filter_map(|(name, key, connections)| {
                let name = name?;
                let protocol = match name.proto {
                    svcplane_bpf::maps::PROTO_TCP => svcplane_core::Protocol::Tcp,
                    svcplane_bpf::maps::PROTO_UDP => svcplane_core::Protocol::Udp,
                    _ => svcplane_core::Protocol::Sctp,
                };
                let endpoint = SocketAddr::new(
                    svcplane_bpf::maps::address_of(key.addr),
                    u16::from_be_bytes(key.port.to_ne_bytes()),
                );
                Some(svcplane_core::counters::EndpointCounter {
                    service_port: name.name(),
                    protocol,
                    endpoint,
                    connections,
                })
            })
            .collect())
    }

    fn request_full_resync(&mut self) {
        self.full_pending = true;
    }

    fn detect_drift(&mut self) -> Option<String> {
        if self.lb.is_none() || self.full_pending {
            return None;
        }
        if self.last_drift_check.is_some_and(|at| at.elapsed() < DRIFT_INTERVAL) {
            return None;
        }
        self.last_drift_check = Some(Instant::now());
        if let Some(missing) = svcplane_bpf::sock_lb::missing_pins(&self.options.bpf_root).into_iter().next() {
            // Re-open so the links are attached again.
            self.lb = None;
            self.tc = None;
            return Some(format!("{} is gone", missing.display()));
        }
        // A new interface (a pod's veth) needs the tc program; a removed one's link is gone.
        if let Ok(interfaces) = svcplane_bpf::tc::node_interfaces()
            && (interfaces != self.tc_interfaces
                || svcplane_bpf::tc::pinned_interfaces(&self.options.bpf_root).len() < interfaces.len())
        {
            self.lb = None;
            self.tc = None;
            return Some(format!(
                "the node's interfaces are now {interfaces:?}, tc programs on {:?}",
                self.tc_interfaces
            ));
        }
        match local_addresses() {
            Ok(local) if local != self.node.local => {
                return Some(format!("the node's addresses changed to {local:?}"));
            }
            _ => {}
        }
        if self.last_count_check.is_some_and(|at| at.elapsed() < COUNT_INTERVAL) {
            return None;
        }
        self.last_count_check = Some(Instant::now());
        let expected: usize = self.record.values().map(|w| w.entries.frontends.len()).sum();
        let lb = self.lb.as_ref().expect("opened");
        let found = lb.services.keys().count();
        (found != expected).then(|| format!("the services map holds {found} entries, svcplane wrote {expected}"))
    }

    fn render(&self, plan: &NodePlan) -> Result<String, DataplaneError> {
        let node = NodeAddresses { local: local_addresses().unwrap_or_else(|_| plan.config.node_ips.clone()) };
        Ok(render_text(plan, &node))
    }

    fn cleanup(&mut self) -> Result<bool, DataplaneError> {
        // Objects being opened ahead are opened (and pinned) first, then removed with the rest.
        if let Some(opening) = self.ahead.take() {
            opening.wait();
        }
        self.lb = None;
        self.tc = None;
        self.record.clear();
        self.usage = MapUsage::default();
        self.slots = Ranges::new(self.options.sizes.backends);
        self.full_pending = true;
        Ok(svcplane_bpf::cleanup(&self.options.bpf_root)?)
    }
}
