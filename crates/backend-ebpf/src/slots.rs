//! Ranges of the backends array handed to endpoint sets.
//!
//! Each endpoint set lives in one range of `svcplane_backends` (its slots at `first ..
//! first + len`), and a range is never written while a frontend names it: a changed set is
//! written to a new range, the frontends are moved to it, and the old range is given back.
//! A program may still be reading a range it found through a frontend just moved (a
//! lookup takes microseconds), so a range given back is held for [`HOLD`] before it is
//! handed out again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// How long a range given back waits before it is handed out again: far longer than any
/// program run that found it before its frontends moved.
pub const HOLD: Duration = Duration::from_secs(1);

/// Free and held ranges of an array of `capacity` slots. Best fit, free neighbours merged.
#[derive(Debug, Clone)]
pub struct Ranges {
    capacity: u32,
    /// Free ranges: first slot -> length.
    free: BTreeMap<u32, u32>,
    /// The same ranges as (length, first slot), for best fit.
    by_length: BTreeSet<(u32, u32)>,
    /// Ranges given back, in the order they were, with when.
    held: VecDeque<(Instant, u32, u32)>,
    /// Slots neither free nor held.
    taken: u32,
}

impl Ranges {
    /// Every slot free.
    pub fn new(capacity: u32) -> Self {
        let mut ranges =
            Self { capacity, free: BTreeMap::new(), by_length: BTreeSet::new(), held: VecDeque::new(), taken: 0 };
        ranges.insert_free(0, capacity);
        ranges
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots handed out and not given back, plus those held.
    pub fn in_use(&self) -> u32 {
        self.taken + self.held.iter().map(|(_, _, length)| length).sum::<u32>()
    }

    /// The first slot of a free range of `length` slots, now taken; `None` if no free range
    /// is that long. A set of no slots takes none (and starts at 0).
    pub fn take(&mut self, length: u32) -> Option<u32> {
        if length == 0 {
            return Some(0);
        }
        let &(free_length, first) = self.by_length.range((length, 0)..).next()?;
        self.remove_free(first, free_length);
        if free_length > length {
            self.insert_free(first + length, free_length - length);
        }
        self.taken += length;
        Some(first)
    }

    /// Marks `first .. first + length` taken (a range found in the maps, adopted). False if
    /// any of it is not free (taken already, or beyond the array).
    pub fn take_at(&mut self, first: u32, length: u32) -> bool {
        if length == 0 {
            return true;
        }
        let Some(end) = first.checked_add(length) else { return false };
        let Some((&start, &free_length)) = self.free.range(..=first).next_back() else { return false };
        if start + free_length < end {
            return false;
        }
        self.remove_free(start, free_length);
        if start < first {
            self.insert_free(start, first - start);
        }
        if end < start + free_length {
            self.insert_free(end, start + free_length - end);
        }
        self.taken += length;
        true
    }

    /// Gives `first .. first + length` back, to be handed out again after [`HOLD`].
    pub fn give_back(&mut self, first: u32, length: u32, now: Instant) {
        if length == 0 {
            return;
        }
        self.taken = self.taken.saturating_sub(length);
        self.held.push_back((now, first, length));
    }

    /// Gives back at once a range no frontend ever named (taken for a write that did not
    /// happen).
    pub fn give_back_unused(&mut self, first: u32, length: u32) {
        if length == 0 {
            return;
        }
        self.taken = self.taken.saturating_sub(length);
        self.free_range(first, length);
    }

    /// Frees the held ranges given back at least [`HOLD`] before `now`.
    pub fn release_held(&mut self, now: Instant) {
        while let Some(&(at, first, length)) = self.held.front() {
            if now.saturating_duration_since(at) < HOLD {
                break;
            }
            self.held.pop_front();
            self.free_range(first, length);
        }
    }

    /// The held ranges, for a rebuilt allocator to keep holding them.
    pub fn held(&self) -> impl Iterator<Item = (Instant, u32, u32)> + '_ {
        self.held.iter().copied()
    }

    /// Holds `first .. first + length` (taken out of the free ranges) as if given back at
    /// `at`. False if it is not free.
    pub fn hold_at(&mut self, at: Instant, first: u32, length: u32) -> bool {
        if !self.take_at(first, length) {
            return false;
        }
        self.give_back(first, length, at);
        true
    }

    fn free_range(&mut self, mut first: u32, mut length: u32) {
        if let Some((&before, &before_length)) = self.free.range(..first).next_back()
            && before + before_length == first
        {
            self.remove_free(before, before_length);
            first = before;
            length += before_length;
        }
        if let Some(&after_length) = self.free.get(&(first + length)) {
            self.remove_free(first + length, after_length);
            length += after_length;
        }
        self.insert_free(first, length);
    }

    fn insert_free(&mut self, first: u32, length: u32) {
        if length > 0 {
            self.free.insert(first, length);
            self.by_length.insert((length, first));
        }
    }

    fn remove_free(&mut self, first: u32, length: u32) {
        self.free.remove(&first);
        self.by_length.remove(&(length, first));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_handed_out_one_after_another_from_an_empty_array() {
        let mut ranges = Ranges::new(100);
        assert_eq!(ranges.take(10), Some(0));
        assert_eq!(ranges.take(5), Some(10));
        assert_eq!(ranges.take(0), Some(0), "an empty set takes nothing");
        assert_eq!(ranges.in_use(), 15);
        assert_eq!(ranges.take(86), None, "only 85 slots are left");
        assert_eq!(ranges.take(85), Some(15));
    }

    #[test]
    fn a_range_given_back_is_held_until_the_hold_has_passed_then_merged_with_its_neighbours() {
        let mut ranges = Ranges::new(30);
        let (a, b, c) = (ranges.take(10).unwrap(), ranges.take(10).unwrap(), ranges.take(10).unwrap());
        let now = Instant::now();
        ranges.give_back(a, 10, now);
        ranges.give_back(b, 10, now);
        assert_eq!(ranges.take(1), None, "held slots are not handed out");
        assert_eq!(ranges.in_use(), 30);
        ranges.release_held(now + HOLD / 2);
        assert_eq!(ranges.take(1), None, "not yet");
        ranges.release_held(now + HOLD);
        assert_eq!(ranges.in_use(), 10);
        assert_eq!(ranges.take(20), Some(0), "the two freed ranges merged into one");
        ranges.give_back_unused(c, 10);
        assert_eq!(ranges.in_use(), 20);
    }

    #[test]
    fn the_smallest_free_range_that_fits_is_taken() {
        let mut ranges = Ranges::new(100);
        let taken: Vec<u32> = [10, 3, 10, 5, 10].iter().map(|n| ranges.take(*n).unwrap()).collect();
        assert_eq!(ranges.take(62), Some(38), "the rest of the array");
        ranges.give_back_unused(taken[1], 3);
        ranges.give_back_unused(taken[3], 5);
        assert_eq!(ranges.take(4), Some(taken[3]), "the 5-slot hole, not the 3-slot one");
        assert_eq!(ranges.take(3), Some(taken[1]));
    }

    #[test]
    fn adopted_ranges_are_carved_out_of_the_free_space_and_never_taken_twice() {
        let mut ranges = Ranges::new(50);
        assert!(ranges.take_at(20, 10));
        assert!(!ranges.take_at(25, 10), "overlaps the adopted range");
        assert!(!ranges.take_at(45, 10), "runs past the end of the array");
        assert!(ranges.take_at(0, 5));
        assert_eq!(ranges.take(15), Some(5), "the hole between the two adopted ranges");
        assert_eq!(ranges.take(20), Some(30));
        assert_eq!(ranges.take(1), None);
        let now = Instant::now();
        assert!(!ranges.hold_at(now, 0, 5), "taken");
        let mut fresh = Ranges::new(50);
        assert!(fresh.hold_at(now, 0, 5));
        assert_eq!(fresh.take(45), Some(5));
        assert_eq!(fresh.take(1), None, "the held range stays out until released");
    }
}
