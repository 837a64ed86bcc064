//! Probe clients for the echo server: one request, one parsed reply, and an error that tells
//! "rejected" (a RST or an ICMP error came back) from "dropped" (nothing came back).
//!
//! The probes use the calling thread's network namespace; [`tcp_request_in`] and
//! [`udp_request_in`] first enter a lab namespace (see [`crate::run_in_namespace`]).

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use std::path::Path;

use crate::namespace::{NamespaceError, run_in_namespace, run_in_namespace_within};

/// What a probe sends: raw text, which the echo server answers with its bare reply line.
const PROBE_PAYLOAD: &[u8] = b"svcplane-probe\n";
/// Longest reply accepted.
const MAX_REPLY: usize = 4096;

/// The echo server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoReply {
    /// The name the server was started with (the pod name in a lab).
    pub server_name: String,
    /// The client address the server saw: the probe's own address if the source was
    /// preserved, a node address if it was masqueraded.
    pub client_addr: SocketAddr,
}

impl EchoReply {
    /// Parses a reply line, `<name> <socket address>`.
    pub fn parse(line: &str) -> Option<EchoReply> {
        let (server_name, client) = line.trim_end_matches(['\r', '\n']).rsplit_once(' ')?;
        if server_name.is_empty() {
            return None;
        }
        Some(EchoReply { server_name: server_name.to_owned(), client_addr: client.parse().ok()? })
    }
}

/// The transport a probe used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// The outcome class of a failed probe, for assertions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeErrorKind {
    /// Rejected fast: TCP RST or ICMP port unreachable (`ECONNREFUSED`).
    Refused,
    /// Rejected fast with an ICMP host/network unreachable (the kernel reports
    /// "administratively prohibited" this way too).
    Unreachable,
    /// Nothing came back in time: dropped.
    TimedOut,
    /// Dropped by the sender's own node, which told the sender at once (`EPERM`: a
    /// netfilter drop of a locally made packet, or a socket-level balancer's drop).
    DroppedLocally,
    /// The connection was accepted and then reset.
    Reset,
    /// Something answered, but not with an echo reply.
    BadReply,
    /// The probe could not even start (namespace, bind) or another I/O error.
    Other,
}

/// A probe that got no echo reply.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Entering the client's namespace failed.
    #[error(transparent)]
    EnterNamespace(#[from] NamespaceError),
    /// The target is not an address of the lab's plan (the lab never probes elsewhere).
    #[error("{addr} is outside the lab's address plan")]
    OutsideAddressPlan { addr: SocketAddr },
    /// Binding the client socket (e.g. a fixed source port) failed.
    #[error("binding {protocol} client socket {local}: {source}")]
    Bind {
        protocol: Protocol,
        local: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Rejected: connection refused (TCP RST, or ICMP port unreachable).
    #[error("{protocol} {addr}: refused")]
    Refused { protocol: Protocol, addr: SocketAddr },
    /// Rejected with ICMP host, network or administratively unreachable.
    #[error("{protocol} {addr}: unreachable: {source}")]
    Unreachable {
        protocol: Protocol,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// No answer within the time limit.
    #[error("{protocol} {addr}: no answer within {after:?}")]
    TimedOut { protocol: Protocol, addr: SocketAddr, after: Duration },
    /// The sender's own node dropped it and said so (`EPERM`).
    #[error("{protocol} {addr}: {operation}: dropped by the sending node (operation not permitted)")]
    DroppedLocally { protocol: Protocol, addr: SocketAddr, operation: &'static str },
    /// The connection was reset after it was established.
    #[error("{protocol} {addr}: connection reset")]
    Reset { protocol: Protocol, addr: SocketAddr },
    /// The answer was not an echo reply line.
    #[error("{protocol} {addr}: not an echo reply: {reply:?}")]
    BadReply { protocol: Protocol, addr: SocketAddr, reply: String },
    /// Any other I/O error, with the step that failed.
    #[error("{protocol} {addr}: {operation}: {source}")]
    Io {
        protocol: Protocol,
        addr: SocketAddr,
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl ProbeError {
    /// The outcome class.
    pub fn kind(&self) -> ProbeErrorKind {
        match self {
            ProbeError::Refused { .. } => ProbeErrorKind::Refused,
            ProbeError::Unreachable { .. } => ProbeErrorKind::Unreachable,
            ProbeError::TimedOut { .. } => ProbeErrorKind::TimedOut,
            ProbeError::DroppedLocally { .. } => ProbeErrorKind::DroppedLocally,
            ProbeError::Reset { .. } => ProbeErrorKind::Reset,
            ProbeError::BadReply { .. } => ProbeErrorKind::BadReply,
            ProbeError::EnterNamespace(_)
            | ProbeError::OutsideAddressPlan { .. }
            | ProbeError::Bind { .. }
            | ProbeError::Io { .. } => ProbeErrorKind::Other,
        }
    }

    /// Whether the probe was refused (RST / ICMP port unreachable).
    pub fn is_refused(&self) -> bool {
        self.kind() == ProbeErrorKind::Refused
    }

    /// Whether the probe was rejected by the network: refused or unreachable.
    pub fn is_rejected(&self) -> bool {
        matches!(self.kind(), ProbeErrorKind::Refused | ProbeErrorKind::Unreachable)
    }

    /// Whether nothing came back in time.
    pub fn is_timed_out(&self) -> bool {
        self.kind() == ProbeErrorKind::TimedOut
    }
}

/// Classifies an I/O error of a probe step.
fn probe_error(
    protocol: Protocol,
    addr: SocketAddr,
    operation: &'static str,
    after: Duration,
    source: std::io::Error,
) -> ProbeError {
    match source.kind() {
        ErrorKind::ConnectionRefused => ProbeError::Refused { protocol, addr },
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => {
            ProbeError::Unreachable { protocol, addr, source }
        }
        ErrorKind::TimedOut | ErrorKind::WouldBlock => ProbeError::TimedOut { protocol, addr, after },
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => ProbeError::Reset { protocol, addr },
        ErrorKind::PermissionDenied => ProbeError::DroppedLocally { protocol, addr, operation },
        _ => ProbeError::Io { protocol, addr, operation, source },
    }
}

fn parse_reply(protocol: Protocol, addr: SocketAddr, bytes: &[u8]) -> Result<EchoReply, ProbeError> {
    let text = String::from_utf8_lossy(bytes);
    EchoReply::parse(&text).ok_or_else(|| ProbeError::BadReply { protocol, addr, reply: text.into_owned() })
}

/// Time left until `deadline`, never zero (a zero timeout means "block forever" to std).
fn left(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| *d >= Duration::from_millis(1))
}

/// Connects to `addr` over TCP, sends one line and reads the echo reply, all within
/// `timeout`.
pub fn tcp_request(addr: SocketAddr, timeout: Duration) -> Result<EchoReply, ProbeError> {
    let protocol = Protocol::Tcp;
    let deadline = Instant::now() + timeout;
    let fail = |operation, source| probe_error(protocol, addr, operation, timeout, source);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| fail("connect", e))?;
    let timed_out = || ProbeError::TimedOut { protocol, addr, after: timeout };
    stream.set_write_timeout(Some(left(deadline).ok_or_else(timed_out)?)).map_err(|e| fail("set timeout", e))?;
    stream.write_all(PROBE_PAYLOAD).map_err(|e| fail("send", e))?;
    let _ = stream.shutdown(Shutdown::Write);
    let mut reply = Vec::new();
    let mut chunk = [0u8; 1024];
    while reply.len() < MAX_REPLY {
        let remaining = left(deadline).ok_or_else(timed_out)?;
        stream.set_read_timeout(Some(remaining)).map_err(|e| fail("set timeout", e))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(fail("receive", error)),
        }
    }
    parse_reply(protocol, addr, &reply)
}

/// Sends one UDP datagram to `addr` from `source_port` (any free port with `None`) and waits
/// at most `timeout` for the echo reply. The socket is connected, so an ICMP port
/// unreachable comes back as [`ProbeError::Refused`], and a reply from any other address
/// than `addr` (a broken reverse NAT) is ignored, as a real client would.
pub fn udp_request(addr: SocketAddr, timeout: Duration, source_port: Option<u16>) -> Result<EchoReply, ProbeError> {
    let protocol = Protocol::Udp;
    let deadline = Instant::now() + timeout;
    let fail = |operation, source| probe_error(protocol, addr, operation, timeout, source);
    let unspecified = match addr {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let local = SocketAddr::new(unspecified, source_port.unwrap_or(0));
    let socket = UdpSocket::bind(local).map_err(|source| ProbeError::Bind { protocol, local, source })?;
    socket.connect(addr).map_err(|e| fail("connect", e))?;
    socket.send(PROBE_PAYLOAD).map_err(|e| fail("send", e))?;
    let mut reply = [0u8; MAX_REPLY];
    loop {
        let remaining = left(deadline).ok_or(ProbeError::TimedOut { protocol, addr, after: timeout })?;
        socket.set_read_timeout(Some(remaining)).map_err(|e| fail("set timeout", e))?;
        match socket.recv(&mut reply) {
            Ok(n) => return parse_reply(protocol, addr, &reply[..n]),
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(error) => return Err(fail("receive", error)),
        }
    }
}

/// [`tcp_request`] from inside the network namespace `namespace`.
pub fn tcp_request_in(namespace: &str, addr: SocketAddr, timeout: Duration) -> Result<EchoReply, ProbeError> {
    run_in_namespace(namespace, || tcp_request(addr, timeout))?
}

/// [`tcp_request_in`] from a thread in `cgroup` (a lab node's, see [`crate::cgroup`]).
pub fn tcp_request_within(
    namespace: &str,
    cgroup: Option<&Path>,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<EchoReply, ProbeError> {
    run_in_namespace_within(namespace, cgroup, || tcp_request(addr, timeout))?
}

/// [`udp_request`] from inside the network namespace `namespace`.
pub fn udp_request_in(
    namespace: &str,
    addr: SocketAddr,
    timeout: Duration,
    source_port: Option<u16>,
) -> Result<EchoReply, ProbeError> {
    run_in_namespace(namespace, || udp_request(addr, timeout, source_port))?
}

/// [`udp_request_in`] from a thread in `cgroup` (a lab node's, see [`crate::cgroup`]).
pub fn udp_request_within(
    namespace: &str,
    cgroup: Option<&Path>,
    addr: SocketAddr,
    timeout: Duration,
    source_port: Option<u16>,
) -> Result<EchoReply, ProbeError> {
    run_in_namespace_within(namespace, cgroup, || udp_request(addr, timeout, source_port))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_line_parses_into_name_and_client_address() {
        let reply = EchoReply::parse("node1-pod2 [2001:db8:1:2::1]:5353\n").unwrap();
        assert_eq!(reply.server_name, "node1-pod2");
        assert_eq!(reply.client_addr, "[2001:db8:1:2::1]:5353".parse::<SocketAddr>().unwrap());
        let reply = EchoReply::parse("a 198.18.0.101:1").unwrap();
        assert_eq!(reply.client_addr.port(), 1);
    }

    #[test]
    fn anything_else_is_not_a_reply() {
        assert_eq!(EchoReply::parse(""), None);
        assert_eq!(EchoReply::parse(" 1.2.3.4:5"), None);
        assert_eq!(EchoReply::parse("HTTP/1.0 200 OK"), None);
        assert_eq!(EchoReply::parse("name 1.2.3.4"), None);
    }

    #[test]
    fn refusals_and_silence_are_told_apart() {
        let addr: SocketAddr = "198.18.129.1:80".parse().unwrap();
        let after = Duration::from_secs(1);
        let refused =
            probe_error(Protocol::Tcp, addr, "connect", after, std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert!(refused.is_refused() && refused.is_rejected() && !refused.is_timed_out());
        let silent = probe_error(Protocol::Udp, addr, "receive", after, std::io::Error::from(ErrorKind::WouldBlock));
        assert!(silent.is_timed_out() && !silent.is_rejected());
        let unreachable =
            probe_error(Protocol::Tcp, addr, "connect", after, std::io::Error::from_raw_os_error(libc::EHOSTUNREACH));
        assert_eq!(unreachable.kind(), ProbeErrorKind::Unreachable);
        assert!(unreachable.is_rejected());
    }
}
