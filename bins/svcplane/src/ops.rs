//! The proxy's healthz and metrics servers, wired to the sync loop: addresses in, servers
//! and the loop's hook out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use svcplane_ops::http::Server;
use svcplane_ops::status::{CounterReader, StatusBoard, StatusFeed, counter_metrics, status_routes};
use svcplane_ops::{ExtraMetrics, OpsFeed, ProxyHealth, healthz_routes, metrics_routes, proxy_registry, start_or_warn};

/// What a running proxy serves; dropping it stops the servers.
#[derive(Debug)]
pub struct ProxyOps {
    pub feed: OpsFeed,
    /// The status page's hook.
    pub status: StatusFeed,
    pub servers: Vec<Server>,
}

/// The settings the servers need.
#[derive(Debug, Clone)]
pub struct OpsSettings {
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    pub hard_fail: bool,
    /// A change waiting longer than this makes the proxy unhealthy (kube-proxy: twice the
    /// sync period).
    pub health_timeout: Duration,
    /// The effective configuration, as `/configz` serves it.
    pub configz_json: String,
    /// Endpoint counters on `/metrics` (0: none, and scrapes read no kernel counters).
    pub metrics_max_endpoint_series: usize,
    /// Endpoint counters on `/status`.
    pub status_max_series: usize,
}

/// `counters` reads the mode's kernel counters, for `/status` and `/metrics`;
/// `mode_metrics` adds the families of a mode that runs in the process (the relay's).
pub fn start(
    settings: &OpsSettings,
    node_name: &str,
    mode: &'static str,
    counters: Option<CounterReader>,
    mode_metrics: Option<ExtraMetrics>,
) -> anyhow::Result<ProxyOps> {
    let metrics = Arc::new(proxy_registry());
    let board =
        Arc::new(StatusBoard::new(mode, node_name, counters, settings.status_max_series, crate::recent::warnings()));
    let health = Arc::new(ProxyHealth::new(settings.health_timeout, Arc::clone(&metrics)));
    let mut servers = Vec::new();
    if let Some(address) = settings.healthz {
        servers.extend(start_or_warn("healthz", address, healthz_routes(&health), settings.hard_fail)?);
    }
    if let Some(address) = settings.metrics {
        let endpoint_series: Option<ExtraMetrics> = (settings.metrics_max_endpoint_series > 0).then(|| {
            let board = Arc::clone(&board);
            let max = settings.metrics_max_endpoint_series;
            Arc::new(move || counter_metrics(&board, max)) as ExtraMetrics
        });
        let extra: Option<ExtraMetrics> = match (endpoint_series, mode_metrics) {
            (Some(series), Some(mode)) => Some(Arc::new(move || series() + &mode())),
            (series, mode) => series.or(mode),
        };
        let routes = metrics_routes(&metrics, mode, settings.configz_json.clone(), extra).merge(status_routes(&board));
        servers.extend(start_or_warn("metrics", address, routes, settings.hard_fail)?);
    }
    Ok(ProxyOps { feed: OpsFeed::new(metrics, health, node_name, mode), status: StatusFeed::new(board), servers })
}
