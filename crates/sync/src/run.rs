//! The loop: changes in, plan updated, one dataplane synced, hooks told.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use svcplane_core::{Change, ClusterState, Dataplane, NodeConfig, NodePlan, PlanDiff, SyncReport};
use tracing::{debug, info, warn};

use crate::hooks::{AfterSync, Synced};

/// Waits between retries of a failed sync: `first`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait after `failures` failures in a row (at least one).
    pub fn after(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.first.saturating_mul(1 << doublings).min(self.max)
    }
}

/// The loop's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopSettings {
    /// Changes arriving sooner after a sync wait this long, and are synced together.
    pub min_sync_interval: Duration,
    pub retry: Backoff,
    /// How long the loop waits for changes before it checks for drift, retries or a stop.
    pub tick: Duration,
}

impl Default for LoopSettings {
    fn default() -> Self {
        Self {
            min_sync_interval: Duration::ZERO,
            retry: Backoff { first: Duration::from_secs(1), max: Duration::from_secs(30) },
            tick: Duration::from_millis(100),
        }
    }
}

/// What one turn of the loop did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// Nothing to do (no changes, no retry due, no drift), or still waiting for the feed's
    /// first complete state.
    Idle,
    /// Changes are waiting for the minimum interval or a retry's backoff.
    Waiting,
    Synced(SyncReport),
    Failed {
        error: String,
        retry_in: Duration,
    },
}

/// The node's sync loop: one cluster state, one plan, one dataplane.
#[derive(Debug)]
pub struct SyncLoop {
    state: ClusterState,
    plan: NodePlan,
    dataplane: Box<dyn Dataplane>,
    hooks: Vec<Box<dyn AfterSync>>,
    settings: LoopSettings,
    /// Everything changed since the last successful sync.
    pending: PlanDiff,
    /// The feed has delivered its first complete state; before that nothing is programmed.
    has_state: bool,
    has_synced: bool,
    last_sync: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
    force: bool,
}

impl SyncLoop {
    pub fn new(config: NodeConfig, dataplane: Box<dyn Dataplane>, settings: LoopSettings) -> Self {
        Self {
            state: ClusterState::new(),
            plan: NodePlan::new(config),
            dataplane,
            hooks: Vec::new(),
            settings,
            pending: PlanDiff::default(),
            has_state: false,
            has_synced: false,
            last_sync: None,
            failures: 0,
            retry_at: None,
            force: false,
        }
    }

    /// Adds a hook told after every sync, in the order added.
    pub fn with_hook(mut self, hook: Box<dyn AfterSync>) -> Self {
        self.hooks.push(hook);
        self
    }

    pub fn plan(&self) -> &NodePlan {
        &self.plan
    }

    pub fn dataplane(&self) -> &dyn Dataplane {
        self.dataplane.as_ref()
    }

    /// Takes one batch of a feed. The first batch is the feed's complete state.
    pub fn ingest(&mut self, changes: Vec<Change>) {
        for hook in &mut self.hooks {
            hook.ingested(&changes);
        }
        self.state.apply_all(changes);
        self.has_state = true;
    }

    /// Replans what the ingested changes touched and syncs if a sync is due at `now`.
    pub fn turn(&mut self, now: Instant) -> Turn {
        if !self.has_state {
            return Turn::Idle;
        }
        if self.state.has_pending_changes() {
            let changes = self.state.take_changes();
            let started = Instant::now();
            self.pending.absorb(self.plan.update(&self.state, &changes));
            debug!(services = changes.services.len(), everything = changes.everything, elapsed = ?started.elapsed(), "planned");
        }
        if let Some(found) = self.dataplane.detect_drift() {
            warn!(
                mode = self.dataplane.mode(),
                "the kernel state changed behind svcplane's back ({found}); resyncing in full"
            );
            for hook in &mut self.hooks {
                hook.drifted(&found);
            }
            self.dataplane.request_full_resync();
            self.force = true;
        }
        let wanted = !self.has_synced || self.force || !self.pending.is_empty();
        if !wanted {
            return Turn::Idle;
        }
        if let Some(at) = self.retry_at
            && now < at
        {
            return Turn::Waiting;
        }
        if self.retry_at.is_none()
            && let Some(last) = self.last_sync
            && now.duration_since(last) < self.settings.min_sync_interval
        {
            return Turn::Waiting;
        }
        self.sync(now)
    }

    fn sync(&mut self, now: Instant) -> Turn {
        let diff = std::mem::take(&mut self.pending).without_round_trips(&self.plan);
        let started = Instant::now();
        let result = self.dataplane.sync(&self.plan, &diff);
        let usage = self.dataplane.table_usage();
        if !usage.is_empty() {
            for hook in &mut self.hooks {
                hook.table_usage(&usage);
            }
        }
        match result {
            Ok(report) => {
                self.has_synced = true;
                self.force = false;
                self.failures = 0;
                self.retry_at = None;
                self.last_sync = Some(now);
                let elapsed = started.elapsed();
                let rule_counts = self.dataplane.rule_counts();
                let synced = Synced {
                    plan: &self.plan,
                    diff: &diff,
                    report: &report,
                    elapsed,
                    state: &self.state,
                    rule_counts: &rule_counts,
                };
                for hook in &mut self.hooks {
                    hook.synced(&synced);
                }
                info!(
                    mode = self.dataplane.mode(),
                    full = report.full,
                    service_ports = report.service_ports,
                    operations = report.operations,
                    elapsed = ?started.elapsed(),
                    "synced"
                );
                Turn::Synced(report)
            }
            Err(error) => {
                // The diff stays for the next try, and anything newer joins it.
                let mut pending = diff;
                pending.absorb(std::mem::take(&mut self.pending));
                self.pending = pending;
                self.failures += 1;
                let retry_in = self.settings.retry.after(self.failures);
                self.retry_at = Some(now + retry_in);
                for hook in &mut self.hooks {
                    hook.failed(&error);
                }
                let error = error_chain(error.as_ref());
                warn!(
                    mode = self.dataplane.mode(),
                    failures = self.failures,
                    "sync failed, the previous rules stay in place; retrying in {retry_in:?}: {error}"
                );
                Turn::Failed { error, retry_in }
            }
        }
    }

    /// Runs until `stop` is set or the feed is gone: batches from `feed` in, syncs out.
    pub fn run(&mut self, feed: &Receiver<Vec<Change>>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match feed.recv_timeout(self.settings.tick) {
                Ok(changes) => {
                    self.ingest(changes);
                    for more in feed.try_iter() {
                        self.ingest(more);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.turn(Instant::now());
            for hook in &mut self.hooks {
                hook.tick(&self.plan, &self.state);
            }
        }
    }
}

/// An error with its causes, `outer: inner: innermost`.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
