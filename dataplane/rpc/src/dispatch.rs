//! Call-header processing and dispatch (RFC 5531 §8–§9): version and
//! authentication checks, program/version/procedure lookup, the duplicate-
//! request cache, reply headers, and per-procedure metrics.

use crate::drc::{Drc, DrcKey, Lookup};
use crate::lend::Lender;
use crate::metrics::{self, OpId};
use crate::record;
use crate::{Auth, CallContext, CallError, Program};
use proto::xdr::{Decoder, Encoder, XdrError};
use std::net::SocketAddr;
use crate::backchannel::ReplySink;
use std::sync::atomic::{AtomicU64, Ordering};
use crate::park::{ParkSlot, Parking, Resumed};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// Log the first few dropped REPLY records, then one in this many.
const LOG_FIRST: u64 = 8;
const LOG_EVERY: u64 = 1000;

// RFC 5531 constants (msg_type, reply_stat, accept_stat, reject_stat,
// auth_stat, auth_flavor).
const CALL: u32 = 0;
const REPLY: u32 = 1;
const MSG_ACCEPTED: u32 = 0;
const MSG_DENIED: u32 = 1;
const SUCCESS: u32 = 0;
const PROG_UNAVAIL: u32 = 1;
const PROG_MISMATCH: u32 = 2;
const PROC_UNAVAIL: u32 = 3;
const GARBAGE_ARGS: u32 = 4;
const SYSTEM_ERR: u32 = 5;
const RPC_MISMATCH: u32 = 0;
const AUTH_ERROR: u32 = 1;
const AUTH_BADCRED: u32 = 1;
const AUTH_TOOWEAK: u32 = 5;
const AUTH_NONE: u32 = 0;
const AUTH_SYS: u32 = 1;
const RPC_VERSION: u32 = 2;
/// RFC 5531: opaque_auth bodies are at most 400 bytes.
const AUTH_BODY_MAX: u32 = 400;
/// RFC 5531 appendix A: machinename<255>, gids<16>.
const MACHINE_NAME_MAX: u32 = 255;
const GIDS_MAX: u32 = 16;

/// Enforced per-transport limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest record (all fragments) accepted; larger closes the connection.
    pub record_bytes_max: usize,
    /// Largest reply record produced (sizes reply buffers; READ counts are
    /// capped below it).
    pub reply_bytes_max: usize,
    /// Calls decoded on one connection whose replies are not yet sent; the
    /// transport stops reading the connection at this depth.
    pub inflight_per_conn_max: usize,
    /// Open connections across all cores; more are accepted and closed.
    pub conns_max: usize,
    /// Calls parked on slow backends (see [`crate::park`]), per connection
    /// and per core, and the record bytes a core keeps for them; at each
    /// bound the transport stops reading (connections of) the core.
    pub parked_per_conn_max: usize,
    pub parked_per_core_max: usize,
    pub parked_bytes_per_core_max: usize,
    /// Large buffers per core, lent to connections while a record larger
    /// than a connection's own receive buffer (16 KiB) arrives, or a reply
    /// larger than its own reply buffer (8 KiB) is built: each receive
    /// buffer holds `record_bytes_max` + 64 KiB, each reply buffer twice
    /// `reply_bytes_max`. At the bound, connections wait for one.
    pub recv_buffers_per_core: usize,
    pub reply_buffers_per_core: usize,
    /// Duplicate-request cache bounds.
    pub drc_entries_max: usize,
    pub drc_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            record_bytes_max: (1 << 20) + 4096,
            reply_bytes_max: (1 << 20) + 4096,
            inflight_per_conn_max: 128,
            conns_max: 1024,
            parked_per_conn_max: 64,
            parked_per_core_max: 1024,
            parked_bytes_per_core_max: 64 << 20,
            recv_buffers_per_core: 32,
            reply_buffers_per_core: 32,
            drc_entries_max: 8192,
            drc_bytes_max: 16 << 20,
        }
    }
}

/// The transport's view of one connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo {
    pub conn_id: u64,
    pub peer: SocketAddr,
    pub core: usize,
}

/// What to do after handling one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A reply record (record mark included) of this many bytes was written.
    Reply(usize),
    /// Nothing to send (e.g. a REPLY message arriving on the fore channel).
    Nothing,
    /// The call parked (see [`crate::park`]): its reply comes from
    /// `Dispatcher::resume` once the transport routes the completion back.
    Parked,
    /// The record is unusable beyond any reply (no xid): close the connection.
    Close,
}

struct Registered {
    prog: Arc<dyn Program>,
    /// Metric ids for procedures 0..PROCS_MAX; beyond that, `other`.
    proc_ops: Vec<OpId>,
}

const PROCS_MAX: u32 = 64;

pub struct Dispatcher {
    programs: Vec<Registered>,
    /// Receives REPLY records (answers to our back-channel calls) and
    /// connection closes.
    reply_sink: Option<Arc<dyn ReplySink>>,
    /// REPLY records dropped for want of a sink (logged sparingly).
    replies_unrouted: AtomicU64,
    drc: Drc,
    pub limits: Limits,
    op_garbage: OpId,
}

impl Dispatcher {
    pub fn new(limits: Limits) -> Self {
        assert!(limits.record_bytes_max >= 1024 && limits.reply_bytes_max >= 1024);
        assert!(limits.inflight_per_conn_max >= 1 && limits.conns_max >= 1);
        assert!(limits.parked_per_conn_max >= 1 && limits.parked_per_core_max >= limits.parked_per_conn_max);
        assert!(limits.parked_bytes_per_core_max >= limits.record_bytes_max);
        assert!(limits.recv_buffers_per_core >= 1 && limits.reply_buffers_per_core >= 1);
        Dispatcher {
            programs: Vec::new(),
            reply_sink: None,
            replies_unrouted: AtomicU64::new(0),
            drc: Drc::new(limits.drc_entries_max, limits.drc_bytes_max),
            limits,
            op_garbage: metrics::register_op("rpc", "rejected"),
        }
    }

    /// Register a program version. Procedure names come from the program for
    /// metrics.
    pub fn register(&mut self, prog: Arc<dyn Program>, name: &'static str, proc_names: &[&'static str]) {
        assert!(
            !self.programs.iter().any(|r| r.prog.program() == prog.program() && r.prog.version() == prog.version()),
            "program {} version {} registered twice",
            prog.program(),
            prog.version()
        );
        let proc_ops = (0..PROCS_MAX as usize)
            .map(|i| metrics::register_op(name, proc_names.get(i).copied().unwrap_or("other")))
            .collect();
        self.programs.push(Registered { prog, proc_ops });
    }

    /// Route REPLY records and connection closes to `sink` (the program
    /// that makes server-initiated calls). One sink per dispatcher.
    pub fn set_reply_sink(&mut self, sink: Arc<dyn ReplySink>) {
        assert!(self.reply_sink.is_none(), "reply sink set twice");
        self.reply_sink = Some(sink);
    }

    /// The transport closed `conn` (called once per connection).
    pub fn conn_closed(&self, conn: &ConnInfo) {
        if let Some(s) = &self.reply_sink {
            s.conn_closed(conn.conn_id);
        }
    }

    /// Handle one complete record; write the reply record into `out`.
    pub fn handle(&self, conn: &ConnInfo, record: &[u8], out: &mut [u8]) -> Outcome {
        self.handle_lending(conn, record, out, None)
    }

    /// `handle`, where the reply may also lend buffers through `lender`:
    /// after `Outcome::Reply(n)`, `lender.take()` holds what goes on the wire
    /// inside the `n` bytes written (the record mark counts them).
    pub fn handle_lending(&self, conn: &ConnInfo, record: &[u8], out: &mut [u8], lender: Option<&Lender>) -> Outcome {
        self.run(conn, record, Out::One(out), lender, None, None, Instant::now()).0
    }

    /// `handle_lending`, where a call whose backend must wait may park in
    /// `slot` (then `Outcome::Parked`; nothing was written to `out`).
    pub fn handle_parking(
        &self,
        conn: &ConnInfo,
        record: &[u8],
        out: &mut [u8],
        lender: Option<&Lender>,
        slot: &dyn ParkSlot,
    ) -> Outcome {
        self.run(conn, record, Out::One(out), lender, Some(slot), None, Instant::now()).0
    }

    /// `handle_parking` with two places for the reply: `direct` (the end of
    /// a connection's small reply buffer) when the program bounds this
    /// call's reply within it (`Program::reply_bytes_bound`), else
    /// `scratch` (room for any reply). Returns the outcome and whether the
    /// reply is in `scratch` (the transport then copies it).
    #[allow(clippy::too_many_arguments)]
    pub fn handle_split(
        &self,
        conn: &ConnInfo,
        record: &[u8],
        direct: &mut [u8],
        scratch: &mut [u8],
        lender: Option<&Lender>,
        slot: &dyn ParkSlot,
    ) -> (Outcome, bool) {
        self.run(conn, record, Out::Split { direct, scratch }, lender, Some(slot), None, Instant::now())
    }

    /// Run a parked call again with its completion (`payload`; `None` when
    /// cancelled): `record` and `state` are what it parked with, `started`
    /// when it first arrived (its latency counts the wait). The reply is
    /// copied, never lent. With `lender`, a READ still marks where its data
    /// lies (`Lender::mark_ddp`: an RDMA transport moves it with RDMA
    /// Writes). With `slot`, the call may park again (`Outcome::Parked`: a
    /// COMPOUND whose later operations wait too — on the backend, or for
    /// their log flush); without one it runs to its reply here.
    #[allow(clippy::too_many_arguments)]
    pub fn resume(
        &self,
        conn: &ConnInfo,
        record: &[u8],
        state: &[u8],
        payload: Option<&(dyn Any + Send)>,
        out: &mut [u8],
        started: Instant,
        lender: Option<&Lender>,
        slot: Option<&dyn ParkSlot>,
    ) -> Outcome {
        let resumed = Resumed { state, payload };
        let (o, _) = self.run(conn, record, Out::One(out), lender, slot, Some(resumed), started);
        debug_assert!(lender.is_none_or(|l| l.lent_len() == 0), "a resumed call lent buffers");
        assert!(slot.is_some() || o != Outcome::Parked, "a resumed call parked with nowhere to park");
        o
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        conn: &ConnInfo,
        record: &[u8],
        out: Out<'_>,
        lender: Option<&Lender>,
        slot: Option<&dyn ParkSlot>,
        resumed: Option<Resumed<'_>>,
        started: Instant,
    ) -> (Outcome, bool) {
        let mut d = Decoder::new(record);
        let Ok(xid) = d.u32() else { return (Outcome::Close, false) };
        let Ok(mtype) = d.u32() else { return (Outcome::Close, false) };
        if mtype == REPLY {
            // An answer to one of our back-channel calls: never answered,
            // whatever it holds; the sink validates the rest.
            match &self.reply_sink {
                Some(s) => s.reply(conn, xid, record),
                None => {
                    let n = self.replies_unrouted.fetch_add(1, Ordering::Relaxed);
                    if n < LOG_FIRST || n % LOG_EVERY == 0 {
                        eprintln!("rpc: REPLY xid {xid:#x} from {} with no back channel: dropped ({} so far)", conn.peer, n + 1);
                    }
                }
            }
            return (Outcome::Nothing, false);
        }
        if mtype != CALL {
            // Neither CALL nor REPLY: nothing to answer, nothing to route.
            return (Outcome::Nothing, false);
        }
        let parsed = parse_call(&mut d);
        let args = d.rest();
        let reg = parsed.as_ref().ok().and_then(|h| self.programs.iter().find(|r| r.prog.program() == h.prog && r.prog.version() == h.vers));
        let bound = match (&parsed, reg) {
            (Ok(h), Some(r)) => r.prog.reply_bytes_bound(h.proc_num, args).map(|b| b + REPLY_HEADER_BYTES),
            _ => Some(REJECT_REPLY_BYTES),
        };
        let (out, in_scratch) = out.pick(bound);
        assert!(out.len() >= 64, "reply buffer too small");
        let (body_at, mut e) = start_reply(out, xid);
        let header = match parsed {
            Ok(h) => h,
            Err(HeaderError::RpcVersion) => {
                denied_rpc_mismatch(&mut e);
                return (self.finish_rejected(e, body_at, started, record.len()), in_scratch);
            }
            Err(HeaderError::BadCred) => {
                denied_auth(&mut e, AUTH_BADCRED);
                return (self.finish_rejected(e, body_at, started, record.len()), in_scratch);
            }
            Err(HeaderError::Garbage) => {
                accepted(&mut e, GARBAGE_ARGS);
                return (self.finish_rejected(e, body_at, started, record.len()), in_scratch);
            }
        };
        let Some(reg) = reg else {
            let versions = self.programs.iter().filter(|r| r.prog.program() == header.prog).map(|r| r.prog.version());
            match (versions.clone().min(), versions.max()) {
                (Some(low), Some(high)) => {
                    accepted(&mut e, PROG_MISMATCH);
                    let _ = e.u32(low);
                    let _ = e.u32(high);
                }
                _ => accepted(&mut e, PROG_UNAVAIL),
            }
            return (self.finish_rejected(e, body_at, started, record.len()), in_scratch);
        };
        let op = reg.proc_ops[header.proc_num.min(PROCS_MAX - 1) as usize];
        let drc_key = (!reg.prog.idempotent(header.proc_num)).then(|| DrcKey {
            addr: conn.peer.ip(),
            xid,
            prog: header.prog,
            vers: header.vers,
            proc_num: header.proc_num,
            args_hash: DrcKey::hash_args(args),
        });
        let parking = slot.map(|s| Parking::new(s, record));
        let ctx = CallContext {
            xid,
            prog: header.prog,
            vers: header.vers,
            proc_num: header.proc_num,
            auth: header.auth,
            conn_id: conn.conn_id,
            peer: conn.peer,
            core: conn.core,
            // A reply the cache keeps is copied whole.
            lend: if drc_key.is_none() { lender } else { None },
            park: parking.as_ref(),
            resumed,
        };
        let accept_at = e.position();
        accepted(&mut e, SUCCESS);
        let results_at = e.position();
        if let (Some(key), None) = (&drc_key, &resumed) {
            match self.drc.lookup(key, e.spare()) {
                Lookup::Hit(n) => {
                    // A retransmission: answer with the reply of the first execution.
                    e.advance(n);
                    return (self.finish(e, body_at, op, started, record.len(), true, 0), in_scratch);
                }
                // Its first execution is parked; its reply answers.
                Lookup::InProgress => return (Outcome::Nothing, in_scratch),
                Lookup::Miss => {}
            }
        }
        let ok = match reg.prog.call(&ctx, args, &mut e) {
            Ok(()) if ctx.park.is_some_and(|p| p.parked()) => {
                // The reply comes later, from `resume`; what was written
                // here is discarded (nothing of it was lent).
                debug_assert!(ctx.lend.is_none_or(|l| l.lent_len() == 0));
                if let Some(key) = drc_key {
                    self.drc.begin(key);
                }
                return (Outcome::Parked, false);
            }
            Ok(()) => true,
            Err(err) => {
                if let Some(l) = ctx.lend {
                    l.discard();
                }
                e.truncate(accept_at);
                match err {
                    CallError::ProcUnavail => accepted(&mut e, PROC_UNAVAIL),
                    CallError::GarbageArgs => accepted(&mut e, GARBAGE_ARGS),
                    CallError::SystemErr => accepted(&mut e, SYSTEM_ERR),
                    CallError::AuthTooWeak => denied_auth(&mut e, AUTH_TOOWEAK),
                }
                false
            }
        };
        if ok {
            if let Some(key) = drc_key {
                self.drc.insert(key, &e.written()[results_at..]);
            }
        }
        let lent = ctx.lend.map_or(0, |l| l.lent_len());
        (self.finish(e, body_at, op, started, record.len(), ok, lent), in_scratch)
    }

    fn finish_rejected(&self, e: Encoder<'_>, body_at: usize, started: Instant, bytes_in: usize) -> Outcome {
        self.finish(e, body_at, self.op_garbage, started, bytes_in, false, 0)
    }

    fn finish(
        &self,
        mut e: Encoder<'_>,
        body_at: usize,
        op: OpId,
        started: Instant,
        bytes_in: usize,
        ok: bool,
        lent: usize,
    ) -> Outcome {
        let len = e.position();
        let body = len - body_at + lent;
        e.patch_u32(0, u32::from_be_bytes(record::header(body)));
        metrics::record(op, started.elapsed().as_nanos() as u64, bytes_in as u64, (len + lent) as u64, ok);
        Outcome::Reply(len)
    }
}

/// Bytes before a program's results in an accepted reply: record mark,
/// xid, REPLY, MSG_ACCEPTED, a null verifier, accept_stat (rounded up).
const REPLY_HEADER_BYTES: usize = 32;
/// Largest rejection (PROG_MISMATCH with its range, denials), rounded up.
const REJECT_REPLY_BYTES: usize = 64;

/// Where a reply may be written.
enum Out<'o> {
    One(&'o mut [u8]),
    /// A small buffer, and a scratch buffer with room for any reply.
    Split { direct: &'o mut [u8], scratch: &'o mut [u8] },
}

impl<'o> Out<'o> {
    /// The buffer for a reply of at most `bound` bytes (`None`: unknown),
    /// and whether it is the scratch buffer.
    fn pick(self, bound: Option<usize>) -> (&'o mut [u8], bool) {
        match self {
            Out::One(b) => (b, false),
            Out::Split { direct, scratch } => match bound {
                Some(n) if n.max(REJECT_REPLY_BYTES) <= direct.len() => (direct, false),
                _ => (scratch, true),
            },
        }
    }
}

struct CallHeader<'a> {
    prog: u32,
    vers: u32,
    proc_num: u32,
    auth: Auth<'a>,
}

enum HeaderError {
    RpcVersion,
    BadCred,
    Garbage,
}

impl From<XdrError> for HeaderError {
    fn from(_: XdrError) -> Self {
        HeaderError::Garbage
    }
}

/// call_body (RFC 5531 §9) after xid and msg_type.
fn parse_call<'a>(d: &mut Decoder<'a>) -> Result<CallHeader<'a>, HeaderError> {
    let rpcvers = d.u32()?;
    if rpcvers != RPC_VERSION {
        return Err(HeaderError::RpcVersion);
    }
    let prog = d.u32()?;
    let vers = d.u32()?;
    let proc_num = d.u32()?;
    let flavor = d.u32()?;
    let body = d.opaque_var(AUTH_BODY_MAX).map_err(|_| HeaderError::BadCred)?;
    let auth = match flavor {
        AUTH_NONE => Auth::None,
        AUTH_SYS => parse_authsys(body).map_err(|_| HeaderError::BadCred)?,
        _ => return Err(HeaderError::BadCred),
    };
    // Verifier: accepted and ignored for AUTH_NONE / AUTH_SYS.
    let _verf_flavor = d.u32()?;
    let _verf = d.opaque_var(AUTH_BODY_MAX)?;
    Ok(CallHeader { prog, vers, proc_num, auth })
}

/// authsys_parms (RFC 5531 appendix A).
fn parse_authsys(body: &[u8]) -> Result<Auth<'_>, XdrError> {
    let mut d = Decoder::new(body);
    let stamp = d.u32()?;
    let machine_name = d.opaque_var(MACHINE_NAME_MAX)?;
    let uid = d.u32()?;
    let gid = d.u32()?;
    let n = d.array_len(GIDS_MAX, 4)?;
    let at = d.position();
    d.skip(n * 4)?;
    Ok(Auth::Sys { stamp, machine_name, uid, gid, gids: &body[at..at + n * 4] })
}

/// Write record mark placeholder + xid + REPLY; returns where the body starts.
fn start_reply(out: &mut [u8], xid: u32) -> (usize, Encoder<'_>) {
    let mut e = Encoder::new(out);
    e.reserve(4).unwrap();
    e.u32(xid).unwrap();
    e.u32(REPLY).unwrap();
    (4, e)
}

/// MSG_ACCEPTED with a null verifier and `stat` (the caller adds any body).
fn accepted(e: &mut Encoder<'_>, stat: u32) {
    let _ = e.u32(MSG_ACCEPTED);
    let _ = e.u32(AUTH_NONE);
    let _ = e.u32(0);
    let _ = e.u32(stat);
}

fn denied_rpc_mismatch(e: &mut Encoder<'_>) {
    let _ = e.u32(MSG_DENIED);
    let _ = e.u32(RPC_MISMATCH);
    let _ = e.u32(RPC_VERSION);
    let _ = e.u32(RPC_VERSION);
}

fn denied_auth(e: &mut Encoder<'_>, stat: u32) {
    let _ = e.u32(MSG_DENIED);
    let _ = e.u32(AUTH_ERROR);
    let _ = e.u32(stat);
}
