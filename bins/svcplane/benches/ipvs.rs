//! IPVS mode benchmark, run inside the guest kernel (the host kernel has no `ip_vs`):
//! `scripts/bench-ipvs` builds this in release mode on the host and runs it with
//! `scripts/in-guest`. See `docs/benchmarks.md`, section "IPVS mode in the guest kernel".
//!
//! Two parts, in one run:
//!
//! 1. svcplane's modes on the same input (`--sizes`, S synthetic ClusterIP Services x
//!    `--endpoints` E): `--mode ipvs`, `--mode nftables`, `--mode iptables`, each in a fresh
//!    one-node lab: cold program (a full sync), one endpoint change (`--changes` of them,
//!    one Service each), both read back from the kernel, then `--connects` TCP connects
//!    from a pod through a ClusterIP and as many straight to the pod (`common::modes`).
//! 2. Against a real API server (etcd + kube-apiserver in the guest, `--api-sizes`): upstream
//!    kube-proxy `--proxy-mode=ipvs` with its defaults, the same with
//!    `--ipvs-min-sync-period=0s --iptables-min-sync-period=0s`, and `svcplane proxy --mode
//!    ipvs`, one after the other, each on a node of its own with every object already in
//!    the API: cold start (process started) until a marker Service created last is in the
//!    node's IPVS table, and until the proxy's first sync has ended (upstream writes its
//!    IPVS table before its sets: its metrics say when the sync ended), then, only once it
//!    has, `--api-changes` endpoint changes of the marker until the table has the new pod;
//!    and each process's peak RSS.
//!
//! Under emulation absolute times mean little; the ratios within one run are the result.

mod common;
#[path = "../tests/kube_support/mod.rs"]
mod kube_support;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::modes::{self, Measured, Mode, Options};
use common::show;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube_support::bench::{ENDPOINTS_PER_SERVICE, create_bulk, peak_rss_kib, until_answered, upstream_kube_proxy_args};
use kube_support::{ECHO_PORT, KubeLab, cluster_ip_v4, echo_service, echo_slice};
use svcplane_control_plane::UpstreamBinaries;
use svcplane_testbed::Lab;

/// What upstream kube-proxy's IPVS mode checks for or uses, loaded before it starts (the
/// kernel would autoload most, one `modprobe` at a time).
const UPSTREAM_MODULES: &[&str] = &[
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_sh",
    "nf_conntrack",
    "ip_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
    "xt_set",
];

#[derive(Debug)]
struct Args {
    sizes: Vec<usize>,
    endpoints: usize,
    changes: usize,
    connects: usize,
    modes: Vec<Mode>,
    api_sizes: Vec<usize>,
    api_changes: usize,
    api_limit: Duration,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        sizes: vec![1000, 10_000],
        endpoints: 10,
        changes: 5,
        connects: 1000,
        modes: Mode::DEFAULT.to_vec(),
        api_sizes: vec![1000],
        api_changes: 3,
        api_limit: Duration::from_secs(300),
    };
    let list = |text: String| -> anyhow::Result<Vec<usize>> {
        text.split(',').filter(|s| !s.trim().is_empty() && s.trim() != "0").map(|s| Ok(s.trim().parse()?)).collect()
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => args.sizes = list(value()?)?,
            "--endpoints" => args.endpoints = value()?.parse()?,
            "--changes" => args.changes = value()?.parse()?,
            "--connects" => args.connects = value()?.parse()?,
            "--modes" => args.modes = value()?.split(',').map(Mode::parse).collect::<Result<_, _>>()?,
            "--api-sizes" => args.api_sizes = list(value()?)?,
            "--api-changes" => args.api_changes = value()?.parse()?,
            "--api-limit" => args.api_limit = Duration::from_secs(value()?.parse()?),
            "--bench" => {}
            other => bail!(
                "unknown argument {other:?} (--sizes A,B --endpoints E --changes N --connects N --modes ipvs,nftables,iptables[,iptables-legacy] \
                 --api-sizes A,B|0 --api-changes N --api-limit SECONDS)"
            ),
        }
    }
    ensure!(args.sizes.iter().all(|&s| (1..=60_000).contains(&s)), "--sizes: 1..=60000 each");
    ensure!(args.api_sizes.iter().all(|&s| (1..=60_000).contains(&s)), "--api-sizes: 1..=60000 each");
    ensure!((1..=250).contains(&args.changes), "--changes: 1..=250");
    ensure!((1..=20).contains(&args.api_changes), "--api-changes: 1..=20");
    ensure!(args.connects <= 20_000, "--connects: 0..=20000");
    ensure!(args.endpoints >= 1, "--endpoints: at least 1");
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// Part 1: svcplane's modes on the same plan

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
}

fn modes_table(size: usize, args: &Args, rows: &[Measured]) -> String {
    let mut out = format!(
        "#### {size} Services x {} endpoints: svcplane's modes (in-process syncs, each mode in a fresh one-node lab)\n\n",
        args.endpoints
    );
    out.push_str(
        "| mode | cold program | one endpoint change, median (max) | ClusterIP connect p50 / p99 | direct p50 / p99 | p50 ratio | p99 ratio | read back after the changes |\n",
    );
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for row in rows {
        let (through, direct, p50, p99) = match row.connect {
            Some(c) => (
                format!("{} / {}", show(c.service.0), show(c.service.1)),
                format!("{} / {}", show(c.direct.0), show(c.direct.1)),
                ratio(c.service.0, c.direct.0),
                ratio(c.service.1, c.direct.1),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "| {} {} | {} | {} ({}) | {through} | {direct} | {p50} | {p99} | {} |",
            row.mode.name(),
            row.mode.flags(),
            show(row.cold),
            show(row.change_median),
            show(row.change_max),
            row.read_back
        );
    }
    for row in rows.iter().filter(|row| !row.cold_phases.is_empty()) {
        let phases: Vec<String> =
            row.cold_phases.iter().map(|(phase, took)| format!("{phase} {}", show(*took))).collect();
        let _ = writeln!(out, "\n{} mode's cold program by phase: {}.", row.mode.name(), phases.join(", "));
    }
    let find = |mode: Mode| rows.iter().find(|row| row.mode == mode);
    if let Some(ipvs) = find(Mode::Ipvs) {
        out.push('\n');
        for other in [Mode::Nftables, Mode::Iptables, Mode::IptablesLegacy] {
            if let Some(other_row) = find(other) {
                let _ = writeln!(
                    out,
                    "- ipvs / {}: cold program **{}**, one endpoint change **{}**",
                    other.name(),
                    ratio(ipvs.cold, other_row.cold),
                    ratio(ipvs.change_median, other_row.change_median)
                );
            }
        }
    }
    out.push('\n');
    out
}

/// Baseline: one `iptables-nft -t nat -S PREROUTING` in a fresh namespace (median of 5),
/// i.e. what one start of an iptables program costs on this machine. IPVS mode and iptables
/// mode run several per sync; under emulation this dominates them.
fn iptables_start_baseline() -> anyhow::Result<Duration> {
    let name = format!("svcp-ipvsbench-{}", std::process::id());
    let status = std::process::Command::new("ip").args(["netns", "add", &name]).status()?;
    ensure!(status.success(), "ip netns add {name} failed (needs root)");
    let samples = svcplane_testbed::run_in_namespace(&name, || {
        (0..5)
            .map(|_| {
                common::time(|| {
                    std::process::Command::new("iptables-nft").args(["-t", "nat", "-S", "PREROUTING"]).output()
                })
            })
            .map(|(took, output)| output.map(|_| took))
            .collect::<Result<Vec<Duration>, _>>()
    });
    let _ = std::process::Command::new("ip").args(["netns", "del", &name]).status();
    Ok(common::median(samples??))
}

fn run_modes(args: &Args, out: &mut String) -> anyhow::Result<()> {
    eprintln!("== warming up (kernel modules), modes {:?}", args.modes);
    modes::warm_up(&args.modes)?;
    let baseline = iptables_start_baseline()?;
    let line = format!(
        "Baseline, same run: one `iptables-nft -t nat -S PREROUTING` (a program start and one listing) takes {}.\n\n",
        show(baseline)
    );
    eprint!("{line}");
    out.push_str(&line);
    for &size in &args.sizes {
        let mut rows = Vec::new();
        for &mode in &args.modes {
            eprintln!("== {size} Services x {} endpoints, {} mode", args.endpoints, mode.name());
            let options =
                Options { services: size, endpoints: args.endpoints, changes: args.changes, connects: args.connects };
            let measured = modes::measure(mode, options).with_context(|| format!("{} mode at {size}", mode.name()))?;
            eprintln!(
                "  cold {}, change median {} max {}, {}",
                show(measured.cold),
                show(measured.change_median),
                show(measured.change_max),
                measured.read_back
            );
            for (phase, took) in &measured.cold_phases {
                eprintln!("    cold sync phase {phase}: {}", show(*took));
            }
            rows.push(measured);
        }
        let table = modes_table(size, args, &rows);
        eprintln!("{table}");
        out.push_str(&table);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Part 2: upstream kube-proxy's IPVS mode and svcplane's from one API server

const MARKER: &str = "marker";
const PODS: [&str; 2] = ["pod-a", "pod-b"];
/// How long a connection from the node gets to reach the new pod once the IPVS table has it.
const CONNECT_CHECK: Duration = Duration::from_secs(10);

/// Polls the IPVS table of `namespace` every 10 ms (over generic netlink, from a thread in
/// that namespace) until virtual service `key` has `pod` as its only real server taking new
/// connections (weight above 0); the time since `from`, or `None` once `limit` has passed.
fn until_in_ipvs_table(
    namespace: &str,
    key: svcplane_ipvs::ServiceKey,
    pod: IpAddr,
    limit: Duration,
    from: Instant,
) -> anyhow::Result<Option<Duration>> {
    svcplane_testbed::run_in_namespace(namespace, || -> anyhow::Result<Option<Duration>> {
        let mut ipvs = svcplane_ipvs::Ipvs::new()?;
        while from.elapsed() < limit {
            if let Ok(destinations) = ipvs.destinations(&key) {
                let taking: Vec<IpAddr> = destinations
                    .iter()
                    .filter(|state| state.destination.weight > 0)
                    .map(|state| state.destination.address)
                    .collect();
                if taking == [pod] {
                    return Ok(Some(from.elapsed()));
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(None)
    })?
}

/// The metrics line of upstream kube-proxy's completed syncs.
const SYNC_COUNT: &str = "kubeproxy_sync_proxy_rules_duration_seconds_count";

/// Upstream kube-proxy's completed IPv4 syncs, read from its metrics on the node (the line
/// labelled IPv4, else the first), with every line of that series as read.
fn completed_syncs(kube: &KubeLab, namespace: &str) -> Option<(f64, String)> {
    let address: SocketAddr = "127.0.0.1:10249".parse().ok()?;
    let (_, _, body) = kube.lab.run_in(namespace, || svcplane_ops::http::get(address, "/metrics")).ok()?.ok()?;
    let lines: Vec<&str> = body.lines().filter(|line| line.starts_with(SYNC_COUNT)).collect();
    let value = |line: &&str| line.rsplit_once(' ').and_then(|(_, value)| value.trim().parse::<f64>().ok());
    let count = lines.iter().find(|line| line.contains("IPv4")).or(lines.first()).and_then(value)?;
    Some((count, lines.join("; ")))
}

/// Polls kube-proxy's metrics every 200 ms until its first sync has ended: the time since
/// `from`, or `None` once `limit` has passed; and the sync series as last read.
fn until_first_sync(kube: &KubeLab, namespace: &str, limit: Duration, from: Instant) -> (Option<Duration>, String) {
    let mut seen = String::new();
    while from.elapsed() < limit {
        if let Some((count, lines)) = completed_syncs(kube, namespace) {
            seen = lines;
            if count >= 1.0 {
                return (Some(from.elapsed()), seen);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    (None, seen)
}

#[derive(Debug, Clone, Copy)]
struct ApiProxy {
    label: &'static str,
    node: u16,
    upstream: bool,
    extra: &'static [&'static str],
}

const API_PROXIES: [ApiProxy; 3] = [
    ApiProxy {
        label: "kube-proxy `--proxy-mode=ipvs` (defaults: min sync periods 1s)",
        node: 1,
        upstream: true,
        extra: &[],
    },
    ApiProxy {
        label: "kube-proxy `--proxy-mode=ipvs --ipvs-min-sync-period=0s --iptables-min-sync-period=0s`",
        node: 2,
        upstream: true,
        extra: &["--ipvs-min-sync-period=0s", "--iptables-min-sync-period=0s"],
    },
    ApiProxy { label: "svcplane `proxy --mode ipvs --iptables-backend nft`", node: 3, upstream: false, extra: &[] },
];

#[derive(Debug, Default)]
struct ApiMeasured {
    cold: Option<Duration>,
    /// From the process's start until its first sync had ended: for upstream kube-proxy,
    /// its metrics' first completed IPv4 sync (it writes the IPVS table before its sets,
    /// one `ipset add` process per entry); for svcplane the marker's time (it writes the
    /// IPVS table last).
    first_sync: Option<Duration>,
    changes: Vec<Option<Duration>>,
    /// After each change was in the IPVS table: whether a new connection from the node
    /// reached the new pod within [`CONNECT_CHECK`].
    reached: Vec<bool>,
    peak_rss_kib: Option<u64>,
}

impl ApiMeasured {
    fn change_median(&self) -> Option<Duration> {
        let mut done: Vec<Duration> = self.changes.iter().flatten().copied().collect();
        if done.len() < self.changes.len() || done.is_empty() {
            return None;
        }
        done.sort();
        Some(done[done.len() / 2])
    }
}

/// Starts `proxy` on its node: its name for the control plane, its pid and its log.
fn start_api_proxy(kube: &KubeLab, proxy: ApiProxy) -> anyhow::Result<(String, u32, PathBuf)> {
    let node = kube.lab.node(proxy.node);
    if !proxy.upstream {
        let (pid, log) = kube.start_svcplane_proxy(proxy.node, &["--mode", "ipvs", "--iptables-backend", "nft"]);
        return Ok((format!("svcplane-proxy-{}", node.name()), pid, log));
    }
    let mut args = upstream_kube_proxy_args(kube, node.name(), "ipvs");
    args.extend(proxy.extra.iter().map(|arg| (*arg).to_owned()));
    // SVCPLANE_BENCH_KUBE_PROXY_V=4 (diagnosis only: logging that much slows it down).
    if let Ok(level) = std::env::var("SVCPLANE_BENCH_KUBE_PROXY_V") {
        args.retain(|arg| !arg.starts_with("--v="));
        args.push(format!("--v={level}"));
    }
    let what = format!("kube-proxy-{}", node.name());
    let (pid, log) = kube.plane.spawn(&what, node.namespace_name(), "kube-proxy", &args)?;
    Ok((what, pid, log))
}

fn move_marker(kube: &KubeLab, pod: &str) -> anyhow::Result<()> {
    let client = kube.client.client();
    let address = kube.lab.pod(pod).ip_v4().to_string();
    kube.client.run(async move {
        let patch = serde_json::json!({ "endpoints": [{ "addresses": [address], "conditions": { "ready": true }, "nodeName": "node1" }] });
        Api::<EndpointSlice>::namespaced(client, "default")
            .patch("marker-1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
    })?;
    Ok(())
}

fn run_api_size(binaries: &UpstreamBinaries, services: usize, args: &Args) -> anyhow::Result<String> {
    eprintln!("== API server: {services} Services x {ENDPOINTS_PER_SERVICE} endpoints");
    let lab = Lab::builder().nodes(3).pod(1, PODS[0]).pod(1, PODS[1]).build()?;
    lab.start_echo_in_all_pods(ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane")))?;
    let (started_in, kube) = common::time(|| KubeLab::start(binaries, lab));
    eprintln!("  etcd + kube-apiserver ready in {}", show(started_in));

    let created = Instant::now();
    create_bulk(&kube, services);
    let marker: Service = kube.client.create(&echo_service(MARKER, false, &[]))?;
    let pod_ip = |name: &str| IpAddr::V4(kube.lab.pod(name).ip_v4());
    kube.client.create(&echo_slice("marker-1", MARKER, &[(pod_ip(PODS[0]), "node1")], &[]))?;
    let create_all = created.elapsed();
    eprintln!("  created {} objects through the API in {}", 2 * services + 2, show(create_all));
    let target = SocketAddr::new(cluster_ip_v4(&marker), 80);
    // The first start of a binary reads it over 9p into the guest's page cache: done here,
    // untimed, so no proxy's cold start pays for it.
    for program in [binaries.require("kube-proxy")?, PathBuf::from(env!("CARGO_BIN_EXE_svcplane"))] {
        let _ = std::process::Command::new(&program).arg("--version").output();
    }

    let key = svcplane_ipvs::ServiceKey::new(target.ip(), svcplane_net::Protocol::Tcp, 80);
    let mut current = 0;
    let mut results = Vec::new();
    for proxy in API_PROXIES {
        eprintln!("  -- {}", proxy.label);
        let namespace = kube.lab.node(proxy.node).namespace_name().to_owned();
        let started = Instant::now();
        let (what, pid, log) = start_api_proxy(&kube, proxy)?;
        let mut measured = ApiMeasured {
            cold: until_in_ipvs_table(&namespace, key, pod_ip(PODS[current]), args.api_limit, started)?,
            ..ApiMeasured::default()
        };
        eprintln!("     cold start to the marker in the IPVS table: {:?}", measured.cold);
        if measured.cold.is_some() {
            measured.first_sync = if proxy.upstream {
                // kube-proxy writes its IPVS table before its sets and rules: a change is
                // only measured once its first sync has ended (else it would time the rest
                // of the first sync).
                let (ended, seen) = until_first_sync(&kube, &namespace, args.api_limit, started);
                eprintln!("     its first sync ended: {ended:?} after its start (metrics: {seen})");
                ended
            } else {
                measured.cold
            };
        }
        if measured.first_sync.is_some() {
            let answered = until_answered(&kube, &namespace, target, PODS[current], CONNECT_CHECK, Instant::now());
            eprintln!("     (a connection from the node reached {} after {answered:?} more)", PODS[current]);
            for _ in 0..args.api_changes {
                current = 1 - current;
                let changed = Instant::now();
                move_marker(&kube, PODS[current])?;
                let took = until_in_ipvs_table(&namespace, key, pod_ip(PODS[current]), args.api_limit, changed)?;
                eprintln!("     one endpoint change to the IPVS table: {took:?}");
                measured.changes.push(took);
                if took.is_none() {
                    break;
                }
                let answered = until_answered(&kube, &namespace, target, PODS[current], CONNECT_CHECK, Instant::now());
                eprintln!("     (a connection from the node reached {} after {answered:?} more)", PODS[current]);
                measured.reached.push(answered.is_some());
            }
        }
        if measured.first_sync.is_none() || measured.changes.iter().any(Option::is_none) {
            eprintln!("     timed out; the end of {what}'s log:\n{}", kube_support::log_tail(&log));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let about: Vec<&str> = text.lines().filter(|line| line.contains(MARKER)).collect();
            eprintln!(
                "     the last of {} lines of {what}'s log that name the marker:\n{}",
                about.len(),
                about[about.len().saturating_sub(60)..].join("\n")
            );
        }
        if measured.reached.contains(&false) || measured.changes.iter().any(Option::is_none) {
            let table = kube
                .lab
                .exec(&namespace, &["cat", "/proc/net/ip_vs"])
                .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
                .unwrap_or_default();
            let hex = match target.ip() {
                IpAddr::V4(ip) => format!("{:08X}:0050", u32::from(ip)),
                IpAddr::V6(_) => String::new(),
            };
            let marker: Vec<&str> = table.lines().skip_while(|line| !line.contains(&hex)).take(8).collect();
            eprintln!("     the marker in /proc/net/ip_vs:\n{}", marker.join("\n"));
        }
        measured.peak_rss_kib = peak_rss_kib(pid);
        if let Err(error) = kube.plane.check_running(&what) {
            eprintln!("     {what} exited: {error}");
        }
        kube.plane.stop(&what);
        results.push(measured);
    }
    Ok(api_table(services, create_all, started_in, args, &results))
}

fn api_table(
    services: usize,
    create_all: Duration,
    ready_in: Duration,
    args: &Args,
    results: &[ApiMeasured],
) -> String {
    let shown = |d: Option<Duration>| d.map_or_else(|| "timed out".to_owned(), show);
    let svcplane = results.last();
    let times = |ours: Option<Duration>, theirs: Option<Duration>| match (ours, theirs) {
        (Some(ours), Some(theirs)) => format!("{:.2}x", theirs.as_secs_f64() / ours.as_secs_f64()),
        _ => "-".to_owned(),
    };
    let mut out = format!(
        "#### {services} Services x {ENDPOINTS_PER_SERVICE} endpoints from one API server (etcd + kube-apiserver in the guest)\n\n\
         | proxy (IPVS mode) | cold start to the marker in the IPVS table | / svcplane | first sync ended | / svcplane | one endpoint change to the IPVS table, median of {} | / svcplane | then a new connection from the node reached the new pod within {} s | peak RSS |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        args.api_changes,
        CONNECT_CHECK.as_secs()
    );
    for (proxy, measured) in API_PROXIES.iter().zip(results) {
        let reached = measured.reached.iter().filter(|reached| **reached).count();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {reached} of {} | {} |",
            proxy.label,
            shown(measured.cold),
            times(svcplane.and_then(|s| s.cold), measured.cold),
            shown(measured.first_sync),
            times(svcplane.and_then(|s| s.first_sync), measured.first_sync),
            if measured.first_sync.is_some() {
                shown(measured.change_median())
            } else {
                "not measured (no first sync)".to_owned()
            },
            times(svcplane.and_then(ApiMeasured::change_median), measured.change_median()),
            measured.reached.len(),
            measured.peak_rss_kib.map_or_else(|| "-".to_owned(), |kib| format!("{:.0} MiB", kib as f64 / 1024.0)),
        );
    }
    let _ = writeln!(
        out,
        "\n(etcd + kube-apiserver ready in {}; the {} objects created through the API in {}.)\n",
        show(ready_in),
        2 * services + 2,
        show(create_all)
    );
    out
}

fn run_api(args: &Args, out: &mut String) -> anyhow::Result<()> {
    let binaries = UpstreamBinaries::locate().context("the upstream binaries (scripts/k8s/build)")?;
    for (module, error) in UPSTREAM_MODULES
        .iter()
        .filter_map(|m| svcplane_testbed::guest::load_modules(&[m]).err().map(|error| (m, error)))
    {
        eprintln!("  (could not load {module}: {error})");
    }
    for &size in &args.api_sizes {
        let table = run_api_size(&binaries, size, args)?;
        eprintln!("{table}");
        out.push_str(&table);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    ensure!(
        cfg!(not(debug_assertions)) || std::env::var_os("SVCPLANE_BENCH_DEBUG").is_some(),
        "run in release mode (scripts/bench-ipvs)"
    );
    if !svcplane_testbed::guest::in_guest() && !Path::new("/proc/net/ip_vs").exists() {
        eprintln!("note: not in the guest kernel; this kernel may lack ip_vs (run scripts/bench-ipvs)");
    }
    let started = Instant::now();
    let mut out = String::new();
    if !args.sizes.is_empty() {
        run_modes(&args, &mut out)?;
    }
    if !args.api_sizes.is_empty() {
        run_api(&args, &mut out)?;
    }
    let _ = writeln!(out, "(whole run: {} in the guest)", show(started.elapsed()));
    // The tables on stdout: in the guest every file written stays in the guest, so
    // scripts/bench-ipvs keeps stdout on the host.
    println!("{out}");
    Ok(())
}
