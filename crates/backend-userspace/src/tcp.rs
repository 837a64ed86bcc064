//! TCP: accept, choose an endpoint (retrying the next on a failed connect), then relay
//! both directions with `splice` through a pipe (no copy to user space), half-close
//! passed on, an error on either side resetting the other.

use std::fs::File;
use std::io;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{OFlag, SpliceFFlags, splice};
use socket2::SockRef;
use svcplane_core::EndpointSetKind;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};

use crate::options::{Options, until_removed};
use crate::pool::Pool;

/// Bytes moved per splice call: a pipe's capacity, raised from the kernel's 64 KiB so a
/// bulk transfer needs a sixteenth of the system calls.
const CHUNK: usize = 1 << 20;

/// Accepts clients until the task is aborted. Out of file descriptors, a spare one is
/// given up for a moment to accept the client and refuse it at once, so nobody waits in
/// the backlog for a slot that may never come.
pub async fn accept_loop(listener: TcpListener, pool: Arc<Pool>, set: EndpointSetKind, options: Arc<Options>) {
    let mut spare = File::open("/dev/null").ok();
    loop {
        match listener.accept().await {
            Ok((client, peer)) => {
                // The client's socket and the one to the endpoint.
                let Ok(slot) = pool.admit(2) else {
                    refuse(&client);
                    continue;
                };
                let (pool, options) = (pool.clone(), options.clone());
                tokio::spawn(async move {
                    serve(client, peer, &pool, set, &options).await;
                    drop(slot);
                });
            }
            Err(error) if matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                pool.stats.refused_no_fds.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(service_port = %pool.name, "the relay is out of file descriptors ({error}): refusing a client of {}", pool.name);
                drop(spare.take());
                if let Ok((client, _)) = listener.accept().await {
                    refuse(&client);
                }
                spare = File::open("/dev/null").ok();
                if spare.is_none() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Err(error) => {
                tracing::warn!(service_port = %pool.name, "accepting a client of {}: {error}", pool.name);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Closes with a reset: the client sees "connection reset", never a silent end of data.
fn refuse(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

async fn serve(client: TcpStream, peer: SocketAddr, pool: &Arc<Pool>, set: EndpointSetKind, options: &Options) {
    let _ = client.set_nodelay(true);
    let removed = pool.watch_serving();
    for endpoint in pool.candidates(set, peer.ip()) {
        let connect = tokio::time::timeout(options.connect_timeout, TcpStream::connect(endpoint)).await;
        let upstream = match connect {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(error)) => {
                tracing::debug!(service_port = %pool.name, %endpoint, "connect failed ({error}); trying the next endpoint");
                pool.failed(endpoint);
                continue;
            }
            Err(_) => {
                tracing::debug!(service_port = %pool.name, %endpoint, "connect timed out; trying the next endpoint");
                pool.failed(endpoint);
                continue;
            }
        };
        let _ = upstream.set_nodelay(true);
        pool.connected(peer.ip(), endpoint);
        tokio::select! {
            result = relay(&client, &upstream, pool) => {
                if result.is_err() {
                    refuse(&client);
                    refuse(&upstream);
                }
            }
            () = until_removed(removed, endpoint, options.removed_grace) => {
                pool.stats.closed_removed.fetch_add(1, Ordering::Relaxed);
                refuse(&client);
                refuse(&upstream);
            }
        }
        return;
    }
    pool.stats.exhausted.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(service_port = %pool.name, client = %peer, "no endpoint of {} accepted the connection", pool.name);
    refuse(&client);
}

/// Both directions until both ended; the first error ends both.
async fn relay(client: &TcpStream, upstream: &TcpStream, pool: &Pool) -> io::Result<()> {
    let (up, down) = tokio::try_join!(pump(client, upstream), pump(upstream, client))?;
    pool.stats.bytes.fetch_add(up + down, Ordering::Relaxed);
    Ok(())
}

/// Moves `from`'s bytes to `to` until `from` ends, then ends `to`'s sending side (a
/// half-close: the other direction goes on).
async fn pump(from: &TcpStream, to: &TcpStream) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        from.readable().await?;
        // A pipe only while bytes are in flight: an idle connection holds none.
        let moved = match take_pipe() {
            Some(pipe) => splice_once(from, to, pipe).await?,
            // No pipe to splice through (out of descriptors): copy this chunk instead.
            None => copy_once(from, to).await?,
        };
        match moved {
            Some(0) => break,
            Some(n) => total += n as u64,
            None => continue,
        }
    }
    let _ = SockRef::from(to).shutdown(Shutdown::Write);
    Ok(total)
}

/// Idle pipes kept for the next transfer.
const IDLE_PIPES: usize = 8;
static PIPES: Mutex<Vec<(OwnedFd, OwnedFd)>> = Mutex::new(Vec::new());

fn take_pipe() -> Option<(OwnedFd, OwnedFd)> {
    let idle = PIPES.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
    idle.or_else(|| {
        let pipe = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).ok()?;
        // Best effort: beyond `fs.pipe-max-size` (or the user's pipe quota) the pipe
        // keeps its default size and moves less per call.
        if nix::fcntl::fcntl(&pipe.1, nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as i32)).is_err() {
            crate::stats::PIPES_NOT_ENLARGED.fetch_add(1, Ordering::Relaxed);
        }
        Some(pipe)
    })
}

/// Only an empty pipe comes back.
fn give_pipe(pipe: (OwnedFd, OwnedFd)) {
    let mut idle = PIPES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if idle.len() < IDLE_PIPES {
        idle.push(pipe);
    }
}

/// One chunk from `from` into the pipe and all of it out to `to`: `Some(0)` at the end of
/// `from`, `None` when `from` had nothing after all.
async fn splice_once(from: &TcpStream, to: &TcpStream, pipe: (OwnedFd, OwnedFd)) -> io::Result<Option<usize>> {
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    let (read_end, write_end) = &pipe;
    // The pipe is empty, so "would block" can only mean the socket has nothing.
    let read = match from
        .try_io(Interest::READABLE, || splice(from, None, write_end, None, CHUNK, flags).map_err(io::Error::from))
    {
        Ok(n) => n,
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
            give_pipe(pipe);
            return Ok(None);
        }
        Err(error) => return Err(error),
    };
    let mut pending = read;
    while pending > 0 {
        to.writable().await?;
        match to
            .try_io(Interest::WRITABLE, || splice(read_end, None, to, None, pending, flags).map_err(io::Error::from))
        {
            Ok(n) => pending -= n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
    give_pipe(pipe);
    Ok(Some(read))
}

async fn copy_once(from: &TcpStream, to: &TcpStream) -> io::Result<Option<usize>> {
    let mut buffer = vec![0u8; 16 * 1024];
    let read = match from.try_read(&mut buffer) {
        Ok(n) => n,
        Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut written = 0;
    while written < read {
        to.writable().await?;
        match to.try_write(&buffer[written..read]) {
            Ok(n) => written += n,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(Some(read))
}
