//! Bounded request load: a thread inside a namespace sends one echo request after another
//! (a new TCP connection, or a new UDP socket, each time) until it is stopped, a request
//! count is reached or a time limit passes, and counts what failed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::namespace::run_in_namespace_within;
use crate::probe::{Protocol, tcp_request, udp_request};

/// What a load sends, and its bounds.
#[derive(Debug, Clone, Copy)]
pub struct LoadSpec {
    pub protocol: Protocol,
    pub target: SocketAddr,
    /// Pause between one request's end and the next one's start.
    pub pause: Duration,
    /// How long one request may take before it counts as failed.
    pub timeout: Duration,
    pub max_requests: u64,
    pub max_duration: Duration,
}

/// What a load saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub sent: u64,
    pub failed: u64,
    /// The first failures, described (at most ten).
    pub first_failures: Vec<String>,
    /// Answers per answering server.
    pub answered_by: BTreeMap<String, u64>,
}

/// A load running on a thread of its own.
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    worker: JoinHandle<LoadReport>,
}

impl Load {
    /// Starts sending from inside `namespace`. Panics if the target is outside the lab's
    /// address plan: load never leaves the lab.
    pub fn start(namespace: &str, spec: LoadSpec) -> Load {
        Self::start_within(namespace, None, spec)
    }

    /// [`Load::start`] from a thread in `cgroup` (a lab node's, see [`crate::cgroup`]).
    pub fn start_within(namespace: &str, cgroup: Option<PathBuf>, spec: LoadSpec) -> Load {
        assert!(
            crate::address_plan::is_lab_address(spec.target.ip()),
            "load to {} refused: outside the lab's address plan",
            spec.target
        );
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let namespace = namespace.to_owned();
        let worker = std::thread::Builder::new()
            .name(format!("load-{}", spec.target))
            .spawn(move || {
                let result = run_in_namespace_within(&namespace, cgroup.as_deref(), || send(spec, &stopping));
                result.unwrap_or_else(|error| LoadReport {
                    sent: 1,
                    failed: 1,
                    first_failures: vec![format!("entering {namespace}: {error}")],
                    answered_by: BTreeMap::new(),
                })
            })
            .expect("starting a load thread");
        Load { stop, worker }
    }

    /// Whether the load has reached its request count or time bound.
    pub fn is_finished(&self) -> bool {
        self.worker.is_finished()
    }

    /// Stops the load (the request under way finishes) and returns what it saw.
    pub fn finish(self) -> LoadReport {
        self.stop.store(true, Ordering::Release);
        self.worker.join().expect("the load thread does not panic")
    }
}

fn send(spec: LoadSpec, stop: &AtomicBool) -> LoadReport {
    let mut report = LoadReport::default();
    let started = Instant::now();
    while !stop.load(Ordering::Acquire) && report.sent < spec.max_requests && started.elapsed() < spec.max_duration {
        report.sent += 1;
        let result = match spec.protocol {
            Protocol::Tcp => tcp_request(spec.target, spec.timeout),
            Protocol::Udp => udp_request(spec.target, spec.timeout, None),
        };
        match result {
            Ok(reply) => *report.answered_by.entry(reply.server_name).or_default() += 1,
            Err(error) => {
                report.failed += 1;
                if report.first_failures.len() < 10 {
                    report.first_failures.push(format!(
                        "request {} after {:?}: {error}",
                        report.sent,
                        started.elapsed()
                    ));
                }
            }
        }
        std::thread::sleep(spec.pause);
    }
    report
}
