//! Scale benchmark: S Services x E endpoints read from generated manifests, through every
//! phase of a sync, with the kernel phases run against a throw-away network namespace.
//!
//! `cargo bench -p svcplane --bench scale -- --sizes 1000,10000 --endpoints 10 --repeat 3`
//! (needs root for `ip netns`). Prints one table per size; `--markdown FILE` also writes the
//! tables as markdown. Results are reported with ratios against baselines measured in the
//! same run: a raw `nft -f` of the plain linear shape (a chain per service with a `numgen` cascade)
//! and one tiny `nft -f` transaction against that table. See `docs/benchmarks.md`.
//!
//! The manifests -> plan wiring below calls the library crates phase by phase (the binary's
//! sync loop does the same in one go), so each phase can be timed on its own.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use svcplane_backend_nftables::{NftablesBackend, render_full};
use svcplane_controller::{Allocator, AllocatorConfig, NodePortRange, reconcile};
use svcplane_core::{Change, ClusterState, IpFamily, NodeConfig, NodePlan, PlanDiff};
use svcplane_nft::{NftCli, NftNetlink};
use svcplane_source::{
    DirectoryWatcher, Loaded, ManifestsFeed, ManifestsSettings, SnapshotDiffer, convert_objects, load_directory,
};

const NODES: usize = 10;
const FILES: usize = 100;
/// The research tool's pod addresses: 198.18.128.0 + (i % 32000) + 1.
const POD_ADDRESSES: u32 = 32000;
const CLUSTER_CIDR: &str = "198.18.128.0/17";
const SERVICE_CIDR: &str = "198.19.0.0/16";
const TARGET_COLD: Duration = Duration::from_secs(1);
const TARGET_CHANGE: Duration = Duration::from_millis(20);

#[derive(Debug)]
struct Args {
    sizes: Vec<usize>,
    endpoints: usize,
    repeat: usize,
    changes: usize,
    markdown: Option<PathBuf>,
    /// Writes the rendered full script and the research script of each size here.
    dump: Option<PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args { sizes: vec![1000, 10000], endpoints: 10, repeat: 3, changes: 10, markdown: None, dump: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--sizes" => args.sizes = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--endpoints" => args.endpoints = value()?.parse()?,
            "--repeat" => args.repeat = value()?.parse()?,
            "--changes" => args.changes = value()?.parse()?,
            "--markdown" => args.markdown = Some(value()?.into()),
            "--dump" => args.dump = Some(value()?.into()),
            "--bench" => {} // passed by `cargo bench`
            other => {
                bail!(
                    "unknown argument {other:?} (--sizes A,B --endpoints E --repeat N --changes N --markdown FILE --dump DIR)"
                )
            }
        }
    }
    ensure!(
        args.repeat > 0 && args.changes > 0 && args.repeat.max(args.changes) <= 250,
        "--repeat, --changes: 1..=250"
    );
    ensure!(args.endpoints > 0 && args.sizes.iter().all(|&s| (1..=60000).contains(&s)), "sizes in 1..=60000");
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// Fixed inputs

fn service_ip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + s as u32 + 1)
}

fn pod_ip(s: usize, e: usize, endpoints: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + ((s * endpoints + e) as u32 % POD_ADDRESSES) + 1)
}

/// Writes the manifests: `nodes.yaml` and `part-NNN.yaml` files, each with a share of the
/// Services and their Pods.
#[derive(Debug)]
struct Manifests {
    dir: PathBuf,
    services: usize,
    endpoints: usize,
}

impl Manifests {
    fn generate(services: usize, endpoints: usize) -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
        let dir = std::env::temp_dir().join(format!("svcplane-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let manifests = Self { dir, services, endpoints };
        let mut nodes = String::new();
        for n in 1..=NODES {
            writeln!(
                nodes,
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: node{n}\nstatus:\n  addresses:\n    - type: InternalIP\n      address: 198.18.0.{}\n---",
                10 + n
            )?;
        }
        std::fs::write(manifests.dir.join("nodes.yaml"), nodes)?;
        for file in 0..manifests.files() {
            manifests.write_file(file, &[])?;
        }
        Ok(manifests)
    }

    fn files(&self) -> usize {
        FILES.min(self.services)
    }

    fn file_of(&self, service: usize) -> usize {
        (0..self.files()).find(|&f| self.range(f).contains(&service)).expect("every service is in a file")
    }

    fn range(&self, file: usize) -> std::ops::Range<usize> {
        file * self.services / self.files()..(file + 1) * self.services / self.files()
    }

    /// Writes one part file; each of `moved` gives endpoint 0 of one service another address.
    fn write_file(&self, file: usize, moved: &[(usize, Ipv4Addr)]) -> anyhow::Result<()> {
        let mut text = String::new();
        for s in self.range(file) {
            writeln!(
                text,
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{s}\n  namespace: bench\nspec:\n  type: ClusterIP\n  clusterIP: {}\n  selector:\n    app: svc-{s}\n  ports:\n    - name: http\n      protocol: TCP\n      port: 80\n      targetPort: 8080\n---",
                service_ip(s)
            )?;
            for e in 0..self.endpoints {
                let ip = match moved.iter().rev().find(|(service, _)| *service == s) {
                    Some(&(_, ip)) if e == 0 => ip,
                    _ => pod_ip(s, e, self.endpoints),
                };
                let node = (s * self.endpoints + e) % NODES + 1;
                writeln!(
                    text,
                    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: svc-{s}-{e}\n  namespace: bench\n  labels:\n    app: svc-{s}\nspec:\n  nodeName: node{node}\n  containers:\n    - name: app\n      image: bench\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n    - ip: {ip}\n  conditions:\n    - type: Ready\n      status: \"True\"\n---"
                )?;
            }
        }
        std::fs::write(self.dir.join(format!("part-{file:03}.yaml")), text)?;
        Ok(())
    }
}

impl Drop for Manifests {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The research shape (`nft-shape-rule-cascade.py S E`), byte for byte.
fn research_script(services: usize, endpoints: usize) -> String {
    let mut out = String::from("table ip bench {\n");
    out.push_str("  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; elements = {\n");
    let elements: Vec<String> =
        (0..services).map(|s| format!("    {} . tcp . 80 : goto svc-{s}", service_ip(s))).collect();
    out.push_str(&elements.join(",\n"));
    out.push_str("\n  } }\n  chain services {\n    ip daddr . meta l4proto . th dport vmap @service-ips\n  }\n");
    out.push_str("  chain pre {\n    type nat hook prerouting priority -100; policy accept;\n    jump services\n  }\n");
    for s in 0..services {
        writeln!(out, "  chain svc-{s} {{").unwrap();
        for e in 0..endpoints {
            let cond =
                if e < endpoints - 1 { format!("numgen random mod {} 0 ", endpoints - e) } else { String::new() };
            writeln!(out, "    {cond}meta l4proto tcp dnat to {}:8080", pod_ip(s, e, endpoints)).unwrap();
        }
        out.push_str("  }\n");
    }
    out.push_str("}\n");
    out
}

// ---------------------------------------------------------------------------------------
// Kernel side: a namespace of our own, and raw `nft -f`

/// `svcp-bench-<pid>-<n>`, deleted on drop (panics included). Never the machine's namespace.
/// The counter keeps two live namespaces (one per mechanism) apart.
#[derive(Debug)]
struct Netns(String);

static NAMESPACES_MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl Netns {
    fn fresh() -> anyhow::Result<Self> {
        let serial = NAMESPACES_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("svcp-bench-{}-{serial}", std::process::id());
        remove_netns(&name);
        let status = Command::new("ip").args(["netns", "add", &name]).status()?;
        ensure!(status.success(), "`ip netns add {name}` failed (the benchmark needs root)");
        Ok(Self(name))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_netns(&self.0);
    }
}

fn remove_netns(name: &str) {
    if Path::new("/run/netns").join(name).exists() {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
    }
}

/// Deletes namespaces left by earlier runs whose process is gone.
fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix("svcp-bench-")
            && let Some(pid) = rest.split('-').next()
            && !Path::new("/proc").join(pid).exists()
        {
            remove_netns(&name);
        }
    }
}

/// `ip netns exec NS nft -f -` with `script` on stdin, as `NftCli` runs it.
fn nft_f(netns: &Netns, script: &str) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", &netns.0, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let output = std::thread::scope(|scope| {
        scope.spawn(move || stdin.write_all(script.as_bytes()));
        child.wait_with_output()
    })?;
    ensure!(output.status.success(), "nft -f failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

fn nft_list(netns: &Netns, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("ip").args(["netns", "exec", &netns.0, "nft"]).args(args).output()?;
    ensure!(output.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8(output.stdout)?)
}

// ---------------------------------------------------------------------------------------
// Measurements

#[derive(Debug, Clone, Copy)]
struct Stats {
    median: Duration,
    min: Duration,
    /// The sample at the 99th percentile (nearest rank): the largest below 100 runs.
    p99: Duration,
    runs: usize,
}

impl Stats {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let p99 = samples[(samples.len() * 99).div_ceil(100) - 1];
        Self { median: samples[samples.len() / 2], min: samples[0], p99, runs: samples.len() }
    }
}

fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let started = Instant::now();
    let value = f();
    (started.elapsed(), value)
}

#[derive(Debug)]
struct Row {
    phase: &'static str,
    stats: Stats,
    note: String,
}

#[derive(Debug, Default)]
struct Report {
    size: usize,
    endpoints: usize,
    rows: Vec<Row>,
    ratios: Vec<(String, f64)>,
    peak_rss_mib: f64,
}

impl Report {
    fn row(&mut self, phase: &'static str, samples: Vec<Duration>, note: impl Into<String>) -> Stats {
        let stats = Stats::of(samples);
        let row = Row { phase, stats, note: note.into() };
        eprintln!(
            "  {:<34} median {:>9} min {:>9} p99 {:>9}  {}",
            row.phase,
            ms(stats.median),
            ms(stats.min),
            ms(stats.p99),
            row.note
        );
        self.rows.push(row);
        stats
    }

    fn ratio(&mut self, what: String, value: f64) {
        eprintln!("  {what}: {value:.2}");
        self.ratios.push((what, value));
    }

    fn markdown(&self) -> String {
        let mut out = format!(
            "#### {} services x {} endpoints\n\n| phase | median | min | p99 | runs | note |\n| --- | ---: | ---: | ---: | ---: | --- |\n",
            self.size, self.endpoints
        );
        for row in &self.rows {
            let s = row.stats;
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                row.phase,
                ms(s.median),
                ms(s.min),
                ms(s.p99),
                s.runs,
                row.note
            )
            .unwrap();
        }
        writeln!(
            out,
            "| peak RSS (VmHWM) | {:.0} MiB | | | | whole process, generator included |\n",
            self.peak_rss_mib
        )
        .unwrap();
        for (what, value) in &self.ratios {
            writeln!(out, "- {what}: **{value:.2}**").unwrap();
        }
        out
    }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 { format!("{ms:.2} ms") } else { format!("{ms:.0} ms") }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// Resets the process's peak RSS (`VmHWM`) by writing 5 to `/proc/self/clear_refs`.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// A `/proc/self/status` memory field, in MiB.
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn allocator() -> Allocator {
    let config =
        AllocatorConfig { service_cidrs: vec![SERVICE_CIDR.parse().unwrap()], node_port_range: NodePortRange::DEFAULT };
    Allocator::new(config).expect("valid allocator config")
}

fn node_config() -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        ..NodeConfig::default()
    }
}

fn controller_input(loaded: &Loaded) -> svcplane_controller::ClusterObjects {
    let objects = &loaded.objects;
    svcplane_controller::ClusterObjects {
        services: objects.services.clone(),
        pods: objects.pods.clone(),
        nodes: objects.nodes.clone(),
        slices: objects.slices.clone(),
        pools: Vec::new(),
    }
}

fn source_objects(
    reconciled: svcplane_controller::Reconciled,
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
) -> svcplane_source::ClusterObjects {
    svcplane_source::ClusterObjects {
        services: reconciled.services,
        pods: Vec::new(),
        nodes,
        slices: reconciled.slices,
        pools: Vec::new(),
    }
}

fn run_size(args: &Args, size: usize) -> anyhow::Result<Report> {
    let e = args.endpoints;
    let repeat = args.repeat;
    let mut report = Report { size, endpoints: e, ..Report::default() };
    reset_peak_rss();
    eprintln!("== {size} services x {e} endpoints");

    let (took, manifests) = time(|| Manifests::generate(size, e));
    let manifests = manifests?;
    eprintln!("  (generated {} files in {})", manifests.files() + 1, ms(took));

    // a. load
    let mut samples = Vec::new();
    let mut loaded = None;
    for _ in 0..repeat {
        let (took, value) = time(|| load_directory(&manifests.dir));
        samples.push(took);
        loaded = Some(value);
    }
    let loaded = loaded.expect("repeat > 0");
    ensure!(loaded.errors.is_empty(), "manifest errors: {:?}", loaded.errors.first());
    ensure!(loaded.objects.pods.len() == size * e, "expected {} pods", size * e);
    let (rss, peak) = (status_mib("VmRSS:"), peak_rss_mib());
    report.row(
        "load (parse the directory)",
        samples,
        format!("{size} Services, {} Pods; RSS {rss:.0} MiB, peak so far {peak:.0} MiB", size * e),
    );

    // b. controller: allocation + EndpointSlices, a fresh allocator each run
    let input = controller_input(&loaded);
    let mut samples = Vec::new();
    let mut warm = None;
    for _ in 0..repeat {
        let mut allocator = allocator();
        let (took, reconciled) = time(|| reconcile(&input, &mut allocator));
        samples.push(took);
        warm = Some((allocator, reconciled));
    }
    let (mut allocator, reconciled) = warm.expect("repeat > 0");
    ensure!(reconciled.errors.is_empty(), "controller errors: {:?}", reconciled.errors.first());
    let slices = reconciled.slices.len();
    report.row("controller (reconcile)", samples, format!("{slices} EndpointSlices"));

    // c. convert + diff into a fresh ClusterState
    let objects = source_objects(reconciled, input.nodes.clone());
    let mut samples = Vec::new();
    let mut warm = None;
    for _ in 0..repeat {
        let (took, value) = time(|| {
            let converted = convert_objects(&objects, &loaded.origins);
            let mut differ = SnapshotDiffer::new();
            let mut state = ClusterState::new();
            for change in differ.diff(converted.services, converted.slices, converted.nodes) {
                state.apply(change);
            }
            (differ, state)
        });
        samples.push(took);
        warm = Some(value);
    }
    let (mut differ, mut state) = warm.expect("repeat > 0");
    drop(objects);
    report.row("convert + diff into ClusterState", samples, "");

    // d. plan
    let mut samples = Vec::new();
    let mut plan = None;
    for _ in 0..repeat {
        let (took, value) = time(|| NodePlan::build(&state, node_config()));
        samples.push(took);
        plan = Some(value);
    }
    let mut plan = plan.expect("repeat > 0");
    state.take_changes();
    ensure!(plan.service_ports.len() == size, "expected {size} service ports in the plan");
    report.row("**plan** (NodePlan::build)", samples, format!("{} service ports", plan.service_ports.len()));

    // e. render: objects and the nft script text
    let mut samples = Vec::new();
    let mut script_bytes = 0;
    let mut operations = 0;
    for _ in 0..repeat {
        let (took, (ops, bytes)) = time(|| {
            let transactions = render_full(&plan, &[IpFamily::V4, IpFamily::V6]);
            let ops: usize = transactions.iter().map(|t| t.operations.len()).sum();
            let bytes: usize = transactions.iter().map(|t| svcplane_nft::render(t).expect("renders").len()).sum();
            (ops, bytes)
        });
        samples.push(took);
        (operations, script_bytes) = (ops, bytes);
    }
    report.row(
        "**render** (render_full + text)",
        samples,
        format!("{operations} operations, {:.1} MiB of script", script_bytes as f64 / (1 << 20) as f64),
    );

    // Baseline 1: raw `nft -f` of the research shape into a fresh namespace.
    let research = research_script(size, e);
    if let Some(dir) = &args.dump {
        let ours: Vec<String> = render_full(&plan, &[IpFamily::V4, IpFamily::V6])
            .iter()
            .map(|t| svcplane_nft::render(t).expect("renders"))
            .collect();
        std::fs::write(dir.join(format!("svcplane-{size}x{e}.nft")), ours.concat())?;
        std::fs::write(dir.join(format!("research-{size}x{e}.nft")), &research)?;
    }
    let mut samples = Vec::new();
    let mut netns = None;
    for _ in 0..repeat {
        drop(netns.take());
        let fresh = Netns::fresh()?;
        let (took, result) = time(|| nft_f(&fresh, &research));
        result?;
        samples.push(took);
        netns = Some(fresh);
    }
    let baseline_cold = report.row(
        "baseline: raw `nft -f`, research shape",
        samples,
        format!("{:.1} MiB of script, no svcplane code", research.len() as f64 / (1 << 20) as f64),
    );
    // Baseline 2: one tiny transaction (replace one chain) in that table.
    let netns_research = netns.expect("repeat > 0");
    let mut samples = Vec::new();
    for k in 0..args.changes {
        let s = k * size / args.changes;
        let mut script = format!("flush chain ip bench svc-{s}\n");
        for i in 0..e {
            let cond = if i < e - 1 { format!("numgen random mod {} 0 ", e - i) } else { String::new() };
            let ip = if i == 0 { Ipv4Addr::new(198, 18, 32, k as u8 + 1) } else { pod_ip(s, i, e) };
            writeln!(script, "add rule ip bench svc-{s} {cond}meta l4proto tcp dnat to {ip}:8080")?;
        }
        let (took, result) = time(|| nft_f(&netns_research, &script));
        result?;
        samples.push(took);
    }
    let baseline_change = report.row("baseline: one-chain `nft -f`", samples, "flush + re-add one service chain");
    drop(netns_research);

    // f. program the kernel cold: a full sync into a fresh namespace.
    let mut samples = Vec::new();
    let mut programmed = None;
    for _ in 0..repeat {
        drop(programmed.take());
        let netns = Netns::fresh()?;
        let mut backend = NftablesBackend::new(NftCli::in_network_namespace(&netns.0));
        let (took, result) = time(|| backend.sync(&plan, &PlanDiff::default()));
        let sync = result?;
        ensure!(sync.full, "the first sync is a full one");
        samples.push(took);
        programmed = Some((backend, netns));
    }
    let cold = report.row(
        "**program the kernel cold** (full sync, nft CLI)",
        samples,
        "NftablesBackend + nft CLI, both families",
    );
    let (mut backend, netns) = programmed.expect("repeat > 0");

    // The same cold program over nf_tables netlink, the proxy's default mechanism.
    let mut samples = Vec::new();
    let (mut kernel_cpu, mut own_cpu) = (Vec::new(), Vec::new());
    let mut programmed = None;
    for _ in 0..repeat {
        drop(programmed.take());
        let netns = Netns::fresh()?;
        let mut netlink_backend = NftablesBackend::new(NftNetlink::in_network_namespace(&netns.0)?);
        let before = thread_cpu();
        let (took, result) = time(|| netlink_backend.sync(&plan, &PlanDiff::default()));
        let after = thread_cpu();
        ensure!(result?.full, "the first sync is a full one");
        samples.push(took);
        own_cpu.push(after.user.saturating_sub(before.user));
        kernel_cpu.push(after.system.saturating_sub(before.system));
        programmed = Some((netlink_backend, netns));
    }
    let cold_netlink = report.row(
        "**program the kernel cold** (full sync, netlink)",
        samples,
        "NftablesBackend + NftNetlink, both families",
    );
    report.row(
        "of which the kernel's own work (system CPU of the syncing thread)",
        kernel_cpu,
        "the batches are handled inside sendmsg, on this thread: the floor of a cold load",
    );
    report.row(
        "of which svcplane's own work (user CPU of the syncing thread)",
        own_cpu,
        "rendering, digests, encoding",
    );
    let (mut netlink_backend, netlink_netns) = programmed.expect("repeat > 0");

    // Baseline 3: the same over netlink with every Service in one table per family, the
    // shape before the tables were split (the kernel validates the whole table per commit).
    let mut samples = Vec::new();
    let mut programmed = None;
    for _ in 0..repeat {
        drop(programmed.take());
        let netns = Netns::fresh()?;
        let mut one_table = NftablesBackend::new(NftNetlink::in_network_namespace(&netns.0)?).with_tables(1);
        let (took, result) = time(|| one_table.sync(&plan, &PlanDiff::default()));
        ensure!(result?.full, "the first sync is a full one");
        samples.push(took);
        programmed = Some((one_table, netns));
    }
    report.row(
        "baseline: cold, one table per family (netlink)",
        samples,
        format!("the default spreads {size} services over {} tables", netlink_backend.tables()),
    );
    let (mut one_table, one_table_netns) = programmed.expect("repeat > 0");

    // Full resync of an unchanged plan over the loaded table.
    let mut samples = Vec::new();
    for _ in 0..repeat {
        backend.request_full_sync();
        let (took, result) = time(|| backend.sync(&plan, &PlanDiff::default()));
        ensure!(result?.full);
        samples.push(took);
    }
    report.row("full resync, nothing changed (nft CLI)", samples, "the CLI cannot read a table's digest: rewrites it");

    // The same over netlink: each table's digest says it already holds the plan.
    let mut samples = Vec::new();
    for _ in 0..repeat {
        netlink_backend.request_full_sync();
        let (took, result) = time(|| netlink_backend.sync(&plan, &PlanDiff::default()));
        let sync = result?;
        ensure!(sync.full && sync.operations == 0, "an unchanged plan's resync writes nothing: {sync:?}");
        samples.push(took);
    }
    report.row(
        "**full resync, nothing changed** (netlink)",
        samples,
        format!("writes nothing: render, digests, 3 reads per table (cold over netlink: {})", ms(cold_netlink.median)),
    );

    // A restart: a new process (backend and socket) whose first sync finds the tables as planned.
    let mut samples = Vec::new();
    for _ in 0..repeat {
        let mut restarted = NftablesBackend::new(NftNetlink::in_network_namespace(&netlink_netns.0)?);
        let (took, result) = time(|| restarted.sync(&plan, &PlanDiff::default()));
        let sync = result?;
        ensure!(sync.full && sync.operations == 0, "a restart over tables holding the plan writes nothing: {sync:?}");
        samples.push(took);
    }
    report.row("**restart, nothing changed** (netlink)", samples, "a new process's first sync: writes nothing");

    // g. one endpoint change, straight into the ClusterState, applied through both mechanisms.
    let mut samples = Vec::new();
    let mut netlink_samples = Vec::new();
    let mut in_process = Vec::new();
    let mut one_table_samples = Vec::new();
    let mut moved_to = Vec::new();
    for k in 0..args.changes {
        let service = k * size / args.changes;
        let name = format!("svc-{service}");
        let mut slice = state
            .slices()
            .find(|slice| slice.service.name == name)
            .cloned()
            .with_context(|| format!("no slice for {name}"))?;
        let address = Ipv4Addr::new(198, 18, 64, k as u8 + 1);
        slice.endpoints[0].address = address.into();
        moved_to.push(address);
        let started = Instant::now();
        state.apply(Change::SliceUpserted(slice));
        let changes = state.take_changes();
        let changed = plan.update(&state, &changes);
        let planned = started.elapsed();
        in_process.push(planned);
        let sync = backend.sync(&plan, &changed)?;
        samples.push(started.elapsed());
        ensure!(!sync.full && sync.service_ports == 1, "expected a partial sync of one service port: {sync:?}");
        let (took, result) = time(|| netlink_backend.sync(&plan, &changed));
        let sync = result?;
        netlink_samples.push(planned + took);
        ensure!(!sync.full && sync.service_ports == 1, "expected a partial sync of one service port: {sync:?}");
        let (took, result) = time(|| one_table.sync(&plan, &changed));
        ensure!(!result?.full);
        one_table_samples.push(planned + took);
    }
    let change_one_table = report.row(
        "baseline: one endpoint change, one table (netlink)",
        one_table_samples,
        "the same changes, every Service in one table per family",
    );
    drop(one_table_netns);
    let change_netlink = report.row(
        "**one endpoint change** (state -> kernel, netlink)",
        netlink_samples,
        "the same changes through NftNetlink",
    );
    let listed = nft_list(&netlink_netns, &["list", "ruleset"])?;
    for address in &moved_to {
        ensure!(listed.contains(&format!("{address}:8080")), "{address} is not in the netlink-programmed table");
    }
    drop(netlink_netns);
    let change = report.row(
        "**one endpoint change** (state -> kernel, nft CLI)",
        samples,
        format!("Change::SliceUpserted, plan.update ({} of it), partial sync", ms(Stats::of(in_process).median)),
    );

    // h. the same through the manifests: rewrite one Pod's file, poll, reconcile, convert, diff, plan, sync.
    let mut watcher = DirectoryWatcher::new(&manifests.dir);
    watcher.poll().context("first poll")?;
    let mut file_moves: Vec<(usize, Ipv4Addr)> = Vec::new();
    let mut samples = Vec::new();
    let mut parts: [Vec<Duration>; 4] = Default::default();
    for k in 0..repeat {
        // Services not touched by (g), so the differ and the state agree about them.
        let service = ((k * size / repeat + size / (2 * repeat)) | 1).min(size - 1);
        let address = Ipv4Addr::new(198, 18, 96, k as u8 + 1);
        file_moves.push((service, address));
        manifests.write_file(manifests.file_of(service), &file_moves)?;
        moved_to.push(address);
        let started = Instant::now();
        let loaded = watcher.poll().context("the rewrite was not noticed")?;
        let t_poll = started.elapsed();
        // Moved, not cloned, as `Pipeline::ingest` does.
        let Loaded { objects, origins, .. } = loaded;
        let input = svcplane_controller::ClusterObjects {
            services: objects.services,
            pods: objects.pods,
            nodes: objects.nodes,
            slices: objects.slices,
            pools: Vec::new(),
        };
        let reconciled = reconcile(&input, &mut allocator);
        let t_reconcile = started.elapsed();
        let converted = convert_objects(&source_objects(reconciled, input.nodes), &origins);
        let changes = differ.diff(converted.services, converted.slices, converted.nodes);
        ensure!(changes.len() == 1, "expected one change, got {}", changes.len());
        for change in changes {
            state.apply(change);
        }
        let t_diff = started.elapsed();
        let changes = state.take_changes();
        let changed = plan.update(&state, &changes);
        let sync = backend.sync(&plan, &changed)?;
        let total = started.elapsed();
        ensure!(!sync.full && sync.service_ports == 1, "expected a partial sync of one service port: {sync:?}");
        samples.push(total);
        for (slot, d) in parts.iter_mut().zip([t_poll, t_reconcile - t_poll, t_diff - t_reconcile, total - t_diff]) {
            slot.push(d);
        }
    }
    let medians: Vec<String> = parts.into_iter().map(|p| ms(Stats::of(p).median)).collect();
    report.row(
        "one endpoint change via manifests",
        samples,
        format!(
            "poll {} + reconcile {} + convert/diff {} + plan/sync {}",
            medians[0], medians[1], medians[2], medians[3]
        ),
    );

    // i. the same through the proxy's incremental manifests feed (`ManifestsFeed::poll_changes`:
    // changed files read, changed documents parsed, only the touched Services allocated,
    // planned and converted), then plan.update and a partial sync. Its first look is the
    // cold read of the whole directory.
    let mut feed = ManifestsFeed::new(ManifestsSettings {
        dir: manifests.dir.clone(),
        allocator: allocator.config().clone(),
        allocations_file: None,
        saves_allocations: false,
    })?;
    let rss_before = status_mib("VmRSS:");
    let (took, first) = time(|| feed.poll_changes());
    let first = first.context("the feed's first look gave nothing")?;
    let rss_after = status_mib("VmRSS:");
    report.row(
        "cold read via the incremental feed (first poll_changes)",
        vec![took],
        format!(
            "{} changes, {} Services; RSS +{:.0} MiB for the feed's state",
            first.len(),
            feed.services_touched(),
            rss_after - rss_before
        ),
    );
    drop(first);
    let mut samples = Vec::new();
    let mut feed_samples = Vec::new();
    let mut sync_samples = Vec::new();
    let mut reads = (0, 0);
    for k in 0..repeat {
        let service = (((k * size / repeat + size / (2 * repeat)) | 1) + 2).min(size - 1);
        let address = Ipv4Addr::new(198, 18, 97, k as u8 + 1);
        file_moves.push((service, address));
        manifests.write_file(manifests.file_of(service), &file_moves)?;
        moved_to.push(address);
        let counters = feed.counters();
        let started = Instant::now();
        let changes = feed.poll_changes().context("the feed did not notice the rewrite")?;
        let t_feed = started.elapsed();
        ensure!(changes.len() == 1, "expected one change from the feed, got {}", changes.len());
        for change in changes {
            state.apply(change);
        }
        let changes = state.take_changes();
        let changed = plan.update(&state, &changes);
        let sync = backend.sync(&plan, &changed)?;
        let total = started.elapsed();
        ensure!(!sync.full && sync.service_ports == 1, "expected a partial sync of one service port: {sync:?}");
        let after = feed.counters();
        reads = (after.files_read - counters.files_read, after.documents_parsed - counters.documents_parsed);
        samples.push(total);
        feed_samples.push(t_feed);
        sync_samples.push(total - t_feed);
    }
    let feed_median = Stats::of(feed_samples.clone()).median;
    report.row(
        "**one endpoint change via manifests, incremental feed** (file written -> kernel)",
        samples,
        format!(
            "feed {} ({} file read, {} document parsed, {} Service planned) + plan/sync {}",
            ms(feed_median),
            reads.0,
            reads.1,
            feed.services_touched(),
            ms(Stats::of(sync_samples).median)
        ),
    );
    report.row(
        "of which our own work in the feed",
        feed_samples,
        "poll_changes alone: scan, read, parse, controller, convert, diff",
    );
    report.ratio(format!("one Pod edit, feed's own work / target 20 ms ({size})"), ratio(feed_median, TARGET_CHANGE));

    // The changes reached the kernel (outside every timing: listing is slow).
    let listed = nft_list(&netns, &["list", "ruleset"])?;
    for address in &moved_to {
        ensure!(listed.contains(&format!("{address}:8080")), "{address} is not in the kernel's table");
    }
    drop(netns);

    report.peak_rss_mib = peak_rss_mib();
    report.ratio(
        format!("cold program, nft CLI / raw `nft -f` of the research shape ({size})"),
        ratio(cold.median, baseline_cold.median),
    );
    report.ratio(
        format!("one endpoint change, nft CLI / one-chain `nft -f` ({size})"),
        ratio(change.median, baseline_change.median),
    );
    report.ratio(format!("cold program, nft CLI / target 1 s ({size})"), ratio(cold.median, TARGET_COLD));
    report.ratio(format!("cold program, netlink / target 1 s ({size})"), ratio(cold_netlink.median, TARGET_COLD));
    report.ratio(
        format!("cold program, netlink / raw `nft -f` of the research shape ({size})"),
        ratio(cold_netlink.median, baseline_cold.median),
    );
    report.ratio(format!("one endpoint change, nft CLI / target 20 ms ({size})"), ratio(change.median, TARGET_CHANGE));
    report.ratio(
        format!("one endpoint change, netlink / target 20 ms ({size})"),
        ratio(change_netlink.median, TARGET_CHANGE),
    );
    report.ratio(
        format!("one endpoint change p99, netlink / target 20 ms ({size})"),
        ratio(change_netlink.p99, TARGET_CHANGE),
    );
    report.ratio(
        format!("one endpoint change, netlink / the same into one table ({size})"),
        ratio(change_netlink.median, change_one_table.median),
    );
    report.ratio(
        format!("one endpoint change, netlink / one-chain `nft -f` ({size})"),
        ratio(change_netlink.median, baseline_change.median),
    );
    Ok(report)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    ensure!(
        cfg!(not(debug_assertions)) || std::env::var_os("SVCPLANE_BENCH_DEBUG").is_some(),
        "run in release mode (cargo bench)"
    );
    remove_stale_namespaces();
    let mut markdown = String::new();
    for &size in &args.sizes {
        let report = run_size(&args, size)?;
        println!("\n{}", report.markdown());
        markdown.push_str(&report.markdown());
        markdown.push('\n');
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, markdown).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// CPU time the calling thread has used, in user space and in the kernel.
struct ThreadCpu {
    user: Duration,
    system: Duration,
}

fn thread_cpu() -> ThreadCpu {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage of the calling thread");
    let duration = |time: nix::sys::time::TimeVal| {
        Duration::from_secs(time.tv_sec().max(0) as u64) + Duration::from_micros(time.tv_usec().max(0) as u64)
    };
    ThreadCpu { user: duration(usage.user_time()), system: duration(usage.system_time()) }
}
