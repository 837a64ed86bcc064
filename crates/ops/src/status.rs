//! The live status page (`/status`, one self-contained HTML file) and what it reads
//! (`/status.json`): the node's mode and last sync, each Service port with its frontends
//! and endpoints (local or remote, ready, terminating, used by this node or not), the
//! kernel's per-endpoint connection counters, and recent warnings naming their object.
//!
//! Cost stays off the sync path: the plan is copied into a view only on a loop turn after
//! someone asked for the page, and counters are read from the kernel only while answering
//! a request (reading every rule at 10k Services takes a while; nobody pays it unasked).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use svcplane_core::counters::{EndpointCounter, bounded, merge, service_port_label};
use svcplane_core::plan::Destination;
use svcplane_core::{ClusterState, NodePlan};
use svcplane_sync::{AfterSync, Synced};

use crate::http::{Response, Routes};
use crate::proxy_health::{family_label, go_time};

const PAGE: &str = include_str!("status.html");
/// How long a request waits for the loop to copy a fresh view (the loop turns every 100 ms).
const FRESH_VIEW_WAIT: Duration = Duration::from_millis(500);
/// Warnings kept for the page.
const RECENT_WARNINGS: usize = 50;

/// Reads the mode's kernel counters (the binary gives one per mode).
pub type CounterReader = Box<dyn FnMut() -> Result<Vec<EndpointCounter>, String> + Send>;

/// The last warnings logged, newest last; the binary's log layer pushes, the page reads.
#[derive(Debug, Default)]
pub struct RecentWarnings {
    lines: Mutex<VecDeque<(SystemTime, String)>>,
}

impl RecentWarnings {
    pub fn push(&self, message: String) {
        let mut lines = self.lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() == RECENT_WARNINGS {
            lines.pop_front();
        }
        lines.push_back((SystemTime::now(), message));
    }

    fn to_json(&self) -> Value {
        let lines = self.lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        lines.iter().map(|(at, message)| json!({"at": go_time(Some(*at)), "message": message})).collect()
    }
}

#[derive(Debug, Default)]
struct Board {
    /// The last view copied from the plan, with the sync generation it shows.
    view: Option<(u64, Value)>,
    generation: u64,
    last_sync: Option<SystemTime>,
    syncs: u64,
}

/// Shared by the sync loop's [`StatusFeed`] and the page's handlers.
pub struct StatusBoard {
    mode: &'static str,
    node: String,
    board: Mutex<Board>,
    /// Someone looked since the last copy: the next loop turn copies the plan.
    wanted: AtomicBool,
    counters: Mutex<Option<CounterReader>>,
    max_series: usize,
    warnings: Arc<RecentWarnings>,
}

impl std::fmt::Debug for StatusBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBoard").field("mode", &self.mode).field("node", &self.node).finish_non_exhaustive()
    }
}

impl StatusBoard {
    /// `max_series`: endpoint counters shown at most (the busiest), as `--max-series`.
    pub fn new(
        mode: &'static str,
        node: &str,
        counters: Option<CounterReader>,
        max_series: usize,
        warnings: Arc<RecentWarnings>,
    ) -> Self {
        Self {
            mode,
            node: node.to_owned(),
            board: Mutex::default(),
            wanted: AtomicBool::new(false),
            counters: Mutex::new(counters),
            max_series,
            warnings,
        }
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kernel's counters, merged and capped; an error is shown, not fatal.
    pub fn read_counters(&self) -> Result<Vec<EndpointCounter>, String> {
        let mut reader = self.counters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match reader.as_mut() {
            Some(read) => read().map(merge),
            None => Err(format!("{} mode keeps no traffic counters", self.mode)),
        }
    }

    /// What `/status.json` answers.
    pub fn status_json(&self) -> Value {
        self.wanted.store(true, Ordering::Release);
        let deadline = Instant::now() + FRESH_VIEW_WAIT;
        let services = loop {
            let board = self.board();
            match &board.view {
                Some((generation, view)) if *generation == board.generation => break view.clone(),
                stale if Instant::now() >= deadline => break stale.as_ref().map_or(json!([]), |(_, v)| v.clone()),
                _ => {}
            }
            drop(board);
            std::thread::sleep(Duration::from_millis(20));
        };
        let (counters, counter_error, omitted) = match self.read_counters() {
            Ok(all) => {
                let shown = bounded(all, self.max_series);
                let list: Vec<Value> = shown
                    .series
                    .iter()
                    .map(|c| {
                        json!({"servicePort": c.service_port, "protocol": c.protocol.to_string(),
                               "endpoint": c.endpoint.to_string(), "connections": c.connections})
                    })
                    .collect();
                (list, Value::Null, shown.omitted)
            }
            Err(error) => (Vec::new(), Value::String(error), 0),
        };
        let board = self.board();
        json!({
            "mode": self.mode,
            "node": self.node,
            "lastSync": board.last_sync.map(|t| go_time(Some(t))),
            "syncs": board.syncs,
            "services": services,
            "counters": counters,
            "counterError": counter_error,
            "omittedSeries": omitted,
            "warnings": self.warnings.to_json(),
        })
    }
}

/// The endpoint counters as Prometheus text: the `max_series` busiest endpoints, the rest
/// counted in two totals, so a scrape stays bounded at any cluster size.
pub fn counter_metrics(board: &StatusBoard, max_series: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let counters = match board.read_counters() {
        Ok(counters) => counters,
        Err(error) => {
            tracing::debug!("endpoint counters for /metrics: {error}");
            return out;
        }
    };
    let shown = bounded(counters, max_series);
    out.push_str("# HELP svcplane_endpoint_connections_total New connections the kernel sent to each endpoint since its rule was written (the busiest endpoints only)\n");
    out.push_str("# TYPE svcplane_endpoint_connections_total counter\n");
    for c in &shown.series {
        let _ = writeln!(
            out,
            "svcplane_endpoint_connections_total{{endpoint=\"{}\",protocol=\"{}\",service_port=\"{}\"}} {}",
            c.endpoint,
            c.protocol,
            c.service_port.replace('\\', "\\\\").replace('"', "\\\""),
            c.connections
        );
    }
    out.push_str("# HELP svcplane_endpoint_series_omitted Endpoint series left out of svcplane_endpoint_connections_total by the cap\n");
    out.push_str("# TYPE svcplane_endpoint_series_omitted gauge\n");
    let _ = writeln!(out, "svcplane_endpoint_series_omitted {}", shown.omitted);
    out.push_str(
        "# HELP svcplane_endpoint_connections_omitted_total New connections to the endpoints left out by the cap\n",
    );
    out.push_str("# TYPE svcplane_endpoint_connections_omitted_total counter\n");
    let _ = writeln!(out, "svcplane_endpoint_connections_omitted_total {}", shown.omitted_connections);
    out
}

/// The sync loop's side of the page.
#[derive(Debug)]
pub struct StatusFeed {
    board: Arc<StatusBoard>,
}

impl StatusFeed {
    pub fn new(board: Arc<StatusBoard>) -> Self {
        Self { board }
    }
}

impl AfterSync for StatusFeed {
    fn synced(&mut self, _sync: &Synced<'_>) {
        let mut board = self.board.board();
        board.generation += 1;
        board.syncs += 1;
        board.last_sync = Some(SystemTime::now());
    }

    fn tick(&mut self, plan: &NodePlan, state: &ClusterState) {
        if !self.board.wanted.swap(false, Ordering::AcqRel) {
            return;
        }
        let generation = self.board.board().generation;
        if self.board.board().view.as_ref().is_some_and(|(copied, _)| *copied == generation) {
            return;
        }
        let view = services_view(plan, state);
        self.board.board().view = Some((generation, view));
    }
}

/// Each service port of the plan, as the page draws it.
pub fn services_view(plan: &NodePlan, state: &ClusterState) -> Value {
    let this_node = plan.config.node_name.as_str();
    let mut ports = Vec::with_capacity(plan.service_ports.len());
    for port in plan.service_ports.values() {
        let known = state.endpoints_for(&port.name);
        let used: BTreeSet<SocketAddr> = port.cluster_endpoints.iter().chain(&port.local_endpoints).copied().collect();
        let mut endpoints: BTreeMap<SocketAddr, Value> = BTreeMap::new();
        for endpoint in known.iter().filter(|e| e.address.is_ipv4() == (port.family == svcplane_core::IpFamily::V4)) {
            let conditions = &endpoint.endpoint;
            endpoints.insert(
                endpoint.address,
                json!({
                    "address": endpoint.address.to_string(),
                    "local": conditions.node_name.as_deref() == Some(this_node),
                    "ready": conditions.ready,
                    "serving": conditions.serving,
                    "terminating": conditions.terminating,
                    "used": used.contains(&endpoint.address),
                }),
            );
        }
        let frontends: Vec<String> = port
            .frontends
            .iter()
            .map(|f| {
                let at = match f.destination {
                    Destination::Address(ip) => SocketAddr::new(ip, f.port).to_string(),
                    Destination::NodePortAddresses => format!("*:{}", f.port),
                };
                format!("{:?} {at}", f.kind)
            })
            .collect();
        let service = &port.name.service;
        let counter_key = service_port_label(&service.namespace, &service.name, &port.name.port_name);
        ports.push(json!({
            "service": port.name.service.to_string(),
            "port": port.name.port_name,
            "counterKey": counter_key,
            "protocol": port.protocol.to_string(),
            "family": family_label(port.family),
            "frontends": frontends,
            "endpoints": endpoints.into_values().collect::<Vec<_>>(),
        }));
    }
    Value::Array(ports)
}

/// `/status` and `/status.json`.
pub fn status_routes(board: &Arc<StatusBoard>) -> Routes {
    let json_board = Arc::clone(board);
    Routes::new()
        .route("/status", |_| Response::new(200, "text/html; charset=utf-8", PAGE))
        .route("/status.json", move |_| Response::json(200, json_board.status_json().to_string()))
}
