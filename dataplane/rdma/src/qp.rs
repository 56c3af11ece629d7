//! The requester's side of an RPC-over-RDMA connection, up to the point
//! where messages flow: an event channel, the id resolved to the server's
//! address and route, a protection domain, one completion queue (with a
//! completion channel when the caller sleeps in poll(2)), a reliable
//! connected queue pair, one registered region, and RFC 8797 private data
//! exchanged. Torn down in reverse on drop.

use crate::mem::Region;
use crate::verbs::{self, ibv_recv_wr, ibv_sge, rdma_cm_event, rdma_cm_id, rdma_conn_param};
use crate::wire::Private;
use std::ffi::c_void;
use std::net::SocketAddr;
use std::time::Duration;

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// What to build.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Work requests each way on the queue pair.
    pub send_wr: u32,
    pub recv_wr: u32,
    /// Bytes of the one registered region (local write, remote read and
    /// write: the server reads Read chunks from it and writes Reply chunks
    /// into it).
    pub region_bytes: usize,
    /// Our private data: the inline sizes we send and can receive.
    pub ours: Private,
    /// A completion channel (a descriptor to sleep on) for the queue.
    pub notify: bool,
}

/// A connected queue pair and what it owns.
pub struct Qp {
    pub ch: *mut verbs::rdma_event_channel,
    pub id: *mut rdma_cm_id,
    pub pd: *mut c_void,
    /// The completion channel (`Shape::notify`), else null.
    pub comp: *mut c_void,
    pub cq: *mut c_void,
    pub qp: *mut c_void,
    pub mem: Option<Region>,
    /// The server's private data (`None`: it sent none of ours; RFC 8166's
    /// 1 KiB default applies).
    pub theirs: Option<Private>,
}

impl Qp {
    /// Resolve, build and connect; `post_recvs` posts the receives (before
    /// the connection is accepted, so the server's first message finds one).
    pub fn connect(addr: SocketAddr, timeout: Duration, shape: Shape, post_recvs: &mut dyn FnMut(&Qp) -> Result<(), String>) -> Result<Qp, String> {
        let l = verbs::lib()?;
        let ch = unsafe { (l.create_event_channel)() };
        if ch.is_null() {
            return Err(os_err("rdma_create_event_channel"));
        }
        let mut q = Qp {
            ch,
            id: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            comp: std::ptr::null_mut(),
            cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
            mem: None,
            theirs: None,
        };
        if unsafe { (l.create_id)(ch, &mut q.id, std::ptr::null_mut(), verbs::RDMA_PS_TCP) } != 0 {
            return Err(os_err("rdma_create_id"));
        }
        let (sa, _) = verbs::sockaddr(&addr);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        if unsafe { (l.resolve_addr)(q.id, std::ptr::null(), &sa as *const _ as *const libc::sockaddr, ms) } != 0 {
            return Err(os_err(&format!("rdma_resolve_addr {addr} (no RDMA device reaches it?)")));
        }
        q.expect_event(verbs::CM_ADDR_RESOLVED, timeout)?;
        if unsafe { (l.resolve_route)(q.id, ms) } != 0 {
            return Err(os_err("rdma_resolve_route"));
        }
        q.expect_event(verbs::CM_ROUTE_RESOLVED, timeout)?;
        let v = unsafe { (*q.id).verbs };
        q.pd = unsafe { (l.alloc_pd)(v) };
        if q.pd.is_null() {
            return Err(os_err("ibv_alloc_pd"));
        }
        if shape.notify {
            q.comp = unsafe { (l.create_comp_channel)(v) };
            if q.comp.is_null() {
                return Err(os_err("ibv_create_comp_channel"));
            }
        }
        let cqe = (shape.send_wr + shape.recv_wr) as i32;
        q.cq = unsafe { (l.create_cq)(v, cqe, std::ptr::null_mut(), q.comp, 0) };
        if q.cq.is_null() {
            return Err(os_err("ibv_create_cq"));
        }
        let mut attr = verbs::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: q.cq,
            recv_cq: q.cq,
            srq: std::ptr::null_mut(),
            max_send_wr: shape.send_wr,
            max_recv_wr: shape.recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            qp_type: verbs::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        if unsafe { (l.create_qp)(q.id, q.pd, &mut attr) } != 0 {
            return Err(os_err("rdma_create_qp"));
        }
        q.qp = unsafe { (*q.id).qp };
        let access = verbs::IBV_ACCESS_LOCAL_WRITE | verbs::IBV_ACCESS_REMOTE_READ | verbs::IBV_ACCESS_REMOTE_WRITE;
        q.mem = Some(Region::new(q.pd, shape.region_bytes, access)?);
        post_recvs(&q)?;
        let ours = shape.ours.encode();
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
        if unsafe { (l.connect)(q.id, &mut p) } != 0 {
            return Err(os_err("rdma_connect"));
        }
        match q.next_event(timeout)? {
            Some((e, _, private)) if e == verbs::CM_ESTABLISHED => q.theirs = private.as_deref().and_then(Private::decode),
            Some((verbs::CM_REJECTED, status, _)) => return Err(format!("{addr} refused the RDMA connection (status {status}: at its connection limit, or not an RPC-over-RDMA server)")),
            Some((e, status, _)) => return Err(format!("connection manager event {e} (status {status}) while connecting to {addr}")),
            None => return Err(format!("no answer from {addr} within {timeout:?}")),
        }
        Ok(q)
    }

    fn expect_event(&mut self, want: u32, timeout: Duration) -> Result<(), String> {
        match self.next_event(timeout)? {
            Some((e, _, _)) if e == want => Ok(()),
            Some((e, status, _)) => Err(format!("connection manager event {e} (status {status}) while waiting for {want}")),
            None => Err(format!("no connection manager event {want} within {timeout:?}")),
        }
    }

    /// The next connection-manager event (kind, status, private data),
    /// waiting up to `timeout`.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<(u32, i32, Option<Vec<u8>>)>, String> {
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
        let (kind, status, p) = unsafe { ((*ev).event, (*ev).status, &(*ev).conn) };
        let private = (!p.private_data.is_null() && p.private_data_len > 0)
            .then(|| unsafe { std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize) }.to_vec());
        unsafe { (l.ack_cm_event)(ev) };
        Ok(Some((kind, status, private)))
    }

    /// The connection manager's descriptor (readable: an event waits).
    pub fn cm_fd(&self) -> i32 {
        unsafe { (*self.ch).fd }
    }

    pub fn region(&self) -> &Region {
        self.mem.as_ref().expect("registered")
    }

    /// Post one receive of `len` bytes at `at` of the region, `wr_id` its id.
    pub fn post_recv(&self, wr_id: u64, at: usize, len: usize) -> Result<(), String> {
        let r = self.region();
        let mut sge = ibv_sge { addr: r.addr(at), length: len as u32, lkey: r.lkey };
        let mut wr = ibv_recv_wr { wr_id, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        if unsafe { verbs::post_recv(self.qp, &mut wr) } != 0 {
            return Err("ibv_post_recv failed".into());
        }
        Ok(())
    }

    /// Post one signaled Send of `len` bytes at `at` of the region.
    pub fn post_send(&self, wr_id: u64, at: usize, len: usize) -> Result<(), String> {
        let r = self.region();
        let mut sge = ibv_sge { addr: r.addr(at), length: len as u32, lkey: r.lkey };
        let mut wr = verbs::ibv_send_wr::new(wr_id, &mut sge, verbs::IBV_WR_SEND, verbs::IBV_SEND_SIGNALED, 0, 0);
        if unsafe { verbs::post_send(self.qp, &mut wr) } != 0 {
            return Err(os_err("ibv_post_send"));
        }
        Ok(())
    }

    /// Disconnect now (the peer sees the connection close).
    pub fn disconnect(&mut self) {
        if let (Ok(l), false) = (verbs::lib(), self.id.is_null()) {
            unsafe { (l.disconnect)(self.id) };
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
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
            }
            if !self.comp.is_null() {
                (l.destroy_comp_channel)(self.comp);
            }
            if !self.pd.is_null() {
                (l.dealloc_pd)(self.pd);
            }
            if !self.id.is_null() {
                (l.destroy_id)(self.id);
            }
            if !self.ch.is_null() {
                (l.destroy_event_channel)(self.ch);
            }
        }
    }
}
