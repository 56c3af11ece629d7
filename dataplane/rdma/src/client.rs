//! A raw RPC-over-RDMA client over the same binding: connects with RFC 8797
//! private data, sends transport messages it builds itself (well-formed or
//! not) and reads what comes back. `chimera-rdma-probe` uses it for NULL
//! round trips and for the hostile-input suite; it is not an NFS client.

use crate::mem::Region;
use crate::verbs::{self, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_wc, rdma_cm_event, rdma_cm_id, rdma_conn_param};
use crate::wire::{self, Private};
use std::ffi::c_void;
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
    ch: *mut verbs::rdma_event_channel,
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    cq: *mut c_void,
    qp: *mut c_void,
    mem: Option<Region>,
    next_send: usize,
    sends_in_flight: usize,
    closed: Option<String>,
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl Client {
    /// Connect to an RPC-over-RDMA server.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, String> {
        let l = verbs::lib()?;
        let ch = unsafe { (l.create_event_channel)() };
        if ch.is_null() {
            return Err(os_err("rdma_create_event_channel"));
        }
        let mut c = Client {
            ch,
            id: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            mem: None,
            next_send: 0,
            sends_in_flight: 0,
            closed: None,
        };
        if unsafe { (l.create_id)(ch, &mut c.id, std::ptr::null_mut(), verbs::RDMA_PS_TCP) } != 0 {
            return Err(os_err("rdma_create_id"));
        }
        let (sa, _) = verbs::sockaddr(&addr);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        if unsafe { (l.resolve_addr)(c.id, std::ptr::null(), &sa as *const _ as *const libc::sockaddr, ms) } != 0 {
            return Err(os_err("rdma_resolve_addr"));
        }
        c.expect_event(verbs::CM_ADDR_RESOLVED, timeout)?;
        if unsafe { (l.resolve_route)(c.id, ms) } != 0 {
            return Err(os_err("rdma_resolve_route"));
        }
        c.expect_event(verbs::CM_ROUTE_RESOLVED, timeout)?;
        let v = unsafe { (*c.id).verbs };
        c.pd = unsafe { (l.alloc_pd)(v) };
        if c.pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        c.cq = unsafe { (l.create_cq)(v, 1024, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if c.cq.is_null() {
            return Err(os_err("ibv_create_cq"));
        }
        let mut attr = verbs::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: c.cq,
            recv_cq: c.cq,
            srq: std::ptr::null_mut(),
            max_send_wr: SLOTS as u32,
            max_recv_wr: SLOTS as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            qp_type: verbs::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        if unsafe { (l.create_qp)(c.id, c.pd, &mut attr) } != 0 {
            return Err(os_err("rdma_create_qp"));
        }
        c.qp = unsafe { (*c.id).qp };
        let access = verbs::IBV_ACCESS_LOCAL_WRITE | verbs::IBV_ACCESS_REMOTE_READ | verbs::IBV_ACCESS_REMOTE_WRITE;
        c.mem = Some(Region::new(c.pd, 2 * SLOTS * SLOT_BYTES + PAYLOAD_BYTES, access)?);
        for i in 0..SLOTS {
            c.post_recv(i)?;
        }
        let ours = Private { send: SLOT_BYTES as u32, recv: SLOT_BYTES as u32, remote_invalidate: false }.encode();
        let mut p = rdma_conn_param {
            private_data: ours.as_ptr() as *const c_void,
            private_data_len: ours.len() as u8,
            responder_resources: 16,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        };
        if unsafe { (l.connect)(c.id, &mut p) } != 0 {
            return Err(os_err("rdma_connect"));
        }
        c.expect_event(verbs::CM_ESTABLISHED, timeout)?;
        Ok(c)
    }

    fn expect_event(&mut self, want: u32, timeout: Duration) -> Result<(), String> {
        match self.next_event(timeout)? {
            Some((e, _)) if e == want => Ok(()),
            Some((e, status)) => Err(format!("connection manager event {e} (status {status}) while waiting for {want}")),
            None => Err(format!("no connection manager event {want} within {timeout:?}")),
        }
    }

    /// The next connection-manager event (kind, status), waiting up to `timeout`.
    fn next_event(&mut self, timeout: Duration) -> Result<Option<(u32, i32)>, String> {
        let l = verbs::lib()?;
        let mut pfd = libc::pollfd { fd: unsafe { (*self.ch).fd }, events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
            return Ok(None);
        }
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        if unsafe { (l.get_cm_event)(self.ch, &mut ev) } != 0 {
            return Err(os_err("rdma_get_cm_event"));
        }
        let r = unsafe { ((*ev).event, (*ev).status) };
        unsafe { (l.ack_cm_event)(ev) };
        Ok(Some(r))
    }

    fn region(&self) -> &Region {
        self.mem.as_ref().expect("registered")
    }

    fn post_recv(&mut self, i: usize) -> Result<(), String> {
        let r = self.region();
        let mut sge = ibv_sge { addr: r.addr(i * SLOT_BYTES), length: SLOT_BYTES as u32, lkey: r.lkey };
        let mut wr = ibv_recv_wr { wr_id: i as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        if unsafe { verbs::post_recv(self.qp, &mut wr) } != 0 {
            return Err("ibv_post_recv failed".into());
        }
        Ok(())
    }

    /// Registered memory the server may read (Read chunks) or write (Write
    /// and Reply chunks): (bytes, address, rkey).
    pub fn payload(&self) -> (&mut [u8], u64, u32) {
        let r = self.region();
        let at = 2 * SLOTS * SLOT_BYTES;
        (r.slice(at, PAYLOAD_BYTES), r.addr(at), r.rkey)
    }

    /// Post one transport message (Send); does not wait.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), String> {
        if msg.len() > SLOT_BYTES {
            return Err(format!("message of {} bytes is over the inline size", msg.len()));
        }
        while self.sends_in_flight >= SLOTS - 1 {
            self.poll(Duration::from_millis(10))?;
        }
        let slot = SLOTS + self.next_send;
        self.next_send = (self.next_send + 1) % SLOTS;
        let r = self.region();
        r.slice(slot * SLOT_BYTES, msg.len()).copy_from_slice(msg);
        let mut sge = ibv_sge { addr: r.addr(slot * SLOT_BYTES), length: msg.len() as u32, lkey: r.lkey };
        let mut wr = ibv_send_wr::new(1 << 32, &mut sge, verbs::IBV_WR_SEND, verbs::IBV_SEND_SIGNALED, 0, 0);
        if unsafe { verbs::post_send(self.qp, &mut wr) } != 0 {
            return Err("ibv_post_send failed".into());
        }
        self.sends_in_flight += 1;
        Ok(())
    }

    /// Poll once: a received message, or None.
    fn poll(&mut self, _t: Duration) -> Result<Option<Vec<u8>>, String> {
        let mut wc = [ibv_wc::default(); 16];
        let n = unsafe { verbs::poll_cq(self.cq, &mut wc) };
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
                let r = self.region();
                let msg = r.slice(i * SLOT_BYTES, w.byte_len as usize).to_vec();
                self.post_recv(i)?;
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
            match self.poll(Duration::ZERO) {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => return Err(Gone::Closed(e)),
            }
            if let Some(why) = &self.closed {
                return Err(Gone::Closed(why.clone()));
            }
            if let Ok(Some((e, _))) = self.next_event(Duration::ZERO) {
                if e == verbs::CM_DISCONNECTED {
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
        self.teardown();
    }

    fn teardown(&mut self) {
        let Ok(l) = verbs::lib() else { return };
        unsafe {
            if !self.id.is_null() {
                (l.disconnect)(self.id);
                if !self.qp.is_null() {
                    (l.destroy_qp)(self.id);
                    self.qp = std::ptr::null_mut();
                }
            }
            self.mem = None;
            if !self.cq.is_null() {
                (l.destroy_cq)(self.cq);
                self.cq = std::ptr::null_mut();
            }
            if !self.pd.is_null() {
                (l.dealloc_pd)(self.pd);
                self.pd = std::ptr::null_mut();
            }
            if !self.id.is_null() {
                (l.destroy_id)(self.id);
                self.id = std::ptr::null_mut();
            }
            if !self.ch.is_null() {
                (l.destroy_event_channel)(self.ch);
                self.ch = std::ptr::null_mut();
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.teardown();
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
