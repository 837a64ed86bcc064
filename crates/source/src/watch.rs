//! Noticing changes in a manifests directory, by polling.
//!
//! Every interval the directory is listed and each manifest's fingerprint (length,
//! modification time and, on Unix, device, inode and change time) compared with the last
//! one. Only new and changed files are read, and of those only the documents whose text
//! changed are parsed again (see [`crate::store`]); the others keep their parsed objects. Polling needs no inotify limits, works on every file system (network mounts,
//! ConfigMap volumes whose files are swapped by renaming a link) and cannot miss an event.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::debug;

use crate::manifests::{Fingerprint, Loaded, ManifestError, list_files};
use crate::store::{ManifestStore, ObjectChange, Phases, StoreCounters};

/// How often [`DirectoryWatcher::run`] looks, unless told otherwise: changes show within a
/// quarter of a second plus the time to parse them.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Longest single sleep of the watch loop, so that a stop request is seen quickly.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// Watches one manifests directory and reloads it when something in it changed.
#[derive(Debug)]
pub struct DirectoryWatcher {
    dir: PathBuf,
    /// The fingerprints of the files of the last poll.
    fingerprints: BTreeMap<PathBuf, Fingerprint>,
    /// What the files hold, file by file and document by document.
    store: ManifestStore,
    /// Problems listing the directory at the last poll.
    listing_errors: Vec<ManifestError>,
    has_polled: bool,
}

/// What one look at the directory found.
#[derive(Debug)]
pub(crate) enum Scan {
    /// The directory itself could not be listed; nothing was applied.
    Unlisted(Vec<ManifestError>),
    /// These objects changed (maybe none, when only problems changed).
    Changed(Vec<ObjectChange>),
}

impl DirectoryWatcher {
    /// A watcher for `dir`; nothing is read until the first [`Self::poll`].
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            fingerprints: BTreeMap::new(),
            store: ManifestStore::default(),
            listing_errors: Vec::new(),
            has_polled: false,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many files were read and documents parsed since the watcher was made.
    pub fn counters(&self) -> StoreCounters {
        self.store.counters
    }

    /// Where the time of the last look that found a change went (reading and parsing).
    pub fn phases(&self) -> Phases {
        self.store.phases
    }

    pub(crate) fn store(&self) -> &ManifestStore {
        &self.store
    }

    /// Looks at the directory once. Returns the whole new state when anything changed since
    /// the previous poll (always on the first poll), `None` otherwise.
    pub fn poll(&mut self) -> Option<Loaded> {
        self.scan(true)?;
        Some(self.store.loaded())
    }

    /// Looks at the directory once and reads what changed: `None` when nothing did (always
    /// something on the first look). With `apply_unlisted` false, a directory that cannot
    /// be listed changes nothing (the files are not forgotten) and is reported as
    /// [`Scan::Unlisted`].
    pub(crate) fn scan(&mut self, apply_unlisted: bool) -> Option<Scan> {
        let started = Instant::now();
        let mut listing_errors = Vec::new();
        let listed = list_files(&self.dir, &mut listing_errors);
        let errors_unchanged = same_errors(&self.listing_errors, &listing_errors);
        let unlisted = listing_errors.iter().any(|error| is_unlisted(error, &self.dir));
        if unlisted && !apply_unlisted {
            let first = !self.has_polled;
            self.listing_errors.clone_from(&listing_errors);
            self.has_polled = true;
            return (first || !errors_unchanged).then_some(Scan::Unlisted(listing_errors));
        }
        let changed: Vec<PathBuf> = listed
            .iter()
            .filter(|file| self.fingerprints.get(&file.path) != Some(&file.fingerprint))
            .map(|file| file.path.clone())
            .collect();
        // With nothing new or changed, equal counts mean nothing was removed either.
        let files_unchanged = changed.is_empty() && listed.len() == self.fingerprints.len();
        if self.has_polled && files_unchanged && errors_unchanged {
            return None;
        }
        let mut fingerprints = BTreeMap::new();
        for file in listed {
            self.fingerprints.remove(&file.path);
            fingerprints.insert(file.path, file.fingerprint);
        }
        let removed: Vec<PathBuf> = std::mem::replace(&mut self.fingerprints, fingerprints).into_keys().collect();
        debug!(
            dir = %self.dir.display(),
            files = self.fingerprints.len(),
            changed = changed.len(),
            removed = removed.len(),
            "manifests changed, reading what changed"
        );
        self.listing_errors.clone_from(&listing_errors);
        self.has_polled = true;
        let listing = started.elapsed();
        let changes = self.store.apply(changed, removed, listing_errors);
        self.store.phases.list = listing;
        Some(Scan::Changed(changes))
    }

    /// Polls every `interval` and sends each new state, the first one included, until
    /// `stop` is set or the receiver is gone. Blocks the calling thread.
    pub fn run(&mut self, interval: Duration, sender: &Sender<Loaded>, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            if let Some(loaded) = self.poll()
                && sender.send(loaded).is_err()
            {
                debug!(dir = %self.dir.display(), "nobody listens for manifest changes any more; stopping");
                return;
            }
            sleep_unless_stopped(interval, stop);
        }
    }

    /// Runs [`Self::run`] on a thread of its own. Set `stop` and join the handle to end it;
    /// it notices within 50 ms plus one poll.
    pub fn spawn(
        mut self,
        interval: Duration,
        sender: Sender<Loaded>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<JoinHandle<()>> {
        thread::Builder::new().name("manifests-watch".to_owned()).spawn(move || self.run(interval, &sender, &stop))
    }
}

fn is_unlisted(error: &ManifestError, dir: &Path) -> bool {
    matches!(error, ManifestError::ListDirectory { path, .. } if path == dir)
}

fn same_errors(old: &[ManifestError], new: &[ManifestError]) -> bool {
    old.len() == new.len() && old.iter().zip(new).all(|(a, b)| a.to_string() == b.to_string())
}

pub(crate) fn sleep_unless_stopped(interval: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + interval;
    loop {
        let now = Instant::now();
        if now >= deadline || stop.load(Ordering::Acquire) {
            return;
        }
        thread::sleep((deadline - now).min(STOP_CHECK_INTERVAL));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::tests::TempDir;
    use std::fs;
    use std::sync::mpsc::{self, Receiver};

    fn service(name: &str, ip: &str) -> String {
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  clusterIP: {ip}\n")
    }

    fn service_ips(loaded: &Loaded) -> Vec<(String, String)> {
        loaded
            .objects
            .services
            .iter()
            .map(|s| {
                let name = s.metadata.name.clone().unwrap_or_default();
                let ip = s.spec.as_ref().and_then(|spec| spec.cluster_ip.clone()).unwrap_or_default();
                (name, ip)
            })
            .collect()
    }

    /// Waits up to one second for a state that satisfies `wanted`.
    fn expect_within_a_second(receiver: &Receiver<Loaded>, what: &str, wanted: impl Fn(&Loaded) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match receiver.recv_timeout(left) {
                Ok(loaded) if wanted(&loaded) => return,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("the watcher did not see {what} within one second");
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
    }

    #[test]
    fn the_watcher_sees_an_edit_an_added_file_and_a_deleted_file_within_one_second() {
        let dir = TempDir::new("watch");
        dir.write("web.yaml", &service("web", "198.19.0.10"));
        let stop = Arc::new(AtomicBool::new(false));
        let (sender, receiver) = mpsc::channel();
        let watcher = DirectoryWatcher::new(&dir.0);
        let handle = watcher.spawn(DEFAULT_POLL_INTERVAL, sender, Arc::clone(&stop)).unwrap();

        expect_within_a_second(&receiver, "the initial state", |l| service_ips(l) == pairs(&[("web", "198.19.0.10")]));

        dir.write("web.yaml", &service("web", "198.19.0.11"));
        expect_within_a_second(&receiver, "an edit", |l| service_ips(l) == pairs(&[("web", "198.19.0.11")]));

        dir.write("sub/api.yml", &service("api", "198.19.0.12"));
        expect_within_a_second(&receiver, "an added file", |l| {
            service_ips(l) == pairs(&[("api", "198.19.0.12"), ("web", "198.19.0.11")])
        });

        fs::remove_file(dir.0.join("web.yaml")).unwrap();
        expect_within_a_second(&receiver, "a deleted file", |l| service_ips(l) == pairs(&[("api", "198.19.0.12")]));

        stop.store(true, Ordering::Release);
        handle.join().unwrap();
    }

    #[test]
    fn a_poll_without_changes_returns_nothing() {
        let dir = TempDir::new("poll");
        dir.write("web.yaml", &service("web", "198.19.0.10"));
        dir.write("broken.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: [\n");
        let mut watcher = DirectoryWatcher::new(&dir.0);
        let first = watcher.poll().expect("the first poll reports the initial state");
        assert_eq!(service_ips(&first), pairs(&[("web", "198.19.0.10")]));
        assert_eq!(first.errors.len(), 1);
        assert!(watcher.poll().is_none());

        // Unchanged files keep their parse results, errors included.
        dir.write("api.yaml", &service("api", "198.19.0.12"));
        let second = watcher.poll().expect("an added file is a change");
        assert_eq!(service_ips(&second), pairs(&[("api", "198.19.0.12"), ("web", "198.19.0.10")]));
        assert_eq!(second.errors.len(), 1);
        assert!(watcher.poll().is_none());
    }

    #[test]
    fn a_directory_that_appears_later_is_picked_up() {
        let parent = TempDir::new("late");
        let dir = parent.0.join("manifests");
        let mut watcher = DirectoryWatcher::new(&dir);
        let first = watcher.poll().unwrap();
        assert_eq!(first.errors.len(), 1, "a missing directory is reported");
        assert!(watcher.poll().is_none(), "the same problem again is no change");
        parent.write("manifests/web.yaml", &service("web", "198.19.0.10"));
        let second = watcher.poll().unwrap();
        assert!(second.errors.is_empty());
        assert_eq!(service_ips(&second), pairs(&[("web", "198.19.0.10")]));
    }

    #[test]
    fn the_watch_loop_ends_when_the_receiver_is_gone() {
        let dir = TempDir::new("hangup");
        let stop = AtomicBool::new(false);
        let (sender, receiver) = mpsc::channel();
        drop(receiver);
        let mut watcher = DirectoryWatcher::new(&dir.0);
        watcher.run(DEFAULT_POLL_INTERVAL, &sender, &stop);
    }
}
