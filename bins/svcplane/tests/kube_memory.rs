//! Benchmark: the memory and the cold start of `svcplane proxy` fed by a real API server.
//!
//! Input, per size S x E: S selector-less ClusterIP Services (TCP 80 -> 8080, IPv4) and one
//! IPv4 EndpointSlice of E endpoints each, written through the API before any proxy runs,
//! plus a marker Service created last whose one endpoint is a lab pod with an echo server.
//! Then each binary under test (`SVCPLANE_MEM_BINARIES`, `label=path,...`; by default the
//! one this test was built with) is started cold on node1 (rules removed first) as
//! `svcplane proxy --kubeconfig ... --node-name node1` in each mode of
//! `SVCPLANE_MEM_MODES` (`nftables`, the default, over netlink; `ebpf`, attached to node1's
//! cgroup with a bpf root of its own), `rounds` times in turn, and measured:
//!
//! - *cold start*: from the process's start until node1 itself reaches the marker's
//!   ClusterIP (list, conversion, plan, render and the kernel's transaction included; every
//!   sync programs everything known, so the marker working means all of it does);
//! - *RSS*: `VmRSS` a few seconds after that (what the proxy keeps), and *peak RSS*:
//!   `VmHWM` (the most it ever held, the cold sync included).
//!
//! Upstream kube-proxy (`--proxy-mode=nftables`, the cached v1.36 binary) is measured the
//! same way in every round, after the binaries under test: the baseline of the same run.
//!
//! Then, on the same API server, the first binary's `svcplane dns --kubeconfig` (cold start
//! until it answers the marker's name, RSS 3 s later) and `svcplane controller --kubeconfig`
//! (RSS after 20 s; the input has no selectors, so it only watches).
//!
//! `scripts/k8s/memory` runs the real sizes (release build); the plain test here runs the
//! same harness on a small cluster so the harness itself stays tested.
//! `SVCPLANE_MEM_HOLD_SECS=N` keeps the lab and its API server up N seconds after the
//! objects are written (the kubeconfig and node namespace printed), for profiling by hand;
//! removing the file `SVCPLANE_MEM_HOLD_FILE` names ends the wait early.

mod kube_support;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use kube_support::bench::upstream_kube_proxy_args;
use kube_support::{CLUSTER_CIDRS, KubeLab, cluster_ip_v4, echo_service, echo_slice};
use svcplane_control_plane::{UpstreamBinaries, binaries_for_test};
use svcplane_testbed::Lab;

const MARKER: &str = "marker";
const MARKER_POD: &str = "node1-pod1";
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
const PROBE_TIMEOUT: Duration = Duration::from_millis(50);
/// How long after the first working probe the kept RSS is read.
const SETTLE: Duration = Duration::from_secs(3);
/// How long a cleanup may take: removing a 10k-Service table (and looking for every other
/// mode's rules) on a loaded machine takes seconds, more than a probe's patience.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the controller runs before its RSS is read.
const CONTROLLER_SETTLE: Duration = Duration::from_secs(20);

/// One cluster size.
#[derive(Debug, Clone, Copy)]
struct Size {
    services: usize,
    endpoints: usize,
}

/// eBPF mode's map sizes for a cluster of `size`: its maps have fixed capacities (131,072
/// endpoint slots by default, fewer than 5k x 50 or 30k x 10 need), and a first sync that
/// does not fit is refused whole, as an operator running that many would size them too.
/// Room for every endpoint, the marker's and a quarter more, as a power of two.
fn ebpf_map_sizes(size: Size) -> Vec<String> {
    let default = svcplane_bpf::MapSizes::default().backends as usize;
    let backends = (size.services * size.endpoints * 5 / 4).next_power_of_two().max(default);
    vec!["--bpf-map-backends".to_owned(), backends.to_string()]
}

/// The proxy modes the harness can start: nftables (the reference) and eBPF, whose maps
/// are its rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProxyMode {
    Nftables,
    Ebpf,
}

impl ProxyMode {
    fn parse(name: &str) -> Self {
        match name.trim() {
            "nftables" => Self::Nftables,
            "ebpf" => Self::Ebpf,
            other => panic!("SVCPLANE_MEM_MODES: {other:?} is not a mode this harness starts (nftables, ebpf)"),
        }
    }
}

/// One binary's measurements in one round.
#[derive(Debug)]
struct Measured {
    label: String,
    cold_start: Option<Duration>,
    rss_kib: Option<u64>,
    peak_kib: Option<u64>,
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn bulk(index: usize, endpoints: usize) -> (Service, EndpointSlice) {
    let name = format!("svc-{index:05}");
    let mut service = echo_service(&name, false, &[]);
    if let Some(spec) = service.spec.as_mut() {
        spec.ip_family_policy = Some("SingleStack".into());
    }
    // Endpoint addresses from 198.18.140.0 up (pod space of the lab plan, no lab pod there).
    let addresses: Vec<(IpAddr, &str)> = (0..endpoints)
        .map(|e| {
            let k = (index * endpoints + e) % 25_000;
            let ip: IpAddr = format!("198.18.{}.{}", 140 + k / 250, k % 250 + 1).parse().unwrap();
            (ip, if e % 2 == 0 { "node1" } else { "node2" })
        })
        .collect();
    let slice = echo_slice(&format!("{name}-1"), &name, &addresses, &[]);
    (service, slice)
}

fn create_bulk(kube: &KubeLab, size: Size) -> Duration {
    let concurrency: usize =
        std::env::var("SVCPLANE_MEM_CONCURRENCY").ok().and_then(|text| text.parse().ok()).unwrap_or(64);
    let started = Instant::now();
    let client = kube.client.client();
    kube.client.run(async move {
        let services_api = Api::<Service>::namespaced(client.clone(), "default");
        let slices_api = Api::<EndpointSlice>::namespaced(client, "default");
        let results: Vec<Result<(), kube::Error>> = futures::stream::iter(0..size.services)
            .map(|index| {
                let (services_api, slices_api) = (services_api.clone(), slices_api.clone());
                async move {
                    let (service, slice) = bulk(index, size.endpoints);
                    services_api.create(&PostParams::default(), &service).await?;
                    slices_api.create(&PostParams::default(), &slice).await?;
                    Ok(())
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        for result in results {
            result.expect("creating a Service and its slice");
        }
    });
    started.elapsed()
}

fn proxy_args(kube: &KubeLab) -> Vec<String> {
    let mut args: Vec<String> = [
        "proxy",
        "--kubeconfig",
        &kube.plane.kubeconfig().display().to_string(),
        "--node-name",
        kube.lab.node(1).name(),
    ]
    .map(String::from)
    .to_vec();
    for cidr in CLUSTER_CIDRS {
        args.extend(["--cluster-cidr".to_owned(), cidr.to_owned()]);
    }
    args
}

/// A proxy under test: how it is started on node1 and how its rules are removed.
struct Proxy {
    label: String,
    binary: String,
    args: Vec<String>,
    cleanup: Vec<String>,
    /// Started, and cleaned up after, keeping this process's mounts: eBPF mode pins its
    /// objects in a bpffs it mounts and attaches to a cgroup under /sys.
    sharing_mounts: bool,
}

impl Proxy {
    /// `svcplane proxy` (nftables mode over netlink) from `binary`. Its rules are removed
    /// by this build's `svcplane cleanup` whatever build is measured: an older build's
    /// cleanup listed tables through the `nft` command, which at 10k Services outlasted
    /// the lab's command timeout and left the rules in place.
    fn svcplane(kube: &KubeLab, label: &str, binary: &str, mode: ProxyMode, bpf_root: &Path, size: Size) -> Self {
        let mut args = proxy_args(kube);
        let mut cleanup = vec![env!("CARGO_BIN_EXE_svcplane").to_owned(), "cleanup".to_owned()];
        match mode {
            ProxyMode::Nftables => {
                Self { label: label.to_owned(), binary: binary.to_owned(), args, cleanup, sharing_mounts: false }
            }
            ProxyMode::Ebpf => {
                let cgroup = kube.lab.node_cgroup(1).expect("a lab with node cgroups").display().to_string();
                let attachment =
                    ["--cgroup-path".to_owned(), cgroup, "--bpf-root".to_owned(), bpf_root.display().to_string()];
                args.extend(["--mode".to_owned(), "ebpf".to_owned()]);
                args.extend(attachment.iter().cloned());
                args.extend(ebpf_map_sizes(size));
                cleanup.extend(attachment);
                Self {
                    label: format!("{label} (ebpf)"),
                    binary: binary.to_owned(),
                    args,
                    cleanup,
                    sharing_mounts: true,
                }
            }
        }
    }

    /// Upstream kube-proxy in nftables mode, the baseline of the same run.
    fn upstream(kube: &KubeLab, upstream: &UpstreamBinaries) -> Option<Self> {
        let binary = upstream.require("kube-proxy").ok()?.display().to_string();
        Some(Self {
            label: "upstream kube-proxy (nftables)".to_owned(),
            args: upstream_kube_proxy_args(kube, kube.lab.node(1).name(), "nftables"),
            cleanup: vec![binary.clone(), "--cleanup".to_owned()],
            binary,
            sharing_mounts: false,
        })
    }
}

/// Starts `proxy` cold on node1 and measures it; stops it and removes its rules after.
fn measure(kube: &KubeLab, proxy: &Proxy, target: SocketAddr, limit: Duration) -> Measured {
    let Proxy { label, binary, args, cleanup, sharing_mounts } = proxy;
    let namespace = kube.lab.node(1).namespace_name().to_owned();
    let cleanup: Vec<&str> = cleanup.iter().map(String::as_str).collect();
    remove_rules(kube, &namespace, &cleanup, *sharing_mounts, target, &format!("before starting {label}"));
    let what = format!("proxy-{}", label.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
    let started = Instant::now();
    let spawned = if *sharing_mounts {
        kube.plane.spawn_sharing_mounts(&what, &namespace, binary, args)
    } else {
        kube.plane.spawn(&what, &namespace, binary, args)
    };
    let (pid, log) = spawned.expect("a proxy");
    let mut cold_start = None;
    while started.elapsed() < limit {
        if let Ok(reply) = kube.lab.tcp_request(&namespace, target, PROBE_TIMEOUT)
            && reply.server_name == MARKER_POD
        {
            cold_start = Some(started.elapsed());
            break;
        }
        std::thread::sleep(PROBE_INTERVAL);
    }
    std::thread::sleep(SETTLE);
    let measured = Measured {
        label: label.clone(),
        cold_start,
        rss_kib: status_kib(pid, "VmRSS:"),
        peak_kib: status_kib(pid, "VmHWM:"),
    };
    if let Err(error) = kube.plane.check_running(&what) {
        panic!("{label} stopped: {error}\n{}", kube_support::log_tail(&log));
    }
    kube.plane.stop(&what);
    remove_rules(kube, &namespace, &cleanup, *sharing_mounts, target, &format!("after {label}"));
    measured
}

/// Runs `cleanup` on node1 and checks that the marker no longer answers; fails with what
/// the cleanup said when it does. The exit status alone is not the test: kube-proxy's
/// cleanup also looks for iptables and IPVS rules and may complain about those.
fn remove_rules(
    kube: &KubeLab,
    namespace: &str,
    cleanup: &[&str],
    sharing_mounts: bool,
    target: SocketAddr,
    when: &str,
) {
    let ran = if sharing_mounts {
        kube.lab.exec_sharing_mounts_with_timeout(namespace, cleanup, CLEANUP_TIMEOUT)
    } else {
        kube.lab.exec_with_timeout(namespace, cleanup, CLEANUP_TIMEOUT)
    };
    let outcome = match ran {
        Ok(output) => format!(
            "{}; stderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        ),
        Err(error) => error.to_string(),
    };
    let answered = kube.lab.tcp_request(namespace, target, Duration::from_millis(300));
    assert!(answered.is_err(), "rules left {when}: the marker still answers after `{}` ({outcome})", cleanup.join(" "));
}

/// Starts `svcplane dns` (the first binary under test) on node1 against the loaded API
/// server and measures it: *cold start* = until it answers the marker's name, RSS and peak
/// 3 s after that.
fn measure_dns(kube: &KubeLab, label: &str, binary: &str, limit: Duration) -> Measured {
    let namespace = kube.lab.node(1).namespace_name().to_owned();
    let what = format!("dns-{label}");
    let kubeconfig = kube.plane.kubeconfig().display().to_string();
    let args = ["dns", "--kubeconfig", &kubeconfig, "--listen", "127.0.0.1:10053", "--metrics-bind-address", ""]
        .map(String::from);
    let started = Instant::now();
    let (pid, log) = kube.plane.spawn(&what, &namespace, binary, &args).expect("svcplane dns");
    let name = format!("{MARKER}.default.svc.cluster.local");
    let dig = ["dig", "+short", "+time=1", "+tries=1", "@127.0.0.1", "-p", "10053", &name, "A"];
    let mut cold_start = None;
    while started.elapsed() < limit {
        if kube.lab.exec_ok(&namespace, &dig).is_ok_and(|output| !output.trim().is_empty()) {
            cold_start = Some(started.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(SETTLE);
    let measured = Measured {
        label: format!("`svcplane dns` ({label})"),
        cold_start,
        rss_kib: status_kib(pid, "VmRSS:"),
        peak_kib: status_kib(pid, "VmHWM:"),
    };
    if let Err(error) = kube.plane.check_running(&what) {
        panic!("svcplane dns stopped: {error}\n{}", kube_support::log_tail(&log));
    }
    kube.plane.stop(&what);
    measured
}

/// Starts `svcplane controller` (the first binary under test, no leader election) on node1
/// against the loaded API server; RSS and peak after [`CONTROLLER_SETTLE`] (it lists every
/// Service, Pod and EndpointSlice first; with the selector-less input it writes nothing).
fn measure_controller(kube: &KubeLab, label: &str, binary: &str) -> Measured {
    let namespace = kube.lab.node(1).namespace_name().to_owned();
    let what = format!("controller-{label}");
    let kubeconfig = kube.plane.kubeconfig().display().to_string();
    let args = ["controller", "--kubeconfig", &kubeconfig, "--leader-elect=false", "--metrics-bind-address", ""]
        .map(String::from);
    let (pid, log) = kube.plane.spawn(&what, &namespace, binary, &args).expect("svcplane controller");
    std::thread::sleep(CONTROLLER_SETTLE);
    let measured = Measured {
        label: format!("`svcplane controller` ({label}, after {} s)", CONTROLLER_SETTLE.as_secs()),
        cold_start: None,
        rss_kib: status_kib(pid, "VmRSS:"),
        peak_kib: status_kib(pid, "VmHWM:"),
    };
    if let Err(error) = kube.plane.check_running(&what) {
        panic!("svcplane controller stopped: {error}\n{}", kube_support::log_tail(&log));
    }
    kube.plane.stop(&what);
    measured
}

fn binaries() -> Vec<(String, String)> {
    match std::env::var("SVCPLANE_MEM_BINARIES") {
        Ok(list) => list
            .split(',')
            .map(|entry| {
                let (label, path) = entry.split_once('=').expect("SVCPLANE_MEM_BINARIES: label=path,...");
                (label.trim().to_owned(), path.trim().to_owned())
            })
            .collect(),
        Err(_) => vec![("svcplane".to_owned(), env!("CARGO_BIN_EXE_svcplane").to_owned())],
    }
}

fn run_size(
    upstream: &UpstreamBinaries,
    size: Size,
    rounds: usize,
    limit: Duration,
    modes: &[ProxyMode],
) -> (Duration, Vec<Measured>) {
    let lab =
        Lab::builder().nodes(2).pods_per_node(1).node_cgroups(modes.contains(&ProxyMode::Ebpf)).build().expect("a lab");
    lab.start_echo_in_all_pods(kube_support::ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane"))).expect("echo");
    let kube = KubeLab::start(upstream, lab);
    let created = create_bulk(&kube, size);
    let marker: Service = kube.client.create(&echo_service(MARKER, false, &[])).expect("the marker");
    let pod_ip = IpAddr::V4(kube.lab.pod(MARKER_POD).ip_v4());
    kube.client.create(&echo_slice("marker-1", MARKER, &[(pod_ip, "node1")], &[])).expect("the marker's slice");
    let target = SocketAddr::new(cluster_ip_v4(&marker), 80);
    if let Some(hold) = std::env::var("SVCPLANE_MEM_HOLD_SECS").ok().and_then(|text| text.parse().ok()) {
        eprintln!(
            "holding {hold} s: kubeconfig {}, node1 namespace {}, marker {target}; args: {}",
            kube.plane.kubeconfig().display(),
            kube.lab.node(1).namespace_name(),
            proxy_args(&kube).join(" ")
        );
        // Ends early once the file `SVCPLANE_MEM_HOLD_FILE` names is gone.
        let file = std::env::var_os("SVCPLANE_MEM_HOLD_FILE");
        let until = Instant::now() + Duration::from_secs(hold);
        while Instant::now() < until && file.as_ref().is_none_or(|file| Path::new(file).exists()) {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let mut all = Vec::new();
    // Where eBPF mode pins its objects; `svcplane cleanup --bpf-root` unmounts it after each start.
    let bpf_root = tempfile::Builder::new().prefix("svcplane-memory-bpf").tempdir().expect("a bpf root directory");
    let mut proxies: Vec<Proxy> = binaries()
        .iter()
        .flat_map(|(label, binary)| {
            modes.iter().map(|mode| Proxy::svcplane(&kube, label, binary, *mode, bpf_root.path(), size))
        })
        .collect();
    proxies.extend(Proxy::upstream(&kube, upstream));
    for _ in 0..rounds {
        for proxy in &proxies {
            let measured = measure(&kube, proxy, target, limit);
            eprintln!("{} x {}: {measured:?}", size.services, size.endpoints);
            all.push(measured);
        }
    }
    for (label, binary) in binaries() {
        for measured in [measure_dns(&kube, &label, &binary, limit), measure_controller(&kube, &label, &binary)] {
            eprintln!("{} x {}: {measured:?}", size.services, size.endpoints);
            all.push(measured);
        }
    }
    (created, all)
}

fn markdown(size: Size, created: Duration, all: &[Measured]) -> String {
    let mut text = String::new();
    let mib = |kib: Option<u64>| kib.map_or_else(|| "-".to_owned(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
    for measured in all {
        let cold = match measured.cold_start {
            Some(took) => format!("{:.0} ms", took.as_secs_f64() * 1e3),
            // The controller has no marker to serve.
            None if measured.label.contains("controller") => "-".to_owned(),
            None => "timed out".to_owned(),
        };
        let _ = writeln!(
            text,
            "| {} x {} | {} | {cold} | {} | {} |",
            size.services,
            size.endpoints,
            measured.label,
            mib(measured.rss_kib),
            mib(measured.peak_kib)
        );
    }
    let _ = writeln!(
        text,
        "| {} x {} | (writing every object) | {:.0} s | | |",
        size.services,
        size.endpoints,
        created.as_secs_f64()
    );
    text
}

#[test]
fn the_memory_harness_measures_a_cold_proxy_on_a_small_cluster() {
    let Some(upstream) = binaries_for_test("kube_memory") else { return };
    let size = Size { services: 30, endpoints: 10 };
    let (created, all) = run_size(&upstream, size, 1, Duration::from_secs(60), &[ProxyMode::Nftables, ProxyMode::Ebpf]);
    eprintln!("{}", markdown(size, created, &all));
    for measured in all.iter().filter(|measured| !measured.label.contains("controller")) {
        assert!(measured.cold_start.is_some(), "never served the marker: {measured:?}");
    }
    for measured in &all {
        let (rss, peak) = (measured.rss_kib.expect("an RSS"), measured.peak_kib.expect("a peak"));
        assert!(rss > 0 && peak >= rss, "{measured:?}");
    }
}

/// `scripts/k8s/memory`: 10k Services x 10 endpoints by default (`SVCPLANE_MEM_SIZES`, e.g.
/// `10000x10,5000x50`; `SVCPLANE_MEM_ROUNDS`), the Markdown rows on stderr and in
/// `SVCPLANE_MEM_MARKDOWN` when set.
#[test]
#[ignore = "a benchmark: run with scripts/k8s/memory (release build, a few minutes)"]
fn svcplane_proxy_memory_and_cold_start_at_10k_services() {
    let Some(upstream) = binaries_for_test("kube_memory") else { return };
    let sizes: Vec<Size> = std::env::var("SVCPLANE_MEM_SIZES")
        .unwrap_or_else(|_| "10000x10".into())
        .split(',')
        .map(|size| {
            let (services, endpoints) = size.trim().split_once('x').expect("SVCPLANE_MEM_SIZES: SxE,...");
            Size { services: services.parse().expect("a number"), endpoints: endpoints.parse().expect("a number") }
        })
        .collect();
    let rounds = std::env::var("SVCPLANE_MEM_ROUNDS").ok().and_then(|text| text.parse().ok()).unwrap_or(2);
    let modes: Vec<ProxyMode> = std::env::var("SVCPLANE_MEM_MODES")
        .unwrap_or_else(|_| "nftables".into())
        .split(',')
        .map(ProxyMode::parse)
        .collect();
    let mut table = String::from(
        "| services x endpoints | binary | cold start to rules in the kernel | RSS after | peak RSS |\n| --- | --- | ---: | ---: | ---: |\n",
    );
    for size in sizes {
        let (created, all) = run_size(&upstream, size, rounds, Duration::from_secs(300), &modes);
        table.push_str(&markdown(size, created, &all));
    }
    eprintln!("{table}");
    if let Ok(path) = std::env::var("SVCPLANE_MEM_MARKDOWN") {
        std::fs::write(&path, &table).expect("writing the Markdown table");
    }
}
