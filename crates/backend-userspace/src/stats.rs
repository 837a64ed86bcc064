//! The relay's own counters: what it did and what it refused, for logs, tests and
//! `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Pipes the kernel would not enlarge to 1 MiB (`fs.pipe-max-size`, or the user's pipe
/// quota `fs.pipe-user-pages-soft` without `CAP_SYS_RESOURCE`): they move 64 KiB or less
/// per call. Process-wide, like the pipe pool.
pub static PIPES_NOT_ENLARGED: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
pub struct Stats {
    started: Instant,
    /// Connections (TCP) and sessions (UDP) relayed to an endpoint.
    pub connections: AtomicU64,
    /// Open connections and sessions now.
    pub active: AtomicU64,
    /// Connects to an endpoint that failed (each one retried on the next, if any).
    pub connect_failures: AtomicU64,
    /// Clients failed because every eligible endpoint failed.
    pub exhausted: AtomicU64,
    /// Clients refused because their service port's table was full.
    pub refused_full: AtomicU64,
    /// Clients refused because the process ran out of file descriptors.
    pub refused_no_fds: AtomicU64,
    /// UDP datagrams dropped because a socket buffer was full (backpressure).
    pub udp_dropped: AtomicU64,
    /// Connections closed because their endpoint was removed (after the grace period).
    pub closed_removed: AtomicU64,
    /// Bytes relayed, both directions.
    pub bytes: AtomicU64,
    /// Descriptors the relay may hold for connections and sessions (set at start from
    /// `RLIMIT_NOFILE`, less a reserve for listeners, pipes and the rest of the process).
    pub fd_budget: AtomicU64,
    /// Descriptors held for connections and sessions now.
    pub fds_held: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            connections: AtomicU64::new(0),
            active: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            exhausted: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
            refused_no_fds: AtomicU64::new(0),
            udp_dropped: AtomicU64::new(0),
            closed_removed: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fd_budget: AtomicU64::new(u64::MAX),
            fds_held: AtomicU64::new(0),
        }
    }
}

impl Stats {
    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// The counters as Prometheus text (`svcplane_userspace_*`).
    pub fn prometheus(&self) -> String {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, lines: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP svcplane_userspace_{name} {help}");
            let _ = writeln!(out, "# TYPE svcplane_userspace_{name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "svcplane_userspace_{name}{labels} {value}");
            }
        };
        family(
            "connections_total",
            "counter",
            "Connections and UDP sessions the relay opened to an endpoint.",
            &[("", get(&self.connections))],
        );
        family("active_connections", "gauge", "Open connections and UDP sessions.", &[("", get(&self.active))]);
        family(
            "connect_failures_total",
            "counter",
            "Connects to an endpoint that failed (retried on the next eligible endpoint).",
            &[("", get(&self.connect_failures))],
        );
        family(
            "refused_total",
            "counter",
            "Clients the relay refused, by reason.",
            &[
                ("{reason=\"all_endpoints_failed\"}", get(&self.exhausted)),
                ("{reason=\"max_connections\"}", get(&self.refused_full)),
                ("{reason=\"file_descriptors\"}", get(&self.refused_no_fds)),
            ],
        );
        family(
            "udp_dropped_total",
            "counter",
            "UDP datagrams dropped because a socket buffer was full.",
            &[("", get(&self.udp_dropped))],
        );
        family(
            "closed_removed_total",
            "counter",
            "Connections closed because their endpoint was removed, after the grace period.",
            &[("", get(&self.closed_removed))],
        );
        family("bytes_total", "counter", "Bytes relayed, both directions.", &[("", get(&self.bytes))]);
        family(
            "pipes_not_enlarged_total",
            "counter",
            "Pipes for splice the kernel kept below 1 MiB (pipe-max-size, or the user's pipe quota).",
            &[("", PIPES_NOT_ENLARGED.load(Ordering::Relaxed))],
        );
        family(
            "file_descriptors",
            "gauge",
            "Descriptors held for connections and sessions, and the most the relay may hold.",
            &[("{kind=\"held\"}", get(&self.fds_held)), ("{kind=\"budget\"}", get(&self.fd_budget))],
        );
        out
    }
}
