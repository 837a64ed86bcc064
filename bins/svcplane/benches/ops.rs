//! What watching the proxy costs, at S Services x E endpoints (default 10k x 10), with the
//! real `svcplane proxy` (nftables mode) in a one-node lab of network namespaces:
//!
//! 1. a scrape: `/metrics`, `/healthz`, `/livez` and `/status.json` against `/proxyMode`
//!    (the same server answering a constant: the HTTP floor), N requests each;
//! 2. the sync loop under scrapes: partial syncs after C endpoint changes with nobody
//!    scraping, then with two threads scraping `/metrics` and `/healthz` without pause;
//! 3. counting: full sync, partial syncs and connect latency through a ClusterIP with
//!    `--nft-counters` on and off, against connecting to the endpoint directly.
//!
//! `cargo bench -p svcplane --bench ops -- --services 10000 --endpoints 10 --scrapes 500 --changes 30 --connects 2000`
//! (root: it builds namespaces). Sync times are the proxy's own
//! `kubeproxy_sync_*_duration_seconds` histograms (sum / count over the phase).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use svcplane_ops::http;
use svcplane_testbed::{Lab, run_in_namespace, tcp_request};

const ECHO_PORT: u16 = 8080;
const METRICS: &str = "127.0.0.1:10249";
const HEALTHZ: &str = "127.0.0.1:10256";
const SYNCED_WITHIN: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct Args {
    services: usize,
    endpoints: usize,
    scrapes: usize,
    changes: usize,
    connects: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args { services: 10_000, endpoints: 10, scrapes: 500, changes: 30, connects: 2000 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--services" => args.services = value()?.parse()?,
            "--endpoints" => args.endpoints = value()?.parse()?,
            "--scrapes" => args.scrapes = value()?.parse()?,
            "--changes" => args.changes = value()?.parse()?,
            "--connects" => args.connects = value()?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(args)
}

fn service_ip(s: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + s as u32 + 1)
}

/// Endpoints of every Service but the first: addresses in the pod range nobody answers on
/// (only rules are measured there). Service 0 has the lab's two real pods.
fn idle_endpoint(s: usize, e: usize, endpoints: usize, shift: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 160, 0)) + ((s * endpoints + e) as u32 + shift) % 24_000 + 1)
}

struct Manifests {
    dir: PathBuf,
    args_services: usize,
    endpoints: usize,
    pods: [Ipv4Addr; 2],
}

const FILES: usize = 100;

impl Manifests {
    fn range(&self, file: usize) -> std::ops::Range<usize> {
        file * self.args_services / FILES..(file + 1) * self.args_services / FILES
    }

    /// One file of Services with explicit EndpointSlices; `shift` moves every idle endpoint
    /// of the file (one endpoint change per Service of the file).
    fn write(&self, file: usize, shift: u32) -> anyhow::Result<()> {
        let mut text = String::new();
        for s in self.range(file) {
            writeln!(
                text,
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-{s}\n  namespace: bench\nspec:\n  clusterIP: {}\n  ports:\n    - name: http\n      port: 80\n      targetPort: {ECHO_PORT}\n---",
                service_ip(s)
            )?;
            let addresses: Vec<Ipv4Addr> = if s == 0 {
                self.pods.to_vec()
            } else {
                (0..self.endpoints).map(|e| idle_endpoint(s, e, self.endpoints, shift)).collect()
            };
            writeln!(
                text,
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-{s}-1\n  namespace: bench\n  labels:\n    kubernetes.io/service-name: svc-{s}\naddressType: IPv4\nports:\n  - name: http\n    port: {ECHO_PORT}\n    protocol: TCP\nendpoints:"
            )?;
            for address in addresses {
                writeln!(text, "  - addresses: [\"{address}\"]\n    nodeName: node1")?;
            }
            text.push_str("---\n");
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

struct Proxy {
    child: Child,
    namespace: String,
}

impl Proxy {
    fn start(lab: &Lab, manifests: &Path, counting: bool) -> anyhow::Result<Self> {
        let node = &lab.nodes()[0];
        let args: Vec<String> = [
            env!("CARGO_BIN_EXE_svcplane"),
            "proxy",
            "--manifests",
            &manifests.to_string_lossy(),
            "--node-name",
            node.name(),
            "--node-ip",
            &node.ip_v4().to_string(),
            "--cluster-cidr",
            "198.18.128.0/17",
            "--service-cidr",
            "198.19.0.0/16",
            "--mode",
            "nftables",
            &format!("--nft-counters={counting}"),
        ]
        .map(String::from)
        .to_vec();
        let mut command = lab.command(node.namespace_name(), &args)?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let proxy = Self { child: command.spawn()?, namespace: node.namespace_name().to_owned() };
        let started = Instant::now();
        while proxy.metric("kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}").unwrap_or(0.0)
            < 1.0
        {
            ensure!(started.elapsed() < SYNCED_WITHIN, "the proxy did not sync within {SYNCED_WITHIN:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(proxy)
    }

    fn get(&self, address: &str, path: &str) -> anyhow::Result<String> {
        let address: SocketAddr = address.parse()?;
        let path = path.to_owned();
        let (status, _, body) = run_in_namespace(&self.namespace, move || http::get(address, &path))??;
        ensure!(status == 200 || status == 503, "GET {address}: {status}");
        Ok(body)
    }

    fn metric(&self, series: &str) -> Option<f64> {
        let body = self.get(METRICS, "/metrics").ok()?;
        body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// (sum, count) of a sync-duration histogram.
    fn histogram(&self, name: &str) -> (f64, f64) {
        let label = "{ip_family=\"IPv4\"}";
        (
            self.metric(&format!("{name}_sum{label}")).unwrap_or(0.0),
            self.metric(&format!("{name}_count{label}")).unwrap_or(0.0),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// p50 and p99 of `count` GETs of `path`, each a new connection, from the node.
fn scrape_latency(
    proxy: &Proxy,
    address: &str,
    path: &str,
    count: usize,
) -> anyhow::Result<(Duration, Duration, usize)> {
    let address: SocketAddr = address.parse()?;
    let path = path.to_owned();
    let (mut samples, size) = run_in_namespace(&proxy.namespace, move || {
        let mut samples = Vec::with_capacity(count);
        let mut size = 0;
        for _ in 0..count {
            let started = Instant::now();
            let (_, _, body) = http::get(address, &path)?;
            samples.push(started.elapsed());
            size = body.len();
        }
        Ok::<_, std::io::Error>((samples, size))
    })??;
    Ok((percentile(&mut samples, 0.5), percentile(&mut samples, 0.99), size))
}

/// Rewrites `changes` files one at a time (each moves the endpoints of its Services) and
/// returns the mean partial sync time the proxy measured over them.
fn partial_syncs(
    proxy: &Proxy,
    manifests: &Manifests,
    changes: usize,
    round: u32,
) -> anyhow::Result<(Duration, usize)> {
    let name = "kubeproxy_sync_partial_proxy_rules_duration_seconds";
    let (sum_before, count_before) = proxy.histogram(name);
    for change in 0..changes {
        let (_, count_now) = proxy.histogram(name);
        manifests.write(change % FILES, round * 1000 + change as u32 + 1)?;
        let started = Instant::now();
        while proxy.histogram(name).1 <= count_now {
            ensure!(started.elapsed() < Duration::from_secs(30), "no partial sync after change {change}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let (sum, count) = proxy.histogram(name);
    let syncs = (count - count_before) as usize;
    Ok((Duration::from_secs_f64((sum - sum_before) / syncs.max(1) as f64), syncs))
}

/// p50 / p99 of `count` TCP request-answer exchanges to `target` from the node.
fn connect_latency(lab: &Lab, target: SocketAddr, count: usize) -> anyhow::Result<(Duration, Duration)> {
    let namespace = lab.nodes()[0].namespace_name().to_owned();
    let mut samples = run_in_namespace(&namespace, move || {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            tcp_request(target, Duration::from_secs(5))?;
            samples.push(started.elapsed());
        }
        Ok::<_, svcplane_testbed::ProbeError>(samples)
    })??;
    Ok((percentile(&mut samples, 0.5), percentile(&mut samples, 0.99)))
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let lab = Lab::builder().nodes(1).pods_per_node(2).clients(0).build().context("building the lab (needs root)")?;
    lab.start_echo_in_all_pods(ECHO_PORT, Path::new(env!("CARGO_BIN_EXE_svcplane")))?;
    let pods = [lab.pods()[0].ip_v4(), lab.pods()[1].ip_v4()];
    let dir = std::env::temp_dir().join(format!("svcplane-ops-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let manifests = Manifests { dir: dir.clone(), args_services: args.services, endpoints: args.endpoints, pods };
    for file in 0..FILES {
        manifests.write(file, 0)?;
    }
    println!(
        "# ops benchmark: {} Services x {} endpoints, nftables mode, {} scrapes, {} changes, {} connects",
        args.services, args.endpoints, args.scrapes, args.changes, args.connects
    );

    // 1. What a scrape costs.
    let proxy = Proxy::start(&lab, &dir, true)?;
    println!("\n| request | p50 ms | p99 ms | bytes | p50 / `/proxyMode` |\n| --- | --- | --- | --- | --- |");
    let (floor, floor_p99, floor_size) = scrape_latency(&proxy, METRICS, "/proxyMode", args.scrapes)?;
    println!("| `/proxyMode` (baseline) | {} | {} | {floor_size} | 1.00 |", ms(floor), ms(floor_p99));
    for (address, path, count) in [
        (METRICS, "/metrics", args.scrapes),
        (HEALTHZ, "/healthz", args.scrapes),
        (HEALTHZ, "/livez", args.scrapes),
        (METRICS, "/status.json", (args.scrapes / 50).max(3)),
    ] {
        let (p50, p99, size) = scrape_latency(&proxy, address, path, count)?;
        println!(
            "| `{path}` ({count}x) | {} | {} | {size} | {:.2} |",
            ms(p50),
            ms(p99),
            p50.as_secs_f64() / floor.as_secs_f64()
        );
    }

    // 2. Partial syncs alone, then under continuous scrapes.
    let (alone, syncs_alone) = partial_syncs(&proxy, &manifests, args.changes, 1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    let scrapers: Vec<_> = [(METRICS, "/metrics"), (HEALTHZ, "/healthz")]
        .into_iter()
        .map(|(address, path)| {
            let (stop, scrapes, namespace) = (Arc::clone(&stop), Arc::clone(&scrapes), proxy.namespace.clone());
            let address: SocketAddr = address.parse().expect("an address");
            std::thread::spawn(move || {
                run_in_namespace(&namespace, || {
                    // Bounded: stops with the phase, and at most 200k requests.
                    for _ in 0..200_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        if http::get(address, path).is_ok() {
                            scrapes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
        })
        .collect();
    let phase = Instant::now();
    let (scraped, syncs_scraped) = partial_syncs(&proxy, &manifests, args.changes, 2)?;
    let phase = phase.elapsed();
    stop.store(true, Ordering::Relaxed);
    for scraper in scrapers {
        let _ = scraper.join();
    }
    let rate = scrapes.load(Ordering::Relaxed) as f64 / phase.as_secs_f64();
    println!("\n| partial sync (proxy's own histogram) | mean ms | syncs | ratio |\n| --- | --- | --- | --- |");
    println!("| nobody scraping (baseline) | {} | {syncs_alone} | 1.00 |", ms(alone));
    println!(
        "| 2 threads scraping `/metrics` + `/healthz` ({rate:.0} scrapes/s) | {} | {syncs_scraped} | {:.2} |",
        ms(scraped),
        scraped.as_secs_f64() / alone.as_secs_f64()
    );
    drop(proxy);

    // 3. Counting on and off.
    let target = SocketAddr::new(IpAddr::V4(service_ip(0)), 80);
    let direct = SocketAddr::new(IpAddr::V4(pods[0]), ECHO_PORT);
    println!(
        "\n| counters | full sync ms | partial sync ms (mean of {}) | connect via ClusterIP p50 / p99 ms | direct to the pod p50 / p99 ms (baseline) |\n| --- | --- | --- | --- | --- |",
        args.changes
    );
    for (round, counting) in [(3, true), (4, false)] {
        for file in 0..FILES {
            manifests.write(file, 0)?;
        }
        let proxy = Proxy::start(&lab, &dir, counting)?;
        let (full_sum, full_count) = proxy.histogram("kubeproxy_sync_full_proxy_rules_duration_seconds");
        let (partial, _) = partial_syncs(&proxy, &manifests, args.changes, round)?;
        let (via_p50, via_p99) = connect_latency(&lab, target, args.connects)?;
        let (direct_p50, direct_p99) = connect_latency(&lab, direct, args.connects)?;
        println!(
            "| {} | {} | {} | {} / {} | {} / {} |",
            if counting { "on (default)" } else { "off (`--nft-counters=false`)" },
            ms(Duration::from_secs_f64(full_sum / full_count.max(1.0))),
            ms(partial),
            ms(via_p50),
            ms(via_p99),
            ms(direct_p50),
            ms(direct_p99)
        );
    }
    Ok(())
}
