//! NFSv4.1 (RFC 8881) over one `RpcConn`: EXCHANGE_ID, CREATE_SESSION with
//! a slot table sized by the server's answer, RECLAIM_COMPLETE, then every
//! COMPOUND behind a SEQUENCE on a free slot with that slot's next
//! sequence id. A COMPOUND of only SEQUENCE renews the lease (`renew`, and
//! `renew_due` says when the caller should tick it).
//!
//! READ / WRITE have submit + finish forms over the pipelined core, each
//! holding one slot until its reply is finished, so at most as many are in
//! flight as the server granted slots.

use crate::error::{xdr, Error, Result};
use crate::rpc::{Auth, Limits, Reply, RpcConn};
use crate::writes::Uncommitted;
use proto::nfs4 as p;
use proto::xdr::Decoder;
use std::time::{Duration, Instant};

pub use p::stateid4 as Stateid;

/// Slots asked for in CREATE_SESSION; the server may grant fewer.
pub const SLOTS_WANTED: u32 = 64;
/// Operations per COMPOUND asked for (SEQUENCE, PUTROOTFH, a path of
/// LOOKUPs, OPEN, GETFH, GETATTR).
pub const OPS_MAX: u32 = 16;
/// Components of a path opened in one COMPOUND, within `OPS_MAX`.
pub const PATH_COMPONENTS_MAX: usize = 10;
/// Bytes of a READ or WRITE payload asked for per COMPOUND.
pub const IO_BYTES_MAX: u32 = 1 << 20;

const ATTR_TYPE: u32 = 1;
const ATTR_SIZE: u32 = 4;
const ATTR_LEASE_TIME: u32 = 10;
const ATTR_FILEID: u32 = 20;
const ATTR_MODE: u32 = 33;

fn nfs4_err(op: i32, code: i32) -> Error {
    let stat = p::nfsstat4::from_i32(code).map_or_else(|| format!("nfsstat4 {code}"), |s| format!("{s:?}"));
    let op = p::nfs_opnum4::from_i32(op).map_or_else(|| format!("op {op}"), |o| format!("{o:?}"));
    Error::Nfs4 { op, stat, code: code as u32 }
}

/// The attributes `getattr` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attr4 {
    pub ftype: u32,
    pub size: u64,
    pub fileid: u64,
    pub mode: u32,
}

/// An open file: its handle and the open stateid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open4 {
    pub fh: Vec<u8>,
    pub stateid: Stateid,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The sequence id of the next request on this slot.
    next_seq: u32,
    busy: bool,
    /// A request on it got no reply (timeout, lost connection): whether
    /// the server executed it is unknown, so neither its sequence id nor
    /// the next is safe to send. Not used again in this session.
    retired: bool,
}

/// A COMPOUND in flight: its xid and the slot it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    pub xid: u32,
    slot: u32,
}

/// An NFSv4.1 client with one session on one connection.
pub struct Nfs41 {
    rpc: RpcConn,
    owner: Vec<u8>,
    verifier: [u8; 8],
    pub clientid: u64,
    pub sessionid: [u8; 16],
    slots: Vec<Slot>,
    lease: Duration,
    last_renew: Instant,
    /// SEQUENCE's sr_status_flags of the last reply (lease trouble,
    /// recallable state: RFC 8881 section 18.46.3).
    pub status_flags: u32,
    /// UNSTABLE writes not yet committed, per file handle.
    uncommitted: Uncommitted,
    /// Whether `finish_write` tracks UNSTABLE answers in `uncommitted`
    /// (`set_track_unstable`).
    track_unstable: bool,
    /// Ask for a back channel on the connection (`SessionOpts`).
    back_wanted: bool,
    /// The highest minor version to ask for (`SessionOpts`).
    minor_max: u32,
    /// The minor version of this client's COMPOUNDs: 2 (NFSv4.2:
    /// LAYOUTERROR, ...) when asked for and the server speaks it, else 1.
    pub minor: u32,
    /// The server granted one (CREATE_SESSION's CONN_BACK_CHAN): its
    /// calls are taken with `next_recall`.
    pub back_channel: bool,
    /// Over RPC-over-RDMA (`SessionOpts::rdma`), reconnects too.
    rdma: bool,
    /// EXCHANGE_ID's eir_flags (the server's pNFS role among them:
    /// `is_pnfs_mds`).
    pub exchange_flags: u32,
}

/// A connection over RDMA or TCP.
fn dial(rdma: bool, addr: &str, auth: &Auth, limits: Limits) -> Result<RpcConn> {
    if rdma {
        RpcConn::connect_rdma(addr, auth, limits)
    } else {
        RpcConn::connect(addr, auth, limits)
    }
}

/// The back channel's RPC program (csa_cb_program).
pub const CB_PROGRAM: u32 = 0x4000_0000;

/// What a session asks for beyond NFSv4.1 (`Nfs41::connect_opts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOpts {
    /// A back channel on the same connection (CREATE_SESSION's
    /// CONN_BACK_CHAN), so that the server can recall layouts: the caller
    /// takes them with `next_recall` whenever the connection was read, and
    /// answers each.
    pub back_channel: bool,
    /// The highest minor version to use (1 or 2); a server that refuses 2
    /// in EXCHANGE_ID gets 1.
    pub minor_max: u32,
    /// Connect (and reconnect) over RPC-over-RDMA (`RpcConn::connect_rdma`).
    pub rdma: bool,
}

/// What a CB_LAYOUTRECALL asks back (RFC 8881 §20.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecallWhat {
    /// The layouts of one file in [offset, offset + length) (length
    /// u64::MAX: to its end); `stateid` is the layout stateid the server
    /// holds for us on it.
    File { fh: Vec<u8>, offset: u64, length: u64, stateid: Stateid },
    /// Every layout of one file system.
    Fsid { major: u64, minor: u64 },
    /// Every layout this client holds.
    All,
}

/// A CB_LAYOUTRECALL to answer with `Nfs41::answer_recall`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recall {
    pub what: RecallWhat,
    /// layoutiomode4: READ 1, RW 2, ANY 3.
    pub iomode: u32,
    /// clora_changed: the layout changed; do not write through the old one.
    pub changed: bool,
    /// The call's xid, tag and CB_SEQUENCE (for the reply).
    xid: u32,
    tag: Vec<u8>,
    seq: p::CB_SEQUENCE4resok,
}

/// Bytes of a CB_COMPOUND reply we build (CB_SEQUENCE + one result).
const CB_REPLY_BYTES_MAX: usize = 512;

fn chan(slots: u32, bytes: u32) -> p::channel_attrs4 {
    p::channel_attrs4 {
        ca_headerpadsize: 0,
        ca_maxrequestsize: bytes,
        ca_maxresponsesize: bytes,
        ca_maxresponsesize_cached: 4096,
        ca_maxoperations: OPS_MAX,
        ca_maxrequests: slots,
        ca_rdma_ird: vec![],
    }
}

/// The results of a COMPOUND after its SEQUENCE, each OK.
fn results<'a>(reply: &'a Reply, skip_sequence: bool) -> Result<(Vec<p::nfs_resop4<'a>>, Option<p::SEQUENCE4resok>)> {
    let body = reply.body();
    let mut d = Decoder::new(body);
    let _status = d.i32().map_err(xdr)?;
    d.opaque_var(1024).map_err(xdr)?;
    let n = d.array_len(OPS_MAX + 1, 8).map_err(xdr)?;
    let mut out = Vec::with_capacity(n);
    let mut seq = None;
    for i in 0..n {
        let at = d.position();
        let head = body.get(at..at + 8).ok_or_else(|| Error::Malformed("COMPOUND result cut short".into()))?;
        let opnum = i32::from_be_bytes(head[..4].try_into().expect("4 bytes"));
        let status = i32::from_be_bytes(head[4..].try_into().expect("4 bytes"));
        let r = <p::nfs_resop4 as proto::xdr::Xdr>::decode(&mut d).map_err(xdr)?;
        if status != 0 {
            return Err(nfs4_err(opnum, status));
        }
        if i == 0 && skip_sequence {
            match r {
                p::nfs_resop4::OP_SEQUENCE(p::SEQUENCE4res::NFS4_OK(ok)) => seq = Some(ok),
                _ => return Err(Error::Malformed(format!("first result is op {opnum}, not SEQUENCE"))),
            }
            continue;
        }
        out.push(r);
    }
    Ok((out, seq))
}

impl Nfs41 {
    /// Connect, EXCHANGE_ID as `owner`, CREATE_SESSION, RECLAIM_COMPLETE and
    /// read the lease time.
    pub fn connect(addr: &str, auth: &Auth, limits: Limits, owner: &[u8]) -> Result<Nfs41> {
        let mut c = Nfs41::unconnected(addr, auth, limits, owner, false)?;
        c.establish()?;
        Ok(c)
    }

    /// A client instance that held `opens` before the server restarted
    /// (e.g. a restarted process that kept its state): connect as `owner`
    /// and reclaim them (see `reestablish_reclaiming`).
    pub fn connect_reclaiming(addr: &str, auth: &Auth, limits: Limits, owner: &[u8], opens: &mut [(Open4, u32)]) -> Result<Nfs41> {
        let mut c = Nfs41::unconnected(addr, auth, limits, owner, false)?;
        c.session_up()?;
        c.reclaim(opens)?;
        c.finish_establish()?;
        Ok(c)
    }

    fn unconnected(addr: &str, auth: &Auth, limits: Limits, owner: &[u8], rdma: bool) -> Result<Nfs41> {
        let rpc = dial(rdma, addr, auth, limits)?;
        // The verifier changes per client instance, so a restarted client's
        // old state is dropped by the server (RFC 8881 section 2.4); it stays
        // the same across `reestablish`.
        let boot = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        let c = Nfs41 {
            rpc,
            owner: owner.to_vec(),
            verifier: boot.to_be_bytes(),
            clientid: 0,
            sessionid: [0; 16],
            slots: Vec::new(),
            lease: Duration::from_secs(90),
            last_renew: Instant::now(),
            status_flags: 0,
            uncommitted: Uncommitted::new(),
            track_unstable: true,
            back_wanted: false,
            minor_max: 1,
            minor: 1,
            back_channel: false,
            rdma,
            exchange_flags: 0,
        };
        Ok(c)
    }

    /// `connect` with `opts` (kept across `reestablish`).
    pub fn connect_opts(addr: &str, auth: &Auth, limits: Limits, owner: &[u8], opts: SessionOpts) -> Result<Nfs41> {
        let mut c = Nfs41::unconnected(addr, auth, limits, owner, opts.rdma)?;
        c.back_wanted = opts.back_channel;
        c.minor_max = opts.minor_max.clamp(1, 2);
        c.establish()?;
        Ok(c)
    }

    /// The next CB_LAYOUTRECALL the server sent on this connection, if any.
    /// Other calls (CB_NULL, operations we do not implement, a wrong
    /// session or program, garbage) are answered here as RFC 8881 and
    /// RFC 5531 say, and never fail the connection. Replays of a sequence
    /// id are answered again (one back-channel slot; recalls are
    /// idempotent). Reads nothing itself: the connection is read while
    /// waiting for replies, or by `RpcConn::on_ready`.
    pub fn next_recall(&mut self) -> Option<Recall> {
        while let Some(rec) = self.rpc.take_call() {
            match self.callback(&rec) {
                Ok(Some(r)) => return Some(r),
                Ok(None) => {}
                Err(reply) => {
                    // Best effort: a connection that fails here fails the
                    // next fore-channel call, which recovers it.
                    let _ = self.rpc.send_reply(&reply);
                }
            }
        }
        None
    }

    /// Decode one call: `Ok(Some)` a recall for the caller, `Ok(None)`
    /// nothing to do, `Err(reply)` answered here.
    fn callback(&mut self, rec: &[u8]) -> std::result::Result<Option<Recall>, Vec<u8>> {
        let mut d = Decoder::new(rec);
        let head = (|| -> proto::xdr::Result<(u32, [u32; 5])> {
            let xid = d.u32()?;
            let w = [d.u32()?, d.u32()?, d.u32()?, d.u32()?, d.u32()?];
            d.u32()?; // credential flavour
            d.opaque_var(400)?;
            d.u32()?; // verifier flavour
            d.opaque_var(400)?;
            Ok((xid, w))
        })();
        let Ok((xid, [_call, rpcvers, prog, _vers, proc_num])) = head else {
            // Not even an RPC header: there is no xid to answer.
            let xid = rec.get(..4).map_or(0, |b| u32::from_be_bytes(b.try_into().expect("4 bytes")));
            return Err(cb_accept_reply(xid, 4, &[]));
        };
        if rpcvers != 2 {
            // MSG_DENIED, RPC_MISMATCH 2..2.
            let mut m = Vec::with_capacity(24);
            for w in [xid, 1, 1, 0, 2, 2] {
                m.extend_from_slice(&w.to_be_bytes());
            }
            return Err(m);
        }
        if prog != CB_PROGRAM {
            return Err(cb_accept_reply(xid, 1, &[])); // PROG_UNAVAIL
        }
        match proc_num {
            0 => return Err(cb_accept_reply(xid, 0, &[])), // CB_NULL
            1 => {}
            _ => return Err(cb_accept_reply(xid, 3, &[])), // PROC_UNAVAIL
        }
        let Ok(args) = <p::CB_COMPOUND4args as proto::xdr::Xdr>::decode(&mut d) else {
            return Err(cb_accept_reply(xid, 4, &[])); // GARBAGE_ARGS
        };
        let tag = args.tag.to_vec();
        if args.minorversion != self.minor {
            return Err(cb_reply(xid, &tag, p::NFS4ERR_MINOR_VERS_MISMATCH, None, &[]));
        }
        let Some(p::nfs_cb_argop4::OP_CB_SEQUENCE(seq)) = args.argarray.first() else {
            return Err(match args.argarray.first() {
                None => cb_reply(xid, &tag, p::NFS4_OK, None, &[]),
                Some(op) => cb_reply(xid, &tag, p::NFS4ERR_SEQUENCE_POS, None, &[(cb_opnum(op), p::NFS4ERR_SEQUENCE_POS)]),
            });
        };
        let bad = if seq.csa_sessionid != self.sessionid || !self.back_channel {
            Some(p::NFS4ERR_BADSESSION)
        } else if seq.csa_slotid != 0 {
            Some(p::NFS4ERR_BADSLOT)
        } else {
            None
        };
        if let Some(status) = bad {
            return Err(cb_reply(xid, &tag, status, None, &[(p::OP_CB_SEQUENCE, status)]));
        }
        let ok = p::CB_SEQUENCE4resok {
            csr_sessionid: seq.csa_sessionid,
            csr_sequenceid: seq.csa_sequenceid,
            csr_slotid: 0,
            csr_highest_slotid: 0,
            csr_target_highest_slotid: 0,
        };
        match args.argarray.get(1) {
            None => Err(cb_sequence_reply(xid, &tag, &ok, None)),
            Some(p::nfs_cb_argop4::OP_CB_LAYOUTRECALL(lr)) if args.argarray.len() == 2 => {
                let what = match &lr.clora_recall {
                    p::layoutrecall4::LAYOUTRECALL4_FILE(f) => {
                        RecallWhat::File { fh: f.lor_fh.to_vec(), offset: f.lor_offset, length: f.lor_length, stateid: f.lor_stateid.clone() }
                    }
                    p::layoutrecall4::LAYOUTRECALL4_FSID(f) => RecallWhat::Fsid { major: f.major, minor: f.minor },
                    p::layoutrecall4::LAYOUTRECALL4_ALL => RecallWhat::All,
                };
                Ok(Some(Recall { what, iomode: lr.clora_iomode as u32, changed: lr.clora_changed, xid, tag, seq: ok }))
            }
            // One operation after CB_SEQUENCE is all we take; others
            // (delegations: we ask for none) are not supported.
            Some(op) => Err(cb_sequence_reply(xid, &tag, &ok, Some((cb_opnum(op), p::NFS4ERR_NOTSUPP)))),
        }
    }

    /// Answer `r` with `status`: NFS4_OK (LAYOUTRETURN follows once the
    /// I/O under the layout is done) or NFS4ERR_NOMATCHING_LAYOUT (none
    /// held: the server forgets it).
    pub fn answer_recall(&mut self, r: &Recall, status: i32) -> Result<()> {
        let reply = cb_sequence_reply(r.xid, &r.tag, &r.seq, Some((p::OP_CB_LAYOUTRECALL, status)));
        self.rpc.send_reply(&reply)
    }

    /// After the server restarted or the connection or session was lost
    /// (BADSESSION, STALE_CLIENTID, every slot retired): a new connection to
    /// `addr`, a new client ID and session. Opens are gone (reopen them);
    /// uncommitted writes stay tracked, so the next COMMIT reports what the
    /// restart lost.
    pub fn reestablish(&mut self, addr: &str, auth: &Auth, limits: Limits) -> Result<()> {
        self.rpc = dial(self.rdma, addr, auth, limits)?;
        self.establish()
    }

    /// After a server restart: a new connection, client ID and session, and
    /// each of `opens` reclaimed in the server's grace period (OPEN with
    /// CLAIM_PREVIOUS, RFC 8881 §8.4.2.1) — its stateid replaced in place —
    /// before RECLAIM_COMPLETE. A server that kept no record of this client
    /// answers NFS4ERR_NO_GRACE (`Error::Nfs4`); reopen then. Uncommitted
    /// writes stay tracked: COMMIT reports the ones the restart lost
    /// (`resend_uncommitted`).
    pub fn reestablish_reclaiming(&mut self, addr: &str, auth: &Auth, limits: Limits, opens: &mut [(Open4, u32)]) -> Result<()> {
        self.rpc = dial(self.rdma, addr, auth, limits)?;
        self.session_up()?;
        self.reclaim(opens)?;
        self.finish_establish()
    }

    /// OPEN CLAIM_PREVIOUS for each of `opens` (stateids replaced in place).
    fn reclaim(&mut self, opens: &mut [(Open4, u32)]) -> Result<()> {
        let owner = self.clientid.to_be_bytes();
        for (o, access) in opens.iter_mut() {
            let ops = [
                p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: &o.fh }),
                p::nfs_argop4::OP_OPEN(p::OPEN4args {
                    seqid: 0,
                    share_access: *access,
                    share_deny: 0,
                    owner: p::state_owner4 { clientid: self.clientid, owner: &owner },
                    openhow: p::openflag4::default(0),
                    claim: p::open_claim4::CLAIM_PREVIOUS(p::open_delegation_type4::OPEN_DELEGATE_NONE),
                }),
            ];
            o.stateid = self.compound(&ops, |r| match r {
                [_, p::nfs_resop4::OP_OPEN(p::OPEN4res::NFS4_OK(ok))] => Ok(ok.stateid.clone()),
                _ => Err(Error::Malformed("reclaim OPEN result".into())),
            })?;
        }
        Ok(())
    }

    /// EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE, lease time.
    fn establish(&mut self) -> Result<()> {
        self.session_up()?;
        self.finish_establish()
    }

    /// EXCHANGE_ID and CREATE_SESSION.
    fn session_up(&mut self) -> Result<()> {
        let c = self;
        let owner = c.owner.clone();
        let exid = p::EXCHANGE_ID4args {
            eia_clientowner: p::client_owner4 { co_verifier: c.verifier, co_ownerid: &owner },
            eia_flags: 0,
            eia_state_protect: p::state_protect4_a::SP4_NONE,
            eia_client_impl_id: vec![],
        };
        let exchange = |c: &mut Nfs41| -> Result<(u64, u32, u32)> {
            let r = c.raw_compound(&[p::nfs_argop4::OP_EXCHANGE_ID(exid.clone())])?;
            match &results(&r, false)?.0[..] {
                [p::nfs_resop4::OP_EXCHANGE_ID(p::EXCHANGE_ID4res::NFS4_OK(ok))] => Ok((ok.eir_clientid, ok.eir_sequenceid, ok.eir_flags)),
                _ => Err(Error::Malformed("EXCHANGE_ID result".into())),
            }
        };
        c.minor = c.minor_max;
        let (clientid, seqid, eir_flags) = match exchange(c) {
            // NFS4ERR_MINOR_VERS_MISMATCH (or anything a 4.1 server says
            // to a 4.2 COMPOUND): 4.1 then.
            Err(e) if c.minor > 1 && !e.is_connection() => {
                c.minor = 1;
                exchange(c)?
            }
            r => r?,
        };
        c.exchange_flags = eir_flags;
        let bytes = (c.rpc.limits().call_bytes_max.min(c.rpc.limits().reply_bytes_max)) as u32;
        let cs = p::CREATE_SESSION4args {
            csa_clientid: clientid,
            csa_sequence: seqid,
            csa_flags: if c.back_wanted { p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN } else { 0 },
            csa_fore_chan_attrs: chan(SLOTS_WANTED, bytes),
            csa_back_chan_attrs: chan(1, 4096),
            csa_cb_program: CB_PROGRAM,
            csa_sec_parms: vec![p::callback_sec_parms4::AUTH_NONE],
        };
        let r = c.raw_compound(&[p::nfs_argop4::OP_CREATE_SESSION(cs)])?;
        let (sid, granted, flags) = match &results(&r, false)?.0[..] {
            [p::nfs_resop4::OP_CREATE_SESSION(p::CREATE_SESSION4res::NFS4_OK(ok))] => {
                (ok.csr_sessionid, ok.csr_fore_chan_attrs.ca_maxrequests, ok.csr_flags)
            }
            _ => return Err(Error::Malformed("CREATE_SESSION result".into())),
        };
        c.back_channel = c.back_wanted && flags & p::CREATE_SESSION4_FLAG_CONN_BACK_CHAN != 0;
        c.rpc.accept_calls(c.back_channel);
        if granted == 0 {
            return Err(Error::Malformed("CREATE_SESSION granted no slots".into()));
        }
        c.clientid = clientid;
        c.sessionid = sid;
        // Never more slots than we asked for, whatever the server says.
        c.slots = vec![Slot { next_seq: 1, busy: false, retired: false }; granted.min(SLOTS_WANTED) as usize];
        Ok(())
    }

    /// RECLAIM_COMPLETE and the lease time.
    fn finish_establish(&mut self) -> Result<()> {
        let c = self;
        c.compound(&[p::nfs_argop4::OP_RECLAIM_COMPLETE(p::RECLAIM_COMPLETE4args { rca_one_fs: false })], |_| Ok(()))?;
        let lease = c.compound(
            &[p::nfs_argop4::OP_PUTROOTFH, p::nfs_argop4::OP_GETATTR(p::GETATTR4args { attr_request: vec![1 << ATTR_LEASE_TIME] })],
            |r| match r {
                [_, p::nfs_resop4::OP_GETATTR(p::GETATTR4res::NFS4_OK(ok))] => {
                    let mut d = Decoder::new(ok.obj_attributes.attr_vals);
                    d.u32().map_err(xdr)
                }
                _ => Err(Error::Malformed("GETATTR lease_time result".into())),
            },
        )?;
        c.lease = Duration::from_secs(lease.max(1) as u64);
        c.last_renew = Instant::now();
        Ok(())
    }

    pub fn rpc(&mut self) -> &mut RpcConn {
        &mut self.rpc
    }

    /// Slots the server granted.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots still usable (granted, minus those retired after a lost reply).
    pub fn usable_slots(&self) -> usize {
        self.slots.iter().filter(|s| !s.retired).count()
    }

    /// Whether the server said it is a pNFS metadata server
    /// (EXCHGID4_FLAG_USE_PNFS_MDS): without it, LAYOUTGET is pointless.
    pub fn is_pnfs_mds(&self) -> bool {
        self.exchange_flags & p::EXCHGID4_FLAG_USE_PNFS_MDS != 0
    }

    /// Slots a `submit` can take now (usable and not in flight).
    pub fn free_slots(&self) -> usize {
        self.slots.iter().filter(|s| !s.retired && !s.busy).count()
    }

    /// The lease time the server announced.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// True once half the lease has passed since the last SEQUENCE answered:
    /// time to `renew` (any COMPOUND renews too).
    pub fn renew_due(&self) -> bool {
        self.last_renew.elapsed() >= self.lease / 2
    }

    /// A COMPOUND of only SEQUENCE: renews the lease.
    pub fn renew(&mut self) -> Result<()> {
        self.compound(&[], |_| Ok(()))
    }

    fn raw_compound(&mut self, ops: &[p::nfs_argop4<'_>]) -> Result<Reply> {
        let x = self.send(ops, None)?;
        self.rpc.wait(x)
    }

    fn send(&mut self, ops: &[p::nfs_argop4<'_>], seq: Option<p::SEQUENCE4args>) -> Result<u32> {
        let n = ops.len() + seq.is_some() as usize;
        if n > OPS_MAX as usize {
            return Err(Error::Invalid(format!("{n} operations, at most {OPS_MAX}")));
        }
        let minor = self.minor;
        self.rpc.submit(100003, 4, 1, &|e| {
            e.opaque_var(b"")?; // tag
            e.u32(minor)?;
            e.u32(n as u32)?;
            if let Some(s) = &seq {
                proto::xdr::Xdr::encode(&p::nfs_argop4::OP_SEQUENCE(s.clone()), e)?;
            }
            for o in ops {
                proto::xdr::Xdr::encode(o, e)?;
            }
            Ok(())
        })
    }

    /// Send `ops` behind a SEQUENCE on a free slot; finish with `finish`.
    pub fn submit(&mut self, ops: &[p::nfs_argop4<'_>]) -> Result<InFlight> {
        let slot = match self.slots.iter().position(|s| !s.busy && !s.retired) {
            Some(s) => s,
            None if self.slots.iter().all(|s| s.retired) => {
                return Err(Error::Invalid("every slot of the session lost a reply: a new session is needed".into()))
            }
            None => return Err(Error::TooManyInFlight { max: self.usable_slots() }),
        };
        let highest = self.slots.iter().rposition(|s| s.busy).map_or(slot, |h| h.max(slot));
        let s = p::SEQUENCE4args {
            sa_sessionid: self.sessionid,
            sa_sequenceid: self.slots[slot].next_seq,
            sa_slotid: slot as u32,
            sa_highest_slotid: highest as u32,
            sa_cachethis: false,
        };
        let xid = self.send(ops, Some(s))?;
        self.slots[slot].busy = true;
        Ok(InFlight { xid, slot: slot as u32 })
    }

    /// Account a COMPOUND's reply (or failure) to its slot and hand the
    /// results after SEQUENCE to `f`.
    pub fn finish<R>(&mut self, fl: InFlight, reply: Result<Reply>, f: impl FnOnce(&[p::nfs_resop4<'_>]) -> Result<R>) -> Result<R> {
        let slot = &mut self.slots[fl.slot as usize];
        slot.busy = false;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                // An RPC-level error is an answer (the server did not run the
                // COMPOUND); no answer at all leaves the slot in doubt.
                if matches!(e, Error::Timeout { .. }) || e.is_connection() {
                    slot.retired = true;
                }
                return Err(e);
            }
        };
        // The server processed SEQUENCE when its first result is there;
        // an RPC-level or SEQUENCE failure leaves the slot's id unchanged.
        let (res, seq) = match results(&reply, true) {
            Ok(v) => v,
            Err(e) => {
                if sequence_ok(&reply) {
                    self.sequence_done();
                    self.slots[fl.slot as usize].next_seq = self.slots[fl.slot as usize].next_seq.wrapping_add(1);
                }
                return Err(e);
            }
        };
        let seq = seq.ok_or_else(|| Error::Malformed("no SEQUENCE result".into()))?;
        if seq.sr_sessionid != self.sessionid || seq.sr_slotid != fl.slot {
            return Err(Error::Malformed("SEQUENCE answered for another session or slot".into()));
        }
        self.slots[fl.slot as usize].next_seq = self.slots[fl.slot as usize].next_seq.wrapping_add(1);
        self.status_flags = seq.sr_status_flags;
        self.sequence_done();
        f(&res)
    }

    fn sequence_done(&mut self) {
        self.last_renew = Instant::now();
    }

    /// One blocking COMPOUND behind SEQUENCE.
    pub fn compound<R>(&mut self, ops: &[p::nfs_argop4<'_>], f: impl FnOnce(&[p::nfs_resop4<'_>]) -> Result<R>) -> Result<R> {
        let fl = self.submit(ops)?;
        let r = self.rpc.wait(fl.xid);
        self.finish(fl, r, f)
    }

    /// PUTROOTFH + LOOKUP of each component of `path`: the handle.
    pub fn lookup_path(&mut self, path: &str) -> Result<Vec<u8>> {
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        if comps.len() > PATH_COMPONENTS_MAX {
            return Err(Error::Invalid(format!("path of {} components, at most {PATH_COMPONENTS_MAX}", comps.len())));
        }
        let mut ops = vec![p::nfs_argop4::OP_PUTROOTFH];
        ops.extend(comps.iter().map(|c| p::nfs_argop4::OP_LOOKUP(p::LOOKUP4args { objname: c.as_bytes() })));
        ops.push(p::nfs_argop4::OP_GETFH);
        self.compound(&ops, |r| match r.last() {
            Some(p::nfs_resop4::OP_GETFH(p::GETFH4res::NFS4_OK(ok))) => Ok(ok.object.to_vec()),
            _ => Err(Error::Malformed("GETFH result".into())),
        })
    }

    /// OPEN `name` in the directory at `dir_path` for `access`
    /// (OPEN4_SHARE_ACCESS_READ 1 / WRITE 2 / BOTH 3); `create` makes it
    /// (UNCHECKED, `mode`) when missing.
    pub fn open(&mut self, dir_path: &str, name: &str, access: u32, create: Option<u32>) -> Result<Open4> {
        let comps: Vec<&str> = dir_path.split('/').filter(|c| !c.is_empty()).collect();
        if comps.len() > PATH_COMPONENTS_MAX {
            return Err(Error::Invalid(format!("path of {} components, at most {PATH_COMPONENTS_MAX}", comps.len())));
        }
        let mode = create.unwrap_or(0).to_be_bytes();
        let openhow = match create {
            Some(_) => p::openflag4::OPEN4_CREATE(p::createhow4::UNCHECKED4(p::fattr4 {
                attrmask: vec![0, 1 << (ATTR_MODE - 32)],
                attr_vals: &mode,
            })),
            None => p::openflag4::default(0), // OPEN4_NOCREATE
        };
        // One open-owner per client for now (the seqid is ignored in 4.1).
        let owner = self.clientid.to_be_bytes();
        let mut ops = vec![p::nfs_argop4::OP_PUTROOTFH];
        ops.extend(comps.iter().map(|c| p::nfs_argop4::OP_LOOKUP(p::LOOKUP4args { objname: c.as_bytes() })));
        ops.push(p::nfs_argop4::OP_OPEN(p::OPEN4args {
            seqid: 0,
            // No delegations: we do not answer CB_RECALL (`next_recall`),
            // and a server with our back channel would otherwise grant
            // them and hold other clients' OPENs (NFS4ERR_DELAY) until it
            // revokes them.
            share_access: access | p::OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
            share_deny: 0,
            owner: p::state_owner4 { clientid: self.clientid, owner: &owner },
            openhow,
            claim: p::open_claim4::CLAIM_NULL(name.as_bytes()),
        }));
        ops.push(p::nfs_argop4::OP_GETFH);
        self.compound(&ops, |r| {
            let n = r.len();
            match (&r[n - 2], &r[n - 1]) {
                (p::nfs_resop4::OP_OPEN(p::OPEN4res::NFS4_OK(o)), p::nfs_resop4::OP_GETFH(p::GETFH4res::NFS4_OK(fh))) => {
                    Ok(Open4 { fh: fh.object.to_vec(), stateid: o.stateid.clone() })
                }
                _ => Err(Error::Malformed("OPEN / GETFH results".into())),
            }
        })
    }

    /// CLOSE an open; returns the final stateid.
    pub fn close(&mut self, o: &Open4) -> Result<Stateid> {
        let ops = [
            p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: &o.fh }),
            p::nfs_argop4::OP_CLOSE(p::CLOSE4args { seqid: 0, open_stateid: o.stateid.clone() }),
        ];
        self.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_CLOSE(p::CLOSE4res::NFS4_OK(s))] => Ok(s.clone()),
            _ => Err(Error::Malformed("CLOSE result".into())),
        })
    }

    pub fn getattr(&mut self, fh: &[u8]) -> Result<Attr4> {
        let want = vec![(1 << ATTR_TYPE) | (1 << ATTR_SIZE) | (1 << ATTR_FILEID), 1 << (ATTR_MODE - 32)];
        let ops = [p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: fh }), p::nfs_argop4::OP_GETATTR(p::GETATTR4args { attr_request: want })];
        self.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_GETATTR(p::GETATTR4res::NFS4_OK(ok))] => decode_attr(&ok.obj_attributes),
            _ => Err(Error::Malformed("GETATTR result".into())),
        })
    }

    pub fn submit_read(&mut self, o: &Open4, offset: u64, count: u32) -> Result<InFlight> {
        let ops = [
            p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: &o.fh }),
            p::nfs_argop4::OP_READ(p::READ4args { stateid: o.stateid.clone(), offset, count: count.min(IO_BYTES_MAX) }),
        ];
        self.submit(&ops)
    }

    /// Finish a READ into `out` (cleared first); returns eof.
    pub fn finish_read(&mut self, fl: InFlight, reply: Result<Reply>, out: &mut Vec<u8>) -> Result<bool> {
        self.finish(fl, reply, |r| match r {
            [_, p::nfs_resop4::OP_READ(p::READ4res::NFS4_OK(ok))] => {
                out.clear();
                out.extend_from_slice(ok.data);
                Ok(ok.eof)
            }
            _ => Err(Error::Malformed("READ result".into())),
        })
    }

    /// Finish a READ into `out`: (bytes read, eof); more data than `out`
    /// holds is malformed.
    pub fn finish_read_into(&mut self, fl: InFlight, reply: Result<Reply>, out: &mut [u8]) -> Result<(usize, bool)> {
        self.finish(fl, reply, |r| match r {
            [_, p::nfs_resop4::OP_READ(p::READ4res::NFS4_OK(ok))] if ok.data.len() <= out.len() => {
                out[..ok.data.len()].copy_from_slice(ok.data);
                Ok((ok.data.len(), ok.eof))
            }
            [_, p::nfs_resop4::OP_READ(p::READ4res::NFS4_OK(ok))] => Err(Error::Malformed(format!("READ of {} bytes answered with {}", out.len(), ok.data.len()))),
            _ => Err(Error::Malformed("READ result".into())),
        })
    }

    pub fn read(&mut self, o: &Open4, offset: u64, count: u32, out: &mut Vec<u8>) -> Result<bool> {
        let fl = self.submit_read(o, offset, count)?;
        let r = self.rpc.wait(fl.xid);
        let eof = self.finish_read(fl, r, out)?;
        if out.len() > count as usize {
            return Err(Error::Malformed(format!("READ of {count} bytes answered with {}", out.len())));
        }
        Ok(eof)
    }

    /// `stable`: FILE_SYNC4 when true, else UNSTABLE4.
    pub fn submit_write(&mut self, o: &Open4, offset: u64, data: &[u8], stable: bool) -> Result<InFlight> {
        if data.len() > IO_BYTES_MAX as usize {
            return Err(Error::Invalid(format!("WRITE of {} bytes, at most {IO_BYTES_MAX}", data.len())));
        }
        let ops = [
            p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: &o.fh }),
            p::nfs_argop4::OP_WRITE(p::WRITE4args {
                stateid: o.stateid.clone(),
                offset,
                stable: if stable { p::stable_how4::FILE_SYNC4 } else { p::stable_how4::UNSTABLE4 },
                data,
            }),
        ];
        self.submit(&ops)
    }

    /// Finish a WRITE of `data` at `offset` to `o`: (count, stored stably,
    /// verifier). An UNSTABLE answer is tracked for `commit` (unless
    /// `set_track_unstable(false)`).
    pub fn finish_write(&mut self, fl: InFlight, reply: Result<Reply>, o: &Open4, offset: u64, data: &[u8]) -> Result<(u32, bool, [u8; 8])> {
        let (count, stable, verf) = self.finish(fl, reply, |r| match r {
            [_, p::nfs_resop4::OP_WRITE(p::WRITE4res::NFS4_OK(ok))] => {
                Ok((ok.count, ok.committed != p::stable_how4::UNSTABLE4, ok.writeverf))
            }
            _ => Err(Error::Malformed("WRITE result".into())),
        })?;
        if count as usize > data.len() {
            return Err(Error::Malformed(format!("WRITE count {count} over the {} bytes sent", data.len())));
        }
        if self.track_unstable {
            self.uncommitted.written(&o.fh, offset, data, count, stable, verf);
        }
        Ok((count, stable, verf))
    }

    pub fn write(&mut self, o: &Open4, offset: u64, data: &[u8], stable: bool) -> Result<(u32, bool, [u8; 8])> {
        let fl = self.submit_write(o, offset, data, stable)?;
        let r = self.rpc.wait(fl.xid);
        self.finish_write(fl, r, o, offset, data)
    }

    /// Off: UNSTABLE answers are not tracked (no range, no copy, nothing
    /// allocated per write), and `commit` answers the server's verifier
    /// without comparing it. For a caller that keeps its own copies and
    /// compares verifiers itself (the fio engine's held writes).
    pub fn set_track_unstable(&mut self, on: bool) {
        self.track_unstable = on;
    }

    /// Bound the copies of unstable data kept for resends.
    pub fn set_held_bytes_max(&mut self, max: usize) {
        self.uncommitted.held_bytes_max = max;
    }

    /// Ranges of `fh` written UNSTABLE and not yet committed.
    pub fn uncommitted(&self, fh: &[u8]) -> Vec<(u64, u32)> {
        self.uncommitted.ranges(fh)
    }

    /// Write again (UNSTABLE, with `o`'s stateid) every uncommitted write of
    /// `o.fh` whose data is held; returns the ranges sent. Follow with
    /// `commit`.
    pub fn resend_uncommitted(&mut self, o: &Open4) -> Result<Vec<(u64, u32)>> {
        let mut held = self.uncommitted.take_held(&o.fh);
        let mut sent = Vec::new();
        while !held.is_empty() {
            let u = held.remove(0);
            let data = u.data.as_ref().expect("held");
            if let Err(e) = self.write(o, u.offset, data, false) {
                held.insert(0, u);
                self.uncommitted.give_back(&o.fh, held);
                return Err(e);
            }
            sent.push((u.offset, u.len));
        }
        Ok(sent)
    }

    /// COMMIT the whole file: the write verifier, or `VerifierChanged` with
    /// the UNSTABLE writes answered under another one (resend them).
    pub fn commit(&mut self, fh: &[u8]) -> Result<[u8; 8]> {
        let ops = [p::nfs_argop4::OP_PUTFH(p::PUTFH4args { object: fh }), p::nfs_argop4::OP_COMMIT(p::COMMIT4args { offset: 0, count: 0 })];
        let verf = self.compound(&ops, |r| match r {
            [_, p::nfs_resop4::OP_COMMIT(p::COMMIT4res::NFS4_OK(ok))] => Ok(ok.writeverf),
            _ => Err(Error::Malformed("COMMIT result".into())),
        })?;
        self.uncommitted.committed(fh, verf)
    }
}

/// Whether a reply's first result is a SEQUENCE that succeeded.
fn sequence_ok(reply: &Reply) -> bool {
    let b = reply.body();
    let mut d = Decoder::new(b);
    (|| -> proto::xdr::Result<bool> {
        d.i32()?;
        d.opaque_var(1024)?;
        if d.u32()? == 0 {
            return Ok(false);
        }
        Ok(d.i32()? == p::OP_SEQUENCE && d.i32()? == 0)
    })()
    .unwrap_or(false)
}

/// Decode the attributes `getattr` asks for, in bit order.
fn decode_attr(f: &p::fattr4<'_>) -> Result<Attr4> {
    let mut a = Attr4::default();
    let mut d = Decoder::new(f.attr_vals);
    for bit in 0..(f.attrmask.len() as u32 * 32) {
        if f.attrmask[(bit / 32) as usize] & (1 << (bit % 32)) == 0 {
            continue;
        }
        match bit {
            ATTR_TYPE => a.ftype = d.u32().map_err(xdr)?,
            ATTR_SIZE => a.size = d.u64().map_err(xdr)?,
            ATTR_FILEID => a.fileid = d.u64().map_err(xdr)?,
            ATTR_MODE => a.mode = d.u32().map_err(xdr)?,
            b => return Err(Error::Malformed(format!("GETATTR returned attribute {b}, not asked for"))),
        }
    }
    Ok(a)
}

/// The opnum of a callback operation (for its NOTSUPP result).
fn cb_opnum(op: &p::nfs_cb_argop4<'_>) -> i32 {
    match op {
        p::nfs_cb_argop4::OP_CB_GETATTR(_) => p::OP_CB_GETATTR,
        p::nfs_cb_argop4::OP_CB_RECALL(_) => p::OP_CB_RECALL,
        p::nfs_cb_argop4::OP_CB_LAYOUTRECALL(_) => p::OP_CB_LAYOUTRECALL,
        p::nfs_cb_argop4::OP_CB_SEQUENCE(_) => p::OP_CB_SEQUENCE,
        p::nfs_cb_argop4::OP_CB_RECALL_ANY(_) => p::OP_CB_RECALL_ANY,
        _ => p::OP_CB_ILLEGAL,
    }
}

/// An accepted RPC reply to a call of the server's: `stat` (0 SUCCESS,
/// 1 PROG_UNAVAIL, 3 PROC_UNAVAIL, 4 GARBAGE_ARGS) and `body`.
fn cb_accept_reply(xid: u32, stat: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(24 + body.len());
    for w in [xid, 1, 0, 0, 0, stat] {
        m.extend_from_slice(&w.to_be_bytes());
    }
    m.extend_from_slice(body);
    m
}

/// A CB_COMPOUND reply of status `status`: CB_SEQUENCE's `seq` result
/// when given, then `results` (opnum, status) carrying only a status.
fn cb_reply(xid: u32, tag: &[u8], status: i32, seq: Option<&p::CB_SEQUENCE4resok>, results: &[(i32, i32)]) -> Vec<u8> {
    use proto::xdr::Xdr;
    let mut b = vec![0u8; CB_REPLY_BYTES_MAX];
    let mut e = proto::xdr::Encoder::new(&mut b);
    let r = (|| -> proto::xdr::Result<()> {
        e.i32(status)?;
        e.opaque_var(&tag[..tag.len().min(64)])?;
        e.u32(seq.is_some() as u32 + results.len() as u32)?;
        if let Some(ok) = seq {
            e.i32(p::OP_CB_SEQUENCE)?;
            p::CB_SEQUENCE4res::NFS4_OK(ok.clone()).encode(&mut e)?;
        }
        for &(op, st) in results {
            e.i32(op)?;
            e.i32(st)?;
        }
        Ok(())
    })();
    debug_assert!(r.is_ok(), "CB_SEQUENCE and a few statuses fit");
    let n = e.position();
    cb_accept_reply(xid, 0, &b[..n])
}

/// A CB_COMPOUND reply: CB_SEQUENCE's `ok`, then `then` (opnum, status).
fn cb_sequence_reply(xid: u32, tag: &[u8], ok: &p::CB_SEQUENCE4resok, then: Option<(i32, i32)>) -> Vec<u8> {
    cb_reply(xid, tag, then.map_or(p::NFS4_OK, |t| t.1), Some(ok), then.as_slice())
}
