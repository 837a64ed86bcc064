//! Benchmark: svcplane against upstream kube-proxy (nftables mode) on the same real API
//! server, node1 running kube-proxy and node2 running `svcplane proxy --kubeconfig`.
//!
//! Input, per size S: S selector-less ClusterIP Services (TCP 80 -> 8080) and one IPv4
//! EndpointSlice of 10 endpoints each, written through the API, plus a marker Service
//! created last whose single endpoint is a lab pod with an echo server. A proxy has the
//! rules "in the kernel" when the node itself reaches the marker's ClusterIP: both proxies
//! program everything they know each time, so the last object working means all do.
//!
//! Measured per proxy: the time from the first object's creation (proxies already running)
//! until the marker answers through that node; one endpoint change (the marker's slice
//! moves to another pod) until the new pod answers; the time from a cold start (rules
//! removed, process started with every object in the API) until the marker answers; and
//! the peak RSS (`VmHWM`) of the proxy process.
//!
//! `scripts/k8s/bench` runs the real sizes (1k and 10k, release build); the plain test here
//! runs the same harness on a small cluster so the harness itself stays tested.

mod kube_support;

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use kube_support::bench::{ENDPOINTS_PER_SERVICE, create_bulk, peak_rss_kib, until_answered, upstream_kube_proxy_args};
use kube_support::{CLUSTER_CIDRS, KubeLab, cluster_ip_v4, echo_service, echo_slice};
use svcplane_control_plane::{UpstreamBinaries, binaries_for_test};
use svcplane_testbed::Lab;

const MARKER: &str = "marker";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    KubeProxy,
    Svcplane,
}

impl Proxy {
    const BOTH: [Proxy; 2] = [Proxy::KubeProxy, Proxy::Svcplane];

    fn node(self) -> u16 {
        match self {
            Proxy::KubeProxy => 1,
            Proxy::Svcplane => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Proxy::KubeProxy => "kube-proxy",
            Proxy::Svcplane => "svcplane",
        }
    }

    fn process(self) -> String {
        format!("{}-node{}", self.name(), self.node())
    }
}

/// The measurements of one size.
#[derive(Debug, Default)]
struct Results {
    services: usize,
    create_all: Duration,
    /// Per proxy (kube-proxy, svcplane).
    created_to_kernel: [Option<Duration>; 2],
    endpoint_change: [Option<Duration>; 2],
    cold_start: [Option<Duration>; 2],
    peak_rss_kib: [Option<u64>; 2],
}

fn start_proxy(kube: &KubeLab, proxy: Proxy) -> u32 {
    let node = kube.lab.node(proxy.node());
    let kubeconfig = kube.plane.kubeconfig().display().to_string();
    let (program, args): (&str, Vec<String>) = match proxy {
        Proxy::KubeProxy => ("kube-proxy", upstream_kube_proxy_args(kube, node.name(), "nftables")),
        Proxy::Svcplane => {
            let mut args: Vec<String> =
                ["proxy", "--kubeconfig", &kubeconfig, "--node-name", node.name()].map(String::from).to_vec();
            for cidr in CLUSTER_CIDRS {
                args.extend(["--cluster-cidr".to_owned(), cidr.to_owned()]);
            }
            (env!("CARGO_BIN_EXE_svcplane"), args)
        }
    };
    let (pid, _) = kube.plane.spawn(&proxy.process(), node.namespace_name(), program, &args).expect("a proxy");
    pid
}

/// Stops a proxy and removes what it programmed, so the next start is cold.
fn stop_and_clean(kube: &KubeLab, proxy: Proxy) {
    kube.plane.stop(&proxy.process());
    let namespace = kube.lab.node(proxy.node()).namespace_name().to_owned();
    let binaries = kube.plane.binaries();
    let cleanup: Vec<String> = match proxy {
        Proxy::KubeProxy => vec![binaries.require("kube-proxy").unwrap().display().to_string(), "--cleanup".into()],
        Proxy::Svcplane => vec![env!("CARGO_BIN_EXE_svcplane").into(), "cleanup".into()],
    };
    // kube-proxy's cleanup also looks for iptables and IPVS rules and may complain.
    let _ = kube.lab.exec(&namespace, &cleanup);
}

/// Waits until `pod` answers on `target` from each proxy's node; the time each took. Each
/// node is probed from a thread of its own, so a slow node never delays the other's probes.
fn until_answered_by(
    kube: &KubeLab,
    target: SocketAddr,
    pod: &str,
    limit: Duration,
    from: Instant,
) -> [Option<Duration>; 2] {
    std::thread::scope(|scope| {
        let waiting = Proxy::BOTH.map(|proxy| {
            scope.spawn(move || {
                let namespace = kube.lab.node(proxy.node()).namespace_name();
                until_answered(kube, namespace, target, pod, limit, from)
            })
        });
        waiting.map(|handle| handle.join().expect("a probing thread"))
    })
}

fn run_size(binaries: &UpstreamBinaries, services: usize, limit: Duration) -> Results {
    let lab = Lab::builder().nodes(2).pods_per_node(2).build().expect("a lab");
    lab.start_echo_in_all_pods(kube_support::ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane"))).expect("echo");
    let kube = KubeLab::start(binaries, lab);
    let pod_ip = |name: &str| IpAddr::V4(kube.lab.pod(name).ip_v4());
    let mut results = Results { services, ..Results::default() };
    let mut pids = Proxy::BOTH.map(|proxy| start_proxy(&kube, proxy));

    // 1. Bulk creation with both proxies running, the marker last.
    let started = Instant::now();
    create_bulk(&kube, services);
    let marker: Service = kube.client.create(&echo_service(MARKER, false, &[])).expect("the marker");
    kube.client
        .create(&echo_slice("marker-1", MARKER, &[(pod_ip("node1-pod1"), "node1")], &[]))
        .expect("the marker's slice");
    results.create_all = started.elapsed();
    let target = SocketAddr::new(cluster_ip_v4(&marker), 80);
    results.created_to_kernel = until_answered_by(&kube, target, "node1-pod1", limit, started);

    // 2. One endpoint change.
    let client = kube.client.client();
    let moved = pod_ip("node1-pod2").to_string();
    let changed = Instant::now();
    kube.client
        .run(async move {
            let patch = serde_json::json!({ "endpoints": [{ "addresses": [moved], "conditions": { "ready": true }, "nodeName": "node1" }] });
            Api::<EndpointSlice>::namespaced(client, "default")
                .patch("marker-1", &PatchParams::default(), &Patch::Merge(&patch))
                .await
        })
        .expect("moving the marker's endpoint");
    results.endpoint_change = until_answered_by(&kube, target, "node1-pod2", limit, changed);
    results.peak_rss_kib = pids.map(peak_rss_kib);

    // 3. Cold start with everything in the API.
    for proxy in Proxy::BOTH {
        stop_and_clean(&kube, proxy);
    }
    for proxy in Proxy::BOTH {
        let namespace = kube.lab.node(proxy.node()).namespace_name();
        assert!(
            kube.lab.tcp_request(namespace, target, Duration::from_millis(300)).is_err(),
            "{} rules left after cleanup",
            proxy.name()
        );
    }
    let restarted = Instant::now();
    pids = Proxy::BOTH.map(|proxy| start_proxy(&kube, proxy));
    results.cold_start = until_answered_by(&kube, target, "node1-pod2", limit, restarted);
    for (slot, pid) in pids.iter().enumerate() {
        let peak = peak_rss_kib(*pid);
        results.peak_rss_kib[slot] = results.peak_rss_kib[slot].max(peak);
    }
    for proxy in Proxy::BOTH {
        kube.plane.check_running(&proxy.process()).expect("the proxy still runs");
    }
    results
}

fn millis(value: Option<Duration>) -> String {
    value.map_or_else(|| "timed out".to_owned(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
}

fn ratio(upstream: Option<f64>, ours: Option<f64>) -> String {
    match (upstream, ours) {
        (Some(upstream), Some(ours)) if ours > 0.0 => format!("{:.2}x", upstream / ours),
        _ => "-".to_owned(),
    }
}

fn markdown(all: &[Results]) -> String {
    let mut text = String::from(
        "| services x endpoints | measure | kube-proxy (nftables) | svcplane | kube-proxy / svcplane |\n| --- | --- | ---: | ---: | ---: |\n",
    );
    for results in all {
        let size = format!("{} x {ENDPOINTS_PER_SERVICE}", results.services);
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        let lag = results.created_to_kernel.map(|d| d.map(|d| d.saturating_sub(results.create_all)));
        let rows: [(&str, [Option<Duration>; 2]); 4] = [
            ("creation to rules in the kernel", results.created_to_kernel),
            ("last object created to rules in the kernel", lag),
            ("one endpoint change to the kernel", results.endpoint_change),
            ("cold start to rules in the kernel", results.cold_start),
        ];
        for (what, [upstream, ours]) in rows {
            let _ = writeln!(
                text,
                "| {size} | {what} | {} | {} | {} |",
                millis(upstream),
                millis(ours),
                ratio(secs(upstream), secs(ours))
            );
        }
        let [upstream, ours] = results.peak_rss_kib;
        let mib = |kib: Option<u64>| kib.map_or_else(|| "-".to_owned(), |k| format!("{:.0} MiB", k as f64 / 1024.0));
        let _ = writeln!(
            text,
            "| {size} | peak RSS | {} | {} | {} |",
            mib(upstream),
            mib(ours),
            ratio(upstream.map(|k| k as f64), ours.map(|k| k as f64))
        );
        let _ = writeln!(
            text,
            "| {size} | (creating every object through the API) | {} | | |",
            millis(Some(results.create_all))
        );
    }
    text
}

#[test]
fn the_benchmark_harness_measures_both_proxies_on_a_small_cluster() {
    let Some(binaries) = binaries_for_test("kube_benchmark") else { return };
    let results = run_size(&binaries, 50, Duration::from_secs(60));
    eprintln!("{}", markdown(std::slice::from_ref(&results)));
    for (what, values) in [
        ("creation", results.created_to_kernel),
        ("change", results.endpoint_change),
        ("cold start", results.cold_start),
    ] {
        assert!(values.iter().all(Option::is_some), "{what}: a proxy never programmed the marker: {results:?}");
    }
    assert!(results.peak_rss_kib.iter().all(Option::is_some), "{results:?}");
}

/// `scripts/k8s/bench`: 1k and 10k Services (`SVCPLANE_KUBE_BENCH_SIZES` to change),
/// the Markdown table on stderr and in `SVCPLANE_KUBE_BENCH_MARKDOWN` when set.
#[test]
#[ignore = "a benchmark: run with scripts/k8s/bench (release build, a few minutes)"]
fn svcplane_against_upstream_kube_proxy_at_1k_and_10k_services() {
    let Some(binaries) = binaries_for_test("kube_benchmark") else { return };
    let sizes: Vec<usize> = std::env::var("SVCPLANE_KUBE_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .map(|size| size.trim().parse().expect("SVCPLANE_KUBE_BENCH_SIZES: numbers separated by commas"))
        .collect();
    let all: Vec<Results> = sizes.iter().map(|&size| run_size(&binaries, size, Duration::from_secs(600))).collect();
    let table = markdown(&all);
    eprintln!("{table}");
    if let Ok(path) = std::env::var("SVCPLANE_KUBE_BENCH_MARKDOWN") {
        std::fs::write(&path, &table).expect("writing the Markdown table");
    }
}
