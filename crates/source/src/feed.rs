//! The manifests directory as a feed, through the controller (allocation, EndpointSlices
//! from Pods): for the proxy, incrementally ([`ManifestsFeed::poll_changes`]: an edit costs
//! the files, documents and Services it touches, see `delta`), out as the changes it makes
//! to the core's model; for cluster DNS and `render`, complete reads of the directory, out
//! as the discovery view or the complete state.
//!
//! A read whose directory could not be listed at all changes nothing: the last state stays,
//! so a directory that disappears never empties the node's rules or the zone. Problems are
//! logged once each (file, object and field) and everything else carries on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use svcplane_controller::{AllocationRecord, Allocator, AllocatorConfig, ConfigError, Reconciled, RecordError};
use svcplane_core::Change;
use svcplane_core::discovery::ClusterView;
use tracing::{debug, info, warn};

use crate::delta::DeltaState;
use crate::diff::SnapshotDiffer;
use crate::dns_view::dns_view;
use crate::manifests::{ClusterObjects, Loaded, ManifestError, ObjectKind, ObjectRef, Origins, load_directory};
use crate::store::{Phases, StoreCounters};
use crate::watch::{DEFAULT_POLL_INTERVAL, DirectoryWatcher, Scan, sleep_unless_stopped};

/// The shortest pause between two looks at the directory by [`ManifestsFeed::spawn_changes`].
const FAST_POLL_INTERVAL: Duration = Duration::from_millis(50);
use crate::{FieldError, convert_objects};

/// Why a manifests feed could not start.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("--manifests: {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("the allocator's settings (--service-cidr, --node-port-range)")]
    Allocator(#[source] ConfigError),
    #[error("reading the allocations record {}", path.display())]
    ReadRecord {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the allocations record {}", path.display())]
    ParseRecord {
        path: PathBuf,
        #[source]
        source: RecordError,
    },
    #[error("starting the manifests watcher")]
    Spawn(#[source] std::io::Error),
}

/// How a manifests feed reads and allocates.
#[derive(Debug, Clone)]
pub struct ManifestsSettings {
    pub dir: PathBuf,
    pub allocator: AllocatorConfig,
    /// Where allocations are remembered across restarts (read at start).
    pub allocations_file: Option<PathBuf>,
    /// Whether this feed writes the record back when allocations change (the proxy does;
    /// DNS only reads it, so both agree on ClusterIPs).
    pub saves_allocations: bool,
}

/// Turns reads of a manifests directory into changes or discovery views.
#[derive(Debug)]
pub struct ManifestsFeed {
    settings: ManifestsSettings,
    allocator: Allocator,
    differ: SnapshotDiffer,
    /// For [`Self::poll_changes`]: the directory file by file, and the controller state.
    watcher: Option<DirectoryWatcher>,
    delta: DeltaState,
    last_touched: usize,
    phases: Phases,
    /// The problems last reported, so an unchanged broken file is not reported on every read.
    reported: Vec<String>,
    warned_unlisted: bool,
}

impl ManifestsFeed {
    pub fn new(settings: ManifestsSettings) -> Result<Self, FeedError> {
        let mut allocator = Allocator::new(settings.allocator.clone()).map_err(FeedError::Allocator)?;
        if let Some(path) = &settings.allocations_file
            && path.exists()
        {
            let text =
                std::fs::read_to_string(path).map_err(|source| FeedError::ReadRecord { path: path.clone(), source })?;
            let record = AllocationRecord::from_json(&text)
                .map_err(|source| FeedError::ParseRecord { path: path.clone(), source })?;
            allocator.restore(&record);
        }
        Ok(Self {
            settings,
            allocator,
            differ: SnapshotDiffer::new(),
            watcher: None,
            delta: DeltaState::default(),
            last_touched: 0,
            phases: Phases::default(),
            reported: Vec::new(),
            warned_unlisted: false,
        })
    }

    /// A feed for a directory that must exist now (the proxy and `render`).
    pub fn for_existing_directory(settings: ManifestsSettings) -> Result<Self, FeedError> {
        if !settings.dir.is_dir() {
            return Err(FeedError::NotADirectory(settings.dir));
        }
        Self::new(settings)
    }

    pub fn dir(&self) -> &Path {
        &self.settings.dir
    }

    /// Reads the directory once and returns the changes it makes to the model (`None` if
    /// the directory could not be listed).
    pub fn read_changes(&mut self) -> Option<Vec<Change>> {
        let loaded = load_directory(&self.settings.dir);
        self.changes(loaded)
    }

    /// The changes one complete read makes to the model (`None` if the directory could not
    /// be listed: nothing is known, so nothing may be removed).
    pub fn changes(&mut self, loaded: Loaded) -> Option<Vec<Change>> {
        let (reconciled, objects, origins, mut problems) = self.reconcile(loaded)?;
        let converted = convert_objects(
            &ClusterObjects {
                services: reconciled.services,
                pods: Vec::new(),
                nodes: objects.nodes,
                slices: reconciled.slices,
                pools: Vec::new(),
            },
            &origins,
        );
        problems.extend(converted.errors.iter().map(FieldError::to_string));
        self.report(problems);
        let changes = self.differ.diff(converted.services, converted.slices, converted.nodes);
        debug!(changes = changes.len(), "manifests read");
        Some(changes)
    }

    /// The discovery view of one complete read (`None` if the directory could not be
    /// listed: the previous view stays).
    pub fn discovery(&mut self, loaded: Loaded) -> Option<ClusterView> {
        let (reconciled, objects, origins, mut problems) = self.reconcile(loaded)?;
        let view = dns_view(
            &ClusterObjects {
                services: reconciled.services,
                pods: objects.pods,
                nodes: Vec::new(),
                slices: reconciled.slices,
                pools: Vec::new(),
            },
            &origins,
        );
        problems.extend(view.errors.iter().map(ToString::to_string));
        self.report(problems);
        Some(view.view)
    }

    /// Looks at the directory once and returns the changes to the model since the last
    /// look: the complete state the first time (even when empty), then only what changed
    /// (`None` when nothing did, or when the directory cannot be listed: the last state
    /// stays). Costs what changed: changed files are read, changed documents parsed, and
    /// only the Services the changed objects touch are allocated, planned and converted.
    pub fn poll_changes(&mut self) -> Option<Vec<Change>> {
        let dir = &self.settings.dir;
        let watcher = self.watcher.get_or_insert_with(|| DirectoryWatcher::new(dir.clone()));
        let changed = match watcher.scan(false)? {
            Scan::Unlisted(errors) => {
                for error in &errors {
                    warn!("{error}; the last state read stays");
                }
                return None;
            }
            Scan::Changed(changed) => changed,
        };
        let store = watcher.store();
        let mut phases = watcher.phases();
        let started = Instant::now();
        let output = self.delta.apply(changed, store, &mut self.allocator);
        phases.controller = started.elapsed();
        let mut problems: Vec<String> = store.errors().iter().map(ToString::to_string).collect();
        problems.extend(self.delta.problems(store));
        self.report(problems);
        if output.allocations_changed && self.settings.saves_allocations {
            self.save_allocations();
        }
        self.last_touched = output.services_touched;
        let started = Instant::now();
        let changes = self.differ.apply(output.partial);
        phases.diff = started.elapsed();
        self.phases = phases;
        debug!(changes = changes.len(), services = self.last_touched, ?phases, "manifests changed");
        Some(changes)
    }

    /// Where the time of the last [`Self::poll_changes`] that found a change went.
    pub fn phases(&self) -> Phases {
        self.phases
    }

    /// Files read and documents parsed by [`Self::poll_changes`] so far.
    pub fn counters(&self) -> StoreCounters {
        self.watcher.as_ref().map(DirectoryWatcher::counters).unwrap_or_default()
    }

    /// The manifest problems [`Self::poll_changes`] knows of now (for tests).
    #[cfg(test)]
    pub(crate) fn store_errors(&self) -> Vec<String> {
        self.watcher.as_ref().map(|w| w.store().errors().iter().map(ToString::to_string).collect()).unwrap_or_default()
    }

    /// How many Services the last [`Self::poll_changes`] allocated, planned and converted.
    pub fn services_touched(&self) -> usize {
        self.last_touched
    }

    /// Watches the directory on a thread of its own ([`Self::poll_changes`] in a loop); the
    /// first state and then every change go to `sender` until `stop` is set. The directory
    /// is looked at every 50 ms, or less often when one look takes longer than 2.5 ms (at
    /// most every [`DEFAULT_POLL_INTERVAL`] x 5), so that polling stays under 5% of a core.
    pub fn spawn_changes(
        mut self,
        sender: Sender<Vec<Change>>,
        stop: Arc<AtomicBool>,
    ) -> Result<JoinHandle<()>, FeedError> {
        std::thread::Builder::new()
            .name("manifests-feed".to_owned())
            .spawn(move || {
                let mut first = true;
                let mut logged = false;
                while !stop.load(Ordering::Acquire) {
                    let started = Instant::now();
                    let changes = self.poll_changes();
                    if !logged && let Some(changes) = &changes {
                        logged = true;
                        let phases = self.phases;
                        info!(
                            changes = changes.len(),
                            elapsed = ?started.elapsed(),
                            list = ?phases.list,
                            read = ?phases.read,
                            split = ?phases.split,
                            parse = ?phases.parse,
                            store = ?phases.store,
                            controller = ?phases.controller,
                            diff = ?phases.diff,
                            "manifests read"
                        );
                    }
                    // The first state is sent even when empty: it says the state is known.
                    if let Some(changes) = changes
                        && (!changes.is_empty() || std::mem::take(&mut first))
                        && sender.send(changes).is_err()
                    {
                        stop.store(true, Ordering::Release);
                        break;
                    }
                    let interval = (started.elapsed() * 20).clamp(FAST_POLL_INTERVAL, DEFAULT_POLL_INTERVAL * 5);
                    sleep_unless_stopped(interval, &stop);
                }
            })
            .map_err(FeedError::Spawn)
    }

    /// Watches the directory; every readable read's discovery view goes to `sender`.
    pub fn spawn_discovery(
        self,
        sender: Sender<ClusterView>,
        stop: Arc<AtomicBool>,
    ) -> Result<JoinHandle<()>, FeedError> {
        self.spawn(stop, move |feed, loaded| match feed.discovery(loaded) {
            Some(view) => sender.send(view).is_ok(),
            None => true,
        })
    }

    /// Runs `handle` for every new read until it returns false (its receiver is gone) or
    /// `stop` is set.
    fn spawn(
        mut self,
        stop: Arc<AtomicBool>,
        mut handle: impl FnMut(&mut Self, Loaded) -> bool + Send + 'static,
    ) -> Result<JoinHandle<()>, FeedError> {
        let (reads, read) = std::sync::mpsc::channel();
        let watcher =
            DirectoryWatcher::new(self.settings.dir.clone()).spawn(DEFAULT_POLL_INTERVAL, reads, Arc::clone(&stop));
        let watcher = watcher.map_err(FeedError::Spawn)?;
        std::thread::Builder::new()
            .name("manifests-feed".to_owned())
            .spawn(move || {
                while let Ok(first) = read.recv() {
                    // Reads may queue up while one is handled: each is complete, the newest wins.
                    let newest = read.try_iter().last().unwrap_or(first);
                    if !handle(&mut self, newest) {
                        stop.store(true, Ordering::Release);
                        break;
                    }
                }
                let _ = watcher.join();
            })
            .map_err(FeedError::Spawn)
    }

    /// Allocation and slices for one read, with the problems found on the way; `None` if
    /// the directory itself could not be listed.
    fn reconcile(&mut self, loaded: Loaded) -> Option<(Reconciled, ClusterObjects, Origins, Vec<String>)> {
        if loaded.errors.iter().any(|error| is_unlisted(error, &self.settings.dir)) {
            if !std::mem::replace(&mut self.warned_unlisted, true) {
                for error in &loaded.errors {
                    warn!("{error}; the last state read stays");
                }
            }
            return None;
        }
        self.warned_unlisted = false;
        let Loaded { objects, origins, errors } = loaded;
        let mut problems: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let reconciled = svcplane_controller::reconcile(&objects, &mut self.allocator);
        for error in &reconciled.errors {
            let object = ObjectRef::new(ObjectKind::Service, &error.service().namespace, &error.service().name);
            match origins.file_of(&object) {
                Some(file) => problems.push(format!("{}: {error}", file.display())),
                None => problems.push(error.to_string()),
            }
        }
        problems.extend(reconciled.load_balancer_problems.iter().cloned());
        if reconciled.allocations_changed && self.settings.saves_allocations {
            self.save_allocations();
        }
        Some((reconciled, objects, origins, problems))
    }

    fn report(&mut self, problems: Vec<String>) {
        if problems != self.reported {
            for problem in &problems {
                warn!("{problem}");
            }
            self.reported = problems;
        }
    }

    fn save_allocations(&self) {
        let Some(file) = &self.settings.allocations_file else {
            return;
        };
        // Write then rename, so a crash never leaves half a record.
        let temporary = file.with_extension("tmp");
        let result = std::fs::write(&temporary, self.allocator.record().to_json())
            .and_then(|()| std::fs::rename(&temporary, file));
        if let Err(error) = result {
            warn!("saving allocations to {}: {error}", file.display());
        }
    }
}

fn is_unlisted(error: &ManifestError, dir: &Path) -> bool {
    matches!(error, ManifestError::ListDirectory { path, .. } if path == dir)
}
