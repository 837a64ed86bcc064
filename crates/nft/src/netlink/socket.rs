//! The NETLINK_NETFILTER socket: opening it (in a named network namespace if asked: a
//! netlink socket talks to the namespace it was created in, wherever it is used from),
//! sending one batch, and collecting what the kernel answers.

use std::fs::File;
use std::io;
use std::path::Path;

use netlink_sys::Socket;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{setsockopt, sockopt};

use super::wire::{self, Ack, NETLINK_NETFILTER, NLMSG_DONE, NLMSG_ERROR};

/// Receive buffer: room for the answers to a batch that fails with many errors (each error
/// costs about a kilobyte of it); the first errors are the ones that count.
const RECEIVE_BUFFER: usize = 8 << 20;

/// Where `ip netns add` puts its namespaces.
const NETNS_DIRECTORIES: [&str; 2] = ["/run/netns", "/var/run/netns"];

#[derive(Debug)]
pub(super) struct NetlinkSocket {
    /// `None` once closed on purpose (an injected fault).
    socket: Option<Socket>,
    /// The send buffer size asked for so far.
    send_buffer: usize,
    receive: Vec<u8>,
}

impl NetlinkSocket {
    /// Opens a socket in the calling thread's network namespace.
    pub(super) fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        // Which attribute an error is about (kernel 4.12 on), and errors without a copy of the
        // message they answer: older kernels just ignore these.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        // Raising the limits past the system-wide maximum needs CAP_NET_ADMIN, which nf_tables
        // needs anyway.
        setsockopt(&socket, sockopt::RcvBufForce, &RECEIVE_BUFFER)?;
        Ok(NetlinkSocket { socket: Some(socket), send_buffer: 0, receive: vec![0; 1 << 17] })
    }

    /// Opens a socket in the network namespace `ip netns` knows as `name`, from a thread that
    /// enters it and ends; the calling thread stays where it is. Returns the namespace too,
    /// for opening the socket again.
    pub(super) fn open_in_namespace(name: &str) -> io::Result<(Self, File)> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad network namespace name {name:?}")));
        }
        let path = NETNS_DIRECTORIES
            .iter()
            .map(|directory| Path::new(directory).join(name))
            .find(|path| path.exists())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no network namespace named {name:?}")))?;
        let namespace = File::open(&path)?;
        Ok((Self::open_in(&namespace)?, namespace))
    }

    /// Opens a socket in the network namespace `namespace` (an open `/proc/.../ns/net` or
    /// `/run/netns/NAME`), from a thread that enters it and ends.
    pub(super) fn open_in(namespace: &File) -> io::Result<Self> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    setns(namespace, CloneFlags::CLONE_NEWNET)?;
                    Self::open()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the thread opening the socket panicked")))
        })
    }

    /// Closes the socket (a fault injected on purpose): every later use fails with
    /// `EBADF`, as with a socket closed under its user.
    pub(super) fn close(&mut self) {
        self.socket = None;
    }

    /// Sends one buffer of messages in one `sendmsg`, which is how the kernel takes a batch
    /// as one transaction. The kernel handles it before `send` returns.
    pub(super) fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        // The kernel refuses a message larger than the send buffer; nft raises it the same way.
        let needed = buf.len() + 4096;
        if needed > self.send_buffer {
            let size = needed.max(1 << 20);
            setsockopt(live(&self.socket)?, sockopt::SndBufForce, &size)?;
            self.send_buffer = size;
        }
        let sent = live(&self.socket)?.send(buf, 0)?;
        if sent != buf.len() {
            return Err(io::Error::other(format!("netlink sent {sent} of {} bytes", buf.len())));
        }
        Ok(())
    }

    /// Reads what is queued without waiting (everything, after a batch: the kernel answered
    /// while `send` ran), handing each error or ack in `seqs` to `on_ack`. Returns whether
    /// answers were lost to a full receive buffer.
    pub(super) fn drain(&mut self, seqs: (u32, u32), on_ack: &mut dyn FnMut(Ack)) -> io::Result<bool> {
        let mut overflowed = false;
        loop {
            match live(&self.socket)?.recv(&mut &mut self.receive[..], libc::MSG_DONTWAIT) {
                Ok(len) => {
                    for message in wire::messages(&self.receive[..len.min(self.receive.len())]) {
                        if message.msg_type == NLMSG_ERROR
                            && let Some(ack) = wire::parse_ack(&message)
                            && in_range(ack.seq, seqs)
                        {
                            on_ack(ack);
                        }
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(overflowed),
                Err(error) if error.raw_os_error() == Some(libc::ENOBUFS) => overflowed = true,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Sends one request and collects the messages answering it until its ack or error (or,
    /// for a dump, its end).
    pub(super) fn request(&mut self, buf: &[u8], seq: u32) -> io::Result<(Vec<Vec<u8>>, Ack)> {
        self.send(buf)?;
        let mut replies = Vec::new();
        loop {
            let len = loop {
                match live(&self.socket)?.recv(&mut &mut self.receive[..], 0) {
                    Ok(len) => break len,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(error),
                }
            };
            for message in wire::messages(&self.receive[..len.min(self.receive.len())]) {
                if message.seq != seq {
                    continue;
                }
                match message.msg_type {
                    NLMSG_ERROR => {
                        let ack = wire::parse_ack(&message)
                            .ok_or_else(|| io::Error::other("the kernel sent a truncated error"))?;
                        return Ok((replies, ack));
                    }
                    NLMSG_DONE => return Ok((replies, wire::parse_done(&message))),
                    _ => replies.push(message.payload.to_vec()),
                }
            }
        }
    }
}

fn in_range(seq: u32, (first, last): (u32, u32)) -> bool {
    seq.wrapping_sub(first) <= last.wrapping_sub(first)
}

/// The socket, unless it was closed.
fn live(socket: &Option<Socket>) -> io::Result<&Socket> {
    socket.as_ref().ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
}
