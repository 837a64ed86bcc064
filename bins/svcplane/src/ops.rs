//! The proxy's healthz and metrics servers, wired to the sync loop: addresses in, servers
//! and the loop's hook out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use svcplane_ops::http::Server;
use svcplane_ops::{OpsFeed, ProxyHealth, healthz_routes, metrics_routes, proxy_registry, start_or_warn};

/// What a running proxy serves; dropping it stops the servers.
#[derive(Debug)]
pub struct ProxyOps {
    pub feed: OpsFeed,
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
}

/// `""` means "no server", as in kube-proxy's configuration.
pub fn bind_address(flag: &str, value: &str) -> anyhow::Result<Option<SocketAddr>> {
    if value.is_empty() {
        return Ok(None);
    }
    value.parse().map(Some).with_context(|| format!("{flag}: {value:?} is not an IP:PORT"))
}

pub fn start(settings: &OpsSettings, node_name: &str, mode: &'static str) -> anyhow::Result<ProxyOps> {
    let metrics = Arc::new(proxy_registry());
    let health = Arc::new(ProxyHealth::new(settings.health_timeout, Arc::clone(&metrics)));
    let mut servers = Vec::new();
    if let Some(address) = settings.healthz {
        servers.extend(start_or_warn("healthz", address, healthz_routes(&health), settings.hard_fail)?);
    }
    if let Some(address) = settings.metrics {
        let routes = metrics_routes(&metrics, mode, settings.configz_json.clone());
        servers.extend(start_or_warn("metrics", address, routes, settings.hard_fail)?);
    }
    Ok(ProxyOps { feed: OpsFeed::new(metrics, health, node_name, mode), servers })
}
