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
}

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
        let mut c = Nfs41::unconnected(addr, auth, limits, owner)?;
        c.establish()?;
        Ok(c)
    }

    /// A client instance that held `opens` before the server restarted
    /// (e.g. a restarted process that kept its state): connect as `owner`
    /// and reclaim them (see `reestablish_reclaiming`).
    pub fn connect_reclaiming(addr: &str, auth: &Auth, limits: Limits, owner: &[u8], opens: &mut [(Open4, u32)]) -> Result<Nfs41> {
        let mut c = Nfs41::unconnected(addr, auth, limits, owner)?;
        c.session_up()?;
        c.reclaim(opens)?;
        c.finish_establish()?;
        Ok(c)
    }

    fn unconnected(addr: &str, auth: &Auth, limits: Limits, owner: &[u8]) -> Result<Nfs41> {
        let rpc = RpcConn::connect(addr, auth, limits)?;
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
        };
        Ok(c)
    }

    /// After the server restarted or the connection or session was lost
    /// (BADSESSION, STALE_CLIENTID, every slot retired): a new connection to
    /// `addr`, a new client ID and session. Opens are gone (reopen them);
    /// uncommitted writes stay tracked, so the next COMMIT reports what the
    /// restart lost.
    pub fn reestablish(&mut self, addr: &str, auth: &Auth, limits: Limits) -> Result<()> {
        self.rpc = RpcConn::connect(addr, auth, limits)?;
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
        self.rpc = RpcConn::connect(addr, auth, limits)?;
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
        let r = c.raw_compound(&[p::nfs_argop4::OP_EXCHANGE_ID(exid)])?;
        let (clientid, seqid) = match &results(&r, false)?.0[..] {
            [p::nfs_resop4::OP_EXCHANGE_ID(p::EXCHANGE_ID4res::NFS4_OK(ok))] => (ok.eir_clientid, ok.eir_sequenceid),
            _ => return Err(Error::Malformed("EXCHANGE_ID result".into())),
        };
        let bytes = (c.rpc.limits().call_bytes_max.min(c.rpc.limits().reply_bytes_max)) as u32;
        let cs = p::CREATE_SESSION4args {
            csa_clientid: clientid,
            csa_sequence: seqid,
            csa_flags: 0,
            csa_fore_chan_attrs: chan(SLOTS_WANTED, bytes),
            csa_back_chan_attrs: chan(1, 4096),
            csa_cb_program: 0x4000_0000,
            csa_sec_parms: vec![p::callback_sec_parms4::AUTH_NONE],
        };
        let r = c.raw_compound(&[p::nfs_argop4::OP_CREATE_SESSION(cs)])?;
        let (sid, granted) = match &results(&r, false)?.0[..] {
            [p::nfs_resop4::OP_CREATE_SESSION(p::CREATE_SESSION4res::NFS4_OK(ok))] => (ok.csr_sessionid, ok.csr_fore_chan_attrs.ca_maxrequests),
            _ => return Err(Error::Malformed("CREATE_SESSION result".into())),
        };
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
        self.rpc.submit(100003, 4, 1, &|e| {
            e.opaque_var(b"")?; // tag
            e.u32(1)?; // minorversion
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
            share_access: access,
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
    /// verifier). An UNSTABLE answer is tracked for `commit`.
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
        self.uncommitted.written(&o.fh, offset, data, count, stable, verf);
        Ok((count, stable, verf))
    }

    pub fn write(&mut self, o: &Open4, offset: u64, data: &[u8], stable: bool) -> Result<(u32, bool, [u8; 8])> {
        let fl = self.submit_write(o, offset, data, stable)?;
        let r = self.rpc.wait(fl.xid);
        self.finish_write(fl, r, o, offset, data)
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
