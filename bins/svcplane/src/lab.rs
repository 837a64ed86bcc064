//! `svcplane lab`: a throwaway network-namespace sandbox (one node, three echo pods, one
//! external client) running the real proxy from the example manifests, with a bounded
//! number of requests through the ClusterIP and the NodePort. Removed when it ends.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use svcplane_core::{IpFamily, Protocol, ServiceType};
use svcplane_testbed::{Lab, ProbeError};

use crate::cli::{EchoArgs, LabArgs, Mode, SourceArgs};
use crate::feeds;

/// The example manifests, embedded so the lab runs from any directory.
const EXAMPLE_MANIFESTS: &[(&str, &str)] = &[
    ("services.yaml", include_str!("../../../examples/lab/services.yaml")),
    ("pods.yaml", include_str!("../../../examples/lab/pods.yaml")),
    ("node.yaml", include_str!("../../../examples/lab/node.yaml")),
];
const SERVICE_CIDR: &str = "198.19.0.0/16";
const CLUSTER_CIDR: &str = "198.18.128.0/17";
const ECHO_PORT: u16 = 8080;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const PROXY_READY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn echo(args: &EchoArgs) -> anyhow::Result<()> {
    svcplane_testbed::serve_echo(&args.name, &svcplane_testbed::wildcard_addrs(args.port), None)
        .with_context(|| format!("echo server {} on port {}", args.name, args.port))
}

/// One frontend of the example Service as the lab exercises it.
struct Target {
    label: String,
    from_namespace: String,
    from_label: String,
    address: SocketAddr,
    protocol: Protocol,
}

pub fn run(args: &LabArgs) -> anyhow::Result<()> {
    let manifests = write_manifests()?;
    let source = SourceArgs {
        manifests: Some(manifests.path().to_owned()),
        kubeconfig: None,
        service_cidrs: vec![SERVICE_CIDR.parse()?],
        node_port_range: "30000-32767".into(),
        allocations_file: None,
    };
    // The proxy allocates the same way from the same manifests, so the lab can know the
    // ClusterIP and NodePort without asking it.
    let mut state = svcplane_core::ClusterState::new();
    for change in feeds::read_changes(&source, "node1")? {
        state.apply(change);
    }
    let service = state.services().next().context("the example manifests hold no Service")?.clone();

    let lab = Lab::builder()
        .nodes(1)
        .pod(1, "echo-0")
        .pod(1, "echo-1")
        .pod(1, "echo-2")
        .clients(1)
        .node_cgroups(args.mode == Mode::Ebpf)
        .build()
        .context("building the lab (needs root)")?;
    let program = std::env::current_exe().context("locating the svcplane binary")?;
    lab.start_echo_in_all_pods(ECHO_PORT, &program)?;
    lab.route_cluster_ranges_via(1, 1)?;
    let node = lab.node(1);
    let client = lab.client(1);
    println!("lab {}: node1 {} with pods:", lab.prefix(), node.ip_v4());
    for pod in lab.pods() {
        println!("  {:<8} {}", pod.name(), pod.ip_v4());
    }
    println!("external client {}", client.ip_v4());

    let bpf_root = manifests.path().join("bpf");
    let mut proxy_args: Vec<std::ffi::OsString> = [
        program.as_os_str(),
        "proxy".as_ref(),
        "--mode".as_ref(),
        mode_name(args.mode).as_ref(),
        "--manifests".as_ref(),
        manifests.path().as_os_str(),
        "--node-name".as_ref(),
        "node1".as_ref(),
        "--node-ip".as_ref(),
        node.ip_v4().to_string().as_ref(),
        "--cluster-cidr".as_ref(),
        CLUSTER_CIDR.as_ref(),
        "--service-cidr".as_ref(),
        SERVICE_CIDR.as_ref(),
    ]
    .map(std::ffi::OsStr::to_owned)
    .to_vec();
    let mut proxy = if let Some(cgroup) = lab.node_cgroup(1) {
        // eBPF mode: the node's cgroup holds the lab's probes of node1 and its pods; the
        // proxy keeps our mounts, so the bpffs it mounts for its pins is ours to remove.
        proxy_args.extend(["--cgroup-path".into(), cgroup.into(), "--bpf-root".into(), bpf_root.clone().into()]);
        let mut command = lab.command_sharing_mounts(node.namespace_name(), &proxy_args)?;
        command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
        command.spawn().context("starting svcplane proxy")?
    } else {
        lab.spawn(node.namespace_name(), &proxy_args)?
    };

    let cluster_ip = service
        .cluster_ips
        .iter()
        .copied()
        .find(|ip| IpFamily::of(ip) == IpFamily::V4)
        .context("the example Service has no IPv4 ClusterIP")?;
    let mut targets = Vec::new();
    for port in &service.ports {
        targets.push(Target {
            label: format!("ClusterIP {cluster_ip}:{}/{}", port.port, port.protocol),
            from_namespace: node.namespace_name().to_owned(),
            from_label: "node1 itself".into(),
            address: SocketAddr::new(cluster_ip, port.port),
            protocol: port.protocol,
        });
        // A pod behind the Service itself: when it draws itself, hairpin masquerade makes it
        // see the node as the client.
        let first_pod = &lab.pods()[0];
        targets.push(Target {
            label: format!("ClusterIP {cluster_ip}:{}/{}", port.port, port.protocol),
            from_namespace: first_pod.namespace_name().to_owned(),
            from_label: format!("pod {}", first_pod.name()),
            address: SocketAddr::new(cluster_ip, port.port),
            protocol: port.protocol,
        });
        if service.service_type != ServiceType::ClusterIp
            && let Some(node_port) = port.node_port
        {
            let (from_namespace, from_label) = (client.namespace_name().to_owned(), "the external client".to_owned());
            targets.push(Target {
                label: format!("NodePort {}:{node_port}/{}", node.ip_v4(), port.protocol),
                from_namespace,
                from_label,
                address: SocketAddr::new(IpAddr::V4(node.ip_v4()), node_port),
                protocol: port.protocol,
            });
        }
    }

    wait_until_programmed(&lab, &targets[0])?;
    println!("\nService {} programmed by `svcplane proxy --mode {}` in node1\n", service.name, mode_name(args.mode));
    let mut all_answered = true;
    for target in &targets {
        let mut by_pod: BTreeMap<String, (u32, IpAddr)> = BTreeMap::new();
        let mut failures = 0;
        for _ in 0..args.requests {
            match probe(&lab, target) {
                Ok(reply) => {
                    let entry = by_pod.entry(reply.server_name).or_insert((0, reply.client_addr.ip()));
                    entry.0 += 1;
                }
                Err(_) => failures += 1,
            }
        }
        println!("{} from {}: {} requests", target.label, target.from_label, args.requests);
        for (pod, (count, source)) in &by_pod {
            println!("  {pod:<8} answered {count:>4} times, seeing the client as {source}");
        }
        if failures > 0 {
            println!("  {failures} requests failed");
        }
        all_answered &= by_pod.len() == lab.pods().len() && failures == 0;
    }

    if args.keep {
        println!("\n--keep: the lab stays until Ctrl-C (namespaces start with {})", lab.prefix());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGINT, std::sync::Arc::clone(&stop))?;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let _ = proxy.kill();
    let _ = proxy.wait();
    if bpf_root.exists() {
        let cleanup = [program.as_os_str(), "cleanup".as_ref(), "--bpf-root".as_ref(), bpf_root.as_os_str()];
        let status = lab.command_sharing_mounts(node.namespace_name(), &cleanup)?.status()?;
        if !status.success() {
            bail!("svcplane cleanup --bpf-root {} failed ({status})", bpf_root.display());
        }
    }
    lab.teardown()?;
    println!("\nlab removed");
    if !all_answered {
        bail!("not every pod answered on every frontend");
    }
    Ok(())
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Nftables => "nftables",
        Mode::Iptables => "iptables",
        Mode::Ebpf => "ebpf",
        Mode::Ipvs => "ipvs",
        Mode::Userspace => "userspace",
    }
}

fn probe(lab: &Lab, target: &Target) -> Result<svcplane_testbed::EchoReply, ProbeError> {
    match target.protocol {
        Protocol::Udp => lab.udp_request(&target.from_namespace, target.address, REQUEST_TIMEOUT, None),
        Protocol::Tcp | Protocol::Sctp => lab.tcp_request(&target.from_namespace, target.address, REQUEST_TIMEOUT),
    }
}

/// Probes the first frontend until it answers: the proxy has read the manifests and
/// written its rules.
fn wait_until_programmed(lab: &Lab, target: &Target) -> anyhow::Result<()> {
    let deadline = Instant::now() + PROXY_READY_TIMEOUT;
    loop {
        match probe(lab, target) {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() >= deadline => {
                bail!("{} did not answer within {PROXY_READY_TIMEOUT:?}: {error}", target.label)
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The example manifests in a fresh temporary directory.
fn write_manifests() -> anyhow::Result<TempDir> {
    let dir = TempDir::new("svcplane-lab")?;
    for (name, text) in EXAMPLE_MANIFESTS {
        std::fs::write(dir.path().join(name), text).with_context(|| format!("writing {name}"))?;
    }
    Ok(dir)
}

/// A directory removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
