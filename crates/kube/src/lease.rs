//! Leader election through a `coordination.k8s.io/v1` Lease, with client-go's
//! `leaderelection` semantics, so that of several `svcplane controller` replicas only one
//! writes at a time.
//!
//! The Lease's spec is the record: `holderIdentity`, `leaseDurationSeconds`, `acquireTime`,
//! `renewTime`, `leaseTransitions`. A candidate
//!
//! - creates the Lease when it does not exist;
//! - takes it when its holder is empty or when the record has not changed for
//!   `leaseDurationSeconds` as measured on the candidate's own monotonic clock from the
//!   moment the candidate first saw that record (never by comparing the writer's
//!   `renewTime` with its own wall clock: clocks of two machines need not agree);
//! - writes with the resourceVersion it read, so of two candidates writing at once the API
//!   server accepts one and answers 409 Conflict to the other, which then keeps waiting;
//! - as the leader, renews every retry period and gives up when no renewal succeeded for
//!   the renew deadline, or at once when it reads a record held by someone else;
//! - on shutdown releases the Lease (empty holder, duration 1 s) so a follower takes over
//!   at its next try instead of waiting out the lease.
//!
//! [`decide`] is the whole decision as a pure function; [`LeaderElector`] does the I/O.
//! What it does not do: no preferred holders or coordinated leader election
//! (`spec.strategy`), no Lease of other kinds (ConfigMap or Endpoints locks), and nothing
//! after leadership is lost: the caller exits, as kube-controller-manager does.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{debug, info, warn};

/// client-go's `JitterFactor`: a waiting candidate retries after a random time between one
/// retry period and 2.2 of them.
pub const JITTER_FACTOR: f64 = 1.2;

/// The timings and the Lease of an election (kube-controller-manager's flag names in the
/// docs of each field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// `--leader-elect-resource-namespace`.
    pub namespace: String,
    /// `--leader-elect-resource-name`.
    pub name: String,
    /// This candidate's identity: `<hostname>_<random>` by default ([`default_identity`]).
    pub identity: String,
    /// `--leader-elect-lease-duration`: how long followers wait after the record last
    /// changed before they take it.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`: how long the leader keeps trying to renew before it
    /// gives up.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`: how often the leader renews and followers try.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// kube-controller-manager's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// client-go's checks: the lease outlasts the renew deadline, which outlasts a jittered
    /// retry period; nothing is zero. The error names the flags.
    pub fn validate(&self) -> Result<(), String> {
        if self.retry_period.is_zero() {
            return Err("--leader-elect-retry-period must be greater than zero".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be greater than --leader-elect-renew-deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * JITTER_FACTOR {
            return Err(format!(
                "--leader-elect-renew-deadline ({:?}) must be greater than {JITTER_FACTOR} x \
                 --leader-elect-retry-period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.identity.is_empty() {
            return Err("the leader election identity is empty".into());
        }
        if self.lease_duration.as_secs() == 0 || i32::try_from(self.lease_duration.as_secs()).is_err() {
            return Err(format!(
                "--leader-elect-lease-duration ({:?}) must be at least 1s and fit the Lease's seconds",
                self.lease_duration
            ));
        }
        Ok(())
    }
}

/// `<hostname>_<random>`, as kube-controller-manager names its candidates (hostname and a
/// UUID): unique per process, so a restarted replica is a new candidate.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned());
    let (a, b) = (random_u64(), random_u64());
    // A version-4 UUID's layout.
    format!(
        "{host}_{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// 64 random bits from the standard library's per-process random hash keys.
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    hasher.finish()
}

/// The leader election record held in a Lease's spec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    pub holder: String,
    pub lease_duration_seconds: i32,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
}

impl LeaseRecord {
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds.unwrap_or_default(),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or_default(),
        }
    }

    fn spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(self.lease_duration_seconds),
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: Some(self.transitions),
            ..LeaseSpec::default()
        }
    }
}

/// A record as this candidate saw it, and since when (local monotonic clock): the time
/// from which its expiry is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub record: LeaseRecord,
    pub since: Instant,
}

impl Observed {
    /// Takes `record`, read at `now`: the observation time moves only when the record
    /// changed (a holder that keeps renewing changes `renewTime` each time).
    pub fn update(previous: Option<Observed>, record: LeaseRecord, now: Instant) -> Observed {
        match previous {
            Some(previous) if previous.record == record => previous,
            _ => Observed { record, since: now },
        }
    }

    /// Whether the holder's lease still runs at `now`.
    pub fn valid_at(&self, now: Instant) -> bool {
        let duration = Duration::from_secs(u64::try_from(self.record.lease_duration_seconds.max(0)).unwrap_or(0));
        self.since + duration > now
    }
}

/// What the last read of the Lease gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The Lease does not exist.
    Absent,
    /// The Lease exists; its record as observed.
    Found(Observed),
    /// The read failed (API unreachable, ...).
    Failed,
}

/// What to do after a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Create the Lease with this candidate as holder.
    Create,
    /// Take the Lease over (its holder is empty or its lease ran out).
    Acquire,
    /// This candidate holds the Lease: write a new renewTime.
    Renew,
    /// Someone else holds a valid lease (or the read failed): try again later.
    Wait { holder: String },
    /// This candidate led and must stop: someone else holds the Lease, or no renewal
    /// succeeded within the renew deadline.
    Lost { reason: String },
}

/// The election's decision, a pure function. `renewed` is when this candidate last wrote
/// the Lease successfully as its holder (`None` when it is not leading).
pub fn decide(read: &Read, now: Instant, identity: &str, renewed: Option<Instant>, config: &LeaseConfig) -> Decision {
    let deadline_passed = renewed.is_some_and(|at| now.saturating_duration_since(at) >= config.renew_deadline);
    match read {
        Read::Failed if deadline_passed => {
            Decision::Lost { reason: format!("no renewal succeeded within {:?}", config.renew_deadline) }
        }
        Read::Failed => Decision::Wait { holder: String::new() },
        Read::Absent if deadline_passed => {
            Decision::Lost { reason: format!("no renewal succeeded within {:?}", config.renew_deadline) }
        }
        Read::Absent => Decision::Create,
        Read::Found(observed) => {
            let holder = &observed.record.holder;
            if holder == identity {
                if deadline_passed {
                    Decision::Lost { reason: format!("no renewal succeeded within {:?}", config.renew_deadline) }
                } else {
                    Decision::Renew
                }
            } else if !holder.is_empty() && observed.valid_at(now) {
                if renewed.is_some() {
                    Decision::Lost { reason: format!("the Lease is held by {holder}") }
                } else {
                    Decision::Wait { holder: holder.clone() }
                }
            } else if deadline_passed {
                Decision::Lost { reason: format!("no renewal succeeded within {:?}", config.renew_deadline) }
            } else {
                Decision::Acquire
            }
        }
    }
}

/// The record a successful [`Decision`] writes at wall-clock time `wall`.
pub fn next_record(
    decision: &Decision,
    read: &Read,
    identity: &str,
    lease_seconds: i32,
    wall: Timestamp,
) -> LeaseRecord {
    let old = match read {
        Read::Found(observed) => observed.record.clone(),
        _ => LeaseRecord::default(),
    };
    let mut record = LeaseRecord {
        holder: identity.to_owned(),
        lease_duration_seconds: lease_seconds,
        acquire_time: Some(wall),
        renew_time: Some(wall),
        transitions: old.transitions,
    };
    match decision {
        Decision::Renew => record.acquire_time = old.acquire_time.or(Some(wall)),
        Decision::Acquire => record.transitions = old.transitions + 1,
        _ => {}
    }
    record
}

/// Why leading ended.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("leader election lost (Lease {namespace}/{name}): {reason}")]
    Lost { namespace: String, name: String, reason: String },
}

/// One candidate: reads and writes its Lease.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    observed: Option<Observed>,
    /// The Lease as last read or written (its resourceVersion guards the next write).
    lease: Option<Lease>,
    renewed: Option<Instant>,
    leading: Arc<AtomicBool>,
}

impl LeaderElector {
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            lease: None,
            renewed: None,
            leading: Arc::new(AtomicBool::new(false)),
        }
    }

    /// True while this candidate leads (for the `leader_election_master_status` gauge).
    pub fn leading(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.leading)
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Reads the Lease, decides, writes: one try of client-go's `tryAcquireOrRenew`.
    pub async fn try_acquire_or_renew(&mut self) -> Decision {
        let now = Instant::now();
        let limit = self.config.renew_deadline;
        let read = match within(limit, self.api.get_opt(&self.config.name)).await {
            Ok(None) => Read::Absent,
            Ok(Some(lease)) => {
                let observed = Observed::update(self.observed.take(), LeaseRecord::of(&lease), now);
                self.observed = Some(observed.clone());
                self.lease = Some(lease);
                Read::Found(observed)
            }
            Err(error) => {
                debug!(lease = %self.config.name, "reading the Lease failed: {error}");
                Read::Failed
            }
        };
        let decision = decide(&read, now, &self.config.identity, self.renewed, &self.config);
        if !matches!(decision, Decision::Create | Decision::Acquire | Decision::Renew) {
            return decision;
        }
        let seconds = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let record = next_record(&decision, &read, &self.config.identity, seconds, Timestamp::now());
        let written = match (&decision, &self.lease) {
            (Decision::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(record.spec()),
                };
                within(limit, self.api.create(&PostParams::default(), &lease)).await
            }
            (_, Some(lease)) => {
                // The resourceVersion read is kept: a write in between is a 409 Conflict.
                let lease = Lease { spec: Some(record.spec()), ..lease.clone() };
                within(limit, self.api.replace(&self.config.name, &PostParams::default(), &lease)).await
            }
        };
        match written {
            Ok(lease) => {
                self.observed = Some(Observed { record: LeaseRecord::of(&lease), since: Instant::now() });
                self.lease = Some(lease);
                self.renewed = Some(now);
                if !self.leading.swap(true, Ordering::AcqRel) {
                    info!(lease = %self.config.name, identity = %self.config.identity, transitions = record.transitions, "became the leader");
                }
                decision
            }
            Err(error) => {
                let conflict = matches!(&error, kube::Error::Api(status) if status.code == 409);
                if conflict {
                    debug!(lease = %self.config.name, "another candidate wrote the Lease first");
                } else {
                    warn!(lease = %self.config.name, "writing the Lease failed: {error}");
                }
                // Judge again with the write failed: a leader past its deadline has lost.
                match decide(&Read::Failed, Instant::now(), &self.config.identity, self.renewed, &self.config) {
                    lost @ Decision::Lost { .. } => lost,
                    _ => Decision::Wait { holder: String::new() },
                }
            }
        }
    }

    /// Waits until this candidate leads (`Ok(true)`) or `stop` is set (`Ok(false)`).
    pub async fn acquire(&mut self, stop: &AtomicBool) -> bool {
        let mut announced: Option<String> = None;
        loop {
            if stop.load(Ordering::Acquire) {
                return false;
            }
            match self.try_acquire_or_renew().await {
                Decision::Create | Decision::Acquire | Decision::Renew => return true,
                Decision::Wait { holder } => {
                    if !holder.is_empty() && announced.as_ref() != Some(&holder) {
                        info!(lease = %self.config.name, %holder, "waiting for the leader's lease to run out");
                        announced = Some(holder);
                    }
                }
                Decision::Lost { .. } => {}
            }
            sleep_unless_stopped(jittered(self.config.retry_period), stop).await;
        }
    }

    /// Renews every retry period until leadership is lost.
    pub async fn renew_until_lost(&mut self) -> LeaseError {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            if let Decision::Lost { reason } = self.try_acquire_or_renew().await {
                self.leading.store(false, Ordering::Release);
                return LeaseError::Lost {
                    namespace: self.config.namespace.clone(),
                    name: self.config.name.clone(),
                    reason,
                };
            }
        }
    }

    /// Gives the Lease up if this candidate holds it (client-go's `ReleaseOnCancel`): empty
    /// holder, duration 1 s, transitions kept. Best effort: a failure is logged.
    pub async fn release(&mut self) {
        if !self.leading.swap(false, Ordering::AcqRel) {
            return;
        }
        let Some(lease) = self.lease.clone() else { return };
        let old = LeaseRecord::of(&lease);
        if old.holder != self.config.identity {
            return;
        }
        let now = Timestamp::now();
        let record = LeaseRecord {
            holder: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(now),
            renew_time: Some(now),
            transitions: old.transitions,
        };
        let lease = Lease { spec: Some(record.spec()), ..lease };
        match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            Ok(_) => info!(lease = %self.config.name, "released the Lease"),
            Err(error) => warn!(lease = %self.config.name, "releasing the Lease failed: {error}"),
        }
        self.renewed = None;
    }
}

/// `call`, failed with a timeout error when it takes longer than `limit` (client-go bounds
/// each try by the renew deadline).
async fn within<T>(limit: Duration, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(format!("no answer within {limit:?}").into())),
    }
}

/// A retry period stretched by a random factor in [1, 1 + JITTER_FACTOR).
fn jittered(period: Duration) -> Duration {
    let fraction = (random_u64() >> 11) as f64 / (1u64 << 53) as f64;
    period.mul_f64(1.0 + JITTER_FACTOR * fraction)
}

async fn sleep_unless_stopped(duration: Duration, stop: &AtomicBool) {
    let until = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < until && !stop.load(Ordering::Acquire) {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
}

/// Runs `lead` while this candidate leads: waits for the Lease, runs `lead` beside the
/// renewal loop, and when `stop` is set lets `lead` finish (it must watch `stop` too) before
/// releasing the Lease. Losing the Lease drops `lead` at once (no write after that point
/// from this task) and returns the error; the caller should exit non-zero.
pub async fn run_while_leading<F>(
    elector: &mut LeaderElector,
    stop: Arc<AtomicBool>,
    lead: impl FnOnce() -> F,
) -> Result<Option<F::Output>, LeaseError>
where
    F: Future,
{
    info!(
        lease = %format!("{}/{}", elector.config.namespace, elector.config.name),
        identity = %elector.config.identity,
        "waiting to lead"
    );
    if !elector.acquire(&stop).await {
        return Ok(None);
    }
    let leading = lead();
    let output = {
        let renewing = elector.renew_until_lost();
        tokio::pin!(leading, renewing);
        tokio::select! {
            output = &mut leading => output,
            lost = &mut renewing => return Err(lost),
        }
    };
    elector.release().await;
    Ok(Some(output))
}

#[cfg(test)]
mod tests;
