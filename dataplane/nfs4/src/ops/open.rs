//! OPEN and the operations on open/other stateids: OPEN_DOWNGRADE, CLOSE,
//! DELEGRETURN, FREE_STATEID, TEST_STATEID (RFC 8881 §18.16, §18.18,
//! §18.2, §18.6, §18.38, §18.48).

use crate::attrs::{self, Bitmap, EXCLCREAT};
use crate::compound::Compound;
use crate::error::{fail, state_status, OpResult};
use crate::ops::{check_component, cinfo, sid_in, sid_out};
use crate::state::{DelegGrant, DelegWant, SHARE_READ, SHARE_WRITE};
use proto::nfs4 as p;
use proto::xdr::{Decoder, Encoder, Xdr};
use vfs::{access, Attr, CreateMode, FileHandle, FileType, NodeKind, SetAttr, VfsError};

/// OPEN4_SHARE_ACCESS_* and _DENY_* live in the low two bits; the rest of
/// share_access carries delegation wants (§18.16.3, `DelegWant`).
const SHARE_MASK: u32 = 3;
/// ACE of a delegation's `permissions`: empty (the client checks access
/// with ACCESS, as it would without the delegation; RFC 8881 §10.4.1).
const DELEG_ACE: p::nfsace4<'static> = p::nfsace4 { r#type: 0, flag: 0, access_mask: 0, who: b"" };
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
            self.deleg_wait(&fh, share & SHARE_WRITE != 0)?;
            return Ok((fh, Bitmap::default(), cinfo(&before, &before)));
        };
        let mut c = create_how(how)?;
        match (&existing, c.mode) {
            (Some(_), CreateMode::Guarded) => return fail(p::NFS4ERR_EXIST),
            (Some((fh, a)), CreateMode::Unchecked) => {
                // An existing file is simply opened; only its size (O_TRUNC) applies.
                Self::openable(a)?;
                self.require_open_access(a, share)?;
                self.deleg_wait(fh, share & SHARE_WRITE != 0 || c.set.size.is_some())?;
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
    /// (reclaim during grace, of a delegation too), CLAIM_DELEGATE_CUR and
    /// CLAIM_DELEG_CUR_FH (an open under a delegation the client holds,
    /// sent when it returns one). A read or write delegation is granted
    /// when the client can be called back and nothing conflicts
    /// (`State::grant_delegation`); an open that conflicts with another
    /// client's delegation gets NFS4ERR_DELAY while it is recalled.
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
        let want = DelegWant::of(a.share_access).ok_or(crate::error::Nfs4Error(p::NFS4ERR_INVAL))?;
        if share == 0 || deny > SHARE_MASK {
            return fail(p::NFS4ERR_INVAL);
        }
        let reclaim = matches!(a.claim, p::open_claim4::CLAIM_PREVIOUS(_));
        self.prog.state().check_locking(clientid, reclaim, self.now_ms)?;
        let how = match &a.openhow {
            p::openflag4::OPEN4_CREATE(how) => Some(how),
            _ => None,
        };
        // The delegation type a CLAIM_PREVIOUS reclaims (Some(write)).
        let mut reclaim_deleg = None;
        let (fh, mask, ci, reclaim) = match &a.claim {
            p::open_claim4::CLAIM_NULL(name) => {
                let (fh, mask, ci) = self.open_by_name(name, how, share)?;
                (fh, mask, ci, false)
            }
            p::open_claim4::CLAIM_FH | p::open_claim4::CLAIM_PREVIOUS(_) | p::open_claim4::CLAIM_DELEG_CUR_FH(_) => {
                if how.is_some() {
                    return fail(p::NFS4ERR_INVAL);
                }
                let fh = self.cur_fh()?;
                match &a.claim {
                    p::open_claim4::CLAIM_PREVIOUS(t) => {
                        reclaim_deleg = match t {
                            p::open_delegation_type4::OPEN_DELEGATE_NONE => None,
                            p::open_delegation_type4::OPEN_DELEGATE_READ => Some(false),
                            p::open_delegation_type4::OPEN_DELEGATE_WRITE => Some(true),
                            _ => return fail(p::NFS4ERR_INVAL),
                        };
                    }
                    p::open_claim4::CLAIM_DELEG_CUR_FH(sid) => {
                        let sid = self.resolve_sid(sid_in(sid))?;
                        self.prog.state().check_deleg(clientid, &sid, &fh)?;
                    }
                    _ => {}
                }
                let fa = self.prog.vfs.getattr(&fh)?;
                Self::openable(&fa)?;
                self.require_open_access(&fa, share)?;
                if !reclaim {
                    self.deleg_wait(&fh, share & SHARE_WRITE != 0)?;
                }
                (fh, Bitmap::default(), p::change_info4 { atomic: false, before: 0, after: 0 }, reclaim)
            }
            p::open_claim4::CLAIM_DELEGATE_CUR(cur) => {
                if how.is_some() {
                    return fail(p::NFS4ERR_INVAL);
                }
                let (dir, before) = self.cur_dir()?;
                check_component(cur.file)?;
                let (fh, fa) = self.prog.vfs.lookup(&dir, cur.file)?;
                let sid = self.resolve_sid(sid_in(&cur.delegate_stateid))?;
                self.prog.state().check_deleg(clientid, &sid, &fh)?;
                Self::openable(&fa)?;
                self.require_open_access(&fa, share)?;
                (fh, Bitmap::default(), cinfo(&before, &before), false)
            }
            // CLAIM_DELEGATE_PREV / CLAIM_DELEG_PREV_FH reclaim a delegation
            // across a client restart, which needs stable storage of
            // delegations we do not keep (§10.2.1).
            _ => return fail(p::NFS4ERR_NOTSUPP),
        };
        let (sid, preserved) = self.open_state(clientid, a.owner.owner, fh, share, deny, reclaim)?;
        let rflags = RESULT_LOCKTYPE_POSIX | if preserved { RESULT_PRESERVE_UNLINKED } else { 0 };
        let grant = self.grant_delegation(clientid, fh, share, want, reclaim_deleg);
        let delegation = match grant {
            DelegGrant::Read(d) => p::open_delegation4::OPEN_DELEGATE_READ(p::open_read_delegation4 {
                stateid: sid_out(d),
                recall: false,
                permissions: DELEG_ACE,
            }),
            DelegGrant::Write(d) => p::open_delegation4::OPEN_DELEGATE_WRITE(p::open_write_delegation4 {
                stateid: sid_out(d),
                recall: false,
                // No space reservation: writes may grow the file freely.
                space_limit: p::nfs_space_limit4::NFS_LIMIT_SIZE(u64::MAX),
                permissions: DELEG_ACE,
            }),
            // Why not is told only to a client that expressed a want.
            DelegGrant::None(_) if want == DelegWant::NoPreference => p::open_delegation4::OPEN_DELEGATE_NONE,
            DelegGrant::None(why) => p::open_delegation4::OPEN_DELEGATE_NONE_EXT(match why {
                p::WND4_CONTENTION => p::open_none_delegation4::WND4_CONTENTION(false),
                p::WND4_RESOURCE => p::open_none_delegation4::WND4_RESOURCE(false),
                other => p::open_none_delegation4::default(other),
            }),
        };
        p::OPEN4resok { stateid: sid_out(sid), cinfo: ci, rflags, attrset: mask.to_vec(), delegation }.encode(e)?;
        self.cur = Some(fh);
        self.cur_sid = Some(sid);
        Ok(())
    }

    /// Grant a delegation after a successful OPEN if the state machine
    /// allows one (then maybe ask holders to give some back).
    fn grant_delegation(&self, clientid: u64, fh: FileHandle, share: u32, want: DelegWant, reclaim: Option<bool>) -> DelegGrant {
        let session = self.seq.filter(|_| self.prog.callbacks.attached()).map(|s| s.session);
        let g = self.prog.state().grant_delegation(clientid, fh, share, want, session, reclaim, self.now_ms);
        if !matches!(g, DelegGrant::None(_)) {
            self.prog.delegations.maybe_recall_any();
        }
        g
    }

    /// Can the server call this COMPOUND's client back (a transport is
    /// attached and one of its sessions has a usable back channel)?
    pub(crate) fn cb_usable(&self) -> bool {
        self.prog.callbacks.attached()
            && self.seq.is_some_and(|s| self.prog.state().cb_path_flags(&s.session) & p::SEQ4_STATUS_CB_PATH_DOWN == 0)
    }

    /// Would this access by the COMPOUND's client conflict with another
    /// client's delegation? Then NFS4ERR_DELAY while it is recalled.
    pub(crate) fn deleg_wait(&self, fh: &FileHandle, write: bool) -> OpResult {
        if self.prog.delegations.must_wait_for(fh, self.seq.map(|s| s.clientid), write) {
            return fail(p::NFS4ERR_DELAY);
        }
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

    /// DELEGRETURN (RFC 8881 §18.6): the delegation on the current file
    /// goes; an open or lock stateid is NFS4ERR_BAD_STATEID, a revoked
    /// delegation NFS4ERR_DELEG_REVOKED (FREE_STATEID forgets it).
    pub(crate) fn op_delegreturn(&mut self, d: &mut Decoder<'_>, _e: &mut Encoder<'_>) -> OpResult {
        let a = p::DELEGRETURN4args::decode(d)?;
        let fh = self.cur_fh()?;
        let clientid = self.clientid()?;
        let sid = self.resolve_sid(sid_in(&a.deleg_stateid))?;
        self.prog.state().delegreturn(clientid, &sid, &fh)?;
        Ok(())
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
