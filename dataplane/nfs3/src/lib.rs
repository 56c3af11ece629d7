//! NFS version 3 (RFC 1813), MOUNT version 3 (RFC 1813 §5) and the portmapper
//! version 2 GETPORT service (RFC 1833 §3), over any [`vfs::Vfs`].
//!
//! One function per procedure, named after it, with the RFC section at the
//! top. Arguments are decoded by the generated `proto::nfs3` types, which
//! borrow from the receive buffer (WRITE data is never copied before it
//! reaches the backend); READ data and directory listings are written
//! straight into the reply buffer.

mod attr;
pub mod mount;
pub mod portmap;

pub use mount::{Export, Mount3Program};
pub use portmap::{PortmapProgram, Registration};

use attr::*;
use proto::nfs3::*;
use proto::xdr::{Decoder, Encoder, Xdr, XdrError};
use rpc::lend::Lender;
use rpc::{Auth, CallContext, CallError, Program};
use std::sync::Arc;
use vfs::clients::{AccessTable, Grant};
use vfs::{Cred, FileHandle, Vfs, VfsError};

/// Procedure names for metrics, indexed by procedure number.
pub const PROC_NAMES: [&str; 22] = [
    "null", "getattr", "setattr", "lookup", "access", "readlink", "read", "write", "create", "mkdir", "symlink",
    "mknod", "remove", "rmdir", "rename", "link", "readdir", "readdirplus", "fsstat", "fsinfo", "pathconf", "commit",
];

/// Largest READ/WRITE transfer advertised in FSINFO (rtmax/wtmax).
pub const IO_BYTES_MAX_DEFAULT: u32 = 1 << 20;

#[derive(Clone)]
pub struct Nfs3Program {
    vfs: Arc<dyn Vfs>,
    io_bytes_max: u32,
    access: Arc<AccessTable>,
    /// NFSv4 delegations on the same files (`with_delegations`).
    delegations: Option<Arc<dyn vfs::DelegationBreaker>>,
}

type R = Result<(), CallError>;

fn enc(r: Result<(), XdrError>) -> R {
    r.map_err(|_| CallError::SystemErr)
}

fn decode<'a, T: Xdr<'a>>(args: &'a [u8]) -> Result<T, CallError> {
    let mut d = Decoder::new(args);
    T::decode(&mut d).map_err(|_| CallError::GarbageArgs)
}

/// Supplementary gids of a call, without allocating.
pub(crate) struct Gids {
    buf: [u32; 16],
    len: usize,
}

impl Gids {
    pub(crate) fn of(auth: &Auth<'_>) -> Gids {
        let mut g = Gids { buf: [0; 16], len: 0 };
        for (i, v) in auth.gids().take(16).enumerate() {
            g.buf[i] = v;
            g.len = i + 1;
        }
        g
    }
    pub(crate) fn cred<'g>(&'g self, auth: &Auth<'_>) -> Cred<'g> {
        match auth {
            Auth::Sys { uid, gid, .. } => Cred { uid: *uid, gid: *gid, gids: &self.buf[..self.len] },
            Auth::None => Cred::NOBODY,
        }
    }
}

/// Procedures that change the file system: refused with ROFS on a
/// read-only grant.
fn modifies(proc_num: u32) -> bool {
    waits_for_the_log(proc_num) || matches!(proc_num, NFSPROC3_WRITE | NFSPROC3_COMMIT)
}

/// A procedure's failure result with `status` and empty attributes: the
/// resfail arm of each procedure is a run of post_op_attr (one word) and
/// wcc_data (two words), all "not present".
fn refuse(proc_num: u32, status: nfsstat3, e: &mut Encoder<'_>) -> R {
    let words = match proc_num {
        NFSPROC3_GETATTR => 0,
        NFSPROC3_SETATTR | NFSPROC3_WRITE | NFSPROC3_CREATE | NFSPROC3_MKDIR | NFSPROC3_SYMLINK | NFSPROC3_MKNOD => 2,
        NFSPROC3_REMOVE | NFSPROC3_RMDIR | NFSPROC3_COMMIT => 2,
        NFSPROC3_RENAME => 4,
        NFSPROC3_LINK => 3,
        _ => 1,
    };
    enc(e.i32(status as i32))?;
    for _ in 0..words {
        enc(e.u32(0))?;
    }
    Ok(())
}

pub(crate) fn status_of(e: VfsError) -> nfsstat3 {
    use nfsstat3::*;
    match e {
        VfsError::NoEnt => NFS3ERR_NOENT,
        VfsError::Exist | VfsError::ExistVerifierMismatch => NFS3ERR_EXIST,
        VfsError::NotDir => NFS3ERR_NOTDIR,
        VfsError::IsDir => NFS3ERR_ISDIR,
        VfsError::NotEmpty => NFS3ERR_NOTEMPTY,
        VfsError::NoSpace => NFS3ERR_NOSPC,
        VfsError::QuotaExceeded => NFS3ERR_DQUOT,
        VfsError::Stale => NFS3ERR_STALE,
        VfsError::BadHandle => NFS3ERR_BADHANDLE,
        VfsError::Inval => NFS3ERR_INVAL,
        VfsError::NameTooLong => NFS3ERR_NAMETOOLONG,
        VfsError::Perm => NFS3ERR_PERM,
        VfsError::Access => NFS3ERR_ACCES,
        VfsError::FileTooBig => NFS3ERR_FBIG,
        VfsError::ReadOnly => NFS3ERR_ROFS,
        VfsError::TooManyLinks => NFS3ERR_MLINK,
        VfsError::CrossDevice => NFS3ERR_XDEV,
        VfsError::NotSupported => NFS3ERR_NOTSUPP,
        VfsError::NotSync => NFS3ERR_NOT_SYNC,
        VfsError::Io => NFS3ERR_IO,
    }
}

fn fh_of(h: &nfs_fh3<'_>) -> Result<FileHandle, nfsstat3> {
    FileHandle::from_bytes(h.data).map_err(status_of)
}

impl Nfs3Program {
    pub fn new(vfs: Arc<dyn Vfs>) -> Self {
        Nfs3Program { vfs, io_bytes_max: IO_BYTES_MAX_DEFAULT, access: Arc::new(AccessTable::new()), delegations: None }
    }

    /// Recall NFSv4 delegations before an NFSv3 call reads a file another
    /// client holds a write delegation on, or changes (data, attributes,
    /// names) a file anyone holds one on: the call is answered
    /// NFS3ERR_JUKEBOX while the recall runs, and the client retries.
    pub fn with_delegations(mut self, d: Arc<dyn vfs::DelegationBreaker>) -> Self {
        self.delegations = Some(d);
        self
    }

    /// Does this call touch a file under another client's delegation
    /// (`with_delegations`)? Checked once, before the procedure runs (a
    /// resumed call passed it already). GETATTR and READ read; SETATTR,
    /// WRITE and LINK change the file in their handle; REMOVE and RENAME
    /// the files their names name.
    fn deleg_must_wait(&self, ctx: &CallContext<'_>, args: &[u8]) -> bool {
        let Some(b) = &self.delegations else { return false };
        if ctx.resumed.is_some() || !b.active() {
            return false;
        }
        let named = |dir: &nfs_fh3<'_>, name: &[u8]| fh_of(dir).ok().and_then(|d| self.vfs.lookup(&d, name).ok()).map(|(f, _)| f);
        let first = || {
            let mut d = Decoder::new(args);
            d.opaque_var(NFS3_FHSIZE).ok().and_then(|h| FileHandle::from_bytes(h).ok())
        };
        let (files, write): ([Option<FileHandle>; 2], bool) = match ctx.proc_num {
            NFSPROC3_GETATTR | NFSPROC3_READ => ([first(), None], false),
            NFSPROC3_SETATTR | NFSPROC3_WRITE | NFSPROC3_LINK => ([first(), None], true),
            NFSPROC3_REMOVE => match decode::<REMOVE3args>(args) {
                Ok(a) => ([named(&a.object.dir, a.object.name), None], true),
                Err(_) => return false,
            },
            NFSPROC3_RENAME => match decode::<RENAME3args>(args) {
                Ok(a) => ([named(&a.from.dir, a.from.name), named(&a.to.dir, a.to.name)], true),
                Err(_) => return false,
            },
            _ => return false,
        };
        // Both are checked, so each conflicting delegation is recalled now.
        let mut wait = false;
        for fh in files.iter().flatten() {
            wait |= b.must_wait(fh, write);
        }
        wait
    }

    /// Export access rules to enforce (default: a table without rules, every
    /// client read-write without squashing).
    pub fn with_access(mut self, access: Arc<AccessTable>) -> Self {
        self.access = access;
        self
    }

    /// The export access check, before anything reaches the backend: the
    /// export is the one in the call's handle(s), narrowed by the rules of
    /// the volume a handle is in (if it has any); a procedure that modifies
    /// needs a writable grant. `Err` is the status to answer. A handle that
    /// does not parse is left to the procedure (BADHANDLE without a backend
    /// call). Runs again when a parked call resumes (same answer unless the
    /// rules changed meanwhile). No allocation.
    fn admit(&self, ctx: &CallContext<'_>, args: &[u8]) -> Result<Grant, nfsstat3> {
        let ip = ctx.peer.ip();
        let mut d = Decoder::new(args);
        let check = |raw: Option<&[u8]>| -> Result<Grant, nfsstat3> {
            match raw.and_then(|b| FileHandle::from_bytes(b).ok()) {
                Some(fh) => self.access.check_fh(&fh, ip).ok_or(nfsstat3::NFS3ERR_ACCES),
                None => Ok(Grant::OPEN),
            }
        };
        let grant = check(d.opaque_var(NFS3_FHSIZE).ok())?;
        // RENAME's target directory and LINK's directory are second handles.
        let second = match ctx.proc_num {
            NFSPROC3_RENAME => d.opaque_var(u32::MAX).ok().and_then(|_| d.opaque_var(NFS3_FHSIZE).ok()),
            NFSPROC3_LINK => d.opaque_var(NFS3_FHSIZE).ok(),
            _ => None,
        };
        let other = check(second)?;
        if !(grant.writable && other.writable) && modifies(ctx.proc_num) {
            return Err(nfsstat3::NFS3ERR_ROFS);
        }
        Ok(grant)
    }

    /// Cap READ/WRITE sizes (must leave room for headers within the
    /// transport's record and reply limits).
    pub fn io_bytes_max(mut self, n: u32) -> Self {
        assert!(n >= 4096);
        self.io_bytes_max = n;
        self
    }

    fn post(&self, fh: &FileHandle) -> post_op_attr {
        post_attr(self.vfs.getattr(fh).ok())
    }

    fn pre(&self, fh: &FileHandle) -> pre_op_attr {
        pre_attr(self.vfs.getattr(fh).ok())
    }

    fn wcc(&self, fh: &FileHandle, before: pre_op_attr) -> wcc_data {
        wcc_data { before, after: self.post(fh) }
    }

    /// §3.3.1 GETATTR
    fn getattr(&self, a: GETATTR3args<'_>, e: &mut Encoder<'_>) -> R {
        let r = fh_of(&a.object).and_then(|fh| self.vfs.getattr(&fh).map_err(status_of));
        match r {
            Ok(at) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(GETATTR3resok { obj_attributes: fattr(&at) }.encode(e))
            }
            Err(s) => enc(e.i32(s as i32)),
        }
    }

    /// §3.3.2 SETATTR
    fn setattr(&self, a: SETATTR3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let fh = match fh_of(&a.object) {
            Ok(f) => f,
            Err(s) => return fail_wcc(e, s, empty_wcc()),
        };
        let before = self.vfs.getattr(&fh);
        let pre = pre_attr(before.ok());
        let set = sattr(&a.new_attributes);
        let guard = match a.guard {
            sattrguard3::TRUE(t) => Some(vfs::Time { sec: t.seconds as i64, nsec: t.nseconds }),
            _ => None,
        };
        let r = before.and_then(|b| may_setattr(&b, cred, &set)).and_then(|_| self.vfs.setattr(&fh, &set, guard));
        match r {
            Ok(_) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(self.wcc(&fh, pre).encode(e))
            }
            Err(err) => fail_wcc(e, status_of(err), self.wcc(&fh, pre)),
        }
    }

    /// §3.3.3 LOOKUP
    fn lookup(&self, a: LOOKUP3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let dir = match fh_of(&a.what.dir) {
            Ok(f) => f,
            Err(s) => return fail_post(e, s, post_op_attr::FALSE),
        };
        let r = self
            .vfs
            .getattr(&dir)
            .and_then(|d| require(&d, cred, vfs::access::LOOKUP).map(|_| d))
            .and_then(|d| match a.what.name {
                // "." and ".." are names a client may look up (§3.3.3; the
                // nfs mount module finds a directory's parent so). The
                // parent of an export's root is the root itself: NFSv3
                // never climbs above what was mounted.
                b"." => Ok((dir, d)),
                b".." => match self.vfs.lookup_parent(&dir) {
                    Ok((p, _)) if p.export_id != dir.export_id => Ok((dir, d)),
                    other => other,
                },
                name => self.vfs.lookup(&dir, name),
            });
        match r {
            Ok((fh, at)) => {
                let bytes = fh.to_bytes();
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(LOOKUP3resok {
                    object: nfs_fh3 { data: &bytes },
                    obj_attributes: post_op_attr::TRUE(fattr(&at)),
                    dir_attributes: self.post(&dir),
                }
                .encode(e))
            }
            Err(err) => fail_post(e, status_of(err), self.post(&dir)),
        }
    }

    /// §3.3.4 ACCESS
    fn access(&self, a: ACCESS3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let r = fh_of(&a.object).and_then(|fh| self.vfs.getattr(&fh).map_err(status_of));
        match r {
            Ok(at) => {
                let granted = vfs::check_access(&at, cred, a.access);
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(ACCESS3resok { obj_attributes: post_op_attr::TRUE(fattr(&at)), access: granted }.encode(e))
            }
            Err(s) => fail_post(e, s, post_op_attr::FALSE),
        }
    }

    /// §3.3.5 READLINK
    fn readlink(&self, a: READLINK3args<'_>, e: &mut Encoder<'_>) -> R {
        let fh = match fh_of(&a.symlink) {
            Ok(f) => f,
            Err(s) => return fail_post(e, s, post_op_attr::FALSE),
        };
        match self.vfs.readlink(&fh) {
            Ok(target) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(READLINK3resok { symlink_attributes: self.post(&fh), data: &target }.encode(e))
            }
            Err(err) => fail_post(e, status_of(err), self.post(&fh)),
        }
    }

    /// §3.3.6 READ: data goes from the backend straight into the reply, or,
    /// from `LEND_MIN_BYTES` on and where backend and transport can, is lent
    /// to it (the backend's chunks go on the wire, no copy).
    fn read(&self, ctx: &CallContext<'_>, a: READ3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let lend = ctx.lend;
        let fh = match fh_of(&a.file) {
            Ok(f) => f,
            Err(s) => return fail_post(e, s, post_op_attr::FALSE),
        };
        let at = match self.vfs.getattr(&fh) {
            Ok(at) => at,
            Err(err) => return fail_post(e, status_of(err), post_op_attr::FALSE),
        };
        if at.ftype != vfs::FileType::Regular {
            let s = if at.ftype == vfs::FileType::Directory { nfsstat3::NFS3ERR_ISDIR } else { nfsstat3::NFS3ERR_INVAL };
            return fail_post(e, s, post_op_attr::TRUE(fattr(&at)));
        }
        if cred.uid != at.uid && vfs::check_access(&at, cred, vfs::access::READ) == 0 {
            return fail_post(e, nfsstat3::NFS3ERR_ACCES, post_op_attr::TRUE(fattr(&at)));
        }
        let count = a.count.min(self.io_bytes_max) as usize;
        let start = e.position();
        enc(e.i32(nfsstat3::NFS3_OK as i32))?;
        enc(post_op_attr::TRUE(fattr(&at)).encode(e))?;
        let words_at = enc_reserve(e, 12)?;
        if let Some(r) = ctx.resumed {
            // The backend parked this READ; its data came back.
            return match vfs::io_done(r.payload) {
                Ok(vfs::IoDone::Read { data, eof }) if data.len() <= count => {
                    let spare = e.spare();
                    if spare.len() < data.len() + 3 {
                        return Err(CallError::SystemErr);
                    }
                    spare[..data.len()].copy_from_slice(data);
                    read_ok(e, words_at, data.len(), *eof, lend);
                    Ok(())
                }
                Ok(_) => {
                    e.truncate(start);
                    fail_post(e, nfsstat3::NFS3ERR_IO, self.post(&fh))
                }
                Err(err) => {
                    e.truncate(start);
                    fail_post(e, status_of(err), self.post(&fh))
                }
            };
        }
        if let Some(l) = lend.filter(|_| count >= LEND_MIN_BYTES) {
            l.begin(e.position());
            match self.vfs.read_lent(&fh, a.offset, count, &mut LendTo(l)) {
                Ok(Some((n, eof))) => {
                    // The (zeroed) pad follows the lent bytes on the wire.
                    enc_reserve(e, proto::xdr::pad(n))?;
                    e.patch_u32(words_at, n as u32);
                    e.patch_u32(words_at + 4, eof as u32);
                    e.patch_u32(words_at + 8, n as u32);
                    return Ok(());
                }
                Ok(None) => l.discard(),
                Err(err) => {
                    l.discard();
                    e.truncate(start);
                    return fail_post(e, status_of(err), self.post(&fh));
                }
            }
        }
        let spare = e.spare();
        if spare.len() < count + 3 {
            return Err(CallError::SystemErr);
        }
        match self.vfs.read_start(&fh, a.offset, &mut spare[..count], &mut Park3 { park: ctx.park, state: &[] }) {
            // Parked: the reply comes when the call resumes.
            Ok(None) => Ok(()),
            Ok(Some((n, eof))) => {
                read_ok(e, words_at, n, eof, lend);
                Ok(())
            }
            Err(err) => {
                e.truncate(start);
                fail_post(e, status_of(err), self.post(&fh))
            }
        }
    }

    /// §3.3.7 WRITE: the data slice borrows the receive buffer.
    fn write(&self, ctx: &CallContext<'_>, a: WRITE3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let fh = match fh_of(&a.file) {
            Ok(f) => f,
            Err(s) => return fail_wcc(e, s, empty_wcc()),
        };
        if let Some(r) = ctx.resumed {
            // Parked after every check passed; the write is done.
            let pre = wcc_unpack(r.state);
            return match vfs::io_done(r.payload) {
                Ok(vfs::IoDone::Write { count, committed, attr }) => self.write_ok(e, pre, *count, *committed, attr),
                Ok(_) => fail_wcc(e, nfsstat3::NFS3ERR_IO, self.wcc(&fh, pre)),
                Err(err) => fail_wcc(e, status_of(err), self.wcc(&fh, pre)),
            };
        }
        let before = match self.vfs.getattr(&fh) {
            Ok(b) => b,
            Err(err) => return fail_wcc(e, status_of(err), empty_wcc()),
        };
        let pre = pre_attr(Some(before));
        if a.count as usize != a.data.len() || a.data.len() > self.io_bytes_max as usize {
            return fail_wcc(e, nfsstat3::NFS3ERR_INVAL, wcc_data { before: pre, after: post_op_attr::TRUE(fattr(&before)) });
        }
        if before.ftype != vfs::FileType::Regular {
            let s = if before.ftype == vfs::FileType::Directory { nfsstat3::NFS3ERR_ISDIR } else { nfsstat3::NFS3ERR_INVAL };
            return fail_wcc(e, s, wcc_data { before: pre, after: post_op_attr::TRUE(fattr(&before)) });
        }
        if cred.uid != before.uid && vfs::check_access(&before, cred, vfs::access::MODIFY) == 0 {
            return fail_wcc(e, nfsstat3::NFS3ERR_ACCES, wcc_data { before: pre, after: post_op_attr::TRUE(fattr(&before)) });
        }
        let stable = match a.stable {
            stable_how::UNSTABLE => vfs::Stability::Unstable,
            stable_how::DATA_SYNC => vfs::Stability::DataSync,
            stable_how::FILE_SYNC => vfs::Stability::FileSync,
        };
        let state = wcc_pack(&pre);
        match self.vfs.write_start(&fh, a.offset, a.data, stable, &mut Park3 { park: ctx.park, state: &state }) {
            Ok(None) => Ok(()),
            Ok(Some((n, committed, after))) => self.write_ok(e, pre, n, committed, &after),
            Err(err) => fail_wcc(e, status_of(err), self.wcc(&fh, pre)),
        }
    }

    fn write_ok(&self, e: &mut Encoder<'_>, pre: pre_op_attr, n: usize, committed: vfs::Stability, after: &vfs::Attr) -> R {
        enc(e.i32(nfsstat3::NFS3_OK as i32))?;
        enc(WRITE3resok {
            file_wcc: wcc_data { before: pre, after: post_op_attr::TRUE(fattr(after)) },
            count: n as u32,
            committed: match committed {
                vfs::Stability::Unstable => stable_how::UNSTABLE,
                vfs::Stability::DataSync => stable_how::DATA_SYNC,
                vfs::Stability::FileSync => stable_how::FILE_SYNC,
            },
            verf: self.vfs.write_verifier(),
        }
        .encode(e))
    }

    /// Shared by CREATE, MKDIR, SYMLINK and MKNOD (§3.3.8–§3.3.11): make the
    /// object, apply the remaining attributes, answer with its handle.
    fn make(
        &self,
        e: &mut Encoder<'_>,
        where_: &diropargs3<'_>,
        kind: vfs::NodeKind<'_>,
        attrs: Option<&sattr3>,
        how: vfs::CreateMode,
        cred: &Cred<'_>,
    ) -> R {
        let dir = match fh_of(&where_.dir) {
            Ok(f) => f,
            Err(s) => return fail_wcc(e, s, empty_wcc()),
        };
        let dir_before = self.vfs.getattr(&dir);
        let pre = pre_attr(dir_before.ok());
        let set = attrs.map(sattr).unwrap_or_default();
        let mode = set.mode.unwrap_or(match kind {
            vfs::NodeKind::Directory => 0o755,
            vfs::NodeKind::Symlink { .. } => 0o777,
            _ => 0o644,
        });
        let r = dir_before
            .and_then(|d| require(&d, cred, vfs::access::MODIFY | vfs::access::LOOKUP))
            .and_then(|_| self.vfs.create(&dir, where_.name, kind, mode, cred, how))
            .and_then(|(fh, at)| {
                // Size, times and ownership asked for at creation (exclusive
                // creates carry none: the verifier occupies the times).
                let rest = vfs::SetAttr { mode: None, ..set };
                if rest != vfs::SetAttr::default() && !matches!(how, vfs::CreateMode::Exclusive(_)) {
                    let at = self.vfs.setattr(&fh, &rest, None)?;
                    Ok((fh, at))
                } else {
                    Ok((fh, at))
                }
            });
        match r {
            Ok((fh, at)) => {
                let bytes = fh.to_bytes();
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(CREATE3resok {
                    obj: post_op_fh3::TRUE(nfs_fh3 { data: &bytes }),
                    obj_attributes: post_op_attr::TRUE(fattr(&at)),
                    dir_wcc: self.wcc(&dir, pre),
                }
                .encode(e))
            }
            Err(err) => fail_wcc(e, status_of(err), self.wcc(&dir, pre)),
        }
    }

    /// §3.3.8 CREATE
    fn create(&self, a: CREATE3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let (attrs, how) = match &a.how {
            createhow3::UNCHECKED(s) => (Some(s), vfs::CreateMode::Unchecked),
            createhow3::GUARDED(s) => (Some(s), vfs::CreateMode::Guarded),
            createhow3::EXCLUSIVE(v) => (None, vfs::CreateMode::Exclusive(*v)),
        };
        self.make(e, &a.r#where, vfs::NodeKind::File, attrs, how, cred)
    }

    /// §3.3.9 MKDIR
    fn mkdir(&self, a: MKDIR3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        self.make(e, &a.r#where, vfs::NodeKind::Directory, Some(&a.attributes), vfs::CreateMode::Guarded, cred)
    }

    /// §3.3.10 SYMLINK
    fn symlink(&self, a: SYMLINK3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let kind = vfs::NodeKind::Symlink { target: a.symlink.symlink_data };
        self.make(e, &a.r#where, kind, Some(&a.symlink.symlink_attributes), vfs::CreateMode::Guarded, cred)
    }

    /// §3.3.11 MKNOD
    fn mknod(&self, a: MKNOD3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let (kind, attrs) = match &a.what {
            mknoddata3::NF3CHR(d) => {
                (vfs::NodeKind::Device { ftype: vfs::FileType::CharDevice, rdev: (d.spec.specdata1, d.spec.specdata2) }, &d.dev_attributes)
            }
            mknoddata3::NF3BLK(d) => {
                (vfs::NodeKind::Device { ftype: vfs::FileType::BlockDevice, rdev: (d.spec.specdata1, d.spec.specdata2) }, &d.dev_attributes)
            }
            mknoddata3::NF3SOCK(s) => (vfs::NodeKind::Device { ftype: vfs::FileType::Socket, rdev: (0, 0) }, s),
            mknoddata3::NF3FIFO(s) => (vfs::NodeKind::Device { ftype: vfs::FileType::Fifo, rdev: (0, 0) }, s),
            _ => return fail_wcc(e, nfsstat3::NFS3ERR_BADTYPE, empty_wcc()),
        };
        self.make(e, &a.r#where, kind, Some(attrs), vfs::CreateMode::Guarded, cred)
    }

    /// §3.3.12 REMOVE and §3.3.13 RMDIR
    fn remove(&self, what: &diropargs3<'_>, dir_op: bool, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let dir = match fh_of(&what.dir) {
            Ok(f) => f,
            Err(s) => return fail_wcc(e, s, empty_wcc()),
        };
        let before = self.vfs.getattr(&dir);
        let pre = pre_attr(before.ok());
        let r = before.and_then(|d| require(&d, cred, vfs::access::MODIFY | vfs::access::LOOKUP)).and_then(|_| {
            if dir_op {
                self.vfs.rmdir(&dir, what.name)
            } else {
                self.vfs.remove(&dir, what.name)
            }
        });
        match r {
            Ok(()) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(self.wcc(&dir, pre).encode(e))
            }
            Err(err) => fail_wcc(e, status_of(err), self.wcc(&dir, pre)),
        }
    }

    /// §3.3.14 RENAME
    fn rename(&self, a: RENAME3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let (from, to) = match (fh_of(&a.from.dir), fh_of(&a.to.dir)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(s), _) | (_, Err(s)) => {
                enc(e.i32(s as i32))?;
                enc(empty_wcc().encode(e))?;
                return enc(empty_wcc().encode(e));
            }
        };
        let (fb, tb) = (self.vfs.getattr(&from), self.vfs.getattr(&to));
        let (fpre, tpre) = (pre_attr(fb.ok()), pre_attr(tb.ok()));
        let want = vfs::access::MODIFY | vfs::access::LOOKUP;
        let r = fb
            .and_then(|f| require(&f, cred, want))
            .and_then(|_| tb)
            .and_then(|t| require(&t, cred, want))
            .and_then(|_| self.vfs.rename(&from, a.from.name, &to, a.to.name));
        let s = match r {
            Ok(()) => nfsstat3::NFS3_OK,
            Err(err) => status_of(err),
        };
        enc(e.i32(s as i32))?;
        enc(self.wcc(&from, fpre).encode(e))?;
        enc(self.wcc(&to, tpre).encode(e))
    }

    /// §3.3.15 LINK
    fn link(&self, a: LINK3args<'_>, cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let (file, dir) = match (fh_of(&a.file), fh_of(&a.link.dir)) {
            (Ok(f), Ok(d)) => (f, d),
            (Err(s), _) | (_, Err(s)) => {
                enc(e.i32(s as i32))?;
                enc(post_op_attr::FALSE.encode(e))?;
                return enc(empty_wcc().encode(e));
            }
        };
        let db = self.vfs.getattr(&dir);
        let pre = pre_attr(db.ok());
        let r = db
            .and_then(|d| require(&d, cred, vfs::access::MODIFY | vfs::access::LOOKUP))
            .and_then(|_| self.vfs.link(&file, &dir, a.link.name));
        let s = match r {
            Ok(_) => nfsstat3::NFS3_OK,
            Err(err) => status_of(err),
        };
        enc(e.i32(s as i32))?;
        enc(self.post(&file).encode(e))?;
        enc(self.wcc(&dir, pre).encode(e))
    }

    /// §3.3.16 READDIR and §3.3.17 READDIRPLUS: entries are streamed into
    /// the reply until the client's byte budget is reached.
    fn readdir(
        &self,
        dir_fh: &nfs_fh3<'_>,
        cookie: u64,
        verf: [u8; 8],
        dircount: u32,
        maxcount: u32,
        plus: bool,
        e: &mut Encoder<'_>,
    ) -> R {
        let dir = match fh_of(dir_fh) {
            Ok(f) => f,
            Err(s) => return fail_post(e, s, post_op_attr::FALSE),
        };
        let at = match self.vfs.getattr(&dir) {
            Ok(a) => a,
            Err(err) => return fail_post(e, status_of(err), post_op_attr::FALSE),
        };
        if at.ftype != vfs::FileType::Directory {
            return fail_post(e, nfsstat3::NFS3ERR_NOTDIR, post_op_attr::TRUE(fattr(&at)));
        }
        let cur = match self.vfs.cookie_verifier(&dir) {
            Ok(v) => v,
            Err(err) => return fail_post(e, status_of(err), post_op_attr::TRUE(fattr(&at))),
        };
        if cookie != 0 && verf != cur && verf != [0; 8] {
            return fail_post(e, nfsstat3::NFS3ERR_BAD_COOKIE, post_op_attr::TRUE(fattr(&at)));
        }
        let start = e.position();
        enc(e.i32(nfsstat3::NFS3_OK as i32))?;
        enc(post_op_attr::TRUE(fattr(&at)).encode(e))?;
        enc(e.opaque_fixed(&cur))?;
        // Budget: the whole reply must fit in maxcount (count for READDIR),
        // keeping 8 bytes for the list terminator and eof.
        let limit = (maxcount as usize).min(e.remaining() + (e.position() - start));
        let body_start = start;
        let mut names_bytes = 0usize;
        let mut entries = 0usize;
        let mut full = false;
        let mut failed: Option<XdrError> = None;
        let listed = self.vfs.readdir(&dir, cookie, &mut |ent| {
            let name_len = proto::xdr::opaque_var_len(ent.name.len());
            let fh_bytes = ent.fh.to_bytes();
            let mut need = 4 + 8 + name_len + 8;
            if plus {
                need += 4 + FATTR3_LEN + 4 + proto::xdr::opaque_var_len(fh_bytes.len());
            }
            let used = e.position() - body_start;
            if used + need + 8 > limit || (plus && names_bytes + 8 + name_len + 8 > dircount as usize) {
                full = true;
                return false;
            }
            let r = (|| {
                e.bool(true)?;
                e.u64(ent.attr.fileid)?;
                e.opaque_var(ent.name)?;
                e.u64(ent.cookie)?;
                if plus {
                    post_op_attr::TRUE(fattr(&ent.attr)).encode(e)?;
                    post_op_fh3::TRUE(nfs_fh3 { data: &fh_bytes }).encode(e)?;
                }
                Ok(())
            })();
            if let Err(x) = r {
                failed = Some(x);
                return false;
            }
            names_bytes += 8 + name_len + 8;
            entries += 1;
            true
        });
        if failed.is_some() {
            return Err(CallError::SystemErr);
        }
        match listed {
            Ok(eof) => {
                if entries == 0 && full {
                    e.truncate(start);
                    return fail_post(e, nfsstat3::NFS3ERR_TOOSMALL, post_op_attr::TRUE(fattr(&at)));
                }
                enc(e.bool(false))?;
                enc(e.bool(eof && !full))
            }
            Err(err) => {
                e.truncate(start);
                fail_post(e, status_of(err), post_op_attr::TRUE(fattr(&at)))
            }
        }
    }

    /// §3.3.18 FSSTAT
    fn fsstat(&self, a: FSSTAT3args<'_>, e: &mut Encoder<'_>) -> R {
        let fh = match fh_of(&a.fsroot) {
            Ok(f) => f,
            Err(s) => return fail_post(e, s, post_op_attr::FALSE),
        };
        match self.vfs.fsstat(&fh) {
            Ok(s) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(FSSTAT3resok {
                    obj_attributes: self.post(&fh),
                    tbytes: s.total_bytes,
                    fbytes: s.free_bytes,
                    abytes: s.avail_bytes,
                    tfiles: s.total_files,
                    ffiles: s.free_files,
                    afiles: s.avail_files,
                    invarsec: 0,
                }
                .encode(e))
            }
            Err(err) => fail_post(e, status_of(err), post_op_attr::FALSE),
        }
    }

    /// §3.3.19 FSINFO
    fn fsinfo(&self, a: FSINFO3args<'_>, e: &mut Encoder<'_>) -> R {
        let r = fh_of(&a.fsroot).and_then(|fh| self.vfs.getattr(&fh).map_err(status_of));
        match r {
            Ok(at) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(FSINFO3resok {
                    obj_attributes: post_op_attr::TRUE(fattr(&at)),
                    rtmax: self.io_bytes_max,
                    rtpref: self.io_bytes_max,
                    rtmult: 4096,
                    wtmax: self.io_bytes_max,
                    wtpref: self.io_bytes_max,
                    wtmult: 4096,
                    dtpref: 64 << 10,
                    maxfilesize: i64::MAX as u64,
                    time_delta: nfstime3 { seconds: 0, nseconds: 1 },
                    properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
                }
                .encode(e))
            }
            Err(s) => fail_post(e, s, post_op_attr::FALSE),
        }
    }

    /// §3.3.20 PATHCONF
    fn pathconf(&self, a: PATHCONF3args<'_>, e: &mut Encoder<'_>) -> R {
        let r = fh_of(&a.object).and_then(|fh| self.vfs.getattr(&fh).map_err(status_of));
        match r {
            Ok(at) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(PATHCONF3resok {
                    obj_attributes: post_op_attr::TRUE(fattr(&at)),
                    linkmax: u32::MAX,
                    name_max: vfs::NAME_MAX as u32,
                    no_trunc: true,
                    chown_restricted: true,
                    case_insensitive: false,
                    case_preserving: true,
                }
                .encode(e))
            }
            Err(s) => fail_post(e, s, post_op_attr::FALSE),
        }
    }

    /// §3.3.21 COMMIT
    fn commit(&self, ctx: &CallContext<'_>, a: COMMIT3args<'_>, e: &mut Encoder<'_>) -> R {
        let fh = match fh_of(&a.file) {
            Ok(f) => f,
            Err(s) => return fail_wcc(e, s, empty_wcc()),
        };
        let (pre, r) = match ctx.resumed {
            Some(r) => (wcc_unpack(r.state), match vfs::io_done(r.payload) {
                Ok(vfs::IoDone::Commit) => Ok(Some(())),
                Ok(_) => Err(VfsError::Io),
                Err(err) => Err(err),
            }),
            None => {
                let pre = self.pre(&fh);
                let state = wcc_pack(&pre);
                (pre, self.vfs.commit_start(&fh, a.offset, a.count as u64, &mut Park3 { park: ctx.park, state: &state }))
            }
        };
        match r {
            Ok(None) => Ok(()),
            Ok(Some(())) => {
                enc(e.i32(nfsstat3::NFS3_OK as i32))?;
                enc(COMMIT3resok { file_wcc: self.wcc(&fh, pre), verf: self.vfs.write_verifier() }.encode(e))
            }
            Err(err) => fail_wcc(e, status_of(err), self.wcc(&fh, pre)),
        }
    }
}

/// Parks an NFSv3 call whose backend must wait (see `rpc::park`): the
/// completion travels back as the ticket's payload, a
/// `vfs::VfsResult<vfs::IoDone>`.
struct Park3<'c> {
    park: Option<&'c rpc::park::Parking<'c>>,
    /// What the call needs when it resumes (WRITE/COMMIT: the pre-op attributes).
    state: &'c [u8],
}

impl vfs::Later for Park3<'_> {
    fn park(&mut self) -> Option<vfs::Done> {
        let ticket = self.park?.park(self.state)?;
        Some(vfs::done_as_payload(move |p| ticket.complete(p)))
    }
}

/// A READ3resok whose `n` data bytes are already in place after the
/// reserved count/eof/length words at `words_at`: pad them and fill the words.
/// A READ3resok whose `n` data bytes are in place after the reserved
/// count/eof/length words at `words_at`; marks the data for RDMA (`lend`).
fn read_ok(e: &mut Encoder<'_>, words_at: usize, n: usize, eof: bool, lend: Option<&Lender>) {
    if let Some(l) = lend {
        l.mark_ddp(words_at + 12, n);
    }
    let pad = proto::xdr::pad(n);
    e.spare()[n..n + pad].fill(0);
    e.advance(n + pad);
    e.patch_u32(words_at, n as u32);
    e.patch_u32(words_at + 4, eof as u32);
    e.patch_u32(words_at + 8, n as u32);
}

/// Pre-op attributes of a parked WRITE/COMMIT: present flag, size, mtime, ctime.
const WCC_STATE_BYTES: usize = 4 + 8 + 12 + 12;

fn wcc_pack(pre: &pre_op_attr) -> [u8; WCC_STATE_BYTES] {
    let mut b = [0u8; WCC_STATE_BYTES];
    if let pre_op_attr::TRUE(w) = pre {
        b[0..4].copy_from_slice(&1u32.to_be_bytes());
        b[4..12].copy_from_slice(&w.size.to_be_bytes());
        b[12..16].copy_from_slice(&w.mtime.seconds.to_be_bytes());
        b[16..20].copy_from_slice(&w.mtime.nseconds.to_be_bytes());
        b[20..24].copy_from_slice(&w.ctime.seconds.to_be_bytes());
        b[24..28].copy_from_slice(&w.ctime.nseconds.to_be_bytes());
    }
    b
}

fn wcc_unpack(b: &[u8]) -> pre_op_attr {
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    if b.len() < WCC_STATE_BYTES || u32_at(0) != 1 {
        return pre_op_attr::FALSE;
    }
    pre_op_attr::TRUE(wcc_attr {
        size: u64::from_be_bytes(b[4..12].try_into().unwrap()),
        mtime: nfstime3 { seconds: u32_at(12), nseconds: u32_at(16) },
        ctime: nfstime3 { seconds: u32_at(20), nseconds: u32_at(24) },
    })
}

/// Bound on the results of the fixed-size procedures (see
/// `reply_bytes_bound`), with room to spare.
const FIXED_RESULT_BYTES_MAX: usize = 512;
/// READ3resok besides the data: status, post-op attributes (88), count,
/// eof, data length, padding — rounded up.
const READ_RESULT_OVERHEAD_BYTES: usize = 128;

/// The `count` of READ3args (file handle, offset, count), without decoding
/// the rest; `None` when the arguments are malformed (the call then fails
/// to decode and answers GARBAGE_ARGS).
fn read_count(args: &[u8]) -> Option<u32> {
    let word = |at: usize| args.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let fh_len = word(0)? as usize;
    if fh_len > NFS3_FHSIZE as usize {
        return None;
    }
    word(4 + proto::xdr::pad(fh_len) + fh_len + 8)
}

/// READs of at least this many bytes lend the backend's buffers to the
/// reply when they can; smaller ones are cheaper to copy.
const LEND_MIN_BYTES: usize = 16 << 10;

/// Hands a backend's lent pieces to the reply's lender.
struct LendTo<'a>(&'a Lender);

impl vfs::LendSink for LendTo<'_> {
    fn lend(&mut self, chunk: &vfs::Shared, at: usize, len: usize) {
        self.0.push(chunk, at, len);
    }
}

fn enc_reserve(e: &mut Encoder<'_>, n: usize) -> Result<usize, CallError> {
    e.reserve(n).map_err(|_| CallError::SystemErr)
}

fn fail_post(e: &mut Encoder<'_>, s: nfsstat3, attrs: post_op_attr) -> R {
    debug_assert!(s != nfsstat3::NFS3_OK);
    enc(e.i32(s as i32))?;
    enc(attrs.encode(e))
}

fn fail_wcc(e: &mut Encoder<'_>, s: nfsstat3, w: wcc_data) -> R {
    debug_assert!(s != nfsstat3::NFS3_OK);
    enc(e.i32(s as i32))?;
    enc(w.encode(e))
}

impl Program for Nfs3Program {
    fn program(&self) -> u32 {
        NFS_PROGRAM
    }

    fn version(&self) -> u32 {
        NFS_V3
    }

    /// RFC 1813 §4.4 lists the procedures whose retransmission must not be
    /// executed twice: the metadata procedures (`waits_for_the_log`).
    fn idempotent(&self, p: u32) -> bool {
        !waits_for_the_log(p)
    }

    /// Every procedure but READ, READLINK, READDIR and READDIRPLUS answers
    /// fixed-size results: at most a status, two wcc_data or post-op
    /// attributes and a handle (CREATE: 4 + 72 + 88 + 116 = 280 bytes).
    /// READ is bounded by its count. The listings and READLINK: unknown.
    fn reply_bytes_bound(&self, proc_num: u32, args: &[u8]) -> Option<usize> {
        match proc_num {
            NFSPROC3_READLINK | NFSPROC3_READDIR | NFSPROC3_READDIRPLUS => None,
            NFSPROC3_READ => read_count(args).map(|n| n.min(self.io_bytes_max) as usize + READ_RESULT_OVERHEAD_BYTES),
            _ => Some(FIXED_RESULT_BYTES_MAX),
        }
    }

    fn call(&self, ctx: &CallContext<'_>, args: &[u8], e: &mut Encoder<'_>) -> R {
        if let Some(r) = ctx.resumed {
            if let Some(done) = r.get::<Offloaded>() {
                // Ran whole on the backend's pool (`offload`): its reply.
                return match done {
                    Ok(reply) => enc(e.opaque_fixed(reply)),
                    Err(err) => Err(*err),
                };
            }
            if waits_for_the_log(ctx.proc_num) {
                // Applied and checked before it parked: only the flush was left.
                return self.durable_resumed(ctx, r, e);
            }
            if !parks_by_itself(ctx.proc_num) {
                // An offloaded call whose worker never answered.
                return refuse(ctx.proc_num, nfsstat3::NFS3ERR_IO, e);
            }
        }
        let gids = Gids::of(&ctx.auth);
        let grant = match ctx.proc_num {
            NFSPROC3_NULL => Grant::OPEN,
            p if p as usize >= PROC_NAMES.len() => return Err(CallError::ProcUnavail),
            p => match self.admit(ctx, args) {
                Ok(_) if self.deleg_must_wait(ctx, args) => return refuse(p, nfsstat3::NFS3ERR_JUKEBOX, e),
                Ok(g) => g,
                Err(s) => return refuse(p, s, e),
            },
        };
        let cred = grant.squash(gids.cred(&ctx.auth));
        if ctx.proc_num != NFSPROC3_NULL && !parks_by_itself(ctx.proc_num) {
            if let Some(pool) = ctx.park.and_then(|_| fh_of_args(args)).and_then(|fh| self.vfs.offload_pool(&fh)) {
                if self.offload(ctx, args, &cred, e, pool) {
                    return Ok(());
                }
            }
        }
        if !waits_for_the_log(ctx.proc_num) {
            return self.procedure(ctx, args, &cred, e);
        }
        let at = e.position();
        let (r, pending) = vfs::durable::deferring(|| self.procedure(ctx, args, &cred, e));
        match pending {
            Some(p) => self.when_durable(ctx, r, p, at, e),
            None => r,
        }
    }
}

/// The metadata procedures, whose changes must be durable before the reply
/// (RFC 1813 §3.3: a server must commit metadata changes before it
/// answers) and whose retransmissions must not run twice (§4.4): they
/// run with the backend's log flush deferred (`vfs::durable`), so the core
/// does not wait for it.
fn waits_for_the_log(proc_num: u32) -> bool {
    matches!(
        proc_num,
        NFSPROC3_SETATTR
            | NFSPROC3_CREATE
            | NFSPROC3_MKDIR
            | NFSPROC3_SYMLINK
            | NFSPROC3_MKNOD
            | NFSPROC3_REMOVE
            | NFSPROC3_RMDIR
            | NFSPROC3_RENAME
            | NFSPROC3_LINK
    )
}

/// READ, WRITE and COMMIT park by themselves where their backend waits
/// (`Vfs::read_start` & co.); every other procedure on a backend that
/// names an `offload_pool` runs whole on it.
fn parks_by_itself(proc_num: u32) -> bool {
    matches!(proc_num, NFSPROC3_READ | NFSPROC3_WRITE | NFSPROC3_COMMIT)
}

/// What an offloaded call (an NFSv3 procedure, MNT, EXPORT) completes
/// with: its reply's result bytes, or the RPC-level error to answer.
pub(crate) type Offloaded = Result<Vec<u8>, CallError>;

/// Park the call and run `serve` on `pool`, into `room` bytes of reply;
/// what it wrote comes back as the completion (`Offloaded`). False: the
/// call could not park (bounds reached) and runs where it is.
pub(crate) fn offload_to(
    ctx: &CallContext<'_>,
    pool: &vfs::iopool::IoPool,
    room: usize,
    serve: impl FnOnce(&mut Encoder<'_>) -> Result<(), CallError> + Send + 'static,
) -> bool {
    let Some(ticket) = ctx.park.and_then(|k| k.park(&[])) else { return false };
    pool.run(Box::new(move || {
        let mut buf = vec![0u8; room];
        let mut out = Encoder::new(&mut buf);
        let done: Offloaded = serve(&mut out).map(|()| out.written().to_vec());
        ticket.complete(Box::new(done));
    }));
    true
}

/// Reply room an offloaded call other than READDIR(PLUS) gets on its worker.
const OFFLOADED_REPLY_BYTES_MAX: usize = 8192;

/// The first handle of a call's arguments (every procedure but NULL starts
/// with one), if it parses.
fn fh_of_args(args: &[u8]) -> Option<FileHandle> {
    let mut d = Decoder::new(args);
    d.opaque_var(NFS3_FHSIZE).ok().and_then(|h| FileHandle::from_bytes(h).ok())
}

/// The largest reply a call keeps while its changes are flushed (metadata
/// replies are a few hundred bytes); a longer one waits for the flush on
/// the core.
const DURABLE_REPLY_BYTES_MAX: usize = 4096;

impl Nfs3Program {
    /// A metadata call's reply is written (from `at`) and its changes are
    /// applied but not yet durable (`p`): park the call with the reply as
    /// its state and let a worker flush; the reply leaves when the flush is
    /// done (`durable_resumed`). Without a place to park (a transport that
    /// keeps no parked calls, the per-connection or per-core bound
    /// reached) or with nothing left to flush, the flush happens here. A
    /// failed flush answers NFS3ERR_IO: the change may not survive a crash.
    fn when_durable(&self, ctx: &CallContext<'_>, r: R, p: vfs::durable::Pending, at: usize, e: &mut Encoder<'_>) -> R {
        let parked_already = ctx.park.is_some_and(|k| k.parked());
        if r.is_ok() && !parked_already && !p.is_durable() && e.position() - at <= DURABLE_REPLY_BYTES_MAX {
            if let Some(ticket) = ctx.park.and_then(|k| k.park(&e.written()[at..])) {
                p.sync_later(Box::new(move |res| ticket.complete(Box::new(res))));
                return Ok(());
            }
        }
        match p.sync_now() {
            Ok(()) => r,
            Err(_) if r.is_err() || parked_already => r,
            Err(err) => {
                e.truncate(at);
                refuse(ctx.proc_num, status_of(err), e)
            }
        }
    }

    /// Park the call and run it whole on `pool` (its backend waits on a
    /// remote: `Vfs::offload_pool`), after the access checks passed here;
    /// its reply comes back as the completion (`Offloaded`). False: it
    /// could not park (bounds reached) and runs here.
    fn offload(&self, ctx: &CallContext<'_>, args: &[u8], cred: &Cred<'_>, e: &mut Encoder<'_>, pool: &vfs::iopool::IoPool) -> bool {
        let me = self.clone();
        let (proc_num, args, uid, gid, gids) = (ctx.proc_num, args.to_vec(), cred.uid, cred.gid, cred.gids.to_vec());
        // READDIR replies are as large as the client asks; the others are
        // a few hundred bytes (READLINK: a path and attributes).
        let room = match proc_num {
            NFSPROC3_READDIR | NFSPROC3_READDIRPLUS => e.remaining(),
            _ => e.remaining().min(OFFLOADED_REPLY_BYTES_MAX),
        };
        offload_to(ctx, pool, room, move |out| {
            let cred = Cred { uid, gid, gids: &gids };
            me.metadata_procedure(proc_num, &args, &cred, out)
        })
    }

    /// A metadata call parked by `when_durable` comes back: its reply is
    /// the state it parked with, sent once the flush succeeded.
    fn durable_resumed(&self, ctx: &CallContext<'_>, r: rpc::park::Resumed<'_>, e: &mut Encoder<'_>) -> R {
        match vfs::durable::synced(r.payload) {
            Ok(()) => enc(e.opaque_fixed(r.state)),
            Err(err) => refuse(ctx.proc_num, status_of(err), e),
        }
    }

    /// One procedure, after the access checks.
    fn procedure(&self, ctx: &CallContext<'_>, args: &[u8], cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        match ctx.proc_num {
            NFSPROC3_READ => self.read(ctx, decode(args)?, cred, e),
            NFSPROC3_WRITE => self.write(ctx, decode(args)?, cred, e),
            NFSPROC3_COMMIT => self.commit(ctx, decode(args)?, e),
            p => self.metadata_procedure(p, args, cred, e),
        }
    }

    /// Every procedure but READ, WRITE and COMMIT: no parking, no lending,
    /// so it also runs on a worker (`offload`).
    fn metadata_procedure(&self, proc_num: u32, args: &[u8], cred: &Cred<'_>, e: &mut Encoder<'_>) -> R {
        let cred = *cred;
        match proc_num {
            NFSPROC3_NULL => Ok(()),
            NFSPROC3_GETATTR => self.getattr(decode(args)?, e),
            NFSPROC3_SETATTR => self.setattr(decode(args)?, &cred, e),
            NFSPROC3_LOOKUP => self.lookup(decode(args)?, &cred, e),
            NFSPROC3_ACCESS => self.access(decode(args)?, &cred, e),
            NFSPROC3_READLINK => self.readlink(decode(args)?, e),
            NFSPROC3_CREATE => self.create(decode(args)?, &cred, e),
            NFSPROC3_MKDIR => self.mkdir(decode(args)?, &cred, e),
            NFSPROC3_SYMLINK => self.symlink(decode(args)?, &cred, e),
            NFSPROC3_MKNOD => self.mknod(decode(args)?, &cred, e),
            NFSPROC3_REMOVE => {
                let a: REMOVE3args = decode(args)?;
                self.remove(&a.object, false, &cred, e)
            }
            NFSPROC3_RMDIR => {
                let a: RMDIR3args = decode(args)?;
                self.remove(&a.object, true, &cred, e)
            }
            NFSPROC3_RENAME => self.rename(decode(args)?, &cred, e),
            NFSPROC3_LINK => self.link(decode(args)?, &cred, e),
            NFSPROC3_READDIR => {
                let a: READDIR3args = decode(args)?;
                self.readdir(&a.dir, a.cookie, a.cookieverf, a.count, a.count, false, e)
            }
            NFSPROC3_READDIRPLUS => {
                let a: READDIRPLUS3args = decode(args)?;
                self.readdir(&a.dir, a.cookie, a.cookieverf, a.dircount, a.maxcount, true, e)
            }
            NFSPROC3_FSSTAT => self.fsstat(decode(args)?, e),
            NFSPROC3_FSINFO => self.fsinfo(decode(args)?, e),
            NFSPROC3_PATHCONF => self.pathconf(decode(args)?, e),
            _ => Err(CallError::ProcUnavail),
        }
    }
}
