//! The tc half of eBPF mode: `bpf/tc_nat.c` loaded once per bpf root (sharing the services,
//! backends and affinity maps with the socket programs through their pins), attached with
//! tcx to the ingress of each of the node's interfaces through links pinned under
//! `<bpf root>/links/tc-<interface>`, so they outlive the process like the socket links.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashOfMaps, MapData};
use aya::programs::links::FdLink;
use aya::programs::{SchedClassifier, TcAttachType};
use ipnet::IpNet;

use crate::maps::{ServiceKey, address_bytes, typed};
use crate::{BpfError, MapSizes, TC_NAT_OBJECT};

pub use crate::maps::{CLUSTER_CIDRS_MAP, CT_MAP, MAGLEV_MAP, SOURCE_RANGES_MAP, TC_CONFIG_MAP};
/// Every map only the tc program has.
pub const TC_MAPS: [&str; 5] = [TC_CONFIG_MAP, CLUSTER_CIDRS_MAP, SOURCE_RANGES_MAP, CT_MAP, MAGLEV_MAP];
const PROGRAM: &str = "svcplane_tc_ingress";
const LINK_PREFIX: &str = "tc-";
/// linux/bpf.h: an inner map whose size may differ from the template's (tables of any
/// prime size fit the outer map); the flags of a map put into the outer map must match
/// the template's.
const BPF_F_INNER_MAP: u32 = 1 << 12;

/// The node's addresses the tc program translates sources to (`struct tc_config`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcConfig {
    pub node_v4: [u8; 16],
    pub node_v6: [u8; 16],
    pub maglev_size: u32,
    /// [`TcConfig::DIRECT_SERVER_RETURN`] or nothing.
    pub flags: u32,
}

impl TcConfig {
    /// External traffic the plan masquerades is not SNATed: a flow to another node's
    /// endpoint carries the Service address to that node, which answers the client from it.
    pub const DIRECT_SERVER_RETURN: u32 = 1;
}

/// A source-range entry's data (`struct range_key` after its prefix length).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RangeData {
    pub frontend: [u8; 16],
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
    pub source: [u8; 16],
}

const _: () = {
    assert!(size_of::<TcConfig>() == 40);
    assert!(size_of::<RangeData>() == 36);
};

/// Bits of an address as the maps store it (IPv4 mapped: 96 more).
fn stored_prefix(net: &IpNet) -> u32 {
    match net {
        IpNet::V4(v4) => 96 + u32::from(v4.prefix_len()),
        IpNet::V6(v6) => u32::from(v6.prefix_len()),
    }
}

/// The loaded tc program and its own maps.
pub struct TcNat {
    /// The object with its program, once loaded ([`TcNat::with_program`]).
    ebpf: Option<Ebpf>,
    bpf_root: PathBuf,
    config: Array<MapData, TcConfig>,
    cluster_cidrs: LpmTrie<MapData, [u8; 16], u8>,
    source_ranges: LpmTrie<MapData, RangeData, u8>,
    maglev: HashOfMaps<MapData, u32, Array<MapData, u32>>,
    /// The same outer map, untyped, for batched updates.
    maglev_outer: MapData,
    maglev_size: u32,
    /// Whether external flows use direct server return ([`TcConfig::DIRECT_SERVER_RETURN`]).
    direct_server_return: bool,
    /// Entries of `cluster_cidrs` written so far.
    written_cidrs: Vec<IpNet>,
    /// Whether links already pinned run an earlier build's program and move onto this one.
    replacing: bool,
}

impl std::fmt::Debug for TcNat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcNat").field("bpf_root", &self.bpf_root).field("cluster_cidrs", &self.written_cidrs).finish()
    }
}

impl TcNat {
    /// Creates the tc program's flow table ([`CT_MAP`], an LRU hash of `sizes.reverse`
    /// entries) and pins it where opening the tc object adopts it, so that its creation
    /// (~20 ms at the default size: the kernel preallocates every entry) can run before, and
    /// beside, the opening of the socket object the tc object waits for. Only on a fresh
    /// root: with links pinned, a map created now would hide from the upgrade check that
    /// the linked programs hold another one. Returns whether it made the table.
    pub fn create_flow_table_ahead(bpf_root: &Path, sizes: MapSizes) -> Result<bool, BpfError> {
        let pin = bpf_root.join(CT_MAP);
        if !crate::sys::is_bpffs(bpf_root) || crate::sys::any_link_pinned(bpf_root) || pin.exists() {
            return Ok(false);
        }
        let failed = |what: String, source: Box<dyn std::error::Error + Send + Sync>| BpfError::Io {
            what: format!("BPF map {CT_MAP}: {what}"),
            source: std::io::Error::other(source),
        };
        let mut parsed = aya_obj::Object::parse(TC_NAT_OBJECT)
            .map_err(|source| failed("parsing the embedded tc_nat.o for its definition".into(), Box::new(source)))?;
        let mut definition = parsed
            .maps
            .remove(CT_MAP)
            .ok_or_else(|| failed("finding its definition".into(), "not in tc_nat.o".into()))?;
        definition.set_max_entries(sizes.reverse);
        // Made without the object's BTF (loaded with the object, later): its type ids would
        // name nothing. The layout check compares type, sizes and flags only.
        if let aya_obj::Map::Btf(map) = &mut definition {
            map.def.btf_key_type_id = 0;
            map.def.btf_value_type_id = 0;
        }
        let map = MapData::create(definition, CT_MAP, None).map_err(|source| BpfError::Map {
            map: CT_MAP,
            what: "creating it ahead of the tc object".into(),
            source: Box::new(source),
        })?;
        map.pin(&pin).map_err(|source| failed(format!("pinning it at {}", pin.display()), Box::new(source)))?;
        Ok(true)
    }

    /// Loads the program against the pins under `bpf_root` (the socket balancer's maps must
    /// be pinned there already: [`crate::SockLb::open`] first).
    pub fn open(bpf_root: &Path, sizes: MapSizes, maglev_size: u32) -> Result<Self, BpfError> {
        let (tc, program) = Self::open_maps(bpf_root, sizes, maglev_size)?;
        Ok(tc.with_program(program.load()?))
    }

    /// The first half of [`TcNat::open`]: the object is read and its maps opened (adopted
    /// by their pins where they exist), the program not loaded yet: [`TcProgram::load`]
    /// (on another thread if need be), then [`TcNat::with_program`]. Until then the maps
    /// can be written, but nothing can be attached.
    pub fn open_maps(bpf_root: &Path, sizes: MapSizes, maglev_size: u32) -> Result<(Self, TcProgram), BpfError> {
        let replacing = crate::upgrade::must_replace_linked_programs(bpf_root, sizes);
        Self::open_maps_replacing(bpf_root, sizes, maglev_size, replacing)
    }

    /// [`TcNat::open_maps`], told whether links already pinned move onto this program
    /// ([`crate::upgrade::must_replace_linked_programs`], decided before the socket
    /// balancer opened: it may have created shared maps anew since).
    pub fn open_maps_replacing(
        bpf_root: &Path,
        sizes: MapSizes,
        maglev_size: u32,
        replacing: bool,
    ) -> Result<(Self, TcProgram), BpfError> {
        let mut loader = crate::ObjectLoader::new(bpf_root, sizes);
        Self::open_maps_with(&mut loader, bpf_root, sizes, maglev_size, replacing)
    }

    /// [`TcNat::open_maps_replacing`] with a loader made for `bpf_root` and `sizes` (the one
    /// the socket balancer was opened with: [`crate::ObjectLoader`]).
    pub fn open_maps_with(
        loader: &mut crate::ObjectLoader,
        bpf_root: &Path,
        sizes: MapSizes,
        maglev_size: u32,
        replacing: bool,
    ) -> Result<(Self, TcProgram), BpfError> {
        // The maps shared with the socket balancer were checked when it opened.
        crate::upgrade::unpin_changed_maps(bpf_root, TC_NAT_OBJECT, "tc_nat.o", sizes, &TC_MAPS)?;
        let mut ebpf = loader.open(TC_NAT_OBJECT, "tc_nat.o")?;
        let config = typed(&mut ebpf, TC_CONFIG_MAP)?;
        let cluster_cidrs = typed(&mut ebpf, CLUSTER_CIDRS_MAP)?;
        let source_ranges = typed(&mut ebpf, SOURCE_RANGES_MAP)?;
        let maglev = typed(&mut ebpf, MAGLEV_MAP)?;
        let maglev_outer = MapData::from_pin(bpf_root.join(MAGLEV_MAP)).map_err(|source| BpfError::Map {
            map: MAGLEV_MAP,
            what: "opening its pin for batched updates".into(),
            source: Box::new(source),
        })?;
        let tc = Self {
            maglev_outer,
            ebpf: None,
            bpf_root: bpf_root.to_owned(),
            config,
            cluster_cidrs,
            source_ranges,
            maglev,
            maglev_size,
            direct_server_return: false,
            written_cidrs: Vec::new(),
            replacing,
        };
        Ok((tc, TcProgram { ebpf }))
    }

    /// Takes the program [`TcProgram::load`] loaded for these maps.
    pub fn with_program(mut self, program: TcProgram) -> Self {
        self.ebpf = Some(program.ebpf);
        self
    }

    fn program(&mut self) -> Result<&mut SchedClassifier, BpfError> {
        let ebpf = self.ebpf.as_mut().ok_or(BpfError::Link {
            program: PROGRAM,
            what: "not loaded yet",
            source: "TcNat::with_program was not called".into(),
        })?;
        classifier(ebpf)
    }

    /// External flows to other nodes' endpoints go by direct server return instead of SNAT
    /// (from the next [`TcNat::configure`] on).
    pub fn with_direct_server_return(mut self, on: bool) -> Self {
        self.direct_server_return = on;
        self
    }

    /// Attaches the program to `interface`'s ingress unless a pinned link already does; a
    /// link an earlier build pinned is moved onto this program (`BPF_LINK_UPDATE`,
    /// atomically). Returns whether it attached or moved a link.
    pub fn attach(&mut self, interface: &str) -> Result<bool, BpfError> {
        let links = self.bpf_root.join(crate::sys::LINKS_DIR);
        let pin = links.join(format!("{LINK_PREFIX}{interface}"));
        if pin.exists() {
            if !self.replacing {
                return Ok(false);
            }
            use std::os::fd::AsFd;
            let program = self.program()?;
            let fd = program.fd().map_err(|source| BpfError::Program {
                program: PROGRAM,
                what: "not loaded",
                source: Box::new(source),
            })?;
            crate::upgrade::update_pinned_link(&pin, fd.as_fd(), PROGRAM)?;
            return Ok(true);
        }
        std::fs::create_dir_all(&links).map_err(|source| BpfError::BpfFs {
            path: links.clone(),
            what: "creating the links directory",
            source,
        })?;
        let program = self.program()?;
        let id = program.attach(interface, TcAttachType::Ingress).map_err(|source| BpfError::Program {
            program: PROGRAM,
            what: "attaching to an interface's ingress (tcx)",
            source: Box::new(source),
        })?;
        let link = program.take_link(id).map_err(|source| BpfError::Program {
            program: PROGRAM,
            what: "taking its link",
            source: Box::new(source),
        })?;
        let link: FdLink = link.try_into().map_err(|source| BpfError::Link {
            program: PROGRAM,
            what: "not a BPF link (tcx needs Linux 6.6)",
            source: Box::new(source),
        })?;
        link.pin(&pin).map_err(|source| BpfError::Link {
            program: PROGRAM,
            what: "pinning",
            source: Box::new(source),
        })?;
        Ok(true)
    }

    /// The node's addresses external flows are translated to, and the cluster CIDRs whose
    /// sources are pods.
    pub fn configure(&mut self, node_ips: &[IpAddr], cluster_cidrs: &[IpNet]) -> Result<(), BpfError> {
        let flags = if self.direct_server_return { TcConfig::DIRECT_SERVER_RETURN } else { 0 };
        let mut config = TcConfig { maglev_size: self.maglev_size, flags, ..TcConfig::default() };
        if let Some(v4) = node_ips.iter().find(|ip| ip.is_ipv4()) {
            config.node_v4 = address_bytes(*v4);
        }
        if let Some(v6) = node_ips.iter().find(|ip| ip.is_ipv6()) {
            config.node_v6 = address_bytes(*v6);
        }
        self.config.set(0, config, 0).map_err(|source| BpfError::Map {
            map: TC_CONFIG_MAP,
            what: "writing the node's addresses".into(),
            source: Box::new(source),
        })?;
        for cidr in cluster_cidrs {
            let key = Key::new(stored_prefix(cidr), address_bytes(cidr.network()));
            self.cluster_cidrs.insert(&key, 1, 0).map_err(|source| BpfError::Map {
                map: CLUSTER_CIDRS_MAP,
                what: format!("adding {cidr}"),
                source: Box::new(source),
            })?;
        }
        for old in self.written_cidrs.iter().filter(|c| !cluster_cidrs.contains(c)) {
            let _ = self.cluster_cidrs.remove(&Key::new(stored_prefix(old), address_bytes(old.network())));
        }
        self.written_cidrs = cluster_cidrs.to_vec();
        Ok(())
    }

    fn range_key(frontend: &ServiceKey, source: &IpNet) -> Key<RangeData> {
        let data = RangeData {
            frontend: frontend.addr,
            port: frontend.port,
            proto: frontend.proto,
            pad: 0,
            source: address_bytes(source.network()),
        };
        Key::new(160 + stored_prefix(source), data)
    }

    /// Lets `source` use the external frontend `frontend`.
    pub fn allow_source(&mut self, frontend: &ServiceKey, source: &IpNet) -> Result<(), BpfError> {
        self.source_ranges.insert(&Self::range_key(frontend, source), 1, 0).map_err(|source_error| BpfError::Map {
            map: SOURCE_RANGES_MAP,
            what: format!("allowing {source} to {frontend:?}"),
            source: Box::new(source_error),
        })
    }

    /// Runs the program once on a crafted Ethernet frame (`BPF_PROG_TEST_RUN`): its verdict
    /// (`TC_ACT_*`) and the frame as it left.
    pub fn test_run(&mut self, frame: &[u8]) -> Result<(u32, Vec<u8>), BpfError> {
        use std::os::fd::AsFd;
        let program = self.program()?;
        let fd = program.fd().map_err(|source| BpfError::Program {
            program: PROGRAM,
            what: "not loaded",
            source: Box::new(source),
        })?;
        crate::sys::prog_test_run(fd.as_fd(), frame)
            .map_err(|source| BpfError::Io { what: "BPF_PROG_TEST_RUN of the tc program".into(), source })
    }

    /// Replaces the Maglev table of endpoint set `set` with one built for `endpoints` (in
    /// slot order): a new table is filled, then swapped in with one update.
    pub fn set_maglev(&mut self, set: u32, endpoints: &[std::net::SocketAddr]) -> Result<(), BpfError> {
        let entries = crate::maglev::table(endpoints, self.maglev_size);
        let failed = |what: &str, source: aya::maps::MapError| BpfError::Map {
            map: MAGLEV_MAP,
            what: format!("{what} for endpoint set {set}"),
            source: Box::new(source),
        };
        let table: Array<MapData, u32> =
            Array::create(self.maglev_size, BPF_F_INNER_MAP).map_err(|source| failed("creating a table", source))?;
        let indexes: Vec<u32> = (0..self.maglev_size).collect();
        crate::sys::update_batch(aya::maps::IterableMap::map(&table), &indexes, &entries)
            .map_err(|source| BpfError::Io { what: format!("filling the Maglev table of set {set}"), source })?;
        self.maglev.insert(set, &table, 0).map_err(|source| failed("swapping the table in", source))
    }

    /// [`TcNat::set_maglev`] for many sets at once: the tables are built and filled, then
    /// swapped in with one batched update. (The kernel waits for an RCU grace period after
    /// every update of a map of maps, ~10 ms; a batch waits once.)
    pub fn set_maglev_many(&mut self, tables: &[(u32, &[std::net::SocketAddr])]) -> Result<(), BpfError> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut built = Vec::with_capacity(tables.len());
        for (set, endpoints) in tables {
            let entries = crate::maglev::table(endpoints, self.maglev_size);
            let table: Array<MapData, u32> =
                Array::create(self.maglev_size, BPF_F_INNER_MAP).map_err(|source| BpfError::Map {
                    map: MAGLEV_MAP,
                    what: format!("creating a table for set {set}"),
                    source: Box::new(source),
                })?;
            let indexes: Vec<u32> = (0..self.maglev_size).collect();
            crate::sys::update_batch(aya::maps::IterableMap::map(&table), &indexes, &entries)
                .map_err(|source| BpfError::Io { what: format!("filling the Maglev table of set {set}"), source })?;
            built.push(table);
        }
        let keys: Vec<u32> = tables.iter().map(|(set, _)| *set).collect();
        let fds: Vec<u32> =
            built.iter().map(|table| aya::maps::IterableMap::map(table).fd().as_fd().as_raw_fd() as u32).collect();
        crate::sys::update_batch(&self.maglev_outer, &keys, &fds)
            .map_err(|source| BpfError::Io { what: "swapping Maglev tables in".into(), source })
    }

    /// Drops the Maglev table of endpoint set `set` (flows to it are then picked at random).
    pub fn remove_maglev(&mut self, set: u32) {
        let _ = self.maglev.remove(&set);
    }

    /// The endpoint sets that have a Maglev table.
    pub fn maglev_sets(&self) -> Vec<u32> {
        self.maglev.keys().filter_map(Result::ok).collect()
    }

    /// Every (frontend, source range) the map allows now.
    pub fn allowed_sources(&self) -> Vec<(ServiceKey, IpNet)> {
        self.source_ranges
            .keys()
            .filter_map(Result::ok)
            .filter_map(|key| {
                let data = key.data();
                let bits = key.prefix_len().checked_sub(160)?;
                let frontend = ServiceKey {
                    addr: data.frontend,
                    port: data.port,
                    proto: data.proto,
                    scope: crate::Scope::External as u8,
                };
                let address = crate::maps::address_of(data.source);
                let length = if address.is_ipv4() { bits.checked_sub(96)? } else { bits };
                Some((frontend, IpNet::new(address, u8::try_from(length).ok()?).ok()?))
            })
            .collect()
    }

    /// Withdraws [`TcNat::allow_source`].
    pub fn disallow_source(&mut self, frontend: &ServiceKey, source: &IpNet) {
        let _ = self.source_ranges.remove(&Self::range_key(frontend, source));
    }
}

/// The tc program of a [`TcNat`], not loaded yet.
pub struct TcProgram {
    ebpf: Ebpf,
}

impl std::fmt::Debug for TcProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcProgram").finish_non_exhaustive()
    }
}

impl TcProgram {
    /// Loads the program (the verifier checks it). The [`TcNat`] opened with it must still
    /// be alive: the program refers to its maps by file descriptor.
    pub fn load(mut self) -> Result<Self, BpfError> {
        classifier(&mut self.ebpf)?.load().map_err(|source| BpfError::Program {
            program: PROGRAM,
            what: "loading (the verifier said no?)",
            source: Box::new(source),
        })?;
        Ok(self)
    }
}

/// The tc program of a loaded `tc_nat.o`.
fn classifier(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, BpfError> {
    ebpf.program_mut(PROGRAM)
        .ok_or(BpfError::Link { program: PROGRAM, what: "missing from the object", source: "no such program".into() })?
        .try_into()
        .map_err(|source| BpfError::Program { program: PROGRAM, what: "not a tc program", source: Box::new(source) })
}

/// The node's interfaces the program belongs on: every one of the calling thread's network
/// namespace but loopback.
pub fn node_interfaces() -> Result<Vec<String>, BpfError> {
    let interfaces = nix::net::if_::if_nameindex()
        .map_err(|errno| BpfError::Io { what: "listing the node's interfaces".into(), source: errno.into() })?;
    let mut names: Vec<String> = interfaces
        .iter()
        .map(|interface| interface.name().to_string_lossy().into_owned())
        .filter(|name| name != "lo")
        .collect();
    names.sort();
    Ok(names)
}

/// The tc links pinned under `bpf_root`, by interface name.
pub fn pinned_interfaces(bpf_root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(bpf_root.join(crate::sys::LINKS_DIR)) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.strip_prefix(LINK_PREFIX).map(str::to_owned))
        .collect();
    names.sort();
    names
}
