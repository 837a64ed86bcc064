use std::time::{Duration, Instant};

use super::*;

const ME: &str = "node-a_1";
const OTHER: &str = "node-b_2";

fn config() -> LeaseConfig {
    LeaseConfig::new("kube-system", "svcplane-controller", ME)
}

fn held_by(holder: &str, since: Instant) -> Read {
    Read::Found(Observed {
        record: LeaseRecord { holder: holder.into(), lease_duration_seconds: 15, ..LeaseRecord::default() },
        since,
    })
}

#[test]
fn an_absent_lease_is_created() {
    let now = Instant::now();
    assert_eq!(decide(&Read::Absent, now, ME, None, &config()), Decision::Create);
}

#[test]
fn a_lease_held_by_someone_else_is_waited_for_until_it_has_not_changed_for_its_duration() {
    let seen = Instant::now();
    let read = held_by(OTHER, seen);
    let waiting = Decision::Wait { holder: OTHER.into() };
    assert_eq!(decide(&read, seen, ME, None, &config()), waiting);
    assert_eq!(decide(&read, seen + Duration::from_millis(14_999), ME, None, &config()), waiting);
    assert_eq!(decide(&read, seen + Duration::from_secs(15), ME, None, &config()), Decision::Acquire);
}

#[test]
fn expiry_is_counted_from_when_the_record_last_changed_on_the_local_clock() {
    let first = Instant::now();
    let record = LeaseRecord { holder: OTHER.into(), lease_duration_seconds: 15, ..LeaseRecord::default() };
    let observed = Observed::update(None, record.clone(), first);
    // The same record read again later keeps its first observation time...
    let again = Observed::update(Some(observed.clone()), record.clone(), first + Duration::from_secs(10));
    assert_eq!(again.since, first);
    // ...a renewed one (new renewTime) starts the count again.
    let renewed = LeaseRecord { renew_time: Some(Timestamp::UNIX_EPOCH), ..record };
    let later = first + Duration::from_secs(12);
    let fresh = Observed::update(Some(again), renewed, later);
    assert_eq!(fresh.since, later);
    assert!(fresh.valid_at(first + Duration::from_secs(20)));
    assert!(!fresh.valid_at(later + Duration::from_secs(15)));
}

#[test]
fn an_empty_holder_is_taken_at_once() {
    let now = Instant::now();
    assert_eq!(decide(&held_by("", now), now, ME, None, &config()), Decision::Acquire);
}

#[test]
fn the_holder_renews_and_loses_after_the_renew_deadline_without_a_renewal() {
    let renewed = Instant::now();
    let read = held_by(ME, renewed);
    assert_eq!(decide(&read, renewed + Duration::from_secs(2), ME, Some(renewed), &config()), Decision::Renew);
    assert!(matches!(
        decide(&Read::Failed, renewed + Duration::from_secs(9), ME, Some(renewed), &config()),
        Decision::Wait { .. }
    ));
    assert!(matches!(
        decide(&Read::Failed, renewed + Duration::from_secs(10), ME, Some(renewed), &config()),
        Decision::Lost { .. }
    ));
    assert!(matches!(
        decide(&read, renewed + Duration::from_secs(10), ME, Some(renewed), &config()),
        Decision::Lost { .. }
    ));
}

#[test]
fn a_leader_that_reads_another_holder_loses_at_once() {
    let now = Instant::now();
    match decide(&held_by(OTHER, now), now, ME, Some(now), &config()) {
        Decision::Lost { reason } => assert!(reason.contains(OTHER), "{reason}"),
        other => panic!("expected Lost, got {other:?}"),
    }
}

#[test]
fn a_failed_read_makes_a_follower_wait() {
    let now = Instant::now();
    assert_eq!(decide(&Read::Failed, now, ME, None, &config()), Decision::Wait { holder: String::new() });
}

#[test]
fn acquiring_counts_a_transition_and_renewing_keeps_the_acquire_time() {
    let acquired = Timestamp::from_second(1_000).unwrap();
    let now = Timestamp::from_second(2_000).unwrap();
    let old = LeaseRecord {
        holder: ME.into(),
        lease_duration_seconds: 15,
        acquire_time: Some(acquired),
        renew_time: Some(acquired),
        transitions: 3,
    };
    let read = Read::Found(Observed { record: old.clone(), since: Instant::now() });
    let renewed = next_record(&Decision::Renew, &read, ME, 15, now);
    assert_eq!((renewed.acquire_time, renewed.renew_time, renewed.transitions), (Some(acquired), Some(now), 3));
    let taken = next_record(&Decision::Acquire, &read, OTHER, 15, now);
    assert_eq!((taken.holder.as_str(), taken.acquire_time, taken.transitions), (OTHER, Some(now), 4));
    let created = next_record(&Decision::Create, &Read::Absent, ME, 15, now);
    assert_eq!((created.transitions, created.lease_duration_seconds), (0, 15));
}

#[test]
fn timings_that_could_let_two_leaders_overlap_are_refused_naming_the_flags() {
    let mut bad = config();
    bad.renew_deadline = Duration::from_secs(15);
    assert!(bad.validate().unwrap_err().contains("--leader-elect-lease-duration"));
    let mut bad = config();
    bad.retry_period = Duration::from_secs(9);
    assert!(bad.validate().unwrap_err().contains("--leader-elect-retry-period"));
    assert_eq!(config().validate(), Ok(()));
}

#[test]
fn identities_are_the_hostname_and_a_random_uuid() {
    let (a, b) = (default_identity(), default_identity());
    assert_ne!(a, b);
    let (_, uuid) = a.rsplit_once('_').unwrap();
    assert_eq!(uuid.len(), 36, "{uuid}");
    assert_eq!(uuid.split('-').map(str::len).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
}
