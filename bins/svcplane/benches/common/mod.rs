//! What the kernel-mode benchmarks share (`ebpf.rs`, `ipvs.rs`, and the guest batch's smoke
//! test of the IPVS benchmark): the fixed synthetic cluster (S ClusterIP Services x E
//! ready endpoints), timing and percentile helpers, and TCP connects through a ClusterIP
//! compared with straight to the pod inside a lab.
//!
//! Each user includes only what it needs, so unused items are allowed here.

#![allow(dead_code, reason = "each benchmark uses its own part of the shared helpers")]

pub mod modes;

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use anyhow::Context as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use svcplane_core::{
    Change, ClusterState, Endpoint, EndpointPort, EndpointSlice, IpFamily, NamespacedName, NodeConfig, Protocol,
    Service, ServicePort,
};
use svcplane_testbed::Lab;

pub const CLUSTER_CIDR: &str = "198.18.128.0/17";
pub const CLUSTER_CIDR_V6: &str = "2001:db8:1::/48";
/// IPv4 ClusterIPs for the first Services, IPv6 above (198.19.0.0/16 holds 65k).
pub const V4_SERVICES: usize = 60_000;
pub const POD_ADDRESSES: u32 = 32_000;
pub const TARGET_PORT: u16 = 8080;
/// One connect's limit: a SYN lost on the way is retransmitted after 1 s, then 3 s.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The ClusterIP of the Service a lab connects through.
pub const LAB_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 250);

// ---------------------------------------------------------------------------------------
// Fixed inputs: S ClusterIP Services x E ready endpoints spread over 10 nodes.

pub fn service_ip(s: usize) -> IpAddr {
    if s < V4_SERVICES {
        IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + s as u32 + 1))
    } else {
        IpAddr::V6(Ipv6Addr::from(u128::from(Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, 0, 0, 0, 0)) + s as u128))
    }
}

pub fn pod_ip(s: usize, e: usize, endpoints: usize, family: IpFamily) -> IpAddr {
    let index = (s * endpoints + e) as u32 % POD_ADDRESSES + 1;
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + index)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(
            u128::from(Ipv6Addr::new(0x2001, 0xdb8, 1, 0xff, 0, 0, 0, 0)) + u128::from(index),
        )),
    }
}

pub fn tcp_port(name: &str, port: u16) -> ServicePort {
    ServicePort { name: name.into(), protocol: Protocol::Tcp, port, node_port: None }
}

pub fn slice(service: &NamespacedName, family: IpFamily, addresses: &[IpAddr]) -> EndpointSlice {
    EndpointSlice {
        last_change_trigger: None,
        name: NamespacedName::new(&service.namespace, format!("{}-slice", service.name)),
        service: service.clone(),
        family,
        ports: vec![EndpointPort { name: "http".into(), protocol: Protocol::Tcp, port: TARGET_PORT }],
        endpoints: addresses.iter().map(|ip| Endpoint::ready(*ip, Some("node2"))).collect(),
    }
}

/// The synthetic cluster: `services` Services, each with `endpoints` endpoints.
pub fn synthetic(services: usize, endpoints: usize) -> ClusterState {
    let mut state = ClusterState::new();
    for s in 0..services {
        let name = NamespacedName::new("bench", format!("svc-{s}"));
        let ip = service_ip(s);
        let family = IpFamily::of(&ip);
        state.apply(Change::ServiceUpserted(Service::cluster_ip(name.clone(), vec![ip], vec![tcp_port("http", 80)])));
        let addresses: Vec<IpAddr> = (0..endpoints).map(|e| pod_ip(s, e, endpoints, family)).collect();
        state.apply(Change::SliceUpserted(slice(&name, family, &addresses)));
    }
    state
}

/// Adds the Service a lab connects through: [`LAB_SERVICE_IP`] port 80 to `server`.
pub fn add_lab_service(state: &mut ClusterState, server: SocketAddr) {
    let name = NamespacedName::new("bench", "target");
    state.apply(Change::ServiceUpserted(Service::cluster_ip(
        name.clone(),
        vec![IpAddr::V4(LAB_SERVICE_IP)],
        vec![tcp_port("http", 80)],
    )));
    state.apply(Change::SliceUpserted(slice(&name, IpFamily::V4, &[server.ip()])));
}

pub fn node_config(node_ips: Vec<IpAddr>) -> NodeConfig {
    NodeConfig {
        node_name: "node1".into(),
        node_ips,
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap(), CLUSTER_CIDR_V6.parse().unwrap()],
        ..NodeConfig::default()
    }
}

/// The address endpoint 0 of a Service moves to in change number `round`.
pub fn moved_address(family: IpFamily, round: usize) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(198, 18, 254, (round % 250) as u8 + 1)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0xfe, 0, 0, 0, round as u16 + 1)),
    }
}

/// Moves endpoint 0 of Service `s` to [`moved_address`]: one EndpointSlice event.
pub fn endpoint_change(state: &mut ClusterState, s: usize, endpoints: usize, round: usize) {
    let name = NamespacedName::new("bench", format!("svc-{s}"));
    let family = IpFamily::of(&service_ip(s));
    let mut addresses: Vec<IpAddr> = (0..endpoints).map(|e| pod_ip(s, e, endpoints, family)).collect();
    addresses[0] = moved_address(family, round);
    state.apply(Change::SliceUpserted(slice(&name, family, &addresses)));
}

// ---------------------------------------------------------------------------------------
// Measurements

pub fn time<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let started = Instant::now();
    let value = f();
    (started.elapsed(), value)
}

pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

pub fn show(d: Duration) -> String {
    let micros = d.as_secs_f64() * 1e6;
    if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 1_000_000.0 {
        format!("{:.2} ms", micros / 1000.0)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}

// ---------------------------------------------------------------------------------------
// Connections through a ClusterIP in a lab.

/// A TCP server in a pod: accepts and reads each connection to its end, then closes it,
/// until the stop flag (600 s at most).
///
/// It is built to stay out of the connect measurements' way: the accept loop blocks (a
/// 100 ms timeout to see the stop flag) instead of polling, and a connection whose client
/// has already closed it (every timed connect) is closed at once, with no thread of its
/// own; only a connection still sending (a stream) gets a reading thread.
pub fn serve(lab: &Lab, pod: &str, stop: Arc<AtomicBool>) -> anyhow::Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let namespace = lab.pod(pod).namespace_name();
    // A long accept queue: under emulation the accept loop can fall behind a burst of
    // connects, and a full queue drops SYNs (a 1 s retransmission, not the dataplane).
    let listener = lab.run_in(namespace, || -> std::io::Result<TcpListener> {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        socket.set_reuse_address(true)?;
        socket.bind(&SocketAddr::from(([0, 0, 0, 0], TARGET_PORT)).into())?;
        socket.listen(4096)?;
        // accept() honours the receive timeout.
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        Ok(socket.into())
    })??;
    let address = SocketAddr::new(IpAddr::V4(lab.pod(pod).ip_v4()), TARGET_PORT);
    let handle = std::thread::spawn(move || {
        // Off the CPU the timed connects and streams run on (`on_last_cpu`); the reading
        // threads it starts inherit this CPU.
        let _ = pin_to_cpu(0);
        let deadline = Instant::now() + Duration::from_secs(600);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let Ok((mut stream, _)) = listener.accept() else { continue };
            let mut buffer = [0u8; 1];
            if stream.set_nonblocking(true).is_ok() {
                match stream.peek(&mut buffer) {
                    // Closed (or reset) by its client already: dropped here.
                    Ok(0) => continue,
                    Err(error) if error.kind() != std::io::ErrorKind::WouldBlock => continue,
                    _ => {}
                }
            }
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; 1 << 16];
                while matches!(stream.read(&mut buffer), Ok(n) if n > 0) {}
            });
        }
    });
    Ok((address, handle))
}

/// `count` connects from `pod` to `target` (connect completed, then closed), timed, from
/// source ports `first_port`, `first_port + 1`, ... A caller gives each path ports of its
/// own: IPVS (NAT) takes a server's reply to a direct connection for one of its own
/// connections when the client's port matches one it already tracks, and rewrites it.
pub fn connects(
    lab: &Lab,
    pod: &str,
    target: SocketAddr,
    count: usize,
    first_port: u16,
) -> anyhow::Result<Vec<Duration>> {
    lab.run_in(pod, || -> anyhow::Result<Vec<Duration>> {
        let mut samples = Vec::with_capacity(count);
        for k in 0..count {
            let port = u16::try_from(usize::from(first_port) + k).context("source ports run out")?;
            let started = Instant::now();
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())?;
            socket
                .connect_timeout(&target.into(), CONNECT_TIMEOUT)
                .map_err(|error| anyhow::anyhow!("connect {} of {count} to {target}: {error}", k + 1))?;
            samples.push(started.elapsed());
            drop(socket);
        }
        Ok(samples)
    })?
}

/// [`connects`] to two targets interleaved one by one (which goes first alternating), so
/// both meet the same moments of the machine: a burst of scheduling noise lands on both
/// paths alike instead of on one block of one path's samples. Each socket is closed with
/// a reset once timed.
pub fn connects_interleaved(
    lab: &Lab,
    pod: &str,
    targets: [SocketAddr; 2],
    count: usize,
    first_ports: [u16; 2],
) -> anyhow::Result<[Vec<Duration>; 2]> {
    // On the last CPU, where the server's accept loop (pinned to the first) does not
    // preempt it.
    lab.run_in(pod, || on_last_cpu(|| connect_pairs(targets, count, first_ports)))?
}

/// Runs `work` with the calling thread pinned to the last CPU (where the server's threads,
/// pinned to the first, do not run), and gives the thread its affinity back after.
pub fn on_last_cpu<T>(work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let had = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    if cpus > 1 {
        pin_to_cpu(cpus - 1)?;
    }
    let result = work();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &had)?;
    result
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// The timed connects of [`connects_interleaved`], on the calling thread.
fn connect_pairs(targets: [SocketAddr; 2], count: usize, first_ports: [u16; 2]) -> anyhow::Result<[Vec<Duration>; 2]> {
    let mut samples = [Vec::with_capacity(count), Vec::with_capacity(count)];
    for k in 0..count {
        let order = if k % 2 == 0 { [0, 1] } else { [1, 0] };
        for path in order {
            let port = u16::try_from(usize::from(first_ports[path]) + k).context("source ports run out")?;
            let started = Instant::now();
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())?;
            socket
                .connect_timeout(&targets[path].into(), CONNECT_TIMEOUT)
                .map_err(|error| anyhow::anyhow!("connect {} of {count} to {}: {error}", k + 1, targets[path]))?;
            samples[path].push(started.elapsed());
            // Closed with a reset: no FIN exchange and no TIME_WAIT whose work would
            // land in the next connect's window (either path's, either mode's).
            socket.set_linger(Some(Duration::ZERO))?;
        }
    }
    Ok(samples)
}

/// Connect p50 and p99 through the Service and straight to the pod, measured alternately
/// in `rounds` rounds so both see the same machine.
#[derive(Debug, Clone, Copy)]
pub struct ConnectLatency {
    pub service: (Duration, Duration),
    pub direct: (Duration, Duration),
}

pub fn connect_latency(
    lab: &Lab,
    pod: &str,
    service: SocketAddr,
    direct: SocketAddr,
    count: usize,
    rounds: usize,
) -> anyhow::Result<ConnectLatency> {
    let (mut through, mut straight) = (Vec::new(), Vec::new());
    let per_round = count.div_ceil(rounds).max(1);
    anyhow::ensure!(per_round * rounds <= 12_000, "at most 12000 connects per path");
    for round in 0..rounds {
        // Source ports 20000-31999 through the Service, 40000-51999 straight to the pod.
        let offset = u16::try_from(round * per_round)?;
        through.extend(connects(lab, pod, service, per_round, 20_000 + offset)?);
        straight.extend(connects(lab, pod, direct, per_round, 40_000 + offset)?);
    }
    Ok(ConnectLatency {
        service: (percentile(&mut through, 0.5), percentile(&mut through, 0.99)),
        direct: (percentile(&mut straight, 0.5), percentile(&mut straight, 0.99)),
    })
}
