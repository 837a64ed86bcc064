//! How the relay behaves, and the one wait every relayed flow shares.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How the relay behaves; every field has a flag in `svcplane proxy`.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long one connect to an endpoint may take before the next one is tried.
    pub connect_timeout: Duration,
    /// A UDP session without a datagram either way for this long ends.
    pub udp_idle_timeout: Duration,
    /// How long a connection to an endpoint that was removed (not merely terminating)
    /// keeps going before it is closed.
    pub removed_grace: Duration,
    /// Open connections (or UDP sessions) per service port; more are refused at once.
    pub max_connections: usize,
    /// The accept backlog of each listener.
    pub backlog: i32,
    /// Threads of the relay's runtime.
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            udp_idle_timeout: Duration::from_secs(30),
            removed_grace: Duration::from_secs(10),
            max_connections: 50_000,
            backlog: 4096,
            threads: 2,
        }
    }
}

/// Waits until `endpoint` is no longer serving, then for the grace period.
pub async fn until_removed(
    mut serving: watch::Receiver<Arc<HashSet<SocketAddr>>>,
    endpoint: SocketAddr,
    grace: Duration,
) {
    loop {
        if !serving.borrow_and_update().contains(&endpoint) {
            break;
        }
        if serving.changed().await.is_err() {
            break;
        }
    }
    tokio::time::sleep(grace).await;
}
