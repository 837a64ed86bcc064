//! eBPF mode benchmark: the same plan programmed by `--mode ebpf` and by `--mode nftables`
//! (netlink, the default mechanism) in the same run, and connections through a ClusterIP
//! compared with connections straight to the pod.
//!
//! `cargo bench -p svcplane --bench ebpf -- --sizes 10000,100000 --endpoints 10`
//! (needs root: network namespaces, a cgroup, BPF). Phases per size: cold program (a full
//! sync into a fresh namespace, cgroup and bpf root), one endpoint change (`plan.update` and
//! a partial sync, `--changes` different Services), the kernel memory of the maps. Then, in
//! a one-node lab with 30k other Services (`--others`), TCP connect latency p50/p99 and bulk
//! throughput through the ClusterIP in eBPF mode and in nftables mode, each as a ratio to
//! the same client reaching the same pod directly; `--same-path` times the direct path
//! against itself, to show how far the ratios scatter with no difference at all.
//! `--cold-only --repeat 1` measures one cold start per process (a node's one start; run it
//! N times), `--settle-ms` waits between cold starts in one process, `--open-ahead-ms`
//! opens the objects that long before the plan arrives, as the proxy does. See
//! `docs/benchmarks.md`.

mod common;

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::{
    LAB_SERVICE_IP, add_lab_service, connects_interleaved, endpoint_change, median, node_config, on_last_cpu,
    percentile, serve, show, synthetic, time,
};
use svcplane_backend_ebpf::{EbpfBackend, EbpfOptions, MapSizes};
use svcplane_backend_nftables::NftablesBackend;
use svcplane_core::{Dataplane, NodePlan, PlanDiff};
use svcplane_nft::NftNetlink;
use svcplane_testbed::Lab;

#[derive(Debug)]
struct Args {
    sizes: Vec<usize>,
    endpoints: usize,
    repeat: usize,
    changes: usize,
    connects: usize,
    others: usize,
    bulk_mib: usize,
    /// Also show where the eBPF cold sync's time goes, and its floor.
    phases: bool,
    /// Time both connect and stream paths straight to the pod (the "ClusterIP" columns
    /// too): the ratios' own scatter, which a real difference must stand out of.
    same_path: bool,
    /// Wait this long after removing one cold start's sandbox before the next: the kernel
    /// frees a removed map's memory in deferred work, which otherwise overlaps the next start.
    settle: Duration,
    /// Only the cold starts (eBPF and the nftables baseline): no endpoint changes, no
    /// connections. With `--repeat 1`, one process measures one cold start, as a node does.
    cold_only: bool,
    /// Open the objects ahead (`EbpfBackend::open_ahead`, as the proxy does when it
    /// starts) this long before the first plan arrives: the time a source's first list
    /// takes. The cold start is then timed from the plan.
    open_ahead: Option<Duration>,
    markdown: Option<PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        sizes: vec![10_000, 100_000],
        endpoints: 10,
        repeat: 3,
        changes: 20,
        connects: 2000,
        others: 30_000,
        bulk_mib: 512,
        phases: false,
        same_path: false,
        settle: Duration::ZERO,
        cold_only: false,
        open_ahead: None,
        markdown: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => args.sizes = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--endpoints" => args.endpoints = value()?.parse()?,
            "--repeat" => args.repeat = value()?.parse()?,
            "--changes" => args.changes = value()?.parse()?,
            "--connects" => args.connects = value()?.parse()?,
            "--others" => args.others = value()?.parse()?,
            "--bulk-mib" => args.bulk_mib = value()?.parse()?,
            "--markdown" => args.markdown = Some(value()?.into()),
            "--phases" => args.phases = true,
            "--same-path" => args.same_path = true,
            "--settle-ms" => args.settle = Duration::from_millis(value()?.parse()?),
            "--cold-only" => args.cold_only = true,
            "--open-ahead-ms" => args.open_ahead = Some(Duration::from_millis(value()?.parse()?)),
            "--bench" => {}
            other => bail!(
                "unknown argument {other:?} (--sizes A,B --endpoints E --repeat N --changes N --connects N --others N --bulk-mib N --phases --same-path --settle-ms MS --cold-only --open-ahead-ms MS --markdown FILE)"
            ),
        }
    }
    ensure!(
        args.repeat > 0 && args.changes > 0 && args.repeat.max(args.changes) <= 250,
        "--repeat, --changes: 1..=250"
    );
    ensure!(args.sizes.iter().all(|&s| (1..=200_000).contains(&s)), "sizes in 1..=200000");
    ensure!((1..=6_000).contains(&args.connects), "--connects: 1..=6000");
    ensure!((1..=4096).contains(&args.bulk_mib), "--bulk-mib: 1..=4096");
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// A sandbox: a network namespace, a cgroup and a bpf root of our own, removed on drop.

#[derive(Debug)]
struct Sandbox {
    netns: String,
    cgroup: PathBuf,
    bpf_root: PathBuf,
}

static SANDBOXES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Sandbox {
    fn fresh() -> anyhow::Result<Self> {
        let serial = SANDBOXES.fetch_add(1, Ordering::Relaxed);
        let netns = format!("svcp-ebench-{}-{serial}", std::process::id());
        let status = Command::new("ip").args(["netns", "add", &netns]).status()?;
        ensure!(status.success(), "`ip netns add {netns}` failed (the benchmark needs root)");
        let mount = svcplane_testbed::cgroup::cgroup2_mount().context("no cgroup2 mount")?;
        let cgroup = mount.join(&netns);
        std::fs::create_dir(&cgroup).with_context(|| format!("creating {}", cgroup.display()))?;
        let bpf_root = std::env::temp_dir().join(format!("{netns}-bpf"));
        Ok(Self { netns, cgroup, bpf_root })
    }

    /// eBPF mode with maps sized for `services` x `endpoints` (as `--bpf-map-*` would).
    fn ebpf(&self, services: usize, endpoints: usize, cold_start_on_one_thread: bool) -> EbpfBackend {
        let sizes = sizes_for(services, endpoints);
        EbpfBackend::new(EbpfOptions {
            bpf_root: self.bpf_root.clone(),
            cgroup: Some(self.cgroup.clone()),
            sizes,
            cold_start_on_one_thread,
            ..EbpfOptions::default()
        })
    }

    /// Runs `work` on a thread inside the namespace (the backend reads the node's netns
    /// cookie and addresses from the thread that syncs).
    fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        Ok(svcplane_testbed::run_in_namespace(&self.netns, work)?)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = svcplane_bpf::cleanup(&self.bpf_root);
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

/// Map sizes for a cluster this big: the defaults, or room for every frontend (two scopes)
/// and endpoint slot with a margin.
fn sizes_for(services: usize, endpoints: usize) -> MapSizes {
    let defaults = MapSizes::default();
    let needed = |n: usize| u32::try_from(n + n / 4).unwrap_or(u32::MAX);
    MapSizes {
        // Three entries a synthetic Service: its ClusterIP for each scope (the node, its
        // pods, and traffic from outside for the tc program).
        services: defaults.services.max(needed(services * 3)),
        backends: defaults.backends.max(needed(services * endpoints)),
        ..defaults
    }
}

// ---------------------------------------------------------------------------------------
// Measurements

/// Cold starts of one kind: their times and each phase's.
#[derive(Debug, Default)]
struct Cold {
    samples: Vec<Duration>,
    phases: Vec<(&'static str, Vec<Duration>)>,
}

impl Cold {
    /// One cold full sync of `plan` by `backend` in `sandbox`.
    fn run(&mut self, sandbox: &Sandbox, backend: &mut EbpfBackend, plan: &NodePlan) -> anyhow::Result<()> {
        self.run_after(sandbox, backend, plan, None)
    }

    /// The same, with the objects opened `ahead` of the plan when given.
    fn run_after(
        &mut self,
        sandbox: &Sandbox,
        backend: &mut EbpfBackend,
        plan: &NodePlan,
        ahead: Option<Duration>,
    ) -> anyhow::Result<()> {
        if let Some(ahead) = ahead {
            sandbox.run(|| backend.open_ahead())?.map_err(|error| anyhow::anyhow!("opening ahead: {error}"))?;
            std::thread::sleep(ahead);
        }
        let (took, result) = sandbox.run(|| time(|| backend.sync(plan, &PlanDiff::default())))?;
        let report = result.map_err(|error| anyhow::anyhow!("eBPF full sync: {error}"))?;
        ensure!(report.full, "the first sync is a full one");
        self.samples.push(took);
        for (phase, took) in backend.last_sync_phases() {
            match self.phases.iter_mut().find(|(name, _)| name == phase) {
                Some((_, samples)) => samples.push(*took),
                None => self.phases.push((phase, vec![*took])),
            }
        }
        Ok(())
    }

    fn min(&self) -> Duration {
        self.samples.iter().min().copied().unwrap_or_default()
    }
}

#[derive(Debug, Default)]
struct Table {
    lines: Vec<String>,
}

impl Table {
    fn row(&mut self, cells: &[String]) {
        let line = format!("| {} |", cells.join(" | "));
        eprintln!("{line}");
        self.lines.push(line);
    }
}

fn run_size(args: &Args, size: usize, out: &mut String) -> anyhow::Result<()> {
    eprintln!("== {size} services x {} endpoints", args.endpoints);
    let (took, mut state) = time(|| synthetic(size, args.endpoints));
    eprintln!("  (generated in {})", show(took));
    let mut plan = NodePlan::build(&state, node_config(Vec::new()));
    state.take_changes();
    ensure!(plan.service_ports.len() == size, "expected {size} service ports in the plan");
    let mut table = Table::default();
    writeln!(out, "#### {size} Services x {} endpoints\n", args.endpoints)?;
    table.row(&["phase".into(), "median".into(), "min".into(), "runs".into(), "note".into()]);
    table.row(&["---".into(), "---:".into(), "---:".into(), "---:".into(), "---".into()]);

    // Cold program, eBPF: a full sync into a fresh sandbox. With --phases, each run is
    // followed by the same cold start on one thread (the program loads, then the sync: the
    // code before the loads moved to threads of their own) and by the floor (a cold start
    // with an empty plan: nothing to write, maps of the same sizes), alternating so all
    // three see the same machine.
    let mut threaded = Cold::default();
    let mut one_thread = Cold::default();
    let mut floor = Cold::default();
    let empty = NodePlan::build(&svcplane_core::ClusterState::new(), node_config(Vec::new()));
    let mut kept = None;
    for run in 0..args.repeat {
        if kept.take().is_some() {
            std::thread::sleep(args.settle);
        }
        let sandbox = Sandbox::fresh()?;
        let mut backend = sandbox.ebpf(size, args.endpoints, false);
        threaded.run_after(&sandbox, &mut backend, &plan, args.open_ahead)?;
        eprintln!("  eBPF cold start {}: {}", run + 1, show(*threaded.samples.last().expect("a sample")));
        kept = Some((backend, sandbox));
        if args.phases {
            // Each sandbox is removed before the next run.
            {
                std::thread::sleep(args.settle);
                let sandbox = Sandbox::fresh()?;
                one_thread.run(&sandbox, &mut sandbox.ebpf(size, args.endpoints, true), &plan)?;
            }
            std::thread::sleep(args.settle);
            let sandbox = Sandbox::fresh()?;
            floor.run(&sandbox, &mut sandbox.ebpf(size, args.endpoints, false), &empty)?;
        }
    }
    let ebpf_cold = median(threaded.samples.clone());
    table.row(&[
        match args.open_ahead {
            None => "**eBPF: program cold** (load + attach + fill maps)".into(),
            Some(ahead) => format!("**eBPF: program cold from the plan**, objects opened {} ahead", show(ahead)),
        },
        show(ebpf_cold),
        show(threaded.min()),
        threaded.samples.len().to_string(),
        "EbpfBackend full sync".into(),
    ]);
    if args.phases {
        table.row(&[
            "eBPF: program cold on one thread (loads, then the sync)".into(),
            show(median(one_thread.samples.clone())),
            show(one_thread.min()),
            one_thread.samples.len().to_string(),
            "the same, `cold_start_on_one_thread`".into(),
        ]);
        table.row(&[
            "eBPF: program cold, empty plan (the floor: open, load, attach)".into(),
            show(median(floor.samples.clone())),
            show(floor.min()),
            floor.samples.len().to_string(),
            "nothing to write; maps of the same sizes".into(),
        ]);
    }
    let (mut backend, sandbox) = kept.expect("repeat > 0");
    let memory = svcplane_bpf::sys::pinned_map_memory(&sandbox.bpf_root)?;

    // Cold program, nftables over netlink, the same plan, same run.
    let mut samples = Vec::new();
    let mut kept_nft = None;
    for _ in 0..args.repeat {
        drop(kept_nft.take());
        let netns = Sandbox::fresh()?;
        let mut nft = NftablesBackend::new(NftNetlink::in_network_namespace(&netns.netns)?);
        let (took, result) = time(|| nft.sync(&plan, &PlanDiff::default()));
        result.map_err(|error| anyhow::anyhow!("nftables full sync: {error}"))?;
        samples.push(took);
        kept_nft = Some((nft, netns));
    }
    let nft_cold = median(samples.clone());
    table.row(&[
        "baseline: nftables program cold (netlink)".into(),
        show(nft_cold),
        show(samples.iter().min().copied().unwrap_or_default()),
        samples.len().to_string(),
        "NftablesBackend full sync, same plan".into(),
    ]);
    let (mut nft, _nft_netns) = kept_nft.expect("repeat > 0");
    if args.cold_only {
        writeln!(out, "{}\n", table.lines.join("\n"))?;
        writeln!(out, "- eBPF cold / nftables cold: **{:.2}**\n", ebpf_cold.as_secs_f64() / nft_cold.as_secs_f64())?;
        if args.phases {
            write_phases(out, &threaded, &one_thread)?;
        }
        return Ok(());
    }

    // One endpoint change: plan.update + partial sync, different Services each time.
    let mut ebpf_changes = Vec::new();
    let mut nft_changes = Vec::new();
    for k in 0..args.changes {
        let s = k * size / args.changes;
        endpoint_change(&mut state, s, args.endpoints, k);
        let changes = state.take_changes();
        let (plan_took, diff) = time(|| plan.update(&state, &changes));
        let (took, result) = sandbox.run(|| time(|| backend.sync(&plan, &diff)))?;
        ensure!(!result.map_err(|e| anyhow::anyhow!("eBPF partial sync: {e}"))?.full, "a partial sync");
        ebpf_changes.push(plan_took + took);
        let (took, result) = time(|| nft.sync(&plan, &diff));
        result.map_err(|e| anyhow::anyhow!("nftables partial sync: {e}"))?;
        nft_changes.push(plan_took + took);
    }
    let ebpf_change = median(ebpf_changes.clone());
    let nft_change = median(nft_changes.clone());
    let p99_ebpf = percentile(&mut ebpf_changes, 0.99);
    let p99_nft = percentile(&mut nft_changes, 0.99);
    table.row(&[
        "**eBPF: one endpoint change** (plan.update + partial sync)".into(),
        show(ebpf_change),
        format!("p99 {}", show(p99_ebpf)),
        args.changes.to_string(),
        "map updates only".into(),
    ]);
    table.row(&[
        "baseline: nftables one endpoint change (netlink)".into(),
        show(nft_change),
        format!("p99 {}", show(p99_nft)),
        args.changes.to_string(),
        "same changes, same plan".into(),
    ]);
    table.row(&[
        "eBPF maps' kernel memory (memlock)".into(),
        format!("{:.1} MiB", memory as f64 / (1 << 20) as f64),
        String::new(),
        "1".into(),
        "every pinned map, at its configured size".into(),
    ]);
    writeln!(out, "{}\n", table.lines.join("\n"))?;
    writeln!(
        out,
        "- eBPF cold / nftables cold: **{:.2}**; eBPF change / nftables change: **{:.3}**\n",
        ebpf_cold.as_secs_f64() / nft_cold.as_secs_f64(),
        ebpf_change.as_secs_f64() / nft_change.as_secs_f64()
    )?;
    if args.phases {
        write_phases(out, &threaded, &one_thread)?;
    }
    Ok(())
}

/// Where the cold syncs' time went, phase by phase.
fn write_phases(out: &mut String, threaded: &Cold, one_thread: &Cold) -> anyhow::Result<()> {
    for (title, cold) in [("the cold sync", threaded), ("the cold sync on one thread", one_thread)] {
        writeln!(
            out,
            "Where {title} goes (median, min and max of {} runs; phases marked \"own thread\" overlap the others):\n",
            cold.samples.len()
        )?;
        let mut lines = vec!["| phase | median | min | max |".to_owned(), "| --- | ---: | ---: | ---: |".to_owned()];
        for (phase, samples) in &cold.phases {
            let min = samples.iter().min().copied().unwrap_or_default();
            let max = samples.iter().max().copied().unwrap_or_default();
            lines.push(format!("| {phase} | {} | {} | {} |", show(median(samples.clone())), show(min), show(max)));
        }
        lines.push(format!("| **whole** | {} | {} | |", show(median(cold.samples.clone())), show(cold.min())));
        for line in &lines {
            eprintln!("{line}");
        }
        writeln!(out, "{}\n", lines.join("\n"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Connections through a ClusterIP in a one-node lab.

/// Bytes per second of one TCP stream of `mib` MiB from `pod` to `target`.
fn throughput(lab: &Lab, pod: &str, target: SocketAddr, mib: usize) -> anyhow::Result<f64> {
    // The sender on one CPU, the server's reader on the other, in every stream: where the
    // scheduler happened to put them moved a stream's rate by up to 30 %.
    let took = lab.run_in(pod, || -> anyhow::Result<Duration> {
        on_last_cpu(|| {
            let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
            let chunk = vec![7u8; 1 << 16];
            let started = Instant::now();
            for _ in 0..mib * 16 {
                stream.write_all(&chunk)?;
            }
            stream.shutdown(std::net::Shutdown::Write)?;
            // Delivered, not only handed to the socket's buffers (several MiB): the server
            // closes once it has read everything.
            stream.set_read_timeout(Some(Duration::from_secs(30)))?;
            let mut end = [0u8; 1];
            ensure!(stream.read(&mut end)? == 0, "the server sent data");
            Ok(started.elapsed())
        })
    })??;
    Ok((mib << 20) as f64 / took.as_secs_f64())
}

/// Through the Service and straight to the pod, measured alternately in `ROUNDS` rounds
/// (which path goes first alternating too) so both see the same machine: connect p50/p99
/// of each, the best stream of each and the median of the rounds' stream ratios.
struct Paired {
    service: (Duration, Duration),
    direct: (Duration, Duration),
    service_stream: f64,
    direct_stream: f64,
    /// The median over rounds of one round's service stream / direct stream: each pair
    /// saw the same moment of the machine, so this is steadier than the best of each.
    stream_ratio: f64,
}

const ROUNDS: usize = 8;
/// Source ports each path of one mode binds: [`MODE_PORTS`] per mode, half through the
/// Service, half straight to the pod.
const MODE_PORTS: u16 = 12_000;

/// `first_port`: where this mode's source ports start. Each mode has its own: a mode
/// that reused the previous mode's ports to the same pod seconds later would meet that
/// mode's connections in TIME_WAIT (in the client and in conntrack), and under DNAT the
/// first connect was sometimes answered with a reset.
fn paired(
    lab: &Lab,
    pod: &str,
    service: SocketAddr,
    direct: SocketAddr,
    args: &Args,
    first_port: u16,
) -> anyhow::Result<Paired> {
    let service = if args.same_path { direct } else { service };
    let (mut through, mut straight) = (Vec::new(), Vec::new());
    let (mut service_stream, mut direct_stream) = (0f64, 0f64);
    let mut ratios = Vec::with_capacity(ROUNDS);
    let per_round = args.connects / ROUNDS;
    let per_path = usize::from(MODE_PORTS / 2);
    ensure!(per_round * ROUNDS <= per_path, "--connects: at most {per_path} per path");
    for round in 0..ROUNDS {
        // Source ports of each path's own (see `common::connects`).
        let offset = u16::try_from(round * per_round)?;
        // The two halves of the mode's ports change hands each round, so the two sides
        // differ by their path only: with the same path on both sides (`--same-path`)
        // the p99 ratio's median was 1.05-1.06 before, ~1 after.
        let (mut through_ports, mut straight_ports) = (first_port + offset, first_port + MODE_PORTS / 2 + offset);
        if round % 2 == 1 {
            std::mem::swap(&mut through_ports, &mut straight_ports);
        }
        let [service_samples, direct_samples] =
            connects_interleaved(lab, pod, [service, direct], per_round, [through_ports, straight_ports])?;
        through.extend(service_samples);
        straight.extend(direct_samples);
        // Which path streams first alternates: the first stream of a round was measured up
        // to 30 % slower whichever path it was.
        let mib = args.bulk_mib / ROUNDS;
        let (first, second) = if round % 2 == 0 { (service, direct) } else { (direct, service) };
        let (first_stream, second_stream) = (throughput(lab, pod, first, mib)?, throughput(lab, pod, second, mib)?);
        let (through_stream, straight_stream) =
            if round % 2 == 0 { (first_stream, second_stream) } else { (second_stream, first_stream) };
        ratios.push(through_stream / straight_stream);
        service_stream = service_stream.max(through_stream);
        direct_stream = direct_stream.max(straight_stream);
    }
    Ok(Paired {
        service: (percentile(&mut through, 0.5), percentile(&mut through, 0.99)),
        direct: (percentile(&mut straight, 0.5), percentile(&mut straight, 0.99)),
        service_stream,
        direct_stream,
        stream_ratio: {
            ratios.sort_by(f64::total_cmp);
            (ratios[(ROUNDS - 1) / 2] + ratios[ROUNDS / 2]) / 2.0
        },
    })
}

fn lab_plan(others: usize, lab: &Lab, server: SocketAddr) -> NodePlan {
    let mut state = synthetic(others, 10);
    add_lab_service(&mut state, server);
    let node = lab.node(1);
    NodePlan::build(&state, node_config(node.ips().to_vec()))
}

fn run_connections(args: &Args, out: &mut String) -> anyhow::Result<()> {
    eprintln!("== connections through a ClusterIP with {} other Services", args.others);
    let lab = Lab::builder().nodes(1).pod(1, "server").pod(1, "client").node_cgroups(true).build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (server, handle) = serve(&lab, "server", Arc::clone(&stop))?;
    let plan = lab_plan(args.others, &lab, server);
    let client = lab.pod("client").namespace_name().to_owned();
    let node_ns = lab.node(1).namespace_name().to_owned();
    let service = SocketAddr::new(IpAddr::V4(LAB_SERVICE_IP), 80);
    let mut rows = Vec::new();

    // eBPF mode on the lab's node: attached to its cgroup, which holds the client thread.
    let bpf_root = std::env::temp_dir().join(format!("svcp-ebench-lab-{}", std::process::id()));
    let mut ebpf = EbpfBackend::new(EbpfOptions {
        bpf_root: bpf_root.clone(),
        cgroup: lab.node_cgroup(1).map(Path::to_path_buf),
        sizes: sizes_for(args.others + 1, 10),
        ..EbpfOptions::default()
    });
    let synced = lab.run_in(&node_ns, || ebpf.sync(&plan, &PlanDiff::default()))?;
    let measured = synced
        .map_err(|error| anyhow::anyhow!("eBPF sync: {error}"))
        .and_then(|_| paired(&lab, &client, service, server, args, 5_000));
    let _ = ebpf.cleanup();
    let _ = svcplane_bpf::cleanup(&bpf_root);
    rows.push(("eBPF mode", measured?));

    // nftables mode on the same node, same plan.
    let mut nft = NftablesBackend::new(NftNetlink::in_network_namespace(&node_ns)?);
    nft.sync(&plan, &PlanDiff::default()).map_err(|error| anyhow::anyhow!("nftables sync: {error}"))?;
    let measured = paired(&lab, &client, service, server, args, 5_000 + MODE_PORTS);
    let _ = nft.cleanup();
    rows.push(("nftables mode", measured?));

    stop.store(true, Ordering::Relaxed);
    let _ = handle.join();
    lab.teardown()?;

    writeln!(
        out,
        "#### TCP through a ClusterIP, {} other Services x 10 endpoints loaded ({} connects, {} MiB stream)\n",
        args.others, args.connects, args.bulk_mib
    )?;
    writeln!(
        out,
        "| mode | ClusterIP connect p50 / p99 | direct connect p50 / p99 | p50 ratio | p99 ratio | ClusterIP stream (best) | direct stream (best) | stream ratio (median of rounds) |"
    )?;
    writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    for (mode, paired) in &rows {
        let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
        let line = format!(
            "| {mode} | {} / {} | {} / {} | {:.2} | {:.2} | {:.2} GiB/s | {:.2} GiB/s | {:.3} |",
            show(paired.service.0),
            show(paired.service.1),
            show(paired.direct.0),
            show(paired.direct.1),
            paired.service.0.as_secs_f64() / paired.direct.0.as_secs_f64(),
            paired.service.1.as_secs_f64() / paired.direct.1.as_secs_f64(),
            gib(paired.service_stream),
            gib(paired.direct_stream),
            paired.stream_ratio
        );
        eprintln!("{line}");
        writeln!(out, "{line}")?;
    }
    writeln!(out)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut out = String::new();
    for &size in &args.sizes {
        run_size(&args, size, &mut out)?;
    }
    if !args.cold_only {
        run_connections(&args, &mut out)?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, &out).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{out}");
    Ok(())
}
