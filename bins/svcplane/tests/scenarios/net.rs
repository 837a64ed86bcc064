//! Probes and small servers the testbed does not offer, all inside lab namespaces: requests
//! from a chosen source address or to loopback, SCTP, connections that stay open, and the
//! health-check HTTP request. Sockets are created inside the namespace (their namespace is
//! fixed then) and may be used from any thread afterwards.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, SockAddr, Socket, Type};
use svcplane_testbed::{EchoReply, Lab, ProbeError};

use super::Protocol;

/// What a probe sends.
const PAYLOAD: &[u8] = b"svcplane-probe\n";
const MAX_REPLY: usize = 4096;

/// How a probe failed, as far as the rows care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// TCP reset or ICMP port unreachable.
    Refused,
    /// Nothing came back in time.
    TimedOut,
    /// The sender's own node dropped it and told the sender (`EPERM`).
    DroppedLocally,
    /// Anything else, described.
    Other(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused => f.write_str("refused"),
            Failure::TimedOut => f.write_str("no answer in time"),
            Failure::DroppedLocally => f.write_str("dropped by the sending node (EPERM)"),
            Failure::Other(text) => f.write_str(text),
        }
    }
}

impl From<ProbeError> for Failure {
    fn from(error: ProbeError) -> Self {
        if error.is_refused() {
            Failure::Refused
        } else if error.is_timed_out() {
            Failure::TimedOut
        } else if error.kind() == svcplane_testbed::ProbeErrorKind::DroppedLocally {
            Failure::DroppedLocally
        } else {
            Failure::Other(error.to_string())
        }
    }
}

fn io_failure(step: &str, error: &std::io::Error) -> Failure {
    match error.kind() {
        ErrorKind::ConnectionRefused => Failure::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Failure::TimedOut,
        ErrorKind::PermissionDenied => Failure::DroppedLocally,
        _ => Failure::Other(format!("{step}: {error}")),
    }
}

fn left(deadline: Instant) -> Result<Duration, Failure> {
    deadline.checked_duration_since(Instant::now()).filter(|d| *d >= Duration::from_millis(1)).ok_or(Failure::TimedOut)
}

/// Linux's `IPPROTO_SCTP`.
const IPPROTO_SCTP: i32 = 132;

fn stream_socket(protocol: Protocol, target: SocketAddr) -> Result<Socket, Failure> {
    let transport = match protocol {
        Protocol::Tcp => socket2::Protocol::TCP,
        Protocol::Sctp => socket2::Protocol::from(IPPROTO_SCTP),
        Protocol::Udp => unreachable!("UDP is not a stream"),
    };
    Socket::new(Domain::for_address(target), Type::STREAM, Some(transport))
        .map_err(|error| Failure::Other(format!("creating a {protocol} socket: {error}")))
}

/// Reads one reply line (or everything until the peer closes) before `deadline`.
fn read_line(
    socket: &mut impl Read,
    set_timeout: impl Fn(Duration) -> std::io::Result<()>,
    deadline: Instant,
) -> Result<String, Failure> {
    let mut reply = Vec::new();
    let mut chunk = [0u8; 1024];
    while !reply.contains(&b'\n') && reply.len() < MAX_REPLY {
        set_timeout(left(deadline)?).map_err(|e| io_failure("set timeout", &e))?;
        match socket.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(io_failure("receive", &error)),
        }
    }
    if reply.is_empty() {
        return Err(Failure::Other("the connection closed without a reply".to_owned()));
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

fn parse(text: &str) -> Result<EchoReply, Failure> {
    EchoReply::parse(text.lines().next().unwrap_or_default())
        .ok_or_else(|| Failure::Other(format!("not an echo reply: {text:?}")))
}

/// One request from the calling thread's namespace: `source` fixes the source address
/// (and/or port), for protocols and targets the testbed's probes do not cover.
pub fn request_here(
    protocol: Protocol,
    target: SocketAddr,
    source: Option<SocketAddr>,
    timeout: Duration,
) -> Result<EchoReply, Failure> {
    let deadline = Instant::now() + timeout;
    match protocol {
        Protocol::Udp => {
            let local = source.unwrap_or_else(|| unspecified(target, 0));
            let socket = UdpSocket::bind(local).map_err(|e| Failure::Other(format!("binding {local}: {e}")))?;
            socket.connect(target).map_err(|e| io_failure("connect", &e))?;
            socket.send(PAYLOAD).map_err(|e| io_failure("send", &e))?;
            let mut reply = [0u8; MAX_REPLY];
            loop {
                socket.set_read_timeout(Some(left(deadline)?)).map_err(|e| io_failure("set timeout", &e))?;
                match socket.recv(&mut reply) {
                    Ok(n) => return parse(&String::from_utf8_lossy(&reply[..n])),
                    Err(error) if error.kind() == ErrorKind::Interrupted => {}
                    Err(error) => return Err(io_failure("receive", &error)),
                }
            }
        }
        Protocol::Tcp | Protocol::Sctp => {
            let mut socket = stream_socket(protocol, target)?;
            if let Some(source) = source {
                socket.set_reuse_address(true).map_err(|e| io_failure("reuse address", &e))?;
                socket.bind(&source.into()).map_err(|e| Failure::Other(format!("binding {source}: {e}")))?;
            }
            socket.connect_timeout(&target.into(), timeout).map_err(|e| io_failure("connect", &e))?;
            socket.set_write_timeout(Some(left(deadline)?)).map_err(|e| io_failure("set timeout", &e))?;
            socket.write_all(PAYLOAD).map_err(|e| io_failure("send", &e))?;
            let timeouts = socket.try_clone().map_err(|e| io_failure("clone", &e))?;
            let text = read_line(&mut socket, |d| timeouts.set_read_timeout(Some(d)), deadline)?;
            parse(&text)
        }
    }
}

pub fn unspecified(like: SocketAddr, port: u16) -> SocketAddr {
    match like {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
    }
}

/// One request from inside `namespace`. Plain TCP and UDP to lab addresses go through the
/// testbed's probes; a fixed source address, SCTP or a loopback target through
/// [`request_here`].
pub fn request(
    lab: &Lab,
    namespace: &str,
    protocol: Protocol,
    target: SocketAddr,
    source: Option<SocketAddr>,
    timeout: Duration,
) -> Result<EchoReply, Failure> {
    let source_address_fixed = source.is_some_and(|s| !s.ip().is_unspecified());
    let lab_target = svcplane_testbed::address_plan::is_lab_address(target.ip());
    match protocol {
        Protocol::Tcp if source.is_none() && lab_target => Ok(lab.tcp_request(namespace, target, timeout)?),
        Protocol::Udp if !source_address_fixed && lab_target => {
            Ok(lab.udp_request(namespace, target, timeout, source.map(|s| s.port()))?)
        }
        _ => {
            if !lab_target && !target.ip().is_loopback() {
                return Err(Failure::Other(format!("{target} is outside the lab's address plan")));
            }
            lab.run_in(namespace, move || request_here(protocol, target, source, timeout))
                .unwrap_or_else(|error| Err(Failure::Other(format!("entering {namespace}: {error}"))))
        }
    }
}

/// Whether this kernel can open SCTP sockets at all (no module loading is attempted).
pub fn sctp_supported() -> Result<(), String> {
    match Socket::new(Domain::IPV4, Type::STREAM, Some(socket2::Protocol::from(IPPROTO_SCTP))) {
        Ok(_) => Ok(()),
        Err(error) => Err(format!("socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails: {error}")),
    }
}

/// `GET /healthz` over HTTP/1.1 from inside `namespace`: the status code and the body.
pub fn http_get(lab: &Lab, namespace: &str, target: SocketAddr, timeout: Duration) -> Result<(u16, String), Failure> {
    if !svcplane_testbed::address_plan::is_lab_address(target.ip()) {
        return Err(Failure::Other(format!("{target} is outside the lab's address plan")));
    }
    let work = move || -> Result<(u16, String), Failure> {
        let deadline = Instant::now() + timeout;
        let mut stream = TcpStream::connect_timeout(&target, timeout).map_err(|e| io_failure("connect", &e))?;
        stream.set_write_timeout(Some(left(deadline)?)).map_err(|e| io_failure("set timeout", &e))?;
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).map_err(|e| io_failure("send", &e))?;
        let mut response = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            stream.set_read_timeout(Some(left(deadline)?)).map_err(|e| io_failure("set timeout", &e))?;
            match stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => response.extend_from_slice(&chunk[..n]),
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => return Err(io_failure("receive", &error)),
            }
        }
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| Failure::Other(format!("not an HTTP response: {text:?}")))?;
        let body = text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
        Ok((status, body))
    };
    lab.run_in(namespace, work).unwrap_or_else(|error| Err(Failure::Other(format!("entering {namespace}: {error}"))))
}

/// A connection that stays open: each [`Conversation::ask`] sends one line and reads the
/// server's one-line answer (from a [`LineServers`] server: `<name> <client>`).
#[derive(Debug)]
pub struct Conversation {
    socket: Socket,
    pub target: SocketAddr,
}

impl Conversation {
    pub fn open(
        lab: &Lab,
        namespace: &str,
        protocol: Protocol,
        target: SocketAddr,
        timeout: Duration,
    ) -> Result<Self, Failure> {
        let work = move || -> Result<Socket, Failure> {
            let socket = stream_socket(protocol, target)?;
            socket.connect_timeout(&target.into(), timeout).map_err(|e| io_failure("connect", &e))?;
            Ok(socket)
        };
        let socket = lab
            .run_in(namespace, work)
            .unwrap_or_else(|error| Err(Failure::Other(format!("entering {namespace}: {error}"))))?;
        Ok(Self { socket, target })
    }

    pub fn ask(&mut self, timeout: Duration) -> Result<EchoReply, Failure> {
        let deadline = Instant::now() + timeout;
        self.socket.set_write_timeout(Some(left(deadline)?)).map_err(|e| io_failure("set timeout", &e))?;
        self.socket.write_all(PAYLOAD).map_err(|e| io_failure("send", &e))?;
        let timeouts = self.socket.try_clone().map_err(|e| io_failure("clone", &e))?;
        let text = read_line(&mut self.socket, |d| timeouts.set_read_timeout(Some(d)), deadline)?;
        parse(&text)
    }
}

/// Line servers in lab pods, run by threads of the test process: every line a client sends
/// is answered with `<pod name> <client address>`, and the connection stays open until the
/// client closes it. Used for connections that must outlive a rules change (TCP) and as the
/// SCTP echo server. Stopped (threads joined) on drop.
#[derive(Debug)]
pub struct LineServers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl LineServers {
    /// Starts a server on `port` on both addresses of each pod.
    pub fn start(lab: &Lab, pods: &[&str], protocol: Protocol, port: u16) -> Result<Self, String> {
        let mut servers = Self { stop: Arc::new(AtomicBool::new(false)), threads: Vec::new() };
        for &pod in pods {
            let lab_pod = lab.try_pod(pod).map_err(|e| e.to_string())?;
            for ip in lab_pod.ips() {
                let address = SocketAddr::new(ip, port);
                let listener = lab
                    .run_in(lab_pod.namespace_name(), move || listen(protocol, address))
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("{protocol} server of {pod} on {address}: {e}"))?;
                let stop = Arc::clone(&servers.stop);
                let name = pod.to_owned();
                servers.threads.push(
                    std::thread::Builder::new()
                        .name(format!("line-{pod}"))
                        .spawn(move || serve(&listener, &name, &stop))
                        .map_err(|e| e.to_string())?,
                );
            }
        }
        Ok(servers)
    }
}

impl Drop for LineServers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn listen(protocol: Protocol, address: SocketAddr) -> std::io::Result<Socket> {
    let transport = match protocol {
        Protocol::Sctp => socket2::Protocol::from(IPPROTO_SCTP),
        _ => socket2::Protocol::TCP,
    };
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, Some(transport))?;
    socket.set_reuse_address(true)?;
    if address.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&SockAddr::from(address))?;
    socket.listen(64)?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn serve(listener: &Socket, name: &str, stop: &Arc<AtomicBool>) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((socket, peer)) => {
                let Some(peer) = peer.as_socket() else { continue };
                let stop = Arc::clone(stop);
                let name = name.to_owned();
                if let Ok(thread) = std::thread::Builder::new()
                    .name("line-conn".to_owned())
                    .spawn(move || converse(socket, &name, peer, &stop))
                {
                    connections.push(thread);
                }
            }
            Err(error) if error.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    for connection in connections {
        let _ = connection.join();
    }
}

fn converse(mut socket: Socket, name: &str, peer: SocketAddr, stop: &AtomicBool) {
    let _ = socket.set_nonblocking(false);
    let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
    let line = svcplane_testbed::echo::reply_line(name, peer);
    let mut pending = Vec::new();
    let mut chunk = [0u8; 1024];
    while !stop.load(Ordering::Relaxed) {
        match socket.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                pending.extend_from_slice(&chunk[..n]);
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    pending.drain(..=end);
                    if socket.write_all(line.as_bytes()).is_err() {
                        return;
                    }
                }
            }
            Err(error)
                if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    let _ = socket.shutdown(Shutdown::Both);
}
