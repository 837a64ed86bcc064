//! [`NamedTable`]: values by object name, kept in one vector and found through a table of
//! positions. A hash map of the same entries leaves about a seventh of its slots empty,
//! each as wide as an entry; here an empty slot is four bytes, and the entries are packed.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::manifests::ObjectRef;
use crate::store::Key;

/// Values by object name; see the module documentation. Removing an entry moves the last
/// one into its place, so the order of [`NamedTable::iter`] is not the insertion order.
#[derive(Debug)]
pub(crate) struct NamedTable<V> {
    /// Positions in `entries`, hashed by the entry's name.
    positions: HashTable<u32>,
    entries: Vec<(Key, V)>,
    hasher: foldhash::fast::RandomState,
}

impl<V> Default for NamedTable<V> {
    fn default() -> Self {
        Self { positions: HashTable::new(), entries: Vec::new(), hasher: foldhash::fast::RandomState::default() }
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
        let entries = &self.entries;
        let hash = self.hasher.hash_one(name);
        self.positions.find(hash, |&at| *entries[at as usize].0 == *name).map(|&at| at as usize)
    }

    pub(crate) fn get(&self, name: &ObjectRef) -> Option<&V> {
        self.position(name).map(|at| &self.entries[at].1)
    }

    pub(crate) fn get_mut(&mut self, name: &ObjectRef) -> Option<&mut V> {
        self.position(name).map(|at| &mut self.entries[at].1)
    }

    /// The shared name held for `name`, when there is an entry.
    pub(crate) fn key(&self, name: &ObjectRef) -> Option<&Key> {
        self.position(name).map(|at| &self.entries[at].0)
    }

    /// Holds `value` under `key` when there is no entry yet, else hands the entry's value and
    /// `value` to `merge`; returns whether there was an entry.
    pub(crate) fn insert_or_merge(&mut self, key: Key, value: V, merge: impl FnOnce(&mut V, V)) -> bool {
        if let Some(at) = self.position(&key) {
            merge(&mut self.entries[at].1, value);
            return true;
        }
        let position = u32::try_from(self.entries.len()).expect("fewer than 2^32 objects");
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.positions.insert_unique(hasher.hash_one(&*key), position, |&at| hasher.hash_one(&*entries[at as usize].0));
        self.entries.push((key, value));
        false
    }

    /// Takes the entry of `name` out; the last entry moves into its place.
    pub(crate) fn remove(&mut self, name: &ObjectRef) -> Option<(Key, V)> {
        let hash = self.hasher.hash_one(name);
        let entries = &self.entries;
        let at = match self.positions.find_entry(hash, |&at| *entries[at as usize].0 == *name) {
            Ok(found) => found.remove().0 as usize,
            Err(_) => return None,
        };
        let removed = self.entries.swap_remove(at);
        if let Some((moved, _)) = self.entries.get(at) {
            let from = self.entries.len() as u32;
            let position = self
                .positions
                .find_mut(self.hasher.hash_one(&**moved), |&position| position == from)
                .expect("every entry has its position");
            *position = at as u32;
        }
        Some(removed)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.entries.iter().map(|(key, value)| (key, value))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::manifests::ObjectKind;

    fn key(name: &str) -> Key {
        Arc::new(ObjectRef::new(ObjectKind::Pod, "shop", name))
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
            let name = format!("pod-{}", (state >> 8) % 300);
            match (state >> 4) % 3 {
                0 | 1 => {
                    table.insert_or_merge(key(&name), step, |value, step| *value += step);
                    *map.entry(name.clone()).or_insert(0) += step;
                }
                _ => {
                    let removed = table.remove(&key(&name)).map(|(key, value)| (key.name.to_string(), value));
                    assert_eq!(removed, map.remove(&name).map(|value| (name.clone(), value)));
                }
            }
            assert_eq!(table.len(), map.len());
            assert_eq!(table.get(&key(&name)), map.get(&name));
        }
        for (name, value) in &map {
            assert_eq!(table.get(&key(name)), Some(value), "{name}");
            assert_eq!(table.key(&key(name)).map(|key| key.name.to_string()), Some(name.clone()));
        }
        let mut listed: Vec<(String, u32)> = table.iter().map(|(key, value)| (key.name.to_string(), *value)).collect();
        listed.sort();
        assert_eq!(listed, map.into_iter().collect::<Vec<_>>());
        assert_eq!(table.get(&key("absent")), None);
    }

    #[test]
    fn the_shared_name_is_kept_when_the_value_is_edited() {
        let mut table: NamedTable<u32> = NamedTable::default();
        let first = key("a");
        assert!(!table.insert_or_merge(Arc::clone(&first), 1, |_, _| unreachable!()));
        assert!(table.insert_or_merge(key("a"), 10, |value, more| *value += more));
        assert!(Arc::ptr_eq(table.key(&first).unwrap(), &first));
        assert_eq!(table.get_mut(&first).copied(), Some(11));
    }
}
