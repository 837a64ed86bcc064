//! Replacing the programs an earlier build left linked under a bpf root, in place.
//!
//! Links pinned under `<bpf root>/links` keep their programs attached across restarts, so a
//! new build that only adopted them would keep running the old build's programs. The build
//! that last linked its programs is recorded in a pinned map ([`BUILD_MAP`]) as an
//! [`identity`]: a hash of both embedded objects and the map sizes. A new process whose
//! identity differs (or that finds a map it had to create or recreate while links exist)
//! loads its own programs and moves every pinned link onto them with `BPF_LINK_UPDATE`,
//! which swaps a link's program atomically: every hook runs either the old program or the
//! new one, never none. Maps whose layout changed (type, key or value size, capacity,
//! flags) are unpinned before the objects are opened, so new ones are created in their
//! place and filled by the sync; the old programs keep theirs (they hold them) until their
//! links move.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use aya::maps::{Array, Map, MapData, MapInfo};

use crate::{BpfError, MapSizes, SOCK_LB_OBJECT, TC_NAT_OBJECT};

/// The pinned map holding the identity of the build whose programs are linked (one u64).
pub const BUILD_MAP: &str = "svcplane_build";

/// This build's identity for maps of `sizes`: FNV-1a over both objects' bytes and the
/// sizes (a map's capacity is part of its layout).
pub fn identity(sizes: MapSizes) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let sizes = [sizes.services, sizes.backends, sizes.affinity, sizes.reverse];
    let bytes = SOCK_LB_OBJECT
        .iter()
        .chain(TC_NAT_OBJECT.iter())
        .copied()
        .chain(sizes.iter().flat_map(|size| size.to_le_bytes()));
    for byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The identity recorded under `bpf_root`, if any.
pub fn recorded_identity(bpf_root: &Path) -> Option<u64> {
    let data = MapData::from_pin(bpf_root.join(BUILD_MAP)).ok()?;
    let map: Array<MapData, u64> = Array::try_from(Map::Array(data)).ok()?;
    map.get(&0, 0).ok()
}

/// Records `identity` under `bpf_root` (the build whose programs are linked now).
pub fn record_identity(bpf_root: &Path, identity: u64) -> Result<(), BpfError> {
    let failed = |what: &str, source: aya::maps::MapError| BpfError::Map {
        map: BUILD_MAP,
        what: what.to_owned(),
        source: Box::new(source),
    };
    let pin = bpf_root.join(BUILD_MAP);
    let mut map: Array<MapData, u64> = match MapData::from_pin(&pin) {
        Ok(data) => Array::try_from(Map::Array(data)).map_err(|source| failed("typing its pin", source))?,
        Err(_) => {
            let map = Array::create(1, 0).map_err(|source| failed("creating it", source))?;
            aya::maps::IterableMap::map(&map).pin(&pin).map_err(|source| BpfError::Io {
                what: format!("pinning {}", pin.display()),
                source: std::io::Error::other(source),
            })?;
            map
        }
    };
    map.set(0, identity, 0).map_err(|source| failed("writing the build identity", source))
}

/// Whether links pinned under `bpf_root` run programs this build must replace: some link
/// is pinned, and the recorded identity is not this build's for `sizes`, or one of the
/// maps the programs use is not pinned or not laid out as this build wants (it will be
/// created anew, and the linked programs hold the old one).
pub fn must_replace_linked_programs(bpf_root: &Path, sizes: MapSizes) -> bool {
    if !crate::sys::any_link_pinned(bpf_root) {
        return false;
    }
    if recorded_identity(bpf_root) != Some(identity(sizes)) {
        return true;
    }
    [(SOCK_LB_OBJECT, "sock_lb.o"), (TC_NAT_OBJECT, "tc_nat.o")].into_iter().any(|(object, name)| {
        expected_layouts(object, name, sizes).is_ok_and(|maps| {
            maps.iter().any(|(map, wanted)| {
                MapInfo::from_pin(bpf_root.join(map)).map(|info| Layout::of(&info)).ok() != Some(*wanted)
            })
        })
    })
}

/// What makes two maps interchangeable for a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
}

impl Layout {
    fn of(info: &MapInfo) -> Self {
        Self {
            map_type: info.map_type().map_or(u32::MAX, |t| t as u32),
            key_size: info.key_size(),
            value_size: info.value_size(),
            max_entries: info.max_entries(),
            flags: info.map_flags(),
        }
    }
}

/// Every map whose capacity follows [`MapSizes`]: the loader sets each to [`sized`].
pub(crate) const SIZED_MAPS: [&str; 9] = {
    use crate::maps::{
        AFFINITY_MAP, BACKENDS_MAP, COUNTERS_MAP, CT_MAP, LIVE_MAP, PORT_NAMES_MAP, SERVICES_MAP, TCP_REV_MAP,
        UDP_FLOWS_MAP,
    };
    [
        SERVICES_MAP,
        BACKENDS_MAP,
        LIVE_MAP,
        COUNTERS_MAP,
        PORT_NAMES_MAP,
        AFFINITY_MAP,
        UDP_FLOWS_MAP,
        CT_MAP,
        TCP_REV_MAP,
    ]
};

/// Which [`MapSizes`] field sizes a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SizeField {
    Services,
    Backends,
    Affinity,
    Reverse,
}

impl SizeField {
    fn of(name: &str) -> Option<Self> {
        use crate::maps::{
            AFFINITY_MAP, BACKENDS_MAP, COUNTERS_MAP, CT_MAP, LIVE_MAP, PORT_NAMES_MAP, SERVICES_MAP, TCP_REV_MAP,
            UDP_FLOWS_MAP,
        };
        match name {
            // A service port has a frontend in every scope, so there are fewer ports than
            // frontends.
            SERVICES_MAP | PORT_NAMES_MAP => Some(Self::Services),
            // Serving endpoints per service port are about as many as backend slots.
            BACKENDS_MAP | LIVE_MAP | COUNTERS_MAP => Some(Self::Backends),
            AFFINITY_MAP => Some(Self::Affinity),
            UDP_FLOWS_MAP | CT_MAP | TCP_REV_MAP => Some(Self::Reverse),
            _ => None,
        }
    }

    fn capacity(self, sizes: MapSizes) -> u32 {
        match self {
            Self::Services => sizes.services,
            Self::Backends => sizes.backends,
            Self::Affinity => sizes.affinity,
            Self::Reverse => sizes.reverse,
        }
    }

    /// The `svcplane proxy` option that sets the field.
    fn option(self) -> &'static str {
        match self {
            Self::Services => "--bpf-map-services",
            Self::Backends => "--bpf-map-backends",
            Self::Affinity => "--bpf-map-affinity",
            Self::Reverse => "--bpf-map-sockets",
        }
    }
}

/// The `svcplane proxy` option that sizes map `name` (the [`MapSizes`] field [`sized`]
/// reads for it), for messages that tell an operator what to raise.
pub fn size_option(name: &str) -> Option<&'static str> {
    SizeField::of(name).map(SizeField::option)
}

/// The capacity this crate gives map `name` for `sizes` (what the loader passes as
/// `map_max_entries`), if it sets one. The sync counts entries against the same figures.
pub fn sized(name: &str, sizes: MapSizes) -> Option<u32> {
    SizeField::of(name).map(|field| field.capacity(sizes))
}

/// The pinned maps of `object` with the layout this build gives them.
fn expected_layouts(object: &[u8], name: &'static str, sizes: MapSizes) -> Result<Vec<(String, Layout)>, BpfError> {
    let parsed = aya_obj::Object::parse(object).map_err(|source| BpfError::Io {
        what: format!("parsing the embedded object {name}"),
        source: std::io::Error::other(source),
    })?;
    Ok(parsed
        .maps
        .iter()
        .filter(|(_, map)| map.pinning() == aya_obj::maps::PinningType::ByName)
        .map(|(map_name, map)| {
            let layout = Layout {
                map_type: map.map_type(),
                key_size: map.key_size(),
                value_size: map.value_size(),
                max_entries: sized(map_name, sizes).unwrap_or_else(|| map.max_entries()),
                flags: map.map_flags(),
            };
            (map_name.clone(), layout)
        })
        .collect())
}

/// Unpins every map of `object` pinned under `bpf_root` whose layout is not the one this
/// build gives it, so that opening the object creates it anew; nothing is checked unless
/// one of `own_maps` (the maps this object is the first to open) is pinned. Programs still linked keep
/// the old map (they hold a reference) until their links move to the new programs.
/// Returns the names of the maps unpinned.
pub(crate) fn unpin_changed_maps(
    bpf_root: &Path,
    object: &[u8],
    name: &'static str,
    sizes: MapSizes,
    own_maps: &[&str],
) -> Result<Vec<String>, BpfError> {
    let mut unpinned = Vec::new();
    // A fresh root (the cold start of a node) has none of them: the object is not parsed.
    if !own_maps.iter().any(|map| bpf_root.join(map).exists()) {
        return Ok(unpinned);
    }
    for (map, wanted) in expected_layouts(object, name, sizes)? {
        let pin = bpf_root.join(&map);
        let Ok(info) = MapInfo::from_pin(&pin) else { continue };
        if Layout::of(&info) == wanted {
            continue;
        }
        std::fs::remove_file(&pin).map_err(|source| BpfError::Io {
            what: format!("unpinning {} (its layout changed: {:?}, now {wanted:?})", pin.display(), Layout::of(&info)),
            source,
        })?;
        unpinned.push(map);
    }
    Ok(unpinned)
}

/// Moves the link pinned at `pin` onto `program` (`BPF_LINK_UPDATE`: atomic, the hook never
/// runs without a program).
pub(crate) fn update_pinned_link(pin: &Path, program: BorrowedFd<'_>, name: &'static str) -> Result<(), BpfError> {
    let link = crate::sys::obj_get(pin).map_err(|source| BpfError::Link {
        program: name,
        what: "opening its pinned link",
        source: Box::new(source),
    })?;
    crate::sys::link_update(link.as_fd(), program).map_err(|source| BpfError::Link {
        program: name,
        what: "moving its pinned link onto the new program (BPF_LINK_UPDATE)",
        source: Box::new(source),
    })
}

/// The program a pinned link runs now: its id and tag, and the ids of the maps it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkedProgram {
    pub id: u32,
    pub tag: u64,
    pub map_ids: Vec<u32>,
}

/// What the link pinned at `pin` runs now.
pub fn linked_program(pin: &Path) -> Result<LinkedProgram, BpfError> {
    let failed = |what: &'static str, source: Box<dyn std::error::Error + Send + Sync>| BpfError::Link {
        program: "pinned link",
        what,
        source,
    };
    let link: aya::programs::links::FdLink = aya::programs::links::PinnedLink::from_pin(pin)
        .map_err(|source| failed("opening its pin", Box::new(source)))?
        .into();
    let id = link.info().map_err(|source| failed("reading its info", Box::new(source)))?.program_id();
    let program = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|program| program.id() == id)
        .ok_or_else(|| failed("finding its program", format!("no program {id} is loaded").into()))?;
    let map_ids =
        program.map_ids().map_err(|source| failed("reading its program's maps", Box::new(source)))?.unwrap_or_default();
    Ok(LinkedProgram { id, tag: program.tag(), map_ids })
}

/// The id of the map pinned at `pin`.
pub fn pinned_map_id(pin: &Path) -> Result<u32, BpfError> {
    MapInfo::from_pin(pin).map(|info| info.id()).map_err(|source| BpfError::Map {
        map: "pinned map",
        what: format!("reading the info of {}", pin.display()),
        source: Box::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sized_map_names_the_option_whose_size_field_it_follows() {
        let sizes = MapSizes { services: 1000, backends: 2000, affinity: 300, reverse: 4000 };
        for map in SIZED_MAPS {
            let option = size_option(map).unwrap_or_else(|| panic!("{map} names no option"));
            let raised = match option {
                "--bpf-map-services" => MapSizes { services: 1001, ..sizes },
                "--bpf-map-backends" => MapSizes { backends: 2001, ..sizes },
                "--bpf-map-affinity" => MapSizes { affinity: 301, ..sizes },
                "--bpf-map-sockets" => MapSizes { reverse: 4001, ..sizes },
                other => panic!("{map}: {other} is not an option of svcplane proxy"),
            };
            assert_eq!(sized(map, raised), sized(map, sizes).map(|capacity| capacity + 1), "{map} follows {option}");
        }
        let full = BpfError::MapFull { map: crate::maps::BACKENDS_MAP, capacity: 2000 };
        assert_eq!(
            full.to_string(),
            "BPF map svcplane_backends is full (2000 entries): raise its size (`svcplane proxy --bpf-map-backends`)"
        );
    }

    #[test]
    fn the_identity_changes_with_the_map_sizes() {
        let sizes = MapSizes::default();
        assert_eq!(identity(sizes), identity(sizes));
        assert_ne!(identity(sizes), identity(MapSizes { services: sizes.services / 2, ..sizes }));
    }

    #[test]
    fn every_pinned_map_of_both_objects_has_an_expected_layout_with_the_sizes_applied() {
        let sizes = MapSizes { services: 1000, backends: 2000, affinity: 300, reverse: 4000 };
        let sock = expected_layouts(SOCK_LB_OBJECT, "sock_lb.o", sizes).expect("parsing sock_lb.o");
        let tc = expected_layouts(TC_NAT_OBJECT, "tc_nat.o", sizes).expect("parsing tc_nat.o");
        let find = |maps: &[(String, Layout)], name: &str| {
            maps.iter().find(|(map, _)| map == name).map(|(_, layout)| *layout).unwrap_or_else(|| panic!("{name}"))
        };
        assert_eq!(find(&sock, crate::maps::SERVICES_MAP).max_entries, 1000);
        assert_eq!(find(&sock, crate::maps::UDP_FLOWS_MAP).max_entries, 4000);
        assert_eq!(find(&tc, crate::maps::CT_MAP).max_entries, 4000);
        assert_eq!(find(&sock, crate::maps::PORT_NAMES_MAP).max_entries, 1000, "one name per service port");
        assert_eq!(find(&sock, crate::maps::TCP_REV_MAP).max_entries, 4000);
        for map in SIZED_MAPS {
            assert!(sized(map, sizes).is_some(), "{map} has a capacity");
        }
        assert_eq!(find(&tc, crate::maps::SERVICES_MAP), find(&sock, crate::maps::SERVICES_MAP), "one layout, shared");
        for map in crate::maps::SOCK_LB_MAPS {
            assert!(sock.iter().any(|(name, _)| name == map), "{map} is pinned by name");
        }
    }
}
