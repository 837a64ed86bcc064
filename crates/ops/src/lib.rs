//! svcplane-ops: what operators and their tools read from a running proxy, the way they
//! read kube-proxy: the healthz server (`/healthz`, `/livez`) and the metrics server
//! (`/metrics` in Prometheus text with kube-proxy's families, `/proxyMode`, `/configz`,
//! `/healthz`), fed by one sync-loop hook ([`OpsFeed`]).
//!
//! What it does not do: no Service policy and no kernel access (it only records what the
//! sync loop reports), no flag or config parsing (the binary hands it addresses and the
//! effective configuration as text), no TLS or authentication (like kube-proxy's servers,
//! bind them where only the node and its scrapers reach).

pub mod feeds;
pub mod http;
pub mod proxy_health;
pub mod status;

use std::net::SocketAddr;
use std::sync::Arc;

pub use feeds::{DRIFT_REPAIRS_TOTAL, OpsFeed, SYNC_FAILURES_TOTAL, TABLE_CAPACITY, TABLE_ENTRIES, TABLE_FULL};
pub use proxy_health::{ProxyHealth, healthz_routes};
use svcplane_metrics::{Desc, Kind, Registry, kube_proxy_descs};

use crate::http::{Response, Routes, Server};

/// kube-proxy's families plus svcplane's own.
pub fn proxy_registry() -> Registry {
    let mut descs = kube_proxy_descs();
    descs.push(Desc {
        name: SYNC_FAILURES_TOTAL,
        kind: Kind::Counter,
        help: "Failed syncs of the node's rules, by mode (the previous rules stay in place)",
        labels: &["mode"],
        buckets: vec![],
    });
    descs.push(Desc {
        name: DRIFT_REPAIRS_TOTAL,
        kind: Kind::Counter,
        help: "Times the kernel state was found changed behind svcplane's back (a table deleted or flushed, a program detached) and rewritten in full, by mode",
        labels: &["mode"],
        buckets: vec![],
    });
    for (name, help) in [
        (TABLE_ENTRIES, "Entries in use in a fixed-size kernel table of the mode (eBPF maps), by mode and table"),
        (
            TABLE_CAPACITY,
            "Capacity of a fixed-size kernel table of the mode (eBPF maps: --bpf-map-*), by mode and table",
        ),
        (TABLE_FULL, "1 while syncs fail because this table is full (raise its size), else 0"),
    ] {
        descs.push(Desc { name, kind: Kind::Gauge, help, labels: &["mode", "table"], buckets: vec![] });
    }
    Registry::with(descs)
}

/// Families rendered when scraped, appended to the registry's.
pub type ExtraMetrics = Arc<dyn Fn() -> String + Send + Sync>;

/// `/metrics`, `/proxyMode`, `/configz` and a plain `/healthz` on the metrics server, as
/// kube-proxy serves them there.
/// `extra` adds families rendered at scrape time (the endpoint counters).
pub fn metrics_routes(
    metrics: &Arc<Registry>,
    mode: &'static str,
    configz_json: String,
    extra: Option<ExtraMetrics>,
) -> Routes {
    let registry = Arc::clone(metrics);
    Routes::new()
        .route("/metrics", move |_| {
            let mut text = registry.render();
            if let Some(extra) = &extra {
                text.push_str(&extra());
            }
            Response::new(200, "text/plain; version=0.0.4; charset=utf-8", text)
        })
        .route("/proxyMode", move |_| Response::text(200, mode))
        .route("/configz", move |_| Response::json(200, configz_json.clone()))
        .route("/healthz", |_| Response::text(200, "ok"))
}

/// Starts a server, or explains why not: with `hard_fail` a bind error is fatal (as
/// kube-proxy's `bindAddressHardFail`), otherwise it is logged and the proxy runs on.
pub fn start_or_warn(
    name: &str,
    address: SocketAddr,
    routes: Routes,
    hard_fail: bool,
) -> Result<Option<Server>, std::io::Error> {
    match Server::start(name, address, routes) {
        Ok(server) => {
            tracing::info!(%address, "{name} server listening");
            Ok(Some(server))
        }
        Err(error) if !hard_fail => {
            tracing::warn!(%address, "the {name} server could not start, running without it: {error}");
            Ok(None)
        }
        Err(error) => Err(std::io::Error::new(error.kind(), format!("{name} server on {address}: {error}"))),
    }
}
