//! [`Postings`]: which objects carry a label, by hashed `(namespace, key, value)`. The
//! manifests feed's controller step finds a Service's candidate Pods, and a Pod's
//! selecting Services, through it.
//!
//! A label usually names a few objects (ten Pods, one Service at 10k Services x 10 Pods):
//! they are kept in a vector, which at ten is half a hash set's size and at one a
//! seventh of a B-tree leaf's. A label that many objects carry (`tier: web` on every Pod)
//! moves them to a counted hash map, so that taking one out stays cheap.
//!
//! What is filed is a multiset: Pods are filed as the hash of their name
//! ([`crate::named_table::name_hash`]), and two Pods whose names collide are both there.

use std::hash::Hash;

use crate::FastMap;

/// How many entries a label keeps in a vector before it moves them to a counted map.
const FEW: usize = 32;

/// The entries under one label; see the module documentation.
#[derive(Debug)]
enum Entries<T> {
    Few(Vec<T>),
    Many(Box<FastMap<T, u32>>),
}

/// Entries by label; see the module documentation.
#[derive(Debug)]
pub(crate) struct Postings<T> {
    by_label: FastMap<u64, Entries<T>>,
}

impl<T> Default for Postings<T> {
    fn default() -> Self {
        Self { by_label: FastMap::default() }
    }
}

impl<T: Clone + Eq + Hash> Postings<T> {
    /// Files `entry` under `label` once more.
    pub(crate) fn insert(&mut self, label: u64, entry: T) {
        let entries = self.by_label.entry(label).or_insert_with(|| Entries::Few(Vec::new()));
        match entries {
            Entries::Few(few) if few.len() < FEW => few.push(entry),
            Entries::Few(few) => {
                let mut many: FastMap<T, u32> = FastMap::default();
                for held in few.drain(..).chain(std::iter::once(entry)) {
                    *many.entry(held).or_default() += 1;
                }
                *entries = Entries::Many(Box::new(many));
            }
            Entries::Many(many) => *many.entry(entry).or_default() += 1,
        }
    }

    /// Takes one `entry` out from under `label`; a label left with none is forgotten.
    pub(crate) fn remove(&mut self, label: u64, entry: &T) {
        let Some(entries) = self.by_label.get_mut(&label) else { return };
        let empty = match entries {
            Entries::Few(few) => {
                if let Some(at) = few.iter().position(|held| held == entry) {
                    few.swap_remove(at);
                }
                few.is_empty()
            }
            Entries::Many(many) => {
                if let Some(count) = many.get_mut(entry) {
                    *count -= 1;
                    if *count == 0 {
                        many.remove(entry);
                    }
                }
                many.is_empty()
            }
        };
        if empty {
            self.by_label.remove(&label);
        }
    }

    /// The distinct entries filed under `label`, in no particular order.
    pub(crate) fn distinct(&self, label: u64) -> Vec<&T> {
        match self.by_label.get(&label) {
            Some(Entries::Few(few)) => {
                let mut distinct: Vec<&T> = Vec::with_capacity(few.len());
                for entry in few {
                    if !distinct.contains(&entry) {
                        distinct.push(entry);
                    }
                }
                distinct
            }
            Some(Entries::Many(many)) => many.keys().collect(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn distinct(postings: &Postings<String>, label: u64) -> Vec<String> {
        let mut listed: Vec<String> = postings.distinct(label).into_iter().cloned().collect();
        listed.sort();
        listed
    }

    #[test]
    fn postings_count_what_a_multiset_counts_through_inserts_and_removals_below_and_above_the_vector_limit() {
        let mut postings: Postings<String> = Postings::default();
        let mut counts: BTreeMap<u64, BTreeMap<String, u32>> = BTreeMap::new();
        // A fixed pseudo-random walk: label 0 gets up to 200 names (a counted map), labels 1
        // and 2 up to 12 (a vector); names are filed more than once and taken out when
        // absent too.
        let mut state = 11u32;
        for _ in 0..6000 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let label = u64::from((state >> 20) % 3);
            let name = format!("pod-{}", (state >> 8) % if label == 0 { 200 } else { 12 });
            let count = counts.entry(label).or_default();
            // Labels 1 and 2 hold each name at most twice: 24 entries, under the limit.
            let room = label == 0 || count.get(&name).is_none_or(|&held| held < 2);
            if (state >> 4) % 3 < 2 && room {
                postings.insert(label, name.clone());
                *count.entry(name).or_default() += 1;
            } else {
                postings.remove(label, &name);
                if let Some(left) = count.get_mut(&name) {
                    *left -= 1;
                    if *left == 0 {
                        count.remove(&name);
                    }
                }
            }
            let expected: Vec<String> = counts[&label].keys().cloned().collect();
            assert_eq!(distinct(&postings, label), expected, "label {label}");
        }
        assert!(matches!(postings.by_label.get(&0), Some(Entries::Many(_))), "label 0 moved to a counted map");
        assert!(matches!(postings.by_label.get(&1), Some(Entries::Few(_))));
    }

    #[test]
    fn an_entry_filed_twice_stays_until_taken_out_twice_and_an_empty_label_is_forgotten() {
        let mut postings: Postings<String> = Postings::default();
        postings.insert(7, "a".to_owned());
        postings.insert(7, "a".to_owned());
        assert_eq!(distinct(&postings, 7), ["a"]);
        postings.remove(7, &"a".to_owned());
        assert_eq!(distinct(&postings, 7), ["a"], "two Pods whose names hash alike: one is left");
        postings.remove(7, &"a".to_owned());
        assert!(postings.by_label.is_empty());
        assert!(postings.distinct(7).is_empty());
    }
}
