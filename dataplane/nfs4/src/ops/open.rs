//! OPEN and the operations on open/other stateids: OPEN_DOWNGRADE, CLOSE,
//! DELEGRETURN, FREE_STATEID, TEST_STATEID (RFC 8881 §18.16, §18.18,
//! §18.2, §18.6, §18.38, §18.48).

use crate::attrs::{self, Bitmap, EXCLCREAT};
use crate::compound::Compound;
use crate::error::{fail, state_status, OpResult};
use crate::ops::{check_component, cinfo, sid_in, sid_out};
use crate::state::{SHARE_READ, SHARE_WRITE};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use vfs::{access, Attr, CreateMode, FileHandle, FileType, NodeKind, SetAttr, VfsError};

/// OPEN4_SHARE_ACCESS_* and _DENY_* live in the low two bits; the rest of
/// share_access carries delegation wants (§18.16.3), which we never grant.
const SHARE_MASK: u32 = 3;
/// OPEN4_RESULT_LOCKTYPE_POSIX: our byte-range locks are POSIX-style.
const RESULT_LOCKTYPE_POSIX: u32 = p::OPEN4_RESULT_LOCKTYPE_POSIX;
/// OPEN4_RESULT_PRESERVE_UNLINKED: the file stays usable through its
/// stateid after REMOVE or RENAME takes its last name (the backend pinned it).
const RESULT_PRESERVE_UNLINKED: u32 = p::OPEN4_RESULT_PRESERVE_UNLINKED;
/// Mode of a file created without a mode attribute.
const CREATE_MODE_DEFAULT: u32 = 0o644;

/// What an OPEN with OPEN4_CREATE asked for.
struct CreateHow {
    mode: CreateMode,
    set: SetAttr,
    mask: Bitmap,
}

fn create_how(how: &p::createhow4<'_>) -> OpResult<CreateHow> {
    Ok(match how {
        p::createhow4::UNCHECKED4(f) | p::createhow4::GUARDED4(f) => {
            let (set, mask) = attrs::decode_set(&f.attrmask, f.attr_vals)?;
            let mode = if matches!(how, p::createhow4::UNCHECKED4(_)) {
                CreateMode::Unchecked
            } else {
                CreateMode::Guarded
            };
            CreateHow { mode, set, mask }
        }
        p::createhow4::EXCLUSIVE4(verf) => {
            CreateHow { mode: CreateMode::Exclusive(*verf), set: SetAttr::default(), mask: Bitmap::default() }
        }
        p::createhow4::EXCLUSIVE4_1(cva) => {
            let (set, mask) = attrs::decode_set(&cva.cva_attrs.attrmask, cva.cva_attrs.attr_vals)?;
            if !mask.minus(&EXCLCREAT).is_empty() {
                // Only suppattr_exclcreat may come with an exclusive create.
                return fail(p::NFS4ERR_INVAL);
            }
            CreateHow { mode: CreateMode::Exclusive(cva.cva_verf), set, mask }
        }
    })
}

impl Compound<'_> {
    /// A regular file may be opened; anything else is refused by type.
    fn openable(a: &Attr) -> OpResult {
        match a.ftype {
            FileType::Regular => Ok(()),
            FileType::Directory => fail(p::NFS4ERR_ISDIR),
            FileType::Symlink => fail(p::NFS4ERR_SYMLINK),
            _ => fail(p::NFS4ERR_INVAL),
        }
    }

    fn require_open_access(&self, a: &Attr, share: u32) -> OpResult {
        let mut bits = 0;
        if share & SHARE_READ != 0 {
            bits |= access::READ;
        }
        if share & SHARE_WRITE != 0 {
            bits |= access::MODIFY;
        }
        self.require_access(a, bits)
    }

    /// CLAIM_NULL: open (and maybe create) `name` in the current directory.
    /// Returns the file, whether we created it, the attributes set, and the
    /// directory's change_info.
    fn open_by_name(
        &self,
        name: &[u8],
        how: Option<&p::createhow4<'_>>,
        share: u32,
    ) -> OpResult<(FileHandle, Bitmap, p::change_info4)> {
        let (dir, before) = self.cur_dir()?;
        check_component(name)?;
        self.require_access(&before, access::LOOKUP)?;
        let vfs = &self.prog.vfs;
        let existing = match vfs.lookup(&dir, name) {
            Ok(found) => Some(found),
            Err(VfsError::NoEnt) => None,
            Err(x) => return Err(x.into()),
        };
        let Some(how) = how else {
            let (fh, a) = existing.ok_or(VfsError::NoEnt)?;
            Self::openable(&a)?;
            self.require_open_access(&a, share)?;
            return Ok((fh, Bitmap::default(), cinfo(&before, &before)));
        };
        let mut c = create_how(how)?;
        match (&existing, c.mode) {
            (Some(_), CreateMode::Guarded) => return fail(p::NFS4ERR_EXIST),
            (Some((fh, a)), CreateMode::Unchecked) => {
                // An existing file is simply opened; only its size (O_TRUNC) applies.
                Self::openable(a)?;
                self.require_open_access(a, share)?;
                let mut mask = Bitmap::default();
                if let Some(size) = c.set.size {
                    if share & SHARE_WRITE == 0 {
                        return fail(p::NFS4ERR_INVAL);
                    }
                    vfs.setattr(fh, &SetAttr { size: Some(size), ..SetAttr::default() }, None)?;
                    mask.insert(attrs::SIZE);
                }
                return Ok((*fh, mask, cinfo(&before, &before)));
            }
            _ => {}
        }
        if self.prog.state().in_grace(self.now_ms) {
            // Creating could collide with a file a client is about to reclaim.
            return fail(p::NFS4ERR_GRACE);
        }
        if existing.is_none() {
            self.require_access(&before, access::MODIFY)?;
        }
        let mode = c.set.mode.take().unwrap_or(CREATE_MODE_DEFAULT);
        let cred = self.cred();
        let (fh, a) = vfs.create(&dir, name, NodeKind::File, mode, &cred, c.mode)?;
        Self::openable(&a)?;
        if c.set != SetAttr::default() {
            vfs.setattr(&fh, &c.set, None)?;
        }
        let after = vfs.getattr(&dir)?;
        Ok((fh, c.mask, cinfo(&before, &after)))
    }

    /// OPEN (RFC 8881 §18.16): CLAIM_NULL (with UNCHECKED4 / GUARDED4 /
    /// EXCLUSIVE4 / EXCLUSIVE4_1 creation), CLAIM_FH, CLAIM_PREVIOUS
    /// (reclaim during grace). No delegation is ever granted.
    ///
    /// The open-owner's clientid is ignored: the session names the client
    /// (§18.16.3; other clients send 0 there). Whether this client may open
    /// now (grace, RECLAIM_COMPLETE: §18.51.3) is settled before anything
    /// is created or truncated.
    pub(crate) fn op_open(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::OPEN4args::decode(d)?;
        let clientid = self.clientid()?;
        let share = a.share_access & SHARE_MASK;
        let deny = a.share_deny;
        if share == 0 || deny > SHARE_MASK {
            return fail(p::NFS4ERR_INVAL);
        }
        let reclaim = matches!(a.claim, p::open_claim4::CLAIM_PREVIOUS(_));
        self.prog.state().check_locking(clientid, reclaim, self.now_ms)?;
        let how = match &a.openhow {
            p::openflag4::OPEN4_CREATE(how) => Some(how),
            _ => None,
        };
        let (fh, mask, ci, reclaim) = match &a.claim {
            p::open_claim4::CLAIM_NULL(name) => {
                let (fh, mask, ci) = self.open_by_name(name, how, share)?;
                (fh, mask, ci, false)
            }
            p::open_claim4::CLAIM_FH | p::open_claim4::CLAIM_PREVIOUS(_) => {
                if how.is_some() {
                    return fail(p::NFS4ERR_INVAL);
                }
                if let p::open_claim4::CLAIM_PREVIOUS(t) = &a.claim {
                    if !matches!(t, p::open_delegation_type4::OPEN_DELEGATE_NONE) {
                        // We never granted a delegation to reclaim.
                        return fail(p::NFS4ERR_RECLAIM_BAD);
                    }
                }
                let fh = self.cur_fh()?;
                let fa = self.prog.vfs.getattr(&fh)?;
                Self::openable(&fa)?;
                self.require_open_access(&fa, share)?;
                let reclaim = matches!(a.claim, p::open_claim4::CLAIM_PREVIOUS(_));
                (fh, Bitmap::default(), p::change_info4 { atomic: false, before: 0, after: 0 }, reclaim)
            }
            // Delegation claims: we hold no delegations.
            _ => return fail(p::NFS4ERR_NOTSUPP),
        };
        let (sid, preserved) = self.open_state(clientid, a.owner.owner, fh, share, deny, reclaim)?;
        let rflags = RESULT_LOCKTYPE_POSIX | if preserved { RESULT_PRESERVE_UNLINKED } else { 0 };
        p::OPEN4resok {
            stateid: sid_out(sid),
            cinfo: ci,
            rflags,
            attrset: mask.to_vec(),
            delegation: p::open_delegation4::OPEN_DELEGATE_NONE,
        }
        .encode(e)?;
        self.cur = Some(fh);
        self.cur_sid = Some(sid);
        Ok(())
    }

    /// The open state of an OPEN, with the backend's open reference: the
    /// first open of a file pins it (`Vfs::pin`), under the state lock, so
    /// a REMOVE or RENAME taking its last name leaves it usable until the
    /// last open goes (the state lock's guard unpins then, on every path).
    /// Returns the stateid and whether the file is preserved when unlinked
    /// (false on a backend without open references). A file removed since
    /// it was looked up is NFS4ERR_STALE and gets no open state.
    #[allow(clippy::too_many_arguments)] // mirrors State::open
    fn open_state(
        &self,
        clientid: u64,
        owner: &[u8],
        fh: FileHandle,
        share: u32,
        deny: u32,
        reclaim: bool,
    ) -> OpResult<(crate::state::Stateid, bool)> {
        let vfs = &*self.prog.vfs;
        let mut st = self.prog.state();
        let pinned_now = !st.is_pinned(&fh)
            && match vfs.pin(&fh) {
                Ok(()) => true,
                Err(VfsError::NotSupported) => false,
                Err(x) => return Err(x.into()),
            };
        match st.open(clientid, owner, fh, share, deny, reclaim, self.now_ms) {
            Ok(sid) => {
                if pinned_now {
                    st.set_pinned(&fh);
                }
                Ok((sid, st.is_pinned(&fh)))
            }
            Err(x) => {
                drop(st);
                if pinned_now {
                    vfs.unpin(&fh);
                }
                Err(x.into())
            }
        }
    }

    /// OPEN_DOWNGRADE (RFC 8881 §18.18).
    pub(crate) fn op_open_downgrade(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::OPEN_DOWNGRADE4args::decode(d)?;
        self.cur_fh()?;
        let clientid = self.clientid()?;
        let sid = self.resolve_sid(sid_in(&a.open_stateid))?;
        let new = self.prog.state().open_downgrade(clientid, &sid, a.share_access & SHARE_MASK, a.share_deny)?;
        sid_out(new).encode(e)?;
        self.cur_sid = Some(new);
        Ok(())
    }

    /// CLOSE (RFC 8881 §18.2): returns the invalid special stateid.
    pub(crate) fn op_close(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::CLOSE4args::decode(d)?;
        self.cur_fh()?;
        let clientid = self.clientid()?;
        let sid = self.resolve_sid(sid_in(&a.open_stateid))?;
        let new = self.prog.state().close(clientid, &sid)?;
        sid_out(new).encode(e)?;
        self.cur_sid = Some(new);
        Ok(())
    }

    /// DELEGRETURN (RFC 8881 §18.6): we grant no delegations, so no stateid
    /// can name one: a live open/lock stateid is NFS4ERR_BAD_STATEID too.
    pub(crate) fn op_delegreturn(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::DELEGRETURN4args::decode(d)?;
        self.cur_fh()?;
        let clientid = self.clientid()?;
        let sid = self.resolve_sid(sid_in(&a.deleg_stateid))?;
        self.prog.state().test_stateid(clientid, &sid)?;
        fail(p::NFS4ERR_BAD_STATEID)
    }

    /// FREE_STATEID (RFC 8881 §18.38).
    pub(crate) fn op_free_stateid(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::FREE_STATEID4args::decode(d)?;
        let clientid = self.clientid()?;
        let sid = self.resolve_sid(sid_in(&a.fsa_stateid))?;
        self.prog.state().free_stateid(clientid, &sid)?;
        Ok(())
    }

    /// TEST_STATEID (RFC 8881 §18.48): one status per stateid.
    pub(crate) fn op_test_stateid(&mut self, d: &mut Decoder<'_>, e: &mut Encoder<'_>) -> OpResult {
        let a = p::TEST_STATEID4args::decode(d)?;
        let clientid = self.clientid()?;
        let st = self.prog.state();
        e.u32(a.ts_stateids.len() as u32)?;
        for s in &a.ts_stateids {
            let code = match st.test_stateid(clientid, &sid_in(s)) {
                Ok(()) => p::NFS4_OK,
                Err(x) => state_status(x),
            };
            e.u32(code as u32)?;
        }
        Ok(())
    }
}
