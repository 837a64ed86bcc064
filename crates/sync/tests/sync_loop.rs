//! The sync loop driven turn by turn with a dataplane that records what it was asked and
//! can be told to fail, and real health-check servers on loopback ports.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use svcplane_core::{
    Change, Dataplane, DataplaneError, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig,
    NodePlan, PlanDiff, Protocol, Service, ServicePort, ServiceType, SyncReport, TrafficPolicy,
};
use svcplane_sync::{AfterSync, Backoff, HealthServers, LoopSettings, SyncLoop, Turn};

/// What the recording dataplane saw, shared with the test.
#[derive(Debug, Default)]
struct Record {
    /// Per sync: the keys of its diff.
    diffs: Vec<Vec<String>>,
    /// Fail the syncs while this is set.
    failing: bool,
    /// Health-check answers read from inside each sync, before "the kernel" has the rules.
    health_during_sync: Vec<Option<u16>>,
    drift: Option<String>,
    full_resyncs_requested: usize,
}

#[derive(Debug)]
struct RecordingDataplane {
    record: Arc<Mutex<Record>>,
    health_port: Option<u16>,
}

impl Dataplane for RecordingDataplane {
    fn mode(&self) -> &'static str {
        "recording"
    }

    fn sync(&mut self, plan: &NodePlan, diff: &PlanDiff) -> Result<SyncReport, DataplaneError> {
        let answer = self.health_port.map(status_of);
        let mut record = self.record.lock().unwrap();
        record.health_during_sync.push(answer.flatten());
        record.diffs.push(diff.keys().map(|k| k.name.to_string()).collect());
        if record.failing {
            return Err("the kernel refused the transaction".into());
        }
        Ok(SyncReport {
            full: false,
            service_ports: diff.len(),
            operations: plan.service_ports.len(),
            rules_replaced: false,
        })
    }

    fn request_full_resync(&mut self) {
        self.record.lock().unwrap().full_resyncs_requested += 1;
    }

    fn detect_drift(&mut self) -> Option<String> {
        self.record.lock().unwrap().drift.take()
    }

    fn render(&self, _plan: &NodePlan) -> Result<String, DataplaneError> {
        Ok(String::new())
    }

    fn cleanup(&mut self) -> Result<bool, DataplaneError> {
        Ok(false)
    }
}

/// The HTTP status a health-check port answers, `None` if nothing listens.
fn status_of(port: u16) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        node_ips: vec!["198.18.0.11".parse().unwrap()],
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        ..NodeConfig::default()
    }
}

fn local_load_balancer(health_port: u16) -> Service {
    let mut service = Service::cluster_ip(
        NamespacedName::new("default", "web"),
        vec!["198.19.0.10".parse().unwrap()],
        vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: Some(30080) }],
    );
    service.service_type = ServiceType::LoadBalancer;
    service.external_traffic_policy = TrafficPolicy::Local;
    service.health_check_node_port = Some(health_port);
    service
}

fn slice(addresses: &[&str]) -> EndpointSlice {
    EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new("default", "web-1"),
        service: NamespacedName::new("default", "web"),
        family: IpFamily::V4,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
        endpoints: addresses.iter().map(|a| Endpoint::ready(a.parse().unwrap(), Some("node1"))).collect(),
    }
}

fn settings() -> LoopSettings {
    LoopSettings {
        min_sync_interval: Duration::ZERO,
        retry: Backoff { first: Duration::from_secs(1), max: Duration::from_secs(8) },
        tick: Duration::from_millis(10),
    }
}

fn sync_loop(health_port: Option<u16>) -> (SyncLoop, Arc<Mutex<Record>>) {
    let record = Arc::new(Mutex::new(Record::default()));
    let dataplane = RecordingDataplane { record: Arc::clone(&record), health_port };
    let sync = SyncLoop::new(config(), Box::new(dataplane), settings()).with_hook(Box::new(HealthServers::default()));
    (sync, record)
}

#[test]
fn the_health_check_node_port_never_answers_200_before_the_services_rules_are_synced() {
    let port = free_port();
    let (mut sync, record) = sync_loop(Some(port));
    sync.ingest(vec![
        Change::ServiceUpserted(local_load_balancer(port)),
        Change::SliceUpserted(slice(&["198.18.129.2"])),
    ]);
    assert!(matches!(sync.turn(Instant::now()), Turn::Synced(_)));
    assert_eq!(record.lock().unwrap().health_during_sync, vec![None], "nothing listened while the rules were going in");
    assert_eq!(status_of(port), Some(200), "after the sync the node says it can serve");
}

#[test]
fn a_failed_sync_turns_the_health_check_to_503_until_a_sync_succeeds() {
    let port = free_port();
    let (mut sync, record) = sync_loop(Some(port));
    let start = Instant::now();
    sync.ingest(vec![
        Change::ServiceUpserted(local_load_balancer(port)),
        Change::SliceUpserted(slice(&["198.18.129.2"])),
    ]);
    assert!(matches!(sync.turn(start), Turn::Synced(_)));
    assert_eq!(status_of(port), Some(200));

    record.lock().unwrap().failing = true;
    sync.ingest(vec![Change::SliceUpserted(slice(&["198.18.129.2", "198.18.129.3"]))]);
    assert!(matches!(sync.turn(start), Turn::Failed { .. }));
    assert_eq!(status_of(port), Some(503), "the kernel may not hold what the count says");

    record.lock().unwrap().failing = false;
    assert_eq!(sync.turn(start + Duration::from_millis(500)), Turn::Waiting, "the retry waits for its backoff");
    assert!(matches!(sync.turn(start + Duration::from_secs(1)), Turn::Synced(_)));
    assert_eq!(status_of(port), Some(200));
}

#[test]
fn nothing_is_synced_before_the_feed_delivers_its_first_state() {
    let (mut sync, record) = sync_loop(None);
    assert_eq!(sync.turn(Instant::now()), Turn::Idle);
    sync.ingest(Vec::new());
    assert!(matches!(sync.turn(Instant::now()), Turn::Synced(_)), "an empty cluster is still a state to program");
    assert_eq!(record.lock().unwrap().diffs.len(), 1);
    assert_eq!(sync.turn(Instant::now()), Turn::Idle, "and then nothing until something changes");
}

#[test]
fn a_failed_syncs_diff_is_handed_again_with_later_changes() {
    let (mut sync, record) = sync_loop(None);
    let start = Instant::now();
    sync.ingest(vec![Change::ServiceUpserted(local_load_balancer(32000))]);
    assert!(matches!(sync.turn(start), Turn::Synced(_)));
    record.lock().unwrap().failing = true;
    sync.ingest(vec![Change::SliceUpserted(slice(&["198.18.129.2"]))]);
    assert!(matches!(sync.turn(start), Turn::Failed { .. }));
    let mut other = local_load_balancer(32001);
    other.name = NamespacedName::new("default", "other");
    other.cluster_ips = vec!["198.19.0.11".parse().unwrap()];
    sync.ingest(vec![Change::ServiceUpserted(other)]);
    record.lock().unwrap().failing = false;
    assert!(matches!(sync.turn(start + Duration::from_secs(1)), Turn::Synced(_)));
    let diffs = record.lock().unwrap().diffs.clone();
    assert_eq!(diffs[2], ["default/other:http/tcp", "default/web:http/tcp"]);
}

#[test]
fn retries_back_off_doubling_up_to_the_maximum() {
    let backoff = Backoff { first: Duration::from_secs(1), max: Duration::from_secs(8) };
    let waits: Vec<u64> = (1..=6).map(|failures| backoff.after(failures).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
}

#[test]
fn drift_found_by_the_dataplane_forces_a_full_resync_without_any_change() {
    let (mut sync, record) = sync_loop(None);
    sync.ingest(Vec::new());
    assert!(matches!(sync.turn(Instant::now()), Turn::Synced(_)));
    record.lock().unwrap().drift = Some("the table is gone".into());
    assert!(matches!(sync.turn(Instant::now()), Turn::Synced(_)));
    assert_eq!(record.lock().unwrap().full_resyncs_requested, 1);
}

#[test]
fn changes_sooner_than_the_minimum_interval_wait_and_go_together() {
    let record = Arc::new(Mutex::new(Record::default()));
    let dataplane = RecordingDataplane { record: Arc::clone(&record), health_port: None };
    let mut sync = SyncLoop::new(
        config(),
        Box::new(dataplane),
        LoopSettings { min_sync_interval: Duration::from_secs(1), ..settings() },
    );
    let start = Instant::now();
    sync.ingest(vec![Change::ServiceUpserted(local_load_balancer(32000))]);
    assert!(matches!(sync.turn(start), Turn::Synced(_)));
    sync.ingest(vec![Change::SliceUpserted(slice(&["198.18.129.2"]))]);
    assert_eq!(sync.turn(start + Duration::from_millis(200)), Turn::Waiting);
    assert!(matches!(sync.turn(start + Duration::from_secs(1)), Turn::Synced(_)));
}

/// A hook that counts, to show hooks hear successes and failures in order.
#[derive(Debug, Default)]
struct Counting(Arc<Mutex<(usize, usize)>>);

impl AfterSync for Counting {
    fn synced(&mut self, _sync: &svcplane_sync::Synced<'_>) {
        self.0.lock().unwrap().0 += 1;
    }

    fn failed(&mut self, _error: &DataplaneError) {
        self.0.lock().unwrap().1 += 1;
    }
}

#[test]
fn hooks_hear_every_success_and_every_failure() {
    let counts = Arc::new(Mutex::new((0, 0)));
    let record = Arc::new(Mutex::new(Record::default()));
    let dataplane = RecordingDataplane { record: Arc::clone(&record), health_port: None };
    let mut sync =
        SyncLoop::new(config(), Box::new(dataplane), settings()).with_hook(Box::new(Counting(Arc::clone(&counts))));
    let start = Instant::now();
    sync.ingest(Vec::new());
    sync.turn(start);
    record.lock().unwrap().failing = true;
    sync.ingest(vec![Change::ServiceUpserted(local_load_balancer(32000))]);
    sync.turn(start);
    assert_eq!(*counts.lock().unwrap(), (1, 1));
}
