//! [`NamedTable`]: values by object name, each name and value kept once, inline, in one
//! vector, and found through a table of positions. A hash map of shared names
//! (`Arc<ObjectRef>` keys) cost an allocation of 80 bytes per object for the name and
//! left about a seventh of its slots empty, each as wide as an entry; here an empty slot
//! is four bytes.
//!
//! Names are hashed with a fixed hasher ([`name_hash`]), so that other indexes (a file's
//! objects, the Pods under a label) can hold an object as its eight-byte hash rather than
//! its name, and find it again here ([`NamedTable::find`], [`NamedTable::with_hash`]).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::manifests::ObjectRef;

/// The hash of an object's name, the same in every run and on every thread.
pub(crate) fn name_hash(name: &ObjectRef) -> u64 {
    foldhash::fast::FixedState::with_seed(0x5eed).hash_one(name)
}

/// Values by object name; see the module documentation. Removing an entry moves the last
/// one into its place, so the order of [`NamedTable::iter`] is not the insertion order,
/// and a position ([`NamedTable::find`]) is good until the next removal.
#[derive(Debug)]
pub(crate) struct NamedTable<V> {
    /// Positions in `entries`, hashed by the entry's name.
    positions: HashTable<u32>,
    entries: Vec<(ObjectRef, V)>,
}

impl<V> Default for NamedTable<V> {
    fn default() -> Self {
        Self { positions: HashTable::new(), entries: Vec::new() }
    }
}

impl<V> NamedTable<V> {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn position(&self, name: &ObjectRef) -> Option<usize> {
        self.find(name_hash(name), |held, _| held == name)
    }

    /// The position of the entry whose name hashes to `hash` and which `wanted` accepts.
    pub(crate) fn find(&self, hash: u64, wanted: impl Fn(&ObjectRef, &V) -> bool) -> Option<usize> {
        let entries = &self.entries;
        self.positions
            .find(hash, |&at| {
                let (name, value) = &entries[at as usize];
                wanted(name, value)
            })
            .map(|&at| at as usize)
    }

    /// Every entry whose name hashes to `hash`: usually one, more only when names collide.
    pub(crate) fn with_hash(&self, hash: u64) -> impl Iterator<Item = (&ObjectRef, &V)> {
        self.positions
            .iter_hash(hash)
            .map(|&at| &self.entries[at as usize])
            .filter(move |(name, _)| name_hash(name) == hash)
            .map(|(name, value)| (name, value))
    }

    pub(crate) fn get(&self, name: &ObjectRef) -> Option<&V> {
        self.position(name).map(|at| &self.entries[at].1)
    }

    pub(crate) fn at(&self, position: usize) -> (&ObjectRef, &V) {
        let (name, value) = &self.entries[position];
        (name, value)
    }

    pub(crate) fn at_mut(&mut self, position: usize) -> &mut V {
        &mut self.entries[position].1
    }

    /// Holds `value` under `name` when there is no entry yet, else hands the entry's value
    /// and `value` to `merge`; returns whether there was an entry.
    pub(crate) fn insert_or_merge(&mut self, name: ObjectRef, value: V, merge: impl FnOnce(&mut V, V)) -> bool {
        let hash = name_hash(&name);
        if let Some(at) = self.find(hash, |held, _| *held == name) {
            merge(&mut self.entries[at].1, value);
            return true;
        }
        let position = u32::try_from(self.entries.len()).expect("fewer than 2^32 objects");
        let entries = &self.entries;
        self.positions.insert_unique(hash, position, |&at| name_hash(&entries[at as usize].0));
        self.entries.push((name, value));
        false
    }

    /// Takes the entry at `position` out; the last entry moves into its place.
    pub(crate) fn remove_at(&mut self, position: usize) -> (ObjectRef, V) {
        let hash = name_hash(&self.entries[position].0);
        let slot = self.positions.find_entry(hash, |&at| at as usize == position);
        slot.expect("every entry has its position").remove();
        let removed = self.entries.swap_remove(position);
        if let Some((moved, _)) = self.entries.get(position) {
            let from = self.entries.len() as u32;
            let slot = self.positions.find_mut(name_hash(moved), |&at| at == from);
            *slot.expect("every entry has its position") = position as u32;
        }
        removed
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ObjectRef, &V)> {
        self.entries.iter().map(|(name, value)| (name, value))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::manifests::ObjectKind;

    fn name(name: &str) -> ObjectRef {
        ObjectRef::new(ObjectKind::Pod, "shop", name)
    }

    #[test]
    fn a_named_table_finds_what_a_map_finds_through_inserts_and_removals_in_any_order() {
        let mut table: NamedTable<u32> = NamedTable::default();
        let mut map: BTreeMap<String, u32> = BTreeMap::new();
        // A fixed pseudo-random walk over 300 names: inserts, edits, removals (of the last
        // entry, of the first, of absent names).
        let mut state = 7u32;
        for step in 0..5000u32 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let text = format!("pod-{}", (state >> 8) % 300);
            match (state >> 4) % 3 {
                0 | 1 => {
                    let existed = table.insert_or_merge(name(&text), step, |value, step| *value += step);
                    assert_eq!(existed, map.contains_key(&text));
                    *map.entry(text.clone()).or_insert(0) += step;
                }
                _ => {
                    let removed = table
                        .find(name_hash(&name(&text)), |held, _| *held == name(&text))
                        .map(|at| table.remove_at(at))
                        .map(|(held, value)| (held.name.to_string(), value));
                    assert_eq!(removed, map.remove(&text).map(|value| (text.clone(), value)));
                }
            }
            assert_eq!(table.len(), map.len());
            assert_eq!(table.get(&name(&text)), map.get(&text));
        }
        for (text, value) in &map {
            assert_eq!(table.get(&name(text)), Some(value), "{text}");
            let found: Vec<_> = table.with_hash(name_hash(&name(text))).map(|(_, value)| *value).collect();
            assert_eq!(found, [*value], "{text}");
            let at = table.find(name_hash(&name(text)), |_, held| held == value).unwrap();
            assert_eq!(table.at(at), (&name(text), value));
        }
        let mut listed: Vec<(String, u32)> =
            table.iter().map(|(held, value)| (held.name.to_string(), *value)).collect();
        listed.sort();
        assert_eq!(listed, map.into_iter().collect::<Vec<_>>());
        assert_eq!(table.get(&name("absent")), None);
    }

    #[test]
    fn a_name_hashes_the_same_in_every_table_and_on_every_thread() {
        let here = name_hash(&name("a"));
        let there = std::thread::spawn(|| name_hash(&name("a"))).join().unwrap();
        assert_eq!(here, there);
        assert_ne!(name_hash(&name("a")), name_hash(&ObjectRef::new(ObjectKind::Service, "shop", "a")));
    }
}
