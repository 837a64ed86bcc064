//! Black-box manifests-mode benchmark: this build's `svcplane proxy --manifests DIR`
//! (nftables mode) in a one-node lab, S Services x E endpoints, real TCP connects from the
//! node as the only signal.
//!
//! ```text
//! cargo bench -p svcplane --bench manifests_blackbox -- --services 10000 --endpoints 10 --repeat 3
//! ```
//!
//! Needs root (a lab: network namespaces it creates and deletes). The same-run baseline is
//! the same harness with a small directory (`--baseline-services`, 100 by default, same
//! endpoints per Service): a feed whose cost follows the change, not the directory, shows
//! add and remove ratios near 1. Cold also gets its kernel floor: the ruleset the proxy
//! programmed, dumped and loaded again by `nft -f` into an empty ruleset.
//!
//! `--program NAME=PATH` (repeatable) measures other builds of `svcplane` in turn, in the
//! same lab and run (the echo servers stay this build's).
//!
//! Measures, each `--repeat`
//! times: **cold** (process start to the last Service answering, from an empty ruleset),
//! **add** (a new file with a Service and its Pod written, to that Service answering),
//! **remove** (a file rewritten without one of the probe Service's two Pods, to that Pod no
//! longer chosen: the start of a run of 30 connects that all reach the other one), and the
//! proxy's VmRSS / VmHWM at the end. Each add and remove waits 1.2 s first (the default
//! minimum time between syncs is 1 s), so it measures an isolated change. Probes are bounded (20 ms connect timeout, 30 s per
//! measure); all addresses are the lab's (198.18.0.0/15).
//!
//! Inputs, deterministic: 100 part files plus `nodes.yaml`; Service `svc-i` has clusterIP
//! `198.19.0.16 + i` and selects its E Pods on nodes 2..10 at addresses in 198.18.160.0/19
//! (repeating above 8000, as the scale benchmark's do); the last Service's Pods are the
//! lab's real pods `node1-pod1` and `node1-pod2`, which run echo servers.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use svcplane_testbed::Lab;
use svcplane_testbed::probe::tcp_request;

const FILES: usize = 100;
const NODES: usize = 10;
const ECHO_PORT: u16 = 8080;
const CONNECT_TIMEOUT: Duration = Duration::from_millis(20);
const MEASURE_LIMIT: Duration = Duration::from_secs(30);
const STREAK: usize = 30;
/// The pause before each add and remove: longer than the proxy's default minimum time
/// between two syncs (1 s, kube-proxy's `minSyncPeriod`), so that each measures an isolated
/// change, not the wait for the rate limit after the previous one.
const SETTLE: Duration = Duration::from_millis(1200);

#[derive(Debug)]
struct Args {
    services: usize,
    baseline_services: usize,
    endpoints: usize,
    repeat: usize,
    /// `--program NAME=PATH`, repeatable: the `svcplane` binaries to measure in turn (to
    /// compare builds in one run); this build's alone when none is given.
    programs: Vec<(String, PathBuf)>,
}

fn args() -> anyhow::Result<Args> {
    let mut args = Args { services: 10_000, baseline_services: 100, endpoints: 10, repeat: 3, programs: Vec::new() };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--services" => args.services = value()?.parse()?,
            "--baseline-services" => args.baseline_services = value()?.parse()?,
            "--endpoints" => args.endpoints = value()?.parse()?,
            "--repeat" => args.repeat = value()?.parse()?,
            "--program" => {
                let value = value()?;
                let (name, path) = value.split_once('=').context("--program NAME=PATH")?;
                ensure!(Path::new(path).is_file(), "--program {name}: {path} is not a file");
                args.programs.push((name.to_owned(), PathBuf::from(path)));
            }
            "--bench" => {}
            other => bail!("unknown argument {other}"),
        }
    }
    ensure!((2..=60_000).contains(&args.services) && (2..=50).contains(&args.endpoints), "out of range");
    ensure!((FILES..=args.services).contains(&args.baseline_services), "--baseline-services in {FILES}..=--services");
    ensure!((1..=20).contains(&args.repeat), "--repeat in 1..=20");
    Ok(args)
}

fn service_ip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 16)) + s as u32)
}

fn pod_ip(s: usize, e: usize, endpoints: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 160, 0)) + ((s * endpoints + e) % 8000) as u32 + 1)
}

fn service_yaml(text: &mut String, name: &str, ip: Ipv4Addr) {
    writeln!(
        text,
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: bench\nspec:\n  clusterIP: {ip}\n  selector:\n    app: {name}\n  ports:\n    - name: http\n      port: 80\n      targetPort: {ECHO_PORT}\n---"
    )
    .unwrap();
}

fn pod_yaml(text: &mut String, name: &str, app: &str, node: usize, ip: Ipv4Addr) {
    writeln!(
        text,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: bench\n  labels:\n    app: {app}\nspec:\n  nodeName: node{node}\n  containers:\n    - name: app\n      image: bench\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs:\n    - ip: {ip}\n  conditions:\n    - type: Ready\n      status: \"True\"\n---"
    )
    .unwrap();
}

struct Manifests {
    dir: PathBuf,
    services: usize,
    endpoints: usize,
    real_pods: [Ipv4Addr; 2],
}

impl Manifests {
    fn range(&self, file: usize) -> std::ops::Range<usize> {
        file * self.services / FILES..(file + 1) * self.services / FILES
    }

    /// Writes part file `file`; the probe Service (the last) has its real Pods, the first
    /// one left out when `without_first_real_pod`.
    fn write_part(&self, file: usize, without_first_real_pod: bool) -> anyhow::Result<()> {
        let mut text = String::new();
        let probe = self.services - 1;
        for s in self.range(file) {
            let name = format!("svc-{s}");
            service_yaml(&mut text, &name, service_ip(s));
            if s == probe {
                for (k, ip) in self.real_pods.iter().enumerate() {
                    if k == 0 && without_first_real_pod {
                        continue;
                    }
                    pod_yaml(&mut text, &format!("{name}-real-{k}"), &name, 1, *ip);
                }
                continue;
            }
            for e in 0..self.endpoints {
                let node = (s * self.endpoints + e) % (NODES - 1) + 2;
                pod_yaml(&mut text, &format!("{name}-{e}"), &name, node, pod_ip(s, e, self.endpoints));
            }
        }
        write_atomically(&self.dir.join(format!("part-{file:03}.yaml")), &text)
    }
}

/// Write, then rename: the watcher never sees half a file.
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)?;
    Ok(())
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

/// Probes `addr` from inside `namespace` until `done` says so, at most [`MEASURE_LIMIT`];
/// returns the time from `since` that `done` reports.
fn probe_until(
    namespace: &str,
    addr: SocketAddr,
    since: Instant,
    mut done: impl FnMut(Option<&str>, Duration) -> Option<Duration> + Send,
) -> anyhow::Result<Duration> {
    svcplane_testbed::run_in_namespace(namespace, move || {
        loop {
            let reply = tcp_request(addr, CONNECT_TIMEOUT).ok();
            let now = since.elapsed();
            if let Some(at) = done(reply.as_ref().map(|r| r.server_name.as_str()), now) {
                return Ok(at);
            }
            if now > MEASURE_LIMIT {
                bail!("{addr} did not reach the expected state within {MEASURE_LIMIT:?}");
            }
            if reply.is_some() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    })?
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// What one size measured.
struct Measured {
    services: usize,
    cold: Vec<Duration>,
    add: Vec<Duration>,
    remove: Vec<Duration>,
    /// `nft -f` of the ruleset the proxy had programmed, into an empty ruleset: the kernel's
    /// share of a cold start.
    raw_load: Vec<Duration>,
    rss_kib: u64,
    hwm_kib: u64,
    warnings: Vec<String>,
}

/// The lab, the program and the pods every size shares.
struct Bench<'a> {
    lab: &'a Lab,
    program: PathBuf,
    node: String,
    real_pods: [Ipv4Addr; 2],
    added_pod: Ipv4Addr,
}

impl Bench<'_> {
    fn flush(&self) -> anyhow::Result<()> {
        self.lab.exec_ok(&self.node, &["nft", "flush", "ruleset"])?;
        Ok(())
    }

    fn start_proxy(&self, dir: &Path) -> anyhow::Result<std::process::Child> {
        let log = std::fs::File::create(dir.join("proxy.log.txt"))?;
        let program = self.program.to_str().context("program path")?;
        let child = self
            .lab
            .command(
                &self.node,
                &[
                    program,
                    "proxy",
                    "--manifests",
                    dir.to_str().context("dir")?,
                    "--service-cidr",
                    "198.19.0.0/16",
                    "--cluster-cidr",
                    "198.18.128.0/17",
                    "--proxy-mode=nftables",
                    "--hostname-override=node1",
                    "--metrics-bind-address=",
                    "--healthz-bind-address=",
                ],
            )?
            .stderr(log.try_clone()?)
            .stdout(log)
            .spawn()?;
        Ok(child)
    }

    fn stop_proxy(&self, mut child: std::process::Child) {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).ok();
        let _ = child.wait();
    }

    /// Cold, add and remove for `services` x `endpoints`, `repeat` times each; added
    /// Services get ClusterIPs `198.19.{added_octet}.k`.
    fn measure(&self, services: usize, endpoints: usize, repeat: usize, added_octet: u8) -> anyhow::Result<Measured> {
        let dir = tempfile::tempdir()?;
        let manifests = Manifests { dir: dir.path().to_path_buf(), services, endpoints, real_pods: self.real_pods };
        let mut nodes = String::new();
        for n in 1..=NODES {
            writeln!(
                nodes,
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: node{n}\nstatus:\n  addresses:\n    - type: InternalIP\n      address: 198.18.0.{}\n---",
                10 + n
            )?;
        }
        std::fs::write(dir.path().join("nodes.yaml"), nodes)?;
        for file in 0..FILES {
            manifests.write_part(file, false)?;
        }
        let probe = SocketAddr::new(service_ip(services - 1).into(), 80);
        eprintln!("== {services} services x {endpoints} endpoints, {}", dir.path().display());
        let node = self.node.as_str();

        // Cold: from an empty ruleset (the proxy leaves its rules when it stops), process
        // start to the probe Service answering.
        let mut cold = Vec::new();
        let mut proxy = None;
        for k in 0..repeat {
            if let Some(child) = proxy.take() {
                self.stop_proxy(child);
            }
            self.flush()?;
            ensure!(
                svcplane_testbed::run_in_namespace(node, || tcp_request(probe, CONNECT_TIMEOUT).is_err())?,
                "the probe Service answers before the proxy runs"
            );
            let started = Instant::now();
            let child = self.start_proxy(dir.path())?;
            let pid = child.id();
            proxy = Some(child);
            let took = probe_until(node, probe, started, |reply, now| reply.map(|_| now))?;
            eprintln!("  cold {k}: {} (VmRSS {} MiB)", ms(took), status_kib(pid, "VmRSS:") / 1024);
            cold.push(took);
        }
        let proxy = proxy.context("repeat > 0")?;
        let pid = proxy.id();

        // Add: a new file with a Service and its Pod (the third real pod).
        let mut add = Vec::new();
        for k in 0..repeat {
            let name = format!("added-{k}");
            let ip = Ipv4Addr::new(198, 19, added_octet, k as u8 + 1);
            let mut text = String::new();
            service_yaml(&mut text, &name, ip);
            pod_yaml(&mut text, &format!("{name}-0"), &name, 1, self.added_pod);
            let addr = SocketAddr::new(ip.into(), 80);
            std::thread::sleep(SETTLE);
            let started = Instant::now();
            write_atomically(&dir.path().join(format!("{name}.yaml")), &text)?;
            let took = probe_until(node, addr, started, |reply, now| reply.map(|_| now))?;
            eprintln!("  add {k}: {}", ms(took));
            add.push(took);
        }

        // Remove: the probe Service's first real Pod leaves its file; then it comes back.
        let probe_file = FILES - 1;
        let mut remove = Vec::new();
        for k in 0..repeat {
            std::thread::sleep(SETTLE);
            let started = Instant::now();
            manifests.write_part(probe_file, true)?;
            let mut streak_start: Option<Duration> = None;
            let mut streak = 0;
            let took = probe_until(node, probe, started, |reply, now| {
                match reply {
                    Some("node1-pod2") => {
                        streak += 1;
                        let begun = *streak_start.get_or_insert(now);
                        if streak >= STREAK {
                            return Some(begun);
                        }
                    }
                    _ => (streak, streak_start) = (0, None),
                }
                None
            })?;
            eprintln!("  remove {k}: {}", ms(took));
            remove.push(took);
            std::thread::sleep(Duration::from_millis(20));
            manifests.write_part(probe_file, false)?;
            probe_until(node, probe, Instant::now(), |reply, now| (reply == Some("node1-pod1")).then_some(now))
                .context("the Pod put back is chosen again")?;
        }

        let (rss_kib, hwm_kib) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));
        // Listing a 10k ruleset through the nft CLI can outlast the lab's 30 s command limit
        // on a loaded machine: then the floor is left out, the rest still counts.
        let ruleset = self.lab.exec_ok(node, &["nft", "list", "ruleset"]);
        self.stop_proxy(proxy);

        // The kernel's share: the same ruleset loaded by `nft -f` into an empty ruleset.
        let mut raw_load = Vec::new();
        match ruleset {
            Ok(ruleset) => {
                let ruleset_file = dir.path().join("ruleset.nft");
                std::fs::write(&ruleset_file, &ruleset)?;
                for _ in 0..repeat {
                    self.flush()?;
                    let started = Instant::now();
                    self.lab.exec_ok(node, &["nft", "-f", ruleset_file.to_str().context("ruleset path")?])?;
                    raw_load.push(started.elapsed());
                }
            }
            Err(error) => eprintln!("  the kernel's floor is left out: {error}"),
        }
        self.flush()?;

        let log = std::fs::read_to_string(dir.path().join("proxy.log.txt")).unwrap_or_default();
        let warnings = log.lines().filter(|line| line.contains(" WARN ")).map(str::to_owned).collect();
        Ok(Measured { services, cold, add, remove, raw_load, rss_kib, hwm_kib, warnings })
    }
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    if !svcplane_testbed::can_run_real_kernel_tests("manifests_blackbox") {
        eprintln!("skipped: needs root");
        return Ok(());
    }
    let program = PathBuf::from(env!("CARGO_BIN_EXE_svcplane"));
    let lab = Lab::builder().nodes(1).pods_per_node(3).build().context("a one-node lab")?;
    lab.start_echo_in_all_pods(ECHO_PORT, &program)?;
    let bench = Bench {
        lab: &lab,
        program,
        node: lab.node(1).namespace_name().to_owned(),
        real_pods: [lab.pod("node1-pod1").ip_v4(), lab.pod("node1-pod2").ip_v4()],
        added_pod: lab.pod("node1-pod3").ip_v4(),
    };
    let programs = if args.programs.is_empty() {
        vec![("this build".to_owned(), bench.program.clone())]
    } else {
        args.programs.clone()
    };
    let mut bench = bench;
    for (name, program) in programs {
        bench.program = program;
        println!("\n{name}: {}\n", bench.program.display());
        report(&bench, &args)?;
    }
    Ok(())
}

/// Measures `bench.program` at the baseline size and the measured size and prints the table.
fn report(bench: &Bench<'_>, args: &Args) -> anyhow::Result<()> {
    // The same-run baseline: the same measures with a directory of `--baseline-services`.
    let baseline = bench.measure(args.baseline_services, args.endpoints, args.repeat, 251)?;
    let measured = bench.measure(args.services, args.endpoints, args.repeat, 250)?;

    println!(
        "| measure (x {} endpoints) | {} Services: median | min | {} Services (baseline): median | ratio of medians | runs |",
        args.endpoints, measured.services, baseline.services
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (what, samples, base) in [
        ("cold: process start -> a Service answering", &measured.cold, &baseline.cold),
        ("of which the kernel: `nft -f` of the same ruleset", &measured.raw_load, &baseline.raw_load),
        ("add: new Service+Pod file written -> answering", &measured.add, &baseline.add),
        ("remove: Pod gone from its file -> no longer chosen", &measured.remove, &baseline.remove),
    ] {
        if samples.is_empty() || base.is_empty() {
            println!("| {what} | n/a | | | | 0 |");
            continue;
        }
        let min = *samples.iter().min().context("samples")?;
        let (m, b) = (median(samples.clone()), median(base.clone()));
        println!(
            "| {what} | {} | {} | {} | {:.2} | {} |",
            ms(m),
            ms(min),
            ms(b),
            m.as_secs_f64() / b.as_secs_f64().max(1e-6),
            samples.len()
        );
    }
    println!(
        "| proxy VmRSS at the end / VmHWM | {} MiB / {} MiB | | {} MiB / {} MiB | | |",
        measured.rss_kib / 1024,
        measured.hwm_kib / 1024,
        baseline.rss_kib / 1024,
        baseline.hwm_kib / 1024
    );
    for run in [&baseline, &measured] {
        if !run.warnings.is_empty() {
            eprintln!(
                "the proxy at {} Services logged {} warnings:\n{}",
                run.services,
                run.warnings.len(),
                run.warnings.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
            );
        }
    }
    Ok(())
}
