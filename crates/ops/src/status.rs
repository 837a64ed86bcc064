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
/// Service ports one answer carries at most (busiest first); a filter finds the others. A
/// 10k-Service node has 20k+ of them, megabytes no page should redraw every 2 s.
pub const MAX_SERVICE_PORTS_SHOWN: usize = 200;
/// Counters read from the kernel are shared by requests this close together (every open
/// page polls; reading a 10k-Service ruleset takes seconds).
const COUNTERS_FRESH_FOR: Duration = Duration::from_secs(2);

/// What one read of the kernel's counters gave.
type CounterRead = Result<Vec<EndpointCounter>, String>;

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
    view: Option<(u64, Arc<Vec<Value>>)>,
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
    /// The last read, shared by requests within [`COUNTERS_FRESH_FOR`].
    last_counters: Mutex<Option<(Instant, CounterRead)>>,
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
            last_counters: Mutex::new(None),
            max_series,
            warnings,
        }
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kernel's counters, read at most every [`COUNTERS_FRESH_FOR`] for the page.
    fn recent_counters(&self) -> Result<Vec<EndpointCounter>, String> {
        let mut last = self.last_counters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, counters)) = last.as_ref()
            && at.elapsed() < COUNTERS_FRESH_FOR
        {
            return counters.clone();
        }
        let counters = self.read_counters();
        *last = Some((Instant::now(), counters.clone()));
        counters
    }

    /// The kernel's counters, merged; an error is shown, not fatal.
    pub fn read_counters(&self) -> Result<Vec<EndpointCounter>, String> {
        let mut reader = self.counters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match reader.as_mut() {
            Some(read) => read().map(merge),
            None => Err(format!("{} mode keeps no traffic counters", self.mode)),
        }
    }

    /// What `/status.json` answers: service ports whose name contains `filter` (all when
    /// empty), busiest first, at most [`MAX_SERVICE_PORTS_SHOWN`].
    pub fn status_json(&self, filter: &str) -> Value {
        self.wanted.store(true, Ordering::Release);
        let deadline = Instant::now() + FRESH_VIEW_WAIT;
        let view: Arc<Vec<Value>> = loop {
            let board = self.board();
            match &board.view {
                Some((generation, view)) if *generation == board.generation => break Arc::clone(view),
                stale if Instant::now() >= deadline => {
                    break stale.as_ref().map_or_else(Arc::default, |(_, view)| Arc::clone(view));
                }
                _ => {}
            }
            drop(board);
            std::thread::sleep(Duration::from_millis(20));
        };
        let counters = self.recent_counters();
        let by_key: BTreeMap<(String, String), u64> = counters.iter().flatten().fold(BTreeMap::new(), |mut sums, c| {
            *sums.entry((c.service_port.clone(), c.protocol.to_string())).or_default() += c.connections;
            sums
        });
        let traffic = |port: &Value| {
            let key = (
                port["counterKey"].as_str().unwrap_or_default().to_owned(),
                port["protocol"].as_str().unwrap_or_default().to_owned(),
            );
            by_key.get(&key).copied().unwrap_or(0)
        };
        let mut matching: Vec<&Value> =
            view.iter().filter(|port| port["service"].as_str().is_some_and(|name| name.contains(filter))).collect();
        let total = matching.len();
        // Stable: equally busy ports keep the plan's order (by name).
        matching.sort_by_key(|port| std::cmp::Reverse(traffic(port)));
        matching.truncate(MAX_SERVICE_PORTS_SHOWN);
        let shown_keys: BTreeSet<(String, String)> = matching
            .iter()
            .map(|p| {
                (
                    p["counterKey"].as_str().unwrap_or_default().to_owned(),
                    p["protocol"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let (counters, counter_error, omitted) = match counters {
            Ok(all) => {
                let relevant: Vec<EndpointCounter> = all
                    .into_iter()
                    .filter(|c| shown_keys.contains(&(c.service_port.clone(), c.protocol.to_string())))
                    .collect();
                let shown = bounded(relevant, self.max_series);
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
            "filter": filter,
            "servicePortsMatching": total,
            "servicePortsTotal": view.len(),
            "services": matching,
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
        self.board.board().view = Some((generation, Arc::new(view)));
    }
}

/// Each service port of the plan, as the page draws it.
pub fn services_view(plan: &NodePlan, state: &ClusterState) -> Vec<Value> {
    let this_node = plan.config.node_name.as_str();
    let mut ports = Vec::with_capacity(plan.service_ports.len());
    for port in plan.service_ports.values() {
        let known = state.endpoints_for(&port.name);
        let used: BTreeSet<SocketAddr> =
            port.cluster_endpoints.iter().chain(port.local_endpoints.iter()).copied().collect();
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
            "port": port.name.port_name.as_str(),
            "counterKey": counter_key,
            "protocol": port.protocol.to_string(),
            "family": family_label(port.family),
            "frontends": frontends,
            "endpoints": endpoints.into_values().collect::<Vec<_>>(),
        }));
    }
    ports
}

/// `/status` and `/status.json`.
pub fn status_routes(board: &Arc<StatusBoard>) -> Routes {
    let json_board = Arc::clone(board);
    Routes::new().route("/status", |_| Response::new(200, "text/html; charset=utf-8", PAGE)).route(
        "/status.json",
        move |request| {
            let filter = query_value(&request.query, "filter").unwrap_or_default();
            Response::json(200, json_board.status_json(&filter).to_string())
        },
    )
}

/// One `name=value` of a query string, percent-decoded (`+` is a space).
fn query_value(query: &str, name: &str) -> Option<String> {
    let raw = query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::query_value;

    #[test]
    fn a_query_value_is_percent_decoded() {
        assert_eq!(query_value("filter=bench%2Fsvc-1+x&y=2", "filter").as_deref(), Some("bench/svc-1 x"));
        assert_eq!(query_value("y=2", "filter"), None);
        assert_eq!(query_value("filter=100%", "filter").as_deref(), Some("100%"));
    }
}
