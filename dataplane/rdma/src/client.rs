//! A raw RPC-over-RDMA client over the same binding: connects with RFC 8797
//! private data, sends transport messages it builds itself (well-formed or
//! not) and reads what comes back. `chimera-rdma-probe` uses it for NULL
//! round trips and for the hostile-input suite; it is not an NFS client.

use crate::qp::{Qp, Shape};
use crate::verbs::{self, ibv_wc};
use crate::wire::{self, Private};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Receive and send slots of the inline size.
const SLOTS: usize = 64;
const SLOT_BYTES: usize = 4096;
/// Registered memory the server may read or write (chunk targets).
pub const PAYLOAD_BYTES: usize = 4 << 20;

/// What waiting for a message found instead.
#[derive(Debug, PartialEq, Eq)]
pub enum Gone {
    /// The server closed the connection (or the queue pair failed).
    Closed(String),
    Timeout,
}

pub struct Client {
    q: Option<Qp>,
    next_send: usize,
    sends_in_flight: usize,
    closed: Option<String>,
}

impl Client {
    /// Connect to an RPC-over-RDMA server.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, String> {
        let shape = Shape {
            send_wr: SLOTS as u32,
            recv_wr: SLOTS as u32,
            region_bytes: 2 * SLOTS * SLOT_BYTES + PAYLOAD_BYTES,
            ours: Private { send: SLOT_BYTES as u32, recv: SLOT_BYTES as u32, remote_invalidate: false },
            notify: false,
        };
        let q = Qp::connect(addr, timeout, shape, &mut |q| (0..SLOTS).try_for_each(|i| q.post_recv(i as u64, i * SLOT_BYTES, SLOT_BYTES)))?;
        Ok(Client { q: Some(q), next_send: 0, sends_in_flight: 0, closed: None })
    }

    fn q(&self) -> &Qp {
        self.q.as_ref().expect("connected")
    }

    /// Registered memory the server may read (Read chunks) or write (Write
    /// and Reply chunks): (bytes, address, rkey).
    pub fn payload(&self) -> (&mut [u8], u64, u32) {
        let r = self.q().region();
        let at = 2 * SLOTS * SLOT_BYTES;
        (r.slice(at, PAYLOAD_BYTES), r.addr(at), r.rkey)
    }

    /// Post one transport message (Send); does not wait.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), String> {
        if msg.len() > SLOT_BYTES {
            return Err(format!("message of {} bytes is over the inline size", msg.len()));
        }
        while self.sends_in_flight >= SLOTS - 1 {
            self.poll()?;
        }
        let slot = SLOTS + self.next_send;
        self.next_send = (self.next_send + 1) % SLOTS;
        self.q().region().slice(slot * SLOT_BYTES, msg.len()).copy_from_slice(msg);
        self.q().post_send(1 << 32, slot * SLOT_BYTES, msg.len())?;
        self.sends_in_flight += 1;
        Ok(())
    }

    /// Poll once: a received message, or None.
    fn poll(&mut self) -> Result<Option<Vec<u8>>, String> {
        let mut wc = [ibv_wc::default(); 16];
        let n = unsafe { verbs::poll_cq(self.q().cq, &mut wc) };
        let mut got = None;
        for w in wc.iter().take(n.max(0) as usize) {
            if w.status != verbs::IBV_WC_SUCCESS {
                self.closed.get_or_insert_with(|| format!("work completion failed: {}", verbs::wc_status(w.status)));
                if w.wr_id >> 32 == 1 {
                    self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                }
                continue;
            }
            if w.opcode == verbs::IBV_WC_RECV {
                let i = w.wr_id as usize;
                let msg = self.q().region().slice(i * SLOT_BYTES, w.byte_len as usize).to_vec();
                self.q().post_recv(i as u64, i * SLOT_BYTES, SLOT_BYTES)?;
                got = Some(msg);
                break;
            } else if w.wr_id >> 32 == 1 {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
            }
        }
        Ok(got)
    }

    /// The next message from the server.
    pub fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>, Gone> {
        let start = Instant::now();
        loop {
            match self.poll() {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => return Err(Gone::Closed(e)),
            }
            if let Some(why) = &self.closed {
                return Err(Gone::Closed(why.clone()));
            }
            if let Some(q) = self.q.as_mut() {
                if let Ok(Some((verbs::CM_DISCONNECTED, _, _))) = q.next_event(Duration::ZERO) {
                    self.closed = Some("the server disconnected".into());
                }
            }
            if start.elapsed() > timeout {
                return Err(Gone::Timeout);
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Wait until the server closes the connection (true) or `timeout`.
    pub fn wait_closed(&mut self, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            match self.recv(Duration::from_millis(50)) {
                Err(Gone::Closed(_)) => return true,
                _ => continue,
            }
        }
        false
    }

    /// Close from our side now (as a client that dies mid-call).
    pub fn abort(mut self) {
        self.q = None;
    }
}

/// An ONC RPC call with AUTH_NONE (no record mark).
pub fn rpc_call(xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(40 + args.len());
    for w in [xid, 0, 2, prog, vers, proc_, 0, 0, 0, 0] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v.extend_from_slice(args);
    v
}

/// A transport header: (position, handle, length, offset) read segments,
/// one optional Write chunk and an optional Reply chunk of (handle, length,
/// offset) segments.
pub fn header(
    xid: u32,
    vers: u32,
    credit: u32,
    proc_: u32,
    reads: &[(u32, u32, u32, u64)],
    write: Option<&[(u32, u32, u64)]>,
    reply: Option<&[(u32, u32, u64)]>,
) -> Vec<u8> {
    let mut v = Vec::new();
    let mut w = |x: u32| v.extend_from_slice(&x.to_be_bytes());
    for x in [xid, vers, credit, proc_] {
        w(x);
    }
    for &(pos, h, len, off) in reads {
        for x in [1, pos, h, len, (off >> 32) as u32, off as u32] {
            w(x);
        }
    }
    w(0);
    if let Some(segs) = write {
        w(1);
        w(segs.len() as u32);
        for &(h, len, off) in segs {
            for x in [h, len, (off >> 32) as u32, off as u32] {
                w(x);
            }
        }
    }
    w(0);
    match reply {
        Some(segs) => {
            w(1);
            w(segs.len() as u32);
            for &(h, len, off) in segs {
                for x in [h, len, (off >> 32) as u32, off as u32] {
                    w(x);
                }
            }
        }
        None => w(0),
    }
    v
}

/// An NFSv3 NULL call over RDMA (RDMA_MSG, no chunks).
pub fn null_message(xid: u32) -> Vec<u8> {
    let mut m = header(xid, wire::VERSION, 32, wire::RDMA_MSG, &[], None, None);
    m.extend(rpc_call(xid, 100003, 3, 0, &[]));
    m
}

/// What a reply message is: (xid, proc, RDMA_ERROR code when proc is
/// RDMA_ERROR, whether an inline RPC reply says MSG_ACCEPTED/SUCCESS).
pub fn classify(m: &[u8]) -> (u32, u32, Option<u32>, bool) {
    let w = |i: usize| m.get(i * 4..i * 4 + 4).map_or(u32::MAX, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let (xid, proc_) = (w(0), w(3));
    if proc_ == wire::RDMA_ERROR {
        return (xid, proc_, Some(w(4)), false);
    }
    let ok = match wire::parse(m) {
        Ok(wire::Message::Call(h)) => {
            let body = &m[h.len..];
            let b = |i: usize| body.get(i * 4..i * 4 + 4).map_or(u32::MAX, |x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]));
            // xid, REPLY, MSG_ACCEPTED, verf flavor, verf length 0, SUCCESS
            b(1) == 1 && b(2) == 0 && b(4) == 0 && b(5) == 0
        }
        _ => false,
    };
    (xid, proc_, None, ok)
}
