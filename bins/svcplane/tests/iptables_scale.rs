//! iptables mode beside nftables mode at 1k and 10k Services x 10 endpoints, in the same
//! run: a cold full sync into a fresh network namespace, a full resync of the unchanged
//! plan, one endpoint change (state -> kernel, a partial sync), and iptables mode's canary
//! check. Needs root; ignored by default because it takes a few minutes:
//!
//! ```text
//! cargo test --release -p svcplane --test iptables_scale -- --ignored --nocapture
//! ```
//!
//! `SVCPLANE_BENCH_SIZES=1000,10000` (default), `SVCPLANE_BENCH_REPEAT=3`,
//! `SVCPLANE_BENCH_CHANGES=10`, `SVCPLANE_BENCH_MODES=netlink,cli,legacy,nft` (default: all),
//! and `SVCPLANE_BENCH_MARKDOWN=FILE` to write the tables.
//!
//! Inputs as `benches/scale.rs`: S ClusterIP Services (`198.19.0.0/16`, TCP 80 -> 8080), E
//! ready endpoints each (`198.18.128.0 + (s*E+e) % 32000 + 1`) spread over node1..node10;
//! the plan is node1's, cluster CIDR `198.18.128.0/17`. The plan is built straight from a
//! `ClusterState` (no manifests): this measures the dataplane. Every backend runs inside
//! the namespace (a thread that joined it, its programs inherit it), as the proxy runs on a
//! node, with no `ip netns exec` in the timings.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svcplane_backend_iptables::IptablesBackend;
use svcplane_backend_nftables::NftablesBackend;
use svcplane_core::{
    Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig, NodePlan,
    PlanDiff, Protocol, Service, ServicePort,
};
use svcplane_iptables::{IptablesCli, Variant};
use svcplane_nft::{NftCli, NftNetlink, Nftables};

const NODES: usize = 10;
const POD_ADDRESSES: u32 = 32000;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn service_ip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + s as u32 + 1)
}

fn pod_ip(s: usize, e: usize, endpoints: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + ((s * endpoints + e) as u32 % POD_ADDRESSES) + 1)
}

fn slice(s: usize, endpoints: usize, moved: Option<Ipv4Addr>) -> EndpointSlice {
    EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new("bench", format!("svc-{s}-slice")),
        service: NamespacedName::new("bench", format!("svc-{s}")),
        family: IpFamily::V4,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: 8080 }],
        endpoints: (0..endpoints)
            .map(|e| {
                let ip = match moved {
                    Some(ip) if e == 0 => ip,
                    _ => pod_ip(s, e, endpoints),
                };
                let node = format!("node{}", (s * endpoints + e) % NODES + 1);
                Endpoint::ready(IpAddr::V4(ip), Some(&node))
            })
            .collect(),
    }
}

fn cluster(services: usize, endpoints: usize) -> ClusterState {
    let mut state = ClusterState::new();
    for s in 0..services {
        state.apply(Change::ServiceUpserted(Service::cluster_ip(
            NamespacedName::new("bench", format!("svc-{s}")),
            vec![IpAddr::V4(service_ip(s))],
            vec![ServicePort { name: "http".into(), protocol: Protocol::Tcp, port: 80, node_port: None }],
        )));
        state.apply(Change::SliceUpserted(slice(s, endpoints, None)));
    }
    state.take_changes();
    state
}

fn node_config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        cluster_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        ..NodeConfig::default()
    }
}

/// A network namespace of this benchmark, deleted on drop. Never the machine's own.
struct NetNs(String);

impl NetNs {
    fn fresh(n: usize) -> NetNs {
        let name = format!("svcp-iptbench-{}-{n}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        let status = Command::new("ip").args(["netns", "add", &name]).status().expect("ip netns add");
        assert!(status.success(), "`ip netns add {name}` failed (the benchmark needs root)");
        NetNs(name)
    }
}

/// Deletes namespaces of earlier runs of this benchmark whose process is gone (a run killed
/// by a timeout cannot remove its own).
fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("svcp-iptbench-").and_then(|rest| rest.split('-').next()) else {
            continue;
        };
        if !std::path::Path::new("/proc").join(pid).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    NftablesNetlink,
    NftablesCli,
    IptablesLegacy,
    IptablesNft,
}

impl Mode {
    /// The name `SVCPLANE_BENCH_MODES` selects it by.
    fn key(self) -> &'static str {
        match self {
            Mode::NftablesNetlink => "netlink",
            Mode::NftablesCli => "cli",
            Mode::IptablesLegacy => "legacy",
            Mode::IptablesNft => "nft",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mode::NftablesNetlink => "nftables (netlink, default)",
            Mode::NftablesCli => "nftables (nft CLI)",
            Mode::IptablesLegacy => "iptables, legacy",
            Mode::IptablesNft => "iptables, nft",
        }
    }
}

/// A backend of any mode, created inside the namespace's thread.
enum AnyBackend {
    NftNetlink(NftablesBackend<NftNetlink>),
    NftCli(NftablesBackend<NftCli>),
    Iptables(IptablesBackend<IptablesCli>),
}

impl AnyBackend {
    fn new(mode: Mode) -> Self {
        match mode {
            Mode::NftablesNetlink => AnyBackend::NftNetlink(NftablesBackend::new(NftNetlink::new().expect("netlink"))),
            Mode::NftablesCli => AnyBackend::NftCli(NftablesBackend::new(NftCli::new())),
            Mode::IptablesLegacy => AnyBackend::Iptables(IptablesBackend::new(IptablesCli::new(Variant::Legacy))),
            Mode::IptablesNft => AnyBackend::Iptables(IptablesBackend::new(IptablesCli::new(Variant::Nft))),
        }
    }

    fn sync(&mut self, plan: &NodePlan, changed: &PlanDiff) -> (bool, usize) {
        match self {
            AnyBackend::NftNetlink(b) => sync_nft(b, plan, changed),
            AnyBackend::NftCli(b) => sync_nft(b, plan, changed),
            AnyBackend::Iptables(b) => {
                let report = b.sync(plan, changed).unwrap_or_else(|e| panic!("iptables sync: {e}"));
                (report.full, report.service_ports)
            }
        }
    }

    fn request_full_sync(&mut self) {
        match self {
            AnyBackend::NftNetlink(b) => b.request_full_sync(),
            AnyBackend::NftCli(b) => b.request_full_sync(),
            AnyBackend::Iptables(b) => b.request_full_sync(),
        }
    }
}

fn sync_nft<N: Nftables>(b: &mut NftablesBackend<N>, plan: &NodePlan, changed: &PlanDiff) -> (bool, usize) {
    let report = b.sync(plan, changed).unwrap_or_else(|e| panic!("nftables sync: {e}"));
    (report.full, report.service_ports)
}

fn median(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], samples[0])
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 { format!("{ms:.2} ms") } else { format!("{ms:.0} ms") }
}

#[derive(Debug, Default)]
struct Row {
    cold: (Duration, Duration),
    resync: (Duration, Duration),
    change: (Duration, Duration),
    /// Canary check without and with nat (medians).
    check: Option<((Duration, Duration), (Duration, Duration))>,
}

/// Measures one mode at one size: every kernel step inside a fresh namespace.
fn measure(mode: Mode, plan: &NodePlan, size: usize, counter: &mut usize) -> Row {
    let (repeat, changes) = (env_or("SVCPLANE_BENCH_REPEAT", 3usize), env_or("SVCPLANE_BENCH_CHANGES", 10usize));
    let endpoints = 10;
    let mut row = Row::default();
    let mut cold = Vec::new();
    let mut last = None;
    for _ in 0..repeat {
        drop(last.take());
        *counter += 1;
        let ns = NetNs::fresh(*counter);
        let took = svcplane_testbed::run_in_namespace(&ns.0, || {
            let mut backend = AnyBackend::new(mode);
            let started = Instant::now();
            let (full, _) = backend.sync(plan, &PlanDiff::default());
            assert!(full, "the first sync is full");
            started.elapsed()
        })
        .expect("entering the namespace");
        cold.push(took);
        last = Some(ns);
    }
    row.cold = median(cold);
    let ns = last.expect("repeat > 0");
    let mut plan = plan.clone();
    // The state the endpoint changes are applied to (rebuilt: ClusterState is not Clone).
    let mut state = cluster(size, endpoints);
    let (resync, change, check) = svcplane_testbed::run_in_namespace(&ns.0, || {
        let mut backend = AnyBackend::new(mode);
        backend.sync(&plan, &PlanDiff::default());
        let mut resync = Vec::new();
        for _ in 0..repeat {
            backend.request_full_sync();
            let started = Instant::now();
            backend.sync(&plan, &PlanDiff::default());
            resync.push(started.elapsed());
        }
        let mut change = Vec::new();
        for k in 0..changes {
            let s = k * size / changes;
            let moved = Ipv4Addr::new(198, 18, 64, k as u8 + 1);
            let started = Instant::now();
            state.apply(Change::SliceUpserted(slice(s, endpoints, Some(moved))));
            let changes = state.take_changes();
            let changed = plan.update(&state, &changes);
            let (full, ports) = backend.sync(&plan, &changed);
            change.push(started.elapsed());
            assert!(!full && ports == 1, "a partial sync of one service port");
        }
        let check = match &mut backend {
            AnyBackend::Iptables(b) => {
                let time_check = |with_nat: bool| {
                    let mut samples = Vec::new();
                    for _ in 0..repeat {
                        let started = Instant::now();
                        assert!(b.canaries_intact(with_nat).expect("reading the canaries"));
                        samples.push(started.elapsed());
                    }
                    median(samples)
                };
                Some((time_check(false), time_check(true)))
            }
            _ => None,
        };
        (median(resync), median(change), check)
    })
    .expect("entering the namespace");
    row.resync = resync;
    row.change = change;
    row.check = check;
    // Outside the timings: the last moved address is in the kernel.
    let moved = Ipv4Addr::new(198, 18, 64, changes as u8).to_string();
    // iptables-nft-save 1.8.9 overflows the default stack at 10k Services.
    let listing = match mode {
        Mode::NftablesNetlink | Mode::NftablesCli => "nft list table ip svcplane",
        Mode::IptablesLegacy => "iptables-legacy-save -t nat",
        Mode::IptablesNft => "ulimit -s unlimited; iptables-nft-save -t nat",
    };
    let output = Command::new("ip").args(["netns", "exec", &ns.0, "sh", "-c", listing]).output().expect("listing");
    assert!(String::from_utf8_lossy(&output.stdout).contains(&moved), "{}: {moved} is programmed", mode.label());
    row
}

#[test]
#[ignore = "a benchmark: needs root and minutes; run with --ignored --nocapture (see the file's header)"]
fn iptables_mode_beside_nftables_mode_at_one_and_ten_thousand_services() {
    let sizes: Vec<usize> = std::env::var("SVCPLANE_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a size"))
        .collect();
    let endpoints = 10;
    remove_stale_namespaces();
    let mut markdown = String::new();
    let mut counter = 0;
    for size in sizes {
        let state = cluster(size, endpoints);
        let plan = NodePlan::build(&state, node_config());
        assert_eq!(plan.service_ports.len(), size);
        let _ = writeln!(
            markdown,
            "#### {size} services x {endpoints} endpoints\n\n| mode | cold full sync | full resync, nothing changed | one endpoint change | canary check (mangle+filter / +nat) |\n| --- | ---: | ---: | ---: | ---: |"
        );
        let mut rows = Vec::new();
        let only = std::env::var("SVCPLANE_BENCH_MODES").unwrap_or_default();
        let modes = [Mode::NftablesNetlink, Mode::NftablesCli, Mode::IptablesLegacy, Mode::IptablesNft];
        for mode in modes.into_iter().filter(|m| only.is_empty() || only.split(',').any(|o| o == m.key())) {
            let row = measure(mode, &plan, size, &mut counter);
            eprintln!(
                "{size}x{endpoints} {:<28} cold {:>9} (min {:>9})  resync {:>9}  change {:>9} (min {:>9})  check {}",
                mode.label(),
                ms(row.cold.0),
                ms(row.cold.1),
                ms(row.resync.0),
                ms(row.change.0),
                ms(row.change.1),
                row.check
                    .map(|(cheap, full)| format!("{} / {}", ms(cheap.0), ms(full.0)))
                    .unwrap_or_else(|| "-".into())
            );
            let _ = writeln!(
                markdown,
                "| {} | {} (min {}) | {} | {} (min {}) | {} |",
                mode.label(),
                ms(row.cold.0),
                ms(row.cold.1),
                ms(row.resync.0),
                ms(row.change.0),
                ms(row.change.1),
                row.check
                    .map(|(cheap, full)| format!("{} / {}", ms(cheap.0), ms(full.0)))
                    .unwrap_or_else(|| "-".into())
            );
            rows.push((mode, row));
        }
        markdown.push('\n');
        let Some((_, base)) = rows.iter().find(|(m, _)| matches!(m, Mode::NftablesNetlink)) else { continue };
        for (mode, row) in rows.iter().filter(|(m, _)| matches!(m, Mode::IptablesLegacy | Mode::IptablesNft)) {
            let _ = writeln!(
                markdown,
                "- {} / nftables (netlink), {size}: cold **{:.2}**, one endpoint change **{:.2}**",
                mode.label(),
                row.cold.0.as_secs_f64() / base.cold.0.as_secs_f64(),
                row.change.0.as_secs_f64() / base.change.0.as_secs_f64()
            );
        }
        markdown.push('\n');
    }
    println!("{markdown}");
    if let Ok(path) = std::env::var("SVCPLANE_BENCH_MARKDOWN") {
        std::fs::write(&path, &markdown).expect("writing the markdown");
    }
}
