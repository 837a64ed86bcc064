//! One netlink socket that sends requests and reads their answers: single requests (with
//! their replies, for dumps) and batches of acknowledged requests. The IPVS family (generic
//! netlink) and ipset (nfnetlink) both speak through it.

use std::io;

use netlink_sys::Socket;

use crate::wire::{Message, NLMSG_DONE, NLMSG_ERROR, messages};

/// The acks of one batch: requests with sequence numbers `first`, `first + 1`, ...
/// (wrapping), each answered by one `NLMSG_ERROR` (errno 0 for success).
pub(crate) struct Acks {
    first: u32,
    errnos: Vec<Option<i32>>,
    missing: usize,
}

impl Acks {
    pub(crate) fn new(first: u32, count: usize) -> Self {
        Acks { first, errnos: vec![None; count], missing: count }
    }

    /// Takes `message` if it is the ack of one of the batch's requests (anything else,
    /// such as an answer to an earlier request, is ignored).
    pub(crate) fn record(&mut self, message: &Message<'_>) {
        if message.msg_type != NLMSG_ERROR {
            return;
        }
        let index = message.seq.wrapping_sub(self.first) as usize;
        let Some(slot) = self.errnos.get_mut(index) else {
            return;
        };
        if slot.is_none() {
            *slot = Some(errno_of(message));
            self.missing -= 1;
        }
    }

    pub(crate) fn complete(&self) -> bool {
        self.missing == 0
    }

    /// The first request refused, in the order sent: (index, errno).
    pub(crate) fn first_refused(&self) -> Option<(usize, i32)> {
        self.refused().next()
    }

    /// Every request refused, in the order sent: (index, errno).
    pub(crate) fn refused(&self) -> impl Iterator<Item = (usize, i32)> + '_ {
        self.errnos.iter().enumerate().filter_map(|(index, errno)| match errno {
            Some(errno) if *errno != 0 => Some((index, *errno)),
            _ => None,
        })
    }
}

/// The errno of an `NLMSG_ERROR` or `NLMSG_DONE` (the kernel writes it negated).
fn errno_of(message: &Message<'_>) -> i32 {
    -message.payload.get(..4).map_or(0, |bytes| i32::from_ne_bytes(bytes.try_into().expect("four bytes")))
}

/// A bound netlink socket of one protocol, its sequence numbers and receive buffer.
#[derive(Debug)]
pub(crate) struct Channel {
    socket: Socket,
    seq: u32,
    receive: Vec<u8>,
}

impl Channel {
    /// Opens and binds a socket of `protocol` in the calling thread's network namespace.
    pub(crate) fn open(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        Ok(Channel { socket, seq: 1, receive: vec![0; 1 << 16] })
    }

    /// The sequence number for the next request.
    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// The number [`Channel::next_seq`] will give next (a batch's first).
    pub(crate) fn peek_seq(&self) -> u32 {
        self.seq.wrapping_add(1)
    }

    /// Sends `buf` as one datagram; a short send is an error.
    fn send_whole(&mut self, buf: &[u8]) -> io::Result<()> {
        let sent = self.socket.send(buf, 0)?;
        if sent != buf.len() {
            return Err(io::Error::other(format!("netlink sent {sent} of {} bytes", buf.len())));
        }
        Ok(())
    }

    /// Receives one datagram into `self.receive` (retrying an interrupted call) and returns
    /// how many of its bytes the buffer holds.
    fn receive_some(&mut self) -> io::Result<usize> {
        loop {
            match self.socket.recv(&mut &mut self.receive[..], 0) {
                Ok(len) => return Ok(len.min(self.receive.len())),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// Sends `buf` (`count` requests with sequence numbers from `first`, each asking for an
    /// ack) and reads every ack.
    pub(crate) fn acknowledged_batch(&mut self, buf: &[u8], first: u32, count: usize) -> io::Result<Acks> {
        self.send_whole(buf)?;
        let mut acks = Acks::new(first, count);
        while !acks.complete() {
            let len = self.receive_some()?;
            for message in messages(&self.receive[..len]) {
                acks.record(&message);
            }
        }
        Ok(acks)
    }

    /// Sends one request and collects the payloads answering it until its ack, error or
    /// dump end; returns them with the errno (0 for success).
    pub(crate) fn request(&mut self, buf: &[u8], seq: u32) -> io::Result<(Vec<Vec<u8>>, i32)> {
        self.send_whole(buf)?;
        let mut replies = Vec::new();
        loop {
            let len = self.receive_some()?;
            for message in messages(&self.receive[..len]) {
                if message.seq != seq {
                    continue;
                }
                match message.msg_type {
                    NLMSG_ERROR | NLMSG_DONE => return Ok((replies, errno_of(&message))),
                    _ => replies.push(message.payload.to_vec()),
                }
            }
        }
    }
}
