//! Byte-range locks: LOCK, LOCKT, LOCKU (RFC 8881 §18.10–§18.12).

use crate::compound::Compound;
use crate::error::{fail, OpResult};
use crate::ops::{lock_kind, sid_in, sid_out};
use crate::state::{LockError, Locker};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};

impl Compound<'_> {
    fn lock_failed<T>(&mut self, e: LockError) -> OpResult<T> {
        match e {
            LockError::State(s) => Err(s.into()),
            LockError::Denied(c) => {
                self.denied = Some(c);
                fail(p::NFS4ERR_DENIED)
            }
        }
    }

    /// LOCK (RFC 8881 §18.10). A new lock owner comes with its open
    /// stateid; an existing one with its lock stateid. The lock-owner's
    /// clientid is ignored: the session names the client (§18.10.3). A
    /// non-reclaim LOCK before RECLAIM_COMPLETE is NFS4ERR_GRACE (§18.51.3).
    pub(crate) fn op_lock(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::LOCK4args::decode(d)?;
        let fh = self.cur_fh()?;
        let clientid = self.clientid()?;
        let locker = match &a.locker {
            p::locker4::TRUE(o) => {
                Locker::New { open_stateid: self.resolve_sid(sid_in(&o.open_stateid))?, owner: o.lock_owner.owner }
            }
            p::locker4::FALSE(x) => Locker::Existing { lock_stateid: self.resolve_sid(sid_in(&x.lock_stateid))? },
        };
        let r = self.prog.state().lock(
            clientid,
            &fh,
            locker,
            lock_kind(&a.locktype),
            a.offset,
            a.length,
            a.reclaim,
            self.now_ms,
        );
        let sid = match r {
            Ok(s) => s,
            Err(x) => return self.lock_failed(x),
        };
        p::LOCK4resok { lock_stateid: sid_out(sid) }.encode(e)?;
        self.cur_sid = Some(sid);
        Ok(())
    }

    /// LOCKT (RFC 8881 §18.11). The owner's clientid is ignored: the
    /// session names the client (§18.11.3), so "our own" lock is this
    /// client's lock of the owner named.
    pub(crate) fn op_lockt(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::LOCKT4args::decode(d)?;
        let fh = self.cur_fh()?;
        let clientid = self.clientid()?;
        let r = self.prog.state().lockt(
            clientid,
            &fh,
            a.owner.owner,
            lock_kind(&a.locktype),
            a.offset,
            a.length,
            self.now_ms,
        );
        match r {
            Ok(()) => Ok(()),
            Err(x) => self.lock_failed(x),
        }
    }

    /// LOCKU (RFC 8881 §18.12).
    pub(crate) fn op_locku(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::LOCKU4args::decode(d)?;
        let fh = self.cur_fh()?;
        let clientid = self.clientid()?;
        let sid = self.resolve_sid(sid_in(&a.lock_stateid))?;
        let new = self.prog.state().locku(clientid, &fh, &sid, a.offset, a.length)?;
        sid_out(new).encode(e)?;
        self.cur_sid = Some(new);
        Ok(())
    }
}
