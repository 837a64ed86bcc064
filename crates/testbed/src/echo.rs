//! The echo server every lab pod runs: it answers with its own name and the client address it
//! saw, so a test can tell which backend answered and whether the source was preserved.
//!
//! Reply line: `<name> <client>\n`, where `<client>` is a [`SocketAddr`] as Rust prints it
//! (`198.18.129.1:40312`, `[2001:db8:1:1::1]:40312`).
//!
//! - TCP, HTTP client (`curl http://IP:PORT/`): an HTTP/1.0 `200 OK` response whose body is
//!   the reply line, with `Connection: close`.
//! - TCP, anything else (raw text, or nothing at all within half a second): the bare reply
//!   line, then the connection is closed.
//! - UDP: every datagram gets the reply line back, from the same socket.
//!
//! Blocking std sockets and threads; one thread polls all listening sockets, each TCP
//! connection gets a short-lived thread of its own.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt, socket, sockopt,
};

/// How long a connection may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to wait for the first byte before answering a silent client anyway.
const SILENT_CLIENT_WAIT: Duration = Duration::from_millis(500);
/// Largest request read before answering.
const MAX_REQUEST: usize = 16 * 1024;
/// Connections handled at once; more are closed straight away.
const MAX_CONNECTIONS: usize = 512;
/// Longest sleep of the poll loop, so a deadline or stop request is noticed quickly.
const POLL_SLICE: Duration = Duration::from_millis(200);

/// The echo server could not start.
#[derive(Debug, thiserror::Error)]
pub enum EchoError {
    /// Creating or configuring a socket failed.
    #[error("creating a {protocol} socket for {addr}: {source}")]
    CreateSocket {
        protocol: &'static str,
        addr: SocketAddr,
        #[source]
        source: nix::errno::Errno,
    },
    /// Binding to an address failed (in use? address not on this namespace?).
    #[error("binding {protocol} {addr}: {source}")]
    Bind {
        protocol: &'static str,
        addr: SocketAddr,
        #[source]
        source: nix::errno::Errno,
    },
    /// `poll(2)` failed.
    #[error("waiting for traffic: {source}")]
    Poll {
        #[source]
        source: nix::errno::Errno,
    },
    /// No address was given.
    #[error("no address to listen on")]
    NoAddress,
}

/// The addresses `serve_echo` is usually given: the IPv4 and IPv6 wildcards on `port`.
pub fn wildcard_addrs(port: u16) -> [SocketAddr; 2] {
    [SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port), SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)]
}

/// Answers on TCP and UDP on every address of `tcp_and_udp_addrs` as `name`, until
/// `deadline` has passed (forever with `None`). IPv6 sockets are IPv6-only, so pass both
/// wildcards (see [`wildcard_addrs`]) to serve both families on one port.
pub fn serve_echo(name: &str, tcp_and_udp_addrs: &[SocketAddr], deadline: Option<Duration>) -> Result<(), EchoError> {
    EchoServer::bind(name, tcp_and_udp_addrs)?.serve(deadline)
}

/// Bound echo sockets, not yet serving. Binding first and serving later lets a caller bind
/// inside a namespace (see [`crate::run_in_namespace`]) and serve from any thread.
#[derive(Debug)]
pub struct EchoServer {
    name: Arc<str>,
    listeners: Vec<TcpListener>,
    datagrams: Vec<UdpSocket>,
}

impl EchoServer {
    /// Binds a TCP listener and a UDP socket on every address.
    pub fn bind(name: &str, tcp_and_udp_addrs: &[SocketAddr]) -> Result<EchoServer, EchoError> {
        if tcp_and_udp_addrs.is_empty() {
            return Err(EchoError::NoAddress);
        }
        let mut listeners = Vec::new();
        let mut datagrams = Vec::new();
        for &addr in tcp_and_udp_addrs {
            let tcp = bound_socket(addr, SockType::Stream)?;
            listen(&tcp, Backlog::MAXCONN).map_err(|source| EchoError::Bind { protocol: "tcp", addr, source })?;
            listeners.push(TcpListener::from(tcp));
            // With port 0, serve UDP on the port TCP got, so one port answers both.
            let udp_addr = match listeners.last().and_then(|l| l.local_addr().ok()) {
                Some(bound) if addr.port() == 0 => bound,
                _ => addr,
            };
            datagrams.push(UdpSocket::from(bound_socket(udp_addr, SockType::Datagram)?));
        }
        Ok(EchoServer { name: Arc::from(name), listeners, datagrams })
    }

    /// The TCP addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners.iter().filter_map(|listener| listener.local_addr().ok()).collect()
    }

    /// Serves until `deadline` has passed (forever with `None`).
    pub fn serve(self, deadline: Option<Duration>) -> Result<(), EchoError> {
        self.serve_until(deadline, &AtomicBool::new(false))
    }

    /// Serves until `deadline` has passed or `stop` becomes true (checked every 200 ms).
    /// Connections already accepted finish on their own threads.
    pub fn serve_until(self, deadline: Option<Duration>, stop: &AtomicBool) -> Result<(), EchoError> {
        let ends_at = deadline.map(|limit| Instant::now() + limit);
        let active = Arc::new(AtomicUsize::new(0));
        let mut buffer = vec![0u8; 65536];
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let slice = match ends_at {
                Some(end) => {
                    let now = Instant::now();
                    if now >= end {
                        return Ok(());
                    }
                    (end - now).min(POLL_SLICE)
                }
                None => POLL_SLICE,
            };
            let timeout = PollTimeout::try_from(slice).unwrap_or(PollTimeout::ZERO);
            let (tcp_ready, udp_ready) = {
                let mut fds: Vec<PollFd<'_>> = self
                    .listeners
                    .iter()
                    .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN))
                    .chain(self.datagrams.iter().map(|u| PollFd::new(u.as_fd(), PollFlags::POLLIN)))
                    .collect();
                match poll(&mut fds, timeout) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(source) => return Err(EchoError::Poll { source }),
                }
                let ready: Vec<bool> = fds.iter().map(|fd| fd.any().unwrap_or(false)).collect();
                let (tcp, udp) = ready.split_at(self.listeners.len());
                (tcp.to_vec(), udp.to_vec())
            };
            for (listener, _) in self.listeners.iter().zip(tcp_ready).filter(|(_, r)| *r) {
                self.accept_all(listener, &active);
            }
            for (socket, _) in self.datagrams.iter().zip(udp_ready).filter(|(_, r)| *r) {
                self.answer_datagrams(socket, &mut buffer);
            }
        }
    }

    fn accept_all(&self, listener: &TcpListener, active: &Arc<AtomicUsize>) {
        // Bounded: at most one backlog's worth per wake-up, then back to poll.
        for _ in 0..64 {
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => {
                    eprintln!("echo {}: accept: {error}", self.name);
                    // Out of descriptors or similar: give the other threads time to finish.
                    thread::sleep(Duration::from_millis(10));
                    return;
                }
            };
            if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                drop(stream);
                continue;
            }
            active.fetch_add(1, Ordering::Relaxed);
            let name = Arc::clone(&self.name);
            let counter = Arc::clone(active);
            let spawned = thread::Builder::new().name("echo-conn".to_owned()).spawn(move || {
                answer_connection(&name, stream, peer);
                counter.fetch_sub(1, Ordering::Relaxed);
            });
            if spawned.is_err() {
                active.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn answer_datagrams(&self, socket: &UdpSocket, buffer: &mut [u8]) {
        for _ in 0..64 {
            match socket.recv_from(buffer) {
                Ok((_, peer)) => {
                    let line = reply_line(&self.name, peer);
                    if let Err(error) = socket.send_to(line.as_bytes(), peer) {
                        eprintln!("echo {}: udp reply to {peer}: {error}", self.name);
                    }
                }
                Err(error) if error.kind() == ErrorKind::WouldBlock => return,
                // ICMP errors from earlier replies surface here; they concern no one now.
                Err(_) => continue,
            }
        }
    }
}

fn bound_socket(addr: SocketAddr, kind: SockType) -> Result<OwnedFd, EchoError> {
    let protocol = if kind == SockType::Stream { "tcp" } else { "udp" };
    let create = |source| EchoError::CreateSocket { protocol, addr, source };
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, kind, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None).map_err(create)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(create)?;
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(create)?;
    }
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr)).map_err(|source| EchoError::Bind { protocol, addr, source })?;
    Ok(fd)
}

/// The line the server answers with.
pub fn reply_line(name: &str, client: SocketAddr) -> String {
    let client = SocketAddr::new(client.ip().to_canonical(), client.port());
    format!("{name} {client}\n")
}

/// What a TCP client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    Http { head: bool },
    Raw,
}

fn answer_connection(name: &str, mut stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nonblocking(false);
    let request = read_request(&mut stream);
    let line = reply_line(name, peer);
    let response = match classify(&request) {
        RequestKind::Http { head } => http_response(&line, head),
        RequestKind::Raw => line.into_bytes(),
    };
    let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
    if stream.write_all(&response).is_err() {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    // Read what is left before closing: closing with unread data would send a RST, and the
    // client could lose the response.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    for _ in 0..64 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
}

fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    let started = Instant::now();
    let mut request = Vec::new();
    let mut chunk = [0u8; 4096];
    while !is_complete(&request) && request.len() < MAX_REQUEST {
        let limit = if request.is_empty() { SILENT_CLIENT_WAIT } else { REQUEST_TIMEOUT };
        let Some(left) = limit.checked_sub(started.elapsed()).filter(|d| !d.is_zero()) else {
            break;
        };
        if stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => request.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    request
}

/// Whether `request` is an HTTP request line (`METHOD target HTTP/x`).
fn is_http_request_line(line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_uppercase())
        && !target.is_empty()
        && version.starts_with("HTTP/")
}

fn first_line(request: &[u8]) -> Option<&[u8]> {
    request.iter().position(|&b| b == b'\n').map(|end| &request[..end])
}

/// Whether the request can be answered: a full HTTP header block, or any other line.
fn is_complete(request: &[u8]) -> bool {
    match first_line(request) {
        None => false,
        Some(line) if is_http_request_line(line) => {
            request.windows(4).any(|w| w == b"\r\n\r\n") || request.windows(2).any(|w| w == b"\n\n")
        }
        Some(_) => true,
    }
}

fn classify(request: &[u8]) -> RequestKind {
    match first_line(request) {
        Some(line) if is_http_request_line(line) => RequestKind::Http { head: line.starts_with(b"HEAD ") },
        _ => RequestKind::Raw,
    }
}

fn http_response(body: &str, head: bool) -> Vec<u8> {
    let mut response = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nServer: svcplane-echo\r\n\r\n",
        body.len()
    );
    if !head {
        response.push_str(body);
    }
    response.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_line_names_the_server_and_the_client() {
        let v4: SocketAddr = "198.18.129.1:40312".parse().unwrap();
        let v6: SocketAddr = "[2001:db8:1:1::1]:40312".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:198.18.0.101]:5".parse().unwrap();
        assert_eq!(reply_line("pod-a", v4), "pod-a 198.18.129.1:40312\n");
        assert_eq!(reply_line("pod-a", v6), "pod-a [2001:db8:1:1::1]:40312\n");
        assert_eq!(reply_line("pod-a", mapped), "pod-a 198.18.0.101:5\n");
    }

    #[test]
    fn an_http_request_is_complete_only_after_its_headers() {
        assert!(!is_complete(b"GET / HTTP/1.1\r\nHost: x\r\n"));
        assert!(is_complete(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(is_complete(b"GET / HTTP/1.0\n\n"));
        assert_eq!(classify(b"GET / HTTP/1.1\r\n\r\n"), RequestKind::Http { head: false });
        assert_eq!(classify(b"HEAD /x HTTP/1.1\r\n\r\n"), RequestKind::Http { head: true });
    }

    #[test]
    fn raw_text_is_answered_after_its_first_line() {
        assert!(!is_complete(b"hello"));
        assert!(is_complete(b"hello\n"));
        assert!(is_complete(b"GET me a coffee\n"));
        assert_eq!(classify(b"hello\n"), RequestKind::Raw);
        assert_eq!(classify(b""), RequestKind::Raw);
        assert_eq!(classify(b"get / http/1.0\r\n\r\n"), RequestKind::Raw);
    }

    #[test]
    fn the_http_response_carries_the_line_as_its_body() {
        let response = String::from_utf8(http_response("a 1.2.3.4:5\n", false)).unwrap();
        assert!(response.starts_with("HTTP/1.0 200 OK\r\n"));
        assert!(response.contains("Content-Length: 12\r\n"));
        assert!(response.contains("Connection: close\r\n"));
        assert!(response.ends_with("\r\n\r\na 1.2.3.4:5\n"));
        let head = String::from_utf8(http_response("a 1.2.3.4:5\n", true)).unwrap();
        assert!(head.ends_with("\r\n\r\n"));
    }
}
