//! A thin binding of ours to rdma-core's libibverbs and librdmacm, loaded
//! with dlopen at first use: chimerad starts (and serves TCP) on machines
//! without rdma-core, and only `server.rdma` needs it. Only what the
//! transport uses is bound: the connection manager (listen, accept, reject,
//! disconnect, events), protection domains, memory registration,
//! completion channels and queues, and queue pairs.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq`
//! are inline functions in verbs.h that call through the context's
//! `ibv_context_ops` table; they are reproduced here from that table's
//! (stable, ABI-frozen) layout. The struct layouts below are rdma-core's
//! public ABI on 64-bit Linux; `layout_sizes` in the tests pins them.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_send_wr` with its `wr` union seen as `rdma` (the only use
/// here); the rest of the unions is padding.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _pad: u32,
    _rest: [u64; 9],
}

impl ibv_send_wr {
    pub fn new(wr_id: u64, sge: *mut ibv_sge, opcode: u32, send_flags: u32, remote_addr: u64, rkey: u32) -> Self {
        ibv_send_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
            opcode,
            send_flags,
            imm_data: 0,
            remote_addr,
            rkey,
            _pad: 0,
            _rest: [0; 9],
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

#[repr(C)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// The head of `struct rdma_cm_event` (the union beyond `conn` is unused).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: u32,
    pub status: c_int,
    pub conn: rdma_conn_param,
}

/// The head of `struct rdma_cm_id`, through the route's addresses.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut c_void,
    pub channel: *mut c_void,
    pub context: *mut c_void,
    pub qp: *mut c_void,
    pub src_addr: libc::sockaddr_storage,
    pub dst_addr: libc::sockaddr_storage,
}

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

// Opcodes, flags and enums (verbs.h, rdma_cma.h).
pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_RDMA_READ: u32 = 4;
/// A Send that also invalidates one of the peer's memory registrations
/// (its rkey in `imm_data`, the `invalidate_rkey` side of that union).
pub const IBV_WR_SEND_WITH_INV: u32 = 9;
pub const IBV_SEND_SIGNALED: u32 = 2;
pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_WR_FLUSH_ERR: u32 = 5;
pub const IBV_WC_SEND: u32 = 0;
pub const IBV_WC_RDMA_WRITE: u32 = 1;
pub const IBV_WC_RDMA_READ: u32 = 2;
pub const IBV_WC_RECV: u32 = 128;
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_QPT_RC: u32 = 2;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_ID_TOS: c_int = 0;

pub const CM_ADDR_RESOLVED: u32 = 0;
pub const CM_ROUTE_RESOLVED: u32 = 2;
pub const CM_CONNECT_REQUEST: u32 = 4;
pub const CM_CONNECT_ERROR: u32 = 6;
pub const CM_UNREACHABLE: u32 = 7;
pub const CM_REJECTED: u32 = 8;
pub const CM_ESTABLISHED: u32 = 9;
pub const CM_DISCONNECTED: u32 = 10;
pub const CM_DEVICE_REMOVAL: u32 = 11;
pub const CM_TIMEWAIT_EXIT: u32 = 15;

// Offsets into `struct ibv_context` (its ops table follows the device
// pointer) and other structs read by field.
const OPS_POLL_CQ: usize = 11;
const OPS_REQ_NOTIFY_CQ: usize = 12;
const OPS_POST_SEND: usize = 25;
const OPS_POST_RECV: usize = 26;
const QP_NUM_OFFSET: usize = 52;
const MR_LKEY_OFFSET: usize = 36;
const MR_RKEY_OFFSET: usize = 40;
const COMP_CHANNEL_FD_OFFSET: usize = 8;

type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut ibv_wc) -> c_int;
type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type PostSend = unsafe extern "C" fn(*mut c_void, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
type PostRecv = unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The entry points, resolved once.
pub struct Lib {
    pub alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void,
    pub dereg_mr: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_cq: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    pub destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub get_cq_event: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut c_void, u32),
    pub wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
    pub create_event_channel: unsafe extern "C" fn() -> *mut rdma_event_channel,
    pub destroy_event_channel: unsafe extern "C" fn(*mut rdma_event_channel),
    pub create_id: unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_id, *mut c_void, c_int) -> c_int,
    pub destroy_id: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    pub bind_addr: unsafe extern "C" fn(*mut rdma_cm_id, *const libc::sockaddr) -> c_int,
    pub listen: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    pub resolve_addr: unsafe extern "C" fn(*mut rdma_cm_id, *const libc::sockaddr, *const libc::sockaddr, c_int) -> c_int,
    pub resolve_route: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    pub connect: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    pub get_cm_event: unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int,
    pub ack_cm_event: unsafe extern "C" fn(*mut rdma_cm_event) -> c_int,
    pub accept: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    pub reject: unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u8) -> c_int,
    pub disconnect: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut rdma_cm_id, *mut c_void, *mut ibv_qp_init_attr) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut rdma_cm_id),
    pub set_option: unsafe extern "C" fn(*mut rdma_cm_id, c_int, c_int, *mut c_void, usize) -> c_int,
    pub get_src_port: unsafe extern "C" fn(*mut rdma_cm_id) -> u16,
    pub migrate_id: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int,
}

fn open(name: &str) -> Result<*mut c_void, String> {
    let c = std::ffi::CString::new(name).unwrap();
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        let why = unsafe { CStr::from_ptr(libc::dlerror()) }.to_string_lossy().into_owned();
        return Err(format!("cannot load {name} ({why}): install rdma-core's libibverbs1 and librdmacm1 (and ibverbs-providers for the NIC's driver)"));
    }
    Ok(h)
}

fn sym<T: Copy>(h: *mut c_void, lib: &str, name: &str) -> Result<T, String> {
    let c = std::ffi::CString::new(name).unwrap();
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    if p.is_null() {
        return Err(format!("{lib} has no {name}: rdma-core too old"));
    }
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn load() -> Result<Lib, String> {
    const V: &str = "libibverbs.so.1";
    const C: &str = "librdmacm.so.1";
    let v = open(V)?;
    let c = open(C)?;
    Ok(Lib {
        alloc_pd: sym(v, V, "ibv_alloc_pd")?,
        dealloc_pd: sym(v, V, "ibv_dealloc_pd")?,
        reg_mr: sym(v, V, "ibv_reg_mr")?,
        dereg_mr: sym(v, V, "ibv_dereg_mr")?,
        create_comp_channel: sym(v, V, "ibv_create_comp_channel")?,
        destroy_comp_channel: sym(v, V, "ibv_destroy_comp_channel")?,
        create_cq: sym(v, V, "ibv_create_cq")?,
        destroy_cq: sym(v, V, "ibv_destroy_cq")?,
        get_cq_event: sym(v, V, "ibv_get_cq_event")?,
        ack_cq_events: sym(v, V, "ibv_ack_cq_events")?,
        wc_status_str: sym(v, V, "ibv_wc_status_str")?,
        create_event_channel: sym(c, C, "rdma_create_event_channel")?,
        destroy_event_channel: sym(c, C, "rdma_destroy_event_channel")?,
        create_id: sym(c, C, "rdma_create_id")?,
        destroy_id: sym(c, C, "rdma_destroy_id")?,
        bind_addr: sym(c, C, "rdma_bind_addr")?,
        listen: sym(c, C, "rdma_listen")?,
        resolve_addr: sym(c, C, "rdma_resolve_addr")?,
        resolve_route: sym(c, C, "rdma_resolve_route")?,
        connect: sym(c, C, "rdma_connect")?,
        get_cm_event: sym(c, C, "rdma_get_cm_event")?,
        ack_cm_event: sym(c, C, "rdma_ack_cm_event")?,
        accept: sym(c, C, "rdma_accept")?,
        reject: sym(c, C, "rdma_reject")?,
        disconnect: sym(c, C, "rdma_disconnect")?,
        create_qp: sym(c, C, "rdma_create_qp")?,
        destroy_qp: sym(c, C, "rdma_destroy_qp")?,
        set_option: sym(c, C, "rdma_set_option")?,
        get_src_port: sym(c, C, "rdma_get_src_port")?,
        migrate_id: sym(c, C, "rdma_migrate_id")?,
    })
}

/// rdma-core, loaded on first use (the error names what to install).
pub fn lib() -> Result<&'static Lib, String> {
    static L: OnceLock<Result<Lib, String>> = OnceLock::new();
    L.get_or_init(load).as_ref().map_err(|e| e.clone())
}

unsafe fn op<T: Copy>(obj: *mut c_void, idx: usize) -> T {
    // Every verbs object starts with its `struct ibv_context *`; the ops
    // table sits right after the context's device pointer.
    let ctx = *(obj as *const *const u8);
    let slot = ctx.add(8 + idx * 8) as *const *const c_void;
    std::mem::transmute_copy::<*const c_void, T>(&*slot)
}

/// `ibv_poll_cq`.
pub unsafe fn poll_cq(cq: *mut c_void, wc: &mut [ibv_wc]) -> c_int {
    op::<PollCq>(cq, OPS_POLL_CQ)(cq, wc.len() as c_int, wc.as_mut_ptr())
}

/// `ibv_req_notify_cq` (all completions).
pub unsafe fn req_notify_cq(cq: *mut c_void) -> c_int {
    op::<ReqNotifyCq>(cq, OPS_REQ_NOTIFY_CQ)(cq, 0)
}

/// `ibv_post_send`.
pub unsafe fn post_send(qp: *mut c_void, wr: *mut ibv_send_wr) -> c_int {
    let mut bad = std::ptr::null_mut();
    op::<PostSend>(qp, OPS_POST_SEND)(qp, wr, &mut bad)
}

/// `ibv_post_recv`.
pub unsafe fn post_recv(qp: *mut c_void, wr: *mut ibv_recv_wr) -> c_int {
    let mut bad = std::ptr::null_mut();
    op::<PostRecv>(qp, OPS_POST_RECV)(qp, wr, &mut bad)
}

pub unsafe fn qp_num(qp: *mut c_void) -> u32 {
    *((qp as *const u8).add(QP_NUM_OFFSET) as *const u32)
}

pub unsafe fn mr_keys(mr: *mut c_void) -> (u32, u32) {
    let p = mr as *const u8;
    (*(p.add(MR_LKEY_OFFSET) as *const u32), *(p.add(MR_RKEY_OFFSET) as *const u32))
}

pub unsafe fn comp_channel_fd(ch: *mut c_void) -> c_int {
    *((ch as *const u8).add(COMP_CHANNEL_FD_OFFSET) as *const c_int)
}

pub fn wc_status(s: u32) -> String {
    match lib() {
        Ok(l) => unsafe { CStr::from_ptr((l.wc_status_str)(s)) }.to_string_lossy().into_owned(),
        Err(_) => format!("status {s}"),
    }
}

/// A socket address as C wants it.
pub fn sockaddr(a: &std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        std::net::SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The socket address in a `sockaddr_storage` (unspecified when neither
/// IPv4 nor IPv6).
pub fn from_sockaddr(ss: &libc::sockaddr_storage) -> std::net::SocketAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    match ss.ss_family as c_int {
        libc::AF_INET => {
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes())), u16::from_be(sin.sin_port))
        }
        libc::AF_INET6 => {
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            SocketAddr::new(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)), u16::from_be(sin6.sin6_port))
        }
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// rdma-core's ABI on x86-64 / aarch64 (verbs.h, rdma_cma.h).
    #[test]
    fn layout_sizes() {
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(offset_of!(ibv_send_wr, remote_addr), 40);
        assert_eq!(offset_of!(ibv_send_wr, rkey), 48);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
        assert_eq!(size_of::<rdma_conn_param>(), 24);
        assert_eq!(offset_of!(rdma_cm_event, conn), 24);
        assert_eq!(offset_of!(rdma_cm_id, src_addr), 32);
        assert_eq!(offset_of!(rdma_cm_id, dst_addr), 160);
    }

    #[test]
    fn sockaddr_round_trip() {
        for a in ["10.0.2.15:20049", "[fe80::1]:2049"] {
            let a: std::net::SocketAddr = a.parse().unwrap();
            assert_eq!(from_sockaddr(&sockaddr(&a).0), a);
        }
    }
}
