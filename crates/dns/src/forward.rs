//! Forwarding names outside the cluster zone to the upstream resolvers named on the command
//! line, and nowhere else.
//!
//! Each exchange uses a fresh connected UDP socket (a random source port) and a random
//! message id; a reply must come from the upstream, carry that id and repeat the question, or
//! it is ignored. A truncated UDP reply is asked again over TCP. Upstreams are tried in the
//! order given until one answers within the timeout.

use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{Instant, timeout_at};

/// Default time one upstream gets to answer.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(2);

/// Unrelated datagrams one exchange tolerates before giving up on that upstream.
const MAX_STRAY_DATAGRAMS: usize = 16;

/// A forwarding failure.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no upstream resolver is configured")]
    NoUpstream,
    #[error("the query cannot be forwarded: {reason}")]
    BadQuery { reason: String },
    #[error("upstream {upstream}: {source}")]
    Exchange { upstream: SocketAddr, source: io::Error },
}

/// The upstream resolvers and how long each gets.
#[derive(Debug, Clone)]
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration) -> Self {
        Self { upstreams, timeout }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Sends the query `packet` (whose first question is `question`) to each upstream in turn;
    /// returns the first answer.
    pub async fn forward(&self, packet: &[u8], question: &Query) -> Result<Message, ForwardError> {
        if packet.len() < 12 {
            return Err(ForwardError::BadQuery { reason: "shorter than a DNS header".to_owned() });
        }
        let mut last = ForwardError::NoUpstream;
        for &upstream in &self.upstreams {
            let mut packet = packet.to_vec();
            let id = random_id();
            packet[..2].copy_from_slice(&id.to_be_bytes());
            match exchange(upstream, &packet, id, question, self.timeout).await {
                Ok(message) => return Ok(message),
                Err(source) => {
                    tracing::debug!(%upstream, %source, "upstream did not answer");
                    last = ForwardError::Exchange { upstream, source };
                }
            }
        }
        Err(last)
    }

    /// Asks the upstreams for `name`/`query_type` (recursion desired), e.g. to follow a CNAME
    /// out of the zone.
    pub async fn resolve(&self, name: &Name, query_type: RecordType) -> Result<Message, ForwardError> {
        let question = Query::query(name.clone(), query_type);
        let mut message = Message::query();
        message.metadata.recursion_desired = true;
        message.add_query(question.clone());
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        message.set_edns(edns);
        let packet = message.to_vec().map_err(|error| ForwardError::BadQuery { reason: error.to_string() })?;
        self.forward(&packet, &question).await
    }
}

fn random_id() -> u16 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let hash = RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
    (hash & 0xffff) as u16
}

fn invalid(reason: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason.to_owned())
}

fn is_reply_to(message: &Message, id: u16, question: &Query) -> bool {
    message.metadata.id == id
        && message.queries.first().is_some_and(|q| {
            q.query_type() == question.query_type()
                && q.query_class() == question.query_class()
                && q.name().eq_ignore_root(question.name())
        })
}

async fn exchange(
    upstream: SocketAddr,
    packet: &[u8],
    id: u16,
    question: &Query,
    timeout: Duration,
) -> io::Result<Message> {
    let deadline = Instant::now() + timeout;
    let local: SocketAddr = match upstream.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(packet).await?;
    let mut buffer = vec![0u8; usize::from(u16::MAX)];
    for _ in 0..MAX_STRAY_DATAGRAMS {
        let received = timeout_at(deadline, socket.recv(&mut buffer))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer over UDP in time"))??;
        let Ok(message) = Message::from_vec(&buffer[..received]) else {
            continue;
        };
        if !is_reply_to(&message, id, question) {
            continue;
        }
        if message.metadata.truncation {
            return exchange_tcp(upstream, packet, id, question, deadline).await;
        }
        return Ok(message);
    }
    Err(invalid("only unrelated datagrams arrived"))
}

async fn exchange_tcp(
    upstream: SocketAddr,
    packet: &[u8],
    id: u16,
    question: &Query,
    deadline: Instant,
) -> io::Result<Message> {
    let timed_out = |_| io::Error::new(io::ErrorKind::TimedOut, "no answer over TCP in time");
    let mut stream = timeout_at(deadline, TcpStream::connect(upstream)).await.map_err(timed_out)??;
    let length = u16::try_from(packet.len()).map_err(|_| invalid("query too long for TCP"))?;
    let mut framed = Vec::with_capacity(packet.len() + 2);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(packet);
    timeout_at(deadline, stream.write_all(&framed)).await.map_err(timed_out)??;
    let mut length = [0u8; 2];
    timeout_at(deadline, stream.read_exact(&mut length)).await.map_err(timed_out)??;
    let mut buffer = vec![0u8; usize::from(u16::from_be_bytes(length))];
    timeout_at(deadline, stream.read_exact(&mut buffer)).await.map_err(timed_out)??;
    let message = Message::from_vec(&buffer).map_err(|error| invalid(&error.to_string()))?;
    if !is_reply_to(&message, id, question) {
        return Err(invalid("the TCP answer does not match the question"));
    }
    Ok(message)
}
