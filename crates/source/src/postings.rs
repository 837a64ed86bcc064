//! [`Postings`]: which objects carry a label, by hashed `(namespace, key, value)`. The
//! manifests feed's controller step finds a Service's candidate Pods, and a Pod's
//! selecting Services, through it.
//!
//! A label usually names a few objects (ten Pods, one Service at 10k Services x 10 Pods):
//! their names are kept in a vector, which at ten names is half a hash set's size and at
//! one name a seventh of a B-tree leaf's. A label that many objects carry (`tier: web` on
//! every Pod) moves to a hash set, so that taking one name out stays cheap.

use crate::manifests::ObjectRef;
use crate::store::Key;
use crate::{FastMap, FastSet};

/// How many names a label keeps in a vector before it moves them to a hash set.
const FEW: usize = 32;

/// The names under one label; see the module documentation.
#[derive(Debug)]
enum Names {
    Few(Vec<Key>),
    Many(Box<FastSet<Key>>),
}

/// Names by label; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Postings {
    by_label: FastMap<u64, Names>,
}

impl Postings {
    /// Files `name` under `label` (once, however often it is filed).
    pub(crate) fn insert(&mut self, label: u64, name: &Key) {
        let names = self.by_label.entry(label).or_insert_with(|| Names::Few(Vec::new()));
        match names {
            Names::Few(few) if few.contains(name) => {}
            Names::Few(few) if few.len() < FEW => few.push(Key::clone(name)),
            Names::Few(few) => {
                let mut many: FastSet<Key> = few.drain(..).collect();
                many.insert(Key::clone(name));
                *names = Names::Many(Box::new(many));
            }
            Names::Many(many) => {
                many.insert(Key::clone(name));
            }
        }
    }

    /// Takes `name` out from under `label`; a label left with no name is forgotten.
    pub(crate) fn remove(&mut self, label: u64, name: &ObjectRef) {
        let Some(names) = self.by_label.get_mut(&label) else { return };
        let empty = match names {
            Names::Few(few) => {
                if let Some(at) = few.iter().position(|held| **held == *name) {
                    few.swap_remove(at);
                }
                few.is_empty()
            }
            Names::Many(many) => {
                many.remove(name);
                many.is_empty()
            }
        };
        if empty {
            self.by_label.remove(&label);
        }
    }

    /// The names filed under `label`, in no particular order.
    pub(crate) fn get(&self, label: u64) -> impl Iterator<Item = &Key> {
        let (few, many) = match self.by_label.get(&label) {
            Some(Names::Few(few)) => (few.as_slice(), None),
            Some(Names::Many(many)) => (&[][..], Some(many.iter())),
            None => (&[][..], None),
        };
        few.iter().chain(many.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use super::*;
    use crate::manifests::ObjectKind;

    fn key(name: &str) -> Key {
        Arc::new(ObjectRef::new(ObjectKind::Pod, "shop", name))
    }

    fn names(postings: &Postings, label: u64) -> BTreeSet<String> {
        postings.get(label).map(|key| key.name.to_string()).collect()
    }

    #[test]
    fn postings_list_what_sets_list_through_inserts_and_removals_below_and_above_the_vector_limit() {
        let mut postings = Postings::default();
        let mut sets: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        // A fixed pseudo-random walk: label 0 gets up to 200 names (a hash set), labels 1 and 2
        // up to 12 (a vector); names are filed twice and taken out when absent too.
        let mut state = 11u32;
        for _ in 0..6000 {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let label = u64::from((state >> 20) % 3);
            let name = format!("pod-{}", (state >> 8) % if label == 0 { 200 } else { 12 });
            if (state >> 4) % 3 < 2 {
                postings.insert(label, &key(&name));
                sets.entry(label).or_default().insert(name);
            } else {
                postings.remove(label, &key(&name));
                if let Some(set) = sets.get_mut(&label) {
                    set.remove(&name);
                }
            }
            assert_eq!(names(&postings, label), sets.get(&label).cloned().unwrap_or_default(), "label {label}");
        }
        assert!(matches!(postings.by_label.get(&0), Some(Names::Many(_))), "label 0 moved to a hash set");
        assert!(matches!(postings.by_label.get(&1), Some(Names::Few(_))));
    }

    #[test]
    fn a_label_left_with_no_name_is_forgotten() {
        let mut postings = Postings::default();
        postings.insert(7, &key("a"));
        postings.insert(7, &key("a"));
        postings.remove(7, &key("a"));
        assert!(postings.by_label.is_empty());
        assert_eq!(postings.get(7).count(), 0);
    }
}
