//! The DNS server: [`crate::udp`]'s workers for UDP and hickory's TCP loop, both around
//! [`crate::respond`], over a zone snapshot that is swapped atomically when the cluster
//! changes.
//!
//! Both answer FORMERR to requests they cannot parse and ignore messages shorter than a
//! header or that are responses; everything else comes to [`Handler`], which loads the
//! current snapshot (no lock), answers, and forwards names outside the zone. A failing
//! upstream or a client that goes away never stops the server.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::server::Server;
use tokio::net::{TcpListener, UdpSocket};

use crate::handler::Handler;

/// How long an idle TCP connection is kept.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// UDP workers sharing the socket, at most (one per CPU below that).
const MAX_UDP_WORKERS: usize = 4;

/// Binding on port 0 picks the UDP port first; this many tries find one free for TCP too.
const MAX_BIND_ATTEMPTS: usize = 16;

/// A bound server: UDP and TCP on the same address and port.
pub struct DnsServer {
    /// TCP only: UDP is served by [`crate::udp`]'s workers.
    server: Server<Handler>,
    udp_workers: Vec<tokio::task::JoinHandle<()>>,
    local_addr: SocketAddr,
}

impl std::fmt::Debug for DnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsServer").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl DnsServer {
    /// Binds UDP and TCP on `listen` (port 0: any port free for both). Needs a tokio runtime.
    pub async fn bind(listen: SocketAddr, handler: Handler) -> io::Result<Self> {
        let (udp, tcp) = bind_both(listen).await?;
        let local_addr = udp.local_addr()?;
        let udp = Arc::new(udp);
        let mut server = Server::new(handler.clone());
        server.register_listener(tcp, TCP_IDLE_TIMEOUT, 64);
        let workers = std::thread::available_parallelism().map_or(1, std::num::NonZero::get).min(MAX_UDP_WORKERS);
        let udp_workers = (0..workers)
            .map(|_| {
                let stop = server.shutdown_token().clone();
                tokio::spawn(crate::udp::serve(
                    Arc::clone(&udp),
                    handler.clone(),
                    async move { stop.cancelled().await },
                ))
            })
            .collect();
        Ok(Self { server, udp_workers, local_addr })
    }

    /// Where the server listens (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, then stops accepting and waits for the loops to end.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let token = self.server.shutdown_token().clone();
        let result = tokio::select! {
            result = self.server.block_until_done() => {
                token.cancel();
                result
            }
            () = shutdown => {
                token.cancel();
                self.server.block_until_done().await
            }
        };
        for worker in self.udp_workers {
            let _ = worker.await;
        }
        result.map_err(|error| io::Error::other(error.to_string()))
    }
}

async fn bind_both(listen: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    let mut last_error = None;
    for _ in 0..MAX_BIND_ATTEMPTS {
        let udp = UdpSocket::bind(listen).await?;
        let port = udp.local_addr()?.port();
        match TcpListener::bind(SocketAddr::new(listen.ip(), port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            // With a fixed port there is nothing to retry.
            Err(error) if listen.port() != 0 => return Err(error),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::other("no port free for both UDP and TCP")))
}
