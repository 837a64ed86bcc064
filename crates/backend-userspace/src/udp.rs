//! UDP: a session per client address, each with a socket connected to its endpoint;
//! replies go out of the listening socket, bound to the node address the kernel DNATed
//! to, so the kernel's NAT turns their source back into the Service address the client
//! sent to. A session ends when idle for the timeout, when its endpoint stops serving,
//! or when the endpoint refuses (ICMP port unreachable): the client's next datagram then
//! starts a fresh one.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use socket2::SockRef;
use svcplane_core::EndpointSetKind;
use tokio::net::UdpSocket;

use crate::options::Options;
use crate::pool::{Pool, Slot};

const DATAGRAM: usize = 65_536;

#[derive(Debug)]
struct Session {
    upstream: Arc<UdpSocket>,
    /// Milliseconds since `epoch` of the last datagram either way.
    last: Arc<AtomicU64>,
}

type Sessions = Arc<Mutex<HashMap<SocketAddr, Session>>>;

fn lock(sessions: &Sessions) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Session>> {
    sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub async fn serve(socket: UdpSocket, pool: Arc<Pool>, set: EndpointSetKind, options: Arc<Options>) {
    let socket = Arc::new(socket);
    let sessions: Sessions = Arc::default();
    let epoch = Instant::now();
    let mut buffer = vec![0u8; DATAGRAM];
    loop {
        let (length, client) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(service_port = %pool.name, "receiving: {error}");
                continue;
            }
        };
        let now = epoch.elapsed().as_millis() as u64;
        let existing = lock(&sessions).get(&client).map(|s| (s.upstream.clone(), s.last.clone()));
        let (upstream, last) = match existing {
            Some(found) => found,
            None => match open(&socket, &sessions, client, &pool, set, &options, epoch).await {
                Some(opened) => opened,
                None => continue,
            },
        };
        last.store(now, Ordering::Relaxed);
        // Straight to the socket, not through tokio's readiness (unknown for a socket just
        // opened): a full buffer drops the datagram, as the network would.
        match SockRef::from(&*upstream).send(&buffer[..length]) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                pool.stats.udp_dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => tracing::debug!(service_port = %pool.name, %client, "sending upstream: {error}"),
        }
    }
}

/// Opens a session for `client`: a slot in the table, an endpoint, a connected socket.
async fn open(
    socket: &Arc<UdpSocket>,
    sessions: &Sessions,
    client: SocketAddr,
    pool: &Arc<Pool>,
    set: EndpointSetKind,
    options: &Arc<Options>,
    epoch: Instant,
) -> Option<(Arc<UdpSocket>, Arc<AtomicU64>)> {
    let slot = pool.admit(1).ok()?;
    for endpoint in pool.candidates(set, client.ip()) {
        let unspecified = match endpoint.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let upstream = match UdpSocket::bind((unspecified, 0)).await {
            Ok(upstream) => upstream,
            Err(error) => {
                if error.raw_os_error() == Some(libc::EMFILE) || error.raw_os_error() == Some(libc::ENFILE) {
                    pool.stats.refused_no_fds.fetch_add(1, Ordering::Relaxed);
                }
                tracing::warn!(service_port = %pool.name, "opening a UDP session socket: {error}");
                return None;
            }
        };
        if let Err(error) = upstream.connect(endpoint).await {
            tracing::debug!(service_port = %pool.name, %endpoint, "connect failed ({error}); trying the next endpoint");
            pool.failed(endpoint);
            continue;
        }
        pool.connected(client.ip(), endpoint);
        let upstream = Arc::new(upstream);
        let last = Arc::new(AtomicU64::new(epoch.elapsed().as_millis() as u64));
        lock(sessions).insert(client, Session { upstream: upstream.clone(), last: last.clone() });
        let task = Replies {
            socket: socket.clone(),
            upstream: upstream.clone(),
            last: last.clone(),
            client,
            endpoint,
            pool: pool.clone(),
            options: options.clone(),
            sessions: sessions.clone(),
            epoch,
            slot,
        };
        tokio::spawn(task.run());
        return Some((upstream, last));
    }
    pool.stats.exhausted.fetch_add(1, Ordering::Relaxed);
    None
}

/// One session's way back: replies to the client until the session ends.
struct Replies {
    socket: Arc<UdpSocket>,
    upstream: Arc<UdpSocket>,
    last: Arc<AtomicU64>,
    client: SocketAddr,
    endpoint: SocketAddr,
    pool: Arc<Pool>,
    options: Arc<Options>,
    sessions: Sessions,
    epoch: Instant,
    slot: Slot,
}

impl Replies {
    async fn run(self) {
        let mut serving = self.pool.watch_serving();
        let mut buffer = vec![0u8; DATAGRAM];
        let idle = self.options.udp_idle_timeout;
        loop {
            let since = self.epoch.elapsed().as_millis() as u64 - self.last.load(Ordering::Relaxed);
            let left = idle.saturating_sub(std::time::Duration::from_millis(since));
            if left.is_zero() {
                break;
            }
            tokio::select! {
                received = self.upstream.recv(&mut buffer) => match received {
                    Ok(length) => {
                        self.last.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
                        let sent = SockRef::from(&*self.socket).send_to(&buffer[..length], &self.client.into());
                        if sent.is_err_and(|error| error.kind() == io::ErrorKind::WouldBlock) {
                            self.pool.stats.udp_dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(error) => {
                        // ICMP port unreachable from the endpoint: the next datagram picks afresh.
                        tracing::debug!(service_port = %self.pool.name, endpoint = %self.endpoint, "session ends: {error}");
                        if error.kind() == io::ErrorKind::ConnectionRefused {
                            self.pool.failed(self.endpoint);
                        }
                        break;
                    }
                },
                () = tokio::time::sleep(left) => {}
                changed = serving.changed() => {
                    // UDP has no end of its own: a session to an endpoint that stopped
                    // serving ends now, like the stale conntrack flows of the kernel modes.
                    if changed.is_err() || !serving.borrow_and_update().contains(&self.endpoint) {
                        self.pool.stats.closed_removed.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
        let mut sessions = lock(&self.sessions);
        if sessions.get(&self.client).is_some_and(|s| Arc::ptr_eq(&s.upstream, &self.upstream)) {
            sessions.remove(&self.client);
        }
        drop(sessions);
        drop(self.slot);
    }
}
