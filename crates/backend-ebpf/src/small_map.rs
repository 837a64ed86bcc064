//! Ordered maps and sets of a few entries, held as one sorted vector.
//!
//! A service port's map entries (its frontends, its one or two endpoint sets, its local
//! endpoints) are a handful of values each, kept for every port of the node between
//! syncs. A `BTreeMap` allocates a whole node (room for eleven entries) for one entry: at
//! 10k ports those nodes were ~10 MiB of the proxy's heap. A sorted vector holds what is
//! there, and for a few entries a binary search is as fast as the tree.

use std::borrow::Borrow;
use std::fmt;

/// A map ordered by key, as a sorted vector of entries.
#[derive(Clone, PartialEq, Eq)]
pub struct SmallMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self { entries: Vec::new() }
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    fn position<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// Sets `key` to `value`; returns the value it replaces.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.entries[at].1, value)),
            Err(at) => {
                self.entries.insert(at, (key, value));
                None
            }
        }
    }

    /// The value of `key`, made by `make` if the map has none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let at = match self.position(&key) {
            Ok(at) => at,
            Err(at) => {
                self.entries.insert(at, (key, make()));
                at
            }
        };
        &mut self.entries[at].1
    }

    pub fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.position(key).ok().map(|at| &self.entries[at].1)
    }

    pub fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.position(key).is_ok()
    }
}

impl<K, V> SmallMap<K, V> {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }

    /// Gives back the room the vector grew beyond its entries (for maps kept long).
    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SmallMap<K, V> {
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for the key")
    }
}

impl<'a, K, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// A set ordered by value, as a sorted vector.
#[derive(Clone, PartialEq, Eq)]
pub struct SmallSet<T> {
    values: Vec<T>,
}

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        Self { values: Vec::new() }
    }
}

impl<T: Ord> SmallSet<T> {
    /// Adds `value`; whether it was not there.
    pub fn insert(&mut self, value: T) -> bool {
        match self.values.binary_search(&value) {
            Ok(_) => false,
            Err(at) => {
                self.values.insert(at, value);
                true
            }
        }
    }

    pub fn contains(&self, value: &T) -> bool {
        self.values.binary_search(value).is_ok()
    }
}

impl<T> SmallSet<T> {
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The values in order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.values.iter()
    }

    /// Gives back the room the vector grew beyond its values (for sets kept long).
    pub fn shrink_to_fit(&mut self) {
        self.values.shrink_to_fit();
    }
}

impl<T: Ord> FromIterator<T> for SmallSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        let mut values: Vec<T> = values.into_iter().collect();
        values.sort();
        values.dedup();
        Self { values }
    }
}

impl<'a, T> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.iter()
    }
}

impl<T: fmt::Debug> fmt::Debug for SmallSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[test]
    fn a_small_map_answers_as_an_ordered_map_does_whatever_the_order_of_its_inserts() {
        let inserts = [(5, 'a'), (1, 'b'), (9, 'c'), (5, 'd'), (3, 'e'), (1, 'f'), (7, 'g')];
        let (mut small, mut tree) = (SmallMap::default(), BTreeMap::new());
        for (key, value) in inserts {
            assert_eq!(small.insert(key, value), tree.insert(key, value), "insert {key}");
        }
        assert_eq!(small.iter().collect::<Vec<_>>(), tree.iter().collect::<Vec<_>>());
        assert_eq!(small.len(), tree.len());
        for key in 0..11 {
            assert_eq!(small.get(&key), tree.get(&key), "get {key}");
            assert_eq!(small.contains_key(&key), tree.contains_key(&key));
        }
        assert_eq!(small[&9], 'c');
        *small.get_or_insert_with(4, || 'h') = 'i';
        assert_eq!(*small.get_or_insert_with(4, || 'j'), 'i', "an existing value is kept");
        assert_eq!(small.keys().copied().collect::<Vec<_>>(), [1, 3, 4, 5, 7, 9]);
        assert_eq!(format!("{small:?}"), "{1: 'f', 3: 'e', 4: 'i', 5: 'd', 7: 'g', 9: 'c'}");
    }

    #[test]
    fn a_small_set_holds_each_value_once_in_order() {
        let values = [4, 2, 8, 2, 6, 4];
        let mut small: SmallSet<i32> = values.into_iter().collect();
        assert_eq!(
            small.iter().copied().collect::<Vec<_>>(),
            values.iter().copied().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>()
        );
        assert!(small.insert(5));
        assert!(!small.insert(8));
        assert!(small.contains(&5) && !small.contains(&3));
        assert_eq!(small.len(), 5);
    }
}
