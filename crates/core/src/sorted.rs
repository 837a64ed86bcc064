//! A small sorted set kept in one vector, for the indexes that hold one or a few names per
//! Service: a `BTreeSet` allocates a whole node (eleven slots) for its first element, which
//! at 10k Services made these indexes the largest part of the plan.

/// A set of distinct values, sorted, in one exactly-sized allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SortedVec<T>(Vec<T>);

impl<T> Default for SortedVec<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T: Ord> SortedVec<T> {
    /// Adds `value`; false when it was there already.
    pub fn insert(&mut self, value: T) -> bool {
        match self.0.binary_search(&value) {
            Ok(_) => false,
            Err(at) => {
                // One more slot, not double: most of these sets never grow past one or two.
                self.0.reserve_exact(1);
                self.0.insert(at, value);
                true
            }
        }
    }

    /// Removes `value`; false when it was not there.
    pub fn remove(&mut self, value: &T) -> bool {
        match self.0.binary_search(value) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains(&self, value: &T) -> bool {
        self.0.binary_search(value).is_ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<T: Ord> FromIterator<T> for SortedVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(values: I) -> Self {
        let mut all: Vec<T> = values.into_iter().collect();
        all.sort();
        all.dedup();
        all.shrink_to_fit();
        Self(all)
    }
}

impl<T> IntoIterator for SortedVec<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, T> IntoIterator for &'a SortedVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_stay_sorted_and_distinct_whatever_order_they_come_in() {
        let mut set: SortedVec<u32> = [5, 1, 5, 3].into_iter().collect();
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [1, 3, 5]);
        assert!(set.insert(2) && !set.insert(3));
        assert!(set.remove(&1) && !set.remove(&1));
        assert_eq!(set.iter().copied().collect::<Vec<_>>(), [2, 3, 5]);
        assert!(set.contains(&5) && !set.contains(&1) && set.len() == 3);
    }

    #[test]
    fn a_set_of_one_holds_exactly_one_slot() {
        let mut set = SortedVec::default();
        set.insert("only");
        assert_eq!(set.0.capacity(), 1);
        let collected: SortedVec<&str> = ["only"].into_iter().collect();
        assert_eq!(collected.0.capacity(), 1);
    }
}
