//! Benchmark: endpoint churn through a real API server, svcplane against upstream
//! kube-proxy (nftables mode), each proxy alone on its own lab node, one after the other.
//!
//! Input: S selector-less ClusterIP Services with one IPv4 EndpointSlice of 10 ready
//! endpoints each (`kube_support::bench`), written through the API before any proxy runs,
//! plus a marker Service whose one endpoint is a lab pod.
//!
//! Per proxy: start it cold on its node and wait until the node reaches the marker (every
//! Service is then programmed), then let it settle, then send R endpoint changes a second
//! for T seconds: change `j` marks one more endpoint of Service `j`'s slice not ready (a
//! pod failing its readiness probe, as the EndpointSlice controller would write it; run `k`
//! takes endpoint `k` down), so no two changes of a run touch the same Service and every
//! run makes the same changes. A subscription to nf_tables' change notifications in the
//! node's namespace stamps every kernel change as it is committed; a change has *propagated* at
//! the first committed kernel change that names its Service (both proxies name their
//! per-Service chains `...-<namespace>/<name>/...`) after the change was sent. Reported:
//! propagation p50 / p99 / max, changes never seen within the limit, the API's own write
//! latency (so a slow API server shows), and the proxy's peak RSS.
//!
//! The floor, in the same run: a bare watch on the EndpointSlices, opened by the harness
//! itself before the churn, stamps when the API server delivers each change to a client.
//! No proxy can program a change before it has been told of it, so *after delivery* (the
//! kernel's stamp less the delivery stamp of the same change) is what the proxy itself
//! adds: its own watch's decoding, planning, rendering and the kernel's commit.
//!
//! Proxies: kube-proxy v1.36 `--proxy-mode=nftables` with its defaults (at most one sync a
//! second), the same with `--iptables-min-sync-period=0s` (its floor for nftables mode),
//! and `svcplane proxy` (nftables mode over netlink) with its defaults (also at most one
//! sync a second, as kube-proxy) and with `--min-sync-period=0s`.
//!
//! `scripts/k8s/churn` runs the real size (10k Services, 50 changes a second for 60 s,
//! release build); the plain test here runs the same harness on a small cluster, and fails
//! if any proxy misses a change, so the harness itself stays tested.

mod kube_support;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube_support::bench::{
    ENDPOINTS_PER_SERVICE, bulk_service, create_bulk, peak_rss_kib, until_answered, upstream_kube_proxy_args,
};
use kube_support::{CLUSTER_CIDRS, KubeLab, cluster_ip_v4, echo_service, echo_slice};
use svcplane_control_plane::{UpstreamBinaries, binaries_for_test};
use svcplane_testbed::Lab;

const MARKER: &str = "marker";
/// Quiet time between a proxy's cold start and its churn, so start-up work is over.
const SETTLE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    KubeProxyDefaults,
    KubeProxyNoMinSync,
    Svcplane,
    SvcplaneNoMinSync,
}

impl Proxy {
    const ALL: [Proxy; 4] =
        [Proxy::KubeProxyDefaults, Proxy::KubeProxyNoMinSync, Proxy::Svcplane, Proxy::SvcplaneNoMinSync];

    fn node(self) -> u16 {
        match self {
            Proxy::KubeProxyDefaults => 1,
            Proxy::KubeProxyNoMinSync => 2,
            Proxy::Svcplane => 3,
            Proxy::SvcplaneNoMinSync => 4,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Proxy::KubeProxyDefaults => "kube-proxy v1.36 nftables, defaults",
            Proxy::KubeProxyNoMinSync => "kube-proxy v1.36 nftables, `--iptables-min-sync-period=0s`",
            Proxy::Svcplane => "svcplane proxy (nftables, netlink), defaults",
            Proxy::SvcplaneNoMinSync => "svcplane proxy (nftables, netlink), `--min-sync-period=0s`",
        }
    }

    fn process(self) -> String {
        format!("churn-proxy-node{}", self.node())
    }
}

/// The churn of one run.
#[derive(Debug, Clone, Copy)]
struct Churn {
    services: usize,
    per_second: usize,
    seconds: u64,
    /// How long after the last change a change may still propagate.
    limit: Duration,
}

impl Churn {
    fn changes(&self) -> usize {
        self.per_second * usize::try_from(self.seconds).expect("seconds")
    }
}

/// One proxy's figures.
#[derive(Debug, Default)]
struct Measured {
    cold_start: Option<Duration>,
    /// Propagation of each change that was seen, sorted.
    propagation: Vec<Duration>,
    unseen: usize,
    /// The API server's answer time for each change, sorted.
    api_write: Vec<Duration>,
    /// From sending each change to a bare watch receiving it, sorted: the floor.
    delivery: Vec<Duration>,
    /// From that delivery to the kernel's change, for each change seen by both, sorted.
    after_delivery: Vec<Duration>,
    sent_over: Duration,
    peak_rss_kib: Option<u64>,
    /// Notifications the kernel dropped because the subscription's buffer was full.
    overflows: usize,
}

fn start_proxy(kube: &KubeLab, proxy: Proxy) -> u32 {
    let node = kube.lab.node(proxy.node());
    let kubeconfig = kube.plane.kubeconfig().display().to_string();
    let (program, args): (&str, Vec<String>) = match proxy {
        Proxy::KubeProxyDefaults | Proxy::KubeProxyNoMinSync => {
            let mut args = upstream_kube_proxy_args(kube, node.name(), "nftables");
            if proxy == Proxy::KubeProxyNoMinSync {
                args.push("--iptables-min-sync-period=0s".into());
            }
            ("kube-proxy", args)
        }
        Proxy::Svcplane | Proxy::SvcplaneNoMinSync => {
            let mut args: Vec<String> =
                ["proxy", "--kubeconfig", &kubeconfig, "--node-name", node.name()].map(String::from).to_vec();
            for cidr in CLUSTER_CIDRS {
                args.extend(["--cluster-cidr".to_owned(), cidr.to_owned()]);
            }
            if proxy == Proxy::SvcplaneNoMinSync {
                args.push("--min-sync-period=0s".into());
            }
            (env!("CARGO_BIN_EXE_svcplane"), args)
        }
    };
    let (pid, _) = kube.plane.spawn(&proxy.process(), node.namespace_name(), program, &args).expect("a proxy");
    pid
}

/// A subscription to nf_tables' change notifications (netlink group `NFNLGRP_NFTABLES`, what
/// `nft monitor` listens to) in a node's namespace: every notification that names a bulk
/// Service, stamped when received. The kernel sends them as each transaction commits. The
/// raw messages are searched for the name instead of being decoded: both proxies name
/// their per-Service chains `...-default/svc-NNNNN/...`, and a rule's notification carries
/// its chain's name. (`nft monitor` itself first lists the whole ruleset to print names,
/// which at 10k Services took longer than the churn.)
struct KernelMonitor {
    seen: Arc<Mutex<Vec<(Instant, usize)>>>,
    overflows: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

const NFNLGRP_NFTABLES: u32 = 7;
const SERVICE_PREFIX: &[u8] = b"default/svc-";

/// Every bulk Service a notification names (`.../default/svc-01234/...`).
fn services_named(message: &[u8]) -> Vec<usize> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = message[at..].windows(SERVICE_PREFIX.len()).position(|w| w == SERVICE_PREFIX) {
        let digits = at + offset + SERVICE_PREFIX.len();
        if let Some(index) = message.get(digits..digits + 5).and_then(|d| std::str::from_utf8(d).ok()?.parse().ok())
            && !found.contains(&index)
        {
            found.push(index);
        }
        at = digits;
    }
    found
}

/// A netlink socket in `namespace` subscribed to nf_tables' notifications, with a large
/// receive buffer and a short receive timeout (so its reader can be stopped).
#[allow(unsafe_code, reason = "a netlink socket through libc: socket, setsockopt and bind")]
fn subscribe(namespace: &str) -> OwnedFd {
    svcplane_testbed::run_in_namespace(namespace, || {
        // SAFETY: plain system calls on a socket this function owns; every pointer passed
        // points to a live local of the size given.
        unsafe {
            let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER);
            assert!(fd >= 0, "a netlink socket: {}", std::io::Error::last_os_error());
            let fd = OwnedFd::from_raw_fd(fd);
            let size: libc::c_int = 256 << 20;
            let set = |option: libc::c_int, value: *const libc::c_void, length: usize| {
                let length = libc::socklen_t::try_from(length).expect("option length");
                libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, option, value, length)
            };
            assert_eq!(set(libc::SO_RCVBUFFORCE, (&raw const size).cast(), size_of_val(&size)), 0);
            let timeout = libc::timeval { tv_sec: 0, tv_usec: 200_000 };
            assert_eq!(set(libc::SO_RCVTIMEO, (&raw const timeout).cast(), size_of_val(&timeout)), 0);
            let mut address: libc::sockaddr_nl = std::mem::zeroed();
            address.nl_family = u16::try_from(libc::AF_NETLINK).expect("family");
            address.nl_groups = 1 << (NFNLGRP_NFTABLES - 1);
            let length = libc::socklen_t::try_from(size_of_val(&address)).expect("address length");
            let bound = libc::bind(fd.as_raw_fd(), (&raw const address).cast(), length);
            assert_eq!(bound, 0, "subscribing to nf_tables notifications: {}", std::io::Error::last_os_error());
            fd
        }
    })
    .expect("the node's namespace")
}

impl KernelMonitor {
    #[allow(unsafe_code, reason = "recv on the netlink socket through libc")]
    fn start(namespace: &str) -> KernelMonitor {
        let socket = subscribe(namespace);
        let seen: Arc<Mutex<Vec<(Instant, usize)>>> = Arc::default();
        let overflows = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, overflowed, stopped) = (Arc::clone(&seen), Arc::clone(&overflows), Arc::clone(&stop));
        let reader = std::thread::spawn(move || {
            let mut buffer = vec![0u8; 1 << 20];
            while !stopped.load(Ordering::Acquire) {
                // SAFETY: the buffer is live and as long as the length given.
                let received = unsafe { libc::recv(socket.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0) };
                let at = Instant::now();
                let Ok(length) = usize::try_from(received) else {
                    match std::io::Error::last_os_error().raw_os_error() {
                        Some(libc::ENOBUFS) => {
                            overflowed.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(libc::EAGAIN | libc::EINTR) => {}
                        _ => break,
                    }
                    continue;
                };
                let named = services_named(&buffer[..length]);
                if !named.is_empty() {
                    let mut seen = sink.lock().unwrap();
                    seen.extend(named.into_iter().map(|service| (at, service)));
                }
            }
        });
        KernelMonitor { seen, overflows, stop, reader: Some(reader) }
    }

    /// For each service, when the kernel first changed it at or after `since[service]`.
    fn first_change_after(&self, since: &HashMap<usize, Instant>) -> HashMap<usize, Instant> {
        let mut first = HashMap::new();
        for (at, service) in self.seen.lock().unwrap().iter() {
            if since.get(service).is_some_and(|sent| at >= sent) {
                first.entry(*service).or_insert(*at);
            }
        }
        first
    }
}

impl Drop for KernelMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The merge patch that marks endpoints `0..=slot` of bulk Service `index` not ready, as the
/// EndpointSlice controller writes pods that fail their readiness probe: the run in slot
/// `slot` takes endpoint `slot` down, the earlier runs having taken down the ones before.
fn not_ready_patch(index: usize, slot: usize) -> serde_json::Value {
    let (_, slice) = bulk_service(index);
    let mut endpoints = serde_json::to_value(&slice.endpoints).expect("endpoints as JSON");
    for endpoint in 0..=slot {
        endpoints[endpoint]["conditions"] =
            serde_json::json!({ "ready": false, "serving": false, "terminating": false });
    }
    serde_json::json!({ "endpoints": endpoints })
}

/// The Service index of a bulk slice's name (`svc-NNNNN-1`).
fn service_of_slice(name: &str) -> Option<usize> {
    name.strip_prefix("svc-")?.strip_suffix("-1")?.parse().ok()
}

/// What one run of the churn sent and saw.
struct Sent {
    /// When each change (by Service index) was sent.
    at: HashMap<usize, Instant>,
    /// How long the API server took to answer each, unsorted.
    answered: Vec<Duration>,
    /// When the harness's own watch received each change.
    delivered: HashMap<usize, Instant>,
    over: Duration,
}

/// Watches the EndpointSlices from now on and stamps the first change of each bulk slice
/// it receives, until it has `wanted` of them or `limit` has passed.
async fn stamp_deliveries(
    slices: Api<EndpointSlice>,
    wanted: usize,
    limit: Duration,
) -> impl Future<Output = HashMap<usize, Instant>> {
    let now = slices.list_metadata(&ListParams::default().limit(1)).await.expect("the slices' resourceVersion");
    let version = now.metadata.resource_version.expect("a list has a resourceVersion");
    let stream = slices.watch(&WatchParams::default().timeout(290), &version).await.expect("watching the slices");
    async move {
        let mut stream = stream.boxed();
        let mut delivered = HashMap::with_capacity(wanted);
        let deadline = tokio::time::Instant::now() + limit;
        while delivered.len() < wanted {
            match tokio::time::timeout_at(deadline, stream.try_next()).await {
                Ok(Ok(Some(WatchEvent::Modified(slice)))) => {
                    let seen = Instant::now();
                    if let Some(index) = slice.metadata.name.as_deref().and_then(service_of_slice) {
                        delivered.entry(index).or_insert(seen);
                    }
                }
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None) | Err(_)) | Err(_) => break,
            }
        }
        delivered
    }
}

/// Sends the churn of run `slot`: `churn.per_second` changes a second for `churn.seconds`,
/// change `j` to Service `j`. Every run changes the same Services in the same order. Each change is its own request, started on its tick whether or
/// not earlier ones have been answered. A watch of the harness's own stamps each change's
/// delivery meanwhile.
fn send_churn(kube: &KubeLab, churn: Churn, slot: usize) -> Sent {
    let client = kube.client.client();
    let started = Instant::now();
    let (sent, answered, delivered) = kube.client.run(async move {
        let slices = Api::<EndpointSlice>::namespaced(client, "default");
        let deliveries = tokio::spawn(
            stamp_deliveries(slices.clone(), churn.changes(), churn.limit + Duration::from_secs(churn.seconds)).await,
        );
        let mut tick = tokio::time::interval(Duration::from_secs(1) / u32::try_from(churn.per_second).unwrap());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let mut tasks = Vec::with_capacity(churn.changes());
        for j in 0..churn.changes() {
            tick.tick().await;
            let index = j;
            let slices = slices.clone();
            let patch = not_ready_patch(index, slot);
            let sent = Instant::now();
            tasks.push(tokio::spawn(async move {
                let name = format!("svc-{index:05}-1");
                slices
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap_or_else(|e| panic!("marking an endpoint of {name} not ready: {e}"));
                (index, sent, sent.elapsed())
            }));
        }
        let mut sent = HashMap::new();
        let mut answered = Vec::new();
        for task in tasks {
            let (index, at, took) = task.await.expect("a change");
            sent.insert(index, at);
            answered.push(took);
        }
        let delivered = deliveries.await.expect("the delivery stamps");
        (sent, answered, delivered)
    });
    Sent { at: sent, answered, delivered, over: started.elapsed() }
}

fn run_proxy(kube: &KubeLab, proxy: Proxy, churn: Churn, slot: usize, target: SocketAddr) -> Measured {
    let namespace = kube.lab.node(proxy.node()).namespace_name().to_owned();
    let started = Instant::now();
    let pid = start_proxy(kube, proxy);
    let cold_start = until_answered(kube, &namespace, target, "node1-pod1", Duration::from_secs(600), started);
    let mut measured = Measured { cold_start, ..Measured::default() };
    if cold_start.is_none() {
        measured.unseen = churn.changes();
        kube.plane.stop(&proxy.process());
        return measured;
    }
    std::thread::sleep(SETTLE);
    let monitor = KernelMonitor::start(&namespace);
    let Sent { at: sent, answered: mut api_write, delivered, over: sent_over } = send_churn(kube, churn, slot);
    let deadline = Instant::now() + churn.limit;
    let mut first_change = monitor.first_change_after(&sent);
    while first_change.len() < sent.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        first_change = monitor.first_change_after(&sent);
    }
    measured.overflows = monitor.overflows.load(Ordering::Relaxed);
    drop(monitor);
    measured.peak_rss_kib = peak_rss_kib(pid);
    kube.plane.check_running(&proxy.process()).expect("the proxy still runs");
    kube.plane.stop(&proxy.process());
    let mut propagation: Vec<Duration> = sent
        .iter()
        .filter_map(|(service, at)| first_change.get(service).map(|seen| seen.duration_since(*at)))
        .collect();
    propagation.sort();
    api_write.sort();
    measured.delivery = sent
        .iter()
        .filter_map(|(service, at)| delivered.get(service).map(|seen| seen.saturating_duration_since(*at)))
        .collect();
    measured.delivery.sort();
    measured.after_delivery = delivered
        .iter()
        .filter_map(|(service, at)| first_change.get(service).map(|seen| seen.saturating_duration_since(*at)))
        .collect();
    measured.after_delivery.sort();
    measured.unseen = sent.len() - propagation.len();
    measured.propagation = propagation;
    measured.api_write = api_write;
    measured.sent_over = sent_over;
    measured
}

fn quantile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    // Nearest rank.
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn millis(value: Option<Duration>) -> String {
    value.map_or_else(|| "-".to_owned(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
}

fn run(binaries: &UpstreamBinaries, churn: Churn) -> Vec<(Proxy, Measured)> {
    assert!(churn.changes() <= churn.services, "every change of a run needs a Service of its own");
    assert!(Proxy::ALL.len() <= ENDPOINTS_PER_SERVICE, "every run needs an endpoint of its own");
    let lab = Lab::builder().nodes(4).pods_per_node(1).build().expect("a lab");
    lab.start_echo_in_all_pods(kube_support::ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane"))).expect("echo");
    let kube = KubeLab::start(binaries, lab);
    let created = Instant::now();
    create_bulk(&kube, churn.services);
    let marker: Service = kube.client.create(&echo_service(MARKER, false, &[])).expect("the marker");
    let pod = IpAddr::V4(kube.lab.pod("node1-pod1").ip_v4());
    kube.client.create(&echo_slice("marker-1", MARKER, &[(pod, "node1")], &[])).expect("the marker's slice");
    eprintln!(
        "churn: {} Services and their slices written in {:.1} s",
        churn.services,
        created.elapsed().as_secs_f64()
    );
    let target = SocketAddr::new(cluster_ip_v4(&marker), 80);
    Proxy::ALL
        .iter()
        .enumerate()
        .map(|(slot, proxy)| {
            let measured = run_proxy(&kube, *proxy, churn, slot, target);
            eprintln!(
                "churn: {}: cold start {}, propagation p50 {} p99 {}, after delivery p50 {} p99 {}, {} not seen, {} notification overflows",
                proxy.label(),
                millis(measured.cold_start),
                millis(quantile(&measured.propagation, 0.5)),
                millis(quantile(&measured.propagation, 0.99)),
                millis(quantile(&measured.after_delivery, 0.5)),
                millis(quantile(&measured.after_delivery, 0.99)),
                measured.unseen,
                measured.overflows
            );
            (*proxy, measured)
        })
        .collect()
}

fn markdown(churn: Churn, all: &[(Proxy, Measured)]) -> String {
    let mut out = format!(
        "| {} Services x 10, {} endpoint changes/s for {} s | cold start | propagation p50 | p99 | max | delivery to a bare watch p50 / p99 (floor) | after delivery p50 / p99 | changes not seen within {} s | API write p50 / p99 | sent over | peak RSS | notification overflows |\n",
        churn.services,
        churn.per_second,
        churn.seconds,
        churn.limit.as_secs()
    );
    out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (proxy, m) in all {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} / {} | {} / {} | {} of {} | {} / {} | {:.1} s | {} | {} |",
            proxy.label(),
            millis(m.cold_start),
            millis(quantile(&m.propagation, 0.5)),
            millis(quantile(&m.propagation, 0.99)),
            millis(m.propagation.last().copied()),
            millis(quantile(&m.delivery, 0.5)),
            millis(quantile(&m.delivery, 0.99)),
            millis(quantile(&m.after_delivery, 0.5)),
            millis(quantile(&m.after_delivery, 0.99)),
            m.unseen,
            m.unseen + m.propagation.len(),
            millis(quantile(&m.api_write, 0.5)),
            millis(quantile(&m.api_write, 0.99)),
            m.sent_over.as_secs_f64(),
            m.peak_rss_kib.map_or_else(|| "-".to_owned(), |kib| format!("{} MiB", kib / 1024)),
            m.overflows,
        );
    }
    out
}

#[test]
fn the_churn_harness_sees_every_change_reach_each_proxys_kernel_on_a_small_cluster() {
    let test = "the_churn_harness_sees_every_change_reach_each_proxys_kernel_on_a_small_cluster";
    let Some(binaries) = binaries_for_test(test) else { return };
    let churn = Churn { services: 60, per_second: 10, seconds: 2, limit: Duration::from_secs(30) };
    let all = run(&binaries, churn);
    eprintln!("{}", markdown(churn, &all));
    for (proxy, measured) in &all {
        assert!(measured.cold_start.is_some(), "{} never reached the marker", proxy.label());
        assert_eq!(measured.unseen, 0, "{}: changes never reached the kernel", proxy.label());
        assert_eq!(measured.propagation.len(), churn.changes(), "{}", proxy.label());
        assert_eq!(measured.delivery.len(), churn.changes(), "{}: the bare watch missed changes", proxy.label());
        assert_eq!(measured.after_delivery.len(), churn.changes(), "{}", proxy.label());
        assert_eq!(measured.overflows, 0, "{}: notifications lost", proxy.label());
    }
}

/// `scripts/k8s/churn`: 10k Services, 50 changes a second for 60 s per proxy
/// (`SVCPLANE_CHURN=services,per_second,seconds` to change), the Markdown table on stderr
/// and in `SVCPLANE_CHURN_MARKDOWN` when set.
#[test]
#[ignore = "a benchmark: minutes of API writes and churn (scripts/k8s/churn)"]
fn endpoint_churn_at_10k_services_against_upstream_kube_proxy() {
    let test = "endpoint_churn_at_10k_services_against_upstream_kube_proxy";
    let Some(binaries) = binaries_for_test(test) else { return };
    let numbers: Vec<u64> = std::env::var("SVCPLANE_CHURN")
        .unwrap_or_else(|_| "10000,50,60".into())
        .split(',')
        .map(|n| n.trim().parse().expect("SVCPLANE_CHURN: services,per_second,seconds"))
        .collect();
    let [services, per_second, seconds] = numbers[..] else { panic!("SVCPLANE_CHURN: services,per_second,seconds") };
    let churn = Churn {
        services: usize::try_from(services).unwrap(),
        per_second: usize::try_from(per_second).unwrap(),
        seconds,
        limit: Duration::from_secs(60),
    };
    let all = run(&binaries, churn);
    let table = markdown(churn, &all);
    eprintln!("{table}");
    if let Ok(path) = std::env::var("SVCPLANE_CHURN_MARKDOWN") {
        std::fs::write(path, &table).expect("writing the Markdown table");
    }
}
