//! RPC calls over an RPC-over-RDMA v1 connection, the requester's side
//! (RFC 8166), for the userspace client library: the transport under
//! `client::rpc::RpcConn` when it connects with `connect_rdma`.
//!
//! Every call takes one slot of registered memory: an inline send buffer
//! and a body of `slot_bytes` (the largest call or reply the caller
//! allows). A call whose transport header and RPC message fit the server's
//! inline threshold goes inline (RDMA_MSG); a larger one (a WRITE's data)
//! is copied into the body and sent as RDMA_NOMSG with a position-zero Read
//! chunk naming it (§3.5.3), which the server pulls with RDMA Read. Every
//! call also offers the body as its Reply chunk, so a reply larger than
//! our inline threshold (a 4 KiB or 1 MiB READ, a large READDIR) lands
//! there by RDMA Write and comes as RDMA_NOMSG — the server reads the call
//! body before it runs the call, so one region serves both. No Write chunk
//! is offered: the reply arrives whole, contiguous and in XDR order, and
//! the library decodes it as over TCP (one copy, into the reply record).
//!
//! Bounds: at most `slots` calls in flight, further bounded by the credits
//! the server grants (1 until its first reply, RFC 8166 §3.3.1); receives
//! posted for every slot plus `BACKCHANNEL_RECVS` for the server's NFSv4.1
//! back-channel calls (RFC 8167), whose replies go from buffers of their
//! own. Nothing is allocated per call. The region is registered once with
//! remote read and write for its whole length (the server could write
//! any slot; per-call registration, as the Linux client's FRWR, is not
//! done).

use crate::qp::{Qp, Shape};
use crate::verbs::{self, ibv_wc};
use crate::wire::{self, Message, Private, Refused, Segment};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

/// Our inline threshold both ways (what we send inline at most, and the
/// size of each receive buffer).
pub const INLINE_BYTES: usize = 4096;
/// Receives posted beyond the slots, for the server's back-channel calls;
/// as many buffers for our replies to them.
pub const BACKCHANNEL_RECVS: usize = 4;
/// Most slots (calls in flight) of one connection.
pub const SLOTS_MAX: usize = 128;
/// Header of an inline call with its Reply chunk (no Read chunk).
const HEADER_INLINE: usize = wire::HEADER_MIN + 20;

const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_BC: u64 = 3;

fn wr(kind: u64, i: usize) -> u64 {
    kind << 32 | i as u64
}

#[derive(Clone, Copy, Default)]
struct Slot {
    /// The call using the slot (its reply not yet here).
    xid: Option<u32>,
    /// Its Send not yet completed.
    sending: bool,
}

/// Counters of one connection.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counters {
    pub calls_inline: u64,
    /// Calls sent as RDMA_NOMSG with a position-zero Read chunk.
    pub calls_read_chunk: u64,
    pub replies_inline: u64,
    /// Replies that came in the Reply chunk (RDMA_NOMSG).
    pub replies_reply_chunk: u64,
    pub backchannel_calls: u64,
}

pub struct Requester {
    q: Qp,
    epfd: RawFd,
    peer: SocketAddr,
    slot_bytes: usize,
    slots: Vec<Slot>,
    bc_free: Vec<usize>,
    send_inline_max: usize,
    /// Calls the server lets us have in flight.
    granted: usize,
    outstanding: usize,
    sends_in_flight: usize,
    armed: bool,
    closed: Option<String>,
    pub counters: Counters,
}

// The verbs objects are used by one thread at a time (the owner's).
unsafe impl Send for Requester {}

impl Requester {
    /// Connect to an RPC-over-RDMA server: `slots` calls in flight at most
    /// (1..=`SLOTS_MAX`), none larger than `slot_bytes` either way.
    pub fn connect(addr: SocketAddr, timeout: Duration, slots: usize, slot_bytes: usize) -> Result<Requester, String> {
        let slots = slots.clamp(1, SLOTS_MAX);
        let slot_bytes = slot_bytes.max(INLINE_BYTES).next_multiple_of(4096);
        let recvs = slots + BACKCHANNEL_RECVS;
        let shape = Shape {
            send_wr: (slots + BACKCHANNEL_RECVS) as u32,
            recv_wr: recvs as u32,
            region_bytes: slots * (INLINE_BYTES + slot_bytes) + (recvs + BACKCHANNEL_RECVS) * INLINE_BYTES,
            ours: Private { send: INLINE_BYTES as u32, recv: INLINE_BYTES as u32, remote_invalidate: false },
            notify: true,
        };
        let at = Layout { slots, slot_bytes };
        let q = Qp::connect(addr, timeout, shape, &mut |q| (0..recvs).try_for_each(|i| q.post_recv(wr(KIND_RECV, i), at.recv(i), INLINE_BYTES)))?;
        let theirs_recv = q.theirs.map_or(wire::INLINE_DEFAULT, |p| p.recv) as usize;
        for fd in [q.cm_fd(), unsafe { verbs::comp_channel_fd(q.comp) }] {
            let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) };
        }
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(format!("epoll_create1: {}", std::io::Error::last_os_error()));
        }
        for fd in [q.cm_fd(), unsafe { verbs::comp_channel_fd(q.comp) }] {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
            if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                let e = std::io::Error::last_os_error();
                unsafe { libc::close(epfd) };
                return Err(format!("epoll_ctl: {e}"));
            }
        }
        unsafe { verbs::req_notify_cq(q.cq) };
        Ok(Requester {
            q,
            epfd,
            peer: addr,
            slot_bytes,
            slots: vec![Slot::default(); slots],
            bc_free: (0..BACKCHANNEL_RECVS).collect(),
            send_inline_max: theirs_recv.min(INLINE_BYTES),
            granted: 1,
            outstanding: 0,
            sends_in_flight: 0,
            armed: true,
            closed: None,
            counters: Counters::default(),
        })
    }

    fn at(&self) -> Layout {
        Layout { slots: self.slots.len(), slot_bytes: self.slot_bytes }
    }

    /// A descriptor that polls readable when a completion or a connection
    /// event waits (then `poll`).
    pub fn fd(&self) -> RawFd {
        self.epfd
    }

    /// Why the connection is closed, once it is.
    pub fn closed(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    /// The largest call or reply one slot holds.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Calls in flight now, and the most the server's credits and our
    /// slots allow.
    pub fn in_flight(&self) -> (usize, usize) {
        (self.outstanding, self.granted.min(self.slots.len()))
    }

    fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.xid.is_none() && !s.sending)
    }

    /// Whether a call can be posted now (credits, a free slot, room on
    /// the send queue).
    pub fn has_room(&self) -> bool {
        self.closed.is_none() && self.outstanding < self.granted.min(self.slots.len()) && self.free_slot().is_some()
    }

    /// Post call `xid`, its RPC message the concatenation of `parts`.
    pub fn call(&mut self, xid: u32, parts: &[&[u8]]) -> Result<(), String> {
        if let Some(why) = &self.closed {
            return Err(why.clone());
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.slot_bytes {
            return Err(format!("a call of {len} bytes is over the connection's {} bytes", self.slot_bytes));
        }
        if !self.has_room() {
            return Err(format!("no credit: {} calls in flight, {} granted", self.outstanding, self.granted));
        }
        let k = self.free_slot().expect("has_room");
        let at = self.at();
        let r = self.q.region();
        let body = Segment { handle: r.rkey, length: self.slot_bytes as u32, offset: r.addr(at.body(k)) };
        let send = r.slice(at.send(k), INLINE_BYTES);
        let sent = if HEADER_INLINE + len <= self.send_inline_max {
            let mut n = wire::encode_call(send, xid, self.slots.len() as u32, None, Some(body));
            for p in parts {
                send[n..n + p.len()].copy_from_slice(p);
                n += p.len();
            }
            self.counters.calls_inline += 1;
            n
        } else {
            let dst = r.slice(at.body(k), len);
            let mut n = 0;
            for p in parts {
                dst[n..n + p.len()].copy_from_slice(p);
                n += p.len();
            }
            self.counters.calls_read_chunk += 1;
            wire::encode_call(send, xid, self.slots.len() as u32, Some(Segment { length: len as u32, ..body }), Some(body))
        };
        self.q.post_send(wr(KIND_SEND, k), at.send(k), sent).inspect_err(|e| self.close(e))?;
        self.slots[k] = Slot { xid: Some(xid), sending: true };
        self.outstanding += 1;
        self.sends_in_flight += 1;
        Ok(())
    }

    /// Send the REPLY `msg` to a call the server made (back channel).
    pub fn reply(&mut self, xid: u32, msg: &[u8]) -> Result<(), String> {
        if let Some(why) = &self.closed {
            return Err(why.clone());
        }
        if wire::HEADER_MIN + msg.len() > self.send_inline_max {
            return Err(format!("a back-channel reply of {} bytes is over the inline threshold", msg.len()));
        }
        let Some(i) = self.bc_free.pop() else { return Err("every back-channel reply buffer is in use".into()) };
        let at = self.at().bc(i);
        let buf = self.q.region().slice(at, INLINE_BYTES);
        let n = wire::encode_call(buf, xid, self.slots.len() as u32, None, None);
        buf[n..n + msg.len()].copy_from_slice(msg);
        self.q.post_send(wr(KIND_BC, i), at, n + msg.len()).inspect_err(|e| self.close(e))?;
        self.sends_in_flight += 1;
        Ok(())
    }

    /// Close the connection (the reason is what `closed` says).
    pub fn close(&mut self, why: &str) {
        if self.closed.is_none() {
            self.closed = Some(format!("RDMA connection to {}: {why}", self.peer));
            self.q.disconnect();
        }
    }

    /// Take what completed: each RPC message received (a reply, or a call
    /// the server made) is handed to `on_record`, in order. Returns how
    /// many; afterwards `closed` says whether the connection died.
    pub fn poll(&mut self, on_record: &mut dyn FnMut(&[u8])) -> usize {
        if self.closed.is_some() {
            return 0;
        }
        while let Ok(Some((e, status, _))) = self.q.next_event(Duration::ZERO) {
            if matches!(e, verbs::CM_DISCONNECTED | verbs::CM_DEVICE_REMOVAL | verbs::CM_TIMEWAIT_EXIT) {
                self.close(&format!("the server disconnected (event {e}, status {status})"));
                return 0;
            }
        }
        let l = match verbs::lib() {
            Ok(l) => l,
            Err(e) => {
                self.close(&e);
                return 0;
            }
        };
        let mut events = 0;
        loop {
            let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
            if unsafe { (l.get_cq_event)(self.q.comp, &mut cq, &mut ctx) } != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            unsafe { (l.ack_cq_events)(self.q.cq, events) };
            self.armed = false;
        }
        if !self.armed {
            unsafe { verbs::req_notify_cq(self.q.cq) };
            self.armed = true;
        }
        let mut n = 0;
        let mut wc = [ibv_wc::default(); 16];
        loop {
            let got = unsafe { verbs::poll_cq(self.q.cq, &mut wc) };
            if got <= 0 {
                break;
            }
            for w in &wc[..got as usize] {
                n += self.completed(w, on_record);
            }
            if self.closed.is_some() {
                break;
            }
        }
        n
    }

    fn completed(&mut self, w: &ibv_wc, on_record: &mut dyn FnMut(&[u8])) -> usize {
        let (kind, i) = (w.wr_id >> 32, (w.wr_id & 0xffff_ffff) as usize);
        match kind {
            KIND_SEND => {
                self.sends_in_flight -= 1;
                if let Some(s) = self.slots.get_mut(i) {
                    s.sending = false;
                }
            }
            KIND_BC => {
                self.sends_in_flight -= 1;
                self.bc_free.push(i);
            }
            _ => {}
        }
        if w.status != verbs::IBV_WC_SUCCESS {
            self.close(&format!("work completion failed: {}", verbs::wc_status(w.status)));
            return 0;
        }
        if kind != KIND_RECV {
            return 0;
        }
        let at = self.at().recv(i);
        let msg = self.q.region().slice(at, w.byte_len as usize);
        let got = self.received(msg, on_record);
        if self.closed.is_none() {
            if let Err(e) = self.q.post_recv(w.wr_id, at, INLINE_BYTES) {
                self.close(&e);
            }
        }
        got
    }

    fn slot_of(&self, xid: u32) -> Option<usize> {
        self.slots.iter().position(|s| s.xid == Some(xid))
    }

    fn received(&mut self, msg: &[u8], on_record: &mut dyn FnMut(&[u8])) -> usize {
        let h = match wire::parse(msg) {
            Ok(Message::Call(h)) => h,
            Ok(Message::Done) => return 0,
            Err(Refused::PeerError { xid }) => {
                let code = msg.get(16..20).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                let what = match code {
                    wire::ERR_VERS => "ERR_VERS",
                    wire::ERR_CHUNK => "ERR_CHUNK",
                    _ => "an unknown error",
                };
                self.close(&format!("the server answered RDMA_ERROR {what} to call {xid:#x}"));
                return 0;
            }
            Err(e) => {
                self.close(&format!("the server sent a malformed transport header: {e:?}"));
                return 0;
            }
        };
        let slot = self.slot_of(h.xid);
        let body: &[u8] = if h.proc_ == wire::RDMA_NOMSG {
            let (Some(k), Some(rc)) = (slot, h.reply) else {
                self.close(&format!("RDMA_NOMSG for {:#x}, which is no call of ours in flight or has no Reply chunk", h.xid));
                return 0;
            };
            let len = rc.capacity() as usize;
            if len > self.slot_bytes || len < 8 {
                self.close(&format!("a Reply chunk of {len} bytes for {:#x} (the slot holds {})", h.xid, self.slot_bytes));
                return 0;
            }
            self.counters.replies_reply_chunk += 1;
            self.q.region().slice(self.at().body(k), len)
        } else {
            &msg[h.len..]
        };
        let is_reply = body.len() >= 8 && body[4..8] == [0, 0, 0, 1];
        if is_reply {
            if let Some(k) = slot {
                self.slots[k].xid = None;
                self.outstanding -= 1;
            }
            if h.credit > 0 {
                self.granted = (h.credit as usize).min(self.slots.len());
            }
            if h.proc_ == wire::RDMA_MSG {
                self.counters.replies_inline += 1;
            }
        } else {
            self.counters.backchannel_calls += 1;
        }
        on_record(body);
        1
    }
}

impl Drop for Requester {
    fn drop(&mut self) {
        unsafe { libc::close(self.epfd) };
    }
}

/// Where each buffer sits in the region: per slot its send buffer and its
/// body, then the receive buffers, then the back-channel reply buffers.
#[derive(Clone, Copy)]
struct Layout {
    slots: usize,
    slot_bytes: usize,
}

impl Layout {
    fn send(&self, k: usize) -> usize {
        k * (INLINE_BYTES + self.slot_bytes)
    }
    fn body(&self, k: usize) -> usize {
        self.send(k) + INLINE_BYTES
    }
    fn recv(&self, i: usize) -> usize {
        self.slots * (INLINE_BYTES + self.slot_bytes) + i * INLINE_BYTES
    }
    fn bc(&self, i: usize) -> usize {
        self.recv(self.slots + BACKCHANNEL_RECVS + i)
    }
}
