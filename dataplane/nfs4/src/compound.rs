//! The COMPOUND procedure (RFC 8881 §16.2): evaluate operations in order,
//! stop at the first error, and return the results so far.
//!
//! Operations are decoded one at a time (we read the op number, then decode
//! that op's arguments with its generated type), so nothing is decoded past
//! the point where processing stops and no argument array is built. Session
//! rules (§2.10.6): SEQUENCE must come first (or the op must be one of the
//! five allowed alone), and a SEQUENCE's slot is released with the reply
//! cached when the client asked for it.

use crate::error::{fail, Nfs4Error, OpResult};
use crate::park::{self, OpAt};
use crate::state::{SessionId, Stateid};
use crate::Nfs4Program;
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder};
use rpc::{Auth, CallContext, CallError};
use vfs::{Cred, FileHandle};

/// Longest COMPOUND tag accepted (a hostile tag is GARBAGE_ARGS, not a copy).
pub const TAG_BYTES_MAX: u32 = 1024;
/// Supplementary groups carried by AUTH_SYS at most (RFC 5531).
pub const GIDS_MAX: usize = 16;
/// Minor versions served: 1 (RFC 8881) and 2 (RFC 7862). Anything else
/// is NFS4ERR_MINOR_VERS_MISMATCH with no operation evaluated (§16.2.3).
pub const MINOR_VERSIONS: core::ops::RangeInclusive<u32> = 1..=2;
/// Op numbers defined for minor version 1 (RFC 8881 §18): 3 ..= 58.
const OP_FIRST: u32 = 3;
const OP_LAST_V41: u32 = 58;
/// Minor version 2 adds 59 ..= 71 (RFC 7862 §15) and the extended
/// attribute operations 72 ..= 75 (RFC 8276 §8.4, an extension of 4.2).
const OP_LAST_V42: u32 = p::OP_REMOVEXATTR as u32;
/// NFSv4.2 operations accepted in minor version 1 COMPOUNDs too: the
/// flex-files layout (RFC 8435 §9) reports through LAYOUTERROR and
/// LAYOUTSTATS. Every other 4.2 operation in a 4.1 COMPOUND is not an
/// operation of that minor version: NFS4ERR_OP_ILLEGAL (RFC 8881 §15.2,
/// RFC 8178 §4.4.3: a server returns OP_ILLEGAL for an operation its minor
/// version does not define).
const OPS_V42_IN_V41: [u32; 2] = [p::OP_LAYOUTERROR as u32, p::OP_LAYOUTSTATS as u32];

/// Whether `op` is an operation of minor version `minor`.
fn op_known(op: u32, minor: u32) -> bool {
    match minor {
        1 => (OP_FIRST..=OP_LAST_V41).contains(&op) || OPS_V42_IN_V41.contains(&op),
        _ => (OP_FIRST..=OP_LAST_V42).contains(&op),
    }
}

/// The SEQUENCE of this COMPOUND, once it succeeded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seq {
    pub session: SessionId,
    pub slot: u32,
    pub clientid: u64,
    pub cachethis: bool,
    pub response_bytes_max: usize,
    pub response_cached_bytes_max: usize,
}

/// What one COMPOUND carries from op to op (§16.2.3): the current and saved
/// filehandles and stateids, the session, and the caller's identity.
pub(crate) struct Compound<'p> {
    pub prog: &'p Nfs4Program,
    pub conn_id: u64,
    /// The credential the backend sees: the caller's, squashed by the
    /// access rule of the export of the operation's filehandle.
    pub uid: u32,
    pub gid: u32,
    gids: [u32; GIDS_MAX],
    ngids: usize,
    /// The caller's credential as sent (the principal of EXCHANGE_ID).
    pub auth_uid: u32,
    auth_gid: u32,
    auth_ngids: usize,
    pub peer: std::net::IpAddr,
    pub cur: Option<FileHandle>,
    pub saved: Option<FileHandle>,
    pub cur_sid: Option<Stateid>,
    pub saved_sid: Option<Stateid>,
    pub seq: Option<Seq>,
    /// The conflicting lock of a LOCK/LOCKT that ended in NFS4ERR_DENIED.
    pub denied: Option<crate::state::Conflict>,
    /// One word of result body an error carries (LAYOUTGET's
    /// will_signal on LAYOUTTRYLATER, GETDEVICEINFO's mincount on TOOSMALL).
    pub error_body_u32: Option<u32>,
    pub now_ms: u64,
    /// The COMPOUND's minor version (one of `MINOR_VERSIONS`).
    pub minor: u32,
    pub numops: u32,
    pub request_bytes: usize,
    /// Reply position where COMPOUND4res starts.
    pub reply_start: usize,
    /// Where this call may park (see `crate::park`), the operation being
    /// evaluated (for its park state), and the completion a resumed
    /// COMPOUND hands to the operation it parked at.
    pub park: Option<&'p rpc::park::Parking<'p>>,
    /// Where READ marks its data for an RDMA transport (`rpc::lend`).
    pub lend: Option<&'p rpc::lend::Lender>,
    pub op_at: Option<OpAt>,
    pub resumed: Option<rpc::park::Resumed<'p>>,
    /// Where a READ left its data, from the COMPOUND4res start, kept
    /// through a park (`park::pack`) and a worker (`offload`, no `lend`
    /// there): the core marks it again when the reply leaves.
    pub ddp: Option<(usize, usize)>,
}

/// What a COMPOUND carries to the worker that runs the rest of it
/// (`offload`): all of `Compound` but its references to the call.
#[derive(Clone, Copy)]
struct Carry {
    conn_id: u64,
    uid: u32,
    gid: u32,
    gids: [u32; GIDS_MAX],
    ngids: usize,
    auth_uid: u32,
    auth_gid: u32,
    auth_ngids: usize,
    peer: std::net::IpAddr,
    cur: Option<FileHandle>,
    saved: Option<FileHandle>,
    cur_sid: Option<Stateid>,
    saved_sid: Option<Stateid>,
    seq: Option<Seq>,
    now_ms: u64,
    minor: u32,
    numops: u32,
    request_bytes: usize,
    ddp: Option<(usize, usize)>,
}

/// How the operation loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eval {
    Done,
    /// Answered from the slot's reply cache.
    Replay,
    /// An operation parked: the reply comes when the call resumes.
    Parked,
}

pub(crate) enum Step {
    Done,
    /// SEQUENCE found a retransmission: answer from the reply cache.
    Replay,
}

impl<'p> Compound<'p> {
    fn new(prog: &'p Nfs4Program, ctx: &CallContext<'p>, request_bytes: usize, reply_start: usize) -> Self {
        let (uid, gid) = match ctx.auth {
            Auth::Sys { uid, gid, .. } => (uid, gid),
            Auth::None => (Cred::NOBODY.uid, Cred::NOBODY.gid),
        };
        let mut gids = [0u32; GIDS_MAX];
        let mut ngids = 0;
        for g in ctx.auth.gids().take(GIDS_MAX) {
            gids[ngids] = g;
            ngids += 1;
        }
        Compound {
            prog,
            conn_id: ctx.conn_id,
            uid,
            gid,
            gids,
            ngids,
            auth_uid: uid,
            auth_gid: gid,
            auth_ngids: ngids,
            peer: ctx.peer.ip(),
            cur: None,
            saved: None,
            cur_sid: None,
            saved_sid: None,
            seq: None,
            denied: None,
            error_body_u32: None,
            now_ms: prog.now_ms(),
            minor: 1,
            numops: 0,
            request_bytes,
            reply_start,
            park: ctx.park,
            lend: ctx.lend,
            op_at: None,
            resumed: None,
            ddp: None,
        }
    }

    fn carry(&self) -> Carry {
        Carry {
            conn_id: self.conn_id,
            uid: self.uid,
            gid: self.gid,
            gids: self.gids,
            ngids: self.ngids,
            auth_uid: self.auth_uid,
            auth_gid: self.auth_gid,
            auth_ngids: self.auth_ngids,
            peer: self.peer,
            cur: self.cur,
            saved: self.saved,
            cur_sid: self.cur_sid,
            saved_sid: self.saved_sid,
            seq: self.seq,
            now_ms: self.now_ms,
            minor: self.minor,
            numops: self.numops,
            request_bytes: self.request_bytes,
            ddp: self.ddp,
        }
    }

    /// The COMPOUND `k` came from, on a worker: it cannot park, lend or
    /// resume, and its reply starts at 0 of the worker's buffer.
    fn carried(prog: &'p Nfs4Program, k: Carry) -> Self {
        Compound {
            prog,
            conn_id: k.conn_id,
            uid: k.uid,
            gid: k.gid,
            gids: k.gids,
            ngids: k.ngids,
            auth_uid: k.auth_uid,
            auth_gid: k.auth_gid,
            auth_ngids: k.auth_ngids,
            peer: k.peer,
            cur: k.cur,
            saved: k.saved,
            cur_sid: k.cur_sid,
            saved_sid: k.saved_sid,
            seq: k.seq,
            denied: None,
            error_body_u32: None,
            now_ms: k.now_ms,
            minor: k.minor,
            numops: k.numops,
            request_bytes: k.request_bytes,
            reply_start: 0,
            park: None,
            lend: None,
            op_at: None,
            resumed: None,
            ddp: k.ddp,
        }
    }

    /// A READ's data lies at `pos..pos + len` of the reply: the RDMA
    /// transport may place it by Write chunk (`rpc::lend`). The place is
    /// kept too, for a reply that leaves after a park or from a worker.
    pub fn mark_ddp(&mut self, pos: usize, len: usize) {
        if let Some(l) = self.lend {
            l.mark_ddp(pos, len);
        }
        self.ddp = Some((pos - self.reply_start, len));
    }

    /// The worker pool operation `opnum` (its arguments at `d`) must run
    /// on, when its backend waits on another server (`Vfs::offload_pool`:
    /// an `nfs` mount): the backend of PUTFH's handle, of the current
    /// filehandle, and for RENAME, LINK, COPY and CLONE of the saved one
    /// too. Operations that touch only this server's state never move.
    fn offload_pool(&self, opnum: u32, d: &Decoder<'_>) -> Option<&'p vfs::iopool::IoPool> {
        use proto::xdr::Xdr;
        let vfs: &'p dyn vfs::Vfs = &*self.prog.vfs;
        let op = opnum as i32;
        let fh = match op {
            p::OP_PUTFH => FileHandle::from_bytes(p::PUTFH4args::decode(&mut d.clone()).ok()?.object).ok()?,
            op if session_or_client_op(op) => return None,
            p::OP_SEQUENCE
            | p::OP_PUTROOTFH
            | p::OP_PUTPUBFH
            | p::OP_SAVEFH
            | p::OP_RESTOREFH
            | p::OP_GETFH
            | p::OP_OFFLOAD_STATUS
            | p::OP_OFFLOAD_CANCEL => return None,
            p::OP_LOOKUP => {
                let a = p::LOOKUP4args::decode(&mut d.clone()).ok()?;
                return vfs.offload_pool_at(&self.cur?, a.objname);
            }
            _ => self.cur?,
        };
        if let Some(pool) = vfs.offload_pool(&fh) {
            return Some(pool);
        }
        if uses_saved_fh(op) {
            return vfs.offload_pool(&self.saved?);
        }
        None
    }

    fn parked(&self) -> bool {
        self.park.is_some_and(|p| p.parked())
    }

    pub fn cred(&self) -> Cred<'_> {
        Cred { uid: self.uid, gid: self.gid, gids: &self.gids[..self.ngids] }
    }

    /// The current filehandle, or NFS4ERR_NOFILEHANDLE.
    pub fn cur_fh(&self) -> OpResult<FileHandle> {
        self.cur.ok_or(Nfs4Error(p::NFS4ERR_NOFILEHANDLE))
    }

    pub fn saved_fh(&self) -> OpResult<FileHandle> {
        self.saved.ok_or(Nfs4Error(p::NFS4ERR_NOFILEHANDLE))
    }

    /// The client of this COMPOUND's session.
    pub fn clientid(&self) -> OpResult<u64> {
        self.seq.map(|s| s.clientid).ok_or(Nfs4Error(p::NFS4ERR_OP_NOT_IN_SESSION))
    }

    /// Replace the special "current stateid" value (§16.2.3.1.2).
    pub fn resolve_sid(&self, sid: Stateid) -> OpResult<Stateid> {
        if sid == Stateid::CURRENT {
            return self.cur_sid.ok_or(Nfs4Error(p::NFS4ERR_BAD_STATEID));
        }
        Ok(sid)
    }

    /// Reply bytes this COMPOUND may still produce.
    pub fn reply_room(&self, e: &Encoder<'_>) -> usize {
        let used = e.position() - self.reply_start;
        let max = self.seq.map_or(usize::MAX, |s| s.response_bytes_max);
        max.saturating_sub(used).min(e.remaining())
    }

    /// One operation: the sequencing rules of §2.10.6, then dispatch.
    fn step(&mut self, i: u32, opnum: u32, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult<Step> {
        if opnum == p::OP_SEQUENCE as u32 {
            if i != 0 {
                return fail(p::NFS4ERR_SEQUENCE_POS);
            }
            return self.op_sequence(d, e);
        }
        if !op_known(opnum, self.minor) {
            return fail(p::NFS4ERR_OP_ILLEGAL);
        }
        if i == 0 {
            let alone = [
                p::OP_EXCHANGE_ID,
                p::OP_CREATE_SESSION,
                p::OP_DESTROY_SESSION,
                p::OP_BIND_CONN_TO_SESSION,
                p::OP_DESTROY_CLIENTID,
            ];
            if !alone.contains(&(opnum as i32)) {
                return fail(p::NFS4ERR_OP_NOT_IN_SESSION);
            }
            if self.numops != 1 {
                return fail(p::NFS4ERR_NOT_ONLY_OP);
            }
        }
        self.admit(opnum as i32, d)?;
        let before = self.cur;
        self.dispatch(opnum as i32, d, e)?;
        // LOOKUP / LOOKUPP from the pseudo-root into a mount (or back):
        // the new current filehandle's export must admit the client too.
        if matches!(opnum as i32, p::OP_LOOKUP | p::OP_LOOKUPP | p::OP_OPEN) {
            if let (Some(b), Some(now)) = (before, self.cur) {
                if b.export_id != now.export_id && self.prog.access().check(now.export_id, self.peer).is_none() {
                    self.cur = before;
                    return fail(p::NFS4ERR_ACCESS);
                }
            }
        }
        Ok(Step::Done)
    }

    /// The export access check (RFC 8881 §2.6.3.1: the filehandle-setting
    /// operations succeed and the operation that uses the filehandle
    /// answers): an operation that works on the current (and for RENAME /
    /// LINK the saved) filehandle is NFS4ERR_ACCESS unless the rules of its
    /// export (and of the volume it is in, when that has rules) admit the
    /// peer, NFS4ERR_ROFS when it would modify and the
    /// grant is read-only; the credential is squashed as the rule says.
    /// COPY's and CLONE's source (the saved filehandle) must be admitted,
    /// for reading.
    /// Runs before the operation touches the backend, and again on resume.
    /// Operations that only put, save or restore a filehandle, ask SECINFO,
    /// or release state (CLOSE, LOCKU, OPEN_DOWNGRADE, DELEGRETURN,
    /// LAYOUTRETURN, FREE_STATEID) are not checked: a client that lost
    /// access can still let go of what it holds.
    fn admit(&mut self, op: i32, d: &Decoder<'_>) -> OpResult {
        let uses_fh = !matches!(
            op,
            p::OP_PUTFH
                | p::OP_PUTROOTFH
                | p::OP_PUTPUBFH
                | p::OP_SAVEFH
                | p::OP_RESTOREFH
                | p::OP_SECINFO
                | p::OP_SECINFO_NO_NAME
                | p::OP_CLOSE
                | p::OP_LOCKU
                | p::OP_OPEN_DOWNGRADE
                | p::OP_DELEGRETURN
                | p::OP_LAYOUTRETURN
                | p::OP_GETDEVICEINFO
                | p::OP_GETDEVICELIST
        ) && !session_or_client_op(op);
        let table = self.prog.access();
        let mut grant = vfs::clients::Grant::OPEN;
        if uses_fh {
            if let Some(fh) = self.cur {
                grant = table.check_fh(&fh, self.peer).ok_or(Nfs4Error(p::NFS4ERR_ACCESS))?;
            }
            if uses_saved_fh(op) {
                if let Some(fh) = self.saved {
                    let g = table.check_fh(&fh, self.peer).ok_or(Nfs4Error(p::NFS4ERR_ACCESS))?;
                    // COPY and CLONE only read their source (the saved filehandle).
                    if !matches!(op, p::OP_COPY | p::OP_CLONE) {
                        grant.writable &= g.writable;
                    }
                }
            }
            if !grant.writable && modifies(op, d) {
                return fail(p::NFS4ERR_ROFS);
            }
        }
        let c = grant.squash(Cred { uid: self.auth_uid, gid: self.auth_gid, gids: &[] });
        let squashed = c.uid != self.auth_uid || c.gid != self.auth_gid || grant.squash == vfs::clients::Squash::AllSquash;
        self.uid = c.uid;
        self.gid = c.gid;
        self.ngids = if squashed { 0 } else { self.auth_ngids };
        Ok(())
    }

    fn dispatch(&mut self, op: i32, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        match op {
            p::OP_ACCESS => self.op_access(d, e),
            p::OP_CLOSE => self.op_close(d, e),
            p::OP_COMMIT => self.op_commit(d, e),
            p::OP_CREATE => self.op_create(d, e),
            p::OP_DELEGRETURN => self.op_delegreturn(d, e),
            p::OP_GETATTR => self.op_getattr(d, e),
            p::OP_GETFH => self.op_getfh(d, e),
            p::OP_LINK => self.op_link(d, e),
            p::OP_LOCK => self.op_lock(d, e),
            p::OP_LOCKT => self.op_lockt(d, e),
            p::OP_LOCKU => self.op_locku(d, e),
            p::OP_LOOKUP => self.op_lookup(d, e),
            p::OP_LOOKUPP => self.op_lookupp(d, e),
            p::OP_OPEN => self.op_open(d, e),
            p::OP_OPEN_DOWNGRADE => self.op_open_downgrade(d, e),
            p::OP_PUTFH => self.op_putfh(d, e),
            p::OP_PUTPUBFH => self.op_putpubfh(d, e),
            p::OP_PUTROOTFH => self.op_putrootfh(d, e),
            p::OP_READ => self.op_read(d, e),
            p::OP_READDIR => self.op_readdir(d, e),
            p::OP_READLINK => self.op_readlink(d, e),
            p::OP_REMOVE => self.op_remove(d, e),
            p::OP_RENAME => self.op_rename(d, e),
            p::OP_RESTOREFH => self.op_restorefh(d, e),
            p::OP_SAVEFH => self.op_savefh(d, e),
            p::OP_SECINFO => self.op_secinfo(d, e),
            p::OP_SETATTR => self.op_setattr(d, e),
            p::OP_WRITE => self.op_write(d, e),
            p::OP_VERIFY => self.op_verify(d, e),
            p::OP_NVERIFY => self.op_nverify(d, e),
            p::OP_BACKCHANNEL_CTL => self.op_backchannel_ctl(d, e),
            p::OP_BIND_CONN_TO_SESSION => self.op_bind_conn_to_session(d, e),
            p::OP_EXCHANGE_ID => self.op_exchange_id(d, e),
            p::OP_CREATE_SESSION => self.op_create_session(d, e),
            p::OP_DESTROY_SESSION => self.op_destroy_session(d, e),
            p::OP_FREE_STATEID => self.op_free_stateid(d, e),
            p::OP_SECINFO_NO_NAME => self.op_secinfo_no_name(d, e),
            p::OP_TEST_STATEID => self.op_test_stateid(d, e),
            p::OP_DESTROY_CLIENTID => self.op_destroy_clientid(d, e),
            p::OP_RECLAIM_COMPLETE => self.op_reclaim_complete(d, e),
            p::OP_LAYOUTGET => self.op_layoutget(d, e),
            p::OP_GETDEVICEINFO => self.op_getdeviceinfo(d, e),
            p::OP_GETDEVICELIST => self.op_getdevicelist(d, e),
            p::OP_LAYOUTRETURN => self.op_layoutreturn(d, e),
            p::OP_LAYOUTCOMMIT => self.op_layoutcommit(d, e),
            p::OP_LAYOUTERROR => self.op_layouterror(d, e),
            p::OP_LAYOUTSTATS => self.op_layoutstats(d, e),
            p::OP_SEEK => self.op_seek(d, e),
            p::OP_ALLOCATE => self.op_allocate(d, e),
            p::OP_DEALLOCATE => self.op_deallocate(d, e),
            p::OP_READ_PLUS => self.op_read_plus(d, e),
            p::OP_COPY => self.op_copy(d, e),
            p::OP_CLONE => self.op_clone(d, e),
            p::OP_OFFLOAD_STATUS => self.op_offload_status(d, e),
            p::OP_OFFLOAD_CANCEL => self.op_offload_cancel(d, e),
            p::OP_GETXATTR => self.op_getxattr(d, e),
            p::OP_SETXATTR => self.op_setxattr(d, e),
            p::OP_LISTXATTRS => self.op_listxattrs(d, e),
            p::OP_REMOVEXATTR => self.op_removexattr(d, e),
            // Everything else of minor version 1 (delegations, OPENATTR,
            // WANT_DELEGATION, the v4.0-only ops ...) is not supported
            // (RFC 8881 §15.2), nor are the 4.2 operations without a case
            // here (COPY, CLONE, IO_ADVISE, ...: RFC 7862 §13); their
            // arguments are not decoded, since evaluation stops here.
            _ => fail(p::NFS4ERR_NOTSUPP),
        }
    }
}

/// Operations on the session, the client or stateids alone: no filehandle,
/// no backend.
fn session_or_client_op(op: i32) -> bool {
    matches!(
        op,
        p::OP_EXCHANGE_ID
            | p::OP_CREATE_SESSION
            | p::OP_DESTROY_SESSION
            | p::OP_DESTROY_CLIENTID
            | p::OP_BIND_CONN_TO_SESSION
            | p::OP_BACKCHANNEL_CTL
            | p::OP_TEST_STATEID
            | p::OP_FREE_STATEID
            | p::OP_RECLAIM_COMPLETE
    )
}

/// Operations that use the saved filehandle too (RENAME's and LINK's
/// source directory or file, COPY's and CLONE's source).
fn uses_saved_fh(op: i32) -> bool {
    matches!(op, p::OP_RENAME | p::OP_LINK | p::OP_COPY | p::OP_CLONE)
}

/// Whether an operation would change the file system (refused with
/// NFS4ERR_ROFS on a read-only grant): OPEN when it creates or asks for
/// write access, LAYOUTGET for a read-write layout, and the operations that
/// always modify. `d` is at the operation's arguments (peeked, not consumed).
fn modifies(op: i32, d: &Decoder<'_>) -> bool {
    use proto::xdr::Xdr;
    match op {
        p::OP_SETATTR | p::OP_WRITE | p::OP_CREATE | p::OP_REMOVE | p::OP_RENAME | p::OP_LINK | p::OP_COMMIT => true,
        p::OP_ALLOCATE | p::OP_DEALLOCATE | p::OP_SETXATTR | p::OP_REMOVEXATTR | p::OP_COPY | p::OP_CLONE => true,
        p::OP_LAYOUTCOMMIT => true,
        p::OP_OPEN => match p::OPEN4args::decode(&mut d.clone()) {
            Ok(a) => a.share_access & p::OPEN4_SHARE_ACCESS_WRITE != 0 || matches!(a.openhow, p::openflag4::OPEN4_CREATE(_)),
            // The operation answers BADXDR itself.
            Err(_) => false,
        },
        p::OP_LAYOUTGET => match p::LAYOUTGET4args::decode(&mut d.clone()) {
            Ok(a) => a.loga_iomode == p::layoutiomode4::LAYOUTIOMODE4_RW,
            Err(_) => false,
        },
        _ => false,
    }
}

fn xdr_sys(_: proto::xdr::XdrError) -> CallError {
    // The reply buffer cannot hold even the COMPOUND header.
    CallError::SystemErr
}

/// NFSPROC4_COMPOUND (RFC 8881 §16.2).
pub(crate) fn run(
    prog: &Nfs4Program,
    ctx: &CallContext<'_>,
    args: &[u8],
    e: &mut Encoder<'_>,
) -> Result<(), CallError> {
    let mut d = Decoder::new(args);
    let tag = d.opaque_var(TAG_BYTES_MAX).map_err(|_| CallError::GarbageArgs)?;
    let minorversion = d.u32().map_err(|_| CallError::GarbageArgs)?;
    let numops = d.u32().map_err(|_| CallError::GarbageArgs)?;

    let start = e.position();
    if let Some(r) = ctx.resumed {
        return resume(prog, ctx, r, args, minorversion, numops, e);
    }
    let status_at = e.reserve(4).map_err(xdr_sys)?;
    e.opaque_var(tag).map_err(xdr_sys)?;
    let count_at = e.reserve(4).map_err(xdr_sys)?;
    if !MINOR_VERSIONS.contains(&minorversion) {
        // §16.2.3: no operation is evaluated, the result array is empty.
        e.patch_u32(status_at, p::NFS4ERR_MINOR_VERS_MISMATCH as u32);
        return Ok(());
    }

    let mut c = Compound::new(prog, ctx, args.len(), start);
    c.minor = minorversion;
    c.numops = numops;
    let (r, pending) = vfs::durable::deferring(|| evaluate(&mut c, &mut d, e, status_at, count_at, 0));
    let r = match pending {
        Some(p) => when_durable(&c, r, p, start, e),
        None => r,
    };
    finish(&c, r, start, e)
}

/// The COMPOUND's metadata changes are applied but not yet durable (`p`,
/// see `vfs::durable`): a finished COMPOUND parks with its whole reply and
/// a worker flushes; the reply leaves when the flush is done (`resume`),
/// its slot busy until then (also for a COMPOUND that resumed after an
/// operation parked on the backend: it parks a second time). Without a
/// place to park, with a reply too long to keep, or when a later operation
/// parked on the backend (its park comes first), the flush happens here. A failed flush answers
/// SYSTEM_ERR: the reply may not claim changes a crash could lose.
fn when_durable(c: &Compound<'_>, r: Result<Eval, CallError>, p: vfs::durable::Pending, start: usize, e: &mut Encoder<'_>) -> Result<Eval, CallError> {
    if r == Ok(Eval::Done) && !p.is_durable() && e.position() - start <= park::SAVED_REPLY_BYTES_MAX {
        if let Some(parking) = c.park {
            let state = park::pack_durable(c, &e.written()[start..]);
            if let Some(ticket) = parking.park(&state) {
                p.sync_later(Box::new(move |res| ticket.complete(Box::new(res))));
                return Ok(Eval::Parked);
            }
        }
    }
    match p.sync_now() {
        Ok(()) => r,
        Err(_) if r == Ok(Eval::Done) => Err(CallError::SystemErr),
        Err(_) => {
            // Parked on the backend with earlier results written: they
            // stand; the log device failing fails every later change.
            eprintln!("nfs4: a COMPOUND's metadata flush failed while one of its operations was parked");
            r
        }
    }
}

/// Whatever happened, a slot taken by SEQUENCE is released (a slot left
/// busy would answer NFS4ERR_DELAY forever) — unless the COMPOUND parked:
/// the slot stays busy until it resumes and ends here.
fn finish(c: &Compound<'_>, r: Result<Eval, CallError>, start: usize, e: &mut Encoder<'_>) -> Result<(), CallError> {
    if r == Ok(Eval::Parked) {
        return Ok(());
    }
    if let Some(s) = c.seq {
        let bytes = &e.written()[start..];
        let cache = r == Ok(Eval::Done) && s.cachethis && bytes.len() <= s.response_cached_bytes_max;
        c.prog.state().sequence_end(&s.session, s.slot, cache.then_some(bytes));
    }
    r.map(|_| ())
}

/// A parked COMPOUND goes on: the reply so far is written back, the
/// filehandles, stateids and SEQUENCE restored, and evaluation restarts at
/// the parked operation, which takes the completion (`Compound::resumed`).
fn resume(
    prog: &Nfs4Program,
    ctx: &CallContext<'_>,
    r: rpc::park::Resumed<'_>,
    args: &[u8],
    minorversion: u32,
    numops: u32,
    e: &mut Encoder<'_>,
) -> Result<(), CallError> {
    let saved = park::unpack(r.state).ok_or(CallError::SystemErr)?;
    let start = e.position();
    if saved.at.index == park::OFFLOADED {
        // Ran to its end on a worker (`offload`): its whole reply.
        let mut c = Compound::new(prog, ctx, args.len(), start);
        c.seq = saved.seq;
        let out = match r.payload.and_then(|p| p.downcast_ref::<Offloaded>()) {
            Some(Ok(t)) if t.reply.len() <= e.remaining() => {
                e.spare()[..t.reply.len()].copy_from_slice(&t.reply);
                e.advance(t.reply.len());
                if let (Some(l), Some((pos, len))) = (ctx.lend, t.ddp) {
                    l.mark_ddp(start + pos, len);
                }
                Ok(Eval::Done)
            }
            Some(Err(err)) => Err(*err),
            // Too long for this reply buffer, or the worker never answered.
            _ => Err(CallError::SystemErr),
        };
        return finish(&c, out, start, e);
    }
    let room = e.spare();
    if room.len() < saved.reply.len() {
        return Err(CallError::SystemErr);
    }
    room[..saved.reply.len()].copy_from_slice(saved.reply);
    e.advance(saved.reply.len());
    // A READ before the park placed its data (the mark is in the reply kept).
    if let (Some(l), Some((pos, len))) = (ctx.lend, saved.ddp) {
        l.mark_ddp(start + pos, len);
    }
    if saved.at.index == park::DURABLE {
        // Finished before it parked (`when_durable`): only the flush was left.
        let mut c = Compound::new(prog, ctx, args.len(), start);
        c.seq = saved.seq;
        let out = vfs::durable::synced(r.payload).map(|()| Eval::Done).map_err(|_| CallError::SystemErr);
        return finish(&c, out, start, e);
    }
    let mut c = Compound::new(prog, ctx, args.len(), start);
    c.minor = minorversion;
    c.numops = numops;
    c.cur = saved.cur;
    c.saved = saved.saved;
    c.cur_sid = saved.cur_sid;
    c.saved_sid = saved.saved_sid;
    c.seq = saved.seq;
    c.ddp = saved.ddp;
    c.resumed = ctx.resumed;
    let mut d = Decoder::new(args);
    d.skip(saved.at.args_pos).map_err(|_| CallError::SystemErr)?;
    // The rest may park again: at a later data operation, or, once done,
    // for the flush of what it logged (`when_durable`) — the transport
    // keeps it parked, and the core goes on.
    let (out, pending) = vfs::durable::deferring(|| evaluate(&mut c, &mut d, e, start, start + saved.at.count_pos, saved.at.index));
    let out = match pending {
        Some(p) => when_durable(&c, out, p, start, e),
        None => out,
    };
    debug_assert!(c.resumed.is_none(), "the parked operation took its completion");
    finish(&c, out, start, e)
}

/// What the worker of an offloaded COMPOUND completes with: its reply (all
/// of COMPOUND4res) and where a READ left its data in it, or the RPC-level
/// error to answer.
type Offloaded = Result<Tail, CallError>;

struct Tail {
    reply: Vec<u8>,
    ddp: Option<(usize, usize)>,
}

/// The COMPOUND reached an operation whose backend waits on another server
/// (`Compound::offload_pool`): park it and run it from that operation (at
/// `at`, its arguments from there on in `args`) to its end on `pool`, so
/// the core goes on serving other calls. The worker's COMPOUND cannot park:
/// a READ, WRITE or COMMIT later in it waits on the worker too, and a READ
/// keeps its Write-chunk placement (`Tail::ddp`). The slot of its SEQUENCE
/// stays busy until the reply leaves (`resume`). False: it could not park
/// (a bound reached, a long reply so far) and goes on here, inline.
fn offload(c: &Compound<'_>, at: OpAt, args: &[u8], e: &Encoder<'_>, pool: &vfs::iopool::IoPool) -> bool {
    let Some(parking) = c.park else { return false };
    if at.reply_pos > park::SAVED_REPLY_BYTES_MAX {
        return false;
    }
    let so_far = &e.written()[c.reply_start..];
    let state = park::pack(c, OpAt { index: park::OFFLOADED, ..at }, so_far);
    let Some(ticket) = parking.park(&state) else { return false };
    let (prog, carry, args, room) = (c.prog.share(), c.carry(), args.to_vec(), e.remaining());
    let written = so_far.len();
    let mut buf = vec![0u8; written + room];
    buf[..written].copy_from_slice(so_far);
    pool.run(Box::new(move || {
        let done: Offloaded = run_offloaded(&prog, carry, at, &args, buf, written);
        ticket.complete(Box::new(done));
    }));
    true
}

/// On the worker: operations `at.index` on (their arguments `args`), the
/// reply so far the first `written` bytes of `buf`.
fn run_offloaded(prog: &Nfs4Program, k: Carry, at: OpAt, args: &[u8], mut buf: Vec<u8>, written: usize) -> Offloaded {
    let mut c = Compound::carried(prog, k);
    let mut d = Decoder::new(args);
    let (r, n) = {
        let mut e = Encoder::new(&mut buf);
        e.advance(written);
        let r = evaluate(&mut c, &mut d, &mut e, 0, at.count_pos, at.index);
        (r, e.position())
    };
    match r {
        Ok(Eval::Done) => {
            buf.truncate(n);
            Ok(Tail { reply: buf, ddp: c.ddp })
        }
        // No SEQUENCE runs here (no replay), and nothing parks.
        Ok(_) => Err(CallError::SystemErr),
        Err(err) => Err(err),
    }
}

/// The operation loop of §16.2, from operation `first` on (0, or where a
/// parked COMPOUND resumes).
fn evaluate(
    c: &mut Compound<'_>,
    d: &mut Decoder<'_>,
    e: &mut Encoder<'_>,
    status_at: usize,
    count_at: usize,
    first: u32,
) -> Result<Eval, CallError> {
    let start = c.reply_start;
    let mut status = p::NFS4_OK;
    let mut count = first;
    for i in first..c.numops {
        let args_pos = d.position();
        let from_here = d.rest();
        let (opnum, opres, short) = match d.u32() {
            Ok(op) if op_known(op, c.minor) => (op, op, false),
            Ok(op) => (op, p::OP_ILLEGAL as u32, false),
            // Fewer operations than the count says.
            Err(_) => (p::OP_ILLEGAL as u32, p::OP_ILLEGAL as u32, true),
        };
        let op_at = e.position();
        if i > 0 && opnum == opres && c.park.is_some() && !c.parked() {
            if let Some(pool) = c.offload_pool(opnum, d) {
                let at = OpAt { index: i, args_pos, reply_pos: op_at - start, count_pos: count_at - start };
                if offload(c, at, from_here, e, pool) {
                    return Ok(Eval::Parked);
                }
            }
        }
        c.op_at = Some(OpAt { index: i, args_pos, reply_pos: op_at - start, count_pos: count_at - start });
        e.u32(opres).map_err(xdr_sys)?;
        let op_status_at = e.reserve(4).map_err(xdr_sys)?;
        let body_at = e.position();
        let r = if short { Err(Nfs4Error(p::NFS4ERR_BADXDR)) } else { c.step(i, opnum, d, e) };
        if c.parked() {
            return Ok(Eval::Parked);
        }
        count += 1;
        match r {
            Ok(Step::Replay) => {
                replay(c, e)?;
                return Ok(Eval::Replay);
            }
            Ok(Step::Done) => {}
            Err(err) => {
                status = err.0;
                e.truncate(body_at);
                e.patch_u32(op_status_at, err.code());
                c.encode_error_body(opnum as i32, e).map_err(xdr_sys)?;
            }
        }
        // Response limits (§2.10.6.4): the op that crosses them fails.
        if let Some(s) = c.seq {
            let used = e.position() - start;
            // A reply over ca_maxresponsesize is too big whatever was asked.
            let (limit, code) = if s.cachethis && used <= s.response_bytes_max {
                (s.response_cached_bytes_max, p::NFS4ERR_REP_TOO_BIG_TO_CACHE)
            } else {
                (s.response_bytes_max, p::NFS4ERR_REP_TOO_BIG)
            };
            if used > limit && i > 0 {
                e.truncate(op_at);
                e.u32(opres).map_err(xdr_sys)?;
                e.u32(code as u32).map_err(xdr_sys)?;
                if opres == p::OP_SETATTR as u32 {
                    e.u32(0).map_err(xdr_sys)?; // SETATTR4res always has attrsset
                }
                status = code;
            }
        }
        if status != p::NFS4_OK {
            break;
        }
    }
    e.patch_u32(status_at, status as u32);
    e.patch_u32(count_at, count);
    Ok(Eval::Done)
}

/// Answer a retransmission with the reply cached for its slot (§2.10.6.1.1).
fn replay(c: &Compound<'_>, e: &mut Encoder<'_>) -> Result<(), CallError> {
    let seq = c.seq.expect("replay only after a SEQUENCE");
    e.truncate(c.reply_start);
    let st = c.prog.state();
    let cached = st.cached_reply(&seq.session, seq.slot).ok_or(CallError::SystemErr)?;
    let room = e.spare();
    if cached.len() > room.len() {
        return Err(CallError::SystemErr);
    }
    room[..cached.len()].copy_from_slice(cached);
    e.advance(cached.len());
    Ok(())
}

impl Compound<'_> {
    /// Result bodies that exist even when the status is not NFS4_OK.
    fn encode_error_body(&mut self, op: i32, e: &mut Encoder<'_>) -> proto::xdr::Result<()> {
        if op == p::OP_SETATTR {
            // SETATTR4res carries attrsset whatever the status (§18.30).
            e.u32(0)?;
        }
        if let Some(denied) = self.denied.take() {
            crate::ops::encode_denied(&denied, e)?;
        }
        if let Some(w) = self.error_body_u32.take() {
            e.u32(w)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn prog() -> Nfs4Program {
        let fs = Arc::new(vfs::memfs::MemFs::new(vfs::memfs::MemFsConfig { export_id: 1, capacity_bytes: 1 << 20 }));
        Nfs4Program::new_without_reaper(fs, crate::Config { root_export: 1, grace_time_s: 0, ..crate::Config::default() })
    }

    fn ctx<'a>(lend: Option<&'a rpc::lend::Lender>, resumed: Option<rpc::park::Resumed<'a>>) -> CallContext<'a> {
        CallContext {
            xid: 1,
            prog: p::NFS4_PROGRAM,
            vers: 4,
            proc_num: 1,
            auth: Auth::None,
            conn_id: 1,
            peer: "127.0.0.1:700".parse().unwrap(),
            core: 0,
            lend,
            park: None,
            resumed,
        }
    }

    /// COMPOUND4args with an empty tag and no operations (all a resumed
    /// DURABLE or OFFLOADED COMPOUND reads of its arguments).
    const ARGS: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    /// Where COMPOUND4res starts in the resumed call's reply buffer (the
    /// RPC reply header before it).
    const AT: usize = 24;

    /// A COMPOUND4res of `len` bytes: NFS4_OK, empty tag, `len / 4 - 3` words.
    fn reply(len: usize) -> Vec<u8> {
        let mut r = vec![0u8; len];
        r[8..12].copy_from_slice(&((len / 4 - 3) as u32).to_be_bytes());
        r
    }

    /// A READ's Write-chunk placement survives a park for the COMPOUND's log
    /// flush: the resumed reply marks the same bytes (from where its
    /// COMPOUND4res now starts), so an RDMA reply still places the data by
    /// Write chunk instead of needing room inline.
    #[test]
    fn a_read_keeps_its_write_chunk_mark_through_a_durable_park() {
        let prog = prog();
        let c0 = ctx(None, None);
        let mut c = Compound::new(&prog, &c0, ARGS.len(), 0);
        c.ddp = Some((40, 100));
        let state = park::pack_durable(&c, &reply(200));
        let synced: vfs::VfsResult<()> = Ok(());
        let lender = rpc::lend::Lender::new();
        let resumed = rpc::park::Resumed { state: &state, payload: Some(&synced) };
        let mut buf = vec![0u8; 4096];
        let mut e = Encoder::new(&mut buf);
        e.advance(AT);
        run(&prog, &ctx(Some(&lender), Some(resumed)), &ARGS, &mut e).unwrap();
        assert_eq!(e.position(), AT + 200, "the whole reply kept");
        assert_eq!(lender.take_ddp(), Some((AT + 40, 100)));
    }

    /// A park state whose placement lies outside its reply is not ours.
    #[test]
    fn a_placement_outside_the_kept_reply_is_refused() {
        let prog = prog();
        let c0 = ctx(None, None);
        let mut c = Compound::new(&prog, &c0, ARGS.len(), 0);
        c.ddp = Some((150, 100));
        assert!(park::unpack(&park::pack_durable(&c, &reply(200))).is_none());
        c.ddp = Some((usize::MAX - 1, 8));
        assert!(park::unpack(&park::pack_durable(&c, &reply(200))).is_none());
        c.ddp = Some((100, 100));
        assert_eq!(park::unpack(&park::pack_durable(&c, &reply(200))).map(|s| s.ddp), Some(Some((100, 100))));
    }

    /// A COMPOUND that ran to its end on a worker: the core sends the
    /// worker's reply whole, marks the READ data the worker placed, and
    /// answers SYSTEM_ERR for a worker that never answered (a dropped
    /// ticket) or a reply longer than the buffer.
    #[test]
    fn an_offloaded_reply_leaves_whole_with_its_mark() {
        let prog = prog();
        let c0 = ctx(None, None);
        let c = Compound::new(&prog, &c0, ARGS.len(), 0);
        let so_far = reply(16);
        let state = park::pack(&c, OpAt { index: park::OFFLOADED, args_pos: 0, reply_pos: 16, count_pos: 8 }, &so_far);
        let done: Offloaded = Ok(Tail { reply: reply(300), ddp: Some((60, 200)) });
        let lender = rpc::lend::Lender::new();
        let mut buf = vec![0u8; 4096];
        let mut e = Encoder::new(&mut buf);
        e.advance(AT);
        let resumed = rpc::park::Resumed { state: &state, payload: Some(&done) };
        run(&prog, &ctx(Some(&lender), Some(resumed)), &ARGS, &mut e).unwrap();
        assert_eq!(e.written()[AT..], reply(300)[..]);
        assert_eq!(lender.take_ddp(), Some((AT + 60, 200)));

        for payload in [None, Some(&done as &(dyn std::any::Any + Send))] {
            let mut small = vec![0u8; AT + 100];
            let mut e = Encoder::new(&mut small);
            e.advance(AT);
            let resumed = rpc::park::Resumed { state: &state, payload };
            assert_eq!(run(&prog, &ctx(None, Some(resumed)), &ARGS, &mut e), Err(CallError::SystemErr));
        }
    }
}
