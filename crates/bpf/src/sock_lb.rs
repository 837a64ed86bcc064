//! The socket-level balancer: `bpf/sock_lb.c` loaded once per bpf root, its maps pinned
//! there, its nine programs attached to one cgroup v2 directory through BPF links pinned
//! there too, so they outlive the process. A later process with the same root adopts
//! them: the maps are reused by their pins and programs already linked are not attached
//! again.

use std::fs::File;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::{Array, HashMap, Map, MapData};
use aya::programs::links::FdLink;
use aya::programs::{CgroupAttachMode, Program};

use crate::maps::typed;
use crate::maps::{
    AFFINITY_MAP, AffinityKey, AffinityValue, BACKENDS_MAP, BackendValue, CONFIG_MAP, Config, LIVE_MAP, LiveKey,
    RevKey, RevValue, SERVICES_MAP, SOCK_LB_MAPS, ServiceKey, ServiceValue,
};
use crate::{BpfError, SOCK_LB_OBJECT, sys};

/// The programs of `sock_lb.c`, by function name: eight cgroup sock_addr programs, then
/// the cgroup sock program that forgets a released TCP socket's translation.
pub const PROGRAMS: [&str; 9] = [
    "svcplane_connect4",
    "svcplane_sendmsg4",
    "svcplane_recvmsg4",
    "svcplane_getpeername4",
    "svcplane_connect6",
    "svcplane_sendmsg6",
    "svcplane_recvmsg6",
    "svcplane_getpeername6",
    "svcplane_sock_release",
];

/// Where pinned links live under the bpf root.
use crate::sys::LINKS_DIR;

/// Map capacities (entries). `backends` also sizes the live-endpoint map; `reverse` sizes
/// the connection-state maps: UDP flows and TCP sockets' reverse translations here, the tc
/// program's tracking map. (UDP sockets' reverse translations live in each socket's own
/// storage and have no size.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    pub services: u32,
    pub backends: u32,
    pub affinity: u32,
    pub reverse: u32,
}

impl Default for MapSizes {
    /// Fit for 64k backends: every frontend has two scopes (node, pod).
    fn default() -> Self {
        Self { services: 131_072, backends: 131_072, affinity: 65_536, reverse: 262_144 }
    }
}

/// Where to pin and what to attach to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SockLbOptions {
    /// A directory on a bpffs (mounted there if it is not one).
    pub bpf_root: PathBuf,
    /// The cgroup v2 directory whose processes are balanced.
    pub cgroup: PathBuf,
    pub sizes: MapSizes,
}

/// The loaded, attached balancer and its maps.
pub struct SockLb {
    pub services: ServicesMap,
    pub backends: BackendsMap,
    pub affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    /// The node's own connected UDP sockets the balancer connected, by cookie and endpoint:
    /// the Service address each asked for (the sockets to close when their endpoint goes).
    /// The reverse translations of every socket live in `svcplane_tcp_rev` and in UDP
    /// sockets' own storage (`svcplane_sock_rev`), which only the programs read.
    pub udp_sockets: HashMap<MapData, RevKey, RevValue>,
    /// Endpoints UDP flows may stay on (value unused, 1).
    pub live: HashMap<MapData, LiveKey, u32>,
    /// The names of service port ids, for counter readers.
    pub names: PortNamesMap,
    /// The same three maps again, untyped, for batched writes ([`crate::sys::update_batch`]).
    pub batch: BatchMaps,
    /// The backends array, mapped: new ranges are written as memory.
    pub slots: sys::MappedArray,
    pub sizes: MapSizes,
    /// Whether programs were already linked by an earlier process (adopted, not attached).
    pub adopted: bool,
    /// Whether the linked programs are being replaced by this build's
    /// ([`crate::upgrade::must_replace_linked_programs`], decided when the maps were opened).
    pub replacing: bool,
}

impl std::fmt::Debug for SockLb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SockLb")
            .field("sizes", &self.sizes)
            .field("adopted", &self.adopted)
            .field("replacing", &self.replacing)
            .finish_non_exhaustive()
    }
}

impl SockLb {
    /// Loads (or adopts) the balancer under `options.bpf_root` and attaches it to
    /// `options.cgroup` if it is not attached yet. `host_netns_cookie` is the cookie of the
    /// node's own network namespace (sockets there are the node, others are pods).
    pub fn open(options: &SockLbOptions, host_netns_cookie: u64) -> Result<Self, BpfError> {
        let (mut lb, programs) = Self::open_maps(options, host_netns_cookie)?;
        lb.adopted = programs.attach()?;
        Ok(lb)
    }

    /// The first half of [`SockLb::open`]: the object is read and its maps created (or
    /// adopted by their pins), so they can be filled at once; the programs are loaded and
    /// attached by [`SockPrograms::attach`], which may run on another thread meanwhile
    /// (the verifier's work is most of a cold start). `adopted` is false until then.
    pub fn open_maps(options: &SockLbOptions, host_netns_cookie: u64) -> Result<(Self, SockPrograms), BpfError> {
        let mut loader = crate::ObjectLoader::new(&options.bpf_root, options.sizes);
        Self::open_maps_with(&mut loader, options, host_netns_cookie)
    }

    /// [`SockLb::open_maps`] with a loader made for `options` (to open the tc object with
    /// afterwards: [`crate::ObjectLoader`]).
    pub fn open_maps_with(
        loader: &mut crate::ObjectLoader,
        options: &SockLbOptions,
        host_netns_cookie: u64,
    ) -> Result<(Self, SockPrograms), BpfError> {
        let cgroup = File::open(&options.cgroup).map_err(|source| BpfError::Cgroup {
            path: options.cgroup.clone(),
            what: "opening it (it must exist on a cgroup2 mount)",
            source,
        })?;
        sys::ensure_bpffs(&options.bpf_root)?;
        let links_dir = options.bpf_root.join(LINKS_DIR);
        std::fs::create_dir_all(&links_dir).map_err(|source| BpfError::BpfFs {
            path: links_dir.clone(),
            what: "creating the links directory",
            source,
        })?;
        let sizes = options.sizes;
        // Decided before anything changes under the root: whether the linked programs are
        // an earlier build's (or use maps about to be created anew).
        let replacing = crate::upgrade::must_replace_linked_programs(&options.bpf_root, sizes);
        crate::upgrade::unpin_changed_maps(&options.bpf_root, SOCK_LB_OBJECT, "sock_lb.o", sizes, &SOCK_LB_MAPS)?;
        let mut ebpf = loader.open(SOCK_LB_OBJECT, "sock_lb.o")?;

        let mut config: Array<MapData, Config> = typed(&mut ebpf, CONFIG_MAP)?;
        config.set(0, Config { host_netns_cookie }, 0).map_err(|source| BpfError::Map {
            map: CONFIG_MAP,
            what: "writing the node's netns cookie".into(),
            source: Box::new(source),
        })?;

        let pinned = |name: &'static str| {
            MapData::from_pin(options.bpf_root.join(name)).map_err(|source| BpfError::Map {
                map: name,
                what: "opening its pin for batched writes".into(),
                source: Box::new(source),
            })
        };
        let batch =
            BatchMaps { services: pinned(SERVICES_MAP)?, backends: pinned(BACKENDS_MAP)?, live: pinned(LIVE_MAP)? };
        // The programs name these maps by file descriptor: the returned `SockLb` keeps them
        // open, and must live until the programs are loaded.
        let slots = sys::MappedArray::new(&batch.backends, sizes.backends, size_of::<BackendValue>())
            .map_err(|source| BpfError::Io { what: format!("mapping {BACKENDS_MAP} into memory"), source })?;
        let lb = Self {
            slots,
            batch,
            services: typed(&mut ebpf, SERVICES_MAP)?,
            backends: typed(&mut ebpf, BACKENDS_MAP)?,
            affinity: typed(&mut ebpf, AFFINITY_MAP)?,
            udp_sockets: typed(&mut ebpf, crate::maps::UDP_SOCKETS_MAP)?,
            live: typed(&mut ebpf, LIVE_MAP)?,
            names: typed(&mut ebpf, crate::maps::PORT_NAMES_MAP)?,
            sizes,
            adopted: false,
            replacing,
        };
        Ok((lb, SockPrograms { ebpf, cgroup, links_dir, replacing, _config: config }))
    }
}

/// The programs of a [`SockLb`] whose maps are open, not yet loaded nor attached.
pub struct SockPrograms {
    ebpf: Ebpf,
    cgroup: File,
    links_dir: PathBuf,
    /// Whether links already pinned move onto this object's programs.
    replacing: bool,
    /// Kept open until the programs are loaded (they refer to it).
    _config: Array<MapData, Config>,
}

impl std::fmt::Debug for SockPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SockPrograms").field("links_dir", &self.links_dir).finish_non_exhaustive()
    }
}

impl SockPrograms {
    /// Loads and attaches every program no pinned link attaches yet (a link pinned by an
    /// earlier process is kept: nothing is attached twice), and moves links pinned by an
    /// earlier build onto this build's programs at once. Returns whether every program
    /// was already linked (adopted). The [`SockLb`] opened with these programs must still be
    /// alive (it holds the maps they refer to).
    pub fn attach(self) -> Result<bool, BpfError> {
        let (adopted, staged) = self.attach_staging_replacements()?;
        if let Some(staged) = staged {
            staged.swap()?;
        }
        Ok(adopted)
    }

    /// [`SockPrograms::attach`], except that links an earlier build pinned are not moved
    /// yet: their new programs are loaded and handed back, to be swapped in with
    /// [`StagedPrograms::swap`] once the maps are filled. Returns whether every program was
    /// already linked, and the programs to swap in (`None` when nothing is replaced).
    pub fn attach_staging_replacements(mut self) -> Result<(bool, Option<StagedPrograms>), BpfError> {
        let mut adopted = true;
        let mut staged = Vec::new();
        for program in PROGRAMS {
            let pin = self.links_dir.join(program);
            if pin.exists() {
                if self.replacing {
                    load(&mut self.ebpf, program)?;
                    staged.push((program, pin));
                }
                continue;
            }
            adopted = false;
            attach(&mut self.ebpf, program, &self.cgroup, &pin)?;
        }
        let staged = (!staged.is_empty()).then_some(StagedPrograms { ebpf: self.ebpf, links: staged });
        Ok((adopted, staged))
    }
}

/// Socket programs loaded to replace the ones pinned links run ([`SockPrograms::attach_staging_replacements`]).
pub struct StagedPrograms {
    ebpf: Ebpf,
    links: Vec<(&'static str, PathBuf)>,
}

impl std::fmt::Debug for StagedPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedPrograms").field("links", &self.links).finish_non_exhaustive()
    }
}

impl StagedPrograms {
    /// Moves every pinned link onto its new program (`BPF_LINK_UPDATE`, one link at a
    /// time, each atomically). Returns how many links moved.
    pub fn swap(self) -> Result<usize, BpfError> {
        use std::os::fd::AsFd;
        for (program, pin) in &self.links {
            let loaded = self.ebpf.program(program).ok_or(BpfError::Link {
                program,
                what: "missing from the object",
                source: "no such program".into(),
            })?;
            let fd = loaded.fd().map_err(|source| BpfError::Program {
                program,
                what: "not loaded",
                source: Box::new(source),
            })?;
            crate::upgrade::update_pinned_link(pin, fd.as_fd(), program)?;
        }
        Ok(self.links.len())
    }
}

/// Untyped handles of the maps a full sync fills in bulk.
#[derive(Debug)]
pub struct BatchMaps {
    pub services: MapData,
    pub backends: MapData,
    pub live: MapData,
}

/// Loads `program` (the verifier checks it).
fn load<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut Program, BpfError> {
    let prog = ebpf.program_mut(program).ok_or(BpfError::Link {
        program,
        what: "missing from the object",
        source: "no such program".into(),
    })?;
    let loaded = match prog {
        Program::CgroupSockAddr(prog) => prog.load(),
        Program::CgroupSock(prog) => prog.load(),
        _ => {
            return Err(BpfError::Link {
                program,
                what: "not a cgroup sock_addr or sock program",
                source: "unexpected program type".into(),
            });
        }
    };
    loaded.map_err(|source| BpfError::Program {
        program,
        what: "loading (the verifier said no?)",
        source: Box::new(source),
    })?;
    Ok(prog)
}

fn attach(ebpf: &mut Ebpf, program: &'static str, cgroup: &File, pin: &Path) -> Result<(), BpfError> {
    let attaching = |source| BpfError::Program { program, what: "attaching to the cgroup", source: Box::new(source) };
    let taking = |source| BpfError::Program { program, what: "taking its link", source: Box::new(source) };
    let link: FdLink = match load(ebpf, program)? {
        Program::CgroupSockAddr(prog) => {
            let id = prog.attach(cgroup, CgroupAttachMode::Single).map_err(attaching)?;
            prog.take_link(id).map_err(taking)?.try_into()
        }
        Program::CgroupSock(prog) => {
            let id = prog.attach(cgroup, CgroupAttachMode::Single).map_err(attaching)?;
            prog.take_link(id).map_err(taking)?.try_into()
        }
        _ => unreachable!("load() accepts only these two kinds"),
    }
    .map_err(|source| BpfError::Link { program, what: "not a BPF link", source: Box::new(source) })?;
    link.pin(pin).map_err(|source| BpfError::Link { program, what: "pinning", source: Box::new(source) })?;
    Ok(())
}

/// The services map, typed.
pub type ServicesMap = HashMap<MapData, ServiceKey, ServiceValue>;
/// The backends map, typed: slot `first + i` of a frontend's set at index `first + i`.
pub type BackendsMap = Array<MapData, BackendValue>;
/// The names of service port ids (`svcplane_port_names`), as [`SockLb::names`] holds them.
pub type PortNamesMap = HashMap<MapData, u32, crate::maps::PortName>;

/// Opens the pinned maps of a running or stopped balancer, without loading anything.
pub fn open_pinned_services(bpf_root: &Path) -> Result<(ServicesMap, BackendsMap), BpfError> {
    let open = |name: &'static str| {
        MapData::from_pin(bpf_root.join(name)).map_err(|source| BpfError::Map {
            map: name,
            what: format!("opening its pin in {}", bpf_root.display()),
            source: Box::new(source),
        })
    };
    let services = HashMap::try_from(Map::HashMap(open(SERVICES_MAP)?)).map_err(|source| BpfError::Map {
        map: SERVICES_MAP,
        what: "typing".into(),
        source: Box::new(source),
    })?;
    let backends = Array::try_from(Map::Array(open(BACKENDS_MAP)?)).map_err(|source| BpfError::Map {
        map: BACKENDS_MAP,
        what: "typing".into(),
        source: Box::new(source),
    })?;
    Ok((services, backends))
}

/// Every endpoint's connection counter under `bpf_root`, with its service port's name and
/// protocol number (`None` for a port id without a name: written before its name, or left
/// by a port just removed).
pub fn read_counters(bpf_root: &Path) -> Result<Vec<(Option<crate::maps::PortName>, LiveKey, u64)>, BpfError> {
    use crate::maps::{COUNTERS_MAP, PORT_NAMES_MAP, PortName};
    let open = |name: &'static str| {
        MapData::from_pin(bpf_root.join(name)).map_err(|source| BpfError::Map {
            map: name,
            what: format!("opening its pin in {} (is eBPF mode running with this --bpf-root?)", bpf_root.display()),
            source: Box::new(source),
        })
    };
    let typing =
        |name: &'static str| move |source| BpfError::Map { map: name, what: "typing".into(), source: Box::new(source) };
    let counters: HashMap<MapData, LiveKey, u64> =
        HashMap::try_from(Map::HashMap(open(COUNTERS_MAP)?)).map_err(typing(COUNTERS_MAP))?;
    let names: HashMap<MapData, u32, PortName> =
        HashMap::try_from(Map::HashMap(open(PORT_NAMES_MAP)?)).map_err(typing(PORT_NAMES_MAP))?;
    Ok(counters
        .iter()
        .filter_map(Result::ok)
        .map(|(key, count)| (names.get(&key.port_id, 0).ok(), key, count))
        .collect())
}

/// The pins a running balancer needs that are not there (someone removed them).
pub fn missing_pins(bpf_root: &Path) -> Vec<PathBuf> {
    let links = PROGRAMS.iter().map(|p| bpf_root.join(LINKS_DIR).join(p));
    let maps = SOCK_LB_MAPS.iter().map(|m| bpf_root.join(m));
    links.chain(maps).filter(|path| !path.exists()).collect()
}
