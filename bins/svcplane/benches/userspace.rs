//! Userspace mode benchmark: the real `svcplane proxy --mode userspace` on a one-node lab,
//! against the same client reaching the same pod directly and against `--mode nftables`,
//! in the same run.
//!
//! `cargo bench -p svcplane --bench userspace -- --connects 2000 --bulk-mib 512 --hold 10000`
//! (needs root: network namespaces). Per mode, alternating with the direct path in four
//! rounds: TCP connect latency p50/p99 (the handshake: through the relay it completes at
//! the relay's listener), connect plus a one-byte echo p50/p99 (which includes the relay's
//! own connect to the endpoint), and one bulk TCP stream. Then, in userspace mode, `--hold`
//! connections opened and held at once (each proven end to end by a one-byte echo), with
//! the proxy process's resident memory before and while holding them.
//!
//! The pod's servers run in a child process (this binary again, `SVCPLANE_BENCH_SERVER`),
//! so the clients, the relay and the servers each have their own descriptor table.
//! Everything runs inside the lab's namespaces and is bounded in count and time.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use svcplane_testbed::Lab;

const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 250);
/// Service port 80 -> the sink (reads and discards until EOF, then closes).
const SINK_PORT: u16 = 8080;
/// Service port 81 -> the echo (writes back what it reads).
const ECHO_PORT: u16 = 8081;
const SERVER_ROLE: &str = "SVCPLANE_BENCH_SERVER";
const ROUNDS: usize = 4;
/// No phase of the benchmark may run longer than this.
const PHASE_LIMIT: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Args {
    connects: usize,
    bulk_mib: usize,
    hold: usize,
    markdown: Option<std::path::PathBuf>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args { connects: 2000, bulk_mib: 512, hold: 10_000, markdown: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--connects" => args.connects = value()?.parse()?,
            "--bulk-mib" => args.bulk_mib = value()?.parse()?,
            "--hold" => args.hold = value()?.parse()?,
            "--markdown" => args.markdown = Some(value()?.into()),
            "--bench" => {}
            other => bail!("unknown argument {other:?} (--connects N --bulk-mib N --hold N --markdown FILE)"),
        }
    }
    ensure!((ROUNDS..=20_000).contains(&args.connects), "--connects: {ROUNDS}..=20000");
    ensure!((ROUNDS..=4096).contains(&args.bulk_mib), "--bulk-mib: {ROUNDS}..=4096");
    ensure!((1..=20_000).contains(&args.hold), "--hold: 1..=20000");
    Ok(args)
}

/// Soft descriptor limit up to the hard one, for this process's sockets.
fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() { hard } else { soft }
}

// ---------------------------------------------------------------------------------------
// The servers, in the pod's namespace, in a child process.

async fn sink(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0u8; 1 << 16];
    while matches!(stream.read(&mut buffer).await, Ok(n) if n > 0) {}
}

async fn echo(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = [0u8; 512];
    loop {
        match stream.read(&mut buffer).await {
            Ok(n) if n > 0 => {
                if stream.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// Serves until stdin closes (the benchmark ended or died) or the phase limit times two.
fn run_servers() -> anyhow::Result<()> {
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let sink_listener = tokio::net::TcpListener::bind(("0.0.0.0", SINK_PORT)).await?;
        let echo_listener = tokio::net::TcpListener::bind(("0.0.0.0", ECHO_PORT)).await?;
        tokio::spawn(async move {
            while let Ok((stream, _)) = sink_listener.accept().await {
                tokio::spawn(sink(stream));
            }
        });
        tokio::spawn(async move {
            while let Ok((stream, _)) = echo_listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(echo(stream));
            }
        });
        println!("ready");
        let stdin_closed = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {}
        });
        let _ = tokio::time::timeout(2 * PHASE_LIMIT, stdin_closed).await;
        anyhow::Ok(())
    })
}

/// The servers' child process; dropping it closes its stdin, which ends it.
struct Servers(Child);

impl Servers {
    /// Whether the child still runs (a failure names it rather than a refused connect).
    fn check(&mut self) -> anyhow::Result<()> {
        match self.0.try_wait()? {
            None => Ok(()),
            Some(status) => bail!("the servers' process ended: {status}"),
        }
    }

    fn start(lab: &Lab, pod: &str) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut command = lab.command(lab.pod(pod).namespace_name(), &[exe])?;
        command.env(SERVER_ROLE, "1").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = command.spawn().context("starting the servers")?;
        let mut ready = String::new();
        BufReader::new(child.stdout.take().context("the servers' stdout")?).read_line(&mut ready)?;
        ensure!(ready.trim() == "ready", "the servers did not start: {ready:?}");
        Ok(Self(child))
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------------------------------
// The proxy under test: the real binary in the node's namespace.

fn manifests(dir: &Path, server: Ipv4Addr) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: target\n  namespace: bench\nspec:\n  \
         clusterIP: \"{SERVICE_IP}\"\n  ports:\n    - name: sink\n      protocol: TCP\n      port: 80\n      \
         targetPort: {SINK_PORT}\n    - name: echo\n      protocol: TCP\n      port: 81\n      \
         targetPort: {ECHO_PORT}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  \
         name: target-v4\n  namespace: bench\n  labels:\n    kubernetes.io/service-name: target\n\
         addressType: IPv4\nports:\n  - name: sink\n    protocol: TCP\n    port: {SINK_PORT}\n  - name: echo\n    \
         protocol: TCP\n    port: {ECHO_PORT}\nendpoints:\n  - addresses: [\"{server}\"]\n    conditions:\n      \
         ready: true\n    nodeName: node1\n"
    );
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("target.yaml"), text)?;
    Ok(())
}

struct Proxy {
    child: Child,
    mode: &'static str,
}

impl Proxy {
    fn start(lab: &Lab, mode: &'static str, manifests: &Path, log: &Path) -> anyhow::Result<Self> {
        let node = lab.node(1);
        let [v4, v6] = node.ips().map(|ip| ip.to_string());
        let manifests = manifests.to_string_lossy().into_owned();
        let args = [
            env!("CARGO_BIN_EXE_svcplane"),
            "proxy",
            "--manifests",
            &manifests,
            "--node-name",
            "node1",
            "--node-ip",
            &v4,
            "--node-ip",
            &v6,
            "--cluster-cidr",
            "198.18.128.0/17",
            "--service-cidr",
            "198.19.0.0/16",
            "--mode",
            mode,
        ];
        let mut command = lab.command(node.namespace_name(), &args)?;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(log)?);
        Ok(Self { child: command.spawn().context("starting svcplane proxy")?, mode })
    }

    /// Resident memory of the proxy process, in KiB.
    fn rss_kib(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status.lines().find(|line| line.starts_with("VmRSS:")).context("VmRSS")?;
        Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
    }

    /// Stops it (SIGTERM, then SIGKILL after 5 s) and removes its rules.
    fn stop(mut self, lab: &Lab) -> anyhow::Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.child.try_wait()?.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        lab.exec_ok(lab.node(1).namespace_name(), &[env!("CARGO_BIN_EXE_svcplane"), "cleanup"])?;
        // The lab node's flows still name this mode's translations (a flow the relay reset
        // keeps its DNAT to a listener for 10 s): the next mode starts from none.
        lab.exec_ok(lab.node(1).namespace_name(), &["conntrack", "-F"])?;
        Ok(())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Measurements, from the client pod.

fn echo_once(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(b"x")?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte)
}

/// `count` connects, and `count` connects each followed by a one-byte echo, timed.
fn connects(lab: &Lab, pod: &str, echo: SocketAddr, count: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    lab.run_in(pod, || -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
        let (mut handshakes, mut first_bytes) = (Vec::with_capacity(count), Vec::with_capacity(count));
        let deadline = Instant::now() + PHASE_LIMIT;
        for i in 0..count {
            ensure!(Instant::now() < deadline, "connects took longer than {PHASE_LIMIT:?}");
            let started = Instant::now();
            let stream = TcpStream::connect_timeout(&echo, Duration::from_secs(2))
                .with_context(|| format!("connect {i} to {echo}"))?;
            handshakes.push(started.elapsed());
            drop(stream);
            let started = Instant::now();
            let mut stream = TcpStream::connect_timeout(&echo, Duration::from_secs(2))
                .with_context(|| format!("connect {i} + echo to {echo}"))?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            echo_once(&mut stream).with_context(|| format!("echo {i} from {echo}"))?;
            first_bytes.push(started.elapsed());
        }
        Ok((handshakes, first_bytes))
    })?
}

/// Bytes per second of one stream of `mib` MiB to the sink, until the sink closed.
fn throughput(lab: &Lab, pod: &str, sink: SocketAddr, mib: usize) -> anyhow::Result<f64> {
    let took = lab.run_in(pod, || -> anyhow::Result<Duration> {
        let mut stream =
            TcpStream::connect_timeout(&sink, Duration::from_secs(2)).with_context(|| format!("bulk to {sink}"))?;
        stream.set_read_timeout(Some(PHASE_LIMIT))?;
        let chunk = vec![7u8; 1 << 16];
        let started = Instant::now();
        for _ in 0..mib * 16 {
            stream.write_all(&chunk)?;
        }
        stream.shutdown(std::net::Shutdown::Write)?;
        // The sink closes once it read everything: the bytes arrived, not just left.
        let mut rest = [0u8; 16];
        while stream.read(&mut rest)? > 0 {}
        Ok(started.elapsed())
    })??;
    Ok((mib << 20) as f64 / took.as_secs_f64())
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn show(d: Duration) -> String {
    let micros = d.as_secs_f64() * 1e6;
    if micros < 1000.0 { format!("{micros:.0} µs") } else { format!("{:.2} ms", micros / 1000.0) }
}

#[derive(Debug, Default)]
struct Measured {
    handshakes: Vec<Duration>,
    first_bytes: Vec<Duration>,
    stream: f64,
}

impl Measured {
    fn p(&mut self, p: f64) -> (Duration, Duration) {
        (percentile(&mut self.handshakes, p), percentile(&mut self.first_bytes, p))
    }
}

/// Through the Service and straight to the pod, alternately, so both see the same machine.
fn paired(lab: &Lab, client: &str, server: Ipv4Addr, args: &Args) -> anyhow::Result<(Measured, Measured)> {
    let service = |port| SocketAddr::new(IpAddr::V4(SERVICE_IP), port);
    let direct = |port| SocketAddr::new(IpAddr::V4(server), port);
    let (mut through, mut straight) = (Measured::default(), Measured::default());
    for _ in 0..ROUNDS {
        for (path, echo) in [(&mut through, service(81)), (&mut straight, direct(ECHO_PORT))] {
            let (handshakes, first_bytes) = connects(lab, client, echo, args.connects / ROUNDS)?;
            path.handshakes.extend(handshakes);
            path.first_bytes.extend(first_bytes);
        }
        through.stream = through.stream.max(throughput(lab, client, service(80), args.bulk_mib / ROUNDS)?);
        straight.stream = straight.stream.max(throughput(lab, client, direct(SINK_PORT), args.bulk_mib / ROUNDS)?);
    }
    Ok((through, straight))
}

/// Waits until the Service answers an echo (the proxy programmed the node).
fn wait_programmed(lab: &Lab, client: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let target = SocketAddr::new(IpAddr::V4(SERVICE_IP), 81);
    while started.elapsed() < Duration::from_secs(60) {
        let answered = lab.run_in(client, || -> std::io::Result<()> {
            let mut stream = TcpStream::connect_timeout(&target, Duration::from_millis(300))?;
            stream.set_read_timeout(Some(Duration::from_millis(300)))?;
            echo_once(&mut stream)
        })?;
        if answered.is_ok() {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the Service did not answer within 60 s")
}

struct Held {
    opened: usize,
    refused: usize,
    took: Duration,
    rss_idle_kib: u64,
    rss_held_kib: u64,
    active: Option<f64>,
    fd_budget: Option<f64>,
    refused_fds: Option<f64>,
    small_pipes: Option<f64>,
}

fn metric(lab: &Lab, series: &str) -> Option<f64> {
    let address: SocketAddr = "127.0.0.1:10249".parse().ok()?;
    let (_, _, body) =
        lab.run_in(lab.node(1).namespace_name(), || svcplane_ops::http::get(address, "/metrics")).ok()?.ok()?;
    body.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Opens `count` connections through the relay, each proven by an echo, and holds them.
fn hold(lab: &Lab, client: &str, proxy: &Proxy, count: usize) -> anyhow::Result<Held> {
    let rss_idle_kib = proxy.rss_kib()?;
    let target = SocketAddr::new(IpAddr::V4(SERVICE_IP), 81);
    let started = Instant::now();
    let (streams, refused) = lab.run_in(client, || -> anyhow::Result<(Vec<TcpStream>, usize)> {
        let mut streams = Vec::with_capacity(count);
        let mut refused = 0;
        for _ in 0..count {
            ensure!(started.elapsed() < PHASE_LIMIT, "holding took longer than {PHASE_LIMIT:?}");
            let opened = TcpStream::connect_timeout(&target, Duration::from_secs(2)).and_then(|mut stream| {
                stream.set_read_timeout(Some(Duration::from_secs(2)))?;
                echo_once(&mut stream)?;
                Ok(stream)
            });
            match opened {
                Ok(stream) => streams.push(stream),
                // A refusal is a reset at once, never a wait; anything else is a failure.
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
                    ) =>
                {
                    refused += 1;
                }
                Err(error) => bail!("connection {} of {count}: {error}", streams.len() + refused + 1),
            }
        }
        Ok((streams, refused))
    })??;
    let took = started.elapsed();
    eprintln!("held {} of {count}, {refused} refused, in {took:?}", streams.len());
    std::thread::sleep(Duration::from_millis(500));
    let held = Held {
        opened: streams.len(),
        refused,
        took,
        rss_idle_kib,
        rss_held_kib: proxy.rss_kib()?,
        active: metric(lab, "svcplane_userspace_active_connections"),
        fd_budget: metric(lab, "svcplane_userspace_file_descriptors{kind=\"budget\"}"),
        refused_fds: metric(lab, "svcplane_userspace_refused_total{reason=\"file_descriptors\"}"),
        small_pipes: metric(lab, "svcplane_userspace_pipes_not_enlarged_total"),
    };
    drop(streams);
    Ok(held)
}

fn main() -> anyhow::Result<()> {
    if std::env::var_os(SERVER_ROLE).is_some() {
        return run_servers();
    }
    let args = parse_args()?;
    let limit = raise_fd_limit();
    let lab = Lab::builder().nodes(1).pod(1, "server").pod(1, "client").build()?;
    let dir = std::env::temp_dir().join(format!("svcp-ubench-{}", std::process::id()));
    let result = run(&args, &lab, &dir, limit);
    let _ = std::fs::remove_dir_all(&dir);
    lab.teardown()?;
    let out = result?;
    if let Some(path) = &args.markdown {
        std::fs::write(path, &out).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{out}");
    Ok(())
}

fn run(args: &Args, lab: &Lab, dir: &Path, limit: u64) -> anyhow::Result<String> {
    let server = lab.pod("server").ip_v4();
    let client = lab.pod("client").namespace_name().to_owned();
    let mut servers = Servers::start(lab, "server")?;
    manifests(&dir.join("manifests"), server)?;
    let mut rows = Vec::new();
    let mut held = None;
    for mode in ["nftables", "userspace"] {
        eprintln!("== {mode} mode");
        servers.check()?;
        let proxy = Proxy::start(lab, mode, &dir.join("manifests"), &dir.join(format!("proxy-{mode}.log")))?;
        let measured = wait_programmed(lab, &client).and_then(|programmed| {
            eprintln!("programmed after {programmed:?}");
            paired(lab, &client, server, args)
        });
        let measured = measured.and_then(|paths| {
            if mode == "userspace" {
                held = Some(hold(lab, &client, &proxy, args.hold)?);
            }
            Ok(paths)
        });
        let log = std::fs::read_to_string(dir.join(format!("proxy-{}.log", proxy.mode))).unwrap_or_default();
        proxy.stop(lab)?;
        let measured = measured.with_context(|| format!("{mode} mode; the proxy's log:\n{log}"))?;
        rows.push((mode, measured));
    }

    let mut out = String::new();
    writeln!(
        out,
        "#### TCP through a ClusterIP: `svcplane proxy` in userspace and in nftables mode, one pod behind it ({} connects per path, {} MiB bulk per path, {ROUNDS} alternating rounds)\n",
        args.connects, args.bulk_mib
    )?;
    writeln!(
        out,
        "| path | connect p50 / p99 | connect + 1-byte echo p50 / p99 | bulk stream | vs direct (p50 connect, p50 echo, stream) |"
    )?;
    writeln!(out, "| --- | ---: | ---: | ---: | ---: |")?;
    let gib = |bytes: f64| bytes / f64::from(1u32 << 30);
    let mut nftables_p = None;
    for (mode, (through, straight)) in &mut rows {
        let (t50, e50) = through.p(0.5);
        let (t99, e99) = through.p(0.99);
        let (d50, de50) = straight.p(0.5);
        let (d99, de99) = straight.p(0.99);
        for (label, (h50, h99, f50, f99, stream), ratio) in [
            (format!("ClusterIP, {mode} mode"), (t50, t99, e50, e99, through.stream), true),
            (format!("direct to the pod (same rounds as {mode})"), (d50, d99, de50, de99, straight.stream), false),
        ] {
            let ratios = if ratio {
                format!(
                    "{:.2}, {:.2}, **{:.3}**",
                    h50.as_secs_f64() / d50.as_secs_f64(),
                    f50.as_secs_f64() / de50.as_secs_f64(),
                    stream / straight.stream
                )
            } else {
                "1".to_owned()
            };
            let line = format!(
                "| {label} | {} / {} | {} / {} | {:.2} GiB/s | {ratios} |",
                show(h50),
                show(h99),
                show(f50),
                show(f99),
                gib(stream)
            );
            eprintln!("{line}");
            writeln!(out, "{line}")?;
        }
        if *mode == "nftables" {
            nftables_p = Some((t50, t99, e50, e99));
        } else if let Some((n50, n99, ne50, ne99)) = nftables_p {
            writeln!(
                out,
                "\nuserspace / nftables: connect p50 {:.2}, p99 {:.2}; connect + echo p50 {:.2}, p99 {:.2}\n",
                t50.as_secs_f64() / n50.as_secs_f64(),
                t99.as_secs_f64() / n99.as_secs_f64(),
                e50.as_secs_f64() / ne50.as_secs_f64(),
                e99.as_secs_f64() / ne99.as_secs_f64(),
            )?;
        }
    }
    if let Some(held) = held {
        let grown = held.rss_held_kib.saturating_sub(held.rss_idle_kib);
        writeln!(
            out,
            "#### {} connections through the relay at once (userspace mode)\n\n\
             | asked | held (echoed end to end) | refused at once | opened in | proxy RSS idle | proxy RSS holding | per held connection | relay's active gauge | relay's descriptor budget | refused for descriptors (metric) |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n\
             | {} | {} | {} | {:.1} s | {:.1} MiB | {:.1} MiB | {:.2} KiB | {} | {} | {} |\n\n\
             Descriptor limit of the benchmark (inherited by the proxy): {limit}. Pipes the kernel \
             kept below 1 MiB during the run (`svcplane_userspace_pipes_not_enlarged_total`): {}.\n",
            args.hold,
            args.hold,
            held.opened,
            held.refused,
            held.took.as_secs_f64(),
            held.rss_idle_kib as f64 / 1024.0,
            held.rss_held_kib as f64 / 1024.0,
            grown as f64 / held.opened.max(1) as f64,
            held.active.map_or("?".into(), |v| format!("{v}")),
            held.fd_budget.map_or("?".into(), |v| format!("{v}")),
            held.refused_fds.map_or("?".into(), |v| format!("{v}")),
            held.small_pipes.map_or("?".into(), |v| format!("{v}")),
        )?;
    }
    Ok(out)
}
